"""cross_vocab: drafts from other model families beside one of the target's family, in the shape of
Timor et al. (2025)'s tables (target x dataset x temperature x drafter: tokens/s and speedup)."""

from __future__ import annotations

from matplotlib.figure import Figure
from specresearch.analysis import published
from specresearch.analysis.format import Col, Table, missing, num, speed, temperature, text
from specresearch.analysis.report import Report, caption, latest_by, number, task_name, task_order
from specresearch.analysis.runs import Run, Study

from specresearch import figures

MODES = {"string": "text re-tokenized (SLEM)", "shared": "shared tokens (TLI)"}


def report(study: Study) -> Report:
    """Table 1: one row per (dataset, T, drafter) of ours: tokens/s of the method and of plain decoding,
    the speedup over the fastest plain decoding, τ, α, c, the best drafter of each (dataset, T) marked;
    the authors' published rows apart; the figure: speedup per drafter, per dataset and temperature."""
    report = Report(study.name)
    cells = latest_by(study.speed, lambda r: (r.dataset, r.temperature, drafter(r)), report.notes)
    rows = []
    for (dataset, t, name), run in cells.items():
        r = run.speed_record
        rows.append(dict(target=run.param("model.name", "?"), dataset=dataset, T=t, drafter=name, vocabulary=vocabulary(run),
                         tokens_per_s=r.method.tokens_per_s, plain_tokens_per_s=r.baseline.tokens_per_s,
                         speedup=fastest(r), tau=r.method.tau, alpha=r.method.alpha, c=r.draft_cost_ratio_c, prompts=r.prompts))
    rows.sort(key=lambda x: (task_order(x["dataset"]), x["T"], -(0 if missing(x["speedup"]) else x["speedup"]), x["drafter"]))
    best = {}
    for x in rows:
        if not missing(x["speedup"]):
            best.setdefault((x["dataset"], x["T"]), x["drafter"])  # rows are sorted by speedup within a cell
    for x in rows:
        x["best"] = "yes" if best.get((x["dataset"], x["T"])) == x["drafter"] else ""
    report.tables.append(Table(
        "cross_vocab", "Drafts across vocabularies: speedup per dataset, temperature and drafter",
        caption("One row per (dataset, T, drafter). tokens/s: the method's and plain decoding's (the same prompts, "
                "interleaved, one process); speedup: over the fastest plain decoding timed in the run; τ: tokens per "
                "target forward; α: the share of drafted tokens kept; c: a draft forward's cost in target forwards. "
                "vocabulary: the target's (an independent draft of its family) or the draft's own (cross_vocab, by "
                "its mode). fastest: the fastest drafter of its (dataset, T), as the paper marks its maxima.",
                list(cells.values()), study),
        [Col("target", "target", text, "l"), Col("dataset", lambda x: task_name(x["dataset"]), text, "l"),
         Col("T", "T", temperature, "l"), Col("drafter", "drafter", text, "l"), Col("vocabulary", "vocabulary", text, "l"),
         Col("tokens/s", "tokens_per_s", num), Col("plain tokens/s", "plain_tokens_per_s", num), Col("speedup", "speedup", speed),
         Col("τ", "tau", num), Col("α", "alpha", num), Col("c", "c", num), Col("fastest", "best", text, "l")],
        rows))
    report.tables += _published()
    report.figures["cross_vocab_speedup.png"] = _figure(rows)
    return report


def drafter(run: Run) -> str:
    """The draft model's name (the arms differ by it and by cross_vocab's mode)."""
    name = run.param("drafter.model.name", "?")
    return f"{name}, {run.param('drafter.mode')}" if run.method == "cross_vocab" else str(name)


def vocabulary(run: Run) -> str:
    """'the target's' for a draft of the target's family, else what crosses: cross_vocab's mode."""
    if run.method != "cross_vocab":
        return "the target's"
    mode = run.param("drafter.mode", "?")
    return f"another: {MODES.get(mode, mode)}"


def fastest(record) -> float:
    """The speedup over the fastest plain decoding timed (the compiled one too, where it was), else over the baseline."""
    s = number(record.speedup_vs_fastest_plain)
    return record.speedup if missing(s) else s


def _published() -> list[Table]:
    table = published.load("cross_vocab").get("speedups")
    if table is None or not table.rows:
        return []
    cols = [Col("target", "target", text, "l"), Col("dataset", "dataset", text, "l"), Col("T", "temperature", temperature, "l"),
            Col("drafter", "drafter", text, "l"), Col("vocabulary", "vocabulary", text, "l"), Col("tokens/s", "tokens_per_s", num),
            Col("target alone tokens/s", "target_alone_tokens_per_s", num), Col("speedup", "speedup", speed),
            Col("hardware", "hardware", text, "l")]
    return [published.published_table(
        "published_cross_vocab", "Timor et al. (2025): drafts across vocabularies on GPUs (the authors' benchmark summaries)",
        table.rows, cols, what="Transformers' assisted generation on 9B-141B targets; speedup over the same target without a "
                               "drafter in the same submission. ")]


def _figure(rows: list[dict]) -> Figure:
    """Speedup per drafter (bars), one group per (dataset, T)."""
    fig, (ax,) = figures.panels(1, width=7.0, height=4.2)
    groups = list(dict.fromkeys((x["dataset"], x["T"]) for x in rows))
    drafters = sorted({x["drafter"] for x in rows})
    width = 0.8 / max(len(drafters), 1)
    for j, name in enumerate(drafters):
        values = [next((x["speedup"] for x in rows if (x["dataset"], x["T"]) == g and x["drafter"] == name), float("nan"))
                  for g in groups]
        ax.bar([i + (j - (len(drafters) - 1) / 2) * width for i in range(len(groups))], values, width, label=name, color=f"C{j % 10}")
    if not rows:
        figures.empty(ax, "no speed runs")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(groups)), [f"{task_name(d)}\nT = {t:g}" for d, t in groups])
    ax.set_ylabel("speedup over plain decoding (×)")
    ax.set_title("Drafts across vocabularies: speedup per drafter", fontsize=11)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
