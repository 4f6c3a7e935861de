"""The headline numbers, from one source: the speedups the README and the docs' home state are written
here from committed speed reports (docs/results/data/, as benchmarks/speed.py --json writes them), so
the two pages cannot disagree and every number carries its interval, its prompts and its machine.

docs/results/headline.json names each headline: a report, a method of it (its row's whole label, or
its name up to the first space or parenthesis where that is one row's), what it is, and the kind of CPU
it was measured on (`specresearch.models.machine.cpu_kind`: speed ratios differ by kind), and whether
a run on that kind says it as what to expect there ("expect": true). Each must rest on at least
MIN_PROMPTS prompts with a bootstrap interval over them (speed.py writes one for every row). The
tables come one per CPU kind, a kind without headlines said so. The block between

    <!-- headline: begin ... -->
    <!-- headline: end -->

in README.md and docs/index.md is replaced by the tables, and specresearch/assets/held_out.json (what
a speed run reads to say what to expect on its machine: specresearch.measure.runner) is written with the
headlines marked "expect". `--check` changes nothing and exits 1 when a page's block or that file is
not what the data gives (the tests run it). Every input is checked before a page is
written: a bad one is refused in one line (exit 2) and leaves both pages as they were; a text that
reaches the table is one line without a marker comment or a '|', so it cannot end the block early or
split a row.

    python benchmarks/headline.py            # rewrite the blocks
    python benchmarks/headline.py --check    # are they current?
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from specresearch import reports
from specresearch.errors import SpecResearchError
from specresearch.models.machine import CPU_KINDS

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "docs" / "results" / "headline.json"
DATA = ROOT / "docs" / "results" / "data"
README, INDEX = ROOT / "README.md", ROOT / "docs" / "index.md"
EXPECT = ROOT / "specresearch" / "assets" / "held_out.json"
PAGES = {README: "docs/results/data/{}.json", INDEX: "results/{}.md"}  # page -> its link to a report
MIN_PROMPTS = 8
BLOCK = re.compile(r"<!-- headline: begin[^\n]*-->\n.*?<!-- headline: end -->", re.S)
BEGIN = "<!-- headline: begin (written by `python benchmarks/headline.py` from docs/results/headline.json: edit those) -->"
DATASETS = {"humaneval": "HumanEval", "mtbench": "MT-bench", "sharegpt": "ShareGPT"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a report's name: its file in DATA, never a path out of it
UNSAFE = ("<!--", "-->", "|")  # in a table cell: a marker ends or starts a block, a '|' splits the row
MISSING = object()  # a key the input lacks (None is a value JSON can hold)


class HeadlineError(SpecResearchError):
    """A headline the data cannot back: one line naming the file, the field and what it must be."""


def shown(path: Path) -> str:
    """`path` as a message names it: relative to the checkout where it lies in it, else whole."""
    path = Path(path).absolute()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def brief(value: object) -> str:
    """`value` as a message quotes it: on one line (repr escapes a newline), cut to 60 characters."""
    text = "missing" if value is MISSING else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load(path: Path, expected: str) -> object:
    """The JSON in `path`, or a HeadlineError naming it and `expected` when it cannot be read or is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise HeadlineError(f"{shown(path)}: cannot read it ({err.strerror}); expected {expected}") from None
    except UnicodeDecodeError:
        raise HeadlineError(f"{shown(path)}: not UTF-8 text; expected {expected}") from None
    except json.JSONDecodeError as err:
        raise HeadlineError(f"{shown(path)}: not JSON ({err.msg} at line {err.lineno}); expected {expected}") from None


def text(value: object, where: str, field: str) -> str:
    """`value` when it is a text a table cell can hold: one printable line, not empty, no marker comment, no '|'."""
    if not isinstance(value, str) or not value.strip() or not value.isprintable() or any(s in value for s in UNSAFE):
        raise HeadlineError(f"{where}: {field} must be one line of text without '<!--', '-->' or '|' (it is {brief(value)})")
    return value


