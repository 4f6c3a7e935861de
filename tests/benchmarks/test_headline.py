"""benchmarks/headline.py: the headline table of README.md and docs/index.md, written from speed reports; a bad input
is refused in one line (exit 2) before any page is written, so it can neither rewrite nor break the pages. Every test
works on copies in tmp_path (--source, --data, --readme, --index): the checkout's pages are never touched."""

import builtins
import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import ROOT, script

headline = script("benchmarks/headline.py")

RECORD = {"header": "tiny <- tiny (cpu, 1 thread): 8 HumanEval prompts x 16 tokens x 1 repeats, greedy", "date": "2026-11-28 10:00",
          "args": {"dataset": "humaneval", "prompts": 8, "offset": 0, "tokens": 16, "repeats": 1, "methods": "generate,pld"},
          "rows": [{"method": "generate", "tokens_per_s": 10.0, "speedup_vs_generate": 1.0, "speedup_interval": [1.0, 1.0]},
                   {"method": "pld(k=4)", "tokens_per_s": 15.0, "speedup_vs_generate": 1.5, "speedup_interval": [1.25, 1.75]}]}
ROW = "| prompt lookup, code | **1.50x** | 1.25-1.75x | 8 HumanEval from #0, 16 tokens |"


def run(tmp: Path, *more: str) -> int:
    """headline.py on the inputs and pages under `tmp`."""
    return headline.main(["--source", str(tmp / "headline.json"), "--data", str(tmp / "data"), "--readme", str(tmp / "README.md"),
                          "--index", str(tmp / "index.md"), "--expect", str(tmp / "held_out.json"), *more])


def pages(tmp: Path) -> dict[str, bytes]:
    return {name: (tmp / name).read_bytes() for name in ("README.md", "index.md", "held_out.json")}


