"""An independent draft model (Leviathan et al., 2023; Chen et al., 2023)."""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch
from torch import Tensor

from specresearch.drafters.base import Chain, Context, Drafter
from specresearch.drafters.draft_model import DraftModel
from specresearch.drafters.ngram import lookup
from specresearch.drafters.tree import Sizer
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel
from specresearch.options import drafters as options
from specresearch.options import make
from specresearch.types import Draft, Siblings, Verdict


def plain_chain(**changes) -> tuple[str, ...]:
    """drafter=plain_chain (options.drafters.PLAIN_CHAIN, an int8 draft off too) as overrides of the drafter's
    node; `changes` turn one lever on."""
    given = {**options.PLAIN_CHAIN, "model.quantize": None, **changes}
    return tuple(f"{key}={'null' if value is None else value}" for key, value in given.items())


class ChainRate:
    """A chain's measured acceptance by the draft's confidence (shape=auto's τ̂): of the chain tokens offered
    after the tokens before them were kept, in each tenth of the draft's probability of the token, the share
    the target kept, from a prior of 2 tokens at the tenth's middle (the draft taken at its word until
    verdicts say otherwise). Conditional rates, multiplied down the chain, as Medusa's BranchRate: the int8
    0.5B draft underrates its tokens for the 1.5B target on code (HumanEval 100-103, bf16: 0.98 of the
    chain tokens shape=auto drafted were kept)."""

    BINS, PRIOR = 10, 2.0

    def __init__(self):
        self.offered = [0] * self.BINS
        self.kept = [0] * self.BINS

    def bin(self, confidence: float) -> int:
        """The tenth of the draft's probability that `confidence` falls in."""
        return min(int(confidence * self.BINS), self.BINS - 1)

    def rate(self, confidence: float) -> float:
        """The measured chance that a token the draft gives `confidence` is kept, once the ones before it are."""
        j = self.bin(confidence)
        return (self.kept[j] + self.PRIOR * (j + 0.5) / self.BINS) / (self.offered[j] + self.PRIOR)

    def tau(self, chain: Chain) -> tuple[float, float]:
        """(τ̂, the chance of keeping the whole chain) of a chain so far: 1 + each token's chance of being kept
        with those before it + each sibling's (the token before kept, the chain's token rejected: the draft's
        law on its siblings, renormalized without it)."""
        tau, path = 1.0, 1.0
        for confidence, siblings in chain.scores:
            kept = self.rate(confidence)
            tau += path * ((1 - kept) * min(siblings / max(1 - confidence, 1e-6), 1.0) + kept)
            path *= kept
        return tau, path

    def update(self, chain: Chain, kept: int) -> None:
        """A verdict kept the first `kept` of the chain's tokens."""
        for i, (confidence, _) in enumerate(chain.scores[: kept + 1]):
            j = self.bin(confidence)
            self.offered[j] += 1
            self.kept[j] += i < kept


