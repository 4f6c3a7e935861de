"""The registry: each option of each config group (conf/GROUP/NAME.yaml) and its settings dataclass."""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from typing import Any, Union

from specresearch.options import REGISTRY, drafters, models, runs, tracking, verifiers  # noqa: F401  (importing them registers their options)

# Each option of each config group -> its schema; "*": any other option's (a model preset, a dataset, ...). The
# drafter, verifier and tracker groups are the registry's own (live: an option defined later joins them), the
# drafter group with its preset plain_chain (an independent drafter's settings).
REGISTRY["drafter"]["plain_chain"] = drafters.Independent
OPTIONS: dict[str, dict[str, type]] = {
    "model": {"tiny": models.TinyModel, "*": models.TargetModel},
    "drafter": REGISTRY["drafter"],
    "verifier": REGISTRY["verifier"],
    "tracker": REGISTRY["tracker"],
    "dataset": {"mtbench": runs.MTBench, "*": runs.Dataset},
    "sampling": {"*": runs.SamplingParams},
    "eval": {"*": runs.Eval},
}
# Options that preset a dataclass: option -> (title, the settings that are not its defaults). The model, dataset,
# sampling and eval groups are all presets; the drafter group has its options' own and the presets of one.
PRESETS = {"model": models.PRESETS, "dataset": runs.DATASETS, "sampling": runs.SAMPLINGS, "eval": runs.EVALS,
           "drafter": drafters.PRESETS}
PRIMARY = {"config": runs.Config, "train": runs.TrainConfig}  # conf/NAME.yaml -> its schema (the groups aside)


def schema_of(group: str, option: str) -> type | None:
    """The dataclass of conf/GROUP/OPTION.yaml (None for a group or option without one)."""
    found = OPTIONS.get(group, {})
    return found.get(option, found.get("*"))


def settings(schema: type, shipped: bool = False) -> dict[str, Any]:
    """A schema's settings: name -> the nested settings of a dataclass-typed field, else None (a
    value). shipped: only those the option's YAML has (not the `extra` ones), what a
    command line may set without `+`."""
    hints = typing.get_type_hints(schema)
    return {f.name: settings(dataclass_in(hints[f.name]), shipped) if dataclass_in(hints[f.name]) else None
            for f in fields(schema) if not f.name.startswith("_") and not (shipped and f.metadata.get("extra"))}


def members(hint: Any) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) is Union else (hint,)


def dataclass_in(hint: Any) -> type | None:
    """The dataclass a field type names (`DraftModel`, `Optional[DraftModel]`), or None."""
    for member in members(hint):
        if isinstance(member, type) and is_dataclass(member):
            return member
    return None
