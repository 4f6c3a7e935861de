"""The verifiers' settings (the `verifier` group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from specresearch.errors import SpecResearchError
from specresearch.options import Options, given, one_of, setting

RECOVER = ("sample", "greedy")  # a relaxed verifier's added token


@dataclass
class Verifier(Options):
    """The base of the verifiers' settings."""
    group: ClassVar[str] = "verifier"
    builds: ClassVar[bool] = True


@dataclass
class Greedy(Verifier):
    """Exact match with the target's argmax (needs sampling=greedy). Lossless for greedy decoding."""
    option: ClassVar[str] = "greedy"


@dataclass
class Rejection(Verifier):
    """Speculative rejection sampling (Leviathan et al.; Chen et al.). Lossless at any temperature."""
    option: ClassVar[str] = "rejection"


@dataclass
class Relaxed(Verifier):
    """A lossy rule's shared settings: the added token, and the temperature the rule reads."""
    recover: str = setting("sample", "the target's token after the accepted prefix: sample (from p) or greedy (argmax)")
    rule_temperature: Optional[float] = setting(None, "greedy decoding only: the rule reads softmax(logits / this), a lossy "
                                                      "greedy method (with recover: greedy); null = the decoding's p")

    def check_ranges(self, path: str) -> None:
        one_of(path, "recover", self.recover, RECOVER)
        t = self.rule_temperature
        if given(t) and t is not None and not t > 0:
            raise SpecResearchError(f"{path}.rule_temperature must be > 0 (or null: the decoding's), got {t}")


@dataclass
class Margin(Relaxed):
    """Probability-margin acceptance: keep x if p(x) >= max p - margin (or, with ratio, p(x) >= ratio * max p). Lossy at T > 0."""
    option: ClassVar[str] = "margin"
    margin: Optional[float] = setting(0.1, "absolute margin; null to use ratio")
    ratio: Optional[float] = setting(None, "relative variant, e.g. 0.5; then margin: null")

    def check_ranges(self, path: str) -> None:
        Relaxed.check_ranges(self, path)
        margin, ratio = self.margin, self.ratio
        if given(margin) and given(ratio) and (margin is None) == (ratio is None):
            raise SpecResearchError("verifier=margin takes exactly one of margin (absolute) and ratio (relative); set the other to null")
        if given(margin) and margin is not None and not 0 <= margin <= 1:
            raise SpecResearchError(f"{path}.margin must lie in [0, 1], got {margin}")
        if given(ratio) and ratio is not None and not 0 < ratio <= 1:
            raise SpecResearchError(f"{path}.ratio must lie in (0, 1], got {ratio}")


@dataclass
class TopK(Relaxed):
    """Top-k acceptance: keep x if it is among the target's k most likely tokens. Lossy at T > 0; exact at T = 0 (p one-hot)
    unless rule_temperature is set."""
    option: ClassVar[str] = "topk"
    k: int = setting(3, "the target's k most likely tokens are accepted (not drafter.k)")

    def check_ranges(self, path: str) -> None:
        Relaxed.check_ranges(self, path)
        if given(self.k) and self.k < 1:
            raise SpecResearchError(f"verifier=topk needs k >= 1, got {self.k}")


@dataclass
class Typical(Relaxed):
    """Medusa's typical acceptance: keep x if p(x) > min(epsilon, delta * exp(-H(p))). Lossy at T > 0; exact at T = 0."""
    option: ClassVar[str] = "typical"
    CHOSEN: ClassVar[dict[str, str]] = {
        "epsilon": "Medusa's default (Cai et al. 2024, posterior_threshold); experiments/lossless_vs_lossy sweeps 0.01-0.25 "
                   "at T 0.7 with each setting's speedup, τ and exact distortion",
        "delta": "Medusa's default (posterior_alpha = √epsilon)"}
    epsilon: float = setting(0.09, "Medusa's posterior_threshold")
    delta: float = setting(0.3, "Medusa's posterior_alpha")

    def check_ranges(self, path: str) -> None:
        Relaxed.check_ranges(self, path)
        epsilon, delta = self.epsilon, self.delta
        if any(given(v) and not 0 < v <= 1 for v in (epsilon, delta)):
            raise SpecResearchError(f"verifier=typical needs 0 < epsilon <= 1 and 0 < delta <= 1, got {epsilon}, {delta}")
