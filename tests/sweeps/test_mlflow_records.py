"""What MLflow shows of a run and of a sweep (the UI itself: tests/ui/mlflow_screenshots.py): the sweep's
parent run carries its jobs' summary, job runs their figures, artifacts are strict JSON, the console
has no MLflow chatter."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import pytest

from specresearch.records import NOTE_TAG, headline, json_text
from specresearch.sweeps.summary import swept_keys
from tests.helpers import ROOT, artifact, strict
from tests.sweeps.jobs import FAST, command, env_for, runs

pytestmark = pytest.mark.e2e  # records runs in MLflow stores


def test_json_text_writes_null_for_nan_and_infinity():
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": "NaN", "e": 2}
    assert strict(json_text(value)) == {"a": None, "b": [1.0, None, {"c": None}], "d": "NaN", "e": 2}
    assert "NaN" not in json.dumps(strict(json_text(value, indent=None))["a"])


def test_headline_picks_the_finite_headline_metrics_in_order():
    summary = {"baseline_tau": 1.0, "method_tau": 2.5, "speedup": 1.7, "method_alpha": math.nan, "method_pass@1": 0.5}
    assert list(headline(summary).items()) == [("speedup", 1.7), ("method_tau", 2.5), ("method_pass@1", 0.5)]


def test_a_sweep_that_never_beat_its_baseline_says_so():
    from specresearch.sweeps.summary import describe

    table = [{"drafter.k": "1", "status": "FINISHED", "speedup": 0.7}, {"drafter.k": "3", "status": "FINISHED", "speedup": 0.6}]
    best = {**table[0], "run": "a", "_overrides": {"drafter.k": "1"}}
    assert "(every job was slower than its baseline)" in describe(table, best, "speedup")
    assert "slower" not in describe(table, {**best, "speedup": 1.2}, "speedup")
    assert "slower" not in describe(table, {**best, "method_tau": 0.9}, "method_tau")


def test_swept_keys_are_those_that_differ_between_jobs():
    jobs = [{"model": "tiny", "drafter.k": "2", "verifier": "greedy"}, {"model": "tiny", "drafter.k": "4", "verifier": "typical"},
            {"model": "tiny", "drafter.k": "4"}]
    assert swept_keys(jobs) == ["drafter.k", "verifier"]
    assert swept_keys([{"model": "tiny"}]) == []


def test_a_sweeps_parent_run_summarizes_its_jobs_and_each_job_has_its_figures(tmp_path):
    from mlflow import MlflowClient

    two_prompts = [o for o in FAST if not o.startswith("dataset.num_prompts=")] + ["dataset.num_prompts=2"]
    run = subprocess.run(command(tmp_path, "-m", *two_prompts, "max_new_tokens=12", "drafter.k=1,3,-1"), cwd=tmp_path, env=env_for(tmp_path),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 2, run.stderr[-3000:]  # the k=-1 job is refused; the others go on
    assert "INFO mlflow" not in run.stdout + run.stderr and "alembic" not in run.stdout + run.stderr  # a quiet console
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    jobs, (parent,) = runs(tmp_path)
    assert sorted(j.data.params["drafter.k"] for j in jobs) == ["1", "3"]
    best = max(jobs, key=lambda j: j.data.metrics["speedup"])

    # the parent: the best job's headline metrics, what was swept, a table of jobs, a figure, a description
    metrics, params = parent.data.metrics, parent.data.params
    assert metrics["speedup"] == best.data.metrics["speedup"] and metrics["method_tau"] == best.data.metrics["method_tau"]
    assert metrics["jobs"] == 3 and metrics["jobs_failed"] == 1
    assert params["swept.drafter.k"] == "1,3" and params["best.run"] == best.info.run_name
    assert parent.info.run_name == "sweep drafter.k=1,3,-1"  # named after what it sweeps, as typed
    assert f"drafter.k={best.data.params['drafter.k']}" in params["best.overrides"]
    table = strict(artifact(client, parent, "jobs.json").decode())
    assert table["columns"][:2] == ["drafter.k", "status"] and "speedup" in table["columns"]
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert set(rows) == {"1", "3"} and all(row["status"] == "FINISHED" for row in rows.values())
    assert all(rows[j.data.params["drafter.k"]]["speedup"] == pytest.approx(j.data.metrics["speedup"]) for j in jobs)
    assert artifact(client, parent, "figures/sweep.png").startswith(b"\x89PNG")
    note = parent.data.tags[NOTE_TAG]
    assert f"Best speedup: {best.data.metrics['speedup']:.3f}" in note and "| drafter.k | status | speedup |" in note

    # each job: its figures, the dtype it ran in, headline metrics first, strict JSON artifacts
    for job in jobs:
        assert artifact(client, job, "figures/acceptance_by_position.png").startswith(b"\x89PNG")
        assert artifact(client, job, "figures/time_split.png").startswith(b"\x89PNG")
        assert job.data.params["model.dtype"] == "auto" and job.data.params["model.dtype_used"] == "float32"
        assert job.data.params["model.device_used"] == "cpu"
        assert f"drafter.k={job.data.params['drafter.k']}" in json.loads(job.data.tags["specresearch.overrides"])
        summary = strict(artifact(client, job, "summary.json").decode())
        assert summary["speedup"] == pytest.approx(job.data.metrics["speedup"]) and summary["predicted_speedup"] is None
        for line in artifact(client, job, "records.jsonl").decode().splitlines():
            strict(line)
        log = artifact(client, job, "specresearch.log").decode()  # the job's own log (conf/hydra/job_logging), stamped
        assert "][INFO] - " in log and "speedup" in log
        described = job.data.tags[NOTE_TAG]  # the run page's first line: what ran, on what, its headline numbers
        assert ", target tiny**: speedup " in described and "τ (tokens per target forward)" in described
        assert described.endswith("(FINISHED)") and f"{job.data.metrics['speedup']:.2f}x" in described
        # MLflow lists metrics (and picks the compare page's default axis) in logging order: the headline first,
        # as it stands after each prompt (a chart section of its own, first in the chart view), then per prompt
        metrics = list(client.get_run(job.info.run_id).data.metrics)
        assert metrics[:3] == ["headline/speedup", "headline/method_tau", "headline/method_alpha"]
        assert {"prompt/tau", "prompt/method_tokens_per_s"} <= set(metrics)
        curve = sorted((m.step, m.value) for m in client.get_metric_history(job.info.run_id, "headline/speedup"))
        assert [step for step, _ in curve] == [0, 1] and curve[-1][1] == pytest.approx(job.data.metrics["speedup"])
        assert summary["speedup"] == pytest.approx(job.data.metrics["speedup"])


# --- stores MLflow cannot use, runs left RUNNING by dead processes (issue 35) -------------------------

def _refusal(tracker) -> str:
    from specresearch.errors import SpecResearchError

    with pytest.raises(SpecResearchError) as refused:
        tracker.check_reachable()
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_file_that_is_no_mlflow_database_is_refused_naming_it(tmp_path):
    from specresearch.tracking import MLflowTracker

    store = tmp_path / "mlruns"
    store.mkdir()
    noise = bytes(range(256)) * 8
    (store / "mlflow.db").write_bytes(noise)
    assert _refusal(MLflowTracker(store=str(store))) == (
        f"cannot record in the MLflow store {store} (tracker.store): {store}/mlflow.db is not an MLflow database "
        "(sqlite: file is not a database)")
    assert (store / "mlflow.db").read_bytes() == noise and sorted(store.iterdir()) == [store / "mlflow.db"]


def test_a_store_path_mlflows_uri_cannot_hold_is_refused(tmp_path):
    from specresearch.analysis.runs import AnalysisError
    from specresearch.analysis.tables import tracker_target

    from specresearch.tracking import MLflowTracker

    store = tmp_path / "x" / "a#b?c"
    message = _refusal(MLflowTracker(store=str(store)))
    assert message == f"tracker.store cannot hold '?' (MLflow's sqlite URI reads them otherwise), got {store}"
    with pytest.raises(AnalysisError, match=r"tracker.store cannot hold '\?'"):
        tracker_target("leviathan", {"store": str(store)})
    assert not (tmp_path / "x").exists()


def test_a_store_path_with_a_hash_round_trips_to_the_browse_line_and_the_analysis(tmp_path):
    """'#' is kept by MLflow's sqlite URI: the database is where the browse line and the analysis look."""
    from mlflow import MlflowClient
    from specresearch.analysis.tables import tracker_target

    from specresearch.tracking import MLflowTracker, tracked_run
    from tests.helpers import make_cfg

    store = tmp_path / "a#b"
    tracker = MLflowTracker(store=str(store))
    tracker.check_reachable()
    with tracked_run(tracker, make_cfg(*FAST), "run", lambda: ({"speedup": 1.0}, {})):
        pass
    assert (store / "mlflow.db").is_file() and not (tmp_path / "a").exists()
    uri = tracker.browse_hint().split("--backend-store-uri ")[1].split()[0]
    assert uri == f"sqlite:///{store}/mlflow.db" == tracker_target("leviathan", {"store": str(store)})[0]
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("specresearch").experiment_id])
    assert run.info.status == "FINISHED"


