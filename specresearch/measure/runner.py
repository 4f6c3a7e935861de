"""One experiment: the same prompts decoded by the autoregressive baseline and by the method,
interleaved prompt by prompt so machine noise hits both alike; results printed and tracked (`run`), and
what a run checks before it waits for the speed lock or loads a model (`check_run`)."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from importlib import resources
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specresearch.build import build, build_engine, claim_params
from specresearch.data import Prompt, encode, load_prompts
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM, StaticSlots
from specresearch.measure.equivalence import AUTO_MAX, baseline_cache, equivalence, format_calibration
from specresearch.measure.results import Results, format_table
from specresearch.metrics import first_divergence
from specresearch.models import check_model_files, check_tiny_args, machine_tags
from specresearch.models.machine import CPU_KINDS, cpu_kind
from specresearch.options.drafters import Heads
from specresearch.records import HEADLINE_SECTION, PER_PROMPT_TAG, PromptStep, flatten, headline, json_text, prefixed
from specresearch.seeding import stream_seed
from specresearch.settings import built_by
from specresearch.stats import samples_for_tv
from specresearch.stats.distortion import check_distortion, continuations, distortion
from specresearch.tracking import browse_line, tracked_run
from specresearch.types import GenerationOutput, SamplingParams

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> dict[str, float]:
    """Run one experiment from a composed config (see conf/config.yaml).

    Everything that can be checked is checked before a tracked run opens, so a bad input leaves
    nothing half-written; a failure during decoding marks the run FAILED with what it had measured.

    Returns:
        The summary metrics.
    """
    torch.manual_seed(cfg.seed)
    sampling = SamplingParams(**cfg.sampling)
    prompts = check_run(cfg)  # as the command line checks it (before the speed lock): a run from Python too, before anything is recorded
    tracker = build(cfg.tracker)
    tracker.check_reachable()  # where results go, before any model loads
    method = build_engine(cfg)
    if cfg.stats.distortion:
        check_distortion(method)  # before anything is measured
    baseline = build_engine(cfg, baseline=True, target=method.kv.lm)
    compiled = compiled_reference(cfg, baseline)
    target, drafter = method.kv.lm, method.drafter
    trained_on = trained_on_tags(drafter, prompts)  # refuses heads trained on any of these prompts
    expect = what_to_expect(target.name, target.device, target.dtype)
    if expect:
        log.info(expect)
    prompt_ids = [encode(target.tokenizer, p) for p in prompts]
    # A model other than the tiny one tells its positions only now that it has loaded: before anything is measured.
    check_positions(cfg, prompts, [len(ids) for ids in prompt_ids], method.kv.max_positions, target.name,
                    "its config.max_position_embeddings")
    stops = list(cfg.dataset.get("stop", []) or [])
    k = int(drafter.k or drafter.depth)  # draft tokens per step; a tree's depth, as the Leviathan prediction's chain length
    label = method.label

    def generate(engine: Engine, ids: list[list[int]], first: int, max_new: int) -> list[GenerationOutput]:
        """Prompts first, first + 1, ... (a batch): prompt i decodes stream i of the run's seed, whatever its batch."""
        return engine.generate(ids, max_new, stop_strings=stops, seed=[stream_seed(cfg.seed, first + b) for b in range(len(ids))])

    batch = int(cfg.batch_size)
    engines = (baseline, method) if compiled is None else (baseline, method, compiled)
    longest = max(prompt_ids, key=len)
    for engine in engines:  # compiled slots sized once for the longest prompt (a larger cache would compile its graphs again),
        if engine.kv.lm.compile:  # and a graph made for every width a verification may feed (one token for plain decoding)
            engine.kv.reset(len(longest) + cfg.max_new_tokens + 1)
            engine.kv.precompile(1 if engine.drafter.k == 0 and not engine.drafter.depth else StaticSlots.COMPILED_WIDTHS[-1],
                                     hidden=engine.drafter.needs_hidden)
    if cfg.warmup:  # first calls pay one-off costs (allocator, kernels, compilation): keep them out of every timing
        log.info(f"warm-up (untimed; warmup=false skips it): {' and '.join(e.label for e in engines)} decode "
                 f"{min(8, cfg.max_new_tokens)} tokens of {len(prompt_ids[:batch])} prompt(s) each, so that one-off costs "
                 "(memory, kernels, compiled graphs) stay out of the timings")
        for engine in engines:  # a compiled engine decodes the longest prompt in full: its draft model's slots grow to their size too
            compiled_run = engine.kv.lm.compile
            generate(engine, [longest] if compiled_run else prompt_ids[:batch], 0,
                     cfg.max_new_tokens if compiled_run else min(8, cfg.max_new_tokens))

    results = Results(batch_size=batch)
    tags = {**machine_tags(target), **trained_on}
    with tracked_run(tracker, cfg, label, lambda: _report(results, k), tags=tags, params=claim_params(method)) as tracked:
        per_prompt = len(engines) * cfg.max_new_tokens  # at most: a row may stop early (EOS, a stop string)
        # the bar counts the tokens that come: its total shrinks when a batch's rows stopped early (total = n at the end)
        sides = "baseline and method" if compiled is None else "baseline, method and compiled plain decoding"
        with tqdm(total=len(prompts) * per_prompt, desc=f"{label} ({sides})", unit="token") as progress:  # closed before the battery's bars
            for engine in engines:
                engine.on_tokens = progress.update  # the bar moves with every step
            for first in range(0, len(prompts), batch):  # prompt i (row i - first of its batch) is seeded stream_seed(cfg.seed, i)
                ids = prompt_ids[first : first + batch]
                if first // batch % 2 == 0:  # alternate who goes first, so drifts in machine speed cancel
                    base = generate(baseline, ids, first, cfg.max_new_tokens)
                    meth = generate(method, ids, first, cfg.max_new_tokens)
                else:
                    meth = generate(method, ids, first, cfg.max_new_tokens)
                    base = generate(baseline, ids, first, cfg.max_new_tokens)
                comp = generate(compiled, ids, first, cfg.max_new_tokens) if compiled is not None else None
                gaps = [divergence_gap(target, p, b.tokens, m.tokens) if sampling.greedy else None for p, b, m in zip(ids, base, meth)]
                records = results.add_batch(prompts[first : first + batch], base, meth, gaps, comp)
                if drafter.predicted_speedup is not None:  # shape=auto: fixed (Medusa) or over the steps so far (dynamic trees)
                    results.predicted_speedup = drafter.predicted_speedup
                summary = prefixed(headline(flatten(results.record(k))), HEADLINE_SECTION)
                for i, (b, m, record) in enumerate(zip(base, meth, records), start=first):
                    tracked.log_metrics({**summary, **_step_metrics(b, m, record)}, step=i)
                progress.total = progress.n + (len(prompts) - first - len(ids)) * per_prompt  # what can still come
                progress.refresh()
            for engine in engines:
                engine.on_tokens = None
        tracked.tag(per_prompt_tag(results.records, batch))
        if cfg.stats.distortion and not sampling.greedy:
            results.distortion = measure_distortion(cfg, baseline, method, prompt_ids)
        if cfg.stats.samples and not sampling.greedy:
            cache = baseline_cache(cfg, target, prompt_ids, sampling) if cfg.stats.reuse_baseline else None
            equivalence(cfg.stats, cfg.seed, target, method, prompt_ids, sampling, results, cache)
        # the results, said inside the run: its logged log (specresearch.log) holds them too
        record = results.record(k)
        log.info(format_table(cfg, label, record, results, sampling, target))
        suspect = suspect_speedup(flatten(record))
        if suspect:
            log.warning(suspect)
        if results.equivalence is not None:
            log.info(results.equivalence.format())
        if record.distortion:
            log.info(format_distortion(record.distortion))
        elif cfg.stats.distortion and sampling.greedy:
            log.info("exact distortion at temperature 0: every rule keeps the target's argmax path (the greedy identity above)")
        if "rate" in record.calibration:
            log.info(format_calibration(record.calibration, cfg.stats.alpha))
        elif cfg.stats.samples and sampling.greedy:
            log.info("equivalence at temperature 0: the outputs are deterministic, so it is the greedy identity above")
    browse_line(tracker)
    return flatten(record)


