"""Lookahead decoding (Fu et al., 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding"): the target drafts for itself by Jacobi iteration on a window of guessed future
tokens; the n-grams along the Jacobi trajectories fill a pool, and the pool's n-grams that start with
the last token are verified in the same target forward. No second model, no training."""

from __future__ import annotations

import torch
from torch import Tensor

from specresearch.drafters.base import Context, Drafter
from specresearch.options import drafters as options
from specresearch.options import make
from specresearch.types import Draft, Trie, Verdict


class LookaheadDrafter(Drafter):
    """Each step feeds one tree after the last committed token (the root):

    - the *verification branch*: up to G pool n-grams that start with the root, N − 1 tokens each,
      merged into a trie (deterministic proposals, q = None, verified by multi-step speculative
      sampling: lossless with greedy and with rejection sampling);
    - the *lookahead branch* (scratch nodes): a window of N − 1 levels × W columns, where
      `levels[j, i]` guesses the token at position j + i after the root (`levels[0, 0]` is the root
      itself). Level 0 is a chain from the root; level j ≥ 1 of column i attends to level 0 up to
      column i and to levels 1..j of column i (the paper's mask), at position j + i.

    The target's argmax on the top level gives a new guess for positions N − 1 + i (one Jacobi
    step); the n-gram of each column, levels[0..N−2, i] + new[i], goes to the pool (at most G per
    first token, the most recent first). The window then moves with the committed tokens: after m
    tokens the guess for position r is the old guess for r + m, in the same column where the
    trajectory has one, else from the new top level.
    """

    name = "lookahead"
    # The law tests read a sequence's first tokens, drafted before the Jacobi window has filled the pool:
    # the mode whose pool holds the prompt's n-grams from the first step is the one whose drafts land there
    # (the default drafts from the same pool by the same rule, filled later).
    modes = {"pool from prompt": ("pool_from_prompt=true",)}

    Settings = options.Lookahead

    def __init__(self, target=None, **given):
        """
        Args:
            target: unused (the config passes it to every drafter).
            **given: the settings (`Settings`): W = window, the Jacobi window's width (the lookahead
                positions per level); N = ngram, the n-gram size (N − 1 levels in the window, proposals
                of N − 1 tokens); G = guesses, the most pool n-grams verified per step (and kept per
                first token); pool_from_prompt. The rest at their defaults.
        """
        s = self.settings = make(self.Settings, given)
        self.W, self.N, self.G = s.window, s.ngram, s.guesses
        self.pool_from_prompt = s.pool_from_prompt
        self.depth = self.N - 1  # the longest proposal
        self.windows: list[Window] = []  # each row's pool and Jacobi window
        self._scratch_parents = self._window_parents()  # [M]: -1 = root, else index among scratch nodes
        self._top = torch.arange(self.W) + (self.N - 2) * self.W - 1  # [W] the top level's scratch rows

    def prefill_rows(self, ctxs: list[Context]) -> None:
        super().prefill_rows(ctxs)
        self.windows = [Window(self, ctx) for ctx in ctxs]

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        """Each row's tree from its own pool and window (a dict and a small tensor per row: O(1) Python per row)."""
        drafts = []
        for window, ctx in zip(self.windows, ctxs):
            device = ctx.tokens.device
            depth = min(self.N - 1, ctx.max_draft)
            if depth <= 0:
                drafts.append(Draft.empty(device))
                continue
            tokens, parents = window.trie(int(ctx.tokens[-1]), depth)
            n = len(tokens)
            scratch = window.levels.flatten()[1:]  # [M]: level 0 from column 1, then levels 1.. (row-major)
            scratch_parents = torch.where(self._scratch_parents < 0, -1, self._scratch_parents + n)
            drafts.append(Draft(tokens=torch.cat([torch.tensor(tokens, dtype=torch.long), scratch]).to(device),
                                parents=torch.cat([torch.tensor(parents, dtype=torch.long), scratch_parents]), scratch=scratch.numel()))
        return drafts

    def observe_row(self, b: int, logits: Tensor) -> None:
        self.windows[b].new = logits[self._top.to(logits.device)].argmax(-1).cpu()  # [W] one Jacobi step on the top level

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        for window, ctx, verdict in zip(self.windows, ctxs, verdicts):
            window.commit(ctx, verdict)

    def select_rows(self, index: list[int]) -> None:
        super().select_rows(index)
        self.windows = [self.windows[i] for i in index]

    def _window_parents(self) -> Tensor:
        """[M] the lookahead branch's parents among the scratch nodes (-1 = root): level 0 is a chain
        from the root; level j ≥ 1 of column i follows level j − 1 of column i."""
        def at(j: int, i: int) -> int:  # the scratch index of levels[j, i]; -1 for levels[0, 0] = the root
            return j * self.W + i - 1

        parents = [at(0, i - 1) for i in range(1, self.W)]
        parents += [at(j - 1, i) for j in range(1, self.N - 1) for i in range(self.W)]
        return torch.tensor(parents, dtype=torch.long)


