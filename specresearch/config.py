"""The configuration registry: each group folder of conf/ (drafter/, verifier/, model/, ...) is the list
of its options, and each study folder of experiments/ (its `preset.yaml`) is an option of the group
`experiment`. Both folders sit beside the package in a checkout and inside it in a wheel (pyproject's
package-dir maps them there), so the CLI, lm-eval and the analysis find them from any folder.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from specresearch import settings
from specresearch.errors import SpecResearchError
from specresearch.options import REGISTRY, target
from specresearch.options.conf import CONF_DIR, project_folder, render

STUDIES_DIR = project_folder("experiments", "README.md")
STUDY_GROUP = "experiment"  # python -m specresearch experiment=NAME runs experiments/NAME/preset.yaml


def studies() -> dict[str, Path]:
    """Every study: its name (the folder's) -> its folder (preset.yaml, README.md, analysis.py, ...)."""
    return {path.parent.name: path.parent for path in sorted(STUDIES_DIR.glob("*/preset.yaml"))}


def groups() -> list[str]:
    """The config groups: the folders here (but hydra/: Hydra's own groups), and `experiment`."""
    found = [path.name for path in CONF_DIR.iterdir() if path.is_dir() and path.name not in ("hydra", "__pycache__")]
    return sorted([*found, STUDY_GROUP])


def options(group: str) -> list[str]:
    """The options of a config group (empty for a name that is no group): its files, and the options defined in
    code that have none (`register_options`)."""
    if group == STUDY_GROUP:
        return sorted(studies())
    return sorted({*(path.stem for path in (CONF_DIR / group).glob("*.yaml")), *unshipped(group)})


def unshipped(group: str) -> dict[str, type]:
    """The registered options of `group` that conf/ has no file for (a drafter defined in a test module, or in a
    user's module imported before composing), that can be built (their class is defined): option -> settings."""
    return {name: schema for name, schema in REGISTRY.get(group, {}).items()
            if not (CONF_DIR / group / f"{name}.yaml").is_file() and (target(schema) is not None or not schema.builds)}


def register_options() -> None:
    """Make every option `unshipped` names composable, as if conf/GROUP/NAME.yaml held what
    `python -m specresearch.config` would write for it: Hydra's config store. Idempotent."""
    store = ConfigStore.instance()
    for group in list(REGISTRY):
        for name, schema in unshipped(group).items():
            store.store(group=group, name=name, node=OmegaConf.create(render(schema)), provider="specresearch")


def study_groups() -> dict[str, list[str]]:
    """The studies' own config groups, `NAME/SUBFOLDER` (e.g. batch_synergy/arm) -> their options."""
    return {f"{name}/{sub.name}": sorted(path.stem for path in sub.glob("*.yaml"))
            for name, folder in studies().items() for sub in sorted(folder.iterdir())
            if sub.is_dir() and any(sub.glob("*.yaml"))}


def register_studies() -> None:
    """Make every study's preset the option `experiment=NAME` (a global package, as `# @package
    _global_` says in a group folder): Hydra's config store, so the preset can live in its study's
    folder beside its README and analysis. A subfolder of YAMLs there is a config group of the study's
    own, `NAME/SUBFOLDER` (global package too): arms of a sweep that are no product of settings, e.g.
    experiments/batch_synergy/arm/tree.yaml is `batch_synergy/arm=tree`. Idempotent."""
    store = ConfigStore.instance()
    for name, folder in studies().items():
        store.store(group=STUDY_GROUP, name=name, node=OmegaConf.load(folder / "preset.yaml"), package="_global_",
                    provider="specresearch")
        for path in sorted(folder.glob("*/*.yaml")):  # the study's own groups: its sweep's arms
            store.store(group=f"{name}/{path.parent.name}", name=path.stem, node=OmegaConf.load(path),
                        package="_global_", provider="specresearch")


def compose(overrides: Sequence[str] | Mapping[str, Any] = (), config_name: str = "config") -> DictConfig:
    """A config of conf/ composed with Hydra overrides, as `python -m specresearch` would
    compose it (without the `hydra` node), and checked against the settings schema
    (specresearch.settings.check_config).

    Args:
        overrides: `["drafter=pld", "drafter.k=4"]`, or a mapping `{"drafter": "pld", "drafter.k": 4}`
            (values as Python gives them: True -> true, None -> null).
        config_name: "config" (experiments, evaluations) or "train".

    Raises:
        SpecResearchError: an unknown option or setting (naming the valid ones), a value of the wrong
            type or out of range, a bad override, or overrides that are not a list of strings or a mapping.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException

    if isinstance(overrides, Mapping):
        overrides = [f"{key}={_text(value)}" for key, value in overrides.items()]
    if isinstance(overrides, (str, bytes)) or not isinstance(overrides, Sequence) \
            or not all(isinstance(arg, str) for arg in overrides):
        example = f"[{overrides!r}]" if isinstance(overrides, str) else '["drafter=pld", "drafter.k=4"]'
        raise SpecResearchError(f"compose() takes a list of overrides, e.g. {example}, or a mapping such as "
                                f"{{'drafter': 'pld'}}; got {overrides!r}")
    overrides = list(overrides)
    problem = unknown_option(overrides, config_name)
    if problem:
        raise SpecResearchError(problem)
    register_options()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=overrides)
    except HydraException as err:
        raise SpecResearchError(str(err)) from None
    settings.check_config(cfg)
    return cfg


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else "null" if value is None else str(value)


def unknown_option(args: Sequence[str], config_name: str = "config") -> str | None:
    """The one-line error for a `group=NAME` (or `+group=a,b` in a sweep) that names no option of a
    config group, or for a setting (`drafter.lookup=4`, `max_new_token=8`) that the config it would
    change does not have; None if neither. Checked before Hydra composes, whose own messages are a
    dozen lines; values Hydra's sweep grammar writes otherwise (`choice(...)`, globs) are left to Hydra."""
    known = groups()
    own = study_groups()  # batch_synergy/arm=...: a study's own group (its folder's arm/)
    chosen: dict[str, list[str]] = {}  # group → the options the arguments select
    for arg in args:
        group, sep, value = arg.lstrip("+").partition("=")
        if sep and group == "study":  # the label the analysis selects a study's runs by: only its preset sets it
            return (f"study is set by a study's preset, not by hand (the study's analysis would count this run among "
                    f"its own): run experiment=NAME, NAME one of {', '.join(options(STUDY_GROUP))}")
        if not sep or (group not in known and group not in own) or not re.fullmatch(r"[\w.-]+(,[\w.-]+)*", value):
            continue
        valid = own[group] if group in own else options(group)
        for name in value.split(","):
            if name not in valid and name != "null":
                return f"unknown {group} '{name}': valid are {', '.join(valid)}"
        chosen[group] = value.split(",")
    if chosen.get(STUDY_GROUP, ["null"]) != ["null"]:
        return None  # a study's preset may choose options and add settings of its own: Hydra checks those
    schema = settings.PRIMARY.get(config_name)
    if schema is None:
        return None
    primary = OmegaConf.load(CONF_DIR / f"{config_name}.yaml")  # its defaults list: the options it chooses
    for entry in primary.get("defaults", []):
        if isinstance(entry, (dict, DictConfig)):
            for group, name in entry.items():
                if group in known:
                    chosen.setdefault(group, [str(name)])
    for before, arg in zip(["", *args], args):
        path, sep, _ = arg.partition("=")
        flag_value = before.startswith("-") and before not in ("-m", "--multirun") and "=" not in before  # -sc query=bash
        if not sep or flag_value or arg.startswith(("+", "~", "-")) or path.split(".")[0] == "hydra" or path in known \
                or "/" in path or "@" in path:  # hydra/launcher=ray, a package override: Hydra's own
            continue
        keys = path.split(".")
        if keys[0] in known:
            for name in chosen.get(keys[0], ["null"]):
                if name in ("null", "None"):
                    return f"{path} sets a setting of {keys[0]}, which is off: choose one, {keys[0]}=NAME ({', '.join(options(keys[0]))})"
                problem = _missing(keys[1:], _option(keys[0], name), f"{keys[0]}={name}", keys[0])
                if problem:
                    return problem
        else:
            command = "python -m specresearch" + ("" if config_name == "config" else f".{config_name}")
            problem = _missing(keys, {**settings.settings(schema, shipped=True), **{g: None for g in chosen}}, command, "")
            if problem:
                return problem
    return None


def _option(group: str, name: str) -> dict | None:
    """The settings conf/GROUP/NAME.yaml has, as its schema declares them (None: no schema, Hydra decides)."""
    schema = settings.schema_of(group, name)
    return settings.settings(schema, shipped=True) if schema else None


def _missing(keys: list[str], node: Any, owner: str, prefix: str) -> str | None:
    """The error for a dotted setting `keys` that `node` (a config's settings) has no place for, or None."""
    for depth, key in enumerate(keys):
        if not isinstance(node, (dict, DictConfig)):
            return None  # a value (or null) there: Hydra decides
        valid = sorted(k for k in node if k not in ("_target_", "defaults", "hydra"))
        if key not in node:
            where = ".".join([prefix, *keys[:depth]]).strip(".")
            names = ", ".join(f"{where}.{k}".lstrip(".") for k in valid)
            return f"{owner} has no setting '{'.'.join([where, key]).strip('.')}': valid are {names}"
        node = node[key]
    return None


register_studies()


def write_conf(argv: list[str] | None = None) -> int:
    """`python -m specresearch.config [--check]`: conf/ and docs/options.md written from the settings
    dataclasses (specresearch.options.conf), once the classes their options build are defined."""
    import specresearch.drafters  # noqa: F401  (defining the classes binds each option's `_target_`)
    import specresearch.tracking  # noqa: F401
    import specresearch.verifiers  # noqa: F401
    from specresearch.options import conf

    return conf.main(argv)


if __name__ == "__main__":
    raise SystemExit(write_conf())
