"""An independent draft model (Leviathan et al., 2023; Chen et al., 2023)."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Mapping

import torch

from specresearch.drafters.base import Chain, Context, Drafter
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel, check_same_vocab, load_model, use_skinny_linear
from specresearch.target import Target
from specresearch.types import Draft, Verdict
from specresearch.vocab import Shortlist


class IndependentDrafter(Drafter):
    """A smaller model with the target's tokenizer proposes k tokens autoregressively: its argmax
    when decoding greedily (q = None), else samples from its own q after the same processing as p.

    Its KV cache holds every accepted token but the last, like the target's. When all k draft
    tokens are accepted it has not yet seen the k-th one (gpt-fast's subtlety): the next proposal
    feeds the two missing tokens in one forward.
    """

    name = "independent"

    def __init__(
        self,
        target: LoadedModel,
        k: int = 4,
        model: Mapping | LoadedModel | None = None,
        vocab: int | None = None,
        vocab_corpus: str = "python-stdlib",
        quantize: str | None = None,
        confidence: float | None = None,
        k_policy: str = "fixed",
        k_max: int | None = None,
    ):
        """
        Args:
            target: the target model; the draft must share its vocabulary.
            k: draft tokens per step (>= 1).
            model: the draft model: load_model() arguments (name, dtype, device, ...) or a LoadedModel.
            vocab: draft only over the `vocab` most frequent tokens (FR-Spec, Zhao et al., 2025): the
                draft's lm head scores those rows only. None = the whole vocabulary. Lossless either
                way: a sampled draft reports the q it drew from (zero outside the shortlist).
            vocab_corpus: offline text the frequencies come from (see specresearch.vocab).
            quantize: "int8": the draft's linear layers get int8 weights (torch's dynamic
                quantization, CPU only; activations in float32), on a copy of the draft model.
                None = as loaded. Lossless either way: only the draft changes.
            confidence: stop drafting early, after a token whose draft probability is below this
                (transformers' assistant_confidence_threshold; Leviathan's k becomes a maximum).
                None = always k tokens. Lossless: the stop depends on the draft alone.
            k_policy: "fixed", or "heuristic" (transformers' schedule, see engine.DraftLength);
                combines with `confidence` as in transformers. Lossless: k depends on past verdicts only.
            k_max: the largest k the heuristic may reach (None = 4 k).
        """
        if int(k) < 1:
            raise SpecResearchError(f"drafter=independent needs k >= 1, got k={k} (use drafter=none for plain decoding)")
        if model is None:
            raise SpecResearchError("drafter=independent needs a draft model: set drafter.model.name")
        if quantize not in (None, "int8"):
            raise SpecResearchError(f"unknown drafter.quantize '{quantize}': valid are null (none), int8")
        if confidence is not None and not 0 < float(confidence) < 1:
            raise SpecResearchError(f"drafter.confidence must lie in (0, 1) or be null, got {confidence}")
        self.k, self.k_policy, self.k_max = int(k), k_policy, k_max  # the engine's DraftLength reads them
        self.confidence = None if confidence is None else float(confidence)
        draft = model if isinstance(model, LoadedModel) else load_model(**dict(model))
        check_same_vocab(target, draft)
        self._forwards = 0
        lm_head = draft.model.get_output_embeddings()
        self.shortlist: Shortlist | None = None  # the tokens the draft may propose; None = all
        self.head: torch.Tensor | None = None  # [N, H] their rows of the draft's lm head (Target.forward's head)
        if vocab is not None:
            if getattr(lm_head, "bias", None) is not None or getattr(draft.model.config, "final_logit_softcapping", None):
                raise SpecResearchError(f"drafter.vocab needs a plain linear lm head; {draft.name} has a bias or logit softcapping")
            cache = model.get("cache_dir") if isinstance(model, Mapping) else None
            self.shortlist = Shortlist.load(lm_head, draft.tokenizer, int(vocab), vocab_corpus, cache)
            self.head = self.shortlist.head.weight
        if quantize is not None:
            draft = quantize_int8(draft)
            self.head = None if self.head is None else self.head.to(draft.dtype)
        self.draft = Target(draft)

    def prefill(self, ctx: Context) -> None:
        self.draft.reset()
        self.draft.prefill(ctx.tokens[:-1], reuse=ctx.reuse_prefill)

    def propose(self, ctx: Context) -> Draft:
        pending = ctx.tokens[self.draft.length :]  # [1], or [2] after a fully accepted step
        chain = Chain(ctx, self.shortlist)
        for _ in range(ctx.max_draft):
            logits = self.draft.forward(pending, head=self.head)[-1]  # [V], or [N] over the shortlist
            self._forwards += 1
            pending = chain.add(logits)[None]
            if self.confidence is not None and chain.confidence() < self.confidence:
                break  # an unlikely draft token: the next ones would likely be wasted
        return chain.draft()

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        # Keep what the draft cache saw of the accepted sequence; everything but its last token.
        self.draft.rollback(min(self.draft.length, ctx.tokens.numel() - 1))

    @property
    def draft_forwards(self) -> int:
        return self._forwards


def quantize_int8(lm: LoadedModel) -> LoadedModel:
    """A copy of `lm` in float32 whose nn.Linear layers (the lm head included) hold int8 weights, one
    scale per output channel (per-tensor scales cost the 0.5B Qwen draft 0.1 of α), computed with
    torch's dynamic quantization kernels (fbgemm/oneDNN on x86, qnnpack on ARM)."""
    if lm.device.type != "cpu":
        raise SpecResearchError(f"drafter.quantize=int8 runs on the CPU only (torch's dynamic int8 kernels); the draft is on {lm.device}")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    model = use_skinny_linear(copy.deepcopy(lm.model).float(), False)  # quantize_dynamic swaps plain nn.Linear only
    with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors in favour of torchao
        warnings.simplefilter("ignore")
        model = quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    return dataclasses.replace(lm, model=model, dtype=torch.float32, name=f"{lm.name} (int8)")
