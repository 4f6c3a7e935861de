#!/usr/bin/env python3
"""The law the engine's verifier reads, audited against the baseline's own path: is p what plain decoding says?

Rejection sampling is lossless when the p it reads at each node is the law plain decoding would sample
from after that node's context. The engine computes p in batched, ragged verification forwards of k + 1
(or a tree's) query tokens over a KV cache that rows leave as they finish (the battery's shapes: R rows of
one prompt, L tokens each, no EOS); this script decodes those rows as the battery's method side does
(`specresearch.stats.sample_engine`'s call), records at every verification each row's context, draft
and the logits the verifier got, then recomputes each of those laws along the baseline's own path: the
prompt prefilled once and shared (`specresearch.stats.samples`' prompt), then one query token a forward
(`decode_batch`'s forward, as `sample_target` draws the battery's baseline side), every context's tokens
fed in turn (a trie of the contexts, walked depth first: one forward per distinct prefix). It prints, per
node, whether the two logits are the same bits, and the total variation between the two laws: the
count, mean, quantiles and maximum, overall and by the number of rows the step verified together.

In fp32 a correct engine agrees with the baseline's path to float precision (a TV of 1e-4 would be a bug:
a stale cache slot, a wrong position or mask); in bf16 with the default kernels the gap is the target's own
numerics between 1-query and (k + 1)-query forwards (`benchmarks/kernel_paths.py`); with
`--kernels invariant` (model.kernels=invariant) every node is the same bits: the verifier reads exactly
the law plain decoding samples from.

    python benchmarks/engine_laws.py                                   # the real pair, bf16: the battery's shapes
    python benchmarks/engine_laws.py --kernels invariant               # the same with the shape-invariant forward
    python benchmarks/engine_laws.py --dtype float32                   # the same in fp32: any gap is a bug
    python benchmarks/engine_laws.py --model tiny --rows 8             # checks the script runs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import numpy as np
import torch
from tqdm import tqdm

from specresearch import build_engine, compose, reports
from specresearch.data import encode, load_prompts
from specresearch.errors import SpecResearchError, fail, report_path
from specresearch.models import machine_tags
from specresearch.sampling import logits_to_probs
from specresearch.stats.samples import SharedPrompt, Stream, sample_seeds


def node_contexts(context: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor | None) -> list[torch.Tensor]:
    """The context each law of a step is conditioned on: the row's context ([T], its newest token last)
    for the root's law, then for each draft node the context and the path down to that node."""
    paths: list[torch.Tensor] = []
    for j in range(tokens.numel()):
        parent = j - 1 if parents is None else int(parents[j])
        paths.append(torch.cat([paths[parent] if parent >= 0 else tokens[:0], tokens[j : j + 1]]))
    return [context] + [torch.cat([context, path]) for path in paths]


class Reference:
    """The laws plain decoding samples from, along the baseline's own path (`sample_target`): the prompt
    prefilled once and held as the rows' shared prefix where the model shares one, then one query token a
    forward. Contexts are fed as a trie, depth first, so a prefix several contexts share is fed once."""

    def __init__(self, lm, prompt: list[int]):
        self.lm, self.n = lm, len(prompt)
        self.shared = SharedPrompt(lm, prompt)

    @torch.inference_mode()
    def logits(self, suffixes: list[tuple[int, ...]]) -> dict[tuple[int, ...], torch.Tensor]:
        """{suffix: [V] logits after prompt + suffix} for every suffix (tokens after the prompt), each from a
        forward of one query token after the cache of the tokens before it (the prompt's: its prefill's)."""
        out = {(): self.shared.logits[0]}
        cache, prefix = self.shared.rows(1)
        fed: list[int] = []
        for suffix in tqdm(sorted(set(suffixes)), desc="reference: one query a forward", unit="context"):
            common = 0
            while common < min(len(fed), len(suffix)) and fed[common] == suffix[common]:
                common += 1
            if common < len(fed):
                cache.crop(common - len(fed))  # transformers 5: a negative count drops the newest tokens
                del fed[common:]
            for token in suffix[common:]:
                position = torch.tensor([[self.n + len(fed)]], device=self.lm.device)
                hidden = self.lm.model.base_model(input_ids=torch.tensor([[token]], device=self.lm.device), cache=cache,
                                                  use_cache=True, position_ids=position,
                                                  **({"prefix": prefix} if prefix is not None else {})).last_hidden_state
                fed.append(token)
                out[tuple(fed)] = self.lm.model.get_output_embeddings()(hidden[0, -1])  # [V]
        return out


