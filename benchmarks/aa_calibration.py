"""The equivalence battery's type-I error over R independent seeds, on the tiny model.

Two comparisons, R repeats each, through the functions a run's battery uses (specresearch.measure):

- A/A: the target against itself, repeat r from streams (seed, AA_A/AA_B, prompt, r) (`aa_report`,
  what `stats.aa_repeats` runs);
- a lossless method against the target: `drafter=pld verifier=rejection` by default, repeat r being
  the battery of a run with seed `seed + r` (baseline and method draws, teacher forcing, Holm); with
  stream seeds (specresearch.seeding) consecutive seeds share no draw.

For each: the Holm verdict's rejection rate at alpha with its Clopper-Pearson 95% interval, and for
every test of the family the rate of its raw p-value below alpha and a KS test of the uniformity of
its p-values (each is U(0, 1) under H0 for a continuous test; discrete ones sit above it).

    python benchmarks/aa_calibration.py --repeats 200 --samples 300 --out docs/results/data/DATE-aa-calibration.json

The report is a results page in the curated format of docs/hooks/results.py, the raw p-values beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from specresearch import reports

ROOT = Path(__file__).resolve().parent.parent
METHOD = ("drafter=pld", "verifier=rejection")
BASE = ("model=tiny", "sampling=random", "dataset=humaneval", "dataset.num_prompts=1", "tracker=none")


def calibrate(repeats: int, samples: int, method: Sequence[str] = METHOD, alpha: float = 0.01, length: int = 8, seed: int = 0,
              batch: str | int = "auto", progress: Callable[[str, int], None] | None = None) -> dict:
    """R repeats of the A/A comparison and of the method against the target, on the first HumanEval
    prompt, the tiny model at T = 1.

    Args:
        repeats: R, independent repeats of each comparison.
        samples: N per side and repeat.
        method: the method's overrides (a lossless one: its verdict should reject at rate alpha).
        alpha: the verdict's family-wise level (Holm), and the raw tests' level in the per-test rates.
        length: tokens per sequence (stats.length).
        seed: the A/A repeats' seed (repeat r: stream r of its A/A streams); the method's repeat r is a
            run with seed `seed + r`.
        batch: rows per call (stats.batch).
        progress: called with ("aa" or "method", r) after each repeat.

    Returns:
        {"config": ..., "aa": summary, "method": summary, "seconds": ...}; a summary holds the
        calibration (`specresearch.stats.calibration`), each test's raw rejection rate and KS p-value,
        and every repeat's p-values.
    """
    from specresearch import build_engine, compose
    from specresearch.data import encode, load_prompts
    from specresearch.measure import aa_report, baseline_samples, method_samples, score, stats_rows
    from specresearch.seeding import stream_seed
    from specresearch.stats import Samples, Stream, battery
    from specresearch.types import SamplingParams

    t0 = time.perf_counter()
    overrides = [*BASE, *method, f"seed={seed}"]
    cfg = compose(overrides)
    engine = build_engine(cfg)
    target, sampling = engine.target.lm, SamplingParams(**cfg.sampling)
    prompts = [encode(target.tokenizer, p) for p in load_prompts(**cfg.dataset)][:1]
    rows = stats_rows(batch, engine.target.vocab_size)
    power, tv = float(cfg.stats.power), float(cfg.stats.tv)

    def lossless(r: int):
        run = seed + r  # a run with seed s + r: its own streams
        base = baseline_samples(target, prompts, samples, length, sampling, run, rows)
        meth = method_samples(engine, prompts, samples, length, run, rows)
        return battery(Samples.concat(base), score(target, prompts, base, sampling, run, rows, Stream.BASELINE),
                       Samples.concat(meth), score(target, prompts, meth, sampling, run, rows, Stream.METHOD),
                       alpha=alpha, power=power, permutations=0, seed=stream_seed(run, Stream.PERMUTE), tv=tv)

    reports = {"aa": [], "method": []}
    for r in range(repeats):
        reports["aa"].append(aa_report(target, prompts, samples, length, sampling, seed, r, rows, alpha, power, tv))
        if progress is not None:
            progress("aa", r)
        reports["method"].append(lossless(r))
        if progress is not None:
            progress("method", r)
    return {
        "config": {"overrides": overrides, "method": engine.label, "repeats": repeats, "samples": samples, "length": length,
                   "alpha": alpha, "seed": seed, "rows": rows, "prompt_tokens": len(prompts[0])},
        "aa": summarise(reports["aa"], alpha),
        "method": summarise(reports["method"], alpha),
        "seconds": time.perf_counter() - t0,
    }


def summarise(reports: list, alpha: float) -> dict:
    """The calibration of R reports: the verdict's rejection rate (`specresearch.stats.calibration`), and
    per test of the family its raw rejection rate at alpha with a Clopper-Pearson 95% interval and the KS
    p-value of its p-values' uniformity; every repeat's raw p-values and Holm minimum."""
    from scipy import stats as st

    from specresearch.stats import calibration

    names = [t.name for t in reports[0].tests]
    pvalues = {name: [next(t.pvalue for t in r.tests if t.name == name) for r in reports] for name in names}
    tests = {}
    for name, ps in pvalues.items():
        k = sum(p < alpha for p in ps)
        ci = st.binomtest(k, len(ps)).proportion_ci()
        tests[name] = {"rejections": k, "rate": k / len(ps), "rate_ci_low": ci.low, "rate_ci_high": ci.high,
                       "p_uniform": float(st.kstest(ps, "uniform").pvalue)}
    return {
        "calibration": calibration(reports, alpha),
        "tests": tests,
        "pvalues": {name: [float(f"{p:.4g}") for p in ps] for name, ps in pvalues.items()},
        "min_holm": [float(f"{min(r.holm):.4g}") for r in reports],
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


def page(result: dict, command: str, date: str) -> dict:
    """The results page (docs/hooks/results.py's curated format) with the raw result beside it."""
    c = result["config"]
    alpha = c["alpha"]
    columns = ["comparison", "test", f"rejected at alpha = {alpha}", "rate", "95% interval (Clopper-Pearson)",
               "KS uniformity p of its p-values"]
    rows = []
    for key, label in (("aa", "A/A (target vs target)"), ("method", f"{c['method']} vs target")):
        s = result[key]
        cal = s["calibration"]
        rows.append([label, "**Holm verdict**", f"{cal['rejections']}/{cal['repeats']}", f"{cal['rate']:.3f}",
                     f"{cal['rate_ci_low']:.3f}-{cal['rate_ci_high']:.3f}", ""])
        for name, t in s["tests"].items():
            rows.append([label, f"{name} (raw p)", f"{t['rejections']}/{cal['repeats']}", f"{t['rate']:.3f}",
                         f"{t['rate_ci_low']:.3f}-{t['rate_ci_high']:.3f}", f"{t['p_uniform']:.3g}"])
    notes = findings(result)
    return {
        "title": f"A/A calibration of the equivalence battery over {c['repeats']} independent seeds (tiny model)",
        "date": date,
        "machine": machine(),
        "topic": "lossless",
        "command": [command],
        "prompts": f"the first HumanEval prompt x {c['length']} tokens, T = 1, N = {c['samples']} per side",
        "columns": columns,
        "rows": rows,
        "notes": notes,
        "data": {"script": "benchmarks/aa_calibration.py", "result": result},
    }


def findings(result: dict) -> list[str]:
    """The page's findings, from the result alone: the setup, each verdict's rate against alpha, both
    comparisons pooled (each is an H0), and which tests the verdict's rejections came from."""
    from scipy import stats as st

    from specresearch.stats import holm

    c = result["config"]
    alpha, repeats = c["alpha"], c["repeats"]
    aa, me = result["aa"]["calibration"], result["method"]["calibration"]
    k = aa["rejections"] + me["rejections"]
    pooled = st.binomtest(k, 2 * repeats)
    m = len(result["aa"]["tests"])
    by: dict[str, int] = {}
    for side in ("aa", "method"):
        pv = result[side]["pvalues"]
        names = list(pv)
        for r in range(repeats):
            adjusted = holm(np.array([pv[name][r] for name in names]))
            for name, h in zip(names, adjusted):
                if h < alpha:
                    by[name] = by.get(name, 0) + 1
    tail = {name: sum(p < alpha / m for side in ("aa", "method") for p in result[side]["pvalues"][name])
            for name in result["aa"]["pvalues"]}
    return [
        f"{repeats} independent repeats of each comparison, N = {c['samples']} sequences of {c['length']} tokens per side and "
        f"repeat, the first HumanEval prompt ({c['prompt_tokens']} byte tokens) on the tiny random model (vocabulary 320) at T = 1; "
        f"the verdict is Holm over the battery's {m} tests at alpha = {alpha}, no permutations.",
        f"A/A repeat r draws its sides from streams (seed {c['seed']}, AA_A / AA_B, prompt, r), as stats.aa_repeats does; the "
        f"method's repeat r is the battery of a run with seed {c['seed']} + r (its baseline, its method samples one stream each, "
        "its scoring): with stream seeds (specresearch.seeding.stream_seed) consecutive seeds share no draw.",
        f"Verdict rejection rate: A/A {aa['rate']:.3f} (95% {aa['rate_ci_low']:.3f}-{aa['rate_ci_high']:.3f}; one-sided p of a rate "
        f"above alpha {aa['p_rate_above_alpha']:.2g}), method {me['rate']:.3f} ({me['rate_ci_low']:.3f}-{me['rate_ci_high']:.3f}; "
        f"p {me['p_rate_above_alpha']:.2g}); both being null comparisons, pooled {k}/{2 * repeats} = {k / (2 * repeats):.3f} "
        f"({pooled.proportion_ci().low:.3f}-{pooled.proportion_ci().high:.3f}; p of a rate above alpha "
        f"{st.binomtest(k, 2 * repeats, alpha, alternative='greater').pvalue:.2g}). Holm keeps the family-wise rate at or below "
        "alpha only if every test's p-value is valid in the far tail (below alpha / m).",
        "The verdict's rejections came from: " + (", ".join(f"{name} {n}" for name, n in sorted(by.items(), key=lambda t: -t[1])) or "none")
        + f" (Holm at alpha over both comparisons); raw p-values below alpha / {m} = {alpha / m:.2g} per test, of "
        f"{2 * repeats}: " + ", ".join(f"{name} {n}" for name, n in tail.items() if n)
        + f" (under H0 about {2 * repeats * alpha / m:.2f} each).",
        "Per test: the share of repeats whose raw (unadjusted) p-value is below alpha, and a KS test of the uniformity of its "
        "p-values over the repeats (a small KS p: that test's p-values are not uniform under H0).",
        f"Whole run: {result['seconds']:.0f} s.",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="independent repeats of each comparison (default 200)")
    parser.add_argument("--samples", type=int, default=300, help="sequences per side and repeat (default 300)")
    parser.add_argument("--method", default=" ".join(METHOD), help=f"the lossless method's overrides (default: {' '.join(METHOD)!r})")
    parser.add_argument("--alpha", type=float, default=0.01, help="the verdict's family-wise level (default 0.01, stats.alpha)")
    parser.add_argument("--length", type=int, default=8, help="tokens per sequence (default 8, stats.length)")
    parser.add_argument("--seed", type=int, default=0, help="the A/A seed; the method's repeat r runs with seed + r (default 0)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: the tiny model's calls are small, and a second thread on a busy core "
                             "made them 40-90x slower on a 2-core machine)")
    parser.add_argument("--out", type=Path, default=None, help="the JSON report (default: docs/results/data/DATE-aa-calibration.json)")
    args = parser.parse_args(argv)
    if args.repeats < 2 or args.samples < 10 or args.length < 1 or not 0 < args.alpha < 1 or args.threads < 1:
        parser.error("--repeats >= 2, --samples >= 10, --length >= 1, 0 < --alpha < 1 and --threads >= 1")
    import torch

    torch.set_num_threads(args.threads)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = args.out or ROOT / "docs" / "results" / "data" / f"{date}-aa-calibration.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/aa_calibration.py " + shlex.join(
        ["--repeats", str(args.repeats), "--samples", str(args.samples),
         *(["--method", args.method] if args.method != " ".join(METHOD) else []),
         *(["--alpha", str(args.alpha)] if args.alpha != 0.01 else []), *(["--length", str(args.length)] if args.length != 8 else []),
         *(["--seed", str(args.seed)] if args.seed else []), *(["--threads", str(args.threads)] if args.threads != 1 else []),
         "--out", reports.shown_path(out, ROOT)])

    def progress(kind: str, r: int) -> None:
        if kind == "method" and ((r + 1) % 10 == 0 or r + 1 == args.repeats):
            print(f"{r + 1}/{args.repeats} repeats", file=sys.stderr, flush=True)

    result = calibrate(args.repeats, args.samples, args.method.split(), args.alpha, args.length, args.seed, progress=progress)
    data = reports.check(page(result, command, date), str(out))  # the docs' one results format
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    for row in data["rows"]:
        if "Holm" in row[1] or row[1].startswith("surprisal_z"):
            print(" | ".join(row))
    print(f"{result['seconds']:.0f} s; report: {reports.shown_path(out, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
