"""CPU kernels for the few-row products of decoding and verification (SkinnyLinear)."""

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
    """Make every nn.Linear of `model` a SkinnyLinear (on) or a plain nn.Linear again (off), in place."""
    for module in model.modules():
        if type(module) in (torch.nn.Linear, SkinnyLinear):
            module.__class__ = SkinnyLinear if on else torch.nn.Linear
    return model
