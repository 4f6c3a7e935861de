"""Where results go is checked before anything runs (`check_destinations`): Hydra's output folder, the
tracker's store and the model cache; a run refused before it measured anything leaves no empty output folder behind
(`discard_refused_run`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from specresearch.errors import SpecResearchError
from specresearch.tracking import write_problem

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into `hydra.output_subdir`
_MADE_FOR_RUN: list[Path] = []  # the single run's output folder and the parents Hydra makes with it, deepest first


def check_destinations(config: DictConfig, multirun: bool) -> None:
    """Before anything runs (SweepCallback.on_run_start / on_multirun_start): Hydra's output folder
    (`hydra.run.dir`, or `hydra.sweep.dir` for a sweep), the tracker's store and the model cache
    (check_model_caches) must be writable; else
    print one `error:` line naming the path and exit 2, instead of a traceback once the models have
    loaded. For a single run, note the folders Hydra is about to make for it (`discard_refused_run`).

    Args:
        config: the composed config, with its `hydra` node.
        multirun: a sweep (`-m`).
    """
    from hydra.utils import instantiate

    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        folder: Path | None = Path(os.path.abspath(str(OmegaConf.select(config, key))))
    except Exception:  # resolvable only once the job runs (`${hydra:...}`): left to Hydra
        folder = None
    try:
        problem = write_problem(folder) if folder is not None else None
        if problem is not None:
            raise SpecResearchError(f"cannot write Hydra's output folder {folder} ({key}): {problem}")
        try:
            tracker = instantiate(config.tracker) if "tracker" in config else None
        except Exception:  # a bad tracker config: settings.check refuses it in one line when the job starts
            tracker = None
        if hasattr(tracker, "check"):
            tracker.check()
        check_model_caches(config)
    except SpecResearchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if not multirun:
        _MADE_FOR_RUN[:] = [path for path in [folder, *folder.parents] if not path.exists()] if folder is not None else []


def check_model_caches(config: DictConfig) -> None:
    """The model cache a run writes to (`model.cache_dir`, else $SPECRESEARCH_CACHE or the user
    cache folder: trained heads, training data, eval baselines) and, when set, $SPECRESEARCH_CACHE
    (the speed lock's folder) must be writable (models.cache_root), before a model loads.

    Raises:
        SpecResearchError: one line naming the setting and the path.
    """
    from specresearch.models import cache_root

    try:
        cache_dir = OmegaConf.select(config, "model.cache_dir", default=None)
    except Exception:  # resolvable only once the job runs: load_model checks it then
        return
    cache_root(cache_dir)
    if cache_dir and os.environ.get("SPECRESEARCH_CACHE"):
        cache_root()


def discard_refused_run() -> None:
    """After a single run was refused before it measured anything: remove what Hydra made for it
    (the `.hydra/` files and the job log in its output folder, then that folder and the parents Hydra
    made with it, e.g. the day folder of outputs/DATE/TIME/). Only folders that did not exist before
    the run (`check_destinations`) and hold nothing else are touched; nothing in a sweep, whose job
    folders are its record of each job."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    out = Path(os.path.abspath(hc.runtime.output_dir))
    if not _MADE_FOR_RUN or _MADE_FOR_RUN[0] != out:  # the folder was there before: not ours to remove
        return
    log, sub = f"{hc.job.name}.log", hc.output_subdir
    try:
        if {path.name for path in out.iterdir()} - {log, sub}:
            return  # something else was written there (a measured run's records): keep all of it
        if sub and (out / sub).is_dir():
            if {path.name for path in (out / sub).iterdir()} - set(HYDRA_FILES):
                return
            for name in HYDRA_FILES:
                (out / sub / name).unlink(missing_ok=True)
            (out / sub).rmdir()
        (out / log).unlink(missing_ok=True)
        for folder in _MADE_FOR_RUN:
            folder.rmdir()  # fails on the first folder that holds something else: it and its parents stay
    except OSError:
        pass

