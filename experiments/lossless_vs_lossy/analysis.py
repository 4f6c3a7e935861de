"""lossless_vs_lossy: verifier x temperature -> speed, τ, the battery's verdict."""

from __future__ import annotations

import math

from specresearch.analysis.format import DASH, Col, Table, missing, num, num3, pvalue, speed, temperature, text
from specresearch.analysis.report import Report, caption, deficit, deficit_cell, latest_by, lossless, verdict
from specresearch.analysis.runs import Study

from specresearch import figures


def report(study: Study) -> Report:
    """Rows verifier × T: speedup, τ, α, the verdict, the smallest Holm p, the surprisal deficit with
    its CI, the top-1 shares; figure: acceptance by position."""
    report = Report(study.name)
    cells = latest_by(study.speed, lambda r: (r.verifier, r.temperature), report.notes)
    records = []
    for (verifier, t), run in sorted(cells.items(), key=lambda kv: (kv[0][1], not lossless(kv[1]), kv[0][0])):
        r, eq = run.speed_record, run.speed_record.equivalence
        records.append(dict(
            verifier=verifier, lossless=lossless(run), T=t, run=run.id, speedup=r.speedup,
            tau=r.method.tau, alpha=r.method.alpha, verdict=verdict(run),
            min_holm_p=eq.get("min_holm_p", math.nan), deficit=deficit(run),
            top1=(eq.get("top1_share_method", math.nan), eq.get("top1_share_baseline", math.nan)),
            acceptance=r.method.acceptance_at,
        ))
    report.tables.append(Table(
        "lossless_vs_lossy", "Lossless vs lossy: each verifier's speed and faithfulness",
        caption("Speedup, τ and α from the speed comparison; at T > 0 the equivalence battery's verdict (Holm over "
                "every test), its smallest Holm-adjusted p, the surprisal deficit (nats/token, 95% CI) and the share "
                "of top-1 tokens (method / baseline); at T = 0 equivalence is the greedy identity.",
                list(cells.values()), study),
        [Col("verifier", "verifier", text, "l"),
         Col("lossless (claim)", "lossless", lambda x: text({True: "yes", False: "no"}.get(x)), "l"),
         Col("T", "T", temperature), Col("speedup", "speedup", speed), Col("τ", "tau", num), Col("α", "alpha", num3),
         Col("verdict", "verdict", text, "l"), Col("smallest Holm p", "min_holm_p", pvalue),
         Col("surprisal deficit [95% CI]", "deficit", deficit_cell),
         Col("top-1 share method / baseline", "top1", lambda p: DASH if missing(p[0]) else f"{num3(p[0])} / {num3(p[1])}")],
        records))
    report.figures["lossless_vs_lossy_acceptance_by_position.png"] = figures.acceptance(
        {f"T = {t:g}": {r["verifier"]: r["acceptance"] for r in records if r["T"] == t and r["acceptance"]}
         for t in sorted({r["T"] for r in records})},
        "Acceptance by draft position, per verifier")
    return report
