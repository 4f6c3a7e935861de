"""What a run records, in one place: the tags every run carries and the typed records of its results.

Written by the application layer (specresearch.app, the trackers, the sweeps) and read by the
analysis (specresearch.analysis) with the same names, so the two cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
from dataclasses import asdict, dataclass, field, fields

from omegaconf import DictConfig, OmegaConf

# --- tags ------------------------------------------------------------------------------------------
HASH_TAG = "specresearch.config_hash"  # sha256 of the resolved config (config_hash): what resume matches
STUDY_TAG = "specresearch.study"  # the study preset a run belongs to (cfg.study)
SWEEP_TAG = "specresearch.sweep"  # "true" on a sweep's parent run
HOST_TAG, PID_TAG = "specresearch.host", "specresearch.pid"  # where a run's process runs: resume tells a killed job from a live one
JOB_TAG = "specresearch.job."  # + job number, on the parent run: "finished", "skipped <run id>" or "failed: <why>"
INTERRUPTED_TAG = "specresearch.interrupted"  # "true" on a RUNNING run that resume found with its process gone
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: a sweep's job run names its parent
NOTE_TAG = "mlflow.note.content"  # MLflow's own: the run's description (markdown), shown first on its page
OVERRIDES_TAG = "specresearch.overrides"  # a job's command-line overrides: what a sweep's summary tabulates it by
HASH_EXCLUDED = ("tracker", "resume")  # where a run is recorded, and whether to skip it, do not change what it measures


def process_tags(cfg: DictConfig) -> dict[str, str]:
    """The tags of every run we open, job or sweep parent: this process (host, pid) and the study."""
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}
    if cfg.get("study") is not None:
        tags[STUDY_TAG] = str(cfg.study)
    return tags


def json_text(value, indent: int | None = 2, default=None) -> str:
    """`value` as strict JSON: NaN and ±inf (a rate of nothing, an absent metric) become null, which
    every parser reads (Python's json would write bare NaN, which strict parsers reject); `default`
    as json.dumps's (what to write for an object JSON has no type for)."""

    def strict(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: strict(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [strict(v) for v in x]
        return x

    return json.dumps(strict(value), indent=indent, allow_nan=False, default=default and (lambda x: strict(default(x))))


def config_hash(cfg: DictConfig) -> str:
    """sha256 of the resolved config (JSON, sorted keys) without the top-level keys `tracker` and
    `resume`: two runs with the same hash measured the same thing.

    Args:
        cfg: a composed config (the job's, without the `hydra` node).
    """
    tree = OmegaConf.to_container(cfg, resolve=True)
    for key in HASH_EXCLUDED:
        tree.pop(key, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True, default=str).encode()).hexdigest()


# --- typed run records ---------------------------------------------------------------------------
# A run's results as one typed record, flattened to MLflow metrics by `to_metrics` and read back by
# `from_metrics`: the metric names below are spelled here only. VERSION counts changes of the record
# (metric `record_version`).
VERSION = 1
VERSION_KEY = "record_version"
BASELINE, METHOD = "baseline", "method"  # the two sides: `baseline_*` and `method_*` metrics
GROUP, EQ, AA, DELTA = "group.", "eq_", "aa_", "delta_"  # prefixes of per-category, battery, A/A and delta metrics
ACCEPTANCE_AT = "acceptance_at_"  # + draft position 1, 2, ...
PROMPT = "prompt/"  # + PromptStep's names: one prompt's values, logged as step i
HEADLINE_SECTION = "headline/"  # + a HEADLINE name: its value over the prompts so far, logged as step i
NAN = float("nan")
# The headline metrics. A run logs them first (MLflow lists a run's metrics, and picks the compare
# page's default axis, in logging order); a speed run also logs them as they stand after each prompt
# (step i) as `headline/NAME` (HEADLINE_SECTION), a chart section that sorts before the per-prompt
# values `prompt/*` (PromptStep) and the rest (MLflow's chart view puts "/" sections first, by name).
HEADLINE = ("speedup", "method_tau", "method_alpha", "method_tokens_per_s", "baseline_tokens_per_s", "identity_rate",
            "method_pass_at_1", "delta_pass_at_1")


def headline(summary: dict[str, float]) -> dict[str, float]:
    """The HEADLINE metrics of `summary` that are finite, in HEADLINE's order (names as in `summary`)."""
    keys = {key.replace("@", "_at_"): key for key in summary}
    return {keys[name]: summary[keys[name]] for name in HEADLINE
            if name in keys and isinstance(summary[keys[name]], (int, float)) and math.isfinite(summary[keys[name]])}


def prefixed(values: dict[str, float], prefix: str) -> dict[str, float]:
    """`values` with `prefix` added to every key."""
    return {prefix + key: value for key, value in values.items()}


def unprefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    """The metrics whose name starts with `prefix`, without it."""
    return {key[len(prefix):]: value for key, value in metrics.items() if key.startswith(prefix)}


@dataclass
class SideStats:
    """One side's counters and timings summed over the prompts: SpecStats.summary(), by its names."""

    new_tokens: float = NAN
    prompt_tokens: float = NAN
    steps: float = NAN  # target forwards after the prefill
    drafted: float = NAN
    accepted: float = NAN
    draft_forwards: float = NAN
    nodes_per_step: float = NAN
    tau: float = NAN  # tokens per target forward
    alpha: float = NAN  # accepted / drafted: the share of drafted tokens kept (falls with k)
    rejected: float = NAN  # steps that rejected a draft token
    alpha_token: float = NAN  # Leviathan's α: accepted / tried draft tokens
    tokens_per_s: float = NAN
    time_total: float = NAN
    time_prefill: float = NAN
    time_draft: float = NAN
    time_verify: float = NAN
    time_accept: float = NAN
    time_other: float = NAN
    acceptance: list[float] = field(default_factory=list)  # P(accepted | proposed) at draft position 1, 2, ...

    @classmethod
    def of(cls, summary: dict[str, float]) -> SideStats:
        """From SpecStats.summary(), or from a run's metrics of one side without its prefix."""
        names = {f.name for f in fields(cls)}
        acceptance = []
        while f"{ACCEPTANCE_AT}{len(acceptance) + 1}" in summary:
            acceptance.append(summary[f"{ACCEPTANCE_AT}{len(acceptance) + 1}"])
        return cls(**{k: v for k, v in summary.items() if k in names and k != "acceptance"}, acceptance=acceptance)

    def to_metrics(self, prefix: str) -> dict[str, float]:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "acceptance"}
        values.update({f"{ACCEPTANCE_AT}{i + 1}": rate for i, rate in enumerate(self.acceptance)})
        return prefixed(values, prefix)


@dataclass
class Group:
    """One prompt category's slice of a speed run (MT-bench's categories: Spec-Bench's subtask view)."""

    prompts: float
    speedup: float
    method_tau: float
    method_alpha: float


@dataclass
class SpeedRecord:
    """The results of a speed run (`python -m specresearch`): the two sides, their comparison, the
    Leviathan prediction, the greedy identity, per-category slices, the distribution battery."""

    baseline: SideStats
    method: SideStats
    prompts: float = NAN
    k: float = NAN  # draft tokens per step (0: a drafter without k)
    speedup: float = NAN  # tokens/s of the method / of the baseline
    time_ratio: float = NAN  # total time of the baseline / of the method
    draft_cost_ratio_c: float = NAN
    verify_cost_v: float = NAN
    leviathan_speedup: float = NAN  # Thm 3.8 from the measured alpha_token, k, c, v
    leviathan_optimal_k: float = NAN
    leviathan_optimal_speedup: float = NAN
    predicted_speedup: float = NAN  # a drafter's own prediction (shape=auto, Sequoia's sizing); NaN = none
    identity_rate: float = NAN  # share of prompts whose method output equals the baseline's
    mean_first_divergence: float = NAN
    max_divergence_logit_gap: float = NAN
    groups: dict[str, Group] = field(default_factory=dict)  # prompt category -> its slice
    equivalence: dict[str, float] = field(default_factory=dict)  # stats.Report.summary() and sampling rates
    calibration: dict[str, float] = field(default_factory=dict)  # stats.calibration(): the A/A calibration
    version: int = VERSION

    SCALARS = ("prompts", "k", "speedup", "time_ratio", "draft_cost_ratio_c", "verify_cost_v", "leviathan_speedup",
               "leviathan_optimal_k", "leviathan_optimal_speedup", "predicted_speedup", "identity_rate", "mean_first_divergence",
               "max_divergence_logit_gap")

    def to_metrics(self) -> dict[str, float]:
        """The flat MLflow metrics: `baseline_*`, `method_*`, the scalars, `group.CATEGORY.*`, `eq_*`, `aa_*`."""
        out = {**self.baseline.to_metrics(f"{BASELINE}_"), **self.method.to_metrics(f"{METHOD}_")}
        out.update({name: getattr(self, name) for name in self.SCALARS})
        for category, group in self.groups.items():
            out.update(prefixed(asdict(group), f"{GROUP}{category}."))
        out.update({**prefixed(self.equivalence, EQ), **prefixed(self.calibration, AA), VERSION_KEY: self.version})
        return out

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> SpeedRecord:
        """Read a speed run's metrics back; a name it lacks reads as NaN.

        Args:
            metrics: the run's metrics, as MLflow keeps them.
        """
        groups: dict[str, dict[str, float]] = {}
        for key, value in unprefixed(metrics, GROUP).items():
            category, _, name = key.rpartition(".")
            groups.setdefault(category, {})[name] = value
        record = cls(SideStats.of(unprefixed(metrics, f"{BASELINE}_")), SideStats.of(unprefixed(metrics, f"{METHOD}_")),
                     **{name: metrics.get(name, NAN) for name in cls.SCALARS},
                     groups={c: Group(**{f.name: g.get(f.name, NAN) for f in fields(Group)}) for c, g in groups.items()},
                     equivalence=unprefixed(metrics, EQ), calibration=unprefixed(metrics, AA),
                     version=int(metrics.get(VERSION_KEY, VERSION)))
        return record


@dataclass
class PromptStep:
    """One prompt of a speed run, logged as step i (MLflow draws each as a curve over the prompts)."""

    baseline_tokens_per_s: float
    method_tokens_per_s: float
    tau: float
    identical: float

    def to_metrics(self) -> dict[str, float]:
        """`prompt/*` metrics; NaN ones (a prompt with no new token) left out."""
        return {f"{PROMPT}{k}": float(v) for k, v in asdict(self).items() if not math.isnan(v)}


@dataclass
class EvalSide:
    """One side of a quality run: the task's scores and the decoding speed of its generations."""

    scores: dict[str, float]  # lm-eval's metric names ("pass@1", "pass@1_stderr"); MLflow spells "@" as "_at_"
    tokens_per_s: float = NAN
    tau: float = NAN
    alpha: float = NAN
    new_tokens: float = NAN

    SPEED = ("tokens_per_s", "tau", "alpha", "new_tokens")

    @classmethod
    def of(cls, scores: dict[str, float], summary: dict[str, float]) -> EvalSide:
        """From lm-eval's scores and the side's SpecStats.summary()."""
        return cls(dict(scores), **{key: summary[key] for key in cls.SPEED})

    def score(self, name: str) -> float:
        """A score by lm-eval's name or by MLflow's spelling of it ("pass@1" or "pass_at_1")."""
        return self.scores.get(name, self.scores.get(name.replace("@", "_at_"), NAN))


@dataclass
class EvalRecord:
    """The results of a quality run (`eval=NAME`): each side's scores, the method's deltas, the paired
    test; the paired part only when both sides ran (None: not recorded)."""

    sides: dict[str, EvalSide]  # "baseline" (absent with eval.baseline=false), "method"
    problems: float | None = None
    delta: dict[str, float] = field(default_factory=dict)  # score -> method − baseline
    method_only: float | None = None  # problems only the method solves
    baseline_only: float | None = None  # problems only the baseline solves
    mcnemar_p: float | None = None  # exact McNemar test of the two
    identity_rate: float | None = None  # share of identical completions
    speedup: float | None = None  # only when the baseline was measured in the same run
    baseline_reused: float | None = None  # 1.0: the baseline's side came from an earlier identical run
    version: int = VERSION

    PAIRED = ("method_only", "baseline_only", "mcnemar_p", "identity_rate", "speedup", "baseline_reused")

    def to_metrics(self) -> dict[str, float]:
        """The flat metrics: `SIDE_SCORE`, `SIDE_tokens_per_s` (tau, alpha, new_tokens), `problems`,
        `delta_SCORE` and the paired test's names."""
        out: dict[str, float] = {}
        for name, side in self.sides.items():
            out.update(prefixed({**side.scores, **{k: getattr(side, k) for k in EvalSide.SPEED}}, f"{name}_"))
        values = {"problems": self.problems, **prefixed(self.delta, DELTA), **{k: getattr(self, k) for k in self.PAIRED}}
        return {**out, **{k: v for k, v in values.items() if v is not None}, VERSION_KEY: self.version}

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> EvalRecord:
        """Read a quality run's metrics back (scores in MLflow's spelling: "pass_at_1")."""
        own = {k: v for k, v in metrics.items() if k not in cls.PAIRED}
        sides = {}
        for name in (BASELINE, METHOD):
            values = unprefixed(own, f"{name}_")
            if values:
                speed = {k: values.pop(k) for k in EvalSide.SPEED if k in values}
                sides[name] = EvalSide(values, **speed)
        return cls(sides, metrics.get("problems"), unprefixed(metrics, DELTA), **{k: metrics.get(k) for k in cls.PAIRED},
                   version=int(metrics.get(VERSION_KEY, VERSION)))

    def score(self, side: str, name: str) -> float:
        """A side's score (NaN when that side did not run)."""
        return self.sides[side].score(name) if side in self.sides else NAN

    def delta_of(self, name: str) -> float:
        return self.delta.get(name, self.delta.get(name.replace("@", "_at_"), NAN))
