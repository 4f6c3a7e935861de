"""The sequence-level equivalence battery: does a method sample from the target's law?

Two families of evidence, gated together by Holm's method (valid under any dependence):

- one-sample, against the target's exact conditionals (teacher forcing): the surprisal z-test
  (Σ(−log p_t(x_t) − H_t) / √Σ(M2_t − H_t²) ~ N(0, 1) under H0, a martingale CLT) and the
  randomized PIT (u_t i.i.d. U(0, 1) under H0, Kolmogorov–Smirnov);
- two-sample, against the baseline's samples: Pearson's χ² tests of homogeneity on the token
  histogram at each position and on the joint of the first 2 and 3 tokens (rare categories pooled so
  every expected count is ≥ 5), and Mann–Whitney U and KS on the per-sequence target log-likelihood.
  Pearson's X², not the G statistic: on these sparse pooled tables the G-test's far tail (below
  α / m, where Holm decides) ran 1.5–2× nominal in 10,000 A/A repeats at N = 300 while X² held it.

Positions with different conditional laws are never pooled into one χ² against one p. Effect sizes
(surprisal deficit, top-1 share, the mean TV of the position marginals beside what two samples of
one law give at these sizes: its permutation noise floor) and a power report (the smallest TV and
surprisal shift the chosen N detects with the chosen power) say what a "pass" means.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import stats as st
from scipy.optimize import brentq

from specresearch.errors import SpecResearchError
from specresearch.stats.floor import NumericFloor
from specresearch.stats.samples import Conditionals, Samples

MIN_EXPECTED = 5  # pool categories until every expected count is at least this
NEGLIGIBLE_TV = 1e-3  # a numeric floor whose bound stays below this is no explanation of a rejection (fp32: ~1e-6)


@dataclass
class TestResult:
    """One test of the battery."""

    name: str
    statistic: float
    pvalue: float
    df: int = 0  # degrees of freedom of a χ²-type test; 0 otherwise
    kind: str = "two-sample"  # "one-sample" (against the target's conditionals) or "two-sample" (against the baseline)


@dataclass
class Report:
    """The battery's outcome for one method against the target."""

    tests: list[TestResult]  # the family the verdict is drawn from
    holm: list[float]  # Holm-adjusted p-values, in the order of `tests`
    bh: list[float]  # Benjamini–Hochberg adjusted (an exploratory screen, not the verdict)
    alpha: float  # family-wise error rate of the verdict
    controls: list[TestResult]  # the baseline's own one-sample tests: a harness check that must pass
    effects: dict[str, float] = field(default_factory=dict)
    power: dict[str, float] = field(default_factory=dict)
    n_method: int = 0
    n_baseline: int = 0
    length: int = 0
    sized_at_df: int | None = None  # stats.samples=auto: the position df N was sized for (the baseline's own)
    tv_by_position: np.ndarray | None = None  # [L] the plug-in TV of each position's pooled histograms
    tv_null_by_position: np.ndarray | None = None  # [L] its noise floor (mean over relabellings; NaN without)
    floor: NumericFloor | None = None  # the target's own numerics between the sides' forward paths (None: not measured)

    @property
    def reject(self) -> bool:
        """True when the method's law is shown to differ from the target's (Holm at `alpha`)."""
        return any(p < self.alpha for p in self.holm)

    @property
    def rejected(self) -> list[str]:
        return [t.name for t, p in zip(self.tests, self.holm) if p < self.alpha]

    @property
    def numerics(self) -> str | None:
        """The verdict against the numeric floor (None: no floor measured, or nothing rejected).

        "beyond": the target's own numerics cannot account for the rejection: they are negligible (the most
        TV they can put on a position's marginal, `NumericFloor.bound`, below NEGLIGIBLE_TV, which no N here
        detects), or some rejected position's TV above its noise floor exceeds that position's bound.
        "within": every rejection is one the numerics can reach (a position shift no larger than their
        bound, or a test that reads no position: the surprisal, PIT, log-likelihood and joint tests). A
        TV bound does not bound the position tests' noncentrality, so "within" says the rule is not shown
        to differ, not that the numerics caused it: compare like with like (model.kernels=invariant, fp32)."""
        if self.floor is None or not self.reject:
            return None
        bound = self.floor.bound  # [L]
        if bound.max() < NEGLIGIBLE_TV:
            return "beyond"
        excess = self.tv_by_position - np.nan_to_num(self.tv_null_by_position)  # [L]
        positions = [int(name.removeprefix("position_")) - 1 for name in self.rejected if name.startswith("position_")]
        return "beyond" if any(excess[t] > bound[t] for t in positions) else "within"

    @property
    def controls_pass(self) -> bool:
        return all(c.pvalue >= self.alpha for c in self.controls)

    def summary(self) -> dict[str, float]:
        """Flat metrics for MLflow (`eq_` prefix is added by the caller)."""
        out = {
            "reject": float(self.reject),
            "min_holm_p": min(self.holm) if self.holm else 1.0,
            "alpha": self.alpha,
            "samples_method": self.n_method,
            "samples_baseline": self.n_baseline,
            "length": self.length,
            "controls_pass": float(self.controls_pass),
        }
        out.update({f"p_{t.name}": t.pvalue for t in self.tests})
        out.update({f"control_p_{c.name}": c.pvalue for c in self.controls})
        out.update(self.effects)
        out.update({f"power_{key}": value for key, value in self.power.items()})
        if self.floor is not None:
            out.update({f"floor_{key}": value for key, value in self.floor.summary().items()})
            if self.numerics is not None:
                out["beyond_numerics"] = float(self.numerics == "beyond")
        return out

    def as_dict(self) -> dict:
        return {
            "verdict": "different" if self.reject else "not distinguishable",
            "rejected_by": self.rejected,
            "alpha": self.alpha,
            "tests": [{**vars(t), "holm": h, "bh": b} for t, h, b in zip(self.tests, self.holm, self.bh)],
            "controls": [vars(c) for c in self.controls],
            "effects": self.effects,
            "power": self.power,
            "samples": {"method": self.n_method, "baseline": self.n_baseline, "length": self.length},
            "tv_by_position": None if self.tv_by_position is None else self.tv_by_position.tolist(),
            "tv_null_by_position": None if self.tv_null_by_position is None else self.tv_null_by_position.tolist(),
            "floor": None if self.floor is None else self.floor.as_dict(),
            "numerics": self.numerics,
        }

    def format(self) -> str:
        """A few lines for the console."""
        e, pw = self.effects, self.power
        if self.reject:
            verdict = f"DIFFERENT from the target (Holm, family-wise alpha={self.alpha}): rejected by {', '.join(self.rejected)}"
        else:
            verdict = (
                f"not distinguishable from the target (Holm over {len(self.tests)} tests, alpha={self.alpha}); "
                f"with N={self.n_method}, a position TV >= {pw['min_tv_position']:.3f} or a surprisal shift >= "
                f"{pw['min_surprisal_shift']:.3f} nats/token would be detected with power {pw['power']:.0%}"
            )
        shown = sorted(zip(self.holm, self.tests), key=lambda t: t[0])[:6]
        lines = [
            f"equivalence ({self.n_method} method vs {self.n_baseline} baseline sequences of {self.length} tokens): {verdict}",
            "  smallest p-values (raw / Holm): " + ", ".join(f"{t.name} {t.pvalue:.2g}/{h:.2g}" for h, t in shown),
            f"  surprisal deficit {e['surprisal_deficit']:+.3f} nats/token [{e['surprisal_deficit_ci_low']:+.3f}, "
            f"{e['surprisal_deficit_ci_high']:+.3f}]; top-1 share {e['top1_share_method']:.3f} vs baseline "
            f"{e['top1_share_baseline']:.3f}; mean position TV (pooled) {e['tv_position']:.3f}, two samples of one law "
            f"{e['tv_position_null']:.3f} (95% below {e['tv_position_null_q95']:.3f})",
        ]
        if not self.reject:
            short = ""
            if pw["n_for_tv"] > self.n_method:
                short = (f" ({pw['n_for_tv'] / self.n_method - 1:.1%} more than this run's, which stats.samples=auto sized at the "
                         f"baseline's own position df, {self.sized_at_df})" if self.sized_at_df is not None
                         else " (more than this run's: size N with stats.samples=auto)")
            lines.append(f"  sequences per side for a position TV of {pw['tv']:g} with power {pw['power']:.0%} at this run's "
                         f"position df ({pw['position_df']:.0f}): {pw['n_for_tv']:.0f}{short}")
        if not self.reject and e["surprisal_deficit"] != 0:
            lines.append(f"  samples per side to detect the observed surprisal deficit with power {pw['power']:.0%}: "
                         f"{pw['n_for_observed_deficit']:.0f}")
        if self.floor is not None:
            f = self.floor
            judged = {"beyond": "DIFFERENT beyond the target's own numerics",
                      "within": "every rejection is within reach of the target's own numerics: the rule is not shown to differ "
                                "(compare like with like: model.kernels=invariant, or fp32)",
                      None: "nothing to attribute"}[self.numerics]
            lines.append(f"  numeric floor ({f.sequences} baseline sequences re-read; plain decoding's path vs verification's, "
                         f"{f.chunk} a forward from the prompt's last token): mean TV "
                         f"{f.verify.mean():.4f} per position (max {f.verify.max():.4f}), at most {f.bound.max():.4f} on a position's "
                         f"marginal; 1 query vs teacher forcing {f.score.mean():.4f}: {judged}")
        if not self.controls_pass:
            lines.append("  WARNING: the baseline fails its own one-sample tests: the harness, not the method, is suspect")
        return "\n".join(lines)


