"""specresearch.measure.runner: sizes a run cannot meet, refused in one line before the work starts: an
explicit stats.samples above the cap of stats.samples=auto, and a stats.length (the battery) or
stats.distortion that the target's positions cannot hold, before any model loads where the config says
them (the tiny model), else right after the target loads and before anything is measured."""

import math

import pytest

import specresearch.measure.runner as runner
from specresearch.data import load_prompts
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.measure import run
from specresearch.measure.equivalence import AUTO_MAX
from tests.helpers import make_cfg
from tests.tiny import TINY

SAMPLED = ("sampling=random", "verifier=rejection")  # the battery and exact distortion run at T > 0 only


def tiny_cfg(*overrides: str):
    return make_cfg(*TINY, "dataset.num_prompts=1", "max_new_tokens=4", "tracker=none", *overrides)


@pytest.mark.parametrize("overrides, message", [
    ([*SAMPLED, "stats.samples=1000000000"],
     "stats.samples=1000000000 draws 1,000,000,000 sequences per side (1 prompt(s)), above the 100,000 that stats.samples=auto "
     "draws at most: valid are stats.samples <= 100000 for stats.prompts=1, or stats.samples=auto"),
    ([*SAMPLED, "dataset.num_prompts=4", "stats.prompts=4", "stats.samples=25001"],
     "stats.samples=25001 draws 100,004 sequences per side (4 prompt(s)), above the 100,000 that stats.samples=auto draws at "
     "most: valid are stats.samples <= 25000 for stats.prompts=4, or stats.samples=auto"),
    ([*SAMPLED, "stats.samples=10", "stats.length=100000"],
     "prompt HumanEval/0 (348 tokens) and stats.length=100000 need 100348 positions, but the tiny model has 2048 "
     "(model.tiny.max_position_embeddings): valid are stats.length <= 1700 for these prompts"),
    ([*SAMPLED, "stats.distortion=100000"],
     "prompt HumanEval/0 (348 tokens) and stats.distortion=100000 need 100348 positions, but the tiny model has 2048 "
     "(model.tiny.max_position_embeddings): valid are stats.distortion <= 1700 for these prompts"),
])
def test_what_cannot_be_met_is_refused_before_a_model_loads(overrides, message, monkeypatch):
    """Before: an explicit N drew for days without a word; a battery length or a distortion length past the
    model's positions failed after the speed measurement (the distortion naming max_new_tokens)."""
    monkeypatch.setattr(runner, "build_engine", lambda *a, **k: pytest.fail("a model loaded"))
    with pytest.raises(SpecResearchError) as refused:
        run(tiny_cfg(*overrides))
    assert str(refused.value) == message


@pytest.mark.parametrize("overrides", [
    [*SAMPLED, f"stats.samples={AUTO_MAX}"],  # the cap itself
    [*SAMPLED, "stats.samples=10", "stats.length=1700"],  # 348 + 1700 = 2048 positions
    [*SAMPLED, "stats.distortion=1700"],
    ["stats.samples=1000000000", "stats.length=100000", "stats.distortion=100000"],  # greedy: neither runs
])
def test_what_can_be_met_passes(overrides):
    assert [p.id for p in runner.check_run(tiny_cfg(*overrides))] == ["HumanEval/0"]


@pytest.mark.parametrize("setting", ["stats.length", "stats.distortion"])
def test_a_model_known_only_once_loaded_is_checked_before_anything_is_measured(setting, monkeypatch):
    """A model the config does not size (check_run knows no positions for it, as for a real model) is
    checked right after it loads, against its config.max_position_embeddings, before any decoding."""
    monkeypatch.setattr(runner, "check_run", lambda cfg: load_prompts(**cfg.dataset))  # no sizes known before loading
    monkeypatch.setattr(Engine, "generate", lambda *a, **k: pytest.fail("decoding started"))
    with pytest.raises(SpecResearchError) as refused:
        run(tiny_cfg(*SAMPLED, "stats.samples=10", f"{setting}=100000"))
    assert str(refused.value) == (f"prompt HumanEval/0 (348 tokens) and {setting}=100000 need 100348 positions, but tiny has "
                                  f"2048 (its config.max_position_embeddings): valid are {setting} <= 1700 for these prompts")


