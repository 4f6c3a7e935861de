"""Where runs are recorded, checked before a run opens: a local store's folder (writable, a path MLflow's
sqlite URI can hold, an MLflow database), a tracking server that answers; the flock that serializes
creating a store; and the runs whose process died, marked FAILED (`mark_dead_runs`)."""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from specresearch.records import (
    HOST_TAG,
    INTERRUPTED_TAG,
    PID_TAG,
)

log = logging.getLogger(__name__)



SERVER_TIMEOUT_S = 3.0  # how long `check` waits for a tracking server's answer


UNQUOTED = "?%"  # characters a store path cannot hold: MLflow's sqlite URI reads them as a query, an escape


def store_path_problem(store: Path) -> str | None:
    """Why `store` cannot be a local store's folder: it holds a character of UNQUOTED, which MLflow's
    sqlite URI does not keep (`a?b` would write the database `a`); None when it can."""
    bad = sorted({char for char in str(store) if char in UNQUOTED})
    if not bad:
        return None
    return f"tracker.store cannot hold {' or '.join(map(repr, bad))} (MLflow's sqlite URI reads them otherwise), got {store}"


def database_problem(db: Path) -> str | None:
    """Why the existing file `db` is not an MLflow database (not sqlite, or sqlite without MLflow's
    tables); None when it is one, is empty or does not exist (MLflow creates it). Reads only."""
    if not db.is_file():
        return None
    try:
        with closing(sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=30)) as connection:
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.OperationalError:  # locked by a writer, unreadable: MLflow says what it finds
        return None
    except sqlite3.DatabaseError as err:
        return f"{db} is not an MLflow database (sqlite: {err})"
    if tables and "experiments" not in tables:
        return f"{db} is not an MLflow database (it has no experiments table)"
    return None


def server_problem(uri: str, timeout: float = SERVER_TIMEOUT_S) -> str | None:
    """Why the tracking server at `uri` (http or https) cannot be reached within `timeout` seconds;
    None when it answers (any HTTP status), or for another kind of URI. One GET of its /health, no
    retries: MLflow's own client retries for minutes before it gives up."""
    if not uri.startswith(("http://", "https://")):
        return None
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
    except urllib.error.HTTPError:  # it answered
        return None
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", None) or err
        return f"cannot reach the MLflow server {uri} (tracker.uri) within {timeout:g} s: {reason}"
    return None


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


def local_pid(run: Any) -> int | None:
    """The pid of the process that recorded `run` (tags HOST_TAG, PID_TAG) when it ran on this host
    and is not this process; None otherwise (another host, no or a bad pid tag, ourselves)."""
    tags = run.data.tags
    pid = tags.get(PID_TAG, "")
    if tags.get(HOST_TAG) != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return None
    return int(pid)


def mark_dead_runs(client: Any) -> list[str]:
    """Mark FAILED, tagged INTERRUPTED_TAG, every RUNNING run of the store (jobs, single runs, sweep
    parents, in every experiment) whose process ran on this host and is dead; what they logged stays.
    Runs of other hosts, and runs whose pid is alive (a reused pid too), are left alone.

    Args:
        client: an MlflowClient on the store.

    Returns:
        The ids of the runs marked.
    """
    experiments = [e.experiment_id for e in client.search_experiments()]
    marked = []
    for start in range(0, len(experiments), 100):  # MLflow searches at most 100 experiments at once
        for run in client.search_runs(experiments[start:start + 100], filter_string="attributes.status = 'RUNNING'",
                                      max_results=10000):
            pid = local_pid(run)
            if pid is None or pid_alive(pid):
                continue
            client.set_tag(run.info.run_id, INTERRUPTED_TAG, "true")
            client.set_terminated(run.info.run_id, status="FAILED")
            log.info(f"marked run {run.info.run_id} FAILED: interrupted (its process {pid} on this host is gone)")
            marked.append(run.info.run_id)
    return marked


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (filelock's FileLock: an flock; the file is created if missing
    and stays; another user's read-only file serves too), waiting for it; released when the block ends
    or the process dies."""
    from filelock import FileLock, lock_descriptor  # 50 ms to import: only where a store is opened

    lock = FileLock(path, fallback_to_soft=False)  # the kernel's flock alone, which a process's death releases
    try:
        lock.acquire()
    except PermissionError:  # a lock file this user cannot write: FileLock refuses it, flock needs no write access
        fd = os.open(path, os.O_RDONLY)
        try:
            lock_descriptor(fd)  # FileLock's own flock, on this descriptor
            yield
        finally:
            os.close(fd)  # releases the flock
        return
    try:
        yield
    finally:
        lock.release()
