"""What the plain lm-eval command needs to know specresearch: `--model specresearch`, `--tasks
humaneval_offline` (and our other offline tasks, without `--include_path`), from any folder.

lm-eval 0.4.13 reads no plugin entry points (upstream merged them for models after 0.4.13;
pyproject.toml declares ours in the `lm_eval.models` group for when a release reads it) and has no
hook for outside tasks at all: its TaskManager indexes lm_eval/tasks/ and the `include_path` it is
given. So the stdlib-only module `specresearch.evaluation.hook`, which `specresearch-lm-eval.pth` imports at
interpreter start, calls this module right after two lm-eval modules run (never before lm-eval is
imported):
  - `lm_eval.models` (lm-eval's table of model names): `register` adds `specresearch` to lm-eval's
    registry as a lazy `module:class` path. Not on `lm_eval.api.registry`: `get_model` imports
    `lm_eval.models` (lm-eval's own names) only while the registry is empty;
  - `lm_eval.tasks`: `add_tasks` makes every TaskManager also index our task folder (before the
    caller's `include_path`, so a task of the user's own with the same name still wins);
  - `lm_eval._cli.harness` (lm-eval's command line, whichever way it starts: the `lm-eval` script,
    `python -m lm_eval`, `python -m specresearch.evaluation.hook`): `one_line_errors` makes a
    SpecResearchError (our model's or our tasks' refusal) one `error: MESSAGE` line on stderr and
    exit code 2, as on our own command line; lm-eval's errors stay lm-eval's.
And `quiet_git_hash`, called when our model is built (so only for runs of our model): the `git
describe` that gives the hash lm-eval records runs with its stderr silenced, so that outside a
checkout git's "fatal: not a git repository" is not printed.
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


def register(models_module=None) -> None:
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


def one_line_errors(harness_module) -> None:
    """Make lm-eval's `HarnessCLI.execute` (every subcommand's dispatch) report a SpecResearchError as
    one `error: MESSAGE` line on stderr and exit 2, without a traceback (once); other exceptions pass."""
    cls = getattr(harness_module, "HarnessCLI", None)
    execute = getattr(cls, "execute", None)
    if execute is None or getattr(execute, "_specresearch", False):  # another lm-eval's shape, or done
        return

    @functools.wraps(execute)
    def one_line(self, args):
        from specresearch.errors import SpecResearchError, fail

        try:
            return execute(self, args)
        except SpecResearchError as err:
            fail(str(err))

    one_line._specresearch = True
    cls.execute = one_line


def quiet_git_hash() -> None:
    """Replace lm-eval's `get_git_commit_hash` (`git describe --always`, stderr inherited) by the
    same lookup with git's stderr silenced (once); inside a checkout it records the same hash."""
    import lm_eval.loggers.utils as utils_module

    original = utils_module.get_git_commit_hash
    if getattr(original, "_specresearch", False):
        return

    @functools.wraps(original)
    def get_git_commit_hash():
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, FileNotFoundError):  # no checkout here, or no git: as lm-eval does
            return utils_module.get_commit_from_path(os.getcwd())

    get_git_commit_hash._specresearch = True
    utils_module.get_git_commit_hash = get_git_commit_hash
    evaluator = sys.modules.get("lm_eval.evaluator")  # imported the name already
    if evaluator is not None and getattr(evaluator, "get_git_commit_hash", None) is original:
        evaluator.get_git_commit_hash = get_git_commit_hash
