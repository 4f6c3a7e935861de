"""Samples of the first L new tokens of a prompt, and the target's exact conditionals along them.

The baseline draws N sequences in batches from the target alone, sharing one prefill of the prompt
(held once, every row attending over it: specresearch.attention);
a speculative method draws them in batches through the engine's batch API (its prefill kept and
restored), sample j of prompt i from its own stream (`sample_seeds`) whatever the batch size.
`teacher_force` then scores every sequence with the target in one batched pass per chunk, so the
tests see p_t at each position independently of the code that produced the tokens.

Every draw comes from a stream of the run's seed (`specresearch.seeding.stream_seed`) keyed by what
it is for (`Stream`), the prompt's index and the sample's or round's: so runs with seeds s and s + 1,
the two sides of a comparison and the rounds of one side share no stream.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache

from specresearch.attention import SharedPrefix, shares_prefix
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM, decode_batch
from specresearch.models import LoadedModel
from specresearch.sampling import logits_to_probs, sample
from specresearch.seeding import stream_seed
from specresearch.types import SamplingParams


class Stream(IntEnum):
    """The named streams of the equivalence battery's draws (and of exact distortion's): the first key of
    `stream_seed(seed, stream, ...)`."""

    BASELINE = 1  # the target's own samples (sample_target): key (BASELINE, prompt, 0)
    METHOD = 2  # the method's samples (sample_engine): sample j of prompt i, key (METHOD, i, j)
    SCORE = 3  # teacher forcing's PIT uniforms: key (SCORE, *the scored side's key)
    AA_A = 4  # A/A calibration, repeat r, side a (sample_target): key (AA_A, prompt, r)
    AA_B = 5  # ... side b: key (AA_B, prompt, r)
    AUTO = 6  # stats.samples=auto: the baseline's extra draws of round r (sample_target): key (AUTO, prompt, r)
    PERMUTE = 7  # the battery's relabellings (its noise floor of the position TV): key (PERMUTE,)
    DISTORTION = 8  # exact distortion's continuations (stats.distortion.continuations): key (DISTORTION, prompt)
    FORCED = 9  # the drafter's own draws in a distortion run: row b's key (FORCED, b)


@dataclass
class Samples:
    """N sequences of the first L new tokens, and what it cost to draw them."""

    tokens: np.ndarray  # [N, L] int64
    prompt: np.ndarray  # [N] index of the prompt each sequence continues
    seconds: float  # wall time of the drawing

    @property
    def samples_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("nan")

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        return Samples(
            np.concatenate([s.tokens for s in parts]), np.concatenate([s.prompt for s in parts]), sum(s.seconds for s in parts)
        )


@dataclass
class Conditionals:
    """The target's law p_t at each sampled token x_t (by teacher forcing), reduced to what the tests need."""

    logp: np.ndarray  # [N, L] log p_t(x_t); -inf where the target gives x_t probability 0
    entropy: np.ndarray  # [N, L] H_t = −Σ p log p
    m2: np.ndarray  # [N, L] Σ p log² p (the surprisal's second moment)
    pit: np.ndarray  # [N, L] randomized PIT: F_t(x_t−) + U·p_t(x_t), i.i.d. U(0, 1) when x_t ~ p_t
    rank: np.ndarray  # [N, L] 1 + the number of tokens the target prefers to x_t

    @staticmethod
    def concat(parts: list[Conditionals]) -> Conditionals:
        return Conditionals(*(np.concatenate([getattr(c, f) for c in parts]) for f in ("logp", "entropy", "m2", "pit", "rank")))


