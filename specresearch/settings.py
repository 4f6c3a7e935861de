"""The settings schema: one dataclass per kind of config node, the one place a setting is declared,
typed and range-checked. conf/ keeps the defaults users read; a dataclass here says which keys an
option has and what each may hold, and `check` refuses a composed config that strays from it in one
line, before a run opens or a model loads.

- `OPTIONS` maps each option of each config group (conf/GROUP/NAME.yaml) to its dataclass; a group
  without `_target_` (model, dataset, sampling, eval) is checked against the fields of all its
  options together (a setting of one dataset passes on another), a `_target_` group (drafter,
  verifier, tracker) against the option whose `_target_` the node names.
- Field types are what a YAML value may be: `Optional[int]` takes null, `float` takes an int,
  bool and int never pass for each other; `Any` is not checked. A field declared with `extra()` is
  not in the shipped YAML: the command line adds it with `+key=value`.
- A dataclass's `check(path)` checks ranges, on the values the node gives (absent ones are MISSING):
  every rule that needs no model, so a config is refused before one loads. The drafters' and
  verifiers' constructors call the same check (e.g. `PromptLookup(k=k, ...).check("drafter")`); what
  needs the model (layer indices, vocabulary, checkpoints, the sampling) stays with them.

Stdlib, OmegaConf and specresearch.errors only: everything may read this module, it reads nothing of
the package (the classes the `_target_`s name load torch).
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Optional, Union

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specresearch.errors import SpecResearchError


def extra(default: Any = None) -> Any:
    """A field the shipped YAML leaves out: set with `+key=value` (its default: not set)."""
    return field(default=default, metadata={"extra": True})


def _given(value: Any) -> bool:
    return value is not MISSING


# -- model nodes -----------------------------------------------------------------------------------


@dataclass
class Model:
    """A model as specresearch.models.load_model takes it (the `model` group; the target)."""
    name: str = MISSING          # a zoo key, a Hugging Face id or local directory, a .gguf path, or "tiny"
    dtype: str = MISSING         # auto = bfloat16 (float16 on GPUs without bf16, float32 on CPUs without native bf16)
    device: str = MISSING        # auto = cuda if available, else cpu
    kernels: str = MISSING       # auto = SkinnyLinear for few rows on the CPU; torch = nn.Linear as is
    cache: str = MISSING         # the KV cache: dynamic or static (preallocated)
    compile: bool = MISSING      # the decoder under torch.compile at fixed widths (needs cache=static)
    cache_dir: Optional[str] = MISSING  # null = $SPECRESEARCH_CACHE or the user cache dir
    tiny: Optional[Dict[str, Any]] = extra()  # name=tiny: the random model's arguments (tiny_model's; a free mapping)

    def check(self, path: str) -> None:
        _one_of(path, "cache", self.cache, CACHES)
        if _given(self.compile) and self.compile and _given(self.cache) and self.cache != "static":
            raise SpecResearchError(f"{path}.compile=true needs {path}.cache=static (compiled graphs keep fixed shapes)")


@dataclass
class TargetModel(Model):
    """The `model` group: the target, and the draft model its drafters default to."""
    draft: Optional[str] = None  # drafter.model.name's default (independent, tree); load_model does not read it


@dataclass
class TinyModel(TargetModel):
    """model=tiny: a random-weight model built from `tiny`."""
    tiny: Optional[Dict[str, Any]] = None  # vocab_size, hidden_size, num_layers, num_heads, seed (and noise, ...)


@dataclass
class DraftModel(Model):
    """A drafter's own model: load_model's settings and specresearch.drafters.draft_model.cheapen's."""
    vocab: Optional[int] = None       # FR-Spec: score only the N most frequent tokens (e.g. 32768); null = all
    vocab_corpus: str = MISSING       # where the frequencies come from: python-stdlib or mtbench (never the eval set)
    quantize: Optional[str] = None    # int8: int8 weights for the draft's linear layers (CPU)


# -- drafters --------------------------------------------------------------------------------------


K_POLICIES = ("fixed", "heuristic")  # how k evolves within a sequence (engine.DraftLength)
MATCH = ("first", "last")  # drafter=pld: which earlier occurrence it continues
CHILDREN = ("top", "sample")  # a tree's children: the draft's likeliest tokens, or drawn from its law
SHAPES = ("auto",)  # a tree's sizing (drafters.tree.Sizer); null = nodes as given
CACHES = ("dynamic", "static")  # a model's KV cache (target.Target; static: target.StaticSlots)
RECOVER = ("sample", "greedy")  # a relaxed verifier's added token


def _one_of(path: str, key: str, value: Any, valid: tuple, null: str = "") -> None:
    """`value` is one of `valid` (or null, where `null` says what null means)."""
    if _given(value) and not (null and value is None) and value not in valid:
        names = [f"null ({null})"] * bool(null) + list(valid)
        raise SpecResearchError(f"unknown {path}.{key} '{value}': valid are {', '.join(names)}")


def _at_least(path: str, key: str, value: Any, low: int, meaning: str = "") -> None:
    if _given(value) and value < low:
        raise SpecResearchError(f"{path}.{key} must be >= {low}{meaning}, got {value}")


def _probability_or_null(path: str, key: str, value: Any) -> None:
    """A confidence threshold: in (0, 1), or null (off)."""
    if _given(value) and value is not None and not 0 < value < 1:
        raise SpecResearchError(f"{path}.{key} must lie in (0, 1) or be null, got {value}")


