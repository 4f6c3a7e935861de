"""benchmarks/flagship.py: one table that puts task quality and the battery's verdict beside the speed rows, and
refuses a malformed report, a run folder without its Hydra files, an unreadable summary or an unwritable --out in one line."""

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, results_hook

pytestmark = pytest.mark.e2e  # runs benchmarks/flagship.py as its users do


def test_flagship_table_puts_quality_and_the_battery_beside_the_speed_rows(tmp_path):
    """benchmarks/flagship.py: each speed report's reference, assisted and speculative rows (other plain decodings
    left on the run's own page), and beside the row of the same text, temperature, drafter and verifier the pass@1
    of an eval run and the battery's verdict of a stats run; a run that matches no row is said so; the docs render it."""
    report = {
        "header": "qwen <- qwen (bf16, cpu): 3 HumanEval prompts x 96 tokens x 1 repeats, sampled at T = 0.7",
        "args": {"dataset": "humaneval", "offset": 150, "prompts": 3, "tokens": 96, "repeats": 1, "temperature": 0.7,
                 "methods": "generate,baseline,medusa:verifier=typical", "json": "x.json"},
        "rows": [{"method": "generate", "speedup_vs_generate": 1.0, "identical_to_reference": None},
                 {"method": "baseline", "speedup_vs_generate": 0.98, "identical_to_reference": None},
                 {"method": "medusa(depth=1) verifier=typical", "speedup_vs_generate": 1.25, "alpha": 0.4, "tau": 1.4,
                  "identical_to_reference": None},
                 {"method": "pld(k=4)", "speedup_vs_generate": 1.1, "alpha": 0.3, "tau": 1.2, "identical_to_reference": None}],
    }
    speed_json = tmp_path / "2026-11-28-flagship-humaneval-t07.json"
    speed_json.write_text(json.dumps(report))

    def run(name, dataset, drafter, summary):
        folder = tmp_path / name
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "hydra.yaml").write_text(
            f"hydra:\n  runtime:\n    choices:\n      drafter: {drafter}\n      verifier: typical\n")
        (folder / ".hydra" / "config.yaml").write_text(f"dataset:\n  name: {dataset}\nsampling:\n  temperature: 0.7\n")
        (folder / ".hydra" / "overrides.yaml").write_text(f"- drafter={drafter}\n- verifier=typical\n- sampling.temperature=0.7\n")
        (folder / "summary.json").write_text(json.dumps({"status": "FINISHED", **summary}))
        return str(folder)

    quality = run("02-00-00", "humaneval", "medusa", {"method_pass@1": 0.4, "baseline_pass@1": 0.45, "problems": 20,
                                                       "mcnemar_p": 0.62})
    stats = run("02-30-00", "humaneval", "medusa", {"eq_reject": 1.0, "eq_alpha": 0.01, "eq_samples_method": 600, "eq_length": 8,
                                                     "eq_samples_baseline": 600, "eq_power_min_tv_position": 0.12, "eq_tv_position": 0.3,
                                                     "eq_tv_position_null": 0.05, "eq_top1_share_method": 0.92,
                                                     "eq_top1_share_baseline": 0.84})
    stray = run("03-00-00", "mtbench", "eagle", {"eq_reject": 0.0, "eq_alpha": 0.01, "eq_samples_method": 10,
                                                  "eq_samples_baseline": 10})
    out = tmp_path / "flagship.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(speed_json),
                             "--run", quality, stats, stray, "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    rows = {row[3]: row for row in data["rows"]}
    assert list(rows) == ["generate", "medusa(depth=1) verifier=typical", "pld(k=4)", "eagle verifier=typical"]  # our baseline: on its page
    assert rows["pld(k=4)"][7].startswith("lossless: rejection sampling")  # speed.py's default verifier at T > 0, no battery run
    medusa = rows["medusa(depth=1) verifier=typical"]
    assert medusa[:2] == ["code (HumanEval)", "0.7"] and medusa[4] == "1.25x" and medusa[5] == "1.40"
    assert medusa[6] == "pass@1 0.40 vs target 0.45 (the first 20 problems, one sample each; McNemar p 0.62)"
    assert medusa[7] == ("**different** from the target (Holm at 0.01; 600 vs 600 sequences of 8 tokens, detects a position TV of 0.12; "
                         "position TV 0.30 (noise floor 0.05), top-1 share 0.92 vs 0.84)")
    assert rows["generate"][6] == rows["generate"][7] == ""
    stray_row = rows["eagle verifier=typical"]  # no speed row of its key: a row of its own, its speed left to its page
    assert stray_row[:2] == ["chat (MT-bench)", "0.7"] and stray_row[4] == "" and stray_row[-1] == "run 03-00-00"
    assert stray_row[7].startswith("not distinguishable from the target (Holm at 0.01; 10 vs 10 sequences")
    assert "specresearch drafter=medusa verifier=typical sampling.temperature=0.7   # 02-00-00" in data["command"]
    assert data["command"][0].startswith("python benchmarks/speed.py --dataset humaneval --offset 150")
    assert data["machine"] == "qwen <- qwen (bf16, cpu)" and data["date"] == "2026-11-28"  # the date: the report file's name
    hook = results_hook()
    target = tmp_path / "data.json"
    target.write_text(out.read_text())
    page = hook.render(hook.load(target), "data.json")
    assert "| code (HumanEval) |" in page and "Same in every row: T = 0.7" in page  # a constant column, said once



