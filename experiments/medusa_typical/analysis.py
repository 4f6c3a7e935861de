"""medusa_typical: Medusa's typical acceptance, ε -> speed, quality, faithfulness."""

from __future__ import annotations

import math

from matplotlib.figure import Figure
from specresearch.analysis import published
from specresearch.analysis.format import DASH, Col, Table, missing, num, num3, pvalue, signed, speed, temperature, text
from specresearch.analysis.report import Report, caption, deficit, deficit_cell, latest_by, lossless, mean, plain, verdict
from specresearch.analysis.runs import Run, Study

from specresearch import figures
from specresearch.records import BASELINE, METHOD

SCORE = "pass@1"  # the quality score compared (HumanEval's)


def _setting(run: Run) -> tuple[str, float | None, float]:
    """(verifier, ε or None, T): what joins a speed run with a quality run."""
    eps = run.number("verifier.epsilon")
    return (run.verifier, None if missing(eps) else eps, run.temperature)


def report(study: Study) -> Report:
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
        sr, qr = (s.speed_record if s else None), (q.eval_record if q else None)
        records.append(dict(
            verifier=verifier, lossless=lossless(s or q), epsilon=eps, T=t,
            speed_run=s.id if s else None, quality_run=q.id if q else None,
            speedup=sr.speedup if sr else math.nan, tau=sr.method.tau if sr else math.nan,
            alpha=sr.method.alpha if sr else math.nan,
            method_pass=qr.score(METHOD, SCORE) if qr else math.nan,
            baseline_pass=qr.score(BASELINE, SCORE) if qr else math.nan,
            delta=qr.delta_of(SCORE) if qr else math.nan, mcnemar_p=_nan(qr.mcnemar_p) if qr else math.nan,
            verdict=verdict(s), deficit=deficit(s), acceptance=sr.method.acceptance_at if sr else [],
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
         Col("ε", "epsilon", plain), Col("T", "T", temperature),
         Col("speedup", "speedup", speed), Col("τ", "tau", num), Col("α", "alpha", num3),
         Col("method pass@1", "method_pass", num3), Col("baseline pass@1", "baseline_pass", num3),
         Col("Δ pass@1 (McNemar p)", lambda r: (r["delta"], r["mcnemar_p"]), _delta_cell),
         Col("equivalence", "verdict", text, "l"), Col("surprisal deficit [95% CI]", "deficit", deficit_cell)],
        records))
    medusa = published.load("medusa_typical").get("medusa")
    if medusa is not None and medusa.rows:
        report.tables.append(published.published_table("published_medusa", "Medusa (Cai et al. 2024)", medusa.rows))
    report.figures["medusa_typical_speed_quality.png"] = _speed_quality(records)
    report.figures["medusa_typical_acceptance_by_position.png"] = figures.acceptance(
        {f"T = {t:g}": {_label(r): r["acceptance"] for r in records if r["T"] == t and r["acceptance"]}
         for t in sorted({r["T"] for r in records if r["acceptance"]})},
        "Acceptance by draft position (by depth for trees), per ε")
    return report


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


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