def _k_at_least_one(option: str, k: Any) -> None:
    if _given(k) and k < 1:
        raise SpecResearchError(f"drafter={option} needs k >= 1, got k={k} (use drafter=none for plain decoding)")


def check_draft_length(path: str, k: Any, k_policy: Any, k_max: Any) -> None:
    """engine.DraftLength's settings: a k_policy of K_POLICIES, and k_max (null = 4 k) at least k.

    Raises:
        SpecResearchError
    """
    _one_of(path, "k_policy", k_policy, K_POLICIES)
    if _given(k_max) and k_max is not None and _given(k) and k_max < k:
        raise SpecResearchError(f"{path}.k_max must be >= {path}.k, got {k_max} < {k}")


def _chain_drafter(node: Any, option: str, path: str) -> None:
    """drafter=independent's, self_draft's and cross_vocab's ranges: the chain, its stops, siblings and lookup."""
    _k_at_least_one(option, node.k)
    _at_least(path, "lookup", node.lookup, 0, " (0 = off)")
    _at_least(path, "siblings", node.siblings, 0, " (0 = a plain chain)")
    if _given(node.sibling_confidence) and not 0 <= node.sibling_confidence < 1:
        raise SpecResearchError(f"{path}.sibling_confidence must lie in [0, 1) (0 = keep every sibling), got {node.sibling_confidence}")
    _probability_or_null(path, "confidence", node.confidence)
    _probability_or_null(path, "chain_confidence", node.chain_confidence)
    check_draft_length(path, node.k, node.k_policy, node.k_max)


def _tree_shape(path: str, branching: Any, topk: Any, depth: Any, nodes: Any, children: Any, chain_confidence: Any) -> None:
    """drafters.tree.TreeShape's ranges: static `branching`, or a dynamic tree's topk, depth and nodes."""
    _one_of(path, "children", children, CHILDREN)
    static = _given(branching) and branching is not None
    if static and (not len(branching) or min(branching) < 1):
        raise SpecResearchError(f"{path}.branching needs one or more counts >= 1 (or null: dynamic), got {list(branching)}")
    sizes = [v for v in (topk, depth, nodes) if _given(v)]
    if not static and sizes and min(sizes) < 1:
        raise SpecResearchError(f"a dynamic tree needs topk, depth and nodes >= 1, got {topk}, {depth}, {nodes}")
    _probability_or_null(path, "chain_confidence", chain_confidence)


def _sized_tree(path: str, shape: Any, branching: Any, children: Any) -> None:
    """shape=auto (drafters.tree.Sizer) sizes a dynamic tree of top children."""
    _one_of(path, "shape", shape, SHAPES, null="nodes as given")
    if not _given(shape) or shape is None:
        return
    if _given(branching) and branching is not None:
        raise SpecResearchError(f"{path}.shape=auto sizes a dynamic tree: set {path}.branching=null")
    if _given(children) and children != "top":
        raise SpecResearchError(f"{path}.shape=auto keeps the likeliest nodes, which sampled children cannot be chosen by "
                                f"(their law would change): use {path}.children=top")


@dataclass
class Independent:
    """drafter=independent: a smaller draft model proposes k tokens per step."""
    _target_: str = "specresearch.drafters.independent.IndependentDrafter"
    k: int = MISSING                          # draft tokens per step (the most, with confidence)
    confidence: Optional[float] = None        # stop a draft after a token the draft gives less than this probability
    chain_confidence: Optional[float] = None  # stop once the product of the draft's probabilities falls below this
    k_policy: str = MISSING                   # fixed, or heuristic (k += 2 after a fully accepted draft, else k -= 1)
    k_max: Optional[int] = None               # the heuristic's largest k; null = 4 k
    siblings: int = MISSING                   # the draft's next N likeliest tokens beside each draft token; 0 = a chain
    sibling_confidence: float = MISSING       # keep a sibling only where its path probability is at least this
    lookup: int = MISSING                     # n-gram guesses fed with each draft forward; 0 = off
    model: Optional[DraftModel] = None        # the draft model, as in the `model` group

    def check(self, path: str) -> None:
        _chain_drafter(self, "independent", path)


@dataclass
class Tree:
    """drafter=tree: token trees from a draft model (SpecInfer; EAGLE-2's dynamic trees)."""
    _target_: str = "specresearch.drafters.tree.TreeDrafter"
    branching: Optional[List[int]] = None     # children per node at each depth: a static tree; null = dynamic
    topk: int = MISSING                       # dynamic: children per expanded node and nodes expanded per level
    depth: int = MISSING                      # dynamic: levels
    nodes: int = MISSING                      # dynamic: the most nodes kept, by cumulative draft probability
    children: str = MISSING                   # top (the draft's likeliest tokens) or sample (drawn from q)
    chain_confidence: Optional[float] = None  # stop growing after a level whose every path probability is below this
    shape: Optional[str] = None               # auto: the size with the best predicted speedup; null = nodes
    model: Optional[DraftModel] = None        # the draft model, as in the `model` group
    ensemble: List[DraftModel] = field(default_factory=list)  # more draft models merged into one tree (SpecInfer)

    def check(self, path: str) -> None:
        _tree_shape(path, self.branching, self.topk, self.depth, self.nodes, self.children, self.chain_confidence)
        _sized_tree(path, self.shape, self.branching, self.children)


