"""specresearch.settings.check_config: an unknown setting or a value of the wrong type is refused up
front with one line naming the valid settings or the expected type; every shipped option passes; and
SamplingParams refuses values outside their range."""

import math

import pytest
from hydra import compose, initialize_config_dir

from specresearch.config import CONF_DIR
from specresearch.errors import SpecResearchError
from specresearch.options.runs import SANDBOX_MIN_MEMORY_MB
from specresearch.settings import check_config
from specresearch.types import SamplingParams
from tests.helpers import make_cfg
from tests.tiny import TINY

GROUPS = ("drafter", "verifier", "sampling", "dataset", "tracker", "model", "eval", "experiment")


def refused(*overrides: str) -> str:
    """The one-line message check_config gives the composed config."""
    with pytest.raises(SpecResearchError) as err:
        check_config(make_cfg(*TINY, *overrides))
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("group,name", [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))])
def test_every_shipped_option_passes(group, name):
    check_config(make_cfg(f"{group}={name}"))
    check_config(make_cfg("model=tiny", f"{group}={name}"))


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_train_config_passes(drafter):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"drafter={drafter}"])
    check_config(cfg)
    cfg.train.heads = "x"
    with pytest.raises(SpecResearchError, match="train.heads must be an integer, got 'x'"):
        check_config(cfg)


@pytest.mark.parametrize("overrides", [
    ["dataset.num_prompts=null"],  # documented: null = all
    ["resume=false"], ["resume=true"],  # documented: true/false force it
    ["verifier=typical", "verifier.epsilon=1"],  # an int where a float is wanted (drafter.confidence=1 is out of range)
    ["sampling=random", "sampling.temperature=1", "sampling.top_k=5", "sampling.top_p=0.9"],
    ["drafter=tree", "drafter.branching=null", "drafter.ensemble=[{name: tiny}]"],
    ["+model.tiny.noise=0.1"],  # model.tiny is a free mapping (tiny_model's arguments)
])
def test_valid_values_pass(overrides):
    check_config(make_cfg(*TINY, *overrides))


def test_bad_type():
    assert refused("drafter.k=abc") == "drafter.k must be an integer, got 'abc'"


def test_unknown_key_names_the_valid_ones():
    message = refused("+drafter.kk=3")
    assert message.startswith("drafter=independent has no setting 'kk': valid are k, ")
    assert "confidence" in message and "k_policy" in message and "target" not in message


def test_unknown_key_elsewhere():
    assert "takes none" in refused("verifier=greedy", "+verifier.margin=0.1")
    assert refused("+stats.sample=3").startswith("stats has no setting 'sample': valid are samples, ")
    assert refused("+sampling.topk=3") == "sampling has no setting 'topk': valid are temperature, top_k, top_p"
    assert refused("+seeds=3").startswith("unknown setting 'seeds': valid are ")
    assert "no setting 'foo'" in refused("+model.foo=1")


def test_subclass_settings_follow_its_parent():
    """drafter=self_draft passes **options to IndependentDrafter: those are settings, but not `model`,
    which it passes itself."""
    check_config(make_cfg("model=tiny", "drafter=self_draft", "+drafter.confidence=0.4"))
    with pytest.raises(SpecResearchError, match="valid are k, k_policy, k_max, chain_confidence, confidence, siblings, sibling_confidence, lookup, shape, vocab, vocab_corpus, skip") as err:
        check_config(make_cfg("model=tiny", "drafter=self_draft", "+drafter.model={name: tiny}"))
    assert ", model," not in str(err.value)


def test_bool_and_int_do_not_pass_for_each_other():
    assert refused("drafter.k=true") == "drafter.k must be an integer, got True"
    assert refused("warmup=1") == "warmup must be true or false, got 1"
    assert refused("max_new_tokens=1.5") == "max_new_tokens must be an integer, got 1.5"


