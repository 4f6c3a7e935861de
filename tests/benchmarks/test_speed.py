"""The speed benchmark keeps working: its --quick mode on tiny fp32 models, end to end; and it refuses
a bad argument or an unusable destination in one line before any model loads."""

import json
import math
import os
import re
import subprocess
import sys
import warnings

import mlflow
import numpy as np
import pytest

from specresearch import reports
from tests.helpers import ROOT, not_bars, results_hook, script, speed_report
from tests.tiny import tiny_model

pytestmark = pytest.mark.e2e  # runs benchmarks/speed.py as its users do

SPEED = str(ROOT / "benchmarks" / "speed.py")


def speed_module():
    """benchmarks/speed.py, imported (it is a script, not a module of the package)."""
    return script("benchmarks/speed.py")


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
    for row in (spec, default):  # the tokens fed to verification a step: at least the accepted ones, at most a chain of 4 for the chain
        assert row["tau"] - 1 <= row["nodes_per_step"] <= (4 if row is spec else 17 * 3), row
        assert f"{row['method']}: time split" in result.stdout and f"; {row['nodes_per_step']:.1f} draft tokens verified a step" in result.stdout
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


def test_speed_quick_without_a_transformers_row_refers_to_the_baseline(tmp_path):
    """--methods baseline,pld measured, then lost the whole measurement to a TypeError in the results table (its
    reference column fell on speedup_vs_baseline_interval, a list): now the baseline is the reference, once."""
    result, report = quick(tmp_path, "--methods", "baseline,pld", "--prompts", "2")
    assert [r["method"] for r in report["rows"]] == ["baseline", "pld(k=10)"] and all(r["tokens_per_s"] > 0 for r in report["rows"])
    data = json.loads((tmp_path / "speed.json").read_text())
    # --quick decodes 2 prompts: no BCa interval over them (it needs 3), the repeats' min-max instead, and a note says so
    assert data["columns"][:5] == ["method", "tok/s", "±", "vs baseline", "min-max"] and data["columns"].count("vs baseline") == 1
    assert data["rows"][0][3] == "1.00x" and any(n.startswith("No transformers generate row: the reference is baseline") for n in data["notes"])
    assert "speedup intervals not computed: 2 prompt(s), a 95% BCa interval over prompts needs >= 3" in data["notes"]
    assert "| pld(k=10) |" in results_hook().render(results_hook().load(tmp_path / "speed.json"), "speed.json")
    assert "vs_baseline" in result.stdout and "pld(k=10)" in result.stdout  # the terminal's table too


def test_a_results_table_without_a_reference_row_names_its_reference_or_has_none():
    """speed_to_table on rows of every kind speed.py writes without transformers' generate: the baseline as the reference
    (its interval key beside it), the run's first method as the reference, and rows with no speedup at all."""
    row = {"method": "baseline", "tokens_per_s": 2.0, "tokens_per_s_std": 0.1, "speedup_vs_baseline": 1.0,
           "speedup_interval": [1.0, 1.0], "speedup_min": 1.0, "speedup_max": 1.0, "identical_to_reference": 2,
           "speedup_vs_baseline_interval": [1.0, 1.0], "fastest_plain": "baseline", "speedup_vs_fastest_plain": 1.0}
    pld = {**row, "method": "pld(k=10)", "tokens_per_s": 3.0, "speedup_vs_baseline": 1.5, "speedup_interval": [1.4, 1.6],
           "speedup_vs_baseline_interval": [1.4, 1.6], "speedup_vs_fastest_plain": 1.5}
    record = {"header": "tiny <- tiny", "args": {"prompts": 2, "tokens": 16, "methods": "baseline,pld"}, "rows": [row, pld]}
    data = speed_report().speed_to_table(record, "speed-20261127-120000")
    assert data["columns"] == ["method", "tok/s", "±", "vs baseline", "95% interval", "vs fastest plain", "α", "τ", "c", "v", "Leviathan", "identical"]
    assert data["rows"][1][:6] == ["pld(k=10)", "3.00", "0.10", "1.50x", "1.40-1.60", "1.50x"]
    assert "the reference is baseline" in " ".join(data["notes"])

    first = [{k.replace("speedup_vs_baseline", "speedup_vs_pld(k=10)"): v for k, v in r.items()} for r in (pld, row)]  # pld,baseline
    data = speed_report().speed_to_table({**record, "rows": first}, "speed-20261127-120000")
    assert data["columns"][3:6] == ["vs pld(k=10)", "95% interval", "vs baseline"] and "the reference is pld(k=10)" in " ".join(data["notes"])

    bare = [{k: v for k, v in r.items() if not k.startswith("speedup")} for r in (row, pld)]
    data = speed_report().speed_to_table({**record, "rows": bare}, "speed-20261127-120000")
    assert data["columns"][:4] == ["method", "tok/s", "±", "vs baseline"] and all(len(r) == len(data["columns"]) for r in data["rows"])
    assert "no reference column" in " ".join(data["notes"])
    text = speed_module().table(bare, "header")  # the terminal's table: the reference's column empty
    assert "pld(k=10)" in text and "vs_reference" in text


