"""The application layer: what every entry point shares (the CLI's speed and quality runs, training,
the benchmark, lm-eval's model, a notebook).

- `build`, `build_engine`: objects and engines from a composed config.
- `tracked_run`: a tracked run that ends FINISHED, or FAILED with what it had measured.
- `cli`: a Hydra entry point with one-line errors, sweeps that survive and the same job handling.

Imports go one way: entry points import this module; it imports the core (engine, models, trackers,
sweeps) and never an entry point. Heavy imports (torch, the models) happen inside the functions
that need them, so `--help` and tab completion stay fast.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from specresearch.config import CONF_DIR, unknown_option
from specresearch.errors import SpecResearchError
from specresearch.records import OVERRIDES_TAG

if TYPE_CHECKING:
    from specresearch.engine import Engine
    from specresearch.models import LoadedModel
    from specresearch.tracking import Tracker

log = logging.getLogger(__name__)


def build(node: DictConfig, **objects: Any) -> Any:
    """hydra.utils.instantiate, but our own errors come out as themselves, not wrapped, and runtime
    `objects` (a loaded model) reach the constructor as they are: merged into the config, Hydra
    would turn a dataclass such as LoadedModel into a config node."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, _partial_=True)(**objects) if objects else instantiate(node)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, SpecResearchError):
            raise cause from None
        raise


def build_engine(cfg: DictConfig, baseline: bool = False, target: LoadedModel | None = None) -> Engine:
    """The engine a composed config describes, or with `baseline` the target alone: the `none`
    drafter with a lossless verifier, whatever rule the method is studied with.

    Args:
        cfg: a composed config (model, drafter, verifier, sampling).
        baseline: build the baseline instead of the method.
        target: the target already loaded (baseline and method share it); None loads `cfg.model`.
    """
    from specresearch.drafters.none import NoDrafter
    from specresearch.engine import Engine
    from specresearch.models import load_model
    from specresearch.types import SamplingParams
    from specresearch.verifiers import GreedyVerifier, RejectionVerifier

    sampling = SamplingParams(**cfg.sampling)
    target = target if target is not None else load_model(**cfg.model)
    if baseline:
        return Engine(target, NoDrafter(), GreedyVerifier() if sampling.greedy else RejectionVerifier(), sampling)
    return Engine(target, build(cfg.drafter, target=target), build(cfg.verifier), sampling)


def machine_tags(lm: LoadedModel) -> dict[str, str]:
    """What a measurement ran on, as the config cannot say (`dtype=auto`, `device=auto`): the
    resolved dtype and device, the processor or GPU, the cores torch uses, torch's version."""
    import platform

    import torch

    if lm.device.type == "cuda":
        processor = torch.cuda.get_device_name(lm.device)
    else:
        processor = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                          if line.startswith("model name")), platform.processor() or platform.machine())
    return {"specresearch.dtype": str(lm.dtype).removeprefix("torch."), "specresearch.device": str(lm.device),
            "specresearch.processor": processor, "specresearch.threads": str(torch.get_num_threads()),
            "specresearch.torch": torch.__version__}


def claim_params(engine: Engine) -> dict[str, str]:
    """What the method claims and what it ran as, as run params (the class may change; the record
    must not): the verifier's `lossless` claim ("true" / "false"), which tests/test_lossless.py
    proves for every drafter, and the target's dtype and device actually used (`resolved_params`)."""
    return {"verifier.lossless": str(bool(engine.verifier.lossless)).lower(), **resolved_params(engine.target.lm)}


def resolved_params(lm: LoadedModel) -> dict[str, str]:
    """The dtype and device a model actually runs in, beside the config's `model.dtype=auto`:
    `model.dtype_used`, `model.device_used` (run params)."""
    return {"model.dtype_used": str(lm.dtype).removeprefix("torch."), "model.device_used": str(lm.device)}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# --- tracked runs -----------------------------------------------------------------------------------

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
        tags, params: extra tags (e.g. `machine_tags`) and params (e.g. `claim_params`).

    Yields:
        The tracker, to log step metrics as they come.
    """
    overrides = hydra_overrides()
    tags = {**(tags or {}), **({OVERRIDES_TAG: json.dumps(overrides)} if overrides is not None else {})}
    tracker.start(cfg, run_name=name, tags=tags, params=params)
    status = "FAILED"
    try:
        yield tracker
        status = "FINISHED"
    finally:
        summary, files = report()
        _record(tracker, summary, files, status)


def _record(tracker: Tracker, summary: dict[str, float], files: dict[str, str], status: str) -> None:
    """End a tracked run with `status` after logging its finite metrics (the HEADLINE ones first),
    `files` (name -> text), summary.json (strict JSON: null for NaN) and a speed run's figures
    (analysis.figures.speed_run); write the same files, and the summary with the status, to Hydra's
    output folder."""
    from specresearch.records import headline, json_text

    finite = {key: value for key, value in summary.items() if isinstance(value, (int, float)) and math.isfinite(value)}
    try:
        tracker.log_metrics({**headline(finite), **finite})  # MLflow lists a run's metrics in logging order
        for name, text in files.items():
            tracker.log_artifact_text(text, name)
        tracker.log_artifact_text(json_text(summary), "summary.json")
        _log_figures(tracker, summary)
    finally:
        tracker.end(status)
    out_dir = output_dir()
    if out_dir is not None:
        for name, text in files.items():
            (out_dir / name).write_text(text)
        (out_dir / "summary.json").write_text(json_text({"status": status, **summary}))


def _log_figures(tracker: Tracker, summary: dict[str, float]) -> None:
    """A speed run's figures as PNG artifacts (nothing for other runs, or for `tracker=none`)."""
    from specresearch.tracking import NullTracker

    if isinstance(tracker, NullTracker):
        return
    from specresearch.analysis import figures

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


