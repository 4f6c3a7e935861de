import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
ROOT = CONF_DIR.parent

# Tiny models for both target and draft, so composing the default config needs no real model.
TINY = ["model=tiny", "drafter.model.name=tiny", "+drafter.model.tiny={vocab_size: 320, seed: 0, noise: 0.03}"]


def make_cfg(*overrides: str):
    """Compose conf/config.yaml with overrides, as `python -m specresearch` would."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture(autouse=True, scope="session")
def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def equivalence_report(engine, prompt: list[int], n: int = 300, length: int = 5, seed: int = 50, alpha: float = 1e-3):
    """The battery on `n` samples of `length` tokens from a sampling engine against as many from its
    target alone (tiny models; fixed seeds)."""
    from specresearch.stats import battery, sample_engine, sample_target, teacher_force

    target, sampling = engine.target.lm, engine.sampling
    meth = sample_engine(engine, prompt, n, length, seed=seed)
    base = sample_target(target, prompt, n, length, sampling, seed=seed + 1)
    return battery(base, teacher_force(target, prompt, base.tokens, sampling, seed=1),
                   meth, teacher_force(target, prompt, meth.tokens, sampling, seed=2), alpha=alpha, bootstrap=0)
