"""Experiment tracking: MLflow with a local store that needs no server, or nothing (`tracker=none`).

A sweep (`python -m specresearch -m ...`) gets one parent run, opened by `SweepCallback`, with one
nested run per job.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omegaconf import DictConfig, OmegaConf

PARENT_RUN_ENV = "SPECRESEARCH_MLFLOW_PARENT_RUN_ID"


class Tracker(Protocol):
    """Where a run's config, metrics and records go."""

    def start(self, cfg: DictConfig, run_name: str | None = None) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact_text(self, text: str, name: str) -> None: ...
    def end(self, status: str = "FINISHED") -> None: ...
    def browse_hint(self) -> str | None: ...


class NullTracker:
    """Records nothing (tests, quick tries)."""

    def __init__(self, **_):
        pass

    def start(self, cfg: DictConfig, run_name: str | None = None) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_artifact_text(self, text: str, name: str) -> None:
        pass

    def end(self, status: str = "FINISHED") -> None:
        pass

    def browse_hint(self) -> str | None:
        return None


class MLflowTracker:
    """MLflow on a local sqlite store, artifacts beside it under an absolute path.

    Args:
        store: folder holding `mlflow.db` and `artifacts/` (relative paths resolve from the cwd).
        experiment: MLflow experiment name.
    """

    def __init__(self, store: str = "mlruns", experiment: str = "specresearch"):
        self.store = Path(store).expanduser().resolve()
        self.experiment = experiment
        self.uri = f"sqlite:///{self.store / 'mlflow.db'}"
        self.run_id: str | None = None

    def _mlflow(self):
        import mlflow  # ~2 s: only when a run is really tracked

        self.store.mkdir(parents=True, exist_ok=True)
        mlflow.set_tracking_uri(self.uri)
        return mlflow

    def _experiment_id(self, mlflow) -> str:
        found = mlflow.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        location = (self.store / "artifacts" / self.experiment).as_uri()
        return mlflow.create_experiment(self.experiment, artifact_location=location)

    def start(self, cfg: DictConfig, run_name: str | None = None) -> None:
        """Open the run (nested under a sweep's parent run if there is one) and log every config
        value as a flat param, and the resolved config as `config.yaml`."""
        mlflow = self._mlflow()
        parent = os.environ.get(PARENT_RUN_ENV)
        run = mlflow.start_run(
            experiment_id=self._experiment_id(mlflow), run_name=run_name, parent_run_id=parent, nested=bool(parent)
        )
        self.run_id = run.info.run_id
        mlflow.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
        mlflow.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import mlflow

        mlflow.log_metrics({k.replace("@", "_at_"): float(v) for k, v in metrics.items()}, step=step)  # MLflow refuses '@' (pass@1)

    def log_artifact_text(self, text: str, name: str) -> None:
        import mlflow

        mlflow.log_text(text, name)

    def end(self, status: str = "FINISHED") -> None:
        import mlflow

        mlflow.end_run(status=status)

    def browse_hint(self) -> str:
        return f"mlflow ui --backend-store-uri {self.uri}"

    def start_parent(self, name: str) -> str:
        """Open a sweep's parent run; jobs find its id in the environment."""
        mlflow = self._mlflow()
        run = mlflow.start_run(experiment_id=self._experiment_id(mlflow), run_name=name)
        os.environ[PARENT_RUN_ENV] = run.info.run_id
        return run.info.run_id

    def end_parent(self, status: str) -> None:
        """Close the sweep's parent run with `status`, whatever run is active now."""
        mlflow = self._mlflow()
        run_id = os.environ.pop(PARENT_RUN_ENV)
        mlflow.MlflowClient().set_terminated(run_id, status=status)
        if mlflow.active_run() is not None and mlflow.active_run().info.run_id == run_id:
            mlflow.end_run(status=status)


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """{"a": {"b": 1}} → {"a.b": "1"}: MLflow params are flat strings."""
    if isinstance(tree, dict):
        out: dict[str, str] = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    value = json.dumps(tree) if isinstance(tree, list) else str(tree)
    return {prefix[:-1]: value}


try:  # Hydra's callback base class; the callback is configured in conf/config.yaml
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover
    Callback = object


@dataclass
class JobFailed:
    """What a sweep job returns when its experiment was refused (a SpecResearchError)."""

    message: str


class SweepCallback(Callback):
    """Opens one MLflow parent run per multirun sweep and closes it at the end: FINISHED when every
    job finished, FAILED (and exit code 2) when any failed. The other jobs of a sweep go on after
    one fails; a parent left open by a crash is closed as FAILED when the process exits."""

    def __init__(self) -> None:
        self.tracker: MLflowTracker | None = None
        self.jobs = 0
        self.failed: list[int] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.utils import instantiate

        tracker = instantiate(config.tracker)
        if isinstance(tracker, MLflowTracker):
            self.tracker = tracker
            tracker.start_parent(name=f"sweep {Path(config.hydra.sweep.dir).name}")
            atexit.register(self._close, "FAILED")

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        from hydra.core.utils import JobStatus

        self.jobs += 1
        if job_return.status == JobStatus.FAILED or isinstance(job_return._return_value, JobFailed):
            self.failed.append(config.hydra.job.num)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._close("FAILED" if self.failed else "FINISHED")
        if self.failed:
            print(f"{len(self.failed)} of {self.jobs} jobs failed (job numbers {self.failed})", file=sys.stderr)
            sys.exit(2)

    def _close(self, status: str) -> None:
        if self.tracker is None:
            return
        tracker, self.tracker = self.tracker, None
        tracker.end_parent(status)
        print(f"sweep recorded as one parent run ({status}); browse it with: {tracker.browse_hint()}")