def battery(
    base: Samples, base_cond: Conditionals, meth: Samples, meth_cond: Conditionals,
    alpha: float = 0.01, power: float = 0.8, permutations: int = 200, seed: int = 0, tv: float = 0.05,
    floor: NumericFloor | None = None,
) -> Report:
    """Run every test of the battery on one method's samples against the baseline's.

    Args:
        base, base_cond: the target's own samples and their teacher-forced conditionals.
        meth, meth_cond: the method's samples (same prompts) and their conditionals.
        alpha: family-wise error rate of the verdict (Holm).
        power: the power the report's detectable effects are stated for.
        tv: the position TV the report states the needed N for (`power["n_for_tv"]`).
        permutations: relabellings of the two samples for the TV's noise floor (0: none, NaN floor).
        seed: seeds the permutation draws.
        floor: the target's own numerics along the baseline's samples (`stats.floor.numeric_floor`): the
            verdict is then judged against it (`Report.numerics`).
    """
    length = meth.tokens.shape[1]
    if not 0 < tv < 1:
        raise SpecResearchError(f"battery: tv must lie in (0, 1), got {tv}")
    tests = [
        _surprisal_z(meth_cond, "surprisal_z"),
        _pit_ks(meth_cond, "pit_ks"),
        *_loglik_tests(base_cond, meth_cond),
        *(
            _contingency(_labels(base, 0, j), _labels(meth, 0, j), f"joint_{j}")
            for j in (2, 3) if j <= length
        ),
        *(_contingency(_labels(base, t, t + 1), _labels(meth, t, t + 1), f"position_{t + 1}") for t in range(length)),
    ]
    pvalues = np.array([t.pvalue for t in tests])
    report = Report(
        tests=tests,
        holm=holm(pvalues).tolist(),
        bh=st.false_discovery_control(np.clip(pvalues, 1e-300, 1)).tolist(),
        alpha=alpha,
        controls=[_surprisal_z(base_cond, "surprisal_z"), _pit_ks(base_cond, "pit_ks")],
        n_method=len(meth.tokens),
        n_baseline=len(base.tokens),
        length=length,
    )
    rng = np.random.default_rng(seed)
    report.effects, report.tv_by_position, report.tv_null_by_position = _effects(base, base_cond, meth, meth_cond, permutations, rng)
    report.floor = floor
    report.power = _power(tests, meth_cond, report, alpha, power, tv)
    return report


