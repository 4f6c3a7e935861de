"""Every lossless claim, proven for every drafter: each option of conf/drafter (read from the folder),
in each of its drafting modes (`Drafter.modes`), with each verifier of conf/verifier that claims
`lossless`, on tiny fp32 models:

- at T = 1, the law of what the method itself emits (the engine with sample_first=False, so no token
  comes from the plain prefill), from 2,880 rows of ragged batched decodes (two prompts of different
  lengths alternating row by row; each row an independent stream): the first token, the second given
  the first, their joint over every cell expected 5 or more times, and the token rejection sampling
  recovers after the first step's draft was rejected against the residual computed from the target's
  own forwards (`law_pvalues` says what each sees and its power), each at alpha = 1e-3; in two
  settings: where drafts land (LANDING) and where a step's first draft is rejected about half the
  time (REJECTING), so the acceptance, residual and sibling paths each carry samples;
- the same at T = 0.7 with top-k 20 (MC_EXTRA), for each drafter option's first mode, in REJECTING
  with its models' logits scaled by 0.7 (tiny.at_temperature: its laws at T = 0.7 are those it was
  tuned for at T = 1, and both paths carry samples): the expected law is the target's after the same
  temperature and top-k (`logits_to_probs`), so a p or a q tempered or truncated otherwise fails;
- the exact law of the first emitted token at each of EXACT's settings (T = 1, top-k 4; T = 0.7,
  top-k 4; T = 1.5, top-k 4, top-p 0.9), by enumeration over the drafter's own draws (tests/draws.py:
  its sampling calls replayed along every outcome, its code unchanged), equal to the target's p to
  1e-9, p being the verify forward's logits after the sampling settings by reference code, and the p
  the verifier was handed that same law: no sampling noise, so a drafter that draws children without
  replacement or reports another q than it drew from (before a temperature, a top-k or a top-p the
  draw saw), or a verifier that reads a p processed otherwise, fails for sure;
- at T = 0, greedy identity with plain decoding, one prompt at a time, for every row of a batch of
  four prompts of different lengths whose rows stop at different steps, and for a batch of one prompt
  repeated (its rows share the prompt's cache).

LANDING: a cyclic target whose top token at T = 1 is about 0.85, a draft close to it, Medusa and EAGLE
heads built to know its cycle, prompts that are the target's own cycle; each law test there asserts
that the method's draft path carried its samples (at least MIN_ALPHA of the drafted tokens accepted;
with a chain's `lookup`, fewer draft forwards than drafted tokens: the cascade fired), so a setting that stops
exercising the acceptance path fails instead of passing on the residual path alone. REJECTING: a
target less sure of the same cycle and a draft surer than it; each test there asserts that at least
MIN_RECOVERED first steps kept no draft token. The greedy identity also runs on the random target
(TINY), where drafts are mostly rejected.

Law tests at T = 1 without top-k or top-p cannot see a temperature or a truncation applied to only
one of p and q (softmax(l / 1) is softmax(l), and nothing is cut): hence the settings beyond it.

A new drafter, mode or lossless verifier is covered without editing this file. The control at the
end shows the law test catches the defect it was written for; `python -m tests.mutants` applies 29
lossy mutants one at a time and shows that these tests kill each one (docs/concepts/lossless.md).
"""

import json
import math
import os
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from scipy import stats as st

from specresearch.build import build_engine
from specresearch.drafters.tree import TreeDrafter, TreeShape
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.sampling import logits_to_probs
from specresearch.stats.battery import noncentrality
from specresearch.stats.exact import draft_first_token_law, normalised, root_children, total_variation
from specresearch.types import Draft, SamplingParams, Verdict
from specresearch.verifiers import RejectionVerifier
from tests.cases import cases, lossless_verifiers, modes
from tests.draws import enumerated
from tests.tiny import CYCLING, LANDING, PLAIN, REJECTING, REPEATING, at_temperature, drafter_cfg

T1 = SamplingParams(temperature=1.0)
# Beyond T = 1 without truncation, where a temperature or a truncation applied to only one of p and q changes
# nothing: the exact law at each of these (top-k 4 keeps the enumeration small), the
# Monte Carlo law at T1 and at MC_EXTRA. Their names end the new tests' ids (T = 1 keeps its ids): no word of a
# mutant's `select` in them (tests/mutants.py), so `-k T0.7` picks a setting.
EXACT = {"T1-k4": SamplingParams(1.0, top_k=4), "T0.7-k4": SamplingParams(0.7, top_k=4),
         "T1.5-k4-p0.9": SamplingParams(1.5, top_k=4, top_p=0.9)}
