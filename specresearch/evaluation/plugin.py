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
    wins), and sets `one_line_refusals` too. We wrap its public TaskManager's constructor: lm-eval
    0.4.13 has no other way to add a task folder by default;
  - `lm_eval.config.evaluate_config` (the settings of `lm_eval run`, after its arguments and `--config`
    file are read): `refuse_unsafe_early` wraps its public `EvaluatorConfig.process_tasks`, the first
    lm-eval code that holds both the task list and `confirm_run_unsafe_code`, so a run of our model on
    a code task without `--confirm_run_unsafe_code` is refused in one line before the task index and the
    model are built (lm-eval itself refuses only after both). Our model's constructor would be too late
    and sees neither: lm-eval gives it the model arguments alone.
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


def refuse_unsafe_early(config_module) -> None:
    """Make `lm_eval run --model specresearch` refuse a task marked `unsafe_code: true` without
    `--confirm_run_unsafe_code` before any model loads: `EvaluatorConfig.process_tasks` of lm-eval's
    `config_module` checks the names in a TaskManager of our and the user's task folders before it
    indexes lm-eval's thousands (our code tasks are refused there, seconds after the start), and every task
    it resolved once it has (lm-eval's own, groups and tags followed to their tasks). Other models are
    left to lm-eval. Also sets `one_line_refusals`.

    Raises (from the wrapped method):
        SpecResearchError: such a task, without the flag.
    """
    one_line_refusals()
    cls = getattr(config_module, "EvaluatorConfig", None)
    process = getattr(cls, "process_tasks", None)
    if process is None or getattr(process, "_specresearch", False):  # a future lm-eval of another shape, or done
        return

    @functools.wraps(process)
    def process_tasks(self, *args, **kwargs):
        check = getattr(self, "model", None) == "specresearch" and not getattr(self, "confirm_run_unsafe_code", True)
        if check:
            from lm_eval.tasks import TaskManager

            names = [self.tasks] if isinstance(self.tasks, str) else list(self.tasks or [])
            names = [name for spec in names for name in (spec.split(",") if isinstance(spec, str) else [spec])]  # "a,b"
            _refuse_unsafe(TaskManager(include_path=self.include_path, include_defaults=False), names)
        manager = process(self, *args, **kwargs)
        if check:
            _refuse_unsafe(manager, self.tasks)
        return manager

    process_tasks._specresearch = True
    cls.process_tasks = process_tasks


def _refuse_unsafe(manager, specs: list) -> None:
    """Raise a SpecResearchError naming the tasks among `specs` that are marked `unsafe_code: true`."""
    unsafe = unsafe_tasks(manager.task_index, specs)
    if unsafe:
        from specresearch.errors import SpecResearchError

        which = f"tasks {', '.join(unsafe)} execute" if len(unsafe) > 1 else f"task {unsafe[0]} executes"
        raise SpecResearchError(f"{which} model-written code (unsafe_code: true): add --confirm_run_unsafe_code to the "
                                "lm_eval command (from Python: simple_evaluate(..., confirm_run_unsafe_code=True))")


def unsafe_tasks(index: dict, specs: list) -> list[str]:
    """The tasks among `specs` that lm-eval's task index `index` (`TaskManager.task_index`) marks
    `unsafe_code: true`, groups and tags followed to their tasks.

    Args:
        index: task, group and tag name -> lm-eval's index entry (`.kind`, `.cfg`, `.tags`).
        specs: names, or task configs as dicts (a YAML file given to `--tasks`, a group's inline task);
            a name the index lacks is skipped (lm-eval refuses it itself).

    Returns:
        Their names, in the order found, each once.
    """
    found, seen, todo = [], set(), list(specs)
    while todo:
        spec = todo.pop(0)
        if isinstance(spec, dict):
            cfg, name = spec, spec.get("task")
        elif spec in index and spec not in seen:
            seen.add(spec)
            entry, name = index[spec], spec
            if entry.kind.name == "TAG":  # a tag's entry lists the tasks that carry it
                todo += sorted(entry.tags)
                continue
            cfg = entry.cfg or {}
        else:
            continue
        if cfg.get("unsafe_code") and name not in found:
            found.append(name)
        members = cfg.get("task")
        if isinstance(members, list):  # a group's tasks
            todo += members
        elif isinstance(spec, dict) and isinstance(members, str) and "unsafe_code" not in cfg:
            todo.append(members)  # an inline config of an indexed task: that task's own setting
    return found


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
