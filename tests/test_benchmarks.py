"""The speed benchmark keeps working: its --quick mode on tiny fp32 models, end to end; and it refuses
a bad argument or an unusable destination in one line before any model loads."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import mlflow
import pytest

from specresearch import reports
from tests.conftest import ROOT, speed_report
from tests.test_console import not_bars

pytestmark = pytest.mark.e2e  # runs benchmarks/speed.py, flagship.py, headline.py and aa_calibration.py as their users do

SPEED = str(ROOT / "benchmarks" / "speed.py")


def speed_module():
    """benchmarks/speed.py, imported (it is a script, not a module of the package)."""
    spec = importlib.util.spec_from_file_location("speed", SPEED)
    speed = sys.modules["speed"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(speed)
    return speed


def quick(tmp_path, *argv: str) -> tuple[subprocess.CompletedProcess, dict]:
    """speed.py --quick with `argv`, its report in tmp_path/speed.json, nothing tracked: (the process, the report)."""
    out = tmp_path / "speed.json"
    result = subprocess.run([sys.executable, SPEED, "--quick", "--json", str(out), "--tracker", "none", *argv],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, reports.raw(json.loads(out.read_text()))




def test_speed_quick_runs_every_method_and_records_them(tmp_path, new_store):
    out = tmp_path / "speed.json"
    result = subprocess.run(
        [
            sys.executable, SPEED, "--quick", "--profile", "--json", str(out), "--store", str(new_store(tmp_path / "mlruns")), "--methods",
            "generate,generate_torch,generate_compiled,hf_assisted,hf_prompt_lookup,baseline,baseline_compiled,independent,"
            "plain_chain,independent:model.vocab=100:model.vocab_corpus=mtbench:model.quantize=int8,"
            "independent:k=2:model.vocab=100:model.vocab_corpus=mtbench:model.quantize=int8",  # the same options: one int8 copy for both
        ],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}, "HF_HUB_OFFLINE": "1"},  # the warnings a user would see
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # no warning of transformers' (generate plain, compiled, assisted, lookup) or ours; --profile's torch profiler
    # (kineto) logs its start and stop as "USDT:" lines, which are not ours to silence
    # (besides the one line that says what quantize=auto chose, as it should)
    said = [line for line in not_bars(result.stderr) if not line.startswith("USDT:")]
    assert len(said) == 1 and said[0].startswith("drafter.model.quantize=auto: "), result.stderr[-3000:]
    report = reports.raw(json.loads(out.read_text()))
    rows = {r["method"]: r for r in report["rows"]}
    cheap = "independent(k=16) model.vocab=100 model.vocab_corpus=mtbench model.quantize=int8"
    chain = "plain_chain(k=4)"  # Leviathan's chain of 4
    assert list(rows) == ["generate", "generate_torch", "generate_compiled", "hf_assisted", "hf_prompt_lookup", "baseline", "baseline_compiled", "independent(k=16)",
                          chain, cheap, cheap.replace("k=16", "k=2")]
    plain = {name: rows[name]["tokens_per_s"] for name in ("generate", "generate_torch", "generate_compiled", "baseline", "baseline_compiled")}
    fastest = max(plain, key=plain.get)
    assert {r["fastest_plain"] for r in rows.values()} == {fastest} and rows[fastest]["speedup_vs_fastest_plain"] == 1
    assert rows[cheap]["speedup_vs_fastest_plain"] == rows[cheap]["tokens_per_s"] / plain[fastest]
    assert 0 < rows[cheap]["alpha"] < 1
    for row in rows.values():
        assert row["tokens_per_s"] > 0
        assert row["identical_to_reference"] == 2, f"{row['method']}: greedy in fp32 must equal generate's tokens"
    default = rows["independent(k=16)"]  # a tree (siblings) some steps: Leviathan's chain model does not apply
    assert 0 < default["alpha"] < 1 and 1 < default["tau"] <= 17 and math.isnan(default["leviathan"])
    spec = rows[chain]  # Leviathan's chain
    assert 0 < spec["alpha"] < 1 and 1 < spec["tau"] <= 5 and spec["leviathan"] > 0
    assert abs(sum(spec["time_split"].values()) - 1) < 1e-6
    assert chain in result.stdout and "vs_generate" in result.stdout
    assert set(report["profile"]) == set(rows)  # --profile: each method's time by op group, adding up to its wall time
    for name, prof in report["profile"].items():
        assert prof["seconds"] > 0 and prof["matmul"] > 0 and prof["python"] > 0, name
        assert abs(sum(v for k, v in prof.items() if k != "seconds") - 1) < 1e-6
    assert "profile (one prompt)" in result.stdout
    assert len(report["v_curve"]) == 9 and report["v_curve"][0] == 1 and min(report["v_curve"]) > 0  # v(k), k = 0..8
    assert 1 <= spec["leviathan_optimal_k"] <= 8

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["benchmarks"], output_format="list")
    assert run.info.status == "FINISHED"
    assert run.data.metrics["baseline.tokens_per_s"] == rows["baseline"]["tokens_per_s"]
    assert "independent_k_16_.alpha" in run.data.metrics


def test_speed_unknown_method_lists_the_valid_ones(tmp_path):
    result = subprocess.run(
        [sys.executable, SPEED, "--quick", "--tracker", "none", "--methods", "generate,eagle3"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert result.returncode != 0
    assert "unknown method(s) eagle3: valid are generate, generate_torch, generate_compiled, hf_assisted, hf_prompt_lookup, hf_universal, baseline, baseline_compiled, cross_vocab, eagle, independent, lookahead, medusa" in result.stderr


def test_table_without_generate_refers_to_the_first_method():
    speed = speed_module()
    rows = [
        {"method": "baseline", "tokens_per_s": 2.0, "tokens_per_s_std": 0.1, "speedup_vs_baseline": 1.0,
         "speedup_min": 1.0, "speedup_max": 1.0, "identical_to_reference": 2},
        {"method": "independent(k=4)", "tokens_per_s": 3.0, "tokens_per_s_std": 0.1, "speedup_vs_baseline": 1.5,
         "speedup_min": 1.4, "speedup_max": 1.6, "identical_to_reference": 2},
    ]
    text = speed.table(rows, "header")
    assert "vs_baseline" in text and "1.50x" in text


def test_speed_quick_on_mtbench_chat(tmp_path):
    """--dataset mtbench: MT-bench's first turns through the chat template, one per category."""
    _, report = quick(tmp_path, "--dataset", "mtbench", "--prompts", "2", "--methods", "generate,baseline,pld")
    assert "2 MT-bench questions (first turn, chat template)" in report["header"] and report["args"]["dataset"] == "mtbench"
    assert [r["method"] for r in report["rows"]] == ["generate", "baseline", "pld(k=10)"]
    assert all(r["identical_to_reference"] == 2 for r in report["rows"])