MC_EXTRA = ("T0.7-k20", SamplingParams(0.7, top_k=20))
ALPHA, POWER, TV, BINS = 1e-3, 0.8, 0.05, 10
# w² = Σ (o − e)² / e ≥ 4 TV² over the bins, so N·4·TV² reaches the noncentrality that gives POWER.
N = math.ceil(noncentrality(BINS - 1, ALPHA, POWER) / (4 * TV**2))


def _law_cases(samplings: dict[str, SamplingParams], settings=("landing", "rejecting"), first_modes: bool = False):
    """(drafter, overrides, verifier, setting, sampling) for every drafter mode (with `first_modes` each drafter
    option's first mode only) x lossless verifier x setting x sampling; ids as cases' with the setting, then the
    sampling's name unless it is T1 (the T = 1 cases keep their ids)."""
    found = modes()
    if first_modes:
        found = [next(m for m in found if m[0] == name) for name in dict.fromkeys(d for d, _, _ in found)]
    return [pytest.param(d, o, v, s, sampling, id=f"{d}[{m}]-{v}-{s}" + ("" if name in ("T1", "T1-k4") else f"-{name}"))
            for name, sampling in samplings.items() for verifiers in [lossless_verifiers(sampling)] for d, m, o in found for v in verifiers
            for s in settings]


def _engine(drafter: str, overrides: tuple[str, ...], verifier: str, sampling: str | SamplingParams, tmp_path, *more: str,
            landing: bool | list[str] = True) -> Engine:
    """The method's engine on tiny models; `sampling` a conf/sampling option, or settings given as `sampling.*`
    overrides of `random` (checked to reach the engine as given)."""
    given = (f"sampling={sampling}",) if isinstance(sampling, str) else (
        "sampling=random", f"sampling.temperature={sampling.temperature}", f"sampling.top_k={sampling.top_k}",
        f"sampling.top_p={sampling.top_p}")
    cfg = drafter_cfg(drafter, tmp_path, *(f"drafter.{o}" for o in overrides), f"verifier={verifier}", *given, *more,
                      landing=landing)
    engine = build_engine(cfg)
    assert isinstance(sampling, str) or engine.sampling == sampling, (engine.sampling, sampling)
    return engine


MIN_ALPHA = 0.3  # landing: the least share of drafted tokens a law test's method must have accepted
MIN_RECOVERED = 50  # rejecting: the fewest first steps that kept no draft token (their token is a recovered one)


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


def counts_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """G-test of category counts against their exact expected counts (same total): categories expected
    below 5 are pooled into one, and that one into the smallest other if it is still below 5. For
    independent draws from different laws (the expected counts are sums of each draw's law) the
    statistic's null variance is at most the multinomial's, so the χ² p-value is conservative."""
    keep = expected >= 5
    obs, exp = list(observed[keep]), list(expected[keep])
    if (~keep).any():
        rest_o, rest_e = observed[~keep].sum(), expected[~keep].sum()
        if rest_e >= 5 or not exp:
            obs.append(rest_o)
            exp.append(rest_e)
        else:
            i = int(np.argmin(exp))
            obs[i], exp[i] = obs[i] + rest_o, exp[i] + rest_e
    if len(exp) < 2:
        return 1.0  # one category: nothing to test
    return float(st.power_divergence(np.asarray(obs, float), np.asarray(exp, float), lambda_="log-likelihood").pvalue)


BATCH = 128  # samples decoded together: the rows of one batch are independent draws (row b seeded with (seed, b))


PROMPTS = (CYCLING, CYCLING[2:11])  # two prompts of the target's cycle, of different lengths and last tokens (so laws)