def number(value: object, where: str, field: str, integer: bool = False) -> float:
    """`value` when it is a finite number (an integer where `integer`); JSON's true and false are not numbers."""
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or not math.isfinite(value):
        raise HeadlineError(f"{where}: {field} must be {'an integer' if integer else 'a number'} (it is {brief(value)})")
    return value


def entries(source: Path) -> list[dict]:
    """The headlines `source` lists, each checked: a non-empty list of {what, report, method}."""
    expected = 'a non-empty JSON list of headlines {"what": ..., "report": ..., "method": ...}'
    items = load(source, expected)
    if not isinstance(items, list) or not items:
        raise HeadlineError(f"{shown(source)}: expected {expected} (it is {brief(items)})")
    for i, item in enumerate(items, 1):
        where = f"{shown(source)}, headline {i}"
        if not isinstance(item, dict):
            raise HeadlineError(f"{where}: expected an object {{\"what\", \"report\", \"method\"}} (it is {brief(item)})")
        text(item.get("what", MISSING), where, "'what'")
        report = item.get("report", MISSING)
        if not isinstance(report, str) or not NAME.fullmatch(report):
            raise HeadlineError(f"{where}: 'report' must be the name of a report in docs/results/data (letters, digits, '.', '_', "
                                f"'-'; no folder) (it is {brief(report)})")
        method = item.get("method", MISSING)
        if not isinstance(method, str) or not method.strip():
            raise HeadlineError(f"{where}: 'method' must be a method of the report's rows (it is {brief(method)})")
        kind = item.get("kind", MISSING)
        if kind not in CPU_KINDS:
            raise HeadlineError(f"{where}: 'kind' must be the kind of CPU the report was measured on, one of "
                                f"{', '.join(CPU_KINDS)} (it is {brief(kind)})")
        if not isinstance(item.get("expect", False), bool):
            raise HeadlineError(f"{where}: 'expect' must be true or false (it is {brief(item['expect'])})")
    return items


def which(h: dict) -> str:
    """Which prompts a headline decoded: MT-bench's question of each category, or HumanEval's first problem."""
    return f"(question #{h['offset']} of each category)" if h["dataset"] == "MT-bench" else f"from #{h['offset']}"


def row_of(report: dict, method: str, name: str) -> dict:
    """The row of `report` whose method is `method`: its whole label ("independent(k=16)"), or else its name up
    to the first space or parenthesis ("independent")."""
    rows = [r for r in report.get("rows", []) if r["method"] == method] or \
        [r for r in report.get("rows", []) if re.split(r"[ (]", r["method"], maxsplit=1)[0] == method]
    if len(rows) != 1:
        found = sorted({re.split(r"[ (]", r["method"], maxsplit=1)[0] for r in report.get("rows", [])})
        raise HeadlineError(f"{name}: {len(rows)} rows of method '{method}' (one needed); its methods: {', '.join(found)}")
    return rows[0]


