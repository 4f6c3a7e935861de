#!/usr/bin/env python3
"""Batches on a GPU, where real weights cannot travel: tokens/s of transformers `generate` left-padded
(the anchor), our batched baseline, and independent drafting at the two ends of acceptance (draft =
the target's own weights: nearly every token accepted; draft = random 0.5B-shape weights: none
accepted), at B = 1, 4, 16, 64 (env SIZES), on random weights of the Qwen2.5-Coder-1.5B and 0.5B shapes
(bf16; speed does not depend on the values), ragged prompts of 150-229 random tokens, 64 new tokens,
greedy, best of 2 timed runs after a warm-up. Writes $OUT/batch_gpu.json after every batch size.

    SHAPES=<folder with 1.5b/ and 0.5b/ config.json + tokenizer files> OUT=<folder> python benchmarks/gpu_batch.py
    python benchmarks/gpu_batch.py --dry     # the same code paths on the CPU with tiny shapes

SHAPES defaults to .gpu (tok15/, tok05/: benchmarks/gpu_prepare.sh), else the model cache's folders.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

DRY = "--dry" in sys.argv
OUT = Path(os.environ.get("OUT", "/tmp/gpu_out"))
DEV = "cpu" if DRY or not torch.cuda.is_available() else "cuda"
DT = torch.float32 if DRY else torch.bfloat16
NEW = 16 if DRY else 64
SIZES = [int(b) for b in os.environ.get("SIZES", "1,4" if DRY else "1,4,16,64").split(",")]
REPORT: dict = {"device": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu", "torch": torch.__version__,
                "new_tokens": NEW, "rows": []}
T0 = time.time()
BUDGET = float(os.environ.get("BUDGET_S", "300"))


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def make(src: Path, dst: Path, seed: int, tiny: dict | None) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(src, local_files_only=True)
    for k, v in (tiny or {}).items():
        setattr(cfg, k, v)
    if tiny and getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[: cfg.num_hidden_layers]
    torch.manual_seed(seed)
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(cfg, dtype=DT)
    shutil.rmtree(dst, ignore_errors=True)
    model.save_pretrained(dst)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src / f).is_file():
            shutil.copy(src / f, dst / f)
    del model


def main() -> None:
    from transformers import AutoModelForCausalLM

    from specresearch import build_engine, compose
    from specresearch.models import load_model

    OUT.mkdir(parents=True, exist_ok=True)
    q15, q05 = Path("/tmp/bq15"), Path("/tmp/bq05")
    t15 = ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
           if DRY else None)
    t05 = ({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64}
           if DRY else None)
    shapes = Path(os.environ.get("SHAPES", ".gpu"))
    if (shapes / "tok15").is_dir():
        src15, src05 = shapes / "tok15", shapes / "tok05"
    else:
        from specresearch.models import default_cache_dir
        src15, src05 = (Path(default_cache_dir()) / f"qwen2.5-coder-{size}" for size in ("1.5b", "0.5b"))
    make(src15, q15, 0, t15)
    make(src05, q05, 1, t05)
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(150, 230, (max(SIZES),), generator=gen).tolist()
    prompts = [torch.randint(100, 30000, (n,), generator=gen) for n in lengths]  # ragged rows
    dtype = "fp32" if DRY else "bf16"

    def cfg(*over):
        return compose([f"model.name={q15}", f"model.device={DEV}", f"model.dtype={dtype}", "tracker=none", *over])

    lm = load_model(**cfg("drafter=none").model)
    engines = {"baseline": build_engine(cfg("drafter=none"), baseline=True, target=lm),
               "independent k=4, draft = target (all accepted)":
                   build_engine(cfg("drafter=independent", f"drafter.model.name={q15}", "drafter.k=4"), target=lm),
               "independent k=4, draft = random 0.5B (none accepted)":
                   build_engine(cfg("drafter=independent", f"drafter.model.name={q05}", "drafter.k=4"), target=lm)}
    hf = AutoModelForCausalLM.from_pretrained(q15, dtype=DT, local_files_only=True).to(DEV).eval()
    hf.generation_config.eos_token_id, hf.generation_config.pad_token_id, hf.generation_config.do_sample = None, 0, False

    def hf_run(rows):
        width = max(p.numel() for p in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for b, p in enumerate(rows):  # left padding
            ids[b, width - p.numel():], mask[b, width - p.numel():] = p, 1
        out = hf.generate(input_ids=ids.to(DEV), attention_mask=mask.to(DEV), max_new_tokens=NEW, min_new_tokens=NEW)
        return [o[width:].tolist() for o in out]

    def ours(engine):
        def run(rows):
            outs = engine.generate(list(rows) if len(rows) > 1 else rows[0], max_new_tokens=NEW, eos_token_ids=[], seed=0)
            outs = outs if isinstance(outs, list) else [outs]
            return [o.tokens for o in outs], outs
        return run

    def timed(run, rows, reps=2):
        with torch.inference_mode():
            result = run(rows)  # warm-up
            best = float("inf")
            for _ in range(reps):
                sync()
                t = time.perf_counter()
                result = run(rows)
                sync()
                best = min(best, time.perf_counter() - t)
        return best, result

    for B in SIZES:
        if time.time() - T0 > BUDGET:
            print(f"budget spent before B={B}", flush=True)
            break
        rows = prompts[:B]
        row = {"B": B}
        secs, hf_tokens = timed(hf_run, rows)
        row["hf_generate_tok_s"] = B * NEW / secs
        for name, engine in engines.items():
            secs, (tokens, outs) = timed(ours(engine), rows)
            row[name] = {"tok_s": B * NEW / secs, "vs_generate": B * NEW / secs / row["hf_generate_tok_s"],
                         "tau": sum(o.stats.accepted + o.stats.steps for o in outs) / max(1, sum(o.stats.steps for o in outs)),
                         "rows_equal_to_generate": sum(t == h for t, h in zip(tokens, hf_tokens))}
        REPORT["rows"].append(row)
        print(json.dumps(row), flush=True)
        (OUT / "batch_gpu.json").write_text(json.dumps(REPORT, indent=1))
    REPORT["seconds"] = time.time() - T0
    (OUT / "batch_gpu.json").write_text(json.dumps(REPORT, indent=1))


if __name__ == "__main__":
    main()
