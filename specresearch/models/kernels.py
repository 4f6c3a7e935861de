"""The linear layers' kernels (model.kernels): on the CPU, products with weights oneDNN laid out once
(PackedLinear, auto's choice) or few rows as W @ xᵀ (SkinnyLinear); and the shape-invariant products of
model.kernels=invariant (InvariantLinear)."""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor

from specresearch.models.machine import cpu_kind, cpuinfo


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


PACK_ROWS = 17  # the rows oneDNN lays a packed weight out for: a verification's (1 to 17 tokens); any number runs


PACK_MIN = 2**16  # PackedLinear: weights of fewer entries take SkinnyLinear's product (oneDNN's ~20 µs a call outweighs the layout)


class PackedLinear(SkinnyLinear):
    """nn.Linear whose CPU product reads a copy of the weight that oneDNN laid out for its kernel once,
    ahead of the calls (model.kernels=packed, auto's choice on a CPU): the prepacked weights of
    inductor's CPU freezing, without compiling.

    F.linear lays the weight out again on every call (oneDNN, bfloat16) or runs MKL's sgemm (float32),
    so a forward of a few tokens streams the weights several times. Measured on a 2-core AMD EPYC with
    AVX-512 BF16 (Qwen2.5-Coder-1.5B, 2 threads; docs/concepts/measured.md, "Kernels"): one token's
    forward 87-109 ms instead of SkinnyLinear's 191 in bfloat16 and 116-184 ms instead of 330 in float32,
    17 tokens 129-168 and 262-266 ms (benchmarks/kernel_costs.py). The product of every shape measured
    there is faster (1 to 550 rows), so it takes every input on the CPU in float32 and bfloat16 for weights
    of PACK_MIN entries or more, but float32 products of up to MKL_ROWS rows on an Intel CPU
    (`mkl_takes_few_rows`: MKL's F.linear is faster there) and bfloat16 products of up to SKINNY_ROWS rows on
    a CPU with AMX (`few_bf16_rows_unpacked`: torch.mv for one row, W @ xᵀ for more); products of fewer than
    PADDED_ROWS rows are padded to that many with zero rows on a CPU with AVX-512 BF16 but no AMX
    (`few_rows_padded`: one or two rows are slower there than four), and bfloat16 products of 17 to 32 rows to 33 on a
    CPU with AMX (`middle_bf16_rows_padded`: 33 rows are faster there); smaller weights (a tiny
    test model's) take SkinnyLinear's product, other devices and dtypes, and inputs that need a gradient,
    F.linear (`routes` says which few-row paths run here).

    The layout is made at the first such call and again when the weight changes (another tensor,
    dtype or shape, or a write in place; not seen on a weight made under inference_mode, which keeps no
    version): a second copy of the weight, outside the state dict.
    """

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        if not (x.device.type == "cpu" and x.dtype == w.dtype and w.dtype in (torch.float32, torch.bfloat16)
                and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
            return F.linear(x, w, self.bias)
        if w.numel() < PACK_MIN:
            return super().forward(x)
        rows = x.numel() // x.shape[-1]
        if rows <= MKL_ROWS and w.dtype == torch.float32 and mkl_takes_few_rows():
            return F.linear(x, w, self.bias)
        if w.dtype == torch.bfloat16 and rows <= SKINNY_ROWS and few_bf16_rows_unpacked():
            if rows > 1:
                return super().forward(x)
            x1 = x.reshape(-1)  # [in]
            return (torch.mv(w, x1) if self.bias is None else torch.addmv(self.bias, w, x1)).reshape(*x.shape[:-1], -1)
        x2 = x.reshape(rows, x.shape[-1])  # [rows, in]
        pad = (PADDED_ROWS if rows < PADDED_ROWS and few_rows_padded() else
               AMX_PAD[1] if w.dtype == torch.bfloat16 and AMX_PAD[0] < rows < AMX_PAD[1] and middle_bf16_rows_padded() else rows)
        if pad > rows:
            x2 = torch.cat([x2, x2.new_zeros(pad - rows, x2.shape[1])])  # [pad, in]: zero rows, dropped below
        y = torch.ops.mkldnn._linear_pointwise(x2, self.packed(), self.bias, "none", [None], "")  # [pad, out]
        return y[:rows].reshape(*x.shape[:-1], -1)  # [..., out]

    def packed(self) -> Tensor:
        """The weight in oneDNN's layout (an opaque mkldnn tensor), made again whenever the weight changed."""
        w, kept = self.weight, self.__dict__.get("_pack_key")
        version = (w.data_ptr(), None if w.is_inference() else w._version, w.dtype, tuple(w.shape))  # (inference tensors keep no version)
        if kept is None or kept[0]() is not w or kept[1] != version:
            self.__dict__["_pack"] = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_ROWS)
            self.__dict__["_pack_key"] = (weakref.ref(w), version)  # the weight itself (not kept alive), and its state
        return self.__dict__["_pack"]

    def __getstate__(self) -> dict:  # copies and pickles carry the weight, not its layout (made again on use)
        return {k: v for k, v in super().__getstate__().items() if k not in ("_pack", "_pack_key")}


