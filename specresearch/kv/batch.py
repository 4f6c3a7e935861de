"""decode_batch: many rows continued together, one forward per token (training data, the law tests'
baseline samples)."""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache

from specresearch.attention import SharedPrefix
from specresearch.models import LoadedModel
from specresearch.sampling import draw
from specresearch.types import SamplingParams


@torch.inference_mode()
def decode_batch(
    lm: LoadedModel, cache: DynamicCache, ids: Tensor, new: int, sampling: SamplingParams, rng: torch.Generator | None,
    mask: Tensor | None = None, positions: Tensor | None = None, fed_hidden: bool = False, prefix: SharedPrefix | None = None,
) -> tuple[Tensor, Tensor]:
    """Continue B sequences together, one forward per token: feed `ids` after `cache`, draw the next
    token of each row as decoding does (specresearch.sampling.draw: argmax when greedy, else sampled),
    feed it back, `new` times. No EOS stops a row. Where a batch of one prompt suffices, the engine is
    the reference; this is for many rows at once (training data, the law tests' baseline samples).

    Args:
        lm: the model.
        cache: the rows' KV cache so far ([B, ...]; it grows).
        ids: [B, T] tokens to feed first (T >= 1).
        new: tokens to draw per row (>= 1).
        sampling: temperature / top-k / top-p of the draws.
        rng: the generator of the draws.
        mask: [B, cached + T] attention mask, 0 = left padding (one column more per new token); None = none.
        positions: [B, T] position ids of `ids` (left-padded rows start at 0); None = after the cache.
        fed_hidden: also return the hidden states of `ids` before their last (EAGLE trains on a prompt's features).
        prefix: a prompt every row attends over, held once (specresearch.attention): `cache` then holds what
            follows it, and `positions` must be given.

    Returns:
        [B, new] the drawn tokens, and [B, new, H] the final-norm hidden state that produced each
        ([B, T - 1 + new, H] with `fed_hidden`: those of ids[:, :-1] first).
    """
    lm_head = lm.model.get_output_embeddings()
    shared = {"prefix": prefix} if prefix is not None else {}
    tokens, hidden = [], []
    for _ in range(new):
        out = lm.model.base_model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, **shared)
        if fed_hidden and not hidden:
            hidden.extend(out.last_hidden_state[:, :-1].unbind(1))
        h = out.last_hidden_state[:, -1]  # [B, H]
        nxt = draw(lm_head(h).float(), sampling, rng)  # [B]
        tokens.append(nxt)
        hidden.append(h)
        ids = nxt[:, None]
        if positions is not None:
            positions = positions[:, -1:] + 1
        if mask is not None:
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.stack(tokens, 1), torch.stack(hidden, 1)
