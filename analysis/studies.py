"""The studies that have tables: every study folder (specresearch.config.studies()) with an
`analysis.py`, whose `report(study: Study) -> Report` builds them. Discovery, not a list to edit:
adding a study touches only its own folder.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable

from specresearch.analysis.report import Report
from specresearch.analysis.runs import AnalysisError, Study

from specresearch.config import studies

ANALYSIS = "analysis.py"


def analysed() -> list[str]:
    """The studies with an analysis, sorted."""
    return sorted(name for name, folder in studies().items() if (folder / ANALYSIS).is_file())


def builder(name: str) -> Callable[[Study], Report]:
    """The `report` function of study `name`'s analysis.py (imported from its file).

    Raises:
        AnalysisError: no such study, or it has no analysis.py (the valid names are listed).
    """
    if name not in analysed():
        raise AnalysisError(f"unknown study '{name}': valid are {', '.join(analysed())}")
    path = studies()[name] / ANALYSIS
    module_name = f"experiments.{name}.analysis"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up there
    spec.loader.exec_module(module)
    return module.report
