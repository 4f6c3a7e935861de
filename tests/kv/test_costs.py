"""kv/costs.py: the cost curve shape=auto sizes trees with, kept once per machine and model in the model cache
(<cache>/costs/<model>/<key>.json): whatever lies there instead of a whole file (bytes, JSON of another shape, a
FIFO, a folder, a loop of links) is measured again, said once and never raised, blocked on or used."""

import json
import logging
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from specresearch.kv import kept_cost_curve


def kept_file(tmp_path: Path, monkeypatch, target, caplog) -> Path:
    """The tiny target's cost file, measured once into a model cache under tmp_path (a first measure says nothing)."""
    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="specresearch.kv"):
        kept_cost_curve(target, [2])
    assert "cost file" not in caplog.text
    (path,) = (tmp_path / "cache" / "costs" / "tiny").glob("*.json")
    return path


def measured_again(path: Path, target, caplog, call: Callable = kept_cost_curve) -> None:
    """kept_cost_curve after `path` was damaged: one warning naming it, costs measured anew and the file
    written whole in its place."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="specresearch.kv"):
        v, one = call(target, [2, 3])
    said = [r.getMessage() for r in caplog.records if "cost file" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and "measuring again" in said[0], caplog.text
    assert one > 0 and len(v) == 2 and all(math.isfinite(x) and x > 0 for x in v)
    again = json.loads(path.read_text())
    assert set(again["v"]) == {"2", "3"} and again["one_token_s"] > 0
    assert not list(path.parent.glob("*.tmp"))


def test_random_bytes_are_measured_again_not_a_unicode_error(tmp_path, monkeypatch, target, caplog):
    path = kept_file(tmp_path, monkeypatch, target, caplog)
    path.write_bytes(bytes(range(128, 256)) * 8)  # not UTF-8: UnicodeDecodeError before the fix
    measured_again(path, target, caplog)


def test_deep_nesting_is_measured_again_not_a_recursion_error(tmp_path, monkeypatch, target, caplog):
    path = kept_file(tmp_path, monkeypatch, target, caplog)
    path.write_text("[" * 100_000 + "]" * 100_000)  # JSON too deep for the parser: RecursionError before the fix
    measured_again(path, target, caplog)


def test_a_fifo_in_its_place_is_measured_again_without_blocking(tmp_path, monkeypatch, target, caplog):
    """Reading a FIFO no one writes blocks for ever: the file is not read, and the FIFO is replaced by a file."""
    path = kept_file(tmp_path, monkeypatch, target, caplog)
    path.unlink()
    os.mkfifo(path)
    failed = []

    def call(lm, sizes):  # in a thread, so that a blocked read fails the test instead of hanging it
        done: list = []
        worker = threading.Thread(target=lambda: done.append(kept_cost_curve(lm, sizes)), daemon=True)
        worker.start()
        worker.join(timeout=300)  # a guard against hanging, not a measure of speed
        if worker.is_alive():
            failed.append("blocked on the FIFO")
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))  # a writer that closes at once: the read ends
            worker.join()
        return done[0]

    measured_again(path, target, caplog, call)
    assert not failed and path.is_file()


def test_a_folder_in_its_place_is_measured_but_not_raised(tmp_path, monkeypatch, target, caplog):
    """A folder cannot be replaced by the file (nor is it deleted): measured every run, with one line saying why."""
    path = kept_file(tmp_path, monkeypatch, target, caplog)
    path.unlink()
    path.mkdir()
    with caplog.at_level(logging.WARNING, logger="specresearch.kv"):
        v, one = kept_cost_curve(target, [2, 3])
    said = [r.getMessage() for r in caplog.records if "cost file" in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0] and "not a regular file" in said[0]
    assert one > 0 and all(math.isfinite(x) and x > 0 for x in v)
    assert path.is_dir() and not list(path.parent.glob("*.tmp"))  # the measurement not kept, nothing left behind


def test_an_unreadable_file_a_loop_of_links_is_measured_again(tmp_path, monkeypatch, target, caplog):
    path = kept_file(tmp_path, monkeypatch, target, caplog)
    path.unlink()
    path.symlink_to(path)  # reading it fails with "too many levels of symbolic links" (an OSError, not a missing file)
    measured_again(path, target, caplog)
    assert not path.is_symlink()


def test_a_file_over_a_mebibyte_is_not_read(tmp_path, monkeypatch, target, caplog):
    """A whole file is a few hundred bytes: one of gigabytes would be read into memory whole."""
    path = kept_file(tmp_path, monkeypatch, target, caplog)
    path.write_text(path.read_text() + " " * 2**20)  # still valid JSON, but no file kept_cost_curve writes
    measured_again(path, target, caplog)


@pytest.mark.parametrize("content", [
    "[]",  # a list
    '"costs"',  # a string
    '{"one_token_s": 0.01}',  # no v
    '{"v": {"2": 1.1}}',  # no one_token_s
    '{"v": [1.1], "one_token_s": 0.01}',  # v a list
    '{"v": {"two": 1.1}, "one_token_s": 0.01}',  # a size that is no number
    '{"v": {"0x2": 1.1}, "one_token_s": 0.01}',  # a batch of no rows
    '{"v": {"x2": 1.1}, "one_token_s": 0.01}',  # a batch without its rows
    '{"v": {"2": "x"}, "one_token_s": 0.01}',  # a cost that is no number
    '{"v": {"2": "1.1"}, "one_token_s": 0.01}',  # a number as a string
    '{"v": {"2": true}, "one_token_s": 0.01}',  # a bool
    '{"v": {"2": null}, "one_token_s": 0.01}',
    '{"v": {"2": 1.1}, "one_token_s": -1}',  # a negative time
    '{"v": {"2": -1.1}, "one_token_s": 0.01}',  # a negative cost
    '{"v": {"2": 0}, "one_token_s": 0.01}',  # a zero cost
    '{"v": {"2": NaN}, "one_token_s": 0.01}',
    '{"v": {"2": Infinity}, "one_token_s": 0.01}',
    pytest.param('{"v": {"2": 1.1}, "one_token_s": 1' + "0" * 400 + "}", id="an int too large for a float"),  # OverflowError
    "{cut",  # cut short
    "",  # empty
])
def test_a_file_of_the_wrong_shape_is_measured_again(content, tmp_path, monkeypatch, target, caplog):
    path = kept_file(tmp_path, monkeypatch, target, caplog)
    path.write_text(content)
    measured_again(path, target, caplog)


def test_a_batchs_costs_are_kept_beside_one_rows(tmp_path, monkeypatch, target, caplog):
    """A batch's verification, (rows, n), is measured on that many rows and kept as "RxN" beside one row's sizes,
    over one row's one token; a later call reads it back without measuring."""
    from specresearch.kv import CachedLM, costs

    path = kept_file(tmp_path, monkeypatch, target, caplog)
    rows = []
    forward_rows = CachedLM.forward_rows
    monkeypatch.setattr(CachedLM, "forward_rows", lambda self, chains, *a, **k: rows.append(len(chains)) or forward_rows(self, chains, *a, **k))
    v, one = kept_cost_curve(target, [2, (3, 2), (1, 3)])
    assert set(rows) == {1, 3} and all(math.isfinite(x) and x > 0 for x in v)
    assert json.loads(path.read_text())["v"].keys() == {"2", "3x2", "3"}
    monkeypatch.setattr(costs, "forward_seconds", lambda *args: pytest.fail("measured again"))
    assert kept_cost_curve(target, [(3, 2), 3]) == ([v[1], v[2]], one)


