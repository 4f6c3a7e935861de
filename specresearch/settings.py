"""The config layer's check: a composed config (conf/config.yaml or conf/train.yaml, with its groups)
against the settings dataclasses of specresearch.options, refused in one line before a run opens or a
model loads: an unknown setting (naming the valid ones), a value of the wrong type (wrong types are
refused, never converted), a value out of range (the dataclass's `check_ranges`).

- A group whose options configure no class (model, dataset, sampling, eval) is checked against the fields
  of all its options together (a setting of one dataset passes on another); a group whose options build
  one (drafter, verifier, tracker: `builds`) against the option that builds the class the node's
  `_target_` names (the class bound to it, or, before the package's classes are imported, the one its
  conf/ file names: a config is checked before torch loads).
- Field types are what a YAML value may be: `Optional[int]` takes null, `float` takes an int, bool and
  int never pass for each other; `Any` is not checked.
- A range check sees the values the node gives (absent ones are MISSING): every rule that needs no
  model, so a config is refused before one loads; what needs the model stays with the classes.

OmegaConf and specresearch.options only: the core (engine, drafters, verifiers) does not import this
module; it takes the dataclasses themselves.
"""

from __future__ import annotations

import functools
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specresearch.errors import SpecResearchError
from specresearch.options import MISSING, target
from specresearch.options.conf import CONF_DIR
from specresearch.options.groups import OPTIONS, PRIMARY, dataclass_in, members, schema_of, settings
from specresearch.options.models import Model
from specresearch.options.runs import Config, TrainConfig

__all__ = ["check_config", "OPTIONS", "PRIMARY", "schema_of", "settings"]
SKIPPED = ("hydra", "experiment")  # Hydra's own node; a study's preset is merged into the other keys


# -- the check -------------------------------------------------------------------------------------


def check_config(cfg: DictConfig) -> None:
    """Refuse an unknown setting, a value of the wrong type or out of range anywhere in a composed
    config.yaml or train.yaml, in one line naming the valid settings, the expected type or the range.

    Raises:
        SpecResearchError
    """
    primary = TrainConfig if "train" in cfg else Config
    groups = [g for g in OPTIONS if g in cfg]
    top = _hints(primary)
    for key in cfg:
        if key in SKIPPED:
            continue
        value = _resolved(cfg, key)
        if key == "model":
            _check_model(value, "model", _group_schema("model"))
        elif key in OPTIONS:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise SpecResearchError(f"{key} must be a group of settings, got {value!r}: choose an option with {key}=NAME")
            if OPTIONS[key][next(iter(OPTIONS[key]))].builds:
                _check_target(value, key)
            else:
                _check_node(value, _group_schema(key), key, key)
        elif key in top:
            _check_value(value, top[key], key)
        else:
            valid = [*(k for k in top if not k.startswith("_")), *dict.fromkeys([*groups, *OPTIONS])]
            raise SpecResearchError(f"unknown setting '{key}': valid are {', '.join(valid)}")
    _ranges(primary, {k: _resolved(cfg, k) for k in top if k in cfg}, "")
    model = _resolved(cfg, "model") if "model" in cfg else None
    if isinstance(model, dict) and model.get("compile") and cfg.get("batch_size", 1) > 1:  # (kv.StaticSlots.forward)
        raise SpecResearchError(f"model.compile=true compiles the decoder of one sequence: batch_size={cfg.batch_size} would run "
                                "eagerly; use model.compile=false (model.cache=static decodes batches eagerly) or batch_size=1")


def _check_target(node: dict, group: str) -> None:
    """A `_target_` node against the option of its group that builds the same class; a class that no
    option names is the user's own: its constructor checks it."""
    schema = built_by(group, node.get("_target_"))
    if schema is not None:
        _check_node(node, schema, group, f"{group}={schema.option}")


def built_by(group: str, path: Any) -> type | None:
    """The settings of the option of `group` that builds class `path` (a `_target_`), or None."""
    for option, schema in OPTIONS[group].items():
        if path == (target(schema) or _shipped_target(group, option)):
            return schema
    return None


@functools.cache
def _shipped_target(group: str, option: str) -> str | None:
    """The `_target_` conf/GROUP/OPTION.yaml names (None: no such file): the package's own options, whose classes
    a config is checked without importing (their modules load torch)."""
    path = CONF_DIR / group / f"{option}.yaml"
    return OmegaConf.load(path).get("_target_") if path.is_file() else None


def _check_model(node: Any, path: str, schema: type) -> None:
    if not isinstance(node, dict):
        raise SpecResearchError(f"{path} must be a group of model settings (name, dtype, ...), got {node!r}")
    _check_node(node, schema, path, path)


