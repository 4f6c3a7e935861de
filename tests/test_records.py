"""The typed run records: the flat metrics they write (the names MLflow stores hold), and what they
read back, from runs recorded before the records existed too."""

import math
from dataclasses import fields

import pytest

from specresearch.metrics import SpecStats
from specresearch.records import VERSION, EvalRecord, EvalSide, Group, SideStats, SpeedRecord


def same(a: dict, b: dict) -> bool:
    """Equal dicts, NaN equal to NaN, in the same order."""
    return list(a) == list(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a.values(), b.values()))


def method_stats() -> SpecStats:
    stats = SpecStats(new_tokens=12, time_total=1.0)
    for drafted, accepted in ((2, 2), (2, 1), (2, 0), (2, 2), (2, 1)):
        stats.observe(drafted, accepted)
    return stats


def speed_record() -> SpeedRecord:
    return SpeedRecord(SideStats.of(SpecStats(new_tokens=12, steps=12, time_total=2.0).summary()), SideStats.of(method_stats().summary()),
                       prompts=2, k=2, speedup=1.5, groups={"writing": Group(1, 1.2, 2.0, 0.5)},
                       equivalence={"reject": 0.0, "samples_per_s_method": 3.0}, calibration={"rate": 0.05})


def test_side_stats_know_every_name_of_spec_stats():
    names = {f.name for f in fields(SideStats)}
    assert {k for k in method_stats().summary() if not k.startswith("acceptance_at_")} <= names


def test_speed_record_writes_the_names_stores_hold_and_reads_them_back():
    record = speed_record()
    metrics = record.to_metrics()
    assert metrics["baseline_tokens_per_s"] == 6.0 and metrics["method_alpha_token"] == method_stats().alpha_token
    assert metrics["method_acceptance_at_2"] == pytest.approx(0.4) and "baseline_acceptance_at_1" not in metrics
    assert metrics["group.writing.speedup"] == 1.2 and metrics["group.writing.method_tau"] == 2.0
    assert metrics["eq_reject"] == 0.0 and metrics["eq_samples_per_s_method"] == 3.0 and metrics["aa_rate"] == 0.05
    assert metrics["speedup"] == 1.5 and metrics["k"] == 2 and metrics["record_version"] == VERSION
    back = SpeedRecord.from_metrics(metrics)
    assert same(back.to_metrics(), metrics) and back.groups["writing"] == record.groups["writing"]


def test_a_name_the_metrics_lack_reads_as_nan():
    metrics = {k: v for k, v in speed_record().to_metrics().items() if k not in ("method_rejected", "eq_reject")}
    record = SpeedRecord.from_metrics(metrics)
    assert math.isnan(record.method.rejected) and math.isnan(record.equivalence.get("reject", math.nan))
    assert math.isnan(SpeedRecord.from_metrics({}).speedup)


def test_eval_record_round_trip_in_mlflow_spelling():
    record = EvalRecord({"baseline": EvalSide({"pass@1": 0.5}, 10.0, 1.0, 0.0, 40),
                         "method": EvalSide({"pass@1": 0.75, "pass@1_stderr": 0.1}, 15.0, 2.0, 0.6, 40)},
                        problems=4, delta={"pass@1": 0.25}, method_only=1, baseline_only=0, mcnemar_p=1.0,
                        identity_rate=0.5, baseline_reused=0.0)
    metrics = record.to_metrics()
    assert metrics["method_pass@1"] == 0.75 and metrics["delta_pass@1"] == 0.25 and "speedup" not in metrics
    back = EvalRecord.from_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()})  # as MLflow keeps them
    assert back.score("method", "pass@1") == 0.75 and back.score("baseline", "pass@1") == 0.5
    assert back.delta_of("pass@1") == 0.25 and back.mcnemar_p == 1.0 and back.speedup is None
    assert back.sides["method"].tau == 2.0 and back.method_only == 1 and back.problems == 4
    only = EvalRecord.from_metrics({"method_pass_at_1": 0.0, "problems": 1})  # eval.baseline=false
    assert list(only.sides) == ["method"] and math.isnan(only.score("baseline", "pass@1"))
