"""specresearch.options.conf's command (`python -m specresearch.config [--root DIR] [--check]`): a --root that is no
checkout is refused in one line, and a generated file that is not UTF-8 is out of date, not a traceback."""

from __future__ import annotations

import shutil

import pytest

from specresearch.config import write_conf
from specresearch.options.conf import CONF_DIR


@pytest.mark.parametrize("case, says", [("missing", "no such folder"), ("empty", "no conf/config.yaml there"),
                                        ("a file", "a file, not a folder")])
@pytest.mark.parametrize("check", [False, True])
def test_a_root_that_is_no_checkout_is_one_line(case, says, check, tmp_path, capsys):
    """--root <missing, empty or a file>: the write ended in a traceback, the check called every file out of date."""
    root = tmp_path / "root"
    if case == "empty":
        root.mkdir()
    elif case == "a file":
        root.write_text("keep me")
    with pytest.raises(SystemExit) as exit_:
        write_conf(["--root", str(root), *(["--check"] if check else [])])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert line.startswith(f"error: --root {root}: {says}: valid is a checkout, the folder holding conf/config.yaml (default "), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if case == "missing" else ["root"])
    assert case != "empty" or not any(root.iterdir())
    assert case != "a file" or root.read_text() == "keep me"


def test_a_generated_file_that_is_not_utf8_is_out_of_date_and_rewritten(tmp_path, capsys):
    """--check meeting a file of random bytes (a UnicodeDecodeError traceback) names it out of date, exit 1; the
    write mends it."""
    from specresearch.options import conf

    shutil.copytree(CONF_DIR, tmp_path / "conf", ignore=shutil.ignore_patterns("__pycache__"))
    assert write_conf(["--root", str(tmp_path)]) == 0  # a checkout of today's files (docs/options.md made)
    assert write_conf(["--root", str(tmp_path), "--check"]) == 0
    pld = tmp_path / "conf" / "drafter" / "pld.yaml"
    pld.write_bytes(bytes(range(128, 256)))
    assert write_conf(["--root", str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().err == "conf/drafter/pld.yaml is out of date: run python -m specresearch.config\n"
    assert write_conf(["--root", str(tmp_path)]) == 0
    assert pld.read_text(encoding="utf-8") == conf.files()["conf/drafter/pld.yaml"]
    assert write_conf(["--root", str(tmp_path), "--check"]) == 0
