"""MkDocs hook: pages generated at build time, never pasted.

- `results/NAME.md` for every `docs/results/data/NAME.json`: a report of the one results format
  (specresearch.reports: title, date, machine, command, topic, the table, notes), whoever wrote it
  (benchmarks/speed.py --json, gpu_check.py, flagship.py, aa_calibration.py, tests/mutants.py, a hand).
  Drop such a file into the folder and it becomes a page.
- `results/index.md`: every results page, by topic (speed, batches, GPU, studies, quality, lossless),
  newest first within each.
- In any page, a line `<!-- results-table: NAME -->` becomes the table of `docs/results/data/NAME.json`
  with a link to its page (command, machine, notes): a concept page shows measured numbers without
  pasting them.
- `studies/NAME.md` for every study README: `experiments/NAME/README.md` when that folder
  exists, else `specresearch/studies/NAME/README.md`.

The Results and Studies sections of `nav` get these pages appended (on_config), so `nav` lists
every page without hand edits.
"""

from __future__ import annotations

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


# ---------------------------------------------------------------- rendering


def load(path: Path) -> dict:
    """A data file: a report of the one results format (specresearch.reports), refused in one line
    otherwise (every results page states its command and machine)."""
    return reports.checked(json.loads(path.read_text(encoding="utf-8")), str(path))


def render(data: dict, source: str) -> str:
    parts = [
        f"# {data['title']}",
        f"**Date:** {data['date']}  \n**Machine:** {data['machine']}",
    ]
    if data.get("prompts"):
        parts.append(f"**Prompts:** {data['prompts']}")
    parts.append("**Command:**\n\n```bash\n" + "\n".join(data["command"]) + "\n```")
    parts.append(markdown_table(data["columns"], data["rows"]))
    if data.get("notes"):
        parts.append("## Findings\n\n" + "\n".join(f"- {n}" for n in data["notes"]))
    if data.get("extra"):
        parts.append(data["extra"])
    parts.append(f"<small>Generated from `docs/{DATA}/{source}`.</small>")
    return "\n\n".join(parts) + "\n"


def render_index(pages: list[tuple[str, dict]]) -> str:
    lines = [
        "# Results",
        "",
        "Every table below is generated at build time from a JSON file in `docs/results/data/`",
        "(`docs/hooks/results.py`): one report per measured table (`specresearch.reports`: title, date,",
        "machine, the command that produced it, the table, findings), whatever wrote it; a report written",
        "by `benchmarks/speed.py --json` dropped into that folder becomes a page as it is. Commands use",
        "today's names (see the changelog). Timings are from one run on small CPUs unless a page says",
        "otherwise; compare numbers only within one page (one machine, one run).",
    ]
    for name in reports.TOPICS:
        chosen = [p for p in pages if p[1]["topic"] == name]
        if not chosen:
            continue
        lines += ["", f"## {TOPIC_TITLES[name]}", "", "| date | result | machine |", "|---|---|---|"]
        for stem, data in sorted(chosen, key=lambda p: (str(p[1]["date"]), p[0]), reverse=True):
            lines.append(f"| {data['date']} | [{cell(data['title'])}]({stem}.md) | {cell(data['machine'])} |")
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
    studies = [{name: f"studies/{name}.md"} for name in study_readmes(_repo_root(config))]
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
    def table(match: re.Match) -> str:
        name = match.group(1)
        path = _docs_dir(config) / DATA / f"{name}.json"
        if not path.is_file():
            raise ValueError(f"{page.file.src_uri}: <!-- results-table: {name} --> names no file {DATA}/{name}.json")
        data = load(path)
        up = "../" * page.file.src_uri.count("/")
        return (markdown_table(data["columns"], data["rows"])
                + f"\n\n<small>Measured {data['date']} ({data['machine']}); command and notes: "
                f"[{cell(data['title'])}]({up}results/{name}.md).</small>")

    return TABLE_MARK.sub(table, markdown)
