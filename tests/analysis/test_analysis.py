"""specresearch.analysis on real tiny-model sweeps run through the CLI into one temporary MLflow store: the
tables' rows and columns, their values against what MLflow holds, the PNGs, the folder logged to the
sweep's parent run, re-runs counted once, published numbers kept apart, and the errors; a study
added as one folder; the typed run records read back."""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from specresearch.analysis import published
from specresearch.analysis.format import DASH, Col, Table, latex, latex_escape, markdown
from specresearch.analysis.runs import AnalysisError, load_study
from specresearch.analysis.studies import builder
from specresearch.analysis.tables import analyse, parse, tracker_target

from specresearch import config as conf
from specresearch.metrics import leviathan_speedup
from tests.helpers import make_cfg, run_specresearch
from tests.tiny import TINY

pytestmark = pytest.mark.e2e  # runs studies and their analysis through MLflow

PNG = b"\x89PNG\r\n\x1a\n"
# Speed jobs hold the machine's speed lock (one timing at a time); these tiny jobs time nothing we
# read, and must not wait for other people's long measurements on a shared machine.
NO_LOCK = ["exclusive=false"] if "exclusive" in make_cfg() else []
SMALL = ["dataset.num_prompts=1", "dataset.per_category=1", "++dataset.categories=[writing,coding]", "max_new_tokens=6"]


def uri(store) -> str:
    return f"sqlite:///{store}/mlflow.db"


def run_cli(store, tmp_path_factory, name: str, *args: str) -> None:
    result = run_specresearch(*args, *NO_LOCK, f"tracker.store={store}", cwd=tmp_path_factory.mktemp(name))
    assert result.returncode == 0, result.stderr[-3000:]


def mlflow_jobs(store, study: str) -> list:
    """The study's job runs, read back independently of specresearch.analysis.runs."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri(store))
    exp = client.get_experiment_by_name("specresearch")
    return [r for r in client.search_runs([exp.experiment_id], filter_string=f"params.study = '{study}'", max_results=1000)]


def latest(runs, key):
    out = {}
    for r in sorted(runs, key=lambda r: r.info.start_time):
        out[key(r)] = r
    return out


def assert_pngs(out, names):
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == PNG, name
        from PIL import Image

        with Image.open(out / name) as image:
            image.verify()


@pytest.fixture(scope="session")  # (session: pytest -n interleaves modules on a worker, which would make a module fixture again)
def store(tmp_path_factory, new_store):
    return new_store(tmp_path_factory.mktemp("analysis") / "mlruns")  # every study's runs in one store, as in real use


@pytest.fixture(scope="session")  # (session: pytest -n interleaves modules on a worker, which would make a module fixture again)
def leviathan_store(store, tmp_path_factory):
    common = ["experiment=leviathan", *TINY, *SMALL]
    run_cli(store, tmp_path_factory, "leviathan", *common, "drafter.k=1,2")  # 2 tasks x 2 T x 2 k = 8 jobs
    # one of those jobs again, alone (not a sweep, so `resume` does not skip it): a re-run of one config
    run_cli(store, tmp_path_factory, "rerun", *common, "hydra.mode=RUN", "dataset=mtbench", "sampling.temperature=1.0", "drafter.k=2")
    return store


@pytest.fixture(scope="session")  # (session: pytest -n interleaves modules on a worker, which would make a module fixture again)
def specbench_store(store, tmp_path_factory):
    # model-free or self-drafting methods (no draft model, no trained heads); 4 layers so self_draft skips some
    run_cli(store, tmp_path_factory, "specbench", "experiment=specbench", "model=tiny", "model.tiny.num_layers=4",
            "drafter=pld,self_draft", "dataset=humaneval,mtbench,sharegpt", *SMALL)
    return store


@pytest.fixture(scope="session")  # (session: pytest -n interleaves modules on a worker, which would make a module fixture again)
def lossless_store(store, tmp_path_factory):
    run_cli(store, tmp_path_factory, "lossless", "experiment=lossless_vs_lossy", *TINY, "lossless_vs_lossy/arm=independent",
            "verifier=rejection,typical", "sampling.temperature=0.0,1.0", "dataset.offset=0", "dataset.num_prompts=1",
            "max_new_tokens=6", "stats.samples=10", "stats.length=2", "stats.distortion=4")
    return store


def _sandbox_ready() -> bool:
    from specresearch.evaluation import sandbox

    return sys.platform.startswith("linux") and all(sandbox.isolation().get(layer) for layer in sandbox.REQUIRED)


@pytest.fixture(scope="session")  # (session: pytest -n interleaves modules on a worker, which would make a module fixture again)
def medusa_store(store, tmp_path_factory):
    """The medusa_typical grid on tiny models (an independent tiny draft stands in for Medusa heads, which
    need training): speed + battery for ε = 0.09 and 0.3, the rejection reference alone, and quality
    (HumanEval, 1 problem) for ε = 0.09 only, so the other rows' quality side is missing."""
    common = ["experiment=medusa_typical", "drafter=independent", *TINY, "dataset.num_prompts=1", "max_new_tokens=6",
              "stats.samples=10", "stats.length=2"]
    run_cli(store, tmp_path_factory, "medusa_speed", *common, "verifier.epsilon=0.09,0.3")
    run_cli(store, tmp_path_factory, "medusa_reference", *common, "hydra.mode=RUN", "verifier=rejection")
    cache = tmp_path_factory.mktemp("cache")
    if _sandbox_ready():
        run_cli(store, tmp_path_factory, "medusa_quality", *common, "verifier.epsilon=0.09", "eval=humaneval",
                "eval.allow_code_execution=true", "eval.limit=1", f"model.cache_dir={cache}")
    else:
        _log_quality_run(store)
    return store


