import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from specresearch.config import CONF_DIR
from specresearch.models import SkinnyLinear, load_model

ROOT = Path(__file__).resolve().parent.parent  # the checkout

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n N`: N workers share the cores, one thread each (their subprocesses too)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

# Tiny models for both target and draft, so composing the default config needs no real model.
TINY = ["model=tiny", "drafter.model.name=tiny", "+drafter.model.tiny={vocab_size: 320, seed: 0, noise: 0.03}"]


def make_cfg(*overrides: str):
    """Compose conf/config.yaml with overrides, as `python -m specresearch` would."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.fixture(autouse=True, scope="session")
def _offline(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    # The tests' speed jobs time tiny models: they take a lock of their own, not the machine's (a
    # user's study holding ~/.cache/specresearch/speed.lock would stall the suite).
    os.environ["SPECRESEARCH_SPEED_LOCK"] = str(tmp_path_factory.mktemp("lock") / "speed.lock")


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


def train_cfg(**overrides):
    """A small `train` config for specresearch.train on tiny models (text data unless overridden, no disk cache);
    the keys not named here keep conf/train.yaml's defaults."""
    from omegaconf import OmegaConf

    from specresearch.config import CONF_DIR

    base = dict(OmegaConf.to_container(OmegaConf.load(CONF_DIR / "train.yaml").train), heads=2, layers=1, own_lm_head=False, data="text", corpora=["python-stdlib"], tokens=1200, new=16, gen_batch=8,
                temperature=0.0, seq_len=64, held_out=0.2, cache=False, epochs=3, batch=32, lr=3e-3, weight_decay=0.0, seed=0,
                log_every=10, out=None)
    return OmegaConf.create({"train": {**base, **overrides}, "drafter": {"_target_": "specresearch.drafters.medusa.MedusaDrafter"}})


def tiny_model(seed: int = 0, vocab_size: int = 320, **options):
    """The tiny random fp32 model as runs load it (its linear layers verify few tokens with
    SkinnyLinear); `options` are tiny_model's others: noise and noise_seed for a perturbed copy,
    num_layers, ..."""
    lm = load_model("tiny", device="cpu", tiny={"vocab_size": vocab_size, "seed": seed, **options})
    assert isinstance(lm.model.lm_head, SkinnyLinear)
    return lm


@pytest.fixture(scope="module")
def target():
    """The tiny target model (seed 0, 320 tokens), one per test module."""
    return tiny_model()


@pytest.fixture(scope="module")
def close_draft():
    """A noise-perturbed copy of the target (noise 0.01): accepts some drafts and rejects others."""
    return tiny_model(noise=0.01, noise_seed=5)


@pytest.fixture(scope="module")
def far_draft():
    """A more perturbed copy (noise 0.03): about 30% of sampled drafts are rejected, exercising the residual."""
    return tiny_model(noise=0.03, noise_seed=5)


REPEATING = [10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11]  # prompts for the n-gram drafters
PLAIN = [200, 7, 91, 33]


def cyclic_tiny(seed: int, cycle: int = 5, head: float = 1.0):
    """A tiny model whose greedy text repeats: its (scaled) embeddings dominate the residual stream
    and its lm head maps each token to the next one of a random cycle of `cycle` tokens, so after a
    few tokens prompt lookup finds what comes next (a random tiny model never repeats itself). The
    transformer layers still add their part: the argmax is the model's, not a table's. `head` scales
    the logits: at 3e-4 the argmax still cycles and the laws at T = 1 are random (top ≈ 0.85)."""
    lm = tiny_model(seed)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(320, generator=gen)
    prev = torch.empty(320, dtype=torch.long)
    for i in range(0, 320, cycle):
        block = order[i : i + cycle]
        prev[block] = block.roll(1)  # the token before each one in its cycle
    with torch.no_grad():
        embed = lm.model.model.embed_tokens.weight
        embed.mul_(1000.0)
        lm.model.lm_head.weight.copy_(embed[prev] * head)  # logit of j ∝ <e_prev(j), h>: largest for j = next(t)
    return lm


def equivalence_report(engine, prompt: list[int], n: int = 300, length: int = 5, seed: int = 50, alpha: float = 1e-3):
    """The battery on `n` samples of `length` tokens from a sampling engine against as many from its
    target alone (tiny models; fixed seeds)."""
    from specresearch.stats import battery, sample_engine, sample_target, teacher_force

    target, sampling = engine.target.lm, engine.sampling
    meth = sample_engine(engine, prompt, n, length, seed=seed)
    base = sample_target(target, prompt, n, length, sampling, seed=seed + 1)
    return battery(base, teacher_force(target, prompt, base.tokens, sampling, seed=1),
                   meth, teacher_force(target, prompt, meth.tokens, sampling, seed=2), alpha=alpha, bootstrap=0)


def drafter_cfg(name: str, tmp_path: Path, *overrides: str):
    """The composed config of `drafter=NAME` on tiny models (target and any draft model: TINY; cross_vocab's
    draft with another tokenizer), with untrained heads saved under `tmp_path` for the drafters that load
    trained weights (medusa, eagle)."""
    from omegaconf import OmegaConf

    node = OmegaConf.load(CONF_DIR / "drafter" / f"{name}.yaml")
    base = TINY if "model" in node else ["model=tiny"]
    if name == "cross_vocab":  # a draft in another vocabulary: bytes and byte pairs (models.PairTokenizer)
        base = [*TINY[:-1], TINY[-1].replace("}", ", tokenizer: pairs}")]
    if "checkpoint" in node:  # a trained drafter: untrained weights of the right shape for the tiny target
        target = load_model("tiny", device="cpu", tiny=dict(make_cfg("model=tiny").model.tiny))
        if name == "medusa":
            from specresearch.drafters.medusa import MedusaHeads

            path = tmp_path / "heads.safetensors"
            MedusaHeads(target.model.config.hidden_size, 3).save(path, {"target": "tiny"})
        elif name == "eagle":
            from specresearch.drafters.eagle import EagleHead

            path = tmp_path / "head.safetensors"
            EagleHead(target.model.config).save(path, {"target": "tiny"})
        else:
            raise NotImplementedError(f"drafter_cfg: no untrained weights for drafter={name}; add them here")
        base = [*base, f"drafter.checkpoint={path}"]
    return make_cfg(*base, f"drafter={name}", *overrides)


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
