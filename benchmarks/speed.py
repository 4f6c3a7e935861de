"""Speed side by side with transformers, in one process, on the same prompts.

Methods, each decoding a fixed number of new tokens (EOS ignored) after each prompt, greedily or, with
--temperature T, sampling from softmax(logits / T) (no top-k, no top-p):
  generate           transformers `generate`, plain greedy (the reference for every ratio)
  generate_torch     the same on torch's own nn.Linear (as transformers ships it), whatever --kernels says
  generate_compiled  the same with a static KV cache and torch.compile (inductor; compiled in the warm-up)
  hf_assisted        transformers assisted generation with the same draft model, its defaults
  hf_prompt_lookup   transformers prompt lookup (`prompt_lookup_num_tokens`)
  hf_universal       transformers Universal Assisted Generation: the --cross-draft model, whose tokenizer differs
                     (`assistant_tokenizer`); compare with our cross_vocab drafter, which drafts with the same model
  baseline           our engine with the `none` drafter
  baseline_compiled  the same with a static KV cache and the decoder compiled (model.cache=static, model.compile=true)
  <drafter>          our engine with each drafter of conf/drafter/ and a lossless verifier (greedy; at T > 0
                     rejection sampling); options after colons: independent:model.vocab=32768:model.quantize=int8,
                     a verifier of conf/verifier/ and its options too: medusa:verifier=typical:verifier.epsilon=0.05

The methods are interleaved prompt by prompt, in an order that rotates every run, after one
untimed warm-up each, so machine noise hits all alike. Tokens/s are total new tokens / total time;
the spread is over repeats (each repeat decodes every prompt once); a speedup's 95% interval is BCa's over
prompts (3 or more of them; fewer: none). One progress bar on stderr counts the decodes as they finish.
For our drafters the table also
has α, τ, the measured c and v and the Leviathan prediction, and a note each with its time split and the draft tokens
it verified a step (a tree's size). `vs_fastest` is each method's speedup
over the fastest plain decoding it ran beside (generate, generate_torch, generate_compiled, baseline or baseline_compiled): the honest
ratio when one of them beats the reference.

--batch 1,2,4,8,16 decodes the prompts B at a time for each batch size B (transformers left-padded,
our engine through its batch call): tokens/s and the speedup over the fastest plain decoding at each
B, and each speculative method's crossover, the first B where its speedup falls below 1. Assisted
generation takes one sequence: skipped at B > 1, with the reason in the table.

    python benchmarks/speed.py                                  # Qwen2.5-Coder 1.5B / 0.5B, bf16
    python benchmarks/speed.py --prompts 6 --tokens 96 --repeats 3 --k 4
    python benchmarks/speed.py --methods generate,baseline      # our baseline vs generate only
    python benchmarks/speed.py --methods generate,hf_assisted,baseline,independent,independent:model.vocab=32768:model.quantize=int8
    python benchmarks/speed.py --dtype float32 --profile        # and where the time goes, op by op
    python benchmarks/speed.py --dataset mtbench --prompts 8    # chat: one MT-bench question per category
    python benchmarks/speed.py --temperature 0.7 --methods generate,hf_assisted,baseline,medusa:verifier=typical,independent
    python benchmarks/speed.py --quick --tracker none           # tiny random models, seconds
    python benchmarks/speed.py --offset 100 --prompts 16 --batch 1,2,4,8,16 --methods generate,baseline,pld,independent
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import logging
import math
import platform
import re
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specresearch import reports
from specresearch.build import build
from specresearch.cli import fail
from specresearch.config import compose
from specresearch.config import options as config_options
from specresearch.data import MTBENCH_CATEGORIES, SHAREGPT_EVAL, Prompt, encode, load_prompts
from specresearch.drafters import NoDrafter
from specresearch.drafters.draft_model import OPTIONS as CHEAPER
from specresearch.drafters.draft_model import DraftModel, cheapen, split_spec
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError, report_problem
from specresearch.kv import cost_curve
from specresearch.metrics import SpecStats, first_divergence, predict
from specresearch.models import LoadedModel, cache_root, load_model
from specresearch.models.machine import cpu_kind
from specresearch.sweeps.lock import busy
from specresearch.tracking import MLflowTracker, NullTracker, browse_line, tracked_run
from specresearch.types import SamplingParams
from specresearch.verifiers import lossless

if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its file (the tests), not run: its sibling below
    sys.path.insert(1, str(Path(__file__).resolve().parent))
import speed_report  # noqa: E402  (benchmarks/speed_report.py: the record -> the docs' one results format)

DATASETS = {"humaneval": "HumanEval prompts", "mtbench": "MT-bench questions (first turn, chat template)",
            "sharegpt": "ShareGPT first turns (evaluation side, chat template)"}
HF_METHODS = ("generate", "generate_torch", "generate_compiled", "hf_assisted", "hf_prompt_lookup", "hf_universal")
CROSS = ("hf_universal", "cross_vocab")  # the methods that draft with --cross-draft (another tokenizer)
PLAIN = ("generate", "generate_torch", "generate_compiled", "baseline", "baseline_compiled")  # plain decoding, one token per target forward
OURS_PLAIN = ("baseline", "baseline_compiled")


@dataclass
class Run:
    tokens: list[list[int]]  # [B][n] new tokens of each prompt of the batch
    seconds: float  # the batch's wall time
    stats: SpecStats | None = None  # our engine's counters, summed over the rows; None for transformers


@dataclass
class Method:
    """One way to decode, and what it measured over all prompts and repeats."""

    name: str
    decode: Callable[[list[list[int]], int], Run]  # (a batch of prompts, new tokens) -> Run
    seconds: list[float] = field(default_factory=list)  # [R] total time of each repeat
    tokens: list[int] = field(default_factory=list)  # [R] new tokens of each repeat
    group_seconds: list[float] = field(default_factory=list)  # [G] each prompt's (group's) time, summed over repeats
    stats: SpecStats = field(default_factory=SpecStats)
    outputs: list[list[int]] = field(default_factory=list)  # first repeat's tokens, per prompt

    def fresh(self) -> Method:
        """The same decoding with nothing measured yet (one per batch size)."""
        return Method(self.name, self.decode)


def pad_id(lm: LoadedModel) -> int:
    """The pad token of left-padded batches: the model's, else its EOS (the first of several), else 0."""
    pad = lm.model.generation_config.pad_token_id
    if pad is None:
        pad = lm.model.generation_config.eos_token_id
    if isinstance(pad, (list, tuple)):
        pad = pad[0] if pad else None
    return 0 if pad is None else int(pad)