def _log_quality_run(store) -> None:
    """Where this machine cannot sandbox model-written code, the quality run of ε = 0.09 is logged
    directly, with the run contract of `eval=humaneval` (params of the speed run plus eval.*, the
    study tags, the metric names of runner.summarise): the join is what is tested here."""
    import mlflow

    (speed,) = [r for r in mlflow_jobs(store, "medusa_typical") if r.data.params.get("verifier.epsilon") == "0.09"]
    mlflow.set_tracking_uri(uri(store))
    params = {**speed.data.params, "eval.task": "humaneval_offline", "eval.limit": "1"}
    params.pop("eval", None)
    with mlflow.start_run(experiment_id=speed.info.experiment_id, tags={"specresearch.study": "medusa_typical",
                                                                         "specresearch.config_hash": "synthetic-quality"}):
        mlflow.log_params(params)
        mlflow.log_metrics(dict(baseline_pass_at_1=0.0, method_pass_at_1=0.0, delta_pass_at_1=0.0, mcnemar_p=1.0,
                                problems=1, method_tau=1.5))


# --------------------------------------------------------------------------------------------------


def test_leviathan_tables_match_mlflow(leviathan_store, tmp_path):
    study, report, out = analyse("leviathan", uri(leviathan_store), out=tmp_path / "out", log=False)
    jobs = [r for r in mlflow_jobs(leviathan_store, "leviathan") if r.info.status == "FINISHED"]
    assert len(jobs) == 9  # 8 sweep jobs + 1 re-run
    kept = latest(jobs, lambda r: (r.data.params["dataset.name"], r.data.params["sampling.temperature"], r.data.params["drafter.k"]))
    assert len(kept) == 8 and len(study.runs) == 8  # the re-run counts once ...
    assert {r.id for r in study.runs} == {r.info.run_id for r in kept.values()}  # ... and the latest is kept
    (old,) = study.superseded
    assert old.config_hash == kept[("mtbench", "1.0", "2")].data.tags.get("specresearch.config_hash", old.config_hash)
    assert study.parent is not None and study.parent.tags.get("specresearch.sweep", "true") == "true"

    by_task = report.table("leviathan_alpha")
    assert by_task.headers[:5] == ["task", "T", "k runs", "α (pooled)", "c (mean)"]
    assert [(r["task"], r["T"]) for r in by_task.records] == [("humaneval", 0.0), ("humaneval", 1.0), ("mtbench", 0.0), ("mtbench", 1.0)]
    assert by_task.column("task") == ["HumanEval", "HumanEval", "MT-bench", "MT-bench"]
    for rec, cells in zip(by_task.records, by_task.cells):
        runs = [r for (d, t, _), r in kept.items() if (d, float(t)) == (rec["task"], rec["T"])]
        accepted = sum(r.data.metrics["method_accepted"] for r in runs)  # Leviathan's α: accepted / tried tokens
        alpha = accepted / (accepted + sum(r.data.metrics["method_rejected"] for r in runs))
        assert rec["alpha"] == pytest.approx(alpha) and cells[3] == f"{alpha:.3f}"
        c = sum(r.data.metrics["draft_cost_ratio_c"] for r in runs) / len(runs)
        assert rec["c"] == pytest.approx(c) and rec["ks"] == [1, 2]
        best = max(runs, key=lambda r: r.data.metrics["speedup"])
        assert rec["best_k"] == int(best.data.params["drafter.k"]) and rec["best_speedup"] == best.data.metrics["speedup"]
        predicted = {int(r.data.params["drafter.k"]): leviathan_speedup(alpha, int(r.data.params["drafter.k"]), c,
                                                                        r.data.metrics["verify_cost_v"]) for r in runs}
        assert rec["pred_k"] == max(predicted, key=predicted.get)
        assert rec["ideal_k"] >= 1 and rec["ideal_speedup"] > 0  # the paper's v = 1

    per_k = report.table("leviathan_k")
    assert len(per_k.records) == 8 and per_k.headers[:4] == ["task", "T", "k", "speedup"]
    for rec, cells in zip(per_k.records, per_k.cells):
        run = kept[(rec["task"], f"{rec['T']:.1f}", str(rec["k"]))]
        assert rec["run"] == run.info.run_id and rec["speedup"] == run.data.metrics["speedup"]
        assert cells[3] == f"{run.data.metrics['speedup']:.2f}×"
        assert rec["tau"] == run.data.metrics["method_tau"] and rec["kept"] == run.data.metrics["method_alpha"]
        assert rec["alpha"] == pytest.approx(run.data.metrics["method_alpha_token"])

    md = (out / "tables.md").read_text()
    assert "8 runs" in md and "1 earlier run(s) of a config that ran again later were left out" in md
    for table in report.tables:  # published numbers only in their own, labelled tables, after ours
        assert table.published == table.title.startswith("Published (not measured here)")
        if table.published:
            assert md.index(table.title) > md.index("## Published numbers") > md.index(by_task.title)
    assert "\\toprule" in (out / "tables.tex").read_text() and "tab:leviathan_alpha" in (out / "tables.tex").read_text()
    assert_pngs(out, ["leviathan_speedup_vs_k.png", "leviathan_acceptance_by_position.png"])
    manifest = json.loads((out / "runs.json").read_text())
    assert len(manifest["runs"]) == 8 and manifest["superseded"] == [old.id]


EXPERIMENTS = conf.STUDIES_DIR  # the real studies, before a test puts another folder in their place


@pytest.fixture
def studies_dir(tmp_path, monkeypatch):
    """An empty studies folder in place of experiments/ (conf.studies() reads it)."""
    folder = tmp_path / "studies"
    folder.mkdir()
    monkeypatch.setattr(conf, "STUDIES_DIR", folder)
    return folder


