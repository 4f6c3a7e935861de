"""`python -m specresearch.train drafter=medusa [model=...] [train.*=...]`: train Medusa heads on the
target's own predictions, offline, on the CPU.

Self-distillation (Medusa-1 with the target frozen): the target reads offline text once (the
standard library's Python sources and the MT-bench questions: never the HumanEval evaluation
prompts); its final hidden states and its top-1 predictions are cached; head i learns to predict,
from the hidden state at position t, the target's own top-1 token at position t + 2 + i. The last
`held_out` share of the chunks is held out for the reported accuracy. The heads land in the model
cache, keyed by the target, where `drafter=medusa` finds them; the run is tracked in MLflow.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig
from torch import Tensor
from tqdm import tqdm

from specresearch.__main__ import CONF_DIR
from specresearch.drafters.medusa import MedusaHeads, checkpoint_path
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel, load_model
from specresearch.target import Target
from specresearch.vocab import CORPORA, corpus_texts

DRAFTERS = ("medusa",)


@dataclass
class Cache:
    """What the target computed on the corpus, once: the inputs and labels of the heads."""

    hidden: Tensor  # [N, H] final-norm hidden states, float32
    labels: Tensor  # [N, K] the target's top-1 token at t + 1 + i (the token t + 2 + i), −100 past a chunk's end
    held_out: Tensor  # [N] bool: positions of held-out chunks


@torch.inference_mode()
def build_cache(lm: LoadedModel, texts: list[str], tokens: int, seq_len: int, heads: int, held_out: float) -> Cache:
    """Run the target over `tokens` tokens of `texts`, in chunks of `seq_len`, and keep per position
    its hidden state and the top-1 labels of every head."""
    ids: list[int] = []
    for text in texts:
        ids.extend(lm.tokenizer.encode(text, add_special_tokens=False))
        if len(ids) >= tokens:
            break
    ids = ids[:tokens]
    chunks = [ids[i : i + seq_len] for i in range(0, len(ids) - heads - 1, seq_len)]
    if not chunks:
        raise SpecResearchError(f"train.tokens={tokens} gives no chunk of more than {heads + 1} tokens")
    target = Target(lm)
    target.keep_hidden = True
    hidden, labels, held = [], [], []
    first_held = len(chunks) - max(1, round(held_out * len(chunks))) if held_out > 0 else len(chunks)
    for c, chunk in enumerate(tqdm(chunks, desc="target over the corpus", unit="chunk")):
        target.reset()
        logits = target.forward(torch.tensor(chunk))  # [T, V]
        top1 = logits.argmax(-1).cpu()  # [T]: top1[j] is the target's guess for token j + 1
        n = len(chunk)
        lab = torch.full((n, heads), -100, dtype=torch.long)
        for i in range(heads):
            lab[: max(0, n - 1 - i), i] = top1[1 + i :]
        hidden.append(target.hidden.float().cpu())
        labels.append(lab)
        held.append(torch.full((n,), c >= first_held))
    return Cache(torch.cat(hidden), torch.cat(labels), torch.cat(held))


def accuracy(heads: MedusaHeads, lm_head: torch.nn.Module, cache: Cache, mask: Tensor, batch: int = 256) -> list[float]:
    """Per-head top-1 agreement with the target's own tokens on the positions in `mask`."""
    hits = torch.zeros(heads.config["heads"])
    counts = torch.zeros(heads.config["heads"])
    rows = mask.nonzero()[:, 0]
    with torch.inference_mode():
        for s in range(0, rows.numel(), batch):
            r = rows[s : s + batch]
            pred = heads(cache.hidden[r].to(lm_head.weight.dtype), lm_head).argmax(-1).cpu()  # [K, B]
            h, c = _hits(pred, cache.labels[r].T)
            hits, counts = hits + h, counts + c
    return (hits / counts.clamp_min(1)).tolist()