def test_nested_values():
    assert refused("drafter.model.name=3") == "drafter.model.name must be a string, got 3"
    assert refused("drafter=tree", "drafter.ensemble=[{name: tiny, vocabulary: 3}]").startswith(
        "drafter.ensemble[0] has no setting 'vocabulary': valid are name, dtype, device")
    assert refused("drafter=tree", "drafter.ensemble=[{name: tiny, vocabulary: 3}]").endswith("vocab, vocab_corpus, quantize")
    assert refused("drafter.model.vocab=many") == "drafter.model.vocab must be an integer or null, got 'many'"
    assert refused("+model.quantize=int8").startswith("model has no setting 'quantize'")  # the target's node: no draft options
    assert refused("drafter=tree", "drafter.branching=[2,a]") == "drafter.branching must be a list of integers or null, got [2, 'a']"
    assert refused("eval=humaneval", "eval.sandbox.timeout=long") == "eval.sandbox.timeout must be a number, got 'long'"
    assert refused("dataset.stop=[1]") == "dataset.stop must be a list of strings, got [1]"


def test_verifier_and_top_level_types():
    assert refused("verifier=margin", "verifier.margin=abc") == "verifier.margin must be a number or null, got 'abc'"
    assert refused("seed=abc") == "seed must be an integer, got 'abc'"
    assert refused("stats.samples=many") == "stats.samples must be an integer >= 0 (0: off) or auto, got 'many'"
    assert refused("stats.tv=1.5") == "stats.alpha, stats.power and stats.tv must lie in (0, 1), got 0.01, 0.8, 1.5"
    assert refused("stats.aa_repeats=-1") == "stats.aa_repeats must be >= 0, got -1"
    assert refused("stats.samples=5").startswith("stats needs samples >= 10 (or 0: off, or auto)")
    assert refused("stats.time_split=maybe") == "stats.time_split must be true, false or auto, got 'maybe'"
    assert refused("stats.batch=many") == "stats.batch must be an integer >= 1 or auto, got 'many'"
    assert refused("stats.batch=0") == "stats.batch must be an integer >= 1 or auto, got 0"
    assert refused("compiled_reference=maybe") == "compiled_reference must be auto, true or false, got 'maybe'"
    assert refused("compiled_reference=true", "batch_size=2").startswith("compiled_reference=true times compiled decoding of one sequence")
    check_config(make_cfg(*TINY, "stats.samples=auto"))


@pytest.mark.parametrize("stop", ['[""]', '["END", ""]'])
def test_an_empty_stop_string_is_refused(stop):
    """An empty string is in every text: each completion stopped after one token, and the run still reported a
    speedup (and a time split past 100%)."""
    assert refused(f"dataset.stop={stop}") == ("dataset.stop holds an empty string, which ends every completion after one "
                                               "token: valid are non-empty strings, or dataset.stop=[] for none")
    check_config(make_cfg(*TINY, "dataset.stop=[]"))


@pytest.mark.parametrize("override,needle", [
    ("sampling.temperature=-1", "sampling.temperature must be a finite number >= 0 (0 = greedy), got -1"),
    ("sampling.top_p=1.5", "sampling.top_p must lie in (0, 1] (1 = off), got 1.5"),
    ("sampling.top_p=0", "sampling.top_p must lie in (0, 1] (1 = off), got 0"),
    ("sampling.top_k=-1", "sampling.top_k must be an integer >= 0 (0 = off), got -1"),
])
def test_sampling_ranges(override, needle):
    assert refused("verifier=rejection", "sampling=random", override) == needle


SANDBOX_MEMORY = (f"eval.sandbox.memory_mb must be >= {SANDBOX_MIN_MEMORY_MB} (the address space of a Python process "
                  "running a test program, interpreter included; below it every program fails), got ")


