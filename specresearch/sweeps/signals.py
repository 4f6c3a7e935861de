"""During a job SIGTERM, SIGHUP and SIGINT (Ctrl-C) raise SystemExit(128 + signal) in the main thread,
so the run ends FAILED with what it had measured (specresearch.tracking.tracked_run records on any
BaseException), or nothing is recorded when no run had opened yet (`Interrupted.report` says which);
the sweep's parent run is then closed FAILED by the callback's atexit."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Interrupted(SystemExit):
    """SystemExit(128 + signal), raised by `exit_on_signals`' handler."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signal_name = signal.Signals(signum).name

    def report(self, run: str | None) -> str:
        """The line that says what the interruption left, given the job's run: its MLflow id (recorded
        FAILED by tracking.tracked_run), "" for a run that records nothing (tracker=none), None when
        no run had opened yet (a model loading, the speed lock awaited)."""
        if run is None:
            return f"interrupted by {self.signal_name} before a run opened: nothing recorded"
        if not run:
            return f"interrupted by {self.signal_name}: nothing recorded (tracker=none)"
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
        if announce is not None:
            os.write(2, f"\ninterrupted by {name}: {announce}\n".encode())  # not print: reentrancy
        if before_exit is not None:
            before_exit(signum)
        raise stop

    return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}



def restore_signals(previous: dict | None) -> None:
    """Put back the handlers `exit_on_signals` replaced."""
    for sig, old in (previous or {}).items():
        signal.signal(sig, old if old is not None else signal.SIG_DFL)

