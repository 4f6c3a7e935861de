"""CPU kernels for the few-row products of decoding and verification (SkinnyLinear), and the
shape-invariant products of model.kernels=invariant (InvariantLinear)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class SkinnyLinear(torch.nn.Linear):
    """nn.Linear that computes a few rows (up to `MAX_ROWS`) as W @ xᵀ on the CPU, in float32 and bfloat16.

    torch's F.linear (x @ Wᵀ) on MKL costs about m times one row for m small, so verifying k + 1
    tokens costs k + 1 decode steps. The same product laid out as W @ xᵀ streams W once: measured on
    this project's AVX2 machine (2 cores, Qwen2.5-Coder-1.5B in float32), a 5-token forward costs 1.8-2x
    one token instead of 3x. In bfloat16 (oneDNN, measured on a 2-core Xeon with AVX-512 and AMX) a
    one-row F.linear is slower than a two-row W @ xᵀ: one row is computed padded with a zero row, and a
    one-token forward of the 1.5B takes 141 ms instead of 183 (9 tokens: 155 instead of 185); plain
    decoding, the baseline and transformers' `generate` on the same model all run this way. One row
    in float32 and long prompts keep F.linear. Weights and state dict are those of nn.Linear.
    """

    MAX_ROWS = 64

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1]
        half = x.dtype == torch.bfloat16
        if not (x.device.type == "cpu" and (x.dtype == torch.float32 or half) and (1 < rows or half) and rows <= self.MAX_ROWS):
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, x.shape[-1])  # [rows, in]
        if rows == 1:  # bf16: a one-row product takes a slower kernel than a two-row one
            x2 = torch.cat([x2, torch.zeros_like(x2)])
        y = self.weight @ x2.T if self.bias is None else torch.addmm(self.bias[:, None], self.weight, x2.T)  # [out, rows]
        return y[:, :rows].T.contiguous().reshape(*x.shape[:-1], -1)  # [..., out]


def use_skinny_linear(model: torch.nn.Module, on: bool = True) -> torch.nn.Module:
    """Make every nn.Linear of `model` a SkinnyLinear (on) or a plain nn.Linear again (off: an InvariantLinear too),
    in place."""
    for module in model.modules():
        if type(module) in (torch.nn.Linear, SkinnyLinear, InvariantLinear):
            module.__class__ = SkinnyLinear if on else torch.nn.Linear
    return model


class InvariantLinear(torch.nn.Linear):
    """nn.Linear whose every output row has the same bits whatever the other rows of the input: the
    product of a row does not depend on how many tokens or rows the forward carries (model.kernels=invariant).

    A matrix kernel may pick its algorithm, and so its order of summation, by the number of rows m
    (measured on a 2-core AMD EPYC with AVX-512 BF16: F.linear in bf16 gives row 0 other bits at every
    m >= 2). Here every product is W @ xᵀ over blocks of exactly `block` columns (the last padded with
    zeros), so each row meets one kernel of one shape; `block` is the widest this machine's kernels keep
    row-invariant for the weight's shape and dtype (`invariant_block`, probed once: bf16 on AVX-512
    BF16 takes every row in one product, float32 blocks of 8), None = one product of all the rows
    (at least 2). Weights and state dict are those of nn.Linear.
    """

    block: int | None = 1

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1]
        x2 = x.reshape(rows, x.shape[-1])  # [rows, in]
        y = blocked_product(self.weight, x2, self.block)  # [rows, out]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], -1)  # [..., out]


def blocked_product(weight: Tensor, x: Tensor, block: int | None) -> Tensor:
    """[rows, out] = x @ weightᵀ as W @ xᵀ over column blocks of exactly `block` (None: all rows, at least 2)."""
    rows = x.shape[0]
    width = max(rows, 2) if block is None else block
    padded = -(-rows // width) * width
    if padded > rows:
        x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])  # [padded, in]
    parts = [weight @ x[s : s + width].T for s in range(0, padded, width)]  # each [out, width]
    return torch.cat(parts, 1)[:, :rows].T.contiguous()  # [rows, out]


PROBE_ROWS = (2, 3, 5, 9, 17, 33, 130)  # forward widths the probe checks (1 token to a batch's verification)
PROBE_ALONE = 33  # the probe compares each width's first rows, up to this many, with the rows computed alone
_BLOCKS: dict[tuple, int | None] = {}  # (device, dtype, out, in, threads) -> the probed block


@torch.inference_mode()
def invariant_block(weight: Tensor) -> int | None:
    """The widest column block at which W @ xᵀ gives each row of x the bits it has alone, on this
    machine, for this weight's shape, dtype and device (torch's thread count included): None (any number
    of rows in one product), else the first of 64, 16, 8, 4, 2 that holds at every width of PROBE_ROWS,
    else 1 (a row at a time: always invariant, one weight stream per row). Probed with random rows
    against the weight itself, once per key (about 3 s for Qwen2.5-Coder-1.5B's five shapes here)."""
    key = (str(weight.device), weight.dtype, *weight.shape, torch.get_num_threads())
    if key not in _BLOCKS:
        gen = torch.Generator(device=weight.device).manual_seed(0)
        x = torch.randn(max(PROBE_ROWS), weight.shape[1], generator=gen, device=weight.device).to(weight.dtype)  # [R, in]
        x[1::3] *= 1e3  # rows of other magnitudes beside each other: a kernel that shares scaling between rows shows it
        _BLOCKS[key] = next((block for block in (None, 64, 16, 8, 4, 2) if _row_invariant(weight, x, block)), 1)
    return _BLOCKS[key]


def _row_invariant(weight: Tensor, x: Tensor, block: int | None) -> bool:
    alone = torch.cat([blocked_product(weight, x[j : j + 1], block) for j in range(PROBE_ALONE)])  # [A, out] each row by itself
    return all(torch.equal(blocked_product(weight, x[:m], block)[:PROBE_ALONE], alone[:m]) for m in PROBE_ROWS)


def use_invariant_kernels(model: torch.nn.Module) -> torch.nn.Module:
    """model.kernels=invariant: the target's law at a context the same bits whatever the forward's shape.
    Every nn.Linear becomes an InvariantLinear (its block probed for this machine) and the attention
    specresearch.attention's `invariant_attention` (float64, prefix-shared or not). In place."""
    from specresearch.attention import use_invariant_attention

    for module in model.modules():
        if type(module) in (torch.nn.Linear, SkinnyLinear, InvariantLinear):
            module.__class__ = InvariantLinear
            module.block = invariant_block(module.weight)
    return use_invariant_attention(model)
