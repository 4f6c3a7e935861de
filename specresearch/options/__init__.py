"""Every setting of specresearch, declared once: one dataclass per option (a drafter, a verifier, a
model, a tracker) or config node, whose fields hold each setting's type, default and one-line
description (`setting`), and whose `check_ranges(path)` holds its ranges, the rules that need no model.

An option is registered where it is written: a dataclass with an `option` name joins REGISTRY (its
group's options), and the class it configures names it (`IndependentDrafter.Settings`), which binds the
option's `_target_` to that class (`implements`, called by the drafters', verifiers' and trackers' bases):
no list of options and no class path written by hand. Constructors take the settings (`make`);
conf/GROUP/NAME.yaml is generated from the dataclasses (`python -m specresearch.config`; a test holds the
files to them); `specresearch.settings` checks a composed config against them; `--help` and the docs'
option tables read the descriptions.

Stdlib only (no OmegaConf, no torch): the core imports it, and a config is refused in a fraction of a
second, before torch loads.

- `models`: the `model` group and the drafters' own models;
- `drafters`, `verifiers`, `tracking`: the groups whose options build a class (`builds`: Hydra's `_target_`);
- `runs`: the rest of a run (dataset, sampling, eval, stats, the top level, training).
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING as NO_DEFAULT
from dataclasses import field, fields
from typing import Any, ClassVar

from specresearch.errors import SpecResearchError

MISSING = "???"  # a node's value that is absent (OmegaConf's MISSING): a range check passes it by
# group -> option -> its settings dataclass, in the order they are declared: every dataclass with an `option`
# (Options.__init_subclass__), the package's and any module's that defines one (a drafter in a test module).
REGISTRY: dict[str, dict[str, type]] = {}


def setting(default: Any = NO_DEFAULT, doc: str = "", *, factory: Any = NO_DEFAULT, extra: bool = False,
            follows: str = "") -> Any:
    """A setting: its default (or a `factory` for a mutable one) and its one-line description.

    extra: not in the shipped YAML; the command line adds it with `+key=value`.
    follows: in conf/, the default is this other setting's value (an interpolation, e.g. model.cache_dir).
    """
    metadata = {"doc": doc, "extra": extra, "follows": follows}
    if factory is not NO_DEFAULT:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def doc(schema: type, name: str) -> str:
    """The description of setting `name` of `schema`."""
    return schema.__dataclass_fields__[name].metadata.get("doc", "")


class Options:
    """The base of every settings dataclass (not one itself, so that a subclass may be frozen: SamplingParams).

    A subclass may give settings it inherits other defaults, without declaring them again:
    `class PromptLookup(DraftLength, defaults={"k": 10})`.
    """

    group: ClassVar[str] = ""  # the config group (drafter, verifier, ...): the path its errors name
    option: ClassVar[str] = ""  # its name in the group: conf/GROUP/OPTION.yaml; set: the option is registered
    builds: ClassVar[bool] = False  # its options build a class (`_target_`: the class that names them `Settings`)
    # Why a default of this option is what it is, one line per setting: the measurement that chose it (the
    # prompts, the machine, the speedup, the results page) or the source it follows. This class's own, never
    # inherited: a subclass that gives a setting another default says why itself (`chosen`).
    CHOSEN: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, defaults: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = dict(cls.__dict__.get("__annotations__", {}))
        for name, value in (defaults or {}).items():
            inherited = next((base.__dataclass_fields__[name] for base in cls.__mro__[1:]
                              if name in getattr(base, "__dataclass_fields__", {})), None)
            if inherited is None:
                raise TypeError(f"{cls.__name__}: defaults names '{name}', which no base declares")
            own[name] = inherited.type
            kind = {"default_factory": lambda v=value: dataclasses.replace(v) if dataclasses.is_dataclass(v) else v} \
                if dataclasses.is_dataclass(value) else {"default": value}
            setattr(cls, name, field(**kind, metadata=inherited.metadata))
        cls.__annotations__ = own
        if cls.__dict__.get("option"):
            known = REGISTRY.setdefault(cls.group, {}).get(cls.option)
            if known is not None and _path(known) != _path(cls):
                raise TypeError(f"{_path(cls)}: {cls.group}={cls.option} is {_path(known)} already; choose another option name")
            REGISTRY[cls.group][cls.option] = cls

    def check_ranges(self, path: str) -> None:
        """Refuse values out of range (SpecResearchError): the rules that need no model."""


def _path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def implements(cls: type) -> None:
    """Bind class `cls` to the settings it declares as its own (`cls.Settings`): their option's `_target_`
    is `cls`'s import path from now on. The drafters', verifiers' and trackers' bases call it for every
    subclass, so a class is registered where it is written."""
    schema = cls.__dict__.get("Settings")
    if schema is None:
        return
    bound = schema.__dict__.get("_class")
    if bound is not None and bound != _path(cls):
        raise TypeError(f"{_path(cls)} declares {schema.__name__} as its Settings, which {bound} declares already")
    schema._class = _path(cls)


def target(schema: type) -> str | None:
    """The import path of the class an option builds (its `_target_`), once that class is defined (`implements`)."""
    return schema.__dict__.get("_class")


def chosen(schema: type) -> dict[str, str]:
    """{setting: why its default is what it is} of option `schema` (its own CHOSEN, not its bases')."""
    return dict(schema.__dict__.get("CHOSEN", {}))


def make(schema: type, given: dict[str, Any], path: str | None = None) -> Any:
    """`schema`'s settings from `given` (the rest at their defaults), checked: how a constructor takes
    its keyword settings. An unknown name is refused in one line naming the valid ones.

    Raises:
        SpecResearchError
    """
    path = path or schema.group
    valid = [f.name for f in fields(schema) if not f.name.startswith("_")]
    unknown = [key for key in given if key not in valid]
    if unknown:
        raise SpecResearchError(f"{path} has no setting '{unknown[0]}': valid are {', '.join(valid)}")
    settings = schema(**given)
    settings.check_ranges(path)
    return settings


# -- range rules: each names the setting and the valid values ---------------------------------------


def given(value: Any) -> bool:
    """Whether a node gives `value` (a partial node's absent settings are MISSING)."""
    return not (isinstance(value, str) and value == MISSING)


def one_of(path: str, key: str, value: Any, valid: tuple, null: str = "") -> None:
    """`value` is one of `valid` (or null, where `null` says what null means)."""
    if given(value) and not (null and value is None) and value not in valid:
        names = [f"null ({null})"] * bool(null) + list(valid)
        raise SpecResearchError(f"unknown {path}.{key} '{value}': valid are {', '.join(names)}")


def at_least(path: str, key: str, value: Any, low: int, meaning: str = "") -> None:
    if given(value) and value < low:
        raise SpecResearchError(f"{path}.{key} must be >= {low}{meaning}, got {value}")


def probability_or_null(path: str, key: str, value: Any) -> None:
    """A confidence threshold: in (0, 1), or null (off)."""
    if given(value) and value is not None and not 0 < value < 1:
        raise SpecResearchError(f"{path}.{key} must lie in (0, 1) or be null, got {value}")


SWITCH = ("auto", True, False)  # a setting that is auto, true or false (resume, compiled_reference, stats.time_split)


def switch(value: Any) -> bool:
    """Whether `value` is one of SWITCH (the booleans themselves: 1 and 0 are not true and false)."""
    return any(value is v if isinstance(v, bool) else value == v for v in SWITCH)


def integer(value: Any) -> bool:
    """An int that is no bool."""
    return isinstance(value, int) and not isinstance(value, bool)
