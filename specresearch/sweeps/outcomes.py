"""What a sweep's job returns to Hydra (and to Optuna's sweeper) when it did not simply measure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass
class JobFailed:
    """What a sweep job returns when its experiment was refused (a SpecResearchError). Not a number:
    Optuna's sweeper records the trial as failed and goes on."""

    message: str


@dataclass
class JobSkipped:
    """What a sweep job returns when `resume` found its config already finished: that run and its
    objective's value, which Optuna's sweeper reads with float() (no finite value: a failed trial)."""

    run_id: str
    value: float | None = None

    def __float__(self) -> float:
        if self.value is None or not math.isfinite(self.value):
            raise TypeError(f"run {self.run_id} has no finite objective value")
        return float(self.value)


JOB_TAG = "specresearch.job."  # + job number, on the parent run: "finished", "skipped <run id>" or "failed: <why>"


def job_outcome(job_return: Any) -> str:
    """What became of a job, from Hydra's JobReturn: finished, skipped <run id>, or failed: <why>."""
    from hydra.core.utils import JobStatus

    value = job_return._return_value
    if job_return.status == JobStatus.FAILED:
        return f"failed: {type(value).__name__}: {value}"
    if isinstance(value, JobFailed):
        return f"failed: {value.message}"
    if isinstance(value, JobSkipped):
        return f"skipped {value.run_id}"
    return "finished"

