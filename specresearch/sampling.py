"""Logits → probabilities → tokens. The one place where temperature, top-k and top-p are applied,
so the target's p, the draft's q and the baseline always see the same processing (transformers
issue #47932 is what happens otherwise)."""

from __future__ import annotations

import torch
from torch import Tensor

from specresearch.types import SamplingParams


def logits_to_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """Turn logits into the distribution a token is drawn from.

    Args:
        logits: [..., V] raw logits, any float dtype.
        params: temperature / top-k / top-p. Temperature 0 gives the one-hot argmax.

    Returns:
        [..., V] float32 probabilities (temperature, then top-k, then top-p, as transformers orders them).
    """
    scaled = logits.float()
    if params.greedy:
        return torch.zeros_like(scaled).scatter_(-1, scaled.argmax(-1, keepdim=True), 1.0)
    # the temperature in place where .float() made a copy: a pass less over [..., V] (the caller's float32 logits stay)
    logits = scaled.div_(params.temperature) if scaled is not logits else scaled / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # [..., V] mass of strictly more likely tokens
        sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def ranking_probs(logits: Tensor, params: SamplingParams) -> Tensor:
    """The probabilities a drafter ranks and scores its candidates by: `logits_to_probs` at T > 0; at
    T = 0, where that law is one-hot, the softmax at temperature 1 (the draft's own confidences).

    Args:
        logits: [..., V] raw logits.
        params: the decoding's sampling settings.

    Returns:
        [..., V] float32 probabilities.
    """
    return logits_to_probs(logits, _UNIT if params.greedy else params)


def draw(logits: Tensor, params: SamplingParams, rng: torch.Generator | None) -> Tensor:
    """The next token of each row as decoding picks it: the argmax when greedy (no random draw), else a
    sample from `logits_to_probs`.

    Args:
        logits: [..., V] raw logits.
        params: temperature / top-k / top-p.
        rng: the generator of the draws.

    Returns:
        [...] token ids (int64).
    """
    return logits.argmax(-1) if params.greedy else sample(logits_to_probs(logits, params), rng)


def sample(probs: Tensor, rng: torch.Generator | None) -> Tensor:
    """Draw one token per row by inverting its CDF: one uniform u per row, the first token whose
    cumulative mass exceeds u times the row's total (`invert_cdf`). A token of probability 0 is never drawn.
    torch.multinomial draws V exponentials per row instead: on a 151,936-token vocabulary that took
    half of a 64-row bf16 decode step of Qwen2.5-Coder-0.5B on the 2-core CPU.

    Args:
        probs: [..., V] probabilities (need not be normalised).
        rng: the generator that makes draws reproducible; None uses torch's global one.

    Returns:
        [...] token ids (int64).
    """
    rows = probs.reshape(-1, probs.shape[-1]).shape[0]
    return invert_cdf(probs, torch.rand((rows, 1), generator=rng, dtype=torch.float64, device=probs.device))


def invert_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """[..., V] probabilities and [N, 1] uniforms (float64; N rows of probs) → [...] the tokens they pick:
    the first token whose cumulative mass exceeds u times the row's total (`sample`'s draw, given u).

    The mass is summed in two levels, so that no pass over the vocabulary runs its additions one after
    another: the sums of blocks of CDF_BLOCK tokens (in the probabilities' dtype, float32 at least), accumulated in float64
    to find the block, then the float64 cumulative sums inside that block alone. 64 rows of a 151,936-token
    vocabulary took 1.7-2.9 ms instead of 62-65 (a float64 cumsum, its copy included) on the 2-core CPU with AMX.
    A block's sum carries its dtype's rounding (float32: about 1e-7 of the block's mass), which its last token of
    mass gains or loses: a law within ~1e-7 of p in total variation, the size of the rounding p itself carries in
    float32. Given u, a draw differs from a float64 cumsum's where u falls that close to a token's end; a token of
    probability 0 is never picked."""
    flat = probs.reshape(-1, probs.shape[-1])  # [N, V]
    rows, vocab = flat.shape
    pad = -vocab % CDF_BLOCK
    blocks = (torch.nn.functional.pad(flat, (0, pad)) if pad else flat).reshape(rows, -1, CDF_BLOCK)  # [N, nb, C]
    sums = blocks.sum(-1, dtype=torch.promote_types(flat.dtype, torch.float32)).double()  # [N, nb] (not in float64: a float64
    # copy of [N, V] costs more than a cumsum)
    cum = torch.nn.functional.pad(sums.cumsum(-1), (1, 0))  # [N, nb + 1] the mass before each block, then the total
    total = cum[:, -1:]  # [N, 1]
    if flat.device.type == "cpu" and not bool((total > 0).all()):  # (no device sync on a GPU)
        raise ValueError("sample: every row needs a positive, finite total probability")
    mass = u * total  # [N, 1]
    j = torch.minimum(torch.searchsorted(cum, mass, right=True) - 1, last_of(sums))  # [N, 1] the block holding the token
    # (u * total rounded up to the total: the last block of mass > 0)
    before = cum.gather(1, j)  # [N, 1] the mass of the blocks before it
    block = blocks[torch.arange(rows, device=flat.device), j[:, 0]]  # [N, C]
    inner = torch.searchsorted(before + block.double().cumsum(-1), mass, right=True)  # [N, 1] (C: its sum rounded above)
    return (j * CDF_BLOCK + torch.minimum(inner, last_of(block))).reshape(probs.shape[:-1])


def last_of(mass: Tensor) -> Tensor:
    """[N, M] non-negative masses → [N, 1] the index of each row's last one above 0."""
    return mass.shape[-1] - 1 - (mass > 0).flip(-1).int().argmax(-1, keepdim=True)


CDF_BLOCK = 128  # invert_cdf: tokens per block of its first level (151,936 = 1,187 x 128: no padding for Qwen's vocabulary)


_UNIT = SamplingParams(temperature=1.0)  # plain softmax: logits / 1.0 is exact
