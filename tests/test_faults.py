"""Faults (issue 19): one line, a non-zero exit, nothing half-written, never a lost result.

End to end through `python -m specresearch` on the tiny random model: results that cannot be written
are refused before anything runs, Ctrl-C records the run FAILED and exits 130, two runs starting at
once on a new store both record, and a refused run leaves no empty output folder."""

import signal
import subprocess
import sys
import time

import pytest

from specresearch.config import CONF_DIR
from tests.helpers import interrupt_when_measuring, run_specresearch, specresearch_command, user_env
from tests.tiny import TINY

pytestmark = pytest.mark.e2e  # runs the command line and kills it (signals, full disks, broken stores)

FAST = [*TINY, "dataset.num_prompts=1", "max_new_tokens=4"]


def cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """The command line in tmp_path, Hydra's own outputs/ there (what a user gets)."""
    return run_specresearch(*args, cwd=tmp_path, outputs=False, timeout=300)


def statuses(store) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
    experiment = client.get_experiment_by_name("specresearch")
    return sorted(r.info.status for r in client.search_runs([experiment.experiment_id]))


@pytest.mark.parametrize("where", ["under a file", "in /proc"])
def test_an_unwritable_store_is_one_line_before_the_models_load(tmp_path, where):
    """The unknown model would be refused when the models load: the store is refused before that."""
    (tmp_path / "file").write_text("")
    store = tmp_path / "file" / "sub" if where == "under a file" else "/proc/specresearch-test/mlruns"
    result = cli(tmp_path, *FAST, "model.name=no-such-model", f"tracker.store={store}", f"hydra.run.dir={tmp_path}/out")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: cannot write the MLflow store {store} (tracker.store): ")
    assert line.endswith(f"{tmp_path}/file is not a folder" if where == "under a file" else "cannot create a file in /proc (No such file or directory)")
    assert not (tmp_path / "out").exists()  # refused before Hydra made the run's folder


@pytest.mark.parametrize("mode", ["run", "sweep"])
def test_an_unwritable_hydra_output_dir_is_one_line(tmp_path, mode):
    (tmp_path / "file").write_text("")
    key = "hydra.run.dir" if mode == "run" else "hydra.sweep.dir"
    result = cli(tmp_path, *(["-m"] if mode == "sweep" else []), *FAST, f"tracker.store={tmp_path}/mlruns",
                 f"{key}={tmp_path}/file/sub")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: cannot write Hydra's output folder {tmp_path}/file/sub ({key}): {tmp_path}/file is not a folder"]
    assert not (tmp_path / "mlruns").exists()


