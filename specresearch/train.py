"""`python -m specresearch.train drafter=medusa|eagle [model=...] [train.*=...]`: train Medusa heads
or an EAGLE head on the target's own predictions, offline, on the CPU.

Self-distillation with the target frozen. Two kinds of training data (`train.data`):

- `self` (default; Medusa-2's self-distillation): the target continues offline prompts (functions of
  the standard library cut after their docstring, as HumanEval prompts are; ShareGPT first turns
  through the chat template), greedily and batched. Head i learns, from the hidden state that
  produced token t + 1, the target's own token t + 2 + i: the text the heads see at decode time is
  the target's own, so the labels are too.
- `text` (Medusa-1 on fixed text): the target reads offline text once (the same sources, whole);
  head i learns the target's top-1 at t + 1 + i, given the text's tokens up to there.

Training reads only the train side of specresearch.data's split (`train_side`): never HumanEval,
MT-bench, ShareGPT's evaluation prompts or the stdlib_doctest task's modules. The checkpoint's meta
records which prompts made the data (`trained_on`: sources, split, number, sha256 and ids), and a run
with the drafter refuses prompts among them.

The hidden states and labels are computed once and cached on disk (keyed by every setting they depend
on), so a second training with other optimiser settings starts at once. The last `held_out` share of
the prompts (or text chunks) is held out for the reported accuracy. The heads land in the model cache,
keyed by the target, where `drafter=medusa` (or `eagle`) finds them; the run is tracked in MLflow.
"""

from __future__ import annotations

import logging
import hashlib
import json
import random
import sys
import time
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm import tqdm
from transformers import DynamicCache

from specresearch.app import build, cli, tracked_run
from specresearch.drafters.eagle import EagleHead, eagle_path
from specresearch.drafters.medusa import MedusaHeads, checkpoint_path
from specresearch.errors import SpecResearchError
from specresearch.data import DATASETS, SPLIT_RULE, TRAIN_SOURCES, Prompt, encode, prompt_record, train_side
from specresearch.models import LoadedModel, default_cache_dir, load_model
from specresearch.target import Target, decode_batch
from specresearch.types import SamplingParams

log = logging.getLogger(__name__)

DRAFTERS = {"MedusaDrafter": "medusa", "EagleDrafter": "eagle"}  # drafter class → what trains it
EAGLE_CLS = 0.1  # EAGLE's weight of the token loss beside the feature regression (Li et al., 2024)
EAGLE_CLIP = 0.5  # EAGLE's gradient-norm clip


DATA = ("self", "text")
CACHE_FORMAT = 3  # the data cache's fields and prompts (a change makes older caches unused; 3: the train/eval split)
MAX_HEADS = 8  # labels kept per position in the data cache: any train.heads up to this reuses it
RANKS = 10  # ranks whose held-out hit rates the checkpoint keeps (drafter=medusa builds its tree from them)
MAX_PROMPT = 320  # data=self skips longer prompts: one long prompt pads a whole batch to its length


@dataclass
class Cache:
    """What the target computed once: the inputs and labels of the heads."""

    hidden: Tensor  # [N, H] final-norm hidden states (the target's dtype)
    labels: Tensor  # [N, K] head i's label at each position (the token t + 2 + i), −100 where there is none
    held_out: Tensor  # [N] bool: positions of held-out prompts or chunks
    tokens: Tensor  # [N] the token after each position (t + 1: the target's own with data=self), −100 at a chunk's end
    seq: Tensor  # [N] the prompt or chunk each position belongs to (positions of one are contiguous, in order)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        save_file({k: v.contiguous() for k, v in vars(self).items()}, str(tmp))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> Cache:
        return cls(**load_file(str(path)))


def training_prompts(corpora: list[str], seed: int, files: bool = False) -> list[Prompt]:
    """The prompts training may read of `corpora` (specresearch.data.train_side: python-stdlib's
    functions, or with `files` its files; ShareGPT's training first turns, as chat), each shuffled,
    then interleaved so that every prefix of the list mixes the corpora."""
    pools = []
    for i, corpus in enumerate(corpora):
        pool = train_side(corpus, files)
        random.Random(seed + i).shuffle(pool)
        pools.append(pool)
    return [p for group in zip_longest(*pools) for p in group if p is not None]


