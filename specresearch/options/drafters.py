"""The drafters' settings (the `drafter` group). Settings several drafters share are declared once,
in the small bases they inherit: a draft length, a path-probability stop, a chain's stops and
siblings, a frequent-token vocabulary, a tree's size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, List, Optional

from specresearch.errors import SpecResearchError
from specresearch.options import Options, at_least, given, one_of, probability_or_null, setting
from specresearch.options.models import DraftModel, FrequentVocab

K_POLICIES = ("fixed", "heuristic")  # how k evolves within a sequence (engine.DraftLength)
MATCH = ("first", "last")  # drafter=pld: which earlier occurrence it continues
CHILDREN = ("top", "sample")  # a tree's children: the draft's likeliest tokens, or drawn from its law
SHAPES = ("auto",)  # a tree's sizing (drafters.tree.Sizer); null = nodes as given
CROSS_VOCAB_MODES = ("string", "shared")  # drafter=cross_vocab: the draft's text re-tokenized, or its shared tokens (TLI)


@dataclass
class Drafter(Options):
    """The base of the drafters' settings."""
    group: ClassVar[str] = "drafter"
    builds: ClassVar[bool] = True


# -- shared parts ----------------------------------------------------------------------------------


@dataclass
class DraftLength(Drafter):
    """How many tokens a chain drafter proposes each step (engine.DraftLength)."""
    k: int = setting(4, "draft tokens per step (the most: a confidence stop or a shorter match may draft fewer)")
    k_policy: str = setting("fixed", "fixed, or heuristic (transformers: k += 2 after a fully accepted draft, else k -= 1)")
    k_max: Optional[int] = setting(None, "the largest k the heuristic may reach; null = 4 k")

    def check_ranges(self, path: str) -> None:
        if given(self.k) and self.k < 1:
            raise SpecResearchError(f"drafter={self.option} needs k >= 1, got k={self.k} (use drafter=none for plain decoding)")
        one_of(path, "k_policy", self.k_policy, K_POLICIES)
        if given(self.k_max) and self.k_max is not None and given(self.k) and self.k_max < self.k:
            raise SpecResearchError(f"{path}.k_max must be >= {path}.k, got {self.k_max} < {self.k}")


@dataclass
class PathStop(Drafter):
    """A stop on the draft's path probability (EAGLE-2's cumulative confidence)."""
    chain_confidence: Optional[float] = setting(
        None, "stop drafting once the draft's path probability (the product of its tokens' probabilities: a chain's so "
              "far, or every path of a tree's last level) falls below this, e.g. 0.2; null = never")

    def check_ranges(self, path: str) -> None:
        probability_or_null(path, "chain_confidence", self.chain_confidence)


@dataclass
class Chain(PathStop, DraftLength):
    """A chain drafted token by token by a draft model: its stops, siblings and prompt lookup."""
    confidence: Optional[float] = setting(None, "stop a draft after a token the draft gives less than this probability "
                                                "(e.g. 0.4, transformers' assisted generation); null = always k")
    siblings: int = setting(0, "beside each draft token, the draft's next N likeliest tokens as leaves the target may take "
                               "instead (a tree whose spine is the chain; no extra draft forward); 0 = a plain chain")
    sibling_confidence: float = setting(0.0, "keep a sibling only where its path probability (the draft's chance the target "
                                             "takes it) is at least this, e.g. 0.05; 0 = all")
    lookup: int = setting(0, "prompt lookup inside the draft: feed up to this many n-gram guesses with each draft forward, "
                             "kept while the draft agrees (same chain, fewer forwards); 0 = off")

    def check_ranges(self, path: str) -> None:
        DraftLength.check_ranges(self, path)
        PathStop.check_ranges(self, path)
        at_least(path, "lookup", self.lookup, 0, " (0 = off)")
        at_least(path, "siblings", self.siblings, 0, " (0 = a plain chain)")
        if given(self.sibling_confidence) and not 0 <= self.sibling_confidence < 1:
            raise SpecResearchError(f"{path}.sibling_confidence must lie in [0, 1) (0 = keep every sibling), "
                                    f"got {self.sibling_confidence}")
        probability_or_null(path, "confidence", self.confidence)


@dataclass
class ShapedChain(Chain):
    """A draft model's chain whose length may follow this machine's cost curve (drafters.independent.ChainSizing)."""
    shape: Optional[str] = setting(None, "auto: draft on while a longer chain adds tokens faster than the run's predicted "
                                         "speedup (the draft's probabilities calibrated by past verdicts, the run's measured "
                                         "drafting time per token, this machine's measured cost of verifying n tokens: "
                                         "Sequoia's sizing for a chain), within k and any stop above; null = the stops as given")

    def check_ranges(self, path: str) -> None:
        Chain.check_ranges(self, path)
        one_of(path, "shape", self.shape, SHAPES, null="the stops as given")


