"""stdlib_doctest: write a function of Python's standard library from its signature and docstring;
scored by running the docstring's own examples (doctest) against the completion, in the sandbox.

A second execution-scored code task that needs no download: the problems are read from the running
interpreter's standard library (public top-level functions whose docstrings hold examples and whose
own body passes them: specresearch.data.DOCTEST_FUNCTIONS, checked on CPython 3.11). The completion is executed inside the
function's module, so the module's private helpers are there, as for the original.

Caveats: the standard library is in every code model's training data (this measures a delta between
decoding methods, not a model's ability), and the prompts overlap `specresearch.train`'s
self-distillation prompts (functions cut after their docstring): a Medusa/EAGLE head trained by
`train.data=self` has seen them, so its acceptance here is optimistic.
"""

from __future__ import annotations

from specresearch.data import doctest_problems
from specresearch.evaluation import sandbox


def program(doc: dict, completion: str) -> str:
    """The program run in the sandbox: define prompt + completion inside the module, run its doctests."""
    return f"""import doctest, importlib, sys
module = importlib.import_module({doc["module"]!r})
exec(compile({(doc["prompt"] + completion)!r}, "<completion>", "exec"), module.__dict__)
function = module.__dict__[{doc["name"]!r}]
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
for test in doctest.DocTestFinder(recurse=False).find(function, {doc["name"]!r}, module=False, globs=dict(module.__dict__)):
    runner.run(test, out=sys.stderr.write)
failed, attempted = runner.summarize(verbose=False)
sys.exit(1 if failed or not attempted else 0)
"""


def load(**_):
    """The problems as a datasets.DatasetDict with one `test` split (lm-eval's `custom_dataset`).
    lm-eval calls it when it builds the task, before any generation: the sandbox's refusals come now."""
    import datasets

    sandbox.preflight()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(doctest_problems())})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """pass@1 of one completion: 1.0 if every example of the function's docstring passes."""
    return sandbox.score(doc["task_id"], program(doc, results[0]))
