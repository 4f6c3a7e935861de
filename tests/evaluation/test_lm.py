"""specresearch as an lm-eval model: registration, generation through the engine, the target's
log-likelihoods, and the offline HumanEval task's scoring."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specresearch.errors import SpecResearchError
from specresearch.evaluation.lm import SpecResearchLM
from specresearch.seeding import stream_seed
from tests.helpers import ROOT

pytestmark = pytest.mark.e2e  # runs lm-eval tasks and generated code

TINY_ARGS = {"model": "tiny", "verifier": "greedy"}
DRAFT_MODEL = {"drafter.model.name": "tiny", "+drafter.model.tiny": "{vocab_size: 320, seed: 0, noise: 0.03}"}
CONTEXTS = ["def add(a, b):", "hello world", "x = [1, 2, 3]\n", "abc"]
MAX_NEW = 12


def _greedy_reference(lm: SpecResearchLM, context: str, until: str) -> str:
    """transformers' own greedy decoding of the tiny target, cut before `until`: what a lossless
    method must produce through lm-eval."""
    model, tok = lm.engine.kv.lm.model, lm.tokenizer
    ids = torch.tensor([tok.encode(context)])
    out = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=0)[0, ids.shape[1]:]
    text = tok.decode(out.tolist(), skip_special_tokens=True)
    return text.split(until)[0]


def _tiny_task(folder: Path, lm: SpecResearchLM) -> str:
    """A local lm-eval generation task whose targets are the target's own greedy continuations, with
    a stop string that cuts the first one midway."""
    first = _greedy_reference(lm, CONTEXTS[0], until="\0\0")
    until = next(ch for ch in first[3:] if ch.isprintable() and ch != "\ufffd")
    docs = [{"context": c, "target": _greedy_reference(lm, c, until)} for c in CONTEXTS]
    (folder / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "tiny_greedy.yaml").write_text(f"""
task: tiny_greedy
dataset_path: json
dataset_kwargs:
  data_files:
    test: {folder / "docs.jsonl"}
