"""Pass rates over seeds, paired by problem (specresearch.analysis.seeds), and the lossless_vs_lossy table built on
them: the tags read back, the intervals against scipy's own tests, their coverage and power by simulation."""

import sys

import numpy as np
import pytest
from scipy import stats
from specresearch.analysis import seeds
from specresearch.analysis.runs import Run


def _outcomes(matrix: np.ndarray, first: int = 0) -> seeds.Outcomes:
    """[seeds, problems] of 0/1 -> seed -> problem -> outcome (seeds numbered from 1)."""
    return {s + 1: {first + i: int(v) for i, v in enumerate(row)} for s, row in enumerate(matrix)}


def test_solved_reads_a_sides_tag_and_nothing_else():
    tags = {"specresearch.solved.method": "156:0110", "specresearch.solved.baseline": "0:1"}
    assert seeds.solved(tags, "method") == {156: 0, 157: 1, 158: 1, 159: 0}
    assert seeds.solved(tags, "baseline") == {0: 1}
    assert seeds.solved({}, "method") is None


def test_rate_and_paired_are_t_intervals_over_the_problems_seed_means():
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 164)) < 0.55, rng.random((4, 164)) < 0.45
    r = seeds.rate(_outcomes(a))
    ci = stats.ttest_1samp(a.mean(0), 0).confidence_interval()
    assert (r.value, r.problems, r.seeds) == (pytest.approx(a.mean()), 164, 4)
    assert (r.low, r.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    d = seeds.paired(_outcomes(a), _outcomes(b))
    test = stats.ttest_rel(a.mean(0), b.mean(0))
    ci = test.confidence_interval()
    assert d.delta == pytest.approx(a.mean() - b.mean()) and d.p == pytest.approx(test.pvalue)
    assert (d.low, d.high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    se = (a.mean(0) - b.mean(0)).std(ddof=1) / np.sqrt(164)
    assert d.detectable == pytest.approx((stats.t.ppf(0.975, 163) + stats.t.ppf(0.8, 163)) * se)


def test_paired_keeps_the_seeds_and_problems_both_sides_have():
    a = _outcomes(np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]]))  # seeds 1, 2, 3; problems 0-3
    b = {1: {0: 0, 1: 0, 2: 0}, 2: {1: 1, 2: 1, 3: 0}, 7: {0: 1}}  # seeds 1, 2 shared; problems 1, 2 at both
    d = seeds.paired(a, b)
    assert (d.seeds, d.problems) == (2, 2)
    assert d.delta == pytest.approx(((0.5 - 0.5) + (0.5 - 0.5)) / 2)
    one = seeds.paired({1: {0: 1, 1: 0, 2: 1}}, {1: {0: 0, 1: 0, 2: 1}})  # one seed: (solved only by a − only by b) / n
    assert one.delta == pytest.approx(1 / 3) and one.seeds == 1
    assert np.isnan(seeds.paired({1: {0: 1}}, {1: {0: 0}}).delta)  # one problem: no interval


def _simulate(shift: float, n_seeds: int, reps: int, rng) -> list[seeds.Paired]:
    """Two settings on 164 problems of HumanEval-like spread (each problem's rate drawn from Beta(0.4, 0.5): most
    problems nearly always or nearly never solved), `n_seeds` each; the first's rates moved by `shift`."""
    out = []
    for _ in range(reps):
        p = rng.beta(0.4, 0.5, 164)
        q = np.clip(p + shift, 0, 1)
        out.append(seeds.paired(_outcomes(rng.random((n_seeds, 164)) < q), _outcomes(rng.random((n_seeds, 164)) < p)))
    return out


def test_the_interval_covers_no_difference_at_its_level_and_narrows_with_seeds():
    """What the study's claims rest on: with no difference the 95% interval covers 0 about 95% of the time; one seed a
    side leaves it about ±0.075 wide over 164 problems, 4 seeds within ±0.04, and 8 seeds find a true +0.04 (the
    interval above 0) most of the time, the detectable difference they state at or under 0.045."""
    rng = np.random.default_rng(1)
    null = _simulate(0.0, 4, 300, rng)
    assert 0.92 <= np.mean([d.low <= 0 <= d.high for d in null]) <= 0.98
    half = {k: np.median([(d.high - d.low) / 2 for d in _simulate(0.04, k, 60, rng)]) for k in (1, 4)}
    assert half[1] > 0.06 and half[4] <= 0.04
    eight = _simulate(0.04, 8, 150, rng)
    assert np.mean([d.low > 0 for d in eight]) >= 0.7 and np.median([d.detectable for d in eight]) <= 0.045


def _run(i: int, task: str, drafter: str, verifier: str, t: float, seed: int, method: str, baseline: str | None,
         **params) -> Run:
    targets = {"none": "specresearch.drafters.none.NoDrafter", "plain_chain": "specresearch.drafters.independent.IndependentDrafter"}
    verifiers = {"rejection": "specresearch.verifiers.rejection.RejectionVerifier",
                 "margin": "specresearch.verifiers.relaxed.MarginVerifier"}
    tags = {"specresearch.solved.method": method, **({"specresearch.solved.baseline": baseline} if baseline else {})}
    return Run(f"r{i}", "FINISHED", i, {"eval.task": task, "drafter._target_": targets[drafter], "verifier._target_":
               verifiers[verifier], "sampling.temperature": str(t), "seed": str(seed), "model.dtype_used": "bfloat16",
               **params}, {}, tags)


def test_the_study_pairs_each_setting_with_its_own_target_and_the_lower_t_one():
    from specresearch.analysis.studies import builder

    builder("lossless_vs_lossy")
    module = sys.modules["experiments.lossless_vs_lossy.analysis"]
    target = {1: "0:1100", 2: "0:1000"}
    runs = [_run(1, "humaneval_offline", "plain_chain", "rejection", 0.7, 1, "0:1100", target[1]),
            _run(2, "humaneval_offline", "plain_chain", "margin", 0.7, 1, "0:1110", target[1], **{"verifier.margin": "0.4"}),
            _run(3, "humaneval_offline", "plain_chain", "margin", 0.7, 2, "0:1111", target[2], **{"verifier.margin": "0.4"}),
            _run(4, "humaneval_offline", "none", "rejection", 0.5, 1, "0:1110", None),
            _run(5, "humaneval_offline", "none", "rejection", 0.5, 2, "0:1100", None)]
    records = module.quality_over_seeds(runs)
    rows = {(r["verifier"], r["setting"], r["T"]): r for r in records}
    assert list(rows) == [(module.TARGET, "–", 0.7), (module.TARGET, "–", 0.5), ("rejection", "–", 0.7),
                          ("margin", "margin 0.4", 0.7)]
    margin = rows[("margin", "margin 0.4", 0.7)]
    assert margin["seeds"] == "2 (1, 2)" and margin["rate"].value == pytest.approx((1 + 1 + 1 + 0.5) / 4)
    assert margin["vs_target"].delta == pytest.approx(((1 - 1) + (1 - 0.5) + (1 - 0) + (0.5 - 0)) / 4)
    lower_t, vs = margin["vs_lower"]  # against the target alone at T = 0.5 (drafter none's method side)
    assert lower_t == 0.5 and vs.delta == pytest.approx(((1 - 1) + (1 - 1) + (1 - 0.5) + (0.5 - 0)) / 4)
    assert rows[(module.TARGET, "–", 0.7)]["rate"].value == pytest.approx(3 / 8)  # the baseline sides, seeds 1 and 2
    assert rows[(module.TARGET, "–", 0.5)]["vs_lower"] is None
