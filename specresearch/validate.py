"""Every config value checked up front, before a run opens or a model loads: an unknown setting or a
value of the wrong type is one line that names the valid settings or the expected type, not a
traceback from deep inside a constructor.

Where the types come from, so that a new option needs nothing here:

- a node with a `_target_` (drafter, verifier, tracker, nested ones): the class's `__init__`
  signature and type hints (a `**kwargs` that a subclass passes on adds its parent's parameters; one
  that reaches `object` accepts any key). Runtime objects (`target`) are not settings.
- a model node (`model`, and any mapping a constructor takes as `Mapping | LoadedModel`, such as
  `drafter.model` and `drafter.ensemble`'s items): `load_model`'s signature, which every one of them
  is passed to; a draft model's (`Mapping | LoadedModel | DraftModel`) also `cheapen`'s (vocab,
  vocab_corpus, quantize).
- any other node (sampling, dataset, eval, stats, train, the top-level settings): the shipped YAML
  defaults; a value fits if it has the type of the default in one of the group's options (ints pass
  for floats; bools and ints never pass for each other). A default of null accepts anything; a
  setting whose YAML comment names null, true or false as a value accepts that value too
  (`num_prompts: 5  # null = all`, `resume: auto  # ... true/false force it`).

Ranges are checked where the values are used (constructors, SamplingParams): they raise the same
one-line SpecResearchError.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Union

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from specresearch.config import CONF_DIR, groups as config_groups
from specresearch.errors import SpecResearchError

INJECTED = ("target",)  # passed by app.build at run time (the loaded target), never set in a config
SKIPPED = ("hydra", "experiment")  # Hydra's own node; experiment presets are merged into the other keys


def check_config(cfg: DictConfig) -> None:
    """Refuse an unknown setting or a value of the wrong type anywhere in a composed config.

    Args:
        cfg: a composed config.yaml or train.yaml of conf/.

    Raises:
        SpecResearchError: one line naming the setting and the valid keys or the expected type.
    """
    groups = [group for group in config_groups() if group not in SKIPPED]
    top = _references("", (CONF_DIR / "config.yaml", CONF_DIR / "train.yaml"))
    for key in cfg:
        if key in SKIPPED:
            continue
        value = _resolved(cfg, key)
        if key == "model":
            _check_model(value, "model")
        elif isinstance(value, dict) and "_target_" in value:
            _check_target(value, key, group=key)
        elif key in groups:
            if value is not None:
                if not isinstance(value, dict):
                    raise SpecResearchError(f"{key} must be a group of settings, got {value!r}: choose an option with {key}=NAME")
                _check_defaults(value, _references(key, tuple(sorted((CONF_DIR / key).glob("*.yaml")))), key)
        elif any(key in ref for ref in top.refs):
            _check_defaults({key: value}, top, "")
        else:
            valid = [*dict.fromkeys(k for ref in top.refs for k in ref), *groups]
            raise SpecResearchError(f"unknown setting '{key}': valid are {', '.join(valid)}")
    if isinstance(cfg.get("sampling"), DictConfig):  # its ranges too: refused before a job takes the speed lock
        from specresearch.types import SamplingParams

        SamplingParams(**_resolved(cfg, "sampling"))


# -- nodes -----------------------------------------------------------------------------------------


def _check_target(node: dict, path: str, group: str | None = None) -> None:
    """A `_target_` node against its class's (or function's) parameters."""
    from hydra.utils import get_method

    target = node["_target_"]
    try:
        obj = get_method(target)  # a class or a function
    except Exception as err:  # Hydra wraps import errors in several types
        raise SpecResearchError(f"{path}._target_ '{target}' cannot be imported: {str(err).splitlines()[0]}") from None
    option = _option_of(group, target) if group else None
    _check_call(node, obj, path, f"{group}={option}" if option else path)


def _check_model(node: Any, path: str, draft: bool = False) -> None:
    """A model node, as the keyword arguments of load_model; a draft model's also takes cheapen's
    (vocab, vocab_corpus, quantize)."""
    from specresearch.models import load_model

    if not isinstance(node, dict):
        raise SpecResearchError(f"{path} must be a group of model settings (name, dtype, ...), got {node!r}")
    if draft:
        from specresearch.drafters.draft_model import cheapen

        _check_call(node, (load_model, cheapen), path, path)
    else:
        _check_call(node, load_model, path, path)


def _check_call(node: dict, obj: Any, path: str, label: str) -> None:
    """`node`'s keys and values against the parameters of `obj` (a class or function, or a tuple of
    them whose parameters add up)."""
    params, hints, open_ended = [], {}, False
    for one in obj if isinstance(obj, tuple) else (obj,):
        names, own_hints, any_key = _parameters(one)
        params += [name for name in names if name not in params]
        hints, open_ended = {**own_hints, **hints}, open_ended or any_key
    valid = [name for name in params if name not in INJECTED and not _runtime_only(hints.get(name, Any))]
    for key, value in node.items():
        if key.startswith("_"):  # _target_, _partial_, _recursive_, ...: Hydra's own
            continue
        if key not in valid:
            if open_ended:
                continue
            takes = f"valid are {', '.join(valid)}" if valid else "it takes none"
            raise SpecResearchError(f"{label} has no setting '{key}': {takes}")
        if key in hints:
            _check_value(value, hints[key], f"{path}.{key}")


def _check_value(value: Any, hint: Any, path: str) -> None:
    if isinstance(value, dict) and "_target_" in value:  # instantiated by Hydra: its own parameters
        _check_target(value, path)
        return
    if isinstance(value, dict) and _admits_model(hint):
        _check_model(value, path, draft=_admits_draft(hint))
        return
    item = _item_hint(hint)
    if isinstance(value, list) and item is not None and _admits_model(item):
        for i, element in enumerate(value):
            _check_value(element, item, f"{path}[{i}]")
        return
    if not _fits(value, hint):
        raise SpecResearchError(f"{path} must be {_describe(hint)}, got {value!r}")


def _check_defaults(node: dict, ref: _Refs, path: str) -> None:
    """A node without `_target_` against the shipped defaults of every option of its group."""
    valid = list(dict.fromkeys(k for r in ref.refs for k in r))
    for key, value in node.items():
        where = f"{path}.{key}" if path else key
        if key not in valid:
            raise SpecResearchError(f"{path or 'the config'} has no setting '{key}': valid are {', '.join(valid)}")
        defaults = [r[key] for r in ref.refs if key in r]
        nested = [d for d in defaults if isinstance(d, dict)]
        if isinstance(value, dict) and nested:
            _check_defaults(value, _Refs(tuple(nested), ref.documented), where)
            continue
        if any(isinstance(d, list) and d for d in defaults):  # an empty list says nothing of its items' type
            defaults = [d for d in defaults if not (isinstance(d, list) and not d)]
        hints = [_hint_of(d) for d in defaults] + list(ref.documented.get(where, ()))
        hint = Union[tuple(hints)]
        if not _fits(value, hint):
            raise SpecResearchError(f"{where} must be {_describe(hint)}, got {value!r}")


# -- signatures ------------------------------------------------------------------------------------


def _parameters(obj: Any) -> tuple[list[str], dict[str, Any], bool]:
    """The keyword parameters of a class's __init__ (following `**kwargs` up the MRO) or of a
    function, their type hints, and whether any key is accepted."""
    if not isinstance(obj, type):
        return _own_parameters(obj, bound=False)
    names: list[str] = []
    hints: dict[str, Any] = {}
    passed_on = False  # a subclass's **kwargs goes up to this class
    supplied: set[str] = set()  # the parent's parameters a subclass passes itself: super().__init__(model=...)
    for cls in obj.__mro__:
        if "__init__" not in vars(cls):
            continue
        if cls is object:
            return names, hints, passed_on  # a **kwargs that nothing consumes: any key goes
        init = vars(cls)["__init__"]
        own, own_hints, passed_on = _own_parameters(init, bound=True)
        names += [n for n in own if n not in names and n not in supplied]
        supplied |= _passed_to_super(init)
        hints = {**own_hints, **hints}
        if not passed_on:
            return names, hints, False
    return names, hints, True


def _passed_to_super(init: Any) -> set[str]:
    """The keywords an __init__ gives `super().__init__(...)` by name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return set()
    return {
        kw.arg for call in ast.walk(tree)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "__init__"
        and isinstance(call.func.value, ast.Call) and getattr(call.func.value.func, "id", None) == "super"
        for kw in call.keywords if kw.arg
    }


