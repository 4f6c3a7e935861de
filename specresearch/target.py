"""The one target wrapper: a causal LM that owns its KV cache, feeds tokens through it, and rolls it
back exactly after a rejection (no recomputation of the accepted prefix). Draft models use the same
wrapper for their own cache."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer

from specresearch.attention import SharedPrefix, shares_prefix
from specresearch.models import LoadedModel, SkinnyLinear, default_cache_dir, machine_tags
from specresearch.sampling import draw
from specresearch.types import SamplingParams

log = logging.getLogger(__name__)


class Target:
    """A causal LM plus its KV cache, for one sequence or a batch of them (rows).

    `length` is the number of cache slots. The engine keeps every token but the last one sampled in
    the cache, so each step feeds [last token, draft tokens] and gets one distribution per draft
    position plus the bonus position.

    One API, over rows (`prefill_rows`, `forward_rows`, `keep_rows`, `truncate_rows`, `crop_rows`,
    `select_rows`); one sequence is a batch of one, which runs the plain layout through the private
    one-sequence steps (`_prefill`, `_forward`, `_rollback`, `_keep`: no mask for a chain, compiled graphs).

    Rows: B sequences share one cache of
    `length` slots. Row b's tokens sit, in order, in the slots where `valid[b]` is True, and its next
    position id is `lengths[b]`: positions and attention come from the row, not from the slot. A step
    writes every row's fed tokens into the same new window of slots (padded to the widest row's);
    `keep_rows` then moves each row's kept tokens to the front of that window (a gather inside the
    window, nothing before it moves) and crops the window to the longest kept run. The slots a row
    leaves unfilled stay behind as holes, masked out of every later attention (ragged acceptance by
    pad-and-mask, compacted per step). A preallocated static cache fits the same layout: the window is
    written at a moving write position, and `keep_rows` moves that position back.

    Rows that continue one prompt share it (`prefix`, see specresearch.attention): its keys and values
    are held once, every row attends over them, and the slots hold only each row's tokens after it
    (positions still count from the prompt's first token). A model whose attention cannot take a
    shared prefix (not SDPA) copies the prompt into every row instead.
    """

    def __init__(self, lm: LoadedModel, static: bool | None = None):
        self.lm = lm
        self.model = lm.model
        self.device = lm.device
        self.cache: DynamicCache | None = None
        self.length = 0
        self._kept: tuple[Tensor, DynamicCache, Tensor, Tensor | None] | None = None  # (tokens, cache, logits, hidden) of a kept prefill
        self._tree: tuple[int, Tensor] | None = None  # (start, [n, n] ancestors) of the tree fed last
        self.keep_hidden = False  # keep the last hidden states of every forward in `hidden` (Medusa heads read them)
        self.hidden: Tensor | None = None  # [K, H] the final-norm hidden states of the last forward's tokens
        self.vocab_size = self.model.get_input_embeddings().num_embeddings  # valid token ids: [0, vocab_size)
        self.max_positions: int | None = getattr(self.model.config, "max_position_embeddings", None)  # the longest sequence; None = unsaid
        self.lengths: list[int] = []  # rows: each row's tokens in the cache (its next position id), the shared prefix's included
        self.prefix: SharedPrefix | None = None  # rows: the prompt every row attends over, held once (the slots hold what follows)
        self.valid: Tensor | None = None  # [B, length] rows: the slots that hold a row's tokens; None = all of them
        self.hidden_rows: list[Tensor] = []  # rows, with keep_hidden: [n_b, H] each row's hidden states of its last fed tokens
        self._window = 0  # rows: where the last forward_rows' window starts
        self._trees: tuple[int, list[int], list[Tensor], list[list[int]]] | None = None  # rows' trees: (start slot, lengths
        # before them, each row's [n, n] ancestry of its nodes, their slots)
        # A static cache (the model's `cache`, model.cache=static; `static` overrides it): one sequence in preallocated
        # slots; `length` is the write position, a rollback moves it back. See `StaticSlots`.
        self.static = StaticSlots(lm) if (lm.cache == "static" if static is None else static) else None

    def reset(self, capacity: int = 0) -> None:
        """Forget everything: the next forward starts a new sequence (of about `capacity` tokens: a static
        cache's first size, grown when a forward needs more)."""
        self.cache = self.static.reset(capacity) if self.static else DynamicCache(config=self.model.config)
        self.length = 0
        self.lengths, self.valid, self.prefix = [], None, None

    @property
    def rows(self) -> int:
        """The sequences in the cache (after prefill_rows)."""
        return len(self.lengths)

    @property
    def _single(self) -> bool:
        """One sequence in the plain layout: its tokens fill the slots (no holes, no shared prefix)."""
        return self.rows == 1 and self.valid is None and self.prefix is None

    @property
    def _shared(self) -> int:
        """The tokens of the shared prefix (0: none), which no slot holds."""
        return self.prefix.length if self.prefix is not None else 0

    def prefill_rows(self, prompts: Sequence[Tensor], reuse: bool = False) -> Tensor:
        """Start B sequences: put each prompt ([T_b] token ids) into the cache, as row b.

        Args:
            prompts: B prompts.
            reuse: as in `_prefill` (a batch of one prompt repeated B times counts as that prompt).

        Returns:
            [B, V] the logits after each prompt's last token; None when every prompt is empty (a draft
            model's cache may start empty: its first forward feeds the whole context).
        """
        first = prompts[0]
        if not any(len(p) for p in prompts):
            if self.static:
                self.cache = self.static.rows(len(prompts))
            self.lengths, self.valid = [0] * len(prompts), None
            return None
        if all(p.shape == first.shape and torch.equal(p, first) for p in prompts[1:]):  # one prefill serves every row
            if self.static:
                self.cache = self.static.rows(1)
            logits = self._prefill(first, reuse)  # [1, V]
            self.lengths, self.valid = [len(first)] * len(prompts), None
            self.hidden_rows = [self.hidden] * len(prompts)
            if len(prompts) > 1 and shares_prefix(self.model):  # the prompt held once; the rows' slots start empty
                self.prefix = SharedPrefix.of(self.cache, len(first))
                self.cache = self.static.rows(len(prompts)) if self.static else DynamicCache(config=self.model.config)
                self.length = 0
            elif len(prompts) > 1 and self.static:
                self.cache = self.static.repeat(len(prompts), len(first))
            elif len(prompts) > 1:
                for layer in self._layers():
                    layer.keys, layer.values = layer.keys.repeat(len(prompts), 1, 1, 1), layer.values.repeat(len(prompts), 1, 1, 1)
            return logits.expand(len(prompts), -1)
        if self.static:
            self.cache = self.static.rows(len(prompts))
        self.lengths = [0] * len(prompts)
        self.valid = torch.zeros(len(prompts), self.length, dtype=torch.bool, device=self.device)
        hidden = self._rows_hidden(list(prompts), [None] * len(prompts))  # [B, W, H]
        last = hidden[torch.arange(len(prompts)), torch.tensor(self.lengths) - 1]  # [B, H]
        if bool(self.valid.all()):  # right-padded prompts: each row's tokens already come first
            self.valid = None
        return self.model.get_output_embeddings()(last)  # [B, V]

    def forward_rows(self, fed: Sequence[Tensor], parents: Sequence[Tensor | None], head: torch.nn.Module | None = None,
                     tree: int | None = None, padded: bool = False) -> list[Tensor] | Tensor:
        """Feed row b's tokens `fed[b]` ([n_b] >= 1: a chain, or a tree under `parents[b]`, as in
        `_forward`; [n_b, H] input embeddings for a model fed embeddings, such as EAGLE's head) after
        its cached ones, every row in one forward.

        A row may feed nothing (n_b = 0): a drafter's row that is done drafting while others go on.
        With `tree` (a slot: `length` when the rows' trees began), each row's nodes grow the tree it
        fed since then, level by level, as `forward(..., tree=)` does for one sequence: parents index
        the row's tree nodes in the order fed; a node sees the row's tokens before the tree and its
        own ancestors. `crop_rows` drops the trees again.

        Returns:
            [n_b, V] logits per row: row i of each is the distribution of the token after `fed[b][i]`; with
            `padded`, one [B, W, V] tensor instead (W >= every n_b; row b's first n_b positions are its own).
        """
        if self._single and len(fed[0]):  # one sequence: the plain forward (no mask for a chain)
            self._window = self.length
            logits = self._forward(fed[0], head=head, parents=parents[0], tree=tree)
            self.hidden_rows = [self.hidden]
            self.lengths = [self.length]
            return logits[None] if padded else [logits]
        hidden = self._rows_hidden(list(fed), list(parents), tree)  # [B, W, H]
        logits = (head or self.model.get_output_embeddings())(hidden)  # [B, W, V] ([B, W, N] with a head over N tokens)
        return logits if padded else [logits[b, : len(t)] for b, t in enumerate(fed)]

    def keep_rows(self, kept: Sequence[Sequence[int]]) -> None:
        """Keep, of the tokens each row fed in the last `forward_rows`, those at `kept[b]` (in order:
        the root and the accepted path, at least one), as `_keep` does for one sequence."""
        start = self._window
        if self._single:
            self._keep(start, list(kept[0]))
            self.lengths = [self.length]
            return
        width = max(len(k) for k in kept)
        if any(list(k) != list(range(len(k))) for k in kept):  # a tree's path: move it to the window's front
            index = torch.tensor([list(k) + [k[-1] if k else 0] * (width - len(k)) for k in kept], device=self.device)  # [B, W']
            _move_slots(self._layers(), start, index)
        self._crop(start + width)  # chains keep a prefix of what they fed: a crop, no copy
        filled = torch.arange(width, device=self.device) < torch.tensor([len(k) for k in kept], device=self.device)[:, None]  # [B, W']
        self.valid = torch.cat([self.valid[:, :start] if self.valid is not None else
                                torch.ones(len(kept), start, dtype=torch.bool, device=self.device), filled], dim=1)
        self.length = start + width
        self.lengths = [n + len(k) - self._fed[b] for b, (n, k) in enumerate(zip(self.lengths, kept))]
        if bool(self.valid.all()):
            self.valid = None

    def truncate_rows(self, lengths: Sequence[int]) -> None:
        """Drop each row's cached tokens beyond its first `lengths[b]` (`_rollback` for rows): their
        slots become holes, compacted away once they are as many as the tokens."""
        if self._single:
            self._rollback(lengths[0])
            self.lengths = [self.length]
            return
        if self.prefix is not None and min(lengths) < self.prefix.length:  # into the prompt the rows share: each row its own copy
            self._unshare()
        valid = self.valid if self.valid is not None else torch.ones(self.rows, self.length, dtype=torch.bool, device=self.device)
        own = torch.tensor(list(lengths), device=self.device)[:, None] - self._shared  # [B, 1] the slots a row keeps
        self.valid = valid & (valid.cumsum(1) <= own)  # [B, L] a row's first lengths[b] tokens
        self.lengths = [min(n, int(m)) for n, m in zip(self.lengths, lengths)]
        if self.length >= 2 * (max(self.lengths) - self._shared):
            self._compact_rows()
        elif bool(self.valid.all()):
            self.valid = None

    def _unshare(self) -> None:
        """Copy the shared prefix into every row's slots, before the row's own tokens, and share none: a
        row may then roll back into the prompt (a draft that re-encodes the context may part from its
        tokens there). Positions and each row's tokens are unchanged."""
        rows, shared = self.rows, self.prefix.length
        own = []  # per cache layer: (keys, values) [B, Hkv, P + L, D] the prefix, then the rows' slots; None where none are held
        for layer, keys, values in zip(self.cache.layers, self.prefix.keys, self.prefix.values):
            if keys is None:
                own.append(None)
                continue
            keys, values = keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1)
            if self.length:
                keys = torch.cat([keys, layer.keys[:, :, : self.length]], dim=2)
                values = torch.cat([values, layer.values[:, :, : self.length]], dim=2)
            own.append((keys.contiguous(), values.contiguous()))
        if self.static:
            self.static.rows(rows)  # (emptied: `own` holds copies)
            self.static.restore(own, shared + self.length)
            self.cache = self.static.cache
        else:
            for layer, slots in zip(self.cache.layers, own):
                if slots is not None:
                    if not getattr(layer, "is_initialized", False):
                        layer.lazy_initialization(*slots)
                    layer.keys, layer.values = slots
        valid = self.valid if self.valid is not None else torch.ones(rows, self.length, dtype=torch.bool, device=self.device)
        self.valid = torch.cat([torch.ones(rows, shared, dtype=torch.bool, device=self.device), valid], dim=1)
        if bool(self.valid.all()):
            self.valid = None
        self.length += shared
        self.prefix = None

    def crop_rows(self, slots: int, lengths: Sequence[int]) -> None:
        """Drop every slot from `slots` on, where each row then holds `lengths[b]` tokens (a drafter's
        trees, fed after slot `slots`, dropped after drafting)."""
        if self._single:
            self._rollback(slots)
            self.lengths = [self.length]
            return
        self._crop(slots)
        self.length, self.lengths = slots, list(lengths)
        self.valid = None if self.valid is None or bool(self.valid[:, :slots].all()) else self.valid[:, :slots]

    def select_rows(self, index: Sequence[int]) -> None:
        """Keep only the rows at `index` (in order): finished rows stop costing forwards. The cache
        is then compacted: every row's tokens first, holes only after a row's end."""
        at = torch.tensor(list(index), device=self.device)
        if self.static:
            self.static.select(at)
        else:
            for layer in self._layers():
                layer.keys, layer.values = layer.keys.index_select(0, at), layer.values.index_select(0, at)
        self.lengths = [self.lengths[i] for i in index]
        self.hidden_rows = [self.hidden_rows[i] for i in index] if self.hidden_rows else []
        if self.valid is not None:
            self.valid = self.valid.index_select(0, at)
            self._compact_rows()

    def _crop(self, slots: int) -> None:
        """Drop every slot from `slots` on (a static cache: write from there on)."""
        if self.static:
            self.static.seek(slots)
            return
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[:, :, :slots], layer.values[:, :, :slots]

    def _layers(self) -> list:
        """The cache's layers that hold tensors (a draft that skips layers leaves the others empty)."""
        return [layer for layer in self.cache.layers if getattr(layer, "keys", None) is not None]

    def _compact_rows(self) -> None:
        """Move each row's tokens to its first slots and crop the slots no row uses."""
        own = torch.tensor(self.lengths, device=self.device)[:, None] - self._shared  # [B, 1] each row's tokens in the slots
        width = int(own.max())
        index = (~self.valid).to(torch.uint8).sort(stable=True, dim=1).indices[:, :width]  # [B, W] each row's filled slots first, in order
        _move_slots(self._layers(), 0, index)
        self._crop(width)
        self.valid = torch.arange(width, device=self.device) < own  # [B, W]
        self.length = width
        if bool(self.valid.all()):
            self.valid = None

    def _rows_hidden(self, fed: list[Tensor], parents: list[Tensor | None], tree: int | None = None) -> Tensor:
        """[B, W, H] the final hidden states of each row's fed tokens (padded to the widest, W), fed
        after the cache into a new window of W slots (under `tree`: see `forward_rows`); `hidden_rows`
        keeps each row's [n_b, H]."""
        rows, dtype = len(fed), self.model.dtype
        n = [len(t) for t in fed]
        width = max(1, *n)
        ids = torch.nn.utils.rnn.pad_sequence([t.to(self.device) for t in fed], batch_first=True)  # [B, <= W] (ids; or [B, <= W, H] embeddings)
        ids = torch.nn.functional.pad(ids, (0, 0) * (ids.dim() - 2) + (0, width - ids.shape[1]))  # [B, W] ([B, W, H])
        filled = torch.arange(width) < torch.tensor(n)[:, None]  # [B, W] the slots a row's tokens take
        seen = torch.ones(width, width, dtype=torch.bool).tril() & filled[:, None, :] & filled[:, :, None]  # [B, W, W] a chain sees its tokens so far
        seen |= torch.eye(width, dtype=torch.bool) & ~filled[:, :, None]  # padding (a row with fewer tokens, or none) sees itself only
        depth = torch.arange(1, width + 1).expand(rows, width) * filled  # [B, W] each token's depth (a chain's i-th: i + 1)
        valid = self.valid if self.valid is not None else torch.ones(rows, self.length, dtype=torch.bool, device=self.device)
        cached = valid[:, None, :].expand(rows, width, -1)  # [B, W, L] the cached slots each fed token sees
        base = self.lengths  # the position after which row b's tokens (or its tree's) go on
        if tree is not None:
            cached, base = self._grow_trees(tree, parents, n, cached, seen, depth)
        elif any(p is not None for p in parents):
            for b, p in enumerate(parents):
                if p is not None:
                    seen[b, : n[b], : n[b]] = tree_ancestry(torch.ones(0, 0, dtype=torch.bool), p.cpu())
                    depth[b, : n[b]] = seen[b, : n[b], : n[b]].sum(-1)
        allowed = torch.cat([cached, seen.to(self.device)], dim=-1)  # [B, W, L + W]
        mask = torch.zeros(allowed.shape, dtype=dtype, device=self.device).masked_fill_(~allowed, torch.finfo(dtype).min)
        positions = torch.tensor(base)[:, None] + (depth - 1).clamp(min=0)  # [B, W]
        self._window, self._fed = self.length, n
        shared = {"prefix": self.prefix} if self.prefix is not None else {}
        if self.static:
            hidden = self.static.forward(ids, self.length, positions.to(self.device), mask[:, None], **shared)  # [B, W, H]
            self.cache = self.static.cache  # (a larger one when the rows outgrew it)
        else:
            hidden = self.model.base_model(**_inputs(ids), attention_mask=mask[:, None], position_ids=positions.to(self.device),
                                           cache=self.cache, use_cache=True, **shared).last_hidden_state  # [B, W, H]
        self.length += width
        self.valid = torch.cat([valid, filled.to(self.device)], dim=1)
        self.lengths = [length + f for length, f in zip(self.lengths, n)]
        self.hidden_rows = [hidden[b, :f] for b, f in enumerate(n)] if self.keep_hidden else []
        return hidden

    def _grow_trees(self, start: int, parents: list[Tensor | None], n: list[int], cached: Tensor, seen: Tensor,
                    depth: Tensor) -> tuple[Tensor, list[int]]:
        """For `_rows_hidden` under a tree begun at slot `start`: each row's new nodes see, of the
        slots from `start` on, only their ancestors' (`seen` and `depth` [B, W] are set in place).

        Returns:
            [B, W, L] the cached slots each new node sees, and each row's length before its tree.
        """
        if self.length == start:  # a new tree per row: no node yet
            self._trees = (start, list(self.lengths), [torch.ones(0, 0, dtype=torch.bool)] * len(n), [[] for _ in n])
        elif self._trees is None or self._trees[0] != start:
            raise ValueError(f"the slots cached since {start} are not trees fed by forward_rows()")
        _, base, known, slots = self._trees
        cached = cached.clone()
        cached[:, :, start:] = False
        for b, p in enumerate(parents):
            if not n[b]:
                continue
            old = known[b].shape[0]
            known[b] = tree_ancestry(known[b], p.cpu())  # [old + n_b, old + n_b]
            new = known[b][old:]  # [n_b, old + n_b] each new node's ancestors, itself included
            cached[b, : n[b], slots[b]] = new[:, :old].to(self.device)
            seen[b, : n[b], : n[b]] = new[:, old:]
            depth[b, : n[b]] = new.sum(-1)
            slots[b] = slots[b] + list(range(self.length, self.length + n[b]))
        return cached, base

    def _prefill(self, tokens: Tensor, reuse: bool = False) -> Tensor | None:
        """Put `tokens` ([T], may be empty) into the cache.

        Args:
            tokens: [T] token ids.
            reuse: keep a copy of this prefill, and restore it instead of recomputing when the next
                reusing prefill has the same tokens (many samples of one prompt).

        Returns:
            [1, V] the logits after the last token (the lm head runs on that position only), or None
            when `tokens` is empty.
        """
        if not len(tokens):
            return None
        if reuse and self._kept is not None and torch.equal(self._kept[0], tokens):
            if self.static:  # the slots keep their addresses (compiled graphs hold them): copy the prompt's back in
                self.static.restore(self._kept[1], len(tokens))
                self.cache = self.static.cache  # (a larger one when the prompt outgrew the slots reset gave)
            else:
                self.cache = copy.deepcopy(self._kept[1])
            self.length, self.hidden = len(tokens), self._kept[3]
            return self._kept[2]
        logits = self._run(tokens, logits_to_keep=1)
        if reuse:
            kept = self.static.copy(len(tokens)) if self.static else copy.deepcopy(self.cache)
            self._kept = (tokens.clone(), kept, logits, self.hidden)
        return logits

    def _forward(
        self, tokens: Tensor, head: torch.nn.Module | None = None, parents: Tensor | None = None, tree: int | None = None
    ) -> Tensor:
        """Feed `tokens` ([K]) after the cached ones: a chain, or a tree under a tree attention mask.

        Args:
            tokens: [K] token ids.
            head: an lm head over N tokens to score with instead of the model's own ([K, H] -> [K, N]:
                a draft restricted to N tokens, see drafters.draft_model).
            parents: [K] for a tree: each token's parent, an index among the tree's nodes (the
                tokens fed since cache length `tree`, this call's included), -1 for a token that
                follows the cache before the tree; parents come before children. Each token then
                attends to that cache and its own ancestors only, at position (tree start + depth
                − 1), so its logits equal those of its path decoded as a chain. None = a chain.
            tree: where the tree starts in the cache: None = here (a new tree); the start of the
                tree fed by the previous calls, to grow it level by level (a drafter expanding a tree).

        Returns:
            [K, V] logits (or [K, N] with `head`): row i is the distribution of the token after tokens[i].
        """
        extra = {} if parents is None else self._tree_inputs(parents, tree)
        if head is None:
            return self._run(tokens, logits_to_keep=0, **extra)
        return head(self._hidden_states(tokens, **extra))  # [K, H] -> [K, N]

    def _rollback(self, length: int) -> None:
        """Drop cached tokens beyond the first `length` (after a rejection)."""
        if length < self.length:
            if self.static:
                self.static.seek(length)
            else:
                self.cache.crop(length - self.length)  # transformers 5: a negative count drops the newest tokens
            self.length = length

    def _keep(self, start: int, rows: list[int]) -> None:
        """Keep, of the tokens cached since length `start`, only those at `rows` (in order): the
        accepted path of a tree. The cache then equals a prefill of that path (a select, no
        recomputation); a path that is a prefix of the fed tokens is a plain rollback."""
        if rows == list(range(len(rows))):
            self._rollback(start + len(rows))
            return
        index = torch.tensor(rows, device=self.device) + start  # [R]
        if self.static:
            self.static.keep(start, index)
            self.length = start + len(rows)
            return
        for layer in self.cache.layers:
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(-2, index)], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(-2, index)], dim=-2)
        self.length = start + len(rows)

    def _tree_inputs(self, parents: Tensor, start: int | None) -> dict[str, Tensor]:
        """The 4D additive attention mask ([1, 1, K, L + K]) and position ids ([1, K]) of K tree
        nodes: a new tree (start None), or more nodes of the tree cached since `start`."""
        start = self.length if start is None else start
        known = torch.ones(0, 0, dtype=torch.bool)
        if self.length > start and self._tree is not None and self._tree[0] == start:
            known = self._tree[1]
        if known.shape[0] != self.length - start:
            raise ValueError(f"the {self.length - start} tokens cached since {start} are not a tree fed by forward()")
        ancestors, mask, positions = tree_attention(known, parents, self.length, start, self.model.dtype)
        self._tree = (start, ancestors)
        return {"attention_mask": mask.to(self.device), "position_ids": positions[None].to(self.device)}

    @torch.inference_mode()  # (as the engine decodes: graphs made with grad mode on would be made again)
    def precompile(self, upto: int = 64, hidden: bool = False) -> None:
        """With a compiled decoder (model.compile=true): make its graph for every compiled width up to the one
        that holds `upto` tokens now, a warm-up (a forward of that width at the write position, rolled back),
        so a timed decode meets no compilation. Call it after `reset(capacity)`: the graphs hold these slots.
        `hidden`: the graphs that end at the hidden states (a drafter that reads them, or a head of its
        own), not at the model's logits (see `StaticSlots.forward`)."""
        if not (self.static and self.lm.compile):
            return
        start = self.length
        for width in StaticSlots.COMPILED_WIDTHS:
            self._static_forward(torch.zeros(1, width, dtype=torch.long, device=self.device), logits=None if hidden else 0)
            self._rollback(start)
            if width >= upto:
                break

    def _static_forward(self, ids: Tensor, logits: int | None = None, **extra: Tensor) -> Tensor:
        """[1, K, H] the final hidden states of `ids` ([1, K] or [1, K, H]) fed at the static cache's write
        position: a chain (causal) or a tree (`extra`'s mask and positions), see `StaticSlots.forward`;
        with `logits` (an int), the model's logits of the last `logits` of them instead (0: all)."""
        k = ids.shape[1]
        mask = extra.get("attention_mask")  # [1, 1, K, length + K] a tree's, else None: a chain
        positions = extra.get("position_ids")
        if positions is None:
            positions = torch.arange(self.length, self.length + k, device=self.device)[None]  # [1, K]
        out = self.static.forward(ids, self.length, positions, mask, logits=logits)
        self.cache = self.static.cache  # (a larger one when the sequence outgrew it)
        self.length += k
        return out

    def _hidden_states(self, tokens: Tensor, **extra: Tensor) -> Tensor:
        """[K, H] the base model's final (normed) hidden states of `tokens`, fed after the cache."""
        if self.static:
            return self._static_forward(tokens.to(self.device)[None], **extra)[0]
        out = self.model.base_model(**_inputs(tokens.to(self.device)[None]), cache=self.cache, use_cache=True, **extra)
        self.length += len(tokens)
        return out.last_hidden_state[0]

    def _run(self, tokens: Tensor, logits_to_keep: int, **extra: Tensor) -> Tensor:
        if self.static and not self.keep_hidden:  # logits from the static slots (compiled: the lm head in the graph)
            return self._static_forward(tokens.to(self.device)[None], logits=logits_to_keep, **extra)[0]
        if self.keep_hidden:  # the base model, then the lm head on the rows asked for
            hidden = self.hidden = self._hidden_states(tokens, **extra)  # [K, H]
            return self.model.get_output_embeddings()(hidden[-logits_to_keep:])  # [K or 1, V]
        out = self.model(
            **_inputs(tokens.to(self.device)[None]),  # [1, K]
            cache=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **extra,
        )
        self.length += len(tokens)
        return out.logits[0]  # [K, V]


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
        when this one has fewer slots: a Target reset without the prompt's size, as a draft model's is)."""
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
        out = decoder(**_inputs(ids), attention_mask=causal, position_ids=positions, cache=self.cache, use_cache=True, **shared)
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
    width and per Target's slots): with `logits` the whole causal LM (decoder and lm head, as transformers
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


def _inputs(x: Tensor) -> dict[str, Tensor]:
    """A forward's inputs: [B, K] token ids, or [B, K, H] input embeddings (a draft head's, see drafters.eagle)."""
    return {"inputs_embeds": x} if x.is_floating_point() else {"input_ids": x}


def _move_slots(layers: list, start: int, index: Tensor) -> None:
    """In every layer, row b's slots `start + index[b]` ([B, W]) copied to slots start..start + W - 1."""
    for layer in layers:
        layer.keys[:, :, start : start + index.shape[1]] = _gather_slots(layer.keys[:, :, start:], index)
        layer.values[:, :, start : start + index.shape[1]] = _gather_slots(layer.values[:, :, start:], index)


