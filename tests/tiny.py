"""The tiny random-weight models the core tests decode with, and the settings built on them: TINY (a random
target and a noisy copy as its draft), LANDING (a cyclic target whose drafts land), REJECTING (the same cycle,
drafts rejected about half the time), the prompts, and configs and heads for each drafter on them."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from specresearch.config import CONF_DIR
from specresearch.models import PackedLinear, SkinnyLinear, load_model, packed_linear_available

from .helpers import make_cfg

# Tiny models for both target and draft, so composing the default config needs no real model.
TINY = ["model=tiny", "drafter.model.name=tiny", "+drafter.model.tiny={vocab_size: 320, seed: 0, noise: 0.03}"]
# Where drafts land: a cyclic target (its text cycles; at T = 1 its top token ≈ 0.85) and a draft close to it.
# Seed 4 has the cycle 34 -> 110 -> 119 -> 48 -> 134: bytes with text, none of the pairs' letters a..h, all among
# the 200 most frequent tokens of MT-bench (the cheap drafts' shortlist): LANDING_START's text every draft can write.
LANDING = ["model=tiny", "model.tiny.seed=4", "model.tiny.cycle=5", "model.tiny.logit_scale=3e-4", "drafter.model.name=tiny",
           "+drafter.model.tiny={vocab_size: 320, seed: 4, noise: 0.005, cycle: 5, logit_scale: 2.2e-4}"]
LANDING_START = 34
# Where drafts are often rejected: the same cycle, a target less sure of it (top token 0.2-0.6 at T = 1) and a draft
# much surer (noisier too), so a draft model's first draft of a step is rejected about half the time (40-55%) and siblings
# after it: the residual and sibling paths carry a large share of the samples (`python -m tests.verifiers.test_lossless` prints it).
# The law tests' Medusa heads (drafter_cfg with a setting given as a list) predict the target's own law a step ahead, perturbed
# by this much of their spread (cycle_heads' `noise`). Heads built from the target's rows shifted along the cycle share only
# the top token with the target's law among the tokens either gives real mass: after a rejected first child no second one is
# ever accepted, so children drawn without replacement, a lossy bug, stayed exact there.
HEAD_NOISE = 0.02
REJECTING = ["model=tiny", "model.tiny.seed=4", "model.tiny.cycle=5", "model.tiny.logit_scale=1.9e-4", "drafter.model.name=tiny",
             "+drafter.model.tiny={vocab_size: 320, seed: 4, noise: 0.01, cycle: 5, logit_scale: 3e-4}"]


def at_temperature(setting: list[str], temperature: float) -> list[str]:
    """A cyclic setting (LANDING, REJECTING) for decoding at `temperature`: each cyclic model's logit_scale times
    it, so that its laws at that temperature are (about: the draft's weight noise is not scaled) the ones at T = 1
    the setting was tuned for, and its drafts land or are rejected as often (a sharper target at T = 0.7 would
    reject fewer drafts)."""
    return [re.sub(r"(logit_scale[=:] ?)([0-9.eE+-]+)", lambda m: f"{m[1]}{float(m[2]) * temperature:.6g}", o) for o in setting]


def tiny_model(seed: int = 0, vocab_size: int = 320, **options):
    """The tiny random fp32 model as runs load it (its linear layers on weights oneDNN laid out once,
    PackedLinear, where torch has oneDNN); `options` are tiny_model's others: noise and noise_seed for a perturbed copy,
    num_layers, ..."""
    lm = load_model("tiny", device="cpu", tiny={"vocab_size": vocab_size, "seed": seed, **options})
    assert isinstance(lm.model.lm_head, PackedLinear if packed_linear_available() else SkinnyLinear)
    return lm


REPEATING = [10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11]  # prompts for the n-gram drafters
PLAIN = [200, 7, 91, 33]


def plain_chain(target, cls=None, **given):
    """An independent drafter (or its subclass `cls`) as Leviathan's chain of k: its default stops, lookup and
    siblings off unless `given` sets them (the tests of one mechanism at a time)."""
    from specresearch.drafters.independent import IndependentDrafter
    from specresearch.options.drafters import PLAIN_CHAIN
    return (cls or IndependentDrafter)(target, **{**PLAIN_CHAIN, **given})


def cyclic_tiny(seed: int, cycle: int = 5, head: float = 1.0):
    """A tiny model whose greedy text repeats (models.tiny_model's `cycle`): after a few tokens prompt
    lookup finds what comes next (a random tiny model never repeats itself). `head` scales the logits:
    at 3e-4 the argmax still cycles and the laws at T = 1 are random (top ≈ 0.85)."""
    return tiny_model(seed, cycle=cycle, logit_scale=head)


def rejected_cyclic_draft(seed: int = 0):
    """cyclic_tiny(seed, head=3e-4) with its lm head perturbed (1.5 of its spread): a draft of the cyclic
    target's text that the target rejects at times, at T = 0 too."""
    draft = cyclic_tiny(seed, head=3e-4)
    with torch.no_grad():
        w = draft.model.lm_head.weight
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(1)) * w.std() * 1.5)
    return draft


