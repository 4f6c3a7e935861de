"""Attention over a prompt that every row of a batch shares, held once.

Many samples of one prompt (the equivalence battery, the law tests) decode B rows that all continue
the same P tokens. Copied into each row's KV cache, that prompt costs every step a copy of B x P
keys and values and an attention over them per row. Here the prompt's keys and values are held
once (`SharedPrefix`, [1, Hkv, P, D] per layer) and each row's cache holds only the tokens after
it; `prefix_attention` attends a step's queries of all rows over the prompt in one attention per
layer (the rows folded into the query dimension) and over each row's own tokens, and merges the two
by their log-sum-exps: the softmax over both, as if the prompt sat in every row's cache.

transformers dispatches attention by name (its AttentionInterface): `use_prefix_attention` makes a
model's attention `prefix_attention`, which is SDPA, unchanged, in every forward that passes no
`prefix=`; a forward passes one as `model(..., prefix=SharedPrefix)` (a keyword argument that
transformers hands down to every layer's attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

PREFIX_ATTENTION = "sdpa_shared_prefix"  # the attention implementation's name in transformers' registry
INVARIANT_ATTENTION = "invariant_float64"  # model.kernels=invariant's (invariant_attention)


@dataclass
class SharedPrefix:
    """The keys and values of one prompt, which every row of a batch attends over (positions 0..P-1);
    the rows' caches hold only what follows it, at positions from P on."""

    keys: list[Tensor | None]  # per layer [1, Hkv, P, D]; None for a layer that holds none (a draft that skips it)
    values: list[Tensor | None]
    length: int  # P

    @staticmethod
    def of(cache, length: int) -> SharedPrefix:
        """The first `length` slots of a one-row cache (transformers' DynamicCache or StaticCache), as a
        prefix. Slices: the prefix shares that cache's memory (copy what may change afterwards)."""
        keys, values = [], []
        for layer in cache.layers:
            held = getattr(layer, "keys", None) is not None and layer.keys.numel() > 0
            keys.append(layer.keys[:1, :, :length] if held else None)
            values.append(layer.values[:1, :, :length] if held else None)
        return SharedPrefix(keys, values, length)