def _gather_slots(cache: Tensor, index: Tensor) -> Tensor:
    """[B, H, W, D] the slots `index` ([B, W]) of each row of a [B, H, L, D] cache tensor."""
    b, h, _, d = cache.shape
    return cache.gather(2, index[:, None, :, None].expand(b, h, index.shape[1], d))


COST_SIZES = (1, 2, 3, 5, 9, 17, 33, 65, 129)  # tokens per verification forward measured for a tree's sizing (shape=auto)


@torch.inference_mode()
def forward_seconds(lm: LoadedModel, ids: list[int], sizes: list[int], repeats: int = 3) -> list[float]:
    """The model's measured seconds for a forward of n tokens after `ids`, for each n in `sizes` (the
    fastest of `repeats`: noise only adds).

    Args:
        lm: the model, as it will run (device, dtype, kernels).
        ids: [T] the context the forwards follow (T >= 2).
        sizes: numbers of tokens to feed (>= 1).
        repeats: timings of each size.
    """
    model = Target(lm)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    model.reset()
    model.prefill_rows([torch.tensor(ids[:-1])])

    def seconds(n: int) -> float:
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.forward_rows([torch.tensor(ids[-1:] * n)], [None])
            sync()
            runs.append(time.perf_counter() - t0)
            model.truncate_rows([len(ids) - 1])
        return min(runs)

    times = {n: seconds(n) for n in sorted(set(sizes))}
    return [times[n] for n in sizes]


