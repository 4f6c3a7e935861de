#!/usr/bin/env python3
"""The numeric floor of the equivalence battery on a target, for chains of several lengths.

Draws `--samples` continuations of `--tokens` tokens of a prompt from the target alone (the battery's
baseline side, `sample_target`), re-reads each along plain decoding's path (one query token a forward),
a chain's verification ((k + 1)-query forwards) for each k of `--k`, and teacher forcing, and reports per
position the mean TV between the 1-query law and each other path's, the bound it puts on a position's
marginal (the cumulative sum: `specresearch.stats.floor`), and beside it the smallest position TV the
battery detects at `--n` sequences a side (power 0.8, Holm over the family at alpha 0.01, position df
`--df`): a floor above that line is a floor the battery can see.

    python benchmarks/numeric_floor.py                                     # Qwen2.5-Coder-1.5B, dtype auto, T 0.7
    python benchmarks/numeric_floor.py --kernels invariant                 # the same with model.kernels=invariant: 0
    python benchmarks/numeric_floor.py --model tiny --samples 32           # checks the script runs
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from specresearch import reports
from specresearch.data import encode, load_prompts
from specresearch.models import load_model, machine_tags
from specresearch.stats import family_size, numeric_floor, sample_target
from specresearch.stats.battery import noncentrality
from specresearch.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kernels", default="auto", help="model.kernels: auto, torch or invariant")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompt", type=int, default=156, help="the HumanEval problem (the lossless_vs_lossy study's battery prompt)")
    ap.add_argument("--samples", type=int, default=256, help="baseline sequences re-read")
    ap.add_argument("--tokens", type=int, default=8, help="L: tokens per sequence (stats.length)")
    ap.add_argument("--k", type=int, nargs="+", default=[4, 8, 16], help="chain lengths: verification forwards of k + 1 queries")
    ap.add_argument("--n", type=int, default=8705, help="sequences per side the detectable TV is stated for (the study's auto N)")
    ap.add_argument("--df", type=int, default=29, help="the position tests' df at that N (the study's)")
    ap.add_argument("--batch", type=int, default=32, help="sequences per forward")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results report here")
    args = ap.parse_args()

    lm = load_model(args.model, dtype=args.dtype, kernels=args.kernels)
    prompt = encode(lm.tokenizer, load_prompts("humaneval", num_prompts=1, offset=args.prompt)[0])
    sampling = SamplingParams(temperature=args.temperature)
    tokens = sample_target(lm, prompt, args.samples, args.tokens, sampling, args.seed, args.batch).tokens  # [n, L]
    floors = {k: numeric_floor(lm, [prompt], [tokens], sampling, k + 1, args.batch) for k in args.k}
    detectable = float(np.sqrt(noncentrality(args.df, 0.01 / family_size(args.tokens), 0.8) / (4 * args.n / 2)))
    rows = []
    for k, f in floors.items():
        rows.append([f"1 query vs {k + 1} (chain of {k})", *(f"{v:.4f}" for v in f.verify), f"{f.bound.max():.4f}"])
    first = next(iter(floors.values()))
    rows.append(["1 query vs teacher forcing", *(f"{v:.4f}" for v in first.score), f"{np.cumsum(first.score).max():.4f}"])
    print(f"{lm.name} ({lm.dtype}, kernels {args.kernels}), T = {args.temperature}, HumanEval {args.prompt}, {args.samples} "
          f"baseline sequences x {args.tokens}: mean TV per position between the 1-query law and another path's; the battery "
          f"detects a position TV >= {detectable:.4f} at N = {args.n} a side (df {args.df}, power 0.8)")
    for r in rows:
        print("  " + " | ".join(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports.of_script(
                "numeric_floor.py", vars(args), machine_tags(lm),
                f"The battery's numeric floor: {lm.name}, {str(lm.dtype).removeprefix('torch.')}, kernels {args.kernels}",
                topic="lossless",
                columns=["paths", *(f"position {t + 1}" for t in range(args.tokens)), "bound on a position's marginal"], rows=rows,
                prompts=f"HumanEval {args.prompt}, {args.samples} sequences of {args.tokens} tokens sampled from the target at "
                        f"T = {args.temperature}",
                notes=[f"Each cell the mean over the sequences of the TV between the target's law at that position read one query "
                       f"token a forward (the battery's baseline side) and read along the other path (specresearch.stats.floor); "
                       f"the bound is the cumulative sum, the most TV these numerics can put on a position's marginal. The battery "
                       f"detects a position TV of {detectable:.4f} with power 0.8 at N = {args.n} a side (df {args.df}, Holm over "
                       f"{family_size(args.tokens)} tests at alpha 0.01)."],
                data={"floors": {str(k): f.as_dict() for k, f in floors.items()}, "detectable_tv": detectable}), f, indent=1)


if __name__ == "__main__":
    main()
