"""A speed cell's intervals over its prompts, and the paired difference of two cells on the same prompts.

A speed run tags each prompt's new tokens and seconds on both sides and the method's target forwards and accepted
draft tokens (records.PER_PROMPT_TAG). The speedup is the pooled ratio (the method's tokens over its seconds, over the
baseline's), τ the method's tokens per forward (SpecStats.tau); their 95% intervals are BCa bootstraps over prompts (scipy.stats.bootstrap,
a draw resamples prompts with every number of each), and two cells on the same prompts (say a lossy rule and
rejection sampling, same drafter, seeds and prompts) are compared by the difference of their speedups, the draw
resampling the prompts of both together.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

from specresearch.records import PER_PROMPT_TAG

DRAWS = 10_000
LEVEL = 0.95


@dataclass
class Interval:
    """A statistic over prompts with its 95% BCa interval (NaN ends under 3 prompts or for a degenerate sample)."""

    value: float
    low: float
    high: float
    prompts: int


def per_prompt(tags: dict[str, str]) -> dict[str, tuple[float, ...]] | None:
    """A speed run's prompts: id -> (baseline tokens, baseline seconds, method tokens, method seconds, method forwards,
    accepted draft tokens: NaN in the tags of 2026-12-03 that lacked them); None without the tag (older runs, batches)."""
    value = tags.get(PER_PROMPT_TAG)
    if not value:
        return None
    data = json.loads(value)
    return {i: (*b, *m, *[math.nan] * (4 - len(m))) for i, b, m in zip(data["ids"], data["baseline"], data["method"])}


def _speedup(bt, bs, mt, ms, axis=-1):
    return (mt.sum(axis) / ms.sum(axis)) / (bt.sum(axis) / bs.sum(axis))


def _tau(steps, accepted, axis=-1):
    return (accepted.sum(axis) + steps.sum(axis)) / steps.sum(axis)


def _difference(*columns, axis=-1):
    return _speedup(*columns[:4], axis=axis) - _speedup(*columns[4:], axis=axis)


def _bootstrap(columns: list[np.ndarray], statistic) -> Interval:
    value = float(statistic(*columns))
    n = len(columns[0])
    if n < 3:
        return Interval(value, math.nan, math.nan, n)
    with warnings.catch_warnings():  # a degenerate sample (every prompt the same): NaN ends
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = stats.bootstrap(columns, statistic, paired=True, vectorized=True, n_resamples=DRAWS, confidence_level=LEVEL,
                             method="BCa", random_state=np.random.default_rng(0)).confidence_interval
    return Interval(value, float(ci.low), float(ci.high), n)


def _columns(prompts: dict, ids: list[str]) -> list[np.ndarray]:
    return [np.array([prompts[i][c] for i in ids], dtype=float) for c in range(6)]


def speedup(prompts: dict) -> Interval:
    """The cell's speedup over its baseline (pooled over prompts) with its 95% BCa interval over prompts."""
    return _bootstrap(_columns(prompts, sorted(prompts))[:4], _speedup)


def tau(prompts: dict) -> Interval:
    """τ: the method's tokens per target forward, its bonus token included, before a stop's truncation (SpecStats.tau),
    pooled, with its 95% BCa interval over prompts."""
    return _bootstrap(_columns(prompts, sorted(prompts))[4:], _tau)


def difference(a: dict, b: dict) -> Interval:
    """a's speedup − b's over the prompts both decoded, paired by prompt (each draw resamples them for both)."""
    ids = sorted(set(a) & set(b))
    if not ids:
        return Interval(math.nan, math.nan, math.nan, 0)
    return _bootstrap(_columns(a, ids)[:4] + _columns(b, ids)[:4], _difference)
