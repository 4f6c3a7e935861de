"""A study's runs, read back from MLflow (and nothing else).

The run contract (written by `python -m specresearch`): every job run of a study has the param
`study` = NAME and the tags `specresearch.study` = NAME and `specresearch.config_hash`; a sweep's
parent run has the tags `specresearch.study` = NAME and `specresearch.sweep` = "true", its jobs the
tag `mlflow.parentRunId`. Params are the flat dotted config keys (`drafter.k`, `dataset.name`, ...).
Only FINISHED job runs count, and of several FINISHED runs of one config (re-runs) only the latest.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from functools import cache, cached_property
from pathlib import Path

from omegaconf import OmegaConf

from specresearch.config import CONF_DIR
from specresearch.records import (
    COMMITTED,
    HASH_EXCLUDED,
    HASH_TAG,
    INTERRUPTED_TAG,
    JOB_TAG,
    OVERRIDES_TAG,
    PARENT_TAG,
    PER_PROMPT_TAG,
    PID_TAG,
    SOLVED_TAG,
    STUDY_TAG,
    SWEEP_TAG,
    EvalRecord,
    SpeedRecord,
    committed_study,
)
from specresearch.tracking import database_problem, mark_dead_runs, server_problem

CONTRACT_TAGS = {STUDY_TAG, SWEEP_TAG, HASH_TAG}
NOT_FACTS = (PID_TAG, JOB_TAG, INTERRUPTED_TAG, OVERRIDES_TAG,  # bookkeeping tags, not the setting (the overrides: one per job)
             PER_PROMPT_TAG, SOLVED_TAG)  # and a run's per-prompt and per-problem measurements


class AnalysisError(Exception):
    """A request the analysis cannot serve (unknown study, no runs, bad argument): one clear line."""


@dataclass
class Run:
    """One MLflow run, as plain dicts (params are strings, as MLflow keeps them)."""

    id: str
    status: str
    start: int  # ms since the epoch
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]

    @classmethod
    def from_mlflow(cls, run) -> Run:
        return cls(run.info.run_id, run.info.status, run.info.start_time or 0,
                   dict(run.data.params), dict(run.data.metrics), dict(run.data.tags))

    @property
    def parent(self) -> str | None:
        return self.tags.get(PARENT_TAG)

    @property
    def is_sweep(self) -> bool:
        return self.tags.get(SWEEP_TAG, "").lower() == "true"

    @property
    def quality(self) -> bool:
        """A quality run (`eval=NAME`: lm-eval scores) rather than a speed run."""
        return self.param("eval.task") is not None

    @property
    def config_hash(self) -> str:
        """The run's own hash of its resolved config (tag); runs logged before the tag existed get a
        hash of their params but tracker.* and resume (the same config, flattened), so their re-runs
        still collapse (a tagged and an untagged run of one config do not)."""
        tagged = self.tags.get(HASH_TAG)
        if tagged:
            return tagged
        kept = {k: v for k, v in self.params.items() if k.split(".", 1)[0] not in HASH_EXCLUDED}
        return "params:" + hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]

    def param(self, key: str, default: str | None = None) -> str | None:
        """A param, with MLflow's rendering of a null config value ("None") read as missing."""
        value = self.params.get(key)
        return default if value is None or value in ("None", "null") else value

    def number(self, key: str) -> float:
        """A numeric param (nan when missing or not a number)."""
        try:
            return float(self.param(key))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return math.nan

    @cached_property
    def speed_record(self) -> SpeedRecord:
        """The run's metrics as a speed run's record (what `python -m specresearch` logs)."""
        return SpeedRecord.from_metrics(self.metrics)

    @cached_property
    def eval_record(self) -> EvalRecord:
        """The run's metrics as a quality run's record (what `eval=NAME` logs)."""
        return EvalRecord.from_metrics(self.metrics)

    @property
    def temperature(self) -> float:
        return self.number("sampling.temperature")

    @property
    def dataset(self) -> str:
        return self.param("dataset.name", "?")  # type: ignore[return-value]

    @property
    def method(self) -> str:
        """The drafter's option name (the file stem of conf/drafter/*.yaml with this _target_)."""
        return option_name("drafter", self.param("drafter._target_"))

    @property
    def verifier(self) -> str:
        return option_name("verifier", self.param("verifier._target_"))


