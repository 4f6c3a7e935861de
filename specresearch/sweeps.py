"""Sweeps that survive: resume, interrupted jobs, and one speed measurement at a time per machine.

- **resume** (`resume: auto`, on in sweeps): before a job runs, MLflow is asked for a FINISHED run of
  the same config (`tracking.config_hash`) in the same experiment; if there is one the job is skipped.
  RUNNING runs of that config left by a killed process (same host, pid gone) are marked FAILED first,
  so a sweep started again re-runs exactly what did not finish.
- **signals**: during a job SIGTERM, SIGHUP and SIGINT (Ctrl-C) raise SystemExit(128 + signal) in the
  main thread, so the run ends FAILED with what it had measured (experiment.run and run_eval record
  on any BaseException); the sweep's parent run is then closed FAILED by the callback's atexit.
- **where results go** is checked before anything runs (`check_destinations`): Hydra's output folder
  and the tracker's store; a run refused before it measured anything leaves no empty output folder
  behind (`discard_refused_run`).
- **the speed lock** (`exclusive: true`): a speed job holds an flock on `speed.lock` in the cache
  folder for its whole duration, so parallel launchers (joblib, Ray on one node) and other users'
  sweeps never time two measurements against each other on one machine. Quality jobs (`eval=...`)
  never lock: their timing is not the result.
"""

from __future__ import annotations

import fcntl
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specresearch.errors import SpecResearchError
from specresearch.tracking import HASH_TAG, HOST_TAG, PID_TAG, JobSkipped, MLflowTracker, config_hash, write_problem

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
INTERRUPTED_TAG = "specresearch.interrupted"


@contextmanager
def job(cfg: DictConfig, multirun: bool) -> Iterator[JobSkipped | None]:
    """Everything around one job (speed or eval): signals raise, `resume` may skip it, a speed job
    holds the machine's speed lock.

    Args:
        cfg: the job's composed config.
        multirun: whether the job is part of a sweep (`resume: auto` is on only then).

    Yields:
        JobSkipped when an identical config already finished (do not run it), else None (run it).
    """
    previous = exit_on_signals(announce=False)
    try:
        tracker = _tracker(cfg) if resume_on(cfg, multirun) else None
        digest = config_hash(cfg) if tracker is not None else ""
        if tracker is not None and (done := finished_run(tracker, digest, cfg.get("objective"))) is not None:
            yield done
            return
        if cfg.get("eval") is None and cfg.get("exclusive", True):
            with speed_lock() as waited:
                if waited and tracker is not None and (done := finished_run(tracker, digest, cfg.get("objective"))) is not None:
                    yield done  # measured by someone else while this job waited
                    return
                yield None
        else:
            yield None
    except Interrupted as stop:
        print(stop.message, file=sys.stderr, flush=True)  # once recorded: the last line, after the progress bar's
        raise
    finally:
        restore_signals(previous)


def resume_on(cfg: DictConfig, multirun: bool) -> bool:
    """`resume`: auto = on in a sweep, off for a single run; true/false force it."""
    value = cfg.get("resume", "auto")
    if isinstance(value, bool):
        return value
    if value == "auto":
        return multirun
    raise SpecResearchError(f"resume must be auto, true or false, got {value!r}")


def _tracker(cfg: DictConfig) -> MLflowTracker | None:
    if "tracker" not in cfg:
        return None
    from hydra.utils import instantiate

    tracker = instantiate(cfg.tracker)
    return tracker if isinstance(tracker, MLflowTracker) else None


def finished_run(tracker: MLflowTracker, digest: str, objective: str | None = None) -> JobSkipped | None:
    """The latest FINISHED run with config hash `digest` in the tracker's experiment, as the job's
    return value (with the run's `objective` metric); None if there is none. On the way, RUNNING runs
    of that config whose process is gone (this host, pid dead: a SIGKILL, a power cut) are marked
    FAILED with the tag `specresearch.interrupted`, and so is their sweep's parent run if its own
    process is gone too."""
    experiment = tracker.experiment_id()
    if experiment is None:  # nothing was ever recorded there
        return None
    client = tracker.client()
    runs = client.search_runs([experiment], filter_string=f"tags.`{HASH_TAG}` = '{digest}'",
                              order_by=["attributes.start_time DESC"], max_results=1000)
    for run in runs:
        if run.info.status == "RUNNING":
            if _gone(run):
                _mark_interrupted(client, run, "run")
                parent = run.data.tags.get("mlflow.parentRunId")
                if parent:
                    parent_run = client.get_run(parent)
                    if parent_run.info.status == "RUNNING" and _gone(parent_run):
                        _mark_interrupted(client, parent_run, "the sweep's parent run")
            else:
                tags = run.data.tags
                print(f"note: run {run.info.run_id} of this config is RUNNING (host {tags.get(HOST_TAG, '?')}, "
                      f"pid {tags.get(PID_TAG, '?')}); measuring it here too")
    done = next((run for run in runs if run.info.status == "FINISHED"), None)
    if done is None:
        return None
    print(f"skipped: identical config already finished as run {done.info.run_id} (resume=false to measure again)", flush=True)
    value = done.data.metrics.get(objective.replace("@", "_at_")) if objective else None  # MLflow's names (tracking.log_metrics)
    return JobSkipped(done.info.run_id, value)


