"""The equivalence battery (specresearch.stats) on tiny fp32 models: the samplers and the teacher-
forced conditionals are right, lossless pairs pass, aggressive lossy rules are detected, the A/A
type-I error stays at the nominal level, and the power report matches its formula."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from scipy import stats as st

from specresearch.drafters import NoDrafter, PromptLookupDrafter
from specresearch.engine import Engine
from specresearch.measure import auto_samples
from specresearch.stats import Samples, Stream, battery, calibration, holm, sample_engine, sample_seeds, sample_target, teacher_force
from specresearch.stats.battery import MIN_EXPECTED, _tv_position, family_size, noncentrality, pooled_table, position_df, samples_for_tv
from specresearch.types import SamplingParams
from specresearch.verifiers import RejectionVerifier, TopKVerifier, TypicalVerifier
from tests.tiny import PLAIN, REPEATING, plain_chain

T1 = SamplingParams(temperature=1.0)
PROMPT = [1, 2, 3, 4]
N, L = 300, 5
ALPHA = 1e-3  # CI: fixed seeds, small alpha


@pytest.fixture(scope="module")
def target_side(target):
    """The battery's target side: N samples of L tokens from the target alone, and their teacher-forced scores."""
    base = sample_target(target, PROMPT, N, L, T1, seed=1)
    return base, teacher_force(target, PROMPT, base.tokens, T1, seed=2)


def method_samples(target, engine, seed=100):
    meth = sample_engine(engine, PROMPT, N, L, seed=seed)
    return meth, teacher_force(target, PROMPT, meth.tokens, T1, seed=seed + 1)


def test_holm_adjusts_as_the_step_down_procedure():
    # sorted 0.005, 0.01, 0.03, 0.04 → 4·0.005, 3·0.01, max(.., 2·0.03), max(.., 1·0.04)
    np.testing.assert_allclose(holm(np.array([0.01, 0.04, 0.03, 0.005])), [0.03, 0.06, 0.06, 0.02])


def test_pooled_table_keeps_counts_and_expected_counts():
    rng = np.random.default_rng(0)
    a, b = rng.zipf(1.5, (200, 1)), rng.zipf(1.5, (150, 1))
    table = pooled_table(a, b)
    assert table[0].sum() == 200 and table[1].sum() == 150
    expected = table.sum(0) * table.sum(1)[:, None] / table.sum()
    assert expected.min() >= MIN_EXPECTED


def test_contingency_tests_are_pearson_chi2_on_the_pooled_table():
    """The battery's position and joint tests are Pearson's X² (Σ (o − e)² / e over the pooled [2, C]
    table, df C − 1), not the G statistic, whose far tail ran 1.5–2× nominal on such tables."""
    from specresearch.stats.battery import _contingency

    rng = np.random.default_rng(3)
    a, b = rng.zipf(1.6, (300, 1)), rng.zipf(1.6, (300, 1))
    table = pooled_table(a, b).astype(float)  # [2, C]
    expected = table.sum(0) * table.sum(1)[:, None] / table.sum()
    x2 = ((table - expected) ** 2 / expected).sum()
    result = _contingency(a, b, "position_1")
    assert result.df == table.shape[1] - 1 >= 2
    assert result.statistic == pytest.approx(x2) and result.pvalue == pytest.approx(st.chi2.sf(x2, result.df))
    g = 2 * (table * np.log(table / expected)).sum()
    assert abs(result.statistic - g) > 1e-6  # the two statistics do differ on this table
    assert _contingency(np.ones((5, 1)), np.ones((7, 1)), "x").pvalue == 1.0  # one category: nothing to test


@torch.inference_mode()
def test_teacher_forcing_matches_a_fresh_full_forward(target, target_side):
    """The conditionals come from a cached, batched pass; a plain forward of prompt + sequence agrees."""
    base, cond = target_side
    for i in (0, 7):
        ids = torch.tensor(PROMPT + base.tokens[i].tolist())[None]
        logits = target.model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1]  # [L, V]
        logp = torch.log_softmax(logits.double(), -1)
        expected = logp.gather(-1, torch.as_tensor(base.tokens[i])[:, None])[:, 0].numpy()
        np.testing.assert_allclose(cond.logp[i], expected, atol=1e-4)
        np.testing.assert_allclose(cond.entropy[i], -(logp.exp() * logp).sum(-1).numpy(), atol=1e-4)
    assert cond.pit.min() >= 0 and cond.pit.max() <= 1 and (cond.rank >= 1).all()


