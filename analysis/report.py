"""What a study's analysis returns (Report), and the helpers every study's analysis shares: task
names and order, latest-run selection, captions with the runs' setting, the verifier's claim, the
equivalence verdict.

Measured numbers come only from the runs' MLflow params and metrics (read through the typed records
of specresearch.records); published numbers only from the study's published.json (see
specresearch.analysis.published), in tables of their own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from matplotlib.figure import Figure
from specresearch.analysis.format import DASH, Table, missing, with_ci
from specresearch.analysis.runs import CONTRACT_TAGS, NOT_FACTS, Run, Study, distinct

from specresearch.data import DATASETS
from specresearch.records import COMMIT_TAG, DIFF_TAG

TASK_NAMES = {"humaneval": "HumanEval", "mtbench": "MT-bench", "sharegpt": "ShareGPT"}  # how papers spell them


@dataclass
class Report:
    """What a study's analysis produces: tables (measured first, then published) and figures."""

    study: str
    tables: list[Table] = field(default_factory=list)
    figures: dict[str, Figure] = field(default_factory=dict)  # file name (.png) -> figure
    notes: list[str] = field(default_factory=list)  # remarks printed with the tables (e.g. runs ignored)

    def table(self, name: str) -> Table:
        return next(t for t in self.tables if t.name == name)


def task_name(dataset: str) -> str:
    return TASK_NAMES.get(dataset, dataset)


def task_order(dataset: str) -> tuple[int, str]:
    return (DATASETS.index(dataset) if dataset in DATASETS else len(DATASETS), dataset)


def finite(values: Iterable[float]) -> list[float]:
    return [v for v in values if not missing(v)]


def mean(values: Iterable[float]) -> float:
    vals = finite(values)
    return sum(vals) / len(vals) if vals else math.nan


def number(x) -> float:
    """A value as a float; NaN when it is none (published data holds strings and nulls too)."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def plain(x) -> str:
    """A value as its source gives it; a dict (several numbers of one row) as "key value, ..."."""
    if missing(x):
        return DASH
    if isinstance(x, float):
        return f"{x:g}"
    if isinstance(x, dict):
        return "; ".join(f"{k}: {plain(v)}" if isinstance(v, dict) else f"{k} {plain(v)}" for k, v in x.items())
    if isinstance(x, (list, tuple)):
        return ", ".join(plain(v) for v in x)
    return str(x)


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
    return "(" + ", ".join(plain(p) for p in parts) + ")"


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
    sizes = finite(number(r.eval_record.problems) if r.quality else r.speed_record.prompts for r in runs)
    if sizes:
        lo, hi = int(min(sizes)), int(max(sizes))
        parts.append(f"prompts per run {lo}" + (f"–{hi}" if hi != lo else ""))
    machine = sorted({k for r in runs for k in r.tags if k.startswith("specresearch.") and k not in CONTRACT_TAGS
                      and not k.startswith(NOT_FACTS) and k not in (COMMIT_TAG, DIFF_TAG)})
    parts += [f"{k.removeprefix('specresearch.')} {_distinct(r.tags.get(k) for r in runs)}" for k in machine]
    commits = _distinct((r.tags.get(COMMIT_TAG) or r.tags.get("mlflow.source.git.commit") or "")[:8] for r in runs)
    if commits:
        parts.append(f"commit {commits}")
    return "; ".join(parts)


def caption(what: str, runs: list[Run], study: Study) -> str:
    """A table's caption: what it shows, how many runs it is built from (a run that feeds several rows counted once)
    and the setting they record."""
    runs = distinct(runs)
    n = len(runs)
    return (f"{what} From {n} FINISHED run{'s' if n != 1 else ''} of study '{study.name}' in MLflow "
            f"(re-runs of one config counted once, the latest). {facts(runs)}.")


def lossless(run: Run) -> bool | None:
    """The verifier's claim (`lossless`) as the run recorded it (param `verifier.lossless`)."""
    recorded = run.param("verifier.lossless")
    return recorded == "true" if recorded in ("true", "false") else None


def verdict(run: Run | None) -> str | None:
    """The equivalence verdict: at T = 0 the greedy identity; at T > 0 the battery's (Holm)."""
    if run is None:
        return None
    record = run.speed_record
    if run.temperature == 0:
        rate = record.identity_rate
        return "greedy identity" + ("" if missing(rate) else f" ({rate:.0%} identical)")
    reject = record.equivalence.get("reject", math.nan)
    if missing(reject):
        return None
    return "different" if reject >= 0.5 else "not distinguishable"


def deficit(run: Run | None) -> tuple[float, float, float]:
    """The battery's surprisal deficit (nats/token) and its 95% CI; NaN without a battery."""
    eq = run.speed_record.equivalence if run is not None else {}
    return tuple(eq.get(f"surprisal_deficit{s}", math.nan) for s in ("", "_ci_low", "_ci_high"))  # type: ignore[return-value]


def deficit_cell(v: tuple[float, float, float]) -> str:
    return with_ci(*v)
