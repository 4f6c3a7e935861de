#!/usr/bin/env python3
"""How fast the equivalence battery draws its samples, per the target's `model.kernels`: the baseline's and
the method's sequences per second on one prompt, the same draws a run's `stats.samples` makes
(`specresearch.measure.baseline_samples` / `method_samples`, `stats.batch=auto` rows a call).

One engine is built from the run's overrides; the linear layers of the target and of a draft model change
class between timings (a draft's int8 layers stay). Each of `--rounds` rounds draws both sides once with
every kernels choice, in one process, so a drift of the machine's speed moves the choices alike; each
figure is the best round's rate.

    python benchmarks/battery_rates.py --json docs/results/data/DATE-battery-rates-bf16.json
    python benchmarks/battery_rates.py --overrides "model=tiny drafter=pld verifier=rejection" --samples 32 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from specresearch import reports
from specresearch.errors import SpecResearchError, fail, report_problem
from specresearch.models import machine_tags, use_linear
from specresearch.models.loading import linear_kind
from specresearch.options.models import KERNELS

OVERRIDES = ("drafter=plain_chain verifier=rejection sampling=random sampling.temperature=0.7 dataset=humaneval "
             "dataset.offset=156")  # the lossless cell of the study's independent arm (the 1.5B and its 0.5B sibling, a chain of 4)


def rates(overrides: list[str], kernels: list[str], samples: int, length: int, rounds: int, seed: int = 0) -> dict:
    """The best of `rounds` rates (sequences per second) of each side's draws per kernels choice (of the target
    and the draft model, where the drafter has one).

    Returns:
        {"label": the method, "target": the target's LoadedModel, "rows": rows a call,
         "rates": {kernels: {"baseline": samples/s, "method": samples/s}}}.
    """
    from specresearch import build_engine, compose
    from specresearch.data import encode, load_prompts
    from specresearch.measure import baseline_samples, method_samples, stats_rows
    from specresearch.types import SamplingParams

    if unknown := [k for k in kernels if k not in KERNELS or k == "invariant"]:
        raise SpecResearchError(f"unknown --kernels {', '.join(unknown)}: valid are "
                                f"{', '.join(k for k in KERNELS if k != 'invariant')}")
    cfg = compose([*overrides, f"seed={seed}"])
    engine = build_engine(cfg)
    target, sampling = engine.kv.lm, SamplingParams(**cfg.sampling)
    models = [target, *([draft.lm] if (draft := getattr(engine.drafter, "draft", None)) is not None else [])]
    if sampling.greedy:
        raise SpecResearchError("the battery draws at temperature > 0: set sampling=random (and sampling.temperature)")
    prompts = [encode(target.tokenizer, load_prompts(**cfg.dataset)[0])]
    rows = stats_rows(cfg.stats.batch, engine.kv.vocab_size)
    best = {k: {"baseline": 0.0, "method": 0.0} for k in kernels}
    for r in range(rounds):
        for k in kernels:
            for lm in models:
                use_linear(lm.model, linear_kind(k, lm))
            baseline_samples(target, prompts, 1, length, sampling, seed, rows)  # untimed: the layout, first calls
            for side, draw in (("baseline", lambda: baseline_samples(target, prompts, samples, length, sampling, seed + r, rows)),
                               ("method", lambda: method_samples(engine, prompts, samples, length, seed + r, rows))):
                t0 = time.perf_counter()
                draw()
                best[k][side] = max(best[k][side], samples / (time.perf_counter() - t0))
        print(f"  round {r + 1}/{rounds}, best so far (samples/s): " + "  ".join(
            f"{k} {best[k]['baseline']:.2f}/{best[k]['method']:.2f}" for k in kernels), flush=True)
    return {"label": engine.label, "target": target, "rows": rows, "rates": best}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--overrides", default=OVERRIDES, help="the run's overrides (the method, the pair, the prompt)")
    ap.add_argument("--kernels", default="skinny,auto", help="model.kernels to compare (the target's and the draft's), the first "
                    "the reference")
    ap.add_argument("--samples", type=int, default=64, help="sequences per side per round")
    ap.add_argument("--length", type=int, default=8, help="tokens per sequence (stats.length)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", help="write the results page here")
    args = ap.parse_args()
    kernels = args.kernels.split(",")
    if args.json and (problem := report_problem(Path(args.json), "--json")):
        ap.error(problem)
    result = rates(shlex.split(args.overrides), kernels, args.samples, args.length, args.rounds)
    ref, got = kernels[0], result["rates"]
    columns = ["kernels", "baseline (samples/s)", "method (samples/s)", f"baseline / {ref}", f"method / {ref}"]
    rows = [[k, f"{got[k]['baseline']:.2f}", f"{got[k]['method']:.2f}", f"{got[k]['baseline'] / got[ref]['baseline']:.2f}x",
             f"{got[k]['method'] / got[ref]['method']:.2f}x"] for k in kernels]
    print("\n" + "\n".join("  ".join(r) for r in [columns, *rows]))
    if args.json:
        target = result["target"]
        with open(args.json, "w") as f:
            json.dump(reports.of_script(
                "battery_rates.py", vars(args), machine_tags(target),
                f"The battery's draws per second per model.kernels: {result['label']}, {target.name}, "
                f"{str(target.dtype).removeprefix('torch.')}", topic="speed", columns=columns, rows=rows,
                prompts=f"the first prompt of the run's dataset ({args.overrides}), {args.length} tokens a sequence",
                notes=[f"{args.samples} sequences a side per round, {result['rows']} rows a call (stats.batch=auto); each rate the "
                       f"best of {args.rounds} rounds, a round drawing both sides with every kernels choice in one process. "
                       "The draft model's linear layers take the same kernels (int8 ones stay)."]), f, indent=1)


if __name__ == "__main__":
    try:
        main()
    except SpecResearchError as e:
        fail(str(e))