@torch.inference_mode()
def test_batched_sampler_first_token_follows_p(target):
    """The baseline sampler's first token against the exact p_1 (G-test, 3000 draws)."""
    s = sample_target(target, PROMPT, 3000, 1, T1, seed=3, batch=1000)
    p1 = torch.softmax(target.model(input_ids=torch.tensor([PROMPT])).logits[0, -1].double(), -1).numpy()
    table = pooled_table(s.tokens, np.random.default_rng(0).choice(len(p1), (100_000, 1), p=p1))
    assert st.chi2_contingency(table, lambda_="log-likelihood").pvalue > ALPHA


@torch.inference_mode()
def test_pit_is_uniform_when_sampler_and_scorer_share_a_seed(target):
    """The PIT's uniforms do not replay the sampler's: drawn one row at a time with seed s and scored
    with seed s, sample() inverts the CDF with uniforms from the very stream teacher_force would use
    unsalted (the PIT KS then rejected at p = 7e-6 on the tiny model)."""
    s = sample_target(target, PROMPT, N, L, T1, seed=7, batch=1)
    cond = teacher_force(target, PROMPT, s.tokens, T1, seed=7)
    assert st.kstest(cond.pit.ravel(), "uniform").pvalue > ALPHA


def test_engine_reused_prefill_gives_the_same_outputs(target, far_draft):
    engine = Engine(target, plain_chain(target, k=3, model=far_draft), RejectionVerifier(), T1)
    fresh = [engine.generate(PROMPT, 12, seed=s).tokens for s in range(3)]
    reused = [engine.generate(PROMPT, 12, seed=s, reuse_prefill=True).tokens for s in range(3)]
    assert fresh == reused


def test_batched_method_samples_equal_the_one_by_one_draws(target, far_draft):
    """sample_engine draws `batch` rows per generate call; sample j is seeded sample_seeds(seed, n)[j]
    (stream (seed, Stream.METHOD, prompt, j)) whatever the batch, so the samples equal one generate call
    per sample (T = 1, fp32), in order."""
    from specresearch.seeding import stream_seed

    engine = Engine(target, plain_chain(target, k=3, model=far_draft), RejectionVerifier(), T1)
    seeds = sample_seeds(50, 7)
    assert seeds == [stream_seed(50, Stream.METHOD, 0, j) for j in range(7)]
    one_by_one = [engine.generate(PROMPT, L, eos_token_ids=[], seed=s, sample_first=False).tokens for s in seeds]
    seen = []
    for batch in (1, 3, 32):
        s = sample_engine(engine, PROMPT, 7, L, seed=50, batch=batch, progress=seen.append)
        assert s.tokens.tolist() == one_by_one and s.tokens.shape == (7, L)
    assert seen == [1] * 7 + [3, 3, 1] + [7]
    assert len({tuple(row) for row in one_by_one}) > 1  # the seeds differ, so do the samples


def test_battery_runs_with_consecutive_seeds_share_no_sample(target, far_draft):
    """The battery's draws (specresearch.measure.equivalence's own functions) with seeds s and s + 1 share no stream:
    no method sample's seed is in both runs (with `seed + 2_000_000 + i n + j` they shared n - 1 of
    n), and the sequences drawn differ row for row, on the method's side and the baseline's."""
    from specresearch.measure import baseline_samples, method_samples

    prompts, n, length = [PROMPT, REPEATING], 40, 8
    seeds = {s: [x for i in range(len(prompts)) for x in sample_seeds(s, n, i)] for s in (7, 8)}
    assert len(set(seeds[7])) == len(set(seeds[8])) == len(prompts) * n and not set(seeds[7]) & set(seeds[8])
    engine = Engine(target, plain_chain(target, k=3, model=far_draft), RejectionVerifier(), T1)
    for draw in (lambda s: method_samples(engine, prompts, n, length, s, 16),
                 lambda s: baseline_samples(target, prompts, n, length, T1, s, 16)):
        a, b = (Samples.concat(draw(s)).tokens for s in (7, 8))
        assert a.shape == b.shape == (len(prompts) * n, length)
        assert (a == b).all(1).mean() < 0.05  # identical rows: chance alone (8 tokens at T = 1)
        assert len({tuple(row) for row in a} & {tuple(row) for row in b}) < 0.05 * len(a)  # nor shifted by a row or a prompt


