"""What the sweep tests share: a fast job, a store and cache under the test's folder, the command line on them and the
store's runs."""

import subprocess

from specresearch.records import HASH_TAG
from tests.helpers import run_specresearch, specresearch_command, user_env

FAST = ["model=tiny", "drafter=pld", "dataset.num_prompts=1", "max_new_tokens=6"]


def env_for(tmp_path) -> dict[str, str]:
    return user_env(SPECRESEARCH_CACHE=str(tmp_path / "cache"))  # the speed lock lives there


def command(tmp_path, *args: str) -> list[str]:
    return specresearch_command(*args, outputs=tmp_path, store=tmp_path / "mlruns")


def cli(tmp_path, *args: str) -> subprocess.CompletedProcess:
    result = run_specresearch(*args, cwd=tmp_path, store=tmp_path / "mlruns", env=env_for(tmp_path), timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def runs(tmp_path):
    """Every run of the store: (job runs, sweep parent runs)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    experiment = client.get_experiment_by_name("specresearch")
    found = client.search_runs([experiment.experiment_id], max_results=1000)
    return [r for r in found if HASH_TAG in r.data.tags], [r for r in found if HASH_TAG not in r.data.tags]