class OwnMessages(logging.Filter):
    """The console's filter (conf/hydra/job_logging): our own loggers' messages at every level, the
    libraries' warnings and errors only (lm-eval's and MLflow's INFO lines go to the job's log file),
    less lm-eval's advice on `--metadata`, which it gives as a warning for every task that builds its
    own data (ours do) and which asks nothing of our user."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "lm_eval.api.task" and "Custom kwargs can be passed to `--metadata`" in record.getMessage():
            return False
        return record.name.split(".")[0] in ("specresearch", "__main__") or record.levelno >= logging.WARNING


def browse_line(tracker: Tracker) -> None:
    """Say where the run can be browsed (nothing for `tracker=none`)."""
    hint = tracker.browse_hint()
    if hint:
        log.info(f"\nrecorded in MLflow; browse with:\n  {hint}")


# --- command-line entry points ------------------------------------------------------------------

def fail(message: str) -> None:
    """Print a one-line error and exit 2 (how every command reports a SpecResearchError)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def cli(config_name: str, work: Callable[[DictConfig], dict[str, float] | None], timed: bool = True) -> None:
    """Run a Hydra command (`python -m specresearch`, `python -m specresearch.train`): every job, single
    or in a sweep, is checked (settings.check) before a run opens, then runs `work(cfg)` inside
    sweeps.job (signals end its run FAILED, `resume` may skip it, a timed speed job holds the speed lock).
    A SpecResearchError is one `error:` line and exit 2 for a single run (which leaves no empty output
    folder); in a sweep the other jobs go on and the sweep's callback counts the failed one.

    Args:
        config_name: the primary config of conf/ ("config" or "train").
        work: the job: the composed config in, the summary metrics out.
        timed: whether the jobs' results are timings (sweeps.job: the speed lock); False for training.
    """
    import hydra

    problem = unknown_option(sys.argv[1:], config_name)
    if problem:
        fail(problem)
    try:
        hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base="1.3")(_job(work, timed))()
    except KeyboardInterrupt:  # Ctrl-C outside a job (during a job sweeps.exit_on_signals turns it into SystemExit(130))
        print("\ninterrupted by SIGINT", file=sys.stderr)
        sys.exit(128 + signal.SIGINT)


def _job(work: Callable[[DictConfig], dict[str, float] | None], timed: bool) -> Callable[[DictConfig], Any]:
    def task(cfg: DictConfig) -> Any:
        """One job. Returns the summary metric `objective` (a float, for Optuna's sweeper; None when
        it is not set or not finite), or what SweepCallback counts: JobSkipped, JobFailed."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from specresearch import sweeps
        from specresearch.settings import check

        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        try:
            check(cfg)  # before sweeps.job: a refused config opens no run and takes no lock
            with sweeps.job(cfg, multirun=multirun, timed=timed) as skipped:
                if skipped is not None:
                    return skipped
                summary = work(cfg)
        except SpecResearchError as err:
            if not multirun:
                sweeps.discard_refused_run()  # nothing measured: leave no empty outputs/DATE/TIME/ behind
                fail(str(err))
            # In a sweep the other jobs go on; SweepCallback counts this one and exits non-zero at the end.
            print(f"error: job {hc.job.num} ({' '.join(hc.overrides.task)}): {err}", file=sys.stderr)
            return sweeps.JobFailed(str(err))
        optimizing = "BasicSweeper" not in str(hc.sweeper.get("_target_"))  # Optuna reads the return value
        return sweeps.objective_value(cfg, summary, warn=optimizing)

    return task