def _hits(pred: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """[K, B] predictions and labels (−100 = none) → per head: ([K] correct, [K] labelled)."""
    valid = labels >= 0
    return ((pred == labels) & valid).sum(-1), valid.sum(-1)


def train(cfg: DictConfig, lm: LoadedModel, tracker=None) -> tuple[MedusaHeads, dict]:
    """Train Medusa heads for `lm` as `cfg.train` says; return them and a summary (losses, accuracies)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    texts = [t for corpus in tc.corpora for t in corpus_texts(corpus)]
    random.Random(tc.seed).shuffle(texts)
    t0 = time.perf_counter()
    cache = build_cache(lm, texts, tc.tokens, tc.seq_len, tc.heads, tc.held_out)
    cache_s = time.perf_counter() - t0
    lm_head = lm.model.get_output_embeddings()
    for p in lm_head.parameters():
        p.requires_grad_(False)  # shared and frozen
    heads = MedusaHeads(cache.hidden.shape[1], tc.heads, tc.layers, tc.own_lm_head, lm_head.weight.shape[0])
    heads.init_lm_heads(lm_head)
    heads.to(lm.device)
    opt = torch.optim.AdamW(heads.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    train_rows = (~cache.held_out & (cache.labels[:, 0] >= 0)).nonzero()[:, 0]
    steps = max(1, tc.epochs * train_rows.numel() // tc.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=tc.lr, total_steps=steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(tc.seed)
    first_loss = last_loss = float("nan")
    bar = tqdm(range(steps), desc="medusa heads", unit="step")
    for step in bar:
        r = train_rows[torch.randint(train_rows.numel(), (tc.batch,), generator=gen)]  # [B]
        logits = heads(cache.hidden[r].to(device=lm.device, dtype=lm_head.weight.dtype), lm_head).float()  # [K, B, V]
        lab = cache.labels[r].T.to(lm.device)  # [K, B]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), lab.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        last_loss = loss.item()
        first_loss = last_loss if step == 0 else first_loss
        if step % tc.log_every == 0 or step == steps - 1:
            hits, counts = _hits(logits.argmax(-1), lab)
            acc = hits / counts.clamp_min(1)  # [K]
            bar.set_postfix(loss=f"{last_loss:.3f}", acc=" ".join(f"{a:.2f}" for a in acc.tolist()))
            if tracker is not None:
                tracker.log_metrics({"loss": last_loss, **{f"train_acc_head{i + 1}": float(a) for i, a in enumerate(acc)}}, step=step)
    held = accuracy(heads, lm_head, cache, cache.held_out) if bool(cache.held_out.any()) else []
    seen = torch.zeros_like(cache.held_out)  # as many training positions, to show the generalisation gap
    seen[train_rows[torch.randperm(train_rows.numel(), generator=gen)[: max(1, int(cache.held_out.sum()))]]] = True
    fit = accuracy(heads, lm_head, cache, seen)
    summary = {
        "positions": int(cache.labels.shape[0]),
        "train_positions": int(train_rows.numel()),
        "held_out_positions": int(cache.held_out.sum()),
        "steps": steps,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "cache_seconds": cache_s,
        "train_seconds": time.perf_counter() - t0 - cache_s,
        **{f"held_out_acc_head{i + 1}": a for i, a in enumerate(held)},
        **{f"train_acc_head{i + 1}": a for i, a in enumerate(fit)},
    }
    return heads, summary


def check(cfg: DictConfig) -> None:
    name = cfg.drafter.get("_target_", "").rsplit(".", 1)[-1]
    if name != "MedusaDrafter":
        raise SpecResearchError(f"specresearch.train trains drafters {', '.join(DRAFTERS)}: use drafter=medusa (got {name or cfg.drafter})")
    tc = cfg.train
    bad = sorted(set(tc.corpora) - set(CORPORA))
    if bad or not tc.corpora:
        raise SpecResearchError(f"unknown train.corpora {bad}: valid are {', '.join(CORPORA)}")
    if min(tc.heads, tc.layers, tc.tokens, tc.seq_len, tc.batch, tc.epochs) < 1 or not 0 <= tc.held_out < 1:
        raise SpecResearchError("train.heads, layers, tokens, seq_len, batch and epochs must be >= 1 and 0 <= train.held_out < 1")


def run(cfg: DictConfig) -> dict:
    """Train, save the heads where drafter=medusa looks (or train.out), track the run; return the summary."""
    from specresearch.experiment import build

    check(cfg)
    lm = load_model(**cfg.model)
    out = Path(cfg.train.out) if cfg.train.out else checkpoint_path(lm.name, cfg.model.cache_dir)
    tracker = build(cfg.tracker)
    tracker.start(cfg, run_name=f"train medusa x{cfg.train.heads} on {lm.name}")
    try:
        heads, summary = train(cfg, lm, tracker)
        heads.save(out, {"target": lm.name, **{k: v for k, v in summary.items() if "acc" in k or k == "steps"}})
        tracker.log_metrics({k: float(v) for k, v in summary.items()})
        tracker.log_artifact_text(str(out), "checkpoint.txt")
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end("FINISHED")
    acc = " ".join(f"{summary[k]:.3f}" for k in sorted(summary) if k.startswith("held_out_acc"))
    fit = " ".join(f"{summary[k]:.3f}" for k in sorted(summary) if k.startswith("train_acc"))
    print(
        f"medusa heads for {lm.name}: {summary['steps']} steps, loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}, "
        f"held-out top-1 agreement per head: {acc or 'n/a'} (on training positions: {fit})\n"
        f"target pass over the corpus {summary['cache_seconds']:.0f} s, training {summary['train_seconds']:.0f} s\n"
        f"saved {out}; decode with: python -m specresearch drafter=medusa verifier=typical"
    )
    return summary


def _task(cfg: DictConfig) -> None:
    from specresearch.experiment import fail

    try:
        run(cfg)
    except SpecResearchError as err:
        fail(str(err))


def main() -> None:
    hydra.main(config_path=str(CONF_DIR), config_name="train", version_base="1.3")(_task)()


if __name__ == "__main__":
    main()
