"""Relaxed (lossy) verification: keep the longest draft prefix (or tree path) whose tokens pass a
rule on the target's p alone, then let the target add one token. Faster than rejection sampling where the rule
is looser than the target's law, and not faithful to it: `specresearch.stats` measures by how much."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import replace

import torch
from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.options import make
from specresearch.options import verifiers as options
from specresearch.sampling import sample
from specresearch.types import Draft, SamplingParams, Verdict
from specresearch.verifiers.base import Verifier, argmax_law, argmax_verdicts, at, rowwise


class RelaxedVerifier(Verifier):
    """Accept draft token x_i while the rule `passes` on p_i and p_i(x_i); then add the target's token at the first
    rejected position (or the bonus position): drawn from p there (`recover=sample`, as Medusa's
    typical sampling does) or its argmax (`recover=greedy`). The draft's q is not used.

    At temperature 0 the decoding's p is one-hot, so every rule here keeps exactly the argmax path.
    `rule_temperature` makes a lossy greedy method instead: the rule reads softmax(logits / T_rule)
    (e.g. 1: top-k of the target's logits), while the added token stays the argmax (recover=greedy).
    """

    lossless = False

    Settings: type[options.Relaxed]  # each rule's

    def __init__(self, **given):
        """
        Args:
            **given: the rule's settings (`Settings`), the rest at their defaults: `recover`, the target's
                added token ("sample" from p, or "greedy", its argmax); `rule_temperature`, greedy decoding
                only: the rule reads softmax(logits / this); None = p.
        """
        s = self.settings = make(self.Settings, given)
        self.recover, self.rule_temperature = s.recover, s.rule_temperature

    def check_sampling(self, sampling: SamplingParams) -> None:
        if self.rule_temperature is not None and not (sampling.greedy and self.recover == "greedy"):
            raise SpecResearchError(
                f"verifier.rule_temperature is for greedy decoding (a lossy greedy method): use it with sampling=greedy and "
                f"verifier.recover=greedy; got temperature={sampling.temperature}, recover={self.recover}. At temperature > 0 "
                "the rule reads the decoding's own p: set rule_temperature=null"
            )

    def p_sampling(self, sampling: SamplingParams) -> SamplingParams:
        """The rule's view of the target: softmax at `rule_temperature` (same top-k/top-p) if set; its
        argmax, the added token with recover=greedy, is the greedy token all the same."""
        return sampling if self.rule_temperature is None else replace(sampling, temperature=float(self.rule_temperature))

    def verify_argmax(self, drafts, top: Tensor) -> list[Verdict]:
        return argmax_verdicts(drafts, top, longest=True)  # the longest passing path, as `_verify_tree`

    def acceptance(self, p: Tensor, q: Tensor, x: Tensor) -> Tensor:
        return self.passes(p, at(p, x)).to(p.dtype)  # [K] (or [K, M]) 0 or 1; q is not used

    def fallback(self, p: Tensor, q: Tensor | None) -> Tensor:
        return argmax_law(p) if self.recover == "greedy" else p

    def _verify_trees(self, drafts: list[Draft], p: Tensor, rngs: list[torch.Generator | None]) -> list[Verdict]:
        """Each row's tree by `_verify_tree` (p [B, W, V])."""
        return [self._verify_tree(draft, p[b, : len(draft) + 1], rng) for b, (draft, rng) in enumerate(zip(drafts, rngs))]

    def _verify_tree(self, draft: Draft, p: Tensor, rng: torch.Generator | None) -> Verdict:
        """Medusa's rule on a tree (`tree_path`), then the target's token after the path (from `fallback`)."""
        x = draft.tokens[: len(draft)].to(p.device)  # [N]
        path = self.tree_path(draft, p)
        y = sample(self.fallback(p[path[-1] + 1 if path else 0], None), rng)
        return Verdict(tokens=torch.cat([x[path], y[None]]).cpu(), num_accepted=len(path), path=path)

    def tree_path(self, draft: Draft, p: Tensor) -> list[int]:
        """The nodes Medusa's rule keeps of a tree: the longest path whose every token passes (ties: the
        path likelier under p); p [N + 1, V] as in `Verifier.__call__` (row 0 the root's, row i + 1 after node i)."""
        k = len(draft)
        x = draft.tokens[:k].to(p.device)  # [N]
        parents = draft.parents[:k].tolist()
        rows = torch.tensor(parents, dtype=torch.long, device=p.device) + 1  # [N] the row of p at each node's position (N may be 0)
        px = p[rows, x]  # [N]
        ok = self.passes(p[rows], px).tolist()
        score: dict[int, tuple[int, float]] = {-1: (0, 0.0)}  # node -> (depth, log p of its path), if it passes
        for i, parent in enumerate(parents):
            if ok[i] and parent in score:
                depth, logp = score[parent]
                score[i] = (depth + 1, logp + float(torch.log(px[i])))
        best = max(score, key=lambda i: score[i])
        path = []
        while best >= 0:
            path.append(best)
            best = parents[best]
        return path[::-1]

    @abstractmethod
    def passes(self, p: Tensor, px: Tensor) -> Tensor:
        """[K] bool: the rule, given the target's laws p ([K, V]) and each draft token's probability px ([K];
        or [K, M]: M tokens per row, then [K, M])."""


class TypicalVerifier(RelaxedVerifier):
    """Typical acceptance (Medusa, Cai et al., 2024): accept x if p(x) > min(ε, δ·exp(−H(p))), H the
    entropy of the target's p at that position. Exact at temperature 0 (p one-hot: only the argmax
    passes) for ε, δ ≤ 1, not both 1."""

    name = "typical"

    Settings = options.Typical  # epsilon: the hard threshold ε (Medusa's posterior_threshold); delta: the entropy-scaled δ

    def __init__(self, **given):
        super().__init__(**given)
        self.epsilon, self.delta = self.settings.epsilon, self.settings.delta

    def argmax_path(self, sampling: SamplingParams) -> bool:
        # a one-hot p passes its argmax only if min(ε, δ) < 1 (ε = δ = 1 accepts nothing)
        return super().argmax_path(sampling) and min(self.epsilon, self.delta) < 1

    def passes(self, p: Tensor, px: Tensor) -> Tensor:
        entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)  # [K]
        return px > rowwise(torch.clamp(self.delta * torch.exp(-entropy), max=self.epsilon), px)