def lookup_runs(target, drafter_with, sampling) -> dict[int, tuple[list[list[int]], int]]:
    """For lookup 0 and 4 (`drafter_with(lookup)` builds the drafter): the tokens of three prompts decoded
    with rejection sampling (40 each, seed i for prompt i) and the draft forwards they took; asserts that
    some drafts were accepted and some rejected in each."""
    from specresearch.engine import Engine
    from specresearch.verifiers import RejectionVerifier

    runs = {}
    for lookup in (0, 4):
        drafter = drafter_with(lookup)
        engine = Engine(target, drafter, RejectionVerifier(), sampling)
        outs = [engine.generate(p, 40, eos_token_ids=[], seed=i) for i, p in enumerate([REPEATING, PLAIN, REPEATING[3:]])]
        runs[lookup] = ([out.tokens for out in outs], drafter.draft_forwards)
        assert 0 < sum(out.stats.accepted for out in outs) < sum(out.stats.drafted for out in outs)
    return runs


def lengths_on_curves(drafter, prompts: list[list[int]], sampling, k: int) -> dict[str, list[int]]:
    """A chain drafter with shape=auto (drafter.sizing), drafting at no cost on three cost curves: its draft's
    length for each prompt (seed i for prompt i) on a flat curve, one with a cliff after 5 verified tokens and
    one where each token verified costs 100 forwards; asserts that each curve predicts a speedup."""
    import math

    from specresearch.drafters import Context
    from specresearch.drafters.tree import Sizer

    curves = {"flat": lambda m: 1.0, "cliff": lambda m: 1.0 if m <= 5 else 100.0, "steep": lambda m: 1.0 + 100 * (m - 1)}
    seen = {}
    for name, v in curves.items():
        drafter.sizing.sizer = Sizer(v, math.inf)  # drafting at no cost
        seen[name] = []
        for seed, prompt in enumerate(prompts):
            ctx = Context(torch.tensor(prompt), sampling, torch.Generator().manual_seed(seed), max_draft=k)
            with torch.inference_mode():
                drafter.prefill(ctx)
                seen[name].append(len(drafter.propose(ctx)))
        assert drafter.predicted_speedup is not None and drafter.predicted_speedup > 0
    return seen


def equivalence_report(engine, prompt: list[int], n: int = 300, length: int = 5, seed: int = 50, alpha: float = 1e-3):
    """The battery on `n` samples of `length` tokens from a sampling engine against as many from its
    target alone (tiny models; fixed seeds)."""
    from specresearch.stats import battery, sample_engine, sample_target, teacher_force

    target, sampling = engine.kv.lm, engine.sampling
    meth = sample_engine(engine, prompt, n, length, seed=seed)
    base = sample_target(target, prompt, n, length, sampling, seed=seed + 1)
    return battery(base, teacher_force(target, prompt, base.tokens, sampling, seed=1),
                   meth, teacher_force(target, prompt, meth.tokens, sampling, seed=2), alpha=alpha, permutations=0)