def test_published_numbers_may_be_missing(leviathan_store, studies_dir):
    """A study without published.json: the measured tables stand alone."""
    shutil.copytree(EXPERIMENTS / "leviathan", studies_dir / "leviathan",
                    ignore=shutil.ignore_patterns("published.json", "__pycache__"))
    report = builder("leviathan")(load_study("leviathan", uri(leviathan_store), "specresearch"))
    assert [t.name for t in report.tables] == ["leviathan_alpha", "leviathan_k"]


@pytest.mark.parametrize("content, message", [
    ("{not json", "published.json: not valid JSON"),
    ('{"tables": {"alpha": {"rows": [{"alpha": 0.5}]}}}', "published.json: table 'alpha', row 1: every row is an object with its 'source'"),
    ('{"table": {}}', "published.json: unknown key 'table': valid are about, references, tables"),
])
def test_a_broken_published_json_is_an_error_that_names_it(studies_dir, content, message):
    (studies_dir / "leviathan").mkdir()
    (studies_dir / "leviathan" / "preset.yaml").write_text("study: leviathan\n")
    (studies_dir / "leviathan" / "published.json").write_text(content)
    with pytest.raises(AnalysisError, match=message):
        published.load("leviathan")


NEW_STUDY = {  # a whole new study: its folder is all it takes
    "preset.yaml": "# @package _global_\nstudy: tiny_study\ntracker:\n  experiment: tiny\n",
    "README.md": "# tiny_study\n",
    "analysis.py": '''
from specresearch.analysis.format import Col, Table, num, speed, text
from specresearch.analysis.published import load, published_table
from specresearch.analysis.report import Report, caption


def report(study):
    rows = [dict(dataset=r.dataset, speedup=r.speed_record.speedup, tau=r.speed_record.method.tau) for r in study.speed]
    out = Report(study.name, [Table("tiny", "Tiny", caption("Speedups.", study.speed, study),
                                    [Col("dataset", "dataset", text, "l"), Col("speedup", "speedup", speed), Col("τ", "tau", num)], rows)])
    out.tables += [published_table("published_tiny", "Tiny paper", t.rows) for t in load(study.name).values()]
    return out
''',
    "published.json": json.dumps({"tables": {"paper": {"rows": [{"speedup": 2.5, "source": "A paper, Table 1"}]}}}),
}


def test_a_new_study_is_one_folder(studies_dir, tmp_path):
    import mlflow
    from hydra.core.config_store import ConfigStore

    from specresearch.metrics import SpecStats
    from specresearch.records import STUDY_TAG, SpeedRecord, flatten

    (studies_dir / "tiny_study").mkdir()
    for name, content in NEW_STUDY.items():
        (studies_dir / "tiny_study" / name).write_text(content)
    conf.register_studies()  # what importing specresearch.config does with the real folder
    try:
        assert conf.studies() == {"tiny_study": studies_dir / "tiny_study"} and parse(["experiment=tiny_study"])[0] == "tiny_study"
        store = tmp_path / "store"
        target = tracker_target("tiny_study", {"store": str(store)})  # composes experiment=tiny_study, its preset included
        assert target == (uri(store.resolve()), "tiny")
        mlflow.set_tracking_uri(target[0])
        experiment = mlflow.create_experiment("tiny")
        method = SpecStats(steps=10, accepted=15, drafted=20, drafted_at=[10, 10], accepted_at=[8, 7])  # tau 2.5
        record = SpeedRecord(SpecStats(steps=10), method, prompts=3, k=2, speedup=1.75)
        with mlflow.start_run(experiment_id=experiment, tags={STUDY_TAG: "tiny_study"}):  # a synthetic run of the study
            mlflow.log_params({"study": "tiny_study", "dataset.name": "humaneval"})
            mlflow.log_metrics({k: v for k, v in flatten(record).items() if not math.isnan(v)})
        study, report, out = analyse("tiny_study", *target, out=tmp_path / "out", log=False)
        assert report.table("tiny").cells == [["humaneval", "1.75×", "2.50"]]
        assert report.table("published_tiny").published and "not measured here" in (out / "tables.md").read_text()
    finally:
        ConfigStore.instance().repo["experiment"].pop("tiny_study.yaml", None)


def test_cli_prints_writes_and_logs_to_the_sweep_parent(leviathan_store, tmp_path):
    import mlflow

    out = tmp_path / "cli"
    result = subprocess.run([sys.executable, "-m", "specresearch.analysis", "experiment=leviathan", f"tracker.store={leviathan_store}",
                             f"out={out}", "log=true"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "MPLBACKEND": "Agg"})  # from any folder: the studies are in the package
    assert result.returncode == 0, result.stderr[-3000:]
    assert "### Leviathan: acceptance rate, cost and best draft length" in result.stdout
    assert "| task | T | k runs | α (pooled) |" in result.stdout
    client = mlflow.MlflowClient(tracking_uri=uri(leviathan_store))
    exp = client.get_experiment_by_name("specresearch")
    parents = client.search_runs([exp.experiment_id], "tags.`specresearch.sweep` = 'true' and tags.`specresearch.study` = 'leviathan'")
    parent = max(parents, key=lambda r: r.info.start_time)  # the latest sweep's parent (the re-run was no sweep)
    assert f"logged to MLflow run {parent.info.run_id}" in result.stdout
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "analysis")}
    assert {f"analysis/{name}" for name in ("tables.md", "tables.tex", "runs.json", "leviathan_speedup_vs_k.png",
                                            "leviathan_acceptance_by_position.png")} <= logged
    mlflow.set_tracking_uri(uri(leviathan_store))
    text = mlflow.artifacts.load_text(f"runs:/{parent.info.run_id}/analysis/tables.md")
    assert text == (out / "tables.md").read_text()


