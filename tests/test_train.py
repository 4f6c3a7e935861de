"""specresearch.train trains any drafter class that implements drafters.training.Trainable: a drafter
it has never heard of trains, saves and is named by the same code as Medusa and EAGLE; a class that
does not implement it is refused in one line that names the trainable options."""

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from torch import nn

from specresearch.config import CONF_DIR
from specresearch.drafters.base import Drafter, save_checkpoint
from specresearch.drafters.training import optimise
from specresearch.errors import SpecResearchError
from specresearch.models import load_model
from specresearch.train import run, train, trainable
from specresearch.types import Draft

from .conftest import train_cfg

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
    module, summary = train(cfg, load_model("tiny", device="cpu", tiny={"vocab_size": 320, "seed": 0}))
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