class ChainSizing:
    """`shape=auto` for a chain drafted token by token (drafters independent, self_draft and cross_vocab's
    mode=shared): after each token, whether drafting on pays (`Sizer.grows`), from the chain's acceptance
    calibrated by past verdicts (`ChainRate`) and the run's measured drafting time, each next token costing the
    run's drafting seconds per chain token so far (the step's mean draft forward on the first step; none where
    its law is computed already: with lookup many tokens come with a forward drafted for another, and the run's
    mean counts them). It reads the draft, the clock and past verdicts only, so it stays lossless.

    In a batch the rows size together: a draft forward is shared by the rows drafting at its level, and the
    verification forward pads every row to the widest, so a row below the widest drafts on for its drafting
    alone and the row that widens it pays for every row's padding (`Sizer.grows`); the target's cost of a
    batch's verification is measured for the batch sizes a run decodes (`prefill`)."""

    def __init__(self, sizer: Sizer, target: LoadedModel, most: int):
        self.sizer, self.rate = sizer, ChainRate()
        self.target, self.most, self.rows = target, most, 1  # what the cost curve is measured for: its batches up to `rows` rows
        self.clock = time.perf_counter  # the measure of drafting time (seconds)
        self.drafted = [0.0, 0.0]  # drafting seconds and chain tokens (a row's mean) over the run
        self.began: tuple[float, list[int]] = (0.0, [])  # the step's start: its clock and each row's draft forwards before it
        self.chains: list[Chain | None] = []  # the step's chains (None: a row that drafts none)
        self.width = 1  # the widest row's verification so far this step (its root and nodes), with the tokens rows go on to

    @classmethod
    def of(cls, target: LoadedModel, s: options.ShapedChain) -> ChainSizing | None:
        """What a chain's settings ask for: sizing on the target's measured cost curve up to the widest draft they
        allow (k, or k_max under the heuristic; each token with its siblings) where s.shape is auto, else None."""
        if s.shape != "auto":
            return None
        k = s.k_max or 4 * s.k if s.k_policy == "heuristic" else s.k
        most = k * (1 + s.siblings)
        return cls(Sizer.measure(target, most), target, most)

    def prefill(self, rows: int) -> None:
        """A run decodes `rows` rows together: the target's cost of verifying batches of that many is measured
        (once per machine: kept in the model cache), unless it is already."""
        if rows > self.rows:
            self.sizer.batch = Sizer.measure(self.target, self.most, rows).batch
            self.rows = rows

    def begin(self, forwards: list[int], chains: list[Chain | None]) -> None:
        """A step's drafting starts; `forwards`: each row's draft forwards so far (Drafter.row_forwards); `chains`:
        the rows' chains, drafted in place."""
        self.began, self.chains, self.width = (self.clock(), list(forwards)), chains, 1

    def pays(self, b: int, chain: Chain, ahead: bool, forwards: list[int], left: int) -> bool:
        """Whether row b's chain should draft on: `ahead`, the next token's law is computed already; `forwards`,
        each row's draft forwards so far; `left`, the most tokens it may still take."""
        start, before = self.began
        drafting = self.clock() - start
        seconds, tokens = self.drafted
        levels = forwards[b] - before[b]  # the draft forwards of this step so far (every row drafting now has had as many)
        step = seconds / tokens if tokens else drafting / max(levels, 1)
        step /= max(1, sum(f - f0 == levels for f, f0 in zip(forwards, before)))  # shared by the rows drafting at this level
        more = 1 + (len(chain.others[-1]) if chain.others else 0)  # it and as many siblings as the last token had
        tau, path = self.rate.tau(chain)
        m = 1 + chain.size
        self.width = max(self.width, *(1 + c.size for c in self.chains if c is not None))
        on = self.sizer.grows(tau, path, self.rate.rate(chain.confidence), m, more, drafting, 0.0 if ahead else step, step, left,
                              rows=len(before), width=self.width)
        if on:
            self.width = max(self.width, m + more)
        return on

    def end(self, chains: list[Chain | None]) -> None:
        """The step's chains are drafted (None: a row that drafted none): their predictions join the run's."""
        drafted = [chain for chain in chains if chain is not None]
        if not drafted:
            return
        drafting = self.clock() - self.began[0]
        self.drafted[0] += drafting
        self.drafted[1] += sum(len(chain.tokens) for chain in drafted) / len(drafted)
        if any(chain.tokens for chain in drafted):  # every row's tokens (1 where it drafted none) for the batch's forward
            tau = sum(self.rate.tau(chain)[0] if chain is not None and chain.tokens else 1.0 for chain in chains)
            self.sizer.record(tau, max(1 + chain.size for chain in drafted), drafting, rows=len(chains))

    def commit(self, chains: list[Chain | None], verdicts: list[Verdict]) -> None:
        """Each chain's verdict calibrates the acceptance rates (None: a row that drafted none)."""
        for chain, verdict in zip(chains, verdicts):
            if chain is not None:
                self.rate.update(chain, chain.accepted(verdict))

    @property
    def predicted_speedup(self) -> float | None:
        """The speedup over plain decoding the stops predicted, over the steps so far."""
        return self.sizer.predicted_speedup


