"""Exact-match greedy verification."""

from __future__ import annotations

from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.options import verifiers as options
from specresearch.types import SamplingParams
from specresearch.verifiers.base import Verifier, argmax_law, rowwise


class GreedyVerifier(Verifier):
    """Keep the longest draft prefix equal to the target's argmax, then add the target's argmax.

    Lossless for greedy decoding: the output is the target's greedy output, token for token (up to
    the floating-point near-ties of batched vs one-token forwards, see docs/concepts/measured.md).
    """

    Settings = options.Greedy
    lossless = True
    name = "greedy"

    def check_sampling(self, sampling: SamplingParams) -> None:
        if not sampling.greedy:
            raise SpecResearchError(
                f"verifier=greedy decodes the target's argmax, but sampling.temperature={sampling.temperature}: "
                "use sampling=greedy, or verifier=rejection to sample at temperature > 0"
            )

    def acceptance(self, p: Tensor, q: Tensor, x: Tensor) -> Tensor:
        return (x == rowwise(p.argmax(-1), x)).to(p.dtype)  # [K] (or [K, M])

    def fallback(self, p: Tensor, q: Tensor | None) -> Tensor:
        return argmax_law(p)