def holm(pvalues: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control under any dependence)."""
    m = len(pvalues)
    order = np.argsort(pvalues)
    adjusted = np.maximum.accumulate((m - np.arange(m)) * pvalues[order]).clip(max=1.0)
    out = np.empty(m)
    out[order] = adjusted
    return out


def calibration(reports: list[Report], alpha: float) -> dict[str, float]:
    """A/A calibration: over repetitions of baseline vs baseline, the verdict's rejection rate with a
    95% Clopper–Pearson interval, a one-sided test that it does not exceed `alpha`, and a KS test of
    the uniformity of the surprisal z-test's p-values (each valid test's p-value is U(0, 1) under H0)."""
    rejections = sum(r.reject for r in reports)
    result = st.binomtest(rejections, len(reports), alpha, alternative="greater")
    ci = st.binomtest(rejections, len(reports), alpha).proportion_ci()
    z_pvalues = [next(t.pvalue for t in r.tests if t.name == "surprisal_z") for r in reports]
    return {
        "repeats": len(reports),
        "rejections": rejections,
        "rate": rejections / len(reports),
        "rate_ci_low": ci.low,
        "rate_ci_high": ci.high,
        "p_rate_above_alpha": result.pvalue,
        "p_uniform_surprisal_z": st.kstest(z_pvalues, "uniform").pvalue,
    }


# --- the tests ---------------------------------------------------------------------------------


def _surprisal_z(cond: Conditionals, name: str) -> TestResult:
    surprisal = -cond.logp
    if np.isinf(surprisal).any():  # a token the target gives probability 0: not the target's law
        return TestResult(name, float("inf"), 0.0, kind="one-sample")
    variance = (cond.m2 - cond.entropy**2).clip(min=0).sum()
    if variance <= 0:  # every position deterministic
        return TestResult(name, 0.0, 1.0, kind="one-sample")
    z = (surprisal - cond.entropy).sum() / np.sqrt(variance)
    return TestResult(name, float(z), float(2 * st.norm.sf(abs(z))), kind="one-sample")


def _pit_ks(cond: Conditionals, name: str) -> TestResult:
    result = st.kstest(cond.pit.ravel(), "uniform")
    return TestResult(name, float(result.statistic), float(result.pvalue), kind="one-sample")


def _loglik_tests(base_cond: Conditionals, meth_cond: Conditionals) -> list[TestResult]:
    # rounded, so that the same sequence scored in two batches is a tie, not a float-noise rank
    a, b = (np.round(c.logp.sum(1), 4) for c in (meth_cond, base_cond))
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return [TestResult("loglik_mannwhitney", float("inf"), 0.0), TestResult("loglik_ks", float("inf"), 0.0)]
    mw = st.mannwhitneyu(a, b, alternative="two-sided")
    ks = st.ks_2samp(a, b)
    return [TestResult("loglik_mannwhitney", float(mw.statistic), float(mw.pvalue)),
            TestResult("loglik_ks", float(ks.statistic), float(ks.pvalue))]


def _labels(s: Samples, start: int, stop: int) -> np.ndarray:
    """[N, ...] the category of each sequence: its prompt and tokens start..stop-1, as rows."""
    return np.concatenate([s.prompt[:, None], s.tokens[:, start:stop]], 1)


def _contingency(a: np.ndarray, b: np.ndarray, name: str) -> TestResult:
    """Pearson's χ² test of homogeneity of two samples of categories (rows of `a` and `b`), rare
    categories pooled into 'other' until every expected count is >= MIN_EXPECTED.

    Pearson's X² rather than the G statistic (lambda_="log-likelihood"), because Holm reads each p-value
    at alpha / m: on these tables (a few expected counts near 5) the G statistic's p-values below
    alpha / m came 1.5-2.1x as often as nominal under H0, X²'s at or below it (docs/concepts/lossless.md).
    No Yates correction: it only applies to 2x2 tables and makes them conservative."""
    table = pooled_table(a, b)
    if table.shape[1] < 2:  # one category: nothing can differ
        return TestResult(name, 0.0, 1.0, df=0)
    result = st.chi2_contingency(table, correction=False)  # [2, C] table; Pearson's X² (lambda_ default)
    return TestResult(name, float(result.statistic), float(result.pvalue), df=int(result.dof))


def pooled_table(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[2, C] counts of each category in a and b; categories whose smaller expected count is below
    MIN_EXPECTED go to one 'other' column, itself merged into the rarest kept one if still too small."""
    return _pooled(category_counts(a, b), len(a), len(b))


