"""benchmarks/engine_laws.py: the audit of the p the verifier reads against the target's own law at every node, and
its results report."""

import json
import subprocess
import sys

import pytest

from specresearch import reports
from tests.helpers import ROOT, script

pytestmark = pytest.mark.e2e  # runs benchmarks/engine_laws.py's audit and the script


@pytest.mark.parametrize("drafter", ["independent", "tree", "pld", "lookahead", "self_draft"])
def test_the_p_the_verifier_reads_is_the_targets_own_law_at_every_node(drafter):
    """benchmarks/engine_laws.py's audit on tiny fp32 models: 8 rows x 8 tokens decoded as the battery's
    method side does (ragged drafts, rows leaving as they finish), every law the verifier read against
    a plain one-row forward of that node's context: equal to float precision at every node."""
    from specresearch import build_engine, compose

    laws = script("benchmarks/engine_laws.py")
    engine = build_engine(compose(["model=tiny", f"drafter={drafter}", "verifier=rejection", "sampling=random",
                                   "sampling.temperature=0.7"]))
    found = laws.audit(engine, list(range(3, 40)), rows=8, tokens=8, seed=0)
    assert {r["at"] for r in found} >= set(range(8))  # every position of the continuation had its law read
    assert len(found) >= 8 * 8 and max(r["tv"] for r in found) < 1e-4, max(r["tv"] for r in found)
    assert found[0]["rows"] == 8
    if drafter in ("tree", "self_draft"):  # their rows finish at different steps: later steps verify fewer of them
        assert min(r["rows"] for r in found) < 8


def test_engine_laws_writes_a_results_report(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_laws.py"), "--model", "tiny", "--rows", "4",
                             "--tokens", "6", "--drafter", "tree", "--json", str(tmp_path / "laws.json")],
                            capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "all steps" in result.stdout
    data = json.loads((tmp_path / "laws.json").read_text())
    assert reports.validate(data) == []
    assert data["rows"][0][0] == "all steps" and float(data["rows"][0][-1]) < 1e-4 and str(tmp_path) not in json.dumps(data)


@pytest.mark.parametrize("argv, says", [
    (["--model", "nope"], "error: unknown model 'nope': valid are qwen2.5-coder-0.5b, qwen2.5-coder-1.5b, smollm2-135m, tiny"),
    (["--drafter", "nope"], "error: unknown drafter 'nope': valid are cross_vocab, eagle, independent,"),
    (["--model", "tiny", "--json", "/proc/specresearch-x"],
     "error: cannot write the report /proc/specresearch-x (--json): cannot create a file in /proc (No such file or directory)"),
])
def test_a_bad_model_or_json_is_one_line_before_the_engine_is_built(argv, says, monkeypatch, capsys):
    """--model nope (a traceback from compose) and --json /proc/x (a traceback after the whole audit) are refused in
    one line, exit 2, before any model loads."""
    laws = script("benchmarks/engine_laws.py")
    monkeypatch.setattr(laws, "build_engine", lambda cfg: pytest.fail("the engine was built"))
    with pytest.raises(SystemExit) as exit_:
        laws.main(argv)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and line.startswith(says), line
