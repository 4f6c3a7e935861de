"""Exact distortion (specresearch.stats.distortion): the exact law of the first token each verification
step emits, along teacher-forced continuations, on tiny fp32 models at T = 1. Every lossless verifier x
drafter mode (read from conf/, as tests/verifiers/test_lossless.py reads them) gives 0 to float precision; each lossy
rule gives more; and at the prompt's first position the exact TV agrees with what the equivalence battery
estimates from samples of the method and of the target."""

import numpy as np
import pytest
import torch

from specresearch.build import build_engine
from specresearch.drafters.independent import plain_chain
from specresearch.errors import SpecResearchError
from specresearch.measure.equivalence import baseline_samples, method_samples, score
from specresearch.stats import Samples, battery
from specresearch.stats.distortion import Distortion, continuations, distortion, tv_to_powers
from specresearch.stats.exact import chain_first_token_laws, first_token_law, kl_divergence, step_first_token_law
from specresearch.stats.floor import one_query_laws
from specresearch.types import Draft, SamplingParams, Siblings
from specresearch.verifiers import MarginVerifier, RejectionVerifier, TopKVerifier, TypicalVerifier
from tests.cases import cases
from tests.tiny import CYCLING, REJECTING, drafter_cfg

T1 = SamplingParams(temperature=1.0)

LOSSY = ["typical", "margin", "topk"]
PROMPTS = [CYCLING[:6], CYCLING[3:11]]  # two prompts of different lengths
LENGTH = 6


def _engine(drafter: str, overrides: tuple[str, ...], verifier: str, tmp_path, *more: str):
    cfg = drafter_cfg(drafter, tmp_path, *(f"drafter.{o}" for o in overrides), f"verifier={verifier}", "sampling=random", *more,
                      landing=REJECTING)
    return build_engine(cfg), build_engine(cfg, baseline=True)


def _measured(method, baseline):
    texts = continuations(baseline, PROMPTS, LENGTH, seed=3)
    return distortion(method, PROMPTS, texts, seed=3)


@pytest.mark.parametrize("drafter, overrides, verifier", cases(T1))
def test_lossless_pairs_have_no_distortion(drafter, overrides, verifier, tmp_path):
    """Every lossless verifier x drafter mode: the first token's exact law equals p at every position
    (TV and KL < 1e-9), sampled trees averaged over their children's draws, a sampled chain token's
    deterministic siblings (the siblings modes, the independent drafter's default) over its draw."""
    method, baseline = _engine(drafter, overrides, verifier, tmp_path)
    d = _measured(method, baseline)
    assert d.tv.shape == (len(PROMPTS), LENGTH)
    assert d.tv.max() < 1e-9 and np.abs(d.kl).max() < 1e-9, (d.tv.max(), d.kl.max())
    assert 0 <= d.kept.min() and d.kept.max() <= 1 + 1e-12


@pytest.mark.parametrize("drafter, overrides", [("independent", plain_chain()), ("medusa", ()), ("pld", ())])
@pytest.mark.parametrize("verifier", LOSSY)
def test_lossy_rules_are_measured_off_the_target(drafter, overrides, verifier, tmp_path):
    """Typical, margin and top-k acceptance at T = 1 move the first token's law off p (the draft surer
    than the target: REJECTING), and the summary states it with its interval."""
    method, baseline = _engine(drafter, overrides, verifier, tmp_path)
    d = _measured(method, baseline)
    s = d.summary()
    assert s["tv_mean"] > 1e-3 and s["kl_mean"] > 1e-4, s
    assert s["tv_mean_ci_low"] <= s["tv_mean"] <= s["tv_mean_ci_high"]
    assert s["tv_q50"] <= s["tv_q90"] <= s["tv_q99"] <= s["tv_max"]
    assert s["positions"] == len(PROMPTS) * LENGTH


