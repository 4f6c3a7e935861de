"""Sweeps that survive (specresearch.sweeps): resume skips what already finished, interrupted jobs are
recorded FAILED and run again, speed jobs serialize on the machine's lock, the joblib and Ray
launchers record their jobs under the sweep's parent run, Optuna reads the jobs' objective.

End to end through `python -m specresearch` on the tiny random model with prompt lookup (no draft
model), a few tokens, into temporary MLflow stores; the lock file and caches go to tmp_path too."""

import importlib.util
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
import yaml

from specresearch import sweeps
from specresearch.errors import SpecResearchError
from specresearch.records import HASH_TAG, config_hash
from specresearch.sweeps import JobSkipped
from tests.helpers import artifact, interrupt_when_measuring, make_cfg, strict
from tests.sweeps.jobs import FAST, cli, command, env_for, runs

pytestmark = pytest.mark.e2e  # runs sweeps (`-m`) through the command line and Hydra's launchers

def k_of(run) -> str:
    return run.data.params["drafter.k"]


# --- units -------------------------------------------------------------------------------------------

def test_config_hash_ignores_tracker_and_resume_only():
    base = config_hash(make_cfg(*FAST))
    assert base == config_hash(make_cfg(*FAST, "tracker=none", "resume=false", "resume_ignore_code=true"))
    assert base != config_hash(make_cfg(*FAST, "drafter.k=3"))
    assert base != config_hash(make_cfg(*FAST, "exclusive=false"))


def test_resume_is_on_for_sweeps_by_default_and_true_or_false_overrides_it():
    assert sweeps.resume_on(make_cfg(*FAST), multirun=True) and not sweeps.resume_on(make_cfg(*FAST), multirun=False)
    assert sweeps.resume_on(make_cfg(*FAST, "resume=true"), multirun=False)
    assert not sweeps.resume_on(make_cfg(*FAST, "resume=false"), multirun=True)
    with pytest.raises(SpecResearchError, match="resume must be auto, true or false"):
        sweeps.resume_on(make_cfg(*FAST, "resume=sometimes"), multirun=True)


@pytest.mark.parametrize("value", ["maybe", "1", "null"])
def test_resume_ignore_code_is_true_or_false(value):
    """Refused in one line naming the valid values, by the settings check (before anything runs) and by the job itself."""
    from specresearch.settings import check_config

    assert not sweeps.ignore_code(make_cfg(*FAST)) and sweeps.ignore_code(make_cfg(*FAST, "resume_ignore_code=true"))
    cfg = make_cfg(*FAST, f"resume_ignore_code={value}")
    for refuse in (check_config, lambda c: sweeps.job(c, multirun=True).__enter__()):
        with pytest.raises(SpecResearchError, match=r"^resume_ignore_code must be true or false, got (.*)$"):
            refuse(cfg)


def test_objective_value_is_a_finite_float_or_none():
    cfg = make_cfg(*FAST)
    assert sweeps.objective_value(cfg, {"speedup": 1.25}) == 1.25
    assert sweeps.objective_value(cfg, {"speedup": float("nan")}) is None  # NaN would crash Optuna's study
    assert sweeps.objective_value(make_cfg(*FAST, "objective=null"), {"speedup": 1.25}) is None
    assert float(JobSkipped("r", 2.0)) == 2.0
    with pytest.raises(TypeError):  # Optuna's sweeper then records a failed trial
        float(JobSkipped("r", None))


def test_ray_launcher_gets_the_parent_run_in_its_runtime_env():
    from omegaconf import OmegaConf

    config = OmegaConf.create({"hydra": {"launcher": {
        "_target_": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
        "ray": {"init": {"address": None, "runtime_env": {"env_vars": {"MINE": "1"}}}, "remote": {}}}}})
    OmegaConf.set_struct(config, True)
    OmegaConf.set_readonly(config, True)
    sweeps.forward_env_to_ray(config, {"SPECRESEARCH_MLFLOW_PARENT_RUN_ID": "abc"})
    assert dict(config.hydra.launcher.ray.init.runtime_env.env_vars) == {"MINE": "1", "SPECRESEARCH_MLFLOW_PARENT_RUN_ID": "abc"}


