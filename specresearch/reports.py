"""The one results format: every measured table the docs render is a report of this shape, whatever
wrote it (benchmarks/speed.py --json, benchmarks/gpu_check.py, benchmarks/flagship.py,
benchmarks/aa_calibration.py, tests/mutants.py, a table written by hand). docs/results/data/NAME.json
becomes the page results/NAME.md (docs/hooks/results.py); a test holds every file there to `validate`.

A report: `title`, `date`, `machine` (processor or GPU, memory, versions), `command` (the lines that
reproduce it), `topic` (TOPICS: the results index groups by it), `columns` and `rows` (the measured
table), and optionally `prompts` (what was decoded), `notes` (findings), `extra` (Markdown after the
table) and `data` (the writer's own record, e.g. speed.py's per-method numbers with their intervals,
which other scripts read: `raw`). No machine path: paths are relative to the repository.

`of(record, name)` makes the report of a record a benchmark writes (speed.py's per-method rows or its
batch sizes, gpu_check.py's sections); stdlib only.
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


def check(report: Any, source: str) -> dict:
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


def of(record: dict, name: str, topic: str | None = None) -> dict:
    """The report of a benchmark's record (its `data`): speed.py's per-method rows or batch sizes, gpu_check.py's
    sections; a record that is a report already is returned as it is. `name`: the file's name (a date in it
    serves a record without one); `topic`: TOPICS' (default: gpu for gpu_check, batches for --batch, else speed)."""
    if "columns" in record:
        return record
    if is_gpu_check(record):
        table, kind = gpu_check_to_table(record, name), "gpu"
    elif is_batch_report(record):
        table, kind = batch_to_table(record, name), "batches"
    elif is_speed_report(record):
        table, kind = speed_to_table(record, name), "speed"
    else:
        raise SpecResearchError(f"{name}: not a record a benchmark writes (speed.py's or gpu_check.py's) nor a report")
    return {**{k: v for k, v in table.items() if v not in (None, "")}, "topic": topic or kind, "data": record}


def of_script(script: str, args: dict[str, Any], machine: dict[str, str], title: str, **fields: Any) -> dict:
    """The report a benchmark script writes of one run: `title` and `fields` (topic, columns, rows, prompts,
    notes, data) with today's date, the machine in one line (`machine`: specresearch.models.machine_tags) and
    the command that reproduces it (benchmarks/`script` with every argument of `args` but the output, `json`)."""
    command = " ".join([f"python benchmarks/{script}", *(f"--{k} {v}" for k, v in args.items() if k != "json")])
    return {"title": title, "date": datetime.date.today().isoformat(),
            "machine": ", ".join(f"{k.removeprefix('specresearch.')} {v}" for k, v in machine.items()),
            "command": [command], **fields}


def is_speed_report(data: dict) -> bool:
    """What benchmarks/speed.py --json writes."""
    return {"header", "args", "rows"} <= data.keys() and "columns" not in data


def is_batch_report(data: dict) -> bool:
    """What benchmarks/speed.py --batch ... --json writes: rows per batch size and each method's crossover."""
    return {"header", "args", "batches", "crossover"} <= data.keys() and "columns" not in data


def is_gpu_check(data: dict) -> bool:
    """What benchmarks/gpu_check.py writes."""
    return data.get("script") == "benchmarks/gpu_check.py" and "columns" not in data


