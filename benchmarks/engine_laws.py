#!/usr/bin/env python3
"""The law the engine's verifier reads, audited against the target itself: is p what the target says?

Rejection sampling is lossless when the p it reads at each node is the target's conditional law given
that node's context. The engine computes p in batched, ragged verification forwards over a KV cache
that rows leave as they finish (the battery's shapes: R rows of one prompt, L tokens each, no EOS);
this script decodes those rows as the battery's method side does (`specresearch.stats.sample_engine`'s
call), and at every verification records each row's context, draft and the p the verifier got, then
recomputes each of those laws from the model alone: a plain forward of the row's own sequence, one row,
through transformers' own cache of the prompt (the reference). It prints the total variation between
the two per node: its mean, quantiles and maximum, overall and by the number of rows the step verified
together. In fp32 a correct engine agrees with the reference to float precision (a TV of 1e-4 would be a
bug: a stale cache slot, a wrong position or mask); in bf16 the gap is the target's own numerics between
batch shapes (`benchmarks/kernel_paths.py`).

    python benchmarks/engine_laws.py                                   # the real pair, bf16: the battery's shapes
    python benchmarks/engine_laws.py --dtype float32                   # the same in fp32: any gap is a bug
    python benchmarks/engine_laws.py --model tiny --rows 8             # checks the script runs
"""

from __future__ import annotations

import argparse
import copy
import json

import numpy as np
import torch
from tqdm import tqdm

from specresearch import build_engine, compose, reports
from specresearch.data import encode, load_prompts
from specresearch.models import machine_tags
from specresearch.sampling import logits_to_probs
from specresearch.stats.samples import Stream, sample_seeds


def node_contexts(context: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor | None) -> list[torch.Tensor]:
    """The context each law of a step is conditioned on: the row's context ([T], its newest token last)
    for the root's law, then for each draft node the context and the path down to that node."""
    paths: list[torch.Tensor] = []
    for j in range(tokens.numel()):
        parent = j - 1 if parents is None else int(parents[j])
        paths.append(torch.cat([paths[parent] if parent >= 0 else tokens[:0], tokens[j : j + 1]]))
    return [context] + [torch.cat([context, path]) for path in paths]


class Reference:
    """The target's own laws, from plain one-row forwards of the model (transformers' code, not the
    engine's): the prompt but its last token is computed once and kept in the model's own cache, and
    each context is fed after a copy of it."""

    def __init__(self, model, prompt: list[int], sampling):
        self.model, self.sampling, self.n = model, sampling, len(prompt) - 1
        with torch.inference_mode():
            self.cache = model(torch.tensor([prompt[:-1]], device=model.device), use_cache=True).cache

    @torch.inference_mode()
    def laws(self, context: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor | None) -> torch.Tensor:
        """[1 + K, V] the target's law at the root and after each of the K draft nodes (a chain: one forward
        of the context's rest and the whole chain; a tree: one per node)."""
        seqs = [torch.cat([context, tokens])] if parents is None else node_contexts(context, tokens, parents)
        logits = []
        for seq in seqs:
            out = self.model(seq[None, self.n :], cache=copy.deepcopy(self.cache), use_cache=True).logits[0]  # [T' + K, V]
            logits.append(out[context.numel() - 1 - self.n :] if parents is None else out[-1:])
        return logits_to_probs(torch.cat(logits).float(), self.sampling)


