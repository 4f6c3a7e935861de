"""The drafter interface and the context it sees."""

from __future__ import annotations

import json
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from safetensors.torch import save_file
from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.types import Draft, SamplingParams, Verdict

K_POLICIES = ("fixed", "heuristic")


@dataclass
class Context:
    """What a drafter may look at when proposing."""

    tokens: Tensor  # [T] prompt + generated so far (on the target's device)
    sampling: SamplingParams  # the same processing the verifier applies to p
    rng: torch.Generator | None  # for sampled drafts
    max_draft: int  # propose at most this many tokens (tokens left before max_new_tokens, minus one)
    reuse_prefill: bool = False  # the prompt may repeat: a drafter may keep and restore its prefill
    hidden: Tensor | None = None  # [R, H] for drafters with needs_hidden: the target's final hidden states of the
    # tokens it took in last (the prompt at prefill; the last token and the accepted ones after a step), one per
    # token, in order: row j gave the token after it, the last row the newest token (Medusa reads it, EAGLE all)


class Drafter(ABC):
    """Proposes draft tokens and keeps its own state in step with the accepted sequence.

    A drafter that samples must return the q it sampled from (after the same temperature, top-k and
    top-p as p); a deterministic one returns q = None. Never report a q the tokens were not drawn
    from (transformers issues #32867, #47932).
    """

    k: int  # draft tokens per step (0 for the autoregressive baseline); the current value under k_policy=heuristic
    name: str
    k_policy: str = "fixed"
    k_start: int = 0  # k at the start of every sequence
    k_max: int = 0  # the largest k the heuristic may reach
    needs_hidden: bool = False  # the engine passes the target's hidden states in Context.hidden
    # Weights trained by specresearch.train: their checkpoint and its record of the prompts that trained
    # them (`checkpoint_record`); None for drafters without trained weights (or weights given in code).
    trained_on: dict | None = None
    # The ways this drafter drafts whose laws differ, as overrides of its config node: the lossless
    # tests (tests/test_lossless.py) prove every mode with every lossless verifier, so a new mode is
    # covered by naming it here.
    modes: ClassVar[dict[str, tuple[str, ...]]] = {"default": ()}

    def set_k_policy(self, k: int, policy: str = "fixed", k_max: int | None = None) -> None:
        """How k evolves within a sequence: "fixed", or "heuristic" (transformers' assisted generation:
        k += 2 after a fully accepted draft, k −= 1 otherwise, within [1, k_max]; k_max None = 4 k)."""
        if policy not in K_POLICIES:
            raise SpecResearchError(f"unknown drafter.k_policy '{policy}': valid are {', '.join(K_POLICIES)}")
        if k_max is not None and int(k_max) < int(k):
            raise SpecResearchError(f"drafter.k_max must be >= drafter.k, got {k_max} < {k}")
        self.k = self.k_start = int(k)
        self.k_policy = policy
        self.k_max = int(k_max) if k_max is not None else 4 * int(k)

    def adapt(self, drafted: int, accepted: int) -> None:
        """After a verification step: update k under the heuristic policy (a no-op for "fixed")."""
        if self.k_policy == "heuristic" and drafted:
            self.k = min(self.k_max, self.k + 2) if accepted == drafted else max(1, self.k - 1)

    def check(self, sampling: SamplingParams) -> None:
        """Raise SpecResearchError if this drafter cannot run with these sampling settings."""

    def prefill(self, ctx: Context) -> None:
        """Start a new sequence whose tokens are ctx.tokens (subclasses call this first: it resets k)."""
        self.k = self.k_start or self.k

    @abstractmethod
    def propose(self, ctx: Context) -> Draft:
        """Propose up to min(k, ctx.max_draft) tokens to follow ctx.tokens."""

    def observe(self, logits: Tensor) -> None:
        """The target's logits ([S, V]) on the draft's scratch nodes, from the verification forward
        (called before `commit`, only for drafts with scratch nodes)."""

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        """The verifier kept `verdict.tokens`; ctx.tokens now ends with them. Roll own state back."""

    @property
    def draft_forwards(self) -> int:
        """Forwards of a draft model so far (for the draft cost ratio c); 0 for model-free drafters."""
        return 0


def save_checkpoint(module: torch.nn.Module, path: Path, meta: dict) -> None:
    """A trained drafter's weights as safetensors at `path`, and `meta` (its shape, target, training)
    in a JSON file beside them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}, str(path))
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1))


def find_checkpoint(drafter: str, target_name: str, checkpoint: str | None, default: Path) -> Path:
    """The weights a trained drafter loads: `checkpoint`, else `default` (where `python -m
    specresearch.train drafter=<drafter>` saves them). A missing file, or one trained for another
    target, is an error that says what to do."""
    path = Path(checkpoint) if checkpoint else default
    if not path.is_file():
        raise SpecResearchError(
            f"no trained {drafter} drafter for {target_name} at {path}: train it with\n"
            f"  python -m specresearch.train drafter={drafter} model.name={target_name}\n"
            f"or point drafter.checkpoint at a {default.name} file"
        )
    trained_for = json.loads(path.with_suffix(".json").read_text()).get("target")
    if trained_for not in (None, target_name):
        raise SpecResearchError(f"the {drafter} weights at {path} were trained for {trained_for}, not {target_name}")
    return path


def checkpoint_record(drafter: str, path: Path, meta: dict) -> dict:
    """What the weights at `path` (meta: their JSON) record of the prompts that trained them, with
    the checkpoint: {"checkpoint", "sources", "split", "split_rule", "prompts", "prompts_sha256",
    "ids"} (specresearch.data.prompt_record). Weights trained before runs recorded it give
    {"checkpoint"} alone, with a one-line warning."""
    record = meta.get("trained_on")
    if record is None:
        print(f"warning: the {drafter} weights at {path} do not record their training prompts (trained before that was recorded; "
              f"they may overlap MT-bench): retrain with python -m specresearch.train drafter={drafter}", file=sys.stderr)
        return {"checkpoint": str(path)}
    return {"checkpoint": str(path), **record}
