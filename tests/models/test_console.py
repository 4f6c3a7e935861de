"""A quiet console: a run and the speed benchmark print on stderr nothing but their progress bars (no
warning of transformers or torch), and the slow steps have one bar each: a model load ("loading NAME")
and each side of the equivalence battery's sampling."""

import os
import re
import subprocess
import sys

import pytest

from specresearch.models import ZOO, Part, ZooEntry, load_model
from tests.helpers import BAR, not_bars, sha256_of, write_tiny_gguf

pytestmark = pytest.mark.e2e  # reads the command line's console output



def bars(stderr: str) -> dict[str, str]:
    """Each bar's description -> its last state drawn (tqdm redraws a bar in place with \\r)."""
    return {m["desc"]: line for line in re.split(r"[\r\n]", stderr) if (m := BAR.fullmatch(line.strip()))}


def run(*args: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # the warnings a user would see
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)


def test_a_plain_run_prints_no_warning(tmp_path):
    result = run("-m", "specresearch", "model=tiny", "drafter=pld", "verifier=greedy", "tracker=none", "dataset.num_prompts=1",
                 "max_new_tokens=8", f"hydra.run.dir={tmp_path}/out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "greedy identity" in result.stdout
    assert not_bars(result.stderr) == [], result.stderr[-3000:]
    assert "| 16/16 [" in bars(result.stderr)["pld(k=10) x greedy (baseline and method)"]  # new tokens, both sides


def test_the_battery_has_one_bar_per_side(tmp_path):
    result = run("-m", "specresearch", "model=tiny", "drafter=pld", "verifier=rejection", "sampling.temperature=1", "stats.samples=20",
                 "stats.length=3", "tracker=none", "dataset.num_prompts=1", "max_new_tokens=4", f"hydra.run.dir={tmp_path}/out",
                 f"model.cache_dir={tmp_path}/cache", cwd=tmp_path)  # a cache of its own: the target's side is drawn, not reused
    assert result.returncode == 0, result.stderr[-3000:]
    assert not_bars(result.stderr) == [], result.stderr[-3000:]
    drawn = bars(result.stderr)
    for side in ("baseline", "method"):
        assert "| 20/20 [" in drawn[f"equivalence samples: {side}"]  # every sample counted, once


def test_a_model_load_has_one_bar_named_after_the_model(tmp_path, monkeypatch, capsys):
    """A tiny GGUF as a zoo model: its cache entry is built on the first load; the second reads it, with
    one bar that counts every tensor of the entry, and no bar of transformers' own."""
    from safetensors import safe_open

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setitem(ZOO, "tiny-gguf", ZooEntry("Tiny GGUF", (Part(file=str(gguf)),), sha256_of(gguf)))
    load_model("tiny-gguf", cache_dir=tmp_path / "cache", device="cpu")
    capsys.readouterr()
    load_model("tiny-gguf", cache_dir=tmp_path / "cache", device="cpu")
    err = capsys.readouterr().err
    with safe_open(tmp_path / "cache" / "tiny-gguf" / "model.safetensors", "pt") as f:
        n = len(list(f.keys()))
    assert list(bars(err)) == ["loading tiny-gguf"] and not_bars(err) == [], err
    assert f"| {n}/{n} [" in bars(err)["loading tiny-gguf"]


def test_a_quality_run_shows_our_lines_and_keeps_lm_evals_in_the_log_file(tmp_path, new_store):
    """lm-eval's INFO lines (seeds, contexts, requests) and its --metadata advice go to the job's log
    file, not to the console; the results table and the browse line stay."""
    result = run("-m", "specresearch", "eval=stdlib_doctest", "model=tiny", "drafter=pld", "eval.limit=1", "eval.baseline=false",
                 "eval.allow_code_execution=true", "max_new_tokens=8", f"tracker.store={new_store(tmp_path / 'mlruns')}",
                 f"hydra.run.dir={tmp_path}/out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pass@1" in result.stdout and "browse with" in result.stdout
    for chatter in ("Setting random seed", "Building contexts", "Running generate_until", "Custom kwargs"):
        assert chatter not in result.stdout + result.stderr
    log = (tmp_path / "out" / "specresearch.log").read_text()
    assert "Building contexts" in log and "pass@1" in log  # the job's own record keeps everything
