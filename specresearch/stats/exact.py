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

from specresearch.errors import SpecResearchError
from specresearch.types import Draft, Siblings
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
        q = one_hot(torch.tensor([x]), p.numel())[0]  # a deterministic draft: x with probability 1
    return chain_first_token_laws(verifier, p[None], q[None])[0][0]  # averaged over x ~ q (multinomial normalises q)


def acceptance_rate(verifier: Verifier, p: Tensor, q: Tensor) -> float:
    """Σ_x q(x) a(x): the probability that a one-token draft x ~ q is kept (1 − TV(p, q) for rejection sampling)."""
    return float(chain_first_token_laws(verifier, p[None], q[None])[1][0])


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
    tries = [one_hot(torch.tensor([x]), p.numel()).double()[0] for x in xs] if q is None else [normalised(q)] * m
    return _children_law(verifier, p.double(), tries)[0]


def _children_law(verifier: Verifier, cur: Tensor, tries: list[Tensor]) -> tuple[Tensor, float]:
    """Multi-step speculative sampling over children drawn independently, child j from law tries[j] ([V],
    one-hot for a deterministic child), averaged over every draw: child j, reached with probability r_j, is
    kept as x with q_j(x) a_j(x); its rejection leaves cur_{j+1} = fallback(cur_j, q_j), which reads no drawn
    token. Returns (the [V] float64 law Σ_j r_j q_j a_j + r_{m+1} cur_{m+1}, r_{m+1}): O(mV)."""
    law, reach = torch.zeros_like(cur, dtype=torch.float64), 1.0
    for qi in tries:
        a = verifier.acceptance_all(cur[None], qi[None])[0].double()  # [V] a(x) for every x
        law += reach * qi * a
        reach *= float((qi * (1 - a)).sum())
        cur = normalised(verifier.fallback(cur, qi))
    return law + reach * (cur if tries else normalised(verifier.fallback(cur, None))), reach


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
    return _walk(verifier, draft, p)[0]


def _walk(verifier: Verifier, draft: Draft, p: Tensor) -> tuple[Tensor, float]:
    """`draft_first_token_law`'s law, and the probability that every child of the root is rejected."""
    p = normalised(p)
    kids = root_children(draft)
    x = draft.tokens[: len(draft)].to(p.device)  # [N]
    q = draft_law(Draft(x, draft.q), p)  # [N, V]
    q = q / q.sum(-1, keepdim=True)  # as the draws normalise it (float32 laws sum to 1 within ~1e-7)
    law, reach, cur = torch.zeros_like(p), 1.0, p
    for c in kids:
        a = float(verifier.acceptance(cur[None], q[c : c + 1], x[c : c + 1])[0])
        law[x[c]] += reach * a
        reach *= 1.0 - a
        cur = normalised(verifier.fallback(cur, q[c]))
    return law + reach * (cur if kids else normalised(verifier.fallback(cur, None))), reach


