"""batch_synergy: speedup over batch size per draft length k and for one tree (Su et al. 2023)."""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from specresearch.analysis import published
from specresearch.analysis.format import Col, Table, integer, missing, speed, text
from specresearch.analysis.report import Report, caption, latest_by
from specresearch.analysis.runs import Run, Study

from specresearch import figures

TREE = "tree"


def report(study: Study) -> Report:
    """Table 1 per batch size: the speedup of each arm (k = 1, 2, ... and the tree), the best k and
    its speedup; Table 2 per arm: its speedup at the smallest and largest batch and the crossover
    batch (the smallest where it falls below 1×); the paper's findings apart; the figure: speedup
    and best k over the batch size."""
    report = Report(study.name)
    grid = latest_by(study.speed, lambda r: (arm(r), batch_size(r)), report.notes)
    arms = sorted({a for a, _ in grid}, key=_arm_order)
    batches = sorted({b for _, b in grid})
    speedups = {a: {b: grid[(a, b)].speed_record.speedup for b in batches if (a, b) in grid} for a in arms}
    chains = [a for a in arms if isinstance(a, int)]
    per_batch = []
    for b in batches:
        best = best_k({k: speedups[k].get(b, math.nan) for k in chains})
        per_batch.append(dict(batch=b, **{_label(a): speedups[a].get(b, math.nan) for a in arms},
                              best_k=best, best_speedup=speedups[best][b] if best is not None else math.nan))
    per_arm = []
    for a in arms:
        by_b = speedups[a]
        per_arm.append(dict(arm=_label(a), batches=list(by_b), first=by_b[min(by_b)], last=by_b[max(by_b)],
                            crossover=crossover(by_b), best_at=[r["batch"] for r in per_batch if r["best_k"] == a]))
    used = list(grid.values())
    report.tables.append(Table(
        "batch_synergy", "Batch synergy: speedup per batch size and draft length",
        caption("One row per batch size (prompts decoded together, param `batch_size`): the measured speedup "
                "(the method's tokens/s over the baseline's, both at that batch size, same prompts) of the "
                "independent drafter at each draft length k and of the token tree; best k: the k with the highest "
                "speedup at that batch size (chains only), and that speedup.", used, study),
        [Col("batch size", "batch", integer)] + [Col(_label(a), _label(a), speed) for a in arms]
        + [Col("best k", "best_k", integer), Col("its speedup", "best_speedup", speed)],
        per_batch))
    report.tables.append(Table(
        "batch_synergy_crossover", "Batch synergy: where speculation stops paying",
        caption("One row per arm: its speedup at the smallest and the largest batch size measured, the "
                "crossover batch (the smallest batch size whose speedup is below 1×; – if none is), and the batch "
                "sizes at which that k is the best.", used, study),
        [Col("arm", "arm", text, "l"), Col("batch sizes", lambda r: ", ".join(map(str, r["batches"])), text, "l"),
         Col("speedup, smallest batch", "first", speed), Col("speedup, largest batch", "last", speed),
         Col("crossover batch (< 1×)", "crossover", integer),
         Col("best at batch sizes", lambda r: ", ".join(map(str, r["best_at"])), text, "l")],
        per_arm))
    never = [b for b in batches if all(not missing(s) and s < 1 for s in (speedups[a].get(b, math.nan) for a in arms))]
    if never:
        report.notes.append(f"no arm is faster than plain decoding from batch size {never[0]} on (of those measured)")
    report.tables += _published()
    report.figures["batch_synergy_speedup_vs_batch.png"] = _figure(speedups, per_batch, chains)
    return report


def arm(run: Run) -> int | str:
    """The run's arm: its draft length k for a chain drafter (`drafter.k`), else the drafter's name (tree)."""
    k = run.number("drafter.k")
    return int(k) if not missing(k) else run.method


def batch_size(run: Run) -> int:
    """The run's `batch_size` param; 1 for a run logged before the setting existed (one prompt at a time)."""
    b = run.number("batch_size")
    return 1 if missing(b) else int(b)


def best_k(speedups: dict[int, float]) -> int | None:
    """The k with the highest measured speedup (the smallest k on a tie); None when none was measured."""
    measured = {k: s for k, s in speedups.items() if not missing(s)}
    return max(sorted(measured), key=measured.get) if measured else None


def crossover(speedups: dict[int, float]) -> int | None:
    """The smallest batch size whose speedup is below 1 (speculation slower than plain decoding); None if none."""
    return next((b for b in sorted(speedups) if not missing(speedups[b]) and speedups[b] < 1), None)


def _arm_order(a: int | str) -> tuple[int, int, str]:
    return (0, a, "") if isinstance(a, int) else (1, 0, str(a))


def _label(a: int | str) -> str:
    return f"k = {a}" if isinstance(a, int) else str(a)


def _published() -> list[Table]:
    """Su et al.'s findings as text: their numbers were not available offline (published.json says so)."""
    tables = published.load("batch_synergy")
    if "findings" not in tables or not tables["findings"].rows:
        return []
    return [published.published_table(
        "published_batch_synergy", "Su et al. 2023, findings (their numbers were not available offline)",
        tables["findings"].rows, [Col("finding", "finding", text, "l"), Col("setting", "setting", text, "l")],
        what="Compare the shape (best k over batch size) with ours, not values: no numbers are copied. ")]


def _figure(speedups: dict, per_batch: list[dict], chains: list[int]) -> Figure:
    fig, (left, right) = figures.panels(2, width=5.0, height=3.6)
    if not per_batch:
        figures.empty(left, "no speed runs")
    for i, (a, by_b) in enumerate(speedups.items()):
        bs = sorted(b for b in by_b if not missing(by_b[b]))
        style = dict(linestyle="--", marker="s", color="black") if not isinstance(a, int) else dict(marker="o", color=f"C{i}")
        left.plot(bs, [by_b[b] for b in bs], label=_label(a), **style)
    left.axhline(1.0, color="grey", linewidth=0.8)
    left.set_xscale("log", base=2)
    left.set_xlabel("batch size")
    left.set_ylabel("speedup (×)")
    left.set_title("Speedup over plain decoding at the same batch size", fontsize=10)
    if speedups:
        left.legend(fontsize=7)
    rows = [r for r in per_batch if r["best_k"] is not None]
    right.plot([r["batch"] for r in rows], [r["best_k"] for r in rows], marker="o", color="C3")
    for r in rows:
        right.annotate(f"{r['best_speedup']:.2f}×", (r["batch"], r["best_k"]), textcoords="offset points",
                       xytext=(4, 4), fontsize=7)
    right.set_xscale("log", base=2)
    right.set_yscale("log", base=2)
    right.set_yticks(chains or [1])
    right.set_yticklabels([str(k) for k in chains] or ["1"])
    right.set_xlabel("batch size")
    right.set_ylabel("best k (highest speedup)")
    right.set_title("Best draft length over batch size", fontsize=10)
    if not rows:
        figures.empty(right, "no chain runs")
    for ax in (left, right):
        ax.set_xticks([r["batch"] for r in per_batch] or [1])
        ax.set_xticklabels([str(r["batch"]) for r in per_batch] or ["1"])
    fig.suptitle("Batch synergy (Su et al. 2023): speedup and best k over batch size", fontsize=11)
    fig.tight_layout()
    return fig
