import math

import pytest
import torch

from specresearch.metrics import SpecStats, cost_ratios, leviathan_optimal_k, leviathan_speedup, per_token, predict
from specresearch.sampling import invert_cdf, logits_to_probs, sample
from specresearch.types import SamplingParams


def test_spec_stats_counts_tau_alpha_and_positions():
    s = SpecStats()
    s.observe(4, 4)
    s.observe(4, 1)
    s.observe(2, 0)
    assert s.steps == 3 and s.drafted == 10 and s.accepted == 5
    assert s.tau == pytest.approx((5 + 3) / 3)
    assert s.alpha == pytest.approx(0.5)
    assert s.drafted_at == [3, 3, 2, 2] and s.accepted_at == [2, 1, 1, 1]
    merged = s.merge(SpecStats(steps=1, drafted=0, accepted=0, time_total=2.0, drafted_at=[], accepted_at=[]))
    assert merged.steps == 4 and merged.drafted_at == [3, 3, 2, 2] and merged.time_total == 2.0


def test_baseline_has_tau_one():
    s = SpecStats()
    for _ in range(5):
        s.observe(0, 0)
    assert s.tau == 1.0 and math.isnan(s.alpha)


def test_leviathan_formula():
    # alpha = 0: one token per step at cost k·c + v
    assert leviathan_speedup(0.0, 4, 0.5, 1.0) == pytest.approx(1 / 3)
    # alpha = 1: k + 1 tokens per step
    assert leviathan_speedup(1.0, 4, 0.5, 1.0) == pytest.approx(5 / 3)
    # the paper's example shape: (1 − α^(k+1)) / ((1 − α)(k c + 1))
    assert leviathan_speedup(0.8, 4, 0.05, 1.0) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))
    assert math.isnan(leviathan_speedup(float("nan"), 4, 0.5))


def test_greedy_probs_are_one_hot_argmax():
    logits = torch.tensor([[0.1, 3.0, -1.0], [5.0, 0.0, 4.9]])
    probs = logits_to_probs(logits, SamplingParams())
    assert probs.tolist() == [[0, 1, 0], [1, 0, 0]]


