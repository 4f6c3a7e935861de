"""What a user who knows lm-eval expects of `--model specresearch`: `pretrained=NAME`, the
`--confirm_run_unsafe_code` opt-in, our tasks found by name without `--include_path` (and listed by
`lm-eval ls tasks`), the plain `lm_eval` command working after our install, refusals in one line (a code
task without the flag before any model loads), and lm-eval's own route (`--include_path`, `@register_model`)."""

import json
import logging
import os
import re
import subprocess
import sys
import sysconfig

import pytest
from lm_eval.api.model import LM

import specresearch.evaluation.hook  # noqa: E402,F401 (in this process too, the hook specresearch-lm-eval.pth installs at start)
from specresearch.config import options
from specresearch.errors import SpecResearchError
from specresearch.evaluation import sandbox
from specresearch.evaluation.lm import SpecResearchLM
from specresearch.evaluation.runner import TASKS, TASKS_DIR
from specresearch.evaluation.sandbox import ALLOW_ENV, CodeExecutionNotAllowed
from tests.helpers import ROOT

pytestmark = pytest.mark.e2e  # runs lm-eval's own command

# lm-eval's own command line, the `lm_eval` script of this environment: it knows our model and tasks
# through specresearch-lm-eval.pth, which our install put into site-packages (editable or not)
LM_EVAL = (os.path.join(os.path.dirname(sys.executable), "lm_eval"),)


