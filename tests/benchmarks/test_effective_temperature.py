"""benchmarks/effective_temperature.py: each rule's step law against the target's at other temperatures, its results
report, its refusals, and the lossless_vs_lossy study's table of its newest page."""

import json
import sys

import pytest
from specresearch.analysis.studies import builder

from specresearch import reports
from tests.helpers import script

pytestmark = pytest.mark.e2e  # runs benchmarks/effective_temperature.py as its users do


def test_rules_against_other_temperatures_write_a_results_report(tmp_path, capsys, monkeypatch):
    """On the tiny fp32 model rejection sampling's law is the target's at the run's T (TV 0, the nearest T'), a lossy
    rule's is not; the report validates and its command gives the arguments back."""
    temperature = script("benchmarks/effective_temperature.py")
    out = tmp_path / "new" / "2026-01-01-effective-temperature.json"
    argv = ["--model", "tiny", "--tokens", "3", "--prompts", "2", "--settings", "rejection", "topk_loose", "--grid", "0.5", "1",
            "--json", str(out)]
    assert temperature.main(argv) == 0
    assert "rejection (lossless)" in capsys.readouterr().out
    page = json.loads(out.read_text())
    assert reports.validate(page) == [] and page["data"]["grid"] == [0.5, 0.7, 1.0]
    rejection, topk = page["data"]["cells"]
    assert rejection["nearest_temperature"] == 0.7 and rejection["nearest_tv_mean"] < 1e-9 and rejection["tv_mean_at_0.5"] > 1e-4
    assert topk["tv_mean"] > 1e-3 and len(topk["curve"]) == 3
    assert "--settings rejection topk_loose --temperature 0.7 --grid 0.5 1.0" in page["command"][0]

    builder("lossless_vs_lossy")
    study = sys.modules["experiments.lossless_vs_lossy.analysis"]
    monkeypatch.setattr(study, "NUMERICS", out.parent)
    assert study.temperature_table({"qwen2.5-coder-1.5b"}) is None  # no page of the study's target
    table = study.temperature_table({"tiny"})
    assert table.name == "effective_temperature" and [r["setting"] for r in table.records] == ["rejection", "topk_loose"]
    assert table.columns[3].value(table.records[0]) == 0.7


@pytest.mark.parametrize("argv, says", [
    (["--json", "/proc/specresearch-x"], "error: cannot write the report /proc/specresearch-x (--json)"),
    (["--grid", "0"], "error: argument --grid: a temperature is a number > 0, got '0'"),
    (["--settings", "nope"], "error: argument --settings: invalid choice: 'nope'"),
])
def test_a_bad_argument_is_one_line_before_any_model_loads(argv, says, capsys):
    temperature = script("benchmarks/effective_temperature.py")
    with pytest.raises(SystemExit) as exit_:
        temperature.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and any(says in line for line in err), err