def test_an_unreachable_tracking_server_is_refused_at_once():
    """No MLflow retry loop (minutes): one short request."""
    from specresearch.analysis.runs import AnalysisError, load_study

    from specresearch.tracking import MLflowTracker

    message = _refusal(MLflowTracker(uri="http://127.0.0.1:9"))
    assert message.startswith("cannot reach the MLflow server http://127.0.0.1:9 (tracker.uri) within 3 s: ")
    with pytest.raises(AnalysisError, match="cannot reach the MLflow server http://127.0.0.1:9"):
        load_study("leviathan", "http://127.0.0.1:9", "specresearch")


def test_an_empty_experiment_name_is_refused_before_anything_runs():
    from specresearch.errors import SpecResearchError
    from specresearch.settings import check_config
    from tests.helpers import make_cfg

    with pytest.raises(SpecResearchError, match="^tracker.experiment must be a non-empty name, got ''$"):
        check_config(make_cfg("tracker.experiment="))
    with pytest.raises(SpecResearchError, match="^tracker.store must be a non-empty name, got ''$"):
        check_config(make_cfg("tracker.store="))


def test_runs_of_dead_processes_on_this_host_are_marked_failed_when_a_store_opens(tmp_path, new_store):
    """Single runs, jobs and sweep parents alike, in any experiment, keeping what they logged; a live
    process's run and another host's stay RUNNING."""
    import socket

    from mlflow import MlflowClient
    from specresearch.analysis.runs import load_study

    from specresearch.tracking import MLflowTracker

    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        host = socket.gethostname()
        store = new_store(tmp_path / "mlruns")
        client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
        here, other = (client.create_experiment(name, artifact_location=(tmp_path / name).as_uri()) for name in ("specresearch", "other"))

        def running(experiment, pid, host=host, **tags):
            return client.create_run(experiment, tags={"specresearch.host": host, "specresearch.pid": str(pid), **tags}).info.run_id

        parent = running(here, dead.pid, **{"specresearch.sweep": "true"})
        single = running(other, dead.pid)
        client.log_metric(single, "prompts", 3)
        live = running(here, alive.pid)
        elsewhere = running(here, dead.pid, host="another-host")

        MLflowTracker(store=str(store)).experiment_id()  # what every run does first
        status = {run: client.get_run(run).info.status for run in (parent, single, live, elsewhere)}
        assert status == {parent: "FAILED", single: "FAILED", live: "RUNNING", elsewhere: "RUNNING"}
        assert client.get_run(single).data.tags["specresearch.interrupted"] == "true"
        assert client.get_run(single).data.metrics["prompts"] == 3

        alive.kill()
        alive.wait()
        with pytest.raises(Exception, match="no FINISHED runs"):  # the analysis marks them too
            load_study("leviathan", f"sqlite:///{store}/mlflow.db", "specresearch")
        assert client.get_run(live).info.status == "FAILED" and client.get_run(elsewhere).info.status == "RUNNING"
    finally:
        alive.kill()