SKINNY_ROWS = 13  # PackedLinear: bfloat16 products of 2 to this many rows take SkinnyLinear's W @ xᵀ on CPUs with AMX
PADDED_ROWS = 4  # PackedLinear: products of fewer rows are padded to this many with zero rows on CPUs with AVX-512 BF16 but no AMX
MKL_ROWS = 3  # PackedLinear: float32 products of up to this many rows take MKL's F.linear on Intel CPUs
AMX_PAD = (16, 33)  # PackedLinear: bfloat16 products of more than 16 and fewer than 33 rows are padded to 33 on CPUs with AMX


@functools.cache
def mkl_takes_few_rows() -> bool:
    """Whether float32 products of up to MKL_ROWS rows run faster on MKL (F.linear) than on oneDNN's packed
    kernel here: on Intel CPUs, where MKL takes its own fast paths. Measured on a 2-core Intel Xeon with AMX
    (Qwen2.5-Coder-1.5B, float32, 2 threads, docs/results/data/2026-12-02-kernel-costs-fp32-amx.json): a
    forward of 1, 2 and 3 tokens took 288-323, 356-370 and 335-415 ms on F.linear against 412, 426-534
    and 417-573 on the packed kernel, which is ahead from 5 tokens on (9 tokens 533-598 ms against
    881-1,069); on a 2-core AMD EPYC MKL took 328 ms for one token and the packed kernel 116
    (docs/concepts/measured.md, "Kernels")."""
    return torch.backends.mkl.is_available() and cpuinfo("vendor_id") == "GenuineIntel"


@functools.cache
def few_bf16_rows_unpacked() -> bool:
    """Whether bfloat16 products of up to SKINNY_ROWS rows run faster here off oneDNN's packed kernel: one row on
    torch's own matrix-vector kernel (torch.mv), 2 to SKINNY_ROWS rows as SkinnyLinear's W @ xᵀ. On CPUs with
    AMX, measured on a 2-core Intel Xeon with AMX (2 threads, the ways interleaved): a one-token forward of
    Qwen2.5-Coder-1.5B took 291-337 ms on torch.mv against 384-414 on the packed kernel (4 rounds), and
    transformers' `generate` of 48 tokens on HumanEval 100-102 81 s against 100; with 2 to 13 rows as W @ xᵀ
    as well, Medusa (typical) decoded 64 tokens of them in 71 s against 77 and the default drafter in 39 against 41.
    The outputs are within bfloat16's rounding of the packed kernel's (float32 sums, rounded once)."""
    return cpu_kind() == "AMX"