def hf(name: str, lm: LoadedModel, **generate_kwargs) -> Method:
    """A transformers `generate` call with extra arguments (assistant_model, prompt_lookup_num_tokens).
    A batch is left-padded to its longest prompt, with an attention mask that hides the padding."""

    def decode(batch: list[list[int]], n: int, **call_kwargs) -> Run:
        width = max(map(len, batch))
        pad = pad_id(lm)
        x = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=lm.device)  # [B, T]
        mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=lm.device)  # [B, T]
        t0 = time.perf_counter()
        with torch.inference_mode():
            # EOS ignored as our engine's eos_token_ids=[] does (no EOS ends it; min_new_tokens would mask EOS out
            # instead, and its processor, given to the assistant too, makes assisted generation warn)
            out = lm.model.generate(  # [B, T + n]
                x, attention_mask=mask, max_new_tokens=n, eos_token_id=[], pad_token_id=pad,
                **{"do_sample": False, **generate_kwargs}, **call_kwargs,
            )
        if lm.device.type == "cuda":
            torch.cuda.synchronize()
        return Run(out[:, width:].tolist(), time.perf_counter() - t0)

    return Method(name, decode)


def quiet_assistant_warning() -> None:
    """Drop the one warning transformers' assisted generation gives of itself: its candidate generator
    (transformers 5.24, `_prepare_generation_args`) calls `generate` with a generation_config and
    max/min_new_tokens together, which `generate` then calls deprecated. Nothing the caller passes
    avoids it; every other message of that logger still shows."""

    def keep(record) -> bool:
        return not record.getMessage().startswith("Passing `generation_config` together with generation-related")

    logger = logging.getLogger("transformers.generation.utils")
    if not any(getattr(f, "__name__", "") == keep.__name__ for f in logger.filters):
        logger.addFilter(keep)


def hf_torch_kernels(name: str, lm: LoadedModel, **generate_kwargs) -> Method:
    """transformers' `generate` on torch's own nn.Linear, as transformers ships it, whatever --kernels
    says (the layers' class is swapped back for the call: same weights)."""
    method = hf(name, lm, **generate_kwargs)
    plain = method.decode

    def decode(batch: list[list[int]], n: int) -> Run:
        kinds = {m: type(m) for m in lm.model.modules() if isinstance(m, torch.nn.Linear)}
        for module in kinds:
            module.__class__ = torch.nn.Linear  # (a PackedLinear keeps its layout for when it is one again)
        try:
            return plain(batch, n)
        finally:
            for module, kind in kinds.items():
                module.__class__ = kind

    method.decode = decode
    return method


def hf_compiled(name: str, lm: LoadedModel, cache_len: int, **generate_kwargs) -> Method:
    """transformers' `generate` at its fastest on this stack: a static KV cache of `cache_len` tokens (one
    size for every prompt, so one compilation) and the forward compiled by torch.compile (inductor),
    which transformers does by itself on GPUs and here on any device. The warm-up compiles it."""
    from transformers import CompileConfig, StaticCache

    config = CompileConfig(fullgraph=False, dynamic=False, mode="default")
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told so
    method = hf(name, lm, compile_config=config, **generate_kwargs)
    plain = method.decode

    def decode(batch: list[list[int]], n: int) -> Run:
        cache = StaticCache(config=lm.model.config, max_cache_len=cache_len)  # its batch size: the first forward's
        return plain(batch, n, cache=cache)

    method.decode = decode
    return method


def ours(name: str, engine: Engine) -> Method:
    """Our engine: one prompt through its one-sequence call, timed by the engine (as without --batch); a
    batch through its batch call (`engine.generate(prompts, n)`), timed by the clock around the call: the
    longest row's time once rows decode together, and still the batch's time while they decode in turn."""

    def decode(batch: list[list[int]], n: int) -> Run:
        if len(batch) == 1:
            out = engine.generate(batch[0], n, eos_token_ids=[])
            return Run([out.tokens], out.stats.time_total, out.stats)
        t0 = time.perf_counter()
        outs = engine.generate(batch, n, eos_token_ids=[])
        if engine.kv.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        stats = outs[0].stats
        for out in outs[1:]:
            stats = stats.merge(out.stats)
        return Run([out.tokens for out in outs], seconds, stats)

    return Method(name, decode)


def drafter_names() -> list[str]:
    return [name for name in config_options("drafter") if name != "none"]


def wanted_methods(spec: str) -> list[str]:
    """The names in --methods (all when empty), checked before any model loads."""
    valid = [*HF_METHODS, *OURS_PLAIN, *drafter_names()]
    wanted = [m.strip() for m in spec.split(",")] if spec else valid
    unknown = [m for m in wanted if m.split(":")[0] not in valid]
    if unknown:
        raise SpecResearchError(f"unknown method(s) {', '.join(unknown)}: valid are {', '.join(valid)}")
    return wanted


@dataclass
class Ours:
    """One of our drafters as --methods names it ("medusa:shape=auto:verifier=typical"), composed."""

    group: str  # the drafter's group in conf/drafter/
    options: list[str]  # its options as given (with --k first where the drafter has a draft length), verifier ones included
    drafter: DictConfig  # the `drafter` node
    verifier: DictConfig  # the `verifier` node: the method's `verifier=` option, else greedy (rejection at T > 0)


def drafter_configs(args) -> dict[str, Ours]:
    """Each of our drafters in --methods ("independent:model.vocab=32768:model.quantize=int8"), composed
    from conf/ and checked by the settings schema (config.compose) before any model loads: drafter
    options as `drafter.<option>`; `verifier=NAME` and `verifier.<option>` pick and set its verifier
    (default: greedy, at --temperature > 0 rejection sampling, both lossless). Drafters with a draft
    length get --k first when it is given (lookahead's k is its n-gram size)."""
    found = {}
    for name in wanted_methods(args.methods):
        if name in (*HF_METHODS, *OURS_PLAIN):
            continue
        group, *options = name.split(":")
        if args.k is not None and "k" in compose([f"drafter={group}"]).drafter:
            options = [f"k={args.k}", *options]
        verifier = [o for o in options if o.startswith("verifier")]
        if not any(o.startswith("verifier=") for o in verifier):
            verifier = [f"verifier={lossless(args.temperature == 0).name}", *verifier]
        overrides = [f"drafter={group}", *(f"drafter.{o}" for o in options if not o.startswith("verifier")), *verifier]
        cfg = compose(overrides)
        try:  # a verifier that cannot decode at this temperature (greedy at T > 0), refused before any model loads
            build(cfg.verifier).check_sampling(SamplingParams(temperature=args.temperature))
        except SpecResearchError as err:
            raise SpecResearchError(f"{name} at --temperature {args.temperature:g}: {err}") from None
        found[name] = Ours(group, options, cfg.drafter, cfg.verifier)
    return found


