#!/usr/bin/env python3
"""Numerics on the distortion axis: how far the target's own kernels move each verification step's law.

For each drafter arm of the lossless_vs_lossy study (a plain chain of 4 from the 0.5B draft; Medusa's
heads' tree) at each T, this takes the study's text (the target's own continuations of `--tokens` tokens
of HumanEval 156-159, `stats.distortion`'s, seed 0) and decodes along it as exact distortion does
(`specresearch.stats.distortion`), reading at every position the target's p as the step's verification
forward computes it (k + 1 or the tree's query tokens) and as plain decoding does (one query a forward):
the TV between them is what the numerics alone move a step's law by, on the axis where the study puts
each lossy rule's exact distortion (its frontier reads this page's rows beside them). With
`--kernels invariant` it is exactly 0.

    python benchmarks/numerics_distortion.py --json docs/results/data/DATE-numerics-distortion.json
    python benchmarks/numerics_distortion.py --model tiny --tokens 4 --temperatures 1.0     # checks the script runs
"""

from __future__ import annotations

import argparse
import json

from specresearch import build_engine, compose, reports
from specresearch.data import encode, load_prompts
from specresearch.models import machine_tags
from specresearch.stats.distortion import continuations, distortion

ARMS = {"independent": ("drafter=plain_chain",), "medusa": ("drafter=medusa", "drafter.lookup=0")}  # the study's arm/ files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kernels", default="auto", help="model.kernels: auto, torch or invariant")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7, 1.0])
    ap.add_argument("--tokens", type=int, default=32, help="positions per prompt (the study's stats.distortion)")
    ap.add_argument("--offset", type=int, default=156, help="the first HumanEval problem (the study's held-out 156-159)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results report here")
    args = ap.parse_args()

    rows, data, lm, target = [], [], None, None
    for arm in args.arms:
        for t in args.temperatures:
            cfg = compose([f"model={args.model}", f"model.dtype={args.dtype}", f"model.kernels={args.kernels}", *ARMS[arm],
                           "verifier=rejection", "sampling=random", f"sampling.temperature={t}", f"seed={args.seed}"])
            method = build_engine(cfg, target=target)
            lm = target = method.kv.lm
            baseline = build_engine(cfg, baseline=True, target=target)
            prompts = [encode(lm.tokenizer, p) for p in load_prompts("humaneval", num_prompts=args.prompts, offset=args.offset)]
            texts = continuations(baseline, prompts, args.tokens, args.seed)
            d = distortion(method, prompts, texts, args.seed).summary(seed=args.seed)
            rows.append([arm, f"{t:g}", f"{d['numerics_tv_mean']:.4f}", f"{d['numerics_tv_q90']:.4f}", f"{d['numerics_tv_max']:.4f}",
                         f"{d['tv_mean']:.1e}", f"{d['positions']:.0f}"])
            data.append({"arm": arm, "temperature": t, **d})
            print(" | ".join(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports.of_script(
                "numerics_distortion.py", vars(args), machine_tags(lm),
                f"Numerics on the distortion axis: {lm.name}, {str(lm.dtype).removeprefix('torch.')}, kernels {args.kernels}",
                topic="lossless",
                columns=["drafter", "T", "numerics TV mean", "90%", "max", "rejection's exact TV (the rule)", "positions"], rows=rows,
                prompts=f"HumanEval {args.offset}-{args.offset + args.prompts - 1}, the target's own continuation of {args.tokens} "
                        f"tokens of each (stats.distortion's, seed {args.seed})",
                notes=["At each position, the TV between the target's p as the method's verification forward read it (a chain of 4: "
                       "5 query tokens; Medusa: its tree's nodes) and as plain decoding reads it (one query a forward after the "
                       "same text): what the target's own kernels alone move each step's law by. Rejection sampling's exact "
                       "distortion against the p it read is beside it (0: the rule is lossless)."],
                data={"model": args.model, "cells": data}), f, indent=1)


if __name__ == "__main__":
    main()