@dataclass
class TreeSize(Drafter):
    """A tree's size: its most nodes, how children are chosen, and Sequoia-style sizing."""
    nodes: int = setting(24, "the most nodes kept, by cumulative draft probability (the target verifies them in one "
                             "forward; EAGLE-2: 60 on GPUs); with shape=auto the largest size considered")
    children: str = setting("top", "top: the draft's likeliest tokens (q = None); sample: drawn from q (SpecInfer, T > 0)")
    shape: Optional[str] = setting(None, "auto: each step keeps the size in 1..nodes with the best predicted speedup (draft "
                                         "confidence, this machine's measured cost of verifying n tokens); null = nodes")

    def check_ranges(self, path: str) -> None:
        one_of(path, "children", self.children, CHILDREN)
        one_of(path, "shape", self.shape, SHAPES, null="nodes as given")


@dataclass
class DynamicTree(TreeSize):
    """A dynamic tree (EAGLE-2): each level expands the likeliest nodes."""
    topk: int = setting(4, "dynamic: children per expanded node and nodes expanded per level (EAGLE-2 uses 10 on GPUs)")
    depth: int = setting(5, "dynamic: levels, the longest path (EAGLE-2: 6)")

    def check_ranges(self, path: str) -> None:
        TreeSize.check_ranges(self, path)
        sizes = [v for v in (self.topk, self.depth, self.nodes) if given(v)]
        if sizes and min(sizes) < 1:
            raise SpecResearchError(f"a dynamic tree needs topk, depth and nodes >= 1, got {self.topk}, {self.depth}, {self.nodes}")
        if given(self.shape) and self.shape is not None and given(self.children) and self.children != "top":
            raise SpecResearchError(f"{path}.shape=auto keeps the likeliest nodes, which sampled children cannot be chosen by "
                                    f"(their law would change): use {path}.children=top")


@dataclass
class Heads(Drafter):
    """Heads trained on the target (Medusa, EAGLE): where their file is."""
    heads: ClassVar[str] = ""  # their kind: the file layout a checkpoint is checked against (drafters.checkpoints)
    checkpoint: Optional[str] = setting(None, "the heads' safetensors file; null = the one trained for this target in the "
                                              "model cache (python -m specresearch.train drafter=NAME), else the one the "
                                              "package ships for it (specresearch/weights/NAME/TARGET/: Medusa's for "
                                              "qwen2.5-coder-1.5b)")
    cache_dir: Optional[str] = setting(None, "the model cache (the target's)", follows="model.cache_dir")


# -- the options -----------------------------------------------------------------------------------


# Where the defaults below were chosen: interleaved benchmarks/speed.py runs on the tuning sets, each reason comparing
# settings within one run and naming its results pages (docs/results/data/NAME.json, which tests/test_docs.py holds
# each speedup to): a setting's speedup moves between runs (day, machine, kernels), so a reason quotes one run's.
TUNED = "tuning sets HumanEval 100-103 x 128 + ShareGPT 0-3 x 64, greedy, bf16"
FIRST = (f"{TUNED}, 2-core Intel Xeon with AMX, skinny kernels: docs/results/data/2026-11-29-tune-humaneval.json, "
         "docs/results/data/2026-11-29-tune-sharegpt.json")
LEVERS = (f"{TUNED}, 2-core Intel Xeon with AMX, skinny kernels: docs/results/data/2026-11-29-tune-levers-humaneval.json, "
          "docs/results/data/2026-11-29-tune-levers-sharegpt.json")
PACKED = (f"{TUNED}, 2-core AMD EPYC with AVX-512 BF16, packed kernels: "
          "docs/results/data/2026-12-02-tune-packed-humaneval-bf16.json, docs/results/data/2026-12-02-tune-packed-sharegpt-bf16.json")
HELD_CURVE = ("HumanEval 120-127 x 128 and MT-bench questions 2-9 x 64, 2 repeats, the same machine: "
              "docs/results/data/2026-12-05-heldout-avx512bf16-humaneval-curve-bf16.json, "
              "docs/results/data/2026-12-05-heldout-avx512bf16-mtbench-curve-bf16.json")
CURVE = (f"{TUNED}, 2-core AMD EPYC with AVX-512 BF16, packed kernels: "
         "docs/results/data/2026-12-05-tune-chain-shape-per-token-avx512bf16-humaneval.json, "
         "docs/results/data/2026-12-05-tune-chain-shape-per-token-avx512bf16-sharegpt.json")