def test_chain_law_matches_the_quadratic_enumeration():
    """`chain_first_token_laws` (O(V) per position through `acceptance_all`) equals the law built one
    draft token at a time, for every rule, on random laws with zeros in them."""
    g = torch.Generator().manual_seed(0)
    p = torch.rand(3, 40, generator=g) ** 3
    p[:, :5] = 0
    q = torch.softmax(torch.randn(3, 40, generator=g) * 2, -1)
    for verifier in (RejectionVerifier(), TypicalVerifier(), MarginVerifier(), TopKVerifier()):
        laws, kept = chain_first_token_laws(verifier, p, q)
        for b in range(3):
            pb, qb = p[b].double() / p[b].double().sum(), q[b].double() / q[b].double().sum()
            slow = sum(qb[x] * _one_token(verifier, pb, x, qb) for x in range(40))
            assert torch.allclose(laws[b], slow, atol=1e-12), verifier.name
            a = torch.tensor([float(verifier.acceptance(pb[None], qb[None], torch.tensor([x]))[0]) for x in range(40)], dtype=torch.float64)
            assert abs(float(kept[b]) - float((qb * a).sum())) < 1e-12
        assert torch.allclose(first_token_law(verifier, p[0], q[0]), laws[0])


def _one_token(verifier, p, x, q):
    a = float(verifier.acceptance(p[None], q[None], torch.tensor([x]))[0])
    fallback = verifier.fallback(p, q).double()
    return a * torch.nn.functional.one_hot(torch.tensor(x), p.numel()).double() + (1 - a) * fallback / fallback.sum()


def test_relaxed_tree_law_reads_the_longest_passing_path():
    """A relaxed rule on a tree keeps the longest passing path: two passing root children, the second
    with a passing child, so the first token is the second child's, with probability 1."""
    p = torch.tensor([[0.4, 0.35, 0.25, 0.0], [0.1, 0.1, 0.1, 0.7], [0.0, 0.0, 0.1, 0.9], [0.25] * 4])
    tree = Draft(torch.tensor([0, 1, 3]), None, torch.tensor([-1, -1, 1]))
    law, kept = step_first_token_law(TopKVerifier(k=2), tree, p)
    assert kept == 1.0 and law.tolist() == [0.0, 1.0, 0.0, 0.0]
    law, kept = step_first_token_law(TopKVerifier(k=2), Draft(torch.tensor([2, 3]), None, torch.tensor([-1, 0])), p)
    assert kept == 0.0 and torch.allclose(law, p[0].double())
    with pytest.raises(SpecResearchError, match="sampled children"):
        step_first_token_law(TopKVerifier(k=2), Draft(torch.tensor([0, 1]), torch.full((2, 4), 0.25), torch.tensor([-1, -1])), p)


@pytest.mark.parametrize("verifier", [RejectionVerifier(), TypicalVerifier(), MarginVerifier(), TopKVerifier(k=2)],
                         ids=lambda v: v.name)
def test_a_sampled_tree_s_law_is_the_average_over_its_children_s_draws(verifier):
    """Root children drawn independently from their q rows: the O(mV) law equals the enumeration of every
    draw of the children (each draw's walk by `draft_first_token_law`, weighted by its probability); for
    rejection sampling it is p. Relaxed rules keep a longest path and are refused on sampled trees."""
    import itertools

    from specresearch.stats.exact import draft_first_token_law, sampled_children_law

    g = torch.Generator().manual_seed(1)
    p = torch.rand(6, generator=g) ** 2
    q = torch.softmax(torch.randn(3, 6, generator=g) * 1.5, -1)  # three root children, each from its own law
    parents = torch.tensor([-1, -1, -1])
    enumerated = torch.zeros(6, dtype=torch.float64)
    for xs in itertools.product(range(6), repeat=3):
        weight = float(torch.prod(torch.stack([q[j, x].double() for j, x in enumerate(xs)])))
        enumerated += weight * draft_first_token_law(verifier, Draft(torch.tensor(xs), q, parents), p)
    law, reach = sampled_children_law(verifier, Draft(torch.tensor([0, 1, 2]), q, parents), p)
    assert torch.allclose(law, enumerated, atol=1e-12) and 0 <= reach <= 1
    if verifier.lossless:
        assert torch.allclose(law, p.double() / p.double().sum(), atol=1e-12)
    siblings = Draft(torch.tensor([0, 1]), torch.stack([q[0], torch.nn.functional.one_hot(torch.tensor(1), 6).float()]),
                     torch.tensor([-1, -1]))
    with pytest.raises(SpecResearchError, match="siblings=N"):
        sampled_children_law(verifier, siblings, p)  # deterministic siblings of a draw: the drafter's rule is needed


