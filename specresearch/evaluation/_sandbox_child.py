"""The sandbox launcher (see specresearch.evaluation.sandbox): isolates itself, then runs the program.

Started as `python -I -S _sandbox_child.py SETTINGS_JSON`, so it may use the standard library only.
In order, it:
  0. joins the memory cgroup that sandbox.py made for it (`cgroup` in the settings), if any: a limit of
     memory_mb + disk_mb on all the memory of the launcher and of everything the program starts, shared
     memory included (SysV segments, memfd files, tmpfs), which RLIMIT_AS does not count;
  1. unshares a network namespace (no interface is up: every connect fails, even to the host's
     127.0.0.1), a PID namespace (the program becomes its PID 1: when it dies, or is killed,
     the kernel kills every process it left behind, even one that left the process group) and an IPC
     namespace (its SysV shared memory, semaphores, message queues and POSIX message queues are its own,
     none of the host's or another sandbox's, and are destroyed with it);
  2. as root, drops to uid/gid 65534 (nobody), so file permissions and RLIMIT_NPROC apply; if the
     interpreter lies under a folder nobody cannot enter (e.g. /root, mode 0700), it first exposes
     only the interpreter's own folders in a private mount namespace (a read-only tmpfs over that folder);
  3. mounts, in a private mount namespace (inside the user namespace without root), a tmpfs of
     `disk_mb` over the sandbox folder, holding a copy of the program: all the program writes, in all
     its files (unlinked ones too), fits in it, and nothing reaches the host's disk;
  4. restricts itself with Landlock: writes only beneath the sandbox folder (and to /dev/null),
     no TCP bind/connect, no signals or abstract unix sockets out of the sandbox (as the ABI allows);
  5. installs a seccomp filter: socket() only for IP (which the empty network namespace leaves nowhere
     to go), so no unix socket, pathname or abstract, nor vsock or netlink; socketpair() only of
     SOCK_STREAM (a datagram socketpair could sendto a host's pathname socket); no io_uring (its
     operations would bypass the filter); no kernel keyrings: add_key, request_key and keyctl fail with EPERM
     (every sandbox runs as the same uid, whose keyrings the kernel keeps across sandboxes and after them);
     any other system call ABI (i386, x32) kills the process;
     without the memory cgroup, also no memfd_create, memfd_secret, shmget or msgget (EACCES): memory that
     RLIMIT_AS does not count is then unavailable instead of counted (POSIX shm_open, in /dev/shm, is
     already refused by Landlock);
  6. forks the program (the PID namespace's init), sets the resource limits in it and execs
     `python -I -S program.py`; then waits and exits with the program's status (128 + signal if killed).

It writes one JSON line to the fd `report_fd` before the fork: which layers it applied, and `missing`
(the required ones it could not apply; then it exits 125 without running anything).
"""

import ctypes
import errno
import json
import os
import resource
import signal
import stat
import sys

NOBODY = 65534  # the uid and gid root drops to

CLONE_NEWNS = 0x00020000
INODES = 4096  # files and folders the sandbox folder's tmpfs may hold (each costs kernel memory)
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on x86_64 and aarch64.
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
LANDLOCK_CREATE_RULESET_VERSION = 1 << 0
LANDLOCK_RULE_PATH_BENEATH = 1
WRITE_FILE, TRUNCATE = 1 << 1, 1 << 14
FS_WRITE = {  # ABI -> the write-type rights it knows (reads and execution stay allowed so Python can start)
    1: WRITE_FILE | sum(1 << b for b in range(4, 13)),  # REMOVE_DIR/FILE, MAKE_CHAR/DIR/REG/SOCK/FIFO/BLOCK/SYM
    2: 1 << 13,  # REFER: link or rename across folders
    3: TRUNCATE,
}
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI >= 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI >= 6
PR_SET_PDEATHSIG, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 22, 38

