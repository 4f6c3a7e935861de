"""The drafter interface and the context it sees."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from specresearch.options import drafters as options
from specresearch.options import implements
from specresearch.sampling import logits_to_probs, ranking_probs, sample
from specresearch.types import Draft, SamplingParams, Siblings, Verdict

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
    settings: options.Drafter  # its settings (`make(Settings, given)`), read where they are used, never copied
    depth: int = 0  # trees: the longest path a draft may have (their k stays 0)
    needs_hidden: bool = False  # the engine passes the target's hidden states in Context.hidden
    # Weights trained by specresearch.train: their checkpoint and its record of the prompts that trained
    # them (`checkpoint_record`); None for drafters without trained weights (or weights given in code).
    trained_on: dict | None = None
    # A drafter that sizes its tree itself (shape=auto) predicts its speedup over plain decoding; the
    # run prints it beside the measured one.
    predicted_speedup: float | None = None
    # A chain drafter's siblings beside each chain token (n = 0: none): the rule its Chains draft with,
    # which the exact distortion applies to every draw of the token.
    siblings: Siblings = Siblings()
    # The ways this drafter drafts whose laws differ, as overrides of its config node: the lossless
    # tests (tests/verifiers/test_lossless.py) prove every mode with every lossless verifier, so a new mode is
    # covered by naming it here.
    modes: ClassVar[dict[str, tuple[str, ...]]] = {"default": ()}
    draft_forwards: int = 0  # forwards of a draft model over the drafter's life, one per row they drafted for (0: model-free)
    row_forwards: list[int]  # each row's draft forwards since its prefill (`count`)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        implements(cls)  # a drafter declares its settings (`Settings = options.NAME`): drafter=NAME builds it

    def draft_length(self) -> options.DraftLength | None:
        """The settings of the chain a drafter drafts each step (k, k_policy, k_max: what the engine's
        DraftLength policy is built from: k at the start of every sequence, then fixed or transformers'
        heuristic within [1, k_max]); None for drafters that size their drafts themselves (the baseline,
        trees, n-gram pools)."""
        settings = getattr(self, "settings", None)
        return settings if isinstance(settings, options.DraftLength) else None

    @property
    def k(self) -> int:
        """Draft tokens per step (the first step's under the heuristic); 0 without a draft length."""
        length = self.draft_length()
        return length.k if length is not None else 0

    def check_sampling(self, sampling: SamplingParams) -> None:
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


def common_prefix(a: list[int], b: list[int], most: int | None = None) -> int:
    """The length of the longest common prefix of `a` and `b`, at most `most` (None: no bound)."""
    n = min(len(a), len(b)) if most is None else min(len(a), len(b), most)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Chain:
    """A chain draft built token by token (independent, self_draft, eagle): each token is the draft's
    argmax when decoding greedily (q = None), else a sample from its q, the draft's logits after the
    same processing as p (specresearch.sampling), and that q is recorded."""

    def __init__(self, ctx: Context, shortlist: Shortlist | None = None, siblings: Siblings = Siblings(), scored: bool = False):
        """
        Args:
            ctx: the step's context (sampling settings, generator).
            shortlist: the tokens the draft's logits score (FR-Spec); None = the whole vocabulary.
            siblings: beside each chain token, the draft's next `siblings.n` likeliest tokens at its
                position as leaves (see `draft`; those under `siblings.confidence` left out); n = 0: a
                plain chain.
            scored: keep `confidence` and `path` (a drafter that stops on them); with siblings always.
        """
        self.ctx, self.shortlist, self.siblings = ctx, shortlist, siblings
        self.scored = scored or siblings.n > 0
        self.confidence = 1.0  # the draft's probability of the last token: its q's when sampled, its softmax's (T = 1) when greedy
        self.path = 1.0  # the product of the chain's token probabilities so far (EAGLE-2's cumulative confidence)
        self.scores: list[tuple[float, float]] = []  # each token's draft probability and its siblings' (their sum)
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
            if self.siblings.n:
                others = self.siblings.of(law, x, self.path)
                self.others.append(others if self.shortlist is None else self.shortlist.ids[others])
            self.confidence = float(law[x])
            self.path *= self.confidence
            self.scores.append((self.confidence, float(law[others].sum()) if self.siblings.n else 0.0))
        return token

    @property
    def size(self) -> int:
        """The draft's nodes: the chain's tokens and their siblings."""
        return len(self.tokens) + sum(len(o) for o in self.others)

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
        if not self.siblings.n:
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
