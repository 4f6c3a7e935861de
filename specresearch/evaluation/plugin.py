"""Makes the plain lm-eval command know specresearch: `--model specresearch`, `--tasks humaneval_offline`
(and our other offline tasks, without `--include_path`), from any folder.

lm-eval 0.4.13 reads no plugin entry points (upstream merged them for models after 0.4.13;
pyproject.toml declares ours in the `lm_eval.models` group for when a release reads it) and has no
hook for outside tasks at all: its TaskManager indexes lm_eval/tasks/ and the `include_path` it is
given. So `specresearch-lm-eval.pth`, installed beside the package, imports this module at
interpreter start, and it only adds an import hook that acts right after three lm-eval modules run:
  - `lm_eval.models` (lm-eval's table of model names): `specresearch` joins lm-eval's registry as a
    lazy `module:class` path;
  - `lm_eval.tasks`: every TaskManager also indexes our task folder (before the caller's
    `include_path`, so a task of the user's own with the same name still wins);
  - `lm_eval.loggers.utils`: the `git describe` that gives the hash lm-eval records runs with its
    stderr silenced, so that outside a checkout git's "fatal: not a git repository" is not printed.
Nothing is imported until lm-eval itself is, and nothing of ours until the model is asked for.
"""

from __future__ import annotations

import functools
import inspect
import os
import subprocess
import sys
from pathlib import Path

TARGET = "specresearch.evaluation.lm:SpecResearchLM"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"  # our lm-eval task files


def register() -> None:
    """Add `specresearch` to lm-eval's model registry (lazily, as a path) unless it is there."""
    from lm_eval.api.registry import model_registry

    if "specresearch" not in model_registry:
        model_registry.register("specresearch", target=TARGET)


def add_tasks(tasks_module) -> None:
    """Make every `TaskManager` of lm-eval's `tasks_module` index TASKS_DIR as well (once per class)."""
    cls = tasks_module.TaskManager
    init = cls.__init__
    if getattr(init, "_specresearch", False):
        return
    signature = inspect.signature(init)
    if "include_path" not in signature.parameters:  # a future lm-eval of another shape: leave it be
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        given = bound.arguments.get("include_path")
        paths = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        if not any(Path(p).resolve() == TASKS_DIR for p in paths):  # already there: no "overrides" warnings
            bound.arguments["include_path"] = [TASKS_DIR, *paths]
        init(*bound.args, **bound.kwargs)

    __init__._specresearch = True
    cls.__init__ = __init__


def quiet_git_hash(utils_module) -> None:
    """Replace lm-eval's `get_git_commit_hash` (`git describe --always`, stderr inherited) by the
    same lookup with git's stderr silenced; inside a checkout it records the same hash."""
    original = utils_module.get_git_commit_hash

    @functools.wraps(original)
    def get_git_commit_hash():
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, FileNotFoundError):  # no checkout here, or no git: as lm-eval does
            return utils_module.get_commit_from_path(os.getcwd())

    utils_module.get_git_commit_hash = get_git_commit_hash
    evaluator = sys.modules.get("lm_eval.evaluator")  # imported the name already (install() after lm-eval ran)
    if evaluator is not None and getattr(evaluator, "get_git_commit_hash", None) is original:
        evaluator.get_git_commit_hash = get_git_commit_hash


HOOKS = {  # lm-eval module -> what to do right after it runs
    "lm_eval.models": lambda module: register(),
    "lm_eval.tasks": add_tasks,
    "lm_eval.loggers.utils": quiet_git_hash,
}


class _AfterLmEval:
    """A meta-path finder that runs a module's HOOKS entry right after the module executes."""

    def find_spec(self, name, path=None, target=None):
        hook = HOOKS.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:  # the real module, as the other finders find it
            spec = finder.find_spec(name, path, target) if finder is not self and hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            hook(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called by the .pth file: act now on the lm-eval modules already run, and on the others when they run."""
    for name, hook in HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])
    if not any(isinstance(f, _AfterLmEval) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLmEval())
