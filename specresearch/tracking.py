"""Experiment tracking: MLflow with a local store that needs no server, or nothing (`tracker=none`).

A sweep (`python -m specresearch -m ...`) gets one parent run, opened by `SweepCallback`, with one
nested run per job, whichever Hydra launcher runs the jobs (basic, joblib, Ray): jobs find the parent
through the environment. Every job run is tagged with its config's hash (`config_hash`), which is how
`resume` (specresearch.sweeps) finds jobs already measured.

A local store is created (database and experiment) under an flock on `mlflow.db.lock` beside it, so
processes that start at once on a new store (parallel launchers, `exclusive=false` runs) do not race
in MLflow's schema migration. Where results go is checked before anything runs (`write_problem`).
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import math
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from specresearch.errors import SpecResearchError

PARENT_RUN_ENV = "SPECRESEARCH_MLFLOW_PARENT_RUN_ID"
PARENT_URI_ENV = "SPECRESEARCH_MLFLOW_TRACKING_URI"  # the parent run's store: a sweep's jobs record beside it
HASH_TAG = "specresearch.config_hash"
STUDY_TAG = "specresearch.study"
SWEEP_TAG = "specresearch.sweep"  # "true" on a sweep's parent run
HOST_TAG, PID_TAG = "specresearch.host", "specresearch.pid"  # where a run's process runs: resume tells a killed job from a live one
HASH_EXCLUDED = ("tracker", "resume")  # where a run is recorded, and whether to skip it, do not change what it measures
_CREATED: set[str] = set()  # sqlite URIs whose database this process has opened under the store lock (MLflowTracker._mlflow)


def write_problem(folder: Path) -> str | None:
    """Why files cannot be written in `folder` (made with its missing parents first), or None when
    they can: its nearest existing ancestor must be a folder in which a file can be created. Creates
    nothing that stays: a probe file is made and removed (chmod does not stop root, a probe does
    stop everyone on a read-only or pseudo file system)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".specresearch-probe-"):
            pass
    except OSError as err:
        return f"cannot create a file in {existing} ({err.strerror})"
    return None


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing; another user's read-only file serves
    too), waiting for it; released when the block ends or the process dies."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def process_tags(cfg: DictConfig) -> dict[str, str]:
    """The tags of every run we open, job or sweep parent: this process (host, pid) and the study."""
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
    if cfg.get("study") is not None:
        tags[STUDY_TAG] = str(cfg.study)
    return tags


