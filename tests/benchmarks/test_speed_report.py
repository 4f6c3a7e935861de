"""benchmarks/speed_report.py: a record benchmarks/speed.py writes becomes a report of the docs' one results
format (specresearch.reports) that keeps the record."""

import pytest

from specresearch import reports
from specresearch.errors import SpecResearchError
from tests.helpers import speed_report


def test_a_speed_record_becomes_a_report_that_keeps_it():
    record = {"header": "tiny <- tiny (cpu)", "date": "2026-11-28 10:00",
              "args": {"dataset": "humaneval", "prompts": 2, "offset": 0, "tokens": 8, "repeats": 1, "methods": "generate,pld"},
              "rows": [{"method": "generate", "tokens_per_s": 10.0, "speedup_vs_generate": 1.0, "speedup_interval": [1.0, 1.0]},
                       {"method": "pld(k=4)", "tokens_per_s": 12.0, "speedup_vs_generate": 1.2, "speedup_interval": [1.1, 1.3]}],
              "v_curve": [1.0, 1.2], "profile": {}}
    report = speed_report().report(record, "speed")
    assert reports.validate(report) == [] and report["topic"] == "speed" and report["date"] == "2026-11-28 10:00"
    assert reports.raw(report) is record and [row[0] for row in report["rows"]] == ["generate", "pld(k=4)"]
    assert report["command"] == ["python benchmarks/speed.py --dataset humaneval --prompts 2 --offset 0 --tokens 8 --repeats 1 "
                                 "--methods generate,pld"]
    assert speed_report().report(report, "again") is report  # a report is one already
    with pytest.raises(SpecResearchError, match="^x: not a record a benchmark writes"):
        speed_report().report({"rows": []}, "x")
