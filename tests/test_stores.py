"""stores.file_lock, the lock that serializes creating a store: made if missing, held by one holder at a time
(threads and processes alike), released when the block ends or the holder dies, on another user's
read-only lock file too. (The store checks and mark_dead_runs are tested with the runs: tests/test_faults.py,
tests/sweeps/.)"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from filelock import FileLock, Timeout, lock_descriptor

from specresearch.stores import file_lock
from tests.helpers import ROOT


def held_elsewhere(path) -> bool:
    """Whether another holder has the lock on `path`: a FileLock of this thread cannot take it at once."""
    lock = FileLock(path)
    try:
        lock.acquire(timeout=0.1)
    except Timeout:
        return True
    lock.release()
    return False


def second_holder(path) -> tuple[threading.Thread, threading.Event]:
    """A thread that takes file_lock(path) (an object of its own) and sets the event once it holds it."""
    entered = threading.Event()

    def hold():
        with file_lock(path):
            entered.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread, entered


def test_a_second_holder_waits_until_the_first_releases_and_the_file_is_made_and_stays(tmp_path):
    path = tmp_path / "mlflow.db.lock"
    with file_lock(path):
        assert path.is_file() and held_elsewhere(path)
        thread, entered = second_holder(path)
        assert not entered.wait(0.5)  # it waits
    assert entered.wait(10)
    thread.join(10)
    assert path.is_file() and not held_elsewhere(path)  # released, and the file stays for the next holders


def test_a_body_that_raises_releases_the_lock(tmp_path):
    path = tmp_path / "mlflow.db.lock"
    with pytest.raises(ValueError, match="^the body$"), file_lock(path):
        raise ValueError("the body")
    assert not held_elsewhere(path)


def test_a_holder_killed_in_the_block_releases_the_lock(tmp_path):
    path = tmp_path / "mlflow.db.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom specresearch.stores import file_lock\n"
                               f"with file_lock(Path({str(path)!r})):\n    print('held', flush=True)\n    time.sleep(600)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        assert held_elsewhere(path)  # another process holds it: this one cannot take it
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        start = time.monotonic()
        with file_lock(path):
            assert time.monotonic() - start < 5
    finally:
        holder.kill()
        holder.wait(10)


def test_another_users_read_only_lock_file_serves_too(tmp_path, monkeypatch):
    """FileLock refuses a lock file it cannot open for writing; file_lock flocks it read-only, and holders still
    exclude each other."""
    path = tmp_path / "mlflow.db.lock"
    path.write_text("")
    path.chmod(0o444)
    if os.geteuid() == 0:  # root opens any file for writing: answer as the OS answers every other user
        real_open = os.open

        def read_only_open(file, flags, *args, **kwargs):
            if os.fspath(file) == str(path) and flags & (os.O_WRONLY | os.O_RDWR):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(file))
            return real_open(file, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", read_only_open)
    with pytest.raises(PermissionError):
        FileLock(path).acquire(timeout=1)  # what file_lock falls back from
    with file_lock(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            assert not lock_descriptor(fd, blocking=False)  # held
        finally:
            os.close(fd)
        thread, entered = second_holder(path)
        assert not entered.wait(0.5)
    assert entered.wait(10)
    thread.join(10)