def _own_parameters(fn: Any, bound: bool) -> tuple[list[str], dict[str, Any], bool]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return [], {}, True
    if bound:
        params = params[1:]  # self
    names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    more = any(p.kind == p.VAR_KEYWORD for p in params)
    return names, _type_hints(fn, names), more


def _type_hints(fn: Any, names: list[str]) -> dict[str, Any]:
    """Evaluated hints (modules use `from __future__ import annotations`); a hint that does not
    evaluate (a name imported for type checking only) is left out: not checked."""
    try:
        return {k: v for k, v in typing.get_type_hints(fn).items() if k in names}
    except Exception:  # one bad annotation: evaluate them one by one
        pass
    hints = {}
    for name, annotation in getattr(fn, "__annotations__", {}).items():
        if name in names:
            try:
                hints[name] = eval(annotation, fn.__globals__) if isinstance(annotation, str) else annotation
            except Exception:
                pass
    return hints


# -- types -----------------------------------------------------------------------------------------


def _members(hint: Any) -> tuple:
    origin = typing.get_origin(hint)
    return typing.get_args(hint) if origin in (Union, types.UnionType) else (hint,)


def _runtime_only(hint: Any) -> bool:
    """A parameter for our own runtime objects (a loaded model, trained heads), null at most: not a setting."""
    objects = [m for m in _members(hint) if m is not None and m is not type(None)]
    return bool(objects) and all(isinstance(m, type) and m.__module__.startswith("specresearch") for m in objects)


def _admits_model(hint: Any) -> bool:
    from specresearch.models import LoadedModel

    return any(member is LoadedModel for member in _members(hint))