@dataclass
class Medusa:
    """drafter=medusa: trained heads on the target's last hidden state propose a tree."""
    _target_: str = "specresearch.drafters.medusa.MedusaDrafter"
    checkpoint: Optional[str] = None          # heads.safetensors; null = the one trained for this target
    cache_dir: Optional[str] = None           # the model cache (the target's)
    choices: Optional[List[List[int]]] = None  # the tree: per-depth ranks of each path; null = from the heads' accuracies
    nodes: int = MISSING                      # tree size when choices is null; the largest with shape=auto
    shape: Optional[str] = MISSING            # auto: Sequoia's sizing, when choices is null; null = nodes
    children: str = MISSING                   # top (the heads' top tokens) or sample (drawn from the heads' laws)
    vocab: Optional[int] = None               # the heads score only the N most frequent tokens (FR-Spec)
    vocab_corpus: str = MISSING               # offline text the token frequencies come from

    def check(self, path: str) -> None:
        _one_of(path, "children", self.children, CHILDREN)
        _at_least(path, "nodes", self.nodes, 1)
        _one_of(path, "shape", self.shape, SHAPES, null="nodes as given")
        choices = self.choices if _given(self.choices) else None
        if choices is None:
            return
        if not choices or any(not c or min(c) < 0 for c in choices):
            raise SpecResearchError(f"{path}.choices must be non-empty paths of ranks >= 0, got {[list(c) for c in choices]}")
        missing = sorted({tuple(c[:-1]) for c in choices if len(c) > 1} - {tuple(c) for c in choices})
        if missing:
            raise SpecResearchError(f"{path}.choices must hold every path's parent; missing {[list(m) for m in missing]}")


@dataclass
class Eagle:
    """drafter=eagle: a one-layer head drafts on the target's features, autoregressively."""
    _target_: str = "specresearch.drafters.eagle.EagleDrafter"
    k: int = MISSING                          # draft tokens per step
    k_policy: str = MISSING                   # fixed, or heuristic (up to k_max)
    k_max: Optional[int] = None               # null = 4 k
    checkpoint: Optional[str] = None          # head.safetensors; null = the one trained for this target
    cache_dir: Optional[str] = None           # the model cache (the target's)
    vocab: Optional[int] = None               # the head scores only the N most frequent tokens (FR-Spec)
    vocab_corpus: str = MISSING               # offline text the token frequencies come from
    tree: bool = MISSING                      # true: EAGLE-2's dynamic tree instead of a chain of k
    topk: int = MISSING                       # tree: children per expanded node, and nodes expanded per level
    depth: int = MISSING                      # tree: levels
    nodes: int = MISSING                      # tree: the most nodes kept
    children: str = MISSING                   # tree: top or sample
    shape: Optional[str] = None               # tree: auto = the size with the best predicted speedup; null = nodes

    def check(self, path: str) -> None:
        _at_least(path, "k", self.k, 1)
        if self.tree is True:
            _tree_shape(path, None, self.topk, self.depth, self.nodes, self.children, None)
            _sized_tree(path, self.shape, None, self.children)
            return
        if _given(self.shape) and self.shape is not None:
            raise SpecResearchError(f"{path}.shape=auto sizes EAGLE-2's tree: set {path}.tree=true")
        check_draft_length(path, self.k, self.k_policy, self.k_max)


@dataclass
class PromptLookup:
    """drafter=pld: continue an earlier occurrence of the last n-gram."""
    _target_: str = "specresearch.drafters.pld.PromptLookupDrafter"
    k: int = MISSING              # the most tokens proposed per step
    max_ngram: int = MISSING      # the longest suffix looked up; longer first
    min_ngram: int = MISSING      # the shortest suffix looked up
    match: str = MISSING          # first (paper, transformers) or last (most recent) earlier occurrence
    k_policy: str = MISSING       # fixed, or heuristic
    k_max: Optional[int] = None   # the heuristic's largest k; null = 4 k

    def check(self, path: str) -> None:
        _k_at_least_one("pld", self.k)
        low, high = self.min_ngram, self.max_ngram
        if _given(low) and _given(high) and not 1 <= low <= high:
            raise SpecResearchError(f"drafter=pld needs 1 <= min_ngram <= max_ngram, got {low}, {high}")
        _one_of(path, "match", self.match, MATCH)
        check_draft_length(path, self.k, self.k_policy, self.k_max)


CROSS_VOCAB_MODES = ("string", "shared")  # drafter=cross_vocab: the draft's text re-tokenized, or its shared tokens (TLI)


@dataclass
class CrossVocab:
    """drafter=cross_vocab: a draft model whose tokenizer differs from the target's."""
    _target_: str = "specresearch.drafters.cross_vocab.CrossVocabDrafter"
    k: int = MISSING                          # draft tokens per step
    mode: str = MISSING                       # string (its argmax text in the target's tokens) or shared (TLI: the tokens both vocabularies have)
    k_policy: str = MISSING                   # fixed, or heuristic
    k_max: Optional[int] = None               # the heuristic's largest k; null = 4 k
    confidence: Optional[float] = None        # stop a draft after a token the draft gives less than this probability
    chain_confidence: Optional[float] = None  # stop once the product of the draft's probabilities falls below this
    lookup: int = MISSING                     # n-gram guesses (the draft's tokens) fed with each draft forward; 0 = off
    siblings: int = MISSING                   # mode=shared: the draft's next N likeliest shared tokens beside each draft token; 0 = a chain
    sibling_confidence: float = MISSING       # keep a sibling only where its path probability is at least this
    model: Optional[DraftModel] = None        # the draft model, as in the `model` group

    def check(self, path: str) -> None:
        _chain_drafter(self, "cross_vocab", path)
        _one_of(path, "mode", self.mode, CROSS_VOCAB_MODES)
        if _given(self.siblings) and self.siblings and _given(self.mode) and self.mode == "string":
            raise SpecResearchError(f"{path}.siblings needs {path}.mode=shared (a sibling is one target token; mode=string drafts text), "
                                    f"or set {path}.siblings=0")


