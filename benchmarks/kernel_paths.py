#!/usr/bin/env python3
"""How far the target's own law moves with the kernels that compute it: the floor under any
"lossless" verdict on a real model.

Speculative decoding is lossless in exact arithmetic; on a machine the target's logits at a position
come from a forward whose shapes differ between plain decoding (one token a step) and verification
(k + 1 tokens a step), and in bf16 those shapes round differently. This script samples one
continuation of a prompt from the target, then computes the target's law at T at each of its positions
along three kernel paths of the project's own target wrapper (specresearch.kv.CachedLM): one token
at a time (plain decoding), chunks of k + 1 tokens (a k-token chain's verification) and one forward of
the whole continuation (teacher forcing, as the battery scores samples), each for one row and for R
rows of the same sequence. It prints, per path pair, the total variation between the two laws at each
position (its mean and maximum). In fp32 they agree to ~1e-6; a TV of d at a position is a real
difference between "the target" of the baseline and of the method, which a battery with enough
samples detects (docs/concepts/lossless.md, "What a verdict on a real model can see").

    python benchmarks/kernel_paths.py                                  # Qwen2.5-Coder-1.5B, dtype auto (bf16 on a bf16 CPU)
    python benchmarks/kernel_paths.py --dtype float32                  # the same in fp32
    python benchmarks/kernel_paths.py --model tiny --tokens 8          # checks the script runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence

import torch

from specresearch import reports
from specresearch.data import encode, load_prompts
from specresearch.errors import SpecResearchError, fail, report_path
from specresearch.kv import CachedLM
from specresearch.models import load_model, machine_tags
from specresearch.sampling import logits_to_probs
from specresearch.types import SamplingParams


def laws_along(target: CachedLM, prompt: torch.Tensor, continuation: torch.Tensor, chunk: int, rows: int,
               sampling: SamplingParams) -> torch.Tensor:
    """[L, V] the target's law of each token of `continuation` ([L]) after `prompt`, fed `chunk` tokens a
    forward (chunk >= L: one forward of the whole continuation), in a batch of `rows` copies (row 0's)."""
    target.reset(prompt.numel() + continuation.numel())
    first = target.prefill_rows([prompt] * rows)[0:1]  # [1, V] the law of continuation[0]
    logits = [first.float()]
    fed = continuation[:-1]
    for s in range(0, fed.numel(), chunk):
        logits.append(target.forward_rows([fed[s : s + chunk]] * rows, [None] * rows)[0].float())  # [n, V] row 0's
    return logits_to_probs(torch.cat(logits), sampling)  # [L, V]


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, measure, print (and write --json); a refused setting (a --json that cannot be written, a
    --model the loader does not know) is one `error:` line and exit 2, before any model loads."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--tokens", type=int, default=16, help="L: the continuation's length")
    ap.add_argument("--k", type=int, default=4, help="a chain's draft length: verification feeds k + 1 tokens")
    ap.add_argument("--rows", type=int, default=110, help="R: the rows of the batched paths (the battery's stats.batch=auto)")
    ap.add_argument("--prompt", type=int, default=156, help="the HumanEval problem (the lossless_vs_lossy study's first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the numbers here")
    try:  # a bad --model or --json: one line, before anything loads
        run(ap.parse_args(argv))
    except SpecResearchError as err:
        fail(str(err))
    return 0


def run(args: argparse.Namespace) -> None:
    """The measurement of `main`'s arguments: --json checked first, then the model loaded (load_model refuses an
    unknown name before it reads anything)."""
    out = report_path(args.json, "--json")
    lm = load_model(args.model, dtype=args.dtype, device=args.device)
    prompt = torch.tensor(encode(lm.tokenizer, load_prompts("humaneval", num_prompts=1, offset=args.prompt)[0]), device=lm.device)
    sampling = SamplingParams(temperature=args.temperature)
    target = CachedLM(lm)
    gen = torch.Generator(device=lm.device).manual_seed(args.seed)
    with torch.inference_mode():
        ids = prompt
        for _ in range(args.tokens):  # a continuation drawn from the target
            p = logits_to_probs(lm.model(ids[None]).logits[0, -1].float(), sampling)
            ids = torch.cat([ids, torch.multinomial(p, 1, generator=gen)])
        continuation = ids[prompt.numel():]
        paths = {f"{name}, {r} row{'s' * (r > 1)}": laws_along(target, prompt, continuation, chunk, r, sampling)
                 for name, chunk in (("1 token a forward", 1), (f"{args.k + 1} tokens a forward", args.k + 1),
                                     ("the whole continuation", args.tokens))
                 for r in (1, args.rows)}
    print(f"{lm.name} ({lm.dtype}, {lm.device}), T = {args.temperature}, HumanEval {args.prompt}, {args.tokens} sampled tokens: "
          "TV between the target's laws at each position along two kernel paths")
    rows = []
    for (a, pa), (b, pb) in itertools.combinations(paths.items(), 2):
        tv = 0.5 * (pa - pb).abs().sum(-1)  # [L]
        rows.append({"a": a, "b": b, "tv": tv.tolist(), "mean": float(tv.mean()), "max": float(tv.max())})
        print(f"  {a:32} vs {b:32} mean {tv.mean():.2e}  max {tv.max():.2e}")
    if out:  # one results report (specresearch.reports): the command as typed, no output path, the machine as measured
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            json.dump(report(rows, args, lm, machine_tags(lm)), f, indent=1)


def report(pairs: list[dict], args: argparse.Namespace, lm, machine: dict) -> dict:
    """The results report of one run: a row per pair of kernel paths (mean and max TV), the per-position TVs in `data`."""
    return reports.of_script(
        "kernel_paths.py", vars(args), machine,
        f"The target's law along other kernel paths: {lm.name}, {str(lm.dtype).removeprefix('torch.')}", topic="lossless",
        columns=["path a", "path b", "mean TV over positions", "max TV"],
        rows=[[r["a"], r["b"], f"{r['mean']:.2e}", f"{r['max']:.2e}"] for r in pairs],
        prompts=f"HumanEval {args.prompt}, {args.tokens} tokens sampled from the target at T = {args.temperature}",
        notes=["TV between the target's laws (after the sampling settings) at the same positions, computed by the project's "
               "target wrapper fed 1 token, k + 1 tokens or the whole continuation a forward, with 1 row or R rows of "
               "the same sequence (row 0's laws)."],
        data={"pairs": pairs})


if __name__ == "__main__":
    sys.exit(main())
