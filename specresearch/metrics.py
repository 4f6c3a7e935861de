"""Speculative-decoding statistics (kept in one small dataclass, as vLLM's SpecDecodingStats) and the
Leviathan et al. (2023) speedup prediction.

Names follow the papers: τ is the mean number of tokens a target forward yields (accepted draft
tokens plus the recovered/bonus token, so plain decoding has τ = 1); α = accepted / drafted, the
share of draft tokens kept (it falls with k: tokens after a rejection are drafted, never tried);
α_token = accepted / tried, Leviathan's per-token acceptance rate (constant in k if i.i.d.).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass
class SpecStats:
    """Counters and timings of one generation, or the sum of several (`merge`)."""

    prompt_tokens: int = 0
    new_tokens: int = 0  # after EOS / stop / max_new_tokens truncation
    steps: int = 0  # target forwards after the prefill (verification passes)
    drafted: int = 0  # draft tokens proposed (for a tree: its depth, the longest path)
    accepted: int = 0  # draft tokens accepted
    rejected: int = 0  # steps that rejected a draft token (kept fewer than they drafted)
    draft_forwards: int = 0  # forwards of a draft model (0 for model-free drafters)
    nodes: int = 0  # tokens fed to verification forwards after the last committed one (chain: = drafted)
    off_chain: int = 0  # steps whose draft was not a chain of the run's k tokens (a tree, a confidence stop, no n-gram
    # match, a k the policy changed); steps cut short by max_new_tokens are not counted. Leviathan's model needs 0.
    drafted_at: list[int] = field(default_factory=list)  # [K] steps that proposed a token at position i
    accepted_at: list[int] = field(default_factory=list)  # [K] steps that accepted the token at position i
    time_prefill: float = 0.0  # seconds: target and drafter prefill
    time_draft: float = 0.0  # seconds in the drafter (propose + commit)
    time_verify: float = 0.0  # seconds in target forwards after the prefill
    time_accept: float = 0.0  # seconds in logits -> probabilities, the verification rule and the target's rollback
    time_total: float = 0.0  # seconds wall clock for the whole generation

    def observe(self, num_drafted: int, num_accepted: int, nodes: int | None = None, off_chain: bool = False) -> None:
        """Count one verification step that kept `num_accepted` of `num_drafted` draft tokens (a tree:
        of its depth) and fed `nodes` tokens after the last committed one (default: num_drafted);
        `off_chain`: its draft was not the run's chain of k tokens."""
        self.steps += 1
        self.off_chain += off_chain
        self.nodes += num_drafted if nodes is None else nodes
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.rejected += num_accepted < num_drafted
        _grow(self.drafted_at, num_drafted)
        _grow(self.accepted_at, num_drafted)
        for i in range(num_drafted):
            self.drafted_at[i] += 1
        for i in range(num_accepted):
            self.accepted_at[i] += 1

    def merge(self, other: SpecStats) -> SpecStats:
        """Return the sum of two records (counters, per-position counts and timings add up)."""
        out = SpecStats()
        for name, value in asdict(self).items():
            theirs = getattr(other, name)
            if isinstance(value, list):
                n = max(len(value), len(theirs))
                setattr(out, name, [_at(value, i) + _at(theirs, i) for i in range(n)])
            else:
                setattr(out, name, value + theirs)
        return out

    @classmethod
    def of_batch(cls, rows: Sequence[SpecStats]) -> SpecStats:
        """The record of one batch decoded together: the rows' counters summed, and the times of the
        row that finished last (each row's times are the batch's while it decoded, so the last row's
        are the batch's wall clock)."""
        out = SpecStats()
        for row in rows:
            out = out.merge(row)
        last = max(rows, key=lambda row: row.time_total)
        for name in asdict(out):
            if name.startswith("time_"):
                setattr(out, name, getattr(last, name))
        return out

    @property
    def tau(self) -> float:
        """Mean tokens per verification step, the recovered/bonus token included (before truncation)."""
        return (self.accepted + self.steps) / self.steps if self.steps else float("nan")

    @property
    def alpha(self) -> float:
        """Acceptance rate: accepted / drafted draft tokens."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def alpha_token(self) -> float:
        """Leviathan's α, the probability that a tried draft token is accepted: accepted / (accepted +
        rejected), the maximum-likelihood estimate under their i.i.d. model (a step tries its tokens
        up to the first rejection; those after it are never tried). Unlike `alpha` it does not fall
        with k when the i.i.d. model holds: the α to put in `leviathan_speedup`."""
        tried = self.accepted + self.rejected
        return self.accepted / tried if tried else float("nan")

    @property
    def acceptance_at(self) -> list[float]:
        """P(draft token i accepted | it was proposed), for each draft position i (1, 2, ...)."""
        return [a / d if d else float("nan") for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def nodes_per_step(self) -> float:
        """Tokens fed to a verification forward after the last committed one, per step."""
        return self.nodes / self.steps if self.steps else float("nan")

    @property
    def time_other(self) -> float:
        """Seconds in the loop's own Python: appending tokens, stop checks, bookkeeping."""
        return self.time_total - self.time_prefill - self.time_draft - self.time_verify - self.time_accept

    TIME_SPLIT = ("prefill", "draft", "verify", "accept", "other")  # the phases that add up to time_total

    @property
    def split_timed(self) -> bool:
        """Whether the phases were timed (the engine's time_split; off, only time_total is)."""
        return self.time_verify > 0 or not self.steps

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.time_total if self.time_total > 0 else float("nan")

    # What the counters give, recorded beside them (records.flatten): `method_tau`, `method_acceptance_at_1`, ...
    DERIVED = ("tau", "alpha", "alpha_token", "tokens_per_s", "nodes_per_step", "time_other", "acceptance_at")


