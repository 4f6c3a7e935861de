"""Speculative rejection sampling (Leviathan et al., 2023; Chen et al., 2023)."""

from __future__ import annotations

import torch
from torch import Tensor

from specresearch.options import verifiers as options
from specresearch.verifiers.base import Verifier, at


class RejectionVerifier(Verifier):
    """Accept draft token x with probability min(1, p(x) / q(x)); after the first rejection sample
    the recovered token from norm(max(0, p − q)); if all K are accepted sample the bonus token from
    p at position K. The output then follows p exactly, whatever q is. A deterministic draft
    (q = None) counts as one-hot: x is accepted with probability p(x).
    """

    Settings = options.Rejection
    lossless = True
    name = "rejection"

    def acceptance(self, p: Tensor, q: Tensor, x: Tensor) -> Tensor:
        px, qx = at(p, x), at(q, x)  # [K] (or [K, M])
        return acceptance_probability(px, qx)

    def fallback(self, p: Tensor, q: Tensor | None) -> Tensor:
        return p if q is None else residual(p, q)


def acceptance_probability(p: Tensor, q: Tensor) -> Tensor:
    """min(1, p/q) elementwise, with 1 where q = 0 (a token q never proposes)."""
    return torch.where(q > 0, (p / q.clamp_min(torch.finfo(q.dtype).tiny)).clamp(max=1.0), torch.ones_like(p))


def residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p − q)): the law of the recovered token. Falls back to p where p == q
    (then a rejection has probability 0, and only rounding can get here)."""
    r = (p - q).clamp_min(0.0)  # [..., V]
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(r.dtype).tiny), p)