# seccomp (include/uapi/linux/seccomp.h, audit.h) and classic BPF (include/uapi/linux/filter.h).
SECCOMP_MODE_FILTER = 2
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
LD_W_ABS, JEQ, JGE, AND, RET = 0x20, 0x15, 0x35, 0x54, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JMP|JGE|K, ALU|AND|K, RET|K
NR, ARCH, ARG0, ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (an argument's low 32 bits: little-endian)
X32_SYSCALL_BIT = 0x40000000
SYSCALLS = {  # machine -> (AUDIT_ARCH_*, socket, socketpair); io_uring_setup/enter/register are 425-427 on both
    "x86_64": (0xC000003E, 41, 53),
    "aarch64": (0xC00000B7, 198, 199),
}
IO_URING = (425, 428)  # [first, end)
SHARED_MEMORY = {  # machine -> memfd_create, memfd_secret, shmget, msgget: refused without the memory cgroup
    "x86_64": (319, 447, 29, 68),
    "aarch64": (279, 447, 194, 186),
}
KEYRINGS = {  # machine -> add_key, request_key, keyctl: always refused (EPERM, as container runtimes do)
    "x86_64": (248, 249, 250),
    "aarch64": (217, 218, 219),
}
AF_INET, AF_INET6, SOCK_STREAM, SOCK_TYPE_MASK = 2, 10, 1, 0xF

# The new mount API (Linux >= 5.2; same numbers on every architecture) and mount(2) flags.
SYS_OPEN_TREE, SYS_MOVE_MOUNT = 428, 429
OPEN_TREE_CLONE, AT_RECURSIVE, MOVE_MOUNT_F_EMPTY_PATH, AT_FDCWD = 1, 0x8000, 0x4, -100
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 1 << 14, 1 << 18

LAYERS = ("network_namespace", "pid_namespace", "ipc_namespace", "memory_cgroup", "unprivileged_uid", "disk_quota",
          "landlock_fs", "landlock_net", "landlock_scope", "seccomp_sockets", "shared_memory")

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
except (OSError, AttributeError):  # not a libc we know: every kernel layer is reported missing
    _libc = None


class RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


class PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)): 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _syscall(number: int, *args) -> int:
    # integers as longs: syscall(2) is variadic and reads every argument as a long
    return _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))


def _prctl(option: int, value: int, pointer=None) -> int:
    return _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(value), ctypes.c_ulong(0) if pointer is None else pointer,
                       ctypes.c_ulong(0), ctypes.c_ulong(0))


def _mount(source: bytes | None, target: str, fstype: bytes | None, flags: int, data: bytes | None) -> None:
    _check(_libc.mount(source, target.encode(), fstype, ctypes.c_ulong(flags), data), f"mount {target}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


_private_mounts = False  # whether this process entered its private mount namespace


def private_mounts() -> None:
    """Enter a private mount namespace, once: nothing mounted afterwards reaches the host."""
    global _private_mounts
    if not _private_mounts:
        unshare(CLONE_NEWNS)
        _mount(b"none", "/", None, MS_REC | MS_PRIVATE, None)
        _private_mounts = True


def map_ids(uid: int, gid: int) -> None:
    """Without root, in the new user namespace: map our own uid and gid (from before the unshare) to
    themselves, since a tmpfs mounted in the namespace takes files only from mapped owners."""
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, line.encode())  # one write, as these files require
        finally:
            os.close(fd)


def disk_quota(folder: str, program: str, disk_mb: int, owner: tuple[int, int]) -> None:
    """Cover `folder`, in a private mount namespace, with a tmpfs of `disk_mb` MB owned by `owner` (uid, gid),
    copy the program into it and enter it: what the program writes, in all, then fits in `disk_mb`."""
    with open(os.path.join(folder, program), "rb") as f:
        source = f.read()
    private_mounts()
    options = f"size={disk_mb}m,nr_inodes={INODES},mode=0700,uid={owner[0]},gid={owner[1]}"
    _mount(b"tmpfs", folder, b"tmpfs", MS_NOSUID | MS_NODEV, options.encode())
    path = os.path.join(folder, program)
    with open(path, "wb") as f:
        f.write(source)
    os.chown(path, *owner)
    os.chdir(folder)  # the launcher's working folder was the one beneath the tmpfs


def socket_filter(machine: str, shared_memory: bool = True) -> list[tuple[int, int, int, int]]:
    """The seccomp filter (see the module's docstring) as classic BPF: (code, jt, jf, k) per instruction.
    `shared_memory=False` also refuses the system calls of SHARED_MEMORY (when no memory cgroup counts them)."""
    if machine not in SYSCALLS:
        raise OSError(errno.ENOSYS, f"no seccomp filter for {machine} (only {', '.join(SYSCALLS)})")
    arch, socket, socketpair = SYSCALLS[machine]
    refused = () if shared_memory else SHARED_MEMORY[machine]
    lines = [  # (label, code, k, where to jump if true, if false): None = the next instruction
        (None, LD_W_ABS, ARCH, None, None),
        (None, JEQ, arch, None, "kill"),
        (None, LD_W_ABS, NR, None, None),
        (None, JGE, X32_SYSCALL_BIT, "kill", None),
        *((None, JEQ, number, "eperm", None) for number in KEYRINGS[machine]),
        *((None, JEQ, number, "deny", None) for number in refused),
        (None, JGE, IO_URING[0], None, "socket"),
        (None, JGE, IO_URING[1], "allow", "deny"),
        ("socket", JEQ, socket, None, "socketpair"),
        (None, LD_W_ABS, ARG0, None, None),  # the domain
        (None, JEQ, AF_INET, "allow", None),
        (None, JEQ, AF_INET6, "allow", "deny"),
        ("socketpair", JEQ, socketpair, None, "allow"),
        (None, LD_W_ABS, ARG1, None, None),  # the type, with SOCK_NONBLOCK/SOCK_CLOEXEC
        (None, AND, SOCK_TYPE_MASK, None, None),
        (None, JEQ, SOCK_STREAM, "allow", "deny"),
        ("allow", RET, RET_ALLOW, None, None),
        ("deny", RET, RET_ERRNO | errno.EACCES, None, None),
        ("eperm", RET, RET_ERRNO | errno.EPERM, None, None),
        ("kill", RET, RET_KILL_PROCESS, None, None),
    ]
    at = {label: i for i, (label, *_) in enumerate(lines) if label}
    return [(code, at[yes] - i - 1 if yes else 0, at[no] - i - 1 if no else 0, k)
            for i, (_, code, k, yes, no) in enumerate(lines)]