def _pooled(counts: np.ndarray, na: int, nb: int) -> np.ndarray:
    """`pooled_table` of [2, C] counts of samples of sizes na and nb (empty categories change nothing)."""
    share = min(na, nb) / (na + nb)
    keep = counts.sum(0) * share >= MIN_EXPECTED
    kept, other = counts[:, keep], counts[:, ~keep].sum(1, keepdims=True)
    if other.sum() * share >= MIN_EXPECTED or kept.shape[1] == 0:
        return np.concatenate([kept, other], 1) if other.sum() else kept
    rarest = kept.sum(0).argmin()
    kept[:, rarest] += other[:, 0]
    return kept


# --- effect sizes and power --------------------------------------------------------------------


def _effects(base, base_cond, meth, meth_cond, permutations: int, rng) -> tuple[dict[str, float], np.ndarray, np.ndarray]:
    surprisal, entropy = -meth_cond.logp, meth_cond.entropy
    finite = np.isfinite(surprisal)
    n_tokens = finite.sum()
    deficit = float((entropy[finite] - surprisal[finite]).mean()) if n_tokens else float("nan")
    half = 1.96 * np.sqrt((meth_cond.m2 - entropy**2).clip(min=0)[finite].sum()) / max(n_tokens, 1)
    tv_t, null_t, q95 = _tv_position(base.tokens, meth.tokens, base.prompt, meth.prompt, permutations, rng)
    tv, null = float(tv_t.mean()), float(null_t.mean())
    return {
        "surprisal_deficit": deficit,  # > 0: the method emits likelier tokens than the target would
        "surprisal_deficit_ci_low": deficit - half,
        "surprisal_deficit_ci_high": deficit + half,
        "top1_share_method": float((meth_cond.rank == 1).mean()),
        "top1_share_baseline": float((base_cond.rank == 1).mean()),
        "impossible_tokens": float((~finite).sum()),
        "tv_position": tv,  # the plug-in mean position TV: biased upwards by sampling noise (see _tv_position)
        "tv_position_null": null,  # its mean when both samples come from one law (the noise floor)
        "tv_position_null_q95": q95,  # ... and its 95th percentile there
    }, tv_t, null_t


