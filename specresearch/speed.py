"""One experiment: the same prompts decoded by the autoregressive baseline and by the method,
interleaved prompt by prompt so machine noise hits both alike; results printed and tracked."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specresearch import settings
from specresearch.build import build, build_engine, claim_params
from specresearch.models import check_model_files, check_tiny_args, machine_tags
from specresearch.data import Prompt, encode, load_prompts
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.metrics import SpecStats, first_divergence, predict
from specresearch.records import HEADLINE_SECTION, Group, PromptStep, SpeedRecord, flatten, headline, json_text, prefixed
from specresearch.seeding import stream_seed
from specresearch.stats import (
    Conditionals, Report, Samples, Stream, battery, calibration, family_size, position_df, sample_engine, sample_target, samples_for_tv,
    teacher_force,
)
from specresearch.target import StaticSlots, Target
from specresearch.tracking import browse_line, tracked_run
from specresearch.types import GenerationOutput, SamplingParams

log = logging.getLogger(__name__)


@dataclass
class Results:
    """Per-prompt records and the sums over prompts, for baseline and method."""

    records: list[dict] = field(default_factory=list)
    equivalence: Report | None = None  # the distribution battery (stats.samples > 0, temperature > 0)
    rates: dict[str, float] = field(default_factory=dict)  # the battery's sampling speed (samples_per_s_baseline, ..._method)
    calibration: dict[str, float] = field(default_factory=dict)  # the A/A calibration (stats.calibration), when run
    baseline: SpecStats = field(default_factory=SpecStats)
    method: SpecStats = field(default_factory=SpecStats)
    identical: int = 0  # prompts whose method output equals the baseline's, token for token
    divergences: list[int] = field(default_factory=list)  # first differing position, per differing prompt
    gaps: list[float] = field(default_factory=list)  # target logit gap at that position, per differing prompt
    groups: dict[str, list[SpecStats]] = field(default_factory=dict)  # prompt category -> [baseline, method] (MT-bench)
    predicted_speedup: float = float("nan")  # the drafter's own prediction (shape=auto), if it makes one
    batch_size: int = 1  # prompts decoded together
    row_baseline: SpecStats = field(default_factory=SpecStats)  # the rows' own records summed (each row's time: its latency)
    row_method: SpecStats = field(default_factory=SpecStats)
    compiled: SpecStats = field(default_factory=SpecStats)  # plain decoding compiled (compiled_reference), when timed

    def add_batch(self, prompts: list[Prompt], bases: list[GenerationOutput], meths: list[GenerationOutput],
                  gaps: list[float | None], compiled: list[GenerationOutput] | None = None) -> list[dict]:
        """Record one batch (each side decoded its prompts together): the totals count the batch's
        tokens over its wall time (`SpecStats.of_batch`); the rows' own records are kept too.
        `compiled`: the compiled plain decoding of the same prompts, when timed."""
        self.baseline = self.baseline.merge(SpecStats.of_batch([o.stats for o in bases]))
        self.method = self.method.merge(SpecStats.of_batch([o.stats for o in meths]))
        if compiled:
            self.compiled = self.compiled.merge(SpecStats.of_batch([o.stats for o in compiled]))
        return [self.add(*row) for row in zip(prompts, bases, meths, gaps)]

    def add(self, prompt: Prompt, base: GenerationOutput, meth: GenerationOutput, gap: float | None = None) -> dict:
        """Record one prompt (of a batch: `add_batch` counted the totals); `gap` is the target's logit
        gap between the two tokens at the first divergence (see `divergence_gap`)."""
        self.row_baseline = self.row_baseline.merge(base.stats)
        self.row_method = self.row_method.merge(meth.stats)
        category = prompt.meta.get("category")
        if category is not None:
            b, m = self.groups.get(category, (SpecStats(), SpecStats()))
            self.groups[category] = [b.merge(base.stats), m.merge(meth.stats)]
        diverge = first_divergence(base.tokens, meth.tokens)
        if diverge is None:
            self.identical += 1
        else:
            self.divergences.append(diverge)
        if gap is not None:
            self.gaps.append(gap)
        record = {
            "id": prompt.id,
            "category": category,
            "prompt_tokens": base.stats.prompt_tokens,
            "identical": diverge is None,
            "first_divergence": diverge,
            "divergence_logit_gap": gap,
            "baseline": {**flatten(base.stats), "stop_reason": base.stop_reason, "text": base.text},
            "method": {**flatten(meth.stats), "stop_reason": meth.stop_reason, "text": meth.text},
        }
        self.records.append(record)
        return record

    def record(self, k: int) -> SpeedRecord:
        """The run's record so far: speedup as the ratio of tokens per second (of total times when the outputs
        are the same length: greedy), and the Leviathan prediction from the
        measured α, draft cost ratio c and verification cost v (both relative to one baseline forward)."""
        base, meth = self.baseline, self.method
        pred = predict(base, meth, k)
        n = len(self.records)
        compiled = self.compiled.tokens_per_s if self.compiled.new_tokens else float("nan")
        fastest = max(base.tokens_per_s, compiled) if math.isfinite(compiled) else base.tokens_per_s
        return SpeedRecord(
            baseline=base,
            method=meth,
            prompts=n,
            k=k,
            # per token: at T > 0 the method and the baseline stop at different lengths
            speedup=meth.tokens_per_s / base.tokens_per_s if base.tokens_per_s else float("nan"),
            compiled_baseline_tokens_per_s=compiled,
            speedup_vs_fastest_plain=meth.tokens_per_s / fastest if fastest else float("nan"),
            time_ratio=base.time_total / meth.time_total if meth.time_total else float("nan"),
            draft_cost_ratio_c=pred.c,
            verify_cost_v=pred.v,
            leviathan_speedup=pred.speedup,
            leviathan_optimal_k=pred.best_k,
            leviathan_optimal_speedup=pred.best_speedup,
            predicted_speedup=self.predicted_speedup,
            batch_size=self.batch_size,
            baseline_row_tokens_per_s=self.row_baseline.tokens_per_s,
            method_row_tokens_per_s=self.row_method.tokens_per_s,
            identity_rate=self.identical / n if n else float("nan"),
            mean_first_divergence=sum(self.divergences) / len(self.divergences) if self.divergences else float("nan"),
            max_divergence_logit_gap=max(self.gaps) if self.gaps else float("nan"),
            groups={  # Spec-Bench's per-subtask view (MT-bench categories)
                category: Group(prompts=sum(r["category"] == category for r in self.records),
                                speedup=m.tokens_per_s / b.tokens_per_s if b.tokens_per_s else float("nan"),
                                method_tau=m.tau, method_alpha=m.alpha)
                for category, (b, m) in self.groups.items()
            },
            equivalence={**(self.equivalence.summary() if self.equivalence is not None else {}), **self.rates},
            calibration=self.calibration,
        )


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
    tracker.check()  # where results go, before any model loads
    method = build_engine(cfg)
    baseline = build_engine(cfg, baseline=True, target=method.target.lm)
    compiled = compiled_reference(cfg, baseline)
    target, drafter = method.target.lm, method.drafter
    trained_on = trained_on_tags(drafter, prompts)  # refuses heads trained on any of these prompts
    prompt_ids = [encode(target.tokenizer, p) for p in prompts]
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
        if engine.target.lm.compile:  # and a graph made for every width a verification may feed (one token for plain decoding)
            engine.target.reset(len(longest) + cfg.max_new_tokens + 1)
            engine.target.precompile(1 if engine.drafter.k == 0 and not engine.drafter.depth else StaticSlots.COMPILED_WIDTHS[-1],
                                     hidden=engine.drafter.needs_hidden)
    if cfg.warmup:  # first calls pay one-off costs (allocator, kernels, compilation): keep them out of every timing
        log.info(f"warm-up (untimed; warmup=false skips it): {' and '.join(e.label for e in engines)} decode "
                 f"{min(8, cfg.max_new_tokens)} tokens of {len(prompt_ids[:batch])} prompt(s) each, so that one-off costs "
                 "(memory, kernels, compiled graphs) stay out of the timings")
        for engine in engines:  # a compiled engine decodes the longest prompt in full: its draft model's slots grow to their size too
            compiled_run = engine.target.lm.compile
            generate(engine, [longest] if compiled_run else prompt_ids[:batch], 0, cfg.max_new_tokens if compiled_run else min(8, cfg.max_new_tokens))

    results = Results(batch_size=batch)
    tags = {**machine_tags(target), **trained_on}
    with tracked_run(tracker, cfg, label, lambda: _report(results, k), tags=tags, params=claim_params(method)) as tracked:
        per_prompt = len(engines) * cfg.max_new_tokens  # at most: a row may stop early (EOS, a stop string)
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
                progress.update((first + len(ids)) * per_prompt - progress.n)  # rows that stopped early: their tokens never came
            for engine in engines:
                engine.on_tokens = None
        if cfg.stats.samples and not sampling.greedy:
            equivalence(cfg.stats, cfg.seed, target, method, prompt_ids, sampling, results)
    record = results.record(k)
    log.info(format_table(cfg, label, record, results, sampling, target))
    if results.equivalence is not None:
        log.info(results.equivalence.format())
    if "rate" in record.calibration:
        log.info(format_calibration(record.calibration, cfg.stats.alpha))
    elif cfg.stats.samples and sampling.greedy:
        log.info("equivalence at temperature 0: the outputs are deterministic, so it is the greedy identity above")
    browse_line(tracker)
    return flatten(record)


def check_run(cfg: DictConfig) -> list[Prompt]:
    """Everything a speed run can check without loading a model, refused in one line before the run
    waits for the speed lock (the command line calls it before sweeps.job), opens a run or loads
    anything: the settings (settings.check), a local model's files, a tiny model's sizes, the prompts (never fewer than
    asked), whether the longest prompt and max_new_tokens fit a tiny model's positions, a drafter's
    checkpoint files, and what the equivalence battery would need (stats.prompts, stats.samples=auto).

    Returns:
        The prompts (load_prompts(**cfg.dataset)).
    """
    settings.check(cfg)
    tiny = []  # (tokenizer, max positions, its settings' path) of each tiny model
    for path, node in (("model", cfg.get("model")), ("drafter.model", (cfg.get("drafter") or {}).get("model"))):
        if node is not None and node.get("name") not in (None, "tiny"):
            check_model_files(node.name)
        if node is not None and node.get("name") == "tiny":
            given = node.get("tiny")
            tiny.append((*check_tiny_args(OmegaConf.to_container(given, resolve=True) if given is not None else None, f"{path}.tiny"), path))
    prompts = load_prompts(**cfg.dataset)
    for tokenizer, limit, path in [t for t in tiny if t[2] == "model"]:  # the target's (a draft checks its own as it loads)
        length, longest = max((len(encode(tokenizer, p)), p.id) for p in prompts)
        if length + cfg.max_new_tokens > limit:
            room = f"valid are max_new_tokens <= {limit - length} for these prompts" if length < limit else "the prompt alone fills them"
            raise SpecResearchError(f"prompt {longest} ({length} tokens) and max_new_tokens={cfg.max_new_tokens} need "
                                    f"{length + cfg.max_new_tokens} positions, but the tiny model has {limit} "
                                    f"({path}.tiny.max_position_embeddings): {room}")
    drafter = cfg.get("drafter") or {}
    if drafter.get("checkpoint"):  # medusa, eagle: the files now, not after the models load
        from specresearch.drafters.base import check_checkpoint

        from specresearch.drafters.medusa import SHAPE_KEYS

        medusa = "medusa" in str(drafter.get("_target_", "")).lower()
        check_checkpoint("medusa" if medusa else "eagle", Path(str(drafter.checkpoint)).expanduser(), keys=SHAPE_KEYS if medusa else ())
    sc = cfg.get("stats")
    if sc is not None and sc.samples and cfg.sampling.temperature > 0:  # the battery runs
        if sc.prompts > len(prompts):
            raise SpecResearchError(f"stats.prompts={sc.prompts} > the {len(prompts)} prompt(s) this run decodes (dataset.num_prompts, "
                                    f"dataset.offset): valid are stats.prompts <= {len(prompts)}")
        if sc.samples == "auto":
            least = samples_for_tv(sc.tv, 1, sc.length, sc.alpha, sc.power)  # auto's first draw, per side
            if least > AUTO_MAX:
                low = _least_auto_tv(sc)
                raise SpecResearchError(
                    f"stats.samples=auto: a position TV of {sc.tv} needs at least {least:,} sequences per side (length {sc.length}, "
                    f"alpha {sc.alpha}, power {sc.power}), above the {AUTO_MAX:,} that auto draws at most: valid are stats.tv >= "
                    f"{low:.4g} with samples=auto, or an explicit stats.samples=N (sequences per prompt)")
    return prompts


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
    lm = baseline.target.lm
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
    return {"drafter.trained_on.sources": ",".join(record["sources"]), "drafter.trained_on.split": f"{record['split']} ({record['split_rule']})",
            "drafter.trained_on.prompts": str(record["prompts"]), "drafter.trained_on.prompts_sha256": record["prompts_sha256"]}


AUTO_ROUNDS = 6  # stats.samples=auto: rounds of baseline draws to reach the N its position df asks for
AUTO_MAX = 100_000  # stats.samples=auto: the most sequences per side (all prompts together) it draws


def equivalence(sc: DictConfig, seed: int, target, method: Engine, prompt_ids: list[list[int]], sampling: SamplingParams, results: Results) -> None:
    """The distribution battery: `sc.samples` continuations of `sc.length` tokens of each of the first
    `sc.prompts` prompts, from the target alone and from the method (both batched, `sc.batch` rows at a
    time); both scored by teacher forcing; tests against each other and against the target's
    conditionals. With samples=auto, N is the one at which the position tests detect a TV of `sc.tv`
    with `sc.power` (see `auto_samples`). With `sc.aa_repeats`, also the A/A calibration (baseline
    against baseline, fresh streams each time: `aa_report`). Fills `results`.

    Every draw is a stream of `seed` (`specresearch.seeding.stream_seed`) named by its `Stream`: the
    baseline, auto's rounds, the method (one stream per sample: `sample_seeds`), each side's scoring,
    the A/A sides of each repeat; so runs with seeds s and s + 1 share none."""
    prompts = prompt_ids[: sc.prompts]
    rows = stats_rows(sc.batch, method.target.vocab_size)  # per call
    auto = sc.samples == "auto"
    n = sc.samples if not auto else -(-samples_for_tv(sc.tv, 1, sc.length, sc.alpha, sc.power) // len(prompts))
    with tqdm(total=n * len(prompts), desc="equivalence samples: baseline", unit="sample") as b:
        parts = baseline_samples(target, prompts, n, sc.length, sampling, seed, rows, progress=b.update)
        if auto:
            parts, n = auto_samples(parts, n, lambda more, r: baseline_samples(target, prompts, more, sc.length, sampling, seed, rows,
                                                                               Stream.AUTO, r, b.update), sc, b)
        base, base_cond = Samples.concat(parts), score(target, prompts, parts, sampling, seed, rows, Stream.BASELINE)
    with tqdm(total=n * len(prompts), desc="equivalence samples: method", unit="sample") as b:
        meth_parts = method_samples(method, prompts, n, sc.length, seed, rows, b.update)
    meth = Samples.concat(meth_parts)
    results.equivalence = battery(base, base_cond, meth, score(target, prompts, meth_parts, sampling, seed, rows, Stream.METHOD),
                                  alpha=sc.alpha, power=sc.power, seed=stream_seed(seed, Stream.PERMUTE), tv=sc.tv)
    if auto:  # the two samples pooled may keep a few categories more than the baseline alone did
        results.equivalence.sized_at_df = position_df(base)
    results.rates.update(samples_per_s_baseline=base.samples_per_s, samples_per_s_method=meth.samples_per_s)
    if sc.aa_repeats:
        reports = [aa_report(target, prompts, n, sc.length, sampling, seed, r, rows, sc.alpha, sc.power, sc.tv)
                   for r in tqdm(range(sc.aa_repeats), desc="A/A calibration", unit="repeat")]
        results.calibration.update(calibration(reports, sc.alpha))


def baseline_samples(target, prompts: list[list[int]], n: int, length: int, sampling: SamplingParams, seed: int, rows: int,
                     stream: int = Stream.BASELINE, part: int = 0, progress=None) -> list[Samples]:
    """The battery's draws from the target alone: `n` continuations of each prompt, prompt i's from stream
    (seed, stream, i, part) (`sample_target`); one Samples per prompt."""
    return [sample_target(target, ids, n, length, sampling, seed, rows, i, progress, stream, part) for i, ids in enumerate(prompts)]


def method_samples(method: Engine, prompts: list[list[int]], n: int, length: int, seed: int, rows: int, progress=None) -> list[Samples]:
    """The battery's draws from the method: `n` continuations of each prompt, sample j of prompt i from
    stream (seed, Stream.METHOD, i, j) (`sample_engine`, `sample_seeds`); one Samples per prompt."""
    return [sample_engine(method, ids, n, length, seed, rows, i, progress) for i, ids in enumerate(prompts)]


def aa_report(target, prompts: list[list[int]], n: int, length: int, sampling: SamplingParams, seed: int, repeat: int, rows: int,
              alpha: float, power: float, tv: float) -> Report:
    """One repeat of the A/A calibration: the battery (no permutations) on two fresh baseline samples of
    `n` per prompt, side a from streams (seed, Stream.AA_A, prompt, repeat), side b from (seed, Stream.AA_B,
    prompt, repeat): every repeat's, and every seed's, independent of the others."""
    sides = []
    for stream in (Stream.AA_A, Stream.AA_B):
        parts = baseline_samples(target, prompts, n, length, sampling, seed, rows, stream, repeat)
        sides += [Samples.concat(parts), score(target, prompts, parts, sampling, seed, rows, stream, repeat)]
    return battery(*sides, alpha=alpha, power=power, permutations=0, seed=stream_seed(seed, Stream.PERMUTE, repeat), tv=tv)


STATS_ROWS = 256  # stats.batch=auto: rows per call, fewer for large vocabularies
STATS_LAWS = 2**24  # stats.batch=auto: about this many probabilities per position of a call (64 MiB in float32)


def stats_rows(batch: int | str, vocab: int) -> int:
    """stats.batch: the rows drawn per call. auto: STATS_ROWS, or fewer where a call's laws (rows x vocabulary, per
    verified position) would pass STATS_LAWS: 256 for the tiny model, 110 for a 151,936-token vocabulary."""
    return int(batch) if batch != "auto" else max(1, min(STATS_ROWS, STATS_LAWS // vocab))


def auto_samples(parts: list[Samples], n: int, more: Callable[[int, int], list[Samples]], sc: DictConfig, bar=None) -> tuple[list[Samples], int]:
    """stats.samples=auto: grow the baseline's samples per prompt until N per side reaches what the
    position tests need to detect a TV of `sc.tv` with `sc.power` at the degrees of freedom those tests
    will have at that N (`position_df` of the baseline itself; more samples keep more categories, so
    it is repeated, at most AUTO_ROUNDS times, and capped at AUTO_MAX sequences per side).

    Args:
        parts: the baseline's samples, one Samples of `n` sequences per prompt.
        n: sequences per prompt drawn so far (start from the df = 1 bound: no smaller N can do).
        more: more(m, round) draws m more sequences per prompt (fresh seeds per round).
        sc: the stats settings (tv, power, alpha, length).
        bar: a progress bar whose total is raised with N.

    Returns:
        The grown parts and N per prompt.
    """
    prompts = len(parts)
    for r in range(AUTO_ROUNDS):
        df = position_df(Samples.concat(parts))
        need = -(-min(samples_for_tv(sc.tv, df, sc.length, sc.alpha, sc.power), AUTO_MAX) // prompts)
        if need <= n:
            break
        if bar is not None:
            bar.total = need * prompts
            bar.refresh()
        parts = [Samples.concat([p, extra]) for p, extra in zip(parts, more(need - n, r))]
        n = need
    else:
        df = position_df(Samples.concat(parts))
    if samples_for_tv(sc.tv, df, sc.length, sc.alpha, sc.power) > n * prompts:
        log.warning(f"stats.samples=auto: a position TV of {sc.tv} needs {samples_for_tv(sc.tv, df, sc.length, sc.alpha, sc.power)} "
                    f"sequences per side at position df {df}; testing with {n * prompts} (the power report says what it detects)")
    log.info(f"stats.samples=auto: N = {n} per prompt ({n * prompts} per side) for a position TV of {sc.tv} with power "
             f"{sc.power:.0%} at position df {df} (Holm over {family_size(sc.length)} tests at alpha={sc.alpha})")
    return parts, n


def score(target, prompts: list[list[int]], parts: list[Samples], sampling: SamplingParams, seed: int, batch: int, stream: int,
          part: int | None = None) -> Conditionals:
    """Teacher forcing of one side's samples (one Samples per prompt), prompt i's PIT uniforms from stream
    (seed, Stream.SCORE, stream, i[, part]): each side, prompt and A/A repeat its own."""
    return Conditionals.concat([teacher_force(target, ids, s.tokens, sampling, seed, batch, (stream, i) if part is None else (stream, i, part))
                                for i, (ids, s) in enumerate(zip(prompts, parts))])


def format_calibration(c: dict[str, float], alpha: float) -> str:
    """The A/A calibration's line (c: stats.calibration())."""
    return (
        f"A/A calibration: the baseline against itself {c['repeats']:.0f} times: rejected {c['rejections']:.0f} "
        f"({c['rate']:.1%}, 95% CI {c['rate_ci_low']:.1%}-{c['rate_ci_high']:.1%}) at nominal alpha={alpha}; "
        f"p(rate > alpha) = {c['p_rate_above_alpha']:.2g}; uniformity of the surprisal test's p-values: p = {c['p_uniform_surprisal_z']:.2g}"
    )