def test_specbench_table_is_spec_bench_view(specbench_store, tmp_path):
    study, report, out = analyse("specbench", uri(specbench_store), out=tmp_path, log=False)
    table = report.table("specbench")
    assert table.headers == ["method", "HumanEval", "MT-bench writing", "MT-bench coding", "MT-bench (all)", "ShareGPT", "Overall"]
    assert {r["method"] for r in table.records} == {"pld", "self_draft"}  # names from conf/drafter/*.yaml
    overall = [r["overall"] for r in table.records]
    assert overall == sorted(overall, reverse=True)  # Spec-Bench's leaderboard order
    runs = latest(mlflow_jobs(specbench_store, "specbench"), lambda r: (r.data.params["drafter._target_"], r.data.params["dataset.name"]))
    assert len(runs) == 6 and len(study.runs) == 6
    for rec, cells in zip(table.records, table.cells):
        target = next(t for t, _ in runs if t.endswith({"pld": "PromptLookupDrafter", "self_draft": "SelfDraftDrafter"}[rec["method"]]))
        speeds = []
        for header, dataset in (("HumanEval", "humaneval"), ("MT-bench (all)", "mtbench"), ("ShareGPT", "sharegpt")):
            m = runs[(target, dataset)].data.metrics
            assert cells[table.headers.index(header)] == f"{m['speedup']:.2f}× (τ {m['method_tau']:.2f})"
            speeds.append(m["speedup"])
        assert rec["overall"] == pytest.approx(sum(speeds) / 3)
        m = runs[(target, "mtbench")].data.metrics
        assert cells[table.headers.index("MT-bench coding")] == f"{m['group.coding.speedup']:.2f}× (τ {m['group.coding.method_tau']:.2f})"
    assert "HumanEval, MT-bench (all), ShareGPT" in table.caption
    for t in report.tables[1:]:
        assert t.published and "not measured here" in t.title
    assert_pngs(out, ["specbench_acceptance_by_position.png", "specbench_speedup_vs_tau.png"])


def test_lossless_vs_lossy_rows_distortion_and_verdicts(lossless_store, tmp_path):
    study, report, out = analyse("lossless_vs_lossy", uri(lossless_store), out=tmp_path, log=False)
    table = report.table("frontier")
    assert [(r["verifier"], r["setting"], r["T"]) for r in table.records] == [
        ("rejection", DASH, 0.0), ("typical", "ε 0.09, δ 0.3", 0.0), ("rejection", DASH, 1.0), ("typical", "ε 0.09, δ 0.3", 1.0)]
    assert [v.endswith("(lossless)") for v in table.column("verifier")] == [True, False, True, False]
    runs = latest(mlflow_jobs(lossless_store, "lossless_vs_lossy"), lambda r: (r.data.params["verifier._target_"].rsplit(".", 1)[1],
                                                                               float(r.data.params["sampling.temperature"])))
    names = {"rejection": "RejectionVerifier", "typical": "TypicalVerifier"}
    for rec, cells in zip(table.records, table.cells):
        m = runs[(names[rec["verifier"]], rec["T"])].data.metrics
        assert rec["speedup"] == m["speedup"] and rec["tau"] == m["method_tau"]
        if rec["T"] == 0:  # no distortion at T = 0: every rule keeps the argmax path
            assert "dist_tv_mean" not in m and cells[table.headers.index("TV mean [95% CI]")] == DASH
        else:
            assert rec["tv"][0] == m["dist_tv_mean"] and m["dist_positions"] == 4
            assert rec["verifier"] != "rejection" or m["dist_tv_max"] < 1e-9
    battery = report.table("battery")
    assert [(r["verifier"], r["T"]) for r in battery.records] == [("rejection", 1.0), ("typical", 1.0)]
    for rec in battery.records:
        m = runs[(names[rec["verifier"]], 1.0)].data.metrics
        assert rec["verdict"] == ("different" if m["eq_reject"] else "not distinguishable")
    assert any(t.published for t in report.tables)  # the published trade-offs beside
    assert_pngs(out, ["lossless_vs_lossy_frontier.png"])
    from specresearch.analysis import intervals

    for job in mlflow_jobs(lossless_store, "lossless_vs_lossy"):  # each prompt's tokens and seconds, for the intervals
        ((tokens, seconds, *_),) = intervals.per_prompt(job.data.tags).values()
        assert tokens == job.data.metrics["method_new_tokens"] and seconds > 0


def test_the_quality_table_s_intervals():
    """lossless_vs_lossy's Δ pass@1 interval from the discordant counts is the normal interval of the mean of the
    per-problem differences (method − target, each −1, 0 or 1), an interval, not a point, where they disagree;
    each side's is Wilson's."""
    import sys

    from analysis.studies import builder

    builder("lossless_vs_lossy")
    paired_interval = sys.modules["experiments.lossless_vs_lossy.analysis"].paired_interval
    rng = np.random.default_rng(0)
    for n in (20, 164):
        method, target = rng.random(n) < 0.6, rng.random(n) < 0.5
        d = method.astype(float) - target
        low, high = paired_interval(float((d > 0).sum()), float((d < 0).sum()), float(n))
        half = 1.96 * d.std() / np.sqrt(n)
        assert low == pytest.approx(d.mean() - half) and high == pytest.approx(d.mean() + half) and low < d.mean() < high
    assert paired_interval(0.0, 0.0, 164.0) == (0.0, 0.0)  # every problem the same on both sides
    wilson = sys.modules["experiments.lossless_vs_lossy.analysis"].wilson
    from scipy.stats import binomtest

    for k, n in ((73, 164), (0, 164), (20, 20)):  # each side's pass@1 interval: scipy's Wilson interval (z = 1.96 here)
        ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson(k / n, n) == pytest.approx((ci.low, ci.high), abs=1e-4)


