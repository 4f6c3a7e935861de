"""The one target wrapper: a causal LM that owns its KV cache, feeds tokens through it, and rolls it
back exactly after a rejection (no recomputation of the accepted prefix). Draft models use the same
wrapper for their own cache."""

from __future__ import annotations

import copy

import torch
from torch import Tensor
from transformers import DynamicCache

from specresearch.models import LoadedModel


class Target:
    """A causal LM plus its KV cache, batch size 1.

    `length` is the number of tokens in the cache. The engine keeps every token but the last one
    sampled in the cache, so each step feeds [last token, draft tokens] and gets one distribution
    per draft position plus the bonus position.
    """

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.model = lm.model
        self.device = lm.device
        self.cache: DynamicCache | None = None
        self.length = 0
        self._kept: tuple[Tensor, DynamicCache, Tensor] | None = None  # (tokens, cache, logits) of a kept prefill

    def reset(self) -> None:
        """Forget everything: the next forward starts a new sequence."""
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def prefill(self, tokens: Tensor, reuse: bool = False) -> Tensor | None:
        """Put `tokens` ([T], may be empty) into the cache.

        Args:
            tokens: [T] token ids.
            reuse: keep a copy of this prefill, and restore it instead of recomputing when the next
                reusing prefill has the same tokens (many samples of one prompt).

        Returns:
            [1, V] the logits after the last token (the lm head runs on that position only), or None
            when `tokens` is empty.
        """
        if not tokens.numel():
            return None
        if reuse and self._kept is not None and torch.equal(self._kept[0], tokens):
            self.cache, self.length = copy.deepcopy(self._kept[1]), tokens.numel()
            return self._kept[2]
        logits = self._run(tokens, logits_to_keep=1)
        if reuse:
            self._kept = (tokens.clone(), copy.deepcopy(self.cache), logits)
        return logits

    def forward(self, tokens: Tensor, head: Tensor | None = None) -> Tensor:
        """Feed `tokens` ([K]) after the cached ones.

        Args:
            tokens: [K] token ids.
            head: [N, H] rows of the output embedding to score instead of the whole vocabulary (a
                draft restricted to N tokens); the model must have a plain linear lm head.

        Returns:
            [K, V] logits (or [K, N] with `head`): row i is the distribution of the token after tokens[i].
        """
        if head is None:
            return self._run(tokens, logits_to_keep=0)
        out = self.model.base_model(input_ids=tokens.to(self.device)[None], past_key_values=self.cache, use_cache=True)
        self.length += tokens.numel()
        return out.last_hidden_state[0] @ head.T  # [K, H] @ [H, N]

    def rollback(self, length: int) -> None:
        """Drop cached tokens beyond the first `length` (after a rejection)."""
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5: a negative count drops the newest tokens
            self.length = length

    def _run(self, tokens: Tensor, logits_to_keep: int) -> Tensor:
        out = self.model(
            input_ids=tokens.to(self.device)[None],  # [1, K]
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        self.length += tokens.numel()
        return out.logits[0]  # [K, V]
