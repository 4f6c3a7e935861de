"""The trackers' settings (the `tracker` group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from specresearch.errors import SpecResearchError
from specresearch.options import Options, given, setting


@dataclass
class Tracker(Options):
    """The base of the trackers' settings."""
    group: ClassVar[str] = "tracker"
    builds: ClassVar[bool] = True


@dataclass
class MLflow(Tracker):
    """MLflow on a local sqlite store (no server): ./mlruns/mlflow.db, artifacts in ./mlruns/artifacts."""
    option: ClassVar[str] = "mlflow"
    store: str = setting("mlruns", "the local store's folder")
    experiment: str = setting("specresearch", "the MLflow experiment")
    uri: Optional[str] = setting(None, "a tracking server instead of the local store, e.g. http://head:5000 (for Ray "
                                       "workers on other machines)")

    def check_ranges(self, path: str) -> None:
        for key in ("store", "experiment"):
            value = getattr(self, key)
            if given(value) and not str(value).strip():
                raise SpecResearchError(f"{path}.{key} must be a non-empty name, got {value!r}")


@dataclass
class NoTracker(Tracker):
    """Record nothing (tests, quick tries)."""
    option: ClassVar[str] = "none"
