"""The typed run records: the flat metrics `flatten` writes (the names MLflow stores hold), and the
same record read back by attribute."""

import math
from dataclasses import fields

import pytest

from specresearch.metrics import SpecStats
from specresearch.records import VERSION, EvalRecord, EvalSide, Group, SpeedRecord, flatten


def same(a: dict, b: dict) -> bool:
    """Equal dicts, NaN equal to NaN, in the same order."""
    return list(a) == list(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a.values(), b.values()))


def method_stats() -> SpecStats:
    stats = SpecStats(new_tokens=12, time_total=1.0)
    for drafted, accepted in ((2, 2), (2, 1), (2, 0), (2, 2), (2, 1)):
        stats.observe(drafted, accepted)
    return stats


def speed_record() -> SpeedRecord:
    return SpeedRecord(SpecStats(new_tokens=12, steps=12, time_total=2.0), method_stats(),
                       prompts=2, k=2, speedup=1.5, groups={"writing": Group(1, 1.2, 2.0, 0.5)},
                       equivalence={"reject": 0.0, "samples_per_s_method": 3.0}, calibration={"rate": 0.05})


def test_a_side_is_the_engines_own_counters_with_what_they_give():
    """One record type per side: SpecStats' fields and its DERIVED values under `SIDE_NAME`, lists by position."""
    metrics = flatten(speed_record())
    stats = method_stats()
    assert {f"method_{f.name}" for f in fields(SpecStats) if not isinstance(getattr(stats, f.name), list)} <= set(metrics)
    assert metrics["method_tau"] == stats.tau and metrics["method_nodes_per_step"] == stats.nodes_per_step
    assert [metrics[f"method_drafted_at_{i}"] for i in (1, 2)] == stats.drafted_at


def test_speed_record_writes_the_names_stores_hold_and_reads_them_back():
    record = speed_record()
    metrics = flatten(record)
    assert metrics["baseline_tokens_per_s"] == 6.0 and metrics["method_alpha_token"] == method_stats().alpha_token
    assert metrics["method_acceptance_at_2"] == pytest.approx(0.4) and "baseline_acceptance_at_1" not in metrics
    assert metrics["group.writing.speedup"] == 1.2 and metrics["group.writing.method_tau"] == 2.0
    assert metrics["eq_reject"] == 0.0 and metrics["eq_samples_per_s_method"] == 3.0 and metrics["aa_rate"] == 0.05
    assert metrics["speedup"] == 1.5 and metrics["k"] == 2 and metrics["record_version"] == VERSION
    back = SpeedRecord.from_metrics(metrics)
    assert same(flatten(back), metrics) and back.groups["writing"] == record.groups["writing"]
    assert back.method.acceptance_at == method_stats().acceptance_at and back.method.alpha_token == method_stats().alpha_token


def test_a_name_the_metrics_lack_reads_as_nan():
    metrics = {k: v for k, v in flatten(speed_record()).items() if k not in ("eq_reject", "speedup")}
    record = SpeedRecord.from_metrics(metrics)
    assert math.isnan(record.speedup) and "reject" not in record.equivalence and record.k == 2
    assert math.isnan(SpeedRecord.from_metrics({}).speedup) and SpeedRecord.from_metrics({}).method.acceptance_at == []


def test_eval_record_round_trip_in_mlflow_spelling():
    record = EvalRecord({"baseline": EvalSide({"pass@1": 0.5}, SpecStats(new_tokens=40, steps=40, time_total=4.0)),
                         "method": EvalSide({"pass@1": 0.75, "pass@1_stderr": 0.1}, SpecStats(new_tokens=40, steps=20, accepted=20, time_total=2.0))},
                        problems=4, delta={"pass@1": 0.25}, method_only=1, baseline_only=0, mcnemar_p=1.0,
                        identity_rate=0.5, baseline_reused=0.0)
    metrics = flatten(record)
    assert metrics["method_pass@1"] == 0.75 and metrics["method_tau"] == 2.0 and metrics["baseline_tokens_per_s"] == 10.0 and metrics["delta_pass@1"] == 0.25 and "speedup" not in metrics
    back = EvalRecord.from_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()})  # as MLflow keeps them
    assert back.score("method", "pass@1") == 0.75 and back.score("baseline", "pass@1") == 0.5
    assert back.delta_of("pass@1") == 0.25 and back.mcnemar_p == 1.0 and back.speedup is None
    assert back.sides["method"].stats.tau == 2.0 and back.method_only == 1 and back.problems == 4
    assert set(back.sides["method"].scores) == {"pass_at_1", "pass_at_1_stderr"}  # a side's counters are not its scores
    only = EvalRecord.from_metrics({"method_pass_at_1": 0.0, "problems": 1})  # eval.baseline=false
    assert list(only.sides) == ["method"] and math.isnan(only.score("baseline", "pass@1"))
