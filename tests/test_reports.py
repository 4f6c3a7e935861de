"""The one results format (specresearch.reports): every committed results file is a report of it, no
committed file names a folder of the machine that wrote it, and a report that strays is refused in one line.
(A record a benchmark writes becoming a report: tests/benchmarks/test_speed_report.py, tests/benchmarks/test_gpu_check.py.)"""

import json

import pytest

from specresearch import reports
from specresearch.errors import SpecResearchError
from tests.helpers import ROOT

DATA = ROOT / "docs" / "results" / "data"


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.stem)
def test_every_results_file_is_a_report(path):
    report = json.loads(path.read_text(encoding="utf-8"))
    assert reports.validate(report) == [], path.name
    assert reports.machine_paths(path.read_text(encoding="utf-8")) == [], f"{path.name} names a folder of the machine that wrote it"


def test_no_file_of_the_package_names_a_folder_of_a_machine():
    files = [p for p in (ROOT / "specresearch").rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".json", ".md", ".txt")]
    found = {p.relative_to(ROOT).as_posix(): reports.machine_paths(p.read_text(encoding="utf-8")) for p in files}
    assert {name: paths for name, paths in found.items() if paths} == {}


def test_machine_paths_finds_homes_work_trees_and_drives_but_not_repository_paths():
    text = "ran /root/out/x.json in /work/main and C:\\Users\\me, wrote docs/results/data/x.json, see https://a.org/tmp/x"
    assert reports.machine_paths(text) == ["/root/out/x.json", "/work/main", "C:\\Users\\me,"]


def _report(**changed):
    return {"title": "t", "date": "2026-11-28", "machine": "a CPU", "command": ["python x.py"], "topic": "speed",
            "columns": ["method", "tok/s"], "rows": [["a", "1.0"]], **changed}


@pytest.mark.parametrize("changed,problem", [
    ({"topic": "fast"}, "unknown topic 'fast': valid are speed, batches, gpu, studies, quality, lossless"),
    ({"rows": [["a"]]}, "row 0 has 1 cells, the columns 2"),
    ({"command": "python x.py"}, "'command' must be a list, got str"),
    ({"header": "x"}, "unknown key 'header': valid are title, date, machine, command, topic, columns, rows, prompts, notes, extra, data"),
    ({"machine": ""}, "empty 'machine'"),
])
def test_a_report_that_strays_is_refused_in_one_line_naming_the_problem(changed, problem):
    assert reports.validate(_report()) == []
    with pytest.raises(SpecResearchError) as err:
        reports.checked(_report(**changed), "x.json")
    assert str(err.value) == f"x.json is not a results report: {problem}"


def test_a_scripts_command_gives_its_arguments_back_to_the_shell():
    """A page's command reruns its script: a list argument (nargs="+") as its items, a value with a space quoted."""
    import shlex

    report = reports.of_script("x.py", {"arms": ["independent", "medusa"], "grid": (0.3, 0.5), "what": "a b", "json": "out.json"},
                               {"processor": "cpu"}, "t")
    assert shlex.split(report["command"][0]) == ["python", "benchmarks/x.py", "--arms", "independent", "medusa", "--grid", "0.3", "0.5",
                                                 "--what", "a b"]