@dataclass
class Lookahead:
    """drafter=lookahead: Jacobi iteration fills an n-gram pool verified in the same target forward."""
    _target_: str = "specresearch.drafters.lookahead.LookaheadDrafter"
    window: int = MISSING             # W: Jacobi window width
    ngram: int = MISSING              # N: n-gram size = proposal length + 1
    guesses: int = MISSING            # G: pool n-grams verified per step
    pool_from_prompt: bool = MISSING  # also pool the prompt's n-grams

    def check(self, path: str) -> None:
        window, guesses = self.window, self.guesses
        if any(_given(v) and v < 1 for v in (window, guesses)):
            raise SpecResearchError(f"drafter=lookahead needs window >= 1 and guesses >= 1, got {window}, {guesses}")
        if _given(self.ngram) and self.ngram < 3:
            raise SpecResearchError(f"drafter=lookahead needs ngram >= 3 (N − 1 >= 2 Jacobi levels), got ngram={self.ngram}")


@dataclass
class SelfDraft:
    """drafter=self_draft: the target drafts with layers skipped (its own model: no `model`)."""
    _target_: str = "specresearch.drafters.self_draft.SelfDraftDrafter"
    k: int = MISSING                          # draft tokens per step
    skip: Optional[List[int]] = None          # decoder layer indices to skip; layer 0 is always kept
    exit_layer: Optional[int] = None          # instead: early exit after layer exit_layer - 1
    skip_ratio: Optional[float] = None        # when neither is set: skip this fraction of the layers
    vocab: Optional[int] = None               # FR-Spec: the draft scores only the N most frequent tokens
    vocab_corpus: str = MISSING               # where the frequencies come from
    quantize: Optional[str] = None            # int8: an int8 copy of the layers the draft runs (CPU)
    confidence: Optional[float] = None        # as for drafter=independent
    chain_confidence: Optional[float] = None  # as for drafter=independent
    k_policy: str = MISSING                   # fixed, or heuristic
    k_max: Optional[int] = None               # the heuristic's largest k; null = 4 k
    siblings: int = MISSING                   # as for drafter=independent
    sibling_confidence: float = MISSING       # as for drafter=independent
    lookup: int = MISSING                     # as for drafter=independent

    def check(self, path: str) -> None:
        _chain_drafter(self, "self_draft", path)


@dataclass
class NoDrafter:
    """drafter=none: plain autoregressive decoding through the same engine."""
    _target_: str = "specresearch.drafters.none.NoDrafter"


# -- verifiers -------------------------------------------------------------------------------------


def _relaxed(node: Any, path: str) -> None:
    """The relaxed verifiers' shared settings: the added token, and the rule's temperature."""
    _one_of(path, "recover", node.recover, RECOVER)
    t = node.rule_temperature
    if _given(t) and t is not None and not t > 0:
        raise SpecResearchError(f"{path}.rule_temperature must be > 0 (or null: the decoding's), got {t}")


@dataclass
class Greedy:
    """verifier=greedy: exact match with the target's argmax."""
    _target_: str = "specresearch.verifiers.greedy.GreedyVerifier"


@dataclass
class Rejection:
    """verifier=rejection: speculative rejection sampling, lossless at any temperature."""
    _target_: str = "specresearch.verifiers.rejection.RejectionVerifier"


@dataclass
class Margin:
    """verifier=margin: keep x if p(x) >= max p - margin (or >= ratio * max p)."""
    _target_: str = "specresearch.verifiers.relaxed.MarginVerifier"
    margin: Optional[float] = None            # absolute margin; null to use ratio
    ratio: Optional[float] = None             # relative variant, e.g. 0.5
    recover: str = MISSING                    # sample (from p) or greedy (argmax)
    rule_temperature: Optional[float] = None  # greedy decoding only: the rule reads softmax(logits / this)

    def check(self, path: str) -> None:
        _relaxed(self, path)
        margin, ratio = self.margin, self.ratio
        if _given(margin) and _given(ratio) and (margin is None) == (ratio is None):
            raise SpecResearchError("verifier=margin takes exactly one of margin (absolute) and ratio (relative); set the other to null")
        if _given(margin) and margin is not None and not 0 <= margin <= 1:
            raise SpecResearchError(f"{path}.margin must lie in [0, 1], got {margin}")
        if _given(ratio) and ratio is not None and not 0 < ratio <= 1:
            raise SpecResearchError(f"{path}.ratio must lie in (0, 1], got {ratio}")


@dataclass
class TopK:
    """verifier=topk: keep x if it is among the target's k most likely tokens."""
    _target_: str = "specresearch.verifiers.relaxed.TopKVerifier"
    k: int = MISSING
    recover: str = MISSING                    # sample (from p) or greedy (argmax)
    rule_temperature: Optional[float] = None  # greedy decoding only: the rule reads softmax(logits / this)

    def check(self, path: str) -> None:
        _relaxed(self, path)
        if _given(self.k) and self.k < 1:
            raise SpecResearchError(f"verifier=topk needs k >= 1, got {self.k}")