def drafter_cfg(name: str, tmp_path: Path, *overrides: str, landing: bool | list[str] = False):
    """The composed config of `drafter=NAME` on tiny models (target and any draft model: TINY, or with
    `landing` LANDING, or the cyclic setting given, e.g. REJECTING; cross_vocab's draft with another
    tokenizer), with heads saved under `tmp_path` for the drafters that load trained weights (medusa,
    eagle): untrained, or with `landing` built to know the cyclic target's cycle (`cycle_heads`)."""
    from omegaconf import OmegaConf

    from specresearch.config import register_options
    from specresearch.options.conf import render
    from specresearch.options.groups import OPTIONS

    path = CONF_DIR / "drafter" / f"{name}.yaml"  # an option defined in code (a test module's) has none
    node = OmegaConf.load(path) if path.is_file() else OmegaConf.create(render(OPTIONS["drafter"][name]))
    register_options()
    tiny = LANDING if landing is True else list(landing) if landing else TINY
    base = tiny if "model" in node else tiny[:-2]
    if name == "cross_vocab":  # a draft in another vocabulary: bytes and byte pairs (models.PairTokenizer)
        base = [*tiny[:-1], tiny[-1].replace("}", ", tokenizer: pairs}")]
    if "checkpoint" in node:  # a trained drafter: weights of the right shape for the tiny target
        target = load_model("tiny", device="cpu", tiny=dict(make_cfg(*tiny[:-2]).model.tiny))
        path = tmp_path / ("heads.safetensors" if name == "medusa" else "head.safetensors")
        if name not in ("medusa", "eagle"):
            raise NotImplementedError(f"drafter_cfg: no weights for drafter={name}; add them here")
        head = cycle_heads(name, target, noise=0.0 if landing is True else HEAD_NOISE) if landing else None
        if head is None and name == "medusa":
            from specresearch.drafters.medusa import MedusaHeads

            head = MedusaHeads(target.model.config.hidden_size, 3)
        elif head is None:
            from specresearch.drafters.eagle import EagleHead

            head = EagleHead(target.model.config)
        head.save(path, {"target": "tiny"})
        base = [*base, f"drafter.checkpoint={path}"]
    return make_cfg(*base, f"drafter={name}", *overrides)


def landing_next() -> torch.Tensor:
    """[V] the next token of each token's cycle in LANDING's target (models.cycle_next of its settings)."""
    from specresearch.models import cycle_next

    tiny = make_cfg(*LANDING[:-2]).model.tiny
    return cycle_next(tiny.vocab_size, tiny.seed, tiny.cycle)


def cycle_heads(name: str, target, noise: float = 0.0):
    """Medusa heads or an EAGLE head that know a cyclic tiny target's cycle (models.tiny_model's `cycle`),
    built, not trained: the target's last hidden state at token t points along t's (scaled) embedding
    and its lm head row j is the embedding of the token before j, times `logit_scale`.

    - medusa: three heads with their own lm heads, head i that row for the token i + 1 cycle steps
      before j (it predicts the token at t + 2 + i), its residual block the identity (zero weights).
      With `noise`: head i's lm head is the target's after a least-squares map of the target's
      hidden state at t to the one at t + i + 1 along the cycle, perturbed by `noise` of its spread:
      a law close to the target's own there, tail included, but not equal;
    - eagle: fc passes the token's normed embedding and drops the feature, the decoder layer adds
      nothing (zero output projections): the predicted feature is the drafted token's normed
      embedding, which the target's lm head maps to the token after it.
    """
    tiny = target.model.config
    weight = target.model.lm_head.weight.detach()  # [V, H]
    prev = torch.argsort(landing_next())  # [V] the token before each one
    with torch.no_grad():
        if name == "medusa":
            from specresearch.drafters.medusa import MedusaHeads

            heads = MedusaHeads(tiny.hidden_size, 3, own_lm_head=True, vocab=tiny.vocab_size)
            back = prev.clone()
            if noise:  # the target's final hidden states along its cycle from LANDING_START
                cycle = [LANDING_START]
                while len(cycle) < 24:
                    cycle.append(int(landing_next()[cycle[-1]]))
                h = target.model.model(input_ids=torch.tensor([cycle])).last_hidden_state[0].float()  # [T, H]
            for i, own in enumerate(heads.lm_heads):
                if noise:  # the target's lm head after a least-squares map of h_t to h_(t+i+1) on the cycle, perturbed
                    ahead = torch.linalg.lstsq(h[: -(i + 1)], h[i + 1 :]).solution  # [H, H]
                    own.weight.copy_(weight @ ahead.T)
                    own.weight.add_(torch.randn(own.weight.shape, generator=torch.Generator().manual_seed(i)) * own.weight.std() * noise)
                else:  # head i: row j = lm head row of prev^(i+1)(j) = embedding of prev^(i+2)(j)
                    own.weight.copy_(weight[back])
                back = prev[back]
            return heads
        from specresearch.drafters.eagle import EagleHead

        head = EagleHead(tiny)
        hidden = tiny.hidden_size
        head.fc.weight.zero_()
        head.fc.bias.zero_()
        head.fc.weight[:, :hidden] = torch.eye(hidden)
        for path, module in head.layer.named_modules():
            if path.endswith(("o_proj", "down_proj")):
                module.weight.zero_()
        return head


def _cycling() -> list[int]:
    """The landing target's own cycle from LANDING_START, repeated to 12 tokens: text the n-gram drafters can continue."""
    following, cycle = landing_next(), [LANDING_START]
    while len(cycle) < 12:
        cycle.append(int(following[cycle[-1]]))
    return cycle


CYCLING = _cycling()
