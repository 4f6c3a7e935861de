"""The registry: each option of each config group (conf/GROUP/NAME.yaml) and its settings dataclass."""

from __future__ import annotations

import typing
from dataclasses import fields, is_dataclass
from typing import Any, Union

from specresearch.options import drafters, models, runs, tracking, verifiers


def _by_name(*schemas: type, **presets: type) -> dict[str, type]:
    return {**{schema.option: schema for schema in schemas}, **presets}


# Each option of each config group -> its schema; "*": any other option's (a model preset, a dataset, ...).
OPTIONS: dict[str, dict[str, type]] = {
    "model": {"tiny": models.TinyModel, "*": models.TargetModel},
    "drafter": _by_name(drafters.Independent, drafters.Tree, drafters.Medusa, drafters.Eagle, drafters.PromptLookup,
                        drafters.Lookahead, drafters.SelfDraft, drafters.CrossVocab, drafters.NoDrafter,
                        plain_chain=drafters.Independent),
    "verifier": _by_name(verifiers.Greedy, verifiers.Rejection, verifiers.Margin, verifiers.TopK, verifiers.Typical),
    "tracker": _by_name(tracking.MLflow, tracking.NoTracker),
    "dataset": {"mtbench": runs.MTBench, "*": runs.Dataset},
    "sampling": {"*": runs.Sampling},
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