@dataclass
class Typical:
    """verifier=typical: Medusa's typical acceptance, p(x) > min(epsilon, delta * exp(-H(p)))."""
    _target_: str = "specresearch.verifiers.relaxed.TypicalVerifier"
    epsilon: float = MISSING                  # Medusa's posterior_threshold
    delta: float = MISSING                    # Medusa's posterior_alpha
    recover: str = MISSING                    # sample (from p) or greedy (argmax)
    rule_temperature: Optional[float] = None  # greedy decoding only: the rule reads softmax(logits / this)

    def check(self, path: str) -> None:
        _relaxed(self, path)
        epsilon, delta = self.epsilon, self.delta
        if any(_given(v) and not 0 < v <= 1 for v in (epsilon, delta)):
            raise SpecResearchError(f"verifier=typical needs 0 < epsilon <= 1 and 0 < delta <= 1, got {epsilon}, {delta}")


# -- trackers --------------------------------------------------------------------------------------


@dataclass
class MLflow:
    """tracker=mlflow: MLflow on a local sqlite store, or a server."""
    _target_: str = "specresearch.tracking.MLflowTracker"
    store: str = MISSING          # the local store's folder
    experiment: str = MISSING     # the MLflow experiment
    uri: Optional[str] = None     # a tracking server instead of the local store

    def check(self, path: str) -> None:
        for key in ("store", "experiment"):
            value = getattr(self, key)
            if _given(value) and not str(value).strip():
                raise SpecResearchError(f"{path}.{key} must be a non-empty name, got {value!r}")


@dataclass
class NoTracker:
    """tracker=none: record nothing."""
    _target_: str = "specresearch.tracking.NullTracker"


# -- datasets, sampling, eval ----------------------------------------------------------------------


@dataclass
class Dataset:
    """dataset=humaneval, sharegpt: prompts, as specresearch.data.load_prompts takes them."""
    name: str = MISSING                   # humaneval, mtbench or sharegpt
    num_prompts: Optional[int] = None     # null = all
    offset: int = MISSING                 # prompts skipped first
    stop: List[str] = MISSING             # strings that end a completion


@dataclass
class MTBench(Dataset):
    """dataset=mtbench: chat prompts in 8 categories."""
    categories: Optional[List[str]] = None  # e.g. [coding, math]
    per_category: Optional[int] = None      # the first N questions of each category; replaces num_prompts


@dataclass
class Sampling:
    """sampling=greedy, random: the target's decoding law."""
    temperature: float = MISSING  # 0 = greedy
    top_k: int = MISSING          # 0 = off
    top_p: float = MISSING        # 1 = off

    def check(self, path: str) -> None:  # the texts of specresearch.types.SamplingParams
        t, k, p = self.temperature, self.top_k, self.top_p
        if _given(t) and not (math.isfinite(t) and t >= 0):
            raise SpecResearchError(f"{path}.temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if _given(k) and k < 0:
            raise SpecResearchError(f"{path}.top_k must be an integer >= 0 (0 = off), got {k!r}")
        if _given(p) and not 0 < p <= 1:
            raise SpecResearchError(f"{path}.top_p must lie in (0, 1] (1 = off), got {p!r}")


# The least eval.sandbox.memory_mb: a program's whole address space (RLIMIT_AS), interpreter included.
# Measured with specresearch.evaluation.sandbox (CPython 3.11, Linux): every canonical HumanEval solution
# passes at 16 MB (25 of 164 fail at 12 MB, all fail or hang at 10 MB); every stdlib_doctest solution
# passes at 24 MB (all fail at 16 MB: doctest imports more). 64 leaves room for other builds of Python.
SANDBOX_MIN_MEMORY_MB = 64


@dataclass
class Sandbox:
    """Where eval's generated code runs."""
    timeout: float = MISSING             # wall seconds per problem; then its process group is killed
    memory_mb: int = MISSING             # address-space limit of the process
    require_isolation: bool = MISSING    # refuse to run without a network namespace and Landlock

    def check(self, path: str) -> None:
        t, m = self.timeout, self.memory_mb
        if _given(t) and not (math.isfinite(t) and t > 0):
            raise SpecResearchError(f"{path}.timeout must be a finite number of seconds > 0, got {t!r}")
        if _given(m) and m < SANDBOX_MIN_MEMORY_MB:
            raise SpecResearchError(f"{path}.memory_mb must be >= {SANDBOX_MIN_MEMORY_MB} (the address space of a Python "
                                    f"process running a test program, interpreter included; below it every program "
                                    f"fails), got {m!r}")


@dataclass
class Eval:
    """eval=humaneval, stdlib_doctest: quality (an lm-eval task) instead of speed."""
    task: str = MISSING                  # the lm-eval task
    limit: Optional[int] = None          # N problems (from `offset`); null = all
    offset: int = 0                      # the first problem scored
    baseline: bool = MISSING             # also score the target alone and log the delta
    allow_code_execution: bool = MISSING  # must be true: completions are executed (in the sandbox)
    sandbox: Sandbox = field(default_factory=Sandbox)
    reuse_baseline: bool = MISSING       # reuse the target-alone scores of an identical earlier run


# -- top level -------------------------------------------------------------------------------------


@dataclass
class Stats:
    """The distribution-equivalence battery (specresearch.stats)."""
    samples: Union[int, str] = MISSING  # N continuations per prompt from the baseline and the method; 0 = off; auto: sized for `tv`
    length: int = MISSING       # L: the first L new tokens of each continuation are tested
    prompts: int = MISSING      # the first `prompts` prompts of the dataset
    alpha: float = MISSING      # family-wise error rate of the verdict
    power: float = MISSING      # the power the detectable-effect report is stated for
    tv: float = MISSING         # the position TV the power report (and samples=auto) sizes N for
    aa_repeats: int = MISSING   # A/A calibration repeats; 0 = off
    batch: Union[int, str] = MISSING  # sequences per batched forward (baseline and method sampling, teacher forcing); auto: by vocabulary
    time_split: Union[bool, str] = MISSING  # time the phases of each step (a device sync each): true, false or auto (on the CPU only)

    def check(self, path: str) -> None:
        if _given(self.samples) and self.samples != "auto" and (
                not isinstance(self.samples, int) or isinstance(self.samples, bool) or self.samples < 0):
            raise SpecResearchError(f"{path}.samples must be an integer >= 0 (0: off) or auto, got {self.samples!r}")
        given = [getattr(self, name) for name in ("alpha", "power", "tv") if _given(getattr(self, name))]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 for v in given):
            raise SpecResearchError(f"{path}.alpha, {path}.power and {path}.tv must lie in (0, 1), got "
                                    f"{', '.join(repr(getattr(self, n)) for n in ('alpha', 'power', 'tv'))}")
        if _given(self.time_split) and not _switch(self.time_split):
            raise SpecResearchError(f"{path}.time_split must be true, false or auto, got {self.time_split!r}")
        if _given(self.batch) and self.batch != "auto" and (not isinstance(self.batch, int) or isinstance(self.batch, bool) or self.batch < 1):
            raise SpecResearchError(f"{path}.batch must be an integer >= 1 or auto, got {self.batch!r}")
        if _given(self.aa_repeats) and self.aa_repeats < 0:
            raise SpecResearchError(f"{path}.aa_repeats must be >= 0, got {self.aa_repeats}")
        if _given(self.samples) and self.samples and (self.samples != "auto" and self.samples < 10 or
                                                      _given(self.length) and self.length < 1 or _given(self.prompts) and self.prompts < 1):
            raise SpecResearchError(f"{path} needs samples >= 10 (or 0: off, or auto), length >= 1 and prompts >= 1; got "
                                    f"samples={self.samples}, length={self.length}, prompts={self.prompts}")


