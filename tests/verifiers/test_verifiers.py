"""Verifiers on fixed small-vocabulary p and q: exact output laws, then Monte Carlo through the real
code path with a G-test powerful enough to see a total-variation error of 0.02 (STATS.md)."""

import numpy as np
import pytest
import torch
from scipy.stats import chi2, ncx2, power_divergence

from specresearch.errors import SpecResearchError
from specresearch.stats import acceptance_rate, first_token_law, single_step_tv
from specresearch.types import Draft, SamplingParams
from specresearch.verifiers import GreedyVerifier, RejectionVerifier

V = 8
ALPHA = 1e-3  # significance of each Monte Carlo test (CI: fixed seeds, small alpha)
N = 40_000  # draws per Monte Carlo test; see test_monte_carlo_power


def law(x: list[float]) -> torch.Tensor:
    t = torch.tensor(x, dtype=torch.float64)
    return t / t.sum()


def random_law(gen: torch.Generator, peak: float = 2.0) -> torch.Tensor:
    return torch.softmax(peak * torch.randn(V, generator=gen, dtype=torch.float64), -1)


GEN = torch.Generator().manual_seed(0)
CASES = {
    "random": (random_law(GEN), random_law(GEN)),
    "q equals p": (law([1, 2, 3, 4, 5, 6, 7, 8]),) * 2,
    "disjoint supports": (law([1, 1, 1, 1, 0, 0, 0, 0]), law([0, 0, 0, 0, 1, 2, 3, 4])),
    "one-hot p": (law([0, 0, 1, 0, 0, 0, 0, 0]), random_law(GEN)),
    "q = 0 where p > 0": (law([3, 1, 1, 1, 1, 1, 1, 1]), law([0, 0, 0, 1, 1, 1, 1, 1])),
    "ties": (law([2, 2, 2, 2, 0, 0, 0, 0]), law([1, 1, 1, 1, 1, 1, 1, 1])),
}