def test_the_decode_bar_counts_the_tokens_that_come(capsys):
    """Rows that stop early (here: at any of a few common characters) never bring max_new_tokens: the decode bar's
    total shrinks to what comes, so it ends at n = total (it used to jump to the end of each prompt's share)."""
    from tests.helpers import BAR

    stops = "[" + ",".join(f"'{c}'" for c in "etaoinsr ") + "]"
    run(tiny_cfg("dataset.num_prompts=2", "max_new_tokens=40", f"dataset.stop={stops}"))
    lines = [m for m in (BAR.fullmatch(line.strip()) for line in capsys.readouterr().err.replace("\r", "\n").split("\n"))
             if m and "(baseline and method)" in m["desc"]]
    done, total = map(int, lines[-1].group(0).split("| ")[1].split(" ")[0].split("/"))
    assert done == total < 2 * 2 * 40  # both sides of both prompts stopped early, and the bar says what came


def test_a_speedup_above_tau_is_flagged():
    """τ tokens per target forward bound the speedup (each forward costs about a plain step or more): 2.43x at
    τ = 1.03, seen under outside load, is flagged; speedups up to τ (and a little above: v(2) < 1) are not."""
    warning = runner.suspect_speedup({"speedup": 2.43, "method_tau": 1.03})
    assert warning.startswith("warning: the speedup 2.43x is above τ = 1.03") and "quiet machine" in warning
    assert runner.suspect_speedup({"speedup": 1.9, "method_tau": 3.2}) is None
    assert runner.suspect_speedup({"speedup": 1.1, "method_tau": 1.0}) is None  # within SUSPECT
    assert runner.suspect_speedup({"speedup": 2.0, "method_tau": math.nan}) is None  # nothing to hold it to


@pytest.mark.parametrize("kind", ["AMX", "AVX-512 BF16", "AVX2", "AVX512"])  # AVX512: torch's name for one without bf16
def test_a_run_of_the_default_target_says_what_its_cpu_kind_measured(kind, monkeypatch):
    """The README's headlines marked "expect" (specresearch/assets/held_out.json) for this CPU kind, each with its
    report; another kind's numbers never; a kind without any says so and names the kinds measured; nothing on a GPU
    or for a model the headline has not measured."""
    import json
    from importlib import resources

    import torch

    shipped = json.loads(resources.files("specresearch.assets").joinpath("held_out.json").read_text("utf-8"))["headlines"]
    monkeypatch.setattr(runner, "cpu_kind", lambda: kind)
    said = runner.what_to_expect("qwen2.5-coder-1.5b", torch.device("cpu"), torch.bfloat16)
    mine = [h for h in shipped if h["kind"] == kind]
    for h in shipped:  # each of this kind's numbers with its report; no other kind's report
        assert (f"{h['speedup']:.2f}x [{h['interval'][0]:.2f}-{h['interval'][1]:.2f}]" in said
                and f"docs/results/data/{h['report']}.json" in said) == (h in mine), (h, said)
    if not mine:  # none measured there (AVX2 until benchmarks/new_kind.py runs on one): said, naming where they were
        assert kind in ("AVX2", "AVX512") and said.startswith(
            f"what to expect here: qwen2.5-coder-1.5b has no held-out speed measurement on a CPU of this kind ({kind}) yet, "
            f"only on {', '.join(sorted({h['kind'] for h in shipped}))} (the README's headline); python benchmarks/speed.py "
            "measures every method on this machine")
    else:
        assert mine and said.startswith(f"what to expect here: held out on a CPU with {kind} (the README's headline), over")
        other = torch.float32 if runner.CPU_KINDS[kind] == "bfloat16" else torch.bfloat16  # a dtype not the kind's auto
        assert (f"they ran {runner.CPU_KINDS[kind]}, this run {str(other).removeprefix('torch.')}"
                in runner.what_to_expect("qwen2.5-coder-1.5b", torch.device("cpu"), other))
    assert runner.what_to_expect("tiny", torch.device("cpu"), torch.float32) is None
    assert runner.what_to_expect("qwen2.5-coder-1.5b", torch.device("cuda"), torch.bfloat16) is None
