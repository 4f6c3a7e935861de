"""The verifier interface."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from specresearch.types import Draft, SamplingParams, Verdict


class Verifier(ABC):
    """Decides, from the target's distributions, how much of a draft to keep.

    Terms (Leviathan et al., 2023): *accepted* draft tokens are kept; after the first rejection the
    target adds a *recovered* token; when every draft token is accepted it adds a *bonus* token from
    p at the position after the draft. Either way a step yields num_accepted + 1 tokens.
    """

    lossless: bool  # the claim that outputs follow the target's law exactly; tests must prove it
    name: str

    def check(self, sampling: SamplingParams) -> None:
        """Raise SpecResearchError if this rule cannot run with these sampling settings."""

    @abstractmethod
    def __call__(self, draft: Draft, p: Tensor, rng: torch.Generator | None) -> Verdict:
        """Verify one draft.

        Args:
            draft: K proposed tokens and their law q ([K, V], or None for a deterministic drafter).
            p: [K + 1, V] target probabilities after temperature/top-k/top-p: row i is the law of
               the token at draft position i; row K is the bonus position.
            rng: the generator for every random draw (reproducible tests).

        Returns:
            The accepted prefix plus one recovered or bonus token.
        """
