"""leviathan: α per task and temperature; speedup over k, measured and predicted (Leviathan et al. 2023)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from matplotlib.figure import Figure
from specresearch.analysis import published
from specresearch.analysis.format import Col, Table, integer, missing, num, num3, speed, temperature, text
from specresearch.analysis.report import Report, caption, finite, latest_by, mean, number, plain, task_name, task_order
from specresearch.analysis.runs import Run, Study

from specresearch import figures
from specresearch.metrics import leviathan_optimal_k, leviathan_speedup

K_IDEAL = 16  # the largest k searched for the paper's idealised best k (v = 1)


def report(study: Study) -> Report:
    """Table 1 per (task, T): α pooled over k, c, measured and predicted best k; Table 2 per k;
    the paper's published α and speedups apart; figures: speedup vs k, acceptance by position."""
    report = Report(study.name)
    cells: dict[tuple[str, float], dict[int, Run]] = {}
    for (task, t, k), run in latest_by(study.speed, lambda r: (r.dataset, r.temperature, _k(r)), report.notes).items():
        cells.setdefault((task, t), {})[k] = run
    per_cell, per_k = [], []
    for task, t in sorted(cells, key=lambda c: (task_order(c[0]), c[1])):
        runs = dict(sorted(cells[(task, t)].items()))
        by_k = {k: r.speed_record for k, r in runs.items()}
        accepted = sum(finite(r.method.accepted for r in by_k.values()))
        tried = sum(finite(r.method.accepted + r.method.rejected for r in by_k.values()))
        alpha = accepted / tried if tried else math.nan
        c = mean(r.draft_cost_ratio_c for r in by_k.values())
        predicted = {k: leviathan_speedup(alpha, k, c, r.verify_cost_v) for k, r in by_k.items()}
        measured = {k: r.speedup for k, r in by_k.items()}
        best_k = max((k for k in measured if not missing(measured[k])), key=measured.get, default=None)
        pred_k = max((k for k in predicted if not missing(predicted[k])), key=predicted.get, default=None)
        ideal_k, ideal = leviathan_optimal_k(alpha, c, 1.0, 1, k_max=K_IDEAL, v_curve=[1.0] * (K_IDEAL + 1))
        per_cell.append(dict(
            task=task, T=t, ks=list(by_k), runs=[r.id for r in runs.values()], accepted=accepted,
            drafted=sum(finite(r.method.drafted for r in by_k.values())),
            alpha=alpha, c=c, best_k=best_k, best_speedup=measured.get(best_k, math.nan),
            pred_k=pred_k, pred_speedup=predicted.get(pred_k, math.nan),
            ideal_k=ideal_k or None, ideal_speedup=ideal,
            v={k: r.verify_cost_v for k, r in by_k.items()}, measured=measured, predicted=predicted,
            acceptance={k: r.method.acceptance_at for k, r in by_k.items()},
        ))
        for k, r in by_k.items():
            per_k.append(dict(task=task, T=t, k=k, run=runs[k].id, speedup=measured[k], predicted=predicted[k],
                              predicted_own=leviathan_speedup(r.method.alpha_token, k, r.draft_cost_ratio_c, r.verify_cost_v),
                              tau=r.method.tau, alpha=r.method.alpha_token, kept=r.method.alpha, c=r.draft_cost_ratio_c,
                              v=r.verify_cost_v, prompts=r.prompts))
    used = [r for by_k in cells.values() for r in by_k.values()]
    task_col, t_col = Col("task", lambda r: task_name(r["task"]), text, "l"), Col("T", "T", temperature, "l")
    report.tables.append(Table(
        "leviathan_alpha", "Leviathan: acceptance rate, cost and best draft length per task and temperature",
        caption("α: Leviathan's per-token acceptance rate, pooled over the k runs of each (task, T): Σ accepted "
                "/ Σ tried draft tokens (a step tries tokens up to its first rejection; the maximum-likelihood α "
                "of their i.i.d. model; Σ accepted / Σ drafted, the share of drafted tokens kept, falls with k "
                "and is shown per run below); c the mean draft cost "
                "ratio; the best k measured (highest speedup) and predicted by Leviathan et al.'s Thm 3.8 "
                "(1 − α^(k+1)) / ((1 − α)(k·c + v)) with the pooled α, the mean c and each k run's measured v, "
                f"and with the paper's idealised v = 1 (k searched in 1..{K_IDEAL}).", used, study),
        [task_col, t_col, Col("k runs", lambda r: ", ".join(map(str, r["ks"])), text, "l"),
         Col("α (pooled)", "alpha", num3), Col("c (mean)", "c", num3),
         Col("best k, measured", "best_k", integer), Col("its speedup", "best_speedup", speed),
         Col("best k, predicted (measured v)", "pred_k", integer), Col("predicted speedup", "pred_speedup", speed),
         Col("best k, predicted (v = 1)", "ideal_k", integer), Col("predicted speedup (v = 1)", "ideal_speedup", speed)],
        per_cell))
    report.tables.append(Table(
        "leviathan_k", "Leviathan: speedup over k, measured and predicted",
        caption("One row per job: the measured speedup (tokens/s over the baseline's, same prompts, interleaved); "
                "predicted with the cell's pooled α and mean c and this run's v; predicted by the run itself "
                "(its own α, c, v); τ (tokens per target forward); α per tried token; the share of drafted tokens "
                "kept; c; v.", used, study),
        [task_col, t_col, Col("k", "k", integer), Col("speedup", "speedup", speed),
         Col("predicted (pooled α, mean c)", "predicted", speed), Col("predicted (run's own α, c, v)", "predicted_own", speed),
         Col("τ", "tau", num), Col("α", "alpha", num3), Col("kept", "kept", num3), Col("c", "c", num3), Col("v", "v", num3)],
        per_k))
    report.tables += _published()
    report.figures["leviathan_speedup_vs_k.png"] = _speedup_vs_k(per_cell)
    report.figures["leviathan_acceptance_by_position.png"] = figures.acceptance(
        {_cell_title(c): {f"k = {k}": rates for k, rates in c["acceptance"].items() if rates} for c in per_cell},
        "Acceptance by draft position (dotted: α^i with the pooled α, Leviathan's i.i.d. model)",
        pooled={_cell_title(c): c["alpha"] for c in per_cell})
    return report