@pytest.mark.parametrize("option", ["humaneval", "stdlib_doctest"])
@pytest.mark.parametrize("override,message", [
    ("eval.sandbox.timeout=-1", "eval.sandbox.timeout must be a finite number of seconds > 0, got -1"),
    ("eval.sandbox.timeout=0", "eval.sandbox.timeout must be a finite number of seconds > 0, got 0"),
    ("eval.sandbox.timeout=inf", "eval.sandbox.timeout must be a finite number of seconds > 0, got inf"),
    ("eval.sandbox.memory_mb=1", SANDBOX_MEMORY + "1"),
    (f"eval.sandbox.memory_mb={SANDBOX_MIN_MEMORY_MB - 1}", SANDBOX_MEMORY + str(SANDBOX_MIN_MEMORY_MB - 1)),
])
def test_sandbox_ranges(option, override, message):
    """The nested eval.sandbox node's ranges are checked (before a run opens: every completion would fail)."""
    assert refused(f"eval={option}", override) == message


def test_sandbox_edges_pass():
    check_config(make_cfg(*TINY, "eval=humaneval", "eval.sandbox.timeout=0.5", f"eval.sandbox.memory_mb={SANDBOX_MIN_MEMORY_MB}"))


@pytest.mark.parametrize("kwargs", [
    {"temperature": -1.0}, {"temperature": math.inf}, {"temperature": math.nan}, {"top_p": 1.5}, {"top_p": 0.0},
    {"top_p": math.nan}, {"top_k": -1}, {"top_k": 2.5}, {"top_k": True},
])
def test_sampling_params_refuse_out_of_range(kwargs):
    with pytest.raises(SpecResearchError, match="must"):
        SamplingParams(**{"temperature": 1.0, **kwargs})


def test_sampling_params_accept_the_edges():
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.7, top_k=1, top_p=1.0).top_p == 1.0
    assert SamplingParams(temperature=2, top_p=1e-6).temperature == 2


CHAIN_K = "needs k >= 1, got k=0 (use drafter=none for plain decoding)"


