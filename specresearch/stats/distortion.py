"""Exact distortion on real text: how far the first token each verification step emits is from the
target's law, computed (not sampled) along teacher-forced continuations of real prompts.

At every position t of a continuation the method's own drafter proposes as it would there (its real
draft model, heads or lookup, its own state), the target verifies that draft in one forward (p at
every node), and `stats.exact.step_first_token_law` turns (draft, p) into the exact law of the token
the step emits first; the step then commits the continuation's token t, whatever the verifier would
have done, so the next position is the continuation's. Per position: the TV and KL(law ‖ p) to the
target's p there, and the probability that the token comes from the draft. A lossless pair gives 0 to
float precision; a lossy rule's numbers are its effect size, with no sampling noise: the battery
(`stats.battery`) tests whole sequences, this measures the one step exactly.

Beside it, the numerics: at every position the TV between the target's p as the step's verification forward
read it (k + 1 or a tree's query tokens) and as plain decoding reads it (one query token a forward after the
same text): what the target's own kernels alone move each step's law by, on the same axis as a rule's
distortion (0 in fp32 to ~1e-6, and exactly 0 with model.kernels=invariant).

And, where asked (`temperatures`), the TV of each step's law to the target's law at other temperatures T'
(p_T' ∝ p_T ** (T / T'), the same logits at another T): is a lossy rule the target at a lower temperature, and
which one (`Distortion.nearest`)?
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.seeding import stream_seed
from specresearch.stats.exact import kl_divergence, normalised, step_first_token_law, total_variation
from specresearch.stats.floor import one_query_laws
from specresearch.stats.samples import Stream
from specresearch.types import Draft, SamplingParams, Siblings, Verdict
from specresearch.verifiers.base import Verifier

QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class Distortion:
    """Per position of every continuation (prompt after prompt): the exact first-token TV and KL(law ‖ p)
    to the target's p, and the probability that the first token is the draft's."""

    tv: np.ndarray  # [P, L]
    kl: np.ndarray  # [P, L]
    kept: np.ndarray  # [P, L]
    numerics: np.ndarray | None = None  # [P, L] TV(p as the verification forward read it, p after one query a forward)
    tv_at: np.ndarray | None = None  # [P, L, S] TV to the target's law at temperatures[s] (`distortion(temperatures=...)`)
    temperatures: tuple[float, ...] = ()  # [S]

    def summary(self, resamples: int = 2000, seed: int = 0) -> dict[str, float]:
        """Mean, quantiles and maximum of the per-position TV, mean and 90% quantile of the KL, the mean
        probability of keeping the first draft token, the positions counted; and a 95% bootstrap interval
        of the mean TV over prompts (positions of one continuation are not independent)."""
        tv, kl = self.tv.ravel(), self.kl.ravel()
        out = {"tv_mean": float(tv.mean()), "tv_max": float(tv.max()), "kl_mean": float(kl.mean()),
               "kl_q90": float(np.quantile(kl, 0.9)), "kept_mean": float(self.kept.mean()),
               "positions": float(tv.size), "prompts": float(self.tv.shape[0])}
        out.update({f"tv_q{round(q * 100)}": float(np.quantile(tv, q)) for q in QUANTILES})
        out["tv_mean_ci_low"], out["tv_mean_ci_high"] = _over_prompts(self.tv.mean(1), resamples, seed)
        if self.numerics is not None:
            numerics = self.numerics.ravel()
            out.update(numerics_tv_mean=float(numerics.mean()), numerics_tv_q90=float(np.quantile(numerics, 0.9)),
                       numerics_tv_max=float(numerics.max()))
        if self.tv_at is not None:
            out.update(self.nearest(resamples, seed))
        return out

    def nearest(self, resamples: int = 2000, seed: int = 0) -> dict[str, float]:
        """Against the target's law at each T' of `temperatures`: the mean TV (`tv_mean_at_<T'>`), the T' whose law is
        nearest on average (`nearest_temperature`), the mean TV there with a 95% bootstrap interval over prompts
        (`nearest_tv_mean`, `_ci_low`, `_ci_high`), and the share of positions whose law is nearer (beyond float error)
        the target's at that T' than the p it was verified against (`nearest_closer`)."""
        means = self.tv_at.mean((0, 1))  # [S]
        best = int(np.argmin(means))
        out = {f"tv_mean_at_{t:g}": float(m) for t, m in zip(self.temperatures, means)}
        low, high = _over_prompts(self.tv_at[:, :, best].mean(1), resamples, seed)
        out.update(nearest_temperature=self.temperatures[best], nearest_tv_mean=float(means[best]),
                   nearest_tv_mean_ci_low=low, nearest_tv_mean_ci_high=high,
                   nearest_closer=float((self.tv_at[:, :, best] < self.tv - 1e-9).mean()))
        return out


def _over_prompts(per_prompt: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean of `per_prompt` ([P]: one value a prompt, as the positions of one
    continuation are not independent)."""
    rng = np.random.default_rng(seed)
    means = per_prompt[rng.integers(0, len(per_prompt), (resamples, len(per_prompt)))].mean(1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


class Recorder(Verifier):
    """A verifier that computes, at every step, the exact law of the first token `inner` would emit
    (`step_first_token_law`, from the step's draft and p) and records its distance to p; then emits the
    continuation's next token for each row (no draft token kept), so the decode follows the continuations."""

    def __init__(self, inner: Verifier, continuations: Sequence[Sequence[int]], siblings: Siblings | None = None,
                 powers: Sequence[float] = ()):
        self.inner, self.lossless, self.name = inner, inner.lossless, inner.name
        self.powers = list(powers)  # T / T' for each other temperature T' (p_T' ∝ p ** (T / T'))
        self.siblings = siblings  # the drafter's sibling rule (step_first_token_law), None = no siblings
        self.continuations = [list(c) for c in continuations]
        self.t = 0  # the step: every row emits one token per step, so it is the position in each continuation
        self.tv: list[list[float]] = [[] for _ in continuations]
        self.kl: list[list[float]] = [[] for _ in continuations]
        self.kept: list[list[float]] = [[] for _ in continuations]
        self.p: list[list[Tensor]] = [[] for _ in continuations]  # each step's p at its first position, as the verification read it
        self.tv_at: list[list[list[float]]] = [[] for _ in continuations]  # [P][L][S] TV to the target's law at each T'

    def check_sampling(self, sampling: SamplingParams) -> None:
        self.inner.check_sampling(sampling)

    def p_sampling(self, sampling: SamplingParams) -> SamplingParams:
        return self.inner.p_sampling(sampling)

    def argmax_path(self, sampling: SamplingParams) -> bool:
        return False  # a law at every step (distortion runs at T > 0 only)

    def acceptance(self, p: Tensor, q: Tensor, x: Tensor) -> Tensor:
        return self.inner.acceptance(p, q, x)

    def fallback(self, p: Tensor, q: Tensor | None) -> Tensor:
        return self.inner.fallback(p, q)

    def verify_rows(self, drafts: Sequence[Draft], p: Tensor, rngs) -> list[Verdict]:
        if len(drafts) != len(self.continuations):
            raise SpecResearchError("the distortion run lost a row (every row decodes its continuation's length)")
        verdicts = []
        for b, draft in enumerate(drafts):
            law, kept = step_first_token_law(self.inner, draft, p[b, : len(draft) + 1], self.siblings)  # [V] float64
            target = normalised(p[b, 0])  # [V] the target's law at this position
            self.tv[b].append(total_variation(law.to(target.device), target))
            self.kl[b].append(float(kl_divergence(law.to(target.device), target)))
            self.kept[b].append(kept)
            self.p[b].append(target.float().cpu())
            if self.powers:
                self.tv_at[b].append(tv_to_powers(law.to(target.device), target, self.powers))
            verdicts.append(Verdict(tokens=torch.tensor([self.continuations[b][self.t]]), num_accepted=0,
                                    path=None if draft.parents is None else []))
        self.t += 1
        return verdicts


def tv_to_powers(law: Tensor, p: Tensor, powers: Sequence[float]) -> list[float]:
    """TV(law, p ** a / Σ p ** a) for each power a in `powers` ([V] laws): the target's law at T' = T / a from its law p
    at T, where p is softmax(logits / T) (tokens p excludes stay excluded)."""
    logp = torch.log(p.double())  # [V], -inf where p is 0
    return [total_variation(law, torch.softmax(logp * a, -1)) for a in powers]


def check_distortion(method: Engine) -> None:
    """Refuse, before a run measures anything, a method whose exact distortion is not computed: a relaxed
    rule (its longest passing path) over trees whose nodes are draws at T > 0 (sampled children, or the
    siblings beside a sampled chain token): the first token's law then averages over the draws of every
    node along the path (`stats.exact.step_first_token_law`)."""
    drafter, verifier = method.drafter, method.verifier
    if method.sampling.greedy or getattr(verifier, "tree_path", None) is None:
        return
    if drafter.siblings.n:
        raise SpecResearchError(f"exact distortion of verifier={verifier.name} over a sampled chain with siblings is not computed (its "
                                "longest passing path reads every draw below the root): set drafter.siblings=0, or measure "
                                "verifier=rejection")
    if getattr(getattr(drafter, "settings", None), "children", "top") == "sample":
        raise SpecResearchError(f"exact distortion of verifier={verifier.name} over sampled children is not computed (its longest "
                                "passing path reads every node's draw): set drafter.children=top")


def continuations(baseline: Engine, prompts: list[list[int]], length: int, seed: int) -> list[list[int]]:
    """The target's own continuations of `length` tokens at the run's sampling (plain decoding, stream
    (seed, DISTORTION, i) for prompt i), EOS not stopping them (as the battery samples): the text the
    distortion is measured along. Without `sample_first`: the prompt's last token counts as the newest."""
    outs = baseline.generate(prompts, length, eos_token_ids=[], sample_first=False,
                             seed=[stream_seed(seed, Stream.DISTORTION, i) for i in range(len(prompts))])
    return [o.tokens for o in outs]


def distortion(method: Engine, prompts: list[list[int]], texts: list[list[int]], seed: int = 0,
               temperatures: Sequence[float] = ()) -> Distortion:
    """The method's exact first-token distortion along `texts` (one continuation per prompt, equal
    lengths): its drafter proposes at every position, the target verifies, `Recorder` records.

    Args:
        method: the engine (target, drafter, verifier, sampling) whose steps are measured; T > 0.
        prompts: token ids of each prompt (at least 2 tokens: the last one is fed with the first draft).
        texts: each prompt's continuation (e.g. `continuations`), all of one length.
        seed: the drafter's draws of row b come from stream (seed, FORCED, b) (they do not change the laws).
        temperatures: other temperatures T' (> 0) to measure each step's law against the target's at (`tv_at`); the
            run's sampling must not truncate (top-k, top-p), so that p_T' ∝ p_T ** (T / T') is the target's law at T'.

    Returns:
        The per-position TV, KL and kept probability (and the TV at each of `temperatures`).
    """
    if method.sampling.greedy:
        raise SpecResearchError("exact distortion is for sampling at temperature > 0: at temperature 0 every rule here keeps "
                                "the target's argmax path (the greedy identity checks it)")
    sampling = method.verifier.p_sampling(method.sampling)
    if sampling != method.sampling:
        raise SpecResearchError("exact distortion compares the first token's law with the p the verifier reads; "
                                "verifier.rule_temperature reads another one: set it to null")
    if temperatures and (min(temperatures) <= 0 or sampling.top_k or sampling.top_p < 1):
        raise SpecResearchError(f"distortion against the target at other temperatures needs T' > 0 (got {list(temperatures)}) "
                                "and sampling without top-k or top-p (the target's law at T' is then p ** (T / T'))")
    length = len(texts[0])
    if any(len(t) != length for t in texts) or length < 1:
        raise SpecResearchError(f"distortion needs continuations of one length >= 1, got {sorted({len(t) for t in texts})}")
    siblings = method.drafter.siblings
    recorder = Recorder(method.verifier, texts, siblings if siblings.n else None,
                        [sampling.temperature / t for t in temperatures])
    forced = Engine(method.kv.lm, method.drafter, recorder, method.sampling, time_split=False)
    forced.generate(prompts, length, eos_token_ids=[], sample_first=False,
                    seed=[stream_seed(seed, Stream.FORCED, b) for b in range(len(prompts))])
    numerics = []  # [P, L]
    for b, (prompt, text) in enumerate(zip(prompts, texts)):
        plain = one_query_laws(method.kv.lm, prompt, text, sampling).cpu()  # [L, V]
        numerics.append([total_variation(read, one) for read, one in zip(recorder.p[b], plain)])
    return Distortion(np.array(recorder.tv), np.array(recorder.kl), np.array(recorder.kept), np.array(numerics),
                      np.array(recorder.tv_at) if temperatures else None, tuple(temperatures))
