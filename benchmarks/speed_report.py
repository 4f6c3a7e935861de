"""What benchmarks/speed.py --json writes, as a report of the docs' one results format (specresearch.reports):
its per-method rows (topic speed) or, with --batch, its rows per batch size and each method's crossover (topic
batches), the record itself kept as the report's `data`. Stdlib only (no torch, no model): flagship.py reads a
record's command and date with it.

    report(record, name)     # speed.py's record -> the report it writes
"""

from __future__ import annotations

import re
import shlex

from specresearch import reports
from specresearch.errors import SpecResearchError


def report(record: dict, name: str) -> dict:
    """The report of a record speed.py writes (its `data`): the per-method rows (topic speed) or the batch sizes
    (topic batches); a record that is a report already is returned as it is. `name`: the file's name (a date in
    it serves a record without one)."""
    if "columns" in record:
        return record
    if is_batch_report(record):
        return reports.of(batch_to_table(record, name), "batches", record)
    if is_speed_report(record):
        return reports.of(speed_to_table(record, name), "speed", record)
    raise SpecResearchError(f"{name}: not a record a benchmark writes (speed.py's rows or batch sizes) nor a report")


def is_speed_report(data: dict) -> bool:
    """What benchmarks/speed.py --json writes."""
    return {"header", "args", "rows"} <= data.keys() and "columns" not in data


def is_batch_report(data: dict) -> bool:
    """What benchmarks/speed.py --batch ... --json writes: rows per batch size and each method's crossover."""
    return {"header", "args", "batches", "crossover"} <= data.keys() and "columns" not in data


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


def reference_key(row: dict) -> str | None:
    """The key of a speed.py row's speedup over the run's reference (the method the others' tokens and speedup
    intervals are compared with: transformers' generate where it ran, else the first method):
    `speedup_vs_<reference>`, `speedup_vs_baseline` when our baseline is the reference, None in a row with neither."""
    other = [k for k in row if k.startswith("speedup_vs_") and not k.endswith("_interval")
             and k not in ("speedup_vs_baseline", "speedup_vs_fastest_plain")]
    return other[0] if other else "speedup_vs_baseline" if "speedup_vs_baseline" in row else None


def time_split_note(row: dict) -> str:
    """A drafter's row as one line: its time split and, where recorded (since 2026-12-06), the draft tokens it verified
    a step (speed.py's console and its results page alike)."""
    return (f"{row['method']}: time split " + ", ".join(f"{k} {v:.0%}" for k, v in row["time_split"].items())
            + (f"; {row['nodes_per_step']:.1f} draft tokens verified a step" if "nodes_per_step" in row else ""))


def speed_to_table(data: dict, name: str) -> dict:
    """A speed.py report in the curated format: rows -> table, args -> command, header -> machine. The reference
    column is the speedup over transformers' generate, else over the run's first method (our baseline, when it
    is the reference, once: no second `vs baseline`), its header naming it; absent when the rows have neither.
    Beside it the 95% interval over prompts (`95% BCa interval` where the record names its `interval_method`;
    records before it: a percentile bootstrap, `95% interval`), else the repeats' min-max; the rows'
    `interval_notes` (no interval computed, or only the point value) become notes, once each."""
    args = data.get("args", {})
    rows = data["rows"]
    ref = reference_key(rows[0]) if rows else "speedup_vs_generate"
    interval = bool(rows) and bool(rows[0].get("speedup_interval"))  # an interval over prompts, or the repeats' range
    kind = data.get("interval_method")  # BCa since speed.py records it; before, a percentile bootstrap, unnamed
    pairs = [("method", "method"), ("tok/s", "tokens_per_s"), ("±", "tokens_per_s_std")]  # (column, key of a row)
    if ref is not None:
        pairs += [(ref.replace("speedup_", "").replace("_", " "), ref),
                  ((f"95% {kind} interval" if kind else "95% interval") if interval else "min-max", None)]
    if ref != "speedup_vs_baseline":  # our baseline as the reference: its column once
        pairs.append(("vs baseline", "speedup_vs_baseline"))
    pairs += [("vs fastest plain", "speedup_vs_fastest_plain"), ("α", "alpha"), ("τ", "tau"), ("c", "c"), ("v", "v"),
              ("Leviathan", "leviathan"), ("identical", "identical_to_reference")]
    columns, keys = [c for c, _ in pairs], [k for _, k in pairs]
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
    if ref is None:
        notes.append("No transformers generate row and no speedup over a reference: no reference column.")
    elif ref != "speedup_vs_generate":
        notes.append(f"No transformers generate row: the reference is {ref.removeprefix('speedup_vs_')} "
                     "(the speedup column after ±, its interval and identical are over it).")
    notes += list(dict.fromkeys(note for r in rows for note in r.get("interval_notes", [])))  # none, or only the point value
    if data.get("v_curve"):
        notes.append("Target forward of k + 1 tokens over one token, k = 0, 1, ...: "
                     + " ".join(f"{v:.2f}" for v in data["v_curve"]))
    if rows and "fastest_plain" in rows[0]:
        notes.append(f"vs fastest plain: over the fastest plain decoding measured ({rows[0]['fastest_plain']}).")
    notes += [time_split_note(r) for r in rows if "time_split" in r]
    out = _page(data, name, f"{args.get('prompts', '?')} prompts x {args.get('tokens', '?')} tokens", "", columns, table_rows, notes)
    if data.get("profile"):
        prof = data["profile"]
        groups = [k for k in next(iter(prof.values())) if k != "seconds"]
        out["extra"] = "## Profile\n\n" + reports.markdown_table(
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
    return _page(data, name, f"batch sizes {args.get('batch', '?')}", f", batch sizes {args.get('batch')}", columns, table_rows, notes)


def _page(data: dict, name: str, title: str, setting: str, columns: list, rows: list, notes: list[str]) -> dict:
    """What a speed record's page and a batch record's share: the title (the record's, else the dataset and
    `title`), date, machine, command, what was decoded (`setting` after the decoding), the table and the notes."""
    args = data.get("args", {})
    dataset = args.get("dataset", "humaneval")
    return {
        "title": data.get("title") or f"benchmarks/speed.py: {dataset}, {title}",
        "date": report_date(data, name),
        "machine": data["header"],
        "command": [speed_command(args)],
        "prompts": f"{dataset}, {args.get('prompts')} prompts from offset {args.get('offset', 0)}, {args.get('tokens')} new tokens, "
                   f"{args.get('repeats')} repeats, {decoding(args)}{setting} (from the report's args)",
        "columns": columns,
        "rows": rows,
        "notes": data.get("notes", []) + notes,
    }


def report_date(data: dict, name: str) -> str:
    """A speed.py report's date: its own `date`, else the stamp in its file name (speed-YYYYMMDD-HHMMSS), else
    the date a results file's name starts with (YYYY-MM-DD-NAME)."""
    match = re.search(r"(\d{4})(\d{2})(\d{2})-(\d{2})(\d{2})", name)
    day = re.match(r"\d{4}-\d{2}-\d{2}", name)
    return data.get("date") or (f"{match[1]}-{match[2]}-{match[3]} {match[4]}:{match[5]}" if match else day[0] if day else "not recorded")
