"""specresearch.settings, the settings schema: every shipped option has a dataclass whose fields are
its YAML's keys, OmegaConf takes the YAML's defaults as that dataclass's types, a range check refuses
a value before a model loads, and the schema module stands on its own."""

import ast
from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from specresearch import settings
from specresearch.config import CONF_DIR, compose, options, unknown_option
from specresearch.errors import SpecResearchError

OPTIONS = [(group, name) for group in settings.OPTIONS for name in options(group)]


def _shipped(group: str, name: str) -> dict:
    """conf/GROUP/NAME.yaml's own settings, with those of the options it builds on (`defaults`)."""
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
    merged = {}
    for base in node.pop("defaults", []):
        if base != "_self_":
            merged.update(_shipped(group, base))
    return {**merged, **node}


def _keys(node: dict) -> dict:
    return {k: _keys(v) if isinstance(v, dict) and k != "tiny" else None for k, v in node.items() if not k.startswith("_")}


@pytest.mark.parametrize("group,name", OPTIONS)
def test_every_option_has_a_schema_with_its_keys(group, name):
    schema = settings.schema_of(group, name)
    assert schema is not None, f"conf/{group}/{name}.yaml has no schema in specresearch.settings.OPTIONS"
    node = _shipped(group, name)
    assert _keys(node) == _keys_of(settings.settings(schema, shipped=True))
    if "_target_" in node:
        assert node["_target_"] == schema._target_


def _keys_of(skeleton: dict) -> dict:
    return {k: _keys_of(v) if isinstance(v, dict) else None for k, v in skeleton.items()}


@pytest.mark.parametrize("group,name", OPTIONS)
def test_omegaconf_takes_the_yaml_defaults_as_the_schema_types(group, name):
    """The schemas are structured configs: OmegaConf's own type check accepts each shipped option."""
    merged = OmegaConf.merge(OmegaConf.structured(settings.schema_of(group, name)), _shipped(group, name))
    assert set(_shipped(group, name)) <= set(merged)


@pytest.mark.parametrize("name", ["config", "train"])
def test_the_primary_configs_fit_their_schemas(name):
    """conf/config.yaml's and conf/train.yaml's own settings (the groups aside): OmegaConf's type check
    accepts them, and they are the schema's."""
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{name}.yaml"))
    node = {k: v for k, v in node.items() if k not in ("defaults", "hydra")}
    OmegaConf.merge(OmegaConf.structured(settings.PRIMARY[name]), node)
    assert _keys(node) == _keys_of(settings.settings(settings.PRIMARY[name], shipped=True))


def test_the_schema_module_imports_nothing_of_the_package_but_errors():
    tree = ast.parse((CONF_DIR.parent / "specresearch" / "settings.py").read_text())
    imported = {alias.name if isinstance(node, ast.Import) else node.module
                for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    ours = {name for name in imported if name.startswith("specresearch")}
    assert ours == {"specresearch.errors"}
    assert not {name.split(".")[0] for name in imported} & {"torch", "transformers", "numpy"}


@pytest.mark.parametrize("name", options("experiment"))
def test_every_study_preset_passes_the_check(name):
    cfg = compose([f"experiment={name}"])
    assert cfg.study == name


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_the_train_config_passes_the_check(drafter):
    assert compose([f"drafter={drafter}"], config_name="train").train.heads >= 1


@pytest.mark.parametrize("overrides,message", [
    (["drafter.k=abc"], "drafter.k must be an integer, got 'abc'"),
    (["+drafter.kk=3"], "drafter=independent has no setting 'kk': valid are k, "),
    (["drafter.siblings=-1"], "drafter.siblings must be >= 0 (0 = a plain chain), got -1"),  # was the constructor's
    (["drafter=self_draft", "drafter.siblings=-2"], "drafter.siblings must be >= 0 (0 = a plain chain), got -2"),
    (["max_new_tokens=0"], "max_new_tokens must be >= 1, got 0"),  # was the run's
    (["resume=sometimes"], "resume must be auto, true or false, got 'sometimes'"),  # was sweeps.resume_on's
    (["sampling=random", "sampling.top_p=0"], "sampling.top_p must lie in (0, 1] (1 = off), got 0"),
])
def test_compose_refuses_a_bad_value_in_one_line_before_anything_loads(overrides, message):
    """specresearch.config.compose checks what it composed: no model is loaded to find out."""
    with pytest.raises(SpecResearchError) as err:
        compose(["model=tiny", "tracker=none", *overrides])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("overrides", [["resume=true"], ["resume=false"], ["resume=auto"], ["drafter.siblings=2"]])
def test_in_range_values_pass(overrides):
    compose(["model=tiny", "tracker=none", *overrides])


def test_unknown_option_reads_the_schema():
    """A setting only `+` adds (an `extra()` field) is not one the option has."""
    assert unknown_option(["model=qwen2.5-coder-0.5b", "model.tiny.vocab_size=8"]).startswith(
        "model=qwen2.5-coder-0.5b has no setting 'model.tiny': valid are model.cache, model.cache_dir, model.compile, model.device,")
    assert unknown_option(["model=tiny", "model.tiny.vocab_size=8"]) is None
    assert unknown_option(["drafter.model.tiny.vocab_size=8"]).startswith("drafter=independent has no setting 'drafter.model.tiny'")
    assert [f.name for f in fields(settings.DraftModel)][-3:] == ["vocab", "vocab_corpus", "quantize"]


def test_a_class_no_option_names_is_left_to_its_constructor():
    cfg = OmegaConf.create({"drafter": {"_target_": "my.own.Drafter", "anything": 1}})
    settings.check(cfg)
