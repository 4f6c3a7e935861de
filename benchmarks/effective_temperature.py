#!/usr/bin/env python3
"""Is a lossy rule the target at a lower temperature? Each step's exact first-token law against the target's at T'.

The lossless_vs_lossy study found typical acceptance and the loosest margin (0.4) scoring above the target alone on
HumanEval at T = 0.7, and the target alone scoring higher at T = 0.5: a rule that keeps the target's likelier tokens
might be a lower temperature in disguise. This measures it on the law, not on a score: for each rule (the study's
independent arm, a plain chain of 4 from the 0.5B draft) at T, along the target's own continuations of `--tokens`
tokens of `--prompts` HumanEval problems (`stats.distortion`'s text), the exact law of the first token each step emits
(`specresearch.stats.distortion`) against the target's law at every T' of `--grid` (p_T' ∝ p_T ** (T / T'): the
same logits at another temperature). A rule that is a lower temperature has a T' < T whose law it matches (TV near 0
there, well below its TV at T); one that is not stays as far from every T'.

    python benchmarks/effective_temperature.py --json docs/results/data/DATE-effective-temperature.json
    python benchmarks/effective_temperature.py --model tiny --tokens 4 --prompts 2 --settings margin_loose  # checks it runs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np

from specresearch import build_engine, compose, reports
from specresearch.data import encode, load_prompts
from specresearch.errors import SpecResearchError, fail, report_path
from specresearch.models import machine_tags
from specresearch.stats.distortion import continuations, distortion

ARM = ("drafter=plain_chain",)  # the study's arm/independent.yaml
SETTINGS = {  # the study's quality/ files and the verifiers' defaults: name -> (label, overrides)
    "rejection": ("rejection (lossless)", ("verifier=rejection",)),
    "typical": ("typical ε 0.09, δ 0.3", ("verifier=typical",)),
    "typical_loose": ("typical ε 0.01, δ 0.1", ("verifier=typical", "verifier.epsilon=0.01", "verifier.delta=0.1")),
    "margin": ("margin 0.1", ("verifier=margin",)),
    "margin_loose": ("margin 0.4", ("verifier=margin", "verifier.margin=0.4")),
    "topk": ("top-k 3", ("verifier=topk",)),
    "topk_loose": ("top-k 10", ("verifier=topk", "verifier.k=10")),
}
GRID = [round(0.3 + 0.05 * i, 2) for i in range(15)]  # T' 0.3 .. 1.0


def _temperature(value: str) -> float:
    try:
        t = float(value)
    except ValueError:
        t = -1.0
    if not t > 0 or t == float("inf"):
        raise argparse.ArgumentTypeError(f"a temperature is a number > 0, got {value!r}")
    return t


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, measure, print (and write --json); a refused setting (a --json that cannot be written, a
    --model the loader does not know) is one `error:` line and exit 2, before any model loads."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--temperature", type=_temperature, default=0.7, help="the run's T (the study's quality runs: 0.7)")
    ap.add_argument("--grid", type=_temperature, nargs="+", default=GRID, help="the T' compared with (default 0.3 to 1.0 by 0.05)")
    ap.add_argument("--tokens", type=int, default=32, help="positions per prompt (the study's stats.distortion)")
    ap.add_argument("--offset", type=int, default=144, help="the first HumanEval problem")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results report here")
    try:  # a bad --model or --json: one line, before anything loads
        run(ap.parse_args(argv))
    except SpecResearchError as err:
        fail(str(err))
    return 0


def run(args: argparse.Namespace) -> None:
    """The measurement of `main`'s arguments: --json checked first, then each rule's engine built and measured."""
    out = report_path(args.json, "--json")
    grid = sorted({*args.grid, args.temperature})

    rows, data, target, texts = [], [], None, None
    for name in args.settings:
        label, overrides = SETTINGS[name]
        cfg = compose([f"model={args.model}", f"model.dtype={args.dtype}", *ARM, *overrides, "sampling=random",
                       f"sampling.temperature={args.temperature}", f"seed={args.seed}"])
        method = build_engine(cfg, target=target)
        lm = target = method.kv.lm
        if texts is None:  # one text for every rule: the target's own continuations at T
            prompts = [encode(lm.tokenizer, p) for p in load_prompts("humaneval", num_prompts=args.prompts, offset=args.offset)]
            texts = continuations(build_engine(cfg, baseline=True, target=target), prompts, args.tokens, args.seed)
        d = distortion(method, prompts, texts, args.seed, temperatures=grid)
        s = d.summary(seed=args.seed)
        at_half = s.get("tv_mean_at_0.5", np.nan)
        rows.append([label, f"{s['tv_mean']:.4f} [{s['tv_mean_ci_low']:.4f}, {s['tv_mean_ci_high']:.4f}]",
                     f"{at_half:.4f}", f"{s['nearest_temperature']:g}",
                     f"{s['nearest_tv_mean']:.4f} [{s['nearest_tv_mean_ci_low']:.4f}, {s['nearest_tv_mean_ci_high']:.4f}]",
                     f"{s['nearest_closer']:.2f}", f"{s['positions']:.0f}"])
        data.append({"setting": name, "label": label, "curve": d.tv_at.mean((0, 1)).tolist(), **s})
        print(" | ".join(rows[-1]), flush=True)
    if out:  # one results report (specresearch.reports): the command as typed, no output path, the machine as measured
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            json.dump(reports.of_script(
                "effective_temperature.py", vars(args), machine_tags(lm),
                f"Is a lossy rule a lower temperature? {lm.name}, {str(lm.dtype).removeprefix('torch.')}, T = {args.temperature:g}",
                topic="lossless",
                columns=[f"rule (chain of 4 from the draft, T = {args.temperature:g})", f"TV to p at T = {args.temperature:g} [95% CI]",
                         "TV to p at 0.5", "nearest T'", "TV there [95% CI]", "positions nearer there", "positions"],
                rows=rows,
                prompts=f"HumanEval {args.offset}-{args.offset + args.prompts - 1}, the target's own continuation of {args.tokens} "
                        f"tokens of each (stats.distortion's, seed {args.seed})",
                notes=[f"At each position, the exact law of the first token the step emits (the rule on the draft and the p the "
                       f"verification read) against the target's law at T' (p ** ({args.temperature:g} / T'), normalised) for T' in "
                       f"{', '.join(f'{t:g}' for t in grid)}; the nearest T' minimises the mean TV over positions, its interval "
                       "is a bootstrap over prompts; 'positions nearer there' is the share of positions whose law is nearer the "
                       "target's at that T' than at the run's T."],
                data={"model": args.model, "temperature": args.temperature, "grid": grid, "cells": data}), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