@pytest.mark.parametrize("case", CASES)
def test_rejection_exact_law_is_p(case):
    p, q = CASES[case]
    torch.testing.assert_close(first_token_law(RejectionVerifier(), p, q), p, atol=1e-12, rtol=0)
    assert single_step_tv(RejectionVerifier(), p, q) < 1e-6
    # Leviathan et al.: the acceptance rate is 1 − TV(p, q) = Σ min(p, q).
    assert acceptance_rate(RejectionVerifier(), p, q) == pytest.approx(float(torch.minimum(p, q).sum()), abs=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_rejection_exact_law_deterministic_draft(case):
    """q = None (one-hot draft): for every fixed draft token x the output law is p."""
    p, _ = CASES[case]
    for x in range(V):
        torch.testing.assert_close(first_token_law(RejectionVerifier(), p, x=x), p, atol=1e-12, rtol=0)
    assert single_step_tv(RejectionVerifier(), p) < 1e-6


def test_exact_law_tells_a_biased_rule():
    """The enumeration is not blind: the draft's own law (accept everything) is q, not p."""
    p, q = CASES["random"]

    class AlwaysAccept(RejectionVerifier):
        lossless = False

        def acceptance(self, p, q, x):
            return torch.ones(x.shape, dtype=p.dtype)

    torch.testing.assert_close(first_token_law(AlwaysAccept(), p, q), q)
    assert single_step_tv(AlwaysAccept(), p, q) == pytest.approx(float((p - q).abs().sum() / 2))


def test_monte_carlo_power():
    """N draws give power >= 0.99 against any output law at TV >= 0.02 from p (w² >= 4 TV²)."""
    w2 = 4 * 0.02**2
    power = ncx2.sf(chi2.isf(ALPHA, V - 1), V - 1, N * w2)
    assert power >= 0.99


def g_test(counts: np.ndarray, p: np.ndarray) -> float:
    keep = p > 0
    assert counts[~keep].sum() == 0, "a token with p = 0 was emitted"
    return power_divergence(counts[keep], counts.sum() * p[keep], lambda_="log-likelihood").pvalue


def draw_first_tokens(p, q, deterministic: bool, seed: int) -> np.ndarray:
    verifier, rng = RejectionVerifier(), torch.Generator().manual_seed(seed)
    P = torch.stack([p, p]).float()  # [K+1, V] with K = 1
    counts = np.zeros(V, dtype=np.int64)
    xs = torch.multinomial(q.float(), N, replacement=True, generator=rng)
    for x in xs:
        draft = Draft(tokens=x[None], q=None if deterministic else q.float()[None])
        counts[int(verifier(draft, P, rng).tokens[0])] += 1
    return counts


@pytest.mark.e2e  # Monte Carlo (the exact enumerations of test_lossless and test_relaxed stay in the core)
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled q", "q=None"])
def test_rejection_monte_carlo_follows_p(deterministic):
    p, q = CASES["random"]
    counts = draw_first_tokens(p, q, deterministic, seed=1)
    assert g_test(counts, p.numpy()) > ALPHA


def test_monte_carlo_detects_a_biased_rule():
    """Positive control for the harness: the draft's own law q is rejected by the same test."""
    p, q = CASES["random"]
    counts = np.random.default_rng(0).multinomial(N, q.numpy())
    assert g_test(counts, p.numpy()) < ALPHA


@pytest.mark.e2e  # Monte Carlo
def test_rejection_chain_follows_p_at_every_position():
    """K = 3 with a different p and q at each position: conditional on being emitted, the token at
    position j follows p_j (an off-by-one between positions would fail)."""
    K, gen = 3, torch.Generator().manual_seed(2)
    P = torch.stack([random_law(gen, 1.0) for _ in range(K + 1)])  # [K+1, V]
    Q = torch.stack([(0.6 * P[i] + 0.4 * random_law(gen, 1.0)) for i in range(K)])  # [K, V]
    verifier, rng = RejectionVerifier(), torch.Generator().manual_seed(3)
    counts = np.zeros((K + 1, V), dtype=np.int64)
    draws = torch.stack([torch.multinomial(Q[i].float(), N, replacement=True, generator=rng) for i in range(K)], 1)
    for xs in draws:  # [K]
        verdict = verifier(Draft(tokens=xs, q=Q.float()), P.float(), rng)
        for j, tok in enumerate(verdict.tokens.tolist()):
            counts[j, tok] += 1
    assert counts[K].sum() > 1000  # the bonus position is reached often enough to be tested
    pvalues = [g_test(counts[j], P[j].numpy()) for j in range(K + 1)]
    assert min(pvalues) > ALPHA / (K + 1), pvalues  # Bonferroni over positions


def test_rejection_bonus_token_when_all_accepted():
    p = torch.eye(V)[[1, 2, 3]].float()  # [3, V] one-hot target: accept 1, 2 then bonus 3
    verdict = RejectionVerifier()(Draft(tokens=torch.tensor([1, 2])), p, torch.Generator().manual_seed(0))
    assert verdict.num_accepted == 2 and verdict.tokens.tolist() == [1, 2, 3]


def test_greedy_verifier_longest_matching_prefix():
    p = torch.eye(V)[[5, 6, 7, 1]].float()  # target argmax 5, 6, 7, then bonus 1
    verify = GreedyVerifier()
    cases = {(5, 6, 7): [5, 6, 7, 1], (5, 6, 0): [5, 6, 7], (0, 6, 7): [5], (5, 0, 7): [5, 6]}
    for draft, expected in cases.items():
        verdict = verify(Draft(tokens=torch.tensor(draft)), p)
        assert verdict.tokens.tolist() == expected
        assert verdict.num_accepted == len(expected) - 1
    assert verify(Draft(tokens=torch.empty(0, dtype=torch.long)), p[:1]).tokens.tolist() == [5]


def test_greedy_verifier_refuses_sampling():
    with pytest.raises(SpecResearchError, match="verifier=rejection"):
        GreedyVerifier().check_sampling(SamplingParams(temperature=0.7))


def _random_draft(gen: torch.Generator, tree: bool) -> Draft:
    """A chain or a tree of 1-6 tokens of a 5-token vocabulary (so argmax matches are common), with
    a sibling group that may repeat a token."""
    k = int(torch.randint(1, 7, (1,), generator=gen))
    tokens = torch.randint(0, 5, (k,), generator=gen)
    if not tree:
        return Draft(tokens=tokens)
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, k)]  # each node's parent comes before it
    return Draft(tokens=tokens, parents=torch.tensor(parents))


@pytest.mark.parametrize("name", ["greedy", "rejection", "typical", "margin", "topk"])
def test_argmax_verdicts_are_the_verifiers_own_at_temperature_0(name):
    """At T = 0 the engine decides from the target's argmax alone (Verifier.verify_argmax): the verdicts equal the
    verifier's own on one-hot laws, for chains and trees, in a batch of mixed rows; typical with
    epsilon = delta = 1 (which accepts nothing) opts out."""
    from omegaconf import OmegaConf

    from specresearch.build import build
    from specresearch.config import CONF_DIR
    verifier = build(OmegaConf.load(CONF_DIR / "verifier" / f"{name}.yaml"))  # each as its config makes it
    greedy = SamplingParams()
    assert verifier.argmax_path(greedy) and not verifier.argmax_path(SamplingParams(temperature=1.0))
    gen = torch.Generator().manual_seed(1)
    for trial in range(60):
        drafts = [_random_draft(gen, tree=bool(trial % 2) and b != 1) for b in range(3)]
        width = 1 + max(len(d) for d in drafts)
        top = torch.randint(0, 5, (3, width), generator=gen)  # [B, W] the target's argmax
        p = torch.nn.functional.one_hot(top, 5).float()  # [B, W, V]
        own = verifier.verify_rows(drafts, p, [torch.Generator().manual_seed(trial)] * 3)
        fast = verifier.verify_argmax(drafts, top)
        for a, b in zip(own, fast):
            assert a.tokens.tolist() == b.tokens.tolist() and a.num_accepted == b.num_accepted and a.path == b.path
    if name == "typical":
        from specresearch.verifiers import TypicalVerifier

        assert not TypicalVerifier(epsilon=1.0, delta=1.0).argmax_path(greedy)
