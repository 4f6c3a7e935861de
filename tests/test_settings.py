"""Settings declared once: every shipped option has a dataclass (specresearch.options) whose fields
are its YAML's keys, the option groups' YAML is generated from them, the classes take them (no
setting of their own), OmegaConf takes the YAML's defaults as the dataclasses' types, a range check
(specresearch.settings) refuses a value before a model loads, and the declarations stand on their own."""

import ast
import importlib
import inspect
from dataclasses import fields
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import specresearch.drafters
import specresearch.tracking
import specresearch.verifiers  # noqa: F401  (the classes bind their options' `_target_`)
from specresearch import options as declarations
from specresearch import settings
from specresearch.config import CONF_DIR, compose, options, unknown_option
from specresearch.errors import SpecResearchError
from specresearch.options import target

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
        assert node["_target_"] == target(schema)


def _keys_of(skeleton: dict) -> dict:
    return {k: _keys_of(v) if isinstance(v, dict) else None for k, v in skeleton.items()}


@pytest.mark.parametrize("group,name", OPTIONS)
def test_omegaconf_takes_the_yaml_defaults_as_the_schema_types(group, name):
    """The schemas are structured configs: OmegaConf's own type check accepts each shipped option."""
    node = {k: v for k, v in _shipped(group, name).items() if k != "_target_"}  # Hydra's: the class the option builds
    merged = OmegaConf.merge(OmegaConf.structured(settings.schema_of(group, name)), node)
    assert set(node) <= set(merged)


@pytest.mark.parametrize("name", ["config", "train"])
def test_the_primary_configs_fit_their_schemas(name):
    """conf/config.yaml's and conf/train.yaml's own settings (the groups aside): OmegaConf's type check
    accepts them, and they are the schema's."""
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{name}.yaml"))
    node = {k: v for k, v in node.items() if k not in ("defaults", "hydra")}
    OmegaConf.merge(OmegaConf.structured(settings.PRIMARY[name]), node)
    assert _keys(node) == _keys_of(settings.settings(settings.PRIMARY[name], shipped=True))


PACKAGE = CONF_DIR.parent / "specresearch"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {alias.name if isinstance(node, ast.Import) else node.module
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def test_the_declarations_import_nothing_of_the_package_but_errors_and_no_config_library():
    for path in sorted((PACKAGE / "options").glob("*.py")):
        imported = _imports(path)
        ours = {name for name in imported if name.startswith("specresearch")}
        assert ours <= {"specresearch.errors", "specresearch.options"} | {f"specresearch.options.{p.stem}" for p in path.parent.glob("*.py")}, path
        assert not {name.split(".")[0] for name in imported} & {"torch", "transformers", "numpy", "omegaconf", "hydra"}, path


def test_the_core_imports_neither_omegaconf_nor_the_config_check():
    """engine, drafters and verifiers take the dataclasses; the config layer (OmegaConf, settings.check_config) stays above them."""
    core = [PACKAGE / "engine.py", *(PACKAGE / "drafters").glob("*.py"), *(PACKAGE / "verifiers").glob("*.py")]
    for path in core:
        imported = {name.split(".")[0] if name.startswith("omegaconf") else name for name in _imports(path)}
        assert not imported & {"omegaconf", "hydra", "specresearch.settings"}, path


def test_the_generated_conf_files_are_up_to_date():
    from specresearch.options import conf
    assert conf.stale(CONF_DIR.parent) == [], "run python -m specresearch.config"


@pytest.mark.parametrize("group,name", [(g, n) for g in ("drafter", "verifier") for n in settings.OPTIONS[g]])
def test_the_classes_declare_no_setting_of_their_own(group, name):
    """A drafter's or verifier's constructor takes its settings dataclass (`Settings`, the one the option
    registers): no keyword of it repeats a setting with a default of its own."""
    schema = settings.OPTIONS[group][name]
    module, _, cls_name = target(schema).rpartition(".")
    cls = getattr(importlib.import_module(module), cls_name)
    if [f for f in fields(schema) if not f.name.startswith("_")]:
        assert cls.Settings is schema
    own = [p.name for p in inspect.signature(cls.__init__).parameters.values()
           if p.name in {f.name for f in fields(schema)} and p.default is not inspect.Parameter.empty and p.name not in ("model", "ensemble")]
    assert own == [], f"{cls_name}.__init__ declares {own} again: take them from {schema.__name__}"


def test_a_constructor_refuses_an_unknown_setting_naming_the_valid_ones():
    from specresearch.drafters.pld import PromptLookupDrafter
    with pytest.raises(SpecResearchError, match="^drafter has no setting 'kk': valid are k, k_policy, k_max, max_ngram"):
        PromptLookupDrafter(kk=3)
    assert PromptLookupDrafter().k == 10 and PromptLookupDrafter(k=3).settings.k == 3


def test_a_subclass_gives_an_inherited_setting_another_default_without_declaring_it():
    drafters = declarations.drafters
    assert drafters.PromptLookup().k == 10 and drafters.Independent().k == 16 and drafters.DraftLength().k == 4
    assert drafters.PromptLookup.__dataclass_fields__["k"].metadata == drafters.DraftLength.__dataclass_fields__["k"].metadata


def test_why_a_default_is_chosen_names_a_shipped_setting_of_its_option_in_one_line():
    """CHOSEN (why each default is what it is) belongs to the option that ships the default: each key is one of
    its settings (dotted for a nested one), each reason one line, and `--settings` and docs/options.md print it."""
    from specresearch.options import conf

    said = 0
    for group, name, schema, values, _ in conf.registered():
        rows = {n: d for n, d, _ in conf.table(schema, values)}
        for key, why in conf.reasons(schema, values).items():
            assert key in rows, f"{group}={name}: CHOSEN names '{key}', not one of its settings {sorted(rows)}"
            assert why and "\n" not in why, (group, name, key)
            assert f"  {key}={rows[key]}: {why}" in conf.describe(group, name).split("Why these defaults:\n")[1]
            assert f"- `{key}={rows[key]}`: {why}" in conf.markdown()
            said += 1
    assert said and declarations.chosen(declarations.drafters.PromptLookup)["k"]
    plain = {(g, n): v for g, n, _, v, _ in conf.registered()}["drafter", "plain_chain"]
    assert "k" not in conf.reasons(declarations.drafters.Independent, plain)  # a preset's k is its own reason
    assert declarations.chosen(declarations.drafters.Independent)["k"]  # the default experiment's drafter says why

    class Longer(declarations.drafters.PromptLookup, defaults={"k": 20}):
        """A subclass that changes a default and does not say why."""
    assert declarations.chosen(Longer) == {}  # a base's reasons are not inherited


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
    assert [f.name for f in fields(declarations.models.DraftModel)][-3:] == ["vocab", "vocab_corpus", "quantize"]


def test_a_class_no_option_names_is_left_to_its_constructor():
    cfg = OmegaConf.create({"drafter": {"_target_": "my.own.Drafter", "anything": 1}})
    settings.check_config(cfg)
