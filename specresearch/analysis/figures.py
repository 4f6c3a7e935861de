"""Figures (matplotlib, Agg backend: no display needed) shared by the studies."""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402


def panels(n: int, width: float = 4.2, height: float = 3.2) -> tuple[Figure, list]:
    """A figure with `n` panels on a grid (at most 3 per row); unused axes hidden."""
    n = max(n, 1)
    cols = 2 if n == 4 else min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def acceptance(groups: dict[str, dict[str, Sequence[float]]], title: str, pooled: dict[str, float] | None = None) -> Figure:
    """Acceptance by draft position: one panel per group, one line per series.

    Args:
        groups: panel title -> {series label -> [P(accepted at position 1), P(at 2), ...]}.
        title: the figure's title.
        pooled: panel title -> a pooled α; its curve α^i is drawn dotted (Leviathan's i.i.d. model: the
            token at position i is accepted when it and the i − 1 before it are).
    """
    fig, axes = panels(len(groups))
    if not groups:
        empty(axes[0], "no runs with draft positions")
    for ax, (name, series) in zip(axes, groups.items()):
        for label, rates in series.items():
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=label)
        if pooled and not math.isnan(pooled.get(name, math.nan)):
            positions = range(1, max((len(r) for r in series.values()), default=1) + 1)
            ax.plot(positions, [pooled[name] ** i for i in positions], color="grey", linestyle=":",
                    label=f"α^i, pooled α = {pooled[name]:.3f}")
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("draft position i")
        ax.set_ylabel("P(accepted | proposed)")
        ax.set_ylim(-0.02, 1.02)
        ax.xaxis.get_major_locator().set_params(integer=True)
        if series:
            ax.legend(fontsize=7)
        else:
            empty(ax, "no draft positions logged")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def empty(ax, message: str) -> None:
    """Say on the axes why there is nothing to plot (rather than failing or drawing a blank)."""
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")


def close(fig: Figure) -> None:
    plt.close(fig)
