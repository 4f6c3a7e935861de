"""Speculative rejection sampling (Leviathan et al., 2023; Chen et al., 2023)."""

from __future__ import annotations

import torch
from torch import Tensor

from specresearch.sampling import sample
from specresearch.types import Draft, Verdict
from specresearch.verifiers.base import Verifier


class RejectionVerifier(Verifier):
    """Accept draft token x with probability min(1, p(x) / q(x)); after the first rejection sample
    the recovered token from norm(max(0, p − q)); if all K are accepted sample the bonus token from
    p at position K. The output then follows p exactly, whatever q is. A deterministic draft
    (q = None) counts as one-hot: x is accepted with probability p(x).
    """

    lossless = True
    name = "rejection"

    def __call__(self, draft: Draft, p: Tensor, rng: torch.Generator | None = None) -> Verdict:
        k = len(draft)
        x = draft.tokens.to(p.device)  # [K]
        q = draft.q.to(p.dtype) if draft.q is not None else one_hot(x, p.shape[-1]).to(p.dtype)  # [K, V]
        rows = torch.arange(k, device=p.device)
        p_x, q_x = p[rows, x], q[rows, x]  # [K], [K]
        u = torch.rand(k, generator=rng, device=p.device)  # [K]
        accepted = (u < acceptance_probability(p_x, q_x)).int()  # [K]; u in [0, 1) never accepts p(x) = 0
        n = int(accepted.cumprod(0).sum())
        last = residual(p[n], q[n]) if n < k else p[k]  # [V]
        y = sample(last, rng)
        return Verdict(tokens=torch.cat([x[:n], y[None]]), num_accepted=n)


def acceptance_probability(p: Tensor, q: Tensor) -> Tensor:
    """min(1, p/q) elementwise, with 1 where q = 0 (a token q never proposes)."""
    return torch.where(q > 0, (p / q.clamp_min(torch.finfo(q.dtype).tiny)).clamp(max=1.0), torch.ones_like(p))


def residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p − q)): the law of the recovered token. Falls back to p where p == q
    (then a rejection has probability 0, and only rounding can get here)."""
    r = (p - q).clamp_min(0.0)  # [..., V]
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(r.dtype).tiny), p)


def one_hot(tokens: Tensor, vocab_size: int) -> Tensor:
    """[K] token ids → [K, V] one-hot laws, the q of a deterministic drafter."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()
