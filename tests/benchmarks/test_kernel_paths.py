"""benchmarks/kernel_paths.py: the target's law along three kernel paths, its results report, and its refusals."""

import json

import pytest

from specresearch import reports
from tests.helpers import script

pytestmark = pytest.mark.e2e  # runs benchmarks/kernel_paths.py as its users do


def test_kernel_paths_writes_a_results_report_into_a_new_folder(tmp_path, capsys):
    """On the tiny fp32 model every pair of paths agrees to float precision; --json's folder is made."""
    paths = script("benchmarks/kernel_paths.py")
    out = tmp_path / "new" / "paths.json"
    assert paths.main(["--model", "tiny", "--tokens", "4", "--rows", "2", "--json", str(out)]) == 0
    assert "1 token a forward, 1 row" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert reports.validate(data) == [] and len(data["data"]["pairs"]) == 15  # 6 paths, every pair
    assert all(pair["max"] < 1e-4 for pair in data["data"]["pairs"])


@pytest.mark.parametrize("argv, says", [
    (["--model", "nope"], "error: unknown model 'nope': not an embedded model (choices: qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, "
                          "smollm2-135m, gemma-3-270m, tiny), not a local directory or .gguf file"),
    (["--model", "tiny", "--json", "/proc/specresearch-x"],
     "error: cannot write the report /proc/specresearch-x (--json): cannot create a file in /proc (No such file or directory)"),
])
def test_a_bad_model_or_json_is_one_line_before_the_model_loads(argv, says, monkeypatch, capsys):
    """--model nope and --json /proc/x ended in tracebacks (the second after the measurement): now one line, exit 2;
    --json is checked before the model loads, and the loader refuses an unknown name before it reads anything."""
    from specresearch.models import load_model

    paths = script("benchmarks/kernel_paths.py")
    loaded = []
    monkeypatch.setattr(paths, "load_model", lambda name, **kw: loaded.append(name) or load_model(name, **kw))
    with pytest.raises(SystemExit) as exit_:
        paths.main(argv)
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and line.startswith(says), line
    assert loaded == (["nope"] if "nope" in argv else [])
