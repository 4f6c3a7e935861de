"""The records that flow through one decode loop: what a drafter proposes, what a verifier decides,
and what a generation returns. One record shape for every method, so analysis never needs to know
which method ran."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from specresearch.metrics import SpecStats


@dataclass(frozen=True)
class SamplingParams:
    """How target and draft logits become distributions; applied identically to p, q and the baseline."""

    temperature: float = 0.0  # 0 = greedy (one-hot argmax); > 0 = sample from softmax(logits / T)
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set with mass >= top_p; 1 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class Draft:
    """A proposal from a drafter.

    tokens: [K] proposed token ids (a chain); K may be 0 (the autoregressive baseline).
    q: [K, V] the law each token was sampled from, after the same temperature/top-k/top-p as p;
       None for a deterministic drafter (greedy draft, n-gram lookup): verifiers treat it as one-hot.
    """

    tokens: Tensor  # [K]
    q: Tensor | None = None  # [K, V]

    def __len__(self) -> int:
        return int(self.tokens.numel())


@dataclass
class Verdict:
    """A verifier's decision on one draft.

    tokens: [num_accepted + 1] the accepted draft prefix, then one token from the target: the
            *recovered* token (sampled from the residual after a rejection) or the *bonus* token
            (sampled from p when every draft token was accepted).
    """

    tokens: Tensor  # [n + 1]
    num_accepted: int


@dataclass
class GenerationOutput:
    """The result of decoding one prompt, the same for every method (the baseline included)."""

    tokens: list[int]  # new tokens only, after EOS / stop-string / max_new_tokens truncation
    text: str  # the decoded new tokens
    stats: SpecStats = field(default_factory=SpecStats)
    stop_reason: str = "length"  # "eos" | "stop_string" | "length"