class MarginVerifier(RelaxedVerifier):
    """Probability-margin acceptance: accept x if p(x) >= max p − margin, or, with `ratio`, if
    p(x) >= ratio · max p; never a token the target's p excludes (p(x) = 0: at temperature 0, or
    removed by top-k/top-p). So exact at temperature 0 for every margin in [0, 1] and ratio in (0, 1];
    margin = 1 at T > 0 accepts every token p allows (the draft's law: a positive control)."""

    name = "margin"

    Settings = options.Margin

    def __init__(self, **given):
        super().__init__(**given)
        self.margin, self.ratio = self.settings.margin, self.settings.ratio

    def passes(self, p: Tensor, px: Tensor) -> Tensor:
        top = p.max(-1).values  # [K]
        return (px >= rowwise(top * self.ratio if self.ratio is not None else top - self.margin, px)) & (px > 0)


class TopKVerifier(RelaxedVerifier):
    """Top-k acceptance: accept x if it is among the target's k most likely tokens (ties at the k-th
    probability pass too). Exact at temperature 0 (p one-hot) unless `rule_temperature` is set."""

    name = "topk"

    Settings = options.TopK

    def __init__(self, **given):
        super().__init__(**given)
        self.k = self.settings.k

    def passes(self, p: Tensor, px: Tensor) -> Tensor:
        kth = torch.topk(p, min(self.k, p.shape[-1]), dim=-1).values[:, -1]  # [K]
        return px >= rowwise(kth.clamp_min(1e-30), px)
