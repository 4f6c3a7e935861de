"""Prompt lookup decoding (Saxena, 2023; transformers' `prompt_lookup_num_tokens`): the draft is
the continuation of an earlier occurrence of the context's last n-gram. No model, no training."""

from __future__ import annotations

from specresearch.drafters.base import Context, Drafter
from specresearch.drafters.ngram import lookup_rows
from specresearch.options import drafters as options
from specresearch.options import make
from specresearch.types import Draft


class PromptLookupDrafter(Drafter):
    """Match the last n tokens of the context (n from `max_ngram` down to `min_ngram`) against the
    prompt and the generated text, and propose the up to k tokens that followed the match. A
    deterministic drafter (q = None): greedy and rejection verification keep it lossless.

    Matching is one vectorised comparison of every n-token window with the suffix per n (no Python
    loop over the context); a batch's rows are looked up together (`lookup_rows`).
    """

    name = "pld"

    Settings = options.PromptLookup

    def __init__(self, target=None, **given):
        """
        Args:
            target: unused (the config passes it to every drafter).
            **given: the settings (`Settings`: k, max_ngram, min_ngram, match, k_policy, k_max), the
                rest at their defaults (Saxena's: 10 tokens, n-grams of 3 down to 1, the first match).
        """
        s = self.settings = make(self.Settings, given)
        self.max_ngram, self.min_ngram, self.match = s.max_ngram, s.min_ngram, s.match

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        """Every row's draft from one lookup of all rows (`lookup_rows`)."""
        found = lookup_rows([ctx.tokens for ctx in ctxs], [ctx.max_draft for ctx in ctxs], self.max_ngram, self.min_ngram, self.match)
        return [Draft(tokens=tokens) for tokens in found]
