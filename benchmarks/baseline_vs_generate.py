"""Is our autoregressive baseline as fast as transformers' own `generate`?

Same model, same prompts, same number of new tokens, greedy; the two are interleaved prompt by
prompt (and alternate who goes first) so machine noise hits both alike. Reports the ratio of
total times and whether the tokens are identical.

    python benchmarks/baseline_vs_generate.py                       # qwen2.5-coder-1.5b, bf16
    python benchmarks/baseline_vs_generate.py --model smollm2-135m --prompts 4 --tokens 64
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from specresearch.data import load_prompts
from specresearch.drafters import NoDrafter
from specresearch.engine import Engine
from specresearch.models import load_model
from specresearch.types import SamplingParams
from specresearch.verifiers import GreedyVerifier


def hf_generate(lm, ids: list[int], n: int) -> tuple[list[int], float]:
    x = torch.tensor([ids], device=lm.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(ids) :].tolist(), time.perf_counter() - t0


def ours(engine: Engine, ids: list[int], n: int) -> tuple[list[int], float]:
    out = engine.generate(ids, n, eos_token_ids=[])
    return out.tokens, out.stats.time_total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="pairs of runs per prompt")
    args = parser.parse_args()

    lm = load_model(args.model, dtype=args.dtype)
    engine = Engine(lm, NoDrafter(), GreedyVerifier(), SamplingParams())
    prompts = [lm.tokenizer.encode(p.text, add_special_tokens=False) for p in load_prompts("humaneval", args.prompts)]
    ours(engine, prompts[0], 4), hf_generate(lm, prompts[0], 4)  # warm-up, untimed
    t_ours = t_hf = 0.0
    same, ratios = 0, []
    for i, ids in enumerate(prompts):
        for r in range(args.repeats):
            runs = [("ours", ours, engine), ("hf", hf_generate, lm)]
            result = {}
            for name, fn, obj in runs if (i + r) % 2 == 0 else runs[::-1]:  # alternate who goes first
                result[name] = fn(obj, ids, args.tokens)
            t_ours += result["ours"][1]
            t_hf += result["hf"][1]
            ratios.append(result["hf"][1] / result["ours"][1])
            same += result["ours"][0] == result["hf"][0]
            print(f"prompt {i} run {r}: ours {args.tokens / result['ours'][1]:.2f} tok/s, generate {args.tokens / result['hf'][1]:.2f} tok/s")
    n = args.tokens * len(ratios)
    ratios.sort()
    print(
        f"\n{args.model} ({lm.dtype}, {lm.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}), {len(prompts)} HumanEval prompts x {args.repeats} pairs, "
        f"{args.tokens} new tokens each\n"
        f"ours: {n / t_ours:.2f} tok/s   transformers generate: {n / t_hf:.2f} tok/s\n"
        f"time ratio generate/ours = {t_hf / t_ours:.3f} overall, median of pairs {statistics.median(ratios):.3f} "
        f"(range {ratios[0]:.3f}-{ratios[-1]:.3f}; >= 1 means ours is at least as fast)\n"
        f"identical tokens in {same}/{len(ratios)} pairs"
    )


if __name__ == "__main__":
    main()
