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
