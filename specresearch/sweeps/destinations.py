"""Where results go is checked before anything runs (`check_destinations`): Hydra's output folder,
the tracker's store and the model cache; a run refused before it measured anything leaves no empty output folder behind
(`discard_refused_run`). A time-stamped output folder (Hydra's default) is each run's own (`claim_folder`)."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from specresearch.errors import SpecResearchError, fail, write_problem

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")  # what Hydra writes into `hydra.output_subdir`
_MADE_FOR_RUN: list[Path] = []  # the single run's output folder and the parents Hydra makes with it, deepest first


def check_destinations(config: DictConfig, multirun: bool) -> None:
    """Before anything runs (SweepCallback.on_run_start / on_multirun_start): Hydra's output folder
    (`hydra.run.dir`, or `hydra.sweep.dir` for a sweep), the tracker's store and the model cache
    (check_model_caches) must be writable; else
    print one `error:` line naming the path and exit 2, instead of a traceback once the models have
    loaded. A time-stamped folder (Hydra's default outputs/DATE/TIME) is then claimed for this run
    (`claim_folder`: TIME-1, -2, ... when a run started in the same second has it). For a single run,
    note the folders made for it (`discard_refused_run`).

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
        except Exception:  # a bad tracker config: settings.check_config refuses it in one line when the job starts
            tracker = None
        if hasattr(tracker, "check_reachable"):
            tracker.check_reachable()
        check_model_caches(config)
        if folder is not None and stamped(config, key):
            missing = [path for path in folder.parents if not path.exists()]
            folder = claim_folder(folder)
            _set_folder(config, key, folder, multirun)
            made = [folder, *(path for path in folder.parents if path in missing)]
        else:
            made = [path for path in [folder, *folder.parents] if not path.exists()] if folder is not None else []
    except SpecResearchError as err:
        fail(str(err))
    if not multirun:
        _MADE_FOR_RUN[:] = made


def stamped(config: DictConfig, key: str) -> bool:
    """Whether the folder `key` names is time-stamped (`${now:...}`, as Hydra's default
    outputs/DATE/TIME is): two runs started in the same second would share it."""
    node, _, leaf = key.rpartition(".")
    return "${now:" in str(OmegaConf.to_container(OmegaConf.select(config, node), resolve=False).get(leaf, ""))


def claim_folder(folder: Path) -> Path:
    """Make `folder` (with its missing parents), or `folder`-1, -2, ... when another run made it
    already: os.mkdir is atomic, so two processes never get one folder. Returns the folder made.

    Raises:
        SpecResearchError: it cannot be made (named, in one line).
    """
    problem = write_problem(folder.parent)
    if problem:
        raise SpecResearchError(f"cannot make Hydra's output folder {folder}: {problem}")
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        claimed, n = folder, 0
        while not _made(claimed):
            n += 1
            claimed = folder.with_name(f"{folder.name}-{n}")
    except OSError as err:
        raise SpecResearchError(f"cannot make Hydra's output folder {folder}: {err.strerror or err}") from None
    return claimed


def _made(folder: Path) -> bool:
    """Make `folder`; False when it exists already."""
    try:
        folder.mkdir()
    except FileExistsError:
        return False
    return True


def _set_folder(config: DictConfig, key: str, folder: Path, multirun: bool) -> None:
    """Set `key` to the claimed folder in the config Hydra runs with, and for a sweep in its
    overrides too, from which Hydra composes every job's config (on other processes and machines too)."""
    with read_write(config.hydra), open_dict(config.hydra):
        OmegaConf.update(config, key, str(folder), merge=False)
        if multirun:
            quoted = str(folder).replace("\\", "\\\\").replace("'", "\\'")
            config.hydra.overrides.hydra.append(f"{key}='{quoted}'")


def check_model_caches(config: DictConfig) -> None:
    """The model cache a run writes to (`model.cache_dir`, else $SPECRESEARCH_CACHE or the user
    cache folder: trained heads, training data, eval baselines) and, when set, $SPECRESEARCH_CACHE
    (the speed lock's folder) must be writable (models.cache_root), before a model loads. A model
    from a local folder (`model.name` a directory) with no `model.cache_dir` is loaded from there
    alone: the cache is not looked up first (a drafter that keeps files there asks for it then).

    Raises:
        SpecResearchError: one line naming the setting and the path.
    """
    from specresearch.models import cache_root

    try:
        cache_dir = OmegaConf.select(config, "model.cache_dir", default=None)
        name = OmegaConf.select(config, "model.name", default=None)
    except Exception:  # resolvable only once the job runs: load_model checks it then
        return
    if cache_dir or not (isinstance(name, str) and Path(name).expanduser().is_dir()):
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