def gpu_check_to_table(data: dict, name: str) -> dict:
    """A gpu_check.py report in the curated format: its speed rows -> table (each method over generate,
    over the fastest plain decoding measured and over our baseline; c, v and the draft's seconds per step),
    device + versions -> machine, argv -> command; the matrix's summary, v(k) and what failed as notes."""
    versions, device, sp = data.get("versions", {}), data.get("device", {}), data.get("speed") or {}
    rows = sp.get("rows", [])
    plain = [r for r in rows if r["method"] in ("generate", "generate_compiled", "baseline", "baseline_compiled")]
    fastest = max(plain, key=lambda r: r["tokens_per_s"], default=None)
    by_name = {r["method"]: r for r in rows}

    def ratio(r: dict, ref: dict | None) -> str:
        return f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}x" if ref else ""

    def fmt(v, spec: str) -> str:
        return "" if v is None else "n/a" if v != v else format(v, spec)

    table_rows = []
    for r in rows:
        split = r.get("time_split") or {}
        draft_per_step = r["v"] * split["draft"] / split["verify"] if r.get("c") is not None and split.get("verify") else None
        compiled = r.get("compiled", r["method"].endswith("_compiled"))  # (reports before the flag: by the name)
        base = by_name.get("baseline_compiled" if compiled else "baseline")
        table_rows.append([r["method"], f"{r['tokens_per_s']:.1f}", " ".join(f"{x:.0f}" for x in r.get("tokens_per_s_repeats", [])),
                           ratio(r, by_name.get("generate")), ratio(r, fastest), ratio(r, base), fmt(r.get("tau"), ".2f"),
                           fmt(r.get("c"), ".3f"), fmt(draft_per_step, ".3f"), fmt(r.get("v"), ".2f"),
                           ", ".join(f"{k} {v:.0%}" for k, v in split.items()),
                           " ".join(f"{s:.1f}" for s in r.get("warmup_seconds", [])), r.get("first_divergence_vs_generate")])
    columns = ["method", "tok/s", "tok/s per run", "vs generate", "vs fastest plain", "vs our baseline", "τ", "c",
               "draft / step", "v", "time split", "warm-up s", "first divergence vs generate"]
    notes = []
    if fastest is not None:
        notes.append(f"vs fastest plain: over {fastest['method']}, the fastest plain decoding measured; vs our baseline: "
                     "a compiled method over baseline_compiled, the others over baseline. c and v are against the same "
                     "baseline's one-token forward; draft / step: the draft's seconds per step over that forward "
                     "(v x draft / verify of the time split; Medusa's heads have no draft-model forward, so c is 0).")
    if sp.get("v_curve"):
        notes.append("Eager target forward of k + 1 tokens over one token, k = 0..8: " + " ".join(f"{v:.2f}" for v in sp["v_curve"])
                     + (f"; the 0.5B draft's forward over the target's: {sp['c_draft']:.3f}" if "c_draft" in sp else "")
                     + (f"; one target forward {sp['target_forward_ms']:.1f} ms" if "target_forward_ms" in sp else "") + ".")
    for method, f in sp.get("failed", {}).items():
        notes.append(f"{method}: {f.get('status', 'error')}: {f.get('error')}")
    m = data.get("matrix")
    if m and m.get("status") == "ok":
        s = m["summary"]
        notes.append(f"Matrix on {m.get('device', device.get('type'))} (tiny random model, fp32): "
                     f"T = 0 {s['t0_identical']}/{s['t0_cells']} drafter x verifier cells identical to plain decoding; "
                     f"T = 1 {s['t1_ok']}/{s['t1_runs']} ran; other modes {s['modes_ok']}/{s['modes']} passed, "
                     f"{s['modes_refused']} refused; our baseline == generate: {s['baseline_equals_generate']}.")
        for d, row in m.get("modes", {}).items():
            notes += [f"{d} x {v}: {c['status']}: {c.get('error')}" for v, c in row.items() if c.get("status") not in ("ok", None)]
    elif m:
        notes.append(f"Matrix: {m.get('status')}: {m.get('error')}")
    machine = (f"{device.get('name', device.get('type', '?'))}" + (f" ({device['memory_gib']} GiB)" if "memory_gib" in device else "")
               + f", torch {versions.get('torch')}" + (f" (CUDA {versions['torch_cuda']})" if versions.get("torch_cuda") else "")
               + f", transformers {versions.get('transformers')}, specresearch at {versions.get('git')}")
    shapes = sp.get("shapes", {})
    return {
        "title": data.get("title") or f"benchmarks/gpu_check.py on {device.get('name', device.get('type', '?'))}",
        "date": data.get("date") or data.get("started", report_date(data, name)),
        "machine": machine,
        "command": ["python benchmarks/gpu_check.py " + " ".join(shlex.quote(a) for a in data.get("argv", []))],
        "prompts": (f"random weights of the Qwen2.5-Coder-1.5B shape (target) and 0.5B shape (draft), {sp.get('dtype')}, "
                    f"vocabulary {shapes.get('vocab')}; one prompt of {sp.get('prompt_tokens')} tokens, {sp.get('new_tokens')} new "
                    f"tokens, greedy, EOS ignored, {sp.get('repeats')} rounds in rotating order (tok/s over all of them)")
                   if rows else None,
        "columns": columns,
        "rows": table_rows or [["(no speed section)", *[""] * (len(columns) - 1)]],
        "notes": data.get("notes", []) + notes,
    }


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