@dataclass
class Independent(ShapedChain, defaults={"k": 16, "lookup": 4, "siblings": 3, "sibling_confidence": 0.02, "shape": "auto"}):
    """A separate, smaller draft model with the target's tokenizer proposes k tokens per step (Leviathan et al. 2023).
    Its defaults are the fastest lossless chain measured on code and chat together: each reason below compares
    settings within one run on the tuning sets and names its results pages; the held-out speedups are the README's."""
    option: ClassVar[str] = "independent"
    CHOSEN: ClassVar[dict[str, str]] = {
        "k": f"16 against 32, with the stops, lookup and siblings below: 2.22x / 1.80x against 2.36x / 1.63x over generate "
             f"on code / chat in one run, level on the two together ({PACKED})",
        "shape": f"auto (the chain's length read from this machine's cost curve) against the constant stop chain_confidence=0.4 "
                 f"that it replaces: 2.47x / 1.56x against 2.24x / 1.51x over generate on code / chat in one run, ahead on "
                 f"both ({CURVE}). A first form, which charged each later token the step's mean draft forward (prompt "
                 f"lookup's free tokens uncounted), ran level on the tuning sets and slower than the constant stop held out on "
                 f"code ({HELD_CURVE})",
        "chain_confidence": "null: shape=auto stops the chain (see shape); 0.4 was the default before it, chosen against 0.2 "
                            f"at 2.22x / 1.80x against 1.95x / 1.65x over generate on code / chat in one run ({PACKED})",
        "siblings": f"3 at sibling_confidence 0.02 against 2 at 0.05: 2.22x / 1.80x against 2.21x / 1.82x over generate on "
                    f"code / chat in one run, level ({PACKED}); a 65,536-token FR-Spec shortlist with 2 siblings at 0.05 "
                    f"ran 2.99x / 1.94x against 2.75x / 2.02x without it, faster on code only, and a shortlist needs a "
                    f"corpus per tokenizer, so it stays an option ({FIRST})",
        "sibling_confidence": "see siblings",
        "lookup": f"4 against 8 guesses: 2.89x / 1.98x over generate on code / chat against 2.63x / 2.12x in one run "
                  f"({LEVERS})",
        "model.quantize": "int8 draft weights where the CPU has torch's int8 kernels, none elsewhere (the console says which): "
                          f"2.89x / 1.98x over generate on code / chat against a bf16 draft's 2.00x / 1.53x in one run, on "
                          f"a CPU with AMX for bf16 ({LEVERS})",
    }
    model: DraftModel = setting(doc="the draft model, as in the `model` group", factory=lambda: DraftModel(quantize="auto"))


# Leviathan's plain chain: k = 4 tokens a step, one draft forward each, none of the independent drafter's
# levers (stops, lookup, siblings, int8). drafter=plain_chain, the independent drafter's "plain chain" mode (the
# law tests' and the tests' of one mechanism) and the studies whose question is k read it here.
PLAIN_CHAIN = {"k": 4, "chain_confidence": None, "shape": None, "lookup": 0, "siblings": 0, "sibling_confidence": 0.0}
# The drafter group's presets: option -> (title, the settings of the option it presets that differ)
PRESETS = {"plain_chain": (
    "Leviathan's plain chain (Leviathan et al. 2023; Chen et al. 2023): drafter=independent with k = 4 and none of its "
    "levers (confidence stops, lookup, siblings, int8 draft): what the speculative decoding papers measure, and the studies "
    "whose question is k (leviathan, batch_synergy) draft",
    {**PLAIN_CHAIN, "model": DraftModel()})}


@dataclass
class SelfDraft(FrequentVocab, ShapedChain):
    """Self-speculative decoding (Draft & Verify 2023; LayerSkip early exit 2024): the target drafts with layers skipped."""
    option: ClassVar[str] = "self_draft"
    skip: Optional[List[int]] = setting(None, "decoder layer indices to skip, e.g. [4, 6, 8, 10, 12]; layer 0 is always kept")
    exit_layer: Optional[int] = setting(None, "instead: early exit after layer exit_layer - 1 (skip every later layer)")
    skip_ratio: Optional[float] = setting(0.5, "when neither is set: skip this fraction of the layers, evenly spaced, first "
                                               "and last kept")
    quantize: Optional[str] = setting(None, "int8: an int8 copy of the layers the draft runs (CPU); auto: int8 on a CPU with torch's "
                                            "int8 kernels, else none")