@pytest.mark.parametrize("overrides,message", [
    # the chain drafters (independent, self_draft) and engine.DraftLength's k_policy, k_max
    (["drafter.k=0"], f"drafter=independent {CHAIN_K}"),
    (["drafter=self_draft", "drafter.k=0"], f"drafter=self_draft {CHAIN_K}"),
    (["drafter.lookup=-1"], "drafter.lookup must be >= 0 (0 = off), got -1"),
    (["drafter=self_draft", "drafter.siblings=-1"], "drafter.siblings must be >= 0 (0 = a plain chain), got -1"),
    (["drafter.sibling_confidence=1"], "drafter.sibling_confidence must lie in [0, 1) (0 = keep every sibling), got 1"),
    (["drafter.confidence=1.5"], "drafter.confidence must lie in (0, 1) or be null, got 1.5"),
    (["drafter.chain_confidence=0"], "drafter.chain_confidence must lie in (0, 1) or be null, got 0"),
    (["drafter.shape=tall"], "unknown drafter.shape 'tall': valid are null (the stops as given), auto"),
    (["drafter=self_draft", "drafter.shape=tall"], "unknown drafter.shape 'tall': valid are null (the stops as given), auto"),
    (["drafter=cross_vocab", "drafter.shape=auto"],
     "drafter.shape=auto sizes a chain of target tokens, which needs drafter.mode=shared (mode=string drafts text), or set "
     "drafter.shape=null"),
    (["drafter.k_policy=grow"], "unknown drafter.k_policy 'grow': valid are fixed, heuristic"),
    (["drafter.k=4", "drafter.k_max=2"], "drafter.k_max must be >= drafter.k, got 2 < 4"),
    # pld, lookahead
    (["drafter=pld", "drafter.k=0"], f"drafter=pld {CHAIN_K}"),
    (["drafter=pld", "drafter.min_ngram=3", "drafter.max_ngram=2"], "drafter=pld needs 1 <= min_ngram <= max_ngram, got 3, 2"),
    (["drafter=pld", "drafter.min_ngram=0"], "drafter=pld needs 1 <= min_ngram <= max_ngram, got 0, 3"),
    (["drafter=pld", "drafter.match=random"], "unknown drafter.match 'random': valid are first, last"),
    (["drafter=pld", "drafter.k_policy=heuristic", "drafter.k_max=5"], "drafter.k_max must be >= drafter.k, got 5 < 10"),
    (["drafter=lookahead", "drafter.guesses=0"], "drafter=lookahead needs window >= 1 and guesses >= 1, got 7, 0"),
    (["drafter=lookahead", "drafter.ngram=2"], "drafter=lookahead needs ngram >= 3 (N − 1 >= 2 Jacobi levels), got ngram=2"),
    # tree
    (["drafter=tree", "drafter.children=beam"], "unknown drafter.children 'beam': valid are top, sample"),
    (["drafter=tree", "drafter.branching=[2,0]"], "drafter.branching needs one or more counts >= 1 (or null: dynamic), got [2, 0]"),
    (["drafter=tree", "drafter.branching=[]"], "drafter.branching needs one or more counts >= 1 (or null: dynamic), got []"),
    (["drafter=tree", "drafter.branching=null", "drafter.nodes=0"], "a dynamic tree needs topk, depth and nodes >= 1, got 4, 5, 0"),
    (["drafter=tree", "drafter.chain_confidence=1"], "drafter.chain_confidence must lie in (0, 1) or be null, got 1"),
    (["drafter=tree", "drafter.shape=best"], "unknown drafter.shape 'best': valid are null (nodes as given), auto"),
    (["drafter=tree", "drafter.shape=auto"], "drafter.shape=auto sizes a dynamic tree: set drafter.branching=null"),
    (["drafter=tree", "drafter.branching=null", "drafter.children=sample", "drafter.shape=auto"],
     "drafter.shape=auto keeps the likeliest nodes, which sampled children cannot be chosen by (their law would change): "
     "use drafter.children=top"),
    # medusa
    (["drafter=medusa", "drafter.children=beam"], "unknown drafter.children 'beam': valid are top, sample"),
    (["drafter=medusa", "drafter.nodes=0"], "drafter.nodes must be >= 1, got 0"),
    (["drafter=medusa", "drafter.shape=optimal"], "unknown drafter.shape 'optimal': valid are null (nodes as given), auto"),
    (["drafter=medusa", "drafter.choices=[[0],[-1]]"], "drafter.choices must be non-empty paths of ranks >= 0, got [[0], [-1]]"),
    (["drafter=medusa", "drafter.choices=[[0],[]]"], "drafter.choices must be non-empty paths of ranks >= 0, got [[0], []]"),
    (["drafter=medusa", "drafter.choices=[[0],[1,0]]"], "drafter.choices must hold every path's parent; missing [[1]]"),
    # eagle
    (["drafter=eagle", "drafter.k=0"], "drafter.k must be >= 1, got 0"),
    (["drafter=eagle", "drafter.k_policy=grow"], "unknown drafter.k_policy 'grow': valid are fixed, heuristic"),
    (["drafter=eagle", "drafter.shape=auto"], "drafter.shape=auto sizes EAGLE-2's tree: set drafter.tree=true"),
    (["drafter=eagle", "drafter.tree=true", "drafter.topk=0"], "a dynamic tree needs topk, depth and nodes >= 1, got 0, 6, 24"),
    (["drafter=eagle", "drafter.tree=true", "drafter.children=beam"], "unknown drafter.children 'beam': valid are top, sample"),
    (["drafter=eagle", "drafter.tree=true", "drafter.children=sample", "drafter.shape=auto"],
     "drafter.shape=auto keeps the likeliest nodes, which sampled children cannot be chosen by (their law would change): "
     "use drafter.children=top"),
    # the relaxed verifiers
    (["verifier=margin", "verifier.recover=maybe"], "unknown verifier.recover 'maybe': valid are sample, greedy"),
    (["verifier=topk", "verifier.rule_temperature=0"], "verifier.rule_temperature must be > 0 (or null: the decoding's), got 0"),
    (["verifier=margin", "verifier.margin=null"],
     "verifier=margin takes exactly one of margin (absolute) and ratio (relative); set the other to null"),
    (["verifier=margin", "verifier.ratio=0.5"],
     "verifier=margin takes exactly one of margin (absolute) and ratio (relative); set the other to null"),
    (["verifier=margin", "verifier.margin=1.5"], "verifier.margin must lie in [0, 1], got 1.5"),
    (["verifier=margin", "verifier.margin=null", "verifier.ratio=0"], "verifier.ratio must lie in (0, 1], got 0"),
    (["verifier=topk", "verifier.k=0"], "verifier=topk needs k >= 1, got 0"),
    (["verifier=typical", "verifier.epsilon=0"], "verifier=typical needs 0 < epsilon <= 1 and 0 < delta <= 1, got 0, 0.3"),
    (["verifier=typical", "verifier.delta=1.5"], "verifier=typical needs 0 < epsilon <= 1 and 0 < delta <= 1, got 0.09, 1.5"),
])
def test_drafter_and_verifier_ranges_are_refused_by_the_schema(overrides, message):
    """Each model-independent rule of a drafter's or verifier's constructor is its settings
    dataclass's check: the composed config is refused in one line before any model loads."""
    with pytest.raises(SpecResearchError) as err:
        check_config(make_cfg("model=tiny", *overrides))
    assert str(err.value) == message and "\n" not in message


