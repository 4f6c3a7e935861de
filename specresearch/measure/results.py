"""A run's results: the per-prompt records and sums of baseline and method (`Results`), and the table
printed at its end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from omegaconf import DictConfig

from specresearch.data import Prompt
from specresearch.metrics import SpecStats, first_divergence, predict
from specresearch.records import Group, SpeedRecord, flatten
from specresearch.stats import (
    Report,
    Samples,
)
from specresearch.types import GenerationOutput, SamplingParams


@dataclass
class Results:
    """Per-prompt records and the sums over prompts, for baseline and method."""

    records: list[dict] = field(default_factory=list)
    equivalence: Report | None = None  # the distribution battery (stats.samples > 0, temperature > 0)
    samples: dict[str, Samples] = field(default_factory=dict)  # the battery's draws: "baseline" and "method"
    rates: dict[str, float] = field(default_factory=dict)  # the battery's sampling speed (samples_per_s_baseline, ..._method)
    calibration: dict[str, float] = field(default_factory=dict)  # the A/A calibration (stats.calibration), when run
    distortion: dict[str, float] = field(default_factory=dict)  # exact distortion (stats.distortion), when run
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
            distortion=self.distortion,
        )


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
            f"{r.compiled_baseline_tokens_per_s / b.tokens_per_s:.2f}x the baseline)"
            if math.isfinite(r.compiled_baseline_tokens_per_s) else
            "(compiled plain decoding not timed: compiled_reference=true times it)"),
        (f"Leviathan prediction            {r.leviathan_speedup:.2f}x   from alpha per tried token={m.alpha_token:.3f}, "
         f"k={r.k:.0f}, c={r.draft_cost_ratio_c:.3f}, v={r.verify_cost_v:.3f}"
         + (f"; its best k: {r.leviathan_optimal_k:.0f} ({r.leviathan_optimal_speedup:.2f}x)" if r.leviathan_optimal_k else "")
         if math.isfinite(r.leviathan_speedup) else
         "Leviathan prediction            n/a     (its model is a chain of k draft tokens every step; this drafter's steps "
         "drafted trees or chains of other lengths)"),
        *([f"Sequoia prediction              {r.predicted_speedup:.2f}x   (drafter.shape=auto: the draft sized for this machine, "
           f"{m.nodes_per_step:.1f} nodes per verification; measured: the speedup above)"]
          if math.isfinite(r.predicted_speedup) else []),
        f"tau={m.tau:.2f}  alpha (accepted / drafted)={m.alpha:.3f}  acceptance by draft position: {by_pos}",
        f"method time split: {split}",
        f"greedy identity: {identity}",
    ]
    return "\n".join(lines)
