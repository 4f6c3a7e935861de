"""An independent draft model (Leviathan et al., 2023; Chen et al., 2023)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from specresearch.drafters.base import Chain, Context, Drafter
from specresearch.drafters.draft_model import DraftModel
from specresearch.drafters.ngram import lookup
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
    """

    name = "independent"
    # the defaults (a chain with stops, lookup, siblings and an int8 draft where the CPU has the kernels), a plain
    # chain of 4, and each lever on the plain chain alone
    modes = {"default": (), "plain chain": plain_chain(), "cheap draft": plain_chain(**{
                 "model.vocab": 200, "model.vocab_corpus": "mtbench", "model.quantize": "int8"}),
             "lookup": plain_chain(lookup=4), "chain confidence": plain_chain(k=8, chain_confidence=0.3),
             "siblings": plain_chain(siblings=2), "siblings by confidence": plain_chain(siblings=3, sibling_confidence=0.05)}

    Settings = options.Independent

    def __init__(self, target: LoadedModel, model: Mapping | LoadedModel | DraftModel | None = None, **given):
        """
        Args:
            target: the target model; the draft must share its vocabulary.
            model: the draft model: load_model() arguments (name, dtype, device, ...) plus the
                cheaper-draft options `vocab`, `vocab_corpus`, `quantize` (drafters.draft_model), a
                LoadedModel, or a DraftModel.
            **given: the settings (`Settings`: k, k_policy, k_max, confidence, chain_confidence, siblings,
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

    def prefill_rows(self, ctxs: list[Context]) -> None:
        super().prefill_rows(ctxs)
        self.draft.reset()
        self.draft.prefill_rows([ctx.tokens[:-1] for ctx in ctxs], reuse=ctxs[0].reuse_prefill)

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        """Every row's chain: one draft forward per level feeds each row still drafting (rows done drafting
        feed nothing) its pending tokens and, with `lookup`, its own prompt-lookup guesses (ragged rows),
        each row in its own slots of the draft's cache (CachedLM's rows)."""
        scored = self.confidence is not None or self.chain_confidence is not None
        chains = [Chain(ctx, self.draft.shortlist, self.siblings, scored) for ctx in ctxs]
        self._chains = [(ctx.tokens.numel(), chain) for ctx, chain in zip(ctxs, chains)]
        # each row's tokens its draft has not seen: [1], or [2] after a fully accepted step; [0] where it drafts nothing
        pending = [ctx.tokens[n:] if ctx.max_draft > 0 else ctx.tokens[:0] for ctx, n in zip(ctxs, self.draft.lengths)]
        self.draft.draft_chains(pending, lambda b: self._guess(ctxs[b], chains[b]),
                                lambda b, logits, guess: self._walk(ctxs[b], chains[b], logits, guess), self.count)
        return [chain.draft() for chain in chains]

    def _walk(self, ctx: Context, chain: Chain, logits: Tensor, guess: Tensor) -> tuple[int, Tensor, bool]:
        """Add the draft's token of each row of `logits` ([G + 1, V or N]; row i: the draft's law after the
        pending tokens and guess[:i]) to the chain while it repeats the guess. Returns (i, [1] the last token
        added, whether the chain is drafted): guess[:i] became the chain's."""
        for i, row in enumerate(logits):
            x = chain.add(row)
            done = self._done(ctx, chain)
            if done or i == guess.numel() or x != guess[i]:
                break
        return i, x[None], done

    def _done(self, ctx: Context, chain: Chain) -> bool:
        """Whether the chain is drafted: it reached the step's draft length, or a confidence stop fired."""
        return (len(chain.tokens) == ctx.max_draft or chain.confidence < (self.confidence or 0.0)
                or chain.path < (self.chain_confidence or 0.0))

    def _guess(self, ctx: Context, chain: Chain) -> Tensor:
        """[G] prompt lookup's continuation of the context and the chain so far (G < what is left to draft)."""
        want = min(self.lookup, ctx.max_draft - len(chain.tokens) - 1)
        if want <= 0:
            return ctx.tokens[:0]
        tokens = torch.cat([ctx.tokens, *[x[None] for x in chain.tokens]])  # [T + chain]
        return lookup(tokens, want, match="last").to(ctx.tokens.device)

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        # Keep what each row's draft cache saw of its accepted sequence (everything but its last token),
        # and none of the chain after a sibling the target took in its place.
        self.draft.truncate_rows([min(n, ctx.tokens.numel() - 1, start + chain.accepted(verdict))
                                  for n, ctx, verdict, (start, chain) in zip(self.draft.lengths, ctxs, verdicts, self._chains)])

    def select_rows(self, index: list[int]) -> None:
        super().select_rows(index)
        self.draft.select_rows(index)
        self._chains = [self._chains[i] for i in index]