SWITCH = ("auto", True, False)  # a setting that is auto, true or false (resume, compiled_reference, stats.time_split)


def _switch(value) -> bool:
    """Whether `value` is one of SWITCH (the booleans themselves: 1 and 0 are not true and false)."""
    return any(value is v if isinstance(v, bool) else value == v for v in SWITCH)


@dataclass
class Config:
    """conf/config.yaml: a speed run (or eval=NAME: a quality run). The groups are checked by OPTIONS."""
    study: Optional[str] = None       # the study a run belongs to (set by the study presets)
    seed: int = MISSING               # seeds every random draw; prompt i uses stream i of it (seeding.stream_seed(seed, i))
    max_new_tokens: int = MISSING     # per prompt, for baseline and method alike
    batch_size: int = MISSING         # prompts decoded together (one target forward verifies every row's draft)
    warmup: bool = MISSING            # one short untimed generation of each engine first
    compiled_reference: Any = MISSING  # time compiled plain decoding beside the baseline: auto (on CUDA), true or false
    resume: Any = MISSING             # auto (in sweeps only), true or false
    resume_ignore_code: bool = MISSING  # resume reuses a run measured by other code (commit, dirty flag) too
    exclusive: bool = MISSING         # a speed job holds the machine's speed lock
    objective: Optional[str] = None   # the summary metric a job returns (for Optuna)
    stats: Stats = field(default_factory=Stats)

    def check(self, path: str) -> None:
        if _given(self.max_new_tokens) and self.max_new_tokens < 1:
            raise SpecResearchError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if _given(self.batch_size) and (not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1):
            raise SpecResearchError(f"batch_size must be an integer >= 1, got {self.batch_size!r}")
        if _given(self.resume) and not _switch(self.resume):
            raise SpecResearchError(f"resume must be auto, true or false, got {self.resume!r}")
        if _given(self.compiled_reference) and not _switch(self.compiled_reference):
            raise SpecResearchError(f"compiled_reference must be auto, true or false, got {self.compiled_reference!r}")
        if self.compiled_reference is True and _given(self.batch_size) and self.batch_size > 1:
            raise SpecResearchError(f"compiled_reference=true times compiled decoding of one sequence: batch_size={self.batch_size} "
                                    "needs compiled_reference=false (or auto)")


