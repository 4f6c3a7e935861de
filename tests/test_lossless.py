"""Every lossless claim, proven for every drafter: each option of conf/drafter (read from the folder),
in each of its drafting modes (`Drafter.modes`), with each verifier of conf/verifier that claims
`lossless`, on tiny fp32 models:

- at T = 1, the law of what the method itself emits (the engine with sample_first=False, so no token
  comes from the plain prefill), from the rows of batched decodes (each row an independent sample): the first token, and the second given the first, against the
  target's exact conditionals. Each is a G-test of the randomized PIT in 10 equal bins against the
  uniform law (exact under H0 for any conditionals), sized so that a TV of 0.05 between the binned
  laws (at most the tokens' TV) is detected with power 0.8 at alpha = 1e-3;
- at T = 0, greedy identity with plain decoding, one prompt at a time, for every row of a batch of
  four prompts of different lengths whose rows stop at different steps, and for a batch of one prompt
  repeated (its rows share the prompt's cache).

Both run where drafts land (conftest.LANDING: a cyclic target whose top token at T = 1 is about 0.85, a
draft close to it, Medusa and EAGLE heads built to know its cycle, a prompt that is the target's own
cycle): each law test asserts that the method's draft path carried its samples (at least MIN_ALPHA of
the drafted tokens accepted; with `lookup`, fewer draft forwards than drafted tokens: the cascade
fired), so a setting that stops exercising the acceptance path fails instead of passing on the
residual path alone; the greedy identity also runs on the random target (TINY), where drafts are
mostly rejected.

A new drafter, mode or lossless verifier is covered without editing this file. The control at the
end shows the law test catches the defect it was written for.
"""

import math

import numpy as np
import pytest
import torch
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf
from scipy import stats as st

from specresearch.drafters.tree import TreeDrafter, TreeShape
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.build import build_engine
from specresearch.models import load_model
from specresearch.sampling import logits_to_probs
from specresearch.stats.battery import noncentrality
from specresearch.types import SamplingParams
from specresearch.verifiers import RejectionVerifier

from .conftest import CONF_DIR, LANDING_START, PLAIN, REPEATING, drafter_cfg, landing_next

T1 = SamplingParams(temperature=1.0)
ALPHA, POWER, TV, BINS = 1e-3, 0.8, 0.05, 10
# w² = Σ (o − e)² / e ≥ 4 TV² over the bins, so N·4·TV² reaches the noncentrality that gives POWER.
N = math.ceil(noncentrality(BINS - 1, ALPHA, POWER) / (4 * TV**2))


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _modes() -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for name in _options("drafter"):
        cls = get_class(OmegaConf.load(CONF_DIR / "drafter" / f"{name}.yaml")._target_)
        out += [(name, mode, overrides) for mode, overrides in cls.modes.items()]
    return out


def _lossless(temperature: float) -> list[str]:
    """The verifiers of conf/verifier that claim to be lossless and run at this temperature."""
    out = []
    for name in _options("verifier"):
        verifier = instantiate(OmegaConf.load(CONF_DIR / "verifier" / f"{name}.yaml"))
        try:
            verifier.check(SamplingParams(temperature=temperature))
        except SpecResearchError:
            continue
        if verifier.lossless:
            out.append(name)
    return out


def _cases(temperature: float):
    return [pytest.param(d, o, v, id=f"{d}[{m}]-{v}") for d, m, o in _modes() for v in _lossless(temperature)]


def _engine(drafter: str, overrides: tuple[str, ...], verifier: str, sampling: str, tmp_path, landing: bool = True) -> Engine:
    cfg = drafter_cfg(drafter, tmp_path, *(f"drafter.{o}" for o in overrides), f"verifier={verifier}", f"sampling={sampling}",
                      landing=landing)
    return build_engine(cfg)


def _cycling() -> list[int]:
    """The landing target's own cycle from LANDING_START, repeated to 12 tokens: text the n-gram drafters can continue."""
    following, cycle = landing_next(), [LANDING_START]
    while len(cycle) < 12:
        cycle.append(int(following[cycle[-1]]))
    return cycle


