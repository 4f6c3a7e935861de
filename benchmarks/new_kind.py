"""A CPU kind the headline has no numbers for, measured by one resumable command: the runbook of docs/benchmarks.md
("A CPU kind not measured yet") as steps, each writing its report to docs/results/data/DATE-NAME.json.

A step whose report is there already (written on any day) is skipped, so a run that was stopped, or outlived a
session, goes on where it stopped when started again; a step that fails stops the run (it wrote no report; the steps
before it keep theirs). Once both held-out reports are there, the headline rows of this kind are added to
docs/results/headline.json, one for each headline of another kind whose method the new report of its dataset
measured (the default on code and on chat, marked "expect"; Medusa; assisted generation), and headline.py writes
the README's and the docs' tables. Measure on a quiet machine, one command at a time: the run says the load it
starts at.

    python benchmarks/new_kind.py --dry                  # the steps, their commands and which are done; nothing runs
    python benchmarks/new_kind.py                        # every step not done (hours on a 2-core AVX2 CPU), then the headline
    python benchmarks/new_kind.py --only kernel-costs    # some steps (names as --dry lists them, without the kind)
    python benchmarks/new_kind.py --dry --kind AVX2      # another kind's steps (measuring takes the machine's own kind)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "benchmarks") not in sys.path:  # loaded from its file (the tests), not run: its sibling below
    sys.path.insert(1, str(ROOT / "benchmarks"))
import headline  # noqa: E402  (benchmarks/headline.py: the headline tables, from the reports)

from specresearch import reports  # noqa: E402
from specresearch.models.machine import CPU_KINDS, cpu_kind  # noqa: E402

SLUGS = {"AMX": "amx", "AVX-512 BF16": "avx512bf16", "AVX2": "avx2"}  # a kind in report names
DTYPES = {"float32": "fp32", "bfloat16": "bf16"}
BATTERY = ("drafter=plain_chain verifier=rejection sampling=random sampling.temperature=0.7 dataset=humaneval "
           "dataset.offset=156")  # the study's lossless cell on the real pair (battery_rates.py's default)
TUNED = "generate,independent,independent:shape=null:chain_confidence=0.4"  # the default's stop against the constant one
HELD_OUT = "generate,baseline,independent,independent:shape=null:chain_confidence=0.4,medusa:verifier=typical"


@dataclass(frozen=True)
class Step:
    """One measurement of the runbook: `script` (in benchmarks/) with `args`, its report named DATE-`name`."""

    name: str  # its report's name after the date; {K}: the kind and dtype ("avx2-fp32")
    script: str
    args: tuple[str, ...]
    what: str

    @property
    def key(self) -> str:
        """Its name in --only: the report's without the kind ("kernel-costs", "tune-chain-shape-humaneval", ...)."""
        return self.name.replace("-{K}", "")

    def report(self, kind: str) -> str:
        return self.name.format(K=slug(kind))

    def command(self, kind: str, out: Path) -> list[str]:
        args = [a.format(dtype=CPU_KINDS[kind]) for a in self.args]
        return [sys.executable, str(ROOT / "benchmarks" / self.script), *args, "--json", str(out)]


STEPS = (
    Step("kernel-costs-{K}", "kernel_costs.py", ("--model", "qwen2.5-coder-1.5b", "--dtype", "{dtype}", "--kernels", "torch,skinny,packed",
         "--shapes", "1x1,1x2,1x3,1x5,1x9,1x13,1x17,9+5+3+1,4x9", "--prompt", "156", "--repeats", "5"),
         "the target's cost curve, every kernel at every shape, interleaved (issue 75's v(9) and v(17))"),
    Step("tune-chain-shape-{K}-humaneval", "speed.py", ("--dataset", "humaneval", "--prompts", "4", "--offset", "100",
         "--tokens", "128", "--methods", TUNED), "tuning, code: the chain's stop on this kind (choose here, never on held-out runs)"),
    Step("tune-chain-shape-{K}-sharegpt", "speed.py", ("--dataset", "sharegpt", "--prompts", "4", "--offset", "0",
         "--tokens", "64", "--methods", TUNED), "tuning, chat"),
    Step("heldout-{K}-humaneval", "speed.py", ("--dataset", "humaneval", "--prompts", "8", "--offset", "120", "--tokens", "128",
         "--methods", HELD_OUT + ",hf_assisted"), "held out, code: the headline's rows (the defaults were chosen on "
         "HumanEval 100-103 and ShareGPT 0-3)"),
    Step("heldout-{K}-mtbench", "speed.py", ("--dataset", "mtbench", "--prompts", "8", "--offset", "2", "--tokens", "64",
         "--methods", HELD_OUT), "held out, chat"),
    Step("battery-rates-{K}", "battery_rates.py", ("--overrides", BATTERY, "--kernels", "skinny,auto", "--samples", "64",
         "--length", "8", "--rounds", "2"), "the battery's draws per second on the real pair, on W @ x^T and the default kernels"),
)
HELD_OUT_STEPS = {"HumanEval": "heldout-{K}-humaneval", "MT-bench": "heldout-{K}-mtbench"}  # headline.py's dataset names