def test_a_study_rebuilds_from_its_committed_runs(lossless_store, tmp_path, monkeypatch):
    """save=true commits the runs and tables (a results report that validates); the analysis rebuilds the same
    tables from that file alone: with data=PATH, and where the store holds none of the study's runs."""
    from specresearch.analysis import runs as runs_module

    from specresearch import reports

    monkeypatch.setattr(runs_module, "COMMITTED", tmp_path / "docs" / "results" / "data")
    (tmp_path / "docs" / "results" / "figures").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "data").mkdir()
    _, saved, _ = analyse("lossless_vs_lossy", uri(lossless_store), out=tmp_path / "a", log=False, save=True)
    path = tmp_path / "docs" / "results" / "data" / "study-lossless-vs-lossy.json"
    record = json.loads(path.read_text())
    assert reports.validate(record) == [] and record["topic"] == "studies"
    assert record["rows"] == saved.table("frontier").cells and not reports.machine_paths(path.read_text())
    assert (tmp_path / "docs" / "results" / "figures" / "study-lossless-vs-lossy-lossless_vs_lossy_frontier.png").is_file()
    again = analyse("lossless_vs_lossy", uri(lossless_store), out=tmp_path / "b", log=False, data=path)[1]
    fresh = analyse("lossless_vs_lossy", uri(tmp_path / "no-store"), out=tmp_path / "c", log=False)[1]
    for report in (again, fresh):
        assert [t.cells for t in report.tables] == [t.cells for t in saved.tables]
    assert "the committed runs in study-lossless-vs-lossy.json" in (tmp_path / "c" / "tables.md").read_text()


def test_medusa_typical_joins_speed_and_quality(medusa_store, tmp_path):
    study, report, out = analyse("medusa_typical", uri(medusa_store), out=tmp_path, log=False)
    table = report.table("medusa_typical")
    assert [(r["verifier"], r["epsilon"]) for r in table.records] == [("rejection", None), ("typical", 0.09), ("typical", 0.3)]
    jobs = mlflow_jobs(medusa_store, "medusa_typical")
    quality = [r for r in jobs if "eval.task" in r.data.params]
    speed = {r.data.params.get("verifier.epsilon"): r for r in jobs if "eval.task" not in r.data.params}
    assert len(quality) == 1 and len(speed) == 3
    q = quality[0].data.metrics
    rows = {r["epsilon"]: (r, cells) for r, cells in zip(table.records, table.cells)}
    rec, cells = rows[0.09]
    assert rec["speed_run"] == speed["0.09"].info.run_id and rec["quality_run"] == quality[0].info.run_id
    assert rec["speedup"] == speed["0.09"].data.metrics["speedup"]
    assert rec["method_pass"] == q["method_pass_at_1"] and rec["baseline_pass"] == q["baseline_pass_at_1"]
    assert cells[table.headers.index("Δ pass@1 (McNemar p)")] == f"{q['delta_pass_at_1']:+.3f} (p {q['mcnemar_p']:.2g})"
    m = speed["0.09"].data.metrics
    assert rec["verdict"] == ("different" if m["eq_reject"] else "not distinguishable")
    for eps in (None, 0.3):  # speed only: the quality side shows "–", not an error
        rec, cells = rows[eps]
        assert rec["quality_run"] is None and rec["speed_run"] is not None
        for header in ("method pass@1", "baseline pass@1", "Δ pass@1 (McNemar p)"):
            assert cells[table.headers.index(header)] == DASH
        assert cells[table.headers.index("speedup")] != DASH
    assert table.column("verifier")[0] == "rejection (lossless)" and table.column("ε")[0] == DASH
    assert_pngs(out, ["medusa_typical_speed_quality.png", "medusa_typical_acceptance_by_position.png"])


# --------------------------------------------------------------------------------------------------


# batch size -> speedup of k = 1, 2, 4, 8 and the tree: the best k shrinks as the batch grows (4, 4, 2, 1, 1)
SYNERGY = {1: (1.3, 1.6, 1.8, 1.5, 1.7), 2: (1.25, 1.5, 1.55, 1.2, 1.4), 4: (1.2, 1.35, 1.1, 0.9, 1.0),
           8: (1.1, 1.0, 0.8, 0.6, 0.85), 16: (0.9, 0.7, 0.5, 0.4, 0.6)}


def test_batch_synergy_best_k_and_crossover(tmp_path, new_store):
    """Fake runs of the batch x k grid (and the tree) with known speedups, logged as `python -m
    specresearch experiment=batch_synergy` logs them (params study, batch_size, drafter.*; metric speedup)."""
    import mlflow

    from specresearch.records import HASH_TAG, STUDY_TAG

    store = new_store(tmp_path / "mlruns")
    mlflow.set_tracking_uri(uri(store))
    experiment = mlflow.create_experiment("specresearch")
    arms = [("independent", k) for k in (1, 2, 4, 8)] + [("tree", None)]
    for b, speedups in SYNERGY.items():
        for (drafter, k), s in zip(arms, speedups):
            params = {"study": "batch_synergy", "batch_size": b, "dataset.name": "humaneval", "sampling.temperature": 0.0,
                      "drafter._target_": make_cfg(f"drafter={drafter}").drafter._target_}
            with mlflow.start_run(experiment_id=experiment, tags={STUDY_TAG: "batch_synergy", HASH_TAG: f"{b}-{drafter}-{k}"}):
                mlflow.log_params({**params, **({"drafter.k": k} if k else {})})
                mlflow.log_metrics({"speedup": s})
    study, report, out = analyse("batch_synergy", uri(store), out=tmp_path / "out", log=False)
    grid = report.table("batch_synergy")
    assert grid.headers == ["batch size", "k = 1", "k = 2", "k = 4", "k = 8", "tree", "best k", "its speedup"]
    assert grid.column("batch size") == ["1", "2", "4", "8", "16"]
    assert grid.column("best k") == ["4", "4", "2", "1", "1"]
    assert grid.column("its speedup") == ["1.80×", "1.55×", "1.35×", "1.10×", "0.90×"]
    assert grid.column("tree") == ["1.70×", "1.40×", "1.00×", "0.85×", "0.60×"]
    arms_table = report.table("batch_synergy_crossover")
    assert arms_table.column("arm") == ["k = 1", "k = 2", "k = 4", "k = 8", "tree"]
    assert arms_table.column("crossover batch (< 1×)") == ["16", "16", "8", "4", "8"]  # 1.00× at 4 is no crossover
    assert arms_table.column("best at batch sizes") == ["8, 16", "4", "1, 2", DASH, DASH]
    assert "no arm is faster than plain decoding from batch size 16 on (of those measured)" in report.notes
    published_findings = report.table("published_batch_synergy")
    assert published_findings.published and "arXiv:2310.18813" in " ".join(published_findings.notes)
    assert_pngs(out, ["batch_synergy_speedup_vs_batch.png"])
    assert len(json.loads((out / "runs.json").read_text())["runs"]) == 25