def cost_curve(lm: LoadedModel, ids: list[int], sizes: list[int], repeats: int = 3) -> list[float]:
    """The model's measured cost of a forward of n tokens after `ids`, over one token's, for each n in
    `sizes` (see `forward_seconds`): the v(n) that speculative decoding's predictions (Leviathan's k,
    a tree's size) are made with."""
    one, *times = forward_seconds(lm, ids, [1, *sizes], repeats)
    return [t / one for t in times]


def kept_cost_curve(lm: LoadedModel, sizes: list[int]) -> tuple[list[float], float]:
    """`cost_curve` at `sizes` (after 129 tokens) and the seconds of one token's forward, measured once
    per machine and model and kept in the model cache: <cache>/costs/<model>/<key>.json, the key
    hashing what the costs depend on (models.machine_tags: processor or GPU, threads, torch, dtype,
    device; the model's config, KV cache kind, compile and kernels), not its weights. Sizes not kept
    yet are measured and added; delete the file to measure again (e.g. after a driver update). A
    cache that cannot be written only costs the measurement again."""
    setup = {**machine_tags(lm), "config": lm.model.config.to_json_string(use_diff=False), "cache": lm.cache,
             "compile": lm.compile, "skinny": any(isinstance(m, SkinnyLinear) for m in lm.model.modules())}
    key = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(lm.cache_dir or default_cache_dir()) / "costs" / lm.name.replace("/", "--") / f"{key}.json"
    kept, v = _read_costs(path)
    missing = [n for n in sizes if n not in v]
    if missing or "one_token_s" not in kept:
        one, *seconds = forward_seconds(lm, list(range(2, 131)), [1, *missing])  # any 129 tokens: costs, not content
        v.update({n: t / one for n, t in zip(missing, seconds)})
        kept = {"model": lm.name, "machine": {k: setup[k] for k in setup if k != "config"}, "one_token_s": kept.get("one_token_s", one),
                "v": {str(n): v[n] for n in sorted(v)}, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:  # whole or not at all: a run beside this one reads either file, never half of one
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(kept, indent=1))
            tmp.replace(path)
        except OSError:
            pass
    return [v[n] for n in sizes], float(kept["one_token_s"])