def _check_node(node: dict, schema: type, path: str, label: str) -> None:
    """`node`'s keys and values against `schema`'s fields, then its ranges."""
    hints = _hints(schema)
    valid = [name for name in hints if not name.startswith("_")]
    for key, value in node.items():
        if key.startswith("_"):  # _target_, _partial_, _recursive_, ...: Hydra's own
            continue
        if key not in hints:
            takes = f"valid are {', '.join(valid)}" if valid else "it takes none"
            raise SpecResearchError(f"{label} has no setting '{key}': {takes}")
        _check_value(value, hints[key], f"{path}.{key}" if path else key)
    _ranges(schema, node, path)


def _check_value(value: Any, hint: Any, path: str) -> None:
    schema = dataclass_in(hint)
    if schema is not None and (isinstance(value, dict) or not _fits(value, hint)):
        if issubclass(schema, Model):
            _check_model(value, path, schema)
        elif isinstance(value, dict):
            _check_node(value, schema, path, path)
        else:
            raise SpecResearchError(f"{path} must be a group of settings ({', '.join(settings(schema))}), got {value!r}")
        return
    item = _item_hint(hint)
    item_schema = dataclass_in(item) if item is not None else None
    if isinstance(value, list) and item_schema is not None:
        for i, element in enumerate(value):
            _check_value(element, item, f"{path}[{i}]")
        return
    if not _fits(value, hint):
        raise SpecResearchError(f"{path} must be {_describe(hint)}, got {value!r}")


def _ranges(schema: Any, node: dict, path: str) -> None:
    """The schema's range check (its `check_ranges(path)`) on the values the node gives (MISSING: absent)."""
    if isinstance(schema, _Merged):
        for one in schema.schemas:
            _ranges(one, node, path)
    elif hasattr(schema, "check_ranges"):
        own = {f.name: node[f.name] for f in fields(schema) if f.name in node and not is_dataclass(dataclass_in(
            typing.get_type_hints(schema)[f.name]))}
        instance = schema.__new__(schema)
        for f in fields(schema):
            object.__setattr__(instance, f.name, own.get(f.name, MISSING))
        instance.check_ranges(path)


def _group_schema(group: str) -> type:
    """A group without `_target_`: one schema holding every field of its options (the first option's
    field first), each with its type."""
    schemas = list(dict.fromkeys(OPTIONS[group].values()))
    if len(schemas) == 1:
        return schemas[0]
    merged: dict[str, Any] = {}
    for schema in schemas:
        for name, hint in _hints(schema).items():
            merged[name] = hint if name not in merged or merged[name] == hint else Union[merged[name], hint]
    return _Merged(group, merged)


class _Merged:
    """The fields of a group's options together (a stand-in for a dataclass: `_hints` reads it)."""

    def __init__(self, group: str, hints: dict[str, Any]):
        self.group, self.hints = group, hints
        self.schemas = list(dict.fromkeys(OPTIONS[group].values()))


def _hints(schema: Any) -> dict[str, Any]:
    """Field name -> type, in declaration order (a base class's first)."""
    if isinstance(schema, _Merged):
        return schema.hints
    hints = typing.get_type_hints(schema)
    return {f.name: hints[f.name] for f in fields(schema)}


# -- types -----------------------------------------------------------------------------------------


def _item_hint(hint: Any) -> Any:
    """The element type of the type's list member (List[X]); None if it has none."""
    for member in members(hint):
        if typing.get_origin(member) is list:
            args = typing.get_args(member)
            return args[0] if args else Any
    return None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a config value (plain Python, resolved) has the type `hint` declares."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if typing.get_origin(hint) is Union:
        return any(_fits(value, member) for member in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if typing.get_origin(hint) is list:
        item = _item_hint(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if typing.get_origin(hint) is dict:
        args = typing.get_args(hint)
        return isinstance(value, dict) and all(_fits(v, args[1] if len(args) == 2 else Any) for v in value.values())
    if isinstance(hint, type) and is_dataclass(hint):
        return isinstance(value, dict)
    return True


def _describe(hint: Any, plural: bool = False) -> str:
    """'an integer', 'a number or null', 'a list of integers', ..."""
    if typing.get_origin(hint) is Union:
        words = list(dict.fromkeys(_describe(m, plural) for m in typing.get_args(hint)))
        return " or ".join([w for w in words if w != "null"] + [w for w in words if w == "null"])
    if hint is type(None):
        return "null"
    simple = {bool: ("true or false", "booleans"), int: ("an integer", "integers"), float: ("a number", "numbers"),
              str: ("a string", "strings")}
    if hint in simple:
        return simple[hint][plural]
    if typing.get_origin(hint) is list:
        item = _item_hint(hint)
        of = "" if item is Any else f" of {_describe(item, plural=True)}"
        return ("lists" if plural else "a list") + of
    if typing.get_origin(hint) is dict:
        return "mappings" if plural else "a mapping"
    return "a group of settings"


def _resolved(cfg: DictConfig, key: str) -> Any:
    """cfg[key] as plain Python, interpolations resolved."""
    try:
        value = cfg[key]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException as err:
        raise SpecResearchError(f"{key}: {str(err).splitlines()[0]}") from None
