"""Published numbers (NOT measured here): a study's `published.json`, read and checked, and rendered
in tables of their own, titled "Published (not measured here): ...", never merged into a measured
column.

A study's published.json (experiments/NAME/published.json) is

    {"about": "what is here, on what setting", "references": {"key": "full citation", ...},
     "tables": {"NAME": {"about": "...", "notes": {"...": "..."}, "rows": [{..., "source": "..."}, ...]}}}

every row carrying the `source` (paper and table, or repository, file and commit) it was copied from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specresearch.analysis.format import Col, Table, text
from specresearch.analysis.report import plain
from specresearch.analysis.runs import AnalysisError

from specresearch.config import studies

FILE = "published.json"
PUBLISHED = "not measured here"
KEYS = {"about": str, "references": dict, "tables": dict}  # what a file may hold, and as what


@dataclass
class PublishedTable:
    """One published table of a study, as its file gives it."""

    about: str
    rows: list[dict]  # each with its `source`
    notes: dict[str, str] = field(default_factory=dict)  # remarks keyed by a row's name (e.g. its method)


def load(study: str) -> dict[str, PublishedTable]:
    """A study's published tables by name; {} for a study without a published.json.

    Raises:
        AnalysisError: the file is no valid JSON, or not of the shape above (names what and where).
    """
    folder = studies().get(study)
    path = folder / FILE if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise AnalysisError(f"{path}: not valid JSON ({err})") from None
    return {name: _table(path, name, value) for name, value in _checked(path, data).get("tables", {}).items()}


def _checked(path: Path, data) -> dict:
    if not isinstance(data, dict):
        raise AnalysisError(f"{path}: expected an object with keys {', '.join(KEYS)}")
    for key, value in data.items():
        if key not in KEYS:
            raise AnalysisError(f"{path}: unknown key '{key}': valid are {', '.join(KEYS)}")
        if not isinstance(value, KEYS[key]):
            raise AnalysisError(f"{path}: '{key}' must be a {KEYS[key].__name__}")
    return data


def _table(path: Path, name: str, value) -> PublishedTable:
    where = f"{path}: table '{name}'"
    if not isinstance(value, dict) or not isinstance(value.get("rows"), list):
        raise AnalysisError(f"{where}: expected an object with a list 'rows' (and 'about', 'notes')")
    unknown = set(value) - {"about", "notes", "rows"}
    if unknown:
        raise AnalysisError(f"{where}: unknown key '{sorted(unknown)[0]}': valid are about, notes, rows")
    for i, row in enumerate(value["rows"]):
        if not isinstance(row, dict) or not isinstance(row.get("source"), str) or not row["source"]:
            raise AnalysisError(f"{where}, row {i + 1}: every row is an object with its 'source'")
    return PublishedTable(str(value.get("about", "")), [dict(r) for r in value["rows"]], dict(value.get("notes", {})))


def published_table(name: str, title: str, entries: list[dict], columns: list[Col] | None = None, what: str = "") -> Table:
    """Published numbers in their own table: every column as the source gives it, the source as a
    numbered note.

    Args:
        name: the table's name (its LaTeX label).
        title: what it shows, after "Published (not measured here): ".
        entries: the rows, each with its `source`.
        columns: default: every key of the entries but `source`, in order, as given.
        what: a sentence for the caption (how to read these numbers beside ours).
    """
    sources = list(dict.fromkeys(str(e.get("source", "?")) for e in entries))
    records = [{**e, "_ref": f"[{sources.index(str(e.get('source', '?'))) + 1}]"} for e in entries]
    if columns is None:
        keys = list(dict.fromkeys(k for e in entries for k in e if k != "source"))
        columns = [Col(k, k, plain, "l") for k in keys]
    columns = columns + [Col("source", "_ref", text, "l")]
    cap = (f"Published numbers, {PUBLISHED}: copied from the sources below (other models, tasks and hardware). "
           f"{what}{len(entries)} rows.")
    return Table(name, f"Published ({PUBLISHED}): {title}", cap, columns, records,
                 notes=[f"[{i + 1}] {s}" for i, s in enumerate(sources)], published=True)
