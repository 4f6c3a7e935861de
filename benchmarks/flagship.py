"""The flagship table: speed, quality and faithfulness of each method per text and temperature, in one page.

Reads what was measured, measures nothing itself:
  --speed FILE  benchmarks/speed.py reports (--json), one interleaved run each: a text (HumanEval, MT-bench) at
                one temperature, transformers' `generate` (the reference), its assisted generation and our methods;
  --run DIR     output folders of `specresearch` runs (Hydra's, with .hydra/ and summary.json): `eval=humaneval`
                runs give pass@1 of the method beside the target alone's, `stats.samples=N` runs the equivalence
                battery's verdict. Each is put beside the speed row of the same text, temperature, drafter and
                verifier.
and writes one results file (curated format: docs/results/data/*.json), every row naming the page of the run it
came from (a run that matches no speed row gets a row of its own), every command listed, the machine of each report
stated.

    python benchmarks/flagship.py --speed docs/results/data/2026-11-28-flagship-humaneval.json \\
        --run outputs/2026-11-28/02-10-00 --out docs/results/data/2026-11-28-flagship.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
if str(Path(__file__).resolve().parent) not in sys.path:  # loaded from its file, not run: its sibling below
    sys.path.insert(1, str(Path(__file__).resolve().parent))
from speed_report import report_date, speed_command  # noqa: E402  (benchmarks/speed_report.py: a speed record's command and date)

from specresearch import reports  # noqa: E402  (the docs' one results format)

TEXTS = {"humaneval": "code (HumanEval)", "mtbench": "chat (MT-bench)", "sharegpt": "chat (ShareGPT)"}
LOSSLESS = "lossless: rejection sampling (the law tests prove every drafter with it)"  # a rejection row without a battery run
SHOWN = ("generate", "hf_assisted")  # transformers' rows kept beside ours; other plain decodings are on each run's page


def method_key(label: str, temperature: float) -> tuple[str, str]:
    """(drafter, verifier) of a speed.py row: "medusa(depth=1) verifier=typical" -> ("medusa", "typical");
    without a verifier option, speed.py's lossless default (greedy, at T > 0 rejection)."""
    drafter = label.split("(")[0].split(" ")[0]
    verifier = next((o.split("=", 1)[1] for o in label.split() if o.startswith("verifier=")), None)
    return drafter, verifier or ("greedy" if temperature == 0 else "rejection")


class InputError(ValueError):
    """An input this script cannot read: one line naming the file and what it lacks."""


READ_ERRORS = (OSError, UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError)


def read_report(path: Path) -> dict:
    """A benchmarks/speed.py report (--json), checked for what the table reads: its args, header and rows,
    each row with its method and its speedup over transformers' `generate`."""
    try:
        report = reports.raw(json.loads(path.read_text()))  # the numbers speed.py wrote (the report's `data`)
        args, rows = report["args"], report["rows"]
        for key in ("dataset", "prompts", "offset", "tokens"):
            args[key]
        if not isinstance(report["header"], str) or not isinstance(rows, list) or not rows:
            raise ValueError("no rows")
        missing = [row["method"] for row in rows if "speedup_vs_generate" not in row]
    except READ_ERRORS as err:
        raise InputError(f"{path}: not a benchmarks/speed.py report (--json without --batch: a header, args and rows): "
                         f"{type(err).__name__} {err}") from None
    if missing:
        raise InputError(f"{path}: rows without a speedup over transformers' generate ({', '.join(missing[:3])}): the flagship "
                         "compares with it; measure with --methods generate,...")
    return report


def read_run(folder: Path) -> dict:
    """A `specresearch` run's choices (text, temperature, drafter, verifier), command and summary."""
    try:
        hydra = yaml.safe_load((folder / ".hydra" / "hydra.yaml").read_text())["hydra"]
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
        overrides = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or []
        choices = hydra["runtime"]["choices"]
        summary = json.loads((folder / "summary.json").read_text())
        run = {
            "key": (config["dataset"]["name"], float(config["sampling"]["temperature"]), choices["drafter"], choices["verifier"]),
            "command": "specresearch " + " ".join(shlex.quote(o) for o in overrides),
            "summary": dict(summary),
            "folder": folder.name,
        }
        hash(run["key"])
        run["quality"], run["battery"] = quality(run), battery(run)  # here, so that a summary's wrong value is named by its folder
        return run
    except READ_ERRORS as err:
        raise InputError(f"{folder}: not the output folder of a specresearch run (.hydra/ with hydra.yaml, config.yaml and "
                         f"overrides.yaml, and summary.json): {type(err).__name__} {err}") from None


def quality(run: dict) -> str | None:
    """pass@1 of the method and of the target alone on the same problems, with the paired test."""
    s = {key.replace("@", "_at_"): value for key, value in run["summary"].items()}  # summary.json: "pass@1"; MLflow: "pass_at_1"
    if "method_pass_at_1" not in s:
        return None
    return (f"pass@1 {s['method_pass_at_1']:.2f} vs target {s['baseline_pass_at_1']:.2f} "
            f"(the first {s['problems']:.0f} problems, one sample each; McNemar p {s['mcnemar_p']:.2g})")


