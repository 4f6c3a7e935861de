"""The fixtures every test can ask for and the hooks; what the tests share besides lives in tests/helpers.py
(the command line, configs, stores) and tests/tiny.py (the tiny models)."""

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.helpers import made_once
from tests.tiny import tiny_model

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n N`: N workers share the cores, one thread each (their subprocesses too)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

REAL_MODELS = ("smollm2", "smollm2_twice")  # fixtures that load a real (zoo) model


def pytest_collection_modifyitems(items):
    """A test that loads a real model is an end-to-end one (`-m "not e2e"` leaves it out)."""
    for item in items:
        if any(name in getattr(item, "fixturenames", ()) for name in REAL_MODELS):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True, scope="session")
def _offline(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    # The tests' speed jobs time tiny models: they take a lock of their own, not the machine's (a
    # user's study holding ~/.cache/specresearch/speed.lock would stall the suite).
    os.environ["SPECRESEARCH_SPEED_LOCK"] = str(tmp_path_factory.mktemp("lock") / "speed.lock")

@pytest.fixture(scope="session")
def new_store(tmp_path_factory) -> Callable[[Path], Path]:
    """`new_store(folder)`: `folder` made an empty MLflow store as a first run leaves it (created and
    migrated), and returned. MLflow migrates a new sqlite database through its whole schema history
    (about 2 s a store); here that happens once per test run and each store gets a copy. For tests of
    what runs record: the tests of a store's making (two runs on a new store, refusals, a file that is
    no MLflow database) start from nothing."""

    def make(folder: Path) -> None:
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db").search_experiments()

    template = made_once(tmp_path_factory, "mlflow-template", make) / "mlflow.db"

    def store(folder: Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "mlflow.db").exists():
            shutil.copyfile(template, folder / "mlflow.db")
        return folder

    return store

@pytest.fixture(scope="module")
def target():
    """The tiny target model (seed 0, 320 tokens), one per test module."""
    return tiny_model()


@pytest.fixture(scope="module")
def close_draft():
    """A noise-perturbed copy of the target (noise 0.01): accepts some drafts and rejects others."""
    return tiny_model(noise=0.01, noise_seed=5)


@pytest.fixture(scope="module")
def far_draft():
    """A more perturbed copy (noise 0.03): about 30% of sampled drafts are rejected, exercising the residual."""
    return tiny_model(noise=0.03, noise_seed=5)