def test_the_experiment_opens_on_the_runs_table_and_describes_itself(tmp_path):
    """MLflow 3 opens an experiment of kind custom_model_development on its runs table (not the GenAI traces view):
    ours is made so, with a description naming the headline metrics and a shared view of the runs table with the
    headline as columns, which the page a run names opens (in MLflow 3.17 only a page's workflowType and
    viewStateShareKey do it); one made before (or by hand) gets all three."""
    import mlflow
    from mlflow import MlflowClient

    from specresearch.records import HEADLINE
    from specresearch.tracking import VIEW, MLflowTracker, runs_page, tracked_run
    from tests.helpers import make_cfg

    for made_before in (False, True):
        store = tmp_path / str(made_before)
        tracker = MLflowTracker(store=str(store))
        tracker.check_reachable()
        if made_before:
            mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
            mlflow.create_experiment("specresearch")
        with tracked_run(tracker, make_cfg(*FAST), "run", lambda: ({"speedup": 1.0}, {})):
            pass
        tags = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db").get_experiment_by_name("specresearch").tags
        assert tags["mlflow.experimentKind"] == "custom_model_development", made_before
        assert all(f"`{name}`" in tags[NOTE_TAG] for name in HEADLINE)
        view = json.loads(tags[f"mlflow.sharedViewState.{VIEW}"])  # the runs table's columns: the headline's first metrics
        assert view["selectedColumns"] == [f"metrics.`{name}`" for name in ("speedup", "method_tau", "method_alpha")]
        assert set(view["selectedColumns"]) <= {f"metrics.`{name}`" for name in HEADLINE}
        experiment = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db").get_experiment_by_name("specresearch").experiment_id
        page = runs_page("http://127.0.0.1:5000", experiment)
        assert tracker.browse_hint() == f"mlflow ui --backend-store-uri sqlite:///{store}/mlflow.db and open {page}"
        assert page.endswith(f"/#/experiments/{experiment}/runs?viewStateShareKey={VIEW}&workflowType=machine_learning")