@pytest.mark.parametrize("content, says", [
    (b"\x89\xff\x00random", "not a benchmarks/speed.py report"),
    (b"{}", "not a benchmarks/speed.py report"),
    (b"[1, 2]", "not a benchmarks/speed.py report"),
    (b'{"header": "x", "args": {"dataset": "humaneval"', "not a benchmarks/speed.py report"),
    (json.dumps({"header": "x", "args": {"dataset": "humaneval", "prompts": 2, "offset": 0, "tokens": 8},
                 "rows": [{"method": "baseline", "speedup_vs_baseline": 1.0}]}).encode(), "rows without a speedup over transformers' generate"),
    (json.dumps({"header": "x", "args": {"dataset": "humaneval", "prompts": 2, "offset": 0, "tokens": 8},
                 "rows": [{"method": "pld k=4", "speedup_vs_generate": "fast", "alpha": 0.5}]}).encode(), "a benchmarks/speed.py report with a value of the wrong kind: ValueError"),
    (json.dumps({"header": "x", "args": {"dataset": "mtbench", "prompts": 2, "offset": "a", "tokens": 8},
                 "rows": [{"method": "generate", "speedup_vs_generate": 1.0}]}).encode(), "a benchmarks/speed.py report with a value of the wrong kind: TypeError"),
])
def test_flagship_refuses_a_malformed_report_in_one_line(tmp_path, content, says):
    """Random bytes, {}, a list, cut JSON, a report without transformers' rows: one `error:` line, exit 2, nothing written."""
    report = tmp_path / "report.json"
    report.write_bytes(content)
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(report), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {report}: {says}"), result.stderr
    assert not out.exists()


def test_flagship_refuses_a_run_folder_without_its_hydra_files(tmp_path):
    good = tmp_path / "speed.json"
    good.write_text(json.dumps({"header": "x (y): z", "args": {"dataset": "humaneval", "prompts": 1, "offset": 0, "tokens": 8},
                                "rows": [{"method": "generate", "speedup_vs_generate": 1.0}]}))
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(good), "--run", str(run),
                             "--out", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        result.stderr.strip().splitlines()[0]] and "not the output folder of a specresearch run" in result.stderr
    assert "Traceback" not in result.stderr


def _flagship_run(folder, summary):
    """A specresearch run folder as flagship.py reads it: .hydra/'s three files and summary.json."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "hydra.yaml").write_text("hydra:\n  runtime:\n    choices: {drafter: medusa, verifier: typical}\n")
    (folder / ".hydra" / "config.yaml").write_text("dataset: {name: humaneval}\nsampling: {temperature: 0.7}\n")
    (folder / ".hydra" / "overrides.yaml").write_text("- drafter=medusa\n")
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


@pytest.mark.parametrize("summary", [{"method_pass@1": "high", "baseline_pass@1": 0.5, "problems": 4, "mcnemar_p": 1.0},
                                     {"eq_reject": True}, [1, 2]])
def test_flagship_names_the_run_whose_summary_it_cannot_read(tmp_path, summary):
    """A summary.json with a value of the wrong kind, a battery's verdict without its numbers, or not a mapping: one line
    naming the run's folder (not the speed report), exit 2, nothing written."""
    good = tmp_path / "speed.json"
    good.write_text(json.dumps({"header": "x (y): z", "args": {"dataset": "humaneval", "prompts": 1, "offset": 0, "tokens": 8},
                                "rows": [{"method": "generate", "speedup_vs_generate": 1.0}]}))
    run = _flagship_run(tmp_path / "run", summary)
    out = tmp_path / "out.json"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(good), "--run", str(run),
                             "--out", str(out)], capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {run}: not the output folder"), result.stderr
    assert not out.exists()


@pytest.mark.parametrize("out", ["/proc/x", "{tmp}", "{tmp}/speed.json/x", "{tmp}/missing/out.json"])
def test_flagship_refuses_an_out_it_cannot_write_before_reading_anything(tmp_path, out):
    """--out in /proc (which os.access calls writable), a folder, under a file, in a missing folder: argparse's one line,
    exit 2, before the reports are read (the report here is not even JSON)."""
    bad = tmp_path / "speed.json"
    bad.write_text("not json")
    out = out.format(tmp=tmp_path)
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "flagship.py"), "--speed", str(bad), "--out", out],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"flagship.py: error: --out {out}: cannot write the results file there (a file in a writable folder); checked before any work")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["speed.json"]  # no probe left behind