@pytest.mark.parametrize("overrides", [
    ["drafter=pld", "drafter.min_ngram=3", "drafter.max_ngram=3", "drafter.k_policy=heuristic", "drafter.k_max=10"],
    ["drafter=tree", "drafter.branching=null", "drafter.shape=auto", "drafter.chain_confidence=0.2"],
    ["drafter=medusa", "drafter.choices=[[0],[1],[0,0]]"], ["drafter=medusa", "drafter.shape=null"],  # choices given: the tree (shape=auto's default)
    ["drafter=eagle", "drafter.tree=true", "drafter.shape=auto", "drafter.k_policy=grow"],  # the tree leaves k_policy unused
    ["drafter.sibling_confidence=0", "drafter.confidence=0.4", "drafter.k=1", "drafter.k_max=1"],
    ["verifier=margin", "verifier.margin=null", "verifier.ratio=1"], ["verifier=margin", "verifier.margin=0"],
    ["verifier=typical", "verifier.epsilon=1", "verifier.delta=1", "verifier.rule_temperature=0.5"],
])
def test_drafter_and_verifier_range_edges_pass(overrides):
    check_config(make_cfg("model=tiny", *overrides))


@pytest.fixture
def no_model_loads(monkeypatch):
    def load_model(*args, **kwargs):
        pytest.fail("a model was loaded for a config the settings schema refuses")
    monkeypatch.setattr("specresearch.models.load_model", load_model)


@pytest.mark.parametrize("model", ["model=qwen2.5-coder-1.5b", "model.name=nobody/no-such-model"])
def test_compose_and_build_engine_refuse_a_bad_range_before_the_model_loads(no_model_loads, model, tmp_path, monkeypatch):
    """A range a drafter's constructor would refuse after the target loaded is refused first, for a
    target that is not even on this machine (an empty model cache: it would be downloaded)."""
    from specresearch import build_engine, compose

    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path))
    overrides = [model, "drafter=pld", "drafter.k=0", "tracker=none"]
    with pytest.raises(SpecResearchError, match="^drafter=pld needs k >= 1, got k=0 "):
        compose(overrides)
    with pytest.raises(SpecResearchError, match="^drafter=pld needs k >= 1, got k=0 "):
        build_engine(make_cfg(*overrides))  # composed without the check: build_engine checks it
    assert not any(tmp_path.iterdir())
