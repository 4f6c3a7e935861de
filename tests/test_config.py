"""Every YAML of every config group composes and instantiates: a renamed class or a typo in a
config cannot break a run silently."""

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from specresearch.data import load_prompts
from specresearch.drafters import Drafter
from specresearch.app import build
from specresearch.models import ZOO, load_model
from specresearch.tracking import MLflowTracker, NullTracker
from specresearch.types import SamplingParams
from specresearch.verifiers import Verifier

from specresearch.conf import options

from .conftest import CONF_DIR, TINY, drafter_cfg, make_cfg


def test_groups_have_their_options():
    assert {"none", "independent"} <= set(options("drafter"))
    assert {"greedy", "rejection", "typical", "margin", "topk"} <= set(options("verifier"))
    assert {"humaneval", "mtbench"} <= set(options("dataset"))
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m", "tiny"} <= set(options("model"))
    assert {"lossless_vs_lossy", "specbench"} <= set(options("experiment"))  # the folders of specresearch/studies


@pytest.mark.parametrize("name", options("experiment"))
def test_experiment_presets_compose(name):
    cfg = make_cfg(f"experiment={name}")
    assert cfg.stats.samples >= 0 and cfg.model.name


@pytest.mark.parametrize("name", options("drafter"))
def test_drafter_configs_instantiate(name, tmp_path):
    cfg = drafter_cfg(name, tmp_path)
    drafter = build(cfg.drafter, target=load_model(**cfg.model))
    assert isinstance(drafter, Drafter) and drafter.name == name


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
    (the zoo's own loading is tested in test_models.py); the tiny one is loaded."""
    cfg = make_cfg(f"model={name}")
    if cfg.model.name == "tiny":
        assert load_model(**cfg.model).model.config.vocab_size == cfg.model.tiny.vocab_size
    else:
        assert cfg.model.name in ZOO
    assert set(OmegaConf.to_container(cfg.model)) >= {"name", "dtype", "device"}


@pytest.mark.parametrize("name", options("eval"))
def test_eval_configs_name_a_known_task(name):
    from specresearch.evaluation.runner import TASKS, TASKS_DIR, check

    cfg = make_cfg(*TINY, f"eval={name}", "eval.allow_code_execution=true")
    assert cfg.eval.task in TASKS and (TASKS_DIR / f"{cfg.eval.task}.yaml").is_file()
    check(cfg.eval)  # valid as shipped, once the user opts in
