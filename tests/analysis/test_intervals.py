"""A speed cell's intervals over prompts (specresearch.analysis.intervals), the tag they are read from, and the
lossless_vs_lossy table of speed cells paired with rejection sampling on the same prompts."""

import json
import math
import sys

import numpy as np
import pytest
from specresearch.analysis import intervals
from specresearch.analysis.runs import Run

from specresearch.measure.runner import TAG_LENGTH, per_prompt_tag


def _prompts(rng, n: int, speedup: float = 1.5, first: int = 0) -> dict:
    """n prompts: the baseline at ~3.5 tokens/s, the method `speedup` times faster with each prompt's own spread."""
    out = {}
    for i in range(n):
        tokens = int(rng.integers(20, 65))
        base_s = tokens / rng.normal(3.5, 0.2)
        steps = int(rng.integers(8, 17))
        out[f"HumanEval/{first + i}"] = (tokens, base_s, tokens, base_s / (speedup * rng.lognormal(0, 0.15)), steps,
                                         int(rng.integers(2, 4)) * steps)
    return out


def _study():
    """The lossless_vs_lossy study's analysis module."""
    from specresearch.analysis.studies import builder

    builder("lossless_vs_lossy")
    return sys.modules["experiments.lossless_vs_lossy.analysis"]


def _faster(prompts: dict, factor: float) -> dict:
    """The same prompts with the method's seconds divided by `factor`: `factor` times faster on every prompt."""
    return {i: (bt, bs, mt, ms / factor, *rest) for i, (bt, bs, mt, ms, *rest) in prompts.items()}