def _lm_eval(*args: str, cwd, env_drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """The plain lm-eval command line, run from `cwd`."""
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    return subprocess.run([*LM_EVAL, *args], cwd=cwd, env={**env, "HF_DATASETS_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def isolated():
    """Our code tasks refuse to start where the sandbox lacks a required layer (before lm-eval's own checks)."""
    missing = [layer for layer in sandbox.REQUIRED if not sandbox.isolation()[layer]]
    if missing:
        pytest.skip(f"this machine lacks sandbox layers {missing}")


class _Canonical(LM):
    """Answers each problem with its own canonical solution: what scores it is the execution."""

    def generate_until(self, requests, disable_tqdm=False):
        return [r.doc["canonical_solution"] for r in requests]

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


def _simple_evaluate(lm, task: str, **kwargs) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    return simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_defaults=False), limit=1,
                           bootstrap_iters=0, **kwargs)


def _request(context: str):
    from lm_eval.api.instance import Instance

    return Instance("generate_until", {}, (context, {"until": ["\n\n"], "max_gen_toks": 8}), 0)


# -- 1. pretrained=NAME ------------------------------------------------------------------------------

def test_pretrained_names_the_target_as_our_own_keys_do():
    lm = SpecResearchLM(pretrained="tiny", drafter="pld")
    same = SpecResearchLM(model="tiny", drafter="pld")
    assert lm.engine.kv.lm.name == same.engine.kv.lm.name == "tiny"
    assert lm.generate_until([_request("def f(x):")], disable_tqdm=True) == \
        same.generate_until([_request("def f(x):")], disable_tqdm=True)
    SpecResearchLM(pretrained="tiny", model="tiny", drafter="pld")  # both, naming the same model: fine


def test_pretrained_not_a_preset_is_the_model_name(tmp_path):
    missing = tmp_path / "nothing.gguf"
    with pytest.raises(SpecResearchError, match=f"unknown model '{re.escape(str(missing))}'.*choices: .*tiny"):
        SpecResearchLM(pretrained=str(missing), drafter="pld")


@pytest.mark.parametrize("ours", ["model=qwen2.5-coder-0.5b", "model.name=/models/other.gguf"])
def test_pretrained_and_our_key_differing_is_refused_naming_both(ours):
    key, value = ours.split("=")
    with pytest.raises(SpecResearchError, match=f"pretrained=tiny and {key}={value} both name the target model"):
        SpecResearchLM(pretrained="tiny", **{key: value})


def test_an_unknown_model_arg_names_the_valid_ones():
    with pytest.raises(SpecResearchError, match=r"unknown key 'dtype': valid are .*pretrained.*model\.dtype=float32"):
        SpecResearchLM(pretrained="tiny", dtype="float32")
    with pytest.raises(SpecResearchError, match="unknown key 'drafter.kk': valid under drafter are k, k_max"):
        SpecResearchLM(pretrained="tiny", drafter="pld", **{"drafter.kk": 3})


# -- 2. the code-execution opt-in ---------------------------------------------------------------------

def test_the_plain_lm_eval_command_runs_our_model_on_our_task_from_any_folder(tmp_path, isolated):
    """The README's install, then lm-eval's own command as a user types it (`lm_eval` of this environment,
    nothing put on the path by the test): `pretrained=tiny` and its defaults, our task by name without
    --include_path, lm-eval's flag as the only opt-in (SPECRESEARCH_ALLOW_CODE_EXECUTION unset), run
    outside any checkout; lm-eval prints its table. CI runs it in the fresh venv of .ci/run."""
    out = tmp_path / "out"
    run = _lm_eval("run", "--model", "specresearch", "--model_args", "pretrained=tiny",
                   "--tasks", "stdlib_doctest", "--limit", "2", "--confirm_run_unsafe_code", "--log_samples",
                   "--output_path", str(out), cwd=tmp_path, env_drop=(ALLOW_ENV,))
    assert run.returncode == 0, run.stderr[-3000:]
    table = [line.split("|") for line in run.stdout.splitlines() if line.startswith("|stdlib_doctest")]
    assert [cell.strip() for cell in table[0][4:6]] == ["0", "pass@1"], run.stdout  # lm-eval's table: n-shot, metric
    (result,) = out.rglob("results_*.json")
    data = json.loads(result.read_text())
    assert data["results"]["stdlib_doctest"]["sample_len"] == 2 and "pass@1,none" in data["results"]["stdlib_doctest"]
    assert data["git_hash"] is None  # lm-eval still asked; there is no checkout here
    (samples,) = out.rglob("samples_stdlib_doctest_*.jsonl")
    samples = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [(s["pass@1"], s["timeout"]) for s in samples] == [(0.0, 0.0)] * 2  # scored: a random model's text fails the doctests


def test_the_flag_alone_opts_in(monkeypatch, isolated):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    results = _simple_evaluate(_Canonical(), "stdlib_doctest", confirm_run_unsafe_code=True)
    assert results["results"]["stdlib_doctest"]["pass@1,none"] == 1.0  # the solution's doctests ran, and passed


def test_without_the_flag_lm_eval_refuses_before_generating(isolated):
    lm = SpecResearchLM(pretrained="tiny", drafter="pld")
    with pytest.raises(ValueError, match="humaneval_offline which is marked as unsafe. Set confirm_run_unsafe_code=True"):
        _simple_evaluate(lm, "humaneval_offline")
    assert lm.outputs == []  # nothing was decoded, nothing executed


@pytest.mark.parametrize("value, message", [("0", f"{ALLOW_ENV}=0 forbids running model-written code"),
                                            ("yes", f"{ALLOW_ENV} must be 1 .allow., 0 .forbid. or unset, got 'yes'")])
def test_our_switch_still_forbids_even_with_the_flag(monkeypatch, value, message):
    """SPECRESEARCH_ALLOW_CODE_EXECUTION=0 wins over lm-eval's flag, and says so before any decoding."""
    monkeypatch.setenv(ALLOW_ENV, value)
    lm = SpecResearchLM(pretrained="tiny", drafter="pld")
    with pytest.raises(CodeExecutionNotAllowed, match=message):
        _simple_evaluate(lm, "stdlib_doctest", confirm_run_unsafe_code=True)
    assert lm.outputs == []


def test_groups_and_tags_are_followed_to_their_code_tasks(tmp_path):
    """What the early refusal of a code task without `--confirm_run_unsafe_code` (plugin.refuse_unsafe_early)
    counts as one: a task marked `unsafe_code: true`, found by name, through a group (its inline configs
    too) or a tag, or given as a config."""
    from lm_eval.tasks import TaskManager

    from specresearch.evaluation.plugin import unsafe_tasks

    task = "dataset_path: json\noutput_type: generate_until\ntag: mixed\n"
    (tmp_path / "safe.yaml").write_text("task: safe\n" + task)
    (tmp_path / "risky.yaml").write_text("task: risky\nunsafe_code: true\n" + task)
    (tmp_path / "suite.yaml").write_text("group: suite\ntask:\n  - safe\n  - task: stdlib_doctest\n    num_fewshot: 0\n  - mixed\n")
    index = TaskManager(include_path=tmp_path, include_defaults=False).task_index
    assert unsafe_tasks(index, ["safe"]) == []
    assert unsafe_tasks(index, ["mixed"]) == ["risky"]
    assert unsafe_tasks(index, ["suite"]) == ["stdlib_doctest", "risky"]
    assert unsafe_tasks(index, ["no_such_task", {"task": "inline", "unsafe_code": True}]) == ["inline"]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_every_code_task_is_marked_unsafe(task):
    """The sandbox takes lm-eval's --confirm_run_unsafe_code as the opt-in because lm-eval asks for it
    before scoring a task marked `unsafe_code: true`: each of our task files must be."""
    from lm_eval.tasks._yaml_loader import load_yaml

    assert load_yaml(TASKS_DIR / f"{task}.yaml", resolve_func=False)["unsafe_code"] is True


# -- 3. our tasks, registered ------------------------------------------------------------------------

def test_lm_eval_ls_tasks_lists_ours_from_any_folder(tmp_path):
    run = _lm_eval("ls", "tasks", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    cells = [line.split("|") for line in run.stdout.splitlines() if line.count("|") >= 3]  # | name | location |...
    rows = {row[1].strip(): row[2].strip() for row in cells}
    assert {task: rows.get(task) for task in TASKS} == {task: str(TASKS_DIR / f"{task}.yaml") for task in TASKS}
    assert "hellaswag" in rows  # lm-eval's own are all still there


def test_every_task_manager_knows_our_tasks_and_a_users_own_wins(tmp_path, caplog):
    from lm_eval.tasks import TaskManager

    assert set(TASKS) <= set(TaskManager(include_defaults=False).all_subtasks)
    with caplog.at_level(logging.WARNING):
        TaskManager(include_path=str(TASKS_DIR), include_defaults=False)  # the old way still works, silently
        assert "overrides" not in caplog.text
        (tmp_path / "mine.yaml").write_text("task: stdlib_doctest\ndataset_path: json\noutput_type: generate_until\n")
        mine = TaskManager(include_path=tmp_path, include_defaults=False)
        assert "Task 'stdlib_doctest'" in caplog.text and "overrides existing task" in caplog.text
    assert mine.task_index["stdlib_doctest"].yaml_path == tmp_path / "mine.yaml"


# -- 5. our refusals on lm-eval's command line: one line, exit 2 -----------------------------------

REFUSALS = {  # case -> (lm-eval arguments after `--model specresearch`, {env var: value}, the one line's start)
    "unknown option": (["--model_args", "pretrained=tiny,drafter=nope"], {},
                       f"error: model_args: unknown drafter 'nope': valid are {', '.join(options('drafter'))}"),
    "unknown setting": (["--model_args", "pretrained=tiny,drafter=pld,drafter.kk=3"], {},
                        "error: model_args: unknown key 'drafter.kk': valid under drafter are k, k_max"),
    "unknown model": (["--model_args", "pretrained=no-such-model,drafter=pld"], {"HF_HUB_OFFLINE": "1"},
                      "error: unknown model 'no-such-model': not an embedded model (choices: "),
    "out of range": (["--model_args", "pretrained=tiny,drafter=pld,sampling.top_p=0"], {},
                     "error: model_args: sampling.top_p must lie in (0, 1] (1 = off), got 0"),
    "batch size": (["--model_args", "pretrained=tiny,drafter=pld", "--batch_size", "auto"], {},
                   "error: model specresearch: batch_size must be an integer >= 1 (lm-eval's 'auto' is not offered"),
    "code execution forbidden": (["--model_args", "pretrained=tiny,drafter=pld"], {ALLOW_ENV: "0"},
                                 f"error: {ALLOW_ENV}=0 forbids running model-written code"),
}


def _lm_eval_args(args: list[str], out) -> list[str]:
    """`lm-eval run` of our model on one cheap problem of a code task, results to `out`."""
    return ["run", "--model", "specresearch", *args, "--tasks", "stdlib_doctest", "--limit", "1",
            "--confirm_run_unsafe_code", "--output_path", str(out)]


def _assert_one_error_line(code: int, stderr: str, start: str) -> None:
    assert code == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]]  # one error line, the last
    assert lines[-1].startswith(start), lines[-1]