output_type: generate_until
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
target_delimiter: ""
generation_kwargs:
  until: [{json.dumps(until)}]
  max_gen_toks: {MAX_NEW}
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
""")
    return "tiny_greedy"


def _evaluate(lm, task: str, folder: Path, **kwargs) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_path=str(folder), include_defaults=False),
                           log_samples=True, bootstrap_iters=0, **kwargs)


@pytest.mark.parametrize("drafter", ["pld", "independent", "self_draft"])
def test_lm_eval_end_to_end_lossless_methods_score_like_plain_greedy(tmp_path, drafter):
    lm = SpecResearchLM(**TINY_ARGS, drafter=drafter, **(DRAFT_MODEL if drafter == "independent" else {}))
    task = _tiny_task(tmp_path, lm)
    results = _evaluate(lm, task, tmp_path)
    assert results["results"][task]["exact_match,none"] == 1.0
    samples = results["samples"][task]
    assert [s["arguments"][0][0] for s in sorted(samples, key=lambda s: s["doc_id"])] == CONTEXTS
    assert len(lm.outputs) == len(CONTEXTS)
    assert any(o.stop_reason == "stop_string" for _, o in lm.outputs) and any(o.stats.steps for _, o in lm.outputs)


def test_a_wrong_answer_scores_zero(tmp_path):
    """The score is computed, not given: targets the model does not produce score 0."""
    lm = SpecResearchLM(**{**TINY_ARGS, "drafter": "pld"})
    task = _tiny_task(tmp_path, lm)
    docs = [json.loads(line) for line in (tmp_path / "docs.jsonl").read_text().splitlines()]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({**d, "target": d["target"] + "!"}) + "\n" for d in docs))
    assert _evaluate(lm, task, tmp_path)["results"][task]["exact_match,none"] == 0.0


# site processes the checkout's specresearch-lm-eval.pth, as it does site-packages' copy at interpreter start
WITH_PTH = f"import site; site.addsitedir({str(ROOT)!r})\n"


def test_registered_name_resolves_in_a_fresh_interpreter():
    """The installed .pth hook registers `specresearch` with lm-eval, without importing us first,
    and lm-eval's own models stay registered."""
    code = WITH_PTH + ("from lm_eval.api.registry import get_model; "
                       "print(get_model('specresearch').__module__, get_model('hf').__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["specresearch.evaluation.lm", "HFLM"]


def test_plain_lm_eval_command_line(tmp_path):
    lm = SpecResearchLM(**{**TINY_ARGS, "drafter": "pld"})
    task = _tiny_task(tmp_path, lm)
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", WITH_PTH + "from lm_eval.__main__ import cli_evaluate; cli_evaluate()", "run", "--model", "specresearch",
           "--model_args", "model=tiny,drafter=pld,verifier=greedy", "--tasks", task, "--batch_size", "3",
           "--include_path", str(tmp_path), "--output_path", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, env={**__import__("os").environ, "HF_DATASETS_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    (result,) = out.rglob("results_*.json")
    assert json.loads(result.read_text())["results"][task]["exact_match,none"] == 1.0
    # lm-eval records the model's info in its config: the code that ran it, as MLflow's tags name it
    from specresearch.records import COMMIT_TAG, DIRTY_TAG, VERSION_TAGS, code_tags

    config = json.loads(result.read_text())["config"]
    named = (COMMIT_TAG, DIRTY_TAG, *VERSION_TAGS.values())
    assert {tag: config.get(tag) for tag in named} == {tag: code_tags().get(tag) for tag in named}
    assert config["model_dtype"] == "float32"


def test_task_sampling_settings_override_the_configured_ones():
    lm = SpecResearchLM(**{**TINY_ARGS, "drafter": "pld", "verifier": "rejection", "sampling": "random"})
    assert lm._engine_for({"until": ["\n"]}).sampling.temperature == 1.0
    assert lm._engine_for({"do_sample": False}).sampling.greedy
    assert lm._engine_for({"temperature": 0.5, "top_p": 0.9}).sampling.top_p == 0.9
    with pytest.raises(SpecResearchError, match="unsupported generation_kwargs.*temperature"):
        lm._engine_for({"typical_p": 0.5})


def test_bad_model_args_name_the_valid_choices():
    with pytest.raises(SpecResearchError, match="pld"):
        SpecResearchLM(**{**TINY_ARGS, "drafter": "nope"})


@pytest.mark.parametrize("args", [{"batch_size": "auto"}, {"batch_size": "auto:4"}, {"batch_size": 0}, {"batch_size": "2.5"},
                                  {"batch_size": True}, {"batch_size": 4, "max_batch_size": 8}])
def test_a_bad_batch_size_is_refused_in_one_line_before_the_model_loads(args, monkeypatch):
    monkeypatch.setattr("specresearch.evaluation.lm.build_engine", lambda cfg: pytest.fail("the model was built"))
    with pytest.raises(SpecResearchError, match=r"model specresearch: .*batch_size=N|batch_size must be an integer >= 1") as err:
        SpecResearchLM(**TINY_ARGS, **args)
    assert "\n" not in str(err.value)


def _requests(kwargs_of=lambda i: {"until": ["\n\n"], "max_gen_toks": MAX_NEW}):
    from lm_eval.api.instance import Instance

    contexts = ["def add(a, b):", "x", "import os\nimport sys\n\ndef main():\n    ", "hello world", "a = 1\nb = 2\n"]
    return [Instance("generate_until", {}, (c, kwargs_of(i)), i) for i, c in enumerate(contexts)]


@pytest.mark.parametrize("kwargs_of", [lambda i: {"until": ["\n\n"], "max_gen_toks": MAX_NEW},
                                       lambda i: {"until": ["\n\n"], "max_gen_toks": MAX_NEW - 2} if i % 2 else
                                       {"until": "\n" if i < 4 else ["\n"], "max_gen_toks": MAX_NEW}],
                         ids=["one kind", "two kinds"])
def test_a_batch_size_decodes_in_batches_with_the_texts_and_seeds_of_batch_size_1(kwargs_of, monkeypatch):
    """5 requests of different lengths (second case: two kinds of stop strings and budgets, the odd ones
    and the even ones): batch_size=3 gives batch size 1's texts, in order; each engine call holds at
    most 3 requests that decode alike (longest first), request i seeded stream_seed(seed, i)."""
    from specresearch.engine import Engine

    one = SpecResearchLM(**TINY_ARGS, drafter="pld", seed=7)
    three = SpecResearchLM(**TINY_ARGS, drafter="pld", seed=7, batch_size="3")  # as lm-eval's command line gives it
    assert (one.batch_size, three.batch_size) == (1, 3)
    calls = []
    generate = Engine.generate

    def spy(self, prompts, max_new_tokens, stop_strings=(), seed=0, **kwargs):
        calls.append(([len(p) for p in prompts], max_new_tokens, tuple(stop_strings), seed))
        return generate(self, prompts, max_new_tokens, stop_strings=stop_strings, seed=seed, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy)
    requests = _requests(kwargs_of)
    want = one.generate_until(requests, disable_tqdm=True)
    assert len(calls) == 5
    calls.clear()
    got = three.generate_until(requests, disable_tqdm=True)
    assert got == want and any(want)
    assert [o.tokens for _, o in three.outputs] == [o.tokens for _, o in one.outputs]
    assert [r for r, _ in three.outputs] == requests  # kept in the requests' order
    lengths = {len(one.tok_encode(r.args[0])): i for i, r in enumerate(requests)}
    assert len(lengths) == 5  # the contexts' lengths differ
    seen = []
    for sizes, max_new, until, seeds in calls:
        assert 1 <= len(sizes) <= 3 and sizes == sorted(sizes, reverse=True)  # longest first
        members = [lengths[n] for n in sizes]
        assert seeds == [stream_seed(7, i) for i in members]
        assert all(requests[i].args[1]["max_gen_toks"] == max_new for i in members)
        assert all(tuple([u] if isinstance(u := requests[i].args[1]["until"], str) else u) == until for i in members)
        seen += members
    assert sorted(seen) == list(range(5))
    assert len(calls) == 2  # one kind: 3 + 2; two kinds: the 3 even ones ("\n" given as a string or a list), the 2 odd ones


@torch.inference_mode()
def test_loglikelihood_is_the_targets_alone():
    from lm_eval.api.instance import Instance

    lm = SpecResearchLM(**{**TINY_ARGS, "drafter": "pld"})
    model, tok = lm.engine.kv.lm.model, lm.tokenizer

    def direct(ids: list[int], n: int) -> tuple[float, bool]:
        logits = model(torch.tensor([ids[:-1]])).logits[0, -n:].float()  # [n, V]
        target = torch.tensor(ids[-n:])
        return F.log_softmax(logits, -1).gather(-1, target[:, None]).sum().item(), bool((logits.argmax(-1) == target).all())

    pairs = [("def add(a, b):", " return a + b"), ("abc", "d")]
    requests = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    got = lm.loglikelihood(requests, disable_tqdm=True)
    for (context, continuation), (logp, greedy) in zip(pairs, got):
        want_logp, want_greedy = direct(tok.encode(context + continuation), len(tok.encode(continuation)))
        assert logp == pytest.approx(want_logp, abs=1e-4) and greedy == want_greedy
    # a continuation made of the target's own argmax tokens is greedy
    ids = tok.encode("abc")
    nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
    (logp, greedy), = lm._loglikelihood_tokens([(None, ids, [nxt])], disable_tqdm=True)
    assert greedy and logp < 0

    text = "the quick brown fox"
    (rolling,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)], disable_tqdm=True)
    ids = [lm.eot_token_id] + tok.encode(text)
    assert rolling == pytest.approx(direct(ids, len(ids) - 1)[0], abs=1e-3)
