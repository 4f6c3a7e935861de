"""load_model: a zoo key, a local directory or .gguf file, a Hugging Face id from the local cache, or a tiny
random model, loaded without network access and checked before it loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specresearch.errors import SpecResearchError
from specresearch.models.hf import in_hf_cache, load_hf, one_line
from specresearch.models.kernels import PackedLinear, SkinnyLinear, packed_linear_available, use_invariant_kernels, use_linear
from specresearch.models.loaded import LoadedModel
from specresearch.models.machine import cpu_has_fast_bf16, resolve_device, resolve_dtype, say_once
from specresearch.models.tiny import check_tiny_args, tiny_model
from specresearch.models.zoo import ZOO, check_gguf, load_gguf, load_zoo
from specresearch.options import make
from specresearch.options.models import TargetModel

MIN_TRANSFORMERS = "5.24"  # models take `cache=`: 5.23 and older ignore it (no error, wrong tokens)


def check_transformers(version: str | None = None) -> None:
    """Refuse a transformers older than MIN_TRANSFORMERS (`version`: the installed one by default).

    The engine hands the model its KV cache as `cache=`; an older transformers takes the keyword
    silently and decodes without the cache, so every token after the first is wrong, with no error.
    """
    import transformers
    from packaging.version import Version

    version = version or transformers.__version__
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise SpecResearchError(f"transformers {version} is installed; specresearch needs >= {MIN_TRANSFORMERS} (older "
                                f"versions ignore the engine's KV cache and decode wrong tokens): pip install "
                                f"'transformers>={MIN_TRANSFORMERS},<6'")


def load_model(name: str, **given: Any) -> LoadedModel:
    """Load a causal LM and its tokenizer, without network access.

    Args:
        name: a zoo key (see ZOO), a local HF-format directory, a .gguf file, a Hugging Face id
            already in the local HF cache, or "tiny" (a random model, see tiny_model).
        **given: the model's settings (options.models.TargetModel, the `model` group's; the rest at their
            defaults): `dtype` ("auto": bfloat16 for real models, float32 for tiny; see resolve_dtype),
            `device` ("auto", "cpu", "cuda" or "cuda:N"), `cache_dir` (where dequantized GGUF models are
            cached; None = default_cache_dir()), `tiny` (tiny_model's keywords, for name "tiny"),
            `kernels` (see `linear_kind`; "auto": float32 and bfloat16 linear layers on the CPU read
            weights oneDNN laid out once (PackedLinear), bfloat16 where the CPU has native bf16;
            "packed", "skinny" (few rows as W @ xᵀ) or "torch" (nn.Linear) everywhere; "invariant":
            the law at a context the same bits at every forward shape, see
            models.kernels.use_invariant_kernels), `cache` (the KV cache its Targets keep: "dynamic" or "static", see
            kv.StaticSlots), `compile` (the decoder under torch.compile at fixed widths; needs
            cache="static"). `draft` is not read here (what drafter.model.name defaults to): taken so
            that `load_model(**cfg.model)` loads the node as it is.

    Returns:
        The model in eval mode on `device` in `dtype`, and its tokenizer.
    """
    check_transformers()
    s = make(TargetModel, {"name": name, **given})
    dtype, device, cache_dir, tiny, kernels, cache, compile = s.dtype, s.device, s.cache_dir, s.tiny, s.kernels, s.cache, s.compile
    lm = _load(name, dtype, resolve_device(device), cache_dir, tiny)
    lm.cache_dir = None if cache_dir is None else str(cache_dir)
    lm.cache, lm.compile = cache, compile
    if kernels == "invariant":
        use_invariant_kernels(lm.model)
    else:
        use_linear(lm.model, linear_kind(kernels, lm, compile))
    return lm


def linear_kind(kernels: str, lm: LoadedModel, compile: bool = False) -> type[torch.nn.Linear]:
    """The linear layers' class for model.kernels=`kernels` (not "invariant"): "auto" takes PackedLinear on a
    CPU in float32, or in bfloat16 where the CPU has native bf16 kernels (measured on such CPUs only),
    SkinnyLinear there under compile or where torch has no oneDNN, else nn.Linear; "packed", "skinny"
    and "torch" take theirs."""
    if kernels == "packed" and not packed_linear_available():
        raise SpecResearchError("model.kernels=packed needs torch's oneDNN (mkldnn) linear ops, which this torch build lacks: "
                                "set model.kernels=auto, skinny or torch")
    if kernels != "auto":
        return {"packed": PackedLinear, "skinny": SkinnyLinear, "torch": torch.nn.Linear}[kernels]
    fast = lm.dtype == torch.float32 or (lm.dtype == torch.bfloat16 and cpu_has_fast_bf16())
    if lm.device.type != "cpu" or not fast:
        return torch.nn.Linear
    return PackedLinear if packed_linear_available() and not compile else SkinnyLinear


def _load(name: str, dtype: str, dev: torch.device, cache_dir: str | None, tiny: dict | None) -> LoadedModel:
    if name == "tiny":
        args = dict(tiny or {})
        check_tiny_args(args)
        lm = tiny_model(**args)
        want = torch.float32 if str(dtype).lower() == "auto" else resolve_dtype(dtype, dev)
        lm.model.to(device=dev, dtype=want)
        lm.device, lm.dtype = dev, want
        return lm
    want = resolve_dtype(dtype, dev)
    if want == torch.bfloat16 and dev.type == "cpu" and not cpu_has_fast_bf16():
        say_once(
            "specresearch: this CPU has no native bf16 kernels (AVX2 only): multi-token forwards (prefill, "
            "verification) cost about as many single-token ones, so speculative speedups shrink; "
            "model.dtype=auto picks float32 here"
        )
    path = Path(name).expanduser()
    if name in ZOO:
        return load_zoo(name, cache_dir, want, dev)
    if path.is_file() and path.suffix == ".gguf":
        return load_gguf(path, name, cache_dir, want, dev)
    if path.is_dir():
        _check_model_folder(path, name)
        try:
            return load_hf(path, name, want, dev)
        except (OSError, ValueError, KeyError, TypeError) as err:  # a damaged config.json, weights of another model, ...
            raise SpecResearchError(f"model.name={name}: transformers cannot load the model in {path} ({one_line(err)}): "
                                    f"valid are {VALID_NAMES}") from err
    if in_hf_cache(name):
        return load_hf(name, name, want, dev)
    raise SpecResearchError(
        f"unknown model '{name}': not an embedded model (choices: {', '.join(ZOO)}, tiny), not a local directory "
        "or .gguf file, and not in the local Hugging Face cache (no hub access here)"
    )


VALID_NAMES = f"a zoo key ({', '.join(ZOO)}), tiny, a Hugging Face id in the local cache or a model folder, or a .gguf file"


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")  # what from_pretrained reads


def check_model_files(name: str) -> None:
    """What load_model would refuse of a local model's files alone (a folder without config.json or
    weights, a .gguf file that is none), checked without loading it: before a run waits for the speed lock."""
    path = Path(str(name)).expanduser()
    if name in ZOO or name == "tiny":
        return
    if path.is_dir():
        _check_model_folder(path, name)
    elif path.is_file() and path.suffix == ".gguf":
        check_gguf(path)


def _check_model_folder(path: Path, name: str) -> None:
    """Refuse a folder that holds no Hugging Face model (its config.json and weights), before
    transformers fails on it with a message about model_type."""
    lacks = [what for what, there in (("config.json", (path / "config.json").is_file()),
                                      ("weights (*.safetensors or *.bin)", any(any(path.glob(g)) for g in WEIGHT_FILES)))
             if not there]
    if lacks:
        raise SpecResearchError(f"model.name={name}: the folder {path} holds no model (no {' and no '.join(lacks)}): "
                                f"valid are {VALID_NAMES}")
