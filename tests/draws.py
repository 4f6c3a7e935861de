"""Exact enumeration of a drafter's own random draws, for laws computed through the drafter's code.

A drafter draws its sampled tokens with two primitives: `specresearch.sampling.sample` (a chain's
token from its q) and `torch.multinomial` (a tree's or Medusa's children). `enumerated(run)` replaces
both, in every drafter module, by a replay of scripted outcomes and calls `run()` once per complete
outcome path, depth first: each call of a primitive branches over every outcome its arguments give
positive probability (with or without replacement, as asked) and weighs it by that probability, so
the paths' weights sum to 1 and a law averaged over them is the drafter's exact law, whatever its
code does with the draws. Nothing is re-implemented: the drafter's code runs unchanged on each path.

Keep the supports small (the tests sample with top-k) and the drafts shallow: the paths multiply.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

import torch

import specresearch.sampling

R = TypeVar("R")
MAX_PATHS = 50_000  # a guard: an enumeration this large means a support or a draft depth was not kept small


class Script:
    """The outcome chosen at each primitive call of one path, and the odometer over paths."""

    def __init__(self):
        self.choice: list[int] = []  # per call of the current path: the index of its outcome
        self.radix: list[int] = []  # per call: how many outcomes it had
        self.call, self.weight = 0, 1.0

    def pick(self, outcomes: list[tuple[object, float]]):
        """The outcome of the next call on this path (its first one when the path is new here)."""
        i = self.call
        self.call += 1
        if i == len(self.choice):
            self.choice.append(0)
            self.radix.append(len(outcomes))
        if self.radix[i] != len(outcomes):
            raise AssertionError(f"draw {i} had {self.radix[i]} outcomes on this path before and {len(outcomes)} now: the drafter's "
                                 "draws depend on something besides their outcomes (an unenumerated random source?)")
        value, prob = outcomes[self.choice[i]]
        self.weight *= prob
        return value

    def next_path(self) -> bool:
        """Move to the next path (False when every path was run)."""
        while self.choice and self.choice[-1] + 1 >= self.radix[-1]:
            self.choice.pop()
            self.radix.pop()
        if not self.choice:
            return False
        self.choice[-1] += 1
        self.call, self.weight = 0, 1.0
        return True


def _row_outcomes(law: torch.Tensor, m: int, replacement: bool) -> list[tuple[list[int], float]]:
    """Every sequence of m draws from the weights `law` ([V]) with positive probability, and that probability."""
    w = law.double().tolist()
    support = [x for x, wx in enumerate(w) if wx > 0]
    if not replacement and m > len(support):  # as torch.multinomial refuses it
        raise RuntimeError("invalid multinomial distribution (with replacement=False, not enough non-negative category to sample)")
    total = sum(w)
    out = []
    for xs in itertools.product(support, repeat=m) if replacement else itertools.permutations(support, m):
        prob, left = 1.0, total
        for x in xs:
            prob *= w[x] / left
            if not replacement:
                left -= w[x]
        out.append((list(xs), prob))
    return out


def _joint(rows: list[list[tuple[list[int], float]]]) -> list[tuple[list[list[int]], float]]:
    return [([xs for xs, _ in combo], math.prod(p for _, p in combo)) for combo in itertools.product(*rows)]


@contextmanager
def _patched(script: Script):
    real_multinomial, real_sample = torch.multinomial, specresearch.sampling.sample

    def multinomial(input, num_samples, replacement=False, *, generator=None, out=None):  # noqa: A002 (torch's names)
        rows = input.reshape(-1, input.shape[-1])
        values = script.pick(_joint([_row_outcomes(row, num_samples, replacement) for row in rows]))
        return torch.tensor(values, dtype=torch.long, device=input.device).reshape(*input.shape[:-1], num_samples)

    def sample(probs, rng):
        rows = probs.reshape(-1, probs.shape[-1])
        values = script.pick(_joint([_row_outcomes(row, 1, True) for row in rows]))
        return torch.tensor([v[0] for v in values], dtype=torch.long, device=probs.device).reshape(probs.shape[:-1])

    modules = [m for name, m in list(sys.modules.items()) if name.startswith("specresearch.drafters") and m is not None]
    swapped = [m for m in modules if getattr(m, "sample", None) is real_sample]
    torch.multinomial = multinomial
    for m in swapped:
        m.sample = sample
    try:
        yield
    finally:
        torch.multinomial = real_multinomial
        for m in swapped:
            m.sample = real_sample


def enumerated(run: Callable[[], R]) -> list[tuple[float, R]]:
    """`run()` on every outcome path of the drafters' draws it makes: (the path's probability, run's result) per path."""
    script, paths = Script(), []
    with _patched(script):
        while True:
            result = run()
            paths.append((script.weight, result))
            if len(paths) > MAX_PATHS:
                raise AssertionError(f"more than {MAX_PATHS} outcome paths: keep the supports small and the drafts shallow")
            if not script.next_path():
                return paths