def speed_command(args: dict) -> str:
    """The benchmarks/speed.py command line that reproduces a report, from its `args`."""
    words = ["python", "benchmarks/speed.py"]
    for key, value in args.items():
        if key == "json" or value is None or value is False or value in ("None", ""):
            continue
        flag = "--" + key.replace("_", "-")
        words += [flag] if value is True else [flag, shlex.quote(str(value))]
    return " ".join(words)


def decoding(args: dict) -> str:
    """How a speed.py report decoded: greedy, or sampled at its --temperature (reports before it: greedy)."""
    return f"sampled at T = {args['temperature']:g}" if args.get("temperature") else "greedy"


def speed_to_table(data: dict, name: str) -> dict:
    """A speed.py report in the curated format: rows -> table, args -> command, header -> machine."""
    args = data.get("args", {})
    rows = data["rows"]
    ref = next((k for k in (rows[0] if rows else {}) if k.startswith("speedup_vs_") and k != "speedup_vs_baseline"), "speedup_vs_generate")
    interval = bool(rows) and bool(rows[0].get("speedup_interval"))  # a bootstrap interval over prompts, or the repeats' range
    columns = ["method", "tok/s", "±", ref.replace("speedup_", "").replace("_", " "), "95% interval" if interval else "min-max",
               "vs baseline",
               "vs fastest plain", "α", "τ", "c", "v", "Leviathan", "identical"]
    keys = ["method", "tokens_per_s", "tokens_per_s_std", ref, None, "speedup_vs_baseline",
            "speedup_vs_fastest_plain", "alpha", "tau", "c", "v", "leviathan", "identical_to_reference"]
    table_rows = []
    for r in rows:
        row = []
        for key in keys:
            if key is None:
                low, high = r.get("speedup_interval") or (r.get("speedup_min"), r.get("speedup_max"))
                row.append(f"{low:.2f}-{high:.2f}" if low is not None else "")
            elif key.startswith("speedup_vs_") or key == "leviathan":
                v = r.get(key)
                row.append("" if v is None else "n/a" if v != v else f"{v:.2f}x")
            else:
                v = r.get(key)
                fmt = {"tokens_per_s": ".2f", "tokens_per_s_std": ".2f", "alpha": ".3f", "tau": ".2f", "c": ".3f", "v": ".2f"}.get(key)
                row.append(v if fmt is None or not isinstance(v, (int, float)) else "n/a" if v != v else format(v, fmt))
        table_rows.append(row)
    notes = []
    if data.get("v_curve"):
        notes.append("Target forward of k + 1 tokens over one token, k = 0, 1, ...: "
                     + " ".join(f"{v:.2f}" for v in data["v_curve"]))
    if rows and "fastest_plain" in rows[0]:
        notes.append(f"vs fastest plain: over the fastest plain decoding measured ({rows[0]['fastest_plain']}).")
    for r in rows:
        if "time_split" in r:
            notes.append(f"{r['method']}: time split " + ", ".join(f"{k} {v:.0%}" for k, v in r["time_split"].items()))
    date = report_date(data, name)
    dataset = args.get("dataset", "humaneval")
    out = {
        "title": data.get("title")
        or f"benchmarks/speed.py: {dataset}, {args.get('prompts', '?')} prompts x {args.get('tokens', '?')} tokens",
        "date": date,
        "machine": data["header"],
        "command": [speed_command(args)],
        "prompts": f"{dataset}, {args.get('prompts')} prompts from offset {args.get('offset', 0)}, {args.get('tokens')} new tokens, "
                   f"{args.get('repeats')} repeats, {decoding(args)} (from the report's args)",
        "columns": columns,
        "rows": table_rows,
        "notes": data.get("notes", []) + notes,
    }
    if data.get("profile"):
        prof = data["profile"]
        groups = [k for k in next(iter(prof.values())) if k != "seconds"]
        out["extra"] = "## Profile\n\n" + markdown_table(
            ["method", "seconds", *groups],
            [[m, f"{p['seconds']:.1f}", *(f"{p[g]:.0%}" for g in groups)] for m, p in prof.items()],
        )
    return out