@pytest.mark.parametrize("rule", [Siblings(2), Siblings(3, confidence=0.12), Siblings(5)], ids=repr)
@pytest.mark.parametrize("verifier", [RejectionVerifier(), TypicalVerifier(epsilon=0.3, delta=0.2)], ids=lambda v: v.name)
def test_a_sampled_token_s_siblings_are_averaged_over_its_draw(verifier, rule):
    """A chain token x ~ q with the rule's deterministic siblings beside it (the independent drafter's
    default at T > 0): the grouped O(n²V) law equals the enumeration of every draw x, each with the
    siblings the rule gives it, walked by `draft_first_token_law`; for rejection sampling it is p. A
    draft whose siblings are not the rule's is refused."""
    from specresearch.stats.exact import draft_first_token_law, sampled_children_law

    g = torch.Generator().manual_seed(4)
    p = torch.rand(7, generator=g) ** 2
    q = torch.softmax(torch.randn(7, generator=g) * 1.5, -1)
    q[6] = 0.0  # a token top-p removed: never a draw, never a sibling
    q = q / q.sum()

    def tree(x: int) -> Draft:
        others = rule.of(q, x)
        rows = torch.cat([q[None], torch.nn.functional.one_hot(others, 7).float()])
        return Draft(torch.cat([torch.tensor([x]), others]), rows, torch.full((1 + len(others),), -1))

    enumerated = sum(float(q[x]) * draft_first_token_law(verifier, tree(x), p) for x in range(7))
    drawn = int(q.argmax())  # the draw this step made: any x gives the same law
    law, reach = sampled_children_law(verifier, tree(drawn), p, rule)
    assert torch.allclose(law, enumerated, atol=1e-12) and 0 <= reach <= 1
    assert abs(float(law.sum()) - 1) < 1e-12
    if verifier.lossless:
        assert torch.allclose(law, p.double() / p.double().sum(), atol=1e-12)
    else:
        assert float((law - p.double() / p.double().sum()).abs().sum()) > 1e-3  # the lossy rule is measured, not p
    wrong = tree(drawn)
    wrong.tokens[1:] = torch.flip(wrong.tokens[1:], [0]) if len(wrong) > 2 else 6
    with pytest.raises(SpecResearchError, match="not the ones"):
        sampled_children_law(verifier, wrong, p, rule)


def test_kl_is_zero_on_equal_laws_and_positive_otherwise():
    p = torch.tensor([0.5, 0.5, 0.0])
    assert float(kl_divergence(p, p)) == 0.0
    assert float(kl_divergence(torch.tensor([1.0, 0.0, 0.0]), p)) == pytest.approx(np.log(2))


def test_distortion_refuses_greedy_decoding(tmp_path):
    method, baseline = _engine("pld", (), "typical", tmp_path, "sampling=greedy")
    with pytest.raises(SpecResearchError, match="temperature > 0"):
        distortion(method, PROMPTS, [[1] * LENGTH, [1] * LENGTH])