def _position_tv(codes: list[tuple[np.ndarray, int]], x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """[L] per position, the TV between two samples' (prompt, token) histograms, pooled as the
    tests pool them: a coarsening, so it bounds the true TV from below, with far less small-sample bias
    than the raw histograms over a whole vocabulary. The samples are the sequences at indices x and y
    of a pool whose category codes at each position are `codes` ([N] codes, their number)."""
    tvs = []
    for code, c in codes:
        table = _pooled(np.stack([np.bincount(code[x], minlength=c), np.bincount(code[y], minlength=c)]), len(x), len(y))  # [2, C']
        tvs.append(0.5 * np.abs(table[0] / table[0].sum() - table[1] / table[1].sum()).sum())
    return np.array(tvs)


def category_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[2, C] counts of every category (rows) in a and b, no pooling."""
    _, inverse = np.unique(np.concatenate([a, b]), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    c = inverse.max() + 1
    return np.stack([np.bincount(inverse[: len(a)], minlength=c), np.bincount(inverse[len(a):], minlength=c)])


def _tv_position(base, meth, pbase, pmeth, permutations: int, rng) -> tuple[np.ndarray, np.ndarray, float]:
    """[L] the plug-in TV at each position and, under random relabelling of the two samples (what two
    samples of one law give at these sizes), [L] its mean there (the noise floor; NaN without
    permutations) and the 95th percentile of the relabellings' mean over positions.

    The plug-in TV of two histograms is biased upwards by their sampling noise (at N = 22,000 a side
    and ~300 categories per position, about 0.047 for two samples of one law), and the bias is
    largest where the true TV is 0 (far from 0 the noise of a category mostly cancels and the plug-in
    is close to the TV). So no bootstrap interval of it is honest near 0: a resample adds its own noise
    on top (the percentile interval of a lossless run sat at [0.062, 0.069] around a plug-in 0.045),
    and subtracting the floor over-corrects a large TV. The report therefore states the plug-in beside
    its noise floor; whether a difference is real is the position χ² tests' call."""
    both, pboth = np.concatenate([base, meth]), np.concatenate([pbase, pmeth])
    codes = []  # per position, each sequence's (prompt, token) category as one integer: relabellings only count them
    for t in range(both.shape[1]):
        _, inverse = np.unique(np.stack([pboth, both[:, t]], 1), axis=0, return_inverse=True)
        codes.append((inverse.ravel(), int(inverse.max()) + 1))
    n = len(base)
    tv = _position_tv(codes, np.arange(n), np.arange(n, len(both)))  # [L]
    nulls = []
    for _ in range(permutations):
        perm = rng.permutation(len(both))
        nulls.append(_position_tv(codes, perm[:n], perm[n:]))
    if not nulls:
        return tv, np.full(len(tv), np.nan), float("nan")
    nulls = np.array(nulls)  # [R, L]
    return tv, nulls.mean(0), float(np.percentile(nulls.mean(1), 95))


def noncentrality(df: int, level: float, power: float) -> float:
    """The χ² noncentrality at which a level-`level` test with `df` degrees of freedom has `power`."""
    critical = st.chi2.isf(level, df)
    return brentq(lambda lam: st.ncx2.sf(critical, df, lam) - power, 1e-9, 1e6)


def family_size(length: int) -> int:
    """The number of tests `battery` gates with Holm for sequences of `length` tokens: surprisal z,
    PIT KS, two log-likelihood tests, the joints of the first 2 and 3 tokens (when that long), and one
    χ² test per position."""
    return 4 + (length >= 2) + (length >= 3) + length


def samples_for_tv(tv: float, df: int, length: int, alpha: float = 0.01, power: float = 0.8) -> int:
    """Sequences per side (equal sizes, all prompts together) at which a position χ² test with `df`
    degrees of freedom detects a position TV of `tv` with `power`, at Holm's strictest level
    alpha / family_size(length): N = λ* / (2 TV²), from λ = n_eff Σ (a − b)² / m_i ≥ 4 n_eff TV² with
    n_eff = N / 2 (Cauchy–Schwarz over the pooled categories; conservative).

    Args:
        tv: the total variation between the method's and the target's law at one position.
        df: the position test's degrees of freedom (pooled categories − 1; see `position_df`).
        length: tokens per sequence (sets the size of the Holm family).
        alpha: family-wise error rate of the verdict.
        power: the probability of rejecting at that TV.

    Returns:
        N per side.
    """
    return int(np.ceil(noncentrality(max(int(df), 1), alpha / family_size(length), power) / (2 * tv**2)))


def position_df(s: Samples) -> int:
    """The median over positions of the degrees of freedom the position χ² tests will have when another
    sample of the same size and law is tested against `s` (categories pooled as `pooled_table` pools
    them: a category is kept when its count in `s` is at least MIN_EXPECTED); at least 1."""
    dfs = [pooled_table(labels, labels).shape[1] - 1 for labels in (_labels(s, t, t + 1) for t in range(s.tokens.shape[1]))]
    return max(int(np.median(dfs)), 1) if dfs else 1


def _power(tests: list[TestResult], meth_cond: Conditionals, report: Report, alpha: float, power: float, tv: float) -> dict[str, float]:
    """What the battery can detect at this N, at Holm's strictest level alpha / m (conservative).

    Two-sample χ² with n_a, n_b draws: noncentrality λ = n_eff Σ (a − b)² / m_i ≥ 4 n_eff TV², with
    n_eff = n_a n_b / (n_a + n_b) (Cauchy–Schwarz), so TV_min = √(λ* / (4 n_eff)). Surprisal z:
    a mean shift δ per token is detected when δ ≥ (z_(level/2) + z_power) σ / √(tokens)."""
    level = alpha / len(tests)
    n_a, n_b = report.n_method, report.n_baseline
    n_eff = n_a * n_b / (n_a + n_b)
    dfs = [t.df for t in tests if t.name.startswith("position_") and t.df > 0]
    df = int(np.median(dfs)) if dfs else 1
    lam = noncentrality(df, level, power)
    sigma = float(np.sqrt((meth_cond.m2 - meth_cond.entropy**2).clip(min=0).mean()))
    z = st.norm.isf(level / 2) + st.norm.isf(1 - power)
    n_tokens = meth_cond.logp.size
    deficit = report.effects["surprisal_deficit"]
    per_seq = meth_cond.logp.shape[1]
    return {
        "power": power,
        "level": level,
        "position_df": df,
        "min_tv_position": float(np.sqrt(lam / (4 * n_eff))),
        "min_surprisal_shift": float(z * sigma / np.sqrt(n_tokens)),
        "tv": tv,
        "n_for_tv": float(np.ceil(lam / (2 * tv**2))),  # per side, equal sizes (samples_for_tv at this df)
        "n_for_observed_deficit": float(np.ceil((z * sigma / abs(deficit)) ** 2 / per_seq)) if deficit else float("inf"),
    }
