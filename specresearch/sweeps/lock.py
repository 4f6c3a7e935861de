"""The speed lock (`exclusive: true`): a speed job holds an flock on `speed.lock` in the cache folder
for its whole duration, so parallel launchers (joblib, Ray on one node) and other users' sweeps never
time two measurements against each other on one machine. Quality jobs (`eval=...`) never lock: their
timing is not the result."""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specresearch.errors import SpecResearchError


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

    Raises:
        SpecResearchError: the lock file cannot be made or opened (a path under a file, in /proc):
            one line naming it, before the job measures anything.
    """
    path = Path(path) if path is not None else lock_path()
    fd, writable = _open(path)
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


def _open(path: Path) -> tuple[int, bool]:
    """A descriptor on the lock file (made with its folder if missing), and whether it is writable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT, 0o666), True
        except PermissionError:  # another user's lock file: flock works on a read-only descriptor too
            return os.open(path, os.O_RDONLY), False
    except OSError as err:
        raise SpecResearchError(f"cannot use the speed lock {path} ($SPECRESEARCH_SPEED_LOCK, else $SPECRESEARCH_CACHE/speed.lock; "
                                f"exclusive=false measures without it): {err.strerror or err}") from None