def _published() -> list[Table]:
    """The paper's α per model pair and temperature (Table 3), and its walltime speedups (Tables 2, 4)."""
    tables = published.load("leviathan")
    out = []
    alphas = _pivot_alpha(tables["alpha"].rows) if "alpha" in tables else []
    if alphas:
        temps = sorted({t for r in alphas for t in r["alpha"]})
        out.append(published.published_table(
            "published_leviathan_alpha", "Leviathan et al. 2023, α of their model pairs (paper's models)", alphas,
            [Col("target", "target", text, "l"), Col("draft", "draft", text, "l"), Col("task", "task", text, "l")]
            + [Col(f"α at T = {t:g}", (lambda t: lambda r: r["alpha"].get(t))(t), num) for t in temps],
            what="Compare with the pooled α per task and T above only as a range: these are other models and tasks. "))
    if "speedup" in tables and tables["speedup"].rows:
        out.append(published.published_table(
            "published_leviathan_speedup", "Leviathan et al. 2023, walltime speedups (paper's models and hardware)",
            tables["speedup"].rows,
            [Col("target", "target", text, "l"), Col("draft", "draft", text, "l"), Col("task", "task", text, "l"),
             Col("T", "temperature", temperature, "l"), Col("k", "k", plain), Col("α", "alpha", num),
             Col("c", "c", plain), Col("speedup", "speedup", speed), Col("predicted", "expected_speedup", speed),
             Col("hardware", "hardware", text, "l")]))
    return out


def _pivot_alpha(entries: list[dict]) -> list[dict]:
    """Published α entries -> one row per (target, draft, task) with α per temperature."""
    rows: dict[tuple, dict] = {}
    for e in entries:
        key = (e.get("target"), e.get("draft"), e.get("task"), e.get("source"))
        row = rows.setdefault(key, dict(target=key[0], draft=key[1], task=key[2], source=key[3], alpha={}))
        row["alpha"][number(e.get("temperature"))] = e.get("alpha")
    return list(rows.values())


def _k(run: Run) -> int:
    """The run's draft length: its drafter.k, else its `k` metric, else 0 (a drafter without k)."""
    for k in (run.number("drafter.k"), run.speed_record.k):
        if not missing(k):
            return int(k)
    return 0


def _v_interp(ks: list[int], vs: list[float]) -> Callable[[np.ndarray], np.ndarray]:
    """v(k) between the measured points, with v(0) = 1 (a forward of one token); linear in between,
    as leviathan_optimal_k interpolates. Not extrapolated: beyond the last k there is no measurement."""
    pts = sorted((k, v) for k, v in zip(ks, vs) if not missing(v))
    xs, ys = [0.0] + [float(k) for k, _ in pts], [1.0] + [v for _, v in pts]
    return lambda k: np.interp(k, xs, ys)


def _cell_title(cell: dict) -> str:
    return f"{task_name(cell['task'])}, T = {cell['T']:g}"


def _speedup_vs_k(cells: list[dict]) -> Figure:
    fig, axes = figures.panels(len(cells))
    if not cells:
        figures.empty(axes[0], "no speed runs")
    for ax, cell in zip(axes, cells):
        ks = cell["ks"]
        grid = np.arange(1, max(ks + [8]) + 1)
        alpha, c = cell["alpha"], cell["c"]
        v = _v_interp(ks, [cell["v"][k] for k in ks])(grid.astype(float))
        curve = [leviathan_speedup(alpha, int(k), c, float(vk)) for k, vk in zip(grid, v)]
        ideal = [leviathan_speedup(alpha, int(k), c, 1.0) for k in grid]
        inside = grid <= max(ks)
        ax.plot(grid[inside], np.array(curve)[inside], color="C0", label="predicted, v(k) interpolated from the runs")
        ax.plot(grid, ideal, color="C1", linestyle="--", label="predicted, v = 1 (paper)")
        ax.plot(ks, [cell["measured"][k] for k in ks], "o", color="C3", label="measured")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_title(f"{_cell_title(cell)}: α = {alpha:.3f}, c = {c:.3f}" if not missing(alpha) else _cell_title(cell), fontsize=10)
        ax.set_xlabel("draft length k")
        ax.set_ylabel("speedup (×)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
    fig.suptitle("Speedup over k: measured points, Leviathan et al.'s prediction from the measured α, c and v", fontsize=11)
    fig.tight_layout()
    return fig