@dataclass
class Study:
    """The runs of one study in one MLflow experiment."""

    name: str
    uri: str
    experiment: str
    runs: list[Run]  # FINISHED job runs, the latest per config hash, oldest first
    superseded: list[Run] = field(default_factory=list)  # FINISHED runs of a config that ran again later
    unfinished: list[Run] = field(default_factory=list)  # job runs not FINISHED (FAILED, RUNNING, KILLED): ignored
    parent: Run | None = None  # the latest sweep parent run: where the analysis is logged

    @property
    def speed(self) -> list[Run]:
        return [r for r in self.runs if not r.quality]

    @property
    def quality(self) -> list[Run]:
        return [r for r in self.runs if r.quality]


@cache
def options(group: str) -> dict[str, str]:
    """_target_ -> option name for a config group, read from conf/GROUP/*.yaml (the registry)."""
    out: dict[str, str] = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        target = OmegaConf.load(path).get("_target_")
        if target and target not in out:
            out[target] = path.stem
    return out


def option_name(group: str, target: str | None) -> str:
    """The option of `group` whose YAML names `target`; an unknown class keeps its class name."""
    if not target:
        return "?"
    return options(group).get(target, target.rsplit(".", 1)[-1])


def load_study(name: str, uri: str, experiment: str) -> Study:
    """Read a study's runs from an MLflow store.

    Args:
        name: the study (the runs' `study` param / `specresearch.study` tag).
        uri: MLflow tracking URI (`sqlite:///.../mlflow.db` for our local stores).
        experiment: the MLflow experiment the runs were logged to (`tracker.experiment`).

    Returns:
        The study's FINISHED job runs, one per config (the latest), and its latest sweep parent.

    Raises:
        AnalysisError: no store, no experiment, or no FINISHED job run of the study there.
    """
    first = f"run `python -m specresearch experiment={name}` first (with the same tracker.store)"
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///"))
        if not db.is_file():  # never let MLflow create an empty store where the user mistyped a path
            raise AnalysisError(f"no MLflow store at {db}: {first}, or point tracker.store=PATH at the runs' store")
    problem = unreadable(uri)
    if problem:
        raise AnalysisError(problem)
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    mark_dead_runs(client)  # a killed run's RUNNING status would otherwise stay
    found = client.get_experiment_by_name(experiment)
    if found is None:
        names = ", ".join(sorted(e.name for e in client.search_experiments())) or "none"
        raise AnalysisError(f"no MLflow experiment '{experiment}' in {uri} (experiments there: {names}); "
                            f"set tracker.experiment=NAME, or {first}")
    seen: dict[str, Run] = {}
    for query in (f"params.study = '{name}'", f"tags.`{STUDY_TAG}` = '{name}'"):
        for run in _search(client, found.experiment_id, query):
            seen[run.id] = run
    parents = sorted((r for r in seen.values() if r.is_sweep), key=lambda r: r.start)
    jobs = [r for r in seen.values() if not r.is_sweep and r.params]
    finished = sorted((r for r in jobs if r.status == "FINISHED"), key=lambda r: r.start)
    latest: dict[str, Run] = {}
    for run in finished:  # oldest first: a later run of the same config replaces an earlier one
        latest[run.config_hash] = run
    kept = sorted(latest.values(), key=lambda r: r.start)
    if not kept:
        other = f" ({len(jobs)} job runs, none FINISHED)" if jobs else ""
        raise AnalysisError(f"no FINISHED runs of study '{name}' in {uri}, experiment '{experiment}'{other}: {first}")
    parent = parents[-1] if parents else None
    return Study(name, uri, experiment, kept, [r for r in finished if latest[r.config_hash] is not r],
                 [r for r in jobs if r.status != "FINISHED"], parent)


KEPT_TAGS = ("specresearch.", "mlflow.parentRunId")  # what a committed run keeps of its tags (the rest: MLflow's bookkeeping)