def audit(engine, prompt: list[int], rows: int, tokens: int, seed: int) -> list[dict]:
    """Decode `rows` continuations of `prompt` as the battery's method side does, recording at each
    verification every row's TV between the p the verifier read and the reference's, per node."""
    contexts: list[torch.Tensor] = []
    found: list[dict] = []
    propose, verify = engine.drafter.propose_rows, engine.verify
    reference = Reference(engine.target.lm.model, prompt, engine.p_sampling)

    def proposing(ctxs):
        contexts[:] = [ctx.tokens.clone() for ctx in ctxs]
        return propose(ctxs)

    def verifying(drafts, logits, active):
        bar.update(1)
        bar.set_postfix(rows=len(drafts))
        p = logits_to_probs(logits, engine.p_sampling)  # [B, W, V]
        for b, (context, draft) in enumerate(zip(contexts, drafts)):
            n = len(draft)  # the proposals (a drafter's scratch positions come after them and are not verified)
            ref = reference.laws(context, draft.tokens[:n], None if draft.parents is None else draft.parents[:n])  # [1 + K_b, V]
            tv = 0.5 * (p[b, : ref.shape[0]] - ref).abs().sum(-1)  # [1 + K_b]
            found.extend({"rows": len(drafts), "node": i, "at": context.numel() - len(prompt) + i, "tv": float(t)}
                         for i, t in enumerate(tv))
        return verify(drafts, logits, active)

    engine.drafter.propose_rows, engine.verify = proposing, verifying
    bar = tqdm(desc="verification steps audited", unit="step")
    try:
        engine.generate([list(prompt)] * rows, tokens, eos_token_ids=[], seed=sample_seeds(seed, rows, 0, Stream.METHOD),
                        reuse_prefill=True, sample_first=False)
    finally:
        engine.drafter.propose_rows, engine.verify = propose, verify
        bar.close()
    return found


def summary(found: list[dict]) -> list[list[str]]:
    """Rows of the report: all nodes, then by the number of rows verified together (buckets)."""
    out = []
    buckets = [("all steps", lambda r: True), ("steps of 1-7 rows", lambda r: r["rows"] < 8),
               ("steps of 8-63 rows", lambda r: 8 <= r["rows"] < 64), ("steps of 64+ rows", lambda r: r["rows"] >= 64)]
    for name, keep in buckets:
        tv = np.array([r["tv"] for r in found if keep(r)])
        if tv.size:
            out.append([name, str(tv.size), f"{tv.mean():.2e}", f"{np.quantile(tv, 0.5):.2e}", f"{np.quantile(tv, 0.99):.2e}",
                        f"{tv.max():.2e}"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--drafter", default="independent", help="a drafter of conf/drafter (its draft model follows the target's)")
    ap.add_argument("--verifier", default="rejection")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--rows", type=int, default=110, help="R: rows decoded together (the battery's stats.batch=auto)")
    ap.add_argument("--tokens", type=int, default=8, help="L: new tokens per row (the battery's stats.length)")
    ap.add_argument("--prompt", type=int, default=156, help="the HumanEval problem (the lossless_vs_lossy study's first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results report here")
    args = ap.parse_args()

    cfg = compose([f"model={args.model}", f"drafter={args.drafter}", f"verifier={args.verifier}", "sampling=random",
                   f"sampling.temperature={args.temperature}", f"model.dtype={args.dtype}"])
    engine = build_engine(cfg)
    lm = engine.target.lm
    prompt = encode(lm.tokenizer, load_prompts("humaneval", num_prompts=1, offset=args.prompt)[0])
    found = audit(engine, prompt, args.rows, args.tokens, args.seed)
    rows = summary(found)
    print(f"{lm.name} ({lm.dtype}, {lm.device}), drafter={args.drafter} x {args.verifier}, T = {args.temperature}, "
          f"HumanEval {args.prompt}, {args.rows} rows x {args.tokens} tokens: TV between the p the verifier read and the "
          "target's law from a plain one-row forward, per node")
    for r in rows:
        print(f"  {r[0]:20} nodes {r[1]:>5}  mean {r[2]}  median {r[3]}  99% {r[4]}  max {r[5]}")
    if args.json:  # one results report (specresearch.reports)
        with open(args.json, "w") as f:
            json.dump(reports.of_script(
                "engine_laws.py", vars(args), machine_tags(lm),
                f"The p the verifier reads against the target's own law: {lm.name}, {str(lm.dtype).removeprefix('torch.')}, "
                f"{args.drafter} x {args.verifier}", topic="lossless",
                columns=["steps", "nodes", "mean TV", "median TV", "99% TV", "max TV"], rows=rows,
                prompts=f"HumanEval {args.prompt}, {args.rows} rows x {args.tokens} tokens at T = {args.temperature}",
                notes=["Each node's TV between the law the engine's verifier read (batched, ragged, cached) and the target's "
                       "law from one plain forward of that node's context (one row, transformers' own code after its cache "
                       "of the prompt)."],
                data={"nodes": found}), f, indent=1)

if __name__ == "__main__":
    main()