CYCLING = _cycling()
MIN_ALPHA = 0.3  # the least share of drafted tokens a law test's method must have accepted


def pit(p: torch.Tensor, x: torch.Tensor, u: np.ndarray) -> np.ndarray:
    """Randomized PIT of tokens x ([N]) under laws p ([N, V]), tokens ordered by descending p (ties by
    id): F(x−) + U·p(x), i.i.d. U(0, 1) exactly when each x is drawn from its p."""
    p = p.double()
    px = p.gather(-1, x[:, None])  # [N, 1]
    ids = torch.arange(p.shape[-1])
    before = (p * ((p > px) | ((p == px) & (ids < x[:, None])))).sum(-1)  # [N]
    return (before + torch.as_tensor(u) * px[:, 0]).numpy()


def uniformity_p(u: np.ndarray) -> float:
    """G-test of the PIT values in BINS equal bins against the uniform law."""
    counts = np.bincount(np.minimum((u * BINS).astype(int), BINS - 1), minlength=BINS)
    return float(st.power_divergence(counts, np.full(BINS, len(u) / BINS), lambda_="log-likelihood").pvalue)


BATCH = 128  # samples decoded together: the rows of one batch are independent draws (row i seeded seed + i)


@torch.inference_mode()
def law_pvalues(engine: Engine, prompt: list[int], n: int = N, seed: int = 0) -> tuple[float, float, dict]:
    """The method's first two tokens, n times (decoded BATCH at a time, so the law tested is that of a
    batched decode's rows): p-values of the first token's law and of the second given the first
    against the target's exact conditionals, and the draft counters."""
    depth = max(engine.drafter.k, engine.drafter.depth, 1)  # the first step drafts its full depth (k for chains)
    firsts, seconds, counts = [], [], {"drafted": 0, "accepted": 0, "draft_forwards": 0}
    for first in range(0, n, BATCH):
        rows = min(BATCH, n - first)
        outs = engine.generate([prompt] * rows, depth + 1, eos_token_ids=[], seed=seed + first, reuse_prefill=True,
                               sample_first=False, stop_after=2)
        for out in outs:
            firsts.append(out.tokens[0])
            seconds.append(out.tokens[1])
            for key in counts:
                counts[key] += getattr(out.stats, key)
    model, sampling = engine.target.lm.model, engine.sampling
    x1, x2 = torch.tensor(firsts), torch.tensor(seconds)
    p1 = logits_to_probs(model(input_ids=torch.tensor([prompt])).logits[0, -1], sampling)  # [V]
    seen = x1.unique()  # [S] the first tokens drawn; one forward each gives the second token's law
    p2 = logits_to_probs(model(input_ids=torch.cat([torch.tensor(prompt).expand(len(seen), -1), seen[:, None]], 1)).logits[:, -1], sampling)
    p2 = p2[torch.searchsorted(seen, x1)]  # [N, V] the law of each second token
    u = np.random.default_rng(seed).random((2, n))
    return uniformity_p(pit(p1.expand(n, -1), x1, u[0])), uniformity_p(pit(p2, x2, u[1])), counts


@pytest.mark.parametrize("drafter, overrides, verifier", _cases(1.0))
def test_sampled_output_follows_the_target(drafter, overrides, verifier, tmp_path):
    engine = _engine(drafter, overrides, verifier, "random", tmp_path)
    p_first, p_second, counts = law_pvalues(engine, CYCLING)
    assert p_first >= ALPHA and p_second >= ALPHA, (p_first, p_second, counts)
    if drafter != "none":  # the method's own draft path carried samples: the test can see its mistakes there
        assert counts["accepted"] >= MIN_ALPHA * counts["drafted"] > 0, counts
    if any(o.startswith("lookup=") for o in overrides):  # the cascade fired: guesses saved draft forwards
        assert counts["draft_forwards"] < counts["drafted"], counts


