"""What the plain lm-eval command needs to know specresearch: `--model specresearch`, `--tasks
humaneval_offline` (and our other offline tasks, without `--include_path`), from any folder.

lm-eval 0.4.13 reads no plugin entry points (upstream merged them for models after 0.4.13;
pyproject.toml declares ours in the `lm_eval.models` group for when a release reads it) and has no
hook for outside tasks at all: its TaskManager indexes lm_eval/tasks/ and the `include_path` it is
given. So the stdlib-only module `specresearch.evaluation.hook`, which `specresearch-lm-eval.pth`
imports at interpreter start (every wheel of ours, editable ones included, carries the .pth:
_build_backend/backend.py), calls this module right after two public lm-eval modules run (never
before lm-eval is imported):
  - `lm_eval.models` (lm-eval's table of model names): `register` adds `specresearch` to lm-eval's
    registry through its public API (`model_registry.register(name, target="module:Class")`, lazily).
    Not on `lm_eval.api.registry`: `get_model` imports `lm_eval.models` (lm-eval's own names) only
    while the registry is empty. It also sets `one_line_refusals`;
  - `lm_eval.tasks`: `add_tasks` makes every TaskManager also index our task folder, as if given in
    `include_path` (before the caller's paths, so a task of the user's own with the same name still
    wins), and sets `one_line_refusals` too. This is the one place we wrap an lm-eval callable, its public TaskManager's constructor:
    lm-eval 0.4.13 has no other way to add a task folder by default.
Nothing of lm-eval's private modules (`lm_eval._cli`, ...) is touched.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from pathlib import Path

TARGET = "specresearch.evaluation.lm:SpecResearchLM"
TASKS_DIR = Path(__file__).resolve().parent / "tasks"  # our lm-eval task files


def register(models_module=None) -> None:
    """Add `specresearch` to lm-eval's model registry (lazily, as a path) unless it is there, and make
    our refusals one line (`one_line_refusals`)."""
    from lm_eval.api.registry import model_registry

    if "specresearch" not in model_registry:
        model_registry.register("specresearch", target=TARGET)
    one_line_refusals()


def add_tasks(tasks_module) -> None:
    """Make every `TaskManager` of lm-eval's `tasks_module` index TASKS_DIR as well (once per class), and
    our refusals one line (`one_line_refusals`: lm-eval checks the task names before it loads a model)."""
    one_line_refusals()
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


def one_line_refusals() -> None:
    """Report a refusal that ends the process as one `error: MESSAGE` line on stderr and exit code 2, as
    our own command line does: a SpecResearchError (our model's or our tasks'), and, where lm-eval's
    command line runs our model (`--model specresearch`), lm-eval's own refusals of its arguments (a
    ValueError raised in lm-eval's code: an unknown task, `--limit 0`, an unsafe task without
    `--confirm_run_unsafe_code`), prefixed `lm-eval:`. Anything else goes to the hook there was.
    Python's `sys.excepthook`, set once."""
    previous = sys.excepthook
    if getattr(previous, "_specresearch", False):
        return

    def excepthook(kind, value, traceback):
        from specresearch.errors import SpecResearchError

        if isinstance(value, SpecResearchError):
            message = str(value)
        elif isinstance(value, ValueError) and _raised_in_lm_eval(traceback) and _runs_our_model(sys.argv):
            message = f"lm-eval: {value}"
        else:
            return previous(kind, value, traceback)
        print(f"error: {message}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)  # (an excepthook cannot choose the exit code; nothing is left to run: the process was ending)

    excepthook._specresearch = True
    sys.excepthook = excepthook


def _raised_in_lm_eval(traceback) -> bool:
    """Whether the innermost frame of `traceback` is lm-eval's code."""
    import lm_eval

    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and Path(traceback.tb_frame.f_code.co_filename).is_relative_to(Path(lm_eval.__file__).parent)


def _runs_our_model(argv: list[str]) -> bool:
    """Whether lm-eval's command line `argv` names our model (`--model specresearch` or `--model=specresearch`)."""
    return any(arg == "--model=specresearch" or (arg == "--model" and argv[i + 1:i + 2] == ["specresearch"])
               for i, arg in enumerate(argv))
