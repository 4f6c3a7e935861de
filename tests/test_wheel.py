"""The package runs anywhere: built as a wheel, installed (not editable) into a folder of its own, and
run from another folder, it finds its configs and studies and decodes with the tiny model."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.e2e  # builds wheels

SOURCES = ("pyproject.toml", "MANIFEST.in", "README.md", "specresearch-lm-eval.pth", "_build_backend", "specresearch", "conf",
           "experiments", "analysis")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built by pip (in its own build environment) from a copy of the sources, so the
    checkout stays clean, and installed with `pip install --target` (the dependencies are this
    environment's)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src, site = tmp / "src", tmp / "site"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(tmp / "dist"), str(src)], check=True, timeout=300)
    wheel = next((tmp / "dist").glob("specresearch-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, timeout=300)
    return site


def _pth_in(wheel: Path) -> tuple[bytes, str]:
    """The wheel's root specresearch-lm-eval.pth and its RECORD line."""
    with zipfile.ZipFile(wheel) as whl:
        record = next(name for name in whl.namelist() if name.endswith(".dist-info/RECORD"))
        line = next(line for line in whl.read(record).decode().splitlines() if line.startswith("specresearch-lm-eval.pth,"))
        return whl.read("specresearch-lm-eval.pth"), line


def test_every_wheel_carries_the_lm_eval_pth_at_its_root(installed, tmp_path):
    """What makes the plain `lm_eval` know us (specresearch/evaluation/hook.py) reaches site-packages from
    a wheel and from an editable install's wheel (PEP 660, what `pip install -e .` builds), listed in
    RECORD with its true hash and size."""
    pth = (ROOT / "specresearch-lm-eval.pth").read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(pth).digest()).rstrip(b"=").decode()
    assert (installed / "specresearch-lm-eval.pth").read_bytes() == pth  # pip put it beside the package
    src = installed.parent / "src"
    build = ("import sys; sys.path.insert(0, '_build_backend'); import backend\n"
             "print(getattr(backend, sys.argv[1])(sys.argv[2]))")
    for hook in ("build_wheel", "build_editable"):
        out = tmp_path / hook
        name = subprocess.run([sys.executable, "-c", build, hook, str(out)], cwd=src, capture_output=True, text=True,
                              check=True, timeout=300).stdout.strip().splitlines()[-1]
        assert _pth_in(out / name) == (pth, f"specresearch-lm-eval.pth,sha256={digest},{len(pth)}"), hook


def run(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}  # before site-packages, where the editable install is
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_runs_the_tiny_model_from_another_folder(installed, tmp_path):
    where = run(installed, tmp_path, "-c", "import specresearch.config as c; print(c.CONF_DIR)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(installed)  # the wheel's copy, not the checkout's
    done = run(installed, tmp_path, "-m", "specresearch", "model=tiny", "drafter=pld", "tracker=none", "dataset.num_prompts=1",
               "max_new_tokens=4", f"hydra.run.dir={tmp_path / 'out'}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "speedup (tokens/s ratio)" in done.stdout
    assert (tmp_path / "out" / "summary.json").is_file()


def test_the_wheel_has_the_studies_and_the_python_api(installed, tmp_path):
    preset = run(installed, tmp_path, "-m", "specresearch", "experiment=lossless_vs_lossy", "--cfg", "job")
    assert preset.returncode == 0, preset.stderr[-2000:]
    assert "study: lossless_vs_lossy" in preset.stdout
    api = run(installed, tmp_path, "-c", "from specresearch import build_engine, compose\n"
              "engine = build_engine(compose(['model=tiny', 'drafter=pld', 'drafter.k=3']))\n"
              "out = engine.generate([5, 6, 7, 5, 6], max_new_tokens=6)\n"
              "print(len(out.tokens), out.stats.tau >= 1)")
    assert api.returncode == 0, api.stderr[-2000:]
    assert api.stdout.split() == ["6", "True"]
