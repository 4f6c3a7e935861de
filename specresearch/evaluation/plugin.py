"""Makes `lm_eval --model specresearch` work: lm-eval 0.4 resolves `--model` against its own registry
before any outside code runs, and reads no plugin entry points yet (upstream merged them after 0.4.13;
pyproject.toml declares ours in the `lm_eval.models` group for when it does).

`specresearch-lm-eval.pth`, installed beside the package, imports this module at interpreter start.
It only adds an import hook: when `lm_eval.models` (lm-eval's table of model names) has run, the
name `specresearch` is added to lm-eval's registry as a lazy `module:class` path. Nothing is imported
until lm-eval itself is, and nothing of ours until the model is asked for.
"""

from __future__ import annotations

import sys

TARGET = "specresearch.evaluation.lm:SpecResearchLM"


def register() -> None:
    """Add `specresearch` to lm-eval's model registry (lazily, as a path) unless it is there."""
    from lm_eval.api.registry import model_registry

    if "specresearch" not in model_registry:
        model_registry.register("specresearch", target=TARGET)


class _AfterLmEvalModels:
    """A meta-path finder that runs `register` right after `lm_eval.models` executes."""

    def find_spec(self, name, path=None, target=None):
        if name != "lm_eval.models":
            return None
        sys.meta_path.remove(self)  # once, and the real finders find the real module
        from importlib.util import find_spec

        spec = find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register()

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    """Called by the .pth file: register now if lm-eval's models ran already, else when they do."""
    if "lm_eval.models" in sys.modules:
        register()
    elif not any(isinstance(f, _AfterLmEvalModels) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLmEvalModels())