def build_methods(args, target: LoadedModel, draft: Callable[[], LoadedModel], cache_len: int,
                  drafters: dict[str, Ours], cross: LoadedModel | None = None) -> list[Method]:
    """Every method asked for by --methods, sharing one target and one draft model (`draft()` loads it
    once, when the first method that drafts with it is built: none may; `cache_len`: the
    longest prompt plus the new tokens, generate_compiled's cache size; `drafters`: drafter_configs;
    `cross`: the --cross-draft model, for hf_universal). Every method samples at --temperature (0: greedy)."""
    sampling = SamplingParams(temperature=args.temperature)
    hf_sampling = {} if sampling.greedy else {"do_sample": True, "temperature": args.temperature, "top_k": 0, "top_p": 1.0}
    methods = []
    cheap: dict[tuple, DraftModel] = {}  # the draft made cheaper, by options
    for name in wanted_methods(args.methods):
        if name == "generate":
            methods.append(hf(name, target, **hf_sampling))
        elif name == "generate_torch":
            methods.append(hf_torch_kernels(name, target, **hf_sampling))
        elif name == "generate_compiled":
            methods.append(hf_compiled(name, target, cache_len, **hf_sampling))
        elif name == "hf_assisted":
            quiet_assistant_warning()
            methods.append(hf(name, target, assistant_model=draft().model, **hf_sampling))
        elif name == "hf_prompt_lookup":
            methods.append(hf(name, target, prompt_lookup_num_tokens=args.pld_tokens, **hf_sampling))
        elif name == "hf_universal":
            if not hasattr(cross.tokenizer, "convert_ids_to_tokens"):
                print(f"skipped {name}: transformers' universal assisted generation needs Hugging Face tokenizers "
                      "(--quick's tiny models have none)")
                continue
            quiet_assistant_warning()
            methods.append(hf(name, target, assistant_model=cross.model, tokenizer=target.tokenizer, assistant_tokenizer=cross.tokenizer,
                              **hf_sampling))
        elif name == "baseline":
            methods.append(ours(name, Engine(target, NoDrafter(), lossless(sampling.greedy), sampling)))
        elif name == "baseline_compiled":  # the same weights, its own static cache and compiled graphs
            compiled = dataclasses.replace(target, cache="static", compile=True, compiled=None)
            engine = Engine(compiled, NoDrafter(), lossless(sampling.greedy), sampling)
            engine.kv.reset(cache_len)  # slots for the longest prompt, made once: every prompt runs the warm-up's graphs
            methods.append(ours(name, engine))
        else:  # one of our drafters, with options: "independent:model.vocab=32768:model.quantize=int8"
            group, options, node = drafters[name].group, drafters[name].options, drafters[name].drafter
            extra = {}
            if group == "cross_vocab":  # the draft of another vocabulary, made as cheap as its options say by the drafter
                extra["model"] = cross_spec(args, node)
            elif "model" in node:  # drafters with a draft model share ours, made as cheap as their options say
                cheaper = {key: node.model[key] for key in CHEAPER if key in node.model}
                key = tuple(sorted(cheaper.items()))
                if key not in cheap:  # one int8 copy per set of options (about 1 GB each), not one per method
                    cheap[key] = cheapen(draft(), target, cache_dir=node.model.get("cache_dir"), **cheaper)
                shared = cheap[key]
                extra["model"] = DraftModel(shared.lm, shared.shortlist, shared.head)  # its own KV cache
            try:
                drafter = build(node, target=target, **extra)
            except SpecResearchError as err:
                if args.methods:  # asked for by name: a real error
                    raise
                print(f"skipped {group}: {err}")  # every method by default: e.g. medusa before its heads are trained
                continue
            label = f"{group}({drafter.size_label})" + "".join(f" {o}" for o in options if not o.startswith("k="))
            methods.append(ours(label, Engine(target, drafter, build(drafters[name].verifier), sampling)))
    return methods