def test_temperature_top_k_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(logits_to_probs(logits, SamplingParams(temperature=1.0)), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    hot = logits_to_probs(logits, SamplingParams(temperature=0.5))
    torch.testing.assert_close(hot, torch.tensor([0.25, 0.09, 0.0225, 0.0025]) / 0.365)
    top2 = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(top2, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # top-p: the smallest set whose mass reaches 0.8 is {0.5, 0.3}
    nucleus = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(nucleus, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # a tiny top_p keeps the most likely token only
    assert logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.01)).tolist() == [1, 0, 0, 0]


def test_sample_is_reproducible_and_follows_support():
    probs = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    a = sample(probs, torch.Generator().manual_seed(7))
    b = sample(probs, torch.Generator().manual_seed(7))
    assert a.tolist() == b.tolist() and a[0] != 0 and a[1] == 0


@pytest.mark.parametrize("vocab", [3, 127, 128, 300, 151936])
def test_the_two_level_inversion_picks_the_token_whose_interval_holds_u(vocab):
    """invert_cdf sums blocks, then inside one block: a u inside token i's interval of the CDF (at its middle, well
    clear of rounding) picks token i, in sparse, one-hot and tiny-mass rows, with the last blocks empty, a vocabulary
    below, at and off a multiple of the block and Qwen's; at u = 1 - 2^-53 (and 1) it picks a row's last token of mass, and
    a token of probability 0 is never picked."""
    g = torch.Generator().manual_seed(vocab)
    probs = torch.rand(8, vocab, generator=g) ** 8
    probs[probs < 0.2] = 0.0
    probs[:, 0] = 1e-3  # every row has mass
    probs[1] = 0.0
    probs[1, vocab // 2] = 1.0  # one-hot
    probs[2, vocab // 3 + 1:] = 0.0  # the last blocks empty
    probs[3, :] = 1e-9  # tiny masses
    cdf = probs.double().cumsum(-1)  # [8, V]
    for row in range(8):
        tokens = probs[row].nonzero()[:, 0]
        tokens = tokens[torch.randperm(len(tokens), generator=g)[:64]]  # [T] tokens of mass in this row
        middle = (cdf[row, tokens] - probs[row, tokens].double() / 2) / cdf[row, -1]  # [T] each one's interval's middle
        assert torch.equal(invert_cdf(probs[row].expand(len(tokens), -1), middle[:, None]), tokens)
    last = vocab - 1 - (probs > 0).flip(-1).int().argmax(-1)  # [8]
    for top in (1 - 2**-53, 1.0):  # (1: where u * total rounds up to the total)
        assert torch.equal(invert_cdf(probs, torch.full((8, 1), top, dtype=torch.float64)), last)
    u = torch.rand(8, 1, generator=g, dtype=torch.float64)
    assert torch.equal(invert_cdf(probs.reshape(2, 4, vocab), u), invert_cdf(probs, u).reshape(2, 4))


def test_leviathan_optimal_k():
    # alpha 0.8, c 0.05, free verification: (1 - 0.8^(k+1)) / (0.2 (0.05 k + 1)) peaks at k = 8 (3.092)
    k, speedup = leviathan_optimal_k(0.8, 0.05, 1.0, k_measured=4)
    assert k == 8 and speedup == pytest.approx((1 - 0.8**9) / (0.2 * 1.4))
    assert leviathan_optimal_k(0.0, 0.3, 1.2, 4)[0] == 1  # nothing is accepted: the shortest draft loses least
    assert leviathan_optimal_k(0.99, 0.0, 1.0, 4, k_max=12)[0] == 12  # free drafts, free verification: longest
    # verification that grows with k (v = 3 at k = 4, i.e. +0.5 per token) pulls the optimum down
    assert leviathan_optimal_k(0.8, 0.05, 3.0, 4)[0] < 8
    assert leviathan_optimal_k(float("nan"), 0.1, 1.0, 4) == (0, pytest.approx(float("nan"), nan_ok=True))
    # a measured cost curve replaces the linear model: flat after 2 tokens favours long drafts
    curve = [1.0, 1.4, 1.7, 1.75, 1.8, 1.85, 1.9]  # v(k) for k = 0..6
    k, speedup = leviathan_optimal_k(0.8, 0.1, 99.0, 4, v_curve=curve)
    assert k == 6 and speedup == pytest.approx(leviathan_speedup(0.8, 6, 0.1, 1.9))
    assert leviathan_optimal_k(0.8, 0.1, 1.84, 4)[0] < 6  # the linear model from v(4) = 1.84 would stop earlier


def test_cost_ratios_relative_to_one_baseline_forward():
    base = SpecStats(steps=10, time_verify=2.0)  # 0.2 s per one-token target forward
    meth = SpecStats(steps=4, time_verify=1.2, draft_forwards=8, time_draft=0.4)
    c, v = cost_ratios(base, meth)
    assert c == pytest.approx(0.25) and v == pytest.approx(1.5)
    assert cost_ratios(base, SpecStats(steps=2, time_verify=0.4))[0] == 0.0  # a model-free drafter costs nothing
    assert per_token(c, SpecStats(drafted=8, draft_forwards=8)) == pytest.approx(0.25)  # one token per forward
    assert per_token(c, SpecStats(drafted=12, draft_forwards=8)) == pytest.approx(0.25 * 8 / 12)  # lookup: 1.5 per forward
    assert per_token(c, SpecStats()) == c


def test_prediction_holds_only_for_chains_of_k():
    base = SpecStats(steps=10, time_verify=2.0)  # 0.2 s per one-token target forward
    chain = SpecStats(steps=4, time_verify=1.2, draft_forwards=16, time_draft=0.8, drafted=16, accepted=10,
                      rejected=3, drafted_at=[4] * 4, accepted_at=[4, 3, 2, 1])
    pred = predict(base, chain, 4)
    assert (pred.c, pred.v) == (pytest.approx(0.25), pytest.approx(1.5))
    assert pred.speedup == pytest.approx(leviathan_speedup(chain.alpha_token, 4, 0.25, 1.5))
    assert (pred.best_k, pred.best_speedup) == leviathan_optimal_k(chain.alpha_token, 0.25, 1.5, 4)
    tree = SpecStats(**{**chain.__dict__, "off_chain": 1})  # one step that was not a chain of 4: no prediction
    assert math.isnan(predict(base, tree, 4).speedup) and predict(base, tree, 4).best_k == 0
    assert predict(base, SpecStats(steps=10, time_verify=3.0), 0).speedup == pytest.approx(2.0 / 3.0)  # no drafter: 1 / v
    assert math.isnan(predict(None, chain, 4).speedup)  # no baseline: c and v unknown


@pytest.mark.parametrize("k", [1, 4, 8])
def test_alpha_token_recovers_an_iid_acceptance_rate_that_alpha_underestimates(k):
    """Steps that accept each tried token with probability 0.7 until the first rejection: the
    per-token α (accepted / tried) is 0.7 for every k, the share of drafted tokens kept falls with
    k, and Leviathan's expected tokens per step from alpha_token match the measured τ."""
    gen = torch.Generator().manual_seed(k)
    stats = SpecStats()
    for _ in range(4000):
        accepted = 0
        while accepted < k and torch.rand((), generator=gen).item() < 0.7:
            accepted += 1
        stats.observe(k, accepted)
    assert stats.alpha_token == pytest.approx(0.7, abs=0.02)
    expected_tau = (1 - stats.alpha_token ** (k + 1)) / (1 - stats.alpha_token)
    assert stats.tau == pytest.approx(expected_tau, rel=0.03)
    if k > 1:
        assert stats.alpha < 0.65  # kept / drafted: the tokens after a rejection were never tried
    assert stats.merge(stats).alpha_token == pytest.approx(stats.alpha_token)