def test_a_sweep_of_methods_samples_the_baseline_once(target, far_draft, tmp_path):
    """stats.reuse_baseline: the battery's baseline side (samples, their scores, N) is kept where `baseline_cache`
    says; another method at the same settings reads it back, and its battery is the one it gets by drawing the
    baseline again; another seed, length, N, temperature or prompt is another key."""
    from specresearch.measure import Results, baseline_cache, equivalence

    sc = OmegaConf.create({"samples": 60, "length": 4, "prompts": 1, "alpha": 0.01, "power": 0.8, "tv": 0.05, "batch": 16,
                           "aa_repeats": 0, "floor": 16})
    cfg = OmegaConf.create({"model": {"name": "tiny", "cache_dir": str(tmp_path)}, "stats": sc, "seed": 3})
    cache = baseline_cache(cfg, target, [PROMPT], T1)
    runs = {}
    for name, verifier, path in [("first", RejectionVerifier(), cache), ("again", TypicalVerifier(), cache),
                                 ("redrawn", TypicalVerifier(), None)]:
        runs[name] = Results()
        equivalence(sc, 3, target, Engine(target, plain_chain(target, k=3, model=far_draft), verifier, T1), [PROMPT], T1,
                    runs[name], path)
    assert cache.is_file() and [runs[n].rates["baseline_reused"] for n in runs] == [0.0, 1.0, 0.0]
    assert runs["again"].equivalence.summary() == runs["redrawn"].equivalence.summary()
    assert runs["again"].rates["samples_per_s_baseline"] == runs["first"].rates["samples_per_s_baseline"]  # the draw's own time
    others = [baseline_cache(cfg, target, [PLAIN], T1), baseline_cache(cfg, target, [PROMPT], SamplingParams(temperature=0.7)),
              *(baseline_cache(OmegaConf.merge(cfg, change), target, [PROMPT], T1) for change in (
                  {"seed": 4}, {"stats": {"length": 5}}, {"stats": {"samples": 61}}, {"stats": {"samples": "auto"}},
                  {"stats": {"batch": 8}}, {"model": {"name": "tiny2"}}))]
    assert len({cache, *others}) == 1 + len(others)


@pytest.mark.parametrize("drafter", ["independent", "none"])
def test_lossless_pairs_pass(target, far_draft, target_side, drafter):
    """Rejection sampling with a draft model (and plain decoding through the same harness, the
    negative control) is not distinguishable from the target by any test of the battery."""
    d = plain_chain(target, k=3, model=far_draft) if drafter == "independent" else NoDrafter()
    meth, cond = method_samples(target, Engine(target, d, RejectionVerifier(), T1))
    report = battery(*target_side, meth, cond, alpha=ALPHA, permutations=50)
    assert not report.reject, report.format()
    assert report.controls_pass
    assert report.effects["tv_position"] < report.effects["tv_position_null"] + 0.05, report.format()  # within noise of the floor


@pytest.mark.parametrize("verifier", [TypicalVerifier(), TopKVerifier(k=320)], ids=["typical", "always accept"])
def test_aggressive_lossy_rules_are_detected(target, far_draft, target_side, verifier):
    """Medusa's typical acceptance and the positive control (accept everything: the draft's law)."""
    meth, cond = method_samples(target, Engine(target, plain_chain(target, k=3, model=far_draft), verifier, T1))
    report = battery(*target_side, meth, cond, alpha=ALPHA, permutations=50)
    assert report.reject, report.format()
    assert any(name.startswith("position_") for name in report.rejected)
    assert report.effects["tv_position"] > report.effects["tv_position_null_q95"]