def test_batch_synergy_preset_sweeps_batch_sizes_and_arms():
    """experiment=batch_synergy: HumanEval past the first 4 problems, greedy; each arm a config of the study's own group."""
    cfg = conf.compose(["experiment=batch_synergy"])
    assert (cfg.study, cfg.dataset.name, cfg.dataset.offset, cfg.dataset.num_prompts) == ("batch_synergy", "humaneval", 4, 16)
    assert cfg.sampling.temperature == 0 and cfg.drafter.k == 4  # a single run: the k = 4 arm
    for name, k in [("k1", 1), ("k8", 8)]:
        arm = conf.compose(["experiment=batch_synergy", f"batch_synergy/arm={name}", "batch_size=16"])
        assert arm.drafter._target_.endswith("IndependentDrafter") and arm.drafter.k == k and arm.batch_size == 16
    tree = conf.compose(["experiment=batch_synergy", "batch_synergy/arm=tree"])
    assert tree.drafter._target_.endswith("TreeDrafter") and list(tree.drafter.branching) == [2, 1, 1, 1] and "k" not in tree.drafter
    assert conf.unknown_option(["experiment=batch_synergy", "batch_synergy/arm=k3"]) == \
        "unknown batch_synergy/arm 'k3': valid are k1, k2, k4, k8, tree"  # one line, before Hydra's dozen
    assert conf.unknown_option(["-m", "experiment=batch_synergy", "batch_synergy/arm=k1,tree"]) is None


CROSS = {("humaneval", 0.0): {("cross_vocab", "smollm2-135m", "string"): 1.2, ("cross_vocab", "smollm2-135m", "shared"): 1.05,
                                ("independent", "qwen2.5-coder-0.5b", None): 1.1},
         ("mtbench", 1.0): {("cross_vocab", "gemma-3-270m", "string"): 0.8, ("independent", "qwen2.5-coder-0.5b", None): 0.95}}


def test_cross_vocab_table_in_the_papers_shape(tmp_path, new_store):
    """Fake runs of experiment=cross_vocab (params as the CLI logs them; metrics a SpeedRecord's): one row per
    (dataset, T, drafter), fastest first within a cell and marked; the authors' rows in a published table."""
    import mlflow

    from specresearch.metrics import SpecStats
    from specresearch.records import HASH_TAG, STUDY_TAG, SpeedRecord, flatten

    store = new_store(tmp_path / "mlruns")
    mlflow.set_tracking_uri(uri(store))
    experiment = mlflow.create_experiment("specresearch")
    for (dataset, t), arms in CROSS.items():
        for (drafter, draft, mode), s in arms.items():
            params = {"study": "cross_vocab", "dataset.name": dataset, "sampling.temperature": t, "model.name": "qwen2.5-coder-1.5b",
                      "drafter._target_": make_cfg(f"drafter={drafter}").drafter._target_, "drafter.model.name": draft,
                      **({"drafter.mode": mode} if mode else {})}
            record = SpeedRecord(SpecStats(new_tokens=64, time_total=16.0, steps=64), SpecStats(new_tokens=64, time_total=16.0 / s, steps=32,
                                 drafted=96, accepted=32), speedup=s, draft_cost_ratio_c=0.2)
            with mlflow.start_run(experiment_id=experiment, tags={STUDY_TAG: "cross_vocab", HASH_TAG: f"{dataset}-{t}-{draft}-{mode}"}):
                mlflow.log_params(params)
                mlflow.log_metrics({k: v for k, v in flatten(record).items() if math.isfinite(v)})
    study, report, out = analyse("cross_vocab", uri(store), out=tmp_path / "out", log=False)
    table = report.table("cross_vocab")
    assert table.column("drafter") == ["smollm2-135m, string", "qwen2.5-coder-0.5b", "smollm2-135m, shared",
                                       "qwen2.5-coder-0.5b", "gemma-3-270m, string"]
    assert table.column("vocabulary") == ["another: text re-tokenized (SLEM)", "the target's", "another: shared tokens (TLI)",
                                          "the target's", "another: text re-tokenized (SLEM)"]
    assert table.column("speedup") == ["1.20×", "1.10×", "1.05×", "0.95×", "0.80×"]
    assert table.column("fastest") == ["yes", DASH, DASH, "yes", DASH]
    assert table.column("tokens/s") == ["4.80", "4.40", "4.20", "3.80", "3.20"]  # 64 tokens in 16 s / speedup
    assert table.column("τ") == ["2.00"] * 5
    authors = report.table("published_cross_vocab")
    assert authors.published and "keyboardAnt/hf-bench" in " ".join(authors.notes)
    assert "google/gemma-2-9b-it" in authors.column("target") and "another" in authors.column("vocabulary")
    assert_pngs(out, ["cross_vocab_speedup.png"])


