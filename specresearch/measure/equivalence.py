"""The distribution-equivalence battery inside a run (stats.samples > 0, temperature > 0): baseline and
method samples drawn in batched rows (samples=auto: until the position df asks for no more), scored by
teacher forcing, tested (specresearch.stats.battery), with the A/A calibration."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specresearch.engine import Engine
from specresearch.measure.results import Results
from specresearch.models import default_cache_dir
from specresearch.seeding import stream_seed
from specresearch.stats import (
    Conditionals,
    Report,
    Samples,
    Stream,
    battery,
    calibration,
    family_size,
    numeric_floor,
    position_df,
    sample_engine,
    sample_target,
    samples_for_tv,
    teacher_force,
)
from specresearch.types import SamplingParams

log = logging.getLogger(__name__)

AUTO_ROUNDS = 6  # stats.samples=auto: rounds of baseline draws to reach the N its position df asks for


AUTO_MAX = 100_000  # stats.samples=auto: the most sequences per side (all prompts together) it draws


def equivalence(sc: DictConfig, seed: int, target, method: Engine, prompt_ids: list[list[int]], sampling: SamplingParams,
                results: Results, cache: Path | None = None) -> None:
    """The distribution battery: `sc.samples` continuations of `sc.length` tokens of each of the first
    `sc.prompts` prompts, from the target alone and from the method (both batched, `sc.batch` rows at a
    time); both scored by teacher forcing; tests against each other and against the target's
    conditionals. With samples=auto, N is the one at which the position tests detect a TV of `sc.tv`
    with `sc.power` (see `auto_samples`). With `sc.aa_repeats`, also the A/A calibration (baseline
    against baseline, fresh streams each time: `aa_report`). Fills `results`.

    Every draw is a stream of `seed` (`specresearch.seeding.stream_seed`) named by its `Stream`: the
    baseline, auto's rounds, the method (one stream per sample: `sample_seeds`), each side's scoring,
    the A/A sides of each repeat; so runs with seeds s and s + 1 share none.

    `cache` (stats.reuse_baseline: `baseline_cache`): where the baseline's side (its samples, their
    scores, N) is kept; read back instead of drawn when an identical earlier run left it, so a sweep of
    methods at one temperature samples the target once."""
    prompts = prompt_ids[: sc.prompts]
    rows = stats_rows(sc.batch, method.kv.vocab_size)  # per call
    auto = sc.samples == "auto"
    kept = Baseline.load(cache) if cache is not None and cache.is_file() else None
    if kept is not None:
        base, base_cond, n = kept.samples, kept.conditionals, kept.n
        log.info(f"equivalence: reusing the baseline's {len(base.tokens)} sequences and their scores from an identical earlier "
                 f"run ({cache})")
    else:
        n = sc.samples if not auto else -(-samples_for_tv(sc.tv, 1, sc.length, sc.alpha, sc.power) // len(prompts))
        with tqdm(total=n * len(prompts), desc="equivalence samples: baseline", unit="sample") as b:
            parts = baseline_samples(target, prompts, n, sc.length, sampling, seed, rows, progress=b.update)
            if auto:
                parts, n = auto_samples(parts, n, lambda more, r: baseline_samples(target, prompts, more, sc.length, sampling, seed, rows,
                                                                                   Stream.AUTO, r, b.update), sc, b)
            base, base_cond = Samples.concat(parts), score(target, prompts, parts, sampling, seed, rows, Stream.BASELINE)
        if cache is not None:
            Baseline(base, base_cond, n).save(cache)
    with tqdm(total=n * len(prompts), desc="equivalence samples: method", unit="sample") as b:
        meth_parts = method_samples(method, prompts, n, sc.length, seed, rows, b.update)
    meth = Samples.concat(meth_parts)
    results.samples.update(baseline=base, method=meth)
    floor = None
    if sc.floor:
        k = int(getattr(method.drafter, "k", 0) or 0)  # a verification forward's queries: the newest token and k drafts
        floor = numeric_floor(target, prompts, [base.tokens[base.prompt == i][: sc.floor] for i in range(len(prompts))], sampling,
                              k + 1, rows)
    results.equivalence = battery(base, base_cond, meth, score(target, prompts, meth_parts, sampling, seed, rows, Stream.METHOD),
                                  alpha=sc.alpha, power=sc.power, seed=stream_seed(seed, Stream.PERMUTE), tv=sc.tv, floor=floor)
    if auto:  # the two samples pooled may keep a few categories more than the baseline alone did
        results.equivalence.sized_at_df = position_df(base)
    results.rates.update(samples_per_s_baseline=base.samples_per_s, samples_per_s_method=meth.samples_per_s,
                         baseline_reused=float(kept is not None))
    if sc.aa_repeats:
        reports = [aa_report(target, prompts, n, sc.length, sampling, seed, r, rows, sc.alpha, sc.power, sc.tv)
                   for r in tqdm(range(sc.aa_repeats), desc="A/A calibration", unit="repeat")]
        results.calibration.update(calibration(reports, sc.alpha))


@dataclass
class Baseline:
    """The battery's baseline side as a run leaves it for reuse: the target's samples, their teacher-forced
    conditionals, and N per prompt (auto's, where it sized N)."""

    samples: Samples
    conditionals: Conditionals
    n: int

    FIELDS = ("logp", "entropy", "m2", "pit", "rank")

    def save(self, path: Path) -> None:
        """Write it (numpy's npz, through a temporary file: a reader never sees half of one); a cache that
        cannot be written costs the reuse, not the run."""
        arrays = {f: getattr(self.conditionals, f) for f in self.FIELDS}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            part = path.with_suffix(".part.npz")
            np.savez(part, tokens=self.samples.tokens, prompt=self.samples.prompt, seconds=self.samples.seconds, n=self.n, **arrays)
            part.replace(path)
        except OSError as err:
            log.warning(f"equivalence: the baseline's samples could not be kept for reuse ({path}: {err})")

    @classmethod
    def load(cls, path: Path) -> Baseline:
        with np.load(path) as z:
            return cls(Samples(z["tokens"], z["prompt"], float(z["seconds"])), Conditionals(*(z[f] for f in cls.FIELDS)), int(z["n"]))


def baseline_cache(cfg: DictConfig, target, prompts: list[list[int]], sampling: SamplingParams) -> Path:
    """Where the battery's baseline side of run `cfg` is kept for reuse: keyed by everything it depends on
    (the target and its resolved dtype and device, the prompts' tokens, sampling, seed, N or auto's sizing,
    L, rows per call (stats.batch), the sampling and scoring code and the sampler's, library versions), never by the method."""
    import torch
    import transformers

    from specresearch import __version__
    from specresearch import sampling as sampler
    from specresearch.stats import samples

    sc = cfg.stats
    key = json.dumps({
        "model": OmegaConf.to_container(cfg.model, resolve=True), "dtype": str(target.dtype), "device": str(target.device),
        "prompts": prompts[: sc.prompts], "sampling": repr(sampling), "seed": cfg.seed, "samples": sc.samples, "length": sc.length,
        **({"tv": sc.tv, "alpha": sc.alpha, "power": sc.power} if sc.samples == "auto" else {}),
        "batch": sc.batch, "code": [Path(m.__file__).read_text() for m in (samples, sampler)] + [Path(__file__).read_text()],
        "versions": [__version__, torch.__version__, transformers.__version__],
    }, sort_keys=True)
    root = Path(cfg.model.cache_dir).expanduser() if cfg.model.cache_dir else default_cache_dir()
    return root / "battery-baselines" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"


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


def auto_samples(parts: list[Samples], n: int, more: Callable[[int, int], list[Samples]], sc: DictConfig,
                 bar=None) -> tuple[list[Samples], int]:
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
    return Conditionals.concat([teacher_force(target, ids, s.tokens, sampling, seed, batch,
                                              (stream, i) if part is None else (stream, i, part))
                                for i, (ids, s) in enumerate(zip(prompts, parts))])


def format_calibration(c: dict[str, float], alpha: float) -> str:
    """The A/A calibration's line (c: stats.calibration())."""
    return (
        f"A/A calibration: the baseline against itself {c['repeats']:.0f} times: rejected {c['rejections']:.0f} "
        f"({c['rate']:.1%}, 95% CI {c['rate_ci_low']:.1%}-{c['rate_ci_high']:.1%}) at nominal alpha={alpha}; "
        f"p(rate > alpha) = {c['p_rate_above_alpha']:.2g}; "
        f"uniformity of the surprisal test's p-values: p = {c['p_uniform_surprisal_z']:.2g}"
    )