def batch_to_table(data: dict, name: str) -> dict:
    """A speed.py --batch report in the curated format: methods down, batch sizes across (tokens/s and
    the speedup over the fastest plain decoding at that batch size), each method's crossover (the first
    batch size where its speedup falls below 1) last; args -> command, header -> machine; what was skipped
    and why, the fastest plain decoding per batch size and outputs unlike the reference's as notes."""
    args = data.get("args", {})
    batches, crossover = data["batches"], data["crossover"]
    sizes = [e["batch"] for e in batches]
    names = list(dict.fromkeys([r["method"] for e in batches for r in e["rows"]] + [m for e in batches for m in e.get("skipped", {})]))
    table_rows = []
    for method in names:
        row = [method]
        for e in batches:
            r = next((r for r in e["rows"] if r["method"] == method), None)
            if r is None:
                row += ["skipped" if method in e.get("skipped", {}) else "", ""]
            else:
                speedup = r.get("speedup_vs_fastest_plain")
                row += [f"{r['tokens_per_s']:.2f}", "" if speedup is None else f"{speedup:.2f}x"]
        if method not in crossover:
            row.append("")
        elif crossover[method] is not None:
            row.append(f"B={crossover[method]}")
        else:
            ran = [e["batch"] for e in batches if any(r["method"] == method for r in e["rows"])]
            row.append(f"none to B={max(ran)}")
        table_rows.append(row)
    columns = ["method", *(c for b in sizes for c in (f"B={b} tok/s", f"B={b} vs fastest plain")), "crossover"]
    notes = [
        "tok/s: new tokens over the wall time of the batches (every prompt, B at a time, left-padded for transformers); "
        "vs fastest plain: over the fastest plain decoding at the same batch size; crossover: the first batch size "
        "where the method's speedup falls below 1.",
        "Fastest plain decoding per batch size: " + ", ".join(
            f"B={e['batch']} {e['rows'][0]['fastest_plain']}" for e in batches if e["rows"] and "fastest_plain" in e["rows"][0]) + ".",
    ]
    skipped: dict[tuple[str, str], list[int]] = {}
    for e in batches:
        for method, why in e.get("skipped", {}).items():
            skipped.setdefault((method, why), []).append(e["batch"])
    notes += [f"{method} skipped at B={', '.join(map(str, at))}: {why}." for (method, why), at in skipped.items()]
    for e in batches:
        for r in e["rows"]:
            if "prompts" in e and r.get("identical_to_reference") not in (None, e["prompts"]):
                notes.append(f"B={e['batch']}: {r['method']} decoded {r.get('identical_to_reference')} of {e['prompts']} prompts "
                             f"token for token as {e.get('reference')} did at that batch size.")
    date = report_date(data, name)
    dataset = args.get("dataset", "humaneval")
    return {
        "title": data.get("title") or f"benchmarks/speed.py: {dataset}, batch sizes {args.get('batch', '?')}",
        "date": date,
        "machine": data["header"],
        "command": [speed_command(args)],
        "prompts": f"{dataset}, {args.get('prompts')} prompts from offset {args.get('offset', 0)}, {args.get('tokens')} new tokens, "
                   f"{args.get('repeats')} repeats, {decoding(args)}, batch sizes {args.get('batch')} (from the report's args)",
        "columns": columns,
        "rows": table_rows,
        "notes": data.get("notes", []) + notes,
    }


def report_date(data: dict, name: str) -> str:
    """A speed.py report's date: its own `date`, else the stamp in its file name (speed-YYYYMMDD-HHMMSS), else
    the date a results file's name starts with (YYYY-MM-DD-NAME)."""
    match = re.search(r"(\d{4})(\d{2})(\d{2})-(\d{2})(\d{2})", name)
    day = re.match(r"\d{4}-\d{2}-\d{2}", name)
    return data.get("date") or (f"{match[1]}-{match[2]}-{match[3]} {match[4]}:{match[5]}" if match else day[0] if day else "not recorded")
