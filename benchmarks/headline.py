"""The headline numbers, from one source: the speedups the README and the docs' home state are written
here from committed speed reports (docs/results/data/, as benchmarks/speed.py --json writes them), so
the two pages cannot disagree and every number carries its interval, its prompts and its machine.

docs/results/headline.json names each headline: a report, a method of it (its row's whole label, or
its name up to the first space or parenthesis where that is one row's) and what it is. Each must rest
on at least MIN_PROMPTS prompts with a bootstrap interval over them (speed.py writes one for every row).
The block between

    <!-- headline: begin ... -->
    <!-- headline: end -->

in README.md and docs/index.md is replaced by the table. `--check` changes nothing and exits 1 when a
page's block is not what the data gives (the tests run it).

    python benchmarks/headline.py            # rewrite the blocks
    python benchmarks/headline.py --check    # are they current?
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from specresearch import reports

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "docs" / "results" / "headline.json"
DATA = ROOT / "docs" / "results" / "data"
PAGES = {ROOT / "README.md": "docs/results/data/{}.json", ROOT / "docs" / "index.md": "results/{}.md"}  # page -> its link to a report
MIN_PROMPTS = 8
BLOCK = re.compile(r"<!-- headline: begin[^\n]*-->\n.*?<!-- headline: end -->", re.S)
BEGIN = "<!-- headline: begin (written by `python benchmarks/headline.py` from docs/results/headline.json: edit those) -->"
DATASETS = {"humaneval": "HumanEval", "mtbench": "MT-bench", "sharegpt": "ShareGPT"}


class HeadlineError(ValueError):
    """A headline the data cannot back: one line naming the file and what is missing."""


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


def headlines() -> list[dict]:
    """Each headline of SOURCE with its numbers read from its report."""
    out = []
    for item in json.loads(SOURCE.read_text()):
        path = DATA / f"{item['report']}.json"
        if not path.is_file():
            raise HeadlineError(f"{SOURCE.name}: no report {path.relative_to(ROOT)}")
        report = reports.raw(json.loads(path.read_text()))  # the numbers speed.py wrote (the report's `data`)
        args, row = report["args"], row_of(report, item["method"], path.name)
        if args["prompts"] < MIN_PROMPTS or not row.get("speedup_interval"):
            raise HeadlineError(f"{path.name}: a headline needs >= {MIN_PROMPTS} prompts and a bootstrap interval over them "
                                f"(benchmarks/speed.py writes one); it has {args['prompts']} prompts"
                                + ("" if row.get("speedup_interval") else " and no interval"))
        ref = next(key for key in row if key.startswith("speedup_vs_") and not key.startswith("speedup_vs_baseline")
                   and not key.endswith("_interval"))
        out.append({**item, "speedup": row[ref], "interval": row["speedup_interval"], "reference": ref.removeprefix("speedup_vs_"),
                    "prompts": args["prompts"], "offset": args["offset"], "tokens": args["tokens"],
                    "dataset": DATASETS.get(args["dataset"], args["dataset"]), "machine": report["header"].split(" (")[1].split(")")[0]
                    if " (" in report["header"] else report["header"]})
    return out


def block(items: list[dict], link: str) -> str:
    """The markdown block of the headlines (a table), with a link to each report's page."""
    lines = [BEGIN, "", "| setting | speedup over transformers' `generate` | 95% interval (bootstrap over prompts) | prompts | data |",
             "|---|---|---|---|---|"]
    for h in items:
        lines.append(f"| {h['what']} | **{h['speedup']:.2f}x** | {h['interval'][0]:.2f}-{h['interval'][1]:.2f}x | "
                     f"{h['prompts']} {h['dataset']} {which(h)}, {h['tokens']} tokens | "
                     f"[{h['report']}]({link.format(h['report'])}) |")
    machines = sorted({h["machine"] for h in items})
    lines += ["", f"Measured by `benchmarks/speed.py` ({'; '.join(machines)}), every method on the same prompts in one "
              "interleaved run; settings chosen on other prompts (ShareGPT, HumanEval 100-103).", "", "<!-- headline: end -->"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a page's block is not current")
    args = parser.parse_args(argv)
    try:
        items = headlines()
    except (HeadlineError, KeyError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    stale = []
    for page, link in PAGES.items():
        text = page.read_text(encoding="utf-8")
        if not BLOCK.search(text):
            print(f"error: {page.relative_to(ROOT)} has no <!-- headline: begin --> ... <!-- headline: end --> block", file=sys.stderr)
            return 2
        new = BLOCK.sub(lambda _: block(items, link), text)
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if not args.check:
                page.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"not current: {', '.join(stale)} (python benchmarks/headline.py rewrites them)", file=sys.stderr)
        return 1
    print("current" if args.check else f"wrote {', '.join(stale) or 'nothing (current)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