@pytest.fixture
def lm_eval_here(monkeypatch):
    """lm-eval's command line run in this process: its task index holds only ours (lm-eval's own
    thousands take seconds to index and play no part here), and its log handler, which it sets up once
    per process on the stderr of that moment, is set up anew on this test's."""
    import lm_eval.utils
    from lm_eval.tasks import TaskManager

    init = TaskManager.__init__
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *args, include_defaults=True, **kwargs:
                        init(self, *args, include_defaults=False, **kwargs))
    logger = logging.getLogger("lm_eval")
    monkeypatch.setattr(lm_eval.utils, "_LOGGING_CONFIGURED", False)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", logger.propagate)


def _ended(caught, monkeypatch, capsys) -> tuple[int | None, str]:
    """What the process's `sys.excepthook` (plugin.one_line_refusals) makes of the exception `caught` that
    ended lm-eval's command line: the exit code it chose (None: it handed the exception on) and stderr."""
    from specresearch.evaluation import plugin

    def exit_now(code):
        raise SystemExit(code)

    plugin.one_line_refusals()
    monkeypatch.setattr(os, "_exit", exit_now)
    capsys.readouterr()
    try:
        sys.excepthook(caught.type, caught.value, caught.tb)
    except SystemExit as exit:
        return exit.code, capsys.readouterr().err
    return None, capsys.readouterr().err


