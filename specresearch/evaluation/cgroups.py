"""The sandbox's memory cgroups: one per program, of memory_mb + disk_mb over all its processes (shared
memory included), made under a cgroup we may write (root's, or a delegated cgroup v2 subtree), read for
OOM kills, and removed after it; ones a dead process left behind are swept."""

from __future__ import annotations

import errno
import itertools
import os
import signal
import time
from pathlib import Path

CGROUP_PREFIX = "specresearch-sandbox-"  # + our pid + a count: the memory cgroups we make, one a program


_cgroup_count = itertools.count()


def cgroup_bases(mountinfo: str | None = None, cgroups: str | None = None) -> tuple[list[str], str]:
    """The cgroup folders under which a memory cgroup may be made for a program: our own cgroup in cgroup v1's
    memory hierarchy; in cgroup v2, our own cgroup or its parent, whichever has the memory controller enabled for
    its children (cgroup.subtree_control). Also why there is none, when none.

    Args:
        mountinfo, cgroups: the text of /proc/self/mountinfo and /proc/self/cgroup; None = read them.
    """
    try:
        mounts = (Path("/proc/self/mountinfo").read_text() if mountinfo is None else mountinfo).splitlines()
        ours = (Path("/proc/self/cgroup").read_text() if cgroups is None else cgroups).splitlines()
    except OSError as e:
        return [], f"cannot read this process's cgroups: {e}"
    v1 = v2 = None  # (mount point, the mount's root in the hierarchy)
    for line in mounts:
        fields = line.split()
        if "-" not in fields:
            continue
        after = fields[fields.index("-") + 1:]
        if after[0] == "cgroup" and "memory" in after[-1].split(","):
            v1 = (fields[4], fields[3])
        elif after[0] == "cgroup2":
            v2 = (fields[4], fields[3])
    for hierarchy, controllers, path in (line.split(":", 2) for line in ours if line.count(":") >= 2):
        if v1 is not None and "memory" in controllers.split(","):
            return _under_mount(*v1, path, v2=False)
        if v1 is None and v2 is not None and hierarchy == "0":
            return _under_mount(*v2, path, v2=True)
    if v1 is None and v2 is None:
        return [], "no cgroup file system is mounted"
    return [], "this process is in no memory cgroup (cgroup v1) nor cgroup v2 hierarchy"


def _under_mount(mount: str, root: str, path: str, v2: bool) -> tuple[list[str], str]:
    """cgroup_bases's candidates for our cgroup `path` in a hierarchy mounted at `mount` from its `root`."""
    if root != "/":  # a mount of a part of the hierarchy (a container without its own cgroup namespace)
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            return [], f"our cgroup {path} is outside what {mount} shows ({root})"
        path = path[len(root.rstrip("/")):]
    own = os.path.normpath(os.path.join(mount, path.lstrip("/")))
    if not v2:
        return [own], ""
    bases = [base for base in ((own, os.path.dirname(own)) if own != mount else (own,))
             if "memory" in _read(os.path.join(base, "cgroup.subtree_control")).split()]
    if not bases:
        return [], (f"cgroup v2's memory controller is not enabled for the children of our cgroup {own} nor of its "
                    "parent (cgroup.subtree_control): not root, or a subtree without delegation (e.g. systemd-run "
                    "--user -p Delegate=yes)")
    return bases, ""


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def make_cgroup(limit_bytes: int) -> tuple[str | None, str]:
    """A new memory cgroup limited to `limit_bytes` (swap included), for one program's launcher to join.

    Returns:
        (its folder, ""), or (None, why none could be made on this machine).
    """
    bases, why = cgroup_bases()
    for base in bases:
        sweep_cgroups(base)
        path = os.path.join(base, f"{CGROUP_PREFIX}{os.getpid()}-{next(_cgroup_count)}")
        try:
            os.mkdir(path)
        except OSError as e:
            why = f"cannot make a cgroup in {base}: {e.strerror}"
            continue
        try:
            if os.path.exists(os.path.join(path, "memory.max")):  # cgroup v2
                Path(path, "memory.max").write_text(str(limit_bytes))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    Path(path, "memory.swap.max").write_text("0")
            else:  # cgroup v1: memory first, then memory + swap (which may not be below it)
                Path(path, "memory.limit_in_bytes").write_text(str(limit_bytes))
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    Path(path, "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            return path, ""
        except OSError as e:
            why = f"cannot set the memory limit of a cgroup in {base}: {e.strerror or e}"
            remove_cgroup(path)
    return None, why


def oom_kills(cgroup: str) -> int:
    """How many processes the kernel killed in `cgroup` for its memory limit."""
    text = _read(os.path.join(cgroup, "memory.events")) or _read(os.path.join(cgroup, "memory.oom_control"))
    counts = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
    return int(counts.get("oom_kill", 0))


def remove_cgroup(cgroup: str, wait_s: float = 5.0) -> None:
    """Remove a program's cgroup, first killing what is still in it (the PID namespace is torn down just
    after the launcher dies; a killed group still exits). Its pids are only the sandbox's processes."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(cgroup)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                return  # left behind, empty or nearly: a later sweep_cgroups removes it
        try:
            Path(cgroup, "cgroup.kill").write_text("1")  # cgroup v2, Linux >= 5.14
        except OSError:  # cgroup v1
            for pid in _read(os.path.join(cgroup, "cgroup.procs")).split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:  # gone meanwhile
                    pass
        time.sleep(0.01)


def sweep_cgroups(base: str) -> None:
    """Remove the cgroups that processes no longer running (killed before their cleanup) left in `base`."""
    try:
        names = [name for name in os.listdir(base) if name.startswith(CGROUP_PREFIX)]
    except OSError:
        return
    for name in names:
        pid = name[len(CGROUP_PREFIX):].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            remove_cgroup(os.path.join(base, name), wait_s=0.0)