class Window:
    """One row's lookahead state: its n-gram pool and its Jacobi window (see LookaheadDrafter)."""

    def __init__(self, lookahead: LookaheadDrafter, ctx: Context | None = None):
        """A new sequence's, whose tokens are ctx.tokens: the window starts from random prompt tokens (the
        paper's start; any start converges by iteration), the pool empty or, with pool_from_prompt, the
        prompt's n-grams. Without ctx: an empty pool and window."""
        self.N, self.W, self.G = lookahead.N, lookahead.W, lookahead.G
        self.pool: dict[int, list[tuple[int, ...]]] = {}  # first token -> continuations (N − 1 tokens), newest first
        self.levels = torch.zeros(self.N - 1, self.W, dtype=torch.long)  # [N−1, W]
        self.new: Tensor | None = None  # [W] the target's argmax on the top level, from the last forward
        if ctx is None:
            return
        prompt = ctx.tokens.cpu()
        if lookahead.pool_from_prompt:
            for gram in prompt.unfold(0, self.N, 1).tolist() if prompt.numel() >= self.N else []:
                self.remember(gram)
        pick = torch.randint(prompt.numel(), (self.N - 1, self.W), generator=ctx.rng, device=ctx.rng.device).cpu()
        self.levels = prompt[pick]  # [N−1, W]

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        """Pool the last forward's n-grams and move the window by the committed tokens."""
        m = verdict.tokens.numel()
        levels = self.levels.clone()
        levels[0, 0] = int(ctx.tokens[-m - 1])  # this step's root
        new = self.new if self.new is not None else levels[-1]
        if self.new is not None:
            for gram in torch.cat([levels, new[None]]).T.tolist():  # [W, N]: one n-gram per column
                self.remember(gram)
        self.new = None
        # Positions are relative to the root, which moved m tokens: the guess for r is the old one for r + m.
        ext = torch.cat([levels, new[None]])  # [N, W]: row j guesses positions j + i
        rows = []
        for j in range(self.N - 1):
            src = j + m
            if src <= self.N - 1:
                rows.append(ext[src])
            else:  # beyond the top level: the top level's guesses further right, the last one repeated
                top = ext[-1, min(src - (self.N - 1), self.W - 1) :]
                rows.append(torch.cat([top, top[-1:].expand(self.W - top.numel())]))
        self.levels = torch.stack(rows)

    def remember(self, gram: list[int]) -> None:
        """Put an n-gram in the pool, most recent first, at most G per first token."""
        grams = self.pool.setdefault(gram[0], [])
        cont = tuple(gram[1:])
        if cont in grams:
            grams.remove(cont)
        grams.insert(0, cont)
        del grams[self.G :]

    def trie(self, root: int, depth: int) -> tuple[list[int], list[int]]:
        """The pool's continuations of `root`, cut to `depth` tokens, merged into a trie:
        (tokens, parents) with parents before children, -1 = the root."""
        trie = Trie()
        for cont in self.pool.get(root, []):
            node = -1
            for tok in cont[:depth]:
                node = trie.add(node, tok)
        return trie.tokens, trie.parents
