"""specresearch.models.machine.cpu_kind: the kind of CPU speed ratios are measured and said per (README's headline)."""

import pytest
import torch

from specresearch.models import machine


@pytest.mark.parametrize("flags, kind", [
    ("fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile", "AMX"),      # Intel Xeon with AMX (it has AVX-512 BF16 too)
    ("fpu avx2 avx512f avx512_bf16", "AVX-512 BF16"),               # e.g. AMD EPYC Zen 4/5
])
def test_the_kind_comes_from_the_cpus_flags(flags, kind, monkeypatch):
    monkeypatch.setattr(machine, "cpuinfo", lambda field: flags if field == "flags" else "")
    assert machine.cpu_kind() == kind and kind in machine.CPU_KINDS


def test_without_bf16_flags_the_kind_is_torchs_capability(monkeypatch):
    """An AVX2-only CPU (no native bf16: dtype=auto runs float32) is "AVX2", torch's own name; so is an AVX-512 CPU
    without bf16 ("AVX512") or a machine without /proc/cpuinfo."""
    monkeypatch.setattr(machine, "cpuinfo", lambda field: "fpu avx2" if field == "flags" else "")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert machine.cpu_kind() == "AVX2" and machine.CPU_KINDS["AVX2"] == "float32"
    monkeypatch.setattr(machine, "cpuinfo", lambda field: "")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert machine.cpu_kind() == "AVX512"
