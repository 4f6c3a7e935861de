"""Tree drafts: the KV wrapper's tree mask and path selection (fp32 tiny model), and multi-step
speculative sampling at a node with several children: its exact law by enumeration, and the real
code path against that law (G-test)."""

import numpy as np
import pytest
import torch
from scipy.stats import power_divergence

from specresearch.kv import CachedLM
from specresearch.stats import sibling_law, total_variation
from specresearch.types import Draft, node_depths
from specresearch.verifiers import GreedyVerifier, RejectionVerifier, TypicalVerifier
from tests.tiny import tiny_model

PROMPT = torch.tensor([3, 141, 59, 26, 53, 58, 97])
FED = torch.tensor([11, 12, 13, 14, 15, 16])  # a root and five nodes
PARENTS = torch.tensor([-1, 0, 0, 1, 3, 2])  # root → {1, 2}; 1 → 3 → 4; 2 → 5
PATHS = [[0, 1, 3, 4], [0, 2, 5], [0, 2]]


def prefilled(lm, tokens: torch.Tensor) -> CachedLM:
    kv = CachedLM(lm)
    kv.reset()
    kv.prefill_rows([tokens])
    return kv


@torch.inference_mode()
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_logits_equal_each_path_decoded_as_a_chain(attention):
    lm = tiny_model()
    lm.model.set_attn_implementation(attention)
    assert lm.model.config._attn_implementation == attention
    tree = prefilled(lm, PROMPT).forward_rows([FED], [PARENTS])[0]  # [6, V]
    for path in PATHS:
        chain = prefilled(lm, PROMPT).forward_rows([FED[path]], [None])[0]
        torch.testing.assert_close(tree[path], chain, atol=1e-4, rtol=0)
    # the mask matters: without it, node 2 would see node 1 and its logits would differ
    flat = prefilled(lm, PROMPT).forward_rows([FED], [None])[0]
    assert (flat[2] - tree[2]).abs().max() > 1e-3


@torch.inference_mode()
@pytest.mark.parametrize("rows", [[0, 2, 5], [0, 1, 3], [0]])
def test_kept_path_equals_a_fresh_prefill(target, rows):
    kv = prefilled(target, PROMPT)
    kv.forward_rows([FED], [PARENTS])
    kv.keep_rows([rows])
    fresh = prefilled(target, torch.cat([PROMPT, FED[rows]]))
    assert kv.length == fresh.length == PROMPT.numel() + len(rows)
    for ours, theirs in zip(kv.cache.layers, fresh.cache.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours.values, theirs.values, atol=1e-5, rtol=0)
    nxt = torch.tensor([77])
    torch.testing.assert_close(kv.forward_rows([nxt], [None])[0], fresh.forward_rows([nxt], [None])[0], atol=1e-4, rtol=0)


def test_node_depths():
    assert node_depths(PARENTS[1:] - 1) == [1, 1, 2, 3, 2]
    draft = Draft(tokens=FED[1:], parents=PARENTS[1:] - 1)
    assert draft.depth == 3 and len(draft) == 5
    assert Draft(tokens=FED[1:], parents=PARENTS[1:] - 1, scratch=2).depth == 2  # scratch nodes are not proposals
    with pytest.raises(ValueError, match="parents"):
        Draft(tokens=FED, scratch=1)


V = 6
GEN = torch.Generator().manual_seed(3)
P = torch.softmax(2 * torch.randn(V, generator=GEN, dtype=torch.float64), 0)
Q = torch.softmax(torch.randn(V, generator=GEN, dtype=torch.float64), 0)
CHILDREN = [[0], [4, 1], [2, 2, 3], [5, 4, 3, 2, 1, 0], [int(P.argmax()), 1]]


@pytest.mark.parametrize("xs", CHILDREN)
def test_mss_with_deterministic_children_is_lossless(xs):
    """Try children in turn, accept x w.p. p(x), zero it and renormalise on a rejection: the emitted
    token follows p exactly, duplicates and all."""
    assert total_variation(sibling_law(RejectionVerifier(), P, xs=xs), P) < 1e-12


@pytest.mark.parametrize("m", [1, 2, 3])
def test_mss_with_sampled_children_is_lossless(m):
    assert total_variation(sibling_law(RejectionVerifier(), P, q=Q, m=m), P) < 1e-12