def _cli(argv: list[str], monkeypatch):
    """lm-eval's command line (what `lm_eval` runs) in this process, with `argv`: the exception it ends with."""
    from lm_eval.__main__ import cli_evaluate

    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(Exception) as caught:
        cli_evaluate()
    return caught


@pytest.mark.parametrize("case", list(REFUSALS))
def test_our_refusals_on_lm_evals_command_line_are_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys, lm_eval_here):
    """In this process, lm-eval's command line ends with our SpecResearchError, which the process's
    excepthook prints as one line, exit 2; nothing is written."""
    args, env, start = REFUSALS[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    caught = _cli(["lm_eval", *_lm_eval_args(args, tmp_path / "out")], monkeypatch)
    assert isinstance(caught.value, SpecResearchError)
    _assert_one_error_line(*_ended(caught, monkeypatch, capsys), start)
    assert not (tmp_path / "out").exists()  # refused before anything was written


LM_EVALS_OWN = {  # lm-eval's own refusals of its arguments, with our model: (arguments after the model's, the line's start)
    "unknown task": (["--tasks", "nope_task"], "error: lm-eval: Tasks not found: nope_task"),
    "no docs": (["--tasks", "stdlib_doctest", "--limit", "0", "--confirm_run_unsafe_code"],
                "error: lm-eval: task.build_requests() did not find any docs!"),
}


@pytest.mark.parametrize("case", list(LM_EVALS_OWN))
def test_lm_evals_own_refusals_of_a_run_of_our_model_are_one_line_too(case, tmp_path, monkeypatch, capsys, lm_eval_here):
    args, start = LM_EVALS_OWN[case]
    argv = ["lm_eval", "run", "--model", "specresearch", "--model_args", "pretrained=tiny,drafter=pld", *args,
            "--output_path", str(tmp_path / "out")]
    caught = _cli(argv, monkeypatch)
    assert caught.type is ValueError  # lm-eval's own
    _assert_one_error_line(*_ended(caught, monkeypatch, capsys), start)


UNSAFE = ("error: task {} executes model-written code (unsafe_code: true): add --confirm_run_unsafe_code to the lm_eval "
          "command (from Python: simple_evaluate(..., confirm_run_unsafe_code=True))")  # the line, of task {}


@pytest.fixture
def no_model(monkeypatch):
    """Building our model fails the test: what is refused must be refused before it loads."""
    import specresearch.evaluation.lm

    monkeypatch.setattr(specresearch.evaluation.lm, "build_engine", lambda *args, **kwargs: pytest.fail("the model was built"))


def test_a_code_task_without_the_flag_is_refused_before_lm_evals_index_and_the_model(tmp_path, monkeypatch, capsys,
                                                                                     lm_eval_here, no_model):
    """Our code task without `--confirm_run_unsafe_code`: one line naming the flag (and the keyword of Python's
    simple_evaluate), exit 2, before lm-eval indexes its own tasks (only the small index of our and the user's
    task folders was built) and before our model is built; lm-eval alone refuses after both."""
    from lm_eval.tasks import TaskManager

    defaults = []  # include_defaults of each TaskManager built
    init = TaskManager.__init__
    monkeypatch.setattr(TaskManager, "__init__", lambda self, *args, include_defaults=True, **kwargs:
                        defaults.append(include_defaults) or init(self, *args, include_defaults=include_defaults, **kwargs))
    caught = _cli(["lm_eval", "run", "--model", "specresearch", "--model_args", "pretrained=tiny", "--tasks",
                   "humaneval_offline", "--output_path", str(tmp_path / "out")], monkeypatch)
    assert isinstance(caught.value, SpecResearchError)
    _assert_one_error_line(*_ended(caught, monkeypatch, capsys), UNSAFE.format("humaneval_offline"))
    assert defaults == [False]
    assert not (tmp_path / "out").exists()


def test_a_code_task_only_lm_eval_resolves_is_refused_before_the_model(tmp_path, monkeypatch, capsys, lm_eval_here,
                                                                       no_model):
    """A task no index holds (a YAML file given to --tasks) is checked once lm-eval has read it, still
    before the model."""
    (tmp_path / "mine.yaml").write_text("task: mine\ndataset_path: json\noutput_type: generate_until\nunsafe_code: true\n")
    caught = _cli(["lm_eval", "run", "--model", "specresearch", "--model_args", "pretrained=tiny", "--tasks",
                   str(tmp_path / "mine.yaml"), "--output_path", str(tmp_path / "out")], monkeypatch)
    assert isinstance(caught.value, SpecResearchError)
    _assert_one_error_line(*_ended(caught, monkeypatch, capsys), UNSAFE.format("mine"))
    assert not (tmp_path / "out").exists()


def test_the_installed_command_refuses_in_one_line_with_exit_2(tmp_path):
    """The same, as a user starts it: the `lm_eval` script, a process of its own (our refusals and lm-eval's),
    code tasks without the flag included: ours and lm-eval's own (`humaneval`, which it indexes)."""
    for args, start in [(REFUSALS["unknown option"][0] + ["--tasks", "stdlib_doctest", "--confirm_run_unsafe_code"],
                         REFUSALS["unknown option"][2]),
                        (["--model_args", "pretrained=tiny,drafter=pld", *LM_EVALS_OWN["unknown task"][0]],
                         LM_EVALS_OWN["unknown task"][1]),
                        (["--model_args", "pretrained=tiny", "--tasks", "humaneval_offline"], UNSAFE.format("humaneval_offline")),
                        (["--model_args", "pretrained=tiny", "--tasks", "humaneval"], UNSAFE.format("humaneval"))]:
        run = _lm_eval("run", "--model", "specresearch", *args, "--output_path", str(tmp_path / "out"), cwd=tmp_path)
        _assert_one_error_line(run.returncode, run.stderr, start)
        assert not (tmp_path / "out").exists()


def test_other_models_errors_stay_lm_evals(tmp_path, monkeypatch, capsys, lm_eval_here):
    """Only a SpecResearchError, or lm-eval's refusal in a run of our model, becomes one line: another
    model's failure is lm-eval's to report, with its traceback."""
    caught = _cli(["lm_eval", "run", "--model", "no_such_model", "--tasks", "stdlib_doctest"], monkeypatch)
    assert caught.type is ValueError and "no_such_model" in str(caught.value)
    code, err = _ended(caught, monkeypatch, capsys)
    assert code is None and "Traceback" in err


# -- 6. lm-eval's own route, without our .pth --------------------------------------------------------

def test_lm_evals_own_route_in_the_docs_runs_as_written_without_our_pth(tmp_path, isolated):
    """docs/quality.md's command for lm-eval's own route (our model registered by `@register_model` on
    import, our tasks by `--include_path`), as written, but in interpreters that read no .pth file
    (`python -S`, site-packages and the checkout on PYTHONPATH instead): our hook never runs."""
    text = (ROOT / "docs" / "quality.md").read_text(encoding="utf-8")
    (command,) = re.findall(r"```bash\n(HF_DATASETS_OFFLINE=1 python -c .*?)\n```", text, re.S)
    paths = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], str(ROOT)])
    run = subprocess.run(["bash", "-c", command.replace("python -c", f"{sys.executable} -S -c")], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    table = [line.split("|") for line in run.stdout.splitlines() if line.startswith("|stdlib_doctest")]
    assert [cell.strip() for cell in table[0][4:6]] == ["0", "pass@1"], run.stdout  # lm-eval's table: n-shot, metric
