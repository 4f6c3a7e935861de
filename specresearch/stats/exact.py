"""Exact single-step laws: what a verifier emits first, by enumeration over the draft token.

For one draft token x ~ q followed by the verifier's decision, the first emitted token has the law

    Σ_x q(x) [a(x) δ_x + (1 − a(x)) f(p, q_x)]

with a = `Verifier.acceptance` and f = `Verifier.fallback` (q_x = q for a sampled draft, one-hot x
for a deterministic one). Lossless ⇔ this equals p for every p and q; for a lossy rule its total
variation to p is the rule's effect size at that step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from specresearch.types import Draft
from specresearch.verifiers.base import Verifier, draft_law, one_hot


def first_token_law(verifier: Verifier, p: Tensor, q: Tensor | None = None, x: int | None = None) -> Tensor:
    """The exact law of the first token a verifier emits after a one-token draft.

    Args:
        verifier: any chain verifier.
        p: [V] the target's law at the draft position.
        q: [V] the law the draft token is drawn from; None for a deterministic draft, then give `x`.
        x: the deterministic draft token (with q = None).

    Returns:
        [V] float64 probabilities.
    """
    p = p.double()
    if q is None:
        if x is None:
            raise ValueError("first_token_law needs q (a sampled draft) or x (a deterministic one)")
        qx = one_hot(torch.tensor([x]), p.numel()).double()  # [1, V]
        a = verifier.acceptance(p[None], qx, torch.tensor([x]))[0]
        return a * qx[0] + (1 - a) * _normalised(verifier.fallback(p, qx[0]))
    q = _normalised(q)  # the law the draft token is drawn from (multinomial normalises)
    v = p.numel()
    a = verifier.acceptance(p.expand(v, v), q.expand(v, v), torch.arange(v))  # [V] a(x) for every x
    return q * a + (q * (1 - a)).sum() * _normalised(verifier.fallback(p, q))


def acceptance_rate(verifier: Verifier, p: Tensor, q: Tensor) -> float:
    """Σ_x q(x) a(x): the probability that a one-token draft x ~ q is kept (1 − TV(p, q) for rejection sampling)."""
    p, q = p.double(), _normalised(q)
    v = p.numel()
    return float((q * verifier.acceptance(p.expand(v, v), q.expand(v, v), torch.arange(v))).sum())


def sibling_law(
    verifier: Verifier, p: Tensor, xs: list[int] | None = None, q: Tensor | None = None, m: int = 0
) -> Tensor:
    """The exact law of the token a tree verifier emits at a node whose children are tried in turn
    (multi-step speculative sampling): after a rejection the next child faces fallback(p, q).

    Args:
        verifier: any verifier.
        p: [V] the target's law at the node.
        xs: deterministic children, in the order they are tried (q = None).
        q: [V] the law m children were drawn from, independently (SpecInfer's sampled siblings).
        m: the number of sampled children.

    Returns:
        [V] float64 probabilities; p for a lossless rule.
    """
    law, reach, cur = torch.zeros_like(p, dtype=torch.float64), 1.0, p.double()
    v = p.numel()
    tries = [one_hot(torch.tensor([x]), v).double()[0] for x in xs] if q is None else [_normalised(q)] * m
    for qi in tries:
        a = verifier.acceptance(cur.expand(v, v), qi.expand(v, v), torch.arange(v)).double()  # [V] a(x) for every x
        law += reach * qi * a
        reach *= float((qi * (1 - a)).sum())
        cur = _normalised(verifier.fallback(cur, qi))
    return law + reach * (cur if tries else _normalised(verifier.fallback(cur, None)))


def draft_first_token_law(verifier: Verifier, draft: Draft, p: Tensor) -> Tensor:
    """The exact law of the first token a verifier emits for one drafted chain or tree, given its
    tokens: the root's children (a chain's first token; a tree's nodes whose parent is the root) are
    tried in turn, child x accepted with probability `acceptance(cur, q_x, x)`, and after its rejection
    cur ← `fallback(cur, q_x)` (multi-step speculative sampling; for a chain, one child); when every
    child is rejected the token comes from cur (from `fallback(p, None)` if there is no child).
    Averaged over the drafter's own draws of the draft (q_x: the law it reports for node x,
    normalised as a draw normalises it; one-hot for a deterministic node), a lossless pair gives p.

    Args:
        verifier: any verifier.
        draft: one row's draft (tokens, q or None, parents or None).
        p: [V] the target's law after the last committed token (need not be normalised: it is, first).

    Returns:
        [V] float64 probabilities.
    """
    p = _normalised(p)
    kids = root_children(draft)
    x = draft.tokens[: len(draft)].to(p.device)  # [N]
    q = draft_law(Draft(x, draft.q), p)  # [N, V]
    q = q / q.sum(-1, keepdim=True)  # as the draws normalise it (float32 laws sum to 1 within ~1e-7)
    law, reach, cur = torch.zeros_like(p), 1.0, p
    for c in kids:
        a = float(verifier.acceptance(cur[None], q[c : c + 1], x[c : c + 1])[0])
        law[x[c]] += reach * a
        reach *= 1.0 - a
        cur = _normalised(verifier.fallback(cur, q[c]))
    return law + reach * (cur if kids else _normalised(verifier.fallback(cur, None)))


def root_children(draft: Draft) -> list[int]:
    """The nodes a verifier tries first, in order: a chain's first token, a tree's children of the root."""
    k = len(draft)
    return ([0] if k else []) if draft.parents is None else [i for i, parent in enumerate(draft.parents[:k].tolist()) if parent < 0]


def total_variation(a: Tensor, b: Tensor) -> float:
    """½ Σ |a − b| over the last dimension (laws given as tensors of the same shape)."""
    return float((a.double() - b.double()).abs().sum(-1).max()) / 2


def single_step_tv(verifier: Verifier, p: Tensor, q: Tensor | None = None) -> float:
    """TV(first emitted token's law, p): 0 for a lossless verifier (up to float error). With q = None
    (a deterministic draft) the worst case over every draft token x."""
    if q is not None:
        return total_variation(first_token_law(verifier, p, q), p)
    return max(total_variation(first_token_law(verifier, p, x=x), p) for x in range(p.numel()))


def _normalised(law: Tensor) -> Tensor:
    law = law.double()
    return law / law.sum()
