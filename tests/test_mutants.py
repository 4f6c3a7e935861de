"""The lossy mutants of tests/mutants.py stay armed: each one's edits still apply, once each, to today's
sources, the mutated file still parses, and its law-test selection still picks tests. A refactor that
moves a line a mutant edits fails here in seconds, not at the next 50-minute mutant run. A --json it cannot use is
refused before any mutant runs."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests import mutants

LAW_TESTS = "(sampled_output or exact_law)"  # what mutants.run selects in tests/verifiers/test_lossless.py


def collect(root: Path) -> list[str]:
    """The node ids of the law tests of the checkout at `root` (in a child: pytest does not nest)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/verifiers/test_lossless.py", "-k", LAW_TESTS], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(root)})
    ids = [line for line in out.stdout.splitlines() if line.startswith("tests/verifiers/test_lossless.py::")]
    assert ids, out.stdout[-2000:] + out.stderr[-2000:]
    return ids


@pytest.fixture(scope="module")
def law_test_ids() -> list[str]:
    return collect(mutants.ROOT)


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_mutant_applies_to_todays_sources(mutant, tmp_path):
    (tmp_path / mutant.file).parent.mkdir(parents=True)
    (tmp_path / mutant.file).write_text((mutants.ROOT / mutant.file).read_text())
    mutants.apply(mutant, tmp_path)  # exits naming the edit whose text is not there exactly once
    mutated = (tmp_path / mutant.file).read_text()
    assert mutated != (mutants.ROOT / mutant.file).read_text()
    ast.parse(mutated, mutant.file)


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_mutant_selects_law_tests(mutant, law_test_ids, tmp_path):
    """Its -k picks law tests (pytest's matching: a name that is a substring of the test's id); where the
    mutant itself adds the tests (a rule that claims to be lossless joins the law tests), in its mutated copy."""
    expression = Expression.compile(mutant.select)

    def picked(ids: list[str]) -> list[str]:
        return [test for test in ids if expression.evaluate(lambda name, test=test: name.lower() in test.lower())]

    if not picked(law_test_ids):
        mutants.scratch_copy(tmp_path)
        mutants.apply(mutant, tmp_path)
        law_test_ids = collect(tmp_path)
    assert picked(law_test_ids), f"mutant {mutant.name}: -k {mutant.select!r} picks none of the {len(law_test_ids)} law tests"


def test_a_moved_line_disarms_a_mutant(tmp_path):
    """The check can fail: a source without the mutant's text is refused."""
    mutant = mutants.MUTANTS[0]
    (tmp_path / mutant.file).parent.mkdir(parents=True)
    (tmp_path / mutant.file).write_text("x = 1\n")
    with pytest.raises(SystemExit, match=mutant.name):
        mutants.apply(mutant, tmp_path)


@pytest.mark.parametrize("case", ["in /proc", "random bytes", "not JSON", "a JSON list", "rows of another shape"])
def test_a_bad_json_is_one_line_before_any_mutant_runs(case, tmp_path, monkeypatch, capsys):
    """--json where no file can be written ended in a traceback after every mutant ran; with --only, an existing --json
    that is not a report of this command (its other rows are kept) ended in one before: both now one line, exit 2."""
    monkeypatch.setattr(mutants, "run", lambda *a, **k: pytest.fail("a mutant ran"))
    path = tmp_path / "mutants.json"
    content = {"random bytes": bytes(range(128, 256)) * 4, "not JSON": b"mutants: 28 killed\n", "a JSON list": b"[1, 2]",
               "rows of another shape": json.dumps({"command": ["python -m tests.mutants"],
                                                    "data": {"mutants": [{"mutant": "accept-power-0.9"}]}}).encode()}
    if case == "in /proc":
        path = Path("/proc/specresearch-x.json")
    else:
        path.write_bytes(content[case])
    with pytest.raises(SystemExit) as exit_:
        mutants.main(["--only", mutants.MUTANTS[0].name, "--json", str(path)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2, line
    assert line.startswith({
        "in /proc": f"error: cannot write the report {path} (--json): cannot create a file in /proc (No such file or directory)",
        "random bytes": f"error: --json {path} cannot be read as JSON (UnicodeDecodeError): give the report",
        "not JSON": f"error: --json {path} cannot be read as JSON (JSONDecodeError): give the report",
        "a JSON list": f"error: --json {path} is not a report of python -m tests.mutants (command: a list of strings; data.mutants:",
        "rows of another shape": f"error: --json {path} is not a report of python -m tests.mutants",
    }[case]), line
    if case != "in /proc":
        assert path.read_bytes() == content[case]  # left as it was
