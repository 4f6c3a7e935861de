"""Experiment tracking: MLflow with a local store that needs no server, or nothing (`tracker=none`).

A sweep (`python -m specresearch -m ...`) gets one parent run, opened by specresearch.sweeps'
`SweepCallback` through `start_parent`, with one nested run per job, whichever Hydra launcher runs
the jobs (basic, joblib, Ray): jobs find the parent through the environment. Every job run is tagged
with its config's hash (`config_hash`), which is how `resume` (specresearch.sweeps) finds jobs already
measured.

A local store is created (database and experiment) under an flock on `mlflow.db.lock` beside it, so
processes that start at once on a new store (parallel launchers, `exclusive=false` runs) do not race
in MLflow's schema migration. Where results go is checked before anything runs (`MLflowTracker.check_reachable`,
with specresearch.stores: a writable folder, a path MLflow's sqlite URI can hold, a file that is an
MLflow database, a server that answers). The first time a process opens a store it marks FAILED every
RUNNING run there whose process on this host is dead (`stores.mark_dead_runs`: a SIGKILL, a power cut),
so no run stays RUNNING.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

from specresearch.errors import SpecResearchError, write_problem
from specresearch.interrupts import held_signals
from specresearch.options import implements, make
from specresearch.options import tracking as options
from specresearch.records import (
    HASH_TAG,
    HEADLINE,
    NOTE_TAG,
    OVERRIDES_TAG,
    config_hash,
    headline,
    json_text,
    process_tags,
)
from specresearch.stores import (
    database_problem,
    file_lock,
    mark_dead_runs,
    server_problem,
    store_path_problem,
)

log = logging.getLogger(__name__)

PARENT_RUN_ENV = "SPECRESEARCH_MLFLOW_PARENT_RUN_ID"


PARENT_URI_ENV = "SPECRESEARCH_MLFLOW_TRACKING_URI"  # the parent run's store: a sweep's jobs record beside it


_OPENED: set[str] = set()  # tracking URIs this process has opened (MLflowTracker._mlflow): created, dead runs marked


_TRACKED: list[str] = []  # per run this process opened (tracked_run), oldest first: its id, "" when nothing records it


def runs_opened() -> list[str]:
    """The runs this process has opened so far (tracked_run), oldest first: the MLflow run's id, or ""
    for a run that records nothing (tracker=none). A job compares it before and after: whether its
    run exists, which an interruption's message says."""
    return list(_TRACKED)