def test_the_first_position_tests_what_the_method_emits(target):
    """The method's first token comes from a draft-and-verify step, not from the plain prefill: with
    prompt lookup and the positive control (accept every draft token) the first token is always the
    lookup's, and the first position alone tells the method from the target."""
    engine = Engine(target, PromptLookupDrafter(k=2), TopKVerifier(k=320), T1)
    meth = sample_engine(engine, REPEATING, 100, 3, seed=300)
    assert set(meth.tokens[:, 0].tolist()) == {12}  # ... 10 11 | 12: what followed "10 11" before
    first = sample_target(target, REPEATING, 100, 3, T1, seed=301)
    report = battery(first, teacher_force(target, REPEATING, first.tokens, T1, seed=1),
                     meth, teacher_force(target, REPEATING, meth.tokens, T1, seed=2), alpha=ALPHA, permutations=0)
    assert "position_1" in report.rejected, report.format()


def test_a_tempered_sampler_is_detected_by_the_one_sample_tests(target, target_side):
    """Samples at T = 0.8 scored against the T = 1 conditionals: the surprisal test sees the deficit."""
    colder = sample_target(target, PROMPT, N, L, SamplingParams(temperature=0.8), seed=4)
    cond = teacher_force(target, PROMPT, colder.tokens, T1, seed=5)
    report = battery(*target_side, colder, cond, alpha=ALPHA, permutations=0)
    assert {"surprisal_z", "pit_ks"} <= set(report.rejected)
    assert report.effects["surprisal_deficit_ci_low"] > 0


@pytest.mark.e2e  # Monte Carlo: 60 A/A repeats
def test_a_a_calibration_stays_at_the_nominal_level(target):
    """Baseline against baseline with fresh streams (aa_report: the run's stats.aa_repeats), 60 times at alpha = 0.05: the verdict's rejection
    rate is not above 0.05 (one-sided binomial test at 0.01), and the surprisal test's p-values are
    uniform (KS at 0.01)."""
    from specresearch.measure import aa_report

    alpha = 0.05
    reports = [aa_report(target, [PROMPT], 150, 4, T1, seed=10, repeat=r, rows=150, alpha=alpha, power=0.8, tv=0.05) for r in range(60)]
    result = calibration(reports, alpha)
    assert result["p_rate_above_alpha"] > 0.01, result
    assert result["p_uniform_surprisal_z"] > 0.01, result


def test_power_report_matches_its_formula(target, target_side):
    report = battery(*target_side, *target_side, alpha=0.01, power=0.8, permutations=0)
    pw = report.power
    lam = noncentrality(pw["position_df"], pw["level"], 0.8)
    assert st.ncx2.sf(st.chi2.isf(pw["level"], pw["position_df"]), pw["position_df"], lam) == pytest.approx(0.8)
    assert pw["min_tv_position"] == pytest.approx(np.sqrt(lam / (4 * N / 2)))
    # a method against itself: nothing rejects, the surprisal deficit is 0, no N is "needed"
    assert not report.reject and report.effects["surprisal_deficit"] == pytest.approx(0.0, abs=0.2)
    # N too small for a TV of 0.05: the report says how to size it, or, where auto sized it, at what df
    assert pw["n_for_tv"] > N and "size N with stats.samples=auto" in report.format()
    report.sized_at_df = pw["position_df"] - 1
    assert f"which stats.samples=auto sized at the baseline's own position df, {pw['position_df'] - 1}" in report.format()


def test_samples_for_tv_is_the_smallest_n_with_the_power():
    """N per side for a position TV at Holm's strictest level: at N the noncentral χ² power
    (λ = 4 n_eff TV², n_eff = N / 2) reaches the target power, at N − 1 it does not."""
    for df, length in ((1, 1), (7, 8), (30, 8)):
        n = samples_for_tv(0.05, df, length, alpha=0.01, power=0.8)
        critical = st.chi2.isf(0.01 / family_size(length), df)
        assert st.ncx2.sf(critical, df, 2 * n * 0.05**2) >= 0.8 > st.ncx2.sf(critical, df, 2 * (n - 1) * 0.05**2)
    assert samples_for_tv(0.05, 1, 8) == 3572 and samples_for_tv(0.05, 16, 8) == 7116  # the values docs/concepts/lossless.md quotes