def test_the_page_a_sweep_names_opens_on_its_runs_with_the_headline_as_columns(tmp_path):
    """In a real browser (Chromium, 1400 x 900), the page a sweep's last line names shows MLflow's runs table
    (its Model training view, not the GenAI overview it opens an experiment on) with speedup, method_tau and
    method_alpha as columns and the sweep's parent run as a row, without a click."""
    pytest.importorskip("playwright")
    from tests.ui import mlflow_screenshots as ui

    if not Path(ui.CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {ui.CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    said = ui.sweep(tmp_path)
    server, url = ui.serve(tmp_path)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=ui.CHROMIUM, args=ui.FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            ui.first_screen(page, said.replace("http://127.0.0.1:5000", url))  # waits for the speedup column
            for column in ("speedup", "method_tau", "method_alpha"):
                assert ui.column(page, column).is_visible(), column
            assert page.get_by_text("sweep drafter.k=2,4,8", exact=True).is_visible()  # the parent run, named after its sweep
            assert not page.get_by_text("Overview", exact=True).count() and "workflowType=machine_learning" in page.url
            page.screenshot(path=tmp_path / "first_screen.png")
            browser.close()
    finally:
        server.terminate()


# --- the code a run was measured by (issue 59) ------------------------------------------------------

def test_same_code_needs_the_same_commit_and_dirty_state_or_outside_a_checkout_the_same_version():
    from specresearch.records import COMMIT_TAG, DIFF_TAG, DIRTY_TAG, VERSION_TAGS, code_of, same_code

    version = VERSION_TAGS["specresearch"]
    clean = {COMMIT_TAG: "a" * 40, DIRTY_TAG: "false", version: "0.1.0"}
    dirty = {**clean, DIRTY_TAG: "true", DIFF_TAG: "1234"}
    assert same_code(clean, clean) and same_code(dirty, dirty)
    assert same_code({**clean, version: "0.0.9"}, clean)  # in a checkout the commit names the code
    assert not same_code({**clean, COMMIT_TAG: "b" * 40}, clean)
    assert not same_code(clean, dirty) and not same_code(dirty, clean)  # a dirty tree is other code than its commit
    assert not same_code({**dirty, DIFF_TAG: "5678"}, dirty)  # other uncommitted changes
    unknown = {k: v for k, v in dirty.items() if k != DIFF_TAG}  # changes that could not be read: equal to nothing
    assert not same_code(unknown, unknown)
    assert not same_code({}, clean) and not same_code({version: "0.1.0"}, clean)  # recorded nothing, or outside a checkout
    wheel = {version: "0.1.0"}
    assert same_code(wheel, wheel) and not same_code({version: "0.2.0"}, wheel) and not same_code(clean, wheel)
    assert not same_code({}, wheel)
    assert code_of(clean) == "aaaaaaaaaaaa" and code_of(dirty) == "aaaaaaaaaaaa+dirty 1234"
    assert code_of(unknown) == "aaaaaaaaaaaa+dirty (changes unknown)"
    assert code_of(wheel) == "specresearch 0.1.0" and code_of({}) == "unrecorded"


def test_code_tags_never_fail_a_run_where_git_is_missing_hangs_or_is_no_checkout(tmp_path, monkeypatch, capfd):
    """Without a usable git (missing, hanging past GIT_TIMEOUT_S, complaining on stderr) or outside a checkout of
    specresearch, the version names the code; git's stderr never reaches the console. Computed once per process."""
    from specresearch import records
    from specresearch.records import COMMIT_TAG, DIRTY_TAG, VERSION_TAGS, code_tags

    assert code_tags() is code_tags()  # cached
    versions = {tag: code_tags()[tag] for tag in VERSION_TAGS.values()}
    fresh = code_tags.__wrapped__
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert fresh() == versions
    (tmp_path / "git").write_text("#!/bin/sh\necho 'fatal: something' >&2\nexec sleep 30\n")
    (tmp_path / "git").chmod(0o755)
    monkeypatch.setattr(records, "GIT_TIMEOUT_S", 0.5)
    started = time.monotonic()
    assert fresh() == versions and time.monotonic() - started < 10
    assert "fatal" not in "".join(capfd.readouterr())
    monkeypatch.undo()
    monkeypatch.setattr(records, "__file__", str(tmp_path / "site-packages" / "specresearch" / "records.py"))
    assert COMMIT_TAG not in fresh() and DIRTY_TAG not in fresh()  # a folder that is no checkout of its own


def test_a_hung_git_does_not_hold_a_tracked_run(tmp_path):
    """A `git` that never answers (a network file system): MLflow's own git lookup (GitPython, no timeout) held every
    run for as long as git hung; with it out of MLflow's context providers the run records FINISHED, our tags
    without a commit (our git call gave up after GIT_TIMEOUT_S). In a process of its own, with a deadline."""
    import sys

    from mlflow import MlflowClient

    from specresearch.records import COMMIT_TAG, MLFLOW_COMMIT_TAG

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "git").write_text("#!/bin/sh\nexec sleep 900\n")
    (tmp_path / "bin" / "git").chmod(0o755)
    store = tmp_path / "store"
    script = ("from specresearch.tracking import MLflowTracker, tracked_run\nfrom tests.helpers import make_cfg\n"
              "from tests.sweeps.jobs import FAST\n"
              f"tracker = MLflowTracker(store={str(store)!r})\n"
              "with tracked_run(tracker, make_cfg(*FAST), 'run', lambda: ({'speedup': 1.0}, {})):\n    pass\n")
    env = {**env_for(tmp_path), "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=600)  # git alone hangs 900 s
    client = MlflowClient(tracking_uri=f"sqlite:///{store}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("specresearch").experiment_id])
    assert run.info.status == "FINISHED" and COMMIT_TAG not in run.data.tags and MLFLOW_COMMIT_TAG not in run.data.tags


def test_every_run_opened_goes_through_the_tracker_that_tags_the_code():
    """Runs are opened by tracking.MLflowTracker only (start: process_tags; start_parent: the sweep callback's
    process_tags), so every entry point (CLI, sweep job and parent, benchmarks, training, eval) tags its code."""

    root = ROOT
    openers = {str(path.relative_to(root)) for folder in ("specresearch", "benchmarks", "analysis")
               for path in (root / folder).rglob("*.py") if "start_run(" in path.read_text()}
    assert openers == {"specresearch/tracking.py"}
    assert "process_tags(config)" in (root / "specresearch/sweeps/callback.py").read_text()
