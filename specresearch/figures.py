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
                    label=f"α^i, α per tried token (Leviathan's) = {pooled[name]:.3f}")
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


def time_split(sides: dict[str, dict[str, float]], title: str) -> Figure:
    """Where each side's time went: one stacked bar per side, in seconds, by phase.

    Args:
        sides: side name -> {phase: seconds}, phases in order (SpecStats.TIME_SPLIT).
        title: the figure's title.
    """
    fig, (ax,) = panels(1, width=6.4, height=0.9 + 0.6 * max(len(sides), 1))
    left = dict.fromkeys(sides, 0.0)
    phases = list(dict.fromkeys(phase for split in sides.values() for phase in split))
    for phase in phases:
        widths = [sides[name].get(phase, 0.0) for name in sides]
        ax.barh(list(sides), widths, left=list(left.values()), label=phase)
        left = {name: start + width for (name, start), width in zip(left.items(), widths)}
    for y, total in enumerate(left.values()):
        ax.text(total, y, f" {total:.2f} s", va="center", fontsize=8)
    ax.set_xlabel("seconds")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncols=len(phases), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.suptitle(title, fontsize=11, y=1.0)
    fig.tight_layout()
    return fig


def speed_run(summary: dict[str, float]) -> dict[str, Figure]:
    """A speed run's own figures, from its summary metrics (read as a SpeedRecord): acceptance by draft
    position (with Leviathan's α^i) and the time split of both sides; {} for a run that has neither
    (quality, training). Keys are artifact names."""
    from specresearch.metrics import SpecStats
    from specresearch.records import SpeedRecord

    record = SpeedRecord.from_metrics(summary)
    figures = {}
    if record.method.acceptance_at:
        figures["figures/acceptance_by_position.png"] = acceptance(
            {"method": {"P(accepted | proposed)": record.method.acceptance_at}}, "acceptance by draft position",
            {"method": record.method.alpha_token})
    sides = {name: {phase: getattr(side, f"time_{phase}") for phase in SpecStats.TIME_SPLIT}
             for name, side in (("baseline", record.baseline), ("method", record.method))}
    sides = {name: split for name, split in sides.items() if all(map(math.isfinite, split.values()))}
    if sides:
        figures["figures/time_split.png"] = time_split(sides, "time split (all prompts)")
    return figures


def sweep(table: list[dict], swept: list[str], metrics: list[str]) -> Figure:
    """A sweep's jobs: one panel per metric against the first swept knob, one line per value of the
    other swept knobs (numeric knobs on a numeric axis, others as categories).

    Args:
        table: one row per job: {"run": name, knob: value (str), ..., metric: value}.
        swept: the knobs that differ between jobs (none: one point per run).
        metrics: the metrics to draw, one panel each.
    """
    x_key, others = (swept[0], swept[1:]) if swept else ("run", [])
    xs = list(dict.fromkeys(str(row[x_key]) for row in table))
    numeric = all(_is_number(x) for x in xs)
    xs = sorted(xs, key=float) if numeric else xs
    series: dict[str, list[dict]] = {}
    for row in table:
        series.setdefault(", ".join(f"{k}={row[k]}" for k in others), []).append(row)
    fig, axes = panels(len(metrics))
    for ax, metric in zip(axes, metrics):
        for label, rows in series.items():
            points = sorted((xs.index(str(r[x_key])), r.get(metric, math.nan)) for r in rows)
            ax.plot([float(xs[i]) if numeric else i for i, _ in points], [v for _, v in points], marker="o", label=label or None)
        if not numeric:
            slanted = max(map(len, xs)) > 8
            ax.set_xticks(range(len(xs)), xs, rotation=30 if slanted else 0, ha="right" if slanted else "center", fontsize=8)
        if metric == "speedup":
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(x_key)
        ax.set_title(metric, fontsize=10)
        if others:
            ax.legend(fontsize=7)
    fig.suptitle(f"sweep: {', '.join(metrics)} by {x_key}", fontsize=11)
    fig.tight_layout()
    return fig


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def empty(ax, message: str) -> None:
    """Say on the axes why there is nothing to plot (rather than failing or drawing a blank)."""
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=9, color="grey")


def close(fig: Figure) -> None:
    plt.close(fig)
