"""Static KV slots (model.cache=static): a preallocated cache whose rollback moves the write position,
and the decoder compiled at fixed widths over it (model.compile=true)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from transformers import StaticCache
from transformers.cache_utils import StaticLayer

from specresearch.attention import SharedPrefix
from specresearch.models import LoadedModel


class StaticSlots:
    """A KV cache preallocated (transformers' StaticCache) for one sequence or B rows: the write position
    is `length`, a rollback moves it back (gpt-fast), a tree's accepted path is copied to the front of its
    slots in place. Run eagerly, a forward attends over the slots written so far (`_Slots`: no copy of the
    cache per step, as a DynamicCache makes, and no attention over empty slots); compiled, over every slot
    under a mask that hides the ones past its tokens.

    With the model's `compile` (model.compile=true) the decoder of one sequence runs under torch.compile
    at fixed shapes: a forward of K tokens is padded to the next of COMPILED_WIDTHS (the padding's slots
    lie past the write position, which then moves back to K), so a run compiles one graph per width it
    meets (CUDA graphs on a GPU: mode reduce-overhead); wider forwards (long prompts) and rows run
    eagerly. The slots never move while they last: a sequence that outgrows them gets a larger cache
    (BLOCK-rounded).
    """

    BLOCK = 256  # slots are allocated in multiples of this
    COMPILED_WIDTHS = (1, 2, 4, 8, 16, 32, 64)

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.model = lm.model
        self.cache: StaticCache | None = None
        self.capacity = 0
        self.batch = 1  # rows the cache holds

    def reset(self, capacity: int) -> StaticCache:
        """The cache for a new sequence of about `capacity` tokens (the same one when it is large enough)."""
        capacity = max(self.BLOCK, -(-capacity // self.BLOCK) * self.BLOCK)
        if self.cache is None or capacity > self.capacity or self.batch != 1:
            self.cache, self.capacity, self.batch = _static_cache(self.model.config, capacity), capacity, 1
            if self.lm.compile:  # slots allocated now: a first compiled forward would otherwise meet them uninitialised
                self.cache.early_initialization(1, *_kv_shape(self.model.config), self.model.dtype, self.lm.device)
        self.seek(0)
        return self.cache

    def rows(self, batch: int) -> StaticCache:
        """An empty cache of `batch` rows (this one, emptied, when it holds that many; else a new one of the same capacity)."""
        if batch != self.batch:
            self.cache, self.batch = _static_cache(self.model.config, self.capacity), batch
        self.seek(0)
        return self.cache

    def repeat(self, batch: int, length: int) -> StaticCache:
        """A cache of `batch` rows, each holding this one-row cache's first `length` slots (a prompt every row shares)."""
        kept = self.copy(length)
        self.cache, self.batch = _static_cache(self.model.config, self.capacity), batch
        self.restore(kept, length)
        return self.cache

    def select(self, index: Tensor) -> None:
        """Keep only the rows at `index` ([B'], in order)."""
        for layer in self._layers():
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self.batch = len(index)

    def seek(self, length: int) -> None:
        """Move the write position to slot `length`."""
        for layer in self._layers():
            layer.cumulative_length.fill_(length)

    def keep(self, start: int, index: Tensor) -> None:
        """Copy the slots `index` ([R], from `start` on, in order) to slots start..start + R - 1 and write after them."""
        for layer in self._layers():
            layer.keys[:, :, start : start + len(index)] = layer.keys.index_select(2, index)
            layer.values[:, :, start : start + len(index)] = layer.values.index_select(2, index)
        self.seek(start + len(index))

    def copy(self, length: int) -> list[tuple[Tensor, Tensor] | None]:
        """The first `length` slots of every layer (None for a layer that holds none: a draft that skips
        it), a prefill kept for reuse."""
        return [(layer.keys[:, :, :length].clone(), layer.values[:, :, :length].clone()) if getattr(layer, "is_initialized", False)
                else None for layer in self.cache.layers]

    def restore(self, kept: list[tuple[Tensor, Tensor] | None], length: int) -> None:
        """Put back what `copy` kept (in every row), in place, and write after it (in a larger cache first
        when this one has fewer slots: a CachedLM reset without the prompt's size, as a draft model's is)."""
        if length > self.capacity:
            self._grow(length)
        for layer, slots in zip(self.cache.layers, kept):
            if slots is not None:
                if not layer.is_initialized:  # (a new cache: of another batch, or after a larger one)
                    layer.lazy_initialization(*(t.expand(self.batch, -1, -1, -1) for t in slots))
                layer.keys[:, :, :length] = slots[0]
                layer.values[:, :, :length] = slots[1]
        self.seek(length)

    def forward(self, ids: Tensor, length: int, positions: Tensor, mask: Tensor | None, logits: int | None = None,
                **shared: SharedPrefix) -> Tensor:
        """[B, K, H] the decoder's final hidden states of `ids` ([B, K] tokens or [B, K, H] embeddings)
        written from slot `length` on, at `positions` ([B, K]), a chain (causal) or under `mask` (the
        [B, 1, K, length + K] additive mask of a tree or of rows, over the slots before and the K new ones),
        after the prompt of `shared` (prefix=SharedPrefix: rows); the write position ends at length + K.
        With `logits` (an int), [B, n, V] the model's logits of the last n = `logits` of the K instead (0: all):
        compiled, the lm head runs inside the graph (as transformers compiles a model), on every padded
        position (a few rows cost one pass over its weights)."""
        k = ids.shape[1]
        compiled = self.lm.compile and ids.shape[0] == 1 and k <= self.COMPILED_WIDTHS[-1]  # wider forwards and rows run eagerly
        width = next(w for w in self.COMPILED_WIDTHS if w >= k) if compiled else k
        if length + width > self.capacity:
            self._grow(length + width)
        dtype, device = self.model.dtype, ids.device
        reach = length + torch.arange(width, device=device)  # [W] a chain's token i sees the slots up to its own
        slots = self.capacity if compiled else length + width  # compiled: every slot (fixed shapes); eagerly the written ones
        causal = torch.zeros(1, 1, width, slots, dtype=dtype, device=device).masked_fill_(
            torch.arange(slots, device=device) > reach[:, None], torch.finfo(dtype).min)  # [1, 1, W, S]
        if mask is not None:
            causal = causal.expand(mask.shape[0], 1, width, slots).clone()
            causal[:, :, :k, : length + k] = mask
        if width > k:  # padding: repeats the last token at the next positions; its slots lie past the write position
            ids = torch.cat([ids, ids[:, -1:].expand(-1, width - k, *ids.shape[2:])], 1)
            positions = torch.cat([positions, positions[:, -1:] + torch.arange(1, width - k + 1, device=device)], 1)
        for layer in self.cache.layers:
            layer.end = None if compiled else length + width
        self.seek(length)
        whole = compiled and logits is not None
        decoder = _compiled(self.lm, whole) if compiled else self.model.base_model
        out = decoder(**model_inputs(ids), attention_mask=causal, position_ids=positions, cache=self.cache, use_cache=True, **shared)
        self.seek(length + k)
        if whole:
            return out.logits[:, :k][:, -logits:]
        hidden = out.last_hidden_state[:, :k]
        return hidden if logits is None else self.model.get_output_embeddings()(hidden[:, -logits:])

    def _grow(self, needed: int) -> None:
        """A larger cache holding what this one wrote (new addresses: compiled graphs are made again)."""
        old = self.cache.layers
        self.cache = _static_cache(self.model.config, -(-needed // self.BLOCK) * self.BLOCK)
        self.capacity = self.cache.layers[0].max_cache_len
        for new, prev in zip(self.cache.layers, old):
            if getattr(prev, "is_initialized", False):
                new.lazy_initialization(prev.keys, prev.values)
                new.keys[:, :, : prev.max_cache_len] = prev.keys
                new.values[:, :, : prev.max_cache_len] = prev.values
                new.cumulative_length.copy_(prev.cumulative_length)

    def _layers(self) -> list:
        """The layers that hold slots (a draft that skips layers leaves the others empty)."""
        return [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]


class _Slots(StaticLayer):
    """transformers' StaticLayer that returns, when `end` is set (an eager forward), only the slots up to
    `end`, the end of what the forward writes: attention reads the written slots, as with a DynamicCache,
    without its copy of the whole cache every step. `end` None (compiled): every slot (fixed shapes)."""

    end: int | None = None

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        return (keys, values) if self.end is None else (keys[:, :, : self.end], values[:, :, : self.end])


def _kv_shape(config) -> tuple[int, int]:
    """(key/value heads, head dim) of a decoder's attention."""
    heads = config.num_attention_heads
    return getattr(config, "num_key_value_heads", None) or heads, getattr(config, "head_dim", None) or config.hidden_size // heads


def _static_cache(config, capacity: int) -> StaticCache:
    """transformers' StaticCache of `capacity` slots, its full-attention layers `_Slots`."""
    cache = StaticCache(config=config, max_cache_len=capacity)
    cache.layers = [_Slots(max_cache_len=capacity) if type(layer) is StaticLayer else layer for layer in cache.layers]
    return cache


def _compiled(lm: LoadedModel, logits: bool) -> Callable:
    """The model under torch.compile, one per model and kind (its Targets share them; the graphs are per
    width and per CachedLM's slots): with `logits` the whole causal LM (decoder and lm head, as transformers
    compiles it), else its decoder alone (for the hidden states: drafters that read them, heads of their own)."""
    if lm.compiled is None:
        lm.compiled = {}
    if logits not in lm.compiled:
        limit = 8 * len(StaticSlots.COMPILED_WIDTHS)  # a graph per width for each of a run's caches (baseline, method, reference)
        for name in ("recompile_limit", "cache_size_limit"):  # a graph per width; torch renamed the setting
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), limit))
        module = lm.model if logits else lm.model.base_model
        lm.compiled[logits] = torch.compile(module, dynamic=False, mode="reduce-overhead" if lm.device.type == "cuda" else None)
    return lm.compiled[logits]


def move_slots(layers: list, start: int, index: Tensor) -> None:
    """In every layer, row b's slots `start + index[b]` ([B, W]) copied to slots start..start + W - 1."""
    for layer in layers:
        layer.keys[:, :, start : start + index.shape[1]] = _gather_slots(layer.keys[:, :, start:], index)
        layer.values[:, :, start : start + index.shape[1]] = _gather_slots(layer.values[:, :, start:], index)


def _gather_slots(cache: Tensor, index: Tensor) -> Tensor:
    """[B, H, W, D] the slots `index` ([B, W]) of each row of a [B, H, L, D] cache tensor."""
    b, h, _, d = cache.shape
    return cache.gather(2, index[:, None, :, None].expand(b, h, index.shape[1], d))


def model_inputs(x: Tensor) -> dict[str, Tensor]:
    """A forward's inputs: [B, K] token ids, or [B, K, H] input embeddings (a draft head's, see drafters.eagle)."""
    return {"inputs_embeds": x} if x.is_floating_point() else {"input_ids": x}