@dataclass
class CrossVocab(ShapedChain):
    """A draft model from another family, whose tokenizer differs from the target's (Timor et al. 2025; transformers' UAG)."""
    option: ClassVar[str] = "cross_vocab"
    mode: str = setting("string", "string: the draft's argmax text, re-tokenized for the target (lossless at any T: a "
                                  "deterministic draft); shared: only the tokens both vocabularies have (TLI: sampled from "
                                  "the draft's law restricted to them; siblings need it)")
    model: DraftModel = setting(doc="the draft model, as in the `model` group (any tokenizer)",
                                factory=lambda: DraftModel(name="smollm2-135m"))

    def check_ranges(self, path: str) -> None:
        ShapedChain.check_ranges(self, path)
        one_of(path, "mode", self.mode, CROSS_VOCAB_MODES)
        if given(self.mode) and self.mode == "string":
            if given(self.siblings) and self.siblings:
                raise SpecResearchError(f"{path}.siblings needs {path}.mode=shared (a sibling is one target token; mode=string "
                                        f"drafts text), or set {path}.siblings=0")
            if given(self.shape) and self.shape is not None:
                raise SpecResearchError(f"{path}.shape=auto sizes a chain of target tokens, which needs {path}.mode=shared "
                                        f"(mode=string drafts text), or set {path}.shape=null")


@dataclass
class Tree(PathStop, DynamicTree):
    """Token trees from a draft model (SpecInfer 2024; EAGLE-2's dynamic trees 2024), verified in one target forward."""
    option: ClassVar[str] = "tree"
    branching: Optional[List[int]] = setting(
        factory=lambda: [2, 1, 1, 1],
        doc="children per node at each depth: a static tree (here 2 + 2 + 2 + 2 = 8 nodes, depth 4; sized for a 2-core "
            "CPU); null = dynamic")
    model: DraftModel = setting(doc="the draft model, as in the `model` group", factory=DraftModel)
    ensemble: List[DraftModel] = setting(doc="more draft models (same keys as `model`) merged into one tree (SpecInfer)",
                                         factory=list)

    def check_ranges(self, path: str) -> None:
        PathStop.check_ranges(self, path)
        static = given(self.branching) and self.branching is not None
        if static and (not len(self.branching) or min(self.branching) < 1):
            raise SpecResearchError(f"{path}.branching needs one or more counts >= 1 (or null: dynamic), got {list(self.branching)}")
        if not static:
            DynamicTree.check_ranges(self, path)
            return
        TreeSize.check_ranges(self, path)
        if given(self.shape) and self.shape is not None:
            raise SpecResearchError(f"{path}.shape=auto sizes a dynamic tree: set {path}.branching=null")


@dataclass
class Medusa(TreeSize, FrequentVocab, Heads, defaults={"nodes": 16, "shape": "auto"}):
    """Medusa (Cai et al. 2024): heads on the target's last hidden state propose a tree of candidates.
    Heads for qwen2.5-coder-1.5b ship with the package (specresearch/weights/medusa/); for another target, train
    them first: python -m specresearch.train drafter=medusa (model=... as for the run)."""
    option: ClassVar[str] = "medusa"
    heads: ClassVar[str] = "medusa"
    CHOSEN: ClassVar[dict[str, str]] = {
        "lookup": f"8 against 4 and 0 with typical acceptance: 2.10x / 1.40x over generate on code / chat, 4 1.63x / "
                  f"1.54x, 0 1.56x / 1.45x in one run, 8 the best of the three on the two together ({FIRST}); on code, "
                  f"16 ran 1.77x and 24 1.82x against 8's 2.06x in a second run "
                  f"(docs/results/data/2026-11-29-tune-medusa-lookup.json)"}
    choices: Optional[List[List[int]]] = setting(
        None, "Medusa's tree of choices: per-depth ranks of each path, e.g. [[0], [1], [0, 0]], used as given; null = the "
              "likeliest paths by the heads' held-out accuracies, as many as `shape` says")
    lookup: int = setting(8, "prompt lookup as a branch of the tree: the up to N tokens that followed the last earlier "
                             "occurrence of the context's last n-gram (3 down to 1) join the heads' candidates (shared "
                             "prefixes merged), verified in the same forward (shape=auto: as much as its measured "
                             "acceptance pays for); needs children=top; 0 = off")

    def check_ranges(self, path: str) -> None:
        TreeSize.check_ranges(self, path)
        at_least(path, "nodes", self.nodes, 1)
        at_least(path, "lookup", self.lookup, 0, " (0 = off)")
        if given(self.lookup) and self.lookup and given(self.children) and self.children != "top":
            raise SpecResearchError(f"{path}.lookup adds a deterministic branch to a tree of the heads' top tokens: use "
                                    f"{path}.children=top, or set {path}.lookup=0")
        choices = self.choices if given(self.choices) else None
        if choices is None:
            return
        if not choices or any(not c or min(c) < 0 for c in choices):
            raise SpecResearchError(f"{path}.choices must be non-empty paths of ranks >= 0, got {[list(c) for c in choices]}")
        missing = sorted({tuple(c[:-1]) for c in choices if len(c) > 1} - {tuple(c) for c in choices})
        if missing:
            raise SpecResearchError(f"{path}.choices must hold every path's parent; missing {[list(m) for m in missing]}")