@torch.inference_mode()
def generate_batch(lm: LoadedModel, prompts: list[list[int]], new: int, temperature: float = 0.0,
                   gen: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Continue `prompts` together (left-padded, one forward per token): greedily, or sampled at
    `temperature`.

    Returns:
        [B, new] the new tokens, and [B, new, H] the final-norm hidden state that produced each.
    """
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)  # [B, T]
    mask = torch.zeros(len(prompts), width, dtype=torch.long)  # [B, T]: 0 = left padding
    for b, p in enumerate(prompts):
        ids[b, width - len(p) :] = torch.tensor(p)
        mask[b, width - len(p) :] = 1
    ids, mask = ids.to(lm.device), mask.to(lm.device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [B, T]: every prompt starts at position 0
    cache = DynamicCache(config=lm.model.config)
    tokens, hidden = decode_batch(lm, cache, ids, new, SamplingParams(temperature=temperature), gen, mask, positions)
    return tokens.cpu(), hidden.cpu()


def self_cache(lm: LoadedModel, prompts: list[list[int]], tokens: int, new: int, heads: int, held_out: float,
               batch: int = 32, temperature: float = 0.0, seed: int = 0) -> Cache:
    """The target continues `prompts` (`new` tokens each, as many prompts as give `tokens` tokens;
    shorter prompts first within the batches, for less padding); keep per generated position the
    hidden state and the labels of every head: the target's own token t + 2 + i, up to its first EOS.
    Positions come in prompt order; the last `held_out` share of the prompts taken is held out."""
    prompts = prompts[: max(1, -(-tokens // new))]
    first_held = len(prompts) - max(1, round(held_out * len(prompts))) if held_out > 0 else len(prompts)
    eos = getattr(lm.tokenizer, "eos_token_id", None)
    gen = torch.Generator(device=lm.device).manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    parts: dict[int, tuple[Tensor, Tensor, Tensor]] = {}  # prompt → ([n, H] hidden states, [n, K] labels, [n] tokens)
    for s in tqdm(range(0, len(order), batch), desc="target continues the prompts", unit="batch"):
        rows = order[s : s + batch]
        out, h = generate_batch(lm, [prompts[i] for i in rows], new, temperature, gen)  # [B, new], [B, new, H]
        for b, i in enumerate(rows):
            ends = (out[b] == eos).nonzero()
            last = int(ends[0]) if eos is not None and ends.numel() else new - 1  # the last token of the text
            lab = torch.full((last + 1, heads), -100, dtype=torch.long)
            for k in range(heads):
                lab[: max(0, last - k), k] = out[b, 1 + k : last + 1]
            parts[i] = (h[b, : last + 1], lab, out[b, : last + 1])
    n = [parts[i][1].shape[0] for i in range(len(prompts))]
    return Cache(
        hidden=torch.cat([parts[i][0] for i in range(len(prompts))]),
        labels=torch.cat([parts[i][1] for i in range(len(prompts))]),
        held_out=torch.cat([torch.full((m,), i >= first_held) for i, m in enumerate(n)]),
        tokens=torch.cat([parts[i][2] for i in range(len(prompts))]),
        seq=torch.cat([torch.full((m,), i) for i, m in enumerate(n)]),
    )


@torch.inference_mode()
def text_cache(lm: LoadedModel, texts: list[str], tokens: int, seq_len: int, heads: int, held_out: float) -> Cache:
    """Run the target over `tokens` tokens of `texts`, in chunks of `seq_len`, and keep per position
    its hidden state and the top-1 labels of every head (the target's top-1 at t + 1 + i)."""
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
    parts: list[tuple[Tensor, ...]] = []  # per chunk: hidden, labels, held_out, tokens, seq
    first_held = len(chunks) - max(1, round(held_out * len(chunks))) if held_out > 0 else len(chunks)
    for c, chunk in enumerate(tqdm(chunks, desc="target over the corpus", unit="chunk")):
        target.reset()
        logits = target.forward(torch.tensor(chunk))  # [T, V]
        top1 = logits.argmax(-1).cpu()  # [T]: top1[j] is the target's guess for token j + 1
        n = len(chunk)
        lab = torch.full((n, heads), -100, dtype=torch.long)
        for i in range(heads):
            lab[: max(0, n - 1 - i), i] = top1[1 + i :]
        after = torch.tensor(chunk[1:] + [-100])  # [T] the text's next token
        parts.append((target.hidden.cpu(), lab, torch.full((n,), c >= first_held), after, torch.full((n,), c)))
    return Cache(*(torch.cat(column) for column in zip(*parts)))


def build_cache(lm: LoadedModel, tc: DictConfig, cache_dir: str | None = None) -> tuple[Cache, Path | None, dict]:
    """The training data as `tc` (cfg.train) asks, from the disk cache (<model cache>/distill/<target>/,
    shared by Medusa and EAGLE) when the same data was made before (`tc.cache`), else computed by the
    target and saved there. Returns it, its path, and the record of the prompts (or texts) it was made
    from (specresearch.data.prompt_record; kept in the JSON beside the cache)."""
    keys = ("data", "corpora", "tokens", "held_out", "seed") + (("new", "temperature", "gen_batch") if tc.data == "self" else ("seq_len",))
    spec = {"format": CACHE_FORMAT, "split": SPLIT_RULE, **{k: OmegaConf.to_object(tc[k]) if OmegaConf.is_config(tc[k]) else tc[k] for k in keys}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(cache_dir or default_cache_dir()) / "distill" / lm.name.replace("/", "--")
    path = folder / f"data-{tc.data}-{digest}.safetensors" if tc.cache else None
    if tc.heads > MAX_HEADS:
        raise SpecResearchError(f"train.heads={tc.heads}: at most {MAX_HEADS}")
    if path is not None and path.is_file():
        print(f"specresearch: training data from {path}", file=sys.stderr)
        cache = Cache.load(path)
        record = json.loads(path.with_suffix(".json").read_text())["trained_on"]
    else:
        used: list[Prompt] = []  # the prompts (or texts) the data is made from, in order
        if tc.data == "self":
            want, prompts = max(1, -(-tc.tokens // tc.new)), []  # as many prompts as self_cache takes
            for p in training_prompts(list(tc.corpora), tc.seed):
                ids = encode(lm.tokenizer, p)
                if len(ids) <= MAX_PROMPT:
                    used.append(p)
                    prompts.append(ids)
                    if len(used) == want:
                        break
            cache = self_cache(lm, prompts, tc.tokens, tc.new, MAX_HEADS, tc.held_out, tc.gen_batch, tc.temperature, tc.seed)
        else:
            read = 0
            for p in training_prompts(list(tc.corpora), tc.seed, files=True):  # as many texts as text_cache reads
                used.append(p)
                read += len(lm.tokenizer.encode(p.text, add_special_tokens=False))
                if read >= tc.tokens:
                    break
            cache = text_cache(lm, [p.text for p in used], tc.tokens, tc.seq_len, MAX_HEADS, tc.held_out)
        record = prompt_record(list(tc.corpora), used)
        if path is not None:
            cache.save(path)
            path.with_suffix(".json").write_text(json.dumps({**spec, "trained_on": record}, indent=1))
    cache.labels = cache.labels[:, : tc.heads]
    return cache, path, record


def accuracy(heads: MedusaHeads, lm_head: torch.nn.Module, cache: Cache, mask: Tensor, ranks: int = RANKS, batch: int = 256) -> Tensor:
    """[K, ranks] per head, the share of the positions in `mask` whose label (the target's own token)
    is the head's rank-r token: column 0 is the top-1 agreement; a row's sum, the top-`ranks` one."""
    hits = torch.zeros(heads.config["heads"], ranks)
    counts = torch.zeros(heads.config["heads"])
    rows = mask.nonzero()[:, 0]
    with torch.inference_mode():
        for s in range(0, rows.numel(), batch):
            r = rows[s : s + batch]
            logits = heads(cache.hidden[r].to(device=lm_head.weight.device, dtype=torch.float32), lm_head)  # [K, B, V]
            h, c = _hits(logits.topk(ranks, dim=-1).indices.cpu(), cache.labels[r].T)
            hits, counts = hits + h, counts + c
    return hits / counts.clamp_min(1)[:, None]


def _hits(pred: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """[K, B, R] ranked predictions and [K, B] labels (−100 = none) → per head ([K, R] hits at each rank, [K] labelled)."""
    valid = labels >= 0  # [K, B]
    return ((pred == labels[..., None]) & valid[..., None]).sum(1), valid.sum(-1)


def train(cfg: DictConfig, lm: LoadedModel, tracker=None) -> tuple[nn.Module, dict]:
    """Train the drafter `cfg.drafter` names (Medusa heads, or an EAGLE head) for `lm` as `cfg.train`
    says; return it and a summary (losses, held-out accuracies, times, and `trained_on`: the record of
    the prompts the data was made from, specresearch.data.prompt_record)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    t0 = time.perf_counter()
    cache, cache_path, trained_on = build_cache(lm, tc, cfg.get("model", {}).get("cache_dir"))
    cache_s = time.perf_counter() - t0
    for p in lm.model.parameters():
        p.requires_grad_(False)  # the target (its lm head and embeddings too) is frozen
    fit = train_eagle if drafter_kind(cfg) == "eagle" else train_medusa
    module, summary = fit(tc, lm, cache, tracker)
    summary.update({
        "positions": int(cache.labels.shape[0]),
        "held_out_positions": int(cache.held_out.sum()),
        "cache_seconds": cache_s,
        "data": str(cache_path) if cache_path else "not cached",
        "train_seconds": time.perf_counter() - t0 - cache_s,
        "trained_on": trained_on,
    })
    return module, summary


def train_medusa(tc: DictConfig, lm: LoadedModel, cache: Cache, tracker=None) -> tuple[MedusaHeads, dict]:
    """Medusa heads on random batches of `tc.batch` cached positions (cross-entropy on each head's label)."""
    lm_head = lm.model.get_output_embeddings()
    heads = MedusaHeads(cache.hidden.shape[1], tc.heads, tc.layers, tc.own_lm_head, lm_head.weight.shape[0])
    heads.init_lm_heads(lm_head)
    heads.to(lm.device)
    train_rows = (~cache.held_out & (cache.labels[:, 0] >= 0)).nonzero()[:, 0]
    gen = torch.Generator().manual_seed(tc.seed)

    def batch_loss(step: int) -> tuple[Tensor, Tensor]:
        r = train_rows[torch.randint(train_rows.numel(), (tc.batch,), generator=gen)]  # [B]
        logits = heads(cache.hidden[r].to(device=lm.device, dtype=torch.float32), lm_head).float()  # [K, B, V]
        lab = cache.labels[r].T.to(lm.device)  # [K, B]
        hits, counts = _hits(logits.argmax(-1, keepdim=True), lab)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), lab.flatten(), ignore_index=-100)
        return loss, hits[:, 0] / counts.clamp_min(1)

    steps = max(1, tc.epochs * train_rows.numel() // tc.batch)
    first_loss, last_loss = _optimise(heads, steps, batch_loss, tc, tracker, "medusa heads")
    held = accuracy(heads, lm_head, cache, cache.held_out) if bool(cache.held_out.any()) else None  # [K, RANKS]
    seen = torch.zeros_like(cache.held_out)  # as many training positions, to show the generalisation gap
    seen[train_rows[torch.randperm(train_rows.numel(), generator=gen)[: max(1, int(cache.held_out.sum()))]]] = True
    fit = accuracy(heads, lm_head, cache, seen)[:, 0].tolist()
    return heads, {
        "train_positions": int(train_rows.numel()),
        "steps": steps,
        "first_loss": first_loss,
        "last_loss": last_loss,
        **{f"held_out_acc_head{i + 1}": a for i, a in enumerate([] if held is None else held[:, 0].tolist())},
        **{f"held_out_top5_head{i + 1}": a for i, a in enumerate([] if held is None else held[:, :5].sum(-1).tolist())},
        **{f"train_acc_head{i + 1}": a for i, a in enumerate(fit)},
        "rank_acc": None if held is None else held.tolist(),  # [K][RANKS] held-out hit rate of each head's rank-r token
    }


def train_eagle(tc: DictConfig, lm: LoadedModel, cache: Cache, tracker=None) -> tuple[EagleHead, dict]:
    """An EAGLE head, one cached sequence (a prompt's continuation, or a text chunk) per step: from each
    pair (f_t, x_{t+1}) it predicts f_{t+1} (smooth L1) and, through the target's lm head, x_{t+2}
    (cross-entropy, weight EAGLE_CLS), as in the paper."""
    lm_head, embed = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
    head = EagleHead(lm.model.config).to(lm.device)
    ids, counts = torch.unique_consecutive(cache.seq, return_counts=True)
    spans = [(int(s), int(n)) for s, n in zip(counts.cumsum(0) - counts, counts) if n > 2]  # (start, length)
    train_spans = [sp for sp in spans if not bool(cache.held_out[sp[0]])]
    if not train_spans:
        raise SpecResearchError("drafter=eagle needs training sequences of 3 or more tokens: raise train.tokens or lower train.held_out")
    gen = torch.Generator().manual_seed(tc.seed)

    def predict(start: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """One sequence → (f̂_{t+1} [M, H], f_{t+1} [M, H], x_{t+2} [M]) at its M valid pairs."""
        f = cache.hidden[start : start + n].to(device=lm.device, dtype=torch.float32)  # [n, H]
        x = cache.tokens[start : start + n].to(lm.device)  # [n]: the token after each position
        valid = (x[:-1] >= 0) & (x[1:] >= 0)  # [n - 1]
        f_hat = head(embed(x[:-1].clamp_min(0))[None], f[:-1][None])[0]  # [n - 1, H]
        return f_hat[valid], f[1:][valid], x[1:][valid]

    def batch_loss(step: int) -> tuple[Tensor, Tensor]:
        f_hat, f_next, label = predict(*train_spans[int(torch.randint(len(train_spans), (1,), generator=gen))])
        logits = lm_head(f_hat.to(lm_head.weight.dtype)).float()  # [M, V]
        loss = nn.functional.smooth_l1_loss(f_hat, f_next) + EAGLE_CLS * nn.functional.cross_entropy(logits, label)
        return loss, (logits.argmax(-1) == label).float().mean()[None]

    def agreement(chosen: list[tuple[int, int]]) -> float:
        hits = total = 0
        with torch.inference_mode():
            for start, n in chosen:
                f_hat, _, label = predict(start, n)
                hits += int((lm_head(f_hat.to(lm_head.weight.dtype)).argmax(-1) == label).sum())
                total += label.numel()
        return hits / max(1, total)

    steps = max(1, tc.epochs * len(train_spans))
    first_loss, last_loss = _optimise(head, steps, batch_loss, tc, tracker, "eagle head", clip=EAGLE_CLIP)
    held_spans = [sp for sp in spans if bool(cache.held_out[sp[0]])]
    return head, {
        "train_positions": sum(n for _, n in train_spans),
        "steps": steps,
        "first_loss": first_loss,
        "last_loss": last_loss,
        **({"held_out_acc_head1": agreement(held_spans)} if held_spans else {}),
        "train_acc_head1": agreement(train_spans[: max(1, len(held_spans))]),
    }


def _optimise(module: nn.Module, steps: int, batch_loss, tc: DictConfig, tracker, desc: str, clip: float | None = None) -> tuple[float, float]:
    """AdamW with a one-cycle schedule over `steps` steps of `batch_loss(step) -> (loss, [K] accuracy)`,
    gradient norms clipped at `clip`, with a progress bar and MLflow curves; returns the first and the last loss."""
    opt = torch.optim.AdamW(module.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=tc.lr, total_steps=steps, pct_start=0.1)
    first_loss = last_loss = float("nan")
    bar = tqdm(range(steps), desc=desc, unit="step")
    for step in bar:
        loss, acc = batch_loss(step)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        sched.step()
        last_loss = loss.item()
        first_loss = last_loss if step == 0 else first_loss
        if step % tc.log_every == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{last_loss:.3f}", acc=" ".join(f"{a:.2f}" for a in acc.tolist()))
            if tracker is not None:
                tracker.log_metrics({"loss": last_loss, **{f"train_acc_head{i + 1}": float(a) for i, a in enumerate(acc)}}, step=step)
    return first_loss, last_loss


def drafter_kind(cfg: DictConfig) -> str:
    """"medusa" or "eagle": the drafter `cfg.drafter` configures, checked."""
    name = cfg.drafter.get("_target_", "").rsplit(".", 1)[-1]
    if name not in DRAFTERS:
        raise SpecResearchError(
            f"specresearch.train trains drafters {', '.join(DRAFTERS.values())}: use drafter={' or drafter='.join(DRAFTERS.values())} "
            f"(got {name or cfg.drafter})"
        )
    return DRAFTERS[name]


def check(cfg: DictConfig) -> None:
    drafter_kind(cfg)
    tc = cfg.train
    bad = sorted(set(tc.corpora) - set(TRAIN_SOURCES))
    if bad or not tc.corpora:
        evaluation = " (evaluation only: training never reads the prompts a run measures)" if set(bad) & set(DATASETS) else ""
        raise SpecResearchError(f"unknown train.corpora {bad}{evaluation}: valid are {', '.join(TRAIN_SOURCES)}")
    if tc.data not in DATA:
        raise SpecResearchError(f"unknown train.data '{tc.data}': valid are {', '.join(DATA)}")
    if min(tc.heads, tc.layers, tc.tokens, tc.new, tc.gen_batch, tc.seq_len, tc.batch, tc.epochs) < 1 or not 0 <= tc.held_out < 1 or tc.temperature < 0:
        raise SpecResearchError(
            "train.heads, layers, tokens, new, gen_batch, seq_len, batch and epochs must be >= 1, 0 <= train.held_out < 1, train.temperature >= 0"
        )


def run(cfg: DictConfig) -> dict:
    """Train, save the drafter where `drafter=medusa|eagle` looks (or train.out), track the run; return the summary."""
    check(cfg)
    kind = drafter_kind(cfg)
    lm = load_model(**cfg.model)
    default = checkpoint_path if kind == "medusa" else eagle_path
    out = Path(cfg.train.out) if cfg.train.out else default(lm.name, cfg.model.cache_dir)
    tracker = build(cfg.tracker)
    what = f"medusa x{cfg.train.heads}" if kind == "medusa" else "eagle"
    summary: dict = {}

    def report() -> tuple[dict[str, float], dict[str, str]]:
        if not summary:
            return {}, {}
        files = {"checkpoint.txt": f"{out}\ntraining data: {summary['data']}\n", "trained_on.json": json.dumps(summary["trained_on"], indent=1)}
        return {k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}, files

    with tracked_run(tracker, cfg, f"train {what} on {lm.name}", report) as tracking:
        module, trained = train(cfg, lm, tracking)
        module.save(out, {"target": lm.name, **{k: v for k, v in trained.items() if "acc" in k or "top5" in k or k in ("steps", "trained_on")}})
        summary.update(trained)
    acc = " ".join(f"{summary[k]:.3f}" for k in sorted(summary) if k.startswith("held_out_acc"))
    fit = " ".join(f"{summary[k]:.3f}" for k in sorted(summary) if k.startswith("train_acc"))
    verifier = "typical" if kind == "medusa" else "greedy"
    record = summary["trained_on"]
    log.info(
        f"{what} for {lm.name}: {summary['steps']} steps, loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}, "
        f"held-out top-1 agreement per head: {acc or 'n/a'} (on training positions: {fit})\n"
        f"training data {summary['cache_seconds']:.0f} s ({summary['positions']} positions; {summary['data']}), training {summary['train_seconds']:.0f} s\n"
        f"trained on {record['prompts']} prompts of {', '.join(record['sources'])} (their train side; ids sha256 {record['prompts_sha256'][:12]}, "
        f"all in {out.with_suffix('.json').name})\n"
        f"saved {out}; decode with: python -m specresearch drafter={kind} verifier={verifier}"
    )
    return summary


def main() -> None:
    cli("train", run, timed=False)


if __name__ == "__main__":
    main()