def test_speed_lock_excludes_a_second_process(tmp_path):
    path = tmp_path / "speed.lock"
    child_code = ("import sys; from specresearch.sweeps import speed_lock\n"
                  "with speed_lock(sys.argv[1]) as waited:\n    print('held', waited, flush=True)\n")
    with sweeps.speed_lock(path) as waited:
        assert not waited
        child = subprocess.Popen([sys.executable, "-c", child_code, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            line = child.stdout.readline()  # printed only once it found the lock held, before it blocks
            assert line.startswith("waiting for the speed lock") and f"pid {os.getpid()}" in line
            time.sleep(0.5)
            assert child.poll() is None  # still waiting while this process holds it
        except BaseException:
            child.kill()
            raise
    assert child.stdout.readline().strip() == "held True"  # released: the child got it
    assert child.wait(timeout=60) == 0
    with sweeps.speed_lock(path) as waited:  # and let it go when it exited
        assert not waited


def test_a_waiting_job_says_who_holds_the_lock_for_how_long_and_keeps_saying_it(tmp_path):
    """The wait names the holder and how long it has held the lock, then repeats that every WAIT_NOTE_S."""
    path = tmp_path / "speed.lock"
    child_code = ("import sys; from specresearch.sweeps import lock\nlock.WAIT_NOTE_S = 1\n"
                  "with lock.speed_lock(sys.argv[1]) as waited:\n    print('held', waited, flush=True)\n")
    with sweeps.speed_lock(path):
        path.write_text(f"pid {os.getpid()} on here since {time.time() - 125:.0f}")  # as if held for 2 minutes
        child = subprocess.Popen([sys.executable, "-c", child_code, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            first, again = child.stdout.readline(), child.stdout.readline()
        finally:
            time.sleep(0.1)
    assert f"(held by pid {os.getpid()} on here, for 2m0" in first
    assert again.startswith("still waiting for the speed lock (0m01s so far; held by pid") and "for 2m0" in again
    assert child.stdout.read().strip().splitlines()[-1] == "held True" and child.wait(timeout=60) == 0


def test_a_timed_job_is_told_when_another_process_keeps_the_machine_busy():
    """busy() names another process that burns a core (not this one, nor its children), and is quiet without it."""
    from specresearch.sweeps.lock import busy

    spin = f"{shlex.quote(sys.executable)} -c 'import time\nend = time.time() + 30\nwhile time.time() < end: pass' >/dev/null 2>&1 &\necho $!"
    pid = int(subprocess.run(["sh", "-c", spin], capture_output=True, text=True, check=True).stdout)  # not our child: its shell left
    try:
        time.sleep(0.5)
        warning = busy(sample_s=0.5)
    finally:
        os.kill(pid, signal.SIGKILL)
    assert warning is not None and f"pid {pid} python" in warning and "timings measured now will be off" in warning
    mine = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 2\nwhile time.time() < end: pass"])]
    try:
        time.sleep(0.3)
        quiet = busy(sample_s=0.5)  # (other tests' workers may be busy meanwhile: only our own child must not be named)
    finally:
        mine[0].wait()
    assert quiet is None or f"pid {mine[0].pid} " not in quiet


def test_quality_jobs_and_exclusive_false_do_not_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path))
    with sweeps.speed_lock():  # held: a job that wanted it would block here
        for overrides in (["eval=stdlib_doctest"], ["exclusive=false"]):
            with sweeps.job(make_cfg(*FAST, "tracker=none", *overrides), multirun=True) as skipped:
                assert skipped is None


@pytest.mark.parametrize("opened, line", [
    (None, "interrupted by SIGTERM before a run opened: nothing recorded"),
    ("none", "interrupted by SIGTERM: nothing recorded (tracker=none)"),
    ("mlflow", "interrupted by SIGTERM: the run is recorded as FAILED with what it measured"),
])
def test_an_interrupted_job_says_whether_its_run_was_recorded(tmp_path, capsys, opened, line):
    """A signal while a model loads or the speed lock is awaited finds no run open: the line says so."""
    from hydra.utils import instantiate

    from specresearch.tracking import tracked_run

    cfg = make_cfg(*FAST, "exclusive=false", f"tracker.store={tmp_path}/mlruns" if opened == "mlflow" else "tracker=none")
    with pytest.raises(sweeps.Interrupted):
        with sweeps.job(cfg, multirun=False):
            if opened is None:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, in the main thread
            with tracked_run(instantiate(cfg.tracker), cfg, "run", lambda: ({"prompts": 1.0}, {})):
                os.kill(os.getpid(), signal.SIGTERM)
    assert capsys.readouterr().err.strip().splitlines()[-1] == line
    if opened == "mlflow":
        (job,), _ = runs(tmp_path)
        assert job.info.status == "FAILED" and job.data.metrics["prompts"] == 1


@pytest.mark.parametrize("when", ["opening", "recording"])
def test_a_signal_while_a_run_opens_or_is_recorded_waits_for_the_record(tmp_path, capsys, when):
    """A SIGTERM inside MLflow's start of a run, or while a finished run's summary was computed or its end written, left
    the run RUNNING for ever (a joblib worker whose driver was killed, once in CI): the signal now waits until the run
    is open (then it ends FAILED with what it measured) or recorded (FINISHED), and then stops the job."""
    from hydra.utils import instantiate

    from specresearch.tracking import tracked_run

    cfg = make_cfg(*FAST, "exclusive=false", f"tracker.store={tmp_path}/mlruns")
    tracker = instantiate(cfg.tracker)
    start = tracker.start

    def start_then_signal(*args, **kwargs):
        start(*args, **kwargs)  # MLflow has created the run
        os.kill(os.getpid(), signal.SIGTERM)

    def report():
        if when == "recording":
            os.kill(os.getpid(), signal.SIGTERM)
        return {"prompts": 1.0}, {}

    if when == "opening":
        tracker.start = start_then_signal
    with pytest.raises(sweeps.Interrupted):
        with sweeps.job(cfg, multirun=False):
            with tracked_run(tracker, cfg, "run", report):
                pass
    (job,), _ = runs(tmp_path)
    assert job.info.status == {"opening": "FAILED", "recording": "FINISHED"}[when] and job.data.metrics["prompts"] == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == {
        "opening": "interrupted by SIGTERM: the run is recorded as FAILED with what it measured",
        "recording": "interrupted by SIGTERM as its run ended: the run is recorded as FINISHED"}[when]


def test_held_signals_deliver_the_first_after_the_block_and_a_second_at_once():
    """What tracked_run opens and records under: a stop waits for the block's end; asked twice, it stops at once
    (a record that hangs can still be interrupted)."""
    from specresearch.interrupts import held_signals

    steps, before = [], signal.getsignal(signal.SIGTERM)
    for twice in (False, True):
        previous = sweeps.exit_on_signals()
        try:
            with pytest.raises(sweeps.Interrupted):
                with held_signals():
                    os.kill(os.getpid(), signal.SIGTERM)
                    steps.append(f"held ({twice})")
                    if twice:
                        os.kill(os.getpid(), signal.SIGTERM)
                        steps.append("not reached")
        finally:
            sweeps.restore_signals(previous)
    assert steps == ["held (False)", "held (True)"]
    assert signal.getsignal(signal.SIGTERM) is before  # every handler put back


def test_a_stop_that_comes_inside_a_finalizer_is_sent_again(capfd):
    """Python runs a signal's handler wherever the main thread is, a collector's weakref callback included, and drops
    what it raises there ("Exception ignored in ..."): a SIGTERM at a job's start was lost that way and every later one
    refused as "again" (the job decoded on, SIGKILL the only stop). Now the dropped stop is sent again and raised where
    the main thread goes next; the hook there was still gets anything else."""
    import weakref

    class Thing:
        pass

    def in_a_finalizer(_):
        signal.raise_signal(signal.SIGTERM)
        for _ in range(1000):  # the handler runs at a loop's jump here; its SystemExit is dropped
            pass

    previous, steps = sweeps.exit_on_signals(), []
    try:
        with pytest.raises(sweeps.Interrupted) as stop:
            thing = Thing()
            ref = weakref.ref(thing, in_a_finalizer)
            del thing  # its last reference: the callback runs now
            steps.append("the finalizer ran" if ref() is None else "not collected")
            time.sleep(5)  # the signal comes again from a thread within REDELIVER_S
            steps.append("not reached")
    finally:
        sweeps.restore_signals(previous)
    assert steps == ["the finalizer ran"] and stop.value.code == 128 + signal.SIGTERM
    err = capfd.readouterr().err
    assert "SIGTERM came inside a finalizer, which drops exceptions: sent again" in err and "again: still recording" not in err
    seen = []
    sys.unraisablehook.hook, hook = seen.append, sys.unraisablehook.hook
    try:
        sys.unraisablehook(types.SimpleNamespace(exc_value=ValueError("x")))
    finally:
        sys.unraisablehook.hook = hook
    assert [type(u.exc_value) for u in seen] == [ValueError]


# --- resume ------------------------------------------------------------------------------------------

def test_resume_skips_a_config_its_study_committed_from_another_store(tmp_path, monkeypatch):
    """A study goes on over sittings on fresh machines (an empty store each time): resume skips a config the study's
    committed runs hold (what the analysis' save=true wrote from the other machine's store), with its objective, and
    runs every other one; an unreadable committed file leaves resume to the store."""
    import json

    from hydra.utils import instantiate

    from analysis.runs import load_study, runs_record
    from specresearch.records import committed_study
    from specresearch.tracking import tracked_run

    monkeypatch.setattr("specresearch.records.COMMITTED", tmp_path / "data")
    cfg = {store: make_cfg(*FAST, "exclusive=false", "study=demo", "objective=speedup", f"tracker.store={tmp_path}/{store}")
           for store in ("there", "here")}
    with sweeps.job(cfg["there"], multirun=True) as skipped:
        assert skipped is None
        with tracked_run(instantiate(cfg["there"].tracker), cfg["there"], "run", lambda: ({"speedup": 1.5}, {})):
            pass
    (tmp_path / "data").mkdir()
    path = committed_study("demo")
    for committed in (None, "{not json", json.dumps({"data": runs_record(load_study("demo", f"sqlite:///{tmp_path}/there/mlflow.db", "specresearch"))})):
        if committed is not None:
            path.write_text(committed)
        with sweeps.job(cfg["here"], multirun=True) as skipped:
            if committed is None or committed.startswith("{not"):
                assert skipped is None  # nothing (readable) committed: the empty store decides
            else:
                (run,) = json.loads(committed)["data"]["runs"]
                assert skipped == JobSkipped(run["id"], 1.5)
    other = make_cfg(*FAST, "exclusive=false", "study=demo", "drafter.k=3", f"tracker.store={tmp_path}/here")
    with sweeps.job(other, multirun=True) as skipped:
        assert skipped is None


def test_resume_skips_finished_jobs_and_runs_only_new_ones(tmp_path, new_store):
    """The first sweep runs on the joblib launcher (two processes): its jobs nest under one parent too."""
    new_store(tmp_path / "mlruns")  # empty, migrated once per test run
    first = cli(tmp_path, "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *FAST, "drafter.k=1,2")
    assert "2 jobs: 2 ran, 0 skipped" in first.stdout
    _check_nested_under_one_parent(tmp_path)
    jobs, parents = runs(tmp_path)
    assert sorted(k_of(r) for r in jobs) == ["1", "2"] and all(r.info.status == "FINISHED" for r in jobs)
    tags = jobs[0].data.tags
    assert tags["specresearch.pid"].isdigit() and tags["specresearch.host"]  # (the study tag: a preset's, test_analysis)
    assert parents[0].data.tags["specresearch.sweep"] == "true"

    # k=1 finished before: skipped, nothing measured again; k=3 is new: it runs
    changed = cli(tmp_path, "-m", *FAST, "drafter.k=1,3")
    assert changed.stdout.count("skipped: identical config already finished as run") == 1
    assert "2 jobs: 1 ran, 1 skipped" in changed.stdout and "(resume=false to measure again)" in changed.stdout
    jobs, parents = runs(tmp_path)
    assert sorted(k_of(r) for r in jobs) == ["1", "2", "3"] and all(r.info.status == "FINISHED" for r in jobs)
    assert len(parents) == 2 and all(p.info.status == "FINISHED" for p in parents)
    # the second parent's table shows the reused run beside the new one, and its headline is the best of both
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    second = max(parents, key=lambda p: p.info.start_time)
    table = strict(artifact(client, second, "jobs.json").decode())
    assert [row[1] for row in table["data"]] == ["FINISHED (reused)", "FINISHED"]
    assert second.data.metrics["speedup"] == max(j.data.metrics["speedup"] for j in jobs if k_of(j) in ("1", "3"))


def _other_code(tags: dict[str, str]) -> dict[str, str]:
    """`tags` (code_tags) as another commit of a clean checkout would record them."""
    from specresearch.records import COMMIT_TAG, DIFF_TAG, DIRTY_TAG

    return {**{k: v for k, v in tags.items() if k != DIFF_TAG}, COMMIT_TAG: "d" * 40, DIRTY_TAG: "false"}


def test_resume_reuses_only_runs_of_the_same_code_unless_told_to_ignore_it(tmp_path, new_store, monkeypatch, caplog):
    """A finished run of the same config is reused when this code measured it; when the code (as resume sees it)
    is another commit, the job runs again with one line saying so, and resume_ignore_code=true reuses it anyway."""
    import logging

    from hydra.utils import instantiate

    from specresearch.records import code_of, code_tags
    from specresearch.sweeps import resume
    from specresearch.tracking import tracked_run

    new_store(tmp_path / "mlruns")
    cfg = make_cfg(*FAST, "exclusive=false", f"tracker.store={tmp_path}/mlruns")
    with tracked_run(instantiate(cfg.tracker), cfg, "run", lambda: ({"speedup": 1.5}, {})):
        pass
    (recorded,), _ = runs(tmp_path)
    assert {k: recorded.data.tags.get(k) for k in code_tags()} == code_tags()
    with sweeps.job(cfg, multirun=True) as skipped:
        assert skipped == JobSkipped(recorded.info.run_id, 1.5)  # the same code: reused

    caplog.set_level(logging.INFO, logger="specresearch.sweeps.resume")
    changed = _other_code(code_tags())
    monkeypatch.setattr(resume, "code_tags", lambda: changed)
    for _ in range(2):  # asked again (as after waiting for the speed lock): still one line
        with sweeps.job(cfg, multirun=True) as skipped:
            assert skipped is None
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("re-running")]
    assert said == [f"re-running: run {recorded.info.run_id} of this config was measured by code {code_of(recorded.data.tags)} "
                    "(now dddddddddddd); resume_ignore_code=true to reuse it"]
    with sweeps.job(make_cfg(*FAST, "exclusive=false", f"tracker.store={tmp_path}/mlruns", "resume_ignore_code=true"),
                    multirun=True) as skipped:
        assert skipped == JobSkipped(recorded.info.run_id, 1.5)
    with sweeps.job(cfg, multirun=False) as skipped:  # resume off (a single run): no line, it runs
        assert skipped is None


def test_a_resumed_sweep_re_runs_the_jobs_that_other_code_measured(tmp_path, new_store):
    """A code change (simulated: the finished runs' recorded commit set to another) makes a resumed sweep measure
    its jobs again, one line each; after another change, resume_ignore_code=true reuses them. The sweep's parent
    and its jobs carry the code (commit, dirty flag, versions) as code_tags computes it."""
    from mlflow import MlflowClient

    from specresearch.records import COMMIT_TAG, DIFF_TAG, DIRTY_TAG, code_tags

    new_store(tmp_path / "mlruns")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    sweep = ("-m", *FAST, "drafter.k=1,2")
    assert "2 jobs: 2 ran, 0 skipped" in cli(tmp_path, *sweep).stdout
    jobs, (parent,) = runs(tmp_path)
    stable = {k: v for k, v in code_tags().items() if k != DIFF_TAG}  # (the digest moves while others edit the tree)
    for run in (*jobs, parent):
        assert {k: run.data.tags.get(k) for k in stable} == stable
        assert (DIFF_TAG in run.data.tags) == (run.data.tags.get(DIRTY_TAG) == "true")

    def change_code(found):  # as if the code had moved on since these runs
        for run in found:
            client.set_tag(run.info.run_id, COMMIT_TAG, "0" * 40)
            client.set_tag(run.info.run_id, DIRTY_TAG, "false")
            if DIFF_TAG in run.data.tags:
                client.delete_tag(run.info.run_id, DIFF_TAG)

    change_code(jobs)
    again = cli(tmp_path, *sweep)
    assert "2 jobs: 2 ran, 0 skipped" in again.stdout, again.stdout
    lines = [line for line in again.stdout.splitlines() if "re-running:" in line]
    assert len(lines) == 2 and {line.split("re-running: run ")[1].split()[0] for line in lines} == {r.info.run_id for r in jobs}
    assert all("measured by code 000000000000 (now " in line and "resume_ignore_code=true to reuse it" in line for line in lines)
    rerun, _ = runs(tmp_path)
    assert len(rerun) == 4 and all(r.info.status == "FINISHED" for r in rerun)

    change_code(rerun)
    reused = cli(tmp_path, *sweep, "resume_ignore_code=true")
    assert "2 jobs: 0 ran, 2 skipped" in reused.stdout and "re-running" not in reused.stdout
    assert len(runs(tmp_path)[0]) == 4


def test_sigterm_records_failed_and_resume_completes_the_job(tmp_path, new_store):
    new_store(tmp_path / "mlruns")  # empty, migrated once per test run
    args = ["-m", "model=tiny", "drafter=pld", "drafter.k=2", "dataset.num_prompts=8", "max_new_tokens=48"]
    returncode, _, err = interrupt_when_measuring(command(tmp_path, *args), tmp_path / "mlruns" / "mlflow.db", signal.SIGTERM,
                                                  cwd=tmp_path, env=env_for(tmp_path))
    assert returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "interrupted by SIGTERM" in err
    (job,), (parent,) = runs(tmp_path)
    assert job.info.status == "FAILED" and parent.info.status == "FAILED"
    assert job.data.metrics["prompt/tau"] >= 1  # what it had measured is kept

    rerun = cli(tmp_path, *args)
    assert "1 ran, 0 skipped" in rerun.stdout
    jobs, _ = runs(tmp_path)
    assert sorted(r.info.status for r in jobs) == ["FAILED", "FINISHED"]


def test_a_killed_jobs_running_run_is_marked_failed_and_run_again(tmp_path, new_store):
    """A RUNNING run of the same config whose process is gone (SIGKILL) is marked FAILED and tagged
    interrupted, with its sweep's parent; the job then runs. A RUNNING run on another host is left."""
    from mlflow import MlflowClient

    digest = config_hash(make_cfg(*FAST, "drafter.k=1"))
    new_store(tmp_path / "mlruns")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.create_experiment("specresearch", artifact_location=(tmp_path / "artifacts").as_uri())
    dead = subprocess.Popen(["true"])
    dead.wait()
    here = {"specresearch.host": socket.gethostname(), "specresearch.pid": str(dead.pid)}
    parent = client.create_run(experiment, tags={"specresearch.sweep": "true", **here}).info.run_id
    killed = client.create_run(experiment, tags={HASH_TAG: digest, "mlflow.parentRunId": parent, **here}).info.run_id
    elsewhere = client.create_run(experiment, tags={HASH_TAG: digest, "specresearch.host": "another-host",
                                                    "specresearch.pid": str(dead.pid)}).info.run_id

    result = cli(tmp_path, "-m", *FAST, "drafter.k=1")
    assert f"marked run {killed} FAILED: interrupted" in result.stdout and "1 ran, 0 skipped" in result.stdout
    assert client.get_run(killed).info.status == "FAILED" and client.get_run(killed).data.tags["specresearch.interrupted"] == "true"
    assert client.get_run(parent).info.status == "FAILED"
    assert client.get_run(elsewhere).info.status == "RUNNING"
    jobs, _ = runs(tmp_path)
    assert sum(r.info.status == "FINISHED" for r in jobs) == 1


# --- launchers ---------------------------------------------------------------------------------------

def _check_nested_under_one_parent(tmp_path, ks=("1", "2")):
    jobs, parents = runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(k_of(r) for r in jobs) == sorted(ks)
    for job in jobs:
        assert job.info.status == "FINISHED" and job.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert {k: v for k, v in parents[0].data.tags.items() if k.startswith("specresearch.job.")} == \
        {f"specresearch.job.{i}": "finished" for i in range(len(ks))}


@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None, reason='pip install -e ".[sweeps]"')
@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None, reason='pip install -e ".[sweeps]"')
def test_ray_launcher_on_a_local_instance_records_both_jobs_under_the_parent(tmp_path, new_store):
    new_store(tmp_path / "mlruns")  # empty, migrated once per test run
    result = cli(tmp_path, "-m", "hydra/launcher=ray", "hydra.launcher.ray.init.address=local", "+hydra.launcher.ray.init.num_cpus=2",
                 "+hydra.launcher.ray.init.include_dashboard=false", *FAST, "drafter.k=1,2")
    assert "2 jobs: 2 ran, 0 skipped" in result.stdout
    _check_nested_under_one_parent(tmp_path)