def test_speed_quick_samples_at_a_temperature_with_each_methods_verifier(tmp_path):
    """--temperature: every method samples (transformers' too); our drafters verify with rejection sampling
    unless a method names its verifier (lossy typical acceptance here), and nothing is compared token for token."""
    _, report = quick(tmp_path, "--temperature", "0.7", "--methods",
                      "generate,hf_assisted,baseline,independent,independent:verifier=typical:verifier.epsilon=0.3")
    assert report["header"].endswith("sampled at T = 0.7") and report["args"]["temperature"] == 0.7
    rows = {r["method"]: r for r in report["rows"]}
    assert list(rows) == ["generate", "hf_assisted", "baseline", "independent(k=16)",
                          "independent(k=16) verifier=typical verifier.epsilon=0.3"]
    assert all(r["identical_to_reference"] is None and r["tokens_per_s"] > 0 for r in rows.values())
    assert 0 < rows["independent(k=16)"]["alpha"] < 1
    page = _docs_hook().render(_docs_hook().load(tmp_path / "speed.json"), "speed.json")
    assert "sampled at T = 0.7" in page


def test_the_draft_model_loads_only_for_methods_that_draft_with_it():
    """Plain decoding and prompt lookup never call the draft's loader; the independent drafter calls it once."""
    import argparse

    from specresearch.models import load_model

    speed = speed_module()
    target = load_model("tiny", tiny={"vocab_size": 320, "seed": 0})
    calls = []

    def draft():
        calls.append(1)
        return load_model("tiny", tiny={"vocab_size": 320, "seed": 0, "noise": 0.03, "noise_seed": 5})

    for methods, loads in (("generate,baseline,pld", 0), ("baseline,independent,independent:k=2", 1)):
        args = argparse.Namespace(methods=methods, k=3, temperature=0.0, kernels="auto", device="auto", batch=None)
        speed.build_methods(args, target, draft, 64, speed.drafter_configs(args))
        assert len(calls) == loads, methods


def test_drafter_configs_pick_each_methods_verifier():
    """The verifier of each of our methods: greedy at T = 0, rejection sampling at T > 0 (both lossless), or
    the one the method names, with its options; drafter options stay the drafter's."""
    import argparse

    speed = speed_module()
    methods = "pld,medusa:verifier=typical:verifier.epsilon=0.05:shape=null"
    for temperature, plain in ((0.0, "GreedyVerifier"), (0.7, "RejectionVerifier")):
        found = speed.drafter_configs(argparse.Namespace(methods=methods, k=3, temperature=temperature))
        assert found["pld"].verifier._target_.endswith(plain) and found["pld"].drafter.k == 3
        medusa = found["medusa:verifier=typical:verifier.epsilon=0.05:shape=null"]
        assert medusa.verifier._target_.endswith("TypicalVerifier") and medusa.verifier.epsilon == 0.05
        assert medusa.drafter.shape is None and "verifier" not in medusa.drafter


