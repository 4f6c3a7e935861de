"""The one KV-cache wrapper: a causal LM that owns its KV cache, feeds tokens through it, and rolls it
back exactly after a rejection (no recomputation of the accepted prefix). The target runs in one (the
engine's `kv`); draft models use the same wrapper for their own cache."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import DynamicCache

from specresearch.attention import SharedPrefix, shares_prefix
from specresearch.kv.static import StaticSlots, model_inputs, move_slots
from specresearch.kv.trees import tree_ancestry, tree_attention
from specresearch.models import LoadedModel


class CachedLM:
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
            move_slots(self._layers(), start, index)
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
        move_slots(self._layers(), 0, index)
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
        # [B, <= W] ids (or [B, <= W, H] embeddings)
        ids = torch.nn.utils.rnn.pad_sequence([t.to(self.device) for t in fed], batch_first=True)
        ids = torch.nn.functional.pad(ids, (0, 0) * (ids.dim() - 2) + (0, width - ids.shape[1]))  # [B, W] ([B, W, H])
        filled = torch.arange(width) < torch.tensor(n)[:, None]  # [B, W] the slots a row's tokens take
        # [B, W, W]: a chain sees its tokens so far
        seen = torch.ones(width, width, dtype=torch.bool).tril() & filled[:, None, :] & filled[:, :, None]
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
            hidden = self.model.base_model(**model_inputs(ids), attention_mask=mask[:, None], position_ids=positions.to(self.device),
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
        out = self.model.base_model(**model_inputs(tokens.to(self.device)[None]), cache=self.cache, use_cache=True, **extra)
        self.length += len(tokens)
        return out.last_hidden_state[0]

    def _run(self, tokens: Tensor, logits_to_keep: int, **extra: Tensor) -> Tensor:
        if self.static and not self.keep_hidden:  # logits from the static slots (compiled: the lm head in the graph)
            return self._static_forward(tokens.to(self.device)[None], logits=logits_to_keep, **extra)[0]
        if self.keep_hidden:  # the base model, then the lm head on the rows asked for
            hidden = self.hidden = self._hidden_states(tokens, **extra)  # [K, H]
            return self.model.get_output_embeddings()(hidden[-logits_to_keep:])  # [K or 1, V]
        out = self.model(
            **model_inputs(tokens.to(self.device)[None]),  # [1, K]
            cache=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **extra,
        )
        self.length += len(tokens)
        return out.logits[0]  # [K, V]