@torch.inference_mode()
def divergence_gap(lm, prompt: list[int], a: list[int], b: list[int]) -> float | None:
    """Where two greedy outputs first differ, how close was the call? The target's logit of one
    token minus the other's, from a fresh prefill of the prompt and the common prefix (in the run's
    dtype). Near zero means a near-tie that rounding can flip; None when the outputs agree or one
    merely stopped earlier."""
    d = first_divergence(a, b)
    if d is None or d >= min(len(a), len(b)):
        return None
    fresh = Target(lm)
    fresh.reset()
    logits = fresh.prefill_rows([torch.tensor(prompt + a[:d])])[0].float()  # [V]
    return abs(logits[a[d]] - logits[b[d]]).item()


def _step_metrics(base: GenerationOutput, meth: GenerationOutput, record: dict) -> dict[str, float]:
    return PromptStep(base.stats.tokens_per_s, meth.stats.tokens_per_s, meth.stats.tau, float(record["identical"])).to_metrics()


def _report(results: Results, k: int) -> tuple[dict[str, float], dict[str, str]]:
    """What was measured so far (also of a failed run): the summary, per-prompt records, the battery."""
    files = {"records.jsonl": "".join(json_text(r, indent=None) + "\n" for r in results.records)}
    if results.equivalence is not None:
        files["equivalence.json"] = json_text(results.equivalence.as_dict())
    return (flatten(results.record(k)) if results.records else {}), files