def prefix_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0, prefix: SharedPrefix | None = None,
                     **kwargs) -> tuple[Tensor, None]:
    """transformers' SDPA attention (on the CPU, grouped key/value heads read in place under a mask, where
    transformers copies them: the same result); with `prefix`, each row's queries attend over the prefix's keys
    and over the row's own (`key`, `value`: what the row cached after the prefix, this step's included)
    as under one softmax: each part's output and log-sum-exp, merged.

    Args:
        module: the attention layer (its `layer_idx` picks the prefix's layer).
        query: [B, H, W, D] this step's queries.
        key, value: [B, Hkv, S, D] the rows' own keys and values (S >= W).
        attention_mask: over the rows' own slots: [B, 1, W, S] additive (0 / -inf-like) or boolean (True =
            attend); None = causal (query i sees the row's slots up to S - W + i).
        scaling: the scores' scale (default 1 / sqrt(D)).
        prefix: the prompt every row shares; None = plain SDPA.

    Returns:
        ([B, W, H, D] attention output, None), as transformers' attention functions return.
    """
    if prefix is None:
        if query.device.type == "cpu" and attention_mask is not None and query.shape[2] > 1 and key.shape[1] < query.shape[1] \
                and not kwargs.keys() & {"position_bias", "softcap"}:
            # transformers repeats each key/value head for its query heads here (a masked forward of several queries:
            # a batch's verification, a tree), a copy of every row's cache per layer (at 8 rows of 2 tokens, a sixth
            # of the 1.5B's forward); torch's CPU kernel reads grouped heads in place, to the same bits
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                                 enable_gqa=True)  # [B, H, W, D]
            return out.transpose(1, 2).contiguous(), None  # [B, W, H, D]
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("prefix_attention: sliding-window attention layers are not supported")
    b, h, w, d = query.shape
    kv, s = key.shape[1], key.shape[2]
    g = h // kv  # query heads per key/value head (query head i reads key/value head i // g)
    scale = scaling if scaling is not None else d**-0.5
    q = query.view(b, kv, g, w, d)  # [B, Hkv, G, W, D]
    folded = q.permute(1, 0, 2, 3, 4).reshape(1, kv, b * g * w, d)  # [1, Hkv, B*G*W, D] every row's queries, one attention
    out_p, lse_p = _attend(folded, prefix.keys[module.layer_idx], prefix.values[module.layer_idx], scale)  # [1, Hkv, BGW, D], [1, Hkv, BGW]
    out_p = out_p.view(kv, b, g, w, d).permute(1, 0, 2, 3, 4)  # [B, Hkv, G, W, D]
    lse_p = lse_p.view(kv, b, g, w).permute(1, 0, 2, 3)  # [B, Hkv, G, W]
    high = torch.promote_types(query.dtype, torch.float32)  # scores and weights in float32 at least (transformers' eager too)
    # over the rows' own slots, each key/value head's G x W queries in one product (a broadcast product copies the keys G times)
    scores = (q.reshape(b, kv, g * w, d) @ key.transpose(2, 3)).view(b, kv, g, w, s).to(high) * scale  # [B, Hkv, G, W, S]
    if attention_mask is None:
        if w > 1:
            scores.masked_fill_(torch.ones(w, s, dtype=torch.bool, device=query.device).triu(s - w + 1), float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores.masked_fill_(~attention_mask[:, :, None], float("-inf"))
    else:
        scores.add_(attention_mask[:, :, None].to(high))
    lse_r = scores.logsumexp(-1)  # [B, Hkv, G, W]
    weights = (scores - lse_r[..., None]).exp().to(value.dtype).view(b, kv, g * w, s)  # [B, Hkv, G*W, S]
    out_r = (weights @ value).view(b, kv, g, w, d)  # [B, Hkv, G, W, D]
    share = torch.sigmoid(lse_p.to(high) - lse_r)[..., None]  # [B, Hkv, G, W, 1] the prefix's share of the softmax's mass
    out = share * out_p.to(high) + (1 - share) * out_r.to(high)  # [B, Hkv, G, W, D]
    return out.to(query.dtype).reshape(b, h, w, d).transpose(1, 2).contiguous(), None  # [B, W, H, D]


def _attend(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Attention of q ([1, Hkv, M, D]) over k, v ([1, Hkv, P, D]), no mask: the output ([1, Hkv, M, D]) and the
    scores' log-sum-exp ([1, Hkv, M]). On the CPU, torch's fused flash kernel (which returns it); elsewhere plain
    products."""
    if q.device.type == "cpu" and q.dtype in (torch.float32, torch.bfloat16, torch.float16) and hasattr(torch.ops.aten, _FLASH_CPU):
        out, lse = getattr(torch.ops.aten, _FLASH_CPU)(q, k, v, 0.0, False, scale=scale)[:2]
        return out, lse
    scores = (q @ k.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) * scale  # [1, Hkv, M, P]
    lse = scores.logsumexp(-1)
    return (scores - lse[..., None]).exp().to(v.dtype) @ v, lse


_FLASH_CPU = "_scaled_dot_product_flash_attention_for_cpu"  # (output, logsumexp) of a fused attention on the CPU


def invariant_attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                        scaling: float | None = None, dropout: float = 0.0, prefix: SharedPrefix | None = None,
                        **kwargs) -> tuple[Tensor, None]:
    """Attention whose output for a query does not depend on the other queries, rows or slots of the forward
    (model.kernels=invariant): every product and sum in float64, the result rounded to the model's dtype.

    A fused attention kernel picks its blocking by the number of queries (measured in bf16 on AVX2 and
    AVX-512 BF16 CPUs: the law after one query differs from the same context's law in a forward of 5 or 9,
    mean TV ~0.007, up to 0.05 at near-ties). Here a score is q · k summed in float64, where the products
    of bf16 (or fp32) numbers are exact and their sum exact or within 2⁻⁵³ of it, whatever the order; the
    softmax and the weighted sum of values likewise: what a forward's shape can still change lies ~2⁻⁴⁵
    below a bf16 rounding step (float32: ~2⁻²⁹), so the rounded output is the same bits at every shape.
    Masked slots (another row's holes, a tree's other branches) weigh exactly 0. The shared prompt
    (`prefix`) is attended with the row's own slots under one softmax, so a prefix-shared batch reads
    the bits of rows that copy the prompt. Same arguments and return as `prefix_attention`.
    """
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("invariant_attention: sliding-window attention layers are not supported")
    b, h, w, d = query.shape
    kv = key.shape[1]
    g = h // kv  # query heads per key/value head
    scale = scaling if scaling is not None else d**-0.5
    f64 = torch.float64
    q = query.view(b, kv, g, w, d).to(f64)  # [B, Hkv, G, W, D]
    keys, values = key.to(f64), value.to(f64)  # [B, Hkv, S, D]
    s = keys.shape[2]
    scores = q @ keys[:, :, None].transpose(3, 4) * scale  # [B, Hkv, G, W, S]
    if attention_mask is None:
        if w > 1:
            scores.masked_fill_(torch.ones(w, s, dtype=torch.bool, device=query.device).triu(s - w + 1), float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores.masked_fill_(~attention_mask[:, :, None], float("-inf"))
    else:  # additive: 0 where seen, a very negative number where not (exactly 0 weight after the softmax)
        scores.masked_fill_(attention_mask[:, :, None] < 0, float("-inf"))
    if prefix is None:
        out = scores.softmax(-1) @ values[:, :, None]  # [B, Hkv, G, W, D]
    else:  # the prompt's keys once for every row: the rows' queries folded into one product per key/value head
        pk, pv = prefix.keys[module.layer_idx].to(f64)[0], prefix.values[module.layer_idx].to(f64)[0]  # [Hkv, P, D]
        folded = q.permute(1, 0, 2, 3, 4).reshape(kv, b * g * w, d)  # [Hkv, B*G*W, D]
        shared = (folded @ pk.transpose(1, 2) * scale).view(kv, b, g, w, -1).permute(1, 0, 2, 3, 4)  # [B, Hkv, G, W, P]
        weights = torch.cat([shared, scores], -1).softmax(-1)  # [B, Hkv, G, W, P + S] one softmax over the prompt and the row's own
        p_len = pk.shape[1]
        from_prompt = weights[..., :p_len].permute(1, 0, 2, 3, 4).reshape(kv, b * g * w, p_len) @ pv  # [Hkv, B*G*W, D]
        out = from_prompt.view(kv, b, g, w, d).permute(1, 0, 2, 3, 4) + weights[..., p_len:] @ values[:, :, None]  # [B, Hkv, G, W, D]
    return out.to(query.dtype).reshape(b, h, w, d).transpose(1, 2).contiguous(), None  # [B, W, H, D]


AttentionInterface.register(PREFIX_ATTENTION, prefix_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(PREFIX_ATTENTION, sdpa_mask)  # masks made as for SDPA (the no-prefix path is SDPA)
AttentionInterface.register(INVARIANT_ATTENTION, invariant_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(INVARIANT_ATTENTION, sdpa_mask)


def use_prefix_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Make a model's SDPA attention `prefix_attention` (SDPA itself unless a forward passes `prefix=`).
    A model with another attention implementation is left as it is (its rows then copy the prompt)."""
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        model.set_attn_implementation(PREFIX_ATTENTION)
    return model


def use_invariant_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Make a model's attention `invariant_attention` (model.kernels=invariant), in place."""
    model.set_attn_implementation(INVARIANT_ATTENTION)
    return model


def shares_prefix(model: torch.nn.Module) -> bool:
    """Whether a model's forwards take `prefix=` (see use_prefix_attention, use_invariant_attention)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) in (PREFIX_ATTENTION, INVARIANT_ATTENTION)
