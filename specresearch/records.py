"""What a run records, in one place: the tags every run carries and the typed records of its results.

Written by the application layer (the runs, the trackers, the sweeps) and read by the
analysis (specresearch.analysis) with the same names, so the two cannot drift apart.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import math
import os
import re
import socket
import subprocess
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specresearch.metrics import SpecStats

# --- tags ------------------------------------------------------------------------------------------
HASH_TAG = "specresearch.config_hash"  # sha256 of the resolved config (config_hash): what resume matches
STUDY_TAG = "specresearch.study"  # the study preset a run belongs to (cfg.study)
SWEEP_TAG = "specresearch.sweep"  # "true" on a sweep's parent run
HOST_TAG, PID_TAG = "specresearch.host", "specresearch.pid"  # where a run's process runs: resume tells a killed job from a live one
JOB_TAG = "specresearch.job."  # + job number, on the parent run: "finished", "skipped <run id>" or "failed: <why>"
INTERRUPTED_TAG = "specresearch.interrupted"  # "true" on a RUNNING run that resume found with its process gone
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: a sweep's job run names its parent
NOTE_TAG = "mlflow.note.content"  # MLflow's own: the run's description (markdown), shown first on its page
PER_PROMPT_TAG = "specresearch.per_prompt"  # a speed run's per-prompt tokens and seconds (JSON): what cells are paired by
SOLVED_TAG = "specresearch.solved."  # + side, on a quality run: its per-problem outcomes ("156:0110"), what seeds are paired by
OVERRIDES_TAG = "specresearch.overrides"  # a job's command-line overrides: what a sweep's summary tabulates it by
# where a run is recorded, and whether to skip it, do not change what it measures
HASH_EXCLUDED = ("tracker", "resume", "resume_ignore_code")
COMMITTED = Path(__file__).resolve().parents[1] / "docs" / "results" / "data"  # a checkout's committed results


def committed_study(name: str, folder: Path | None = None) -> Path:
    """Where study `name`'s measured runs are committed (the analysis' `save=true`): docs/results/data/study-NAME.json
    of the checkout (`folder`, default COMMITTED); its `data.runs` are the runs with their tags, what the analysis
    rebuilds from without the MLflow store and what resume skips on a machine whose store lacks them."""
    return (folder or COMMITTED) / f"study-{name.replace('_', '-')}.json"
# The code a run was measured by (code_tags): resume re-runs a job whose recorded code differs (same_code).
COMMIT_TAG = "specresearch.commit"  # the git commit of the checkout specresearch ran from; absent outside a checkout
MLFLOW_COMMIT_TAG = "mlflow.source.git.commit"  # MLflow's own: the same commit, shown in its Source field
DIRTY_TAG = "specresearch.dirty"  # "true" when that checkout had uncommitted changes to tracked files, else "false"
DIFF_TAG = "specresearch.diff"  # a dirty checkout's changes: sha256 (16 hex) of `git diff HEAD`; absent when clean or unknown
VERSION_TAGS = {"specresearch": "specresearch.version", "torch": "specresearch.torch",  # distribution -> its version's tag
                "transformers": "specresearch.transformers", "lm_eval": "specresearch.lm_eval"}
GIT_TIMEOUT_S = 5.0  # per git command: a hung git (a network file system) must not hold a run


def process_tags(cfg: DictConfig) -> dict[str, str]:
    """The tags of every run we open, job or sweep parent: this process (host, pid), the study and the
    code it runs (code_tags: commit, dirty flag, library versions; the commit also as MLflow's own tag)."""
    tags = {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), **code_tags()}
    if COMMIT_TAG in tags:
        tags[MLFLOW_COMMIT_TAG] = tags[COMMIT_TAG]
    if cfg.get("study") is not None:
        tags[STUDY_TAG] = str(cfg.study)
    return tags