def _read_costs(path: Path) -> tuple[dict, dict[int, float]]:
    """A kept cost file (kept_cost_curve) and its v by size, or ({}, {}) when there is none; a file that is
    not a mapping with a positive finite `one_token_s` and positive finite v values (damaged, edited,
    NaN) is set aside with one line saying so, to be measured again."""
    try:
        text = path.read_text()
    except OSError:
        return {}, {}
    try:
        kept = json.loads(text)
        v = {int(n): float(x) for n, x in kept["v"].items()}
        one = float(kept["one_token_s"])
        if not all(math.isfinite(x) and x > 0 for x in [one, *v.values()]):
            raise ValueError("values must be positive and finite")
        return kept, v
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        log.warning(f"warning: the kept cost file {path} is not usable ({type(err).__name__}: {err}): measuring again")
        return {}, {}


def interpolated(sizes: Sequence[int], values: Sequence[float]) -> Callable[[int], float]:
    """A function of m from its values at `sizes` (increasing): linear in between, constant beyond."""
    def at(m: int) -> float:
        for (a, va), (b, vb) in zip(zip(sizes, values), zip(sizes[1:], values[1:])):
            if a <= m <= b:
                return va + (vb - va) * (m - a) / (b - a)
        return values[0] if m < sizes[0] else values[-1]

    return at


