"""What trained drafters share: the `Trainable` protocol that `python -m specresearch.train` trains
by, the data the target computed for them (`Cache`), and the optimiser loop. A new trained drafter
implements `Trainable` on its class; specresearch.train needs no edit."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol, runtime_checkable

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm import tqdm

if TYPE_CHECKING:
    from specresearch.models import LoadedModel
    from specresearch.options.runs import Train  # the node conf/train.yaml gives (a DictConfig with these keys)


@dataclass
class Cache:
    """What the target computed once: the inputs and labels of the heads."""

    hidden: Tensor  # [N, H] final-norm hidden states (the target's dtype)
    labels: Tensor  # [N, K] head i's label at each position (the token t + 2 + i), −100 where there is none
    held_out: Tensor  # [N] bool: positions of held-out prompts or chunks
    tokens: Tensor  # [N] the token after each position (t + 1: the target's own with data=self), −100 at a chunk's end
    seq: Tensor  # [N] the prompt or chunk each position belongs to (positions of one are contiguous, in order)
    prompt: Tensor  # [N] bool: a prompt's own position (data=self: context for EAGLE, no labels), before its generated ones
    source: Tensor | None = None  # [N] each position's corpus, an index into train.corpora (build_cache derives it; not saved)

    def save(self, path: Path) -> None:
        save_tensors({k: v for k, v in vars(self).items() if k != "source"}, path)

    def held_out_by_corpus(self, corpora: list[str]) -> dict[str, Tensor]:
        """Per corpus, [N] bool: its held-out positions; {} when they all come from one corpus (or
        `source` is unknown), where the pooled held-out rates say it all."""
        if self.source is None:
            return {}
        masks = {name: self.held_out & (self.source == i) for i, name in enumerate(corpora)}
        masks = {name: m for name, m in masks.items() if bool(m.any())}
        return masks if len(masks) > 1 else {}

    @classmethod
    def load(cls, path: Path) -> Cache:
        return cls(**load_file(str(path)))


def save_tensors(tensors: dict[str, Tensor], path: Path) -> None:
    """Tensors as a safetensors file at `path`, whole or not at all (written beside it, then renamed):
    a run stopped half way leaves no torn file for the next to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
    tmp.replace(path)


@runtime_checkable
class Trainable(Protocol):
    """A drafter class whose weights `python -m specresearch.train drafter=<name>` trains on the target's
    own predictions (train.py makes the data, calls `fit`, saves the module, tracks the run). Class-level,
    as training comes before any checkpoint a drafter instance could load."""

    name: str  # the drafter option: drafter=<name>
    suggested_verifier: ClassVar[str]  # the verifier the training run's last line suggests decoding with

    @staticmethod
    def default_checkpoint(target_name: str, cache_dir: str | Path | None = None) -> Path:
        """Where the weights trained for `target_name` go, and where the drafter looks for them."""

    @classmethod
    def run_label(cls, tc: Train) -> str:
        """What the training run is called: `train <label> on <target>` (tc: cfg.train)."""

    @classmethod
    def fit(cls, tc: Train, lm: LoadedModel, cache: Cache, tracker=None) -> tuple[nn.Module, dict]:
        """Train on `cache` as `tc` (cfg.train) says, with the target `lm` frozen.

        Returns:
            The trained module (with `save(path, meta)`) and a summary: "steps", "first_loss",
            "last_loss", "train_positions", per-head "held_out_acc_head<i>" / "train_acc_head<i>",
            and "held_out_acc_head<i>_<corpus>" per corpus when the held-out data mixes them
            (`rate_name`, `Cache.held_out_by_corpus`)
            (train.py saves the accuracies and steps in the checkpoint's meta).
        """


def rate_name(kind: str, head: int, corpus: str | None = None) -> str:
    """The summary's name for head `head`'s (0-based) top-1 agreement on `kind` ("held_out", "train")
    positions, of one corpus or (None) all: held_out_acc_head1, held_out_acc_head1_sharegpt."""
    return f"{kind}_acc_head{head + 1}" + (f"_{corpus}" if corpus else "")


def hits(pred: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """[K, B, R] ranked predictions and [K, B] labels (−100 = none) → per head ([K, R] hits at each rank, [K] labelled)."""
    valid = labels >= 0  # [K, B]
    return ((pred == labels[..., None]) & valid[..., None]).sum(1), valid.sum(-1)


def optimise(module: nn.Module, steps: int, batch_loss: Callable[[int], tuple[Tensor, Tensor]], tc: Train, tracker,
             desc: str, clip: float | None = None) -> tuple[float, float]:
    """AdamW with a one-cycle schedule over `steps` steps of `batch_loss(step) -> (loss, [K] accuracy)`,
    gradient norms clipped at `clip`, with a progress bar and MLflow curves; returns the first and the last loss."""
    opt = torch.optim.AdamW(module.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=tc.lr, total_steps=steps, pct_start=0.1)
    first_loss = last_loss = float("nan")
    bar = tqdm(range(steps), desc=desc, unit="step")
    for step in bar:
        loss, acc = batch_loss(step)
        opt.zero_grad()
        loss.backward()
        if clip is not None:
            nn.utils.clip_grad_norm_(module.parameters(), clip)
        opt.step()
        sched.step()
        last_loss = loss.item()
        first_loss = last_loss if step == 0 else first_loss
        if step % tc.log_every == 0 or step == steps - 1:
            bar.set_postfix(loss=f"{last_loss:.3f}", acc=" ".join(f"{a:.2f}" for a in acc.tolist()))
            if tracker is not None:
                tracker.log_metrics({"loss": last_loss, **{f"train_acc_head{i + 1}": float(a) for i, a in enumerate(acc)}}, step=step)
    return first_loss, last_loss
