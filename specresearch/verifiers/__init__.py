"""Verification rules: which draft tokens to keep, and which token the target adds."""

from specresearch.verifiers.base import Verifier
from specresearch.verifiers.greedy import GreedyVerifier
from specresearch.verifiers.rejection import RejectionVerifier

__all__ = ["Verifier", "GreedyVerifier", "RejectionVerifier"]