def edit(path: Path, change) -> None:
    """Rewrite the JSON at `path` as `change` (given it, changing it in place) leaves it."""
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def checkout(tmp_path, capsys):
    """Copies of README.md and docs/index.md whose blocks are current for one report of a tiny run (written once)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "r.json").write_text(json.dumps(RECORD))
    (tmp_path / "headline.json").write_text(json.dumps([{"what": "prompt lookup, code", "report": "r", "method": "pld", "kind": "AVX2", "expect": True}]))
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copy(ROOT / "docs" / "index.md", tmp_path / "index.md")
    assert run(tmp_path) == 0 and run(tmp_path, "--check") == 0
    capsys.readouterr()
    return tmp_path


def test_the_table_is_written_from_the_report_into_both_pages(checkout, capsys):
    readme, index = ((checkout / name).read_text(encoding="utf-8") for name in ("README.md", "index.md"))
    assert f"{ROW} [r](docs/results/data/r.json) |" in readme and f"{ROW} [r](results/r.md) |" in index
    # the tiny run's header names no CPU kind (as speed.py's before 2026-12-03): the line says so and where it was filed
    assert ("Measured by `benchmarks/speed.py` (cpu, 1 thread in r, whose header names no CPU kind (speed.py names it since "
            "2026-12-03): filed as AVX2 by headline.json).") in readme
    for kind, dtype in headline.CPU_KINDS.items():  # a table for the kind measured, the others said to be not measured
        said = f"**CPUs with {kind}** (`dtype=auto` runs {dtype} there)"
        assert said + ("\n\n| setting" if kind == "AVX2" else ": not measured on held-out prompts") in readme, kind
    expect = json.loads((checkout / "held_out.json").read_text())["headlines"]  # what a run of tiny on an AVX2 CPU says
    assert [(h["model"], h["kind"], h["speedup"], h["interval"], h["report"]) for h in expect] == [("tiny", "AVX2", 1.5, [1.25, 1.75], "r")]
    outside = headline.BLOCK.sub("", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert headline.BLOCK.sub("", readme) == outside  # only the block changed
    assert run(checkout) == 0 and capsys.readouterr().out == "wrote nothing (current)\n"


def test_a_report_that_names_its_cpu_kind_is_shown_as_its_header_says(checkout):
    edit(checkout / "data" / "r.json", lambda r: r.update(header=RECORD["header"].replace("1 thread)", "1 thread, x86_64 AVX2)")))
    assert run(checkout) == 0
    assert "Measured by `benchmarks/speed.py` (cpu, 1 thread, x86_64 AVX2).\n" in (checkout / "README.md").read_text(encoding="utf-8")


def _source(value):
    return lambda tmp: (tmp / "headline.json").write_text(json.dumps(value))


def _headline(**fields):
    return _source([{"what": "prompt lookup, code", "report": "r", "method": "pld", "kind": "AVX2", **fields}])


def _without(key):
    return _source([{k: v for k, v in {"what": "prompt lookup, code", "report": "r", "method": "pld", "kind": "AVX2"}.items()
                    if k != key}])


def _report(change):
    return lambda tmp: edit(tmp / "data" / "r.json", change)


def _row(**fields):
    return _report(lambda r: r["rows"][1].update(fields))


def _bytes(name, data):
    return lambda tmp: (tmp / name).write_bytes(data)


BAD = {  # case -> (what it does to the inputs, the refusal: file, field and what it must be)
    "a newline and the end marker in 'what'": (_headline(what="x\n<!-- headline: end -->\nowned"),
                                               "{tmp}/headline.json, headline 1: 'what' must be one line of text without '<!--', '-->' or '|' (it is 'x\\n<!-- headline: end -->\\nowned')"),
    "the end marker alone in 'what'": (_headline(what="x <!-- headline: end -->"), "headline 1: 'what' must be one line of text without '<!--'"),
    "a '|' in 'what' (splits the row)": (_headline(what="a | b"), "headline 1: 'what' must be one line of text without '<!--', '-->' or '|' (it is 'a | b')"),
    "an empty 'what'": (_headline(what=" "), "headline 1: 'what' must be one line of text"),
    "a path as 'report'": (_headline(report="../r"), "headline 1: 'report' must be the name of a report in docs/results/data (letters, digits, '.', '_', '-'; no folder) (it is '../r')"),
    "a marker in the report's dataset": (_report(lambda r: r["args"].update(dataset="x -->")), "{tmp}/data/r.json: args.dataset must be one line of text without '<!--', '-->' or '|' (it is 'x -->')"),
    "a newline in the report's machine": (_report(lambda r: r.update(header="tiny (cpu\n<!-- x)")), "{tmp}/data/r.json: the machine in 'header' must be one line of text"),
    "an empty JSON object": (_source({}), "{tmp}/headline.json: expected a non-empty JSON list of headlines {{\"what\": ..., \"report\": ..., \"method\": ...}} (it is {{}})"),
    "an empty list": (_source([]), "{tmp}/headline.json: expected a non-empty JSON list of headlines"),
    "a headline not an object": (_source(["x"]), "{tmp}/headline.json, headline 1: expected an object {{\"what\", \"report\", \"method\"}} (it is 'x')"),
    "a missing headline file": (lambda tmp: (tmp / "headline.json").unlink(), "{tmp}/headline.json: cannot read it (No such file or directory); expected a non-empty JSON list"),
    "random bytes as the headline file": (_bytes("headline.json", bytes(range(128, 256))), "{tmp}/headline.json: not UTF-8 text; expected a non-empty JSON list"),
    "text, not JSON, as the headline file": (_bytes("headline.json", b"what: x\n"), "{tmp}/headline.json: not JSON (Expecting value at line 1); expected"),
    "random bytes as the report": (_bytes("data/r.json", bytes(range(128, 256))), "{tmp}/data/r.json: not UTF-8 text; expected a report benchmarks/speed.py --json writes"),
    "a report not an object": (_bytes("data/r.json", b"[1, 2]"), "{tmp}/data/r.json: expected a report benchmarks/speed.py --json writes, a JSON object (it is [1, 2])"),
    "a missing report": (_headline(report="nope"), "{tmp}/headline.json: no report {tmp}/data/nope.json"),
    "a missing key: 'method'": (_without("method"), "headline 1: 'method' must be a method of the report's rows (it is missing)"),
    "a missing key: 'what'": (_without("what"), "headline 1: 'what' must be one line of text without '<!--', '-->' or '|' (it is missing)"),
    "a missing key: the report's args": (_report(lambda r: r.pop("args")), "{tmp}/data/r.json: 'args' must be an object of speed.py's arguments (it is missing)"),
    "a missing key: args.tokens": (_report(lambda r: r["args"].pop("tokens")), "{tmp}/data/r.json: args.tokens must be an integer (it is missing)"),
    "a missing key: the report's rows": (_report(lambda r: r.pop("rows")), "{tmp}/data/r.json: 'rows' must be a list of speed.py's rows, each with its 'method' (it is missing)"),
    "a missing key: a row's method": (_report(lambda r: r["rows"][0].pop("method")), "{tmp}/data/r.json: 'rows' must be a list of speed.py's rows, each with its 'method'"),
    "a missing key: the speedup": (_report(lambda r: r["rows"][1].pop("speedup_vs_generate")), "{tmp}/data/r.json, row 'pld(k=4)': no 'speedup_vs_<reference>'"),
    "a string 'prompts'": (_report(lambda r: r["args"].update(prompts="8")), "{tmp}/data/r.json: args.prompts must be an integer (it is '8')"),
    "a one-number interval": (_row(speedup_interval=[1.5]), "{tmp}/data/r.json, row 'pld(k=4)': 'speedup_interval' must be [low, high], two numbers (it is [1.5])"),
    "a number as the interval": (_row(speedup_interval=1.5), "{tmp}/data/r.json, row 'pld(k=4)': 'speedup_interval' must be [low, high], two numbers (it is 1.5)"),
    "an interval of text": (_row(speedup_interval=["1", "2"]), "{tmp}/data/r.json, row 'pld(k=4)': 'speedup_interval' must be a number (it is '1')"),
    "a reversed interval": (_row(speedup_interval=[1.75, 1.25]), "'speedup_interval' must be [low, high] with low <= high (it is [1.75, 1.25])"),
    "a non-numeric speedup": (_row(speedup_vs_generate="fast"), "{tmp}/data/r.json, row 'pld(k=4)': 'speedup_vs_generate' must be a number (it is 'fast')"),
    "a boolean speedup": (_row(speedup_vs_generate=True), "'speedup_vs_generate' must be a number (it is True)"),
    "a missing key: 'kind'": (_without("kind"), "{tmp}/headline.json, headline 1: 'kind' must be the kind of CPU the report was "
                                                "measured on, one of AMX, AVX-512 BF16, AVX2 (it is missing)"),
    "torch's capability as the 'kind'": (_headline(kind="AVX512"), "headline 1: 'kind' must be the kind of CPU the report was "
                                                                   "measured on, one of AMX, AVX-512 BF16, AVX2 (it is 'AVX512')"),
    "a text as 'expect'": (_headline(expect="yes"), "{tmp}/headline.json, headline 1: 'expect' must be true or false (it is 'yes')"),
    "another kind in the report's header": (_report(lambda r: r.update(header="tiny <- tiny (cpu, 1 thread, x86_64 AMX): 8 x")),
                                            "{tmp}/data/r.json: its header says it ran on an AMX CPU; the headline names AVX2"),
}


@pytest.mark.parametrize("case", BAD)
def test_a_bad_input_is_refused_in_one_line_and_no_page_is_touched(case, checkout, capsys):
    """Each bad input, which wrote into the pages (a marker in 'what' ended the block early, so --check failed from then
    on; {} wiped the table) or raised a traceback, is one line naming the file, the field and what it must be: exit 2,
    and both pages as they were."""
    spoil, message = BAD[case]
    before = pages(checkout)
    spoil(checkout)
    for more in ([], ["--check"]):
        assert run(checkout, *more) == 2
        out = capsys.readouterr()
        assert out.err.startswith("error: ") and out.err.count("\n") == 1 and out.out == "", out.err
        assert message.format(tmp=checkout) in out.err, out.err
    assert pages(checkout) == before


def test_a_page_without_the_block_is_refused_before_the_other_is_written(checkout, capsys):
    """README is current-able, docs/index.md has lost its block: neither is written (README was, before the refusal)."""
    edit(checkout / "headline.json", lambda items: items[0].update(what="prompt lookup, code, again"))
    (checkout / "index.md").write_text("# no block\n")
    before = pages(checkout)
    assert run(checkout) == 2
    assert capsys.readouterr().err == f"error: {checkout / 'index.md'} has no <!-- headline: begin --> ... <!-- headline: end --> block\n"
    assert pages(checkout) == before


def test_a_read_only_checkout_is_refused_in_one_line_naming_the_page(checkout, capsys, monkeypatch):
    """docs/index.md cannot be written: one line naming it, exit 2, and README (written first before) left as it was."""
    edit(checkout / "headline.json", lambda items: items[0].update(what="prompt lookup, code, again"))
    before = pages(checkout)
    (checkout / "index.md").chmod(0o444)
    if os.geteuid() == 0:  # root writes through a file's mode: answer as the OS answers every other user
        def read_only_open(file, mode="r", *args, **kwargs):
            if mode != "r" and Path(file) == checkout / "index.md":
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
            return builtins.open(file, mode, *args, **kwargs)
        monkeypatch.setattr(headline, "open", read_only_open, raising=False)
    assert run(checkout) == 2
    assert capsys.readouterr().err == f"error: cannot write {checkout / 'index.md'} (Permission denied); nothing was written\n"
    assert pages(checkout) == before