def prompt_set(dataset: str, n: int, offset: int, why: str = "") -> list[Prompt]:
    """HumanEval's prompts from `offset` on; MT-bench's first turns (chat template; evaluation only, so
    no head was trained on them): ceil(n / 8) questions of each category after its first `offset`, category
    after category, the first `n` of them (8 prompts cover all 8 categories); or ShareGPT's first turns from
    `offset` on (the evaluation side, chat template: a chat set to choose settings on, MT-bench to report).
    An `offset` past the dataset's prompts, or more prompts than it has from `offset` on, is refused naming
    how many it has (never fewer than asked, silently); `why` says where `n` came from when not from --prompts."""
    every = load_prompts(dataset, SHAREGPT_EVAL if dataset == "sharegpt" else None)
    if dataset == "mtbench":
        size = max(sum(p.meta["category"] == c for p in every) for c in MTBENCH_CATEGORIES)
        what = f"at most {size} questions in an MT-bench category"
    else:
        size, what = len(every), f"{len(every)} {dataset} prompts"
    if offset >= size:
        raise SpecResearchError(f"--offset {offset} is past the prompts: there are {what} (--offset 0 to {size - 1})")
    chosen = (load_prompts("mtbench", per_category=-(-n // len(MTBENCH_CATEGORIES)), offset=offset)[:n] if dataset == "mtbench"
              else every[offset : offset + n])
    if len(chosen) < n:
        valid = f"batch sizes whose least common multiple is <= {len(chosen)}" if why else f"--prompts <= {len(chosen)}"
        raise SpecResearchError(f"--prompts {n}{why} with --offset {offset} asks for more prompts than {dataset} has: "
                                f"{len(chosen)} from --offset {offset} ({what}); valid are {valid}")
    return load_prompts(dataset, n, offset=offset) if dataset != "mtbench" else chosen


def cross_spec(args, node: DictConfig) -> dict:
    """The --cross-draft model's settings as drafter=cross_vocab loads it: its node's options (quantize,
    vocab), this run's dtype, device and kernels; --quick: a tiny model with byte pairs (models.PairTokenizer)."""
    spec = {**OmegaConf.to_container(node.model, resolve=True), "name": args.cross_draft, "dtype": args.dtype,
            "device": args.device, "kernels": args.kernels}
    if args.quick:
        spec["tiny"] = {"vocab_size": 320, "seed": 0, "noise": 0.03, "noise_seed": 5, "tokenizer": "pairs"}
    return spec


def load(args, texts: list[Prompt]) -> tuple[LoadedModel, Callable[[], LoadedModel], list[list[int]]]:
    """CachedLM, the draft's loader (it loads on its first call, once) and the token ids of `texts`: the
    embedded Qwen pair, or tiny random models (--quick)."""
    if args.quick:
        target = load_model("tiny", device=args.device, kernels=args.kernels, tiny={"vocab_size": 320, "seed": 0})
        draft = functools.cache(lambda: load_model("tiny", device=args.device, kernels=args.kernels,
                                                   tiny={"vocab_size": 320, "seed": 0, "noise": 0.03, "noise_seed": 5}))
    else:
        target = load_model(args.model, dtype=args.dtype, device=args.device, kernels=args.kernels)
        draft = functools.cache(lambda: load_model(args.draft, dtype=args.dtype, device=args.device, kernels=args.kernels))
    prompts = [encode(target.tokenizer, p) for p in texts]
    if args.quick:
        prompts = [ids[-48:] for ids in prompts]
    return target, draft, prompts


def measure(methods: list[Method], groups: list[list[list[int]]], n: int, repeats: int, label: str = "prompt",
            warm: bool = False, desc: str = "decoding") -> None:
    """Decode every group of prompts (one batch each) with every method, `repeats` times, rotating who
    goes first from group to group, after one untimed warm-up each on the first group (unless `warm`).
    A progress bar `desc` on stderr counts the timed decodes (methods x groups x repeats) as each finishes,
    the method decoding in its postfix (a warm-up's too, uncounted); it is closed when this returns. The
    line per group and repeat goes to stdout as before, printed through the bar so neither garbles the other."""
    with tqdm(total=len(methods) * len(groups) * repeats, desc=desc, unit="decode", file=sys.stderr) as bar:
        for m in [] if warm else methods:  # warm-up: one-off costs (allocator, kernels, lazy init) stay out of the timings
            bar.set_postfix(method=f"{m.name} (warm-up)")
            m.decode(groups[0], min(8, n))
        _measure_repeats(methods, groups, n, repeats, label, bar)


def _measure_repeats(methods: list[Method], groups: list[list[list[int]]], n: int, repeats: int, label: str, bar: tqdm) -> None:
    """measure's timed decodes, each counted on `bar` when it finishes."""
    turn = 0
    for r in range(repeats):
        for m in methods:
            m.seconds.append(0.0)
            m.tokens.append(0)
        for i, group in enumerate(groups):
            took = {}
            for m in methods[turn % len(methods) :] + methods[: turn % len(methods)]:
                bar.set_postfix(method=m.name)
                run = m.decode(group, n)
                bar.update()
                took[m.name] = run.seconds
                m.seconds[r] += run.seconds
                if r == 0:
                    m.group_seconds.append(0.0)
                m.group_seconds[i] += run.seconds
                m.tokens[r] += sum(map(len, run.tokens))
                if run.stats is not None:
                    m.stats = m.stats.merge(run.stats)
                if r == 0:
                    m.outputs.extend(run.tokens)
            turn += 1
            seconds = ", ".join(f"{name} {t:.1f}s" for name, t in took.items())
            bar.write(f"repeat {r + 1}/{repeats}, {label} {i + 1}/{len(groups)}: {seconds}", file=sys.stdout)
            sys.stdout.flush()


ONE_SEQUENCE = {  # methods transformers refuses to batch, and why
    "hf_assisted": "transformers' assisted generation takes one sequence (batch_size = 1)",
    "hf_prompt_lookup": "transformers' prompt lookup is assisted generation: one sequence (batch_size = 1)",
    "hf_universal": "transformers' universal assisted generation is assisted generation: one sequence (batch_size = 1)",
    "baseline_compiled": "our static cache (model.cache=static) decodes one sequence at a time",
}


@dataclass
class BatchSize:
    """What one batch size measured: each method that could batch, and why the others could not."""

    batch: int
    methods: list[Method]
    skipped: dict[str, str]  # method -> why it did not run at this batch size


def warm_batchable(methods: list[Method], group: list[list[int]], n: int) -> tuple[list[Method], dict[str, str]]:
    """Warm every method up on `group` (one batch, `n` new tokens, untimed) and return those that decoded
    it (fresh, nothing measured yet) and the reason of each that cannot: transformers' assisted generation
    refuses batches (and our static cache); any other of transformers' methods that fails on a batch (generate_compiled, say) is
    skipped with its error's first line. Ours must batch: an error of theirs is raised."""
    keep, skipped = [], {}
    for m in methods:
        if len(group) > 1 and m.name in ONE_SEQUENCE:
            skipped[m.name] = ONE_SEQUENCE[m.name]
            continue
        try:
            m.decode(group, n)
        except Exception as err:  # noqa: BLE001 - transformers' refusal, whatever its class: noted, not fatal
            if len(group) == 1 or m.name not in HF_METHODS:
                raise
            first = str(err).splitlines()[0] if str(err) else ""
            skipped[m.name] = f"transformers failed on a batch: {type(err).__name__}" + (f": {first}" if first else "")
            continue
        keep.append(m.fresh())
    return keep, skipped


def measure_batches(methods: list[Method], prompts: list[list[int]], n: int, repeats: int, sizes: list[int]) -> list[BatchSize]:
    """For each batch size B of `sizes`, every prompt in groups of B (in order; B divides their number),
    every method that can batch, interleaved group by group as `measure` does."""
    done = []
    for b in sizes:
        groups = [prompts[i : i + b] for i in range(0, len(prompts), b)]
        at_b, skipped = warm_batchable(methods, groups[0], min(8, n))
        for name, why in skipped.items():
            print(f"batch size {b}: skipped {name}: {why}", flush=True)
        measure(at_b, groups, n, repeats, label=f"batch size {b}, batch", warm=True, desc=f"decoding at batch size {b}")
        done.append(BatchSize(b, at_b, skipped))
    return done


def verify_costs(target: LoadedModel, ids: list[int], k_max: int, repeats: int = 5) -> list[float]:
    """v(k) for k = 0..k_max: seconds of a target forward of k + 1 tokens after `ids` / one token's
    (the fastest of `repeats`, as noise only adds): what the Leviathan-optimal k is chosen with."""
    return cost_curve(target, ids, list(range(1, k_max + 2)), repeats)


OP_GROUPS = {  # --profile: aten op names (fragments) -> where the time goes
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::mv", "aten::addmv",
               "mkldnn::_linear_pointwise", "quantized::linear"),  # PackedLinear's oneDNN product, AMX's one-row torch.mv
    "attention": ("scaled_dot_product", "flash_attention"),
    "cat (KV cache, RoPE)": ("aten::cat",),
    "sampling": ("softmax", "argmax", "multinomial", "topk", "sort", "cumsum"),
}


def profile(methods: list[Method], ids: list[int], n: int) -> dict[str, dict[str, float]]:
    """Decode one prompt with each method under torch's profiler; split its wall time into the
    self CPU time of the op groups above, other ops, and the rest: Python (ours or transformers')."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    out = {}
    for m in methods:
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            m.decode([ids], n)
            wall = time.perf_counter() - t0
        groups = dict.fromkeys([*OP_GROUPS, "other ops"], 0.0)
        for event in prof.key_averages():
            group = next((g for g, keys in OP_GROUPS.items() if any(k in event.key for k in keys)), "other ops")
            groups[group] += event.self_cpu_time_total / 1e6
        groups["python"] = wall - sum(groups.values())
        out[m.name] = {"seconds": wall, **{g: t / wall for g, t in groups.items()}}
    return out


def profile_table(prof: dict[str, dict[str, float]]) -> str:
    groups = [g for g in next(iter(prof.values())) if g != "seconds"]
    w = max(len(name) for name in [*prof, "profile (one prompt)"]) + 2
    lines = [f"{'profile (one prompt)':<{w}}{'s':>7}" + "".join(f"{g:>{max(len(g), 6) + 2}}" for g in groups)]
    for name, row in prof.items():
        lines.append(f"{name:<{w}}{row['seconds']:>7.1f}" + "".join(f"{row[g]:>{max(len(g), 6) + 2}.0%}" for g in groups))
    return "\n".join(lines)


INTERVAL = 0.95  # the BCa bootstrap interval of every speedup over prompts
INTERVAL_METHOD = "BCa"  # the record says so: its results page names it (records before it: percentile bootstrap)
BOOTSTRAP_DRAWS = 10_000
MIN_INTERVAL_PROMPTS = 3  # with 2 prompts a draw is one of 3 mixes of them: no interval worth the name


def _ratio_of_sums(ref, own, axis=-1):
    """The speedup of a draw of prompts: the reference's summed time over the method's (scipy passes [..., G])."""
    return ref.sum(axis) / own.sum(axis)


def speedup_interval(reference: Method, m: Method) -> tuple[list[float] | None, str | None]:
    """The INTERVAL BCa bootstrap interval over prompts of `m`'s speedup over `reference` (the ratio of their
    total times on the same prompts, every method decoding the same new tokens), and a note when it is not one.

    scipy.stats.bootstrap, paired (a draw resamples prompts, both methods' times of each), the statistic the
    ratio of summed times, BOOTSTRAP_DRAWS draws, seeded (the same numbers every time). With fewer than
    MIN_INTERVAL_PROMPTS prompts: None, and a note saying it is not computed. A degenerate sample (the same
    speedup on every prompt: BCa's interval is NaN) keeps the point value as both ends, and a note says so;
    `m` against itself is [1, 1] without one.

    Returns:
        ([low, high] or None, the note or None).
    """
    import numpy as np
    from scipy import stats

    ref, own = np.asarray(reference.group_seconds), np.asarray(m.group_seconds)  # [G] each prompt's time
    if len(ref) < MIN_INTERVAL_PROMPTS or len(ref) != len(own):
        return None, (f"speedup intervals not computed: {len(ref)} prompt(s), a {INTERVAL:.0%} {INTERVAL_METHOD} interval "
                      f"over prompts needs >= {MIN_INTERVAL_PROMPTS}")
    if m is reference:
        return [1.0, 1.0], None
    point = float(_ratio_of_sums(ref, own))
    with warnings.catch_warnings():  # a degenerate sample: scipy warns and gives NaN, said below in the note instead
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        found = stats.bootstrap((ref, own), _ratio_of_sums, paired=True, vectorized=True, n_resamples=BOOTSTRAP_DRAWS,
                                confidence_level=INTERVAL, method=INTERVAL_METHOD,
                                random_state=np.random.default_rng(0)).confidence_interval  # random_state: scipy >= 1.11
    if not (np.isfinite(found.low) and np.isfinite(found.high)):
        return [point, point], (f"{m.name} over {reference.name}: no {INTERVAL_METHOD} interval (a degenerate sample, the same "
                                f"speedup on every prompt): the point value {point:.2f}x is shown as its interval")
    return [float(found.low), float(found.high)], None


def summarize(methods: list[Method], v_curve: list[float] | None = None, sampled: bool = False) -> list[dict]:
    """One row per method: tokens/s (mean and spread over repeats), ratios with their BCa interval over
    prompts (`speedup_interval`; `interval_notes` says where there is none or it is only the point value),
    α, τ, c, v, Leviathan, and the Leviathan-optimal k (from `v_curve`, the measured v(k), when given);
    the prompts decoded identically to the reference unless `sampled` (then None: sampled continuations
    differ by chance)."""
    by_name = {m.name: m for m in methods}
    reference = by_name.get("generate", methods[0])
    baseline = by_name.get("baseline")
    plain = [m for m in methods if m.name in PLAIN]
    fastest = min(plain, key=lambda m: sum(m.seconds) / sum(m.tokens)) if plain else None
    rows = []
    for m in methods:
        per_repeat = [t / s for t, s in zip(m.tokens, m.seconds)]
        ratios = [rs / s for rs, s in zip(reference.seconds, m.seconds)]  # time ratio vs the reference, per repeat
        interval, note = speedup_interval(reference, m)
        notes = [note]
        row = {
            "method": m.name,
            "tokens_per_s": sum(m.tokens) / sum(m.seconds),
            "tokens_per_s_std": statistics.stdev(per_repeat) if len(per_repeat) > 1 else 0.0,
            f"speedup_vs_{reference.name}": sum(reference.seconds) / sum(m.seconds),
            "speedup_interval": interval,
            "speedup_min": min(ratios),
            "speedup_max": max(ratios),
            "identical_to_reference": None if sampled else sum(first_divergence(a, b) is None
                                                               for a, b in zip(m.outputs, reference.outputs)),
        }
        if baseline is not None:
            row["speedup_vs_baseline"] = sum(baseline.seconds) / sum(m.seconds)
            row["speedup_vs_baseline_interval"], note = speedup_interval(baseline, m)
            notes.append(note)
        row["interval_notes"] = [n for n in dict.fromkeys(notes) if n]  # none, not computed, or only the point value
        if fastest is not None:  # the fastest plain decoding measured: tokens/s over its tokens/s
            row["fastest_plain"] = fastest.name
            row["speedup_vs_fastest_plain"] = (sum(m.tokens) / sum(m.seconds)) / (sum(fastest.tokens) / sum(fastest.seconds))
        if m.stats.drafted:
            k = len(m.stats.drafted_at)
            pred = predict(baseline.stats if baseline is not None else None, m.stats, k, v_curve=v_curve)
            row.update(
                alpha=m.stats.alpha, tau=m.stats.tau, k=k, c=pred.c, v=pred.v, nodes_per_step=m.stats.nodes_per_step,
                leviathan=pred.speedup,
                leviathan_optimal_k=pred.best_k,
                leviathan_optimal=pred.best_speedup,
                time_split={
                    name: getattr(m.stats, f"time_{name}") / m.stats.time_total
                    for name in SpecStats.TIME_SPLIT
                },
            )
        rows.append(row)
    return rows


def table(rows: list[dict], header: str) -> str:
    ref = speed_report.reference_key(rows[0]) or "speedup_vs_reference"  # none in the rows: a column of "-"
    w = max(len(r["method"]) for r in rows) + 2
    lines = [
        header,
        f"{'method':<{w}}{'tok/s':>8}{'±':>6}{ref.replace('speedup_', ''):>14}{f'({INTERVAL:.0%} {INTERVAL_METHOD})':>13}"
        f"{'vs_baseline':>12}{'vs_fastest':>11}"
        f"{'alpha':>7}{'tau':>6}{'c':>7}{'v':>7}{'Leviathan':>10}{'identical':>10}",
    ]
    for r in rows:
        def f(key, fmt, unit=""):
            return "-" if key not in r else "n/a" if r[key] != r[key] else format(r[key], fmt) + unit  # NaN: not applicable

        lines.append(
            f"{r['method']:<{w}}{r['tokens_per_s']:>8.2f}{r['tokens_per_s_std']:>6.2f}{f(ref, '.2f', 'x'):>14}"
            + (f"{r['speedup_interval'][0]:>7.2f}-{r['speedup_interval'][1]:<5.2f}" if r.get("speedup_interval") else f"{'-':>13}")
            + f"{f('speedup_vs_baseline', '.2f', 'x'):>12}"
            f"{f('speedup_vs_fastest_plain', '.2f', 'x'):>11}"
            f"{f('alpha', '.3f'):>7}{f('tau', '.2f'):>6}{f('c', '.3f'):>7}{f('v', '.2f'):>7}{f('leviathan', '.2f', 'x'):>10}"
            f"{'-' if r['identical_to_reference'] is None else r['identical_to_reference']:>10}"
        )
    lines += list(dict.fromkeys(note for r in rows for note in r.get("interval_notes", [])))
    if "fastest_plain" in rows[0]:
        lines.append(f"vs_fastest: over the fastest plain decoding measured ({rows[0]['fastest_plain']}; plain: {', '.join(PLAIN)})")
    for r in rows:
        if "time_split" in r:
            lines.append(
                speed_report.time_split_note(r)
                + (f"; Leviathan-optimal k {r['leviathan_optimal_k']} (predicted {r['leviathan_optimal']:.2f}x over our baseline)"
                   if r["leviathan_optimal_k"] else "")
            )
    return "\n".join(lines)


def metrics(rows: list[dict]) -> dict[str, float]:
    """Every number of every row as an MLflow metric `<method>.<key>` (names made MLflow-safe)."""
    out = {}
    for r in rows:
        for key, value in r.items():
            if key.endswith("_interval") and isinstance(value, list):  # [low, high] -> NAME_low, NAME_high
                value = {f"{key}_low": value[0], f"{key}_high": value[1]}
            for name, number in (value if isinstance(value, dict) and key.endswith("_interval") else {key: value}).items():
                if isinstance(number, (int, float)) and number == number:  # drop NaN
                    out[re.sub(r"[^\w./ -]", "_", f"{r['method']}.{name}")] = number
    return out


BATCH_KEYS = ("method", "tokens_per_s", "tokens_per_s_std", "fastest_plain", "speedup_vs_fastest_plain", "speedup_vs_baseline",
              "identical_to_reference", "alpha", "tau", "k")  # of summarize's row (c, v, Leviathan are one-sequence models)


def summarize_batches(done: list[BatchSize], sampled: bool = False) -> tuple[list[dict], dict[str, int | None]]:
    """Per batch size: its rows (summarize's tokens/s, speedups over the fastest plain decoding at that
    batch size and over our baseline, identity to the reference's tokens at that batch size, α, τ) and the
    methods it skipped; and the crossover of each speculative method: the smallest batch size where its
    speedup over the fastest plain decoding falls below 1, or None when it never does where it ran."""
    batches = []
    for size in done:
        rows = ([{"batch": size.batch, **{k: r[k] for k in BATCH_KEYS if k in r}} for r in summarize(size.methods, sampled=sampled)]
                if size.methods else [])
        reference = next((m for m in size.methods if m.name == "generate"), size.methods[0]) if size.methods else None
        batches.append({"batch": size.batch, "prompts": len(reference.outputs) if reference else 0,
                        "reference": reference.name if reference else None, "rows": rows, "skipped": size.skipped})
    crossover: dict[str, int | None] = {}
    for entry in batches:
        for r in entry["rows"]:
            if r["method"] in PLAIN or "speedup_vs_fastest_plain" not in r:
                continue
            crossover.setdefault(r["method"], None)
            if crossover[r["method"]] is None and r["speedup_vs_fastest_plain"] < 1:
                crossover[r["method"]] = entry["batch"]
    return batches, crossover


def batch_table(batches: list[dict], crossover: dict[str, int | None], header: str) -> str:
    """Methods down, batch sizes across: tokens/s and (speedup over the fastest plain decoding at that
    batch size); the crossover last; then which plain decoding was fastest, what was skipped and why,
    and outputs that differ from the reference's at the same batch size."""
    names = list(dict.fromkeys([r["method"] for e in batches for r in e["rows"]] + [m for e in batches for m in e["skipped"]]))
    w = max(len(n) for n in [*names, "fastest plain"]) + 2
    cw = 18
    sizes = [e["batch"] for e in batches]
    lines = [header, "tok/s (speedup over the fastest plain decoding at the same batch size); crossover: the first batch size "
             "where speculation stops paying (speedup < 1)",
             f"{'method':<{w}}" + "".join(f"{f'B={b}':>{cw}}" for b in sizes) + f"{'crossover':>{cw}}"]
    for name in names:
        cells = []
        for e in batches:
            r = next((r for r in e["rows"] if r["method"] == name), None)
            if r is None:
                cells.append("skipped" if name in e["skipped"] else "-")
            else:
                cells.append(f"{r['tokens_per_s']:.2f} ({r['speedup_vs_fastest_plain']:.2f}x)" if "speedup_vs_fastest_plain" in r
                             else f"{r['tokens_per_s']:.2f}")
        lines.append(f"{name:<{w}}" + "".join(f"{c:>{cw}}" for c in cells) + f"{crossover_text(name, crossover, batches):>{cw}}")
    fastest = [e["rows"][0].get("fastest_plain", "-") if e["rows"] else "-" for e in batches]
    lines.append(f"{'fastest plain':<{w}}" + "".join(f"{name:>{cw}}" for name in fastest))
    for note in batch_notes(batches):
        lines.append(note)
    return "\n".join(lines)


def crossover_text(name: str, crossover: dict[str, int | None], batches: list[dict]) -> str:
    """`B=4`, `none to B=16` (the largest batch size it ran at), or `-` for plain decoding."""
    if name not in crossover:
        return "-"
    if crossover[name] is not None:
        return f"B={crossover[name]}"
    ran = [e["batch"] for e in batches if any(r["method"] == name for r in e["rows"])]
    return f"none to B={max(ran)}"


def batch_notes(batches: list[dict]) -> list[str]:
    """What was skipped at which batch sizes (and why), and where outputs differ from the reference's."""
    notes = []
    why: dict[tuple[str, str], list[int]] = {}
    for e in batches:
        for name, reason in e["skipped"].items():
            why.setdefault((name, reason), []).append(e["batch"])
    for (name, reason), sizes in why.items():
        notes.append(f"skipped {name} at B={', '.join(map(str, sizes))}: {reason}")
    for e in batches:
        for r in e["rows"]:
            if r["identical_to_reference"] not in (None, e["prompts"]):  # None: sampled, not compared
                notes.append(f"B={e['batch']}: {r['method']} decoded {r['identical_to_reference']} of {e['prompts']} prompts "
                             f"token for token as {e['reference']} did at this batch size")
    return notes


def batch_metrics(batches: list[dict], crossover: dict[str, int | None]) -> dict[str, float]:
    """Every number of every batch row as an MLflow metric `b<B>.<method>.<key>`, and `<method>.crossover`."""
    out = {}
    for e in batches:
        out.update({f"b{e['batch']}.{k}": v for k, v in metrics(e["rows"]).items() if not k.endswith(".batch")})
    out.update({re.sub(r"[^\w./ -]", "_", f"{name}.crossover"): b for name, b in crossover.items() if b is not None})
    return out


class Parser(argparse.ArgumentParser):
    """argparse, refusing as every command of the package does: one `error:` line, exit 2 (cli.fail)."""

    def error(self, message: str) -> None:
        fail(message)


def at_least_zero(text: str) -> float:
    """An argparse type: a finite number >= 0 (--temperature)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (0 = greedy), got {text}")
    return value


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text}")
        return value

    return parse


def batch_sizes(text: str) -> list[int]:
    """An argparse type: comma-separated batch sizes, each an integer >= 1 ("1,2,4,8,16"), sorted, once each."""
    try:
        sizes = [int(t) for t in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers >= 1 (1,2,4,8,16), got {text}")
    return sorted(set(sizes))


def check_batches(prompts: int, sizes: list[int]) -> None:
    """Every batch size decodes the same prompts in whole batches: --prompts must be a multiple of each."""
    common = math.lcm(*sizes)
    if prompts % common:
        raise SpecResearchError(f"--prompts {prompts} is not a multiple of every --batch size ({', '.join(map(str, sizes))}): "
                                f"give a multiple of {common}")


def destinations(args) -> tuple[Path, MLflowTracker | NullTracker]:
    """Where the JSON report goes (--json, else benchmarks/results/speed-TIME.json) and the tracker,
    each checked before any model loads, as the model cache is: that folder, the MLflow store
    (--store) and the cache must be writable, else a SpecResearchError says which."""
    out = args.json or Path(__file__).parent / "results" / f"speed-{time.strftime('%Y%m%d-%H%M%S')}.json"
    problem = report_problem(out, "--json")
    if problem:
        raise SpecResearchError(problem)
    tracker = MLflowTracker(store=args.store, experiment="benchmarks") if args.tracker == "mlflow" else NullTracker()
    tracker.check_reachable()
    cache_root()  # dequantized models, a cheaper draft's token counts
    return out, tracker


def parse_args() -> argparse.Namespace:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="target (a zoo name, HF dir or .gguf)")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b", help="draft model for hf_assisted and our drafters")
    parser.add_argument("--cross-draft", default="smollm2-135m",
                        help="draft model of another tokenizer, for hf_universal and our cross_vocab (e.g. gemma-3-270m)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--kernels", choices=["auto", "packed", "skinny", "torch"], default="auto",
        help="model.kernels for every method alike (auto: CPU linears on weights oneDNN laid out once, PackedLinear); "
             "transformers' methods run nn.Linear whatever it says",
    )
    parser.add_argument("--dataset", choices=DATASETS, default="humaneval", help="; ".join(f"{k}: {v}" for k, v in DATASETS.items()))
    parser.add_argument("--prompts", type=at_least(1), default=4, help="prompts of the dataset")
    parser.add_argument("--offset", type=at_least(0), default=0,
                        help="HumanEval: the first prompt; MT-bench: the first question of each category")
    parser.add_argument("--tokens", type=at_least(1), default=64, help="new tokens per prompt (EOS ignored)")
    parser.add_argument("--repeats", type=at_least(1), default=2, help="times every prompt is decoded by every method")
    parser.add_argument("--k", type=at_least(1), default=None,
                        help="draft tokens per step of our drafters (default: each drafter's own, as conf/drafter/ says)")
    parser.add_argument("--temperature", type=at_least_zero, default=0.0,
                        help="0: greedy (default); T > 0: every method samples from softmax(logits / T), no top-k or top-p; "
                             "our drafters verify with rejection sampling unless a method says verifier=NAME")
    parser.add_argument("--pld-tokens", type=at_least(1), default=10, help="transformers' prompt_lookup_num_tokens")
    parser.add_argument(
        "--methods", default="",
        help=f"comma-separated (default: all of {', '.join(HF_METHODS)}, baseline, our drafters); drafter options after colons",
    )
    parser.add_argument(
        "--batch", type=batch_sizes, default=None,
        help="batch sizes (1,2,4,8,16): the prompts B at a time, each method batched; a table of tokens/s and speedup per batch size "
             "and each method's crossover. --prompts must be a multiple of each",
    )
    parser.add_argument("--profile", action="store_true", help="then decode the first prompt once more per method under torch's profiler")
    parser.add_argument("--quick", action="store_true",
                        help="tiny random models, 2 prompts (with --batch: the least common multiple of the batch sizes) "
                             "x 16 tokens: checks the script runs")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here (default: benchmarks/results/speed-TIME.json)")
    parser.add_argument("--tracker", choices=["mlflow", "none"], default="mlflow")
    parser.add_argument("--store", default="mlruns", help="MLflow store folder")
    args = parser.parse_args()
    if args.quick:
        args.prompts, args.tokens, args.repeats = min(args.prompts, 2), min(args.tokens, 16), min(args.repeats, 2)
        args.model, args.draft = "tiny", "tiny"
        args.cross_draft = "tiny"
        if args.batch:
            args.prompts = math.lcm(*args.batch)
    return args


def main() -> None:
    """Parse the arguments, run the benchmark; a refused setting is one `error:` line and exit 2."""
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # the package's messages, as the CLI shows them
    try:
        run(args)
    except SpecResearchError as err:
        fail(str(err))


def report_args(args) -> dict:
    """The command line as the report records it (and the docs rebuild the command from): --batch as typed,
    paths relative to the working directory (a report names no folder of the machine that wrote it)."""
    paths = {key: None if vars(args)[key] is None else reports.shown_path(vars(args)[key], Path.cwd()) for key in ("json", "store")}
    return {**vars(args), **paths, "batch": ",".join(map(str, args.batch)) if args.batch else None}


def run(args) -> None:
    """Check every setting and destination, load, measure, report."""
    if args.batch:
        check_batches(args.prompts, args.batch)
    drafters = drafter_configs(args)
    lcm = f" (--quick with --batch {','.join(map(str, args.batch))}: their least common multiple)" if args.quick and args.batch else ""
    texts = prompt_set(args.dataset, args.prompts, args.offset, lcm)
    out, tracker = destinations(args)
    target, draft, prompts = load(args, texts)
    cross = None
    if "hf_universal" in wanted_methods(args.methods):
        cross = load_model(**split_spec(cross_spec(args, compose(["drafter=cross_vocab"]).drafter))[0])
    methods = build_methods(args, target, draft, max(map(len, prompts)) + args.tokens, drafters, cross)
    report: dict = {}
    done: list[BatchSize] = []

    def measured() -> tuple[dict[str, float], dict[str, str]]:
        """The finished report, or of a failed run the repeats done so far (with --batch: the batch sizes done)."""
        if report:
            rows = report.get("rows", []) + [{"method": f"{name}.profile", **row} for name, row in report["profile"].items()]
            found = metrics(rows) if rows else {}
            if "batches" in report:
                found.update(batch_metrics(report["batches"], report["crossover"]))
            return found, {"speed.json": json.dumps(report, indent=2)}
        if args.batch:
            return (batch_metrics(*summarize_batches(done, args.temperature > 0)) if done else {}), {}
        return (metrics(summarize(methods, sampled=args.temperature > 0)) if all(m.seconds and m.seconds[0] for m in methods) else {}), {}

    warning = busy()  # the lock of our own runs orders only them: say when something else is running
    if warning:
        print(f"warning: {warning}", flush=True)
    crossing = any(m.split(":")[0] in CROSS for m in wanted_methods(args.methods))
    cross_note = f", {args.cross_draft} (another tokenizer)" if crossing else ""
    with tracked_run(tracker, OmegaConf.create(report_args(args)), "speed", measured):
        header = (
            f"\n{args.model} <- {args.draft}{cross_note} ({target.dtype}, {target.device}, kernels {args.kernels}; "
            f"torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, {platform.machine()} {cpu_kind()}): "
            f"{len(prompts)} {DATASETS[args.dataset]} x {args.tokens} tokens x {args.repeats} repeats, "
            + ("greedy" if args.temperature == 0 else f"sampled at T = {args.temperature:g}")
        )
        if args.batch:
            done.extend(measure_batches(methods, prompts, args.tokens, args.repeats, args.batch))
            batches, crossover = summarize_batches(done, args.temperature > 0)
            prof = profile(methods, prompts[0], args.tokens) if args.profile else {}
            header += f", batch sizes {', '.join(map(str, args.batch))}"
            report.update(header=header.strip(), args=report_args(args), batches=batches, crossover=crossover, profile=prof,
                          date=time.strftime("%Y-%m-%d %H:%M"))
        else:
            measure(methods, [[ids] for ids in prompts], args.tokens, args.repeats)
            v_curve = verify_costs(target, prompts[0], max(args.k or 0, 8))
            rows = summarize(methods, v_curve, sampled=args.temperature > 0)
            prof = profile(methods, prompts[0], args.tokens) if args.profile else {}
            report.update(header=header.strip(), args=report_args(args), rows=rows, interval_method=INTERVAL_METHOD,
                          v_curve=v_curve, profile=prof, date=time.strftime("%Y-%m-%d %H:%M"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))  # the measurement first: a fault in its table below cannot lose it
        try:
            page = speed_report.report(report, out.stem)
        except Exception:
            print(f"error: making the results table failed; the measurement is kept in {out}, as speed.py's record",
                  file=sys.stderr, flush=True)
            raise
        out.write_text(json.dumps(page, indent=2))  # the docs' one results format, the record as its data
    if args.batch:
        print(batch_table(report["batches"], report["crossover"], header))
    else:
        print(table(rows, header))
        print("target forward of k+1 tokens / one token, k = 0, 1, ...: " + " ".join(f"{v:.2f}" for v in v_curve))
    if prof:
        print("\n" + profile_table(prof))
    print(f"\nwrote {out}")
    browse_line(tracker)


if __name__ == "__main__":
    main()