@torch.inference_mode()
def sample_target(
    lm: LoadedModel, prompt: list[int], n: int, length: int, sampling: SamplingParams, seed: int, batch: int = 64, prompt_index: int = 0,
    progress: Callable[[int], None] | None = None, stream: int = Stream.BASELINE, part: int = 0,
) -> Samples:
    """Draw `n` continuations of `length` tokens from the target alone, `batch` at a time, after one
    prefill of the prompt (EOS does not stop a sequence: every method is sampled the same way).

    The draws come from one generator, stream (seed, stream, prompt_index, part) of
    `specresearch.seeding.stream_seed`, consumed batch after batch (so they depend on `batch`).

    Args:
        lm: the target.
        prompt: the prompt's token ids.
        n: sequences to draw.
        length: new tokens per sequence.
        sampling: temperature / top-k / top-p.
        seed: the run's seed.
        batch: rows per call.
        prompt_index: recorded with each sequence (which prompt it continues), and keys its stream.
        progress: if given, called with the number of sequences drawn after each batch (a bar's update).
        stream: what the draws are for (`Stream`: the baseline, an A/A side, auto's rounds).
        part: which draw of that stream for this prompt (auto's round, the A/A repeat).

    Returns:
        The tokens ([n, length]) and the wall time, prefill included.
    """
    rng = torch.Generator(device=lm.device).manual_seed(stream_seed(seed, stream, prompt_index, part))
    t0 = time.perf_counter()
    shared = SharedPrompt(lm, prompt)
    p1 = logits_to_probs(shared.logits, sampling)  # [1, V]
    out = []
    for b in _chunks(n, batch):
        x = sample(p1.expand(b, -1), rng)[:, None]  # [b, 1]
        if length > 1:
            cache, prefix = shared.rows(b)
            x = torch.cat([x, decode_batch(lm, cache, x, length - 1, sampling, rng, positions=shared.positions(b, 1),
                                           prefix=prefix)[0]], 1)  # [b, L]
        out.append(x.cpu())
        if progress is not None:
            progress(b)
    tokens = torch.cat(out).numpy()
    return Samples(tokens, np.full(n, prompt_index), time.perf_counter() - t0)


def sample_seeds(seed: int, n: int, prompt_index: int = 0, stream: int = Stream.METHOD) -> list[int]:
    """The seeds of `sample_engine`'s n samples of one prompt: sample j's is stream (seed, stream,
    prompt_index, j) of `specresearch.seeding.stream_seed`, so no two samples, prompts, streams or
    seeds share one."""
    return [stream_seed(seed, stream, prompt_index, j) for j in range(n)]


def sample_engine(
    engine: Engine, prompt: list[int], n: int, length: int, seed: int, batch: int = 32, prompt_index: int = 0,
    progress: Callable[[int], None] | None = None, stream: int = Stream.METHOD,
) -> Samples:
    """Draw `n` continuations of `length` tokens through a speculative engine, `batch` rows per
    `Engine.generate` call (no EOS or stop string ends them).

    Sample j is seeded `sample_seeds(seed, n, prompt_index, stream)[j]` whatever the batch, and a
    batch's row b is what `generate(prompt, seed=seeds[b])` returns, so the samples do not depend on
    `batch` (exactly at fp32). Every token
    comes from the method's own draft-and-verify steps (Engine.generate's sample_first=False: the
    prompt's last token stands for the newest one sampled), so the first position tests the method
    too, not the plain prefill; a one-token prompt cannot, and gets its first token from the prefill.

    Args:
        engine: the method.
        prompt: the prompt's token ids.
        n: sequences to draw.
        length: new tokens per sequence.
        seed: the run's seed: sample j's stream is (seed, stream, prompt_index, j).
        batch: rows per generate call (stats.batch).
        prompt_index: recorded with each sequence (which prompt it continues), and keys its streams.
        progress: if given, called with the number of sequences drawn after each batch (a bar's update).
        stream: what the samples are for (`Stream.METHOD` unless told).

    Returns:
        The tokens ([n, length]) and the wall time of the drawing.
    """
    if batch < 1:
        raise SpecResearchError(f"sample_engine needs batch >= 1 (stats.batch), got {batch}")
    t0 = time.perf_counter()
    seeds = sample_seeds(seed, n, prompt_index, stream)
    rows: list[list[int]] = []
    for start, b in zip(range(0, n, batch), _chunks(n, batch)):
        outs = engine.generate([list(prompt)] * b, length, eos_token_ids=[], seed=seeds[start : start + b],
                               reuse_prefill=True, sample_first=len(prompt) < 2)
        rows.extend(out.tokens for out in outs)
        if progress is not None:
            progress(b)
    return Samples(np.asarray(rows, dtype=np.int64).reshape(n, length), np.full(n, prompt_index), time.perf_counter() - t0)


TEACHER_ELEMENTS = 2**25  # the most probabilities (float32: 128 MiB per [b, L, V] tensor) teacher forcing holds at once


