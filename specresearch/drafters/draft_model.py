"""The draft model of the drafters that run one (independent, tree and its ensemble, self_draft), with
the two ways to make it cheaper that its model node offers. Both change the draft alone, so every
drafter and verifier stays as lossless as it was:

- `vocab`: FR-Spec's shortlist (Zhao et al., 2025): the draft's lm head scores only the N most
  frequent tokens of offline text; a sampled draft reports the q it drew from (zero elsewhere);
- `quantize: int8`: int8 weights for every linear layer, the shortlist's head included (torch's
  dynamic quantization, CPU only, activations in float32), on a copy of the model; `auto`: int8
  where the draft runs on a CPU that torch has int8 kernels for, else the weights as loaded.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM
from specresearch.models import LINEARS, LoadedModel, check_same_vocab, load_model, say_once, use_linear
from specresearch.vocab import Shortlist

QUANTIZE = ("int8", "auto")
OPTIONS = ("vocab", "vocab_corpus", "quantize")  # the keys a draft model's node adds to load_model's: cheapen's


class DraftModel(CachedLM):
    """A draft model with its own KV cache (the target wrapper) whose forward scores its shortlist, if
    it has one: logits are then [K, N] over `shortlist.ids`, and `token` / `widen` map them back."""

    def __init__(self, lm: LoadedModel, shortlist: Shortlist | None = None, head: torch.nn.Module | None = None):
        """
        Args:
            lm: the (possibly quantized) draft model.
            shortlist: the tokens it may propose; None = the whole vocabulary.
            head: the shortlist's lm head as `lm` runs it (int8 with `lm`); None = shortlist.head.
        """
        super().__init__(lm)
        self.shortlist = shortlist
        self.head = head if head is not None or shortlist is None else shortlist.head

    @classmethod
    def load(cls, spec: Mapping | LoadedModel | DraftModel, target: LoadedModel, **cheaper) -> DraftModel:
        """The draft a drafter runs.

        Args:
            spec: a model node: load_model()'s settings plus `vocab`, `vocab_corpus`, `quantize` (see
                `cheapen`); or a LoadedModel (made cheaper by `cheaper`); or a DraftModel (as it is).
            target: the target model; the draft must share its vocabulary.
            **cheaper: `cheapen`'s options, for a LoadedModel.
        """
        if isinstance(spec, DraftModel):
            return spec
        if isinstance(spec, LoadedModel):
            return cheapen(spec, target, **cheaper)
        settings, options = split_spec(spec)
        return cheapen(load_model(**settings), target, **options)

    def _forward(self, tokens: Tensor, head=None, parents: Tensor | None = None, tree: int | None = None) -> Tensor:
        """CachedLM._forward (one row's), scored by the shortlist's head when there is one: [K, N] logits."""
        return super()._forward(tokens, head=head if head is not None else self.head, parents=parents, tree=tree)

    def forward_rows(self, fed, parents, head=None, tree: int | None = None) -> list[Tensor]:
        """CachedLM.forward_rows, scored by the shortlist's head when there is one: [n_b, N] logits per row."""
        return super().forward_rows(fed, parents, head=head if head is not None else self.head, tree=tree)

    def draft_chains(self, pending: list[Tensor], guess: Callable[[int], Tensor],
                     walk: Callable[[int, Tensor, Tensor], tuple[int, Tensor, bool]], count: Callable[[Iterable[int]], None]) -> None:
        """The chain drafters' loop (independent, self_draft, cross_vocab): one forward per level for every
        row still drafting (ragged rows, each in its own slots of the cache), until no row is.

        Args:
            pending: each row's tokens not yet fed ([n_b] >= 1; [0]: the row drafts nothing this step).
            guess: guess(b) is row b's prompt-lookup guess for this level ([G_b], maybe [0]), fed after its
                pending tokens so that one forward drafts the tokens the draft agrees with.
            walk: walk(b, logits, guess) reads the draft's laws after the pending tokens and each prefix of the
                guess (logits [G_b + 1, V or N]), adds the row's tokens to its chain and returns (i, pending,
                done): the guess's first i tokens became the chain's (the cache keeps them), the row's next
                pending tokens ([1]: its last drafted token, not fed yet), and whether its chain is drafted.
            count: count(rows) records one draft forward of those rows (Drafter.count).
        """
        live = [tokens.numel() > 0 for tokens in pending]
        while any(live):
            guesses = [guess(b) if on else pending[b][:0] for b, on in enumerate(live)]  # [G_b]
            fed = [torch.cat([tokens, g]) if on else tokens[:0] for tokens, g, on in zip(pending, guesses, live)]
            logits = self.forward_rows(fed, [None] * len(fed))  # [n_b, V or N] per row
            count(b for b, on in enumerate(live) if on)
            kept = [range(0)] * len(pending)  # per row, the fed tokens its cache keeps
            for b, on in enumerate(live):
                if on:
                    n = pending[b].numel()
                    i, pending[b], done = walk(b, logits[b][n - 1 :], guesses[b])
                    live[b], kept[b] = not done, range(n + i)
            self.keep_rows(kept)

    def token(self, x: int) -> int:
        """The token id of index `x` of this draft's logits."""
        return x if self.shortlist is None else int(self.shortlist.ids[x])

    def widen(self, q: Tensor) -> Tensor:
        """[..., N] a law over this draft's logits → [..., V] over the whole vocabulary."""
        return q if self.shortlist is None else self.shortlist.widen(q)


def split_spec(spec: Mapping) -> tuple[dict, dict]:
    """A draft model's node as (load_model()'s settings, `cheapen`'s options: vocab, vocab_corpus,
    quantize and the model cache)."""
    settings = dict(spec)
    options = {key: settings.pop(key) for key in OPTIONS if key in settings}
    return settings, {**options, "cache_dir": settings.get("cache_dir")}


def cheapen(
    lm: LoadedModel,
    target: LoadedModel,
    vocab: int | None = None,
    vocab_corpus: str = "python-stdlib",
    quantize: str | None = None,
    cache_dir: str | None = None,
    own_vocab: bool = False,
    allowed: Tensor | None = None,
) -> DraftModel:
    """`lm` as a draft for `target`, made cheaper.

    Args:
        lm: the draft model (shared, never modified: quantization works on a copy).
        target: the target model; the draft must share its vocabulary.
        vocab: draft only over the `vocab` most frequent tokens (FR-Spec): the lm head scores those
            rows only. None = the whole vocabulary.
        vocab_corpus: offline text the frequencies come from (see specresearch.vocab).
        quantize: "int8": int8 weights for the linear layers (CPU only); "auto": int8 where this machine
            runs them (`machine_quantize`); None = as loaded.
        cache_dir: the model cache, whose vocab/ folder keeps the token counts (None = the default).
        own_vocab: the draft keeps its own vocabulary (drafters.cross_vocab), not checked against the target's.
        allowed: [A] the only draft tokens it may propose (its shortlist; with `vocab`, the most frequent
            of them): a cross-vocabulary draft's tokens that the target's vocabulary shares. None = all.
    """
    if not own_vocab:
        check_same_vocab(target, lm)
    if quantize not in (None, *QUANTIZE):
        raise SpecResearchError(f"unknown drafter.model.quantize '{quantize}': valid are null (none), {', '.join(QUANTIZE)}")
    if quantize == "auto":
        quantize = machine_quantize(lm)
    shortlist = None
    if vocab is not None or allowed is not None:
        lm_head = lm.model.get_output_embeddings()
        if getattr(lm_head, "bias", None) is not None or getattr(lm.model.config, "final_logit_softcapping", None):
            what = "drafter.model.vocab" if vocab is not None else "a draft restricted to the shared tokens"
            raise SpecResearchError(f"{what} needs a plain linear lm head; {lm.name} has a bias or logit softcapping")
        if vocab is None:
            shortlist = Shortlist.of(lm_head, allowed)
        else:
            shortlist = Shortlist.load(lm_head, lm.tokenizer, int(vocab), vocab_corpus, cache_dir, allowed)
        kind = type(lm_head) if type(lm_head) in LINEARS else torch.nn.Linear
        use_linear(torch.nn.Sequential(shortlist.head), kind)  # the draft's kernels
    if quantize is None:
        return DraftModel(lm, shortlist)
    lm = quantize_int8(lm)
    head = None if shortlist is None else quantize_int8_module(torch.nn.Sequential(copy.deepcopy(shortlist.head).float()))[0]
    return DraftModel(lm, shortlist, head)


def machine_quantize(lm: LoadedModel) -> str | None:
    """quantize=auto on this machine: "int8" when the draft runs on a CPU that torch has int8 kernels
    for (a quantized engine: x86/fbgemm/oneDNN, qnnpack on ARM), else None; the console says which, once."""
    if lm.device.type == "cpu" and int8_engines():
        say_once(f"drafter.model.quantize=auto: int8 draft weights (a CPU with torch's {torch.backends.quantized.engine} int8 kernels)")
        return "int8"
    why = "torch has no int8 kernels here" if lm.device.type == "cpu" else f"int8 kernels are CPU only; the draft runs on {lm.device}"
    say_once(f"drafter.model.quantize=auto: the draft keeps its {lm.dtype} weights ({why})")
    return None


def int8_engines() -> list[str]:
    """The int8 kernel engines torch has on this machine (x86, fbgemm, onednn, qnnpack; none: empty)."""
    return [e for e in torch.backends.quantized.supported_engines if e != "none"]


def quantize_int8(lm: LoadedModel) -> LoadedModel:
    """A copy of `lm` in float32 whose nn.Linear layers (the lm head included) hold int8 weights, one
    scale per output channel (per-tensor scales cost the 0.5B Qwen draft 0.1 of α), computed with
    torch's dynamic quantization kernels (fbgemm/oneDNN on x86, qnnpack on ARM)."""
    if lm.device.type != "cpu":
        raise SpecResearchError(f"drafter.model.quantize=int8 runs on the CPU only (torch's dynamic int8 kernels); "
                                f"the draft is on {lm.device}")
    model = quantize_int8_module(copy.deepcopy(lm.model).float())
    return dataclasses.replace(lm, model=model, dtype=torch.float32, name=f"{lm.name} (int8)", compiled=None)


def quantize_int8_module(module: torch.nn.Module) -> torch.nn.Module:
    """`module` (float32) with its nn.Linear children (PackedLinear, SkinnyLinear and InvariantLinear ones included) swapped for
    dynamically quantized int8 ones, in place."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    use_linear(module, torch.nn.Linear)  # quantize_dynamic swaps plain nn.Linear only

    with warnings.catch_warnings():  # torch 2.13 deprecates quantized tensors in favour of torchao
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