def format_table(cfg: DictConfig, label: str, r: SpeedRecord, results: Results, sampling: SamplingParams, target) -> str:
    """The results table printed at the end of a run."""
    b, m = r.baseline, r.method
    n = int(r.prompts)
    rows = [
        ("tokens/s", f"{b.tokens_per_s:.2f}", f"{m.tokens_per_s:.2f}"),
        *([("tokens/s per row", f"{r.baseline_row_tokens_per_s:.2f}", f"{r.method_row_tokens_per_s:.2f}")] if r.batch_size > 1 else []),
        ("new tokens", f"{b.new_tokens:.0f}", f"{m.new_tokens:.0f}"),
        ("wall time (s)", f"{b.time_total:.1f}", f"{m.time_total:.1f}"),
        ("forwards after prefill", f"{b.steps:.0f}", f"{m.steps:.0f}"),
        ("tau (tokens/forward)", f"{b.tau:.2f}", f"{m.tau:.2f}"),
    ]
    split = ", ".join(
        f"{name} {getattr(m, 'time_' + name) / m.time_total:.0%}" for name in SpecStats.TIME_SPLIT
    ) if m.split_timed else "not timed (stats.time_split=false, or auto on a GPU: a device sync per phase would slow the step)"
    by_pos = " ".join(f"{a:.2f}" for a in m.acceptance_at) or "-"
    identity = (
        f"{results.identical}/{n} prompts identical to the baseline"
        + (f" (first divergence at token {min(results.divergences)} at the earliest)" if results.divergences else "")
        + (f"; target logit gap at divergence <= {max(results.gaps):.3f}" if results.gaps else "")
        if sampling.greedy
        else "n/a (sampled decoding: see the distribution tests)"
    )
    width = max(len(row[0]) for row in rows)
    lines = [
        "",
        f"specresearch  {label}  target={cfg.model.name} ({target.dtype}, {target.device})  "
        f"dataset={cfg.dataset.name} x{n}  batch_size={r.batch_size:.0f}  max_new_tokens={cfg.max_new_tokens}  "
        f"sampling: T={sampling.temperature} top_k={sampling.top_k} top_p={sampling.top_p}",
        f"{'':{width}}  {'baseline':>10}  {'method':>10}",
        *(f"{name:{width}}  {x:>10}  {y:>10}" for name, x, y in rows),
        "",
        f"speedup (tokens/s ratio)        {r.speedup:.2f}x   [ratio of total times {r.time_ratio:.2f}x]",
        f"over the fastest plain decoding {r.speedup_vs_fastest_plain:.2f}x   " + (
            "(the baseline is compiled: model.compile=true)" if target.compile else
            f"(compiled plain decoding: {r.compiled_baseline_tokens_per_s:.1f} tokens/s, "
            f"{r.compiled_baseline_tokens_per_s / b.tokens_per_s:.2f}x the baseline)" if math.isfinite(r.compiled_baseline_tokens_per_s) else
            "(compiled plain decoding not timed: compiled_reference=true times it)"),
        (f"Leviathan prediction            {r.leviathan_speedup:.2f}x   from alpha per tried token={m.alpha_token:.3f}, "
         f"k={r.k:.0f}, c={r.draft_cost_ratio_c:.3f}, v={r.verify_cost_v:.3f}"
         + (f"; its best k: {r.leviathan_optimal_k:.0f} ({r.leviathan_optimal_speedup:.2f}x)" if r.leviathan_optimal_k else "")
         if math.isfinite(r.leviathan_speedup) else
         "Leviathan prediction            n/a     (its model is a chain of k draft tokens every step; this drafter's steps "
         "drafted trees or chains of other lengths)"),
        *([f"Sequoia prediction              {r.predicted_speedup:.2f}x   (drafter.shape=auto: the tree sized for this machine, "
           f"{m.nodes_per_step:.1f} nodes per verification; measured: the speedup above)"]
          if math.isfinite(r.predicted_speedup) else []),
        f"tau={m.tau:.2f}  alpha={m.alpha:.3f}  acceptance by draft position: {by_pos}",
        f"method time split: {split}",
        f"greedy identity: {identity}",
    ]
    return "\n".join(lines)