@dataclass
class Decodes:
    """The first two tokens of n decodes of a method (ragged batches: row i decodes PROMPTS[i % 2]), with
    the exact target laws they should follow and what the method's first step drafted and kept."""

    prompt: torch.Tensor  # [N] the index of each row's prompt
    x1: torch.Tensor  # [N] the first new token
    x2: torch.Tensor  # [N] the second
    p1: list[torch.Tensor]  # per prompt, [V] the target's law of the first token (float64)
    p2: list[dict[int, torch.Tensor]]  # per prompt, first token -> [V] the law of the second
    drafts: list[Draft]  # each row's first draft
    verdicts: list[Verdict]  # and what the verifier made of it
    counts: dict[str, int]  # drafted, accepted, draft_forwards over all steps

    def first_laws(self) -> torch.Tensor:
        return torch.stack([self.p1[int(i)] for i in self.prompt])  # [N, V]

    def second_laws(self) -> torch.Tensor:
        return torch.stack([self.p2[int(i)][int(x)] for i, x in zip(self.prompt, self.x1)])  # [N, V]


@torch.inference_mode()
def decode_rows(engine: Engine, n: int = N, seed: int = 0, sampling: SamplingParams | None = None) -> Decodes:
    """n decodes of the method's first two tokens (BATCH rows a call, the prompts alternating row by row,
    every token from a draft-and-verify step: sample_first=False), recording each row's first draft and
    verdict from the engine's own verifier call; then the target's exact conditionals from plain
    forwards (every first token the rows drew, and every one expected at least 5 times) after `sampling`
    (temperature, top-k, top-p by `logits_to_probs`; None: the engine's)."""
    depth = max(engine.drafter.k, engine.drafter.depth, 1)  # the first step drafts its full depth (k for chains)
    verify, first = engine.verifier.verify_rows, []

    def recording(drafts, p, rngs):
        verdicts = verify(drafts, p, rngs)
        if not first:
            first.append((list(drafts), verdicts))
        return verdicts

    x1, x2, which, drafts, verdicts = [], [], [], [], []
    counts = {"drafted": 0, "accepted": 0, "draft_forwards": 0}
    engine.verifier.verify_rows = recording
    try:
        for start in range(0, n, BATCH):
            rows = list(range(start, min(n, start + BATCH)))
            first.clear()
            outs = engine.generate([PROMPTS[i % 2] for i in rows], depth + 1, eos_token_ids=[], seed=seed + start,
                                   sample_first=False, stop_after=2)
            assert len(first[0][0]) == len(rows), "the first verification holds every row"
            drafts += first[0][0]
            verdicts += first[0][1]
            for i, out in zip(rows, outs):
                x1.append(out.tokens[0])
                x2.append(out.tokens[1])
                which.append(i % 2)
                for key in counts:
                    counts[key] += getattr(out.stats, key)
    finally:
        del engine.verifier.verify_rows
    model, sampling = engine.kv.lm.model, sampling or engine.sampling
    prompt, x1t = torch.tensor(which), torch.tensor(x1)
    p1, p2 = [], []
    for i, ids in enumerate(PROMPTS):
        law = logits_to_probs(model(input_ids=torch.tensor([ids])).logits[0, -1], sampling).double()  # [V]
        rows = prompt == i
        firsts = sorted({*x1t[rows].tolist(), *(law * int(rows.sum()) >= 5).nonzero()[:, 0].tolist()})
        seconds = logits_to_probs(model(input_ids=torch.cat([torch.tensor(ids).expand(len(firsts), -1),
                                                             torch.tensor(firsts)[:, None]], 1)).logits[:, -1], sampling).double()
        p1.append(law)
        p2.append(dict(zip(firsts, seconds)))
    return Decodes(prompt, x1t, torch.tensor(x2), p1, p2, drafts, verdicts, counts)


