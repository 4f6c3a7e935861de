"""A draft model from another family, whose tokenizer differs from the target's (Timor et al., 2025,
"Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies"; transformers' Universal Assisted Generation)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch
from torch import Tensor

from specresearch.drafters.base import Chain, Context, Drafter, common_prefix
from specresearch.drafters.draft_model import DraftModel, cheapen, split_spec
from specresearch.drafters.independent import ChainSizing
from specresearch.drafters.ngram import lookup
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel, load_model, logit_width
from specresearch.options import drafters as options
from specresearch.options import make
from specresearch.types import Draft, SamplingParams, Siblings, Verdict
from specresearch.vocab import Bridge, Shortlist

GREEDY = SamplingParams()


class CrossVocabDrafter(Drafter):
    """A draft model with its own vocabulary proposes k tokens a step, in one of two ways:

    - "string" (SLEM's drafting, and transformers' UAG): the draft's k argmax tokens are turned into
      text and the text into the target's tokens (up to the step's draft length). Deterministic
      (q = None), so greedy and rejection verification keep it lossless at any temperature; the
      target may split the text into more or fewer tokens than the draft did.
    - "shared" (TLI): the draft proposes only tokens that the target's vocabulary has too (the same
      bytes): its law restricted to them and renormalised, after the same temperature / top-k /
      top-p as p, which is the q it samples from (mapped to the target's ids), so rejection
      sampling is exact; greedy takes the argmax among them. The draft's lm head scores only those
      rows (a shortlist). With `siblings`, a tree whose spine is the chain (as drafter=independent's).

    Each step the target's context is written in the draft's tokens (its text re-encoded); the draft
    keeps its KV cache and rolls it back to the longest prefix this encoding shares with what it
    holds (its last draft included), so it re-reads only where the texts' tokens part, as the papers do.
    With `lookup`, each draft forward also feeds prompt lookup's guesses in the draft's own tokens
    (drafter=independent's cascade): the same chain in fewer draft forwards. With `shape=auto` (mode
    "shared", whose chain is one of target tokens) the chain's length follows this machine's cost curve as
    drafter=independent's does (`ChainSizing`).
    """

    name = "cross_vocab"
    modes = {"string": ("mode=string",), "shared": ("mode=shared",),
             "shared, cheap draft, confidence": ("mode=shared", "model.vocab=200", "model.vocab_corpus=mtbench", "model.quantize=int8",
                                                 "k=6", "chain_confidence=0.05"),
             "shared, siblings, lookup": ("mode=shared", "siblings=2", "lookup=4", "k=6"),
             "shared, shape auto": ("mode=shared", "shape=auto", "siblings=1", "k=6")}

    Settings = options.CrossVocab

    def __init__(self, target: LoadedModel, model: Mapping | LoadedModel | None = None, **given):
        """
        Args:
            target: the target model.
            model: the draft model: load_model() arguments (name, dtype, ...) plus `vocab`,
                `vocab_corpus`, `quantize` (drafters.draft_model.cheapen), or a LoadedModel.
            **given: the settings (`Settings`: k, mode, k_policy, k_max, confidence, chain_confidence,
                lookup, siblings, sibling_confidence, shape), the rest at their defaults. "string": the target
                tokens proposed are at most the step's draft length too; the confidence stops read the
                draft's q when sampled, its softmax when greedy. Lossless: stops, sizing and guesses depend on
                the draft, the clock and past verdicts alone.
        """
        s = self.settings = make(self.Settings, given)
        self.confidence, self.chain_confidence = s.confidence or 0.0, s.chain_confidence or 0.0
        if model is None:
            raise SpecResearchError("drafter=cross_vocab needs a draft model: set drafter.model.name")
        self.mode = s.mode
        self.lookup, self.siblings = s.lookup, Siblings(s.siblings, s.sibling_confidence)
        mode = s.mode
        if isinstance(model, LoadedModel):
            lm, options = model, {}
        else:
            spec, options = split_spec(model)
            lm = load_model(**spec)
        self.bridge = Bridge(target.tokenizer, lm.tokenizer, logit_width(target), logit_width(lm))
        if mode == "shared" and not len(self.bridge.shared):
            raise SpecResearchError(f"drafter.mode=shared: draft '{lm.name}' and target '{target.name}' share no token; "
                                    "use drafter.mode=string")
        allowed = self.bridge.shared if mode == "shared" else None
        self.draft: DraftModel = cheapen(lm, target, own_vocab=True, allowed=allowed, **options)
        own = self.draft.shortlist  # the draft tokens its head scores (None: all of them)
        self.rows = own  # what the chain's tokens are: the scored rows' ids (draft ids; target ids in mode "shared")
        if mode == "shared":  # the shared tokens' twins are one to one: the scored rows as target tokens
            twins = self.bridge.twin.to(own.ids.device)[own.ids]  # [S]
            self.rows = Shortlist(twins, own.head, self.bridge.target_vocab)
            self.draft_of = torch.full((self.bridge.target_vocab,), -1, dtype=torch.long, device=twins.device)
            self.draft_of.index_copy_(0, twins, own.ids)
        self.ids: list[list[int]] = []  # each row's draft tokens in the cache, in order
        self.sizing = ChainSizing.of(target, s)
        self._chains: list[Chain | None] = []  # each row's chain of the last step (None: it drafted none)

    @property
    def predicted_speedup(self) -> float | None:
        """shape=auto: the speedup over plain decoding its stops predicted, over the steps so far."""
        return None if self.sizing is None else self.sizing.predicted_speedup

    def prefill_rows(self, ctxs: list[Context]) -> None:
        super().prefill_rows(ctxs)
        if self.sizing is not None:
            self.sizing.prefill(len(ctxs))
        encoded: dict[tuple[int, ...], list[int]] = {}  # a prompt repeated (many samples of one prompt) is encoded once
        self.ids = []
        for ctx in ctxs:
            tokens = tuple(ctx.tokens.tolist())
            if tokens not in encoded:
                encoded[tokens] = self.bridge.to_draft(list(tokens))[:-1]  # (the last one is fed by the first propose)
            self.ids.append(list(encoded[tokens]))
        self.draft.reset()
        self.draft.prefill_rows([torch.tensor(ids, dtype=torch.long, device=self.draft.device) for ids in self.ids],
                                reuse=ctxs[0].reuse_prefill)

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        """Every row's draft: each row's context re-encoded in the draft's tokens and its cache rolled back
        to what that encoding shares with it (into a prompt the rows share too: CachedLM.truncate_rows),
        then one draft forward per level feeds each row still drafting its pending tokens and lookup
        guesses (ragged rows, each in its own slots of the draft's cache)."""
        begun = [self._begin(ctx, ids) for ctx, ids in zip(ctxs, self.ids)]
        self.draft.truncate_rows([len(ids) if start is None else start[1] for ids, start in zip(self.ids, begun)])
        contexts = [[] if start is None else start[0] for start in begun]
        chains = [None if start is None else self._chain(ctx) for ctx, start in zip(ctxs, begun)]
        drafted: list[list[int]] = [[] for _ in ctxs]  # each row's chain in the draft's tokens
        # each row's draft tokens its cache has not seen: [>= 1] where it drafts, else [0]
        pending = [self._tokens([] if start is None else context[start[1] :]) for context, start in zip(contexts, begun)]

        def guess(b: int) -> Tensor:  # [G_b] draft tokens
            return self._tokens(self._guess(contexts[b] + drafted[b], ctxs[b].max_draft - len(drafted[b]) - 1))

        def walk(b: int, logits: Tensor, guessed: Tensor) -> tuple[int, Tensor, bool]:
            i, done = self._walk(b, ctxs[b], chains[b], logits, guessed.tolist(), drafted[b])
            return i, self._tokens(drafted[b][-1:]), done

        if self.sizing is not None:
            self.sizing.begin(self.row_forwards, chains)
        self.draft.draft_chains(pending, guess, walk, self.count)
        self._chains = chains
        if self.sizing is not None:
            self.sizing.end(chains)
        for b, start in enumerate(begun):
            if start is not None:
                self.ids[b] = contexts[b] + drafted[b][:-1]  # the last token was not fed
        return [Draft.empty(ctx.tokens.device) if start is None else self._draft(ctx, chain, tokens)
                for ctx, start, chain, tokens in zip(ctxs, begun, chains, drafted)]

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        if self.sizing is not None:  # (each step re-reads the context: nothing else to roll back)
            self.sizing.commit(self._chains, verdicts)

    def select_rows(self, index: list[int]) -> None:
        super().select_rows(index)
        self.draft.select_rows(index)
        self.ids = [self.ids[i] for i in index]
        self._chains = [self._chains[i] for i in index] if self._chains else []

    def _begin(self, ctx: Context, ids: list[int]) -> tuple[list[int], int] | None:
        """The context in the draft's tokens, and how many of `ids` (the draft tokens its cache holds)
        that encoding keeps (at most all but its last token); None when there is nothing to draft."""
        if ctx.max_draft <= 0:
            return None
        context = self.bridge.to_draft(ctx.tokens.tolist())
        if not context:  # the context has no text the draft can read
            return None
        return context, common_prefix(ids, context, len(context) - 1)

    def _chain(self, ctx: Context) -> Chain:
        """A new step's chain: the draft's law ("shared"), or its argmax at any T ("string")."""
        steered = ctx if self.mode == "shared" else replace(ctx, sampling=GREEDY)
        return Chain(steered, self.rows, self.siblings, scored=bool(self.confidence or self.chain_confidence or self.sizing))

    def _walk(self, b: int, ctx: Context, chain: Chain, logits: Tensor, guess: list[int], drafted: list[int]) -> tuple[int, bool]:
        """Add the draft's token of each row of `logits` ([G + 1, V_d or S]; row i: its law after the
        pending tokens and guess[:i]) to row b's chain, and to `drafted` in the draft's tokens, while it
        repeats the guess. Returns (i, whether the chain is drafted): guess[:i] became the chain's."""
        for i, row in enumerate(logits):
            token = chain.add(row)
            x = int(token) if self.mode == "string" else int(self.draft_of[token])
            drafted.append(x)
            ahead = i < len(guess) and x == guess[i]  # the next token's law is in this forward already
            left = ctx.max_draft - len(drafted)
            done = (left == 0 or x == self.bridge.draft_eos or chain.confidence < self.confidence
                    or chain.path < self.chain_confidence
                    or (self.sizing is not None and not self.sizing.pays(b, chain, ahead, self.row_forwards, left)))
            if done or not ahead:
                break
        return i, done

    def _draft(self, ctx: Context, chain: Chain, drafted: list[int]) -> Draft:
        """The step's draft in the target's tokens: the chain's ("shared"), or the drafted text's ("string")."""
        if self.mode == "shared":
            return chain.draft()
        tokens = torch.tensor(self.bridge.to_target(drafted)[: ctx.max_draft], dtype=torch.long)
        return Draft(tokens=tokens.to(ctx.tokens.device), q=None)

    def _tokens(self, ids: list[int]) -> Tensor:
        """[n] draft token ids, on the draft's device."""
        return torch.tensor(ids, dtype=torch.long, device=self.draft.device)

    def _guess(self, tokens: list[int], want: int) -> list[int]:
        """Prompt lookup's continuation (at most min(lookup, want) draft tokens) of `tokens`' last n-gram."""
        if min(self.lookup, want) <= 0:
            return []
        return lookup(torch.tensor(tokens), min(self.lookup, want), match="last").tolist()