def audit(engine, prompt: list[int], rows: int, tokens: int, seed: int) -> list[dict]:
    """Decode `rows` continuations of `prompt` as the battery's method side does, recording at each
    verification every row's logits per node; then compare each with the baseline's path (`Reference`):
    per node, whether the logits are the same bits and the TV between the two laws (after the run's
    temperature, top-k and top-p)."""
    contexts: list[torch.Tensor] = []
    read: list[tuple[int, int, tuple[int, ...], torch.Tensor]] = []  # (rows verified together, node, context after the prompt, [V] logits)
    propose, verify = engine.drafter.propose_rows, engine.verify

    def proposing(ctxs):
        contexts[:] = [ctx.tokens.clone() for ctx in ctxs]
        return propose(ctxs)

    def verifying(drafts, logits, active):
        bar.update(1)
        bar.set_postfix(rows=len(drafts))
        for b, (context, draft) in enumerate(zip(contexts, drafts)):
            n = len(draft)  # the proposals (a drafter's scratch positions come after them and are not verified)
            nodes = node_contexts(context, draft.tokens[:n], None if draft.parents is None else draft.parents[:n])
            read.extend((len(drafts), i, tuple(node[len(prompt):].tolist()), logits[b, i].clone()) for i, node in enumerate(nodes))
        return verify(drafts, logits, active)

    engine.drafter.propose_rows, engine.verify = proposing, verifying
    bar = tqdm(desc="verification steps recorded", unit="step")
    try:
        engine.generate([list(prompt)] * rows, tokens, eos_token_ids=[], seed=sample_seeds(seed, rows, 0, Stream.METHOD),
                        reuse_prefill=True, sample_first=False)
    finally:
        engine.drafter.propose_rows, engine.verify = propose, verify
        bar.close()
    reference = Reference(engine.kv.lm, prompt).logits([suffix for _, _, suffix, _ in read])
    found = []
    for rows_together, node, suffix, logits in read:
        ref = reference[suffix].detach()
        p, r = (logits_to_probs(x.detach().float(), engine.p_sampling) for x in (logits, ref))  # [V] each
        found.append({"rows": rows_together, "node": node, "at": len(suffix), "tv": float(0.5 * (p - r).abs().sum()),
                      "same_bits": bool(torch.equal(logits, ref.to(logits.dtype)))})
    return found


def summary(found: list[dict]) -> list[list[str]]:
    """Rows of the report: all nodes, then by the number of rows verified together (buckets)."""
    out = []
    buckets = [("all steps", lambda r: True), ("steps of 1-7 rows", lambda r: r["rows"] < 8),
               ("steps of 8-63 rows", lambda r: 8 <= r["rows"] < 64), ("steps of 64+ rows", lambda r: r["rows"] >= 64)]
    for name, keep in buckets:
        kept = [r for r in found if keep(r)]
        tv = np.array([r["tv"] for r in kept])
        if tv.size:
            same = sum(r["same_bits"] for r in kept)
            out.append([name, str(tv.size), f"{same} ({same / tv.size:.1%})", f"{tv.mean():.2e}", f"{np.quantile(tv, 0.5):.2e}",
                        f"{np.quantile(tv, 0.99):.2e}", f"{tv.max():.2e}"])
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, audit, print (and write --json); a refused setting (an unknown --model, --drafter or
    --verifier, a --json that cannot be written) is one `error:` line and exit 2, before any model loads."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a zoo name or tiny)")
    ap.add_argument("--drafter", default="independent", help="a drafter of conf/drafter (its draft model follows the target's)")
    ap.add_argument("--verifier", default="rejection")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--kernels", default="auto", help="the target's model.kernels: auto, torch or invariant")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--rows", type=int, default=110, help="R: rows decoded together (the battery's stats.batch=auto)")
    ap.add_argument("--tokens", type=int, default=8, help="L: new tokens per row (the battery's stats.length)")
    ap.add_argument("--prompt", type=int, default=156, help="the HumanEval problem (the lossless_vs_lossy study's first)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results report here")
    args = ap.parse_args(argv)
    try:
        run(args)
    except SpecResearchError as err:
        fail(str(err))
    return 0


def run(args: argparse.Namespace) -> None:
    """The audit of `main`'s arguments: the settings and --json checked first, then the engine built and decoded."""
    out = report_path(args.json, "--json")
    cfg = compose([f"model={args.model}", f"drafter={args.drafter}", f"verifier={args.verifier}", "sampling=random",
                   f"sampling.temperature={args.temperature}", f"model.dtype={args.dtype}", f"model.kernels={args.kernels}"])
    engine = build_engine(cfg)
    lm = engine.kv.lm
    prompt = encode(lm.tokenizer, load_prompts("humaneval", num_prompts=1, offset=args.prompt)[0])
    found = audit(engine, prompt, args.rows, args.tokens, args.seed)
    rows = summary(found)
    print(f"{lm.name} ({lm.dtype}, {lm.device}), drafter={args.drafter} x {args.verifier}, T = {args.temperature}, "
          f"kernels {args.kernels}, HumanEval {args.prompt}, {args.rows} rows x {args.tokens} tokens: the logits the verifier "
          "read against the baseline's path (one query a forward after the shared prompt), per node")
    for r in rows:
        print(f"  {r[0]:20} nodes {r[1]:>5}  same bits {r[2]:>13}  TV mean {r[3]}  median {r[4]}  99% {r[5]}  max {r[6]}")
    if out:  # one results report (specresearch.reports)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w") as f:
            json.dump(reports.of_script(
                "engine_laws.py", vars(args), machine_tags(lm),
                f"The p the verifier reads against plain decoding's: {lm.name}, {str(lm.dtype).removeprefix('torch.')}, "
                f"kernels {args.kernels}, {args.drafter} x {args.verifier}", topic="lossless",
                columns=["steps", "nodes", "same bits as the baseline's path", "mean TV", "median TV", "99% TV", "max TV"], rows=rows,
                prompts=f"HumanEval {args.prompt}, {args.rows} rows x {args.tokens} tokens at T = {args.temperature}",
                notes=["Each node's logits as the engine's verifier read them (batched, ragged, cached, k + 1 or a tree's "
                       "query tokens a forward) against the baseline's path to the same context (the battery's sample_target: "
                       "the prompt prefilled once and shared, then one query token a forward): whether they are the same bits, "
                       "and the TV between the two laws after the run's sampling settings."],
                data={"nodes": found}), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