def leviathan_speedup(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """Predicted speedup of speculative decoding over plain decoding (Leviathan et al., 2023, Thm 3.8).

    Args:
        alpha: the acceptance rate of a tried draft token (assumed i.i.d. across positions):
            SpecStats.alpha_token, not the share of drafted tokens kept.
        k: draft tokens per step.
        c: cost of one draft forward / cost of one target forward (one token).
        v: cost of the verification forward (k + 1 tokens) / cost of one target forward; the paper
           assumes 1, real hardware pays more.

    Returns:
        E[tokens per step] / (k·c + v), with E[tokens per step] = (1 − α^(k+1)) / (1 − α).
    """
    if any(math.isnan(x) for x in (alpha, c, v)) or k < 0:
        return float("nan")
    expected_tokens = k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return expected_tokens / (k * c + v)


def leviathan_optimal_k(
    alpha: float, c: float, v: float, k_measured: int, k_max: int = 16, v_curve: Sequence[float] | None = None
) -> tuple[int, float]:
    """The draft length that maximises the Leviathan prediction, from what one run measured.

    Without `v_curve`, the verification cost of k + 1 tokens is interpolated linearly between one
    token (cost 1) and the measured v at k_measured: v(k) = 1 + (v - 1) · k / k_measured (linear in
    the tokens fed, as memory-bound forwards on GPUs and fast CPUs are until they turn compute-bound).

    Args:
        v_curve: measured costs of target forwards of 1, 2, ... tokens relative to one token
            (v_curve[k] = v(k)); then k* lies in 1..min(k_max, len(v_curve) - 1) and `v` is unused.

    Returns:
        (k*, predicted speedup at k*); (0, nan) when an input is unknown.
    """
    if any(math.isnan(x) for x in (alpha, c, v)) or k_measured < 1:
        return 0, float("nan")
    if v_curve is not None:
        costs = {k: v_curve[k] for k in range(1, min(k_max, len(v_curve) - 1) + 1)}
    else:
        costs = {k: 1 + (v - 1) * k / k_measured for k in range(1, k_max + 1)}
    best = max(costs, key=lambda k: leviathan_speedup(alpha, k, c, costs[k]))
    return best, leviathan_speedup(alpha, best, c, costs[best])


def cost_ratios(baseline: SpecStats, method: SpecStats) -> tuple[float, float]:
    """The draft cost ratio c and the verification cost v of `method`, both relative to one
    one-token target forward of `baseline` (plain decoding on the same target and prompts).

    Returns:
        (c, v): c = seconds per draft-model forward / seconds per baseline forward (0 for a
        model-free drafter); v = seconds per verification forward / seconds per baseline forward.
    """
    t_target = baseline.time_verify / baseline.steps if baseline.steps and baseline.split_timed else float("nan")
    c = (method.time_draft / method.draft_forwards) / t_target if method.draft_forwards else 0.0
    v = (method.time_verify / method.steps) / t_target if method.steps else float("nan")
    return c, v


def per_token(c: float, stats: SpecStats) -> float:
    """Leviathan's c: the draft cost c (per draft forward) per drafted token (a tree's: per level of
    its depth). A forward drafts one, except with prompt lookup inside the draft (`lookup`), where
    one forward may draft several."""
    return c * stats.draft_forwards / stats.drafted if stats.drafted else c


@dataclass(frozen=True)
class Prediction:
    """Leviathan et al.'s prediction for one method, from what a run measured beside its baseline."""

    c: float  # seconds per draft forward / seconds per baseline forward (0: model-free)
    v: float  # seconds per verification forward / seconds per baseline forward
    speedup: float  # predicted at the run's k; nan where the model does not hold
    best_k: int  # the k that maximises the prediction (0: none)
    best_speedup: float  # the prediction at best_k


def predict(baseline: SpecStats | None, method: SpecStats, k: int, v_curve: Sequence[float] | None = None) -> Prediction:
    """Leviathan's prediction for `method` against `baseline` (plain decoding, same target and prompts).

    Its model is a chain of k draft tokens every step: a method with any other step (a tree, a
    confidence stop, a prompt lookup without a match, a k the policy changed: `method.off_chain`)
    gets nan. k = 0 (no drafter) predicts 1 / v, the cost of its forwards against the baseline's.

    Args:
        baseline: None leaves c and v, and so every prediction, unknown (nan).
        k: draft tokens per step of the run.
        v_curve: measured costs of target forwards of 1, 2, ... tokens (see leviathan_optimal_k).
    """
    c, v = cost_ratios(baseline, method) if baseline is not None else (float("nan"), float("nan"))
    if k == 0:
        return Prediction(c, v, 1.0 / v if v else float("nan"), 0, float("nan"))
    if method.off_chain:
        return Prediction(c, v, float("nan"), 0, float("nan"))
    c_token = per_token(c, method)  # Leviathan's c
    best_k, best = leviathan_optimal_k(method.alpha_token, c_token, v, k, v_curve=v_curve)
    return Prediction(c, v, leviathan_speedup(method.alpha_token, k, c_token, v), best_k, best)


def _grow(counts: list[int], n: int) -> None:
    counts.extend([0] * (n - len(counts)))


def _at(values: list[int], i: int) -> int:
    return values[i] if i < len(values) else 0


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