def test_ctrl_c_records_the_run_failed_and_exits_130(tmp_path, new_store):
    store = new_store(tmp_path / "mlruns")
    args = ["model=tiny", "drafter=pld", "drafter.k=2", "dataset.num_prompts=60", "max_new_tokens=64",
            f"tracker.store={store}", f"hydra.run.dir={tmp_path}/out"]
    # as from a terminal: a job started in the background by a shell without job control inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler (the test would hang on to the end)
    returncode, _, err = interrupt_when_measuring(specresearch_command(*args), store / "mlflow.db", signal.SIGINT, cwd=tmp_path, env=user_env(),
                                                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert returncode == 128 + signal.SIGINT, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines()[-1] == "interrupted by SIGINT: the run is recorded as FAILED with what it measured"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("specresearch").experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.metrics["prompt/tau"] >= 1 and 1 <= run.data.metrics["prompts"] < 60  # what it had measured is kept


def test_two_runs_starting_at_once_on_a_new_store_both_record_each_in_its_own_folder(tmp_path):
    """Without the store lock the second dies in MLflow's schema migration of the new database; in
    Hydra's default folder (outputs/DATE/TIME) the second run of the same second gets TIME-1."""
    store = tmp_path / "mlruns"
    procs = [subprocess.Popen(specresearch_command("model=tiny", "drafter=pld", "dataset.num_prompts=1", "max_new_tokens=4", "exclusive=false",
                                   f"dataset.offset={i}", f"tracker.store={store}"),
                              cwd=tmp_path, env=user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        errs = [proc.communicate(timeout=240)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(err[-2000:] for err in errs)
    assert statuses(store) == ["FINISHED", "FINISHED"]
    folders = sorted(path.parent.parent for path in (tmp_path / "outputs").glob("*/*/.hydra/overrides.yaml"))
    assert len(folders) == 2 and len(list((tmp_path / "outputs").glob("*/*"))) == 2
    offsets = sorted(next(line for line in (folder / ".hydra" / "overrides.yaml").read_text().splitlines() if "offset" in line)
                     for folder in folders)
    assert offsets == ["- dataset.offset=0", "- dataset.offset=1"]
    for folder in folders:
        assert (folder / "records.jsonl").read_text() and '"status": "FINISHED"' in (folder / "summary.json").read_text()


def test_a_claimed_folder_is_never_given_twice(tmp_path):
    from specresearch.errors import SpecResearchError
    from specresearch.sweeps import claim_folder

    stamp = tmp_path / "outputs" / "2026-01-01" / "12-00-00"
    assert [claim_folder(stamp) for _ in range(3)] == [stamp, stamp.with_name("12-00-00-1"), stamp.with_name("12-00-00-2")]
    (tmp_path / "file").write_text("")
    with pytest.raises(SpecResearchError, match=f"^cannot make Hydra's output folder {tmp_path}/file/x: {tmp_path}/file is not a folder$"):
        claim_folder(tmp_path / "file" / "x")


@pytest.mark.parametrize("case", ["no MLflow database", "unreachable server", "speed lock under a file"])
def test_a_store_or_lock_that_cannot_serve_is_one_line_before_the_models_load(tmp_path, case):
    """The unknown model would be refused when the models load: these are refused before that."""
    (tmp_path / "file").write_text("")
    store = tmp_path / "mlruns"
    store.mkdir()
    (store / "mlflow.db").write_bytes(b"not sqlite at all" * 64)
    where = {"no MLflow database": [f"tracker.store={store}"], "unreachable server": ["tracker.uri=http://127.0.0.1:9"],
             "speed lock under a file": ["tracker=none"]}[case]
    lock = {"SPECRESEARCH_SPEED_LOCK": f"{tmp_path}/file/speed.lock"} if case == "speed lock under a file" else {}
    result = subprocess.run(specresearch_command(*FAST, "model.name=no-such-model", *where), cwd=tmp_path, env={**user_env(), **lock},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith({
        "no MLflow database": f"error: cannot record in the MLflow store {store} (tracker.store): {store}/mlflow.db is not an MLflow database",
        "unreachable server": "error: cannot reach the MLflow server http://127.0.0.1:9 (tracker.uri) within 3 s:",
        "speed lock under a file": f"error: cannot use the speed lock {tmp_path}/file/speed.lock",
    }[case]), line
    assert (store / "mlflow.db").read_bytes() == b"not sqlite at all" * 64 and not (tmp_path / "outputs").exists()


def _wait_for(path, text: str, proc, timeout: float = 120.0) -> None:
    """Until the file `path` (a process's stdout) holds `text`."""
    deadline = time.monotonic() + timeout
    while text not in path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, path.read_text()[-2000:]
        time.sleep(0.1)


def _waiting_for_the_lock(tmp_path, *args: str) -> tuple[subprocess.Popen, object]:
    """Start `specresearch ARGS` and return once it waits for the speed lock (which the caller holds)."""
    out = tmp_path / "stdout.txt"
    with open(out, "w") as stdout:
        proc = subprocess.Popen(specresearch_command(*args), cwd=tmp_path, env={**user_env(), "SPECRESEARCH_SPEED_LOCK": str(tmp_path / "speed.lock")},
                                stdout=stdout, stderr=subprocess.PIPE, text=True)
    _wait_for(out, "waiting for the speed lock", proc)
    return proc, out


@pytest.mark.parametrize("case", ["tiny vocab_size=0", "damaged checkpoint", "too few prompts", "battery past the prompts"])
def test_a_refusal_does_not_wait_for_the_speed_lock(tmp_path, case):
    """With another process holding the speed lock, what can be checked without a model (settings, a
    tiny model's sizes, a checkpoint's files, the prompts) is refused at once, in one line: not
    "waiting for the speed lock" until the holder ends."""
    from specresearch.sweeps import speed_lock

    (tmp_path / "heads.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{" + b"\x07" * 50)  # a cut header
    (tmp_path / "heads.json").write_text('{"hidden": 64, "heads": 3, "layers": 1, "own_lm_head": false, "vocab": 320}')
    args, line = {
        "tiny vocab_size=0": (["model.tiny.vocab_size=0"], "error: model.tiny.vocab_size must be an integer >= 2, got 0"),
        "damaged checkpoint": (["model=tiny", "drafter=medusa", f"drafter.checkpoint={tmp_path}/heads.safetensors"],
                               f"error: {tmp_path}/heads.safetensors is not a whole safetensors file"),
        "too few prompts": (["dataset.offset=162", "dataset.num_prompts=5"],
                            "error: dataset.offset + dataset.num_prompts = 167 > the 164 prompts of humaneval"),
        "battery past the prompts": (["sampling=random", "verifier=rejection", "stats.samples=10", "stats.prompts=100"],
                                     "error: stats.prompts=100 > the 1 prompt(s) this run decodes"),
    }[case]
    store = tmp_path / "mlruns"
    with speed_lock(tmp_path / "speed.lock"):
        start = time.monotonic()
        result = subprocess.run(specresearch_command(*(FAST if "drafter=medusa" not in args else ["dataset.num_prompts=1", "max_new_tokens=4"]), *args,
                                     f"tracker.store={store}", f"hydra.run.dir={tmp_path}/out"), cwd=tmp_path,
                                env={**user_env(), "SPECRESEARCH_SPEED_LOCK": str(tmp_path / "speed.lock")},
                                capture_output=True, text=True, timeout=120)
        took = time.monotonic() - start
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "waiting for the speed lock" not in result.stdout and took < 60
    (got,) = result.stderr.strip().splitlines()
    assert got.startswith(line), got
    assert not (tmp_path / "out").exists() and not store.exists()


def test_sigterm_before_a_run_opened_says_nothing_was_recorded(tmp_path):
    from specresearch.sweeps import speed_lock

    store = tmp_path / "mlruns"
    with speed_lock(tmp_path / "speed.lock"):
        proc, _ = _waiting_for_the_lock(tmp_path, *FAST, f"tracker.store={store}", f"hydra.run.dir={tmp_path}/out")
        try:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "interrupted by SIGTERM before a run opened: nothing recorded"
    assert not (store / "mlflow.db").exists()  # no run, not even a store


def test_a_sweep_driver_killed_before_its_first_job_leaves_no_running_parent(tmp_path, new_store):
    """SIGKILL leaves the sweep's parent run RUNNING; the next run on the store marks it FAILED."""
    from mlflow import MlflowClient

    from specresearch.sweeps import speed_lock

    store = new_store(tmp_path / "mlruns")
    with speed_lock(tmp_path / "speed.lock"):
        proc, _ = _waiting_for_the_lock(tmp_path, "-m", *FAST, f"tracker.store={store}", f"hydra.sweep.dir={tmp_path}/multi")
        proc.kill()
        proc.communicate(timeout=60)
    client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
    (parent,) = client.search_runs([client.get_experiment_by_name("specresearch").experiment_id])
    assert parent.info.status == "RUNNING" and parent.data.tags["specresearch.sweep"] == "true"

    after = cli(tmp_path, "model=tiny", "drafter=pld", "dataset.num_prompts=1", "max_new_tokens=4", "exclusive=false",
                f"tracker.store={store}", f"hydra.run.dir={tmp_path}/out")
    assert after.returncode == 0, after.stderr[-3000:]
    assert f"marked run {parent.info.run_id} FAILED: interrupted (its process {proc.pid} on this host is gone)" in after.stdout
    parent = client.get_run(parent.info.run_id)
    assert parent.info.status == "FAILED" and parent.data.tags["specresearch.interrupted"] == "true"
    assert statuses(store) == ["FAILED", "FINISHED"]


def test_a_refused_run_leaves_no_empty_output_folder(tmp_path):
    """Hydra makes outputs/DATE/TIME/ (with .hydra/ and the job log) before the run is refused: what it
    made for that run goes, a folder that was there before stays."""
    refused = cli(tmp_path, *FAST, "drafter.k=0", "tracker=none")  # default hydra.run.dir: outputs/DATE/TIME
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("error: drafter=independent needs k >= 1")
    assert not (tmp_path / "outputs").exists()

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    kept = cli(tmp_path, *FAST, "model.name=no-such-model", "tracker=none", f"hydra.run.dir={tmp_path}/mine")
    assert kept.returncode == 2 and "unknown model 'no-such-model'" in kept.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("args", [["drafter=nope"], ["-m", "drafter=pld,nope"], ["+drafter=nope"]])
def test_an_unknown_option_is_one_line_naming_the_valid_ones(tmp_path, args):
    """Before Hydra composes (its own message is a dozen lines with the search path)."""
    result = cli(tmp_path, *FAST, *args)
    valid = ", ".join(sorted(p.stem for p in (CONF_DIR / "drafter").glob("*.yaml")))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: unknown drafter 'nope': valid are {valid}"]
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_a_setting_the_option_lacks_is_one_line_naming_the_valid_ones(tmp_path):
    result = cli(tmp_path, *FAST, "drafter=tree", "drafter.lookup=4", "tracker=none")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("error: drafter=tree has no setting 'drafter.lookup': valid are drafter.branching, ")
    assert not (tmp_path / "outputs").exists()


def test_the_train_command_refuses_in_one_line_and_leaves_no_folder(tmp_path):
    def train(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "specresearch.train", *args], cwd=tmp_path, env=user_env(),
                              capture_output=True, text=True, timeout=300)

    refused = train("model=tiny", "drafter=pld", "tracker=none")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("error: specresearch.train trains drafters")
    assert "use drafter=eagle or drafter=medusa" in refused.stderr
    unknown = train("drafter=nope")
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        f"error: unknown drafter 'nope': valid are {', '.join(sorted(p.stem for p in (CONF_DIR / 'drafter').glob('*.yaml')))}"]
    unwritable = train("model=tiny", "drafter=medusa", "tracker.store=/proc/nope")
    assert unwritable.returncode == 2 and "cannot write the MLflow store" in unwritable.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "outputs").exists()