@torch.inference_mode()
def teacher_force(
    lm: LoadedModel, prompt: list[int], tokens: np.ndarray, sampling: SamplingParams, seed: int, batch: int = 32,
    key: tuple[int, ...] = (),
) -> Conditionals:
    """Score sequences with the target: at each position the law p_t (after the run's temperature,
    top-k and top-p), and from it the quantities the one-sample tests use.

    Args:
        lm: the target.
        prompt: the prompt the sequences continue.
        tokens: [N, L] sampled continuations.
        sampling: the sampling settings the sequences were drawn with.
        seed: seeds the PIT's uniform draws, from stream (seed, Stream.SCORE, *key) of
            `specresearch.seeding.stream_seed`, so they are independent of the draws that made `tokens`
            even when those were seeded with `seed` too (the same stream would make U the sampler's own
            uniform: the PIT is then not uniform).
        batch: sequences per forward (fewer where their laws, [batch, L, V], would pass TEACHER_ELEMENTS).
        key: the scored side's stream key (e.g. (Stream.METHOD, prompt index)), so each side and prompt
            scored with one seed gets its own uniforms.
    """
    rng = torch.Generator().manual_seed(stream_seed(seed, Stream.SCORE, *key))
    shared = SharedPrompt(lm, prompt)
    batch = max(1, min(batch, TEACHER_ELEMENTS // (tokens.shape[1] * shared.logits.shape[-1])))  # [b, L, V] laws: bounded
    parts = []
    for start, b in zip(range(0, len(tokens), batch), _chunks(len(tokens), batch)):
        x = torch.as_tensor(tokens[start : start + b], device=lm.device)  # [b, L]
        logits = shared.logits.expand(b, 1, -1)  # [b, 1, V]
        if x.shape[1] > 1:
            cache, prefix = shared.rows(b)
            more = lm.model(input_ids=x[:, :-1], cache=cache, use_cache=True, position_ids=shared.positions(b, x.shape[1] - 1),
                            **({"prefix": prefix} if prefix is not None else {})).logits  # [b, L-1, V]
            logits = torch.cat([logits, more], 1)  # [b, L, V]
        parts.append(_reduce(logits_to_probs(logits, sampling), x, rng))
    return Conditionals.concat(parts)


def _reduce(p: Tensor, x: Tensor, rng: torch.Generator) -> Conditionals:
    """[b, L, V] laws and [b, L] tokens → the per-token quantities (float64 on the host). The laws are
    read in float32 (as they were drawn from) and summed in float64: each sum is one pass over them."""
    f64 = torch.float64
    p = p.float()
    px = p.gather(-1, x[..., None])  # [b, L, 1]
    log_p = p.clamp_min(torch.finfo(p.dtype).tiny).log()  # [b, L, V] (p log p = 0 where p = 0)
    p_log_p = p * log_p
    entropy = -p_log_p.sum(-1, dtype=f64)  # H = −Σ p log p
    m2 = (p_log_p * log_p).sum(-1, dtype=f64)  # Σ p log² p
    above = p > px  # [b, L, V] tokens the target prefers to x
    ties = (p == px) & (torch.arange(p.shape[-1], device=p.device) < x[..., None])  # as likely, a smaller id: before x too
    px = px[..., 0].to(f64)  # [b, L]
    before = torch.where(above, p, 0).sum(-1, dtype=f64) + ties.sum(-1) * px  # F(x−) in the order "more likely first, ties by id"
    u = torch.rand(px.shape, generator=rng, dtype=f64).to(p.device)
    pit = before + u * px
    with np.errstate(divide="ignore"):
        logp = np.log(px.cpu().numpy())
    to_np = lambda t: t.cpu().numpy()  # noqa: E731
    return Conditionals(logp, to_np(entropy), to_np(m2), to_np(pit), to_np(above.sum(-1) + 1))


class SharedPrompt:
    """One prefill of a prompt that many rows continue: held once where the model's attention can share
    it (specresearch.attention), else copied into each batch of rows."""

    def __init__(self, lm: LoadedModel, prompt: list[int]):
        target = CachedLM(lm, static=False)
        target.reset()
        self.logits = target.prefill_rows([torch.tensor(prompt, device=lm.device)])  # [1, V]
        self.lm, self.cache, self.length = lm, target.cache, len(prompt)
        self.prefix = SharedPrefix.of(self.cache, self.length) if shares_prefix(lm.model) else None

    def rows(self, b: int) -> tuple[DynamicCache, SharedPrefix | None]:
        """A cache for `b` rows that continue the prompt, and the prefix they attend over (None: the cache holds the prompt)."""
        if self.prefix is not None:
            return DynamicCache(config=self.lm.model.config), self.prefix
        cache = copy.deepcopy(self.cache)
        cache.batch_repeat_interleave(b)
        return cache, None

    def positions(self, b: int, n: int) -> Tensor:
        """[b, n] the position ids of the first n tokens after the prompt."""
        return (self.length + torch.arange(n, device=self.lm.device)).expand(b, n)


def _chunks(n: int, size: int) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]
