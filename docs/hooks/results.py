"""MkDocs hook: pages generated at build time, never pasted.

- `results/NAME.md` for every `docs/results/data/NAME.json`. Three formats are read:
  a curated table (`title`, `date`, `machine`, `command`, `columns`, `rows`, `notes`, optionally
  `prompts`), the report `benchmarks/speed.py --json` writes (`header`, `args`, `rows`,
  `v_curve`, `profile`; with `--batch`: `batches` and `crossover` instead of `rows` and `v_curve`)
  and the one `benchmarks/gpu_check.py` writes (`script`, `versions`, `device`, `matrix`, `speed`);
  a report may carry a `title` and `notes` of its own. Drop such a file into the folder and it
  becomes a page.
- `results/index.md`: every results page, newest first.
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
import math
import re
import shlex
from pathlib import Path

from mkdocs.structure.files import File

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
        notes.append(f"Matrix on {m.get('device', device.get('type'))} (tiny random model, fp32): T = 0 {s['t0_identical']}/{s['t0_cells']} "
                     f"drafter x verifier cells identical to plain decoding; T = 1 {s['t1_ok']}/{s['t1_runs']} ran; other modes "
                     f"{s['modes_ok']}/{s['modes']} passed, {s['modes_refused']} refused; our baseline == generate: {s['baseline_equals_generate']}.")
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
                    f"tokens, greedy, EOS ignored, {sp.get('repeats')} rounds in rotating order (tok/s over all of them)") if rows else None,
        "columns": columns,
        "rows": table_rows or [["(no speed section)", *[""] * (len(columns) - 1)]],
        "notes": data.get("notes", []) + notes,
    }


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(columns: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
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
    columns = ["method", "tok/s", "±", ref.replace("speedup_", "").replace("_", " "), "95% interval" if interval else "min-max", "vs baseline",
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
        "title": data.get("title") or f"benchmarks/speed.py: {dataset}, {args.get('prompts', '?')} prompts x {args.get('tokens', '?')} tokens",
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
        out["extra"] = "## Profile\n\n" + _table(
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


def load(path: Path) -> dict:
    """A data file in the curated format (speed.py reports converted). Refuses one without a
    command or a machine: every results page states both."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if is_gpu_check(data):
        data = gpu_check_to_table(data, path.stem)
    elif is_batch_report(data):
        data = batch_to_table(data, path.stem)
    elif is_speed_report(data):
        data = speed_to_table(data, path.stem)
    for key in ("title", "date", "machine", "command", "columns", "rows"):
        if not data.get(key):
            raise ValueError(f"{path}: results data needs a non-empty {key!r}")
    if isinstance(data["command"], str):
        data["command"] = [data["command"]]
    if isinstance(data.get("notes"), str):
        data["notes"] = [data["notes"]]
    return data


def render(data: dict, source: str) -> str:
    parts = [
        f"# {data['title']}",
        f"**Date:** {data['date']}  \n**Machine:** {data['machine']}",
    ]
    if data.get("prompts"):
        parts.append(f"**Prompts:** {data['prompts']}")
    parts.append("**Command:**\n\n```bash\n" + "\n".join(data["command"]) + "\n```")
    parts.append(_table(data["columns"], data["rows"]))
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
        "(`docs/hooks/results.py`): one file per measured table, with the command that produced it",
        "and the machine it ran on. A report written by `benchmarks/speed.py --json` dropped into",
        "that folder becomes a page as it is. Commands use today's names (see the changelog's",
        "\"Renamed\" section). Timings are from one run on small CPUs unless a page says otherwise;",
        "compare numbers only within one page (one machine, one run).",
        "",
        "| date | result | machine |",
        "|---|---|---|",
    ]
    for stem, data in sorted(pages, key=lambda p: (str(p[1]["date"]), p[0]), reverse=True):
        machine = data["machine"].split(",")[0].split(";")[0]
        lines.append(f"| {data['date']} | [{_cell(data['title'])}]({stem}.md) | {_cell(machine)} |")
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


TOPICS = (  # the navigation's sections of results pages: (title, a pattern of the data file's name), the first match wins
    ("Headline and flagship", r"headline|flagship"),
    ("Law tests and calibration", r"mutants|calibration"),
    ("GPU", r"h100|h200|gpu"),
    ("Batches", r"batch"),
    ("Compiled decoding", r"compiled|avx2"),
    ("Cross-vocabulary drafts", r"cross-vocab"),
    ("Trained heads: Medusa, EAGLE", r"eagle|medusa"),
    ("Quality", r"quality"),
    ("Drafting settings", r"."),
)


def topic(stem: str) -> str:
    """The navigation section of the results page `stem` (TOPICS)."""
    return next(title for title, pattern in TOPICS if re.search(pattern, stem))


def on_config(config, **kwargs):
    docs = _docs_dir(config)
    sections: dict[str, list] = {title: [] for title, _ in TOPICS}  # newest first within each
    for p in reversed(data_files(docs)):
        sections[topic(p.stem)].append({load(p)["title"]: f"results/{p.stem}.md"})
    results = [{title: pages} for title, pages in sections.items() if pages]
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
        return (_table(data["columns"], data["rows"]) + f"\n\n<small>Measured {data['date']} ({data['machine']}); command and notes: "
                f"[{_cell(data['title'])}]({up}results/{name}.md).</small>")

    return TABLE_MARK.sub(table, markdown)