def law_pvalues(d: Decodes, verifier: str, seed: int = 0) -> dict[str, float]:
    """The p-values of the law tests on n decodes (each exact under H0, so each is a valid test at any α):

    - `first`, `second`: the randomized PIT of the first token, and of the second given the first,
      under the target's exact conditionals, in BINS equal bins against the uniform law (G-test). A
      TV of 0.05 between the binned laws is detected with power 0.8 at α = 1e-3 at N = 2,880. Blind to
      errors in *which* unlikely token comes out: the top token fills most bins.
    - `joint`: the counts of (prompt, first token, second token) against their exact expected counts
      N_prompt · p(x1) · p(x2 | x1), every cell expected 5 or more times its own category (the rest
      pooled). Sees the non-top tokens: a cell's deficit of δ·N tokens gives the statistic ≈ (δN)²/E;
      with df cells, a TV of t spread over the cells gives noncentrality ≥ 4 N t² (Cauchy–Schwarz).
    - `recovered` (rejection sampling): the rows whose first step rejected every child of the root (a
      chain's first token, a tree's first level, siblings included): their token against the law
      rejection sampling must give it, norm(max(cur − q_x, 0)) applied child after child from the
      target's p (reference code, not the verifier's), expected counts summed over the rows. The
      residual's mass is off the top token, where `first` cannot see; a bug that emits from p, skips
      a sibling's update or reads another row's law moves whole categories.
    """
    n = len(d.x1)
    u = np.random.default_rng([seed, 0x1A7]).random((2, n))
    out = {"first": uniformity_p(pit(d.first_laws(), d.x1, u[0])), "second": uniformity_p(pit(d.second_laws(), d.x2, u[1]))}
    observed, expected = {}, {}
    for i, (p1, p2) in enumerate(zip(d.p1, d.p2)):
        rows = int((d.prompt == i).sum())
        for x, law in p2.items():
            for y in (rows * p1[x] * law >= 5).nonzero()[:, 0].tolist():
                expected[(i, x, y)] = float(rows * p1[x] * law[y])
    for key in zip(d.prompt.tolist(), d.x1.tolist(), d.x2.tolist()):
        observed[key] = observed.get(key, 0) + 1
    cells = list(expected)
    obs = np.array([observed.get(c, 0) for c in cells] + [n - sum(observed.get(c, 0) for c in cells)], float)
    exp = np.array([expected[c] for c in cells] + [n - sum(expected.values())], float)
    out["joint"] = counts_p(obs, exp)
    if verifier == "rejection":
        tokens, laws = [], []
        for b, (draft, verdict) in enumerate(zip(d.drafts, d.verdicts)):
            kids = root_children(draft)
            if kids and verdict.num_accepted == 0:
                tokens.append(int(d.x1[b]))
                laws.append(recovered_law(d.p1[int(d.prompt[b])], draft, kids))
        if laws:
            expected_r = torch.stack(laws).sum(0).numpy()
            out["recovered"] = counts_p(np.bincount(tokens, minlength=len(expected_r)).astype(float), expected_r)
    return out


def recovered_law(p: torch.Tensor, draft: Draft, kids: list[int]) -> torch.Tensor:
    """[V] the law of rejection sampling's token after every one of `kids` was rejected: the residual
    norm(max(cur − q, 0)) taken child after child (q: the law the child was drawn from, one-hot for a
    deterministic child), starting from the target's p."""
    cur = p.double()
    for c in kids:
        q = torch.zeros_like(cur).index_fill_(0, draft.tokens[c : c + 1].cpu(), 1.0) if draft.q is None else draft.q[c].double().cpu()
        r = (cur - q).clamp_min(0)
        cur = r / r.sum() if r.sum() > 0 else cur
    return cur


def rejection_shares(d: Decodes) -> tuple[int, float, int]:
    """The rows whose first step drafted and kept no draft token (their first token is a recovered one),
    their share of the rows that drafted, and the rows whose first step rejected the root's first child
    and tried a sibling after it (against the residual)."""
    drafted = [(root_children(draft), verdict) for draft, verdict in zip(d.drafts, d.verdicts) if len(draft)]
    rejected = sum(verdict.num_accepted == 0 for _, verdict in drafted)
    siblings = sum(len(kids) > 1 and (verdict.num_accepted == 0 or verdict.path[0] != kids[0]) for kids, verdict in drafted)
    return rejected, rejected / max(len(drafted), 1), siblings


