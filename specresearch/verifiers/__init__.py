"""Verification rules: which draft tokens to keep, and which token the target adds."""

from specresearch.verifiers.base import Verifier
from specresearch.verifiers.greedy import GreedyVerifier
from specresearch.verifiers.rejection import RejectionVerifier
from specresearch.verifiers.relaxed import MarginVerifier, RelaxedVerifier, TopKVerifier, TypicalVerifier

__all__ = ["Verifier", "GreedyVerifier", "RejectionVerifier", "RelaxedVerifier", "TypicalVerifier", "MarginVerifier", "TopKVerifier"]
