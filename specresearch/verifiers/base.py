"""The verifier interface: a chain verifier is two functions, the probability of accepting each draft
token and the law of the token the target adds; one loop turns them into a verdict, and the exact
one-step law (`specresearch.stats.exact`) is computed from the same two."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from specresearch.sampling import sample
from specresearch.types import Draft, SamplingParams, Verdict


class Verifier(ABC):
    """Decides, from the target's distributions, how much of a draft to keep.

    Terms (Leviathan et al., 2023): *accepted* draft tokens are kept; after the first rejection the
    target adds a *recovered* token; when every draft token is accepted it adds a *bonus* token from
    p at the position after the draft. Either way a step yields num_accepted + 1 tokens.

    Draft token i is accepted with probability `acceptance(p, q, x)[i]` (one uniform draw each),
    up to the first rejection; the added token is drawn from `fallback(p[n], q[n])` at the first
    rejected position n, or from `fallback(p[K], None)` at the bonus position.
    """

    lossless: bool  # the claim that outputs follow the target's law exactly; tests must prove it
    name: str

    def check(self, sampling: SamplingParams) -> None:
        """Raise SpecResearchError if this rule cannot run with these sampling settings."""

    def p_sampling(self, sampling: SamplingParams) -> SamplingParams:
        """How the engine turns the target's logits into the p this verifier reads: the decoding's own
        settings, unless a rule asks for another view of the target (see RelaxedVerifier)."""
        return sampling

    @abstractmethod
    def acceptance(self, p: Tensor, q: Tensor, x: Tensor) -> Tensor:
        """The probability of keeping each draft token.

        Args:
            p: [K, V] target laws at the draft positions.
            q: [K, V] the laws the draft tokens were drawn from (one-hot for a deterministic drafter).
            x: [K] the draft tokens.

        Returns:
            [K] probabilities in [0, 1] (0 or 1 for a deterministic rule).
        """

    @abstractmethod
    def fallback(self, p: Tensor, q: Tensor | None) -> Tensor:
        """The law of the token the target adds.

        Args:
            p: [V] the target's law at that position.
            q: [V] the draft's law there after a rejection; None at the bonus position.

        Returns:
            [V] probabilities (need not be normalised).
        """

    def __call__(self, draft: Draft, p: Tensor, rng: torch.Generator | None = None) -> Verdict:
        """Verify one draft.

        Args:
            draft: K proposed tokens (a chain or a tree) and their law q ([K, V], or None for a
                deterministic drafter).
            p: [K + 1, V] target probabilities after temperature/top-k/top-p: row 0 is the law of
               the token after the last committed one, row i + 1 the law after draft token i (for a
               chain: row i is the law at draft position i, row K the bonus position).
            rng: the generator for every random draw (reproducible tests).

        Returns:
            The accepted prefix (or tree path) plus one recovered or bonus token.
        """
        if draft.parents is not None:
            return self._verify_tree(draft, p, rng)
        k = len(draft)
        x = draft.tokens.to(p.device)  # [K]
        q = draft_law(draft, p)  # [K, V]
        n = 0
        if k:
            u = torch.rand(k, generator=rng, device=p.device)  # [K]; u in [0, 1): probability 0 never accepts
            n = int((u < self.acceptance(p[:k], q, x)).int().cumprod(0).sum())
        y = sample(self.fallback(p[n], q[n] if n < k else None), rng)
        return Verdict(tokens=torch.cat([x[:n], y[None]]), num_accepted=n)

    def _verify_tree(self, draft: Draft, p: Tensor, rng: torch.Generator | None) -> Verdict:
        """Multi-step speculative sampling (SpecInfer, Miao et al. 2024) in terms of the same two
        functions: at each node try the children in order, accepting child x with probability
        `acceptance(p, q, x)`; after a rejection p ← `fallback(p, q)` (the residual, for rejection
        sampling) and the next child is tried against it. The first accepted child becomes the node;
        when every child is rejected the added token comes from the current p, at a leaf from
        `fallback(p, None)`. Lossless for rejection sampling with deterministic children (q one-hot:
        p(x) is zeroed and renormalised after a rejection) and with children drawn independently
        from the node's q; greedy keeps the longest path of argmax tokens.
        """
        k = len(draft)
        x = draft.tokens[:k].to(p.device)  # [N]
        q = draft_law(Draft(x, draft.q), p)  # [N, V]
        children: dict[int, list[int]] = {}
        for i, parent in enumerate(draft.parents[:k].tolist()):
            children.setdefault(parent, []).append(i)
        path: list[int] = []
        node, law = -1, p[0]  # [V]
        while True:
            kids = children.get(node, [])
            if not kids:
                law = self.fallback(law, None)
            for child in kids:
                u = torch.rand((), generator=rng, device=p.device)
                if u < self.acceptance(law[None], q[child : child + 1], x[child : child + 1])[0]:
                    break
                law = self.fallback(law, q[child])
            else:
                y = sample(law, rng)
                return Verdict(tokens=torch.cat([x[path], y[None]]), num_accepted=len(path), path=path)
            path.append(child)
            node, law = child, p[child + 1]


def draft_law(draft: Draft, p: Tensor) -> Tensor:
    """[K, V] the law each draft token was drawn from, in p's dtype: draft.q, or one-hot rows."""
    if draft.q is not None:
        return draft.q.to(device=p.device, dtype=p.dtype)
    return one_hot(draft.tokens.to(p.device), p.shape[-1]).to(p.dtype)


def one_hot(tokens: Tensor, vocab_size: int) -> Tensor:
    """[K] token ids → [K, V] one-hot laws, the q of a deterministic drafter."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


def argmax_law(p: Tensor) -> Tensor:
    """[..., V] → the one-hot law of each row's argmax."""
    return torch.zeros_like(p).scatter_(-1, p.argmax(-1, keepdim=True), 1.0)
