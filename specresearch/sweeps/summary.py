"""A sweep's parent run at a glance (`summarize`, called by SweepCallback at the end of a sweep): the
best job's headline metrics as the parent's own metrics (so the collapsed runs table and the chart
view show them), which job that was and what was swept as params, a table of the jobs (`jobs.json`,
MLflow's table artifact, and the run's description) and a figure of the headline metrics against the
swept knob (`figures/sweep.png`)."""

from __future__ import annotations

import json
import math
from typing import Any

from specresearch.records import HEADLINE, NOTE_TAG, OVERRIDES_TAG, json_text

JOBS_TABLE = "jobs.json"
FIGURE = "figures/sweep.png"


def summarize(client: Any, parent_id: str, outcomes: dict[int, str], objective: str | None) -> dict[str, float]:
    """Give a sweep's parent run its jobs' summary. Returns the metrics logged on the parent.

    Args:
        client: an MlflowClient on the sweep's store.
        parent_id: the parent run.
        outcomes: job number -> outcome ("finished", "skipped <run id>", "failed: ..."): a skipped
            job's row is the earlier identical run it reused.
        objective: the metric the best job maximizes (`objective` in the config, e.g. speedup); None =
            the first headline metric the jobs have.
    """
    parent = client.get_run(parent_id)
    runs = {r.info.run_id: r for r in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'", max_results=1000)}
    reused = {o.split()[1] for o in outcomes.values() if o.startswith("skipped ") and len(o.split()) > 1}
    runs.update({run_id: client.get_run(run_id) for run_id in reused - runs.keys()})
    rows = sorted((job_row(run, run.info.run_id in reused) for run in runs.values()), key=lambda r: r["_start"])
    swept = swept_keys([row["_overrides"] for row in rows])
    metrics = [m for m in HEADLINE if any(m in row for row in rows)]
    objective = objective if objective and any(objective in row for row in rows) else (metrics[0] if metrics else None)
    scored = [row for row in rows if objective and math.isfinite(row.get(objective, math.nan))]
    best = max(scored, key=lambda row: row[objective]) if scored else None

    table = [{**({key: row["_overrides"].get(key, "") for key in swept} or {"run": row["run"]}), "status": row["status"],
              **{m: row.get(m, math.nan) for m in metrics}} for row in rows]  # the swept values name a job
    failed = sum(o.startswith("failed") for o in outcomes.values()) if outcomes else sum(r["status"] == "FAILED" for r in rows)
    logged = {**({m: best[m] for m in metrics if m in best} if best else {}), "jobs": float(len(outcomes) or len(rows)),
              "jobs_failed": float(failed)}
    client.log_batch(parent_id, metrics=[_metric(k, v) for k, v in logged.items() if math.isfinite(v)])
    params = {f"swept.{key}": ",".join(dict.fromkeys(row["_overrides"].get(key, "-") for row in rows)) for key in swept}
    if best:
        params.update({"best.run": best["run"], "best.overrides": overrides_text(best)})
    for key, value in params.items():
        client.log_param(parent_id, key, value[:6000])
    client.log_text(parent_id, json_text({"columns": list(table[0]) if table else [], "data": [list(r.values()) for r in table]}),
                    JOBS_TABLE)
    client.set_tag(parent_id, NOTE_TAG, describe(table, best, objective))
    if rows and metrics:
        from specresearch import figures

        figure = figures.sweep(table, swept, [m for m in ("speedup", "method_tau") if m in metrics] or metrics[:2])
        try:
            client.log_figure(parent_id, figure, FIGURE)
        finally:
            figures.close(figure)
    return logged


def job_row(run: Any, reused: bool) -> dict[str, Any]:
    """One job run as a row: its name, status, overrides and headline metrics (MLflow's spelling)."""
    overrides = run.data.tags.get(OVERRIDES_TAG)
    pairs = [o.split("=", 1) for o in (json.loads(overrides) if overrides else []) if "=" in o]
    status = run.info.status + (" (reused)" if reused else "")
    return {"run": run.info.run_name or run.info.run_id, "status": status, "_start": run.info.start_time or 0,
            "_overrides": {k.lstrip("+~"): v for k, v in pairs},
            **{m: v for m, v in run.data.metrics.items() if m in HEADLINE}}


def overrides_text(row: dict[str, Any]) -> str:
    """A job row's overrides as on the command line: "key=value key=value"."""
    return " ".join(f"{k}={v}" for k, v in row["_overrides"].items())


def swept_keys(overrides: list[dict[str, str]]) -> list[str]:
    """The override keys whose values differ between jobs (whatever sweeper chose them), in order."""
    keys = list(dict.fromkeys(key for job in overrides for key in job))
    return [key for key in keys if len({job.get(key) for job in overrides}) > 1]


def describe(table: list[dict[str, Any]], best: dict[str, Any] | None, objective: str | None) -> str:
    """The parent run's description: the best job and the table of jobs, in markdown."""
    if not table:
        return "No job of this sweep recorded a run."
    slower = " (every job was slower than its baseline)" if best and objective == "speedup" and best[objective] < 1 else ""
    head = (f"**Best {objective}: {best[objective]:.3f}**{slower}, run `{best['run']}` "
            f"({overrides_text(best) or 'no overrides'})\n\n" if best else "")
    cells = [[_cell(v) for v in row.values()] for row in table]
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0]), *("| " + " | ".join(c) + " |" for c in cells)]
    return head + "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.3f}"
    return str(value).replace("|", "\\|")


def _metric(key: str, value: float):
    import time

    from mlflow.entities import Metric

    return Metric(key, float(value), int(time.time() * 1000), 0)
