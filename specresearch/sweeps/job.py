"""Everything around one job of a run or sweep (speed or eval): signals raise, `resume` may skip it,
a speed job holds the machine's speed lock; and the value it returns to an optimizing sweeper."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from omegaconf import DictConfig

from specresearch.records import config_hash
from specresearch.sweeps.lock import speed_lock
from specresearch.sweeps.outcomes import JobSkipped
from specresearch.sweeps.resume import finished_run, ignore_code, resume_on, store_tracker
from specresearch.sweeps.signals import Interrupted, driver_gone, exit_on_signals, follow_driver, restore_signals
from specresearch.tracking import runs_opened


@contextmanager
def job(cfg: DictConfig, multirun: bool, timed: bool = True) -> Iterator[JobSkipped | None]:
    """Everything around one job (speed, eval or training): signals raise, `resume` may skip it, a
    speed job holds the machine's speed lock, a job in a sweep's worker process dies with the sweep's
    driver (`signals.follow_driver`: its run recorded FAILED, then the worker exits).

    Args:
        cfg: the job's composed config.
        multirun: whether the job is part of a sweep (`resume: auto` is on only then).
        timed: whether the job's result is a timing (False for training); then a speed job
            (not `eval=...`) holds the speed lock unless `exclusive=false`.

    Yields:
        JobSkipped when an identical config already finished, measured by the same code unless
        `resume_ignore_code=true` (do not run it), else None (run it).
    """
    previous = exit_on_signals()
    before = len(runs_opened())
    try:
        follow_driver()  # a sweep's worker process (joblib's) dies with its driver, SIGKILL included
        reuse_any = ignore_code(cfg)
        tracker = store_tracker(cfg) if resume_on(cfg, multirun) else None
        digest = config_hash(cfg) if tracker is not None else ""
        lookup = (digest, cfg.get("objective"), reuse_any, cfg.get("study"))
        if tracker is not None and (done := finished_run(tracker, *lookup)) is not None:
            yield done
            return
        if timed and cfg.get("eval") is None and cfg.get("exclusive", True):
            with speed_lock() as waited:
                if waited and tracker is not None and (done := finished_run(tracker, *lookup)) is not None:
                    yield done  # measured by someone else while this job waited
                    return
                yield None
        else:
            yield None
    except Interrupted as stop:
        run = next(iter(runs_opened()[before:]), None)  # this job's run, if it opened one
        print(stop.report(run), file=sys.stderr, flush=True)  # once recorded: the last line, after the progress bar's
        if driver_gone():  # no driver to return to: joblib's worker would wait minutes for more work
            sys.stdout.flush()
            os._exit(stop.code)
        raise
    finally:
        restore_signals(previous)



def objective_value(cfg: DictConfig, summary: dict[str, float] | None, warn: bool = False) -> float | None:
    """The job's return value for Optuna: the summary metric `cfg.objective` (e.g. speedup), or None
    when it is not set or not a finite number (Optuna's sweeper then records a failed trial; NaN
    would crash its study). `warn`: say so on stderr."""
    name = cfg.get("objective")
    if not name or summary is None:
        return None
    value = summary.get(name)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    if warn:
        print(f"warning: objective '{name}' is not a finite metric of this run ({value}): an optimizing sweeper counts "
              "the trial as failed", file=sys.stderr)
    return None

