"""Trained drafters' checkpoint files: the weights as safetensors beside a JSON of their shape, target
and training record; found (a file given, the one trained for this target in the model cache, or one
shipped with the package), checked before a run waits for the speed lock, and loaded with one-line
errors naming what to do."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from specresearch.errors import SpecResearchError
from specresearch.models import say_once


def save_checkpoint(module: torch.nn.Module, path: Path, meta: dict) -> None:
    """A trained drafter's weights as safetensors at `path`, and `meta` (its shape, target, training)
    in a JSON file beside them, each whole or not at all (written beside, then renamed: a stopped
    run leaves no cut file)."""
    from specresearch.drafters.training import save_tensors

    save_tensors({k: v.detach().cpu() for k, v in module.state_dict().items()}, path)
    sidecar = path.with_suffix(".json")
    tmp = sidecar.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(sidecar)


SHIPPED = Path(__file__).resolve().parent.parent / "weights"  # trained drafters that come with the package


def find_checkpoint(drafter: str, target_name: str, checkpoint: str | None, default: Path) -> Path:
    """The weights a trained drafter loads: `checkpoint`, else `default` (where `python -m
    specresearch.train drafter=<drafter>` saves them), else the weights shipped in the package for
    this target (`specresearch/weights/<drafter>/<target>/`, with their training record beside them).
    A missing file, or one trained for another target, is an error that says what to do."""
    shipped = SHIPPED / drafter / target_name / default.name
    path = Path(checkpoint) if checkpoint else default if default.is_file() or not shipped.is_file() else shipped
    if not path.is_file():
        raise SpecResearchError(
            f"no trained {drafter} drafter for {target_name} at {path}: train it with "
            f"python -m specresearch.train drafter={drafter} model.name={target_name}, "
            f"or point drafter.checkpoint at a {default.name} file"
        )
    trained_for = read_meta(drafter, path).get("target")
    if trained_for not in (None, target_name):
        raise SpecResearchError(f"the {drafter} weights at {path} were trained for {trained_for}, not {target_name}")
    return path


def _retrain(drafter: str) -> str:
    return f"retrain it with python -m specresearch.train drafter={drafter}, or point drafter.checkpoint at a whole checkpoint"


def read_meta(drafter: str, path: Path, keys: Sequence[str] = ()) -> dict:
    """The JSON beside a trained drafter's weights at `path` (its shape, target, training record), with
    `keys` present; a missing, unreadable or incomplete one is a one-line SpecResearchError naming
    the file and what to do."""
    sidecar = path.with_suffix(".json")
    try:
        meta = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise SpecResearchError(f"the {drafter} checkpoint {path} has no {sidecar.name} beside it (the weights' shape and "
                                f"training record): copy it with the weights, or {_retrain(drafter)}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecResearchError(f"{sidecar} (beside the {drafter} checkpoint) is not readable JSON "
                                f"({_one_line(err)}): {_retrain(drafter)}") from None
    if not isinstance(meta, dict):
        raise SpecResearchError(f"{sidecar} (beside the {drafter} checkpoint) holds {type(meta).__name__}, not a JSON "
                                f"object: {_retrain(drafter)}")
    missing = [key for key in keys if key not in meta]
    if missing:
        raise SpecResearchError(f"{sidecar} (beside the {drafter} checkpoint) lacks {', '.join(missing)}: {_retrain(drafter)}")
    return meta


def check_checkpoint(drafter: str, path: Path, option: str = "drafter.checkpoint", keys: Sequence[str] = ()) -> None:
    """Refuse, without building the module or reading the weights (so before a run waits for the speed
    lock or loads a model), a checkpoint `option` names that load_checkpoint would refuse for what its
    files alone show: no file, a missing or bad JSON beside it, a safetensors header that is damaged or
    promises more bytes than the file holds. One line naming `option`, the file and what to do."""
    from safetensors import SafetensorError, safe_open

    named = "" if option == "drafter.checkpoint" else f"{option}: "  # (drafter.checkpoint's messages are load_checkpoint's, word for word)
    retrain = f"retrain it with python -m specresearch.train drafter={drafter}, or point {option} at a whole checkpoint"
    if not path.is_file():
        raise SpecResearchError(f"{named}no {drafter} checkpoint at {path}"
                                f"{' (a folder)' if path.is_dir() else ''}: train one with python -m specresearch.train drafter={drafter}")
    try:
        read_meta(drafter, path, keys)
    except SpecResearchError as err:
        raise SpecResearchError(f"{named}{str(err).replace('point drafter.checkpoint at', f'point {option} at')}") from None
    try:
        with safe_open(str(path), framework="pt") as weights:
            weights.keys()
    except (SafetensorError, OSError, ValueError) as err:
        raise SpecResearchError(f"{named}{path} is not a whole safetensors file ({_one_line(err)}): it is damaged or cut "
                                f"short; {retrain}") from None


def load_checkpoint(drafter: str, path: Path, make: Callable[[dict], torch.nn.Module],
                    keys: Sequence[str] = ()) -> tuple[torch.nn.Module, dict]:
    """A trained drafter's module and its JSON: `make(meta)` builds the module (`keys`: what it reads of
    the meta), then the weights at `path` fill it. A missing or bad JSON, a damaged, cut or foreign
    safetensors file, or weights of another shape are a one-line SpecResearchError naming the file,
    what is wrong and what to do."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise SpecResearchError(f"no {drafter} checkpoint at {path}: train one with python -m specresearch.train drafter={drafter}")
    meta = read_meta(drafter, path, keys)
    try:
        module = make(meta)
    except (TypeError, ValueError, KeyError) as err:
        raise SpecResearchError(f"{path.with_suffix('.json')} (beside the {drafter} checkpoint) gives a shape that builds "
                                f"no {drafter} module ({_one_line(err)}): {_retrain(drafter)}") from None
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise SpecResearchError(f"{path} is not a whole safetensors file ({_one_line(err)}): it is damaged or cut "
                                f"short; {_retrain(drafter)}") from None
    try:
        module.load_state_dict(weights)
    except RuntimeError as err:  # missing, unexpected or misshapen tensors: torch's first line is a heading, the second says which
        detail = ([line.strip() for line in str(err).splitlines() if line.strip()][1:] or [str(err)])[0][:200]
        raise SpecResearchError(f"the weights in {path} do not fit the {drafter} module its JSON and this target describe "
                                f"({detail}): they were saved for another shape or model; {_retrain(drafter)}") from None
    return module, meta


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = (lines[0] if lines else "")[:200]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def checkpoint_record(drafter: str, path: Path, meta: dict) -> dict:
    """What the weights at `path` (meta: their JSON) record of the prompts that trained them, with
    the checkpoint: {"checkpoint", "sources", "split", "split_rule", "prompts", "prompts_sha256",
    "ids"} (specresearch.data.prompt_record). Weights trained before runs recorded it give
    {"checkpoint"} alone, with a one-line warning (once per process and file)."""
    record = meta.get("trained_on")
    if record is None:
        say_once(f"warning: the {drafter} weights at {path} do not record their training prompts (trained before that was recorded; "
                 f"they may overlap MT-bench): retrain with python -m specresearch.train drafter={drafter}")
        return {"checkpoint": str(path)}
    return {"checkpoint": str(path), **record}
