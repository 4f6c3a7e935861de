"""Self-speculative decoding by layer skipping (Draft & Verify, Zhang et al., 2023; LayerSkip's early
exit, Elhoushi et al., 2024): the target drafts for itself with some of its layers skipped."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from specresearch.drafters.draft_model import cheapen
from specresearch.drafters.independent import IndependentDrafter
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel
from specresearch.options import drafters as options
from specresearch.options import make


class SelfDraftDrafter(IndependentDrafter):
    """The target without some of its decoder layers is the draft model: same weights (nothing is
    copied), its own KV cache for the layers it runs. Everything else is IndependentDrafter's (q,
    confidence, k_policy, `shape=auto`: the chain's length read from the cost curve, drafting timed on the
    skipped target), so greedy and rejection verification stay lossless.

    Which layers to skip: `skip` (explicit indices), or `exit_layer` (LayerSkip's early exit: run
    layers 0 .. exit_layer − 1 only), or `skip_ratio` (that fraction of the layers, evenly spaced
    between the first and the last, which are kept; a 2-layer model skips its second). The first layer is always kept: the
    cache's length is read from it.
    """

    name = "self_draft"
    modes = {"default": (), "cheap draft": ("vocab=200", "vocab_corpus=mtbench", "quantize=int8"), "lookup": ("lookup=4",),
             "siblings": ("siblings=2",), "shape auto": ("shape=auto",)}

    Settings = options.SelfDraft

    def __init__(self, target: LoadedModel, **given):
        """
        Args:
            target: the target model, which drafts for itself.
            **given: the settings (`Settings`): the layers skipped (skip, or exit_layer: keep layers
                [0, exit_layer) only, or skip_ratio: this fraction, evenly spaced), a cheaper draft
                (vocab, vocab_corpus, quantize: as for a draft model's node, drafters.draft_model.cheapen;
                quantize copies the layers the draft runs), and the chain's (IndependentDrafter's). The
                rest at their defaults.
        """
        s = make(self.Settings, given)  # before the draft is built
        n = len(decoder_layers(target.model))
        self.skipped = skipped_layers(n, s.skip, s.exit_layer, s.skip_ratio)
        draft = cheapen(without_layers(target, self.skipped), target, vocab=s.vocab, vocab_corpus=s.vocab_corpus, quantize=s.quantize)
        chain = {f.name: getattr(s, f.name) for f in dataclasses.fields(options.ShapedChain)}
        super().__init__(target, model=draft, **chain)
        self.settings = s


def skipped_layers(n: int, skip: Sequence[int] | None, exit_layer: int | None, skip_ratio: float | None) -> list[int]:
    """The sorted layer indices to skip, from exactly one of the three settings."""
    given = [name for name, value in (("skip", skip), ("exit_layer", exit_layer)) if value is not None]
    if len(given) > 1:
        raise SpecResearchError("drafter=self_draft takes one of drafter.skip and drafter.exit_layer; set the other to null")
    if skip is not None:
        layers = sorted({int(i) for i in skip})
        if not layers or layers[0] < 1 or layers[-1] >= n:
            raise SpecResearchError(f"drafter.skip must list layer indices in [1, {n - 1}] (layer 0 is always kept), got {list(skip)}")
        return layers
    if exit_layer is not None:
        if not 1 <= int(exit_layer) < n:
            raise SpecResearchError(f"drafter.exit_layer must lie in [1, {n - 1}] for a model with {n} layers, got {exit_layer}")
        return list(range(int(exit_layer), n))
    if skip_ratio is None or not 0 < float(skip_ratio) < 1:
        raise SpecResearchError(f"drafter=self_draft needs drafter.skip, drafter.exit_layer or a skip_ratio in (0, 1), got {skip_ratio}")
    if n < 2:
        raise SpecResearchError(f"drafter=self_draft needs a model with at least 2 layers, this one has {n}")
    inner = list(range(1, n - 1)) if n > 2 else [1]  # the first layer is kept, and the last when there is a choice
    count = min(len(inner), max(1, round(float(skip_ratio) * n)))
    return sorted({inner[round(i * (len(inner) - 1) / max(count - 1, 1))] for i in range(count)})


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise SpecResearchError(f"drafter=self_draft needs a decoder with model.model.layers; {type(model).__name__} has none")
    return layers


def without_layers(lm: LoadedModel, skip: Sequence[int]) -> LoadedModel:
    """A view of `lm` whose decoder skips the layers in `skip`: shallow copies of the two outer
    modules with their own child registries, so the target itself is untouched and no weight is
    copied. Kept layers keep their layer_idx, so they use their own slots of a full-size KV cache."""
    outer = copy.copy(lm.model)
    outer._modules = dict(outer._modules)
    inner = copy.copy(outer.model)
    inner._modules = dict(inner._modules)
    skipped = set(skip)
    inner.layers = nn.ModuleList([layer for i, layer in enumerate(decoder_layers(lm.model)) if i not in skipped])
    outer.model = inner
    return dataclasses.replace(lm, model=outer, name=f"{lm.name} without layers {list(skip)}", compiled=None)


@torch.inference_mode()
def agreement(lm: LoadedModel, skip: Sequence[int], tokens: Tensor, reference: Tensor) -> float:
    """The share of positions where the model without `skip` predicts the same next token as `reference`
    ([T − 1], the full model's argmax), teacher forced on `tokens` ([T])."""
    logits = without_layers(lm, skip).model(input_ids=tokens[None].to(lm.device)).logits[0, :-1]  # [T-1, V]
    return float((logits.argmax(-1).cpu() == reference).float().mean())


@torch.inference_mode()
def search_skip(lm: LoadedModel, tokens: Tensor, n_skip: int, progress: bool = False) -> tuple[list[int], list[float]]:
    """A greedy search for layers to skip (simpler than Draft & Verify's Bayesian optimisation): skip one
    layer at a time, each time the one whose removal keeps the draft's top-1 agreement with the full
    model highest on `tokens` (calibration text, teacher forced). Layer 0 is never skipped.

    Returns:
        The skipped layers in the order they were chosen, and the agreement after each choice.
    """
    n = len(decoder_layers(lm.model))
    if not 1 <= n_skip < n:
        raise SpecResearchError(f"the layer search can skip 1 to {n - 1} of {n} layers, got {n_skip}")
    reference = lm.model(input_ids=tokens[None].to(lm.device)).logits[0, :-1].argmax(-1).cpu()  # [T-1]
    chosen, scores = [], []
    for _ in range(n_skip):
        scored = {layer: agreement(lm, chosen + [layer], tokens, reference) for layer in range(1, n) if layer not in chosen}
        best = max(scored, key=scored.get)
        chosen.append(best)
        scores.append(scored[best])
        if progress:
            print(f"skip {sorted(chosen)}: top-1 agreement {scored[best]:.3f}", flush=True)
    return chosen, scores


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m specresearch.drafters.self_draft --model NAME --skip N`: search layers to skip on
    offline calibration text and print the `drafter.skip=[...]` override."""
    import argparse

    from specresearch.models import load_model
    from specresearch.vocab import CORPORA, corpus_texts

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target (a model-group name or path)")
    parser.add_argument("--skip", type=int, required=True, help="how many layers to skip")
    parser.add_argument("--tokens", type=int, default=256, help="calibration tokens")
    parser.add_argument("--corpus", default="python-stdlib", choices=CORPORA, help="offline calibration text")
    args = parser.parse_args(argv)
    lm = load_model(args.model)
    ids = lm.tokenizer.encode("\n".join(corpus_texts(args.corpus)[:50]), add_special_tokens=False)[: args.tokens]
    chosen, scores = search_skip(lm, torch.tensor(ids), args.skip, progress=True)
    print(f"\ndrafter=self_draft drafter.skip=[{','.join(map(str, sorted(chosen)))}]   # agreement {scores[-1]:.3f} on {len(ids)} tokens")


if __name__ == "__main__":
    main()