def seccomp_sockets(shared_memory: bool) -> dict:
    """Install socket_filter for this machine on this process and all it starts."""
    lines = socket_filter(os.uname().machine, shared_memory)
    program = (SockFilter * len(lines))(*(SockFilter(*line) for line in lines))
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(NO_NEW_PRIVS)")  # required to install a filter without root
    _check(_prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(SockFprog(len(lines), program))),
           "prctl(SET_SECCOMP)")
    return {"seccomp_sockets": True, "shared_memory": True}  # counted by the cgroup, or refused by the filter


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel; 0 = unavailable (or not Linux)."""
    if _libc is None or not sys.platform.startswith("linux"):
        return 0
    return max(_syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION), 0)


def landlock(folder: str, abi: int) -> dict:
    """Allow writes only beneath `folder` (and to /dev/null); deny TCP and outward scopes as the ABI allows."""
    fs = sum(rights for version, rights in FS_WRITE.items() if version <= abi)
    attr = RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                       SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24  # only the fields this ABI knows
    ruleset = _check(_syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.pointer(attr), size, 0), "landlock_create_ruleset")
    try:
        for path, rights in ((folder, fs), ("/dev/null", fs & (WRITE_FILE | TRUNCATE))):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = PathBeneathAttr(rights, fd)
                _check(_syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.pointer(rule), 0),
                       f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        _check(_prctl(PR_SET_NO_NEW_PRIVS, 1), "prctl(NO_NEW_PRIVS)")  # required to restrict oneself
        _check(_syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return {"landlock_fs": True, "landlock_net": abi >= 4, "landlock_scope": abi >= 6}


def _closed_ancestor(path: str) -> str | None:
    """The outermost folder on `path` that others (nobody) may not enter, if any."""
    parts = os.path.abspath(path).split(os.sep)[1:]
    for i in range(1, len(parts) + 1):
        folder = os.sep + os.sep.join(parts[:i])
        st = os.stat(folder)
        if not (st.st_mode & stat.S_IXOTH or st.st_uid == NOBODY and st.st_mode & stat.S_IXUSR
                or st.st_gid == NOBODY and st.st_mode & stat.S_IXGRP):
            return folder
    return None


def expose_interpreter(keep: list[str]) -> None:
    """Root only, before dropping to nobody: if the interpreter lies under a folder nobody cannot enter,
    cover that folder, in a private mount namespace, with a read-only tmpfs holding only the interpreter's
    folders (and `keep`). The rest of it (e.g. /root's keys) is then hidden from the program as well."""
    wanted = {sys.base_prefix, sys.prefix, os.path.dirname(sys.executable),
              os.path.dirname(os.path.realpath(sys.executable)), *keep}
    covers: dict[str, list[str]] = {}
    for path in wanted:
        closed = _closed_ancestor(path)
        if closed is not None:
            covers.setdefault(closed, []).append(path)
    if not covers:
        return
    private_mounts()
    for closed, paths in covers.items():
        paths = sorted(p for p in paths if not any(p != q and p.startswith(q + os.sep) for q in paths))
        trees = [_check(_syscall(SYS_OPEN_TREE, AT_FDCWD, p.encode(), OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE),
                        f"open_tree {p}") for p in paths]
        _mount(b"tmpfs", closed, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755,size=64k")
        for path, tree in zip(paths, trees):
            os.makedirs(path, mode=0o755, exist_ok=True)
            _check(_syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, path.encode(), MOVE_MOUNT_F_EMPTY_PATH),
                   f"move_mount {path}")
            os.close(tree)
        _mount(None, closed, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def join_cgroup(cgroup: str) -> None:
    """Move this process (so all it starts) into the memory cgroup `cgroup`, a folder of the cgroup file system."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def isolate(folder: str, program: str, disk_mb: int, cgroup: str | None = None,
            cgroup_why: str = "") -> tuple[dict, dict]:
    """Apply every layer this process can; return which were applied and why the others were not.
    `cgroup`: the memory cgroup sandbox.py made for this run (None: it could not, `cgroup_why` says why)."""
    applied, why = dict.fromkeys(LAYERS, False), {}
    if _libc is None or not sys.platform.startswith("linux"):
        return applied, dict.fromkeys(LAYERS, "not Linux")
    root = os.geteuid() == 0
    uid, gid = os.getuid(), os.getgid()  # as the host knows them: a new user namespace shows them unmapped

    def attempt(layer, action):
        try:
            result = action()
            applied.update(result if isinstance(result, dict) else {layer: True})
        except (OSError, AttributeError) as e:  # AttributeError: the libc lacks the function
            why[layer] = str(e)

    if cgroup is not None:  # first, while still the host's uid: all that follows is counted in it
        attempt("memory_cgroup", lambda: join_cgroup(cgroup))
    else:
        why["memory_cgroup"] = cgroup_why or "no memory cgroup was made for this run"
    # without root, a user namespace gives the right to create the others (and the uid is unprivileged already)
    attempt("network_namespace", lambda: unshare(CLONE_NEWNET if root else CLONE_NEWUSER | CLONE_NEWNET))
    attempt("pid_namespace", lambda: unshare(CLONE_NEWPID))
    attempt("ipc_namespace", lambda: unshare(CLONE_NEWIPC))  # in the user namespace above, without root

    def quota():
        if not root:
            if not applied["network_namespace"]:
                raise OSError(errno.EPERM, "needs the user namespace that network_namespace could not make")
            map_ids(uid, gid)
        disk_quota(folder, program, disk_mb, (NOBODY, NOBODY) if root else (uid, gid))

    attempt("disk_quota", quota)
    if root:
        def drop():
            expose_interpreter(keep=[folder])
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)

        attempt("unprivileged_uid", drop)
    else:
        applied["unprivileged_uid"] = True
    abi = landlock_abi()
    if abi:
        attempt("landlock_fs", lambda: landlock(folder, abi))
    else:
        why["landlock_fs"] = "Landlock is not available (Linux >= 5.13 with lsm=landlock)"
    for layer, version in (("landlock_net", 4), ("landlock_scope", 6)):
        if not applied[layer] and layer not in why:
            why[layer] = f"needs Landlock ABI >= {version}, this kernel has {abi or 'none'}"
    # last: the launcher itself needs no socket after it
    attempt("seccomp_sockets", lambda: seccomp_sockets(shared_memory=applied["memory_cgroup"]))
    if not applied["shared_memory"]:
        why["shared_memory"] = ("neither counted (no memory cgroup) nor refused (no seccomp filter): "
                                + why.get("seccomp_sockets", "?"))
    return applied, why


def set_limits(limits: dict) -> None:
    """The resource limits, in the program's own process (the launcher only waits)."""
    mb = 1024 * 1024
    wanted = {
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_AS: (limits["memory_mb"] * mb,) * 2,
        resource.RLIMIT_CPU: (limits["cpu_s"], limits["cpu_s"] + 1),  # SIGXCPU, then SIGKILL a second later
        resource.RLIMIT_FSIZE: (limits["file_mb"] * mb,) * 2,
        resource.RLIMIT_NOFILE: (limits["open_files"],) * 2,
        resource.RLIMIT_NPROC: (limits["processes"],) * 2,
    }
    for kind, (soft, hard) in wanted.items():
        _, old_hard = resource.getrlimit(kind)
        if old_hard != resource.RLIM_INFINITY:  # one may only lower a hard limit
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(kind, (soft, hard))


def main() -> int:
    settings = json.loads(sys.argv[1])
    folder = settings["folder"]
    applied, why = isolate(folder, settings["program"], settings["limits"]["disk_mb"], settings.get("cgroup"),
                           settings.get("cgroup_why", ""))
    missing = [layer for layer in settings["require"] if not applied[layer]]
    with os.fdopen(settings["report_fd"], "w") as report:
        report.write(json.dumps({"applied": applied, "why": why, "missing": missing}) + "\n")
    if missing:
        return 125
    pid = os.fork()  # in the PID namespace: the program is its init
    if pid == 0:
        try:
            if _libc is not None:
                _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the launcher
            set_limits(settings["limits"])
            os.execv(sys.executable, [sys.executable, "-I", "-S", os.path.join(folder, settings["program"])])
        except BaseException as e:  # whatever it is: say it, and never return into main()
            print(f"sandbox: could not start the program: {e}", file=sys.stderr, flush=True)
        os._exit(126)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code
    name = signal.Signals(-code).name
    hint = {"SIGXCPU": " (CPU time limit)", "SIGXFSZ": " (file size limit)"}.get(name, "")
    print(f"sandbox: the program was killed by {name}{hint}", file=sys.stderr, flush=True)
    return 128 - code


if __name__ == "__main__":
    sys.exit(main())
