"""`python -m specresearch.train drafter=medusa|eagle [model=...] [train.*=...]`: train Medusa heads
or an EAGLE head (any drafter class that implements drafters.training.Trainable) on the target's own
predictions, offline, on the CPU.

Self-distillation with the target frozen. Two kinds of training data (`train.data`):

- `self` (default; Medusa-2's self-distillation): the target continues offline prompts (functions of
  the standard library cut after their docstring, as HumanEval prompts are; ShareGPT first turns
  through the chat template), greedily and batched. Head i learns, from the hidden state that
  produced token t + 1, the target's own token t + 2 + i: the text the heads see at decode time is
  the target's own, so the labels are too.
- `text` (Medusa-1 on fixed text): the target reads offline text once (the same sources, whole: the
  standard library's files, ShareGPT first turns with the answers they got, about equal tokens of
  each corpus; `training_texts`), one forward per `seq_len` chunk; head i learns the target's top-1
  at t + 2 + i, given the text's tokens up to t + 1.

Training reads only the train side of specresearch.data's split (`train_side`): never HumanEval,
MT-bench, ShareGPT's evaluation prompts or the stdlib_doctest task's modules. The checkpoint's meta
records which prompts made the data (`trained_on`: sources, split, number, sha256 and ids), and a run
with the drafter refuses prompts among them.

The hidden states and labels are computed once and cached on disk (keyed by every setting they depend
on), so a second training with other optimiser settings starts at once; text data is kept in chunks,
so a run asking for more tokens of the same text computes only the ones it adds, and an interrupted
one resumes. The last `held_out` share of
the prompts (or text chunks) is held out for the reported accuracy. The heads land in the model cache,
keyed by the target, where `drafter=medusa` (or `eagle`) finds them; the run is tracked in MLflow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import sys
import time
from dataclasses import replace
from itertools import zip_longest
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_file
from torch import Tensor, nn
from tqdm import tqdm
from transformers import DynamicCache

from specresearch.build import build
from specresearch.config import CONF_DIR, options
from specresearch.data import DATASETS, SPLIT_RULE, TRAIN_SOURCES, Prompt, encode, encode_text, prompt_record, train_side
from specresearch.drafters.training import Cache, Trainable, rate_name, save_tensors
from specresearch.errors import SpecResearchError, write_problem
from specresearch.kv import CachedLM, decode_batch
from specresearch.models import LoadedModel, cache_root, default_cache_dir, load_model
from specresearch.tracking import tracked_run
from specresearch.types import SamplingParams
from specresearch.vocab import check_corpus

log = logging.getLogger(__name__)

DATA = ("self", "text")
CACHE_FORMAT = 5  # the data cache's fields and prompts (a change makes older caches unused; 3: the train/eval split;
                  # 4: prompts' positions; 5: data=text reads chat answers and mixes the corpora by tokens)
MAX_HEADS = 8  # labels kept per position in the data cache: any train.heads up to this reuses it
MAX_PROMPT = 320  # data=self skips longer prompts: one long prompt pads a whole batch to its length
SHARD = 16  # data=text: chunks per file of its disk cache (a larger train.tokens adds files, an interrupted run resumes)


def training_prompts(corpora: list[str], seed: int, files: bool = False) -> list[Prompt]:
    """The prompts training may read of `corpora` (specresearch.data.train_side: python-stdlib's
    functions, or with `files` its files; ShareGPT's training first turns, as chat), each shuffled,
    then interleaved so that every prefix of the list mixes the corpora; each names its corpus in
    `meta["corpus"]`."""
    return [p for group in zip_longest(*_pools(corpora, seed, files)) for p in group if p is not None]


def _pools(corpora: list[str], seed: int, files: bool) -> list[list[Prompt]]:
    """Per corpus, its training prompts (train_side), shuffled by `seed`, each naming its corpus."""
    pools = []
    for i, corpus in enumerate(corpora):
        pool = [replace(p, meta={**p.meta, "corpus": corpus}) for p in train_side(corpus, files)]
        random.Random(seed + i).shuffle(pool)
        pools.append(pool)
    return pools


def training_texts(tokenizer, corpora: list[str], seed: int, tokens: int) -> tuple[list[Prompt], list[list[int]]]:
    """The texts train.data=text reads, `tokens` tokens of them in all: each next text from the corpus
    read least so far (in tokens), so that every corpus gives about an equal share however long its
    texts are (a standard-library file is thousands of tokens, a chat exchange hundreds). A text is
    a python-stdlib file, or a ShareGPT first turn with the answer it got, through the chat template
    (data.encode_text). Returns the texts' prompts and token ids, in reading order."""
    pools = [iter(pool) for pool in _pools(corpora, seed, files=True)]
    read = [0] * len(pools)
    used, texts = [], []
    while sum(read) < tokens and pools:
        i = min(range(len(pools)), key=read.__getitem__)
        p = next(pools[i], None)
        if p is None:  # a corpus read whole: the others go on
            del pools[i], read[i]
            continue
        used.append(p)
        texts.append(encode_text(tokenizer, p))
        read[i] += len(texts[-1])
    return used, texts


@torch.inference_mode()
def generate_batch(lm: LoadedModel, prompts: list[list[int]], new: int, temperature: float = 0.0,
                   gen: torch.Generator | None = None, fed_hidden: bool = False) -> tuple[Tensor, Tensor]:
    """Continue `prompts` together (left-padded, one forward per token): greedily, or sampled at
    `temperature`.

    Returns:
        [B, new] the new tokens, and [B, new, H] the final-norm hidden state that produced each (with
        `fed_hidden`, [B, W - 1 + new, H]: first those of the W - 1 left-padded prompt columns before the last).
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
    tokens, hidden = decode_batch(lm, cache, ids, new, SamplingParams(temperature=temperature), gen, mask, positions, fed_hidden)
    return tokens.cpu(), hidden.cpu()


def self_cache(lm: LoadedModel, prompts: list[list[int]], tokens: int, new: int, heads: int, held_out: float,
               batch: int = 32, temperature: float = 0.0, seed: int = 0) -> Cache:
    """The target continues `prompts` (`new` tokens each, as many prompts as give `tokens` tokens;
    shorter prompts first within the batches, for less padding); keep per position the hidden state,
    the token after it, and the labels of every head: the target's own token t + 2 + i, up to its
    first EOS. A prompt's own positions come first (`prompt`: EAGLE attends to their features; no
    labels), then the generated ones (the first is the prompt's last token, which produced the first new
    token). Prompts come in order; the last `held_out` share of the prompts taken is held out."""
    prompts = prompts[: max(1, -(-tokens // new))]
    first_held = len(prompts) - max(1, round(held_out * len(prompts))) if held_out > 0 else len(prompts)
    eos = getattr(lm.tokenizer, "eos_token_id", None)
    gen = torch.Generator(device=lm.device).manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    parts: dict[int, tuple[Tensor, ...]] = {}  # prompt → ([n, H] hidden states, [n, K] labels, [n] tokens, [n] prompt)
    for s in tqdm(range(0, len(order), batch), desc="target continues the prompts", unit="batch"):
        rows = order[s : s + batch]
        out, h = generate_batch(lm, [prompts[i] for i in rows], new, temperature, gen, fed_hidden=True)  # [B, new], [B, W - 1 + new, H]
        width = h.shape[1] - new + 1
        for b, i in enumerate(rows):
            ends = (out[b] == eos).nonzero()
            last = int(ends[0]) if eos is not None and ends.numel() else new - 1  # the last token of the text
            p = len(prompts[i]) - 1  # the prompt's positions before its last
            lab = torch.full((p + last + 1, heads), -100, dtype=torch.long)
            for k in range(heads):
                lab[p : p + max(0, last - k), k] = out[b, 1 + k : last + 1]
            after = torch.cat([torch.tensor(prompts[i][1:], dtype=torch.long), out[b, : last + 1]])  # [p + last + 1]
            kept = h[b, width - 1 - p : width + last]  # [p + last + 1, H]
            parts[i] = (kept, lab, after, torch.arange(p + last + 1) < p)
    n = [parts[i][1].shape[0] for i in range(len(prompts))]
    return Cache(
        hidden=torch.cat([parts[i][0] for i in range(len(prompts))]),
        labels=torch.cat([parts[i][1] for i in range(len(prompts))]),
        held_out=torch.cat([torch.full((m,), i >= first_held) for i, m in enumerate(n)]),
        tokens=torch.cat([parts[i][2] for i in range(len(prompts))]),
        seq=torch.cat([torch.full((m,), i) for i, m in enumerate(n)]),
        prompt=torch.cat([parts[i][3] for i in range(len(prompts))]),
    )


@torch.inference_mode()
def text_cache(lm: LoadedModel, texts: list[list[int]], tokens: int, seq_len: int, heads: int, held_out: float,
               shards: Path | None = None, sources: list[int] | None = None) -> Cache:
    """Run the target over the first `tokens` tokens of `texts` (their token ids, one text after the
    other), in chunks of `seq_len`, and keep per position its hidden state and the top-1 labels of
    every head (the target's top-1 at t + 1 + i); no position is a prompt's (every one is labelled).
    The last `held_out` share of the chunks is held out. `sources`: each text's corpus (an index into
    train.corpora), kept per position in `Cache.source`.

    With `shards` (a folder), every SHARD whole chunks are saved there once computed, and read from
    there when they are: a chunk depends on neither `tokens` nor `held_out`, so a later call with
    more tokens computes only the chunks it adds, and an interrupted one goes on where it stopped."""
    ids = [t for text in texts for t in text][:tokens]
    chunks = [ids[i : i + seq_len] for i in range(0, len(ids) - heads - 1, seq_len)]
    if not chunks:
        raise SpecResearchError(f"train.tokens={tokens} gives no chunk of more than {heads + 1} tokens")
    target = CachedLM(lm)
    target.keep_hidden = True

    def run(group: list[list[int]]) -> dict[str, Tensor]:
        """The target over chunks: their positions' hidden states, labels and next tokens."""
        parts = []
        for chunk in group:
            target.reset()
            target.prefill_rows([torch.tensor(chunk[:0], dtype=torch.long)])  # one row, nothing cached yet
            logits = target.forward_rows([torch.tensor(chunk)], [None])[0]  # [T, V]
            top1 = logits.argmax(-1).cpu()  # [T]: top1[j] is the target's guess for token j + 1
            n = len(chunk)
            lab = torch.full((n, heads), -100, dtype=torch.long)
            for i in range(heads):
                lab[: max(0, n - 1 - i), i] = top1[1 + i :]
            parts.append((target.hidden.cpu(), lab, torch.tensor(chunk[1:] + [-100])))  # the text's next token
        hidden, labels, after = (torch.cat(column) for column in zip(*parts))
        return {"hidden": hidden, "labels": labels, "tokens": after}

    groups: list[dict[str, Tensor]] = []
    with tqdm(total=len(chunks), desc="target over the corpus", unit="chunk") as bar:
        for s in range(0, len(chunks), SHARD):
            group = chunks[s : s + SHARD]
            whole = len(group) == SHARD and all(len(c) == seq_len for c in group)
            path = shards / f"chunks-{s:08d}.safetensors" if shards is not None and whole else None
            if path is not None and path.is_file():
                groups.append(load_file(str(path)))
            else:
                groups.append(run(group))
                if path is not None:
                    save_tensors(groups[-1], path)
            bar.update(len(group))
    first_held = len(chunks) - max(1, round(held_out * len(chunks))) if held_out > 0 else len(chunks)
    chunk = torch.repeat_interleave(torch.arange(len(chunks)), torch.tensor([len(c) for c in chunks]))  # [N] each position's chunk
    source = None
    if sources is not None:  # [N] the corpus of the text each position was read from
        source = torch.repeat_interleave(torch.tensor(sources), torch.tensor([len(t) for t in texts]))[: len(chunk)]
    return Cache(hidden=torch.cat([g["hidden"] for g in groups]), labels=torch.cat([g["labels"] for g in groups]),
                 held_out=chunk >= first_held, tokens=torch.cat([g["tokens"] for g in groups]), seq=chunk,
                 prompt=torch.zeros(len(chunk), dtype=torch.bool), source=source)


