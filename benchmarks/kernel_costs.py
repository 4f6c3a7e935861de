#!/usr/bin/env python3
"""What the target's forward costs per `model.kernels`, shape by shape: the cost curve v(m) that
speculative decoding lives on (a verification of m tokens against one token's forward).

After the same prompt (prefilled, shared by the rows), each kernels choice times forwards of the
shapes below: one row of 1 to 17 query tokens (plain decoding's step and a chain's or a tree's
verification), ragged rows (the batch engine's steps: rows of different lengths in one forward) and
the equivalence battery's, 110 x 1 and 110 x 5. Each of `--repeats` rounds times every kernel at every
shape (two forwards each), in one process, and each figure is the fastest: a machine whose speed drifts
during the run moves every kernel and shape alike, not the ratios. The linear kinds (torch, skinny, packed, auto)
share one loaded model whose layers change class between timings; `invariant` loads its own.

    python benchmarks/kernel_costs.py --json docs/results/data/DATE-kernel-costs-bf16.json
    python benchmarks/kernel_costs.py --dtype float32 --json docs/results/data/DATE-kernel-costs-fp32.json
    python benchmarks/kernel_costs.py --kernels auto,invariant     # what the invariant forward costs
    python benchmarks/kernel_costs.py --model tiny --repeats 1     # checks the script runs
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from specresearch import reports
from specresearch.data import encode, load_prompts
from specresearch.kv import CachedLM, timed_forwards
from specresearch.models import load_model, machine_tags, use_linear
from specresearch.models.loading import linear_kind
from specresearch.options.models import KERNELS

SHAPES = ("1x1", "1x2", "1x3", "1x5", "1x9", "1x13", "1x17", "9+5+3+1", "4x9", "110x1", "110x5")  # rows x query tokens, or ragged


def row_tokens(shape: str) -> list[int]:
    """'RxN': R rows of N query tokens; 'a+b+c': rows of a, b and c tokens (ragged)."""
    if "x" in shape:
        rows, n = shape.split("x")
        return [int(n)] * int(rows)
    return [int(n) for n in shape.split("+")]


@torch.inference_mode()
def seconds(lm, prompt: list[int], tokens: list[int], repeats: int) -> float:
    """The fastest of `repeats` forwards of len(tokens) rows, row i feeding tokens[i] query tokens after
    `prompt` (held once, shared by the rows)."""
    target = CachedLM(lm)
    target.reset(len(prompt) + max(tokens))
    target.prefill_rows([torch.tensor(prompt[:-1], device=lm.device)] * len(tokens))
    return timed_forwards(target, [torch.tensor(prompt[-1:] * n, device=lm.device) for n in tokens], repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kernels", default="torch,skinny,packed",
                    help=f"model.kernels to compare, the first the reference ({', '.join(KERNELS)})")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="RxN (R rows of N query tokens) or a+b+c (ragged rows), comma-separated")
    ap.add_argument("--prompt", type=int, default=156, help="the HumanEval problem the forwards follow")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results report here")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    if unknown := [k for k in kernels if k not in KERNELS]:
        ap.error(f"unknown --kernels {', '.join(unknown)}: valid are {', '.join(KERNELS)}")
    shapes = args.shapes.split(",")

    shared = load_model(args.model, dtype=args.dtype, kernels="torch")
    invariant = load_model(args.model, dtype=args.dtype, kernels="invariant") if "invariant" in kernels else None

    def model(k: str):
        if k == "invariant":
            return invariant
        use_linear(shared.model, linear_kind(k, shared))  # (a PackedLinear's layout is made again: outside the timings)
        return shared

    prompt = encode(shared.tokenizer, load_prompts("humaneval", num_prompts=1, offset=args.prompt)[0])
    times = {shape: dict.fromkeys(kernels, math.inf) for shape in shapes}
    for r in range(args.repeats):  # rounds of every kernel at every shape: a machine whose speed drifts moves them alike
        for k in kernels:
            lm = model(k)
            for shape in shapes:
                times[shape][k] = min(times[shape][k], seconds(lm, prompt, row_tokens(shape), 2))  # (the first partly warms)
        print(f"  round {r + 1}/{args.repeats}, fastest so far (ms): " + "  ".join(
            f"{shape} " + "/".join(f"{times[shape][k] * 1e3:.0f}" for k in kernels) for shape in shapes), flush=True)
    one = times.get("1x1")
    ref = kernels[0]
    rows = [[shape, *(f"{times[shape][k] * 1e3:.1f}" for k in kernels),
             *(f"{times[shape][k] / one[k]:.2f}" for k in kernels if one),
             *(f"{times[shape][k] / times[shape][ref]:.2f}x" for k in kernels[1:])] for shape in shapes]
    columns = ["rows x query tokens", *(f"{k} (ms)" for k in kernels), *(f"v {k}" for k in kernels if one),
               *(f"{k} / {ref}" for k in kernels[1:])]
    print("\n" + "\n".join("  ".join(str(c) for c in r) for r in [columns, *rows]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports.of_script(
                "kernel_costs.py", vars(args), machine_tags(shared),
                f"The forward's cost per model.kernels: {shared.name}, {str(shared.dtype).removeprefix('torch.')}", topic="speed",
                columns=columns, rows=rows,
                prompts=f"HumanEval {args.prompt} prefilled ({len(prompt)} tokens), held once and shared by the rows",
                notes=["Each figure the fastest of the rounds (two forwards each); a round times every kernel at every shape, one "
                       "process, so a drift of the machine's speed moves the kernels and shapes alike. "
                       "1 x 1 is plain decoding's step, 1 x m a verification of m tokens, a+b+c ragged rows of the batch engine, "
                       "110 x 1 and 110 x 5 the equivalence battery's baseline and method steps (stats.batch=auto for this "
                       "vocabulary). v: the forward over the same kernels' 1 x 1 (the cost curve shape=auto reads); "
                       f"the last columns: over {ref}'s time at the same shape."]), f, indent=1)


if __name__ == "__main__":
    main()