class Tracker(Protocol):
    """Where a run's config, metrics and records go."""

    def start(self, cfg: DictConfig, run_name: str | None = None, tags: dict[str, str] | None = None,
              params: dict[str, Any] | None = None) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact_text(self, text: str, name: str) -> None: ...
    def log_figure(self, figure: Any, name: str) -> None: ...  # a matplotlib figure, as a PNG artifact
    def end(self, status: str = "FINISHED") -> None: ...
    def browse_hint(self) -> str | None: ...
    def check_reachable(self) -> None: ...  # raise SpecResearchError when results could not be recorded (before anything runs)

    def describe(self, text: str) -> None:
        """Set the run's description (markdown; MLflow shows it first on the run's page). Default: kept nowhere."""

    def tag(self, tags: dict[str, str]) -> None:
        """Add tags to the open run (facts known only once it measured). Default: kept nowhere."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        implements(cls)  # its Settings' option builds it (tracker=NAME)


class NullTracker(Tracker):
    """Records nothing (tests, quick tries)."""

    Settings = options.NoTracker

    def __init__(self, **_):
        pass

    def start(self, cfg: DictConfig, run_name: str | None = None, tags: dict[str, str] | None = None,
              params: dict[str, Any] | None = None) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_artifact_text(self, text: str, name: str) -> None:
        pass

    def log_figure(self, figure: Any, name: str) -> None:
        pass

    def end(self, status: str = "FINISHED") -> None:
        pass

    def browse_hint(self) -> str | None:
        return None

    def check_reachable(self) -> None:
        pass


# How MLflow 3's UI shows our experiments. MLflow 3.17 opens an experiment on its GenAI overview whatever its
# `mlflow.experimentKind`: its switch (GenAI / Model training, kept in the browser) decides, and a page's
# `workflowType=machine_learning` sets it. Its runs table shows no metric column until a user picks some, and
# keeps that choice in the browser, except for a shared view: an experiment tag `mlflow.sharedViewState.KEY`
# holding the view (JSON), which a page's `viewStateShareKey=KEY` opens. So the page every run names
# (`runs_page`) opens the runs table with the headline as columns; the kind tag serves older 3.x UIs.
VIEW = "specresearch"
COLUMNS = ("speedup", "method_tau", "method_alpha")  # the runs table's metric columns (MLflow orders them by name)
EXPERIMENT_TAGS = {
    "mlflow.experimentKind": "custom_model_development",
    f"mlflow.sharedViewState.{VIEW}": json.dumps({"selectedColumns": [f"metrics.`{name}`" for name in COLUMNS],
                                                  "orderByKey": "attributes.start_time", "orderByAsc": False}),
    "mlflow.note.content": (
        "Runs of specresearch (speculative decoding): one run per job (`python -m specresearch`, a "
        "sweep's jobs under their parent run). The headline metrics, logged first: " + ", ".join(f"`{name}`" for name in HEADLINE)
        + ". Add them as columns in the runs table (Columns), and open a run for its prompts (`prompt/*`), its "
        "`headline/*` charts over the prompts, its records (`records.jsonl`) and its log (`specresearch.log`)."),
}


def without_mlflow_git() -> None:
    """Take MLflow's git lookup out of its run context providers: at every start_run it runs git through GitPython
    (`git version` at its import, `git check-ignore`, ...) with no timeout, so a hung git (a network file system)
    holds the run for as long as it hangs. Our own tags carry the commit, MLflow's `mlflow.source.git.commit`
    included (records.process_tags, each git call within GIT_TIMEOUT_S)."""
    try:  # no public way to unregister one: where a later MLflow moves them, its lookup stays (as before)
        from mlflow.tracking.context import registry
        from mlflow.tracking.context.git_context import GitRunContext

        providers = registry._run_context_provider_registry._registry
    except (ImportError, AttributeError):
        return
    providers[:] = [p for p in providers if not isinstance(p, GitRunContext)]


def runs_page(server: str, experiment: str) -> str:
    """The address of `experiment`'s runs table on the MLflow UI at `server`, in its Model training view (not
    the GenAI overview MLflow 3.17 opens on) with the headline metrics as columns (EXPERIMENT_TAGS' shared view)."""
    return f"{server}/#/experiments/{experiment}/runs?viewStateShareKey={VIEW}&workflowType=machine_learning"


class MLflowTracker(Tracker):
    """MLflow on a local sqlite store, artifacts beside it under an absolute path; or on a tracking
    server (`uri`), which a sweep's jobs on other machines (Ray) can reach.

    Args:
        **given: the settings (options.tracking.MLflow): `store`, the folder holding `mlflow.db` and
            `artifacts/` (relative paths resolve from the cwd); `experiment`; `uri`, a tracking URI
            instead of the local store, e.g. http://head:5000 (`mlflow server`), None = sqlite in
            `store`. Inside a sweep a job records where its parent run is.
    """

    Settings = options.MLflow

    def __init__(self, **given):
        s = self.settings = make(self.Settings, given)
        self.store = Path(s.store).expanduser().resolve()
        self.experiment = s.experiment
        self.local = not s.uri
        self.uri = s.uri or f"sqlite:///{self.store / 'mlflow.db'}"
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

    def check_reachable(self) -> None:
        """Raise SpecResearchError in one line when results could not be recorded: a local store
        whose path MLflow's URI cannot hold (`store_path_problem`), that cannot be written (a path under a
        file, a read-only or pseudo file system) or whose mlflow.db is not an MLflow database; a
        tracking server that does not answer within seconds. Creates nothing. Run before any model loads."""
        db = self._database()
        if db is None:
            problem = server_problem(self.uri)
            if problem:
                raise SpecResearchError(problem)
            return
        problem = store_path_problem(db.parent)
        if problem:
            raise SpecResearchError(problem)
        problem = write_problem(db.parent) or (f"{db} is not a file" if db.exists() and not db.is_file() else None)
        if problem:
            raise SpecResearchError(f"cannot write the MLflow store {db.parent} (tracker.store): {problem}")
        problem = database_problem(db)
        if problem:
            raise SpecResearchError(f"cannot record in the MLflow store {db.parent} (tracker.store): {problem}")

    def _mlflow(self):
        """MLflow on this tracker's store. The first time in this process: a local database is
        created (under the store lock) and dead processes' RUNNING runs are marked (`mark_dead_runs`)."""
        import mlflow  # ~2 s: only when a run is really tracked

        quiet_mlflow()
        without_mlflow_git()
        mlflow.set_tracking_uri(self.uri)
        if self.uri in _OPENED:
            return mlflow
        db = self._database()
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            with self._store_lock():  # a second process on a new database would die in MLflow's schema migration
                mlflow.get_experiment_by_name(self.experiment)  # opens the store: creates and migrates the database
        try:
            mark_dead_runs(mlflow.MlflowClient(tracking_uri=self.uri))
        except Exception as err:  # bookkeeping of other runs: this run records all the same
            log.warning(f"warning: could not mark the runs of dead processes FAILED: {err}")
        _OPENED.add(self.uri)
        return mlflow

    def _experiment_id(self, mlflow) -> str:
        found = mlflow.get_experiment_by_name(self.experiment)
        if found is None:
            with self._store_lock():  # another process may be creating it right now
                found = mlflow.get_experiment_by_name(self.experiment)
                if found is None:
                    location = (self.store / "artifacts" / self.experiment).as_uri() if self.local else None  # a server keeps its own
                    return mlflow.create_experiment(self.experiment, artifact_location=location, tags=EXPERIMENT_TAGS)
        for key, value in EXPERIMENT_TAGS.items():  # an experiment made before these tags, or by hand
            if key not in found.tags:
                mlflow.MlflowClient(tracking_uri=self.uri).set_experiment_tag(found.experiment_id, key, value)
        return found.experiment_id

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
        running one) and `tags` (e.g. the machine: models.machine_tags), and log every config
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

    def log_figure(self, figure: Any, name: str) -> None:
        import mlflow

        mlflow.log_figure(figure, name)

    def end(self, status: str = "FINISHED") -> None:
        import mlflow

        mlflow.end_run(status=status)

    def describe(self, text: str) -> None:
        import mlflow

        mlflow.set_tag(NOTE_TAG, text)

    def tag(self, tags: dict[str, str]) -> None:
        import mlflow

        mlflow.set_tags(tags)

    def browse_hint(self) -> str:
        """How to open the runs: `mlflow ui` on the store (or the server) and the page of the runs table (runs_page)."""
        experiment = self.experiment_id()
        if not self.local:
            return f"open {self.uri if experiment is None else runs_page(self.uri.rstrip('/'), experiment)} (the MLflow server)"
        page = "" if experiment is None else f" and open {runs_page('http://127.0.0.1:5000', experiment)}"
        return f"mlflow ui --backend-store-uri {self.uri}{page}"

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


