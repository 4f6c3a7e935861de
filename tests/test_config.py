"""Every YAML of every config group composes and instantiates: a renamed class or a typo in a
config cannot break a run silently."""

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from specresearch.build import build
from specresearch.config import options, unknown_option
from specresearch.data import load_prompts
from specresearch.drafters import Drafter
from specresearch.models import ZOO, load_model
from specresearch.options.groups import schema_of
from specresearch.tracking import MLflowTracker, NullTracker
from specresearch.types import SamplingParams
from specresearch.verifiers import Verifier
from tests.helpers import make_cfg
from tests.tiny import TINY, drafter_cfg


def test_groups_have_their_options():
    assert {"none", "independent"} <= set(options("drafter"))
    assert {"greedy", "rejection", "typical", "margin", "topk"} <= set(options("verifier"))
    assert {"humaneval", "mtbench"} <= set(options("dataset"))
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "tiny"} <= set(options("model"))
    assert {"lossless_vs_lossy", "specbench"} <= set(options("experiment"))  # the folders of experiments/


@pytest.mark.parametrize("name", options("experiment"))
def test_experiment_presets_compose(name):
    cfg = make_cfg(f"experiment={name}")
    assert cfg.stats.samples >= 0 and cfg.model.name


@pytest.mark.parametrize("args, config_name, error", [
    (["drafter=tree", "drafter.lookup=4"], "config", "drafter=tree has no setting 'drafter.lookup': valid are drafter.branching,"),
    (["drafter.lookup=4"], "config", None),  # the default drafter (independent) has it
    (["-m", "drafter=independent,tree", "drafter.lookup=4"], "config", "drafter=tree has no setting 'drafter.lookup'"),
    (["drafter=tree", "drafter.model.vocabb=8"], "config", "drafter=tree has no setting 'drafter.model.vocabb': valid are drafter.model.cache, drafter.model.cache_dir,"),
    (["max_new_token=8"], "config", "python -m specresearch has no setting 'max_new_token': valid are batch_size, compiled_reference, dataset, drafter,"),
    (["dataset=mtbench", "dataset.per_category=1", "stats.samples=8"], "config", None),
    (["dataset.per_category=1"], "config", "dataset=humaneval has no setting 'dataset.per_category'"),
    (["eval.limit=2"], "config", "eval.limit sets a setting of eval, which is off: choose one, eval=NAME (humaneval, stdlib_doctest)"),
    (["eval=stdlib_doctest", "eval.limit=2", "+drafter.extra=1", "hydra.run.dir=x"], "config", None),  # limit from its base option
    (["experiment=leviathan", "drafter.k=3"], "config", None),  # a study's preset: Hydra checks
    (["-sc", "query=bash"], "config", None),  # a flag's value (tab completion), not a setting
    (["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], "config", None),  # Hydra's own groups and settings
    (["train.tokenz=8"], "train", "python -m specresearch.train has no setting 'train.tokenz': valid are train.batch,"),
    (["drafter=eagle", "train.vocab=8", "drafter.vocab=8"], "train", None),
])
def test_a_setting_the_config_lacks_is_named_with_the_valid_ones(args, config_name, error):
    """Checked before Hydra composes (whose message is Hydra's struct error over five lines); what is
    refused here Hydra would refuse too, what passes composes."""
    problem = unknown_option(args, config_name)
    assert problem == error if error is None else problem.startswith(error), problem
    if error is None and config_name == "config" and not any(a.startswith(("-", "hydra.")) for a in args):
        make_cfg(*args)  # composes: the check refused nothing Hydra takes


@pytest.mark.parametrize("name", options("drafter"))
def test_drafter_configs_instantiate(name, tmp_path):
    cfg = drafter_cfg(name, tmp_path)
    drafter = build(cfg.drafter, target=load_model(**cfg.model))
    assert isinstance(drafter, Drafter) and drafter.name == schema_of("drafter", name).option  # a preset's: its option's


@pytest.mark.parametrize("name", options("verifier"))
def test_verifier_configs_instantiate(name):
    verifier = instantiate(make_cfg(*TINY, f"verifier={name}").verifier)
    assert isinstance(verifier, Verifier) and verifier.name == name
    assert verifier.lossless == (name in {"greedy", "rejection"})  # typical, margin, topk trade faithfulness for speed


@pytest.mark.parametrize("name", options("dataset"))
def test_dataset_configs_load(name):
    cfg = make_cfg(*TINY, f"dataset={name}").dataset
    prompts = load_prompts(**cfg)
    assert len(prompts) == cfg.num_prompts and all(p.text for p in prompts)
    assert len({p.text for p in prompts}) == len(prompts)


@pytest.mark.parametrize("name", options("sampling"))
def test_sampling_configs_build(name):
    params = SamplingParams(**make_cfg(*TINY, f"sampling={name}").sampling)
    assert params.temperature >= 0


@pytest.mark.parametrize("name", options("tracker"))
def test_tracker_configs_instantiate(name, tmp_path):
    cfg = make_cfg(*TINY, f"tracker={name}")
    tracker = instantiate(cfg.tracker)
    assert isinstance(tracker, {"mlflow": MLflowTracker, "none": NullTracker}[name])


@pytest.mark.parametrize("name", options("model"))
def test_model_configs_name_a_loadable_model(name):
    """Real models are too big to load in every test run: check they name an installed zoo entry
    (the zoo's own loading is tested in tests/models/test_loading.py); the tiny one is loaded."""
    cfg = make_cfg(f"model={name}")
    if cfg.model.name == "tiny":
        assert load_model(**cfg.model).model.config.vocab_size == cfg.model.tiny.vocab_size
    else:
        assert cfg.model.name in ZOO
    assert set(OmegaConf.to_container(cfg.model)) >= {"name", "dtype", "device"}


@pytest.mark.parametrize("name", options("eval"))
def test_eval_configs_name_a_known_task(name):
    from specresearch.evaluation.runner import TASKS, TASKS_DIR, check_eval

    cfg = make_cfg(*TINY, f"eval={name}", "eval.allow_code_execution=true")
    assert cfg.eval.task in TASKS and (TASKS_DIR / f"{cfg.eval.task}.yaml").is_file()
    check_eval(cfg.eval)  # valid as shipped, once the user opts in


def test_conf_is_found_beside_the_package_or_inside_it_and_a_leftover_folder_is_not_taken(tmp_path, monkeypatch):
    """A checkout holds conf/ beside the package, a wheel inside it; a checkout's old
    specresearch/conf/ that git left behind (only __pycache__) must not hide the real one."""
    from specresearch.options import conf

    (tmp_path / "specresearch" / "conf" / "__pycache__").mkdir(parents=True)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("defaults: []\n")
    monkeypatch.setattr(conf, "__file__", str(tmp_path / "specresearch" / "options" / "conf.py"))
    assert conf.project_folder("conf", "config.yaml") == tmp_path / "conf"  # a checkout, with a leftover
    (tmp_path / "specresearch" / "conf" / "config.yaml").write_text("defaults: []\n")
    assert conf.project_folder("conf", "config.yaml") == tmp_path / "specresearch" / "conf"  # a wheel


@pytest.mark.parametrize("overrides, error", [
    (["model=tiny", "drafter=pld", "drafter.k=abc"], "drafter.k must be an integer, got 'abc'"),
    (["model=tiny", "drafter=pld", "+drafter.kk=1"], "drafter=pld has no setting 'kk': valid are k, k_policy, k_max, max_ngram,"),
    ("drafter=pld", "compose() takes a list of overrides, e.g. ['drafter=pld'], or a mapping"),
    (["drafter=pld", 4], "compose() takes a list of overrides"),
])
def test_compose_refuses_a_bad_setting_or_overrides_that_are_no_list(overrides, error):
    """The Python API's door: the settings check the command line runs, and a string (not a list of
    overrides) refused in one line instead of being split into characters."""
    from specresearch import compose
    from specresearch.errors import SpecResearchError

    with pytest.raises(SpecResearchError) as err:
        compose(overrides)
    assert str(err.value).startswith(error) and "\n" not in str(err.value), err.value


def _assigned(path: str, value):
    def change(cfg):
        OmegaConf.set_struct(cfg, False)  # a user's own assignment, past the struct flag
        OmegaConf.update(cfg, path, value)
        return cfg
    return change


@pytest.mark.parametrize("make, error", [
    (_assigned("drafter.k", "abc"), "drafter.k must be an integer, got 'abc'"),
    (_assigned("drafter.kk", 1), "drafter=pld has no setting 'kk'"),
    (_assigned("sampling.temperature", -1.0), "sampling.temperature must be a finite number >= 0"),
    (_assigned("max_new_tokens", 0), "max_new_tokens must be >= 1, got 0"),
    (lambda cfg: OmegaConf.create({**OmegaConf.to_container(cfg), "drafter": {**cfg.drafter, "k": True}}), "drafter.k must be an integer, got True"),
    (lambda cfg: OmegaConf.create({"model": OmegaConf.to_container(cfg.model)}),
     "build_engine() needs a config with model, drafter, verifier, sampling (as compose([...]) makes it); this one has no drafter, verifier, sampling"),
])
def test_build_engine_checks_a_config_made_another_way_before_any_model_loads(make, error, monkeypatch):
    """A config changed by assignment or made with OmegaConf.create meets the same settings check as
    the command line's, in one line, and no model is loaded for it."""
    from specresearch import build_engine, compose, models
    from specresearch.errors import SpecResearchError

    loaded = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: loaded.append(a) or pytest.fail("a model was loaded"))
    cfg = make(compose(["model=tiny", "drafter=pld"]))
    with pytest.raises(SpecResearchError) as err:
        build_engine(cfg)
    assert str(err.value).startswith(error) and "\n" not in str(err.value), err.value
    assert loaded == []