def config_hash(cfg: DictConfig) -> str:
    """sha256 of the resolved config (JSON, sorted keys) without the top-level keys `tracker` and
    `resume`: two runs with the same hash measured the same thing.

    Args:
        cfg: a composed config (the job's, without the `hydra` node).
    """
    tree = OmegaConf.to_container(cfg, resolve=True)
    for key in HASH_EXCLUDED:
        tree.pop(key, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()


class Tracker(Protocol):
    """Where a run's config, metrics and records go."""

    def start(self, cfg: DictConfig, run_name: str | None = None, tags: dict[str, str] | None = None,
              params: dict[str, Any] | None = None) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact_text(self, text: str, name: str) -> None: ...
    def end(self, status: str = "FINISHED") -> None: ...
    def browse_hint(self) -> str | None: ...
    def check(self) -> None: ...  # raise SpecResearchError when results could not be recorded (before anything runs)


class NullTracker:
    """Records nothing (tests, quick tries)."""

    def __init__(self, **_):
        pass

    def start(self, cfg: DictConfig, run_name: str | None = None, tags: dict[str, str] | None = None,
              params: dict[str, Any] | None = None) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_artifact_text(self, text: str, name: str) -> None:
        pass

    def end(self, status: str = "FINISHED") -> None:
        pass

    def browse_hint(self) -> str | None:
        return None

    def check(self) -> None:
        pass


class MLflowTracker:
    """MLflow on a local sqlite store, artifacts beside it under an absolute path; or on a tracking
    server (`uri`), which a sweep's jobs on other machines (Ray) can reach.

    Args:
        store: folder holding `mlflow.db` and `artifacts/` (relative paths resolve from the cwd).
        experiment: MLflow experiment name.
        uri: a tracking URI instead of the local store, e.g. http://head:5000 (`mlflow server`);
            None = sqlite in `store`. Inside a sweep a job records where its parent run is.
    """

    def __init__(self, store: str = "mlruns", experiment: str = "specresearch", uri: str | None = None):
        self.store = Path(store).expanduser().resolve()
        self.experiment = experiment
        self.local = not uri
        self.uri = uri or f"sqlite:///{self.store / 'mlflow.db'}"
        if os.environ.get(PARENT_RUN_ENV) and os.environ.get(PARENT_URI_ENV):  # a sweep's job: beside its parent run
            self.uri = os.environ[PARENT_URI_ENV]
            self.local = self.uri.startswith("sqlite:")
        self.run_id: str | None = None

    def _database(self) -> Path | None:
        """The sqlite file this tracker records in; None for a tracking server."""
        return Path(self.uri.removeprefix("sqlite:///")) if self.uri.startswith("sqlite:///") else None

    def _store_lock(self):
        """The flock that serializes creating the database and the experiment (a server needs none)."""
        db = self._database()
        return file_lock(db.with_name(db.name + ".lock")) if db is not None else nullcontext()

    def check(self) -> None:
        """Raise SpecResearchError, naming the folder, when the local store cannot be written (a path
        under a file, a read-only or pseudo file system); creates nothing. Run before any model loads."""
        db = self._database()
        if db is None:
            return
        problem = write_problem(db.parent) or (f"{db} is not a file" if db.exists() and not db.is_file() else None)
        if problem:
            raise SpecResearchError(f"cannot write the MLflow store {db.parent} (tracker.store): {problem}")

    def _mlflow(self):
        import mlflow  # ~2 s: only when a run is really tracked

        mlflow.set_tracking_uri(self.uri)
        db = self._database()
        if db is not None and self.uri not in _CREATED:
            db.parent.mkdir(parents=True, exist_ok=True)
            with self._store_lock():  # a second process on a new database would die in MLflow's schema migration
                mlflow.get_experiment_by_name(self.experiment)  # opens the store: creates and migrates the database
            _CREATED.add(self.uri)
        return mlflow

    def _experiment_id(self, mlflow) -> str:
        found = mlflow.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        with self._store_lock():  # another process may be creating it right now
            found = mlflow.get_experiment_by_name(self.experiment)
            if found is not None:
                return found.experiment_id
            if not self.local:  # a server keeps (or proxies) the artifacts itself
                return mlflow.create_experiment(self.experiment)
            location = (self.store / "artifacts" / self.experiment).as_uri()
            return mlflow.create_experiment(self.experiment, artifact_location=location)

    def client(self):
        """An MlflowClient on this tracker's store."""
        from mlflow import MlflowClient

        self._mlflow()
        return MlflowClient(tracking_uri=self.uri)

    def experiment_id(self) -> str | None:
        """The id of this tracker's experiment; None when it does not exist yet (nothing recorded)."""
        found = self._mlflow().get_experiment_by_name(self.experiment)
        return None if found is None else found.experiment_id

    def start(self, cfg: DictConfig, run_name: str | None = None, tags: dict[str, str] | None = None,
              params: dict[str, Any] | None = None) -> None:
        """Open the run (nested under a sweep's parent run if there is one), tag it with the config's
        hash, its study, where it runs (host, pid: what `resume` needs to tell a killed job from a
        running one) and `tags` (e.g. the machine: experiment.machine_tags), and log every config
        value as a flat param, `params` too (facts the config does not hold, e.g. the verifier's
        lossless claim), and the resolved config as `config.yaml`."""
        mlflow = self._mlflow()
        parent = os.environ.get(PARENT_RUN_ENV)
        tags = {**(tags or {}), HASH_TAG: config_hash(cfg), **process_tags(cfg)}
        run = mlflow.start_run(
            experiment_id=self._experiment_id(mlflow), run_name=run_name, parent_run_id=parent, nested=bool(parent), tags=tags
        )
        self.run_id = run.info.run_id
        try:
            mlflow.log_params({**flatten(OmegaConf.to_container(cfg, resolve=True)), **(params or {})})
            mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        except BaseException:  # a signal or a store error before the caller's own try: leave no RUNNING run
            mlflow.end_run(status="FAILED")
            raise

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import mlflow

        mlflow.log_metrics({k.replace("@", "_at_"): float(v) for k, v in metrics.items()}, step=step)  # MLflow refuses '@' (pass@1)

    def log_artifact_text(self, text: str, name: str) -> None:
        import mlflow

        mlflow.log_text(text, name)

    def end(self, status: str = "FINISHED") -> None:
        import mlflow

        mlflow.end_run(status=status)

    def browse_hint(self) -> str:
        if not self.local:
            return f"open {self.uri} (the MLflow server)"
        return f"mlflow ui --backend-store-uri {self.uri}"

    def start_parent(self, name: str, tags: dict[str, str] | None = None) -> str:
        """Open a sweep's parent run (it also creates the database, before any job touches it); jobs
        find its id and store in the environment."""
        mlflow = self._mlflow()
        run = mlflow.start_run(experiment_id=self._experiment_id(mlflow), run_name=name, tags=tags)
        os.environ[PARENT_RUN_ENV] = run.info.run_id
        os.environ[PARENT_URI_ENV] = self.uri
        return run.info.run_id

    def end_parent(self, status: str) -> None:
        """Close the sweep's parent run with `status`, whatever run is active now."""
        mlflow = self._mlflow()
        run_id = os.environ.pop(PARENT_RUN_ENV)
        os.environ.pop(PARENT_URI_ENV, None)
        mlflow.MlflowClient().set_terminated(run_id, status=status)
        if mlflow.active_run() is not None and mlflow.active_run().info.run_id == run_id:
            mlflow.end_run(status=status)


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} → {"a.b": "1"}: MLflow params are flat strings."""
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    value = json.dumps(tree) if isinstance(tree, list) else str(tree)
    return {prefix[:-1]: value}


try:  # Hydra's callback base class; the callback is configured in conf/config.yaml
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object


@dataclass
class JobFailed:
    """What a sweep job returns when its experiment was refused (a SpecResearchError). Not a number:
    Optuna's sweeper records the trial as failed and goes on."""

    message: str