def test_family_size_and_position_df_are_the_battery_s(target, target_side):
    """family_size(L) is the number of tests the battery gates, and position_df of a sample is the
    df its position tests get against a second sample of the same law and size (here: itself)."""
    base, cond = target_side
    report = battery(base, cond, base, cond, permutations=0)
    assert len(report.tests) == family_size(L) == len(report.holm)
    assert position_df(base) == report.power["position_df"]
    one = battery(Samples(base.tokens[:, :1], base.prompt, 1.0), cond, Samples(base.tokens[:, :1], base.prompt, 1.0), cond, permutations=0)
    assert len(one.tests) == family_size(1)


def test_auto_samples_grow_the_baseline_until_the_position_df_is_covered(target):
    """stats.samples=auto: from the df = 1 bound, the baseline grows (fresh seeds per round) until
    N per side reaches samples_for_tv at the df its own position tests have at that N."""
    sc = OmegaConf.create({"tv": 0.3, "power": 0.8, "alpha": 0.01, "length": 2})
    n0 = samples_for_tv(sc.tv, 1, sc.length, sc.alpha, sc.power)
    rounds = []

    def more(m, r):
        rounds.append((m, r))
        return [sample_target(target, PROMPT, m, sc.length, T1, seed=1000 + r)]

    parts, n = auto_samples([sample_target(target, PROMPT, n0, sc.length, T1, seed=999)], n0, more, sc)
    assert rounds and [r for _, r in rounds] == list(range(len(rounds)))  # it grew, with a new seed each round
    assert len(parts) == 1 and len(parts[0].tokens) == n == n0 + sum(m for m, _ in rounds)
    assert n >= samples_for_tv(sc.tv, position_df(parts[0]), sc.length, sc.alpha, sc.power)


def test_auto_rows_per_call_follow_the_vocabulary():
    """stats.batch=auto: 256 rows for small vocabularies, fewer where a call's laws would grow past 2^24 per position."""
    from specresearch.measure import stats_rows
    assert stats_rows("auto", 320) == 256 and stats_rows("auto", 65_536) == 256
    assert stats_rows("auto", 151_936) == 110 and stats_rows("auto", 2**25) == 1
    assert stats_rows(7, 151_936) == 7


@pytest.mark.parametrize("shift", [0.0, 0.2])
def test_the_position_tv_is_read_against_its_noise_floor(shift):
    """Two samples of one law: the plug-in TV is all noise, and its floor (relabelling) says so (a
    bootstrap percentile interval, as the report gave before, sat above its own plug-in estimate);
    two laws at TV 0.2: the plug-in is close to 0.2 and far above the floor."""
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(60))  # [60] one law
    q = p.copy()
    if shift:  # move `shift` of the mass from the 30 likeliest categories' half to the other half
        order = np.argsort(p)
        lo, hi = order[:30], order[30:]
        q[hi] *= 1 - shift / p[hi].sum()
        q[lo] += shift * p[lo] / p[lo].sum()
    assert 0.5 * np.abs(p - q).sum() == pytest.approx(shift)
    n = 4000
    a = rng.choice(60, size=(n, 2), p=p)
    b = rng.choice(60, size=(n, 2), p=q)
    prompts = np.zeros(n, dtype=np.int64)
    tv_t, null_t, q95 = _tv_position(a, b, prompts, prompts, 100, np.random.default_rng(1))  # [2], [2], the means' 95%
    tv, null = tv_t.mean(), null_t.mean()
    assert 0.03 < null < q95  # 4,000 a side over 60 categories: noise alone gives a TV of a few hundredths
    if shift == 0:
        assert tv == pytest.approx(null, abs=0.01) and tv < q95
    else:
        assert tv == pytest.approx(shift, abs=0.02) and tv > q95
