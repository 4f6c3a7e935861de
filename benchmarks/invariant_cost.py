#!/usr/bin/env python3
"""What the shape-invariant forward (model.kernels=invariant) costs against the default kernels.

The target is loaded twice, with `model.kernels=auto` and `invariant`; each times, after the same prompt
(prefilled, shared by the rows), forwards of R rows x n query tokens: 1 x 1 (plain decoding), 1 x 2..17
(a chain's verification), and the battery's shapes, 110 x 1 (its baseline side's step) and 110 x 5 (a
chain of 4 verified for 110 rows). The two models are timed interleaved shape by shape, each figure the
fastest of `--repeats`; the report gives both and their ratio.

    python benchmarks/invariant_cost.py --json docs/results/data/DATE-invariant-cost.json
    python benchmarks/invariant_cost.py --model tiny --repeats 1       # checks the script runs
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specresearch import reports
from specresearch.data import encode, load_prompts
from specresearch.models import load_model, machine_tags
from specresearch.target import Target

SHAPES = ((1, 1), (1, 2), (1, 5), (1, 9), (1, 17), (110, 1), (110, 5))  # (rows, query tokens)


@torch.inference_mode()
def seconds(lm, prompt: list[int], rows: int, n: int, repeats: int) -> float:
    """The fastest of `repeats` forwards of `rows` rows x `n` tokens after `prompt` (held once, shared)."""
    target = Target(lm)
    target.reset(len(prompt) + n)
    target.prefill_rows([torch.tensor(prompt[:-1], device=lm.device)] * rows)
    sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        target.forward_rows([torch.tensor(prompt[-1:] * n, device=lm.device)] * rows, [None] * rows)
        sync()
        runs.append(time.perf_counter() - t0)
        target.truncate_rows([len(prompt) - 1] * rows)
    return min(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--prompt", type=int, default=156, help="the HumanEval problem the forwards follow")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", help="write the results report here")
    args = ap.parse_args()

    models = {kernels: load_model(args.model, dtype=args.dtype, kernels=kernels) for kernels in ("auto", "invariant")}
    lm = models["auto"]
    prompt = encode(lm.tokenizer, load_prompts("humaneval", num_prompts=1, offset=args.prompt)[0])
    rows = []
    for r, n in SHAPES:
        t = {kernels: seconds(m, prompt, r, n, args.repeats) for kernels, m in models.items()}
        rows.append([f"{r} x {n}", f"{t['auto'] * 1e3:.0f}", f"{t['invariant'] * 1e3:.0f}", f"{t['invariant'] / t['auto']:.2f}x"])
        print(f"  {r:>3} rows x {n:>2} tokens: auto {t['auto'] * 1e3:8.0f} ms  invariant {t['invariant'] * 1e3:8.0f} ms  "
              f"({t['invariant'] / t['auto']:.2f}x)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports.of_script(
                "invariant_cost.py", vars(args), machine_tags(lm),
                f"The shape-invariant forward's cost: {lm.name}, {str(lm.dtype).removeprefix('torch.')}", topic="lossless",
                columns=["rows x query tokens", "kernels auto (ms)", "kernels invariant (ms)", "invariant / auto"], rows=rows,
                prompts=f"HumanEval {args.prompt} prefilled ({len(prompt)} tokens), shared by the rows",
                notes=["Each figure the fastest of the repeats; the two kernels timed interleaved shape by shape, one process. "
                       "1 x 1 is plain decoding's step, 1 x k+1 a chain's verification, 110 x 1 and 110 x 5 the equivalence "
                       "battery's baseline and method steps (stats.batch=auto for this vocabulary)."]), f, indent=1)


if __name__ == "__main__":
    main()
