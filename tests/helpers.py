"""What the tests share: the command line run as a user runs it, and a tiny engine built as the command
line builds one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from specresearch.engine import Engine

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def user_env(**more: str) -> dict[str, str]:
    """This process's environment, offline (no hub), unbuffered, with `more`."""
    return {**os.environ, **OFFLINE, **more}


def specresearch_command(*args: str, outputs: Path | None = None, store: Path | None = None) -> list[str]:
    """`python -m specresearch ARGS`; `outputs`: Hydra's run and sweep folders under it; `store`: the MLflow store."""
    return [sys.executable, "-m", "specresearch", *args,
            *([f"tracker.store={store}"] if store is not None else []),
            *([f"hydra.run.dir={outputs}/out", f"hydra.sweep.dir={outputs}/multi"] if outputs is not None else [])]


def run_specresearch(*args: str, cwd: Path, outputs: bool = True, store: Path | None = None, env: dict | None = None,
                     timeout: float = 900) -> subprocess.CompletedProcess:
    """The command line in `cwd`, as a user runs it (user_env, or `env`), its output captured; Hydra's
    folders under `cwd` (out/, multi/) unless `outputs` is False (then Hydra's own outputs/ there)."""
    return subprocess.run(specresearch_command(*args, outputs=cwd if outputs else None, store=store), cwd=cwd,
                          env=env if env is not None else user_env(), capture_output=True, text=True, timeout=timeout)


def tiny_engine(*overrides: str) -> Engine:
    """The engine `python -m specresearch model=tiny OVERRIDES` builds (a tiny target drafting for itself
    unless the overrides say otherwise), no model file read, nothing recorded."""
    from specresearch import build_engine, compose

    return build_engine(compose(["model=tiny", "tracker=none", *overrides]))
