"""resume (`resume: auto`, on in sweeps): before a job runs, MLflow is asked for a FINISHED run of the
same config (`records.config_hash`) in the same experiment, measured by the same code
(`records.same_code`: commit and dirty flag, or the package version outside a checkout), and then the
study's committed runs (`committed_run`: a study goes on on another machine); if there is one the job
is skipped. A run of the same config measured by other code is re-run, with one line
saying so, unless `resume_ignore_code=true`. RUNNING runs left by a killed process (same host, pid
gone) are marked FAILED first (specresearch.stores.mark_dead_runs), so a sweep started again
re-runs exactly what did not finish."""

from __future__ import annotations

import json
import logging
import os
import time

from omegaconf import DictConfig

from specresearch.errors import SpecResearchError
from specresearch.records import HASH_TAG, HOST_TAG, PARENT_TAG, PID_TAG, code_of, code_tags, committed_study, same_code
from specresearch.stores import local_pid, mark_dead_runs, pid_alive
from specresearch.sweeps.outcomes import JobSkipped
from specresearch.tracking import MLflowTracker

log = logging.getLogger(__name__)
_SAID: set[str] = set()  # the re-run lines this process has said (a job that waited for the speed lock asks twice)


def resume_on(cfg: DictConfig, multirun: bool) -> bool:
    """`resume`: auto = on in a sweep, off for a single run; true/false force it."""
    value = cfg.get("resume", "auto")
    if isinstance(value, bool):
        return value
    if value == "auto":
        return multirun
    raise SpecResearchError(f"resume must be auto, true or false, got {value!r}")


def ignore_code(cfg: DictConfig) -> bool:
    """`resume_ignore_code`: true = resume reuses a finished run of the same config even when other
    code measured it; false (the default) = such a job runs again."""
    value = cfg.get("resume_ignore_code", False)
    if not isinstance(value, bool):
        raise SpecResearchError(f"resume_ignore_code must be true or false, got {value!r}")
    return value


def store_tracker(cfg: DictConfig) -> MLflowTracker | None:
    if "tracker" not in cfg:
        return None
    from hydra.utils import instantiate

    tracker = instantiate(cfg.tracker)
    return tracker if isinstance(tracker, MLflowTracker) else None


def finished_run(tracker: MLflowTracker, digest: str, objective: str | None = None,
                 any_code: bool = False, study: str | None = None) -> JobSkipped | None:
    """The latest FINISHED run with config hash `digest` in the tracker's experiment measured by this
    process's code (records.same_code; by any code with `any_code`), as the job's return value (with
    the run's `objective` metric); else such a run among `study`'s committed runs (`committed_run`: a
    study resumed on a machine whose store lacks them); None if there is none, with one line naming the
    latest such run of the store when only other code measured the config. First, RUNNING runs whose
    process is gone (this host, pid dead: a SIGKILL, a power cut) are marked FAILED with the tag
    `specresearch.interrupted` (stores.mark_dead_runs: also done once when a process opens a store).

    Same code means the same commit and dirty flag (and, dirty, the same digest of the uncommitted
    changes), or the same specresearch version outside a checkout: a dirty tree cannot be proven equal
    to another beyond that, so any other difference counts as other code, as does a run that
    recorded none."""
    experiment = tracker.experiment_id()
    runs = []  # none where nothing was ever recorded (no experiment)
    if experiment is not None:
        client = tracker.client()
        mark_dead_runs(client)  # again: a job of this sweep may have died since the store was opened
        runs = client.search_runs([experiment], filter_string=f"tags.`{HASH_TAG}` = '{digest}'",
                                  order_by=["attributes.start_time DESC"], max_results=1000)
    for run in runs:
        if run.info.status == "RUNNING":
            tags = run.data.tags
            log.info(f"note: run {run.info.run_id} of this config is RUNNING (host {tags.get(HOST_TAG, '?')}, "
                     f"pid {tags.get(PID_TAG, '?')}); measuring it here too")
    finished = [run for run in runs if run.info.status == "FINISHED"]
    current = code_tags()
    done = next((run for run in finished if any_code or same_code(run.data.tags, current)), None)
    if done is None and (kept := committed_run(study, digest, objective, any_code)) is not None:
        return kept
    if done is None:
        if not finished:
            return None
        latest = finished[0]
        line = (f"re-running: run {latest.info.run_id} of this config was measured by code {code_of(latest.data.tags)} "
                f"(now {code_of(current)}); resume_ignore_code=true to reuse it")
        if line not in _SAID:
            _SAID.add(line)
            log.info(line)
        return None
    log.info(f"skipped: identical config already finished as run {done.info.run_id} (resume=false to measure again)")
    value = done.data.metrics.get(objective.replace("@", "_at_")) if objective else None  # MLflow's names (tracking.log_metrics)
    return JobSkipped(done.info.run_id, value)


def committed_run(study: str | None, digest: str, objective: str | None = None, any_code: bool = False) -> JobSkipped | None:
    """The latest FINISHED run with config hash `digest` among study `study`'s committed runs (records.committed_study:
    what the analysis' save=true wrote from another machine's store), measured by this process's code (by any code with
    `any_code`), as the job's return value; None where there is none, no study or no readable committed file."""
    if not study:
        return None
    path = committed_study(study)
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["data"]["runs"]
        found = sorted((r for r in runs if r["status"] == "FINISHED" and r["tags"].get(HASH_TAG) == digest),
                       key=lambda r: r["start"], reverse=True)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        log.info(f"note: the committed runs in {path} are not readable ({type(err).__name__}): resume looks in the store only")
        return None
    current = code_tags()
    done = next((r for r in found if any_code or same_code(r["tags"], current)), None)
    if done is None:
        return None
    log.info(f"skipped: identical config already finished as run {done['id']}, committed in {path.name} (resume=false to "
             "measure again)")
    value = done["metrics"].get(objective.replace("@", "_at_")) if objective else None
    return JobSkipped(done["id"], value)


def stop_local_jobs(tracker: MLflowTracker, parent: str, signum: int, grace_s: float = 60.0) -> None:
    """Pass `signum` on to the jobs of the sweep `parent` that run in other processes of this machine
    (joblib workers, local Ray workers: their RUNNING runs name host and pid), and wait up to `grace_s`
    for them to record their runs FAILED: a parallel launcher kills its workers as soon as the sweep's
    driver exits. Jobs on other machines are left to their launcher (resume marks their runs later,
    from their own host)."""
    experiment = tracker.experiment_id()
    if experiment is None:
        return
    client = tracker.client()

    def running() -> set[int]:
        found = client.search_runs([experiment], filter_string=f"tags.`{PARENT_TAG}` = '{parent}' and attributes.status = 'RUNNING'")
        return {pid for pid in map(local_pid, found) if pid is not None and pid_alive(pid)}

    pids = running()
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while pids and time.monotonic() < deadline:
        time.sleep(0.5)
        pids &= running()