@functools.cache
def few_rows_padded() -> bool:
    """Whether products of fewer than PADDED_ROWS rows (bfloat16 and float32) run faster here padded to PADDED_ROWS
    rows with zeros on oneDNN's packed kernel: on CPUs with AVX-512 BF16 but no AMX, where the kernel computes one
    or two rows slower than four. Measured on a 2-core AMD EPYC with AVX-512 BF16 (Qwen2.5-Coder-1.5B, 2 threads,
    HumanEval 156 prefilled, the ways interleaved, fastest of 5 rounds): in bfloat16 a forward of one token 113 ms
    unpadded against 101 padded to 4 rows, of two tokens 140 against 100, three and five tokens 105 and 103 either
    way (padded to 2, one token took 145 ms; to 3, 110; to 5, 102); in float32 one token 240 against 189, two 294
    against 184, three 193 against 187 (to 8 rows: 240). Restricted to AVX2 code (ONEDNN_MAX_CPU_ISA=AVX2), float32
    gained nothing by padding, so other CPUs keep their paths (on Intel CPUs MKL or torch.mv take these rows).
    A row's result does not depend on the zero rows beside it; its sums may round as those of another
    number of rows do, within the dtype's rounding of nn.Linear's."""
    return cpu_kind() == "AVX-512 BF16"


@functools.cache
def middle_bf16_rows_padded() -> bool:
    """Whether bfloat16 products of 17 to 32 rows run faster here padded to 33 rows with zeros on oneDNN's packed kernel
    (AMX_PAD): on CPUs with AMX, where its kernel (brg_matmul:avx10_1_512_amx for every row count) computes 33 rows
    faster than 17 to 32. Measured on a 2-core Intel Xeon with AMX (Qwen2.5-Coder-1.5B, 2 threads, a forward of n
    tokens after 129 through the engine's cache, the ways interleaved): fastest of 4 rounds, 17, 20, 24, 28 and 32
    tokens took 372, 382, 386, 399 and 393 ms unpadded against 327, 336, 332, 334 and 330 padded to 33 (33 tokens
    336 and 328; 16 tokens 282 and 269, one token 229 and 218); padded to 40 rows 349-363 ms, to 48 356-377. Again,
    8 rounds in shuffled order: 17, 24 and 32 tokens took 391, 411 and 413 ms unpadded (medians; fastest 339, 346,
    357) against 357, 363 and 367 padded (322, 329, 349), and 366, 376 and 391 as W @ xᵀ. A row's
    result does not depend on the zero rows beside it; its sums may round as those of 33 rows do, within bfloat16's
    rounding of nn.Linear's."""
    return cpu_kind() == "AMX"


def routes() -> dict[str, int]:
    """The few-row paths PackedLinear takes on this machine, as the most rows each takes (0: not taken): what a
    forward's cost depends on beyond its layers' class (part of a kept cost curve's key)."""
    return {"float32_mkl_rows": MKL_ROWS if mkl_takes_few_rows() else 0,
            "bfloat16_unpacked_rows": SKINNY_ROWS if few_bf16_rows_unpacked() else 0,
            "padded_rows": PADDED_ROWS - 1 if few_rows_padded() else 0,
            "bfloat16_padded_to_33_rows": AMX_PAD[1] - 1 if middle_bf16_rows_padded() else 0}


def packed_linear_available() -> bool:
    """Whether this torch has oneDNN's prepacked linear (a CPU build with mkldnn; PackedLinear's kernels)."""
    return torch.backends.mkldnn.is_available() and all(
        hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight"))


LINEARS = (torch.nn.Linear, SkinnyLinear, PackedLinear)  # the kinds use_linear sets (InvariantLinear: use_invariant_kernels)


def use_linear(model: torch.nn.Module, kind: type[torch.nn.Linear] = SkinnyLinear) -> torch.nn.Module:
    """Make every linear layer of `model` (nn.Linear, SkinnyLinear, PackedLinear or InvariantLinear) a `kind`
    (one of LINEARS), in place: same weights and state dict."""
    for module in model.modules():
        if type(module) in (*LINEARS, InvariantLinear):
            module.__class__ = kind
            if kind is not PackedLinear:  # free its layout's copy
                for name in ("_pack", "_pack_key"):
                    module.__dict__.pop(name, None)
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
        if type(module) in (*LINEARS, InvariantLinear):
            module.__class__ = InvariantLinear
            module.block = invariant_block(module.weight)
    return use_invariant_attention(model)
