"""A sweep's parent run in MLflow (`SweepCallback`, configured in conf/config.yaml and conf/train.yaml),
and what Ray's workers must be told to find it."""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from specresearch.records import JOB_TAG, SWEEP_TAG, process_tags
from specresearch.sweeps.destinations import check_destinations
from specresearch.sweeps.outcomes import job_outcome
from specresearch.sweeps.resume import stop_local_jobs
from specresearch.sweeps.signals import exit_on_signals, restore_signals, workers_follow_driver
from specresearch.sweeps.summary import summarize
from specresearch.tracking import PARENT_RUN_ENV, PARENT_URI_ENV, MLflowTracker

try:  # Hydra's callback base class
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object


def sweep_name(config: DictConfig) -> str:
    """A sweep's parent run name: what it sweeps, as on the command line ("sweep drafter=pld,independent
    verifier=greedy,rejection"): the sweeper's grid (a preset's) and the command line's lists; the output
    folder's name when neither sweeps anything."""
    grid = {str(k): str(v) for k, v in (OmegaConf.select(config, "hydra.sweeper.params") or {}).items()}
    for override in OmegaConf.select(config, "hydra.overrides.task") or []:
        key, _, value = str(override).partition("=")
        if "," in value or value.startswith(("range(", "choice(", "glob(")):
            grid[key.lstrip("+~")] = value
    swept = " ".join(f"{k}={v}" for k, v in grid.items())
    return f"sweep {swept}"[:250] if swept else f"sweep {Path(config.hydra.sweep.dir).name}"  # (MLflow: names up to 250 chars)


class SweepCallback(Callback):
    """Opens one MLflow parent run per multirun sweep and closes it at the end: FINISHED when every
    job finished or was skipped (`resume`), FAILED (and exit code 2) when any failed. The other jobs
    of a sweep go on after one fails; a parent left open by a crash, or by SIGTERM/SIGHUP, is closed
    as FAILED when the process exits.

    Jobs may run in other processes (joblib) or on other machines (Ray), where Hydra calls
    `on_job_end` on a copy of this callback: each job's outcome is therefore written as a tag of the
    parent run (`specresearch.job.<num>`), which the end of the sweep reads back.

    At the end the parent gets the sweep's summary (sweeps.summary: the best job's headline metrics,
    a table of the jobs, a figure against the swept knob).

    Before a single run or a sweep starts, it checks that Hydra's output folder and the tracker's
    store can be written (sweeps.check_destinations): one `error:` line and exit code 2 if not.
    """

    def __init__(self) -> None:
        self.tracker: MLflowTracker | None = None
        self.outcomes: dict[int, str] = {}  # job number -> outcome, of the jobs this process saw end
        self._signals: dict | None = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        check_destinations(config, multirun=False)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import instantiate


        check_destinations(config, multirun=True)
        workers_follow_driver()  # joblib's workers, a worker that never gets a job included, die with this driver
        tracker = instantiate(config.tracker)
        if isinstance(tracker, MLflowTracker):
            self.tracker = tracker
            tags = {SWEEP_TAG: "true", **process_tags(config)}
            tracker.start_parent(name=sweep_name(config), tags=tags)
            forward_env_to_ray(config, {key: os.environ[key] for key in (PARENT_RUN_ENV, PARENT_URI_ENV)})
        recorded = "the sweep's parent run is recorded as FAILED" if self.tracker is not None else "nothing recorded (tracker=none)"
        # so that atexit closes the parent run on SIGTERM too
        self._signals = exit_on_signals(before_exit=self._stop_jobs, announce=recorded)
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
        outcomes = {**self.outcomes, **self._recorded_outcomes()}
        failed = sorted(num for num, o in outcomes.items() if o.startswith("failed"))
        skipped = sum(o.startswith("skipped") for o in outcomes.values())
        print(f"sweep: {len(outcomes)} job{'s' * (len(outcomes) != 1)}: {len(outcomes) - skipped - len(failed)} ran, {skipped} skipped "
              f"(identical config already finished), {len(failed)} failed")
        self._summarize(outcomes, config.get("objective"))
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

    def _summarize(self, outcomes: dict[int, str], objective: str | None) -> None:
        """Give the parent run its jobs' summary (sweeps.summary); a failure there loses no job."""
        parent = os.environ.get(PARENT_RUN_ENV)
        if self.tracker is None or not parent:
            return
        try:
            summarize(self.tracker.client(), parent, outcomes, objective)
        except Exception as err:
            print(f"warning: could not summarize the sweep on its parent run: {err}", file=sys.stderr)

    def _close(self, status: str) -> None:
        if self.tracker is None:
            return
        tracker, self.tracker = self.tracker, None
        tracker.end_parent(status)
        print(f"sweep recorded as one parent run ({status}); browse it with: {tracker.browse_hint()}")


def is_ray(config: DictConfig) -> bool:
    """Whether the sweep's launcher is hydra-ray-launcher's (local or cluster)."""
    launcher = OmegaConf.select(config, "hydra.launcher")
    return launcher is not None and "RayLauncher" in str(launcher.get("_target_", "")) and "ray" in launcher


def forward_env_to_ray(config: DictConfig, env: dict[str, str]) -> None:
    """When the sweep's launcher is Ray, add `env` to `hydra.launcher.ray.init.runtime_env.env_vars`
    (merged with the user's), so that workers on every node of the cluster see the parent run and
    its tracking URI. Hydra instantiates the launcher from this config after on_multirun_start."""
    if not is_ray(config):
        return
    with read_write(config), open_dict(config):
        init = config.hydra.launcher.ray.init
        if init.get("runtime_env") is None:
            init.runtime_env = {}
        if init.runtime_env.get("env_vars") is None:
            init.runtime_env.env_vars = {}
        for key, value in env.items():
            init.runtime_env.env_vars[key] = value