def test_tree_rules_that_are_not_lossless_are_detected():
    """The enumeration is not blind: greedy at T > 0 gives the argmax, typical moves the law."""
    assert sibling_law(GreedyVerifier(), P, xs=[1, 2]).argmax() == P.argmax()
    assert total_variation(sibling_law(GreedyVerifier(), P, xs=[1, 2]), P) > 0.1
    assert total_variation(sibling_law(TypicalVerifier(), P, xs=[int(P.argmax()), 1]), P) > 0.02


@pytest.mark.e2e  # Monte Carlo: 20,000 trees per case
@pytest.mark.parametrize("xs", [[4, 1], [int(P.argmax()), 2, 2]])
def test_tree_code_path_follows_the_exact_law(xs):
    """20 000 trees of deterministic siblings through Verifier.__call__: the first token fits the
    enumerated law (G-test), and an accepted child's own child is tried next."""
    verifier, n, rng = RejectionVerifier(), 20_000, torch.Generator().manual_seed(11)
    m = len(xs)
    tokens = torch.tensor([*xs, 0])  # a grandchild (token 0) under the first child
    parents = torch.tensor([-1] * m + [0])
    p = torch.stack([P] * (m + 2)).float()  # [N + 1, V]: the same law at every node
    first, second = [], []
    for _ in range(n):
        verdict = verifier(Draft(tokens=tokens, parents=parents), p, rng)
        first.append(int(verdict.tokens[0]))
        if verdict.path and verdict.path[0] == 0:
            second.append(int(verdict.tokens[1]))
    observed = np.bincount(first, minlength=V)
    assert power_divergence(observed, sibling_law(verifier, P, xs=xs).numpy() * n, lambda_="log-likelihood").pvalue > 1e-3
    # after the first child, a single deterministic grandchild: the second token also follows p
    observed = np.bincount(second, minlength=V)
    assert power_divergence(observed, P.numpy() * len(second), lambda_="log-likelihood").pvalue > 1e-3


def test_greedy_tree_keeps_the_longest_argmax_path():
    logits = torch.full((6, V), -5.0)
    best = [2, 0, 4, 1, 5, 3]  # row 0: the argmax after the root; row i + 1: after node i
    logits[torch.arange(6), best] = 5.0
    p = torch.softmax(logits, -1)
    tokens = torch.tensor([3, 2, 1, 4, 0])  # root → 3 (no), 2 (yes); 2 → 1 (no), 4 (yes); 4 → 0 (no)
    parents = torch.tensor([-1, -1, 1, 1, 3])
    verdict = GreedyVerifier()(Draft(tokens=tokens, parents=parents), p, None)
    assert verdict.path == [1, 3] and verdict.num_accepted == 2
    assert verdict.tokens.tolist() == [2, 4, 5]  # then the argmax after node 3


def test_enumerated_draws_weigh_every_outcome_by_its_probability():
    """tests/draws.py, the law tests' exact enumeration: every outcome of a multinomial call, with and
    without replacement, weighed by its probability (sequential draws renormalise without replacement),
    and a chain's `sample` in a drafter module replayed too; a draw's outcome set depends on earlier ones."""
    from specresearch import sampling
    from specresearch.drafters import base
    from tests.draws import enumerated

    law = torch.tensor([0.5, 0.0, 0.3, 0.2])
    with_replacement = dict((tuple(xs), w) for w, xs in enumerated(lambda: torch.multinomial(law, 2, replacement=True).tolist()))
    assert len(with_replacement) == 9 and with_replacement[(0, 2)] == pytest.approx(0.15)
    without = dict((tuple(xs), w) for w, xs in enumerated(lambda: torch.multinomial(law, 2, replacement=False).tolist()))
    assert len(without) == 6 and without[(0, 2)] == pytest.approx(0.5 * 0.3 / 0.5) and without[(2, 0)] == pytest.approx(0.3 * 0.5 / 0.7)
    assert sum(without.values()) == pytest.approx(1, abs=1e-12)

    def chain() -> tuple[int, int]:  # the second draw's law depends on the first token
        x = int(base.sample(law, None))
        return x, int(base.sample(torch.tensor([1.0, 1.0]) if x == 0 else torch.tensor([0.0, 1.0]), None))

    paths = dict((xs, w) for w, xs in enumerated(chain))
    assert paths == pytest.approx({(0, 0): 0.25, (0, 1): 0.25, (2, 1): 0.3, (3, 1): 0.2})
    assert base.sample is sampling.sample and torch.multinomial is torch._C._VariableFunctions.multinomial  # restored
