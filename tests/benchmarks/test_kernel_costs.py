"""benchmarks/kernel_costs.py: each kernels choice timed per shape, and its results page."""

import json
import os
import subprocess
import sys

import pytest

from specresearch import reports
from tests.helpers import ROOT, results_hook

pytestmark = pytest.mark.e2e  # runs benchmarks/kernel_costs.py as its users do


def test_kernel_costs_times_each_kernels_choice_per_shape_and_writes_a_page(tmp_path):
    """benchmarks/kernel_costs.py on the tiny model: every kernels choice at every shape (rows x tokens and ragged
    rows), v against each choice's own one token, a valid results page the docs hook renders; an unknown choice
    refused naming the valid ones."""
    script = str(ROOT / "benchmarks" / "kernel_costs.py")
    out = tmp_path / "costs.json"
    result = subprocess.run([sys.executable, script, "--model", "tiny", "--repeats", "2", "--kernels", "torch,packed,invariant",
                             "--shapes", "1x1,1x3,2+1", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert [line.split(",")[0].strip() for line in result.stdout.splitlines() if "round" in line] == ["round 1/2", "round 2/2"]
    data = json.loads(out.read_text())
    assert reports.validate(data) == []
    assert [row[0] for row in data["rows"]] == ["1x1", "1x3", "2+1"]
    assert data["columns"][1:4] == ["torch (ms)", "packed (ms)", "invariant (ms)"] and data["columns"][-1] == "invariant / torch"
    assert [row[4:7] for row in data["rows"]][0] == ["1.00", "1.00", "1.00"]  # v: each choice's one token over itself
    assert "| 2+1 |" in results_hook().render(results_hook().load(out), "costs.json")
    bad = subprocess.run([sys.executable, script, "--model", "tiny", "--kernels", "mkl"], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "unknown --kernels mkl: valid are auto, packed, skinny, torch, invariant" in bad.stderr