class NewKindError(headline.HeadlineError):
    """A run that cannot go on: one line saying why."""


def slug(kind: str) -> str:
    return f"{SLUGS[kind]}-{DTYPES[CPU_KINDS[kind]]}"


def done(name: str, data: Path) -> Path | None:
    """The newest report named DATE-`name` in `data` that reads as a JSON object (a file cut short is not done), else
    None."""
    for path in sorted(data.glob(f"????-??-??-{name}.json"), reverse=True):
        try:
            if isinstance(json.loads(path.read_text(encoding="utf-8")), dict):
                return path
        except (OSError, UnicodeDecodeError, ValueError):
            continue
    return None


def record(path: Path) -> dict:
    """The numbers a report at `path` holds (speed.py's record: the results page's `data`; {} where that is no object)."""
    return numbers_of(json.loads(path.read_text(encoding="utf-8")))


def numbers_of(page: dict) -> dict:
    """A report's record (reports.raw), {} where that is no object."""
    numbers = reports.raw(page)
    return numbers if isinstance(numbers, dict) else {}


def steps_of(only: str | None) -> list[Step]:
    """The steps --only names (all when None), in the runbook's order."""
    if only is None:
        return list(STEPS)
    names = [s.key for s in STEPS]
    wanted = [n.strip() for n in only.split(",")]
    if unknown := [n for n in wanted if n not in names]:
        raise NewKindError(f"unknown step(s) {', '.join(unknown)} in --only: valid are {', '.join(names)}")
    return [s for s in STEPS if s.key in wanted]


def new_headlines(kind: str, source: Path, data: Path) -> list[dict]:
    """The headline entries of `kind` its held-out reports in `data` back: for each headline of another kind in
    `source` (first of equals kept), the same setting in the new report of its dataset, where that report measured its
    method. None when `kind` has headlines already or a held-out report is missing."""
    items = headline.headlines(source, data)
    reports = {dataset: done(name.format(K=slug(kind)), data) for dataset, name in HELD_OUT_STEPS.items()}
    if any(h["kind"] == kind for h in items) or None in reports.values():
        return []
    new, seen = [], set()
    for h in items:
        path = reports.get(h["dataset"])
        key = (h["what"], h["method"], h["dataset"])
        if path is None or key in seen:
            continue
        try:
            headline.row_of(record(path), h["method"], path.name)
        except (headline.HeadlineError, KeyError, TypeError, AttributeError):  # a setting this kind's run did not measure
            continue  # (the 11-29 fastest setting), or not a speed record at all: headline.py says which when it is added
        seen.add(key)
        new.append({"kind": kind, **({"expect": True} if h.get("expect") else {}), "what": h["what"], "report": path.stem,
                    "method": h["method"]})
    return new