@functools.cache
def code_tags() -> dict[str, str]:
    """The code this process runs, as tags (computed once per process): the git commit of the checkout
    specresearch is imported from and whether it is dirty (with a digest of the uncommitted changes),
    and the versions of specresearch, torch, transformers and lm-eval ("none" when one is not
    installed). Outside a checkout (an installed wheel), or where git is missing or fails, there is
    no commit: the specresearch version names the code. Never raises."""
    from specresearch import __version__

    tags = {VERSION_TAGS["specresearch"]: __version__}
    for name in ("torch", "transformers", "lm_eval"):
        module = sys.modules.get(name)
        try:
            tags[VERSION_TAGS[name]] = str(getattr(module, "__version__", None) or importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            tags[VERSION_TAGS[name]] = "none"
    return {**tags, **_git_tags()}


def _git(root: str, *args: str) -> bytes | None:
    """`git -C root ARGS`'s output; None when git is missing, fails or outlasts GIT_TIMEOUT_S (stderr silenced)."""
    try:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=GIT_TIMEOUT_S,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _git_tags() -> dict[str, str]:
    """COMMIT_TAG, DIRTY_TAG (and DIFF_TAG) when specresearch is imported from a git checkout of its
    own (the package folder at the top of the work tree: not a wheel inside some other repository);
    {} otherwise."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = _git(root, "rev-parse", "--show-toplevel", "HEAD")
    lines = found.decode(errors="replace").split() if found else []
    if len(lines) != 2 or os.path.realpath(lines[0]) != os.path.realpath(root):
        return {}
    diff = _git(root, "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color")
    tags = {COMMIT_TAG: lines[1], DIRTY_TAG: "false" if diff == b"" else "true"}  # diff None (failed): dirty, unknown
    if diff:
        tags[DIFF_TAG] = hashlib.sha256(diff).hexdigest()[:16]
    return tags


def code_of(tags: Mapping[str, str]) -> str:
    """The code a run's tags (or code_tags()) name, as one short line: the commit (12 hex), `+dirty`
    and the changes' digest when dirty; `specresearch VERSION` outside a checkout; "unrecorded"
    for a run from before these tags."""
    if tags.get(COMMIT_TAG):
        dirty = f"+dirty {tags.get(DIFF_TAG, '(changes unknown)')}" if tags.get(DIRTY_TAG) != "false" else ""
        return tags[COMMIT_TAG][:12] + dirty
    version = tags.get(VERSION_TAGS["specresearch"])
    return f"specresearch {version}" if version else "unrecorded"


def same_code(recorded: Mapping[str, str], current: Mapping[str, str]) -> bool:
    """Whether a run's recorded code (its tags) is the code `current` names (code_tags()): the same
    commit and dirty flag and, for a dirty checkout, the same digest of its uncommitted changes;
    outside a checkout, the same specresearch version. A dirty tree cannot be proven equal to another
    beyond that digest (untracked files are not in it), and one whose changes could not be read is
    never equal; a run that recorded no code is not either (resume re-runs it)."""
    if current.get(COMMIT_TAG) or recorded.get(COMMIT_TAG):
        keys = (COMMIT_TAG, DIRTY_TAG, DIFF_TAG)
        dirty_unknown = current.get(DIRTY_TAG) != "false" and not current.get(DIFF_TAG)
        return not dirty_unknown and all(recorded.get(key) == current.get(key) for key in keys)
    version = current.get(VERSION_TAGS["specresearch"])
    return version is not None and recorded.get(VERSION_TAGS["specresearch"]) == version


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
# A run's results as one typed record, read by attribute everywhere (the console, the analysis) and
# flattened to MLflow's metric names by `flatten` alone (read back by `unflatten`): the names below are
# spelled here only. VERSION counts changes of the record (metric `record_version`).
VERSION = 2
VERSION_KEY = "record_version"
BASELINE, METHOD = "baseline", "method"  # the two sides: `baseline_*` and `method_*` metrics
GROUP, EQ, AA, DELTA, DIST = "group.", "eq_", "aa_", "delta_", "dist_"  # prefixes: per-category, battery, A/A, delta, distortion
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


def flatten(record: Any, prefix: str = "") -> dict[str, float]:
    """A record's numbers under the flat names MLflow keeps: the one place they are spelled.

    A field is written under its name, or its `flat` metadata; a nested record's numbers under NAME_
    (`method_tau`); a list's items as NAME_1, NAME_2, ... (`method_acceptance_at_1`); a dict's entries
    as NAME. + key, or `flat` + key (`eq_reject`; a record in a dict: `group.coding.speedup`); a
    record's DERIVED properties beside its fields. None is left out (not measured).
    """
    out: dict[str, float] = {}
    names = [(f.name, f.metadata) for f in fields(record)] + [(name, {}) for name in getattr(record, "DERIVED", ())]
    for name, meta in names:
        value = getattr(record, name)
        if is_dataclass(value):
            out.update(flatten(value, prefix + meta.get("flat", f"{name}_")))
        elif isinstance(value, dict):
            key = prefix + meta.get("flat", f"{name}.")
            for entry, v in value.items():
                out.update(flatten(v, f"{key}{entry}{meta.get('sep', '.')}") if is_dataclass(v) else {f"{key}{entry}": v})
        elif isinstance(value, (list, tuple)):
            out.update({f"{prefix}{meta.get('flat', name)}_{i + 1}": v for i, v in enumerate(value)})
        elif value is not None:
            out[prefix + meta.get("flat", name)] = value
    return out


def unflatten(cls: type, metrics: dict[str, float], prefix: str = "") -> Any:
    """The record of type `cls` that `flatten` wrote under `prefix` into `metrics`: fields only (the
    DERIVED values follow from them); a name it lacks reads as NaN, a list as the items found."""
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):
        hint, meta = hints[f.name], f.metadata
        if is_dataclass(hint):
            values[f.name] = unflatten(hint, metrics, prefix + meta.get("flat", f"{f.name}_"))
        elif typing.get_origin(hint) is dict:
            key, of = prefix + meta.get("flat", f"{f.name}."), typing.get_args(hint)[1]
            entries = unprefixed(metrics, key)
            if is_dataclass(of):
                names = {k.rpartition(".")[0] for k in entries}
                values[f.name] = {name: unflatten(of, metrics, f"{key}{name}.") for name in sorted(names)}
            else:
                values[f.name] = entries
        elif typing.get_origin(hint) is list:
            key, items = f"{prefix}{meta.get('flat', f.name)}_", []
            while f"{key}{len(items) + 1}" in metrics:
                items.append(metrics[f"{key}{len(items) + 1}"])
            values[f.name] = items
        else:
            values[f.name] = metrics.get(prefix + meta.get("flat", f.name), NAN)
    return cls(**values)


@dataclass
class Group:
    """One prompt category's slice of a speed run (MT-bench's categories: Spec-Bench's subtask view)."""

    prompts: float
    speedup: float
    method_tau: float
    method_alpha: float


@dataclass
class SpeedRecord:
    """The results of a speed run (`python -m specresearch`): the two sides' counters (SpecStats,
    summed over the prompts), their comparison, the Leviathan prediction, the greedy identity,
    per-category slices, the distribution battery. MLflow's names: `flatten(record)`."""

    baseline: SpecStats
    method: SpecStats
    prompts: float = NAN
    k: float = NAN  # draft tokens per step (0: a drafter without k)
    speedup: float = NAN  # tokens/s of the method / of the baseline
    compiled_baseline_tokens_per_s: float = NAN  # plain decoding compiled, timed beside them (compiled_reference); NaN = not timed
    speedup_vs_fastest_plain: float = NAN  # tokens/s of the method / of the fastest plain decoding timed (baseline or compiled)
    time_ratio: float = NAN  # total time of the baseline / of the method
    draft_cost_ratio_c: float = NAN
    verify_cost_v: float = NAN
    leviathan_speedup: float = NAN  # Thm 3.8 from the measured alpha_token, k, c, v
    leviathan_optimal_k: float = NAN
    leviathan_optimal_speedup: float = NAN
    predicted_speedup: float = NAN  # a drafter's own prediction (shape=auto, Sequoia's sizing); NaN = none
    batch_size: float = NAN  # prompts decoded together (tokens/s above: a batch's tokens over its wall time)
    baseline_row_tokens_per_s: float = NAN  # per row: a row's tokens over its own time (batch start to its last token)
    method_row_tokens_per_s: float = NAN
    identity_rate: float = NAN  # share of prompts whose method output equals the baseline's
    mean_first_divergence: float = NAN
    max_divergence_logit_gap: float = NAN
    groups: dict[str, Group] = field(default_factory=dict, metadata={"flat": GROUP})  # prompt category -> its slice
    equivalence: dict[str, float] = field(default_factory=dict, metadata={"flat": EQ})  # stats.Report.summary() and sampling rates
    calibration: dict[str, float] = field(default_factory=dict, metadata={"flat": AA})  # stats.calibration(): the A/A calibration
    distortion: dict[str, float] = field(default_factory=dict, metadata={"flat": DIST})  # stats.Distortion.summary() (stats.distortion)
    version: float = field(default=VERSION, metadata={"flat": VERSION_KEY})

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> SpeedRecord:
        """A speed run's record read back from its metrics (a name it lacks reads as NaN)."""
        return unflatten(cls, metrics)


@dataclass
class PromptStep:
    """One prompt of a speed run, logged as step i (MLflow draws each as a curve over the prompts)."""

    baseline_tokens_per_s: float
    method_tokens_per_s: float
    tau: float
    identical: float

    def to_metrics(self) -> dict[str, float]:
        """`prompt/*` metrics; NaN ones (a prompt with no new token) left out."""
        return {k: float(v) for k, v in flatten(self, PROMPT).items() if not math.isnan(v)}


@dataclass
class EvalSide:
    """One side of a quality run: the task's scores and the counters of its generations."""

    scores: dict[str, float] = field(metadata={"flat": ""})  # lm-eval's names ("pass@1", "pass@1_stderr"); MLflow spells "@" as "_at_"
    stats: SpecStats = field(default_factory=SpecStats, metadata={"flat": ""})  # `method_tau`, `method_tokens_per_s`, ...

    def score(self, name: str) -> float:
        """A score by lm-eval's name or by MLflow's spelling of it ("pass@1" or "pass_at_1")."""
        return self.scores.get(name, self.scores.get(name.replace("@", "_at_"), NAN))


@dataclass
class EvalRecord:
    """The results of a quality run (`eval=NAME`): each side's scores, the method's deltas, the paired
    test; the paired part only when both sides ran (None: not recorded). MLflow's names:
    `flatten(record)`: `SIDE_SCORE`, `SIDE_tau` (each side's counters), `problems`, `delta_SCORE` and the
    paired test's names."""

    sides: dict[str, EvalSide] = field(metadata={"flat": "", "sep": "_"})  # "baseline" (absent with eval.baseline=false), "method"
    problems: float | None = None
    delta: dict[str, float] = field(default_factory=dict, metadata={"flat": DELTA})  # score -> method − baseline
    method_only: float | None = None  # problems only the method solves
    baseline_only: float | None = None  # problems only the baseline solves
    mcnemar_p: float | None = None  # exact McNemar test of the two
    identity_rate: float | None = None  # share of identical completions
    speedup: float | None = None  # only when the baseline was measured in the same run
    baseline_reused: float | None = None  # 1.0: the baseline's side came from an earlier identical run
    version: float = field(default=VERSION, metadata={"flat": VERSION_KEY})

    PAIRED = ("method_only", "baseline_only", "mcnemar_p", "identity_rate", "speedup", "baseline_reused")

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> EvalRecord:
        """Read a quality run's metrics back (scores in MLflow's spelling: "pass_at_1"): a side's
        names that are not its counters' are its scores."""
        counters = re.compile(rf"({'|'.join(f.name for f in fields(SpecStats))}|{'|'.join(SpecStats.DERIVED)})(_\d+)?")
        own = {k: v for k, v in metrics.items() if k not in cls.PAIRED}
        sides = {}
        for name in (BASELINE, METHOD):
            values = unprefixed(own, f"{name}_")
            if values:
                scores = {k: v for k, v in values.items() if not counters.fullmatch(k)}
                sides[name] = EvalSide(scores, unflatten(SpecStats, metrics, f"{name}_"))
        return cls(sides, metrics.get("problems"), unprefixed(metrics, DELTA), **{k: metrics.get(k) for k in cls.PAIRED},
                   version=metrics.get(VERSION_KEY, NAN))

    def score(self, side: str, name: str) -> float:
        """A side's score (NaN when that side did not run)."""
        return self.sides[side].score(name) if side in self.sides else NAN

    def delta_of(self, name: str) -> float:
        return self.delta.get(name, self.delta.get(name.replace("@", "_at_"), NAN))
