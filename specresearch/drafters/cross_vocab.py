"""A draft model from another family, whose tokenizer differs from the target's (Timor et al., 2025,
"Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for Heterogeneous
Vocabularies"; transformers' Universal Assisted Generation)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from specresearch import settings
from specresearch.drafters.base import Context, Drafter
from specresearch.drafters.draft_model import DraftModel, cheapen, split_spec
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel, load_model, logit_width
from specresearch.sampling import logits_to_probs, sample
from specresearch.types import Draft
from specresearch.vocab import Bridge

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
      rows (a shortlist).

    Each step the target's context is written in the draft's tokens (its text re-encoded); the draft
    keeps its KV cache and rolls it back to the longest prefix this encoding shares with what it
    holds (its last draft included), so it re-reads only where the texts' tokens part, as the papers do.
    """

    name = "cross_vocab"
    modes = {"string": ("mode=string",), "shared": ("mode=shared",),
             "shared, cheap draft, confidence": ("mode=shared", "model.vocab=200", "model.vocab_corpus=mtbench", "model.quantize=int8",
                                                 "k=6", "chain_confidence=0.05")}

    def __init__(self, target: LoadedModel, k: int = 4, model: Mapping | LoadedModel | None = None, mode: str = "string",
                 k_policy: str = "fixed", k_max: int | None = None, confidence: float | None = None,
                 chain_confidence: float | None = None):
        """
        Args:
            target: the target model.
            k: draft tokens per step (the draft's; "string": the target tokens proposed are at most
                the step's draft length too).
            model: the draft model: load_model() arguments (name, dtype, ...) plus `vocab`,
                `vocab_corpus`, `quantize` (drafters.draft_model.cheapen), or a LoadedModel.
            mode: "string" or "shared" (see above).
            k_policy: "fixed", or "heuristic" (see engine.DraftLength).
            k_max: the largest k the heuristic may reach (None = 4 k).
            confidence: stop drafting after a token the draft gives less than this probability (its
                q's when sampled, its softmax's when greedy; transformers' assistant_confidence_threshold).
                None = always k. Lossless: the stop depends on the draft alone.
            chain_confidence: stop once the product of the drafted tokens' probabilities falls below
                this (EAGLE-2's cumulative confidence). None = never.
        """
        settings.CrossVocab(k=k, mode=mode, k_policy=k_policy, k_max=k_max, confidence=confidence,
                            chain_confidence=chain_confidence).check("drafter")
        self.confidence, self.chain_confidence = confidence or 0.0, chain_confidence or 0.0
        if model is None:
            raise SpecResearchError("drafter=cross_vocab needs a draft model: set drafter.model.name")
        self.k, self.k_policy, self.k_max, self.mode = int(k), k_policy, k_max, mode
        if isinstance(model, LoadedModel):
            lm, options = model, {}
        else:
            spec, options = split_spec(model)
            lm = load_model(**spec)
        self.bridge = Bridge(target.tokenizer, lm.tokenizer, logit_width(target), logit_width(lm))
        if mode == "shared" and not len(self.bridge.shared):
            raise SpecResearchError(f"drafter.mode=shared: draft '{lm.name}' and target '{target.name}' share no token; use drafter.mode=string")
        allowed = self.bridge.shared if mode == "shared" else None
        self.draft: DraftModel = cheapen(lm, target, own_vocab=True, allowed=allowed, **options)
        self.twin = self.bridge.twin.to(lm.device)  # [V_d] each draft token's target id (-1: none)
        self.shortlist_twins = self.twin[self.draft.shortlist.ids] if mode == "shared" else None  # [S] the target id of each scored token
        self.ids: list[int] = []  # the draft tokens in its cache, in order
        self._forwards = 0

    def prefill(self, ctx: Context) -> None:
        self.draft.reset()
        ids = self.bridge.to_draft(ctx.tokens.tolist())[:-1]  # (the last one is fed by the first propose)
        self.draft.prefill(torch.tensor(ids, dtype=torch.long, device=self.draft.device), reuse=ctx.reuse_prefill)
        self.ids = ids

    def propose(self, ctx: Context) -> Draft:
        if ctx.max_draft <= 0:
            return Draft.empty(ctx.tokens.device)
        context = self.bridge.to_draft(ctx.tokens.tolist())
        if not context:  # the context has no text the draft can read
            return Draft.empty(ctx.tokens.device)
        kept = _common_prefix(self.ids, context, len(context) - 1)
        self.draft.rollback(kept)
        pending = context[kept:]  # [>= 1] the draft tokens it has not read
        chain: list[int] = []
        qs: list[Tensor] = []
        path = 1.0  # the product of the drafted tokens' probabilities
        while True:
            logits = self.draft.forward(torch.tensor(pending, device=self.draft.device))[-1]  # [V_d] or [S] (shared)
            self._forwards += 1
            x, q, p_x = self._next(logits, ctx)
            chain.append(x)
            if q is not None:
                qs.append(q)
            path *= p_x
            if len(chain) == ctx.max_draft or x == self.bridge.draft_eos or p_x < self.confidence or path < self.chain_confidence:
                break
            pending = [x]
        self.ids = context + chain[:-1]  # the last token was not fed
        if self.mode == "shared":
            tokens = self.twin[torch.tensor(chain, device=self.twin.device)]  # [K] the target's ids
            q = torch.stack(qs) if qs else None  # [K, V_t]
        else:
            tokens, q = torch.tensor(self.bridge.to_target(chain)[: ctx.max_draft], dtype=torch.long), None
        return Draft(tokens=tokens.to(ctx.tokens.device), q=None if q is None else q.to(ctx.tokens.device))

    def _next(self, logits: Tensor, ctx: Context) -> tuple[int, Tensor | None, float]:
        """The draft's next token (its id) from its logits, the target-vocabulary law it was drawn from
        (None: its argmax), and the draft's probability of it (for the confidence stops; 1 without them)."""
        shortlist = self.draft.shortlist
        scored = self.confidence or self.chain_confidence
        if ctx.sampling.greedy or self.mode == "string":
            x = int(logits.argmax())
            p_x = float(torch.softmax(logits.float(), -1)[x]) if scored else 1.0
            return (x if shortlist is None else int(shortlist.ids[x])), None, p_x
        q = logits_to_probs(logits, ctx.sampling)  # [S] over the shared tokens (the shortlist)
        x = int(sample(q, ctx.rng))
        law = torch.zeros(self.bridge.target_vocab, dtype=q.dtype, device=q.device)
        law.index_add_(0, self.shortlist_twins, q)  # [V_t] (draft tokens of the same bytes add up)
        return int(shortlist.ids[x]), law, float(q[x])

    @property
    def draft_forwards(self) -> int:
        return self._forwards


def _common_prefix(a: list[int], b: list[int], most: int) -> int:
    """The length of the longest common prefix of `a` and `b`, at most `most`."""
    n = min(len(a), len(b), most)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
