"""The drafter interface and the context it sees."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor

from specresearch.types import Draft, SamplingParams, Verdict


@dataclass
class Context:
    """What a drafter may look at when proposing."""

    tokens: Tensor  # [T] prompt + generated so far (on the target's device)
    sampling: SamplingParams  # the same processing the verifier applies to p
    rng: torch.Generator | None  # for sampled drafts
    max_draft: int  # propose at most this many tokens (tokens left before max_new_tokens, minus one)
    reuse_prefill: bool = False  # the prompt may repeat: a drafter may keep and restore its prefill


class Drafter(ABC):
    """Proposes draft tokens and keeps its own state in step with the accepted sequence.

    A drafter that samples must return the q it sampled from (after the same temperature, top-k and
    top-p as p); a deterministic one returns q = None. Never report a q the tokens were not drawn
    from (transformers issues #32867, #47932).
    """

    k: int  # draft tokens per step (0 for the autoregressive baseline)
    name: str

    def prefill(self, ctx: Context) -> None:
        """Start a new sequence whose tokens are ctx.tokens."""

    @abstractmethod
    def propose(self, ctx: Context) -> Draft:
        """Propose up to min(k, ctx.max_draft) tokens to follow ctx.tokens."""

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        """The verifier kept `verdict.tokens`; ctx.tokens now ends with them. Roll own state back."""

    @property
    def draft_forwards(self) -> int:
        """Forwards of a draft model so far (for the draft cost ratio c); 0 for model-free drafters."""
        return 0