@dataclass
class Train:
    """conf/train.yaml's `train`: training Medusa or EAGLE heads (specresearch.train)."""
    heads: int = MISSING               # K: head i predicts the token at t + 2 + i
    layers: int = MISSING              # residual blocks per head
    own_lm_head: bool = MISSING        # false: the target's lm head, shared and frozen; true: a trainable copy per head
    data: str = MISSING                # self: the target's own continuations; text: its top-1 on offline text
    corpora: List[str] = MISSING       # python-stdlib, sharegpt (never evaluation prompts)
    tokens: int = MISSING              # training positions
    new: int = MISSING                 # data=self: tokens generated per prompt
    gen_batch: int = MISSING           # data=self: prompts continued together
    temperature: float = MISSING       # data=self: 0 = the target's greedy text
    seq_len: int = MISSING             # data=text: tokens per target forward over the corpus
    held_out: float = MISSING          # share of the prompts held out for the reported accuracy
    cache: bool = MISSING              # keep the computed data in the model cache
    epochs: int = MISSING              # passes over the cached positions
    batch: int = MISSING               # positions per step
    lr: float = MISSING                # peak learning rate (AdamW, one-cycle)
    weight_decay: float = MISSING      # AdamW weight decay
    soft: float = 0.0                  # medusa: weight of the KL to the target's law (soft labels) against the top-1 cross-entropy
    noise: float = MISSING             # eagle: uniform noise on the features the head reads
    token_loss: float = MISSING        # eagle: weight of the token cross-entropy
    feature_loss: float = MISSING      # eagle: weight of the feature regression
    vocab: Optional[int] = None        # eagle: the token loss scores only this many most frequent tokens
    vocab_corpus: str = MISSING        # eagle: the offline text those frequencies come from
    init: Optional[str] = None         # eagle: go on training the head in this safetensors file
    ttt: int = MISSING                 # eagle: steps the head drafts on its own features in training
    seed: int = MISSING
    log_every: int = MISSING           # steps between progress/MLflow updates
    out: Optional[str] = None          # where to save; null = the model cache


@dataclass
class TrainConfig:
    """conf/train.yaml: its groups (model, drafter, tracker) are checked by OPTIONS."""
    train: Train = field(default_factory=Train)


# Each option of each config group (conf/GROUP/NAME.yaml) -> its schema; "*": any other option's.
OPTIONS: dict[str, dict[str, type]] = {
    "model": {"tiny": TinyModel, "*": TargetModel},
    "drafter": {"independent": Independent, "tree": Tree, "medusa": Medusa, "eagle": Eagle, "pld": PromptLookup,
                "lookahead": Lookahead, "self_draft": SelfDraft, "cross_vocab": CrossVocab, "none": NoDrafter},
    "verifier": {"greedy": Greedy, "rejection": Rejection, "margin": Margin, "topk": TopK, "typical": Typical},
    "tracker": {"mlflow": MLflow, "none": NoTracker},
    "dataset": {"humaneval": Dataset, "mtbench": MTBench, "sharegpt": Dataset},
    "sampling": {"greedy": Sampling, "random": Sampling},
    "eval": {"humaneval": Eval, "stdlib_doctest": Eval},
}
PRIMARY = {"config": Config, "train": TrainConfig}  # conf/NAME.yaml -> its schema (the groups aside)
SKIPPED = ("hydra", "experiment")  # Hydra's own node; a study's preset is merged into the other keys


def schema_of(group: str, option: str) -> type | None:
    """The dataclass of conf/GROUP/OPTION.yaml (None for a group or option without one)."""
    found = OPTIONS.get(group, {})
    return found.get(option, found.get("*"))


def settings(schema: type, shipped: bool = False) -> dict[str, Any]:
    """A schema's settings: name -> the nested settings of a dataclass-typed field, else None (a
    value). shipped: only those the option's YAML has (not the `extra()` ones), what a
    command line may set without `+`."""
    hints = typing.get_type_hints(schema)
    return {f.name: settings(_dataclass_in(hints[f.name]), shipped) if _dataclass_in(hints[f.name]) else None
            for f in fields(schema) if not f.name.startswith("_") and not (shipped and f.metadata.get("extra"))}


# -- the check -------------------------------------------------------------------------------------


def check(cfg: DictConfig) -> None:
    """Refuse an unknown setting, a value of the wrong type or out of range anywhere in a composed
    config.yaml or train.yaml, in one line naming the valid settings, the expected type or the range.

    Raises:
        SpecResearchError
    """
    primary = TrainConfig if "train" in cfg else Config
    groups = [g for g in OPTIONS if g in cfg]
    top = _hints(primary)
    for key in cfg:
        if key in SKIPPED:
            continue
        value = _resolved(cfg, key)
        if key == "model":
            _check_model(value, "model", _group_schema("model"))
        elif key in OPTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise SpecResearchError(f"{key} must be a group of settings, got {value!r}: choose an option with {key}=NAME")
            if "_target_" in OPTIONS[key][next(iter(OPTIONS[key]))].__dataclass_fields__:
                _check_target(value, key)
            else:
                _check_node(value, _group_schema(key), key, key)
        elif key in top:
            _check_value(value, top[key], key)
        else:
            valid = [*(k for k in top if not k.startswith("_")), *dict.fromkeys([*groups, *OPTIONS])]
            raise SpecResearchError(f"unknown setting '{key}': valid are {', '.join(valid)}")
    _ranges(primary, {k: _resolved(cfg, k) for k in top if k in cfg}, "")
    model = _resolved(cfg, "model") if "model" in cfg else None
    if isinstance(model, dict) and model.get("compile") and cfg.get("batch_size", 1) > 1:  # (target.StaticSlots.forward)
        raise SpecResearchError(f"model.compile=true compiles the decoder of one sequence: batch_size={cfg.batch_size} would run "
                                "eagerly; use model.compile=false (model.cache=static decodes batches eagerly) or batch_size=1")


def _check_target(node: dict, group: str) -> None:
    """A `_target_` node against the option of its group that builds the same class; a class that no
    option names is the user's own: its constructor checks it."""
    for option, schema in OPTIONS[group].items():
        if node.get("_target_") == schema._target_:
            _check_node(node, schema, group, f"{group}={option}")
            return


def _check_model(node: Any, path: str, schema: type) -> None:
    if not isinstance(node, dict):
        raise SpecResearchError(f"{path} must be a group of model settings (name, dtype, ...), got {node!r}")
    _check_node(node, schema, path, path)