def test_a_fault_in_the_results_table_keeps_the_measurement(tmp_path, monkeypatch, capsys):
    """speed.py writes its record before it makes the table of it: a fault there is raised, and the record is kept."""
    speed = speed_module()
    out = tmp_path / "speed.json"

    def broken(record, name):
        raise RuntimeError("a fault in the table")

    monkeypatch.setattr(speed.speed_report, "report", broken)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [SPEED, "--quick", "--methods", "baseline,pld", "--tracker", "none", "--json", str(out)])
    with pytest.raises(RuntimeError, match="a fault in the table"):
        speed.main()
    record = json.loads(out.read_text())
    assert [r["method"] for r in record["rows"]] == ["baseline", "pld(k=10)"] and all(r["tokens_per_s"] > 0 for r in record["rows"])
    assert speed_report().is_speed_report(record)  # the record speed_report.report (and the docs) read
    assert f"the measurement is kept in {out}" in capsys.readouterr().err


# speed.py's bar on stderr: "decoding:  50%|█████     | 4/8 [00:01<00:01, 2.0decode/s, method=pld(k=10)]"
DECODING_BAR = re.compile(r"decoding: +\d+%\|[^|]*\| *(?P<n>\d+)/(?P<total>\d+) \[[^\]]*, method=(?P<method>[^\]]*)\]")


