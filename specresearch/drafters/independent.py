"""An independent draft model (Leviathan et al., 2023; Chen et al., 2023)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from specresearch.drafters.base import Context, Drafter
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel, check_same_vocab, load_model
from specresearch.sampling import logits_to_probs, sample
from specresearch.target import Target
from specresearch.types import Draft, Verdict


class IndependentDrafter(Drafter):
    """A smaller model with the target's tokenizer proposes k tokens autoregressively: its argmax
    when decoding greedily (q = None), else samples from its own q after the same processing as p.

    Its KV cache holds every accepted token but the last, like the target's. When all k draft
    tokens are accepted it has not yet seen the k-th one (gpt-fast's subtlety): the next proposal
    feeds the two missing tokens in one forward.
    """

    name = "independent"

    def __init__(self, target: LoadedModel, k: int = 4, model: Mapping | LoadedModel | None = None):
        """
        Args:
            target: the target model; the draft must share its vocabulary.
            k: draft tokens per step (>= 1).
            model: the draft model: load_model() arguments (name, dtype, device, ...) or a LoadedModel.
        """
        if int(k) < 1:
            raise SpecResearchError(f"drafter=independent needs k >= 1, got k={k} (use drafter=none for plain decoding)")
        if model is None:
            raise SpecResearchError("drafter=independent needs a draft model: set drafter.model.name")
        self.k = int(k)
        draft = model if isinstance(model, LoadedModel) else load_model(**dict(model))
        check_same_vocab(target, draft)
        self.draft = Target(draft)
        self._forwards = 0

    def prefill(self, ctx: Context) -> None:
        self.draft.reset()
        self.draft.prefill(ctx.tokens[:-1])

    def propose(self, ctx: Context) -> Draft:
        pending = ctx.tokens[self.draft.length :]  # [1], or [2] after a fully accepted step
        tokens, qs = [], []
        for _ in range(min(self.k, ctx.max_draft)):
            logits = self.draft.forward(pending)[-1]  # [V]
            self._forwards += 1
            if ctx.sampling.greedy:
                x = logits.argmax(-1)
            else:
                q = logits_to_probs(logits, ctx.sampling)  # [V]
                x = sample(q, ctx.rng)
                qs.append(q)
            tokens.append(x)
            pending = x[None]
        if not tokens:
            return Draft(tokens=torch.empty(0, dtype=torch.long, device=ctx.tokens.device))
        return Draft(tokens=torch.stack(tokens), q=torch.stack(qs) if qs else None)  # [K], [K, V]

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        # Keep what the draft cache saw of the accepted sequence; everything but its last token.
        self.draft.rollback(min(self.draft.length, ctx.tokens.numel() - 1))

    @property
    def draft_forwards(self) -> int:
        return self._forwards