@dataclass
class JobSkipped:
    """What a sweep job returns when `resume` found its config already finished: that run and its
    objective's value, which Optuna's sweeper reads with float() (no finite value: a failed trial)."""

    run_id: str
    value: float | None = None

    def __float__(self) -> float:
        if self.value is None or not math.isfinite(self.value):
            raise TypeError(f"run {self.run_id} has no finite objective value")
        return float(self.value)


JOB_TAG = "specresearch.job."  # + job number, on the parent run: "finished", "skipped <run id>" or "failed: <why>"


def job_outcome(job_return: Any) -> str:
    """What became of a job, from Hydra's JobReturn: finished, skipped <run id>, or failed: <why>."""
    from hydra.core.utils import JobStatus

    value = job_return._return_value
    if job_return.status == JobStatus.FAILED:
        return f"failed: {type(value).__name__}: {value}"
    if isinstance(value, JobFailed):
        return f"failed: {value.message}"
    if isinstance(value, JobSkipped):
        return f"skipped {value.run_id}"
    return "finished"


class SweepCallback(Callback):
    """Opens one MLflow parent run per multirun sweep and closes it at the end: FINISHED when every
    job finished or was skipped (`resume`), FAILED (and exit code 2) when any failed. The other jobs
    of a sweep go on after one fails; a parent left open by a crash, or by SIGTERM/SIGHUP, is closed
    as FAILED when the process exits.

    Jobs may run in other processes (joblib) or on other machines (Ray), where Hydra calls
    `on_job_end` on a copy of this callback: each job's outcome is therefore written as a tag of the
    parent run (`specresearch.job.<num>`), which the end of the sweep reads back.

    Before a single run or a sweep starts, it checks that Hydra's output folder and the tracker's
    store can be written (sweeps.check_destinations): one `error:` line and exit code 2 if not.
    """

    def __init__(self) -> None:
        self.tracker: MLflowTracker | None = None
        self.outcomes: dict[int, str] = {}  # job number -> outcome, of the jobs this process saw end
        self._signals: dict | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        from specresearch.sweeps import check_destinations

        check_destinations(config, multirun=False)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import instantiate

        from specresearch.sweeps import check_destinations, exit_on_signals, forward_env_to_ray

        check_destinations(config, multirun=True)
        tracker = instantiate(config.tracker)
        if isinstance(tracker, MLflowTracker):
            self.tracker = tracker
            tags = {SWEEP_TAG: "true", **process_tags(config)}
            tracker.start_parent(name=f"sweep {Path(config.hydra.sweep.dir).name}", tags=tags)
            forward_env_to_ray(config, {key: os.environ[key] for key in (PARENT_RUN_ENV, PARENT_URI_ENV)})
        self._signals = exit_on_signals(before_exit=self._stop_jobs)  # so that atexit closes the parent run on SIGTERM too
        if self.tracker is not None:
            atexit.register(self._close, "FAILED")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.types import RunMode

        if config.hydra.mode != RunMode.MULTIRUN:  # a single run is no sweep's job (and has no job number)
            return
        num, outcome = int(config.hydra.job.num), job_outcome(job_return)
        self.outcomes[num] = outcome
        parent = os.environ.get(PARENT_RUN_ENV)
        if self.tracker is not None and parent:
            try:
                self.tracker.client().set_tag(parent, f"{JOB_TAG}{num}", outcome[:4000])
            except Exception as err:  # the job's own run is recorded: its count at the end is what is lost
                print(f"warning: could not record job {num}'s outcome on the sweep's parent run: {err}", file=sys.stderr)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from specresearch.sweeps import restore_signals

        outcomes = {**self.outcomes, **self._recorded_outcomes()}
        failed = sorted(num for num, o in outcomes.items() if o.startswith("failed"))
        skipped = sum(o.startswith("skipped") for o in outcomes.values())
        print(f"sweep: {len(outcomes)} job{'s' * (len(outcomes) != 1)}: {len(outcomes) - skipped - len(failed)} ran, {skipped} skipped "
              f"(identical config already finished), {len(failed)} failed")
        self._close("FAILED" if failed else "FINISHED")
        if self._signals is not None:
            restore_signals(self._signals)
            self._signals = None
        if failed:
            print(f"{len(failed)} of {len(outcomes)} jobs failed (job numbers {failed})", file=sys.stderr)
            sys.exit(2)

    def _stop_jobs(self, signum: int) -> None:
        """The sweep's driver got SIGTERM/SIGHUP: let the jobs running in other processes here record
        their runs FAILED before the launcher kills them (sweeps.stop_local_jobs)."""
        from specresearch.sweeps import stop_local_jobs

        parent = os.environ.get(PARENT_RUN_ENV)
        if self.tracker is not None and parent:
            try:
                stop_local_jobs(self.tracker, parent, signum)
            except Exception as err:  # exiting anyway; resume marks what is left RUNNING
                os.write(2, f"could not stop the sweep's jobs: {err}\n".encode())

    def _recorded_outcomes(self) -> dict[int, str]:
        """The jobs' outcomes as tagged on the parent run (jobs in other processes or machines)."""
        parent = os.environ.get(PARENT_RUN_ENV)
        if self.tracker is None or not parent:
            return {}
        try:
            tags = self.tracker.client().get_run(parent).data.tags
        except Exception as err:  # the store is unreachable: count what this process saw
            print(f"warning: could not read the jobs' outcomes from the sweep's parent run: {err}", file=sys.stderr)
            return {}
        return {int(key.removeprefix(JOB_TAG)): value for key, value in tags.items()
                if key.startswith(JOB_TAG) and key.removeprefix(JOB_TAG).isdigit()}

    def _close(self, status: str) -> None:
        if self.tracker is None:
            return
        tracker, self.tracker = self.tracker, None
        tracker.end_parent(status)
        print(f"sweep recorded as one parent run ({status}); browse it with: {tracker.browse_hint()}")
