"""An independent draft model (Leviathan et al., 2023; Chen et al., 2023)."""

from __future__ import annotations

from collections.abc import Mapping

from specresearch.drafters.base import Chain, Context, Drafter
from specresearch.drafters.draft_model import DraftModel
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel
from specresearch.types import Draft, Verdict


class IndependentDrafter(Drafter):
    """A smaller model with the target's tokenizer proposes k tokens autoregressively: its argmax
    when decoding greedily (q = None), else samples from its own q after the same processing as p.

    Its KV cache holds every accepted token but the last, like the target's. When all k draft
    tokens are accepted it has not yet seen the k-th one (gpt-fast's subtlety): the next proposal
    feeds the two missing tokens in one forward.
    """

    name = "independent"
    modes = {"default": (), "cheap draft": ("model.vocab=200", "model.vocab_corpus=mtbench", "model.quantize=int8")}

    def __init__(
        self,
        target: LoadedModel,
        k: int = 4,
        model: Mapping | LoadedModel | DraftModel | None = None,
        confidence: float | None = None,
        k_policy: str = "fixed",
        k_max: int | None = None,
    ):
        """
        Args:
            target: the target model; the draft must share its vocabulary.
            k: draft tokens per step (>= 1).
            model: the draft model: load_model() arguments (name, dtype, device, ...) plus the
                cheaper-draft options `vocab`, `vocab_corpus`, `quantize` (drafters.draft_model), a
                LoadedModel, or a DraftModel.
            confidence: stop drafting early, after a token whose draft probability is below this
                (transformers' assistant_confidence_threshold; Leviathan's k becomes a maximum).
                None = always k tokens. Lossless: the stop depends on the draft alone.
            k_policy: "fixed", or "heuristic" (transformers' schedule, see engine.DraftLength);
                combines with `confidence` as in transformers. Lossless: k depends on past verdicts only.
            k_max: the largest k the heuristic may reach (None = 4 k).
        """
        if int(k) < 1:
            raise SpecResearchError(f"drafter=independent needs k >= 1, got k={k} (use drafter=none for plain decoding)")
        if model is None:
            raise SpecResearchError("drafter=independent needs a draft model: set drafter.model.name")
        if confidence is not None and not 0 < float(confidence) < 1:
            raise SpecResearchError(f"drafter.confidence must lie in (0, 1) or be null, got {confidence}")
        self.k, self.k_policy, self.k_max = int(k), k_policy, k_max  # the engine's DraftLength reads them
        self.confidence = None if confidence is None else float(confidence)
        self.draft = DraftModel.load(model, target)
        self._forwards = 0

    def prefill(self, ctx: Context) -> None:
        self.draft.reset()
        self.draft.prefill(ctx.tokens[:-1], reuse=ctx.reuse_prefill)

    def propose(self, ctx: Context) -> Draft:
        pending = ctx.tokens[self.draft.length :]  # [1], or [2] after a fully accepted step
        chain = Chain(ctx, self.draft.shortlist)
        for _ in range(ctx.max_draft):
            logits = self.draft.forward(pending)[-1]  # [V], or [N] over the shortlist
            self._forwards += 1
            pending = chain.add(logits)[None]
            if self.confidence is not None and chain.confidence() < self.confidence:
                break  # an unlikely draft token: the next ones would likely be wasted
        return chain.draft()

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        # Keep what the draft cache saw of the accepted sequence; everything but its last token.
        self.draft.rollback(min(self.draft.length, ctx.tokens.numel() - 1))

    @property
    def draft_forwards(self) -> int:
        return self._forwards

