"""specresearch/evaluation/hook.py, which specresearch-lm-eval.pth imports at interpreter start: its old
command line is gone, and says so."""

import subprocess
import sys


def test_the_removed_command_line_says_what_replaced_it_and_exits_2(tmp_path):
    """`python -m specresearch.evaluation.hook run ...` once ran lm-eval's command line; now it does nothing
    but say, in one error line, that `lm_eval run --model specresearch` replaced it, and exits 2."""
    run = subprocess.run([sys.executable, "-m", "specresearch.evaluation.hook", "run", "--model", "specresearch",
                          "--tasks", "stdlib_doctest", "--output_path", str(tmp_path / "out")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert lines[-1] == ("error: `python -m specresearch.evaluation.hook` was removed: run lm-eval's own command, "
                         "`lm_eval run --model specresearch ...` (docs/quality.md: 'The plain lm-eval command works too')")
    # before it, at most runpy's warning that the .pth had imported the module already
    assert all("RuntimeWarning" in line for line in lines[:-1]), lines
    assert run.stdout == "" and not (tmp_path / "out").exists()
