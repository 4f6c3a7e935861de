"""Relaxed verifiers (typical, margin, top-k): their single-step output law by enumeration — equal to
p where the rule reduces to exact verification (temperature 0), different from p where theory says
it must — the real code path against that law (G-test), greedy exactness in the engine, and errors."""

import numpy as np
import pytest
import torch
from scipy.stats import power_divergence

from specresearch.drafters import LookaheadDrafter, NoDrafter
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.stats import first_token_law, single_step_tv
from specresearch.types import Draft, SamplingParams
from specresearch.verifiers import GreedyVerifier, MarginVerifier, TopKVerifier, TypicalVerifier
from tests.tiny import plain_chain

V = 8
GEN = torch.Generator().manual_seed(1)
P = torch.softmax(1.5 * torch.randn(V, generator=GEN, dtype=torch.float64), -1)  # a T > 0 target law
Q = torch.softmax(1.5 * torch.randn(V, generator=GEN, dtype=torch.float64), -1)  # a draft law
ONE_HOT = torch.zeros(V, dtype=torch.float64).index_fill_(0, torch.tensor([5]), 1.0)  # p at temperature 0

EXACT_AT_T0 = {  # settings at which each rule keeps only the target's argmax of a one-hot p
    "typical": TypicalVerifier(),
    "margin": MarginVerifier(margin=0.1),
    "margin ratio": MarginVerifier(margin=None, ratio=0.5),
    "margin 1": MarginVerifier(margin=1.0),  # max p − 1 = 0: only p(x) > 0 keeps it exact
    "ratio 1": MarginVerifier(margin=None, ratio=1.0),
    "topk 1": TopKVerifier(k=1),
    "topk V": TopKVerifier(k=V),
}
LOOSE = {"typical": TypicalVerifier(), "margin": MarginVerifier(margin=0.2), "topk 3": TopKVerifier(k=3)}


def output_law(verifier, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Exact law of the first emitted token when the draft token x ~ q."""
    return first_token_law(verifier, p, q)


def accepts(verifier, p: torch.Tensor) -> torch.Tensor:
    """[V] bool: whether each token would be kept as a draft token under p."""
    return verifier.acceptance(p.expand(V, V), p.expand(V, V), torch.arange(V)).bool()


@pytest.mark.parametrize("name", EXACT_AT_T0)
def test_exact_at_temperature_zero(name):
    verifier = EXACT_AT_T0[name]
    for x in range(V):  # any draft token, deterministic or sampled
        torch.testing.assert_close(first_token_law(verifier, ONE_HOT, x=x), ONE_HOT)
    torch.testing.assert_close(output_law(verifier, ONE_HOT, Q), ONE_HOT)
    assert single_step_tv(verifier, ONE_HOT) < 1e-12


def test_rules_accept_what_theory_says():
    order = torch.argsort(P, descending=True)
    accepted = {name: accepts(v, P) for name, v in LOOSE.items()}
    assert set(torch.nonzero(accepted["topk 3"]).flatten().tolist()) == set(order[:3].tolist())
    assert torch.equal(accepted["margin"], P >= P.max() - 0.2)
    entropy = -(P * P.log()).sum()
    assert torch.equal(accepted["typical"], P > min(0.09, 0.3 * float(torch.exp(-entropy))))
    assert accepted["typical"].any() and not accepted["typical"].all()


@pytest.mark.parametrize("name", LOOSE)
def test_lossy_at_positive_temperature(name):
    """A loose rule keeps unlikely-under-p tokens the draft favours: the output law moves toward q."""
    law = output_law(LOOSE[name], P, Q)
    assert law.sum() == pytest.approx(1.0)
    assert single_step_tv(LOOSE[name], P, Q) > 0.02
    # with a deterministic draft too: some draft token moves the law away from p
    assert single_step_tv(LOOSE[name], P) > 0.02


@pytest.mark.parametrize("name", LOOSE)
def test_code_path_follows_the_enumerated_law(name):
    """20 000 one-token drafts x ~ q through __call__; the first emitted token's histogram fits the
    enumerated law (G-test), so the enumeration describes the code that runs."""
    verifier, n = LOOSE[name], 20_000
    rng = torch.Generator().manual_seed(7)
    p = torch.stack([P, P]).float()  # [K + 1, V]
    xs = torch.multinomial(Q.float(), n, replacement=True, generator=rng)
    first = [int(verifier(Draft(tokens=x[None]), p, rng).tokens[0]) for x in xs]
    observed = np.bincount(first, minlength=V)
    expected = output_law(verifier, P, Q).numpy() * n
    assert power_divergence(observed, expected, lambda_="log-likelihood").pvalue > 1e-3


@pytest.mark.parametrize("name", LOOSE)
def test_a_tree_draft_with_no_nodes_gets_the_targets_token(name):
    """Lookahead's first steps propose a tree with no node (an empty pool): the target adds its token."""
    empty_tree = Draft(tokens=torch.empty(0, dtype=torch.long), parents=torch.empty(0, dtype=torch.long))
    verdict = LOOSE[name](empty_tree, ONE_HOT[None].float(), None)
    assert verdict.num_accepted == 0 and verdict.path == [] and verdict.tokens.tolist() == [5]


def test_verdict_shape_and_recover_greedy():
    p = torch.stack([P, P, P]).float()  # [K + 1, V]
    top = int(P.argmax())
    verdict = TopKVerifier(k=1, recover="greedy")(Draft(tokens=torch.tensor([top, (top + 1) % V])), p, None)
    assert verdict.num_accepted == 1 and verdict.tokens.tolist() == [top, top]
    empty = TypicalVerifier(recover="greedy")(Draft(tokens=torch.empty(0, dtype=torch.long)), p[:1], None)
    assert empty.num_accepted == 0 and empty.tokens.tolist() == [top]


@pytest.mark.parametrize("verifier", [*EXACT_AT_T0.values(), TypicalVerifier(recover="greedy")])
def test_greedy_runs_equal_the_baseline_where_the_rule_is_exact(verifier, target, close_draft):
    draft = close_draft
    greedy = SamplingParams()
    engine = Engine(target, plain_chain(target, k=3, model=draft), verifier, greedy)
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), greedy)
    for prompt in ([1, 2, 3], [40, 41, 42, 43, 44]):
        out = engine.generate(prompt, 30, eos_token_ids=[])
        assert out.tokens == baseline.generate(prompt, 30, eos_token_ids=[]).tokens
        assert 0 < out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("name", EXACT_AT_T0)