def test_speed_quick_drafts_in_another_vocabulary(tmp_path):
    """cross_vocab drafts with --cross-draft (--quick: a tiny model of bytes and byte pairs) as plain decoding
    decodes; hf_universal needs Hugging Face tokenizers, which the tiny models lack: skipped, saying so."""
    result, report = quick(tmp_path, "--methods", "generate,baseline,hf_universal,cross_vocab,cross_vocab:mode=shared")
    assert "skipped hf_universal: transformers' universal assisted generation needs Hugging Face tokenizers" in result.stdout
    assert "tiny (another tokenizer)" in report["header"] and report["args"]["cross_draft"] == "tiny"
    assert [r["method"] for r in report["rows"]] == ["generate", "baseline", "cross_vocab(k=4)", "cross_vocab(k=4) mode=shared"]
    assert all(r["identical_to_reference"] == 2 for r in report["rows"])
    assert all(r["c"] > 0 for r in report["rows"][2:])  # the draft ran: its cost (over our baseline's step) was measured


def test_speed_quick_batch_mode_has_rows_per_batch_size_and_a_crossover(tmp_path):
    """--batch: per batch size a row per method with tokens/s and the speedup over the fastest plain decoding at
    that size, transformers' assisted generation skipped at B > 1 with its reason, each speculative method's
    crossover, every output still greedy-identical (fp32), and a docs page from the JSON."""
    result, report = quick(tmp_path, "--batch", "2,1", "--methods", "generate,hf_assisted,baseline,pld")
    out = tmp_path / "speed.json"
    assert report["args"]["batch"] == "1,2" and report["args"]["prompts"] == 2  # --quick: the sizes' least common multiple
    assert [e["batch"] for e in report["batches"]] == [1, 2] and "rows" not in report
    one, two = report["batches"]
    assert [r["method"] for r in one["rows"]] == ["generate", "hf_assisted", "baseline", "pld(k=10)"]
    assert [r["method"] for r in two["rows"]] == ["generate", "baseline", "pld(k=10)"]
    assert one["skipped"] == {} and list(two["skipped"]) == ["hf_assisted"] and "batch_size = 1" in two["skipped"]["hf_assisted"]
    for entry in report["batches"]:
        plain = {r["method"]: r["tokens_per_s"] for r in entry["rows"] if r["method"] in ("generate", "baseline")}
        fastest = max(plain, key=plain.get)
        for r in entry["rows"]:
            assert r["batch"] == entry["batch"] and r["tokens_per_s"] > 0 and r["fastest_plain"] == fastest
            assert r["speedup_vs_fastest_plain"] == r["tokens_per_s"] / plain[fastest]
            assert r["identical_to_reference"] == 2, f"B={entry['batch']} {r['method']}: greedy fp32 must equal generate's tokens"
        assert entry["prompts"] == 2 and entry["reference"] == "generate"
    assert set(report["crossover"]) == {"hf_assisted", "pld(k=10)"}  # plain decoding has none
    for method, b in report["crossover"].items():
        below = [e["batch"] for e in report["batches"] for r in e["rows"] if r["method"] == method and r["speedup_vs_fastest_plain"] < 1]
        assert b == (below[0] if below else None)
    assert "B=1" in result.stdout and "B=2" in result.stdout and "crossover" in result.stdout
    assert "skipped hf_assisted at B=2: transformers' assisted generation takes one sequence" in result.stdout

    hook = _docs_hook()
    assert speed_report().is_batch_report(report) and not speed_report().is_speed_report(report)
    out.rename(tmp_path / "speed-20261127-120000.json")
    data = hook.load(tmp_path / "speed-20261127-120000.json")
    assert data["topic"] == "batches" and data["date"] == report["date"]  # the report's own date, when it was written
    assert data["columns"] == ["method", "B=1 tok/s", "B=1 vs fastest plain", "B=2 tok/s", "B=2 vs fastest plain", "crossover"]
    assert [row[0] for row in data["rows"]] == ["generate", "hf_assisted", "baseline", "pld(k=10)"]
    assert data["rows"][1][3] == "skipped" and data["rows"][0][-1] == ""
    assert "--batch 1,2" in data["command"][0] and data["machine"] == report["header"]
    page = hook.render(data, "speed-20261127-120000.json")
    assert "| method | B=1 tok/s |" in page and "hf_assisted skipped at B=2" in page


def test_batch_sizes_must_divide_the_prompts():
    speed = speed_module()
    speed.check_batches(16, [1, 2, 4, 8, 16])
    with pytest.raises(speed.SpecResearchError, match=r"--prompts 12 is not a multiple of every --batch size \(1, 8\): give a multiple of 8"):
        speed.check_batches(12, [1, 8])