def test_cross_vocab_preset_arms_and_prompts():
    """experiment=cross_vocab: rejection sampling (lossless at both temperatures); each arm (drafter, mode) and each
    prompt set a config of the study's own groups; HumanEval held out from the problems where settings were chosen."""
    cfg = conf.compose(["experiment=cross_vocab"])
    assert (cfg.study, cfg.verifier._target_.rsplit(".", 1)[-1], cfg.drafter.mode, cfg.drafter.model.name) == \
        ("cross_vocab", "RejectionVerifier", "string", "smollm2-135m")
    assert (cfg.dataset.name, cfg.dataset.offset, cfg.dataset.num_prompts) == ("humaneval", 104, 4)
    mt = conf.compose(["experiment=cross_vocab", "cross_vocab/data=mtbench"])
    assert (mt.dataset.name, list(mt.dataset.categories), mt.dataset.per_category) == ("mtbench", ["writing", "roleplay", "reasoning", "math"], 1)
    shared = conf.compose(["experiment=cross_vocab", "cross_vocab/arm=smollm2_shared", "sampling.temperature=1.0"])
    assert (shared.drafter.mode, shared.sampling.temperature) == ("shared", 1.0)
    assert conf.compose(["experiment=cross_vocab", "cross_vocab/arm=gemma_string"]).drafter.model.name == "gemma-3-270m"
    same = conf.compose(["experiment=cross_vocab", "cross_vocab/arm=qwen_05b"])
    assert same.drafter._target_.endswith("IndependentDrafter") and same.drafter.model.name == "qwen2.5-coder-0.5b"
    assert conf.unknown_option(["experiment=cross_vocab", "cross_vocab/arm=llama"]) == \
        "unknown cross_vocab/arm 'llama': valid are gemma_string, qwen_05b, smollm2_shared, smollm2_string"


def test_bad_arguments_are_one_clear_line(tmp_path):
    with pytest.raises(AnalysisError, match="unknown study 'nope': valid are batch_synergy, cross_vocab, leviathan, lossless_vs_lossy, medusa_typical, specbench"):
        parse(["experiment=nope"])
    with pytest.raises(AnalysisError, match="name a study"):
        parse(["out=x"])
    with pytest.raises(AnalysisError, match="unknown argument 'color': valid are experiment=NAME"):
        parse(["experiment=leviathan", "color=red"])
    with pytest.raises(AnalysisError, match="unknown argument 'tracker.colour': valid are tracker.store, tracker.experiment"):
        tracker_target("leviathan", {"colour": "red"})
    assert tracker_target("leviathan", {"store": str(tmp_path / "s")}) == (uri((tmp_path / "s").resolve()), "specresearch")
    assert tracker_target("leviathan", {"uri": "http://127.0.0.1:5000"})[0] == "http://127.0.0.1:5000"


def test_no_runs_is_an_error_that_says_what_to_run(leviathan_store, tmp_path):
    with pytest.raises(AnalysisError, match="no MLflow store at .*python -m specresearch experiment=specbench"):
        load_study("specbench", uri(tmp_path / "empty"), "specresearch")
    assert not (tmp_path / "empty").exists()  # nothing created where the user pointed by mistake
    with pytest.raises(AnalysisError, match="no FINISHED runs of study 'nosuch'.*python -m specresearch experiment=nosuch"):
        load_study("nosuch", uri(leviathan_store), "specresearch")
    with pytest.raises(AnalysisError, match="no MLflow experiment 'other'.*experiments there: .*specresearch"):
        load_study("leviathan", uri(leviathan_store), "other")