def what_to_expect(model: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """What the README's headline measured for `model` on this CPU's kind (`cpu_kind`), as one line a speed run says
    before it measures: the headlines marked "expect" (specresearch/assets/held_out.json, which benchmarks/headline.py
    writes from the committed reports), or that this kind has none yet. None on a GPU or for a model without any."""
    headlines = json.loads(resources.files("specresearch.assets").joinpath("held_out.json").read_text("utf-8"))["headlines"]
    if device.type != "cpu" or not any(h["model"] == model for h in headlines):
        return None
    kind = cpu_kind()
    mine = [h for h in headlines if h["model"] == model and h["kind"] == kind]
    auto = CPU_KINDS.get(kind)
    if not mine:
        measured = sorted({h["kind"] for h in headlines if h["model"] == model})
        return (f"what to expect here: {model} has no held-out speed measurement on a CPU of this kind ({kind}) yet, only on "
                f"{', '.join(measured)} (the README's headline); python benchmarks/speed.py measures every method on this machine")
    said = "; ".join(f"{h['what'].split(':')[0].replace('`', '')} {h['speedup']:.2f}x [{h['interval'][0]:.2f}-{h['interval'][1]:.2f}] "
                     f"({h['prompts']} {h['dataset']} prompts x {h['tokens']} tokens, docs/results/data/{h['report']}.json)"
                     for h in mine)
    other = f"; they ran {auto}, this run {str(dtype).removeprefix('torch.')}" if str(dtype) != f"torch.{auto}" else ""
    return (f"what to expect here: held out on a CPU with {kind} (the README's headline{other}), over transformers' generate: "
            f"{said}. A run of a few prompts, other settings or a busy machine lands elsewhere")


SUSPECT = 1.15  # a speedup this far above τ is flagged (a verify forward may cost a little under one token's: v(2) ~0.9 measured)


def suspect_speedup(metrics: dict[str, float]) -> str | None:
    """A warning when the measured speedup exceeds what speculation can give: each target forward brings
    τ tokens on average and costs at least about one plain step, so the speedup stays near or below τ.
    Above it (by SUSPECT), the two sides were timed under different conditions (other work on the machine
    during one side, frequency changes): the number says nothing about the method. None when it is plausible."""
    speedup, tau = metrics.get("speedup", math.nan), metrics.get("method_tau", math.nan)
    if not (math.isfinite(speedup) and math.isfinite(tau)) or speedup <= SUSPECT * tau:
        return None
    load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs now" if hasattr(os, "getloadavg") else "the load unknown"
    return (f"warning: the speedup {speedup:.2f}x is above τ = {tau:.2f} tokens per target forward, which speculation cannot "
            f"produce: the sides were timed under different conditions (other work on the machine? {load}); "
            "do not report it, measure again on a quiet machine")


def measure_distortion(cfg: DictConfig, baseline: Engine, method: Engine, prompt_ids: list[list[int]]) -> dict[str, float]:
    """Exact distortion (stats.distortion tokens per prompt, every prompt of the run): the target's own
    continuations, then the method teacher-forced along them; its summary, with the seconds it took."""
    t0 = time.perf_counter()
    texts = continuations(baseline, prompt_ids, cfg.stats.distortion, cfg.seed)
    summary = distortion(method, prompt_ids, texts, cfg.seed).summary(seed=cfg.seed)
    return {**summary, "seconds": time.perf_counter() - t0}


def format_distortion(d: dict[str, float]) -> str:
    """The console's line for exact distortion (a summary of `measure_distortion`)."""
    return (f"exact distortion of each step's first token ({d['positions']:.0f} positions, {d['prompts']:.0f} prompts, "
            f"{d['seconds']:.0f} s): TV to the target's p mean {d['tv_mean']:.4f} (95% CI over prompts {d['tv_mean_ci_low']:.4f}-"
            f"{d['tv_mean_ci_high']:.4f}), median {d['tv_q50']:.4f}, 90% {d['tv_q90']:.4f}, max {d['tv_max']:.4f}; "
            f"KL(law || p) mean {d['kl_mean']:.4f} nats; first draft token kept with probability {d['kept_mean']:.3f}"
            + (f"; the target's own numerics (p as verification read it vs one query a forward): TV mean {d['numerics_tv_mean']:.4f}, "
               f"90% {d['numerics_tv_q90']:.4f}, max {d['numerics_tv_max']:.4f}" if "numerics_tv_mean" in d else ""))


def check_run(cfg: DictConfig) -> list[Prompt]:
    """Everything a speed run can check without loading a model, refused in one line before the run
    waits for the speed lock (the command line calls it before sweeps.job), opens a run or loads
    anything: a local model's files, a tiny model's sizes, the prompts (never fewer than asked), whether
    the longest prompt and max_new_tokens, stats.length (the battery) or stats.distortion fit a tiny
    model's positions (`check_positions`; another model's, once it loads), a drafter's checkpoint files,
    and what the equivalence battery would need (stats.prompts, an explicit stats.samples within the cap
    of stats.samples=auto, samples=auto's first draw within it too). The settings themselves
    were checked where the config entered (the command line, compose, build_engine: settings.check_config).

    Returns:
        The prompts (load_prompts(**cfg.dataset)).
    """
    tiny = []  # (tokenizer, max positions, its settings' path) of each tiny model
    for path, node in (("model", cfg.get("model")), ("drafter.model", (cfg.get("drafter") or {}).get("model"))):
        if node is not None and node.get("name") not in (None, "tiny"):
            check_model_files(node.name)
        if node is not None and node.get("name") == "tiny":
            given = node.get("tiny")
            args = OmegaConf.to_container(given, resolve=True) if given is not None else None
            tiny.append((*check_tiny_args(args, f"{path}.tiny"), path))
    prompts = load_prompts(**cfg.dataset)
    for tokenizer, limit, path in [t for t in tiny if t[2] == "model"]:  # the target's (a draft checks its own as it loads)
        check_positions(cfg, prompts, [len(encode(tokenizer, p)) for p in prompts], limit, "the tiny model",
                        f"{path}.tiny.max_position_embeddings")
    drafter = cfg.get("drafter") or {}
    schema = built_by("drafter", drafter.get("_target_")) if drafter.get("checkpoint") else None
    if schema is not None and issubclass(schema, Heads):  # medusa, eagle: the files now, not after the models load
        from specresearch.drafters.checkpoints import check_checkpoint
        from specresearch.drafters.medusa import SHAPE_KEYS

        check_checkpoint(schema.heads, Path(str(drafter.checkpoint)).expanduser(), keys=SHAPE_KEYS if schema.heads == "medusa" else ())
    sc = cfg.get("stats")
    if sc is not None and sc.samples and cfg.sampling.temperature > 0:  # the battery runs
        if sc.prompts > len(prompts):
            raise SpecResearchError(f"stats.prompts={sc.prompts} > the {len(prompts)} prompt(s) this run decodes (dataset.num_prompts, "
                                    f"dataset.offset): valid are stats.prompts <= {len(prompts)}")
        if sc.samples != "auto" and sc.samples * sc.prompts > AUTO_MAX:  # a draw of days, which nothing else would stop
            raise SpecResearchError(
                f"stats.samples={sc.samples} draws {sc.samples * sc.prompts:,} sequences per side ({sc.prompts} prompt(s)), above the "
                f"{AUTO_MAX:,} that stats.samples=auto draws at most: valid are stats.samples <= {AUTO_MAX // sc.prompts} "
                f"for stats.prompts={sc.prompts}, or stats.samples=auto")
        if sc.samples == "auto":
            least = samples_for_tv(sc.tv, 1, sc.length, sc.alpha, sc.power)  # auto's first draw, per side
            if least > AUTO_MAX:
                low = _least_auto_tv(sc)
                raise SpecResearchError(
                    f"stats.samples=auto: a position TV of {sc.tv} needs at least {least:,} sequences per side (length {sc.length}, "
                    f"alpha {sc.alpha}, power {sc.power}), above the {AUTO_MAX:,} that auto draws at most: valid are stats.tv >= "
                    f"{low:.4g} with samples=auto, or an explicit stats.samples=N (sequences per prompt)")
    return prompts


def check_positions(cfg: DictConfig, prompts: list[Prompt], lengths: list[int], limit: int | None, model: str, field: str) -> None:
    """Refuse, in one line naming both numbers, a size the target has no positions for: max_new_tokens
    after any prompt, stats.length after any of the battery's prompts and stats.distortion after any
    prompt (both only where they run: at temperature > 0). Unchecked, the last two failed only after the
    speed measurement, where the decoding reached them (the engine's refusal names max_new_tokens).

    Args:
        cfg: the run's config.
        prompts: the run's prompts.
        lengths: their token counts, in the target's tokenization.
        limit: the target's positions (max_position_embeddings); None (unsaid): nothing is checked.
        model: the target as the message names it ("the tiny model").
        field: where `limit` comes from ("model.tiny.max_position_embeddings").
    """
    if limit is None:
        return
    sc, sampled = cfg.get("stats"), cfg.sampling.temperature > 0
    sizes = [("max_new_tokens", cfg.max_new_tokens, len(prompts))]  # (setting, new tokens per prompt, the first prompts it decodes)
    if sc is not None and sampled and sc.samples:
        sizes.append(("stats.length", sc.length, sc.prompts))
    if sc is not None and sampled and sc.distortion:
        sizes.append(("stats.distortion", sc.distortion, len(prompts)))
    for key, size, first in sizes:
        length, longest = max((n, p.id) for n, p in zip(lengths[:first], prompts))
        if length + size > limit:
            room = f"valid are {key} <= {limit - length} for these prompts" if length < limit else "the prompt alone fills them"
            raise SpecResearchError(f"prompt {longest} ({length} tokens) and {key}={size} need {length + size} positions, but "
                                    f"{model} has {limit} ({field}): {room}")


def _least_auto_tv(sc: DictConfig) -> float:
    """The smallest position TV (rounded up to 3 digits) whose first draw fits AUTO_MAX sequences per side."""
    low, high = 1e-6, 0.999  # samples_for_tv falls as the TV grows: too many at low, few enough at high
    for _ in range(60):
        mid = (low * high) ** 0.5
        low, high = (low, mid) if samples_for_tv(mid, 1, sc.length, sc.alpha, sc.power) <= AUTO_MAX else (mid, high)
    step = 10.0 ** (math.floor(math.log10(high)) - 2)
    return math.ceil(high / step) * step


def compiled_reference(cfg: DictConfig, baseline: Engine) -> Engine | None:
    """Plain decoding compiled (model.cache=static, model.compile=true, the target's weights shared), to
    time beside the baseline when `cfg.compiled_reference` asks for it (auto: on CUDA); None when not
    asked, when the baseline is compiled itself, or for a batch (compiled graphs decode one sequence)."""
    lm = baseline.kv.lm
    wanted = lm.device.type == "cuda" if cfg.get("compiled_reference", "auto") == "auto" else bool(cfg.compiled_reference)
    if not wanted or lm.compile or cfg.batch_size > 1:
        return None
    compiled = dataclasses.replace(lm, cache="static", compile=True, compiled=None)
    return Engine(compiled, baseline.drafter, baseline.verifier, baseline.sampling, baseline.time_split)


def trained_on_tags(drafter, prompts: list[Prompt]) -> dict[str, str]:
    """For a drafter with trained weights (medusa, eagle): its checkpoint's record of the prompts that
    trained it, as run tags `drafter.trained_on.*` (sources, split, prompts, prompts_sha256; "unknown"
    for weights that record none). Raises SpecResearchError when any of `prompts` is among them (by id)."""
    record = getattr(drafter, "trained_on", None)
    if record is None:
        return {}
    if "ids" not in record:  # trained before records were kept: checkpoint_record warned
        return {"drafter.trained_on.sources": "unknown"}
    seen = sorted({p.id for p in prompts} & set(record["ids"]))
    if seen:
        raise SpecResearchError(
            f"the {drafter.name} weights at {record['checkpoint']} were trained on {len(seen)} of this run's prompts "
            f"({', '.join(seen[:3])}{', ...' if len(seen) > 3 else ''}): measure them on other prompts, or retrain them"
        )
    return {"drafter.trained_on.sources": ",".join(record["sources"]),
            "drafter.trained_on.split": f"{record['split']} ({record['split_rule']})",
            "drafter.trained_on.prompts": str(record["prompts"]), "drafter.trained_on.prompts_sha256": record["prompts_sha256"]}


@torch.inference_mode()
def divergence_gap(lm, prompt: list[int], a: list[int], b: list[int]) -> float | None:
    """Where two greedy outputs first differ, how close was the call? The target's logit of one
    token minus the other's, from a fresh prefill of the prompt and the common prefix (in the run's
    dtype). Near zero means a near-tie that rounding can flip; None when the outputs agree or one
    merely stopped earlier."""
    d = first_divergence(a, b)
    if d is None or d >= min(len(a), len(b)):
        return None
    fresh = CachedLM(lm)
    fresh.reset()
    logits = fresh.prefill_rows([torch.tensor(prompt + a[:d])])[0].float()  # [V]
    return abs(logits[a[d]] - logits[b[d]]).item()


TAG_LENGTH = 8000  # MLflow's longest tag value


def per_prompt_tag(records: list[dict], batch: int = 1) -> dict[str, str]:
    """Each prompt's new tokens and seconds on both sides, and the method's target forwards and accepted draft tokens, as
    one tag (PER_PROMPT_TAG, JSON: {"ids": [...], "baseline": [[tokens, s], ...], "method": [[tokens, s, steps, accepted],
    ...]}): what an analysis resamples prompts of (a speedup's interval) and pairs two cells' prompts by. None for
    batches (a batch's rows share their times) or past MLflow's tag length (records.jsonl holds them all)."""
    if batch != 1 or not records:
        return {}
    value = json.dumps({"ids": [r["id"] for r in records],
                        "baseline": [[r["baseline"]["new_tokens"], round(r["baseline"]["time_total"], 4)] for r in records],
                        "method": [[r["method"]["new_tokens"], round(r["method"]["time_total"], 4), r["method"]["steps"],
                                    r["method"]["accepted"]]
                                   for r in records]}, separators=(",", ":"))
    return {PER_PROMPT_TAG: value} if len(value) <= TAG_LENGTH else {}


def _step_metrics(base: GenerationOutput, meth: GenerationOutput, record: dict) -> dict[str, float]:
    return PromptStep(base.stats.tokens_per_s, meth.stats.tokens_per_s, meth.stats.tau, float(record["identical"])).to_metrics()


def _report(results: Results, k: int) -> tuple[dict[str, float], dict[str, str]]:
    """What was measured so far (also of a failed run): the summary, per-prompt records, the battery."""
    files = {"records.jsonl": "".join(json_text(r, indent=None) + "\n" for r in results.records)}
    if results.equivalence is not None:
        files["equivalence.json"] = json_text(results.equivalence.as_dict())
    if results.samples:  # both sides' draws, so a verdict can be re-tested without redrawing them
        files["equivalence-samples.json"] = json_text({side: {"tokens": s.tokens.tolist(), "prompt": s.prompt.tolist(),
                                                              "seconds": s.seconds} for side, s in results.samples.items()}, indent=None)
    return (flatten(results.record(k)) if results.records else {}), files
