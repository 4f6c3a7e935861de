"""The one results format: every measured table the docs render is a report of this shape, whatever
wrote it (benchmarks/speed.py --json, benchmarks/gpu_check.py, benchmarks/flagship.py,
benchmarks/aa_calibration.py, tests/mutants.py, a table written by hand). docs/results/data/NAME.json
becomes the page results/NAME.md (docs/hooks/results.py); a test holds every file there to `validate`.

A report: `title`, `date`, `machine` (processor or GPU, memory, versions), `command` (the lines that
reproduce it), `topic` (TOPICS: the results index groups by it), `columns` and `rows` (the measured
table), and optionally `prompts` (what was decoded), `notes` (findings), `extra` (Markdown after the
table) and `data` (the writer's own record, e.g. speed.py's per-method numbers with their intervals,
which other scripts read: `raw`). No machine path: paths are relative to the repository.

`of(fields, topic, data)` makes the report of a writer's own record from what its converter read off it
(benchmarks/speed_report.py for speed.py's records, benchmarks/gpu_check.py for its own), `of_script` the report
of one run of a benchmark script; stdlib only.
"""

from __future__ import annotations

import datetime
import math
import re
import shlex
from pathlib import Path
from typing import Any

from specresearch.errors import SpecResearchError

TOPICS = ("speed", "batches", "gpu", "studies", "quality", "lossless")  # the results index's sections, in its order
REQUIRED = {"title": str, "date": str, "machine": str, "command": list, "topic": str, "columns": list, "rows": list}
OPTIONAL = {"prompts": str, "notes": list, "extra": str, "data": dict}
ABSOLUTE = re.compile(r"(?<![\w.:/])(/(home|root|work|tmp|Users|private|mnt|var|opt)/[^\s\"']+|[A-Z]:\\[^\s\"']+)")


def validate(report: Any) -> list[str]:
    """What keeps `report` from being a results report (empty: nothing)."""
    if not isinstance(report, dict):
        return [f"a report is a JSON object, got {type(report).__name__}"]
    problems = [f"no {key!r}" for key in REQUIRED if key not in report]
    problems += [f"{key!r} must be a {kind.__name__}, got {type(report[key]).__name__}"
                 for key, kind in {**REQUIRED, **OPTIONAL}.items() if key in report and not isinstance(report[key], kind)]
    problems += [f"unknown key {key!r}: valid are {', '.join([*REQUIRED, *OPTIONAL])}" for key in report
                 if key not in REQUIRED and key not in OPTIONAL]
    if problems:
        return problems
    problems += [f"empty {key!r}" for key in ("title", "date", "machine", "command", "columns", "rows") if not report[key]]
    if report["topic"] not in TOPICS:
        problems.append(f"unknown topic {report['topic']!r}: valid are {', '.join(TOPICS)}")
    width = len(report["columns"])
    problems += [f"row {i} has {len(row) if isinstance(row, list) else '?'} cells, the columns {width}"
                 for i, row in enumerate(report["rows"]) if not isinstance(row, list) or len(row) != width]
    return problems


def checked(report: Any, source: str) -> dict:
    """`report` if it is one (`validate`), else a one-line SpecResearchError naming `source` and the first problem."""
    problems = validate(report)
    if problems:
        raise SpecResearchError(f"{source} is not a results report: {problems[0]}")
    return report


def raw(report: dict) -> dict:
    """The writer's own record a report carries (`data`), or the report itself when it has none."""
    return report.get("data", report)


def shown_path(path: str | Path, base: Path) -> str:
    """`path` as a report records it: relative to `base` where it lies under it, else its name alone (a
    report names no folder of the machine that wrote it)."""
    path = Path(path).expanduser().resolve()
    return path.relative_to(base.resolve()).as_posix() if path.is_relative_to(base.resolve()) else path.name


def machine_paths(text: str) -> list[str]:
    """The absolute paths of a machine in `text` (a home, /work, /tmp, a drive letter, ...)."""
    return [m.group(0) for m in ABSOLUTE.finditer(text)]


def of(fields: dict, topic: str, data: dict) -> dict:
    """The report of a writer's own record: `fields` (title, date, machine, command, columns, rows, prompts, notes,
    extra: what its converter read off the record; those empty are dropped) under `topic`, with the record as `data`."""
    return {**{k: v for k, v in fields.items() if v not in (None, "")}, "topic": topic, "data": data}


def _argument(value: Any) -> str:
    """An argument's value as the shell takes it back: a list (an nargs="+" option) as its items, each quoted."""
    items = value if isinstance(value, list | tuple) else [value]
    return " ".join(shlex.quote(str(v)) for v in items)


def of_script(script: str, args: dict[str, Any], machine: dict[str, str], title: str, **fields: Any) -> dict:
    """The report a benchmark script writes of one run: `title` and `fields` (topic, columns, rows, prompts,
    notes, data) with today's date, the machine in one line (`machine`: specresearch.models.machine_tags) and
    the command that reproduces it (benchmarks/`script` with every argument of `args` but the output, `json`)."""
    command = " ".join([f"python benchmarks/{script}", *(f"--{k} {_argument(v)}" for k, v in args.items() if k != "json")])
    return {"title": title, "date": datetime.date.today().isoformat(),
            "machine": ", ".join(f"{k.removeprefix('specresearch.')} {v}" for k, v in machine.items()),
            "command": [command], **fields}


def cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(columns: list[str], rows: list[list]) -> str:
    """A Markdown table of `rows` under `columns`."""
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