def battery(run: dict) -> str | None:
    """The equivalence battery's verdict, with its N and the smallest position TV it detects."""
    s = run["summary"]
    if "eq_reject" not in s:
        return None
    verdict = "**different** from the target" if s["eq_reject"] else "not distinguishable from the target"
    tv = s.get("eq_power_min_tv_position")
    effects = (f"; position TV {s['eq_tv_position']:.2f} (noise floor {s['eq_tv_position_null']:.2f}), top-1 share "
               f"{s['eq_top1_share_method']:.2f} vs {s['eq_top1_share_baseline']:.2f}") if "eq_tv_position" in s else ""
    return (f"{verdict} (Holm at {s['eq_alpha']:g}; {s['eq_samples_method']:.0f} vs {s['eq_samples_baseline']:.0f} sequences of "
            f"{s.get('eq_length', 0):.0f} tokens" + (f", detects a position TV of {tv:.2f}" if tv is not None else "") + effects + ")")


def table(speed: list[Path], runs: list[Path], skip: list[str] = (), notes: list[str] = ()) -> dict:
    """The curated results file: one row per method of each speed report (but those whose label contains one
    of `skip`), with the quality and verdict of the runs of the same key; a run of no row's key gets a row of
    its own (a lossless control beside a lossy method, say), its speed left to its own page; `notes`: the findings."""
    found = [read_run(folder) for folder in runs]
    used = set()
    rows, commands, machines, dates = [], [], [], []
    for path in speed:
        report = read_report(path)
        try:
            args = report["args"]
            temperature = float(args.get("temperature") or 0)
            text = TEXTS.get(args["dataset"], args["dataset"])
            commands.append(speed_command(args))
            dates.append(report_date(report, path.stem))
            machines.append(report["header"].split("): ")[0] + ")")  # the models, dtype, device, kernels, torch, threads, CPU
            prompts = (f"{args['prompts']} prompts from {args['offset']}" if args["dataset"] != "mtbench"
                       else f"{args['prompts']} questions, one per category from its question {args['offset'] + 1} on")
            for r in report["rows"]:
                if (r["method"] not in SHOWN and "alpha" not in r) or any(s in r["method"] for s in skip):  # other plain decodings
                    continue
                key = (args["dataset"], temperature, *method_key(r["method"], temperature))
                mine = [run for run in found if run["key"] == key]
                used.update(run["folder"] for run in mine)
                same = r.get("identical_to_reference")
                lossless = f"identical to `generate`: {same}/{args['prompts']}" if same is not None else ""
                rows.append([
                    text, f"{temperature:g}", f"{prompts} x {args['tokens']} tokens", r["method"],
                    f"{r['speedup_vs_generate']:.2f}x",
                    "" if r.get("tau") is None else f"{r['tau']:.2f}",
                    "; ".join(filter(None, [lossless, *(run["quality"] for run in mine)])),
                    "; ".join(filter(None, (run["battery"] for run in mine)))
                    or (LOSSLESS if "alpha" in r and key[3] == "rejection" and temperature > 0 else ""),
                    f"[{path.stem}]({path.stem}.md)",
                ])
        except InputError:
            raise
        except READ_ERRORS as err:  # a value of the wrong kind (a speedup that is text, a method that is a number ...)
            raise InputError(f"{path}: a benchmarks/speed.py report with a value of the wrong kind: {type(err).__name__} {err}") from None
    for run in found:
        commands.append(f"{run['command']}   # {run['folder']}")
        if run["folder"] not in used:
            dataset, temperature, drafter, verifier = run["key"]
            rows.append([TEXTS.get(dataset, dataset), f"{temperature:g}", "as its command says", f"{drafter} verifier={verifier}",
                         "", "", run["quality"] or "", run["battery"] or "", f"run {run['folder']}"])
    return {
        "title": "The flagship: Medusa with typical acceptance, code and chat, T = 0 and T = 0.7",
        "date": max(dates),
        "machine": " | ".join(dict.fromkeys(machines)),
        "topic": "speed",
        "command": commands,
        "prompts": "held out: no setting was chosen and no head trained on them (HumanEval 150 on; MT-bench from the 6th "
                   "question of each category; settings chosen on HumanEval 100-103 and ShareGPT)",
        "columns": ["text", "T", "prompts", "method", "vs generate", "τ", "quality", "equivalence battery", "run"],
        "rows": rows,
        "notes": list(notes),
    }


def writable(out: Path) -> bool:
    """Whether `out` can be written: not a folder, and a file can be made beside it (a probe, at once removed: /proc
    and read-only mounts pass os.access)."""
    if out.is_dir() or not out.parent.is_dir():
        return False
    try:
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".flagship-probe-"):
            return True
    except OSError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speed", type=Path, nargs="+", required=True, help="benchmarks/speed.py reports (--json)")
    parser.add_argument("--run", type=Path, nargs="*", default=[], help="output folders of specresearch runs (eval, stats)")
    parser.add_argument("--notes", nargs="*", default=[], help="findings to add to the page")
    parser.add_argument("--skip", nargs="*", default=[], help="leave out the speed rows whose method contains one of these")
    parser.add_argument("--out", type=Path, required=True, help="the results file to write (docs/results/data/DATE-NAME.json)")
    args = parser.parse_args()
    missing = [str(p) for p in [*args.speed, *(r / "summary.json" for r in args.run)] if not p.is_file()]
    if missing:
        parser.error(f"not found: {', '.join(missing)}")
    if not writable(args.out):
        parser.error(f"--out {args.out}: cannot write the results file there (a file in a writable folder); checked before any work")
    try:
        data = table(args.speed, args.run, args.skip, args.notes)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    args.out.write_text(json.dumps(reports.checked(data, str(args.out)), indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}: {len(data['rows'])} rows")


if __name__ == "__main__":
    main()