def numbers(item: dict, path: Path) -> dict:
    """The numbers of `item`'s row in its report at `path` (speed.py's record), each checked."""
    name, expected = shown(path), "a report benchmarks/speed.py --json writes"
    report = load(path, expected)
    report = reports.raw(report) if isinstance(report, dict) else report  # the numbers speed.py wrote (the report's `data`)
    if not isinstance(report, dict):
        raise HeadlineError(f"{name}: expected {expected}, a JSON object (it is {brief(report)})")
    args, rows, header = (report.get(key, MISSING) for key in ("args", "rows", "header"))
    if not isinstance(args, dict):
        raise HeadlineError(f"{name}: 'args' must be an object of speed.py's arguments (it is {brief(args)})")
    prompts = number(args.get("prompts", MISSING), name, "args.prompts", integer=True)
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) and isinstance(r.get("method"), str) for r in rows):
        raise HeadlineError(f"{name}: 'rows' must be a list of speed.py's rows, each with its 'method' (it is {brief(rows)})")
    row = row_of(report, item["method"], path.name)
    where = f"{name}, row '{row['method']}'"
    if prompts < MIN_PROMPTS or not row.get("speedup_interval"):
        raise HeadlineError(f"{path.name}: a headline needs >= {MIN_PROMPTS} prompts and a bootstrap interval over them "
                            f"(benchmarks/speed.py writes one); it has {prompts} prompts"
                            + ("" if row.get("speedup_interval") else " and no interval"))
    interval = row["speedup_interval"]
    if not isinstance(interval, list) or len(interval) != 2:
        raise HeadlineError(f"{where}: 'speedup_interval' must be [low, high], two numbers (it is {brief(interval)})")
    low, high = (number(x, where, "'speedup_interval'") for x in interval)
    if low > high:
        raise HeadlineError(f"{where}: 'speedup_interval' must be [low, high] with low <= high (it is {brief(interval)})")
    ref = next((key for key in row if key.startswith("speedup_vs_") and not key.startswith("speedup_vs_baseline")
                and not key.endswith("_interval")), None)
    if ref is None:
        raise HeadlineError(f"{where}: no 'speedup_vs_<reference>' (the speedup over generate, a number; speed.py writes it)")
    if not isinstance(header, str):
        raise HeadlineError(f"{name}: 'header' must be speed.py's one-line header (it is {brief(header)})")
    dataset = args.get("dataset", MISSING)
    machine = header.split(" (")[1].split(")")[0] if " (" in header else header
    stated = next((kind for kind in CPU_KINDS if machine.endswith(" " + kind)), None)  # speed.py names the kind since 2026-12-03
    if stated is not None and stated != item["kind"]:
        raise HeadlineError(f"{name}: its header says it ran on an {stated} CPU; the headline names {item['kind']}")
    return {"speedup": number(row[ref], where, f"'{ref}'"), "interval": [low, high], "reference": ref.removeprefix("speedup_vs_"),
            "prompts": prompts, "offset": number(args.get("offset", MISSING), name, "args.offset", integer=True),
            "tokens": number(args.get("tokens", MISSING), name, "args.tokens", integer=True),
            "dataset": text(DATASETS.get(dataset, dataset) if isinstance(dataset, str) else dataset, name, "args.dataset"),
            "machine": text(machine, name, "the machine in 'header'"), "stated": stated,
            "model": header.split(" <- ")[0].split(" (")[0]}


def headlines(source: Path | None = None, data: Path | None = None) -> list[dict]:
    """Each headline of `source` (SOURCE) with its numbers read from its report in `data` (DATA), every input checked.

    Args:
        source: the list of headlines (docs/results/headline.json).
        data: the folder of the reports they name.

    Returns:
        Each headline: its entry of `source` with its report's numbers (speedup, interval, prompts, machine, ...).
    """
    source, data = SOURCE if source is None else source, DATA if data is None else data
    out = []
    for item in entries(source):
        path = data / f"{item['report']}.json"
        if not path.is_file():
            raise HeadlineError(f"{shown(source)}: no report {shown(path)} (its 'report' names a file of {shown(data)})")
        out.append({**item, **numbers(item, path)})
    return out


def block(items: list[dict], link: str) -> str:
    """The markdown block of the headlines: a table per CPU kind (a kind without headlines says so), with a link
    to each report's page."""
    lines = [BEGIN, ""]
    for kind, dtype in CPU_KINDS.items():
        mine = [h for h in items if h["kind"] == kind]
        lines.append(f"**CPUs with {kind}** (`dtype=auto` runs {dtype} there)" + ("" if mine else
                     ": not measured on held-out prompts at today's settings yet; `python benchmarks/speed.py` measures "
                     "every method on yours, and `python benchmarks/new_kind.py` on such a CPU measures its rows for this headline."))
        if not mine:
            lines.append("")
            continue
        lines += ["", "| setting | speedup over transformers' `generate` | 95% interval (bootstrap over prompts) | prompts | data |",
                  "|---|---|---|---|---|"]
        for h in mine:
            lines.append(f"| {h['what']} | **{h['speedup']:.2f}x** | {h['interval'][0]:.2f}-{h['interval'][1]:.2f}x | "
                         f"{h['prompts']} {h['dataset']} {which(h)}, {h['tokens']} tokens | "
                         f"[{h['report']}]({link.format(h['report'])}) |")
        machines = sorted({h["machine"] if h["stated"] else f"{h['machine']} in {h['report']}, whose header names no CPU kind "
                           f"(speed.py names it since 2026-12-03): filed as {kind} by headline.json" for h in mine})
        lines += ["", f"Measured by `benchmarks/speed.py` ({'; '.join(machines)}).", ""]
    lines += ["Each report ran every method on the same prompts in one interleaved run; settings were chosen on other prompts "
              "(ShareGPT, HumanEval 100-103). Compare rows of one report: the ratios of two reports come from different days "
              "and code. A speed run on the default target prints its CPU kind's numbers as what to expect.", "",
              "<!-- headline: end -->"]
    return "\n".join(lines)