class IndependentDrafter(Drafter):
    """A smaller model with the target's tokenizer proposes k tokens autoregressively: its argmax
    when decoding greedily (q = None), else samples from its own q after the same processing as p.

    Its KV cache holds every accepted token but the last of each row, like the target's. When all k draft
    tokens are accepted it has not yet seen the k-th one (gpt-fast's subtlety): the next proposal
    feeds the two missing tokens in one forward.

    With `lookup`, the draft itself is sped up by prompt lookup (a vertical cascade, as in Cascade
    Speculative Drafting, Chen et al. 2023, whose lowest level is also an n-gram model): each draft
    forward also feeds the up to `lookup` tokens that continued an earlier occurrence of the chain's
    last n-gram, and the chain goes on through those rows while the draft's own token (its argmax,
    or its sample from q) equals the guess. Every token is still drawn from the draft's q given the
    chain before it, once per token from the same generator, and that q is the one reported: in
    exact arithmetic the chain drafted without lookup, in fewer forwards (an int8 draft quantizes a
    forward's rows together, so its q moves slightly with the guesses beside it).

    With `shape=auto` the chain's length follows this machine's cost curve (Sequoia's sizing, made per
    token): after each token it decides whether drafting on raises the predicted speedup
    τ̂ / (d + v(m)) of the run, τ̂ = 1 + its nodes' chances of being kept (siblings included; the draft's
    probabilities calibrated by past verdicts, `ChainRate`), d the measured drafting time and v(m) the
    target's measured cost of verifying m tokens, both over one target token's. It drafts on while some
    longer chain (up to k; each next token as likely as the last and costing the run's drafting seconds
    per chain token, the next none where the lookup's forward already scored it) adds tokens faster than
    the run's predicted speedup so far (Sizer.grows: the run's rate, not the step's, and a horizon, not
    one token). The stop reads the draft, the clock and past verdicts only, as the other stops and a
    heuristic k do, so it stays lossless. In a batch the rows size together (`ChainSizing`): the verification
    pads every row to the widest, so a row drafts on below the widest for its drafting alone and the widest
    pays every row's padding, on the target's measured cost of a batch's forward (other rows' drafts are
    independent of a row's verification, so this too stays lossless).
    """

    name = "independent"
    # the defaults (a chain sized by the cost curve, lookup, siblings and an int8 draft where the CPU has the kernels), a
    # plain chain of 4, each lever on the plain chain alone, and the defaults with the constant stop of before 2026-12-05
    modes = {"default": (), "plain chain": plain_chain(), "cheap draft": plain_chain(**{
                 "model.vocab": 200, "model.vocab_corpus": "mtbench", "model.quantize": "int8"}),
             "lookup": plain_chain(lookup=4), "chain confidence": plain_chain(k=8, chain_confidence=0.3),
             "siblings": plain_chain(siblings=2), "siblings by confidence": plain_chain(siblings=3, sibling_confidence=0.05),
             "constant stop": ("shape=null", "chain_confidence=0.4")}

    Settings = options.Independent

    def __init__(self, target: LoadedModel, model: Mapping | LoadedModel | DraftModel | None = None, **given):
        """
        Args:
            target: the target model; the draft must share its vocabulary.
            model: the draft model: load_model() arguments (name, dtype, device, ...) plus the
                cheaper-draft options `vocab`, `vocab_corpus`, `quantize` (drafters.draft_model), a
                LoadedModel, or a DraftModel.
            **given: the settings (`Settings`: k, k_policy, k_max, confidence, chain_confidence, shape, siblings,
                sibling_confidence, lookup), the rest at their defaults. Each is lossless: the stops,
                siblings and guesses depend on the draft alone (siblings are verified against the
                target's residual), and k on past verdicts only.
        """
        s = self.settings = make(self.Settings, given)
        if model is None:
            raise SpecResearchError("drafter=independent needs a draft model: set drafter.model.name")
        self.confidence, self.chain_confidence, self.lookup = s.confidence, s.chain_confidence, s.lookup
        self.siblings = Siblings(s.siblings, s.sibling_confidence)
        self._chains: list[tuple[int, Chain]] = []  # each row's (context length, chain) of the last step
        self.draft = DraftModel.load(model, target)
        self.sizing = ChainSizing.of(target, s)

    @property
    def predicted_speedup(self) -> float | None:
        """shape=auto: the speedup over plain decoding its stops predicted, over the steps so far."""
        return None if self.sizing is None else self.sizing.predicted_speedup

    def prefill_rows(self, ctxs: list[Context]) -> None:
        super().prefill_rows(ctxs)
        if self.sizing is not None:
            self.sizing.prefill(len(ctxs))
        self.draft.reset()
        self.draft.prefill_rows([ctx.tokens[:-1] for ctx in ctxs], reuse=ctxs[0].reuse_prefill)

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        """Every row's chain: one draft forward per level feeds each row still drafting (rows done drafting
        feed nothing) its pending tokens and, with `lookup`, its own prompt-lookup guesses (ragged rows),
        each row in its own slots of the draft's cache (CachedLM's rows)."""
        scored = self.confidence is not None or self.chain_confidence is not None or self.sizing is not None
        chains = [Chain(ctx, self.draft.shortlist, self.siblings, scored) for ctx in ctxs]
        self._chains = [(ctx.tokens.numel(), chain) for ctx, chain in zip(ctxs, chains)]
        # each row's tokens its draft has not seen: [1], or [2] after a fully accepted step; [0] where it drafts nothing
        pending = [ctx.tokens[n:] if ctx.max_draft > 0 else ctx.tokens[:0] for ctx, n in zip(ctxs, self.draft.lengths)]
        if self.sizing is not None:
            self.sizing.begin(self.row_forwards, chains)
        self.draft.draft_chains(pending, lambda b: self._guess(ctxs[b], chains[b]),
                                lambda b, logits, guess: self._walk(b, ctxs[b], chains[b], logits, guess), self.count)
        if self.sizing is not None:
            self.sizing.end(chains)
        return [chain.draft() for chain in chains]

    def _walk(self, b: int, ctx: Context, chain: Chain, logits: Tensor, guess: Tensor) -> tuple[int, Tensor, bool]:
        """Add the draft's token of each row of `logits` ([G + 1, V or N]; row i: the draft's law after the
        pending tokens and guess[:i]) to row b's chain while it repeats the guess. Returns (i, [1] the last
        token added, whether the chain is drafted): guess[:i] became the chain's."""
        for i, row in enumerate(logits):
            x = chain.add(row)
            ahead = i < guess.numel() and bool(x == guess[i])  # the next token's law is in this forward already
            done = self._done(b, ctx, chain, ahead)
            if done or not ahead:
                break
        return i, x[None], done

    def _done(self, b: int, ctx: Context, chain: Chain, ahead: bool) -> bool:
        """Whether row b's chain is drafted: it reached the step's draft length, a confidence stop fired, or
        (shape=auto) one more token would not pay; `ahead`: the next token's law is computed already."""
        left = ctx.max_draft - len(chain.tokens)
        return (left == 0 or chain.confidence < (self.confidence or 0.0) or chain.path < (self.chain_confidence or 0.0)
                or (self.sizing is not None and not self.sizing.pays(b, chain, ahead, self.row_forwards, left)))

    def _guess(self, ctx: Context, chain: Chain) -> Tensor:
        """[G] prompt lookup's continuation of the context and the chain so far (G < what is left to draft)."""
        want = min(self.lookup, ctx.max_draft - len(chain.tokens) - 1)
        if want <= 0:
            return ctx.tokens[:0]
        tokens = torch.cat([ctx.tokens, *[x[None] for x in chain.tokens]])  # [T + chain]
        return lookup(tokens, want, match="last").to(ctx.tokens.device)

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        if self.sizing is not None:
            self.sizing.commit([chain for _, chain in self._chains], verdicts)
        # Keep what each row's draft cache saw of its accepted sequence (everything but its last token),
        # and none of the chain after a sibling the target took in its place.
        self.draft.truncate_rows([min(n, ctx.tokens.numel() - 1, start + chain.accepted(verdict))
                                  for n, ctx, verdict, (start, chain) in zip(self.draft.lengths, ctxs, verdicts, self._chains)])

    def select_rows(self, index: list[int]) -> None:
        super().select_rows(index)
        self.draft.select_rows(index)
        self._chains = [self._chains[i] for i in index]
