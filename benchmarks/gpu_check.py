#!/usr/bin/env python3
"""A GPU check anyone can run: is every method right on CUDA, and how fast is each there?

(a) matrix: on the tiny random model, every drafter of conf/drafter/ x every verifier of conf/verifier/
    at T = 0, each checked token for token against plain decoding (the engine with the `none` drafter);
    each drafter with each lossless verifier at T = 1 (it runs and decodes every token); each drafter's
    other modes (`Drafter.modes`: trees, siblings, lookup, ...; T = 0 where the mode allows it); and the
    baseline against transformers' `generate`, which catches a transformers that ignores our KV cache.
(b) speed: random weights of the real shapes (Qwen2.5-Coder-1.5B target, 0.5B draft; bf16; speed does
    not depend on the values): transformers `generate` eager and with a static cache + torch.compile,
    our baseline eager (model.cache=dynamic) and compiled (model.cache=static, model.compile=true), and
    our engine with prompt lookup, untrained Medusa heads and an independent 0.5B draft, and prompt lookup
    and Medusa again on the compiled target, greedy, EOS ignored, interleaved after two warm-ups each. Per method: tokens/s,
    tau, and c and v from one more decode with the phases timed; beside them the target's v(k) curve and the draft's c, measured directly.

Everything goes into one JSON (--out), rewritten after each section: versions, device, settings and
every number. The exit status is 1 when a T = 0 cell differs from plain decoding or anything failed.
No network and no model weights are needed; the project's import path needs transformers >= 5.24
(models.check_transformers) and omegaconf (specresearch.settings), no Hydra: configs are read from
conf/ with PyYAML (`node`, `instantiate`).

    python benchmarks/gpu_check.py --out /tmp/gpu/gpu_check.json     # on a GPU machine: a few minutes (estimated)
    python benchmarks/gpu_check.py --dry --out /tmp/gpu_check.json    # the same code paths on the CPU, tiny shapes
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network on the GPU machines: fail fast, never wait on a timeout
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import yaml  # noqa: E402  (PyYAML: a dependency of transformers, so on every machine that can run the project)

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
if str(ROOT) not in sys.path:  # a checkout copied to a GPU machine runs without installing the package
    sys.path.insert(1, str(ROOT))

from specresearch import reports  # noqa: E402  (stdlib only)
from specresearch.metrics import first_divergence  # noqa: E402  (stdlib only; engine and drafters load in the sections)

# The tiny draft of drafters with a draft model (as the tests': the target's seed, perturbed).
TINY_DRAFT = ("model.name=tiny", "model.tiny={vocab_size: 320, seed: 0, noise: 0.03}")
PROMPTS = [  # token ids of the tiny model (bytes): a repeating one for the n-gram drafters, a short one, two of code
    [10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11], [200, 7, 91, 33],
    list(b"def add(a, b):\n    return a + b\n\ndef add(a, b):\n"), list(b"for i in range(10):\n    print(i)\n"),
]
# Qwen2.5-Coder's shapes as the project's model cache holds them (the GGUF conversion unties the embeddings).
VOCAB = 151936
SHAPES = {"1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
                   "num_key_value_heads": 2},
          "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
                   "num_key_value_heads": 2}}
DRY_SHAPES = {"1.5b": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                       "num_key_value_heads": 2},
              "0.5b": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                       "num_key_value_heads": 1}}
SPEED_DRAFTERS = ("pld", "medusa", "independent")  # our speculative methods timed on the real shapes
COMPILED_DRAFTERS = ("pld", "medusa", "independent")  # ... and timed again compiled (model.cache=static model.compile=true:
# the target, and a draft model too)
ONLY = ("generate", "generate_compiled", "baseline", "baseline_compiled", *SPEED_DRAFTERS,  # what --only takes (`short` names)
        *(f"{name}_compiled" for name in COMPILED_DRAFTERS))
DRY_COMPILED_DRAFTERS = ("pld",)  # --dry's: inductor takes ~30 s on the CPU for Medusa's tree graph (tests/kv/test_static.py
# compiles every drafter)
PROMPT = '''import heapq
from dataclasses import dataclass, field


@dataclass(order=True)
class Job:
    priority: int
    name: str = field(compare=False)
    retries: int = field(default=0, compare=False)


class Scheduler:
    def __init__(self, max_retries: int = 3):
        self.queue: list[Job] = []
        self.max_retries = max_retries
'''  # the speed prompt, as bytes: valid ids of any vocabulary; code, so prompt lookup finds n-grams to copy


# --- the registry, read without Hydra --------------------------------------------------------------


def options(group: str) -> list[str]:
    """The options of a config group: conf/GROUP/*.yaml (each group folder is the registry)."""
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def node(group: str, name: str, model: dict | None = None, overrides: Sequence[str] = ()) -> dict:
    """conf/GROUP/NAME.yaml as Hydra composes it: `key=value` overrides (dotted keys, YAML values) applied,
    then `${model.KEY}` filled from `model` (the target's node). Any other interpolation is refused, so
    a YAML this reader does not understand fails here, not silently (a test compares every option's node
    with Hydra's)."""
    raw = yaml.safe_load((CONF / group / f"{name}.yaml").read_text()) or {}
    for item in overrides:
        key, _, value = item.partition("=")
        *path, last = key.split(".")
        at = raw
        for part in path:
            at = at.setdefault(part, {})
        at[last] = yaml.safe_load(value)
    return _resolved(raw, model or {}, f"{group}/{name}.yaml")


def _resolved(value: Any, model: dict, where: str) -> Any:
    if isinstance(value, dict):
        return {k: _resolved(v, model, where) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolved(v, model, where) for v in value]
    if isinstance(value, str) and "${" in value:
        key = value.removeprefix("${model.").removesuffix("}")
        if value != f"${{model.{key}}}" or key not in model:
            raise ValueError(f"{where}: gpu_check reads ${{model.KEY}} interpolations only, got {value!r}")
        return model[key]
    return value


def target_class(cfg: dict) -> type:
    """The class a node's `_target_` names."""
    module, _, name = cfg["_target_"].rpartition(".")
    return getattr(importlib.import_module(module), name)


def instantiate(cfg: dict, **objects: Any) -> Any:
    """The object a node's `_target_` names, built with the node's settings and `objects` (a loaded model)."""
    return target_class(cfg)(**{**{k: v for k, v in cfg.items() if k != "_target_"}, **objects})


def untrained(name: str, lm, folder: Path) -> Path:
    """Untrained weights of the right shape for a drafter that loads trained ones (checkpoint=), for `lm`."""
    from specresearch.drafters.eagle import EagleHead
    from specresearch.drafters.medusa import MedusaHeads

    meta = {"target": lm.name, "trained_on": {"untrained": "random weights written by benchmarks/gpu_check.py"}}
    path = folder / f"{name}.safetensors"
    if name == "medusa":  # zero-initialised blocks: each head starts as the target's lm head
        MedusaHeads(lm.model.config.hidden_size, 3).save(path, meta)
    elif name == "eagle":
        EagleHead(lm.model.config).save(path, meta)
    else:
        raise NotImplementedError(f"gpu_check: no untrained weights for drafter={name}; add them to untrained()")
    return path


def make_drafter(name: str, target, model: dict, folder: Path, overrides: Sequence[str] = (), draft=None):
    """drafter=NAME for `target`, its node read from conf/ with `overrides`: a drafter with a draft model
    gets `draft` (a LoadedModel), else the tiny perturbed copy (TINY_DRAFT); one that loads trained
    weights gets untrained ones written to `folder`."""
    shipped = node("drafter", name, model)
    first, objects = [], {}
    if "model" in shipped:
        if draft is None:
            first += TINY_DRAFT
        else:
            objects["model"] = draft
    if "checkpoint" in shipped:
        first.append(f"checkpoint={untrained(name, target, folder)}")
    return instantiate(node("drafter", name, model, [*first, *overrides]), target=target, **objects)


# --- plumbing --------------------------------------------------------------------------------------


def one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0][:300] if lines else ''}"


def failure(err: BaseException, status: str = "error") -> dict:
    tail = traceback.format_exception(type(err), err, err.__traceback__)
    text = "".join(tail[-3:]).replace(f"{ROOT}/", "")  # the project's files by their path in the repository
    return {"status": status, "error": one_line(err), "traceback": text[-1500:]}


def clean(x: Any) -> Any:
    """JSON-safe: NaN and infinities -> null, tuples -> lists, torch/other objects -> str."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x if x is None or isinstance(x, (bool, int, str)) else str(x)


def gpu_check_to_table(data: dict) -> dict:
    """This script's record (`main`'s report) as the fields of a results report (specresearch.reports.of): its
    speed rows -> table (each method over generate, over the fastest plain decoding measured and over our
    baseline; c, v and the draft's seconds per step), device + versions -> machine, argv -> command, started ->
    date; the matrix's summary, v(k) and what failed as notes."""
    versions, device, sp = data.get("versions", {}), data.get("device", {}), data.get("speed") or {}
    rows = sp.get("rows", [])
    plain = [r for r in rows if r["method"] in ("generate", "generate_compiled", "baseline", "baseline_compiled")]
    fastest = max(plain, key=lambda r: r["tokens_per_s"], default=None)
    by_name = {r["method"]: r for r in rows}

    def ratio(r: dict, ref: dict | None) -> str:
        return f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ref else ""

    def fmt(v, spec: str) -> str:
        return "" if v is None else "n/a" if v != v else format(v, spec)

    table_rows = []
    for r in rows:
        split = r.get("time_split") or {}
        draft_per_step = r["v"] * split["draft"] / split["verify"] if r.get("c") is not None and split.get("verify") else None
        compiled = r.get("compiled", r["method"].endswith("_compiled"))  # (reports before the flag: by the name)
        base = by_name.get("baseline_compiled" if compiled else "baseline")
        table_rows.append([r["method"], f"{r['tokens_per_s']:.1f}", " ".join(f"{x:.0f}" for x in r.get("tokens_per_s_repeats", [])),
                           ratio(r, by_name.get("generate")), ratio(r, fastest), ratio(r, base), fmt(r.get("tau"), ".2f"),
                           fmt(r.get("c"), ".3f"), fmt(draft_per_step, ".3f"), fmt(r.get("v"), ".2f"),
                           ", ".join(f"{k} {v:.0%}" for k, v in split.items()),
                           " ".join(f"{s:.1f}" for s in r.get("warmup_seconds", [])), r.get("first_divergence_vs_generate")])
    columns = ["method", "tok/s", "tok/s per run", "vs generate", "vs fastest plain", "vs our baseline", "τ", "c",
               "draft / step", "v", "time split", "warm-up s", "first divergence vs generate"]
    notes = []
    if fastest is not None:
        notes.append(f"vs fastest plain: over {fastest['method']}, the fastest plain decoding measured; vs our baseline: "
                     "a compiled method over baseline_compiled, the others over baseline. c and v are against the same "
                     "baseline's one-token forward; draft / step: the draft's seconds per step over that forward "
                     "(v x draft / verify of the time split; Medusa's heads have no draft-model forward, so c is 0).")
    if sp.get("v_curve"):
        notes.append("Eager target forward of k + 1 tokens over one token, k = 0..16: " + " ".join(f"{v:.2f}" for v in sp["v_curve"])
                     + (f"; the 0.5B draft's forward over the target's: {sp['c_draft']:.3f}" if "c_draft" in sp else "")
                     + (f"; one target forward {sp['target_forward_ms']:.1f} ms" if "target_forward_ms" in sp else "") + ".")
    for method, f in sp.get("failed", {}).items():
        notes.append(f"{method}: {f.get('status', 'error')}: {f.get('error')}")
    m = data.get("matrix")
    if m and m.get("status") == "ok":
        s = m["summary"]
        notes.append(f"Matrix on {m.get('device', device.get('type'))} (tiny random model, fp32): "
                     f"T = 0 {s['t0_identical']}/{s['t0_cells']} drafter x verifier cells identical to plain decoding; "
                     f"T = 1 {s['t1_ok']}/{s['t1_runs']} ran; other modes {s['modes_ok']}/{s['modes']} passed, "
                     f"{s['modes_refused']} refused; our baseline == generate: {s['baseline_equals_generate']}.")
        for d, row in m.get("modes", {}).items():
            notes += [f"{d} x {v}: {c['status']}: {c.get('error')}" for v, c in row.items() if c.get("status") not in ("ok", None)]
    elif m:
        notes.append(f"Matrix: {m.get('status')}: {m.get('error')}")
    machine = (f"{device.get('name', device.get('type', '?'))}" + (f" ({device['memory_gib']} GiB)" if "memory_gib" in device else "")
               + f", torch {versions.get('torch')}" + (f" (CUDA {versions['torch_cuda']})" if versions.get("torch_cuda") else "")
               + f", transformers {versions.get('transformers')}, specresearch at {versions.get('git')}")
    shapes = sp.get("shapes", {})
    return {
        "title": data.get("title") or f"benchmarks/gpu_check.py on {device.get('name', device.get('type', '?'))}",
        "date": data.get("date") or data.get("started") or "not recorded",
        "machine": machine,
        "command": ["python benchmarks/gpu_check.py " + " ".join(shlex.quote(a) for a in data.get("argv", []))],
        "prompts": (f"random weights of the Qwen2.5-Coder-1.5B shape (target) and 0.5B shape (draft), {sp.get('dtype')}, "
                    f"vocabulary {shapes.get('vocab')}; one prompt of {sp.get('prompt_tokens')} tokens, {sp.get('new_tokens')} new "
                    f"tokens, greedy, EOS ignored, {sp.get('repeats')} rounds in rotating order (tok/s over all of them)")
                   if rows else None,
        "columns": columns,
        "rows": table_rows or [["(no speed section)", *[""] * (len(columns) - 1)]],
        "notes": data.get("notes", []) + notes,
    }


def write(report: dict, out: Path) -> None:
    """`report`, made JSON-safe, as the docs' one results format (topic gpu; the record is its `data`) at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    record = clean(report)
    tmp.write_text(json.dumps(reports.of(gpu_check_to_table(record), "gpu", record), indent=1) + "\n")
    os.replace(tmp, out)  # a reader (or a timed-out run) sees the last whole report


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def versions() -> dict:
    """Python, torch (and its CUDA), transformers, specresearch, the packages around them, the git commit."""
    import transformers

    import specresearch

    found = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
             "transformers": transformers.__version__, "specresearch": specresearch.__version__,
             "specresearch_from": reports.shown_path(Path(specresearch.__file__).parent, ROOT)}
    for dist in ("numpy", "safetensors", "tokenizers", "PyYAML", "omegaconf", "hydra-core"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = None
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        found["git"] = head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "") if head.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        found["git"] = None
    return found


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                "count": torch.cuda.device_count(), "bf16": torch.cuda.is_bf16_supported()}
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    return {"type": "cpu", "name": cpu, "threads": torch.get_num_threads()}


# --- (a) the functional matrix ---------------------------------------------------------------------


def decode(engine, prompts: list[list[int]], n: int) -> list:
    """Every prompt, EOS ignored (every method then decodes exactly n tokens), prompt i from stream i of seed 0."""
    from specresearch.seeding import stream_seed

    return [engine.generate(p, max_new_tokens=n, eos_token_ids=[], seed=stream_seed(0, i)) for i, p in enumerate(prompts)]


def cell(build: Callable[[], Any], prompts: list[list[int]], n: int, reference: list[list[int]] | None) -> dict:
    """Build an engine and decode the prompts: with `reference` (T = 0), how many equal it token for
    token; without (T = 1), whether every prompt got its n tokens. A SpecResearchError while building is
    the method's refusal ("refused"); any other exception an error."""
    from specresearch.errors import SpecResearchError

    t0 = time.perf_counter()
    try:
        engine = build()
    except SpecResearchError as err:
        return failure(err, "refused")
    except Exception as err:  # noqa: BLE001 - one cell's failure must not hide the others
        return failure(err)
    try:
        outs = decode(engine, prompts, n)
    except Exception as err:  # noqa: BLE001
        return failure(err)
    stats = outs[0].stats
    for o in outs[1:]:
        stats = stats.merge(o.stats)
    res = {"status": "ok", "tau": stats.tau, "alpha": stats.alpha if stats.drafted else None}
    if reference is not None:
        res.update(identical=sum(o.tokens == r for o, r in zip(outs, reference)), of=len(reference),
                   first_divergence=[first_divergence(o.tokens, r) for o, r in zip(outs, reference)])
    else:
        res["all_tokens"] = all(len(o.tokens) == n for o in outs)
    res["seconds"] = round(time.perf_counter() - t0, 2)
    return res


def passed(c: dict) -> bool:
    """A cell that ran and, at T = 0, equals plain decoding on every prompt (at T = 1: decoded every token)."""
    return c["status"] == "ok" and (c["identical"] == c["of"] if "of" in c else c["all_tokens"])


def hf_greedy(lm, prompt: list[int], n: int) -> list[int]:
    """transformers' greedy `generate` of n tokens, EOS ignored."""
    ids = torch.tensor([prompt], device=lm.device)
    with torch.inference_mode():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                eos_token_id=[], pad_token_id=0)
    return out[0, len(prompt):].tolist()


def lossless_at(temperature: float) -> list[str]:
    """The verifiers of conf/verifier that claim `lossless` and run at this temperature (as tests/verifiers/test_lossless.py)."""
    from specresearch.errors import SpecResearchError
    from specresearch.types import SamplingParams

    found = []
    for name in options("verifier"):
        verifier = instantiate(node("verifier", name))
        try:
            verifier.check_sampling(SamplingParams(temperature=temperature))
        except SpecResearchError:
            continue
        if verifier.lossless:
            found.append(name)
    return found


def matrix(device: torch.device, prompts: int, n: int) -> dict:
    """Section (a); see the module docstring. Cells: t0[drafter][verifier], t1[drafter][verifier], modes[drafter][mode]."""
    from specresearch.drafters.none import NoDrafter
    from specresearch.engine import Engine
    from specresearch.models import load_model
    from specresearch.types import SamplingParams
    from specresearch.verifiers import GreedyVerifier

    model = node("model", "tiny", overrides=[f"device={device}"])
    target = load_model(**model)
    greedy, sampled = SamplingParams(**node("sampling", "greedy")), SamplingParams(**node("sampling", "random"))
    chosen = PROMPTS[:prompts]
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), greedy)
    reference = [o.tokens for o in decode(baseline, chosen, n)]
    drafters, verifiers, at_t1 = options("drafter"), options("verifier"), lossless_at(1.0)
    res = {"device": str(device), "model": "tiny (fp32)", "prompts": len(chosen), "new_tokens": n, "drafters": drafters,
           "verifiers": verifiers, "t1_verifiers": at_t1,
           "baseline_equals_generate": [r == hf_greedy(target, p, n) for p, r in zip(chosen, reference)],
           "t0": {}, "t1": {}, "modes": {}}

    def engine(name: str, overrides: Sequence[str], verifier: str, sampling: SamplingParams, folder: Path) -> Callable[[], Any]:
        return lambda: Engine(target, make_drafter(name, target, model, folder, overrides),
                              instantiate(node("verifier", verifier)), sampling)

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        folder = Path(tmp)
        for d in drafters:
            res["t0"][d] = {v: cell(engine(d, (), v, greedy, folder), chosen, n, reference) for v in verifiers}
            res["t1"][d] = {v: cell(engine(d, (), v, sampled, folder), chosen, n, None) for v in at_t1}
            res["modes"][d] = {}
            for mode, overrides in target_class(node("drafter", d, model)).modes.items():
                if not overrides:  # the default mode: the matrix above
                    continue
                found = cell(engine(d, overrides, "greedy", greedy, folder), chosen, n, reference)
                if found["status"] == "refused" and at_t1:  # a mode for T > 0 (children=sample) refuses greedy decoding
                    t1 = cell(engine(d, overrides, at_t1[0], sampled, folder), chosen, n, None)
                    found = {**t1, "sampling": f"T=1, {at_t1[0]} (T=0 refused: {found['error']})"} if t1["status"] == "ok" else t1
                res["modes"][d][mode] = {"overrides": list(overrides), **found}
    res["summary"] = matrix_summary(res)
    return res


def matrix_summary(res: dict) -> dict:
    t0, t1, modes = ([c for row in res[part].values() for c in row.values()] for part in ("t0", "t1", "modes"))
    summary = {"t0_cells": len(t0), "t0_identical": sum(map(passed, t0)), "t1_runs": len(t1), "t1_ok": sum(map(passed, t1)),
               "modes": len(modes), "modes_ok": sum(map(passed, modes)), "modes_refused": sum(c["status"] == "refused" for c in modes),
               "baseline_equals_generate": all(res["baseline_equals_generate"])}
    # a mode may be refused where it cannot run (an int8 draft on CUDA); everything else must pass
    summary["ok"] = (summary["t0_identical"] == len(t0) and summary["t1_ok"] == len(t1) and summary["baseline_equals_generate"]
                     and summary["modes_ok"] + summary["modes_refused"] == len(modes))
    return summary


# --- (b) speed on the real shapes ------------------------------------------------------------------


def random_model(shape: dict, name: str, device: torch.device, dtype: torch.dtype, seed: int):
    """A Qwen2 model of `shape` with random weights, as a LoadedModel (a byte tokenizer: no files needed)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from specresearch.models import ByteTokenizer, LoadedModel

    config = Qwen2Config(vocab_size=VOCAB, tie_word_embeddings=False, **shape)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    return LoadedModel(model, ByteTokenizer(VOCAB), name, device, dtype)


@dataclasses.dataclass
class Method:
    """One way to decode the prompt, and what its timed runs measured."""

    name: str
    run: Callable[[int], tuple[list[int], float, Any]]  # new tokens -> (tokens, seconds, SpecStats or None)
    engine: Any = None  # ours: the Engine (for the phase-timed decode)
    compiled: bool = False  # warm-ups decode all n tokens: every width a timed greedy run meets is compiled by then
    warmups: list[float] = dataclasses.field(default_factory=list)  # seconds of the untimed warm-ups (compilation shows here)
    seconds: list[float] = dataclasses.field(default_factory=list)
    tokens: list[list[int]] = dataclasses.field(default_factory=list)
    stats: Any = None  # the last timed run's SpecStats (ours)


def hf_method(name: str, lm, ids: list[int], cache_len: int | None = None) -> Method:
    """transformers' greedy `generate`; with `cache_len`, on a StaticCache of that many slots (one size for
    every call: one compilation) with the forward compiled, as transformers does by itself on GPUs
    (mode reduce-overhead: CUDA graphs; on the CPU, where it would not compile, torch.compile's default)."""
    from transformers import CompileConfig, StaticCache

    x = torch.tensor([ids], device=lm.device)
    kwargs = {}
    if cache_len is not None:
        config = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead" if lm.device.type == "cuda" else "default")
        config._compile_all_devices = True  # transformers compiles on CUDA only unless told so
        kwargs["compile_config"] = config

    def run(n: int) -> tuple[list[int], float, None]:
        extra = {"cache": StaticCache(config=lm.model.config, max_cache_len=cache_len)} if cache_len is not None else {}
        sync(lm.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = lm.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                                    eos_token_id=[], pad_token_id=0, **kwargs, **extra)
        sync(lm.device)
        return out[0, len(ids):].tolist(), time.perf_counter() - t0, None

    return Method(name, run, compiled=cache_len is not None)


def our_method(name: str, engine, ids: list[int], cache_len: int) -> Method:
    """Our engine on the prompt, timed by the engine itself (stats.time_total, synced); a compiled target's
    slots are sized once, `cache_len` (every run replays the warm-up's graphs)."""
    if engine.kv.lm.compile:
        engine.kv.reset(cache_len)

    def run(n: int) -> tuple[list[int], float, Any]:
        out = engine.generate(ids, max_new_tokens=n, eos_token_ids=[], seed=0)
        return out.tokens, out.stats.time_total, out.stats

    return Method(name, run, engine, compiled=bool(engine.kv.lm.compile))


def speed_methods(target, draft, ids: list[int], n: int, k: int, folder: Path,
                  compiled_drafters: Sequence[str] = COMPILED_DRAFTERS) -> tuple[list[Method], dict]:
    """generate, generate_compiled, baseline, baseline_compiled, our SPEED_DRAFTERS (greedy verifier, k draft
    tokens) and the `compiled_drafters` again on the compiled target (with the draft model compiled as well), all
    sharing the target's weights (the compiled methods one compiled decoder); a method that cannot be built is
    reported, not timed."""
    from specresearch.drafters.none import NoDrafter
    from specresearch.engine import Engine
    from specresearch.types import SamplingParams
    from specresearch.verifiers import GreedyVerifier

    greedy = SamplingParams()
    cache_len = len(ids) + n + 1
    model = {**node("model", "qwen2.5-coder-1.5b"), "name": target.name, "device": str(target.device),
             "dtype": str(target.dtype).removeprefix("torch.")}
    methods, failed = [hf_method("generate", target, ids), hf_method("generate_compiled", target, ids, cache_len)], {}
    methods.append(our_method("baseline", Engine(target, NoDrafter(), GreedyVerifier(), greedy), ids, cache_len))
    compiled = dataclasses.replace(target, cache="static", compile=True, compiled=None)
    methods.append(our_method("baseline_compiled", Engine(compiled, NoDrafter(), GreedyVerifier(), greedy), ids, cache_len))
    compiled_draft = dataclasses.replace(draft, cache="static", compile=True, compiled=None)
    for lm, names, suffix, small in ((target, SPEED_DRAFTERS, "", draft), (compiled, compiled_drafters, "_compiled", compiled_draft)):
        for name in names:
            k_option = [f"k={k}"] if "k" in node("drafter", name, model) else []
            try:
                drafter = make_drafter(name, lm, model, folder, k_option, draft=small)
                label = f"{name}({drafter.size_label})" + (" untrained" if "checkpoint" in node("drafter", name, model) else "")
                methods.append(our_method(label + suffix, Engine(lm, drafter, GreedyVerifier(), greedy), ids, cache_len))
            except Exception as err:  # noqa: BLE001 - the other methods still run
                failed[name + suffix] = failure(err)
    return methods, failed


def time_methods(methods: list[Method], n: int, repeats: int, warm: int, deadline: float) -> dict[str, dict]:
    """Two warm-ups of `warm` tokens each, of all n for a compiled method (compilation, allocator, lazy init
    stay out of the timings: a compiled decoder may compile again on its second call, once its cache is
    initialised, and a greedy decode meets the same widths every time), then
    `repeats` rounds of n tokens each, the order rotating every round so drifts hit all alike; a round
    after the first starts only before `deadline` (time.monotonic), and so do a method's warm-ups. A method
    that fails or is skipped leaves the list, its error returned (the others are still timed)."""
    failed = {}

    def attempt(m: Method, tokens: int) -> tuple | None:
        try:
            return m.run(tokens)
        except Exception as err:  # noqa: BLE001 - one method's failure must not lose the others' numbers
            failed[m.name] = failure(err)
            methods.remove(m)
            return None

    for m in list(methods):
        if time.monotonic() > deadline:  # (a compiled method's warm-ups compile: minutes on a GPU)
            failed[m.name] = {"status": "skipped", "error": "past --budget before its warm-ups"}
            methods.remove(m)
            continue
        for _ in range(2):
            t0 = time.perf_counter()
            if attempt(m, n if m.compiled else warm) is None:
                break
            m.warmups.append(time.perf_counter() - t0)
        print(f"speed: {m.name}: warm-ups " + ", ".join(f"{s:.1f}s" for s in m.warmups), flush=True)
    for r in range(repeats):
        if not methods or (r and time.monotonic() > deadline):
            break
        for m in methods[r % len(methods):] + methods[: r % len(methods)]:
            if (out := attempt(m, n)) is not None:
                m.tokens.append(out[0])
                m.seconds.append(out[1])
                m.stats = out[2]
        print(f"speed: round {r + 1}/{repeats}: " + ", ".join(f"{m.name} {m.seconds[-1]:.1f}s" for m in methods), flush=True)
    return failed


def phase_timed(methods: list[Method], n: int) -> dict[str, dict]:
    """c and v of our methods, from one more decode each with the phases timed (a device sync per phase,
    so apart from the timed runs): specresearch.metrics.cost_ratios against the baseline's decode, and
    the time split."""
    from specresearch.metrics import SpecStats, cost_ratios

    stats = {}
    for m in methods:
        if m.engine is None:
            continue
        before = getattr(m.engine, "time_split", True)
        m.engine.time_split = True  # (Engine's own switch: "auto" leaves the phases untimed on CUDA)
        try:
            stats[m.name] = m.run(n)[2]
        except Exception as err:  # noqa: BLE001 - its timed runs passed; the split is extra
            print(f"speed: {m.name}: no phase-timed decode: {one_line(err)}", flush=True)
        finally:
            m.engine.time_split = before
    found = {}
    for m in methods:  # a compiled method's costs against the compiled baseline's forward, the others' against the eager one's
        if (s := stats.get(m.name)) is None:
            continue
        base = stats.get("baseline_compiled" if m.compiled else "baseline")
        c, v = cost_ratios(base, s) if base is not None else (float("nan"), float("nan"))
        found[m.name] = {"c": c if s.drafted else None, "v": v, "steps": s.steps, "draft_forwards": s.draft_forwards,
                       "time_split": {p: getattr(s, f"time_{p}") / s.time_total for p in SpecStats.TIME_SPLIT}}
    return found


def speed(device: torch.device, dry: bool, n: int, repeats: int, k: int, prompt_tokens: int, deadline: float,
          only: Sequence[str] = ()) -> dict:
    """Section (b); see the module docstring."""
    from specresearch.kv import cost_curve, forward_seconds
    from specresearch.models import check_transformers

    check_transformers()  # load_model's check, for the models made here
    dtype = torch.float32 if dry else torch.bfloat16
    shapes = DRY_SHAPES if dry else SHAPES
    target = random_model(shapes["1.5b"], "random qwen2.5-coder-1.5b shape", device, dtype, seed=0)
    draft = random_model(shapes["0.5b"], "random qwen2.5-coder-0.5b shape", device, dtype, seed=1)
    ids = list(PROMPT.encode())[:prompt_tokens]
    res = {"dtype": str(dtype).removeprefix("torch."), "shapes": {"target": shapes["1.5b"], "draft": shapes["0.5b"], "vocab": VOCAB},
           "prompt_tokens": len(ids), "new_tokens": n, "repeats": repeats, "k": k, "verifier": "greedy",
           "notes": {"generate_compiled": "generate with a StaticCache of prompt + new tokens and torch.compile (on CUDA "
                                          "mode reduce-overhead, transformers' own default there)",
                     "baseline_compiled": "model.cache=static, model.compile=true (CUDA graphs on a GPU)",
                     "medusa": "untrained heads (zero-initialised blocks: each head proposes the target's next-token guess): "
                               "the cost side only",
                     "independent": "draft = random 0.5B-shape weights, unrelated to the target: acceptance ~0, the cost side only",
                     "c, v": "per method from one more decode with the phases timed (cost_ratios against the baseline's, "
                             "a compiled method's against baseline_compiled's): "
                             "c = seconds per draft-model forward / one-token target forward, v = per verification forward; "
                             "v_curve and c_draft below are measured on the bare models"}}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        methods, res["failed"] = speed_methods(target, draft, ids, n, k, Path(tmp), DRY_COMPILED_DRAFTERS if dry else COMPILED_DRAFTERS)
        methods = [m for m in methods if not only or short(m.name) in only]
        res["failed"].update(time_methods(methods, n, repeats, min(8, n), deadline))
        costs = phase_timed(methods, n)
    by_name = {m.name: m for m in methods}
    ref, base = by_name.get("generate"), by_name.get("baseline")
    rows = []

    def rate(m: Method | None) -> float:
        return sum(map(len, m.tokens)) / sum(m.seconds) if m is not None else float("nan")

    for m in methods:
        tps = rate(m)
        rows.append({"method": m.name, "compiled": m.compiled, "tokens_per_s": tps,
                     "tokens_per_s_repeats": [len(t) / s for t, s in zip(m.tokens, m.seconds)], "warmup_seconds": m.warmups,
                     "speedup_vs_generate": tps / rate(ref), "speedup_vs_baseline": tps / rate(base),
                     "identical_to_generate": m.tokens[0] == ref.tokens[0] if ref else None,
                     "first_divergence_vs_generate": first_divergence(m.tokens[0], ref.tokens[0]) if ref else None,
                     "tau": m.stats.tau if m.stats is not None else None,
                     "alpha": m.stats.alpha if m.stats is not None and m.stats.drafted else None,
                     **costs.get(m.name, {})})
    res["rows"] = rows
    res["v_curve"] = [1.0, *cost_curve(target, ids, list(range(2, 18)))]  # v(k): a forward of k + 1 tokens / one token's, k = 0..16
    one = forward_seconds(target, ids, [1], repeats=5)[0]
    res["c_draft"] = forward_seconds(draft, ids, [1], repeats=5)[0] / one  # the 0.5B draft's forward / the target's
    res["target_forward_ms"] = one * 1e3
    res["distinct_tokens_generated"] = len(set(ref.tokens[0])) if ref else None  # random weights often repeat a few tokens
    return res


def short(method: str) -> str:
    """A method's name as --only takes it: pld(k=4)_compiled -> pld_compiled, medusa(depth=3) untrained -> medusa."""
    return re.sub(r"\(.*\)( untrained)?", "", method)


def speed_table(res: dict) -> str:
    lines = [f"{'method':<36}{'tok/s':>9}{'vs_generate':>13}{'vs_baseline':>13}{'tau':>7}{'c':>8}{'v':>7}  identical"]
    for r in res["rows"]:
        def f(key: str, fmt: str) -> str:
            value = r.get(key)
            return "-" if value is None or value != value else format(value, fmt)

        lines.append(f"{r['method']:<36}{r['tokens_per_s']:>9.1f}"
                     f"{f('speedup_vs_generate', '.2f'):>12}x{f('speedup_vs_baseline', '.2f'):>12}x"
                     f"{f('tau', '.2f'):>7}{f('c', '.3f'):>8}{f('v', '.2f'):>7}  {r['identical_to_generate']}")
    lines.append("v(k), k = 0..16: " + " ".join(f"{v:.2f}" for v in res["v_curve"]) + f"; c of the 0.5B draft: {res['c_draft']:.3f}")
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON report (default: benchmarks/results/gpu-check-TIME.json)")
    parser.add_argument("--dry", action="store_true", help="the same code paths on the CPU: tiny shapes (hidden 64, 2 layers), few tokens")
    parser.add_argument("--tokens", type=at_least(1), default=None, help="new tokens per speed run (default 256; --dry 16)")
    parser.add_argument("--repeats", type=at_least(1), default=None, help="timed runs per speed method (default 3; --dry 1)")
    parser.add_argument("--k", type=at_least(1), default=4, help="draft tokens per step of our drafters that have a k")
    parser.add_argument("--prompt-tokens", type=at_least(1), default=228, help="speed prompt length (228: as the earlier H200 run)")
    parser.add_argument("--budget", type=at_least(0.0, float), default=480.0,
                        help="seconds: no timed round after the first starts past this")
    parser.add_argument("--only", type=lambda s: s.split(","), default=[],
                        help="speed: time only these methods, e.g. generate_compiled,baseline_compiled,pld_compiled (default all)")
    parser.add_argument("--skip", choices=["matrix", "speed"], action="append", default=[], help="leave a section out")
    args = parser.parse_args(argv)
    unknown = [name for name in args.only if name not in ONLY]
    if unknown:
        parser.error(f"--only: unknown method {', '.join(map(repr, unknown))}: valid are {', '.join(ONLY)}")
    args.tokens = 16 if args.dry and args.tokens is None else 256 if args.tokens is None else args.tokens
    args.repeats = 1 if args.dry and args.repeats is None else 3 if args.repeats is None else args.repeats
    args.out = args.out or ROOT / "benchmarks" / "results" / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}.json"
    if not writable(args.out):
        parser.error(f"--out {args.out}: cannot write the report there (a file in a writable folder); checked before any work")
    if set(args.skip) >= {"matrix", "speed"}:
        parser.error("--skip matrix --skip speed leaves nothing to check")
    return args


def writable(out: Path) -> bool:
    """Whether the report can be written at `out`: not a folder, and a file can be made in its folder, or in the
    nearest folder above it that exists (the rest is made when missing). A probe file, at once removed: /proc and
    read-only mounts pass os.access."""
    folder = next((p for p in [out.parent, *out.parent.parents] if p.exists()), None)
    if out.is_dir() or folder is None or not folder.is_dir():
        return False
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".gpu-check-probe-"):
            return True
    except OSError:
        return False


def at_least(low, kind=int):
    """An argparse type: a `kind` >= low, else argparse's one-line error."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value
    return parse


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sections asked for, write the report after each; 0 when everything passed, else 1."""
    args = parse_args(argv)
    start = time.monotonic()
    if args.dry:
        torch.set_num_threads(1)  # tiny shapes: one thread is fastest, and leaves the other cores to a test suite around it
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry else "cpu")
    given = sys.argv[1:] if argv is None else list(argv)
    report = {"script": "benchmarks/gpu_check.py", "argv": [Path(a).name if a.startswith("/") else a for a in given],  # no machine path
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "dry": args.dry,
              "versions": versions(), "device": device_info(device),
              "settings": {k: (v.name if v.is_absolute() else v.as_posix()) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    sections = {"matrix": lambda: matrix(device, 2 if args.dry else 4, 8 if args.dry else 32),
                "speed": lambda: speed(device, args.dry, args.tokens, args.repeats, args.k, args.prompt_tokens,
                                       start + args.budget, args.only)}
    for name, run in sections.items():
        if name in args.skip:
            continue
        t0 = time.monotonic()
        print(f"{name} ...", flush=True)
        try:
            report[name] = {"status": "ok", **run()}
        except Exception as err:  # noqa: BLE001 - the report keeps what failed and the next section runs
            report[name] = failure(err)
            if isinstance(err, ImportError):  # a GPU machine without the project's packages
                report[name]["hint"] = "install the wheels of .gpu/ first: docs/benchmarks.md, section 'On a GPU'"
        report[name]["seconds"] = round(time.monotonic() - t0, 1)
        report["seconds"] = round(time.monotonic() - start, 1)
        write(report, args.out)
    return summarize(report, args.out)


def summarize(report: dict, out: Path) -> int:
    """Print what the report says; 0 when every section passed."""
    ok = True
    m = report.get("matrix")
    if m is not None:
        if m["status"] != "ok":
            print(f"matrix: {m['error']}" + (f" ({m['hint']})" if "hint" in m else ""))
            ok = False
        else:
            s = m["summary"]
            print(f"matrix on {m['device']}: T=0 {s['t0_identical']}/{s['t0_cells']} identical to plain decoding; "
                  f"T=1 {s['t1_ok']}/{s['t1_runs']} ran; modes {s['modes_ok']}/{s['modes']} passed, {s['modes_refused']} refused; "
                  f"baseline == generate: {s['baseline_equals_generate']}")
            for d, row in {**m["t0"], **{f"{d} (T=1)": r for d, r in m["t1"].items()}, **m["modes"]}.items():
                for v, c in row.items():
                    if c["status"] != "ok":
                        print(f"  {d} x {v}: {c['status']}: {c['error']}")
                    elif not passed(c):
                        print(f"  {d} x {v}: " + (f"{c['identical']}/{c['of']} prompts identical, first divergences "
                                                  f"{c['first_divergence']}" if "of" in c else "fewer tokens than asked"))
            ok &= s["ok"]
    sp = report.get("speed")
    if sp is not None:
        if sp["status"] != "ok":
            print(f"speed: {sp['error']}" + (f" ({sp['hint']})" if "hint" in sp else ""))
            ok = False
        else:
            print(speed_table(sp))
            for name, f in sp["failed"].items():
                print(f"  {name}: {f['error']}")
            ok &= not sp["failed"]
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