def test_lookahead_trees_at_temperature_zero_equal_the_baseline(name):
    """Lookahead proposes empty trees until its pool fills; every relaxed rule then runs on its trees."""
    from tests.tiny import cyclic_tiny

    target = cyclic_tiny(seed=3)
    engine = Engine(target, LookaheadDrafter(window=4, ngram=3, guesses=4), EXACT_AT_T0[name], SamplingParams())
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    out = engine.generate([10, 11, 12], 24, eos_token_ids=[])
    assert out.tokens == baseline.generate([10, 11, 12], 24, eos_token_ids=[]).tokens
    assert out.stats.accepted > 0


def test_errors_name_the_valid_choices():
    with pytest.raises(SpecResearchError, match="valid are sample, greedy"):
        TypicalVerifier(recover="argmax")
    with pytest.raises(SpecResearchError, match="exactly one of margin"):
        MarginVerifier(margin=0.1, ratio=0.5)
    with pytest.raises(SpecResearchError, match="margin must lie in"):
        MarginVerifier(margin=1.5)
    with pytest.raises(SpecResearchError, match="k >= 1"):
        TopKVerifier(k=0)
    with pytest.raises(SpecResearchError, match="0 < epsilon <= 1"):
        TypicalVerifier(epsilon=0)


def test_rule_temperature_makes_a_lossy_greedy_method(target, far_draft):
    """Greedy decoding whose rule reads the target's T = 1 law: every kept token is among the target's
    top 3 logits after its prefix (teacher forcing), the added tokens are argmaxes, and the output
    leaves plain greedy on some prompt; with k = 1 it is plain greedy again."""
    draft = far_draft
    greedy = SamplingParams()
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), greedy)

    def engine(k: int) -> Engine:
        verifier = TopKVerifier(k=k, recover="greedy", rule_temperature=1.0)
        return Engine(target, plain_chain(target, k=4, model=draft), verifier, greedy)

    lossy, exact, differs = engine(3), engine(1), 0
    for prompt in ([1, 2, 3], [40, 41, 42, 43, 44], [7, 7, 9], [200, 100, 50]):
        out = lossy.generate(prompt, 30, eos_token_ids=[])
        plain = baseline.generate(prompt, 30, eos_token_ids=[]).tokens
        differs += out.tokens != plain
        with torch.inference_mode():
            logits = target.model(torch.tensor([prompt + out.tokens])).logits[0, len(prompt) - 1 : -1]  # [N, V]
        top3 = torch.topk(logits, 3, dim=-1).indices  # [N, 3]
        assert all(tok in row for tok, row in zip(out.tokens, top3.tolist()))
        assert exact.generate(prompt, 30, eos_token_ids=[]).tokens == plain
    assert differs > 0


def test_rule_temperature_is_for_greedy_decoding_only():
    with pytest.raises(SpecResearchError, match="recover=greedy"):
        TopKVerifier(k=3, rule_temperature=1.0).check_sampling(SamplingParams())
    with pytest.raises(SpecResearchError, match="rule_temperature=null"):
        TopKVerifier(k=3, recover="greedy", rule_temperature=1.0).check_sampling(SamplingParams(temperature=1.0))
    with pytest.raises(SpecResearchError, match="must be > 0"):
        MarginVerifier(rule_temperature=0)
