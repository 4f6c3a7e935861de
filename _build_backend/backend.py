"""The build backend: setuptools' own (`setuptools.build_meta`), plus `specresearch-lm-eval.pth` at the
root of every wheel it builds, the editable ones included.

That one-line .pth is how the plain `lm_eval` command knows `--model specresearch` and our tasks
(specresearch/evaluation/hook.py): site-packages runs it at interpreter start. setuptools has no way to
put a file at a wheel's root from pyproject.toml, and an editable wheel holds only setuptools' own
import hook, so the README's `pip install -e .` used to leave lm-eval without it. PEP 517's in-tree
backends (`backend-path` in pyproject.toml) are the standard place for such a step: after setuptools
builds a wheel, `add_pth` writes the .pth into it and its RECORD.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F401,F403 (every hook but the two below is setuptools')

PTH = "specresearch-lm-eval.pth"
ROOT = Path(__file__).resolve().parent.parent


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    return name


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    name = build_meta.build_editable(wheel_directory, config_settings, metadata_directory)
    add_pth(Path(wheel_directory) / name)
    return name


def add_pth(wheel: Path) -> None:
    """Rewrite `wheel` with PTH at its root, listed in its RECORD (sha256, size) as the wheel format asks."""
    data = (ROOT / PTH).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(wheel) as old:
        entries = [(info, old.read(info)) for info in old.infolist() if info.filename != PTH]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as new:
        for info, content in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                lines = [line for line in content.decode().splitlines() if line and not line.startswith(f"{PTH},")]
                content = "\n".join([f"{PTH},sha256={digest},{len(data)}", *lines, ""]).encode()
            new.writestr(info, content)
        new.writestr(PTH, data)
