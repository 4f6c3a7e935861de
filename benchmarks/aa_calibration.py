"""The equivalence battery's type-I error over R independent seeds, and its power on a lossy control (tiny model).

Up to two comparisons, R repeats each, through the functions a run's battery uses (specresearch.measure):

- A/A: the target against itself, repeat r from streams (seed, AA_A/AA_B, prompt, r) (`aa_report`,
  what `stats.aa_repeats` runs);
- a lossless method against the target: `drafter=pld verifier=rejection` by default, repeat r being
  the battery of a run with seed `seed + r` (baseline and method draws, teacher forcing, Holm); with
  stream seeds (specresearch.seeding) consecutive seeds share no draw. `--aa-only` skips it;
- or, in its place, a known-lossy control (`--lossy "verifier=margin verifier.margin=0.01"`, with
  drafter=plain_chain unless it names one), its repeats drawn as the lossless method's: its rejection
  rate is the battery's power at this N, set beside the power the battery states there for the
  control's exact first-position TV (stats.distortion: the first token's law, computed, not sampled).

N per side is a number or `auto`: the N stats.samples=auto sizes on this prompt (`auto_samples`, from the
baseline a run of seed `seed` draws), found once and used by every repeat. With `--tv exact` (a lossy
control) auto sizes N for the control's exact first-position TV instead of stats.tv.

For each comparison: the Holm verdict's rejection rate at alpha with its Clopper-Pearson 95% interval
(whether it contains alpha, or lies below or above it), and for every test of the family the rate of its
raw p-value below alpha and below alpha / m (the far tail, where Holm decides; m the family size), each
with its interval, and a KS test of the uniformity of its p-values (each is U(0, 1) under H0 for a
continuous test; discrete ones sit above it).

    python benchmarks/aa_calibration.py --repeats 1000 --samples 300 --out docs/results/data/DATE-aa-calibration.json
    python benchmarks/aa_calibration.py --repeats 100 --samples auto --aa-only --out docs/results/data/DATE-aa-calibration-auto.json
    python benchmarks/aa_calibration.py --repeats 100 --samples auto --tv exact --lossy "verifier=margin verifier.margin=0.01" \
        --out docs/results/data/DATE-battery-power-margin.json

The report is a results page in the curated format of docs/hooks/results.py, the raw p-values beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specresearch import reports
from specresearch.errors import SpecResearchError, fail, report_problem

ROOT = Path(__file__).resolve().parent.parent
METHOD = ("drafter=pld", "verifier=rejection")
LOSSY_DRAFTER = "drafter=plain_chain"  # a sampled chain: pld's lookup drafts nothing at these positions (its exact TV there is 0)
BASE = ("model=tiny", "sampling=random", "dataset=humaneval", "dataset.num_prompts=1", "tracker=none")
LABELS = {"aa": "A/A (target vs target)"}  # the method's and the lossy control's: "<engine label> vs target"


def calibrate(repeats: int, samples: int | str, method: Sequence[str] = METHOD, alpha: float = 0.01, length: int = 8, seed: int = 0,
              batch: str | int = "auto", progress: Callable[[str, int], None] | None = None, *,
              comparisons: Sequence[str] = ("aa", "method"), tv: float | str | None = None) -> dict:
    """R repeats of each comparison on the first HumanEval prompt, the tiny model at T = 1.

    Args:
        repeats: R, independent repeats of each comparison.
        samples: N per side and repeat, or "auto": the N stats.samples=auto sizes (`auto_size`), once.
        method: the method's overrides: a lossless one (comparison "method": its verdict should reject at
            rate alpha), or the lossy control's (comparison "lossy"; drafter=plain_chain unless given).
        alpha: the verdict's family-wise level (Holm), and the raw tests' level in the per-test rates.
        length: tokens per sequence (stats.length).
        seed: the A/A repeats' seed (repeat r: stream r of its A/A streams); the method's repeat r is a
            run with seed `seed + r`; auto's sizing draws the baseline of a run with seed `seed`.
        batch: rows per call (stats.batch).
        progress: called with ("aa", "method" or "lossy", r) after each repeat, and ("auto", N) once N is sized.
        comparisons: which to run, in this order within a repeat: "aa", and "method" or "lossy".
        tv: the position TV auto sizes N for and the battery's power report states N for: a number,
            "exact" (the lossy control's exact first-position TV, floored to 3 decimals), or None (stats.tv).

    Returns:
        {"config": ..., "auto": sizing or None, "exact": the lossy control's exact distortion or None,
        one summary per comparison ("aa", "method", "lossy"), "seconds": ...}; a summary holds the
        calibration (`specresearch.stats.calibration`), each test's raw and far-tail rejection rates and
        KS p-value, and every repeat's p-values (`summarise`).
    """
    from specresearch import build_engine, compose
    from specresearch.data import encode, load_prompts
    from specresearch.measure import aa_report, baseline_samples, method_samples, score, stats_rows
    from specresearch.seeding import stream_seed
    from specresearch.stats import Samples, Stream, battery
    from specresearch.types import SamplingParams

    unknown = [c for c in comparisons if c not in ("aa", "method", "lossy")]
    if unknown or not comparisons or {"method", "lossy"} <= set(comparisons):
        raise SpecResearchError(f"comparisons {list(comparisons)}: valid are 'aa', 'method' and 'lossy', at least one, not both "
                                "'method' and 'lossy'")
    if tv == "exact" and "lossy" not in comparisons:
        raise SpecResearchError("tv='exact' is the lossy control's exact first-position TV: valid only with comparison 'lossy'; "
                                "else a number in (0, 1) or None (stats.tv)")
    t0 = time.perf_counter()
    lossy = "lossy" in comparisons
    overrides = run_overrides(method, lossy, seed)
    cfg = compose(overrides)
    engine = build_engine(cfg)
    target, sampling = engine.kv.lm, SamplingParams(**cfg.sampling)
    prompts = [encode(target.tokenizer, p) for p in load_prompts(**cfg.dataset)][:1]
    rows = stats_rows(batch, engine.kv.vocab_size)
    power = float(cfg.stats.power)
    exact = exact_distortion(cfg, engine, prompts, length, seed) if lossy else None
    if tv == "exact":
        tv = math.floor(exact["tv"][0] * 1000) / 1000  # floored: auto's N then states at least `power` for the exact TV
        if tv <= 0:
            raise SpecResearchError(f"{engine.label}: its exact first-position TV here is {exact['tv'][0]:.2g}, not a lossy control at "
                                    "this prompt: choose another drafter (--lossy 'drafter=... verifier=...') or a number for --tv")
    tv = float(cfg.stats.tv) if tv is None else float(tv)
    sizing = None
    if samples == "auto":
        sizing = auto_size(target, prompts, length, sampling, seed, rows, alpha, power, tv)
        samples = sizing["n"]
        if progress is not None:
            progress("auto", samples)
    samples = int(samples)

    def versus(r: int):
        run = seed + r  # a run with seed s + r: its own streams
        base = baseline_samples(target, prompts, samples, length, sampling, run, rows)
        meth = method_samples(engine, prompts, samples, length, run, rows)
        return battery(Samples.concat(base), score(target, prompts, base, sampling, run, rows, Stream.BASELINE),
                       Samples.concat(meth), score(target, prompts, meth, sampling, run, rows, Stream.METHOD),
                       alpha=alpha, power=power, permutations=0, seed=stream_seed(run, Stream.PERMUTE), tv=tv)

    found: dict[str, list] = {kind: [] for kind in comparisons}
    seconds = dict.fromkeys(comparisons, 0.0)
    for r in range(repeats):
        for kind in comparisons:
            t = time.perf_counter()
            found[kind].append(aa_report(target, prompts, samples, length, sampling, seed, r, rows, alpha, power, tv) if kind == "aa"
                               else versus(r))
            seconds[kind] += time.perf_counter() - t
            if progress is not None:
                progress(kind, r)
    out = {
        "config": {"overrides": overrides, "method": engine.label if set(comparisons) - {"aa"} else None,
                   "comparisons": list(comparisons), "repeats": repeats, "samples": samples,
                   "samples_asked": "auto" if sizing else samples, "tv": tv, "power": power, "length": length, "alpha": alpha,
                   "seed": seed, "rows": rows, "prompt_tokens": len(prompts[0])},
        "auto": sizing,
        "exact": exact,
    }
    for kind in comparisons:
        out[kind] = summarise(found[kind], alpha, exact if kind == "lossy" else None)
        out[kind]["seconds"] = seconds[kind]
    out["seconds"] = time.perf_counter() - t0
    return out


def run_overrides(method: Sequence[str], lossy: bool, seed: int) -> list[str]:
    """The overrides `calibrate` composes its runs' config from: the tiny model's base, the method's (a lossy
    control's over drafter=plain_chain unless it names a drafter), the seed."""
    method = list(method)
    if lossy and not any(o.startswith("drafter=") for o in method):
        method = [LOSSY_DRAFTER, *method]
    return [*BASE, *method, f"seed={seed}"]


def auto_size(target, prompts: list[list[int]], length: int, sampling, seed: int, rows: int, alpha: float, power: float,
              tv: float) -> dict:
    """The N per prompt stats.samples=auto sizes for a run of seed `seed` on these prompts: its baseline
    draw at the df = 1 bound, grown by `auto_samples` (streams BASELINE then AUTO, as `equivalence` draws
    them) until N reaches what the position tests need for a position TV of `tv` with `power`.

    Returns:
        {"n": N per prompt, "start": the df = 1 bound, "position_df": the grown baseline's own (what N was
        sized at), "n_for_tv": samples_for_tv at that df (all prompts), "tv", "power", "seconds"}.
    """
    from omegaconf import OmegaConf

    from specresearch.measure import auto_samples, baseline_samples
    from specresearch.stats import Samples, Stream, position_df, samples_for_tv

    t0 = time.perf_counter()
    sc = OmegaConf.create({"tv": tv, "power": power, "alpha": alpha, "length": length})
    start = -(-samples_for_tv(tv, 1, length, alpha, power) // len(prompts))
    parts = baseline_samples(target, prompts, start, length, sampling, seed, rows)
    parts, n = auto_samples(parts, start, lambda more, r: baseline_samples(target, prompts, more, length, sampling, seed, rows,
                                                                           Stream.AUTO, r), sc)
    df = position_df(Samples.concat(parts))
    return {"n": int(n), "start": int(start), "position_df": int(df), "n_for_tv": samples_for_tv(tv, df, length, alpha, power),
            "tv": tv, "power": power, "seconds": time.perf_counter() - t0}


def exact_distortion(cfg, engine, prompts: list[list[int]], length: int, seed: int) -> dict:
    """The method's exact first-token distortion (stats.distortion) along the target's own continuation of
    `length` tokens of each prompt (a run of seed `seed`): per position the TV to the target's p and the
    probability of keeping the first draft token. Position 1's law is the method's first-token law given
    the prompt, so its TV is the exact TV of the battery's position_1 marginals; later positions' are
    per-step values along one continuation, not marginals."""
    from specresearch import build_engine
    from specresearch.stats.distortion import check_distortion, continuations, distortion

    check_distortion(engine)
    base = build_engine(cfg, baseline=True, target=engine.kv.lm)
    d = distortion(engine, prompts, continuations(base, prompts, length, seed), seed)
    return {"tv": [float(v) for v in d.tv[0]], "kept": [float(v) for v in d.kept[0]], "tv_mean": float(d.tv.mean())}


def summarise(reports: list, alpha: float, exact: dict | None = None) -> dict:
    """The calibration of R reports: the verdict's rejection rate (`specresearch.stats.calibration`, and
    where its interval lies against alpha), and per test of the family its raw rejection rate at alpha and
    in the far tail (raw p below alpha / m, m the family size: the level Holm reads the smallest p-value
    at), each with a Clopper-Pearson 95% interval, the KS p-value of its p-values' uniformity and its
    median df (χ² tests); the tests the verdict's rejections came from; every repeat's raw p-values and
    Holm minimum. With `exact` (a lossy control's exact distortion): `stated_power`."""
    from scipy import stats as st

    from specresearch.stats import calibration

    names = [t.name for t in reports[0].tests]
    m = len(names)
    pvalues = {name: [next(t.pvalue for t in r.tests if t.name == name) for r in reports] for name in names}
    tests = {}
    for name, ps in pvalues.items():
        k, tail = sum(p < alpha for p in ps), sum(p < alpha / m for p in ps)
        ci, tail_ci = st.binomtest(k, len(ps)).proportion_ci(), st.binomtest(tail, len(ps)).proportion_ci()
        dfs = [next(t.df for t in r.tests if t.name == name) for r in reports]
        tests[name] = {"rejections": k, "rate": k / len(ps), "rate_ci_low": ci.low, "rate_ci_high": ci.high,
                       "tail_rejections": tail, "tail_rate": tail / len(ps), "tail_ci_low": tail_ci.low, "tail_ci_high": tail_ci.high,
                       "p_uniform": float(st.kstest(ps, "uniform").pvalue), "df_median": float(np.median(dfs))}
    cal = calibration(reports, alpha)
    cal["versus_alpha"] = versus_alpha(cal["rate_ci_low"], cal["rate_ci_high"], alpha)
    by: dict[str, int] = {}
    for r in reports:
        for name in r.rejected:
            by[name] = by.get(name, 0) + 1
    out = {
        "calibration": cal,
        "family_size": m,
        "tail_level": alpha / m,
        "tests": tests,
        "holm_rejected_by": by,
        "pvalues": {name: [float(f"{p:.4g}") for p in ps] for name, ps in pvalues.items()},
        "min_holm": [float(f"{min(r.holm):.4g}") for r in reports],
    }
    if exact is not None:
        out["stated_power"] = stated_power(reports, exact["tv"][0])
    return out


def versus_alpha(low: float, high: float, alpha: float) -> str:
    """Where a rate's interval [low, high] lies against alpha: "contains alpha", "below alpha" or "above alpha"."""
    return "below alpha" if high < alpha else "above alpha" if low > alpha else "contains alpha"


def stated_power(reports: list, tv1: float) -> dict:
    """What the battery states it detects at these repeats' N, beside the lossy control's exact first-position
    TV `tv1`: its power report (`Report.power`: the smallest position TV detected with its power at Holm's
    strictest level alpha / m, medians over the repeats), and the power its own bound gives the position_1
    test alone at that level: ncx2.sf(chi2.isf(alpha / m, df), df, 4 n_eff tv1²), df the test's (per
    repeat; the mean over repeats). That bound is conservative (Cauchy-Schwarz over the pooled
    categories), and the verdict has 13 more tests, so the measured rates should reach it."""
    from scipy import stats as st

    per = []
    for r in reports:
        df = next(t.df for t in r.tests if t.name == "position_1")
        n_eff = r.n_method * r.n_baseline / (r.n_method + r.n_baseline)
        per.append(float(st.ncx2.sf(st.chi2.isf(r.power["level"], df), df, 4 * n_eff * tv1**2)) if df > 0 else 0.0)
    return {
        "power": reports[0].power["power"],
        "level": reports[0].power["level"],
        "exact_tv_position_1": tv1,
        "position_1_power": float(np.mean(per)),
        "position_1_power_min": float(np.min(per)),
        "position_1_df_median": float(np.median([next(t.df for t in r.tests if t.name == "position_1") for r in reports])),
        "min_tv_position": float(np.median([r.power["min_tv_position"] for r in reports])),
        "position_df": float(np.median([r.power["position_df"] for r in reports])),
        "n_for_tv": float(np.median([r.power["n_for_tv"] for r in reports])),
        "tv": reports[0].power["tv"],
    }


def machine() -> str:
    """The CPU (its model name from /proc/cpuinfo), its cores, torch, and no GPU where none is used."""
    import torch

    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    threads = torch.get_num_threads()
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({threads} thread{'s' * (threads > 1)}), fp32 on the CPU"


def label(result: dict, kind: str) -> str:
    """A comparison's name on the page."""
    return LABELS.get(kind) or f"{result['config']['method']} vs target" + (" (lossy control)" if kind == "lossy" else "")


def page(result: dict, command: str, date: str) -> dict:
    """The results page (docs/hooks/results.py's curated format) with the raw result beside it: per
    comparison the Holm verdict's row (its interval against alpha), then one row per test (raw and
    far-tail rates); a lossy control's rows add the power the battery states."""
    c = result["config"]
    alpha, kinds = c["alpha"], c["comparisons"]
    m = result[kinds[0]]["family_size"]
    lossy = "lossy" in kinds
    columns = ["comparison", "test", f"rejected at alpha = {alpha}", "rate", "95% interval (Clopper-Pearson)",
               f"far tail: raw p < alpha / {m} = {alpha / m:.2g}", "far-tail rate (95% interval)", "KS uniformity p of its p-values",
               *(["stated power at this N"] if lossy else [])]
    rows = []
    for kind in kinds:
        s = result[kind]
        cal, name = s["calibration"], label(result, kind)
        stated = s.get("stated_power")
        extra = ([f">= {stated['position_1_power']:.3f} (position_1 alone, exact TV {stated['exact_tv_position_1']:.3f})"]
                 if stated else [""] if lossy else [])
        rows.append([name, "**Holm verdict**", f"{cal['rejections']}/{cal['repeats']}", f"{cal['rate']:.3f}",
                     f"{cal['rate_ci_low']:.3f}-{cal['rate_ci_high']:.3f} ({cal['versus_alpha']})", "", "", "", *extra])
        for test, t in s["tests"].items():
            extra = ([f"{stated['position_1_power']:.3f}" if test == "position_1" else ""] if stated else [""] if lossy else [])
            rows.append([name, f"{test} (raw p)", f"{t['rejections']}/{cal['repeats']}", f"{t['rate']:.3f}",
                         f"{t['rate_ci_low']:.3f}-{t['rate_ci_high']:.3f}", f"{t['tail_rejections']}/{cal['repeats']}",
                         f"{t['tail_rate']:.4f} ({t['tail_ci_low']:.4f}-{t['tail_ci_high']:.4f})", f"{t['p_uniform']:.3g}", *extra])
    what = "power of the equivalence battery on a lossy control" if kinds == ["lossy"] else "A/A calibration of the equivalence battery"
    n = f"N = {c['samples']} (auto)" if c["samples_asked"] == "auto" else f"N = {c['samples']}"
    return {
        "title": f"{what[0].upper() + what[1:]} over {c['repeats']} independent seeds at {n} (tiny model)",
        "date": date,
        "machine": machine(),
        "topic": "lossless",
        "command": [command],
        "prompts": f"the first HumanEval prompt x {c['length']} tokens, T = 1, {n} per side",
        "columns": columns,
        "rows": rows,
        "notes": findings(result),
        "data": {"script": "benchmarks/aa_calibration.py", "result": result},
    }


def findings(result: dict) -> list[str]:
    """The page's findings, from the result alone: the setup (and auto's sizing), each verdict's rate
    against alpha, the null comparisons pooled, which tests the rejections came from and each test's far
    tail, and for a lossy control the measured power beside the stated one."""
    from scipy import stats as st

    c = result["config"]
    alpha, repeats, kinds = c["alpha"], c["repeats"], c["comparisons"]
    m = result[kinds[0]]["family_size"]
    nulls = [k for k in kinds if k != "lossy"]
    notes = [
        f"{repeats} independent repeats of each comparison ({', '.join(label(result, k) for k in kinds)}), N = {c['samples']} sequences "
        f"of {c['length']} tokens per side and repeat, the first HumanEval prompt ({c['prompt_tokens']} byte tokens) on the tiny "
        f"random model (vocabulary 320) at T = 1, fp32; the verdict is Holm over the battery's {m} tests at alpha = {alpha} "
        "(Pearson's X² for the position and joint contingency tests), no permutations.",
    ]
    auto = result.get("auto")
    if auto:
        notes.append(
            f"N = {auto['n']} is what stats.samples=auto sizes for this prompt (seed {c['seed']}): from the df = 1 bound "
            f"({auto['start']}) it grew the baseline until N covers a position TV of {auto['tv']:g} with power {auto['power']:.0%} at "
            f"the position df of its own samples ({auto['position_df']}: samples_for_tv = {auto['n_for_tv']}); sized once "
            f"({auto['seconds']:.0f} s) and used by every repeat.")
    streams = []
    if "aa" in kinds:
        streams.append(f"A/A repeat r draws its sides from streams (seed {c['seed']}, AA_A / AA_B, prompt, r), as stats.aa_repeats does")
    if set(kinds) - {"aa"}:
        streams.append(f"the {'lossy control' if 'lossy' in kinds else 'method'}'s repeat r is the battery of a run with seed "
                       f"{c['seed']} + r (its baseline, its method samples one stream each, its scoring)")
    notes.append("; ".join(streams) + ": with stream seeds (specresearch.seeding.stream_seed) no two repeats share a draw.")
    rates = []
    for kind in nulls:
        cal = result[kind]["calibration"]
        rates.append(f"{label(result, kind)} {cal['rejections']}/{cal['repeats']} = {cal['rate']:.4f} (95% {cal['rate_ci_low']:.4f}-"
                     f"{cal['rate_ci_high']:.4f}: {cal['versus_alpha']}; one-sided p of a rate above alpha "
                     f"{cal['p_rate_above_alpha']:.2g})")
    if len(nulls) > 1:
        k = sum(result[kind]["calibration"]["rejections"] for kind in nulls)
        pooled = st.binomtest(k, len(nulls) * repeats).proportion_ci()
        rates.append(f"both being null comparisons, pooled {k}/{len(nulls) * repeats} = {k / (len(nulls) * repeats):.4f} "
                     f"({pooled.low:.4f}-{pooled.high:.4f}: {versus_alpha(pooled.low, pooled.high, alpha)})")
    if rates:
        notes.append("Verdict (family-wise) rejection rate at alpha = " + f"{alpha}: " + "; ".join(rates) + ". Holm keeps it at or below "
                     "alpha only if every test's p-value is valid in the far tail (below alpha / m).")
    for kind in nulls:
        s = result[kind]
        tail = ", ".join(f"{name} {t['tail_rejections']}" for name, t in s["tests"].items() if t["tail_rejections"]) or "none"
        total = sum(t["tail_rejections"] for t in s["tests"].values())
        notes.append(
            f"{label(result, kind)}: the verdict's rejections came from "
            + (", ".join(f"{name} {n}" for name, n in sorted(s["holm_rejected_by"].items(), key=lambda t: -t[1])) or "none")
            + f"; raw p-values below alpha / {m} = {alpha / m:.2g}, of {repeats} per test: {tail} ({total} of {m * repeats} "
            f"test-repeats, {m * repeats * alpha / m:.1f} expected under H0, {repeats * alpha / m:.2f} per test).")
    if "lossy" in kinds:
        s, e = result["lossy"], result["exact"]
        sp, cal, p1 = s["stated_power"], s["calibration"], s["tests"]["position_1"]
        notes.append(
            f"Lossy control {c['method']}: its exact first-token distortion along the target's own continuation (stats.distortion) is "
            f"TV {', '.join(f'{v:.3f}' for v in e['tv'])} per position (mean {e['tv_mean']:.3f}; first draft token kept with probability "
            f"{', '.join(f'{v:.2f}' for v in e['kept'])}). Position 1's is the exact TV of the battery's position_1 marginals "
            f"({sp['exact_tv_position_1']:.3f}); later positions' are per-step values along one continuation, not marginals.")
        notes.append(
            f"Stated: at this N the battery's power report says a position TV >= {sp['min_tv_position']:.3f} is detected with power "
            f"{sp['power']:.0%} (median over repeats; Holm's strictest level {sp['level']:.2g}, median position df "
            f"{sp['position_df']:.0f}); for the control's exact position-1 TV {sp['exact_tv_position_1']:.3f} its bound gives the "
            f"position_1 test alone power {sp['position_1_power']:.3f} at that level (median df {sp['position_1_df_median']:.0f}; "
            f"lowest over repeats {sp['position_1_power_min']:.3f})"
            + (f"; auto sized N for that TV ({c['tv']:g}, floored)" if result.get("auto") else "") + ". "
            f"Measured over {repeats} repeats: position_1 below alpha / {m} {p1['tail_rejections']}/{repeats} = {p1['tail_rate']:.3f} "
            f"({p1['tail_ci_low']:.3f}-{p1['tail_ci_high']:.3f}), the Holm verdict {cal['rejections']}/{repeats} = {cal['rate']:.3f} "
            f"({cal['rate_ci_low']:.3f}-{cal['rate_ci_high']:.3f}): the stated power "
            + ("holds (the measured interval reaches it)" if p1["tail_ci_high"] >= sp["position_1_power"] else "is NOT reached")
            + f" for position_1, and the verdict {'reaches' if cal['rate_ci_high'] >= sp['position_1_power'] else 'falls short of'} it.")
    notes.append("Per test: the share of repeats whose raw (unadjusted) p-value is below alpha and below alpha / m (the far tail, "
                 "where Holm decides), Clopper-Pearson intervals, and a KS test of the uniformity of its p-values over the repeats "
                 "(a small KS p: that test's p-values are not uniform).")
    notes.append(f"Whole run: {result['seconds']:.0f} s (" + ", ".join(f"{label(result, k)} {result[k]['seconds']:.0f} s" for k in kinds)
                 + (f", auto's sizing {result['auto']['seconds']:.0f} s" if result.get("auto") else "") + ").")
    return notes


NUMBERS = re.compile(r"\[\s*(-?[0-9][0-9.eE+-]*(?:,\s*-?[0-9][0-9.eE+-]*)*)\s*\]")  # a JSON array of numbers alone


def dumps(data: dict) -> str:
    """`data` as indented JSON with each array of numbers on one line: the per-repeat p-values (R x m of
    them) one to a line made a 1,000-repeat page 1.7 times as large."""
    return NUMBERS.sub(lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", json.dumps(data, indent=1)) + "\n"


def samples_arg(text: str) -> int | str:
    """--samples: an integer >= 10, or auto."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 10:
        raise argparse.ArgumentTypeError(f"{text!r}: valid are an integer >= 10 (sequences per side) or auto")
    return n


def tv_arg(text: str) -> float | str:
    """--tv: a number in (0, 1), or exact."""
    if text == "exact":
        return text
    try:
        tv = float(text)
    except ValueError:
        tv = -1.0
    if not 0 < tv < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: valid are a number in (0, 1) or exact (a lossy control's exact first-position TV)")
    return tv


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="independent repeats of each comparison (default 200)")
    parser.add_argument("--samples", type=samples_arg, default=300,
                        help="sequences per side and repeat: an integer >= 10, or auto (what stats.samples=auto sizes here; default 300)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--method", default=None, help=f"the lossless method's overrides (default: {' '.join(METHOD)!r})")
    which.add_argument("--aa-only", action="store_true", help="the A/A comparison alone (no method)")
    which.add_argument("--lossy", default=None, metavar="OVERRIDES",
                       help="a known-lossy control in the method's place, no A/A (e.g. 'verifier=margin verifier.margin=0.01'; "
                            f"{LOSSY_DRAFTER} unless it names a drafter): its rejection rate beside the power the battery states")
    parser.add_argument("--tv", type=tv_arg, default=None,
                        help="the position TV auto sizes N for and the power report states N for: a number in (0, 1), or exact "
                             "(--lossy only: the control's exact first-position TV, floored to 3 decimals); default stats.tv")
    parser.add_argument("--alpha", type=float, default=0.01, help="the verdict's family-wise level (default 0.01, stats.alpha)")
    parser.add_argument("--length", type=int, default=8, help="tokens per sequence (default 8, stats.length)")
    parser.add_argument("--seed", type=int, default=0, help="the A/A seed; the method's repeat r runs with seed + r (default 0)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: the tiny model's calls are small, and a second thread on a busy core "
                             "made them 40-90x slower on a 2-core machine)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON report (default: docs/results/data/DATE-aa-calibration.json, DATE-battery-power.json with --lossy)")
    args = parser.parse_args(argv)
    if args.repeats < 2 or args.length < 1 or not 0 < args.alpha < 1 or args.threads < 1:
        parser.error("--repeats >= 2, --length >= 1, 0 < --alpha < 1 and --threads >= 1")
    if args.tv == "exact" and args.lossy is None:
        parser.error("--tv exact is a lossy control's exact first-position TV: valid only with --lossy; else a number in (0, 1)")
    from specresearch import compose

    comparisons = ["aa"] if args.aa_only else ["lossy"] if args.lossy else ["aa", "method"]
    method = (args.lossy or args.method or " ".join(METHOD)).split()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = args.out or ROOT / "docs" / "results" / "data" / f"{date}-{'battery-power' if args.lossy else 'aa-calibration'}.json"
    problem = report_problem(out, "--out")
    if problem:  # before the repeats (hours), not after them
        fail(problem)
    try:  # the overrides through the config's own check (an unknown drafter names the valid ones), before anything runs
        compose(run_overrides(method, "lossy" in comparisons, args.seed))
    except SpecResearchError as err:
        fail(f"--{'lossy' if args.lossy else 'method'} {' '.join(method)!r}: {err}")
    import torch

    torch.set_num_threads(args.threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/aa_calibration.py " + shlex.join(
        ["--repeats", str(args.repeats), "--samples", str(args.samples),
         *(["--method", args.method] if args.method not in (None, " ".join(METHOD)) else []),
         *(["--aa-only"] if args.aa_only else []), *(["--lossy", args.lossy] if args.lossy else []),
         *(["--tv", str(args.tv)] if args.tv is not None else []),
         *(["--alpha", str(args.alpha)] if args.alpha != 0.01 else []), *(["--length", str(args.length)] if args.length != 8 else []),
         *(["--seed", str(args.seed)] if args.seed else []), *(["--threads", str(args.threads)] if args.threads != 1 else []),
         "--out", reports.shown_path(out, ROOT)])
    t0 = time.perf_counter()

    def progress(kind: str, r: int) -> None:
        if kind == "auto":
            print(f"auto: N = {r} per side ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        elif kind == comparisons[-1] and ((r + 1) % 10 == 0 or r + 1 == args.repeats or r < 2):
            print(f"{r + 1}/{args.repeats} repeats ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)

    try:
        result = calibrate(args.repeats, args.samples, method, args.alpha, args.length, args.seed, progress=progress,
                           comparisons=comparisons, tv=args.tv)
    except SpecResearchError as err:  # what only the built engine can tell (a control with no distortion at this prompt)
        fail(str(err))
    data = reports.checked(page(result, command, date), str(out))  # the docs' one results format
    out.write_text(dumps(data), encoding="utf-8")
    for row in data["rows"]:
        if "Holm" in row[1] or row[1].startswith(("surprisal_z", "position_1 ")):
            print(" | ".join(row))
    print(f"{result['seconds']:.0f} s; report: {reports.shown_path(out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
