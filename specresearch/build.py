"""Objects and engines from a composed config: the one place a config becomes a target, a drafter, a
verifier and an engine (every entry point builds through here: the CLI's speed and quality runs,
training, the benchmark, lm-eval's model, a notebook), and the tags and params that say what a
measurement ran on. Heavy imports (torch, the models) happen inside the functions that need them, so
`--help` and tab completion stay fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from specresearch import settings
from specresearch.errors import SpecResearchError

if TYPE_CHECKING:
    from specresearch.engine import Engine
    from specresearch.models import LoadedModel


def build(node: DictConfig, **objects: Any) -> Any:
    """hydra.utils.instantiate, but our own errors come out as themselves, not wrapped, and runtime
    `objects` (a loaded model) reach the constructor as they are: merged into the config, Hydra
    would turn a dataclass such as LoadedModel into a config node."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, _partial_=True)(**objects) if objects else instantiate(node)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, SpecResearchError):
            raise cause from None
        raise


def build_engine(cfg: DictConfig, baseline: bool = False, target: LoadedModel | None = None) -> Engine:
    """The engine a composed config describes, or with `baseline` the target alone: the `none`
    drafter with a lossless verifier, whatever rule the method is studied with.

    Args:
        cfg: a composed config (model, drafter, verifier, sampling).
        baseline: build the baseline instead of the method.
        target: the target already loaded (baseline and method share it); None loads `cfg.model`.

    Raises:
        SpecResearchError: a config that lacks one of those nodes or strays from the settings schema
            (specresearch.settings.check_config, as the command line checks it): before any model loads.
    """
    from specresearch.drafters.none import NoDrafter
    from specresearch.engine import Engine
    from specresearch.models import load_model
    from specresearch.types import SamplingParams
    from specresearch.verifiers import lossless

    check_buildable(cfg)
    sampling = SamplingParams(**cfg.sampling)
    target = target if target is not None else load_model(**cfg.model)
    split = cfg.stats.get("time_split", "auto") if "stats" in cfg else "auto"
    if baseline:
        return Engine(target, NoDrafter(), lossless(sampling.greedy), sampling, split)
    return Engine(target, build(cfg.drafter, target=target), build(cfg.verifier), sampling, split)


ENGINE_NODES = ("model", "drafter", "verifier", "sampling")  # what build_engine reads of a config


def check_buildable(cfg: Any) -> None:
    """Refuse, in one line, a config build_engine cannot build: not a config of conf/config.yaml's
    kind (one made with OmegaConf.create or changed by assignment may lack a node or stray from the
    schema), checked as the command line checks it (specresearch.settings.check_config)."""
    if not isinstance(cfg, (DictConfig, dict)):
        raise SpecResearchError(f"build_engine() takes a config from specresearch.compose([...]), got {type(cfg).__name__}")
    missing = [node for node in ENGINE_NODES if cfg.get(node) is None]
    if missing:
        raise SpecResearchError(f"build_engine() needs a config with {', '.join(ENGINE_NODES)} (as compose([...]) makes "
                                f"it); this one has no {', '.join(missing)}")
    settings.check_config(cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg))


def claim_params(engine: Engine) -> dict[str, str]:
    """What the method claims and what it ran as, as run params (the class may change; the record
    must not): the verifier's `lossless` claim ("true" / "false"), which tests/verifiers/test_lossless.py
    proves for every drafter, and the target's dtype and device actually used (`resolved_params`)."""
    return {"verifier.lossless": str(bool(engine.verifier.lossless)).lower(), **resolved_params(engine.kv.lm)}


def resolved_params(lm: LoadedModel) -> dict[str, str]:
    """The dtype and device a model actually runs in, beside the config's `model.dtype=auto`:
    `model.dtype_used`, `model.device_used` (run params)."""
    return {"model.dtype_used": str(lm.dtype).removeprefix("torch."), "model.device_used": str(lm.device)}