def committed(name: str) -> Path:
    """Where study `name`'s measured runs are committed (`save=`): docs/results/data/study-NAME.json of the checkout
    (its table renders as a results page; the analysis rebuilds from its `data` without the MLflow store)."""
    return committed_study(name, COMMITTED)


def runs_record(study: Study) -> dict:
    """The runs a study's tables were built from, as plain data (a committed report's `data`): ids, status,
    start, params, metrics and the tags the analysis reads; a value holding a machine path is left out."""
    from dataclasses import asdict

    from specresearch.reports import machine_paths

    def plain(run: Run) -> dict:
        out = asdict(run)
        out["tags"] = {k: v for k, v in run.tags.items() if k.startswith(KEPT_TAGS)}
        for part in ("params", "tags"):
            out[part] = {k: v for k, v in out[part].items() if not machine_paths(str(v))}
        return out

    return {"study": study.name, "runs": [plain(r) for r in study.runs], "superseded": [r.id for r in study.superseded],
            "unfinished": [r.id for r in study.unfinished], "parent": plain(study.parent) if study.parent else None}


def distinct(runs: Iterable[Run]) -> list[Run]:
    """One run per run id, in first-seen order; of several copies of one run (read from two places), the last."""
    return list({run.id: run for run in runs}.values())


def merged(kept: Study, store: Study) -> Study:
    """A study resumed on another machine (the analysis' merge=true): its committed runs with the store's added. A
    config that ran in both keeps its latest run (the other is superseded); the store's sweep parent, unfinished runs
    and place stand. A run in both (saved from this store before) is one run: the store's copy."""
    both = distinct([*kept.runs, *store.runs])
    latest: dict[str, Run] = {}
    for run in sorted(both, key=lambda r: r.start):  # oldest first: a later run of a config replaces it
        latest[run.config_hash] = run
    superseded = [*kept.superseded, *store.superseded, *(r for r in both if latest[r.config_hash] is not r)]
    return Study(store.name, store.uri, store.experiment, sorted(latest.values(), key=lambda r: r.start), superseded,
                 store.unfinished, store.parent or kept.parent)


def load_committed(name: str, path: Path) -> Study:
    """A study's runs from a committed report (`runs_record` under `data`), as `load_study` reads them from MLflow.

    Raises:
        AnalysisError: no such file, not JSON, or not the runs of this study.
    """
    if not path.is_file():
        raise AnalysisError(f"no committed runs of study '{name}' at {path}")
    valid = f"valid is a study's committed runs (save=true writes them: docs/results/data/{committed(name).name})"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:  # not UTF-8 (random bytes), or not JSON
        raise AnalysisError(f"{path} is not JSON ({type(err).__name__}): {valid}") from None
    data = (record.get("data") if isinstance(record, dict) else None) or {}
    if not isinstance(data, dict) or data.get("study") != name or not data.get("runs"):
        raise AnalysisError(f"{path} holds no runs of study '{name}' (data.study, data.runs): {valid}")
    try:
        runs = [Run(**r) for r in data["runs"]]
        parent = Run(**data["parent"]) if data.get("parent") else None
    except TypeError:  # a run that is no mapping, or lacks or adds a field
        names = ", ".join(f.name for f in fields(Run))
        raise AnalysisError(f"{path}: data.runs and data.parent must be runs with fields {names}: {valid}") from None
    return Study(name, f"committed:{path.name}", "committed", runs, parent=parent)


def unreadable(uri: str) -> str | None:
    """Why the store at `uri` cannot be read: a sqlite file that is not an MLflow database, a
    server that does not answer (specresearch.tracking's checks, before MLflow retries for minutes)."""
    if uri.startswith("sqlite:///"):
        return database_problem(Path(uri.removeprefix("sqlite:///")))
    return server_problem(uri)


def _search(client, experiment_id: str, query: str) -> list[Run]:
    out, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string=query, max_results=1000, page_token=token)
        out.extend(Run.from_mlflow(r) for r in page)
        token = page.token
        if not token:
            return out