def _docs_hook():
    spec = importlib.util.spec_from_file_location("docs_results_hook", ROOT / "docs" / "hooks" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFUSED = {  # arguments -> the start of the one error line
    "--prompts 0": "error: argument --prompts: must be an integer >= 1, got 0",
    "--tokens 0": "error: argument --tokens: must be an integer >= 1, got 0",
    "--repeats 0": "error: argument --repeats: must be an integer >= 1, got 0",
    "--k 0": "error: argument --k: must be an integer >= 1, got 0",
    "--batch 1,0": "error: argument --batch: must be comma-separated integers >= 1 (1,2,4,8,16), got 1,0",
    "--batch x": "error: argument --batch: must be comma-separated integers >= 1 (1,2,4,8,16), got x",
    "--offset -1": "error: argument --offset: must be an integer >= 0, got -1",
    "--offset 1000": "error: --offset 1000 is past the prompts: there are 164 humaneval prompts (--offset 0 to 163)",
    "--offset 10 --dataset mtbench": "error: --offset 10 is past the prompts: there are at most 10 questions in an MT-bench category",
    "--batch 7,11,13": "error: --prompts 1001 (--quick with --batch 7,11,13: their least common multiple) with --offset 0 asks for more "
                       "prompts than humaneval has: 164 from --offset 0 (164 humaneval prompts); valid are batch sizes whose least common "
                       "multiple is <= 164",
    "--offset 162 --batch 4": "error: --prompts 4 (--quick with --batch 4: their least common multiple) with --offset 162 asks for more "
                              "prompts than humaneval has: 2 from --offset 162",
    "--store /proc/x": "error: cannot write the MLflow store /proc/x",
    "--store FILE/mlruns": "error: cannot write the MLflow store FILE/mlruns",
    "--json /proc/x/speed.json": "error: cannot write the report /proc/x/speed.json (--json): cannot create a file in /proc",
    "--json FILE/speed.json": "error: cannot write the report FILE/speed.json (--json): FILE is not a folder",
    "--methods baseline,eagle3": "error: unknown method(s) eagle3: valid are generate, ",
    "--methods independent:model.vocab=x": "error: drafter.model.vocab must be an integer or null, got 'x'",
    "--temperature -1": "error: argument --temperature: must be a number >= 0 (0 = greedy), got -1",
    "--methods medusa:verifier=nope": "error: unknown verifier 'nope': valid are greedy, margin, rejection, topk, typical",
    "--methods medusa:verifier=typical:verifier.eps=1": "error: verifier=typical has no setting 'verifier.eps': valid are verifier.delta, ",
    "--temperature 0.7 --methods pld:verifier=greedy": "error: pld:verifier=greedy at --temperature 0.7: verifier=greedy decodes the target's argmax",
}


@pytest.mark.parametrize("args", REFUSED)
def test_a_bad_argument_or_destination_is_refused_in_one_line_before_a_model_loads(tmp_path, monkeypatch, capsys, args):
    """Ranges at argument parsing; the dataset's size, the drafters' settings (config.compose, the
    settings schema) and every destination (the report's folder, the MLflow store) before any model
    loads: one `error:` line, exit 2, nothing written."""
    speed = speed_module()
    loaded = []
    monkeypatch.setattr(speed, "load_model", lambda *a, **k: loaded.append(a) or pytest.fail("a model loaded"))
    (tmp_path / "file").write_text("keep me")
    argv = args.replace("FILE", str(tmp_path / "file")).split()
    methods = [] if "--methods" in argv else ["--methods", "generate,baseline"]
    if "--store" not in argv:
        argv += ["--store", str(tmp_path / "mlruns")]
    if "--json" not in argv:
        argv += ["--json", str(tmp_path / "speed.json")]
    monkeypatch.setattr(sys, "argv", [SPEED, "--quick", *methods, *argv])
    with pytest.raises(SystemExit) as stop:
        speed.main()
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(REFUSED[args].replace("FILE", str(tmp_path / "file")))
    assert loaded == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "keep me"


@pytest.mark.parametrize("args, line", [
    ("--prompts 200", "error: --prompts 200 with --offset 0 asks for more prompts than humaneval has: 164 from --offset 0 "
                      "(164 humaneval prompts); valid are --prompts <= 164"),
    ("--offset 160 --prompts 8", "error: --prompts 8 with --offset 160 asks for more prompts than humaneval has: 4 from --offset 160 "
                                 "(164 humaneval prompts); valid are --prompts <= 4"),
    ("--dataset mtbench --prompts 81", "error: --prompts 81 with --offset 0 asks for more prompts than mtbench has: 80 from --offset 0"),
])
def test_more_prompts_than_the_dataset_has_are_refused_not_cut_short(tmp_path, monkeypatch, capsys, args, line):
    """--prompts 200 decoded HumanEval's 164 while the report said 200: now one line, before a model
    loads, naming how many there are; nothing written."""
    speed = speed_module()
    monkeypatch.setattr(speed, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    monkeypatch.setattr(sys, "argv", [SPEED, "--methods", "generate,baseline", "--json", str(tmp_path / "speed.json"),
                                      "--store", str(tmp_path / "mlruns"), *args.split()])
    with pytest.raises(SystemExit) as stop:
        speed.main()
    assert stop.value.code == 2
    (got,) = capsys.readouterr().err.strip().splitlines()
    assert got.startswith(line), got
    assert list(tmp_path.iterdir()) == []


def test_the_script_refuses_an_unwritable_report_folder_in_one_line(tmp_path):
    """The script itself (not only main()): exit 2, one `error:` line, no traceback, nothing measured."""
    (tmp_path / "file").write_text("")
    result = subprocess.run([sys.executable, SPEED, "--quick", "--tracker", "none", "--json", str(tmp_path / "file" / "speed.json")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [f"error: cannot write the report {tmp_path}/file/speed.json (--json): {tmp_path}/file is not a folder"]
    assert "repeat 1/" not in result.stdout


def test_flagship_table_puts_quality_and_the_battery_beside_the_speed_rows(tmp_path):
    """benchmarks/flagship.py: each speed report's reference, assisted and speculative rows (other plain decodings
    left on the run's own page), and beside the row of the same text, temperature, drafter and verifier the pass@1
    of an eval run and the battery's verdict of a stats run; a run that matches no row is said so; the docs render it."""
    report = {
        "header": "qwen <- qwen (bf16, cpu): 3 HumanEval prompts x 96 tokens x 1 repeats, sampled at T = 0.7",
        "args": {"dataset": "humaneval", "offset": 150, "prompts": 3, "tokens": 96, "repeats": 1, "temperature": 0.7,
                 "methods": "generate,baseline,medusa:verifier=typical", "json": "x.json"},
        "rows": [{"method": "generate", "speedup_vs_generate": 1.0, "identical_to_reference": None},
                 {"method": "baseline", "speedup_vs_generate": 0.98, "identical_to_reference": None},
                 {"method": "medusa(depth=1) verifier=typical", "speedup_vs_generate": 1.25, "alpha": 0.4, "tau": 1.4,
                  "identical_to_reference": None},
                 {"method": "pld(k=4)", "speedup_vs_generate": 1.1, "alpha": 0.3, "tau": 1.2, "identical_to_reference": None}],
    }
    speed_json = tmp_path / "2026-11-28-flagship-humaneval-t07.json"
    speed_json.write_text(json.dumps(report))

    def run(name, dataset, drafter, summary):
        folder = tmp_path / name
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "hydra.yaml").write_text(
            f"hydra:\n  runtime:\n    choices:\n      drafter: {drafter}\n      verifier: typical\n")
        (folder / ".hydra" / "config.yaml").write_text(f"dataset:\n  name: {dataset}\nsampling:\n  temperature: 0.7\n")
        (folder / ".hydra" / "overrides.yaml").write_text(f"- drafter={drafter}\n- verifier=typical\n- sampling.temperature=0.7\n")
        (folder / "summary.json").write_text(json.dumps({"status": "FINISHED", **summary}))
        return str(folder)

    quality = run("02-00-00", "humaneval", "medusa", {"method_pass@1": 0.4, "baseline_pass@1": 0.45, "problems": 20,
                                                       "mcnemar_p": 0.62})
    stats = run("02-30-00", "humaneval", "medusa", {"eq_reject": 1.0, "eq_alpha": 0.01, "eq_samples_method": 600, "eq_length": 8,
                                                     "eq_samples_baseline": 600, "eq_power_min_tv_position": 0.12, "eq_tv_position": 0.3,
                                                     "eq_tv_position_null": 0.05, "eq_top1_share_method": 0.92,
                                                     "eq_top1_share_baseline": 0.84})
    stray = run("03-00-00", "mtbench", "eagle", {"eq_reject": 0.0, "eq_alpha": 0.01, "eq_samples_method": 10,
                                                  "eq_samples_baseline": 10})
    out = tmp_path / "flagship.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(speed_json),
                             "--run", quality, stats, stray, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    rows = {row[3]: row for row in data["rows"]}
    assert list(rows) == ["generate", "medusa(depth=1) verifier=typical", "pld(k=4)", "eagle verifier=typical"]  # our baseline: on its page
    assert rows["pld(k=4)"][7].startswith("lossless: rejection sampling")  # speed.py's default verifier at T > 0, no battery run
    medusa = rows["medusa(depth=1) verifier=typical"]
    assert medusa[:2] == ["code (HumanEval)", "0.7"] and medusa[4] == "1.25x" and medusa[5] == "1.40"
    assert medusa[6] == "pass@1 0.40 vs target 0.45 (the first 20 problems, one sample each; McNemar p 0.62)"
    assert medusa[7] == ("**different** from the target (Holm at 0.01; 600 vs 600 sequences of 8 tokens, detects a position TV of 0.12; "
                         "position TV 0.30 (noise floor 0.05), top-1 share 0.92 vs 0.84)")
    assert rows["generate"][6] == rows["generate"][7] == ""
    stray_row = rows["eagle verifier=typical"]  # no speed row of its key: a row of its own, its speed left to its page
    assert stray_row[:2] == ["chat (MT-bench)", "0.7"] and stray_row[4] == "" and stray_row[-1] == "run 03-00-00"
    assert stray_row[7].startswith("not distinguishable from the target (Holm at 0.01; 10 vs 10 sequences")
    assert "specresearch drafter=medusa verifier=typical sampling.temperature=0.7   # 02-00-00" in data["command"]
    assert data["command"][0].startswith("python benchmarks/speed.py --dataset humaneval --offset 150")
    assert data["machine"] == "qwen <- qwen (bf16, cpu)" and data["date"] == "2026-11-28"  # the date: the report file's name
    hook = _docs_hook()
    target = tmp_path / "data.json"
    target.write_text(out.read_text())
    assert "| code (HumanEval) | 0.7 |" in hook.render(hook.load(target), "data.json")


def test_aa_calibration_repeats_both_comparisons_and_writes_a_results_page(tmp_path):
    """benchmarks/aa_calibration.py: its core (`calibrate`) on 3 repeats of 30 samples a side, then its
    page: the verdict's and every test's rates with Clopper-Pearson intervals, KS p-values, a command
    without machine paths, and a page the docs hook renders."""
    import torch

    spec = importlib.util.spec_from_file_location("aa_calibration", ROOT / "benchmarks" / "aa_calibration.py")
    aa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa)
    seen = []
    threads = torch.get_num_threads()
    try:  # one thread, as the script runs (two on a busy 2-core machine made its small calls 40-90x slower)
        torch.set_num_threads(1)
        result = aa.calibrate(3, 30, progress=lambda kind, r: seen.append((kind, r)))
        assert aa.main(["--repeats", "3", "--samples", "20", "--out", str(tmp_path / "aa.json")]) == 0  # as a user runs it
    finally:
        torch.set_num_threads(threads)
    assert seen == [("aa", 0), ("method", 0), ("aa", 1), ("method", 1), ("aa", 2), ("method", 2)]
    assert result["config"]["method"] == "pld(k=10) x rejection" and result["config"]["prompt_tokens"] > 100
    for side in ("aa", "method"):
        cal, tests = result[side]["calibration"], result[side]["tests"]
        assert cal["repeats"] == 3 and 0 <= cal["rate_ci_low"] <= cal["rate"] <= cal["rate_ci_high"] <= 1
        assert "surprisal_z" in tests and "position_8" in tests and all(0 <= t["p_uniform"] <= 1 for t in tests.values())
        assert all(len(ps) == 3 for ps in result[side]["pvalues"].values())
    assert result["aa"]["pvalues"]["surprisal_z"] != result["method"]["pvalues"]["surprisal_z"]
    data = json.loads((tmp_path / "aa.json").read_text())
    assert data["command"] == ["python benchmarks/aa_calibration.py --repeats 3 --samples 20 --out aa.json"]
    assert data["data"]["result"]["config"]["samples"] == 20 and "cores" in data["machine"] and str(tmp_path) not in json.dumps(data)
    page = _docs_hook().render(_docs_hook().load(tmp_path / "aa.json"), "aa.json")
    assert "| A/A (target vs target) | **Holm verdict** | " in page and "KS uniformity p" in page


def test_aa_calibration_sizes_auto_n_runs_aa_alone_and_measures_a_lossy_control(tmp_path, capsys):
    """benchmarks/aa_calibration.py's options: --samples auto sizes N once as stats.samples=auto would (for a
    position TV of 0.3 here, so N stays small) and --aa-only runs the A/A comparison alone; every test has its
    far-tail rate (raw p below alpha / m); --lossy runs margin 0.01 over a plain chain in the method's place,
    its exact first-position TV beside the power the battery states; bad values are refused naming the
    valid ones."""
    import torch

    from specresearch.stats import samples_for_tv

    spec = importlib.util.spec_from_file_location("aa_calibration", ROOT / "benchmarks" / "aa_calibration.py")
    aa = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(aa)
    seen = []
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        result = aa.calibrate(2, "auto", progress=lambda kind, r: seen.append((kind, r)), comparisons=["aa"], tv=0.3)
        out = tmp_path / "power.json"
        assert aa.main(["--repeats", "2", "--samples", "40", "--lossy", "verifier=margin verifier.margin=0.01", "--tv", "exact",
                        "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    sizing, n = result["auto"], result["config"]["samples"]
    assert seen == [("auto", n), ("aa", 0), ("aa", 1)] and "method" not in result and result["config"]["method"] is None
    assert sizing["n"] == n >= samples_for_tv(0.3, sizing["position_df"], 8) > 0 and result["config"]["samples_asked"] == "auto"
    s = result["aa"]
    assert s["family_size"] == 14 and s["tail_level"] == pytest.approx(0.01 / 14)
    assert all(t["tail_rejections"] <= t["rejections"] and t["tail_ci_low"] <= t["tail_rate"] <= t["tail_ci_high"] for t in s["tests"].values())
    assert s["calibration"]["versus_alpha"] == "contains alpha"  # 0 or 1 of 2: an interval that wide holds 0.01
    assert aa.versus_alpha(0.001, 0.009, 0.01) == "below alpha" and aa.versus_alpha(0.02, 0.05, 0.01) == "above alpha"

    data = json.loads(out.read_text())
    lossy = data["data"]["result"]
    assert data["command"] == ["python benchmarks/aa_calibration.py --repeats 2 --samples 40 --lossy 'verifier=margin verifier.margin=0.01' "
                               "--tv exact --out power.json"]
    assert lossy["config"]["comparisons"] == ["lossy"] and lossy["config"]["method"] == "independent(k=4) x margin"
    assert "drafter=plain_chain" in lossy["config"]["overrides"] and "aa" not in lossy
    tv1 = lossy["exact"]["tv"][0]
    assert tv1 > 0.1 and lossy["config"]["tv"] == pytest.approx(int(tv1 * 1000) / 1000)  # floored to 3 decimals
    stated = lossy["lossy"]["stated_power"]
    assert stated["exact_tv_position_1"] == tv1 and 0 < stated["position_1_power_min"] <= stated["position_1_power"] < 1
    page = _docs_hook().render(_docs_hook().load(out), "power.json")
    assert "| **Holm verdict** |" in page and "stated power at this N" in page and "far tail: raw p < alpha / 14" in page

    for argv, says in ((["--samples", "many"], "valid are an integer >= 10 (sequences per side) or auto"),
                       (["--tv", "2"], "valid are a number in (0, 1) or exact"),
                       (["--tv", "exact"], "valid only with --lossy"),
                       (["--aa-only", "--lossy", "verifier=margin"], "not allowed with argument")):
        with pytest.raises(SystemExit):
            aa.main([*argv, "--out", str(tmp_path / "x.json")])
        assert says in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("content, says", [
    (b"\x89\xff\x00random", "not a benchmarks/speed.py report"),
    (b"{}", "not a benchmarks/speed.py report"),
    (b"[1, 2]", "not a benchmarks/speed.py report"),
    (b'{"header": "x", "args": {"dataset": "humaneval"', "not a benchmarks/speed.py report"),
    (json.dumps({"header": "x", "args": {"dataset": "humaneval", "prompts": 2, "offset": 0, "tokens": 8},
                 "rows": [{"method": "baseline", "speedup_vs_baseline": 1.0}]}).encode(), "rows without a speedup over transformers' generate"),
    (json.dumps({"header": "x", "args": {"dataset": "humaneval", "prompts": 2, "offset": 0, "tokens": 8},
                 "rows": [{"method": "pld k=4", "speedup_vs_generate": "fast", "alpha": 0.5}]}).encode(), "a benchmarks/speed.py report with a value of the wrong kind: ValueError"),
    (json.dumps({"header": "x", "args": {"dataset": "mtbench", "prompts": 2, "offset": "a", "tokens": 8},
                 "rows": [{"method": "generate", "speedup_vs_generate": 1.0}]}).encode(), "a benchmarks/speed.py report with a value of the wrong kind: TypeError"),
])
def test_flagship_refuses_a_malformed_report_in_one_line(tmp_path, content, says):
    """Random bytes, {}, a list, cut JSON, a report without transformers' rows: one `error:` line, exit 2, nothing written."""
    report = tmp_path / "report.json"
    report.write_bytes(content)
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(report), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {report}: {says}"), result.stderr
    assert not out.exists()


def test_flagship_refuses_a_run_folder_without_its_hydra_files(tmp_path):
    good = tmp_path / "speed.json"
    good.write_text(json.dumps({"header": "x (y): z", "args": {"dataset": "humaneval", "prompts": 1, "offset": 0, "tokens": 8},
                                "rows": [{"method": "generate", "speedup_vs_generate": 1.0}]}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(good), "--run", str(run),
                             "--out", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        result.stderr.strip().splitlines()[0]] and "not the output folder of a specresearch run" in result.stderr
    assert "Traceback" not in result.stderr


def _flagship_run(folder, summary):
    """A specresearch run folder as flagship.py reads it: .hydra/'s three files and summary.json."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices: {drafter: medusa, verifier: typical}\n")
    (folder / ".hydra" / "config.yaml").write_text("dataset: {name: humaneval}\nsampling: {temperature: 0.7}\n")
    (folder / ".hydra" / "overrides.yaml").write_text("- drafter=medusa\n")
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.mark.parametrize("summary", [{"method_pass@1": "high", "baseline_pass@1": 0.5, "problems": 4, "mcnemar_p": 1.0},
                                     {"eq_reject": True}, [1, 2]])
def test_flagship_names_the_run_whose_summary_it_cannot_read(tmp_path, summary):
    """A summary.json with a value of the wrong kind, a battery's verdict without its numbers, or not a mapping: one line
    naming the run's folder (not the speed report), exit 2, nothing written."""
    good = tmp_path / "speed.json"
    good.write_text(json.dumps({"header": "x (y): z", "args": {"dataset": "humaneval", "prompts": 1, "offset": 0, "tokens": 8},
                                "rows": [{"method": "generate", "speedup_vs_generate": 1.0}]}))
    run = _flagship_run(tmp_path / "run", summary)
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(good), "--run", str(run),
                             "--out", str(out)], capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {run}: not the output folder"), result.stderr
    assert not out.exists()


@pytest.mark.parametrize("out", ["/proc/x", "{tmp}", "{tmp}/speed.json/x", "{tmp}/missing/out.json"])
def test_flagship_refuses_an_out_it_cannot_write_before_reading_anything(tmp_path, out):
    """--out in /proc (which os.access calls writable), a folder, under a file, in a missing folder: argparse's one line,
    exit 2, before the reports are read (the report here is not even JSON)."""
    bad = tmp_path / "speed.json"
    bad.write_text("not json")
    out = out.format(tmp=tmp_path)
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(bad), "--out", out],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"flagship.py: error: --out {out}: cannot write the results file there (a file in a writable folder); checked before any work")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["speed.json"]  # no probe left behind


def engine_laws_module():
    spec = importlib.util.spec_from_file_location("engine_laws", ROOT / "benchmarks" / "engine_laws.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("drafter", ["independent", "tree", "pld", "lookahead", "self_draft"])
def test_the_p_the_verifier_reads_is_the_targets_own_law_at_every_node(drafter):
    """benchmarks/engine_laws.py's audit on tiny fp32 models: 8 rows x 8 tokens decoded as the battery's
    method side does (ragged drafts, rows leaving as they finish), every law the verifier read against
    a plain one-row forward of that node's context: equal to float precision at every node."""
    from specresearch import build_engine, compose

    laws = engine_laws_module()
    engine = build_engine(compose(["model=tiny", f"drafter={drafter}", "verifier=rejection", "sampling=random",
                                   "sampling.temperature=0.7"]))
    found = laws.audit(engine, list(range(3, 40)), rows=8, tokens=8, seed=0)
    assert {r["at"] for r in found} >= set(range(8))  # every position of the continuation had its law read
    assert len(found) >= 8 * 8 and max(r["tv"] for r in found) < 1e-4, max(r["tv"] for r in found)
    assert found[0]["rows"] == 8
    if drafter in ("tree", "self_draft"):  # their rows finish at different steps: later steps verify fewer of them
        assert min(r["rows"] for r in found) < 8


def test_engine_laws_writes_a_results_report(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_laws.py"), "--model", "tiny", "--rows", "4",
                             "--tokens", "6", "--drafter", "tree", "--json", str(tmp_path / "laws.json")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all steps" in result.stdout
    data = json.loads((tmp_path / "laws.json").read_text())
    assert reports.validate(data) == []
    assert data["rows"][0][0] == "all steps" and float(data["rows"][0][-1]) < 1e-4 and str(tmp_path) not in json.dumps(data)


def test_kernel_costs_times_each_kernels_choice_per_shape_and_writes_a_page(tmp_path):
    """benchmarks/kernel_costs.py on the tiny model: every kernels choice at every shape (rows x tokens and ragged
    rows), v against each choice's own one token, a valid results page the docs hook renders; an unknown choice
    refused naming the valid ones."""
    script = str(ROOT / "benchmarks" / "kernel_costs.py")
    out = tmp_path / "costs.json"
    result = subprocess.run([sys.executable, script, "--model", "tiny", "--repeats", "1", "--kernels", "torch,packed,invariant",
                             "--shapes", "1x1,1x3,2+1", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert reports.validate(data) == []
    assert [row[0] for row in data["rows"]] == ["1x1", "1x3", "2+1"]
    assert data["columns"][1:4] == ["torch (ms)", "packed (ms)", "invariant (ms)"] and data["columns"][-1] == "invariant / torch"
    assert [row[4:7] for row in data["rows"]][0] == ["1.00", "1.00", "1.00"]  # v: each choice's one token over itself
    assert "| 2+1 |" in _docs_hook().render(_docs_hook().load(out), "costs.json")
    bad = subprocess.run([sys.executable, script, "--model", "tiny", "--kernels", "mkl"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "unknown --kernels mkl: valid are auto, packed, skinny, torch, invariant" in bad.stderr