@pytest.mark.parametrize("module, args, message", [
    ("specresearch.analysis", ["experiment=nope"], "error: unknown study 'nope': valid are batch_synergy, cross_vocab, leviathan, lossless_vs_lossy, medusa_typical, specbench"),
    ("specresearch.analysis.tables", ["experiment=leviathan", "tracker.store=/nonexistent/store"],
     "error: no MLflow store at /nonexistent/store/mlflow.db"),
])
def test_cli_errors_exit_2_with_one_line(module, args, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", module, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and result.stderr.startswith(message)


def test_formats_escape_latex_and_print_missing_as_dash():
    table = Table("t", "A_b & c", "50% of $x", [Col("name", "name", str, "l"), Col("α", "a", lambda x: DASH if math.isnan(x) else f"{x:.2f}")],
                  [dict(name="x_1", a=math.nan), dict(name="y#", a=0.5)], notes=["[1] a~b"])
    assert table.cells == [["x_1", DASH], ["y#", "0.50"]]
    tex = latex(table)
    assert r"A\_b \& c" in tex and r"50\% of \$x" in tex and r"x\_1 & --" in tex and r"y\# & 0.50" in tex
    assert r"$\alpha$" in tex and r"\textasciitilde{}" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    md = markdown(table)
    assert "| name | α |\n|---|---:|\n| x_1 | – |" in md and "*50% of $x*" in md
    assert latex_escape("1.2× τ ε") == r"1.2$\times$ $\tau$ $\varepsilon$"


@pytest.mark.parametrize("case", ["no MLflow database", "a '?' in the path"])
def test_a_store_mlflow_cannot_read_is_one_line_exit_2(tmp_path, capsys, case):
    """Before MLflow opens it (a DatabaseError traceback; a database written where the path was cut)."""
    from specresearch.analysis.tables import main

    store = tmp_path / ("mlruns" if case == "no MLflow database" else "a#b?c")
    store.mkdir()
    (store / "mlflow.db").write_bytes(b"random bytes, not sqlite" * 40)
    assert main(["experiment=leviathan", f"tracker.store={store}", f"out={tmp_path}/out"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith({
        "no MLflow database": f"error: {store}/mlflow.db is not an MLflow database (sqlite: file is not a database)",
        "a '?' in the path": f"error: tracker.store cannot hold '?' (MLflow's sqlite URI reads them otherwise), got {store}",
    }[case])
    assert (store / "mlflow.db").read_bytes() == b"random bytes, not sqlite" * 40 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["under a file", "in /proc", "a file"])
def test_an_unwritable_out_is_one_line_before_the_runs_are_read(tmp_path, capsys, monkeypatch, where):
    """out=<under a regular file> or out=/proc/x failed after the tables were computed: now refused
    first, in one line, with nothing read from MLflow and nothing written."""
    from specresearch.analysis import tables

    monkeypatch.setattr(tables, "load_study", lambda *a, **k: pytest.fail("the runs were read"))
    (tmp_path / "file").write_text("keep me")
    out = {"under a file": f"{tmp_path}/file/sub", "in /proc": "/proc/specresearch-x", "a file": f"{tmp_path}/file"}[where]
    assert tables.main(["experiment=leviathan", f"tracker.store={tmp_path}/mlruns", f"out={out}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: cannot write the tables to {out} (out=DIR): " + {
        "under a file": f"{tmp_path}/file is not a folder", "in /proc": "cannot create a file in /proc (No such file or directory)",
        "a file": f"{tmp_path}/file is not a folder"}[where]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "keep me"


def test_merge_adds_a_stores_runs_to_the_committed_ones():
    """merge=true: a study resumed on another machine keeps its committed cells; a config run again there replaces
    its committed run (superseded), a new config is added, and the store's parent stands."""
    from dataclasses import replace

    from specresearch.analysis.runs import HASH_TAG, Study, committed, load_committed, merged

    kept = load_committed("lossless_vs_lossy", committed("lossless_vs_lossy"))
    last = max(r.start for r in kept.runs)
    again = replace(kept.runs[0], id="again", start=last + 1)  # the same config, run later
    new = replace(kept.runs[1], id="new", start=last + 2, tags={**kept.runs[1].tags, HASH_TAG: "a-config-not-committed"})
    store = Study("lossless_vs_lossy", "sqlite:///store.db", "specresearch", [again, new], parent=new)
    both = merged(kept, store)
    assert [r.id for r in both.runs] == [r.id for r in kept.runs[1:]] + ["again", "new"]
    assert kept.runs[0] in both.superseded and both.parent is new and both.uri == store.uri
    saved = merged(kept, Study("lossless_vs_lossy", "sqlite:///store.db", "specresearch", [kept.runs[0], again]))
    assert saved.superseded == [kept.runs[0]]  # a run saved from this store and read from it again is not its own rerun
    assert parse(["experiment=lossless_vs_lossy", "merge=true"])[5] is True
    with pytest.raises(AnalysisError, match="merge must be true or false"):
        parse(["experiment=lossless_vs_lossy", "merge=yes"])


@pytest.mark.parametrize("case", ["random bytes", "not JSON", "a JSON list", "runs of another shape"])
def test_a_data_file_that_is_no_committed_runs_is_one_line(tmp_path, capsys, monkeypatch, case):
    """data=<a file of random bytes> ended in a UnicodeDecodeError traceback (not JSON, a JSON list or runs without
    their fields in others): now one line, exit 2, before any table is built or written."""
    from specresearch.analysis import tables

    monkeypatch.setattr(tables, "load_study", lambda *a, **k: pytest.fail("MLflow was read"))
    data = tmp_path / "data.json"
    data.write_bytes({"random bytes": bytes(range(128, 256)) * 4, "not JSON": b"leviathan: 12 runs\n", "a JSON list": b"[1, 2]",
                      "runs of another shape": json.dumps({"data": {"study": "leviathan", "runs": [{"id": "r1"}]}}).encode()}[case])
    assert tables.main(["experiment=leviathan", f"tracker.store={tmp_path}/mlruns", f"data={data}", f"out={tmp_path}/out"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    valid = "valid is a study's committed runs (save=true writes them: docs/results/data/study-leviathan.json)"
    assert line == f"error: {data}" + {
        "random bytes": f" is not JSON (UnicodeDecodeError): {valid}",
        "not JSON": f" is not JSON (JSONDecodeError): {valid}",
        "a JSON list": f" holds no runs of study 'leviathan' (data.study, data.runs): {valid}",
        "runs of another shape": f": data.runs and data.parent must be runs with fields id, status, start, params, metrics, tags: {valid}",
    }[case]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json"]


def _files(folder) -> dict[str, str]:
    """Every file under `folder`: its path there -> the SHA-256 of its bytes."""
    import hashlib

    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_analysis_only_reads_the_store_unless_told_to_log(leviathan_store, tmp_path, monkeypatch, capsys):
    """The analysis logged its tables into the store it reads, unasked: by default the store (its database and
    artifacts) is now left byte for byte as it was; `log=true` logs the folder to the study's sweep parent."""
    from specresearch.analysis.tables import main

    monkeypatch.chdir(tmp_path)
    before = _files(leviathan_store)
    assert main(["experiment=leviathan", f"tracker.store={leviathan_store}", f"out={tmp_path}/out"]) == 0
    assert "the store was only read (log=true logs this folder to the study's latest sweep parent run)" in capsys.readouterr().out
    assert _files(leviathan_store) == before
    assert parse(["experiment=leviathan", "log=true"])[6] is True and parse(["experiment=leviathan"])[6] is False
    with pytest.raises(AnalysisError, match="log must be true or false, got 'yes'"):
        parse(["experiment=leviathan", "log=yes"])