def _admits_draft(hint: Any) -> bool:
    from specresearch.drafters.draft_model import DraftModel

    return any(member is DraftModel for member in _members(hint))


def _item_hint(hint: Any) -> Any:
    """The element hint of the hint's sequence member (Sequence[X], list[X]); None if it has none."""
    for member in _members(hint):
        if _is_sequence(member):
            args = [a for a in typing.get_args(member) if a is not Ellipsis]
            return args[0] if len(args) == 1 else Any
    return None


def _is_sequence(hint: Any) -> bool:
    base = typing.get_origin(hint) or hint
    return base in (list, tuple, Sequence)


def _is_mapping(hint: Any) -> bool:
    base = typing.get_origin(hint) or hint
    return base in (dict, Mapping)


def _fits(value: Any, hint: Any) -> bool:
    """Whether a config value (plain Python, resolved) can be passed where `hint` is expected.
    Hints this cannot judge (Any, Path, Literal, ...) accept everything."""
    if hint is Any or hint is inspect.Parameter.empty:
        return True
    if hint is None or hint is type(None):
        return value is None
    if typing.get_origin(hint) in (Union, types.UnionType):
        return any(_fits(value, member) for member in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if _is_sequence(hint):
        item = _item_hint(hint)
        return isinstance(value, list) and all(_fits(v, item) for v in value)
    if _is_mapping(hint):
        args = typing.get_args(hint)
        return isinstance(value, dict) and all(_fits(v, args[1] if len(args) == 2 else Any) for v in value.values())
    if isinstance(hint, type) and hint.__module__.startswith("specresearch"):
        return False  # our own runtime objects (a loaded model, trained heads) never come from a config
    return True


def _describe(hint: Any, plural: bool = False) -> str:
    """'an integer', 'a number or null', 'a list of integers', ..."""
    if typing.get_origin(hint) in (Union, types.UnionType):
        words = [_describe(m, plural) for m in typing.get_args(hint)]
        words = list(dict.fromkeys(w for w in words if w))
        nulls = [w for w in words if w == "null"]
        return " or ".join([w for w in words if w != "null"] + nulls)
    if hint is None or hint is type(None):
        return "null"
    simple = {bool: ("true or false", "booleans"), int: ("an integer", "integers"), float: ("a number", "numbers"),
              str: ("a string", "strings")}
    if hint in simple:
        return simple[hint][plural]
    if _is_sequence(hint):
        item = _item_hint(hint)
        of = "" if item is Any else f" of {_describe(item, plural=True)}"
        return ("lists" if plural else "a list") + of
    if _is_mapping(hint):
        return "mappings" if plural else "a mapping"
    return ""  # a runtime object or a hint not checked: not something to write in a config


def _hint_of(default: Any) -> Any:
    """The type a shipped default stands for."""
    if default is None or (isinstance(default, str) and "${" in default):
        return Any  # null accepts anything; an interpolation's type is its source's
    if isinstance(default, list):
        items = [_hint_of(v) for v in default]
        return list[Union[tuple(items)]] if items else list
    if isinstance(default, dict):
        return dict
    return type(default)


# -- shipped defaults ------------------------------------------------------------------------------


class _Refs(typing.NamedTuple):
    refs: tuple[dict, ...]  # the default node of each option
    documented: dict[str, set]  # dotted key -> the types of the values its comment names (null, true/false)


@cache
def _references(prefix: str, paths: tuple[Path, ...]) -> _Refs:
    refs, documented = [], {}
    for path in paths:
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        refs.append({k: v for k, v in node.items() if k not in ("defaults", "hydra")})
        for key, kinds in _documented_values(path).items():
            documented.setdefault(f"{prefix}.{key}" if prefix else key, set()).update(kinds)
    return _Refs(tuple(refs), documented)


_KEY_LINE = re.compile(r"^(\s*)([\w-]+):(.*)$")
_NAMED = {"null": type(None), "true": bool, "false": bool}


def _documented_values(path: Path) -> dict[str, set]:
    """Dotted keys of a YAML file whose line comment names null, true or false as a value
    (`num_prompts: 5  # null = all`), with those values' types."""
    found, stack = {}, []  # stack: (indent, key) of the enclosing nodes
    for line in path.read_text().splitlines():
        match = _KEY_LINE.match(line)
        if not match:
            continue
        indent, key, rest = len(match[1]), match[2], match[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        value, _, comment = rest.partition("#")
        kinds = {_NAMED[word] for word in re.findall(r"\b(null|true|false)\b", comment)}
        if kinds:
            found[".".join([*(k for _, k in stack), key])] = kinds
        if not value.strip():
            stack.append((indent, key))
    return found


@cache
def _option_of(group: str, target: str) -> str | None:
    """The option of `group` whose YAML names `target` (for messages: drafter=independent)."""
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        if OmegaConf.load(path).get("_target_") == target:
            return path.stem
    return None


def _resolved(cfg: DictConfig, key: str) -> Any:
    """cfg[key] as plain Python, interpolations resolved."""
    try:
        value = cfg[key]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except OmegaConfBaseException as err:
        raise SpecResearchError(f"{key}: {str(err).splitlines()[0]}") from None