def tree_attention(known: Tensor, parents: Tensor, length: int, start: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """The attention of K more tree nodes fed after a cache of `length` tokens whose tree began at `start`.

    Args:
        known: [n, n] bool ancestry of the n tree nodes cached since `start` (row i: node i and its ancestors).
        parents: [K] each new node's parent among the tree's nodes (these included), -1 = the token before the tree.
        length, start: the cache's length (n = length - start) and where the tree began.
        dtype: the mask's dtype.

    Returns:
        [n + K, n + K] the ancestry with the new nodes (`tree_ancestry`), the [1, 1, K, length + K] additive
        mask (each new node sees the cache before the tree, its ancestors and itself), and [K] positions
        (start + depth - 1: a node sits where its path, decoded as a chain, would put it).
    """
    ancestors = tree_ancestry(known, parents)
    rows = ancestors[known.shape[0] :]  # [K, n + K]
    mask = torch.zeros(1, 1, rows.shape[0], length + rows.shape[0], dtype=dtype)  # [1, 1, K, L + K]
    mask[0, 0, :, start:].masked_fill_(~rows, torch.finfo(dtype).min)
    return ancestors, mask, start + rows.sum(-1) - 1


def tree_ancestry(known: Tensor, parents: Tensor) -> Tensor:
    """[n + K, n + K] bool: the ancestry `known` ([n, n], row i: node i and its ancestors) of a tree's n
    nodes, grown by K nodes under `parents` ([K], indices among all n + K nodes, -1 = the tree's root)."""
    n, k = known.shape[0], parents.numel()
    ancestors = torch.zeros(n + k, n + k, dtype=torch.bool)
    ancestors[:n, :n] = known
    if k and int(parents.max()) < n:  # a new level: every parent known, one gather
        ancestors[n:] = ancestors[parents.clamp(min=0)] & (parents >= 0)[:, None]
        ancestors[n:, n:] |= torch.eye(k, dtype=torch.bool)
        return ancestors
    for i, parent in enumerate(parents.tolist(), start=n):
        ancestors[i, i] = True
        if parent >= 0:
            ancestors[i] |= ancestors[parent]
    return ancestors


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
