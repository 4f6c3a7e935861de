"""The machine a model runs on: device and dtype names resolved, whether the CPU has native bf16, the tags
that say what a measurement ran on, and warnings said once per process."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specresearch.errors import SpecResearchError
from specresearch.models.loaded import LoadedModel

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


CPU_KINDS = {"AMX": "bfloat16", "AVX-512 BF16": "bfloat16", "AVX2": "float32"}  # the CPU kinds speed is measured per, and dtype=auto's pick


def cpu_kind() -> str:
    """The kind of CPU speed ratios differ by (they do: docs/concepts/measured.md): "AMX" (Intel's matrix tiles,
    bf16), "AVX-512 BF16" (native bf16 vector kernels, no AMX), "AVX2" (neither, so dtype=auto picks float32),
    or else torch's name for the CPU's vector capability ("AVX512" without bf16, "DEFAULT", an Arm one...)."""
    flags = set(cpuinfo("flags").split())
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX-512 BF16"
    return torch.backends.cpu.get_cpu_capability()


_SAID: set[str] = set()


def say_once(message: str) -> None:
    """Print `message` to stderr the first time this process says it (a warning an engine build or a
    load would otherwise repeat per run of a sweep or a test session)."""
    if message not in _SAID:
        _SAID.add(message)
        print(message, file=sys.stderr)


def machine_tags(lm: LoadedModel) -> dict[str, str]:
    """What a measurement ran on, as the config cannot say (`dtype=auto`, `device=auto`): the
    resolved dtype and device, the processor or GPU, the CPU's kind (`cpu_kind`), the cores torch uses,
    torch's version."""
    import platform

    if lm.device.type == "cuda":
        processor = torch.cuda.get_device_name(lm.device)
    else:
        processor = cpuinfo("model name") or platform.processor() or platform.machine()
    return {"specresearch.dtype": str(lm.dtype).removeprefix("torch."), "specresearch.device": str(lm.device),
            "specresearch.processor": processor, "specresearch.cpu_kind": cpu_kind(), "specresearch.threads": str(torch.get_num_threads()),
            "specresearch.torch": torch.__version__}


def cpuinfo(field: str) -> str:
    """The first value of `field` ("model name", "vendor_id") in /proc/cpuinfo, or "" where there is none."""
    return next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                 if line.split(":", 1)[0].strip() == field), "")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