def test_speed_shows_one_progress_bar_over_its_decodes_closed_before_the_results(tmp_path):
    """A bar on stderr counts the decodes (methods x prompts x repeats) as each finishes, the method in its postfix,
    and is closed (at its total) before the table; stdout's lines per prompt and its table stay as they were."""
    out = tmp_path / "speed.json"
    result = subprocess.run([sys.executable, SPEED, "--quick", "--methods", "baseline,pld", "--json", str(out), "--tracker", "none"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, timeout=600,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # both streams in the order they were written
    assert result.returncode == 0, result.stdout[-3000:]
    lines = re.split(r"[\r\n]", result.stdout)
    bars = [(i, DECODING_BAR.search(line)) for i, line in enumerate(lines) if DECODING_BAR.search(line)]
    assert bars, result.stdout[-3000:]
    last, bar = bars[-1]
    assert int(bar["n"]) == int(bar["total"]) == 2 * 2 * 2  # 2 methods x 2 prompts x 2 repeats
    assert {b["method"] for _, b in bars} >= {"baseline", "pld(k=10)"}
    table = next(i for i, line in enumerate(lines) if line.startswith("method "))
    assert last < table and not any(DECODING_BAR.search(line) for line in lines[table:])
    assert "repeat 2/2, prompt 2/2: " in result.stdout and "pld(k=10)" in lines[table + 2]


def timed(name: str, seconds: list[float]):
    """A speed.py Method that measured `seconds` on each prompt (nothing to decode)."""
    return speed_module().Method(name, decode=None, group_seconds=seconds)


def test_the_speedup_interval_is_bca_over_prompts_as_scipy_gives_it():
    """Paired over prompts (a draw resamples prompts, both methods' times of each), the statistic the ratio of summed
    times, BCa: what scipy.stats.bootstrap gives called directly, not the percentile interval it replaced."""
    from scipy import stats

    reference, pld = timed("generate", [10.0, 12.0, 9.0, 30.0, 11.0, 10.0]), timed("pld", [5.0, 6.0, 5.0, 6.0, 5.5, 5.0])
    interval, note = speed_module().speedup_interval(reference, pld)

    def ratio(ref, own, axis=-1):
        return ref.sum(axis) / own.sum(axis)

    sample = (np.array(reference.group_seconds), np.array(pld.group_seconds))
    bca, percentile = (stats.bootstrap(sample, ratio, paired=True, vectorized=True, n_resamples=10_000, method=method,
                                       random_state=np.random.default_rng(1)).confidence_interval for method in ("BCa", "percentile"))
    assert note is None and interval == pytest.approx([bca.low, bca.high], rel=1e-3)
    assert interval[1] > percentile.high + 0.3  # the skewed sample: BCa's upper end well above the percentile one
    assert interval[0] < 63 / 32.5 < interval[1]  # around the point value, the ratio of the sums
    assert speed_module().speedup_interval(reference, reference) == ([1.0, 1.0], None)  # the reference against itself


def test_the_profile_counts_each_kernel_a_linear_layer_runs_as_matmul():
    """--profile's matmul share holds the products our layers run on the CPU: oneDNN's packed one (PackedLinear),
    torch.mv (one bf16 row on AMX) and the int8 draft's, not only aten's mm family (they were "other ops")."""
    import torch

    from specresearch.drafters.draft_model import quantize_int8_module
    from specresearch.models.kernels import PackedLinear, packed_linear_available

    speed = speed_module()
    x = torch.randn(3, 256)  # [rows, in]
    packed, plain = PackedLinear(256, 1024, bias=False), torch.nn.Linear(256, 1024, bias=False)  # 2**18 entries: packed
    int8 = quantize_int8_module(torch.nn.Sequential(torch.nn.Linear(256, 1024)))
    products = {"mv": lambda: torch.mv(plain.weight, x[0]), "int8": lambda: int8(x)}
    if packed_linear_available():
        products["packed"] = lambda: packed(x)

    def method(name, product):
        def decode(batch, n):
            with torch.inference_mode():
                for _ in range(50):
                    product()
            return speed.Run([[0] * n], 0.0)
        return speed.Method(name, decode)

    prof = speed.profile([method(name, product) for name, product in products.items()], [0], 1)
    for name in products:
        assert prof[name]["matmul"] > 2 * prof[name]["other ops"], (name, prof[name])


def test_a_speedup_interval_of_too_few_prompts_is_not_computed_and_of_a_degenerate_sample_is_the_point():
    """Fewer than 3 prompts: no interval, and a note says so. The same speedup on every prompt (BCa's NaN): no crash, no
    warning, the point value as both ends, and a note says so; the table and the rows carry each note once."""
    speed = speed_module()
    interval, note = speed.speedup_interval(timed("generate", [2.0, 3.0]), timed("pld", [1.0, 2.0]))
    assert interval is None and note == "speedup intervals not computed: 2 prompt(s), a 95% BCa interval over prompts needs >= 3"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scipy's DegenerateDataWarning and its division by zero stay inside
        interval, note = speed.speedup_interval(timed("generate", [2.0, 4.0, 6.0]), timed("pld", [1.0, 2.0, 3.0]))
    assert interval == [2.0, 2.0]
    assert note == ("pld over generate: no BCa interval (a degenerate sample, the same speedup on every prompt): "
                    "the point value 2.00x is shown as its interval")

    def method(name, seconds):
        m = timed(name, seconds)
        m.seconds, m.tokens, m.outputs = [sum(seconds)], [48], [[1] * 16] * 3
        return m

    rows = speed.summarize([method("generate", [2.0, 4.0, 6.0]), method("baseline", [2.0, 4.0, 6.0]), method("pld", [1.0, 2.0, 3.0])])
    assert rows[2]["speedup_interval"] == rows[2]["speedup_vs_baseline_interval"] == [2.0, 2.0]
    assert rows[2]["interval_notes"] == [note, note.replace("over generate", "over baseline")]
    assert rows[1]["interval_notes"] == [note.replace("pld", "baseline").replace("2.00x", "1.00x")]  # over generate; over itself: none
    text = speed.table(rows, "header")
    assert "(95% BCa)" in text and text.count(note) == 1 and "pld over baseline: no BCa interval" in text


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
    page = results_hook().render(results_hook().load(tmp_path / "speed.json"), "speed.json")
    assert "sampled at T = 0.7" in page


def test_the_draft_model_loads_only_for_methods_that_draft_with_it():
    """Plain decoding and prompt lookup never call the draft's loader; the independent drafter calls it once."""
    import argparse

    speed = speed_module()
    target = tiny_model()
    calls = []

    def draft():
        calls.append(1)
        return tiny_model(noise=0.03, noise_seed=5)

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

    hook = results_hook()
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