@dataclass
class Eagle(DynamicTree, FrequentVocab, Heads, DraftLength, defaults={"depth": 6}):
    """EAGLE (Li et al. 2024): a one-layer head drafts on the target's features, autoregressively.
    Train the head first: python -m specresearch.train drafter=eagle (model=... as for the run)."""
    option: ClassVar[str] = "eagle"
    heads: ClassVar[str] = "eagle"
    tree: bool = setting(False, "true: EAGLE-2's dynamic tree (topk, depth, nodes, children, shape) instead of a chain of k")

    def check_ranges(self, path: str) -> None:
        at_least(path, "k", self.k, 1)
        if self.tree is True:
            DynamicTree.check_ranges(self, path)
            return
        if given(self.shape) and self.shape is not None:
            raise SpecResearchError(f"{path}.shape=auto sizes EAGLE-2's tree: set {path}.tree=true")
        DraftLength.check_ranges(self, path)


@dataclass
class PromptLookup(DraftLength, defaults={"k": 10}):
    """Prompt lookup decoding (Saxena 2023): continue an earlier occurrence of the last n-gram. No model."""
    option: ClassVar[str] = "pld"
    CHOSEN: ClassVar[dict[str, str]] = {
        "k": "the paper's num_pred_tokens (Saxena 2023), as transformers' prompt lookup; not tuned here on a real target "
             "(experiments/tune_pld searches k and max_ngram)",
        "max_ngram": "the paper's max_ngram_size (transformers' own prompt lookup uses 2)",
        "match": "the paper's and transformers' choice: the first occurrence"}
    max_ngram: int = setting(3, "the longest suffix looked up (the paper's max_ngram_size); longer first")
    min_ngram: int = setting(1, "the shortest suffix looked up")
    match: str = setting("first", "which earlier occurrence to continue: first (paper, transformers) or last (most recent)")

    def check_ranges(self, path: str) -> None:
        DraftLength.check_ranges(self, path)
        low, high = self.min_ngram, self.max_ngram
        if given(low) and given(high) and not 1 <= low <= high:
            raise SpecResearchError(f"drafter=pld needs 1 <= min_ngram <= max_ngram, got {low}, {high}")
        one_of(path, "match", self.match, MATCH)


@dataclass
class Lookahead(Drafter):
    """Lookahead decoding (Fu et al. 2024): Jacobi iteration on a window of guesses fills an n-gram pool; the pool's
    n-grams that continue the last token are verified in the same target forward. No model."""
    option: ClassVar[str] = "lookahead"
    CHOSEN: ClassVar[dict[str, str]] = {
        key: "the reference implementation's example configuration (LookaheadDecoding's README: LEVEL=5, WINDOW_SIZE=7, "
             "GUESS_SET_SIZE=7); not tuned here" for key in ("window", "ngram", "guesses")}
    window: int = setting(7, "W: Jacobi window width (the reference implementation's WINDOW_SIZE; the paper's A100 runs "
                             "use up to 15)")
    ngram: int = setting(5, "N: n-gram size = levels + 1 = proposal length + 1 (LEVEL)")
    guesses: int = setting(7, "G: pool n-grams verified per step (GUESS_SET_SIZE)")
    pool_from_prompt: bool = setting(False, "also pool the prompt's n-grams (the reference implementation's POOL_FROM_PROMPT)")

    def check_ranges(self, path: str) -> None:
        window, guesses = self.window, self.guesses
        if any(given(v) and v < 1 for v in (window, guesses)):
            raise SpecResearchError(f"drafter=lookahead needs window >= 1 and guesses >= 1, got {window}, {guesses}")
        if given(self.ngram) and self.ngram < 3:
            raise SpecResearchError(f"drafter=lookahead needs ngram >= 3 (N − 1 >= 2 Jacobi levels), got ngram={self.ngram}")


@dataclass
class NoDrafter(Drafter):
    """No drafter: plain autoregressive decoding through the same engine (the baseline itself)."""
    option: ClassVar[str] = "none"