def expected(items: list[dict]) -> str:
    """specresearch/assets/held_out.json's text: the headlines marked "expect", each with its model and CPU kind (what a
    speed run of that model on a CPU of that kind says to expect: specresearch.measure.runner.what_to_expect)."""
    keep = ("what", "model", "kind", "speedup", "interval", "prompts", "dataset", "offset", "tokens", "report")
    return json.dumps({"written by": "python benchmarks/headline.py, from docs/results/headline.json: edit that",
                       "headlines": [{key: h[key] for key in keep} for h in items if h.get("expect")]}, indent=1) + "\n"


def page_text(page: Path) -> str:
    """The text of `page`, which must hold a headline block."""
    try:
        text = page.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise HeadlineError(f"cannot read {shown(page)} ({getattr(err, 'strerror', None) or 'not UTF-8 text'})") from None
    if not BLOCK.search(text):
        raise HeadlineError(f"{shown(page)} has no <!-- headline: begin --> ... <!-- headline: end --> block")
    return text


def unwritable(page: Path) -> str | None:
    """Why `page` cannot be written, or None when it can: opened to append, nothing written (a read-only file,
    folder or mount refuses here, before any page changes)."""
    try:
        with open(page, "a", encoding="utf-8"):
            pass
    except OSError as err:
        return f"cannot write {shown(page)} ({err.strerror}); nothing was written"
    return None


def main(argv: list[str] | None = None) -> int:
    """Write (or with --check, compare) the headline block of README.md and docs/index.md.

    Args:
        argv: the command line's arguments (sys.argv[1:] when None).

    Returns:
        0: the pages are current (or were written); 1: --check found one stale; 2: an input was refused
        (one line on stderr; no page changed).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page's block is not current")
    parser.add_argument("--source", type=Path, default=SOURCE, help="the list of headlines (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DATA, help="the folder of the reports it names (default: %(default)s)")
    parser.add_argument("--readme", type=Path, default=README, help="the README whose block is written (default: %(default)s)")
    parser.add_argument("--index", type=Path, default=INDEX, help="the docs' home whose block is written (default: %(default)s)")
    parser.add_argument("--expect", type=Path, default=EXPECT, help="what a run says to expect, written (default: %(default)s)")
    args = parser.parse_args(argv)
    pages = {args.readme: PAGES[README], args.index: PAGES[INDEX]}
    try:  # every input read and checked before any page is written
        items = headlines(args.source, args.data)
        old = {page: page_text(page) for page in pages}
    except HeadlineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    new = {page: BLOCK.sub(lambda _, link=link: block(items, link), old[page]) for page, link in pages.items()}
    old[args.expect] = args.expect.read_text(encoding="utf-8", errors="replace") if args.expect.is_file() else None
    new[args.expect] = expected(items)
    stale = [page for page in new if new[page] != old[page]]
    if args.check:
        if stale:
            print(f"not current: {', '.join(map(shown, stale))} (python benchmarks/headline.py rewrites them)", file=sys.stderr)
            return 1
        print("current")
        return 0
    for page in stale:
        if problem := unwritable(page):
            print(f"error: {problem}", file=sys.stderr)
            return 2
    for page in stale:
        try:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new[page])
        except OSError as err:
            print(f"error: cannot write {shown(page)} ({err.strerror})", file=sys.stderr)
            return 2
    print(f"wrote {', '.join(map(shown, stale)) or 'nothing (current)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