def chain_first_token_laws(verifier: Verifier, p: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """The exact law of the first token a verifier emits after a chain whose first token x ~ q, for B
    positions at once, averaged over the draw of x: Σ_x q(x) [a(x) δ_x + (1 − a(x)) f(p, q)], with
    a = `Verifier.acceptance_all` (every x at once: O(V) per position, not O(V²) as `first_token_law`).

    Args:
        verifier: any verifier whose fallback after a rejection reads (p, q) only (all of ours).
        p: [B, V] the target's law at each position (normalised here, in float64).
        q: [B, V] the law each position's first draft token is drawn from (one-hot for a deterministic one).

    Returns:
        ([B, V] float64 laws, [B] the probability that the first draft token is kept).
    """
    p, q = normalised(p), normalised(q)
    a = verifier.acceptance_all(p, q).double()  # [B, V] a(x) for every x
    kept = q * a  # [B, V]
    rejected = 1 - kept.sum(-1, keepdim=True)  # [B, 1]
    return kept + rejected * normalised(verifier.fallback(p, q)), kept.sum(-1)


def step_first_token_law(verifier: Verifier, draft: Draft, p: Tensor, siblings: Siblings | None = None) -> tuple[Tensor, float]:
    """The exact law of the first token one verification step emits, given the step's draft and the
    target's laws at its nodes: a chain's averaged over its first token's draw (`chain_first_token_laws`;
    one-hot q for a deterministic token); a deterministic tree's by its verifier's own walk: the
    relaxed rules' longest passing path (`tree_path`: it reads p at every node), else multi-step
    speculative sampling over the root's children (`draft_first_token_law`); a tree with sampled
    children averaged over their draws (`sampled_children_law`).

    Args:
        verifier: any verifier.
        draft: one row's draft.
        p: [K + 1, V] the target's laws as the verifier reads them (row 0 the root's).
        siblings: the drafter's rule for the deterministic siblings beside a sampled chain token
            (`sampled_children_law`); None = the drafter drafts none.

    Returns:
        ([V] float64 law, the probability that the token comes from the draft).

    Raises:
        SpecResearchError: a relaxed rule on a tree whose children were drawn from q: its first token's law is an
            average over the draws of every node along its longest passing path, not computed here.
    """
    if len(draft) == 0:
        return normalised(verifier.fallback(p[0], None)), 0.0
    if draft.parents is None:
        law, kept = chain_first_token_laws(verifier, p[:1], draft_law(draft, p)[:1])
        return law[0], float(kept[0])
    tree_path = getattr(verifier, "tree_path", None)
    if draft.q is not None:
        if tree_path is not None:
            raise SpecResearchError(f"the exact first-token law of {verifier.name} on a tree with sampled children is an average over "
                                    "every node's draw along its longest passing path, not computed: use chains or deterministic "
                                    "trees (children=top)")
        law, reach = sampled_children_law(verifier, draft, p[0], siblings)
        return law, 1.0 - reach
    if tree_path is not None:  # a relaxed rule: the longest passing path, whatever the siblings' order
        path = tree_path(draft, p)
        if path:
            return one_hot(draft.tokens[path[:1]].cpu(), p.shape[-1]).double()[0], 1.0
        return normalised(verifier.fallback(p[0], None)).cpu(), 0.0
    law, reach = _walk(verifier, draft, p[0])
    return law, 1.0 - reach


def sampled_children_law(verifier: Verifier, draft: Draft, p: Tensor, siblings: Siblings | None = None) -> tuple[Tensor, float]:
    """The exact law of the first token multi-step speculative sampling emits over a tree whose root
    children were drawn independently, each from its own q row (tree, Medusa and EAGLE with
    children=sample: with replacement), averaged over every child's draw (`_children_law`, as
    `sibling_law` for children of one law). A lossless verifier gives p.

    A chain token x ~ q followed by deterministic siblings (one-hot q rows: the chain drafters'
    `siblings`, which the rule `siblings` gives each x) is averaged over x's draw: after x is rejected
    the residual fallback(p, q) does not read x, so the draws group by their sibling set: each of the
    siblings S a token outside them would get has a set of its own (the rest share S): O(n²V).

    Args:
        verifier: a verifier that tries root children in turn (not a relaxed rule's longest path).
        draft: one row's tree, q given.
        p: [V] the target's law at the root.
        siblings: the drafter's sibling rule (at the root: path probability 1); needed for one-hot rows
            beside a sampled one.

    Returns:
        ([V] float64 law, the probability that every root child is rejected).

    Raises:
        SpecResearchError: one-hot rows beside sampled ones without `siblings`, or not the ones it gives.
    """
    kids = root_children(draft)
    q = normalised(draft.q[kids].to(p.device))  # [M, V] as the draws normalise them
    onehot = q.max(-1).values == 1.0  # [M]
    p = normalised(p)
    if not onehot.any() or onehot.all():
        return _children_law(verifier, p, list(q))
    if siblings is None or onehot[0] or not onehot[1:].all():
        raise SpecResearchError("the exact first-token law of a tree whose deterministic siblings depend on a sampled token beside "
                                "them needs the drafter's sibling rule (siblings=N): none was given, or the sampled token is not "
                                "the root's first child")
    if not torch.equal(siblings.of(q[0], draft.tokens[kids[0]]).cpu(), draft.tokens[kids[1:]].cpu()):
        raise SpecResearchError("the siblings beside the sampled token are not the ones the drafter's sibling rule (siblings=N) "
                                "gives it: the exact law would average over the wrong sets")
    a = verifier.acceptance_all(p[None], q[:1])[0].double()  # [V] a(x) for every draw x
    missed = q[0] * (1 - a)  # [V] the chance of drawing x and rejecting it
    residual = normalised(verifier.fallback(p, q[0]))  # [V] what the siblings face: it reads no draw
    common = siblings.of(q[0])  # [S] the siblings of every draw outside them
    groups = [(float(missed[x]), siblings.of(q[0], x)) for x in common] + [(float(missed.sum() - missed[common].sum()), common)]
    law, reach = q[0] * a, 0.0
    for weight, tokens in groups:  # (no siblings: the token comes from the residual)
        tries = list(one_hot(tokens.cpu(), len(p)).double().to(p.device))
        law_s, reach_s = _children_law(verifier, residual, tries) if tries else (residual, 1.0)
        law, reach = law + weight * law_s, reach + weight * reach_s
    return law, reach


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


def kl_divergence(a: Tensor, b: Tensor) -> Tensor:
    """KL(a ‖ b) = Σ a log(a / b) over the last dimension, in nats (a token a gives and b excludes: inf)."""
    a, b = a.double(), b.double()
    terms = torch.where(a > 0, a * (torch.log(a) - torch.log(b)), torch.zeros_like(a))
    return terms.sum(-1)


def normalised(law: Tensor) -> Tensor:
    """A law ([V]) or laws ([B, V]) normalised over the last dimension, in float64."""
    law = law.double()
    return law / law.sum(-1, keepdim=True)