def add_headlines(kind: str, source: Path = headline.SOURCE, data: Path = headline.DATA) -> list[dict]:
    """Add `kind`'s headline entries (new_headlines) to `source`, checked by headline.py as a whole (else `source`
    is left as it was and the error says why). Returns the entries added."""
    new = new_headlines(kind, source, data)
    if not new:
        return []
    before = source.read_text(encoding="utf-8")
    entries = json.loads(before) + new
    source.write_text("[\n" + ",\n".join(" " + json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n", encoding="utf-8")
    try:
        headline.headlines(source, data)
    except headline.HeadlineError as err:
        source.write_text(before, encoding="utf-8")
        raise NewKindError(f"the new headlines of {kind} were not added ({err})") from None
    return new


def summary(step: Step, path: Path) -> str:
    """The numbers of `step`'s report at `path` a reader looks for first: v(9) and v(17) per kernel of the cost curve,
    each method's speedup over generate with its interval, the battery's draws per second per kernel."""
    page = json.loads(path.read_text(encoding="utf-8"))
    if step.script == "speed.py":
        return ", ".join(f"{r['method']} {r['speedup_vs_generate']:.2f}x"
                         + (f" [{r['speedup_interval'][0]:.2f}-{r['speedup_interval'][1]:.2f}]" if r.get("speedup_interval") else "")
                         for r in numbers_of(page)["rows"] if "speedup_vs_generate" in r)
    columns, rows = page.get("columns", []), {row[0]: row for row in page.get("rows", [])}
    if step.script == "kernel_costs.py":
        return ", ".join(f"{c.removeprefix('v ')} v(9) {rows['1x9'][i]} v(17) {rows['1x17'][i]}"
                         for i, c in enumerate(columns) if c.startswith("v ") and {"1x9", "1x17"} <= rows.keys())
    return "; ".join(", ".join(f"{c} {v}" for c, v in zip(columns, row)) for row in rows.values())


def tree_size(kind: str, data: Path) -> str | None:
    """What the held-out code run says of Medusa's tree (its draft tokens verified a step), if it ran it."""
    path = done(HELD_OUT_STEPS["HumanEval"].format(K=slug(kind)), data)
    rows = record(path).get("rows", []) if path else []
    medusa = [r for r in rows if isinstance(r, dict) and str(r.get("method")).startswith("medusa") and "nodes_per_step" in r]
    return f"{medusa[0]['method']}: {medusa[0]['nodes_per_step']:.1f} draft tokens verified a step" if medusa else None


def main(argv: list[str] | None = None) -> int:
    """Run the steps not done, then add the headline; 0 when all ran (or were done), 1 when a step failed, 2 when an
    input was refused (one line)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="list the steps, their commands and which are done; run nothing")
    ap.add_argument("--only", help="comma-separated steps (default: all), as --dry names them")
    ap.add_argument("--kind", help=f"the CPU kind ({', '.join(CPU_KINDS)}); default: this machine's; another only with --dry")
    ap.add_argument("--data", type=Path, default=headline.DATA, help="the reports' folder (default: %(default)s)")
    ap.add_argument("--source", type=Path, default=headline.SOURCE, help="the headlines' list (default: %(default)s)")
    for page, default in (("readme", headline.README), ("index", headline.INDEX), ("expect", headline.EXPECT)):
        ap.add_argument(f"--{page}", type=Path, default=default, help=f"headline.py's --{page} (default: %(default)s)")
    args = ap.parse_args(argv)
    here = cpu_kind()
    kind = args.kind or here
    try:
        if kind not in CPU_KINDS:
            raise NewKindError(f"{'--kind ' + kind if args.kind else 'this CPU is ' + kind}: the headline has tables for "
                               f"{', '.join(CPU_KINDS)} only")
        if kind != here and not args.dry:
            raise NewKindError(f"--kind {kind}: this machine is {here}; a kind's numbers are measured on it (--dry lists them)")
        steps = steps_of(args.only)
        measured = {item["kind"] for item in headline.entries(args.source)}
    except headline.HeadlineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    today = datetime.date.today().isoformat()
    print(f"{kind} ({CPU_KINDS[kind]}): {len(steps)} step(s), reports in {headline.shown(args.data)}")
    if kind in measured:
        print(f"({kind} has headlines already: these steps measure it again, and its headlines stay as they are)")
    if not args.dry and hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
        print(f"load average {load:.1f} on {os.cpu_count()} CPUs" + ("" if load < 0.5 else
              ": not quiet; speed ratios measured beside other work are not to be reported"))
    for i, step in enumerate(steps, 1):
        name = step.report(kind)
        found = done(name, args.data)
        out = found or args.data / f"{today}-{name}.json"
        command = shlex.join(["python", *(step.command(kind, out)[1:])]).replace(str(ROOT) + "/", "")
        print(f"\n[{i}/{len(steps)}] {name}: {step.what}\n  {'done: ' + headline.shown(found) if found else command}", flush=True)
        if found or args.dry:
            continue
        t0 = time.perf_counter()
        code = subprocess.run(step.command(kind, out), cwd=ROOT).returncode
        if code != 0 or done(name, args.data) is None:
            print(f"error: step {name} failed (exit {code}) after {time.perf_counter() - t0:.0f} s; it wrote no report. "
                  "Run this again to go on from it.", file=sys.stderr)
            return 1
        print(f"  wrote {headline.shown(out)} in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
    ran = [(step, found) for step in steps if (found := done(step.report(kind), args.data))]
    if ran:
        print(f"\n{kind}'s reports:")
        for step, found in ran:
            try:
                said = summary(step, found)
            except (KeyError, TypeError, AttributeError, IndexError, ValueError) as err:
                said = f"its numbers could not be read ({type(err).__name__}: {err}): is it this step's report?"
            print(f"  {found.stem}: {said}")
    if said := tree_size(kind, args.data):
        print(f"\nMedusa's tree (shape=auto) on {kind}: {said}")
    if args.dry:
        return 0
    try:
        added = add_headlines(kind, args.source, args.data)
    except headline.HeadlineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if added:
        print(f"\nadded {len(added)} headline(s) of {kind} to {headline.shown(args.source)}: "
              + "; ".join(f"{h['what']} ({h['report']})" for h in added))
        return headline.main([f"--{key}={getattr(args, key)}" for key in ("source", "data", "readme", "index", "expect")])
    print(f"\nno headline added: {kind} has headlines in {headline.shown(args.source)} already, or a held-out report is missing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