# --- Optuna ------------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None, reason='pip install -e ".[sweeps]"')
def test_tune_pld_returns_finite_objectives(tmp_path, new_store):
    new_store(tmp_path / "mlruns")  # empty, migrated once per test run
    result = cli(tmp_path, "experiment=tune_pld", "model=tiny", "hydra.sweeper.n_trials=2", "dataset.num_prompts=1",
                 "max_new_tokens=8")
    assert "2 jobs: 2 ran, 0 skipped" in result.stdout
    best = yaml.safe_load((tmp_path / "multi" / "optimization_results.yaml").read_text())
    assert math.isfinite(best["best_value"]) and set(best["best_params"]) == {"drafter.k", "drafter.max_ngram"}
    jobs, parents = runs(tmp_path)
    assert len(jobs) == 2 and all(math.isfinite(r.data.metrics["speedup"]) for r in jobs)
    assert max(r.data.metrics["speedup"] for r in jobs) == pytest.approx(best["best_value"])
    assert parents[0].data.tags["specresearch.study"] == "tune_pld"
    assert all(r.data.tags["specresearch.study"] == "tune_pld" for r in jobs)



# --- a killed driver ---------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); None for a process gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in "ZX" else fields


def _children(pid: int) -> dict[int, str]:
    """The live child processes of `pid`: pid -> start time (/proc/PID/stat's 22nd field: a reused pid is another process)."""
    return {int(p): stat[19] for p in os.listdir("/proc") if p.isdigit() and (stat := _stat(int(p))) and stat[1] == str(pid)}


