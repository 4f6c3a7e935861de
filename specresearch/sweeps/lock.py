"""The speed lock (`exclusive: true`): a speed job holds an flock on `speed.lock` in the cache folder
for its whole duration, so parallel launchers (joblib, Ray on one node) and other users' sweeps never
time two measurements against each other on one machine. Quality jobs (`eval=...`) never lock: their
timing is not the result. The lock orders our own processes only: `busy` tells a timed job, in one
line, that something else keeps the machine busy."""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specresearch.errors import SpecResearchError

log = logging.getLogger(__name__)
WAIT_NOTE_S = 60  # while waiting for the lock, a line this often


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
            waited, start = True, time.monotonic()
            print(f"waiting for the speed lock {path} (held by {_holder(fd)}): speed measurements on one machine run one at "
                  "a time (exclusive=false to measure concurrently)", flush=True)
            while not _try_lock(fd, timeout_s=WAIT_NOTE_S):
                print(f"still waiting for the speed lock ({_duration(time.monotonic() - start)} so far; held by "
                      f"{_holder(fd)})", flush=True)
        if writable:  # who holds it and since when, for the message of those who wait
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.time():.0f}".encode(), 0)
        warning = busy()
        if warning:  # on stdout with the run's other lines (stderr holds the progress bars and errors)
            log.info(f"warning: {warning}")
        yield waited
    finally:
        os.close(fd)  # releases the flock


def _try_lock(fd: int, timeout_s: float) -> bool:
    """Take the flock within `timeout_s` (polling), or say it is still held."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.5)


def _holder(fd: int) -> str:
    """Who holds the lock and for how long, from what the holder wrote into it ("pid P on HOST since EPOCH")."""
    text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    who, _, since = text.partition(" since ")
    if since.isdigit():
        return f"{who}, for {_duration(time.time() - int(since))}"
    return text or "another process"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def busy(sample_s: float = 0.2) -> str | None:
    """One line saying what keeps this machine busy besides this process and its children, or None:
    other processes using more than half a core (over `sample_s`, from /proc on Linux), or, elsewhere,
    a load average above the cores. A timing taken now would be off."""
    cores = os.cpu_count() or 1
    if not os.path.isdir("/proc/self/task"):
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        return f"the machine is busy (load {load:.1f} on {cores} cores): timings measured now will be off" if load > cores else None
    first = _cpu_ticks()
    time.sleep(sample_s)
    second = _cpu_ticks()
    ours = _family(second)
    ticks = os.sysconf("SC_CLK_TCK") * sample_s
    heavy = sorted(((second[pid][2] - first[pid][2]) / ticks, pid, second[pid][0]) for pid in second
                   if pid in first and pid not in ours)
    heavy = [(used, pid, name) for used, pid, name in reversed(heavy) if used > 0.5]
    if not heavy:
        return None
    shown = ", ".join(f"pid {pid} {name} at {used:.1f} cores" for used, pid, name in heavy[:3])
    return (f"the machine is busy: {shown}{' and more' if len(heavy) > 3 else ''} (of {cores} cores): "
            "timings measured now will be off")


def _cpu_ticks() -> dict[int, tuple[str, int, int]]:
    """{pid: (name, parent pid, user + system clock ticks)} of every process /proc shows."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read().decode(errors="replace")
            except OSError:  # it ended
                continue
            name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
            out[int(entry.name)] = (name, int(rest[1]), int(rest[11]) + int(rest[12]))
    return out


def _family(processes: dict[int, tuple[str, int, int]]) -> set[int]:
    """This process, its children and theirs."""
    family, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, (_, parent, _) in processes.items() if parent in family} - family
        family |= more
        grew = bool(more)
    return family


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