def quiet_mlflow() -> None:
    """Keep MLflow's INFO lines (database creation, migrations) off the console: a run prints its
    progress, its table and the browse line. Its warnings and errors still show."""
    import logging

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} → {"a.b": "1"}: MLflow params are flat strings."""
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    value = json.dumps(tree) if isinstance(tree, list) else str(tree)
    return {prefix[:-1]: value}


@contextmanager
def tracked_run(tracker: Tracker, cfg: DictConfig, name: str, report: Callable[[], tuple[dict[str, float], dict[str, str]]],
                tags: dict[str, str] | None = None, params: dict[str, Any] | None = None) -> Iterator[Tracker]:
    """One tracked run, for every entry point: opened with the config, `tags` and `params`; on leaving
    the block it logs what `report()` returns (the finite summary metrics, the files by name, and
    summary.json) and ends FINISHED, or FAILED when the block raised anything (an error, Ctrl-C, a
    signal), after logging what was measured until then. The files and the summary (with its status)
    go to Hydra's output folder too, when there is one.

    Args:
        tracker: a Tracker (MLflowTracker or NullTracker), already `check`ed before models loaded.
        cfg: the composed config, logged as the run's params.
        name: the run's name.
        report: what was measured so far: (summary metrics, {file name: text}); read once, at the end.
        tags: extra tags (e.g. `machine_tags`).
        params: extra params (e.g. `claim_params`).

    Yields:
        The tracker, to log step metrics as they come.
    """
    overrides = hydra_overrides()
    tags = {**(tags or {}), **({OVERRIDES_TAG: json.dumps(overrides)} if overrides is not None else {})}
    status, opened = "FAILED", False
    try:
        with held_signals():  # a signal while the run opens comes once it has, so that it is closed FAILED
            tracker.start(cfg, run_name=name, tags=tags, params=params)
            opened = True
            _TRACKED.append(getattr(tracker, "run_id", None) or "")
        yield tracker
        status = "FINISHED"
    finally:
        if opened:
            try:
                with held_signals():  # a run is recorded whole: a signal inside MLflow's end of it left it RUNNING
                    summary, files = report()
                    _record(tracker, summary, files, status, _pair_named(name, cfg))
            except SystemExit as stop:  # one held back (sweeps.Interrupted): the run is recorded with its own status
                stop.recorded = status
                raise


def _record(tracker: Tracker, summary: dict[str, float], files: dict[str, str], status: str, title: str | None = None) -> None:
    """End a tracked run with `status` after logging its finite metrics (the HEADLINE ones first), its
    description (`describe_run`), `files` (name -> text), summary.json (strict JSON: null for NaN), a speed
    run's figures (figures.speed_run) and the job's log; write the same files, and the summary with the
    status, to Hydra's output folder."""
    finite = {key: value for key, value in summary.items() if isinstance(value, (int, float)) and math.isfinite(value)}
    try:
        tracker.log_metrics({**headline(finite), **finite})  # MLflow lists a run's metrics in logging order
        tracker.describe(describe_run(title, finite, status))
        for name, text in files.items():
            tracker.log_artifact_text(text, name)
        tracker.log_artifact_text(json_text(summary), "summary.json")
        _log_figures(tracker, summary)
        log = job_log()
        if log is not None and log.is_file():  # the job's own log so far (conf/hydra/job_logging), e.g. specresearch.log
            tracker.log_artifact_text(log.read_text(errors="replace"), log.name)
    finally:
        tracker.end(status)
    out_dir = output_dir()
    if out_dir is not None:
        for name, text in files.items():
            (out_dir / name).write_text(text)
        (out_dir / "summary.json").write_text(json_text({"status": status, **summary}))


