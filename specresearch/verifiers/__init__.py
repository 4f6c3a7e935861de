"""Verification rules: which draft tokens to keep, and which token the target adds."""

from specresearch.verifiers.base import Verifier
from specresearch.verifiers.greedy import GreedyVerifier
from specresearch.verifiers.rejection import RejectionVerifier
from specresearch.verifiers.relaxed import MarginVerifier, RelaxedVerifier, TopKVerifier, TypicalVerifier

__all__ = ["Verifier", "GreedyVerifier", "RejectionVerifier", "RelaxedVerifier", "TypicalVerifier", "MarginVerifier", "TopKVerifier",
           "lossless"]


def lossless(greedy: bool) -> Verifier:
    """The lossless verifier of a decoding: greedy's exact match at T = 0, rejection sampling at T > 0
    (the baseline's, and a method's when none is named)."""
    return GreedyVerifier() if greedy else RejectionVerifier()