def test_a_model_loaded_with_a_cache_of_its_own_keeps_its_costs_there(tmp_path, monkeypatch, caplog):
    """load_model(cache_dir=...): the cost file lies in that cache, not in $SPECRESEARCH_CACHE, and damaged
    there it is measured again as anywhere else."""
    from specresearch.models import load_model

    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path / "elsewhere"))
    lm = load_model("tiny", cache_dir=str(tmp_path / "own"), dtype="float32", device="cpu")
    kept_cost_curve(lm, [2])
    (path,) = (tmp_path / "own" / "costs" / "tiny").glob("*.json")
    assert not (tmp_path / "elsewhere" / "costs").exists()
    path.write_text("{cut")
    measured_again(path, lm, caplog)


def test_sizes_are_warmed_then_timed_interleaved(monkeypatch, target):
    """forward_seconds runs each size once untimed (a kernel's first call may lay out its weights), then times
    one round of every size per repeat: a machine that slows down mid-measurement moves every size alike, and
    no size is timed in a stretch of its own (a cost curve read at a run's start once gave v(2) 0.90, v(17) 2.24)."""
    from specresearch.kv import CachedLM, forward_seconds

    fed = []
    forward_rows = CachedLM.forward_rows

    def logged(self, chains, *args, **kwargs):
        fed.append(len(chains[0]))
        return forward_rows(self, chains, *args, **kwargs)

    monkeypatch.setattr(CachedLM, "forward_rows", logged)
    seconds = forward_seconds(target, list(range(2, 20)), [3, 1, 2, 1], repeats=2)
    assert fed == [1, 2, 3] + [1, 2, 3] * 2
    assert len(seconds) == 4 and seconds[1] == seconds[3] and all(s > 0 for s in seconds)


def test_other_few_row_routes_key_another_curve(tmp_path, monkeypatch, target, caplog):
    """A machine whose PackedLinear takes other few-row paths (models.kernels.routes: MKL's rows, bf16's unpacked
    rows) keeps another cost file: a curve measured with the old paths is not read for the new ones."""
    from specresearch.kv import costs

    first = kept_file(tmp_path, monkeypatch, target, caplog)
    monkeypatch.setattr(costs, "routes", lambda: {"float32_mkl_rows": 0, "bfloat16_unpacked_rows": 99})
    kept_cost_curve(target, [2])
    files = set((tmp_path / "cache" / "costs" / "tiny").glob("*.json"))
    assert len(files) == 2 and first in files