def build_cache(lm: LoadedModel, tc: DictConfig, cache_dir: str | None = None) -> tuple[Cache, Path | None, dict]:
    """The training data as `tc` (cfg.train) asks, from the disk cache (<model cache>/distill/<target>/,
    shared by Medusa and EAGLE) when the same data was made before (`tc.cache`), else computed by the
    target and saved there: data=self as one file per request, data=text as a folder of chunks that a
    request for more tokens of the same text extends (text_cache). Returns it, its path, and the record
    of the prompts (or texts) it was made from (specresearch.data.prompt_record; data=self keeps it in
    the JSON beside its file)."""
    if tc.heads > MAX_HEADS:
        raise SpecResearchError(f"train.heads={tc.heads}: at most {MAX_HEADS}")
    keys = ("data", "corpora", "seed") + (("tokens", "held_out", "new", "temperature", "gen_batch") if tc.data == "self" else ("seq_len",))
    spec = {"format": CACHE_FORMAT, "split": SPLIT_RULE,
            **{k: OmegaConf.to_object(tc[k]) if OmegaConf.is_config(tc[k]) else tc[k] for k in keys}}
    if tc.data == "text":
        spec["labels"] = MAX_HEADS
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(cache_dir or default_cache_dir()) / "distill" / lm.name.replace("/", "--")
    path = (folder / f"data-{tc.data}-{digest}{'.safetensors' if tc.data == 'self' else ''}") if tc.cache else None
    corpora = list(tc.corpora)
    used: list[Prompt] = []  # the prompts (or texts) the data is made from, in order
    record = None  # what made data read from disk: the record saved beside it
    if tc.data == "self":
        want, prompts = max(1, -(-tc.tokens // tc.new)), []  # as many prompts as self_cache takes
        for p in training_prompts(corpora, tc.seed):
            ids = encode(lm.tokenizer, p)
            if len(ids) <= MAX_PROMPT:
                used.append(p)
                prompts.append(ids)
                if len(used) == want:
                    break
        if path is not None and path.is_file():
            print(f"specresearch: training data from {path}", file=sys.stderr)
            cache = Cache.load(path)
            record = json.loads(path.with_suffix(".json").read_text())["trained_on"]
        else:
            cache = self_cache(lm, prompts, tc.tokens, tc.new, MAX_HEADS, tc.held_out, tc.gen_batch, tc.temperature, tc.seed)
            if path is not None:
                cache.save(path)
                path.with_suffix(".json").write_text(json.dumps({**spec, "trained_on": prompt_record(corpora, used)}, indent=1))
        cache.source = torch.tensor([corpora.index(p.meta["corpus"]) for p in used])[cache.seq]  # seq: the prompt's index
    else:
        used, texts = training_texts(lm.tokenizer, corpora, tc.seed, tc.tokens)
        if path is not None and path.is_dir():
            print(f"specresearch: training data from {path} (the chunks computed before)", file=sys.stderr)
        cache = text_cache(lm, texts, tc.tokens, tc.seq_len, MAX_HEADS, tc.held_out, path, [corpora.index(p.meta["corpus"]) for p in used])
        if path is not None:
            (path / "spec.json").write_text(json.dumps(spec, indent=1))
    cache.labels = cache.labels[:, : tc.heads]
    return cache, path, record or prompt_record(corpora, used)


def train(cfg: DictConfig, lm: LoadedModel, tracker=None) -> tuple[nn.Module, dict]:
    """Train the drafter `cfg.drafter` names (its class's `fit`, drafters.training.Trainable: Medusa heads,
    an EAGLE head, ...) for `lm` as `cfg.train` says; return it and a summary (losses, held-out
    accuracies, times, and `trained_on`: the record of the prompts the data was made from,
    specresearch.data.prompt_record)."""
    tc = cfg.train
    torch.manual_seed(tc.seed)
    t0 = time.perf_counter()
    cache, cache_path, trained_on = build_cache(lm, tc, cfg.get("model", {}).get("cache_dir"))
    cache_s = time.perf_counter() - t0
    for p in lm.model.parameters():
        p.requires_grad_(False)  # the target (its lm head and embeddings too) is frozen
    module, summary = trainable(cfg).fit(tc, lm, cache, tracker)
    summary.update({
        "positions": int((~cache.prompt).sum()),  # generated (or read) positions: what the heads learn from
        "held_out_positions": int((cache.held_out & ~cache.prompt).sum()),
        "prompt_positions": int(cache.prompt.sum()),  # context only (EAGLE reads their features)
        "cache_seconds": cache_s,
        "data": str(cache_path) if cache_path else "not cached",
        "train_seconds": time.perf_counter() - t0 - cache_s,
        "trained_on": trained_on,
    })
    return module, summary


def trainable(cfg: DictConfig) -> type[Trainable]:
    """The drafter class `cfg.drafter._target_` names, if it implements Trainable (drafters.training)."""
    cls = _class(cfg.drafter.get("_target_", ""))
    if cls is None:
        names = [name for name in options("drafter")
                 if _class(OmegaConf.load(CONF_DIR / "drafter" / f"{name}.yaml").get("_target_")) is not None]
        got = cfg.drafter.get("_target_", "").rsplit(".", 1)[-1] or cfg.drafter
        raise SpecResearchError(f"specresearch.train trains drafters {', '.join(names)}: use drafter={' or drafter='.join(names)} "
                                f"(got {got})")
    return cls


def _class(path: str | None) -> type[Trainable] | None:
    """The class at the dotted `path` if it is a trainable drafter, else None."""
    try:
        cls = get_class(path)
    except Exception:  # no such class (or no path): not trainable
        return None
    return cls if isinstance(cls, Trainable) else None


def check_training(cfg: DictConfig) -> None:
    trainable(cfg)
    tc = cfg.train
    bad = sorted(set(tc.corpora) - set(TRAIN_SOURCES))
    if bad or not tc.corpora:
        evaluation = " (evaluation only: training never reads the prompts a run measures)" if set(bad) & set(DATASETS) else ""
        raise SpecResearchError(f"unknown train.corpora {bad}{evaluation}: valid are {', '.join(TRAIN_SOURCES)}")
    if tc.get("vocab") is not None and (not isinstance(tc.vocab, int) or tc.vocab < 1):
        raise SpecResearchError(f"train.vocab must be null or a number of tokens >= 1 (e.g. 32768), got {tc.vocab}")
    if tc.get("vocab") is not None:
        check_corpus(str(tc.vocab_corpus), "train.vocab_corpus")
    if tc.get("init") is not None and not Path(tc.init).is_file():
        raise SpecResearchError(f"train.init: no head at {tc.init} (a head.safetensors that specresearch.train saved)")
    if tc.get("init") is not None:  # its files now, not after the data is built (their shape is checked against the target then)
        from specresearch.drafters.checkpoints import check_checkpoint

        check_checkpoint("eagle", Path(tc.init), "train.init")  # train.init: eagle only
    if not (isinstance(tc.lr, (int, float)) and math.isfinite(tc.lr) and tc.lr > 0):
        raise SpecResearchError(f"train.lr must be a finite number > 0 (the peak learning rate, e.g. 1e-3), got {tc.lr!r}")
    if not (isinstance(tc.weight_decay, (int, float)) and math.isfinite(tc.weight_decay) and tc.weight_decay >= 0):
        raise SpecResearchError(f"train.weight_decay must be a finite number >= 0, got {tc.weight_decay!r}")
    if tc.data not in DATA:
        raise SpecResearchError(f"unknown train.data '{tc.data}': valid are {', '.join(DATA)}")
    if not 0 <= tc.get("soft", 0.0) <= 1:
        raise SpecResearchError(f"train.soft must lie in [0, 1] (the soft labels' share of the loss), got {tc.soft}")
    if min(tc.heads, tc.layers, tc.tokens, tc.new, tc.gen_batch, tc.seq_len, tc.batch, tc.epochs, tc.ttt) < 1 or not 0 <= tc.held_out < 1 \
            or tc.temperature < 0 or tc.noise < 0 or min(tc.token_loss, tc.feature_loss) < 0 or tc.token_loss + tc.feature_loss <= 0:
        raise SpecResearchError(
            "train.heads, layers, tokens, new, gen_batch, seq_len, batch, epochs and ttt must be >= 1, 0 <= train.held_out < 1, "
            "train.temperature >= 0, train.noise >= 0, train.token_loss >= 0 and train.feature_loss >= 0 (not both 0)"
        )


def check_out(out: Path) -> None:
    """Refuse, before a model loads, a `train.out` the weights could not be saved at: its folder
    cannot be made or written (a path under a regular file, a read-only or pseudo file system), or it
    is a folder itself."""
    problem = write_problem(out.parent) or (f"{out} is a folder" if out.is_dir() else None)
    if problem:
        raise SpecResearchError(f"cannot save the trained weights at {out} (train.out): {problem}")


def run(cfg: DictConfig) -> dict:
    """Train, save the drafter where `drafter=medusa|eagle` looks (or train.out), track the run; return the summary."""
    check_training(cfg)
    drafter = trainable(cfg)
    cache_root(cfg.model.cache_dir)  # the training data's cache, and the default checkpoint's
    out = Path(cfg.train.out) if cfg.train.out else None
    if out is not None:
        check_out(out)
    lm = load_model(**cfg.model)
    if out is None:  # named by the target's name, known once it loads
        out = drafter.default_checkpoint(lm.name, cfg.model.cache_dir)
        check_out(out)
    tracker = build(cfg.tracker)
    what = drafter.run_label(cfg.train)
    summary: dict = {}

    def report() -> tuple[dict[str, float], dict[str, str]]:
        if not summary:
            return {}, {}
        files = {"checkpoint.txt": f"{out}\ntraining data: {summary['data']}\n",
                 "trained_on.json": json.dumps(summary["trained_on"], indent=1)}
        return {k: float(v) for k, v in summary.items() if isinstance(v, (int, float))}, files

    with tracked_run(tracker, cfg, f"train {what} on {lm.name}", report) as tracking:
        module, trained = train(cfg, lm, tracking)
        kept = {k: v for k, v in trained.items() if "acc" in k or "top5" in k or k in ("steps", "trained_on")}
        module.save(out, {"target": lm.name, "train": OmegaConf.to_container(cfg.train, resolve=True), **kept})  # how to reproduce it
        summary.update(trained)
    acc, fit = rates(summary, "held_out"), rates(summary, "train")
    by_corpus = [f"{c} {rates(summary, 'held_out', c)}" for c in cfg.train.corpora if rate_name("held_out", 0, c) in summary]
    verifier = drafter.suggested_verifier
    record = summary["trained_on"]
    log.info(
        f"{what} for {lm.name}: {summary['steps']} steps, loss {summary['first_loss']:.3f} -> {summary['last_loss']:.3f}, "
        f"held-out top-1 agreement per head: {acc or 'n/a'}{' (' + '; '.join(by_corpus) + ')' if by_corpus else ''} "
        f"(on training positions: {fit})\n"
        f"training data {summary['cache_seconds']:.0f} s ({summary['positions']} positions; {summary['data']}), "
        f"training {summary['train_seconds']:.0f} s\n"
        f"trained on {record['prompts']} prompts of {', '.join(record['sources'])} (their train side; "
        f"ids sha256 {record['prompts_sha256'][:12]}, "
        f"all in {out.with_suffix('.json').name})\n"
        f"saved {out}; decode with: python -m specresearch drafter={drafter.name} verifier={verifier}"
    )
    return summary


def rates(summary: dict, kind: str, corpus: str | None = None) -> str:
    """The heads' top-1 agreements of `summary` on `kind` positions (drafters.training.rate_name), in head order."""
    found, i = [], 0
    while rate_name(kind, i, corpus) in summary:
        found.append(f"{summary[rate_name(kind, i, corpus)]:.3f}")
        i += 1
    return " ".join(found)
