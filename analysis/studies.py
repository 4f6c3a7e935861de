"""One builder per study: a study's runs (analysis.runs.Study) -> its tables and figures (Report).

Measured numbers come only from the runs' MLflow params and metrics; published numbers come only
from analysis/published.py and are printed in their own tables, titled "Published (...not measured
here)", never merged into a measured column.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
from matplotlib.figure import Figure

from analysis import figures
from analysis.format import (
    DASH, Col, Table, integer, missing, num, num3, pvalue, signed, speed, speed_tau, temperature, text, with_ci,
)
from analysis.runs import CONTRACT_TAGS, NOT_FACTS, Run, Study
from specresearch.data import DATASETS, MTBENCH_CATEGORIES
from specresearch.metrics import leviathan_optimal_k, leviathan_speedup

TASK_NAMES = {"humaneval": "HumanEval", "mtbench": "MT-bench", "sharegpt": "ShareGPT"}  # how papers spell them
K_IDEAL = 16  # the largest k searched for the paper's idealised best k (v = 1)
PUBLISHED = "not measured here"


@dataclass
class Report:
    """What a study's analysis produces: tables (measured first, then published) and figures."""

    study: str
    tables: list[Table] = field(default_factory=list)
    figures: dict[str, Figure] = field(default_factory=dict)  # file name (.png) -> figure
    notes: list[str] = field(default_factory=list)  # remarks printed with the tables (e.g. runs ignored)

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)


# ---------------------------------------------------------------------------------------------------
# shared helpers


def task_name(dataset: str) -> str:
    return TASK_NAMES.get(dataset, dataset)


def task_order(dataset: str) -> tuple[int, str]:
    return (DATASETS.index(dataset) if dataset in DATASETS else len(DATASETS), dataset)


def finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if not missing(v)]


def mean(values: Iterable[float]) -> float:
    vals = finite(values)
    return sum(vals) / len(vals) if vals else math.nan


def latest_by(runs: Iterable[Run], key: Callable[[Run], object], notes: list[str] | None = None) -> dict:
    """key -> the latest run with that key. Runs of different configs that land in one cell (say,
    another drafter.k in a table without a k column) are not averaged: the latest is shown, and
    `notes` says which runs were left out."""
    out: dict = {}
    for run in sorted(runs, key=lambda r: r.start):
        cell = key(run)
        if cell in out and notes is not None:
            notes.append(f"run {out[cell].id} left out: run {run.id}, later, has the same {_cell(cell)} with another config")
        out[cell] = run
    return out


def _cell(key: object) -> str:
    parts = key if isinstance(key, tuple) else (key,)
    return "(" + ", ".join(_plain(p) for p in parts) + ")"


def _distinct(values: Iterable[str], most: int = 4) -> str:
    seen = list(dict.fromkeys(v for v in values if v))
    return ", ".join(seen[:most]) + (", …" if len(seen) > most else "")


FACT_PARAMS = [("target", "model.name"), ("dtype", "model.dtype"), ("device", "model.device"),
               ("draft", "drafter.model.name"), ("max_new_tokens", "max_new_tokens"), ("eval.limit", "eval.limit"),
               ("stats.samples", "stats.samples")]


def facts(runs: list[Run]) -> str:
    """The setting the runs record: target, dtype, device, prompts, lengths, machine tags, commit."""
    parts = []
    for label, key in FACT_PARAMS:
        values = _distinct(r.param(key) for r in runs)
        if values and not (key == "stats.samples" and values == "0"):
            parts.append(f"{label} {values}")
    sizes = finite(r.metric("problems" if r.quality else "prompts") for r in runs)
    if sizes:
        lo, hi = int(min(sizes)), int(max(sizes))
        parts.append(f"prompts per run {lo}" + (f"–{hi}" if hi != lo else ""))
    machine = sorted({k for r in runs for k in r.tags if k.startswith("specresearch.") and k not in CONTRACT_TAGS
                      and not k.startswith(NOT_FACTS)})
    parts += [f"{k.removeprefix('specresearch.')} {_distinct(r.tags.get(k) for r in runs)}" for k in machine]
    commits = _distinct((r.tags.get("mlflow.source.git.commit") or "")[:8] for r in runs)
    if commits:
        parts.append(f"commit {commits}")
    return "; ".join(parts)