def _log_figures(tracker: Tracker, summary: dict[str, float]) -> None:
    """A speed run's figures as PNG artifacts (nothing for other runs, or for `tracker=none`)."""
    if isinstance(tracker, NullTracker):
        return
    from specresearch import figures  # matplotlib: only when a run draws

    for name, figure in figures.speed_run(summary).items():
        try:
            tracker.log_figure(figure, name)
        finally:
            figures.close(figure)


def hydra_overrides() -> list[str] | None:
    """The running Hydra job's command-line overrides (a sweep job's own values); None outside one."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return None


def output_dir() -> Path | None:
    """Hydra's output folder of the running job; None outside `@hydra.main` (tests, notebooks)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return None


# how a run's description names its headline metrics (records.HEADLINE), and their format
NAMED = {"speedup": ("speedup", "{:.2f}x"), "method_tau": ("τ (tokens per target forward)", "{:.2f}"),
         "method_alpha": ("α (accepted / drafted)", "{:.3f}"), "identity_rate": ("greedy identity", "{:.0%}"),
         "method_pass_at_1": ("pass@1", "{:.3f}"), "delta_pass_at_1": ("Δ pass@1", "{:+.3f}")}


def _pair_named(name: str | None, cfg: DictConfig) -> str | None:
    """The run's name with its target (and draft model) as the config names them: "pld(k=8) x greedy, target tiny"."""
    target, draft = OmegaConf.select(cfg, "model.name"), OmegaConf.select(cfg, "drafter.model.name")
    pair = (f"target {target}" if target else "") + (f", draft {draft}" if target and draft else "")
    return f"{name}, {pair}" if name and pair else name


def describe_run(name: str | None, metrics: dict[str, float], status: str) -> str:
    """A run's description: what ran and its headline numbers, one line (the MLflow page's first line).
    E.g. "**pld(k=8) x greedy**: speedup 1.53x · τ (tokens per target forward) 2.10 · ... (FINISHED)"."""
    shown = [f"{label} {fmt.format(metrics[key])}" for key, (label, fmt) in NAMED.items() if key in metrics]
    return f"**{name or 'run'}**: " + (" · ".join(shown) or "no headline measured") + f" ({status})"


def job_log() -> Path | None:
    """Hydra's log file of the running job (its output folder's `<job name>.log`); None outside `@hydra.main`."""
    from hydra.core.hydra_config import HydraConfig

    out = output_dir()
    return None if out is None else out / f"{HydraConfig.get().job.name}.log"


def browse_line(tracker: Tracker) -> None:
    """Say where the run can be browsed (nothing for `tracker=none`)."""
    hint = tracker.browse_hint()
    if hint:
        log.info(f"\nrecorded in MLflow; browse with:\n  {hint}")
