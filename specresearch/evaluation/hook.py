"""Lets the plain `lm_eval` command know specresearch: `--model specresearch`, and our tasks by name.

lm-eval 0.4.13 reads no plugin entry points and no setting that names outside models or task folders
(pyproject.toml declares our model in the `lm_eval.models` entry-point group for the releases that
read it). So `specresearch-lm-eval.pth`, which every wheel of ours puts into site-packages (editable
installs too: _build_backend/backend.py), imports this module at every interpreter start. It imports
nothing (sys is loaded already) and only puts a finder first on `sys.meta_path`; that finder acts on
two public lm-eval modules alone, right after each one runs, by calling
specresearch.evaluation.plugin (imported then, not before):
  - `lm_eval.models` (lm-eval's table of model names, imported by `get_model` on first use):
    `specresearch` joins lm-eval's registry as a lazy `module:class` path, and our refusals become
    one `error:` line and exit 2;
  - `lm_eval.tasks`: every TaskManager also indexes our task folder;
  - `lm_eval.config.evaluate_config` (the settings of `lm_eval run`): a run of our model on a code task
    without `--confirm_run_unsafe_code` is refused before any model loads.
A process that never imports lm-eval runs nothing else of ours; tests/test_startup.py keeps the cost
at interpreter start under 5 ms.
"""

import sys

AFTER = {"lm_eval.models": "register", "lm_eval.tasks": "add_tasks",  # lm-eval module -> plugin function
         "lm_eval.config.evaluate_config": "refuse_unsafe_early"}


class AfterLmEval:
    """A meta-path finder that runs `specresearch.evaluation.plugin.<AFTER[name]>(module)` right after
    the module `name` executes; it finds no module itself."""

    def find_spec(self, name, path=None, target=None):
        if name not in AFTER:
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
            from specresearch.evaluation import plugin

            getattr(plugin, AFTER[name])(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Put the finder first on sys.meta_path (once); lm-eval modules that already ran are handled now."""
    if any(isinstance(f, AfterLmEval) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, AfterLmEval())
    for name, hook in AFTER.items():
        if name in sys.modules:
            from specresearch.evaluation import plugin

            getattr(plugin, hook)(sys.modules[name])


if __name__ == "__main__":  # `python -m specresearch.evaluation.hook ...`, which ran lm-eval's command line, is gone
    sys.stderr.write("error: `python -m specresearch.evaluation.hook` was removed: run lm-eval's own command, "
                     "`lm_eval run --model specresearch ...` (docs/quality.md: 'The plain lm-eval command works too')\n")
    sys.exit(2)
install()