def caption(what: str, runs: list[Run], study: Study) -> str:
    n = len(runs)
    return (f"{what} From {n} FINISHED run{'s' if n != 1 else ''} of study '{study.name}' in MLflow "
            f"(re-runs of one config counted once, the latest). {facts(runs)}.")


def lossless(run: Run) -> bool | None:
    """The verifier's claim (`lossless`) as the run recorded it (param `verifier.lossless`); for runs
    recorded before that param existed, read from the class its config names."""
    recorded = run.param("verifier.lossless")
    if recorded in ("true", "false"):
        return recorded == "true"
    target = run.param("verifier._target_")
    if not target:
        return None
    module, _, name = target.rpartition(".")
    try:
        return bool(getattr(importlib.import_module(module), name).lossless)
    except (ImportError, AttributeError):
        return None


def verdict(run: Run | None) -> str | None:
    """The equivalence verdict: at T = 0 the greedy identity; at T > 0 the battery's (Holm)."""
    if run is None:
        return None
    if run.temperature == 0:
        rate = run.metric("identity_rate")
        return "greedy identity" + ("" if missing(rate) else f" ({rate:.0%} identical)")
    reject = run.metric("eq_reject")
    if missing(reject):
        return None
    return "different" if reject >= 0.5 else "not distinguishable"


def deficit(run: Run | None) -> tuple[float, float, float]:
    if run is None:
        return (math.nan,) * 3
    return tuple(run.metric(f"eq_surprisal_deficit{s}") for s in ("", "_ci_low", "_ci_high"))  # type: ignore[return-value]


def _deficit_cell(v: tuple[float, float, float]) -> str:
    return with_ci(*v)


def published_entries(name: str) -> list[dict]:
    """A list of published numbers from analysis/published.py; [] while it is missing or incomplete."""
    try:
        module = importlib.import_module("analysis.published")
    except Exception:  # noqa: BLE001 -- being written concurrently: a half-written file must not stop the analysis
        return []
    value = getattr(module, name, None)
    return [dict(e) for e in value if isinstance(e, dict)] if isinstance(value, (list, tuple)) else []


def published_notes(name: str) -> dict[str, str]:
    try:
        value = getattr(importlib.import_module("analysis.published"), name, None)
    except Exception:  # noqa: BLE001
        return {}
    return dict(value) if isinstance(value, dict) else {}


