"""MkDocs hook: pages generated at build time, never pasted.

- `results/NAME.md` for every `docs/results/data/NAME.json`: a report of the one results format
  (specresearch.reports: title, date, machine, command, topic, the table, notes), whoever wrote it
  (benchmarks/speed.py --json, gpu_check.py, flagship.py, aa_calibration.py, tests/mutants.py, a hand).
  Drop such a file into the folder and it becomes a page.
- `results/index.md`: first a summary table per topic (`summaries`), a row per page with its number: the
  page's fastest method (per verifier where its table has one) with the machine's kind (`machine_kind`), its
  speedup over transformers' generate [95% interval] and τ; the battery's calibration and power pages with
  the Holm verdict's rejection rate [interval]; the law pages with their largest TV. Then every results page,
  by topic (speed, batches, GPU, studies, quality, lossless), newest first within each.
- In any page, a line `<!-- results-table: NAME -->` becomes the table of `docs/results/data/NAME.json`
  with a link to its page (command, machine, notes): a concept page shows measured numbers without
  pasting them.
- Every table it writes (`table`) fits a desktop page: a column with no value, or with one value in every
  row, is left out and said once above the table; after one repeat the spread over repeats (±, min-max) is
  left out; a method written with its overrides (`independent(k=16) lookup=4 siblings=2 ...`) shows as its
  name and a footnote number, the whole spec in its title (on hover) and in a list under the table.
  Results pages hide the table of contents (their tables need the width).
- `studies/NAME.md` for every study README: `experiments/NAME/README.md` when that folder
  exists, else `specresearch/studies/NAME/README.md`; the navigation names it by the README's title.

The Results and Studies sections of `nav` get these pages appended (on_config), so `nav` lists
every page without hand edits.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from mkdocs.structure.files import File

from specresearch import reports
from specresearch.reports import cell, markdown_table

DATA = "results/data"


# ---------------------------------------------------------------- finding the sources


def _docs_dir(config) -> Path:
    return Path(config["docs_dir"])


def _repo_root(config) -> Path:
    return Path(config["config_file_path"]).resolve().parent


def data_files(docs_dir: Path) -> list[Path]:
    return sorted((docs_dir / DATA).glob("*.json"))


def study_readmes(root: Path) -> dict[str, Path]:
    """NAME -> README.md of each study, from experiments/ after the move, else the old place."""
    for base in (root / "experiments", root / "specresearch" / "studies"):
        if base.is_dir():
            found = {p.parent.name: p for p in sorted(base.glob("*/README.md"))}
            if found:
                return found
    return {}


def study_title(readme: Path) -> str:
    """A study's title: the first `# ` heading of its README, else its folder's name."""
    for line in readme.read_text(encoding="utf-8").splitlines():
        if line.startswith("# ") and line[2:].strip():
            return line[2:].strip()
    return readme.parent.name


# ---------------------------------------------------------------- tables that fit a page

NO_VALUE = {"", "n/a", "–", "-"}  # a cell that says nothing
SPREAD = ("±", "min-max")  # the spread over repeats: nothing to show after one repeat
SPEC = re.compile(r"([\w.-]+(?:\([^()\s]*\))?\w*)(?: [\w.]+=[^\s,`]*)+")  # a method and its overrides, as speed.py labels a row
LONG = 24  # a spec longer than this shows as its name and a footnote number


def one_repeat(data: dict) -> bool:
    """Whether a report's writer timed each method once (speed.py's `args.repeats`)."""
    args = reports.raw(data).get("args")
    return isinstance(args, dict) and args.get("repeats") == 1


def compact(columns: list[str], rows: list[list], once: bool = False) -> tuple[list[str], list[list], list[str]]:
    """A table less the columns that say nothing row by row.

    Args:
        columns: the table's headers.
        rows: its rows, as many cells each as `columns`.
        once: the methods were timed once: the spread over repeats (SPREAD) is left out.

    Returns:
        The columns kept, the rows with their cells, and the lines that say what was left out: a column with
        no value in any row (NO_VALUE), a column with one value in every row of two or more (that value,
        said once), the spread after one repeat. A table whose every column would go keeps them all.
    """
    shown = [[cell(v) for v in row] for row in rows]
    same, empty, spread, keep = [], [], [], []
    for j, name in enumerate(columns):
        values = {row[j] for row in shown}
        if once and name in SPREAD:
            spread.append(cell(name))
        elif values <= NO_VALUE:
            empty.append(cell(name))
        elif len(rows) > 1 and len(values) == 1:
            same.append(f"{cell(name)} = {values.pop()}")
        else:
            keep.append(j)
    if not keep:
        return columns, rows, []
    said = [f"Same in every row: {'; '.join(same)}."] if same else []
    said += [f"No value in any row (left out): {', '.join(empty)}."] if empty else []
    said += [f"One repeat: no spread over repeats ({', '.join(spread)} left out)."] if spread else []
    return [columns[j] for j in keep], [[row[j] for j in keep] for row in rows], said


def _short(value, specs: dict[str, int]):
    """A cell, a long spec (SPEC, over LONG characters) made its method's name with a footnote number (`specs`:
    spec -> its number, filled here) and the whole spec as its title."""
    match = SPEC.fullmatch(value) if isinstance(value, str) else None
    if not match or len(value) <= LONG:
        return value
    number = specs.setdefault(value, len(specs) + 1)
    title = html.escape(value).replace("|", "&#124;")
    return f'<abbr title="{title}">{html.escape(match.group(1))}</abbr><sup>{number}</sup>'


def table(columns: list[str], rows: list[list], once: bool = False) -> str:
    """The Markdown of a measured table as the docs show it, narrow enough for a desktop page.

    Args:
        columns: the table's headers.
        rows: its rows.
        once: the methods were timed once (`one_repeat`): no spread over repeats is shown.

    Returns:
        What `compact` left out said in a line above the table, the table, and under it the whole of every
        method spec the table shortened (`_short`), numbered as its footnote marks.
    """
    columns, rows, said = compact(columns, rows, once)
    specs: dict[str, int] = {}
    rows = [[_short(v, specs) for v in row] for row in rows]
    parts = ["  \n".join(said)] if said else []
    parts.append(markdown_table(columns, rows))
    if specs:
        parts.append("Methods in full:\n\n" + "\n".join(f"{n}. `{spec}`" for spec, n in specs.items()))
    return "\n\n".join(parts)


# ---------------------------------------------------------------- the summaries of the results index

SPEEDUP = re.compile(r"(\d+(?:\.\d+)?)\s*[x×]")  # 2.51x, 1.31×
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")
INTERVAL = re.compile(r"(\d+(?:\.\d+)?)\s*[-–]\s*(\d+(?:\.\d+)?)\s*(.*)")  # 2.18-2.81, 0.003-0.014 (contains alpha)
TAU = re.compile(r"τ\s*(\d+(?:\.\d+)?)")  # a speedup cell's own τ: 1.57× (τ 6.62)
OVER_GENERATE = ("vs generate", "vs `generate`")  # the speedup the project states: over transformers' generate
PLAIN = ("speedup", "vs generate", "vs `generate`")  # a speedup column named as the summary's own
LABELS = ("drafter", "verifier")  # with `method...`: the columns that name what ran; else the first of
OTHER_LABELS = ("head", "run", "comparison")
SPEED_COLUMNS = ["method", "machine", "speedup [95% interval]", "τ", "page"]
CALIBRATION_COLUMNS = ["comparison", "machine", "Holm verdict: rejected", "rate [95% interval]", "page"]
TV_COLUMNS = ["where", "machine", "largest TV", "page"]


def machine_kind(machine: str) -> str:
    """The kind of machine a results page's machine record names: a GPU by its model (`GPU H200`), else the CPU's
    widest unit it names (AMX, AVX-512, AVX2, or `CPU`); then the dtype it names (`BF16`, `float32`), e.g.
    `AVX2 float32`, `AVX-512 BF16`, `AMX BF16`."""
    gpu = re.search(r"\bNVIDIA (\w+)", machine)
    unit = (f"GPU {gpu.group(1)}" if gpu else "AMX" if "AMX" in machine else "AVX-512" if re.search(r"AVX-?512", machine)
            else "AVX2" if "AVX2" in machine else "CPU")
    dtype = ("float32" if re.search(r"float32|fp32", machine)
             else "BF16" if re.search(r"(?<!native )\b(bfloat16|bf16)\b", machine, re.I) else "")
    return f"{unit} {dtype}".strip()


def _plain(text: str) -> str:
    return text.replace("**", "").strip()


def _label(columns: list[str], row: list[str]) -> str:
    """What a row measured: its method (and drafter, verifier) cells, else its head, run or comparison; where that
    is a number, or there is none, `column = cell` of the columns up to it."""
    named = [j for j, c in enumerate(columns) if c.startswith("method") or c in LABELS]
    named = named or [j for j, c in enumerate(columns) if c in OTHER_LABELS][:1]
    if named and not NUMBER.fullmatch(_plain(row[named[0]])):
        return " × ".join(_plain(row[j]) for j in named if row[j] not in NO_VALUE)
    last = named[0] if named else 0  # a number (a batch size, a run): named by its column and those before it
    return ", ".join(f"{columns[j]} = {_plain(row[j])}" for j in range(last + 1))


def _speedup_column(columns: list[str]) -> int | None:
    """The column of a table's speedups: over transformers' generate where it has one, else one named a
    speedup (or Overall), else the first `vs ...` or `... / generate`."""
    for wanted in (lambda c: c.startswith(OVER_GENERATE), lambda c: "speedup" in c.lower() or c == "Overall",
                   lambda c: c.startswith("vs ") or " vs " in c or c.endswith("/ generate")):
        found = [j for j, c in enumerate(columns) if wanted(c)]
        if found:
            return found[0]
    return None


def _speed_rows(stem: str, data: dict) -> list[tuple[float, list[str]]]:
    """A page's speed summary: its fastest row, or the fastest of each verifier where the table has a verifier
    column, as (speedup, row of SPEED_COLUMNS)."""
    columns, rows = data["columns"], [[cell(v) for v in row] for row in data["rows"]]
    j = _speedup_column(columns)
    if j is None:
        return []
    interval = next((i for i, c in enumerate(columns) if c.startswith("95%") and "interval" in c), None)
    tau = next((i for i, c in enumerate(columns) if c in ("τ", "tau") or c.endswith(": τ")), None)
    group = columns.index("verifier") if "verifier" in columns else None
    best: dict[str, tuple[float, list[str]]] = {}
    for row in rows:
        found = SPEEDUP.search(_plain(row[j]))
        if not found:
            continue
        speedup = float(found.group(1))
        key = row[group] if group is not None else ""
        if key in best and best[key][0] >= speedup:
            continue
        shown = f"{speedup:.2f}x"
        bounds = INTERVAL.match(_plain(row[interval])) if interval is not None and columns[j].startswith(OVER_GENERATE) else None
        shown += f" [{bounds.group(1)}, {bounds.group(2)}]" if bounds else ""
        shown += "" if columns[j] in PLAIN else f" ({columns[j]})"
        own_tau = TAU.search(row[j])
        tau_shown = _plain(row[tau]) if tau is not None else own_tau.group(1) if own_tau else ""
        best[key] = (speedup, [_label(columns, row), machine_kind(data["machine"]), shown, tau_shown, f"[{stem}]({stem}.md)"])
    return list(best.values())


def _calibration_row(stem: str, data: dict) -> list[str] | None:
    """A calibration or power page's summary (a `rejected at ...` column): its Holm verdict's row as
    CALIBRATION_COLUMNS."""
    columns, rows = data["columns"], [[cell(v) for v in row] for row in data["rows"]]
    rejected = next((j for j, c in enumerate(columns) if c.startswith("rejected at")), None)
    if rejected is None:
        return None
    row = next((r for r in rows if any("Holm" in v for v in r)), rows[0])
    rate = _plain(row[columns.index("rate")]) if "rate" in columns else ""
    interval = next((j for j, c in enumerate(columns) if c.startswith("95%") and "interval" in c), None)
    bounds = INTERVAL.match(_plain(row[interval])) if interval is not None else None
    if bounds:
        rate += f" [{bounds.group(1)}, {bounds.group(2)}]" + (f" {bounds.group(3)}" if bounds.group(3) else "")
    at = columns[rejected].removeprefix("rejected at").strip()
    label = _plain(row[columns.index("comparison")]) if "comparison" in columns else _plain(row[0])
    return [label, machine_kind(data["machine"]), f"{_plain(row[rejected])} at {at}", rate, f"[{stem}]({stem}.md)"]


def _tv_row(stem: str, data: dict) -> list[str] | None:
    """A law page's summary (a `max TV` column): its row of the largest TV as TV_COLUMNS, named by its leading
    columns of one kind (`path a` vs `path b`) or its first."""
    columns, rows = data["columns"], [[cell(v) for v in row] for row in data["rows"]]
    if "max TV" not in columns:
        return None
    j = columns.index("max TV")
    values = [(float(m.group(0)), row) for row in rows if (m := NUMBER.search(_plain(row[j])))]
    if not values:
        return None
    tv, row = max(values, key=lambda v: v[0])
    first = columns[0].split()[0]
    lead = [_plain(row[i]) for i, c in enumerate(columns[:j]) if i == 0 or (c.split() or [""])[0] == first]
    return [" vs ".join(lead), machine_kind(data["machine"]), _plain(row[j]), f"[{stem}]({stem}.md)"]


def summaries(pages: list[tuple[str, dict]]) -> list[tuple[str, list[str], list[list[str]]]]:
    """The results index's summary tables, from the pages' own data: (title, columns, rows) for the speed of
    each topic (`_speed_rows`, fastest first), the battery's calibration and power (`_calibration_row`) and the
    largest TV of the law pages (`_tv_row`), newest first; a table without rows is left out."""
    speed: dict[str, list[tuple[float, list[str]]]] = {name: [] for name in reports.TOPICS}
    calibration, tv = [], []
    for stem, data in sorted(pages, key=lambda p: (str(p[1]["date"]), p[0]), reverse=True):
        if (row := _calibration_row(stem, data)) is not None:
            calibration.append(row)
        elif (row := _tv_row(stem, data)) is not None:
            tv.append(row)
        else:
            speed[data["topic"]] += _speed_rows(stem, data)
    found = [(f"{TOPIC_TITLES[name]}: the fastest method of each page", SPEED_COLUMNS,
              [row for _, row in sorted(rows, key=lambda r: -r[0])]) for name, rows in speed.items()]
    found += [("Lossless: the battery's calibration (A/A) and power (a lossy control)", CALIBRATION_COLUMNS, calibration),
              ("Lossless: the largest total variation of each law page", TV_COLUMNS, tv)]
    return [s for s in found if s[2]]


# ---------------------------------------------------------------- rendering


def load(path: Path) -> dict:
    """A data file: a report of the one results format (specresearch.reports), refused in one line
    otherwise (every results page states its command and machine)."""
    return reports.checked(json.loads(path.read_text(encoding="utf-8")), str(path))


def render(data: dict, source: str) -> str:
    """A results page: its title, date, machine, prompts, command, table (`table`), findings and extra; the table
    of contents hidden (the width goes to the table)."""
    parts = [
        "---\nhide:\n  - toc\n---",
        f"# {data['title']}",
        f"**Date:** {data['date']}  \n**Machine:** {data['machine']}",
    ]
    if data.get("prompts"):
        parts.append(f"**Prompts:** {data['prompts']}")
    parts.append("**Command:**\n\n```bash\n" + "\n".join(data["command"]) + "\n```")
    parts.append(table(data["columns"], data["rows"], one_repeat(data)))
    if data.get("notes"):
        parts.append("## Findings\n\n" + "\n".join(f"- {n}" for n in data["notes"]))
    if data.get("extra"):
        parts.append(data["extra"])
    parts.append(f"<small>Generated from `docs/{DATA}/{source}`.</small>")
    return "\n\n".join(parts) + "\n"


def render_index(pages: list[tuple[str, dict]]) -> str:
    """The results index: the summary tables (`summaries`), then every page by topic, newest first."""
    lines = [
        "# Results",
        "",
        "Every table below is generated at build time from a JSON file in `docs/results/data/`",
        "(`docs/hooks/results.py`): one report per measured table (`specresearch.reports`: title, date,",
        "machine, the command that produced it, the table, findings), whatever wrote it; a report written",
        "by `benchmarks/speed.py --json` dropped into that folder becomes a page as it is. Commands use",
        "today's names (see the changelog). Timings are from one run on small CPUs unless a page says",
        "otherwise; compare numbers only within one page (one machine, one run).",
        "",
        "## At a glance",
        "",
        "A row per page, read off its table: the fastest method (of each verifier where the page compares",
        "them) with its speedup over transformers' `generate` where the page has one (else the speedup it",
        "names, in brackets after it), the 95% bootstrap interval over prompts where the page has one, and τ",
        "(tokens per verification); the machine is the kind its record names (GPU, or the CPU's AMX, AVX-512",
        "or AVX2, and the dtype). Pages without such a number are in the lists below.",
    ]
    for title, columns, rows in summaries(pages):
        lines += ["", f"### {title}", "", table(columns, rows)]
    lines += ["", "## Every page"]
    for name in reports.TOPICS:
        chosen = [p for p in pages if p[1]["topic"] == name]
        if not chosen:
            continue
        rows = [[data["date"], f"[{data['title']}]({stem}.md)", machine_kind(data["machine"])]
                for stem, data in sorted(chosen, key=lambda p: (str(p[1]["date"]), p[0]), reverse=True)]
        lines += ["", f"### {TOPIC_TITLES[name]}", "", table(["date", "result", "machine"], rows)]
    return "\n".join(lines) + "\n"


def render_study(name: str, readme: Path, root: Path) -> str:
    text = readme.read_text(encoding="utf-8")
    where = readme.relative_to(root).as_posix()
    return text.rstrip() + f"\n\n<small>Included at build time from `{where}`.</small>\n"


# ---------------------------------------------------------------- MkDocs events


def _fill(nav: list, title: str, entries: list) -> None:
    for item in nav:
        if isinstance(item, dict) and title in item and isinstance(item[title], list):
            present = {repr(next(iter(e.values()))) if isinstance(e, dict) else repr(e) for e in item[title]}
            item[title].extend(e for e in entries if repr(next(iter(e.values()))) not in present)


TOPIC_TITLES = {"speed": "Speed", "batches": "Batches", "gpu": "GPU", "studies": "Studies", "quality": "Quality",
                "lossless": "Lossless: law tests and calibration"}  # the sections of the index and the navigation


def on_config(config, **kwargs):
    docs = _docs_dir(config)
    sections: dict[str, list] = {name: [] for name in reports.TOPICS}  # newest first within each
    for p, data in sorted(((p, load(p)) for p in data_files(docs)), key=lambda pd: (str(pd[1]["date"]), pd[0].stem), reverse=True):
        sections[data["topic"]].append({data["title"]: f"results/{p.stem}.md"})
    results = [{TOPIC_TITLES[name]: pages} for name, pages in sections.items() if pages]
    studies = [{study_title(readme): f"studies/{name}.md"} for name, readme in study_readmes(_repo_root(config)).items()]
    if config.get("nav"):
        _fill(config["nav"], "Results", results)
        _fill(config["nav"], "Studies", studies)
    return config


def on_files(files, config, **kwargs):
    docs = _docs_dir(config)
    pages = []
    for path in data_files(docs):
        data = load(path)
        pages.append((path.stem, data))
        files.append(File.generated(config, f"results/{path.stem}.md", content=render(data, path.name)))
    files.append(File.generated(config, "results/index.md", content=render_index(pages)))
    root = _repo_root(config)
    for name, readme in study_readmes(root).items():
        files.append(File.generated(config, f"studies/{name}.md", content=render_study(name, readme, root)))
    return files


TABLE_MARK = re.compile(r"^<!-- results-table: ([\w.-]+) -->$", re.M)


def on_page_markdown(markdown, page, config, files, **kwargs):
    def measured(match: re.Match) -> str:
        name = match.group(1)
        path = _docs_dir(config) / DATA / f"{name}.json"
        if not path.is_file():
            raise ValueError(f"{page.file.src_uri}: <!-- results-table: {name} --> names no file {DATA}/{name}.json")
        data = load(path)
        up = "../" * page.file.src_uri.count("/")
        return (table(data["columns"], data["rows"], one_repeat(data))
                + f"\n\n<small>Measured {data['date']} ({data['machine']}); command and notes: "
                f"[{cell(data['title'])}]({up}results/{name}.md).</small>")

    return TABLE_MARK.sub(measured, markdown)
