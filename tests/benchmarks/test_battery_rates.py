"""benchmarks/battery_rates.py: the battery's draws per second per the target's kernels, and its results page."""

import json
import os
import shlex
import subprocess
import sys

import pytest
import torch

from specresearch import reports
from specresearch.models import PackedLinear, SkinnyLinear
from tests.helpers import ROOT, results_hook, script

pytestmark = pytest.mark.e2e  # runs benchmarks/battery_rates.py as its users do

SCRIPT = str(ROOT / "benchmarks" / "battery_rates.py")
TINY = "model=tiny drafter=pld verifier=rejection sampling=random"


def test_battery_rates_draw_both_sides_per_kernels_and_write_a_page(tmp_path):
    """On the tiny model: every kernels choice draws both sides in every round, each rate positive and over the
    reference's for the ratio columns, a valid results page the docs hook renders."""
    out = tmp_path / "rates.json"
    result = subprocess.run([sys.executable, SCRIPT, "--overrides", TINY, "--kernels", "torch,packed", "--samples", "8",
                             "--rounds", "2", "--json", str(out)], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert [line.split(",")[0].strip() for line in result.stdout.splitlines() if "round" in line] == ["round 1/2", "round 2/2"]
    data = json.loads(out.read_text())
    assert reports.validate(data) == []
    assert [row[0] for row in data["rows"]] == ["torch", "packed"]
    command = shlex.split(data["command"][0])  # it reproduces the run: the overrides one argument
    assert command[command.index("--overrides") + 1] == TINY
    assert all(float(row[1]) > 0 and float(row[2]) > 0 for row in data["rows"])
    assert data["rows"][0][3:] == ["1.00x", "1.00x"]
    assert "| packed |" in results_hook().render(results_hook().load(out), "rates.json")


@pytest.mark.parametrize("args, message", [
    (["--kernels", "skinny,mkl"], "unknown --kernels mkl: valid are auto, packed, skinny, torch"),
    (["--overrides", "model=tiny drafter=pld verifier=rejection sampling=greedy"], "the battery draws at temperature > 0"),
])
def test_battery_rates_refuse_bad_inputs_in_one_line(tmp_path, args, message):
    result = subprocess.run([sys.executable, SCRIPT, "--overrides", TINY, *args], capture_output=True, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_the_draft_model_takes_each_kernels_choice_too(monkeypatch):
    """A drafter with a draft model (plain_chain): its linear layers take each choice with the target's, so a
    choice's rate is the pair's on those kernels; the last choice is left in place."""
    from specresearch import measure

    seen = []
    real = measure.method_samples

    def method_samples(engine, *args):
        seen.append({type(m) for lm in (engine.kv.lm, engine.drafter.draft.lm) for m in lm.model.modules()
                     if isinstance(m, torch.nn.Linear)})
        return real(engine, *args)

    monkeypatch.setattr(measure, "method_samples", method_samples)
    got = script("benchmarks/battery_rates.py").rates(["model=tiny", "drafter=plain_chain", "verifier=rejection", "sampling=random"],
                                                      ["skinny", "packed"], samples=4, length=3, rounds=1)
    assert seen == [{SkinnyLinear}, {PackedLinear}]
    assert all(r["baseline"] > 0 and r["method"] > 0 for r in got["rates"].values())
