"""The drafter interface and the context it sees."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.models import say_once
from specresearch.sampling import logits_to_probs, ranking_probs, sample
from specresearch.types import Draft, SamplingParams, Verdict

if TYPE_CHECKING:
    from specresearch.vocab import Shortlist


@dataclass
class Context:
    """What a drafter may look at when proposing."""

    tokens: Tensor  # [T] prompt + generated so far (on the target's device)
    sampling: SamplingParams  # the same processing the verifier applies to p
    rng: torch.Generator | None  # for sampled drafts
    max_draft: int  # propose at most this many tokens along any path: the engine's draft length this step (DraftLength),
    # within the tokens left before max_new_tokens (minus one for the recovered or bonus token)
    reuse_prefill: bool = False  # the prompt may repeat: a drafter may keep and restore its prefill
    hidden: Tensor | None = None  # [R, H] for drafters with needs_hidden: the target's final hidden states of the
    # tokens it took in last (the prompt at prefill; the last token and the accepted ones after a step), one per
    # token, in order: row j gave the token after it, the last row the newest token (Medusa reads it, EAGLE all)


class Drafter(ABC):
    """Proposes draft tokens for the rows of a batch, and keeps each row's state (a draft model's cache,
    a pool) in step with its accepted sequence. One implementation per drafter, batch first: one
    sequence is a batch of one (`prefill`, `propose`, `observe`, `commit` call the rows methods so).

    A drafter that samples must return the q it sampled from (after the same temperature, top-k and
    top-p as p); a deterministic one returns q = None. Never report a q the tokens were not drawn
    from (transformers issues #32867, #47932).
    """

    name: str
    # The draft length, for drafters that draft a chain of k tokens per step: plain config that the
    # engine's DraftLength policy is built from (k at the start of every sequence, then fixed or
    # transformers' heuristic within [1, k_max]). k = 0: no policy (the baseline; trees and n-gram pools,
    # which size their drafts themselves).
    k: int = 0
    k_policy: str = "fixed"
    k_max: int | None = None  # None = 4 k
    depth: int = 0  # trees: the longest path a draft may have (their k stays 0)
    needs_hidden: bool = False  # the engine passes the target's hidden states in Context.hidden
    # Weights trained by specresearch.train: their checkpoint and its record of the prompts that trained
    # them (`checkpoint_record`); None for drafters without trained weights (or weights given in code).
    trained_on: dict | None = None
    # A drafter that sizes its tree itself (shape=auto) predicts its speedup over plain decoding; the
    # run prints it beside the measured one.
    predicted_speedup: float | None = None
    # The ways this drafter drafts whose laws differ, as overrides of its config node: the lossless
    # tests (tests/test_lossless.py) prove every mode with every lossless verifier, so a new mode is
    # covered by naming it here.
    modes: ClassVar[dict[str, tuple[str, ...]]] = {"default": ()}
    draft_forwards: int = 0  # forwards of a draft model over the drafter's life, one per row they drafted for (0: model-free)
    row_forwards: list[int]  # each row's draft forwards since its prefill (`count`)

    def check(self, sampling: SamplingParams) -> None:
        """Raise SpecResearchError if this drafter cannot run with these sampling settings."""

    def prefill_rows(self, ctxs: list[Context]) -> None:
        """Start one sequence per row, row b's tokens ctxs[b].tokens. A drafter with state per row sets
        it up here (and calls this)."""
        self.row_forwards = [0] * len(ctxs)

    @abstractmethod
    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        """One draft per row to follow ctxs[b].tokens: at most ctxs[b].max_draft tokens along any path
        (for a chain drafter, the engine's draft length this step)."""

    def observe_row(self, b: int, logits: Tensor) -> None:
        """Row b's target logits ([S, V]) on its draft's scratch nodes, from the verification forward
        (called before `commit_rows`, only for drafts with scratch nodes)."""

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        """The verifier kept `verdicts[b].tokens` of row b; ctxs[b].tokens now ends with them. Roll each
        row's state back."""

    def select_rows(self, index: list[int]) -> None:
        """Keep only the rows at `index` (in order): the others finished. A drafter with state per row
        selects it (and calls this)."""
        self.row_forwards = [self.row_forwards[i] for i in index]

    def count(self, rows: Iterable[int]) -> None:
        """One draft forward drafted for `rows` (it counts for each)."""
        for b in rows:
            self.row_forwards[b] += 1
            self.draft_forwards += 1

    def prefill(self, ctx: Context) -> None:
        """Start one sequence (`prefill_rows` of one row)."""
        self.prefill_rows([ctx])

    def propose(self, ctx: Context) -> Draft:
        """One sequence's draft (`propose_rows` of one row)."""
        return self.propose_rows([ctx])[0]

    def observe(self, logits: Tensor) -> None:
        """One sequence's scratch logits (`observe_row` of row 0)."""
        self.observe_row(0, logits)

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        """One sequence's verdict (`commit_rows` of one row)."""
        self.commit_rows([ctx], [verdict])

    @property
    def size_label(self) -> str:
        """How run names give the draft's size: "k=K" (draft tokens per step), or "depth=D" for trees."""
        return f"depth={self.depth}" if self.depth else f"k={self.k}"


class Chain:
    """A chain draft built token by token (independent, self_draft, eagle): each token is the draft's
    argmax when decoding greedily (q = None), else a sample from its q, the draft's logits after the
    same processing as p (specresearch.sampling), and that q is recorded."""

    def __init__(self, ctx: Context, shortlist: Shortlist | None = None, siblings: int = 0, sibling_confidence: float = 0.0,
                 scored: bool = False):
        """
        Args:
            ctx: the step's context (sampling settings, generator).
            shortlist: the tokens the draft's logits score (FR-Spec); None = the whole vocabulary.
            siblings: beside each chain token, the draft's next `siblings` likeliest tokens at its
                position as leaves (see `draft`); 0 = a plain chain.
            sibling_confidence: keep a sibling only where its path probability (the draft's chance
                that the target takes it: the chain's token probabilities down to its parent, times
                its own) is at least this.
            scored: keep `confidence` and `path` (a drafter that stops on them); with siblings always.
        """
        self.ctx, self.shortlist, self.siblings, self.sibling_confidence = ctx, shortlist, siblings, sibling_confidence
        self.scored = scored or siblings > 0
        self.confidence = 1.0  # the draft's probability of the last token: its q's when sampled, its softmax's (T = 1) when greedy
        self.path = 1.0  # the product of the chain's token probabilities so far (EAGLE-2's cumulative confidence)
        self.tokens: list[Tensor] = []  # 0-d token ids
        self.qs: list[Tensor] = []  # [V] the law each token was drawn from
        self.others: list[Tensor] = []  # [S] each token's siblings (token ids), likeliest first

    def add(self, logits: Tensor) -> Tensor:
        """Draw the next token from the draft's logits ([V], or [N] over the shortlist's tokens).

        Returns:
            The token id (0-d, in the whole vocabulary).
        """
        if self.ctx.sampling.greedy:
            x, q = logits.argmax(-1), None
        else:
            q = logits_to_probs(logits, self.ctx.sampling)  # [V] or [N]
            x = sample(q, self.ctx.rng)
            self.qs.append(q if self.shortlist is None else self.shortlist.widen(q))  # zero off the shortlist
        token = x if self.shortlist is None else self.shortlist.ids[x]
        self.tokens.append(token)
        if self.scored:
            law = ranking_probs(logits, self.ctx.sampling) if q is None else q  # [V or N]
            if self.siblings:
                top = torch.topk(law.index_fill(-1, x.reshape(1), 0.0), min(self.siblings, law.numel()))  # the chain's token is no sibling
                # top-k / top-p removed the zeros (the target never accepts them); the rest by their path probability
                others = top.indices[(top.values > 0) & (top.values * self.path >= self.sibling_confidence)]
                self.others.append(others if self.shortlist is None else self.shortlist.ids[others])
            self.confidence = float(law[x])
            self.path *= self.confidence
        return token

    def draft(self) -> Draft:
        """The chain: [K] tokens, [K, V] q (None when greedy).

        With siblings, a tree whose spine is the chain: each chain token is followed by its siblings,
        leaves under the same parent, tried after it (multi-step speculative sampling). A sibling is
        deterministic given the chain above and beside it, so its law is one-hot (sampled: its q row;
        greedy: q = None as for the chain): after the chain's token is rejected, the target's residual
        accepts it with its own probability, which keeps rejection sampling exact. The siblings cost
        no draft forward, only target rows.
        """
        if not self.tokens:
            return Draft.empty(self.ctx.tokens.device)
        if not self.siblings:
            return Draft(tokens=torch.stack(self.tokens), q=torch.stack(self.qs) if self.qs else None)
        tokens, parents, qs, parent = [], [], [], -1
        for i, (x, others) in enumerate(zip(self.tokens, self.others)):
            spine = len(tokens)
            tokens += [x, *others]
            parents += [parent] * (1 + len(others))
            if self.qs:
                qs += [self.qs[i], *torch.nn.functional.one_hot(others, self.qs[i].numel()).to(self.qs[i].dtype)]
            parent = spine
        return Draft(tokens=torch.stack(tokens), q=torch.stack(qs) if qs else None, parents=torch.tensor(parents))

    def accepted(self, verdict: Verdict) -> int:
        """How many of the chain's own tokens `verdict` kept (a sibling ends the run of them)."""
        if verdict.path is None:
            return verdict.num_accepted
        spine = {i + sum(len(o) for o in self.others[:i]) for i in range(len(self.tokens))}  # each chain token's node
        return next((n for n, node in enumerate(verdict.path) if node not in spine), len(verdict.path))


def save_checkpoint(module: torch.nn.Module, path: Path, meta: dict) -> None:
    """A trained drafter's weights as safetensors at `path`, and `meta` (its shape, target, training)
    in a JSON file beside them, each whole or not at all (written beside, then renamed: a stopped
    run leaves no cut file)."""
    from specresearch.drafters.training import save_tensors

    save_tensors({k: v.detach().cpu() for k, v in module.state_dict().items()}, path)
    sidecar = path.with_suffix(".json")
    tmp = sidecar.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(sidecar)


SHIPPED = Path(__file__).resolve().parent.parent / "weights"  # trained drafters that come with the package


def find_checkpoint(drafter: str, target_name: str, checkpoint: str | None, default: Path) -> Path:
    """The weights a trained drafter loads: `checkpoint`, else `default` (where `python -m
    specresearch.train drafter=<drafter>` saves them), else the weights shipped in the package for
    this target (`specresearch/weights/<drafter>/<target>/`, with their training record beside them).
    A missing file, or one trained for another target, is an error that says what to do."""
    shipped = SHIPPED / drafter / target_name / default.name
    path = Path(checkpoint) if checkpoint else default if default.is_file() or not shipped.is_file() else shipped
    if not path.is_file():
        raise SpecResearchError(
            f"no trained {drafter} drafter for {target_name} at {path}: train it with "
            f"python -m specresearch.train drafter={drafter} model.name={target_name}, "
            f"or point drafter.checkpoint at a {default.name} file"
        )
    trained_for = read_meta(drafter, path).get("target")
    if trained_for not in (None, target_name):
        raise SpecResearchError(f"the {drafter} weights at {path} were trained for {trained_for}, not {target_name}")
    return path


def _retrain(drafter: str) -> str:
    return f"retrain it with python -m specresearch.train drafter={drafter}, or point drafter.checkpoint at a whole checkpoint"


def read_meta(drafter: str, path: Path, keys: Sequence[str] = ()) -> dict:
    """The JSON beside a trained drafter's weights at `path` (its shape, target, training record), with
    `keys` present; a missing, unreadable or incomplete one is a one-line SpecResearchError naming
    the file and what to do."""
    sidecar = path.with_suffix(".json")
    try:
        meta = json.loads(sidecar.read_text())
    except FileNotFoundError:
        raise SpecResearchError(f"the {drafter} checkpoint {path} has no {sidecar.name} beside it (the weights' shape and "
                                f"training record): copy it with the weights, or {_retrain(drafter)}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecResearchError(f"{sidecar} (beside the {drafter} checkpoint) is not readable JSON "
                                f"({_one_line(err)}): {_retrain(drafter)}") from None
    if not isinstance(meta, dict):
        raise SpecResearchError(f"{sidecar} (beside the {drafter} checkpoint) holds {type(meta).__name__}, not a JSON "
                                f"object: {_retrain(drafter)}")
    missing = [key for key in keys if key not in meta]
    if missing:
        raise SpecResearchError(f"{sidecar} (beside the {drafter} checkpoint) lacks {', '.join(missing)}: {_retrain(drafter)}")
    return meta


def check_checkpoint(drafter: str, path: Path, option: str = "drafter.checkpoint", keys: Sequence[str] = ()) -> None:
    """Refuse, without building the module or reading the weights (so before a run waits for the speed
    lock or loads a model), a checkpoint `option` names that load_checkpoint would refuse for what its
    files alone show: no file, a missing or bad JSON beside it, a safetensors header that is damaged or
    promises more bytes than the file holds. One line naming `option`, the file and what to do."""
    from safetensors import SafetensorError, safe_open

    named = "" if option == "drafter.checkpoint" else f"{option}: "  # (drafter.checkpoint's messages are load_checkpoint's, word for word)
    retrain = f"retrain it with python -m specresearch.train drafter={drafter}, or point {option} at a whole checkpoint"
    if not path.is_file():
        raise SpecResearchError(f"{named}no {drafter} checkpoint at {path}"
                                f"{' (a folder)' if path.is_dir() else ''}: train one with python -m specresearch.train drafter={drafter}")
    try:
        read_meta(drafter, path, keys)
    except SpecResearchError as err:
        raise SpecResearchError(f"{named}{str(err).replace('point drafter.checkpoint at', f'point {option} at')}") from None
    try:
        with safe_open(str(path), framework="pt") as weights:
            weights.keys()
    except (SafetensorError, OSError, ValueError) as err:
        raise SpecResearchError(f"{named}{path} is not a whole safetensors file ({_one_line(err)}): it is damaged or cut "
                                f"short; {retrain}") from None


def load_checkpoint(drafter: str, path: Path, make: Callable[[dict], torch.nn.Module],
                    keys: Sequence[str] = ()) -> tuple[torch.nn.Module, dict]:
    """A trained drafter's module and its JSON: `make(meta)` builds the module (`keys`: what it reads of
    the meta), then the weights at `path` fill it. A missing or bad JSON, a damaged, cut or foreign
    safetensors file, or weights of another shape are a one-line SpecResearchError naming the file,
    what is wrong and what to do."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not path.is_file():
        raise SpecResearchError(f"no {drafter} checkpoint at {path}: train one with python -m specresearch.train drafter={drafter}")
    meta = read_meta(drafter, path, keys)
    try:
        module = make(meta)
    except (TypeError, ValueError, KeyError) as err:
        raise SpecResearchError(f"{path.with_suffix('.json')} (beside the {drafter} checkpoint) gives a shape that builds "
                                f"no {drafter} module ({_one_line(err)}): {_retrain(drafter)}") from None
    try:
        weights = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise SpecResearchError(f"{path} is not a whole safetensors file ({_one_line(err)}): it is damaged or cut "
                                f"short; {_retrain(drafter)}") from None
    try:
        module.load_state_dict(weights)
    except RuntimeError as err:  # missing, unexpected or misshapen tensors: torch's first line is a heading, the second says which
        detail = ([line.strip() for line in str(err).splitlines() if line.strip()][1:] or [str(err)])[0][:200]
        raise SpecResearchError(f"the weights in {path} do not fit the {drafter} module its JSON and this target describe "
                                f"({detail}): they were saved for another shape or model; {_retrain(drafter)}") from None
    return module, meta


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = (lines[0] if lines else "")[:200]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def checkpoint_record(drafter: str, path: Path, meta: dict) -> dict:
    """What the weights at `path` (meta: their JSON) record of the prompts that trained them, with
    the checkpoint: {"checkpoint", "sources", "split", "split_rule", "prompts", "prompts_sha256",
    "ids"} (specresearch.data.prompt_record). Weights trained before runs recorded it give
    {"checkpoint"} alone, with a one-line warning (once per process and file)."""
    record = meta.get("trained_on")
    if record is None:
        say_once(f"warning: the {drafter} weights at {path} do not record their training prompts (trained before that was recorded; "
                 f"they may overlap MT-bench): retrain with python -m specresearch.train drafter={drafter}")
        return {"checkpoint": str(path)}
    return {"checkpoint": str(path), **record}