def _plain(x) -> str:
    """A published value as its source gives it; a dict (several numbers of one row) as "key value, ..."."""
    if missing(x):
        return DASH
    if isinstance(x, float):
        return f"{x:g}"
    if isinstance(x, dict):
        return "; ".join(f"{k}: {_plain(v)}" if isinstance(v, dict) else f"{k} {_plain(v)}" for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return ", ".join(_plain(v) for v in x)
    return str(x)


def published_table(name: str, title: str, entries: list[dict], columns: list[Col] | None = None, what: str = "") -> Table:
    """Published numbers in their own table: every column as the source gives it, the source as a
    numbered note. `columns` default: every key of the entries but `source`, in order."""
    sources = list(dict.fromkeys(str(e.get("source", "?")) for e in entries))
    records = [{**e, "_ref": f"[{sources.index(str(e.get('source', '?'))) + 1}]"} for e in entries]
    if columns is None:
        keys = list(dict.fromkeys(k for e in entries for k in e if k != "source"))
        columns = [Col(k, k, _plain, "l") for k in keys]
    columns = columns + [Col("source", "_ref", text, "l")]
    cap = (f"Published numbers, {PUBLISHED}: copied from the sources below (other models, tasks and hardware). "
           f"{what}{len(entries)} rows.")
    return Table(name, f"Published ({PUBLISHED}): {title}", cap, columns, records,
                 notes=[f"[{i + 1}] {s}" for i, s in enumerate(sources)], published=True)


# ---------------------------------------------------------------------------------------------------
# leviathan: alpha per task and temperature; speedup over k, measured and predicted


def _v_interp(ks: list[int], vs: list[float]) -> Callable[[np.ndarray], np.ndarray]:
    """v(k) between the measured points, with v(0) = 1 (a forward of one token); linear in between,
    as leviathan_optimal_k interpolates. Not extrapolated: beyond the last k there is no measurement."""
    pts = sorted((k, v) for k, v in zip(ks, vs) if not missing(v))
    xs, ys = [0.0] + [float(k) for k, _ in pts], [1.0] + [v for _, v in pts]
    return lambda k: np.interp(k, xs, ys)


def _rejected(run: Run, k: int) -> float:
    """Steps of a run that rejected a draft token: the `method_rejected` counter, or for runs logged
    before it existed, derived from a fixed-k chain's last position (steps − full acceptances)."""
    rejected = run.metric("method_rejected")
    if not missing(rejected):
        return rejected
    return run.metric("method_steps") * (1.0 - run.metric(f"method_acceptance_at_{k}"))


def _alpha_token(run: Run, k: int) -> float:
    """Leviathan's α of one run: accepted / tried draft tokens (SpecStats.alpha_token)."""
    accepted = run.metric("method_accepted")
    tried = accepted + _rejected(run, k)
    return accepted / tried if tried else math.nan


def leviathan(study: Study) -> Report:
    """Table 1 per (task, T): α pooled over k, c, measured and predicted best k; Table 2 per k;
    the paper's published α and speedups apart; figures: speedup vs k, acceptance by position."""
    report = Report(study.name)
    runs = study.speed
    cells: dict[tuple[str, float], dict[int, Run]] = {}
    for (task, t, k), run in latest_by(runs, lambda r: (r.dataset, r.temperature, _k(r)), report.notes).items():
        cells.setdefault((task, t), {})[k] = run
    order = sorted(cells, key=lambda c: (task_order(c[0]), c[1]))
    per_cell, per_k = [], []
    for task, t in order:
        by_k = dict(sorted(cells[(task, t)].items()))
        accepted = sum(finite(r.metric("method_accepted") for r in by_k.values()))
        drafted = sum(finite(r.metric("method_drafted") for r in by_k.values()))
        tried = sum(finite(r.metric("method_accepted") + _rejected(r, k) for k, r in by_k.items()))
        alpha = accepted / tried if tried else math.nan
        c = mean(r.metric("draft_cost_ratio_c") for r in by_k.values())
        predicted = {k: leviathan_speedup(alpha, k, c, r.metric("verify_cost_v")) for k, r in by_k.items()}
        measured = {k: r.metric("speedup") for k, r in by_k.items()}
        best_k = max((k for k in measured if not missing(measured[k])), key=measured.get, default=None)
        pred_k = max((k for k in predicted if not missing(predicted[k])), key=predicted.get, default=None)
        ideal_k, ideal = leviathan_optimal_k(alpha, c, 1.0, 1, k_max=K_IDEAL, v_curve=[1.0] * (K_IDEAL + 1))
        per_cell.append(dict(
            task=task, T=t, ks=list(by_k), runs=[r.id for r in by_k.values()], accepted=accepted, drafted=drafted,
            alpha=alpha, c=c, best_k=best_k, best_speedup=measured.get(best_k, math.nan),
            pred_k=pred_k, pred_speedup=predicted.get(pred_k, math.nan),
            ideal_k=ideal_k or None, ideal_speedup=ideal,
            v={k: r.metric("verify_cost_v") for k, r in by_k.items()}, measured=measured, predicted=predicted,
            acceptance={k: r.acceptance() for k, r in by_k.items()},
        ))
        for k, r in by_k.items():
            per_k.append(dict(task=task, T=t, k=k, run=r.id, speedup=measured[k], predicted=predicted[k],
                              predicted_own=leviathan_speedup(_alpha_token(r, k), k, r.metric("draft_cost_ratio_c"),
                                                              r.metric("verify_cost_v")), tau=r.metric("method_tau"),
                              alpha=_alpha_token(r, k), kept=r.metric("method_alpha"), c=r.metric("draft_cost_ratio_c"),
                              v=r.metric("verify_cost_v"), prompts=r.metric("prompts")))
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
    alphas = _pivot_alpha(published_entries("LEVIATHAN_ALPHA"))
    if alphas:
        temps = sorted({t for r in alphas for t in r["alpha"]})
        report.tables.append(published_table(
            "published_leviathan_alpha", "Leviathan et al. 2023, α of their model pairs (paper's models)", alphas,
            [Col("target", "target", text, "l"), Col("draft", "draft", text, "l"), Col("task", "task", text, "l")]
            + [Col(f"α at T = {t:g}", (lambda t: lambda r: r["alpha"].get(t))(t), num) for t in temps],
            what="Compare with the pooled α per task and T above only as a range: these are other models and tasks. "))
    speedups = published_entries("LEVIATHAN_SPEEDUP")
    if speedups:
        report.tables.append(published_table(
            "published_leviathan_speedup", "Leviathan et al. 2023, walltime speedups (paper's models and hardware)", speedups,
            [Col("target", "target", text, "l"), Col("draft", "draft", text, "l"), Col("task", "task", text, "l"),
             Col("T", "temperature", temperature, "l"), Col("k", "k", _plain), Col("α", "alpha", num),
             Col("c", "c", _plain), Col("speedup", "speedup", speed), Col("predicted", "expected_speedup", speed),
             Col("hardware", "hardware", text, "l")]))
    report.figures["leviathan_speedup_vs_k.png"] = _speedup_vs_k(per_cell)
    report.figures["leviathan_acceptance_by_position.png"] = figures.acceptance(
        {_cell_title(c): {f"k = {k}": rates for k, rates in c["acceptance"].items() if rates} for c in per_cell},
        "Acceptance by draft position (dotted: α^i with the pooled α, Leviathan's i.i.d. model)",
        pooled={_cell_title(c): c["alpha"] for c in per_cell})
    return report


def _pivot_alpha(entries: list[dict]) -> list[dict]:
    """Published α entries -> one row per (target, draft, task) with α per temperature."""
    rows: dict[tuple, dict] = {}
    for e in entries:
        key = (e.get("target"), e.get("draft"), e.get("task"), e.get("source"))
        row = rows.setdefault(key, dict(target=key[0], draft=key[1], task=key[2], source=key[3], alpha={}))
        row["alpha"][_float(e.get("temperature"))] = e.get("alpha")
    return list(rows.values())


def _k(run: Run) -> int:
    """The run's draft length: its drafter.k, else its `k` metric, else 0 (a drafter without k)."""
    for k in (run.number("drafter.k"), run.metric("k")):
        if not missing(k):
            return int(k)
    return 0


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _cell_title(cell: dict) -> str:
    return f"{task_name(cell['task'])}, T = {cell['T']:g}"


def _speedup_vs_k(cells: list[dict]) -> Figure:
    fig, axes = figures.panels(len(cells))
    if not cells:
        figures.empty(axes[0], "no speed runs")
    for ax, cell in zip(axes, cells):
        ks = cell["ks"]
        top = max(ks + [8])
        grid = np.arange(1, top + 1)
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


# ---------------------------------------------------------------------------------------------------
# specbench: every method x subtask, Spec-Bench's leaderboard view


def specbench(study: Study) -> Report:
    """One row per method: speedup (τ) per subtask, the MT-bench categories, Overall; sorted by Overall;
    the published Spec-Bench leaderboard apart; figures: acceptance by position, speedup vs τ."""
    report = Report(study.name)
    cells = latest_by(study.speed, lambda r: (r.method, r.dataset), report.notes)
    datasets = sorted({d for _, d in cells}, key=task_order)
    main = [d for d in DATASETS if d in datasets]
    categories = sorted({key.split(".")[1] for r in cells.values() if r.dataset == "mtbench" for key in r.metrics
                         if key.startswith("group.") and key.endswith(".speedup")},
                        key=lambda c: (MTBENCH_CATEGORIES.index(c) if c in MTBENCH_CATEGORIES else 99, c))
    records = []
    for method in sorted({m for m, _ in cells}):
        rec: dict = dict(method=method, runs={}, subtasks={}, categories={})
        for d in datasets:
            run = cells.get((method, d))
            if run is not None:
                rec["runs"][d] = run.id
                rec["subtasks"][d] = (run.metric("speedup"), run.metric("method_tau"), run.metric("method_alpha"))
                rec["acceptance_" + d] = run.acceptance()
        mt = cells.get((method, "mtbench"))
        for cat in categories:
            if mt is not None and f"group.{cat}.speedup" in mt.metrics:
                rec["categories"][cat] = (mt.metric(f"group.{cat}.speedup"), mt.metric(f"group.{cat}.method_tau"),
                                          mt.metric(f"group.{cat}.method_alpha"))
        present = [rec["subtasks"][d] for d in main if d in rec["subtasks"] and not missing(rec["subtasks"][d][0])]
        rec["overall"] = mean(s for s, _, _ in present)
        rec["overall_tau"] = mean(t for _, t, _ in present)
        rec["overall_n"] = len(present)
        records.append(rec)
    records.sort(key=lambda r: (missing(r["overall"]), -(0 if missing(r["overall"]) else r["overall"]), r["method"]))
    n_main = len(main)

    def overall(rec: dict) -> str:
        cell = speed_tau((rec["overall"], rec["overall_tau"]))
        return cell + (f" ({rec['overall_n']}/{n_main})" if rec["overall_n"] < n_main and cell != DASH else "")

    cols = [Col("method", "method", text, "l")]
    for d in datasets:
        if d == "mtbench":
            cols += [Col(f"MT-bench {cat}", (lambda c: lambda r: _pair(r["categories"].get(c)))(cat), speed_tau)
                     for cat in categories]
            cols.append(Col("MT-bench (all)", lambda r: _pair(r["subtasks"].get("mtbench")), speed_tau))
        else:
            cols.append(Col(task_name(d), (lambda d: lambda r: _pair(r["subtasks"].get(d)))(d), speed_tau))
    cols.append(Col("Overall", overall, text))
    used = list(cells.values())
    names = ", ".join(task_name(d) + (" (all)" if d == "mtbench" else "") for d in main) or "none"
    report.tables.append(Table(
        "specbench", "Spec-Bench view: speedup (τ) per method and subtask",
        caption(f"Cells: speedup over the autoregressive baseline (tokens/s ratio, same prompts, interleaved) and τ "
                f"(tokens per target forward). MT-bench categories from the MT-bench run's per-category metrics. "
                f"Overall = the mean of the subtask speedups (and of τ) over {names}; (n/{n_main}) marks a method "
                f"missing a subtask. Rows sorted by Overall, as Spec-Bench's leaderboard.", used, study),
        cols, records))
    report.tables += _published_specbench()
    report.figures["specbench_acceptance_by_position.png"] = figures.acceptance(
        {task_name(d): {r["method"]: r.get("acceptance_" + d) for r in records if r.get("acceptance_" + d)} for d in datasets},
        "Acceptance by draft position (by depth for trees), per subtask and method")
    report.figures["specbench_speedup_vs_tau.png"] = _speedup_vs_tau(records, datasets)
    return report


def _pair(triple):
    return None if triple is None else triple[:2]


def _speedup_vs_tau(records: list[dict], datasets: list[str]) -> Figure:
    fig, (ax,) = figures.panels(1, width=6.5, height=4.8)
    markers = dict(zip(datasets, "osD^vP*X"))
    for i, rec in enumerate(records):
        color = f"C{i % 10}"
        for d in datasets:
            s = rec["subtasks"].get(d)
            if s is not None and not missing(s[0]) and not missing(s[1]):
                ax.scatter(s[1], s[0], color=color, marker=markers[d], s=45)
        cats = [v for v in rec["categories"].values() if not missing(v[0]) and not missing(v[1])]
        if cats:
            ax.scatter([v[1] for v in cats], [v[0] for v in cats], color=color, marker=".", s=18, alpha=0.6)
        ax.scatter([], [], color=color, marker="s", label=rec["method"])
    for d in datasets:
        ax.scatter([], [], color="black", marker=markers[d], label=task_name(d) + (" (all)" if d == "mtbench" else ""))
    if any(r["categories"] for r in records):
        ax.scatter([], [], color="black", marker=".", label="MT-bench category")
    if not records:
        figures.empty(ax, "no speed runs")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("τ (tokens per target forward)")
    ax.set_ylabel("speedup (×)")
    ax.set_title("Speedup vs τ, per method (colour) and subtask (marker)", fontsize=11)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def _published_specbench() -> list[Table]:
    entries = published_entries("SPECBENCH")
    if not entries:
        return []
    subtasks = list(dict.fromkeys(str(e.get("subtask")) for e in entries if e.get("subtask") != "overall"))
    rows: dict[tuple, dict] = {}
    for e in entries:
        key = (e.get("hardware"), e.get("model"), e.get("paper_method"))
        row = rows.setdefault(key, dict(paper_method=e.get("paper_method"), method=e.get("method"), model=e.get("model"),
                                        hardware=e.get("hardware"), source=e.get("source"), speedup={}, tau=None))
        row["speedup"][e.get("subtask")] = e.get("speedup")
        if e.get("subtask") == "overall" and e.get("tau") is not None:
            row["tau"] = e.get("tau")
    def rank(row: dict) -> float:  # within one (hardware, model) leaderboard: by Overall, as Spec-Bench
        overall = _float(row["speedup"].get("overall"))
        return math.inf if missing(overall) else -overall

    groups = list(dict.fromkeys((h, m) for h, m, _ in rows))
    ordered = [r for g in groups for r in sorted((r for (h, m, _), r in rows.items() if (h, m) == g), key=rank)]
    names = {"mtbench": "Multi-turn conv. (MT-bench)", "translation": "Translation", "summarization": "Summarization",
             "qa": "QA", "math": "Math", "rag": "RAG"}
    cols = [Col("paper method", "paper_method", text, "l"), Col("ours", "method", text, "l"),
            Col("model", "model", text, "l"), Col("hardware", "hardware", text, "l")]
    cols += [Col(names.get(s, s), (lambda s: lambda r: r["speedup"].get(s))(s), speed) for s in subtasks]
    cols += [Col("Overall", lambda r: r["speedup"].get("overall"), speed), Col("τ (overall)", "tau", num)]
    table = published_table(
        "published_specbench", "Spec-Bench leaderboard (Vicuna on GPUs, greedy)", ordered, cols,
        what="Spec-Bench's own subtasks (only its multi-turn conversation is MT-bench); its Overall is its own. "
             "'ours' names our drafter of the same idea, where there is one. ")
    notes = published_notes("SPECBENCH_METHOD_NOTES")
    present = {r["paper_method"] for r in ordered}
    table.notes += [f"{m}: {note}" for m, note in notes.items() if m in present]
    return [table]


# ---------------------------------------------------------------------------------------------------
# medusa_typical: epsilon -> speed, quality, faithfulness


def _setting(run: Run) -> tuple[str, float | None, float]:
    """(verifier, ε or None, T): what joins a speed run with a quality run."""
    eps = run.number("verifier.epsilon")
    return (run.verifier, None if missing(eps) else eps, run.temperature)


def medusa_typical(study: Study) -> Report:
    """Rows per ε and verifier (the lossless reference too): speed and τ from the speed runs,
    pass@1 and its paired test from the quality runs, the battery's verdict and surprisal deficit;
    a side that did not run shows "–". Figures: speed-quality scatter, acceptance by position."""
    report = Report(study.name)
    speed_runs = latest_by(study.speed, _setting, report.notes)
    quality_runs = latest_by(study.quality, _setting, report.notes)
    keys = sorted(set(speed_runs) | set(quality_runs), key=lambda k: (k[2], k[1] is not None, k[1] or 0.0, k[0]))
    records = []
    for key in keys:
        verifier, eps, t = key
        s, q = speed_runs.get(key), quality_runs.get(key)
        any_run = s or q
        records.append(dict(
            verifier=verifier, lossless=lossless(any_run), epsilon=eps, T=t,
            speed_run=s.id if s else None, quality_run=q.id if q else None,
            speedup=s.metric("speedup") if s else math.nan, tau=s.metric("method_tau") if s else math.nan,
            alpha=s.metric("method_alpha") if s else math.nan,
            method_pass=q.metric("method_pass_at_1") if q else math.nan,
            baseline_pass=q.metric("baseline_pass_at_1") if q else math.nan,
            delta=q.metric("delta_pass_at_1") if q else math.nan, mcnemar_p=q.metric("mcnemar_p") if q else math.nan,
            verdict=verdict(s), deficit=deficit(s), acceptance=s.acceptance() if s else [],
        ))
    used = list(speed_runs.values()) + list(quality_runs.values())
    report.tables.append(Table(
        "medusa_typical", "Medusa's typical acceptance: ε → speed, quality, faithfulness",
        caption(f"Speed runs ({len(speed_runs)}) and quality runs ({len(quality_runs)}) joined on (verifier, ε, T); "
                "'–' where that side did not run. Speedup, τ, α from the speed run; pass@1 of the method and of the "
                "target alone (baseline) and their difference with the exact McNemar p from the quality run; "
                "equivalence: the battery's Holm verdict at T > 0 (greedy identity at T = 0) and the surprisal "
                "deficit (nats/token the method's tokens are likelier than the target's own) with its 95% CI.",
                used, study),
        [Col("verifier", lambda r: r["verifier"] + (" (lossless)" if r["lossless"] else ""), text, "l"),
         Col("ε", "epsilon", lambda x: _plain(x)), Col("T", "T", temperature),
         Col("speedup", "speedup", speed), Col("τ", "tau", num), Col("α", "alpha", num3),
         Col("method pass@1", "method_pass", num3), Col("baseline pass@1", "baseline_pass", num3),
         Col("Δ pass@1 (McNemar p)", lambda r: (r["delta"], r["mcnemar_p"]), _delta_cell),
         Col("equivalence", "verdict", text, "l"), Col("surprisal deficit [95% CI]", "deficit", _deficit_cell)],
        records))
    medusa = published_entries("MEDUSA")
    if medusa:
        report.tables.append(published_table("published_medusa", "Medusa (Cai et al. 2024)", medusa))
    report.figures["medusa_typical_speed_quality.png"] = _speed_quality(records)
    report.figures["medusa_typical_acceptance_by_position.png"] = figures.acceptance(
        {f"T = {t:g}": {_label(r): r["acceptance"] for r in records if r["T"] == t and r["acceptance"]}
         for t in sorted({r["T"] for r in records if r["acceptance"]})},
        "Acceptance by draft position (by depth for trees), per ε")
    return report


def _label(rec: dict) -> str:
    return f"ε = {rec['epsilon']:g}" if rec["epsilon"] is not None else rec["verifier"]


def _delta_cell(pair) -> str:
    delta, p = pair
    return DASH if missing(delta) else signed(delta) + ("" if missing(p) else f" (p {pvalue(p)})")


def _speed_quality(records: list[dict]) -> Figure:
    fig, (ax,) = figures.panels(1, width=6.0, height=4.5)
    joined = [r for r in records if not missing(r["speedup"]) and not missing(r["method_pass"])]
    for i, r in enumerate(joined):
        ax.scatter(r["speedup"], r["method_pass"], color=f"C{i % 10}", s=45)
        ax.annotate(_label(r) + (f", T = {r['T']:g}" if len({x['T'] for x in joined}) > 1 else ""),
                    (r["speedup"], r["method_pass"]), textcoords="offset points", xytext=(5, 4), fontsize=8)
    for t in sorted({r["T"] for r in records}):
        base = mean(r["baseline_pass"] for r in records if r["T"] == t)
        if not missing(base):
            ax.axhline(base, color="grey", linestyle="--", label=f"baseline (target alone) pass@1, T = {t:g}")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    if not joined:
        figures.empty(ax, "no setting with both a speed and a quality run")
    ax.set_xlabel("speedup (×), speed runs")
    ax.set_ylabel("method pass@1, quality runs")
    ax.set_title("Speed vs quality per ε", fontsize=11)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------
# lossless_vs_lossy: verifier x temperature -> speed, tau, the battery's verdict


def lossless_vs_lossy(study: Study) -> Report:
    """Rows verifier × T: speedup, τ, α, the verdict, the smallest Holm p, the surprisal deficit with
    its CI, the top-1 shares; figure: acceptance by position."""
    report = Report(study.name)
    cells = latest_by(study.speed, lambda r: (r.verifier, r.temperature), report.notes)
    records = []
    for (verifier, t), run in sorted(cells.items(), key=lambda kv: (kv[0][1], not lossless(kv[1]), kv[0][0])):
        records.append(dict(
            verifier=verifier, lossless=lossless(run), T=t, run=run.id, speedup=run.metric("speedup"),
            tau=run.metric("method_tau"), alpha=run.metric("method_alpha"), verdict=verdict(run),
            min_holm_p=run.metric("eq_min_holm_p"), deficit=deficit(run),
            top1=(run.metric("eq_top1_share_method"), run.metric("eq_top1_share_baseline")), acceptance=run.acceptance(),
        ))
    report.tables.append(Table(
        "lossless_vs_lossy", "Lossless vs lossy: each verifier's speed and faithfulness",
        caption("Speedup, τ and α from the speed comparison; at T > 0 the equivalence battery's verdict (Holm over "
                "every test), its smallest Holm-adjusted p, the surprisal deficit (nats/token, 95% CI) and the share "
                "of top-1 tokens (method / baseline); at T = 0 equivalence is the greedy identity.",
                list(cells.values()), study),
        [Col("verifier", "verifier", text, "l"), Col("lossless (claim)", "lossless", lambda x: text({True: "yes", False: "no"}.get(x)), "l"),
         Col("T", "T", temperature), Col("speedup", "speedup", speed), Col("τ", "tau", num), Col("α", "alpha", num3),
         Col("verdict", "verdict", text, "l"), Col("smallest Holm p", "min_holm_p", pvalue),
         Col("surprisal deficit [95% CI]", "deficit", _deficit_cell),
         Col("top-1 share method / baseline", "top1", lambda p: DASH if missing(p[0]) else f"{num3(p[0])} / {num3(p[1])}")],
        records))
    report.figures["lossless_vs_lossy_acceptance_by_position.png"] = figures.acceptance(
        {f"T = {t:g}": {r["verifier"]: r["acceptance"] for r in records if r["T"] == t and r["acceptance"]}
         for t in sorted({r["T"] for r in records})},
        "Acceptance by draft position, per verifier")
    return report


STUDIES: dict[str, Callable[[Study], Report]] = {
    "leviathan": leviathan,
    "specbench": specbench,
    "medusa_typical": medusa_typical,
    "lossless_vs_lossy": lossless_vs_lossy,
}
