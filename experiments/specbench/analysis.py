"""specbench: every method x subtask, in Spec-Bench's leaderboard view."""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from specresearch.analysis import published
from specresearch.analysis.format import DASH, Col, Table, missing, num, speed, speed_tau, text
from specresearch.analysis.report import Report, caption, latest_by, mean, number, task_name, task_order
from specresearch.analysis.runs import Study

from specresearch import figures
from specresearch.data import DATASETS, MTBENCH_CATEGORIES


def report(study: Study) -> Report:
    """One row per method: speedup (τ) per subtask, the MT-bench categories, Overall; sorted by Overall;
    the published Spec-Bench leaderboard apart; figures: acceptance by position, speedup vs τ."""
    report = Report(study.name)
    cells = latest_by(study.speed, lambda r: (r.method, r.dataset), report.notes)
    datasets = sorted({d for _, d in cells}, key=task_order)
    main = [d for d in DATASETS if d in datasets]
    categories = sorted({c for r in cells.values() if r.dataset == "mtbench" for c in r.speed_record.groups},
                        key=lambda c: (MTBENCH_CATEGORIES.index(c) if c in MTBENCH_CATEGORIES else 99, c))
    records = []
    for method in sorted({m for m, _ in cells}):
        rec: dict = dict(method=method, runs={}, subtasks={}, categories={})
        for d in datasets:
            run = cells.get((method, d))
            if run is not None:
                r = run.speed_record
                rec["runs"][d] = run.id
                rec["subtasks"][d] = (r.speedup, r.method.tau, r.method.alpha)
                rec["acceptance_" + d] = r.method.acceptance_at
        mt = cells.get((method, "mtbench"))
        for cat in categories:
            group = mt.speed_record.groups.get(cat) if mt is not None else None
            if group is not None:
                rec["categories"][cat] = (group.speedup, group.method_tau, group.method_alpha)
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
    names = ", ".join(task_name(d) + (" (all)" if d == "mtbench" else "") for d in main) or "none"
    report.tables.append(Table(
        "specbench", "Spec-Bench view: speedup (τ) per method and subtask",
        caption(f"Cells: speedup over the autoregressive baseline (tokens/s ratio, same prompts, interleaved) and τ "
                f"(tokens per target forward). MT-bench categories from the MT-bench run's per-category metrics. "
                f"Overall = the mean of the subtask speedups (and of τ) over {names}; (n/{n_main}) marks a method "
                f"missing a subtask. Rows sorted by Overall, as Spec-Bench's leaderboard.", list(cells.values()), study),
        cols, records))
    report.tables += _published()
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


SUBTASKS = {"mtbench": "Multi-turn conv. (MT-bench)", "translation": "Translation", "summarization": "Summarization",
            "qa": "QA", "math": "Math", "rag": "RAG"}  # Spec-Bench's subtasks, as its leaderboard names them


def _published() -> list[Table]:
    """The Spec-Bench leaderboard: one row per (hardware, model, method), its subtasks, Overall and τ."""
    leaderboard = published.load("specbench").get("leaderboard")
    if leaderboard is None or not leaderboard.rows:
        return []
    entries = leaderboard.rows
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
        overall = number(row["speedup"].get("overall"))
        return math.inf if missing(overall) else -overall

    groups = list(dict.fromkeys((h, m) for h, m, _ in rows))
    ordered = [r for g in groups for r in sorted((r for (h, m, _), r in rows.items() if (h, m) == g), key=rank)]
    cols = [Col("paper method", "paper_method", text, "l"), Col("ours", "method", text, "l"),
            Col("model", "model", text, "l"), Col("hardware", "hardware", text, "l")]
    cols += [Col(SUBTASKS.get(s, s), (lambda s: lambda r: r["speedup"].get(s))(s), speed) for s in subtasks]
    cols += [Col("Overall", lambda r: r["speedup"].get("overall"), speed), Col("τ (overall)", "tau", num)]
    table = published.published_table(
        "published_specbench", "Spec-Bench leaderboard (Vicuna on GPUs, greedy)", ordered, cols,
        what="Spec-Bench's own subtasks (only its multi-turn conversation is MT-bench); its Overall is its own. "
             "'ours' names our drafter of the same idea, where there is one. ")
    present = {r["paper_method"] for r in ordered}
    table.notes += [f"{m}: {note}" for m, note in leaderboard.notes.items() if m in present]
    return [table]