def log_pvalues(test: str, pvalues: dict[str, float], exact_tv: float | None = None) -> None:
    """Append a law test's p-values (or an exact test's TV) to $SPECRESEARCH_LAW_LOG, one JSON line:
    `python -m tests.mutants` reads how strongly each mutant was killed."""
    path = os.environ.get("SPECRESEARCH_LAW_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, "p": pvalues, "tv": exact_tv}) + "\n")


SETTINGS = {"landing": LANDING, "rejecting": REJECTING}


@pytest.mark.e2e  # the Monte Carlo battery of every drafter mode: minutes; the exact laws and greedy identity stay in the core
@pytest.mark.parametrize("drafter, overrides, verifier, setting, sampling",
                         _law_cases({"T1": T1}) + _law_cases(dict([MC_EXTRA]), ("rejecting",), first_modes=True))
def test_sampled_output_follows_the_target(drafter, overrides, verifier, setting, sampling, tmp_path, request):
    """The method's first two tokens follow the target's law after the sampling settings (`law_pvalues`:
    PIT of each, their joint over every cell expected 5+ times, the recovered token's law after a
    rejection), on ragged batches. At T = 1, every mode in two settings: `landing` (drafts mostly
    accepted: the acceptance path carries the samples) and `rejecting` (a step's first draft rejected
    about half the time, siblings after it: the residual and sibling paths do). At MC_EXTRA (T = 0.7,
    top-k 20: p tempered and truncated, so a p or q processed otherwise shows), each drafter's first
    mode in `rejecting` at that temperature (tiny.at_temperature: its models' logits scaled by 0.7,
    so its laws after the temperature are those it was tuned for; unscaled, its target would sharpen to
    a top token of 0.93 and self_draft's first steps recover fewer than MIN_RECOVERED tokens), where
    both paths carry samples (0.3-0.9 of the drafted tokens accepted, 150+ recovered)."""
    engine = _engine(drafter, overrides, verifier, sampling, tmp_path, landing=at_temperature(SETTINGS[setting], sampling.temperature))
    d = decode_rows(engine, sampling=sampling)
    pvalues = law_pvalues(d, verifier)
    log_pvalues(request.node.name, pvalues)
    counts = d.counts
    assert min(pvalues.values()) >= ALPHA, (pvalues, counts)
    if drafter == "none":
        return
    if setting == "landing":  # the method's own draft path carried samples: the test can see its mistakes there
        assert counts["accepted"] >= MIN_ALPHA * counts["drafted"] > 0, counts
        if engine.drafter.k and getattr(engine.drafter, "lookup", 0):  # a chain's cascade fired: guesses saved
            assert counts["draft_forwards"] < counts["drafted"], counts  # draft forwards (a tree's lookup branch: test_medusa)
    else:  # the residual carried samples too (how often siblings faced it: `python -m tests.verifiers.test_lossless`)
        recovered, share, _ = rejection_shares(d)
        assert recovered >= MIN_RECOVERED, (recovered, share, counts)


@pytest.mark.parametrize("drafter, overrides, verifier, setting, sampling", _law_cases(EXACT))
def test_exact_law_through_the_drafters_own_draws(drafter, overrides, verifier, setting, sampling, tmp_path, request):
    """The exact law of the first token a method emits, at each of EXACT's sampling settings (top-k 4:
    every law has 4 tokens or fewer; T = 1; T = 0.7; T = 1.5 with top-p 0.9, which cuts p or q or both
    to 1-3 tokens), by enumeration over the drafter's own draws (tests/draws.py: its sampling calls
    replayed along every outcome, each weighed by its probability, the drafter's code unchanged), each
    draft's first-token law from the verifier's acceptance and fallback (`draft_first_token_law`):
    equal to the target's p to 1e-9, in both settings (Medusa's heads there: tiny.HEAD_NOISE).
    p: the root's logits from the engine's own verify forward after the sampling settings by reference
    code (`logits_to_probs`), one law for every path (the forward's laws move with the draft's width by
    fp32 rounding, ~1e-8); the p the verifier was handed on each path must be that law of its logits
    (so a p tempered or truncated otherwise than q fails here too). No sampling noise: a drafter that
    draws children without replacement, reports another law than it drew from, or a verifier off by
    any amount fails here for sure."""
    engine = _engine(drafter, overrides, verifier, sampling, tmp_path, landing=SETTINGS[setting])
    verify_rows, verify, seen, roots, reference = engine.verifier.verify_rows, engine.verify, [], [], []

    def recording(drafts, p, rngs):  # what the verifier is handed
        seen.append((drafts[0], p[0, 0]))
        return verify_rows(drafts, p, rngs)

    def reading(drafts, logits, rows):  # the target's logits it came from
        roots.append(logits_to_probs(logits[0, 0], sampling))  # [V] the root's law by reference code
        return verify(drafts, logits, rows)

    def run() -> tuple[torch.Tensor, float, bool]:
        seen.clear()  # a first step of depth 1 (2 new tokens at most): the draws that make the first level
        roots.clear()
        engine.generate(CYCLING, 2, eos_token_ids=[], seed=0, reuse_prefill=True, sample_first=False, stop_after=1)
        (draft, p), target = seen[0], roots[0]
        if not reference:
            reference.append(normalised(target))
        drawn = draft.q is not None and bool(((draft.q > 0).sum(-1) > 1).any())  # a draw with two outcomes or more
        return draft_first_token_law(engine.verifier, draft, reference[0]), total_variation(normalised(p), normalised(target)), drawn

    engine.verifier.verify_rows, engine.verify = recording, reading
    with torch.inference_mode():
        paths = enumerated(run)
    total = sum(w for w, _ in paths)
    law = sum(w * law for w, (law, _, _) in paths)
    sampled = any(s for _, (_, _, s) in paths)
    tv, tv_p = total_variation(law, reference[0]), max(tv_p for _, (_, tv_p, _) in paths)
    log_pvalues(request.node.name, {}, max(tv, tv_p))
    assert abs(total - 1) < 1e-12, total
    assert not sampled or len(paths) > 1, "a sampled draft, but no draw was enumerated: a draw outside tests/draws.py's primitives?"
    assert tv_p < 1e-9, f"the verifier read another p than the target's after {sampling}: TV {tv_p}"
    assert tv < 1e-9, (tv, len(paths))


@pytest.mark.parametrize("drafter, overrides, verifier", cases(SamplingParams()))
def test_greedy_output_equals_plain_decoding(drafter, overrides, verifier, tmp_path):
    try:
        engine = _engine(drafter, overrides, verifier, "greedy", tmp_path)
    except SpecResearchError as err:  # a mode that samples by design is refused at T = 0, never run
        assert "temperature" in str(err) and "children=sample" in overrides, err
        return
    plain = build_engine(drafter_cfg(drafter, tmp_path, "sampling=greedy", landing=True), baseline=True, target=engine.kv.lm)
    outs = [engine.generate(prompt, 24, eos_token_ids=[]) for prompt in (CYCLING, PLAIN)]
    assert [out.tokens for out in outs] == [plain.generate(prompt, 24, eos_token_ids=[]).tokens for prompt in (CYCLING, PLAIN)]
    if drafter != "none":  # the drafts landed: the identity holds where they are accepted
        assert sum(out.stats.accepted for out in outs) >= MIN_ALPHA * sum(out.stats.drafted for out in outs) > 0
    # On the random target (TINY), where drafts are mostly rejected: the rejection path.
    random = _engine(drafter, overrides, verifier, "greedy", tmp_path, landing=False)
    alone = build_engine(drafter_cfg(drafter, tmp_path, "sampling=greedy"), baseline=True, target=random.kv.lm)
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


def test_the_law_test_detects_a_biased_tree_budget(monkeypatch, target):
    """The control: the old dynamic-tree budget, which kept the likeliest sampled children (draft =
    target, topk 4, depth 2, nodes 4: the target's top token 0.63 of the time where p = 0.42 here)."""
    monkeypatch.setattr(TreeShape, "_budget_sampled", TreeShape._budget_top)
    drafter = TreeDrafter(target, model=target, branching=None, topk=4, depth=2, nodes=4, children="sample")
    d = decode_rows(Engine(target, drafter, RejectionVerifier(), T1), n=N // 4)
    assert law_pvalues(d, "rejection")["first"] < ALPHA


def landing_counts(rows: int = BATCH) -> None:
    """Print, for every drafter x mode at T = 1 with rejection sampling in the law test's two settings, the
    drafted and accepted tokens, the draft forwards, the share of first steps that kept no draft token and
    the first steps that rejected two or more siblings, of `rows` decodes (`python -m tests.verifiers.test_lossless`)."""
    import tempfile
    from pathlib import Path

    print(f"{'drafter [mode]':52} {'setting':9} {'drafted':>8} {'alpha':>6} {'forwards':>8} {'rejected':>8} {'siblings':>8}")
    for drafter, mode, overrides in modes():
        for setting, tiny in SETTINGS.items():
            with tempfile.TemporaryDirectory() as tmp:
                d = decode_rows(_engine(drafter, overrides, "rejection", "random", Path(tmp), landing=tiny), n=rows)
            c, (_, share, siblings) = d.counts, rejection_shares(d)
            print(f"{f'{drafter} [{mode}]':52} {setting:9} {c['drafted']:8d} {c['accepted'] / max(c['drafted'], 1):6.2f} "
                  f"{c['draft_forwards']:8d} {share:8.2f} {siblings:8d}")


if __name__ == "__main__":
    landing_counts()
