"""Pass rates over seeds, paired by problem: what several completions per problem buy a quality comparison.

A quality run (`eval=NAME`) tags each side's per-problem outcomes (records.SOLVED_TAG: "156:0110"). Runs of one setting
at several seeds (`seed=1,2,3,4`, each its own streams) give each problem a pass rate; two settings are compared by the
mean over problems of the per-problem difference of those rates, with a t interval over problems: the problems are the
sampling unit, the seeds only make each problem's rate less noisy (Miller 2024, "Adding error bars to evals": the paired,
question-clustered standard error). One seed gives McNemar's comparison back (each problem 0 or 1 on each side).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats

from specresearch.records import SOLVED_TAG

Outcomes = dict[int, dict[int, int]]  # seed -> problem index -> 1 (solved) or 0


def solved(tags: dict[str, str], side: str) -> dict[int, int] | None:
    """A run's per-problem outcomes of one side ("baseline" or "method") from its tag, None where it has none (runs
    from before the tag, a side that did not run)."""
    value = tags.get(SOLVED_TAG + side)
    if not value:
        return None
    first, bits = value.split(":")
    return {int(first) + i: int(b) for i, b in enumerate(bits)}


@dataclass
class Rate:
    """A pass rate over problems (each problem's mean over seeds) with its 95% t interval over problems."""

    value: float
    low: float
    high: float
    problems: int
    seeds: int


@dataclass
class Paired:
    """a − b over the problems and seeds both have: the mean per-problem difference of pass rates, its 95% t interval
    over problems, the paired t test's p, and the smallest difference this many problems detect with 80% power at
    the 5% level (at the observed spread of the differences)."""

    delta: float
    low: float
    high: float
    p: float
    detectable: float
    problems: int
    seeds: int


def _common(a: Outcomes, b: Outcomes | None = None) -> tuple[list[int], list[int]]:
    seeds = sorted(set(a) & set(b) if b is not None else set(a))
    sides = [a] if b is None else [a, b]
    problems = sorted(set.intersection(*(set(side[s]) for side in sides for s in seeds))) if seeds else []
    return seeds, problems


def _means(outcomes: Outcomes, seeds: list[int], problems: list[int]) -> list[float]:
    return [sum(outcomes[s][i] for s in seeds) / len(seeds) for i in problems]


def _t_interval(values: list[float]) -> tuple[float, float, float, float]:
    """(mean, low, high, standard error) of a mean over values, 95% t interval."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, math.nan, math.nan
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)
    half = stats.t.ppf(0.975, n - 1) * se
    return mean, mean - half, mean + half, se


def rate(outcomes: Outcomes) -> Rate:
    """The pass rate over the problems every seed scored."""
    seeds, problems = _common(outcomes)
    if not problems:
        return Rate(math.nan, math.nan, math.nan, 0, len(seeds))
    mean, low, high, _ = _t_interval(_means(outcomes, seeds, problems))
    return Rate(mean, low, high, len(problems), len(seeds))


def paired(a: Outcomes, b: Outcomes) -> Paired:
    """a − b, paired by problem, over the seeds both ran and the problems both scored at each of them."""
    seeds, problems = _common(a, b)
    if len(problems) < 2:
        return Paired(math.nan, math.nan, math.nan, math.nan, math.nan, len(problems), len(seeds))
    diff = [x - y for x, y in zip(_means(a, seeds, problems), _means(b, seeds, problems))]
    mean, low, high, se = _t_interval(diff)
    n = len(diff)
    p = 1.0 if se == 0 else float(2 * stats.t.sf(abs(mean) / se, n - 1))
    detectable = (stats.t.ppf(0.975, n - 1) + stats.t.ppf(0.8, n - 1)) * se
    return Paired(mean, low, high, p, detectable, n, len(seeds))