@pytest.mark.parametrize("drafter, overrides, verifier", _cases(0.0))
def test_greedy_output_equals_plain_decoding(drafter, overrides, verifier, tmp_path):
    try:
        engine = _engine(drafter, overrides, verifier, "greedy", tmp_path)
    except SpecResearchError as err:  # a mode that samples by design is refused at T = 0, never run
        assert "temperature" in str(err) and "children=sample" in overrides, err
        return
    plain = build_engine(drafter_cfg(drafter, tmp_path, "sampling=greedy", landing=True), baseline=True, target=engine.target.lm)
    outs = [engine.generate(prompt, 24, eos_token_ids=[]) for prompt in (CYCLING, PLAIN)]
    assert [out.tokens for out in outs] == [plain.generate(prompt, 24, eos_token_ids=[]).tokens for prompt in (CYCLING, PLAIN)]
    if drafter != "none":  # the drafts landed: the identity holds where they are accepted
        assert sum(out.stats.accepted for out in outs) >= MIN_ALPHA * sum(out.stats.drafted for out in outs) > 0
    # On the random target (TINY), where drafts are mostly rejected: the rejection path.
    random = _engine(drafter, overrides, verifier, "greedy", tmp_path, landing=False)
    alone = build_engine(drafter_cfg(drafter, tmp_path, "sampling=greedy"), baseline=True, target=random.target.lm)
    for prompt in (PLAIN, REPEATING):
        assert random.generate(prompt, 24, eos_token_ids=[]).tokens == alone.generate(prompt, 24, eos_token_ids=[]).tokens
    expected = plain.generate(REPEATING, 24, eos_token_ids=[]).tokens
    # One prompt repeated: the rows share it, held once (specresearch.attention); each row decodes it as alone.
    assert [out.tokens for out in engine.generate([REPEATING] * 3, 24, eos_token_ids=[])] == [expected] * 3
    # A batch of 4 prompts of different lengths whose rows stop at different steps (an EOS each reaches at its own time).
    prompts = [REPEATING, PLAIN, REPEATING[3:] + PLAIN, PLAIN[:2]]
    alone = [plain.generate(p, 24, eos_token_ids=[]).tokens for p in prompts]
    eos = [alone[1][5], alone[3][14]]
    expected = [plain.generate(p, 24, eos_token_ids=eos).tokens for p in prompts]
    assert len({len(tokens) for tokens in expected}) > 1, expected  # the rows finish at different steps
    assert [out.tokens for out in engine.generate(prompts, 24, eos_token_ids=eos)] == expected


def test_the_law_test_detects_a_biased_tree_budget(monkeypatch):
    """The control: the old dynamic-tree budget, which kept the likeliest sampled children (draft =
    target, topk 4, depth 2, nodes 4: the target's top token 0.63 of the time where p = 0.42 here)."""
    target = load_model("tiny", device="cpu", tiny={"vocab_size": 320, "seed": 0})
    monkeypatch.setattr(TreeShape, "_budget_sampled", TreeShape._budget_top)
    drafter = TreeDrafter(target, model=target, branching=None, topk=4, depth=2, nodes=4, children="sample")
    p_first, _, _ = law_pvalues(Engine(target, drafter, RejectionVerifier(), T1), REPEATING, n=N // 4)
    assert p_first < ALPHA


def landing_counts(rows: int = BATCH) -> None:
    """Print, for every drafter x mode at T = 1 with rejection sampling in the law test's own setting, the
    drafted and accepted tokens and the draft forwards of one batch of `rows` (`python -m tests.test_lossless`)."""
    import tempfile
    from pathlib import Path

    print(f"{'drafter [mode]':56} {'drafted':>8} {'accepted':>8} {'alpha':>6} {'draft forwards':>15}")
    for drafter, mode, overrides in _modes():
        with tempfile.TemporaryDirectory() as tmp:
            counts = law_pvalues(_engine(drafter, overrides, "rejection", "random", Path(tmp)), CYCLING, n=rows)[2]
        drafted, accepted = counts["drafted"], counts["accepted"]
        print(f"{f'{drafter} [{mode}]':56} {drafted:8d} {accepted:8d} {accepted / max(drafted, 1):6.2f} {counts['draft_forwards']:15d}")


if __name__ == "__main__":
    landing_counts()
