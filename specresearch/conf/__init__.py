"""The configuration registry: each group folder here (drafter/, verifier/, model/, ...) is the list
of its options, and each study folder of specresearch/studies (its `preset.yaml`) is an option of the
group `experiment`. Inside the package, so the CLI, lm-eval and the analysis find it from any folder
and from a wheel.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parent
STUDIES_DIR = CONF_DIR.parent / "studies"
STUDY_GROUP = "experiment"  # python -m specresearch experiment=NAME runs specresearch/studies/NAME/preset.yaml


def studies() -> dict[str, Path]:
    """Every study: its name (the folder's) -> its folder (preset.yaml, README.md, analysis.py, ...)."""
    return {path.parent.name: path.parent for path in sorted(STUDIES_DIR.glob("*/preset.yaml"))}


def groups() -> list[str]:
    """The config groups: the folders here (but hydra/: Hydra's own groups), and `experiment`."""
    found = [path.name for path in CONF_DIR.iterdir() if path.is_dir() and path.name not in ("hydra", "__pycache__")]
    return sorted([*found, STUDY_GROUP])


def options(group: str) -> list[str]:
    """The options of a config group (empty for a name that is no group)."""
    if group == STUDY_GROUP:
        return sorted(studies())
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def register_studies() -> None:
    """Make every study's preset the option `experiment=NAME` (a global package, as `# @package
    _global_` says in a group folder): Hydra's config store, so the preset can live in its study's
    folder beside its README and analysis. Idempotent."""
    store = ConfigStore.instance()
    for name, folder in studies().items():
        store.store(group=STUDY_GROUP, name=name, node=OmegaConf.load(folder / "preset.yaml"), package="_global_",
                    provider="specresearch")


register_studies()
