"""The signals that stop a job (SIGTERM, SIGHUP, SIGINT), and holding them while a run opens or is recorded
(tracking.tracked_run), so that a stop never leaves a run half written. sweeps.signals turns them into SystemExit."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextmanager
def held_signals() -> Iterator[None]:
    """SIGTERM, SIGHUP and SIGINT wait while the block runs: the first of them is delivered after it, to the handler
    that was in place (sweeps.exit_on_signals' raises SystemExit). What opens or records a run is not cut in two by
    a stop; a second signal is delivered at once (a record that hangs can still be stopped). Nothing off the main
    thread, where Python cannot set handlers, nor for a signal that is ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []  # the signals that came
    delivered = False

    def deliver() -> None:
        nonlocal delivered
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)
        if held and not delivered:
            delivered = True
            signal.raise_signal(held[0])

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)
        if len(held) > 1:
            deliver()

    previous = {sig: signal.signal(sig, hold) for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        deliver()
