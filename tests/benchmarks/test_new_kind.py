"""benchmarks/new_kind.py: the runbook for a CPU kind without held-out numbers, as resumable steps, and the headline
rows its held-out reports back. Every test works in tmp_path (--data, --source and the pages): the checkout's reports
and pages are never touched."""

import json
import shutil

import pytest

from tests.helpers import ROOT, script

new_kind = script("benchmarks/new_kind.py")
headline = script("benchmarks/headline.py")
DATA = ROOT / "docs" / "results" / "data"


def test_dry_lists_each_step_with_its_command_and_report_and_runs_nothing(tmp_path, capsys):
    assert new_kind.main(["--dry", "--kind", "AVX2", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("AVX2 (float32): 6 step(s)")
    for step in new_kind.STEPS:
        name = step.report("AVX2")
        assert f"] {name}: {step.what}\n  python benchmarks/{step.script} " in out, name
        assert f"--json {tmp_path}/" in out and f"-{name}.json" in out
    assert "--dtype float32 --kernels torch,skinny,packed" in out  # the cost curve in the kind's dtype
    assert list(tmp_path.iterdir()) == []


def test_a_step_whose_report_reads_is_done_and_one_cut_short_is_not(tmp_path, capsys):
    shutil.copy(DATA / "2026-12-05-kernel-costs-amx-bf16.json", tmp_path / "2026-01-02-kernel-costs-avx2-fp32.json")
    (tmp_path / "2026-01-02-heldout-avx2-fp32-mtbench.json").write_text('{"rows": [')  # a write cut short
    assert new_kind.main(["--dry", "--kind", "AVX2", "--data", str(tmp_path), "--only", "kernel-costs,heldout-mtbench"]) == 0
    out = capsys.readouterr().out
    assert f"  done: {tmp_path}/2026-01-02-kernel-costs-avx2-fp32.json" in out
    assert "heldout-avx2-fp32-mtbench: held out, chat\n  python benchmarks/speed.py --dataset mtbench" in out
    assert "2 step(s)" in out and "tune-chain-shape" not in out
    # a done step's first numbers: v(9) and v(17) of each kernel (those of the page copied)
    assert "\nAVX2's reports:\n  2026-01-02-kernel-costs-avx2-fp32: torch v(9) 0.91 v(17) 1.23, skinny v(9) 1.00 v(17) 1.44, " in out


def test_a_done_report_whose_numbers_do_not_read_is_said_so_and_a_json_list_is_not_done(tmp_path, capsys):
    (tmp_path / "2026-01-02-heldout-avx2-fp32-humaneval.json").write_text('{"data": 5}')
    (tmp_path / "2026-01-02-kernel-costs-avx2-fp32.json").write_text('{"rows": [["1x9"]], "columns": ["v torch"]}')
    (tmp_path / "2026-01-02-battery-rates-avx2-fp32.json").write_text("[1]")
    assert new_kind.main(["--dry", "--kind", "AVX2", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "  2026-01-02-heldout-avx2-fp32-humaneval: its numbers could not be read (KeyError: 'rows'): is it this step's report?" in out
    assert "  2026-01-02-kernel-costs-avx2-fp32: \n" in out  # no 1x17 row: no v(17) to give
    assert "battery-rates-avx2-fp32: the battery's draws per second on the real pair, on W @ x^T and the default kernels\n  python " in out


@pytest.mark.parametrize("args, line", [
    (["--only", "kernel-costs,nope"], "error: unknown step(s) nope in --only: valid are kernel-costs, tune-chain-shape-humaneval, "
                                      "tune-chain-shape-sharegpt, heldout-humaneval, heldout-mtbench, battery-rates"),
    (["--dry", "--kind", "AVX512"], "error: --kind AVX512: the headline has tables for AMX, AVX-512 BF16, AVX2 only"),
    (["--dry", "--source", "{tmp}/none.json"], "error: {tmp}/none.json: cannot read it (No such file or directory)"),
])
def test_a_bad_input_is_refused_in_one_line(tmp_path, capsys, args, line):
    assert new_kind.main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line.format(tmp=tmp_path)) and err.count("\n") == 1


def test_another_kinds_steps_are_not_measured_here(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(new_kind, "cpu_kind", lambda: "AMX")
    assert new_kind.main(["--kind", "AVX2", "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: --kind AVX2: this machine is AMX; a kind's numbers are measured on it (--dry lists them)\n"


def test_steps_run_in_order_a_failure_stops_the_run_and_a_second_run_goes_on_after_the_done(tmp_path, capsys, monkeypatch):
    """Two real, quick speed.py runs stand in for the runbook's hours: the first writes its report; the second is refused
    by speed.py (exit 2, no report), which stops the run; run again, the first is done and only the second runs."""
    quick = new_kind.Step("quick-{K}", "speed.py", ("--quick", "--methods", "generate,baseline", "--tracker", "none"), "a quick run")
    failing = new_kind.Step("failing-{K}", "speed.py", ("--quick", "--methods", "nope", "--tracker", "none"), "a refused run")
    monkeypatch.setattr(new_kind, "STEPS", (quick, failing))
    monkeypatch.setattr(new_kind, "cpu_kind", lambda: "AVX2")
    args = ["--kind", "AVX2", "--data", str(tmp_path / "data"), "--source", str(ROOT / "docs" / "results" / "headline.json")]
    assert new_kind.main(args) == 1
    out, err = capsys.readouterr()
    (report,) = (tmp_path / "data").glob("*-quick-avx2-fp32.json")
    assert [row["method"] for row in headline.reports.raw(json.loads(report.read_text()))["rows"]] == ["generate", "baseline"]
    assert f"wrote {report}" in out and "error: step failing-avx2-fp32 failed (exit 2)" in err
    assert new_kind.main(args) == 1
    out, err = capsys.readouterr()
    assert f"[1/2] quick-avx2-fp32: a quick run\n  done: {report}" in out and "error: step failing-avx2-fp32 failed" in err


def _held_out(tmp_path, kind="AVX2"):
    """headline.json without `kind`'s headlines (should the checkout have them by now) and its reports in tmp_path, with
    the AMX held-out reports copied as `kind`'s (their header's kind changed to it)."""
    data = tmp_path / "data"
    data.mkdir()
    source = tmp_path / "headline.json"
    items = [item for item in json.loads((ROOT / "docs" / "results" / "headline.json").read_text()) if item["kind"] != kind]
    source.write_text(json.dumps(items))
    for item in items:
        shutil.copy(DATA / f"{item['report']}.json", data)
    for dataset in ("humaneval", "mtbench"):
        report = json.loads((DATA / f"2026-12-05-heldout-amx-{dataset}-bf16.json").read_text())
        report["data"]["header"] = report["data"]["header"].replace("x86_64 AMX", f"x86_64 {kind}")
        (data / f"2026-12-07-heldout-{new_kind.slug(kind)}-{dataset}.json").write_text(json.dumps(report))
    return source, data


def test_a_new_kinds_held_out_reports_add_its_headlines_once(tmp_path):
    source, data = _held_out(tmp_path)
    before = json.loads(source.read_text())
    added = new_kind.add_headlines("AVX2", source, data)
    code, chat = "2026-12-07-heldout-avx2-fp32-humaneval", "2026-12-07-heldout-avx2-fp32-mtbench"
    assert [(h["report"], h["method"], h.get("expect", False)) for h in added] == [
        (code, "independent(k=16)", True), (chat, "independent(k=16)", True), (code, "medusa", False), (chat, "medusa", False),
        (code, "hf_assisted", False)]  # the 11-29 fastest setting was not measured by the runbook: no row
    assert json.loads(source.read_text()) == before + added
    assert {h["what"] for h in added} <= {h["what"] for h in before if h["kind"] == "AMX"}
    items = headline.headlines(source, data)
    assert [round(h["speedup"], 2) for h in items if h["kind"] == "AVX2"] == [2.43, 1.90, 1.70, 1.45, 1.45]  # the copied reports' numbers
    assert new_kind.add_headlines("AVX2", source, data) == []  # the kind has its headlines: nothing more


def test_no_headline_is_added_before_both_held_out_reports_are_there(tmp_path):
    source, data = _held_out(tmp_path)
    (data / "2026-12-07-heldout-avx2-fp32-mtbench.json").unlink()
    before = source.read_text()
    assert new_kind.add_headlines("AVX2", source, data) == [] and source.read_text() == before


def test_headlines_a_report_cannot_back_are_not_added(tmp_path):
    """A held-out report of the new kind whose header names another kind: headline.py refuses it, headline.json stays."""
    source, data = _held_out(tmp_path, kind="AVX2")
    path = data / "2026-12-07-heldout-avx2-fp32-humaneval.json"
    report = json.loads(path.read_text())
    report["data"]["header"] = report["data"]["header"].replace("x86_64 AVX2", "x86_64 AMX")
    path.write_text(json.dumps(report))
    before = source.read_text()
    with pytest.raises(new_kind.NewKindError, match="^the new headlines of AVX2 were not added .*its header says it ran on an AMX CPU"):
        new_kind.add_headlines("AVX2", source, data)
    assert source.read_text() == before


def test_the_main_run_adds_the_headlines_and_writes_the_pages(tmp_path, capsys, monkeypatch):
    source, data = _held_out(tmp_path)
    for page in ("README.md", "index.md"):
        shutil.copy(ROOT / (page if page == "README.md" else "docs/index.md"), tmp_path / page)
    monkeypatch.setattr(new_kind, "STEPS", tuple(s for s in new_kind.STEPS if s.name.startswith("heldout")))  # both done
    monkeypatch.setattr(new_kind, "cpu_kind", lambda: "AVX2")
    pages = ["--readme", str(tmp_path / "README.md"), "--index", str(tmp_path / "index.md"), "--expect", str(tmp_path / "held_out.json")]
    assert new_kind.main(["--data", str(data), "--source", str(source), *pages]) == 0
    out = capsys.readouterr().out
    assert "  2026-12-07-heldout-avx2-fp32-humaneval: generate 1.00x [1.00-1.00], baseline 0.97x [0.91-1.00], " in out
    assert "added 5 headline(s) of AVX2" in out and "Medusa's tree (shape=auto) on AVX2: " not in out  # (before nodes_per_step)
    readme = (tmp_path / "README.md").read_text()
    assert "**CPUs with AVX2** (`dtype=auto` runs float32 there)\n\n| setting" in readme
    assert [h["kind"] for h in json.loads((tmp_path / "held_out.json").read_text())["headlines"]].count("AVX2") == 2