def _local_pid(run: Any) -> int | None:
    """The pid of the process that recorded `run` when it ran on this host and is not this process;
    None otherwise (another host, no or a bad pid tag, ourselves)."""
    tags = run.data.tags
    pid = tags.get(PID_TAG, "")
    if tags.get(HOST_TAG) != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return None
    return int(pid)


def _gone(run: Any) -> bool:
    """Whether the process that recorded `run` is known to be dead: it ran on this host and its pid
    is not alive (a reused pid reads as alive: the run is then left alone)."""
    pid = _local_pid(run)
    return pid is not None and not pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this machine and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    try:  # a killed child that nobody reaped yet is dead all the same
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _mark_interrupted(client: Any, run: Any, what: str) -> None:
    client.set_tag(run.info.run_id, INTERRUPTED_TAG, "true")
    client.set_terminated(run.info.run_id, status="FAILED")
    print(f"marked {what} {run.info.run_id} FAILED: interrupted (its process {run.data.tags.get(PID_TAG)} is gone)", flush=True)


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


# --- signals ---------------------------------------------------------------------------------------

class Interrupted(SystemExit):
    """SystemExit(128 + signal), raised by `exit_on_signals`' handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.message = f"interrupted by {signal.Signals(signum).name}: the run is recorded as FAILED with what it measured"


def exit_on_signals(before_exit: Callable[[int], None] | None = None, announce: bool = True) -> dict | None:
    """From now on SIGTERM, SIGHUP and SIGINT raise SystemExit(128 + signal) in the main thread, so
    `finally` and `except BaseException` blocks record what was measured and atexit handlers run (the
    default action of the first two kills the process on the spot; Ctrl-C's KeyboardInterrupt would
    end in a traceback). A second signal while the first is being handled is ignored (SIGKILL still
    ends it). A signal this process was started ignoring stays ignored: `nohup` (SIGHUP), a script's
    background job (SIGINT).

    Args:
        before_exit: called with the signal number before SystemExit is raised.
        announce: say so on stderr at once; without it the catcher of `Interrupted` says so (`job`,
            once the run is recorded, so that its line is the last).

    Returns:
        The previous handlers, for `restore_signals`; None off the main thread, where Python cannot
        install handlers.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    stopping = False

    def handler(signum: int, frame: Any) -> None:
        nonlocal stopping
        name = signal.Signals(signum).name
        if stopping:
            os.write(2, f"{name} again: still recording the interrupted run (SIGKILL to stop at once)\n".encode())
            return
        stopping = True
        stop = Interrupted(signum)
        if announce:
            os.write(2, f"\n{stop.message}\n".encode())  # not print: reentrancy
        if before_exit is not None:
            before_exit(signum)
        raise stop

    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}


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
        found = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and attributes.status = 'RUNNING'")
        return {pid for pid in map(_local_pid, found) if pid is not None and pid_alive(pid)}

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


def restore_signals(previous: dict | None) -> None:
    """Put back the handlers `exit_on_signals` replaced."""
    for sig, old in (previous or {}).items():
        signal.signal(sig, old if old is not None else signal.SIG_DFL)


# --- where results go -------------------------------------------------------------------------------

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into `hydra.output_subdir`
_MADE_FOR_RUN: list[Path] = []  # the single run's output folder and the parents Hydra makes with it, deepest first


