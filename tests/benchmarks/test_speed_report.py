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


def test_a_record_of_bca_intervals_names_them_and_says_where_there_is_only_the_point():
    """speed.py's records name their interval (BCa over prompts): its column says so, and each row's interval note
    (only the point value, or none computed) is a note of the page, once; a record from before keeps `95% interval`."""
    degenerate = ("pld(k=4) over generate: no BCa interval (a degenerate sample, the same speedup on every prompt): "
                  "the point value 1.20x is shown as its interval")
    record = {"header": "tiny <- tiny (cpu)", "date": "2026-11-28 10:00", "interval_method": "BCa",
              "args": {"dataset": "humaneval", "prompts": 3, "offset": 0, "tokens": 8, "repeats": 1, "methods": "generate,pld"},
              "rows": [{"method": "generate", "tokens_per_s": 10.0, "speedup_vs_generate": 1.0, "speedup_interval": [1.0, 1.0],
                        "interval_notes": []},
                       {"method": "pld(k=4)", "tokens_per_s": 12.0, "speedup_vs_generate": 1.2, "speedup_interval": [1.2, 1.2],
                        "interval_notes": [degenerate]},
                       {"method": "pld(k=8)", "tokens_per_s": 12.0, "speedup_vs_generate": 1.2, "speedup_interval": [1.1, 1.3],
                        "interval_notes": [degenerate]}],
              "v_curve": [], "profile": {}}
    report = speed_report().report(record, "speed")
    assert reports.validate(report) == [] and report["columns"][3:5] == ["vs generate", "95% BCa interval"]
    assert report["rows"][1][3:5] == ["1.20x", "1.20-1.20"] and report["notes"].count(degenerate) == 1
    before = {k: v for k, v in record.items() if k != "interval_method"}  # a percentile bootstrap's record, before BCa
    before["rows"] = [{k: v for k, v in r.items() if k != "interval_notes"} for r in record["rows"]]
    page = speed_report().report(before, "speed")
    assert page["columns"][4] == "95% interval" and degenerate not in page["notes"]


def test_a_drafters_note_gives_its_time_split_and_the_draft_tokens_it_verified_a_step():
    """speed.py's rows since 2026-12-06 hold `nodes_per_step` (a Medusa tree's size shows here); a record from before has
    the time split alone."""
    split = {"prefill": 0.1, "draft": 0.2, "verify": 0.7}
    record = {"header": "tiny <- tiny (cpu)", "date": "2026-12-06 10:00",
              "args": {"dataset": "humaneval", "prompts": 2, "offset": 0, "tokens": 8, "repeats": 1, "methods": "generate,pld,tree"},
              "rows": [{"method": "generate", "tokens_per_s": 10.0, "speedup_vs_generate": 1.0},
                       {"method": "pld(k=4)", "tokens_per_s": 12.0, "speedup_vs_generate": 1.2, "time_split": split},
                       {"method": "tree(depth=4)", "tokens_per_s": 11.0, "speedup_vs_generate": 1.1, "time_split": split,
                        "nodes_per_step": 7.25}]}
    notes = speed_report().report(record, "speed")["notes"]
    assert "pld(k=4): time split prefill 10%, draft 20%, verify 70%" in notes
    assert "tree(depth=4): time split prefill 10%, draft 20%, verify 70%; 7.2 draft tokens verified a step" in notes