def test_exact_tv_agrees_with_the_batterys_estimate(tmp_path):
    """At the prompt's first position the method's first token (sample_first=False) follows the exact law:
    the battery's plug-in TV between the method's and the target's first tokens lies within its own noise
    (the 95th percentile of two samples of one law at these sizes) of the exact TV. (Two tokens are drawn,
    so the first step drafts; the first is tested.)"""
    method, baseline = _engine("independent", plain_chain(), "margin", tmp_path, "verifier.margin=0.5")
    prompt = PROMPTS[0]
    d = distortion(method, [prompt], continuations(baseline, [prompt], 2, seed=5), seed=5)
    exact = float(d.tv[0, 0])
    target, n, rows, sampling = method.kv.lm, 3000, 256, SamplingParams(temperature=1.0)
    base = baseline_samples(target, [prompt], n, 1, sampling, 11, rows)
    meth = [Samples(s.tokens[:, :1], s.prompt, s.seconds) for s in method_samples(method, [prompt], n, 2, 11, rows)]
    report = battery(Samples.concat(base), score(target, [prompt], base, sampling, 11, rows, 1),
                     Samples.concat(meth), score(target, [prompt], meth, sampling, 11, rows, 2), seed=11, tv=0.05)
    plug_in, noise = report.effects["tv_position"], report.effects["tv_position_null_q95"]
    assert exact > 0.05, exact  # a visible effect: margin 0.5 keeps draft tokens the target finds less likely
    assert abs(plug_in - exact) <= noise, (plug_in, exact, noise)


def test_the_law_at_other_temperatures_is_the_targets_own(tmp_path):
    """`temperatures`: a lossless pair's step law is the target's at T = 1 (TV 0 there, so T' = 1 is the nearest), and its
    TV to the target at T' = 0.5 and 2 is the TV between the target's own laws at 1 and at T', as plain decoding
    computes them at T' (softmax(logits / T'), not the power family the measure uses)."""
    method, baseline = _engine("independent", plain_chain(), "rejection", tmp_path)
    texts = continuations(baseline, PROMPTS, LENGTH, seed=3)
    d = distortion(method, PROMPTS, texts, seed=3, temperatures=(0.5, 1.0, 2.0))
    assert d.tv_at.shape == (len(PROMPTS), LENGTH, 3)
    for b, (prompt, text) in enumerate(zip(PROMPTS, texts)):
        at = {t: one_query_laws(method.kv.lm, prompt, text, SamplingParams(temperature=t)).double() for t in (0.5, 1.0, 2.0)}
        for s, t in enumerate((0.5, 1.0, 2.0)):
            expected = 0.5 * (at[1.0] - at[t]).abs().sum(-1)  # [L]
            assert np.allclose(d.tv_at[b, :, s], expected.numpy(), atol=1e-5), (t, d.tv_at[b, :, s], expected)
    s = d.summary()
    assert s["nearest_temperature"] == 1.0 and s["nearest_tv_mean"] < 1e-9 and s["nearest_closer"] == 0.0
    assert s["tv_mean_at_0.5"] > 1e-3 and s["tv_mean_at_2"] > 1e-3


def test_a_sharpened_law_is_found_at_its_temperature():
    """The law softmax(2 z) of logits z is the target's at T / 2: TV 0 to the power 2 and positive to the others; the
    nearest temperature over positions is the one every position is nearest to, with the share of positions nearer."""
    z = torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    p, sharp = torch.softmax(z, -1), torch.softmax(2 * z, -1)
    tv = tv_to_powers(sharp, p, [1.0, 2.0, 4.0])
    assert tv[1] < 1e-12 and tv[0] > 0.05 and tv[2] > 0.01
    d = Distortion(tv=np.full((2, 3), tv[0]), kl=np.zeros((2, 3)), kept=np.zeros((2, 3)),
                   tv_at=np.tile(np.array(tv), (2, 3, 1)), temperatures=(0.7, 0.35, 0.175))
    s = d.summary()
    assert s["nearest_temperature"] == 0.35 and s["nearest_tv_mean"] < 1e-12 and s["nearest_closer"] == 1.0
    assert s["tv_mean_at_0.7"] == pytest.approx(tv[0])


def test_other_temperatures_are_refused_under_truncation(tmp_path):
    method, baseline = _engine("pld", (), "typical", tmp_path, "sampling.top_k=5")
    with pytest.raises(SpecResearchError, match="without top-k or top-p"):
        distortion(method, PROMPTS, [[1] * LENGTH, [1] * LENGTH], temperatures=(0.5,))