def check_destinations(config: DictConfig, multirun: bool) -> None:
    """Before anything runs (SweepCallback.on_run_start / on_multirun_start): Hydra's output folder
    (`hydra.run.dir`, or `hydra.sweep.dir` for a sweep) and the tracker's store must be writable; else
    print one `error:` line naming the path and exit 2, instead of a traceback once the models have
    loaded. For a single run, note the folders Hydra is about to make for it (`discard_refused_run`).

    Args:
        config: the composed config, with its `hydra` node.
        multirun: a sweep (`-m`).
    """
    from hydra.utils import instantiate

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder: Path | None = Path(os.path.abspath(str(OmegaConf.select(config, key))))
    except Exception:  # resolvable only once the job runs (`${hydra:...}`): left to Hydra
        folder = None
    try:
        problem = write_problem(folder) if folder is not None else None
        if problem is not None:
            raise SpecResearchError(f"cannot write Hydra's output folder {folder} ({key}): {problem}")
        try:
            tracker = instantiate(config.tracker) if "tracker" in config else None
        except Exception:  # a bad tracker config: validate.check_config refuses it in one line when the job starts
            tracker = None
        if hasattr(tracker, "check"):
            tracker.check()
    except SpecResearchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if not multirun:
        _MADE_FOR_RUN[:] = [path for path in [folder, *folder.parents] if not path.exists()] if folder is not None else []


def discard_refused_run() -> None:
    """After a single run was refused before it measured anything: remove what Hydra made for it
    (the `.hydra/` files and the job log in its output folder, then that folder and the parents Hydra
    made with it, e.g. the day folder of outputs/DATE/TIME/). Only folders that did not exist before
    the run (`check_destinations`) and hold nothing else are touched; nothing in a sweep, whose job
    folders are its record of each job."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    out = Path(os.path.abspath(hc.runtime.output_dir))
    if not _MADE_FOR_RUN or _MADE_FOR_RUN[0] != out:  # the folder was there before: not ours to remove
        return
    log, sub = f"{hc.job.name}.log", hc.output_subdir
    try:
        if {path.name for path in out.iterdir()} - {log, sub}:
            return  # something else was written there (a measured run's records): keep all of it
        if sub and (out / sub).is_dir():
            if {path.name for path in (out / sub).iterdir()} - set(HYDRA_FILES):
                return
            for name in HYDRA_FILES:
                (out / sub / name).unlink(missing_ok=True)
            (out / sub).rmdir()
        (out / log).unlink(missing_ok=True)
        for folder in _MADE_FOR_RUN:
            folder.rmdir()  # fails on the first folder that holds something else: it and its parents stay
    except OSError:
        pass


# --- the speed lock ---------------------------------------------------------------------------------

def lock_path() -> Path:
    """$SPECRESEARCH_SPEED_LOCK (a file every user of the machine can open, to serialize them all),
    else $SPECRESEARCH_CACHE/speed.lock, else speed.lock in the user cache folder."""
    import platformdirs

    if os.environ.get("SPECRESEARCH_SPEED_LOCK"):
        return Path(os.environ["SPECRESEARCH_SPEED_LOCK"])
    root = os.environ.get("SPECRESEARCH_CACHE") or platformdirs.user_cache_dir("specresearch")
    return Path(root) / "speed.lock"


@contextmanager
def speed_lock(path: str | Path | None = None) -> Iterator[bool]:
    """Hold the machine's speed lock (an exclusive flock), waiting for it if another process holds it;
    it is released when the block ends or the process dies.

    Args:
        path: the lock file; default `lock_path()`.

    Yields:
        Whether it had to wait.
    """
    path = Path(path) if path is not None else lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, writable = os.open(path, os.O_RDWR | os.O_CREAT, 0o666), True
    except PermissionError:  # another user's lock file: flock works on a read-only descriptor too
        fd, writable = os.open(path, os.O_RDONLY), False
    try:
        waited = False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            print(f"waiting for the speed lock {path} (held by {holder}): speed measurements on one machine run one at a "
                  "time (exclusive=false to measure concurrently)", flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        if writable:  # who holds it, for the message of those who wait
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield waited
    finally:
        os.close(fd)  # releases the flock


# --- launchers --------------------------------------------------------------------------------------

def is_ray(config: DictConfig) -> bool:
    """Whether the sweep's launcher is hydra-ray-launcher's (local or cluster)."""
    launcher = OmegaConf.select(config, "hydra.launcher")
    return launcher is not None and "RayLauncher" in str(launcher.get("_target_", "")) and "ray" in launcher


def forward_env_to_ray(config: DictConfig, env: dict[str, str]) -> None:
    """When the sweep's launcher is Ray, add `env` to `hydra.launcher.ray.init.runtime_env.env_vars`
    (merged with the user's), so that workers on every node of the cluster see the parent run and
    its tracking URI. Hydra instantiates the launcher from this config after on_multirun_start."""
    from omegaconf import open_dict, read_write

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
