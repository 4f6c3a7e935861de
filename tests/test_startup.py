"""No import-time machinery: specresearch-lm-eval.pth, run by every interpreter of an environment
where specresearch is installed, imports the tiny stdlib-only `specresearch.evaluation.hook` (with
the two package `__init__` files above it, which import nothing) and nothing else, costs under 5 ms,
and acts only once lm-eval's own modules run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.e2e  # starts fresh interpreters (the .pth's cost, lm-eval's start)

PTH = ROOT / "specresearch-lm-eval.pth"
HOOK = ("__init__.py", "evaluation/__init__.py", "evaluation/hook.py")  # what the .pth imports, in the package
OURS = ["specresearch", "specresearch.evaluation", "specresearch.evaluation.hook"]
BUDGET_US = 5000


def _importtime(python: Path) -> dict[str, tuple[int, int]]:
    """`python -X importtime -c pass`: {module: (self us, cumulative us)} of what the start imported."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    err = subprocess.run([str(python), "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stderr
    out = {}
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, cumulative, name = line.removeprefix("import time:").split("|")
            out[name.strip()] = (int(own), int(cumulative))
    return out


def test_the_pth_costs_under_5_ms_at_interpreter_start_and_imports_nothing_of_ours(tmp_path):
    """A fresh environment (a venv) with the .pth and the hook installed as pip leaves them (byte-compiled)
    in its site-packages: the start imports the hook alone, and it costs < 5 ms."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=False, symlinks=os.name != "nt")
    python = env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    shutil.copy(PTH, site / PTH.name)
    for name in HOOK:
        (site / "specresearch" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "specresearch" / name, site / "specresearch" / name)
    subprocess.run([str(python), "-m", "compileall", "-q", str(site / "specresearch")], check=True)

    runs = [_importtime(python) for _ in range(3)]  # the best of three: this machine's other load is not ours
    for modules in runs:
        ours = sorted(name for name in modules if "specresearch" in name)
        assert ours == OURS, ours  # the hook ran, and imported nothing else of the package
        assert not {"lm_eval", "torch", "importlib.util", "inspect"} & set(modules)
    cost = min(sum(modules[name][1] for name in OURS) for modules in runs)  # cumulative: each one's own time and its imports'
    print(f"the hook at interpreter start: {cost} us (best of 3; self+imports)")
    assert cost < BUDGET_US


def test_nothing_of_ours_runs_until_lm_eval_does():
    """With the .pth processed (as site does at start), `import lm_eval` still imports nothing of ours; lm-eval's
    task index pulls in our plugin, and only asking lm-eval for the model imports the model."""
    code = (f"import site, sys; site.addsitedir({str(ROOT)!r})\n"
            "ours = lambda: sorted(m for m in sys.modules if m.startswith('specresearch'))\n"
            "print(ours(), 'torch' in sys.modules)\n"
            "import lm_eval; print(ours())\n"
            "from lm_eval.tasks import TaskManager; print(ours())\n"
            "from lm_eval.api.registry import get_model; print(get_model('specresearch').__name__, get_model('hf').__name__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's package, before an editable install's
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=300).stdout.splitlines()
    assert out[0] == f"{OURS} False"
    assert out[1] == f"{OURS}"
    assert out[2] == f"{sorted([*OURS, 'specresearch.evaluation.plugin'])}"
    assert out[3] == "SpecResearchLM HFLM"


def test_the_hook_acts_on_lm_eval_modules_that_ran_before_it():
    """Imported after lm-eval's tasks and models ran (a process that imported lm-eval first, a test
    process), the hook still registers the model and our tasks."""
    code = ("import lm_eval.models, lm_eval.tasks\n"
            "import specresearch.evaluation.hook\n"
            "from lm_eval.api.registry import model_registry\n"
            "print('specresearch' in model_registry, 'humaneval_offline' in lm_eval.tasks.TaskManager(include_defaults=False).all_subtasks)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split() == ["True", "True"]