def _alive(processes: dict[int, str]) -> list[int]:
    return [pid for pid, start in processes.items() if (stat := _stat(pid)) and stat[19] == start]


def _shm_of(pids) -> list[str]:
    """/dev/shm entries named after these processes (loky's semaphores, joblib's memmapping folders)."""
    return sorted(n for n in os.listdir("/dev/shm") for p in pids if n.startswith((f"sem.loky-{p}-", f"joblib_memmapping_folder_{p}_")))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc and /dev/shm")
@pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None, reason='pip install -e ".[sweeps]"')
def test_joblib_workers_die_with_a_driver_killed_by_sigkill(tmp_path, new_store):
    """kill -9 of a joblib sweep's driver left its workers measuring on (then idle for loky's 5 minutes) and their
    files in /dev/shm: now each worker follows its driver from its start (sweeps.signals.follow_driver, loky's
    initializer): a running job ends FAILED with what it measured, the workers exit (the third of 3 workers for 2
    jobs, which never gets one, too), and with them go the resource trackers and their files."""
    import shutil

    from tests.helpers import wait_for_a_measured_prompt

    new_store(tmp_path / "mlruns")
    args = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=3", "model=tiny", "drafter=pld", "drafter.k=1,2",
            "dataset.num_prompts=32", "max_new_tokens=48", "exclusive=false"]  # jobs that are still measuring at the kill
    log = tmp_path / "driver.log"  # a file, not a pipe: the workers hold the driver's stdout and stderr
    with open(log, "w") as out:
        driver = subprocess.Popen(command(tmp_path, *args), cwd=tmp_path, env=env_for(tmp_path), stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    children = {}
    try:
        wait_for_a_measured_prompt(tmp_path / "mlruns" / "mlflow.db", driver)  # a job runs, in a worker
        children = _children(driver.pid)  # joblib's workers and the resource trackers
        assert len(children) >= 2
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 120  # a bounded wait for the event, not a measure of speed
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children), f"the driver's workers outlived it: {_alive(children)}\n{log.read_text()[-2000:]}"
        assert _shm_of([driver.pid, *children]) == []
        statuses = {r.info.status for r in runs(tmp_path)[0]}
        assert "FAILED" in statuses and "RUNNING" not in statuses, f"{statuses}\n{log.read_text()[-3000:]}"
        assert "interrupted by SIGTERM: the run is recorded as FAILED with what it measured" in log.read_text()
    finally:
        for pid in _alive(children):
            os.kill(pid, signal.SIGKILL)
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        for name in _shm_of([driver.pid, *children]):  # what workers killed here could not clean
            path = f"/dev/shm/{name}"
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.remove(path)