def _check_node(node: dict, schema: type, path: str, label: str) -> None:
    """`node`'s keys and values against `schema`'s fields, then its ranges."""
    hints = _hints(schema)
    valid = [name for name in hints if not name.startswith("_")]
    for key, value in node.items():
        if key.startswith("_"):  # _target_, _partial_, _recursive_, ...: Hydra's own
            continue
        if key not in hints:
            takes = f"valid are {', '.join(valid)}" if valid else "it takes none"
            raise SpecResearchError(f"{label} has no setting '{key}': {takes}")
        _check_value(value, hints[key], f"{path}.{key}" if path else key)
    _ranges(schema, node, path)


def _check_value(value: Any, hint: Any, path: str) -> None:
    schema = _dataclass_in(hint)
    if schema is not None and (isinstance(value, dict) or not _fits(value, hint)):
        if issubclass(schema, Model):
            _check_model(value, path, schema)
        elif isinstance(value, dict):
            _check_node(value, schema, path, path)
        else:
            raise SpecResearchError(f"{path} must be a group of settings ({', '.join(settings(schema))}), got {value!r}")
        return
    item = _item_hint(hint)
    item_schema = _dataclass_in(item) if item is not None else None
    if isinstance(value, list) and item_schema is not None:
        for i, element in enumerate(value):
            _check_value(element, item, f"{path}[{i}]")
        return
    if not _fits(value, hint):
        raise SpecResearchError(f"{path} must be {_describe(hint)}, got {value!r}")


def _ranges(schema: Any, node: dict, path: str) -> None:
    """The schema's range check (its `check(path)`) on the values the node gives (MISSING: absent)."""
    if isinstance(schema, _Merged):
        for one in schema.schemas:
            _ranges(one, node, path)
    elif hasattr(schema, "check"):
        own = {f.name: node[f.name] for f in fields(schema) if f.name in node and not is_dataclass(_dataclass_in(
            typing.get_type_hints(schema)[f.name]))}
        instance = schema.__new__(schema)
        for f in fields(schema):
            object.__setattr__(instance, f.name, own.get(f.name, MISSING))
        instance.check(path)


def _group_schema(group: str) -> type:
    """A group without `_target_`: one schema holding every field of its options (the first option's
    field first), each with its type."""
    schemas = list(dict.fromkeys(OPTIONS[group].values()))
    if len(schemas) == 1:
        return schemas[0]
    merged: dict[str, Any] = {}
    for schema in schemas:
        for name, hint in _hints(schema).items():
            merged[name] = hint if name not in merged or merged[name] == hint else Union[merged[name], hint]
    return _Merged(group, merged)


class _Merged:
    """The fields of a group's options together (a stand-in for a dataclass: `_hints` reads it)."""

    def __init__(self, group: str, hints: dict[str, Any]):
        self.group, self.hints = group, hints
        self.schemas = list(dict.fromkeys(OPTIONS[group].values()))


def _hints(schema: Any) -> dict[str, Any]:
    """Field name -> type, in declaration order (a base class's first)."""
    if isinstance(schema, _Merged):
        return schema.hints
    hints = typing.get_type_hints(schema)
    return {f.name: hints[f.name] for f in fields(schema)}


# -- types -----------------------------------------------------------------------------------------


def _members(hint: Any) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) is Union else (hint,)


def _dataclass_in(hint: Any) -> type | None:
    """The dataclass a field type names (`DraftModel`, `Optional[DraftModel]`), or None."""
    for member in _members(hint):
        if isinstance(member, type) and is_dataclass(member):
            return member
    return None


def _item_hint(hint: Any) -> Any:
    """The element type of the type's list member (List[X]); None if it has none."""
    for member in _members(hint):
        if typing.get_origin(member) is list:
            args = typing.get_args(member)
            return args[0] if args else Any
    return None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a config value (plain Python, resolved) has the type `hint` declares."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if typing.get_origin(hint) is Union:
        return any(_fits(value, member) for member in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if typing.get_origin(hint) is list:
        item = _item_hint(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if typing.get_origin(hint) is dict:
        args = typing.get_args(hint)
        return isinstance(value, dict) and all(_fits(v, args[1] if len(args) == 2 else Any) for v in value.values())
    if isinstance(hint, type) and is_dataclass(hint):
        return isinstance(value, dict)
    return True


def _describe(hint: Any, plural: bool = False) -> str:
    """'an integer', 'a number or null', 'a list of integers', ..."""
    if typing.get_origin(hint) is Union:
        words = list(dict.fromkeys(_describe(m, plural) for m in typing.get_args(hint)))
        return " or ".join([w for w in words if w != "null"] + [w for w in words if w == "null"])
    if hint is type(None):
        return "null"
    simple = {bool: ("true or false", "booleans"), int: ("an integer", "integers"), float: ("a number", "numbers"),
              str: ("a string", "strings")}
    if hint in simple:
        return simple[hint][plural]
    if typing.get_origin(hint) is list:
        item = _item_hint(hint)
        of = "" if item is Any else f" of {_describe(item, plural=True)}"
        return ("lists" if plural else "a list") + of
    if typing.get_origin(hint) is dict:
        return "mappings" if plural else "a mapping"
    return "a group of settings"


def _resolved(cfg: DictConfig, key: str) -> Any:
    """cfg[key] as plain Python, interpolations resolved."""
    try:
        value = cfg[key]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException as err:
        raise SpecResearchError(f"{key}: {str(err).splitlines()[0]}") from None
