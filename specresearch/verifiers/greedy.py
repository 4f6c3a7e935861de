"""Exact-match greedy verification."""

from __future__ import annotations

import torch
from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.types import Draft, SamplingParams, Verdict
from specresearch.verifiers.base import Verifier


class GreedyVerifier(Verifier):
    """Keep the longest draft prefix equal to the target's argmax, then add the target's argmax.

    Lossless for greedy decoding: the output is the target's greedy output, token for token (up to
    the floating-point near-ties of batched vs one-token forwards, see DESIGN.md).
    """

    lossless = True
    name = "greedy"

    def check(self, sampling: SamplingParams) -> None:
        if not sampling.greedy:
            raise SpecResearchError(
                f"verifier=greedy decodes the target's argmax, but sampling.temperature={sampling.temperature}: "
                "use sampling=greedy, or verifier=rejection to sample at temperature > 0"
            )

    def __call__(self, draft: Draft, p: Tensor, rng: torch.Generator | None = None) -> Verdict:
        choice = p.argmax(-1)  # [K + 1] the target's greedy token at each position
        k = len(draft)
        matches = (draft.tokens.to(choice.device) == choice[:k]).int()  # [K]
        n = int(matches.cumprod(0).sum())
        return Verdict(tokens=choice[: n + 1].clone(), num_accepted=n)
