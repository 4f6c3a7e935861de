"""During a job SIGTERM, SIGHUP and SIGINT (Ctrl-C) raise SystemExit(128 + signal) in the main thread,
so the run ends FAILED with what it had measured (specresearch.tracking.tracked_run records on any
BaseException), or nothing is recorded when no run had opened yet (`Interrupted.report` says which);
the sweep's parent run is then closed FAILED by the callback's atexit. A job in a worker process of a
sweep's driver (joblib's) dies with the driver, even one killed by SIGKILL (`follow_driver`; an idle
worker too: `workers_follow_driver`)."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from specresearch.interrupts import STOP_SIGNALS

DRIVER_POLL_S = 1.0  # how often a worker looks whether its driver is still there
DRIVER_GRACE_S = 60.0  # after its SIGTERM, how long a worker whose driver is gone may take to record its run FAILED
REDELIVER_S = 0.05  # after Python dropped the handler's exception (raised inside a finalizer), when the signal comes again


class Interrupted(SystemExit):
    """SystemExit(128 + signal), raised by `exit_on_signals`' handler."""

    recorded = "FAILED"  # its run's status: FINISHED when it came while a finished run was being recorded (held back)
    rearm: Callable[[], None] | None = None  # what `_Redeliver` calls when Python dropped it (exit_on_signals' handler)

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum, self.signal_name = signum, signal.Signals(signum).name

    def report(self, run: str | None) -> str:
        """The line that says what the interruption left, given the job's run: its MLflow id (recorded
        FAILED by tracking.tracked_run, or FINISHED: `recorded`), "" for a run that records nothing (tracker=none), None when
        no run had opened yet (a model loading, the speed lock awaited)."""
        if run is None:
            return f"interrupted by {self.signal_name} before a run opened: nothing recorded"
        if not run:
            return f"interrupted by {self.signal_name}: nothing recorded (tracker=none)"
        if self.recorded == "FINISHED":
            return f"interrupted by {self.signal_name} as its run ended: the run is recorded as FINISHED"
        return f"interrupted by {self.signal_name}: the run is recorded as FAILED with what it measured"


def exit_on_signals(before_exit: Callable[[int], None] | None = None, announce: str | None = None) -> dict | None:
    """From now on SIGTERM, SIGHUP and SIGINT raise SystemExit(128 + signal) in the main thread, so
    `finally` and `except BaseException` blocks record what was measured and atexit handlers run (the
    default action of the first two kills the process on the spot; Ctrl-C's KeyboardInterrupt would
    end in a traceback). A second signal while the first is being handled is ignored (SIGKILL still
    ends it). A signal this process was started ignoring stays ignored: `nohup` (SIGHUP), a script's
    background job (SIGINT).

    Args:
        before_exit: called with the signal number before SystemExit is raised.
        announce: what is recorded, said on stderr at once after "interrupted by SIGNAL: "; None:
            the catcher of `Interrupted` says so (`job`, once the run is recorded, so that its line is
            the last).

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
        stop.rearm = rearm
        if announce is not None:
            os.write(2, f"\ninterrupted by {name}: {announce}\n".encode())  # not print: reentrancy
        if before_exit is not None:
            before_exit(signum)
        raise stop

    def rearm() -> None:
        nonlocal stopping
        stopping = False

    if not isinstance(sys.unraisablehook, _Redeliver):
        sys.unraisablehook = _Redeliver(sys.unraisablehook)
    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}


class _Redeliver:
    """sys.unraisablehook: an `Interrupted` that Python dropped (raised by exit_on_signals' handler inside a finalizer,
    e.g. a weakref callback of the collector) re-arms its handler and is sent again REDELIVER_S later from a thread, so
    that it is raised where the main thread is next; anything else goes to the hook there was."""

    def __init__(self, hook: Callable[[Any], None]) -> None:
        self.hook = hook

    def __call__(self, unraisable: Any) -> None:
        stop = unraisable.exc_value
        if not (isinstance(stop, Interrupted) and stop.rearm is not None):
            self.hook(unraisable)
            return
        stop.rearm()
        os.write(2, f"\n{stop.signal_name} came inside a finalizer, which drops exceptions: sent again\n".encode())
        threading.Timer(REDELIVER_S, os.kill, (os.getpid(), stop.signum)).start()


def restore_signals(previous: dict | None) -> None:
    """Put back the handlers `exit_on_signals` replaced."""
    for sig, old in (previous or {}).items():
        signal.signal(sig, old if old is not None else signal.SIG_DFL)


def driver_gone() -> bool:
    """Whether this process is a worker whose driver (the process that started it: joblib's launcher
    in a sweep's `python -m specresearch -m`) has died: the worker was handed to another parent."""
    driver = multiprocessing.parent_process()
    return driver is not None and os.getppid() != driver.pid


_following: list[threading.Thread] = []  # the watch thread, once per process


def follow_driver() -> None:
    """In a worker process of a sweep's driver (joblib's launcher starts them), end this process when
    the driver dies, killed by SIGKILL included: nothing else would (joblib's workers wait minutes
    for more work, a running job measures on, their files stay in /dev/shm until the workers go).
    A thread looks every DRIVER_POLL_S seconds; once the driver is gone it sends this process SIGTERM,
    which ends a running job FAILED with what it measured (`exit_on_signals`) or an idle worker at
    once, and after DRIVER_GRACE_S more it exits. Nothing happens in the driver's own process (the
    basic launcher's jobs, a single run) nor on a second call.
    """
    driver = multiprocessing.parent_process()
    if driver is None or _following:
        return
    watch = threading.Thread(target=_watch_driver, args=(driver.pid,), name="specresearch-follow-driver", daemon=True)
    _following.append(watch)
    watch.start()


def workers_follow_driver() -> None:
    """In a sweep's driver: joblib's workers start following it (`follow_driver`) as they start, as loky's
    initializer, so a worker that never got a job ends with a killed driver too (it waited out loky's
    5-minute idle timeout). Hydra's joblib launcher asks for the backend "loky" by name: joblib's
    register_parallel_backend gives that name a LokyBackend with the initializer. Nothing without joblib."""
    try:
        from joblib import register_parallel_backend
        from joblib._parallel_backends import LokyBackend
    except ImportError:
        return
    register_parallel_backend("loky", functools.partial(LokyBackend, initializer=follow_driver))


def _watch_driver(driver: int) -> None:
    while os.getppid() == driver:  # (a worker whose driver died belongs to another parent: init or a subreaper)
        time.sleep(DRIVER_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(DRIVER_GRACE_S)  # a job that swallowed its SystemExit, or hangs while recording
    os._exit(128 + signal.SIGTERM)
