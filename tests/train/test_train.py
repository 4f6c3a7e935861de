"""specresearch.train trains any drafter class that implements drafters.training.Trainable: a drafter
it has never heard of trains, saves and is named by the same code as Medusa and EAGLE; a class that
does not implement it is refused in one line that names the trainable options; and end to end,
`python -m specresearch.train` saves Medusa heads and an EAGLE head that record the prompts that
trained them and decode with greedy identity."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

from specresearch.config import CONF_DIR
from specresearch.data import DATASETS, SHAREGPT_EVAL, load_prompts
from specresearch.drafters import MedusaDrafter
from specresearch.drafters.base import Drafter
from specresearch.drafters.checkpoints import save_checkpoint
from specresearch.drafters.eagle import EagleDrafter
from specresearch.drafters.training import optimise
from specresearch.errors import SpecResearchError
from specresearch.train import run, train, trainable
from specresearch.types import Draft
from tests.helpers import ROOT, train_cfg
from tests.tiny import tiny_model

pytestmark = pytest.mark.e2e  # trains heads through the command line

STEPS = 5


class NextNext(nn.Module):
    """One linear layer: from the hidden state that produced token t + 1, a guess of token t + 2."""

    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.linear = nn.Linear(hidden, vocab)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h)

    def save(self, path: Path, meta: dict) -> None:
        save_checkpoint(self, path, meta)


class NextNextDrafter(Drafter):
    """A trained drafter specresearch.train knows nothing of (it only needs Trainable's members)."""

    name = "next_next"
    suggested_verifier = "greedy"

    @staticmethod
    def default_checkpoint(target_name: str, cache_dir=None) -> Path:
        return Path(cache_dir) / "next_next" / f"{target_name}.safetensors"

    @classmethod
    def run_label(cls, tc) -> str:
        return "next-next layer"

    @classmethod
    def fit(cls, tc, lm, cache, tracker=None):
        module = NextNext(cache.hidden.shape[1], lm.model.config.vocab_size)
        rows = (~cache.held_out & (cache.labels[:, 0] >= 0)).nonzero()[:, 0]  # [N]
        x, label = cache.hidden[rows].float(), cache.labels[rows, 0]  # [N, H], [N]

        def batch_loss(step: int):
            logits = module(x)  # [N, V]
            return nn.functional.cross_entropy(logits, label), (logits.argmax(-1) == label).float().mean()[None]

        first, last = optimise(module, STEPS, batch_loss, tc, tracker, "next-next layer")
        return module, {"steps": STEPS, "first_loss": first, "last_loss": last, "train_positions": int(rows.numel())}

    def propose(self, ctx):
        return Draft.empty(ctx.tokens.device)


NEW = f"{__name__}.NextNextDrafter"


def test_a_new_trained_drafter_trains_with_the_same_code():
    cfg = train_cfg(tokens=400, lr=1e-2)
    cfg.drafter = {"_target_": NEW}
    assert trainable(cfg) is NextNextDrafter
    module, summary = train(cfg, tiny_model())
    assert isinstance(module, NextNext) and summary["steps"] == STEPS
    assert summary["last_loss"] < summary["first_loss"] and summary["positions"] > 0
    assert summary["trained_on"]["split"] == "train"


def test_the_training_run_saves_where_the_drafter_says(tmp_path):
    """train.run: the default checkpoint, the run's name and the suggested verifier come from the class."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["model=tiny", "tracker=none", f"model.cache_dir={tmp_path}", f"drafter._target_={NEW}",
                                          "train.data=text", "train.tokens=300", "train.cache=false"])
    summary = run(cfg)
    assert summary["steps"] == STEPS
    assert (tmp_path / "next_next" / "tiny.safetensors").is_file() and (tmp_path / "next_next" / "tiny.json").is_file()


@pytest.mark.parametrize("target", ["specresearch.drafters.pld.PromptLookupDrafter", "specresearch.drafters.nope.Nope", ""])
def test_a_drafter_without_the_protocol_is_refused_in_one_line(target):
    cfg = train_cfg()
    cfg.drafter = {"_target_": target}
    with pytest.raises(SpecResearchError) as err:
        trainable(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("specresearch.train trains drafters eagle, medusa: use drafter=eagle or drafter=medusa (got ")


@pytest.mark.parametrize("drafter, checkpoint, says, cls", [
    ("medusa", "heads.safetensors", "held-out top-1 agreement per head", MedusaDrafter),
    ("eagle", "head.safetensors", "drafter=eagle", EagleDrafter),
], ids=["medusa", "eagle"])
def test_the_train_command_saves_a_checkpoint_that_records_its_prompts_and_decodes_identically(tmp_path, target, drafter, checkpoint,
                                                                                               says, cls):
    """`python -m specresearch.train drafter=NAME` (run from the checkout) saves weights with the settings
    that reproduce them and a record of the training prompts (6 = 300 tokens / 50, sorted, hashed,
    none an evaluation prompt; the loaded drafter reads the same record), and `python -m specresearch`
    decodes with them at greedy identity."""
    out = tmp_path / checkpoint
    cmd = [sys.executable, "-m", "specresearch.train", "model=tiny", f"drafter={drafter}", "tracker=none",
           "train.tokens=300", "train.new=50", "train.epochs=1", "train.cache=false", f"train.out={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.is_file() and says in done.stdout
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["train"]["tokens"] == 300  # the settings that reproduce it
    record = meta["trained_on"]  # which prompts trained the weights
    assert record["sources"] == ["python-stdlib", "sharegpt"] and record["split"] == "train" and record["prompts"] == len(record["ids"]) == 6
    assert record["ids"] == sorted(record["ids"]) and len(set(record["ids"])) == 6
    assert record["prompts_sha256"] == hashlib.sha256("\n".join(sorted(record["ids"])).encode()).hexdigest()
    evaluation = {p.id for name in DATASETS for p in load_prompts(name, SHAREGPT_EVAL if name == "sharegpt" else None)}
    assert not evaluation & set(record["ids"])
    assert cls(target, checkpoint=str(out)).trained_on["ids"] == record["ids"]
    decode = [sys.executable, "-m", "specresearch", "model=tiny", f"drafter={drafter}", f"drafter.checkpoint={out}",
              "tracker=none", "dataset.num_prompts=1", "max_new_tokens=8", "warmup=false"]
    done = subprocess.run(decode, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "greedy identity: 1/1" in done.stdout


@pytest.mark.parametrize("where, says", [
    ("train.out=FILE/h.safetensors", "cannot save the trained weights at FILE/h.safetensors (train.out): FILE is not a folder"),
    ("train.out=TMP", "cannot save the trained weights at TMP (train.out): TMP is a folder"),
    ("model.cache_dir=FILE/cache", "cannot use the model cache FILE/cache (model.cache_dir): FILE is not a folder"),
], ids=["out-under-a-file", "out-a-folder", "cache-under-a-file"])
def test_an_unusable_destination_is_refused_before_the_model_loads(tmp_path, monkeypatch, where, says):
    """train.run: where the weights go (train.out, or the model cache they and the training data go to)
    is checked before the target loads, so no data is made and no step spent for weights that cannot be saved."""
    import specresearch.train as training

    (tmp_path / "file").write_text("keep me")
    monkeypatch.setattr(training, "load_model", lambda **_: pytest.fail("the target loaded"))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=["model=tiny", "tracker=none", "drafter=medusa", f"model.cache_dir={tmp_path}/cache",
                                          where.replace("FILE", str(tmp_path / "file")).replace("TMP", str(tmp_path))])
    with pytest.raises(SpecResearchError) as err:
        run(cfg)
    assert str(err.value) == says.replace("FILE", str(tmp_path / "file")).replace("TMP", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "keep me"


@pytest.mark.parametrize("setting, says", [
    ("train.out=FILE/h.safetensors", "error: cannot save the trained weights at FILE/h.safetensors (train.out): FILE is not a folder"),
    ("train.heads=x", "error: train.heads must be an integer, got 'x'"),
    ("+train.foo=1", "error: train has no setting 'foo': valid are heads, "),
    ("train.soft=2", "error: train.soft must lie in [0, 1] (the soft labels' share of the loss), got 2"),
    ("train.lr=-1", "error: train.lr must be a finite number > 0 (the peak learning rate, e.g. 1e-3), got -1"),
    ("train.weight_decay=-0.5", "error: train.weight_decay must be a finite number >= 0, got -0.5"),
    ("drafter=eagle train.init=HEAD", "error: train.init: HEAD is not a whole safetensors file (SafetensorError: "),
    ("drafter=eagle train.init=FILE", "error: train.init: the eagle checkpoint FILE has no file.json beside it"),
], ids=["out-under-a-file", "heads-not-a-number", "unknown-setting", "soft-out-of-range", "negative-lr", "negative-weight-decay",
        "damaged-init", "init-without-its-json"])
def test_the_train_command_refuses_in_one_line_before_training(tmp_path, setting, says):
    """`python -m specresearch.train`: a train.out under a file, a value of the wrong type, an unknown
    setting (the settings schema) are one `error:` line and exit 2, before anything is trained: no
    training data in the model cache, no outputs/ or MLflow store left behind."""
    (tmp_path / "file").write_text("")
    made = ["file"]
    if "HEAD" in setting:  # a head cut short: its header promises more bytes than the file holds
        (tmp_path / "head.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{" + b"\x07" * 50)
        (tmp_path / "head.json").write_text("{}")
        made += ["head.json", "head.safetensors"]
    paths = {"FILE": str(tmp_path / "file"), "HEAD": str(tmp_path / "head.safetensors")}
    for key, path in paths.items():
        setting, says = setting.replace(key, path), says.replace(key, path)
    cmd = [sys.executable, "-m", "specresearch.train", "drafter=medusa", "model=tiny", "train.tokens=256", "train.new=16", *setting.split()]
    env = {**os.environ, "SPECRESEARCH_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(says), line
    assert "drafter.checkpoint" not in line  # train.init's file is named as train.init
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(made)  # no cache/distill/, outputs/ or mlruns/


@pytest.mark.parametrize("pattern, soft, zero", [("same", 1.0, True), ("alternating", 1.0, False), ("same", 0.0, False)])
def test_soft_labels_are_the_targets_law_where_the_label_was_read(target, pattern, soft, zero):
    """train.soft: the KL from the target's law at the label's position (its lm head on the cached
    hidden state of row r + 1 + i) to the head's. An untrained head is the target's lm head on row r,
    so with every row's hidden state the same the soft loss is 0; alternating between two states,
    head 1's label sits on the other one and the loss is not; the top-1 cross-entropy is never 0."""
    from specresearch.drafters.training import Cache

    n, hidden = 64, target.model.config.hidden_size
    states = torch.randn(2, hidden, generator=torch.Generator().manual_seed(0))  # [2, H]
    h = states[torch.arange(n) % 2] if pattern == "alternating" else states[[0] * n]  # [N, H]
    top1 = target.model.lm_head(h).argmax(-1)  # [N] the target's guess after each row
    labels = torch.stack([top1.roll(-1 - i) for i in range(2)], 1)  # [N, 2] head i: the guess at row r + 1 + i
    labels[-2:] = -100
    cache = Cache(hidden=h, labels=labels, held_out=torch.zeros(n, dtype=torch.bool), tokens=torch.zeros(n, dtype=torch.long),
                  seq=torch.zeros(n, dtype=torch.long), prompt=torch.zeros(n, dtype=torch.bool))
    tc = train_cfg(soft=soft, lr=0.0, held_out=0.0).train  # no step moves the heads: the loss is the untrained heads'
    _, summary = MedusaDrafter.fit(tc, target, cache)
    assert (summary["first_loss"] < 1e-5) == zero, summary["first_loss"]