def test_the_tag_holds_each_prompts_tokens_seconds_and_forwards():
    records = [{"id": f"HumanEval/{i}", "baseline": {"new_tokens": 64, "time_total": 18.123456, "steps": 64},
                "method": {"new_tokens": 60, "time_total": 11.5, "steps": 14, "accepted": 47}} for i in (128, 129)]
    (value,) = per_prompt_tag(records).values()
    assert json.loads(value) == {"ids": ["HumanEval/128", "HumanEval/129"], "baseline": [[64, 18.1235]] * 2,
                                 "method": [[60, 11.5, 14, 47]] * 2}
    assert intervals.per_prompt(per_prompt_tag(records)) == {"HumanEval/128": (64, 18.1235, 60, 11.5, 14, 47),
                                                             "HumanEval/129": (64, 18.1235, 60, 11.5, 14, 47)}
    old = {"specresearch.per_prompt": '{"ids": ["a"], "baseline": [[64, 18.0]], "method": [[60, 11.5, 14]]}'}  # before accepted
    assert math.isnan(intervals.per_prompt(old)["a"][5]) and intervals.per_prompt(old)["a"][:5] == (64, 18.0, 60, 11.5, 14)
    assert per_prompt_tag(records, batch=2) == {} and per_prompt_tag([]) == {}  # a batch's rows share their times
    assert per_prompt_tag(records * (TAG_LENGTH // 50)) == {}  # past MLflow's tag length: none (records.jsonl has them)
    assert intervals.per_prompt({}) is None


def test_speedup_and_tau_are_pooled_with_an_interval_that_narrows_with_prompts():
    rng = np.random.default_rng(0)
    few, many = _prompts(rng, 16), _prompts(rng, 128)
    bt, bs, mt, ms, steps, accepted = (np.array(c, dtype=float) for c in zip(*few.values()))
    s = intervals.speedup(few)
    assert s.value == pytest.approx((mt.sum() / ms.sum()) / (bt.sum() / bs.sum())) and s.prompts == 16
    assert s.low < s.value < s.high and s.low < 1.5 < s.high
    wide, narrow = s.high - s.low, intervals.speedup(many).high - intervals.speedup(many).low
    assert narrow < 0.6 * wide  # about 1/sqrt(8) of it
    t = intervals.tau(few)
    assert t.value == pytest.approx((accepted.sum() + steps.sum()) / steps.sum()) and t.low <= t.value <= t.high
    assert math.isnan(intervals.speedup(dict(list(few.items())[:2])).low)  # two prompts: no interval


def test_the_difference_pairs_prompts_and_finds_what_one_cell_buys():
    rng = np.random.default_rng(1)
    reference = _prompts(rng, 16)
    faster = _faster(reference, 1.08)
    d = intervals.difference(faster, reference)
    assert d.value == pytest.approx(intervals.speedup(faster).value - intervals.speedup(reference).value) and d.prompts == 16
    assert 0 < d.low < d.value < d.high  # paired: the prompts' own spread cancels, the 0.12x gain is found
    unpaired = intervals.speedup(faster).low - intervals.speedup(reference).high
    assert unpaired < 0 < d.low  # while the two cells' own intervals overlap
    other = dict(list(reference.items())[:8])
    assert intervals.difference(faster, other).prompts == 8  # only the prompts both decoded
    assert math.isnan(intervals.difference(faster, {"x": (1, 1, 1, 1, 1, 0)}).value)


def _speed_run(i: int, verifier: str, prompts: dict, drafter: str = "plain_chain", distortion: str = "0", **params) -> Run:
    targets = {"plain_chain": "specresearch.drafters.independent.IndependentDrafter",
               "medusa": "specresearch.drafters.medusa.MedusaDrafter"}
    verifiers = {"rejection": "specresearch.verifiers.rejection.RejectionVerifier",
                 "topk": "specresearch.verifiers.relaxed.TopKVerifier"}
    ids = list(prompts)
    tag = json.dumps({"ids": ids, "baseline": [list(prompts[i][:2]) for i in ids], "method": [list(prompts[i][2:]) for i in ids]})
    return Run(f"r{i}", "FINISHED", i, {"drafter._target_": targets[drafter], "verifier._target_": verifiers[verifier],
               "sampling.temperature": "0.7", "model.dtype_used": "bfloat16", "dataset.name": "humaneval",
               "dataset.offset": "128", "dataset.num_prompts": str(len(ids)), "stats.distortion": distortion,
               "stats.samples": "0", **params}, {}, {"specresearch.per_prompt": tag})


def test_a_caption_counts_a_run_that_feeds_several_rows_once():
    from specresearch.analysis.report import caption
    from specresearch.analysis.runs import Study

    rng = np.random.default_rng(4)
    one, two = _speed_run(1, "rejection", _prompts(rng, 4)), _speed_run(2, "topk", _prompts(rng, 4))
    study = Study("s", "sqlite://", "s", [one, two])
    assert "From 2 FINISHED runs" in caption("Rows.", [one, two, one], study)
    assert "From 1 FINISHED run " in caption("Rows.", [one, one], study)


def test_the_study_pairs_each_rule_with_rejection_on_the_same_prompts():
    module = _study()
    rng = np.random.default_rng(2)
    rejection = _prompts(rng, 16, first=128)
    topk = _faster(rejection, 1.3)
    runs = [_speed_run(1, "rejection", rejection), _speed_run(2, "topk", topk, **{"verifier.k": "10"}),
            _speed_run(3, "topk", topk, drafter="medusa", **{"verifier.k": "10"}),  # no rejection cell of its drafter
            _speed_run(4, "topk", topk, distortion="32")]  # a frontier cell: not one of these
    assert [module._frontier(r) for r in runs] == [False, False, False, True]
    records = module.speed_over_prompts([r for r in runs if not module._frontier(r)], {("independent", "topk", "k 10", 0.7, "bf16"): 0.29})
    assert [(r["dataset"], r["drafter"], r["verifier"], r["setting"]) for r in records] == [
        ("humaneval 128-143", "independent", "rejection", "–"), ("humaneval 128-143", "independent", "topk", "k 10"),
        ("humaneval 128-143", "medusa", "topk", "k 10")]
    reference, rule, medusa = records
    assert medusa["vs_rejection"] is None and reference["vs_rejection"] is None and math.isnan(reference["tv"])
    assert rule["vs_rejection"].value == pytest.approx(rule["speedup"].value - reference["speedup"].value)
    assert rule["vs_rejection"].low > 0 and rule["tv"] == 0.29 and rule["n"] == 16


def test_the_verdict_row_joins_a_settings_speed_distortion_battery_and_quality():
    module = _study()
    rng = np.random.default_rng(3)
    rejection = _prompts(rng, 16, first=128)
    topk = _faster(rejection, 1.3)
    chat = {f"mt/{i}": v for i, v in enumerate(_prompts(rng, 16, speedup=1.2).values())}
    mtbench = {"dataset.name": "mtbench", "dataset.offset": "2", "dataset.per_category": "2"}
    timed = module.speed_over_prompts([
        _speed_run(1, "rejection", rejection), _speed_run(2, "topk", topk, **{"verifier.k": "10"}),
        _speed_run(3, "topk", _faster(chat, 1.25), **{"verifier.k": "10"}, **mtbench),
        _speed_run(4, "rejection", chat, **mtbench)], {})
    assert [r["dataset"] for r in timed] == ["humaneval 128-143", "humaneval 128-143", "mtbench questions 3-4 of each category",
                                             "mtbench questions 3-4 of each category"]
    cell = ("independent", "topk", "k 10", 0.7, "bf16")
    frontier = [dict(zip(("drafter", "verifier", "setting", "T", "target"), cell), lossless=False, tv=(0.29, 0.2, 0.4),
                     verdict="different", eq={"surprisal_deficit": 0.087}),
                dict(drafter="independent", verifier="rejection", setting="–", T=0.7, target="bf16", lossless=True, tv=(0.0,),
                     verdict="different", eq={"surprisal_deficit": 0.001}),
                dict(drafter="independent", verifier="rejection", setting="–", T=0.7, target="fp32", lossless=True, tv=(0.0,),
                     verdict="not distinguishable", eq={})]
    quality = [dict(task="humaneval_offline", drafter="independent", verifier="topk", setting="k 10", T=0.7, target="bf16",
                    vs_target="Δ")]
    rows = module.verdict_rows(frontier, timed, quality)
    assert [(r["verifier"], r["lossless"]) for r in rows] == [("rejection", True), ("topk", False)]
    rule = rows[1]
    assert rule["code"] is timed[1]["speedup"] and rule["chat"] is timed[3]["speedup"] and rule["code_vs_rejection"] is timed[1]["vs_rejection"]
    assert rule["chat_vs_rejection"] is timed[3]["vs_rejection"] and rule["chat_vs_rejection"].low > 0  # each set against its own
    assert rule["tv"] == 0.29 and rule["battery"] == "different (+0.087)" and rule["humaneval_offline"] == "Δ"
    assert "stdlib_doctest" not in rule and rows[0]["chat"] is timed[2]["speedup"] and rows[0]["chat_vs_rejection"] is None
    assert rows[0]["battery"] == "different (+0.001); not distinguishable with fp32"  # the target's other numerics beside
