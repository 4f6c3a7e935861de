"""The decode loop on tiny fp32 models: greedy speculative output equals plain greedy decoding
(and transformers' own generate), KV caches roll back exactly, stops match, and sampled outputs
follow the target's law."""

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import power_divergence

from specresearch.drafters import Context, IndependentDrafter, NoDrafter, draft_model
from specresearch.drafters.draft_model import cheapen
from specresearch.drafters.independent import ChainRate
from specresearch.drafters.tree import Sizer
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.metrics import SpecStats
from specresearch.models import machine
from specresearch.stats import first_token_law
from specresearch.types import Draft, SamplingParams, Verdict
from specresearch.verifiers import GreedyVerifier, RejectionVerifier
from tests.tiny import PLAIN, REPEATING, cyclic_tiny, lengths_on_curves, lookup_runs, plain_chain, rejected_cyclic_draft, tiny_model

GREEDY = SamplingParams()
VOCAB = 320


@pytest.fixture(scope="module")
def same_draft():
    """A copy of the target: every draft is accepted."""
    return tiny_model()


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (int(length),), generator=gen).tolist() for length in torch.randint(1, 12, (n,), generator=gen)]


def autoregressive(target) -> Engine:
    """Plain greedy decoding of `target`, one token a forward: the reference every greedy method must equal."""
    return Engine(target, NoDrafter(), GreedyVerifier(), GREEDY)


class WrongDrafter(IndependentDrafter):
    """Drafts with an exact copy of the target, then shifts every token: each draft is rejected at
    its first position."""

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        return [Draft(tokens=(draft.tokens + 1) % VOCAB) for draft in super().propose_rows(ctxs)]


def test_baseline_equals_transformers_generate(target):
    """Same tokens, and the same stop at EOS (kept in the output), as transformers' greedy generate."""
    stopped = 0
    for prompt in prompts(6):
        ours = autoregressive(target).generate(prompt, 40)
        ids = torch.tensor([prompt])
        theirs = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)
        assert ours.tokens == theirs[0, len(prompt) :].tolist()
        stopped += ours.stop_reason == "eos"
    assert stopped > 0, "no prompt met EOS: the stop is untested"


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_speculative_equals_greedy(target, close_draft, k):
    engine = Engine(target, plain_chain(target, k=k, model=close_draft), GreedyVerifier(), GREEDY)
    for i, prompt in enumerate(prompts(4, seed=k)):
        out = engine.generate(prompt, 40, eos_token_ids=[], seed=i)
        assert out.tokens == autoregressive(target).generate(prompt, 40, eos_token_ids=[]).tokens
        assert len(out.tokens) == 40
    s = out.stats
    assert 0 < s.accepted < s.drafted, "the perturbed draft should be partly accepted"
    assert s.steps < 40 and s.tau == pytest.approx((s.accepted + s.steps) / s.steps)
    assert s.off_chain == 0  # every step a chain of k (those max_new_tokens cut short included): Leviathan's model holds


def test_packed_kernels_keep_greedy_identical():
    """A tiny pair wide enough (hidden 256) that every layer takes oneDNN's packed product (model.kernels=auto
    where torch has it): chains of 1 to 9 verified in one forward give plain one-token decoding's tokens.
    On an Intel CPU float32 products of up to MKL_ROWS rows take MKL instead: the draft's head, which only
    ever sees one row (its prefill keeps the last position's logits), is then never packed."""
    from specresearch.models import PackedLinear, packed_linear_available
    from specresearch.models.kernels import mkl_takes_few_rows

    if not packed_linear_available():
        pytest.skip("this torch has no oneDNN linear ops")
    target, draft = tiny_model(hidden_size=256), tiny_model(hidden_size=256, noise=0.01, noise_seed=5)
    drafted = accepted = 0
    for k in (1, 4, 8):
        engine = Engine(target, plain_chain(target, k=k, model=draft), GreedyVerifier(), GREEDY)
        for i, prompt in enumerate(prompts(3, seed=k)):
            out = engine.generate(prompt, 32, eos_token_ids=[], seed=i)
            assert out.tokens == autoregressive(target).generate(prompt, 32, eos_token_ids=[]).tokens
            drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert 0 < accepted < drafted
    one_row = {(id(draft), "lm_head")} if mkl_takes_few_rows() else set()
    assert all(("_pack" in m.__dict__) != ((id(lm), name) in one_row)
               for lm in (target, draft) for name, m in lm.model.named_modules() if type(m) is PackedLinear)


def test_every_draft_rejected_still_gives_the_baseline_output(target, same_draft):
    engine = Engine(target, plain_chain(target, cls=WrongDrafter, k=3, model=same_draft), GreedyVerifier(), GREEDY)
    for prompt in prompts(3, seed=1):
        out = engine.generate(prompt, 30, eos_token_ids=[])
        assert out.stats.accepted == 0 and out.stats.drafted > 0
        assert out.tokens == autoregressive(target).generate(prompt, 30, eos_token_ids=[]).tokens


@pytest.mark.parametrize("k", [1, 3, 5])
def test_every_draft_accepted_gives_the_baseline_output_and_a_bonus_token_per_step(target, same_draft, k):
    engine = Engine(target, plain_chain(target, k=k, model=same_draft), GreedyVerifier(), GREEDY)
    for prompt in prompts(3, seed=2):
        out = engine.generate(prompt, 36, eos_token_ids=[])
        assert out.stats.accepted == out.stats.drafted > 0
        assert out.stats.tau > k  # k accepted + 1 bonus per full step; the last step may draft fewer
        assert out.tokens == autoregressive(target).generate(prompt, 36, eos_token_ids=[]).tokens


def next_logits_fresh(lm, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return lm.model(torch.tensor([tokens])).logits[0, -1]


@pytest.mark.parametrize("drafter_kind", ["rejected", "partial", "accepted"])
def test_kv_caches_equal_fresh_prefill(target, close_draft, same_draft, drafter_kind):
    """After any rejection pattern the target cache (and the draft's) hold exactly the accepted
    sequence: the next step's logits equal those of a fresh prefill."""
    drafter = {
        "rejected": lambda: plain_chain(target, cls=WrongDrafter, k=3, model=same_draft),
        "partial": lambda: plain_chain(target, k=4, model=close_draft),
        "accepted": lambda: plain_chain(target, k=4, model=same_draft),
    }[drafter_kind]()
    engine = Engine(target, drafter, GreedyVerifier(), GREEDY)
    for max_new in (5, 17, 26):
        prompt = prompts(1, seed=max_new)[0]
        out = engine.generate(prompt, max_new, eos_token_ids=[])
        seq = prompt + out.tokens
        # The engine stops before committing its last step; commit the cache as the next step would.
        assert engine.kv.length >= len(seq) - 1 - drafter.k
        engine.kv.truncate_rows([len(seq) - 1])
        with torch.inference_mode():
            cached = engine.kv.forward_rows([torch.tensor(seq[engine.kv.length :])], [None])[0][-1]
        torch.testing.assert_close(cached, next_logits_fresh(target, seq), atol=1e-4, rtol=1e-4)


def test_tokens_fed_after_a_rollback_see_only_the_kept_cache(target):
    engine = autoregressive(target)
    wrapper = engine.kv
    seq = list(range(20, 40))
    with torch.inference_mode():
        wrapper.reset()
        wrapper.prefill_rows([torch.tensor(seq[:10])])
        wrapper.forward_rows([torch.tensor([7, 8, 9, 10, 11])], [None])  # 5 tokens then rejected after 2
        wrapper.truncate_rows([12])
        logits = wrapper.forward_rows([torch.tensor([99, 98])], [None])[0][-1]
    torch.testing.assert_close(logits, next_logits_fresh(target, seq[:10] + [7, 8, 99, 98]), atol=1e-4, rtol=1e-4)


def test_stops_eos_and_stop_strings_match_baseline(target, close_draft):
    spec = Engine(target, plain_chain(target, k=4, model=close_draft), GreedyVerifier(), GREEDY)
    prompt = prompts(1, seed=9)[0]
    full = autoregressive(target).generate(prompt, 40, eos_token_ids=[]).tokens
    eos = full[13]
    first = full.index(eos)
    for engine in (autoregressive(target), spec):
        out = engine.generate(prompt, 40, eos_token_ids=[eos])
        assert out.tokens == full[: first + 1] and out.stop_reason == "eos"
        out = engine.generate(prompt, 9, eos_token_ids=[])
        assert out.tokens == full[:9] and out.stop_reason == "length"
    # A stop string: two printable bytes from the middle of the baseline's text.
    stop_at = next(i for i in range(8, 38) if 32 <= full[i] < 127 and 32 <= full[i + 1] < 127)
    stop = bytes(full[stop_at : stop_at + 2]).decode()
    outs = [e.generate(prompt, 40, stop_strings=[stop], eos_token_ids=[]) for e in (autoregressive(target), spec)]
    assert outs[0].tokens == outs[1].tokens and outs[0].text == outs[1].text
    assert outs[0].stop_reason == "stop_string" and stop not in outs[0].text
    assert len(outs[0].tokens) <= stop_at + 2


def test_sampled_speculative_follows_target_law(target, far_draft):
    """independent x rejection at T = 1: the joint law of the first two new tokens equals the
    target's exact law (G-test, expected-count pooling). The second token comes from verifying a
    two-token draft: accepted, recovered after a rejection, or drawn from the residual."""
    sampling = SamplingParams(temperature=1.0)
    engine = Engine(target, plain_chain(target, k=2, model=far_draft), RejectionVerifier(), sampling)
    prompt = [65, 66, 67]
    with torch.inference_mode():
        p1 = torch.softmax(target.model(torch.tensor([prompt])).logits[0, -1].double(), -1)  # [V]
        top = torch.topk(p1, 12).indices  # the first token's likely values; the rest pooled
        seqs = torch.tensor([prompt + [int(x)] for x in top])
        p2 = torch.softmax(target.model(seqs).logits[:, -1].double(), -1)  # [12, V]
    n = 3000
    counts: dict[tuple[int, int], int] = {}
    stats = SpecStats()
    for first in range(0, n, 250):  # 250 rows per batched decode: row b of seed `first` is stream (first, b), all independent
        for out in engine.generate([prompt] * 250, 4, eos_token_ids=[], seed=first):  # prefill token, then a 2-token draft
            first_two = tuple(out.tokens[:2])
            counts[first_two] = counts.get(first_two, 0) + 1
            stats = stats.merge(out.stats)
    # cells: (x1, x2) for likely x1 and x2 with expected count >= 5; "x1 likely, x2 other"; "x1 other"
    expected, observed = [], []
    for i, x1 in enumerate(top.tolist()):
        joint = p1[x1] * p2[i]  # [V]
        big = (joint * n >= 5).nonzero().flatten().tolist()
        for x2 in big:
            expected.append(float(joint[x2]))
            observed.append(counts.get((x1, x2), 0))
        expected.append(float(p1[x1] - joint[big].sum()))
        observed.append(sum(c for (a, b), c in counts.items() if a == x1 and b not in big))
    expected.append(float(1 - p1[top].sum()))
    observed.append(sum(c for (a, _), c in counts.items() if a not in top.tolist()))
    expected = np.array(expected) * n
    assert len(expected) > 20 and sum(observed) == n
    assert 0.2 < stats.alpha < 0.9, "both acceptances and recoveries must occur"
    assert stats.accepted_at[0] > 0.2 * n, "the second token must often come from an accepted draft"
    pvalue = power_divergence(np.array(observed), expected, lambda_="log-likelihood").pvalue
    assert pvalue > 1e-3


def test_confidence_stopped_drafts_follow_target_law(target, far_draft):
    """independent(confidence) x rejection at T = 1: drafts of one or two tokens, cut by the draft's
    own confidence; given the most frequent first two tokens, the third follows the target's exact
    conditional law (G-test): where drafts stop depends on the draft alone, so nothing is biased."""
    sampling = SamplingParams(temperature=1.0)
    engine = Engine(target, plain_chain(target, k=2, model=far_draft, confidence=0.5), RejectionVerifier(), sampling)
    prompt = [65, 66, 67]
    n, runs, stats = 3000, [], SpecStats()
    for first in range(0, n, 250):  # 250 rows per batched decode: row b of seed `first` is stream (first, b), all independent
        for out in engine.generate([prompt] * 250, 4, eos_token_ids=[], seed=first):  # prefill token, then a draft of 1 or 2
            runs.append(tuple(out.tokens))
            stats = stats.merge(out.stats)
    assert stats.drafted_at[0] > stats.drafted_at[1] > 0.1 * n, "drafts of one and of two tokens both occur"
    assert stats.off_chain > 0.1 * n  # first steps stopped at one token where two fit: not Leviathan's chain of k
    pairs: dict[tuple[int, int], int] = {}
    for r in runs:
        pairs[r[:2]] = pairs.get(r[:2], 0) + 1
    head = max(pairs, key=pairs.get)
    third = np.bincount([r[2] for r in runs if r[:2] == head], minlength=VOCAB)
    with torch.inference_mode():
        p3 = torch.softmax(target.model(torch.tensor([prompt + list(head)])).logits[0, -1].double(), -1).numpy()  # [V]
    m = third.sum()
    assert m > 200
    big = p3 * m >= 5
    observed = np.append(third[big], third[~big].sum())
    expected = np.append(p3[big], p3[~big].sum()) * m
    assert len(observed) > 5
    assert power_divergence(observed, expected, lambda_="log-likelihood").pvalue > 1e-3


def test_a_seed_reproduces_its_sampled_output_and_another_seed_changes_it(target, close_draft):
    engine = Engine(target, plain_chain(target, k=3, model=close_draft), RejectionVerifier(), SamplingParams(temperature=0.8, top_k=50))
    a = engine.generate([1, 2, 3], 20, eos_token_ids=[], seed=11).tokens
    b = engine.generate([1, 2, 3], 20, eos_token_ids=[], seed=11).tokens
    c = engine.generate([1, 2, 3], 20, eos_token_ids=[], seed=12).tokens
    assert a == b and a != c


def test_stream_seed_spawns_independent_streams_from_a_seed():
    """stream_seed(s, k...) is SeedSequence's spawned stream: (s, b) the b-th child of s; negative seeds
    map modulo 2**64; keys must be 32-bit words (a larger one would alias two words of a longer key)."""
    from specresearch.seeding import stream_seed

    children = np.random.SeedSequence(5).spawn(3)
    assert [stream_seed(5, b) for b in range(3)] == [int(c.generate_state(1, np.uint64)[0]) >> 1 for c in children]
    seeds = {stream_seed(s, *key) for s in (0, 1, 2) for key in ((), (0,), (1,), (0, 0), (0, 1), (1, 0))}
    assert len(seeds) == 18 and all(0 <= x < 2**63 for x in seeds)  # no two (seed, key) tuples alike
    assert stream_seed(-1, 0) == stream_seed(2**64 - 1, 0) != stream_seed(1, 0)
    for bad in (-1, 2**32, 1.0, True):
        with pytest.raises(ValueError, match="key must be an integer"):
            stream_seed(0, bad)
    with pytest.raises(ValueError, match="seed must be an integer"):
        stream_seed("0", 1)


def test_batches_of_consecutive_seeds_share_no_stream(target, close_draft):
    """A batch with seed i gives row b stream (i, b): calls with seeds 0 and 1 share no row (with
    `seed + b`, row b of seed 0 was row b - 1 of seed 1); a batch of one is the prompt alone with that
    seed, and a list of seeds gives row b exactly what `generate(prompt[b], seed=seed[b])` gives (T = 1, fp32)."""
    from specresearch.engine import _seeds
    from specresearch.seeding import stream_seed

    engine = Engine(target, plain_chain(target, k=3, model=close_draft), RejectionVerifier(), SamplingParams(temperature=1.0))
    prompt = [1, 2, 3]
    calls = [[tuple(o.tokens) for o in engine.generate([prompt] * 4, 12, eos_token_ids=[], seed=i)] for i in (0, 1)]
    assert len(set(calls[0] + calls[1])) == 8  # no row of one call equals a row of the other (nor of its own)
    assert _seeds(0, 4) == [stream_seed(0, b) for b in range(4)] and _seeds([3, 3], 2) == [stream_seed(3, 0)] * 2
    alone = engine.generate(prompt, 12, eos_token_ids=[], seed=7).tokens
    assert engine.generate([prompt], 12, eos_token_ids=[], seed=7)[0].tokens == alone
    assert tuple(engine.generate(prompt, 12, eos_token_ids=[], seed=1).tokens) not in calls[0]  # before: row 1 of seed 0
    batch = [prompt, PLAIN, REPEATING[3:], prompt]
    seeds = [7, 0, 1, 12]
    rows = engine.generate(batch, 12, eos_token_ids=[], seed=seeds)
    assert [r.tokens for r in rows] == [engine.generate(p, 12, eos_token_ids=[], seed=s).tokens for p, s in zip(batch, seeds)]
    assert rows[0].tokens == alone and tuple(rows[3].tokens) not in calls[0] + calls[1]


def test_divergence_gap_is_the_targets_logit_gap_at_the_first_difference(target):
    from specresearch.measure import divergence_gap

    prompt = prompts(1, seed=3)[0]
    a = autoregressive(target).generate(prompt, 6, eos_token_ids=[]).tokens
    logits = next_logits_fresh(target, prompt + a[:2])  # [V]
    runner_up = int(logits.topk(2).indices[1])
    b = a[:2] + [runner_up, a[3]]
    assert divergence_gap(target, prompt, a, b) == pytest.approx((logits[a[2]] - logits[runner_up]).item(), abs=1e-4)
    assert divergence_gap(target, prompt, a, list(a)) is None
    assert divergence_gap(target, prompt, a, a[:4]) is None  # stopped earlier: no token to compare


# --- FR-Spec: a draft restricted to the most frequent tokens ---------------------------------------


def test_frequent_tokens_rank_by_count_and_keep_eos(tmp_path):
    from specresearch.models import ByteTokenizer
    from specresearch.vocab import frequent_tokens

    tok = ByteTokenizer()
    top = frequent_tokens(tok, 8, "mtbench", cache_dir=tmp_path)
    assert len(top) == 8 and top[-1] == tok.eos_token_id  # EOS never occurs in text, but a draft must be able to end
    assert top[0] == ord(" ") and ord("e") in top.tolist()  # English: space first, then e, t, ...
    assert list(tmp_path.iterdir()), "the counts are cached"
    assert torch.equal(frequent_tokens(tok, 8, "mtbench", cache_dir=tmp_path), top)
    code = frequent_tokens(tok, 40, "python-stdlib").tolist()  # Python source: indentation, names, colons
    assert code[0] == ord(" ") and {ord("\n"), ord("("), ord(":"), ord("_")} <= set(code)
    with pytest.raises(SpecResearchError, match="unknown vocabulary corpus .wiki.: valid are python-stdlib, sharegpt, mtbench"):
        frequent_tokens(tok, 8, "wiki")


def test_the_sharegpt_corpus_is_chat_from_the_training_side_and_corpora_add_up():
    from specresearch.data import train_side
    from specresearch.vocab import SHAREGPT_BYTES, corpus_texts

    chats = corpus_texts("sharegpt")
    assert SHAREGPT_BYTES <= sum(map(len, chats)) < SHAREGPT_BYTES + 100_000
    assert sum("```" in text for text in chats) > 100  # answers with fenced code: what chat targets write
    train = train_side("sharegpt")[: len(chats)]  # the training side (test_data: no evaluation prompt in it), in order
    assert chats == [f"{p.text}\n{p.meta['reply']}" for p in train] and all(p.meta["reply"] for p in train[:100])
    both = corpus_texts("python-stdlib+sharegpt")
    assert both == corpus_texts("python-stdlib") + chats


@pytest.mark.parametrize("k", [1, 3])
def test_shortlisted_draft_keeps_greedy_identical(target, close_draft, k):
    drafter = plain_chain(target, k=k, model=cheapen(close_draft, target, vocab=200, vocab_corpus="mtbench"))
    engine = Engine(target, drafter, GreedyVerifier(), GREEDY)
    for i, prompt in enumerate(prompts(4, seed=10 + k)):
        out = engine.generate(prompt, 30, eos_token_ids=[], seed=i)
        assert out.tokens == autoregressive(target).generate(prompt, 30, eos_token_ids=[]).tokens
    assert 0 < out.stats.accepted < out.stats.drafted


def test_shortlisted_draft_reports_the_q_it_samples_from(target, far_draft):
    """Single-step check at T = 1: q is the draft's softmax renormalised over the shortlist (zero
    elsewhere), the drawn tokens follow q (G-test), and rejection sampling against this q yields
    exactly the target's p."""
    sampling = SamplingParams(temperature=1.0)
    drafter = plain_chain(target, k=1, model=cheapen(far_draft, target, vocab=100, vocab_corpus="mtbench"))
    prompt = torch.tensor([72, 101, 108, 108, 111, 32])
    rng = torch.Generator().manual_seed(0)
    ctx = Context(prompt, sampling, rng, max_draft=1)
    draws = []
    with torch.inference_mode():
        drafter.prefill(ctx)
        for _ in range(3000):
            draft = drafter.propose(ctx)
            draws.append(int(draft.tokens[0]))
            drafter.commit(ctx, Verdict(tokens=draft.tokens[:1], num_accepted=0))  # nothing kept: the same context again
    q = draft.q[0].double()  # [V]
    short = drafter.draft.shortlist.ids
    with torch.inference_mode():
        full = far_draft.model(prompt[None]).logits[0, -1].double()  # [V]
        p = torch.softmax(target.model(prompt[None]).logits[0, -1].double(), -1)  # [V]
    expected = torch.zeros_like(q).index_copy_(0, short, torch.softmax(full[short], -1))
    torch.testing.assert_close(q, expected, atol=1e-5, rtol=0)
    assert q.sum() == pytest.approx(1.0) and set(draws) <= set(short.tolist())
    counts = np.bincount(draws, minlength=VOCAB)[short.numpy()]
    keep = q[short].numpy() * len(draws) >= 5
    observed = np.append(counts[keep], counts[~keep].sum())
    expected_counts = np.append(q[short].numpy()[keep], q[short].numpy()[~keep].sum())
    expected_counts = expected_counts / expected_counts.sum() * len(draws)
    assert power_divergence(observed, expected_counts, lambda_="log-likelihood").pvalue > 1e-3
    torch.testing.assert_close(first_token_law(RejectionVerifier(), p, q), p, atol=1e-12, rtol=0)


@pytest.mark.parametrize("options", [{"quantize": "int8"}, {"quantize": "int8", "vocab": 200, "vocab_corpus": "mtbench"}])
def test_int8_draft_keeps_greedy_identical(target, close_draft, options):
    drafter = plain_chain(target, k=3, model=cheapen(close_draft, target, **options))
    assert close_draft.model.model.layers[0].mlp.up_proj.weight.dtype == torch.float32, "the shared draft is untouched"
    assert not any(isinstance(m, torch.nn.Linear) for m in drafter.draft.model.modules()), "every linear is int8"
    assert not isinstance(drafter.draft.head, torch.nn.Linear), "the shortlist's head too"
    engine = Engine(target, drafter, GreedyVerifier(), GREEDY)
    for i, prompt in enumerate(prompts(3, seed=20)):
        out = engine.generate(prompt, 30, eos_token_ids=[], seed=i)
        assert out.tokens == autoregressive(target).generate(prompt, 30, eos_token_ids=[]).tokens
    assert 0 < out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_confidence_stops_drafts_early_and_keeps_greedy_identical(target, close_draft, sampling):
    engine = Engine(target, plain_chain(target, k=6, model=close_draft, confidence=0.6), RejectionVerifier(), sampling)
    stats = SpecStats()
    for i, prompt in enumerate(prompts(4, seed=30)):
        out = engine.generate(prompt, 30, eos_token_ids=[], seed=i)
        stats = stats.merge(out.stats)
        if sampling.greedy:
            assert out.tokens == autoregressive(target).generate(prompt, 30, eos_token_ids=[]).tokens
    assert stats.drafted_at[0] > stats.drafted_at[-1] > 0, "some drafts stop early, some run to k"
    sure = Engine(target, plain_chain(target, k=6, model=close_draft, confidence=0.9999), RejectionVerifier(), sampling)
    out = sure.generate(prompts(1)[0], 20, eos_token_ids=[])
    assert len(out.stats.drafted_at) == 1, "a near-1 threshold stops every draft after one token"
    with pytest.raises(SpecResearchError, match="confidence must lie in \\(0, 1\\)"):
        plain_chain(target, k=2, model=close_draft, confidence=1.5)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_chain_confidence_stops_where_the_chains_probability_falls_below(target, far_draft, sampling):
    """Each chain runs while the product of its tokens' draft probabilities stays >= the threshold:
    it stops at the first token that takes it below, or at k."""
    k, threshold, stopped = 12, 0.3, 0
    drafter = plain_chain(target, k=k, model=far_draft, chain_confidence=threshold)
    for seed, prompt in enumerate(prompts(8, seed=40)):
        ctx = Context(torch.tensor(prompt), sampling, torch.Generator().manual_seed(seed), max_draft=k)
        with torch.inference_mode():
            drafter.prefill(ctx)
            draft = drafter.propose(ctx)
            logits = far_draft.model(torch.cat([ctx.tokens, draft.tokens])[None]).logits[0, len(prompt) - 1 : -1]  # [K, V]
        path = torch.softmax(logits.double(), -1).gather(-1, draft.tokens[:, None])[:, 0].cumprod(0)  # [K]
        assert (path[:-1] >= threshold).all()
        assert path[-1] < threshold or len(draft) == k
        stopped += len(draft) < k
    assert stopped >= 2, "some chains stop before k"
    with pytest.raises(SpecResearchError, match="chain_confidence must lie in \\(0, 1\\)"):
        plain_chain(target, k=2, model=far_draft, chain_confidence=0)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_shape_auto_drafts_a_chain_token_only_while_it_pays_on_the_cost_curve(target, far_draft, sampling):
    """drafter.shape=auto reads the cost curve it is given: with drafting at no cost, a flat curve drafts every
    chain to k, a cliff after 5 verified tokens stops every chain at the 4 tokens before it, and a curve where
    each token verified costs 100 forwards stops every chain at its first token."""
    k = 12
    drafter = plain_chain(target, k=k, model=far_draft, shape="auto")
    assert drafter.sizing is not None and drafter.sizing.sizer.unit > 0, "shape=auto measures the target's cost curve"
    seen = lengths_on_curves(drafter, prompts(4, seed=41), sampling, k)
    assert seen == {"flat": [k] * 4, "cliff": [4] * 4, "steep": [1] * 4}
    assert plain_chain(target, k=k, model=far_draft).sizing is None, "shape=null: no curve measured"


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_shape_auto_sizes_a_batchs_chains_on_the_batchs_cost(target, far_draft, sampling):
    """In a batch, shape=auto reads the target's cost of verifying every row padded to the widest: on a curve flat
    for one row, two rows whose every verified token costs 10 forwards draft one token each, two rows with a cliff
    after 5 verified tokens stop at the 4 before it, and one row drafts to k; the first batch measures the curve."""
    k = 12

    def ctxs(rows: int) -> list[Context]:
        return [Context(torch.tensor(p), sampling, torch.Generator().manual_seed(i), max_draft=k)
                for i, p in enumerate(prompts(rows, seed=43))]

    drafter = plain_chain(target, k=k, model=far_draft, shape="auto")
    assert drafter.sizing.sizer.batch is None
    with torch.inference_mode():
        drafter.prefill_rows(ctxs(2))
        assert drafter.sizing.sizer.batch is not None and drafter.sizing.sizer.batch(2, 3) > 0, "the batch's cost is measured"
        for batch, want in [(lambda rows, m: 1.0 + 10 * (m - 1), [1, 1]), (lambda rows, m: 1.0 if m <= 5 else 100.0, [4, 4])]:
            drafter.sizing.sizer = Sizer(lambda m: 1.0, math.inf, batch)  # drafting at no cost
            for rows, lengths in [(ctxs(2), want), (ctxs(1), [k])]:
                drafter.prefill_rows(rows)
                assert [len(draft) for draft in drafter.propose_rows(rows)] == lengths


def test_chain_rate_calibrates_the_drafts_probabilities_by_the_verdicts_of_tokens_reached():
    """shape=auto's acceptance estimate: before any verdict a token is as likely as the draft says (its tenth's
    middle); a verdict counts the tokens it reached (those kept and the first rejected, none after), per tenth
    of the draft's probability; τ̂ multiplies the rates down the chain and credits a sibling with the draft's
    renormalized law where the chain's token is rejected."""
    rate = ChainRate()
    chain = SimpleNamespace(scores=[(0.87, 0.0), (0.81, 0.0), (0.55, 0.0)])
    assert rate.rate(0.87) == pytest.approx(0.85) and rate.rate(0.55) == pytest.approx(0.55)
    assert rate.tau(chain) == pytest.approx((1 + 0.85 + 0.85**2 + 0.85**2 * 0.55, 0.85**2 * 0.55))
    rate.update(chain, kept=1)  # the first kept, the second rejected, the third never reached
    assert rate.rate(0.85) == pytest.approx((1 + 2 * 0.85) / (2 + 2)) and rate.rate(0.55) == pytest.approx(0.55)
    for _ in range(100):
        rate.update(chain, kept=3)
    assert rate.rate(0.85) > 0.98 and rate.rate(0.55) > 0.98, "a draft that underrates its tokens is corrected"
    with_sibling = SimpleNamespace(scores=[(0.5, 0.25)])
    fresh = ChainRate().rate(0.5)
    assert ChainRate().tau(with_sibling)[0] == pytest.approx(1 + fresh + (1 - fresh) * 0.25 / 0.5)


def test_shape_auto_with_lookup_charges_no_drafting_for_a_token_its_forward_scored():
    """With prompt lookup, a token whose law the last draft forward already computed costs no drafting time:
    where drafting dwarfs verification, a repeating text's chains run on through the guesses, longer than
    without lookup, and stay greedy-exact."""
    target, draft = cyclic_tiny(0), cyclic_tiny(0)
    out = {}
    for lookup in (0, 4):
        drafter = plain_chain(target, k=8, model=draft, lookup=lookup, shape="auto")
        drafter.sizing.sizer = Sizer(lambda m: 1.0, 1e-9)  # drafting dwarfs verification: only tokens already scored pay
        drafter.sizing.clock = itertools.count().__next__
        out[lookup] = Engine(target, drafter, GreedyVerifier(), GREEDY).generate(REPEATING, 40, eos_token_ids=[])
    assert len(out[4].stats.drafted_at) > len(out[0].stats.drafted_at), "with lookup, chains run on through the guesses"
    assert out[4].tokens == out[0].tokens == autoregressive(target).generate(REPEATING, 40, eos_token_ids=[]).tokens


def test_int8_draft_sampled_step_is_exact(target, far_draft):
    drafter = plain_chain(target, k=1, model=cheapen(far_draft, target, quantize="int8"))
    prompt = torch.tensor([72, 101, 108, 108, 111])
    ctx = Context(prompt, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), max_draft=1)
    with torch.inference_mode():
        drafter.prefill(ctx)
        q = drafter.propose(ctx).q[0].double()  # [V]
        p = torch.softmax(target.model(prompt[None]).logits[0, -1].double(), -1)
        full = torch.softmax(far_draft.model(prompt[None]).logits[0, -1].double(), -1)
    assert q.sum() == pytest.approx(1.0, abs=1e-5)
    assert 0 < (q - full).abs().sum() / 2 < 0.25  # int8 weights move q, but only a little (total variation)
    torch.testing.assert_close(first_token_law(RejectionVerifier(), p, q), p, atol=1e-12, rtol=0)
    with pytest.raises(SpecResearchError, match="valid are null \\(none\\), int8, auto"):
        cheapen(far_draft, target, quantize="int4")


def test_quantize_auto_is_int8_where_the_machine_runs_it(target, far_draft, monkeypatch, capsys):
    """quantize=auto: int8 linears on a CPU with torch's int8 kernels, the weights as loaded without
    them; the console says which, naming why."""
    def linears(draft) -> int:
        return sum(isinstance(m, torch.nn.Linear) for m in draft.model.modules())

    monkeypatch.setattr(machine, "_SAID", set())  # said once per process: this test's own
    assert linears(cheapen(far_draft, target, quantize="auto")) == 0 < linears(cheapen(far_draft, target))
    assert "quantize=auto: int8 draft weights" in capsys.readouterr().err
    monkeypatch.setattr(draft_model, "int8_engines", lambda: [])
    assert linears(cheapen(far_draft, target, quantize="auto")) == linears(cheapen(far_draft, target)) > 0
    assert "torch has no int8 kernels here" in capsys.readouterr().err


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
@pytest.mark.parametrize("confidence", [None, 0.5])
def test_lookup_drafts_the_same_chain_in_fewer_forwards(sampling, confidence):
    """Prompt lookup inside the draft (a cascade): the same tokens, seed for seed, at T = 0 and T = 1,
    from fewer draft forwards; guesses the draft refuses are rolled back out of its cache."""
    target = cyclic_tiny(0, head=3e-4)  # greedy text cycles (lookup finds it); at T = 1 top ≈ 0.85
    draft = rejected_cyclic_draft()
    runs = lookup_runs(target, lambda lookup: plain_chain(target, k=6, model=draft, confidence=confidence, lookup=lookup), sampling)
    assert runs[4][0] == runs[0][0]
    assert runs[4][1] < 0.85 * runs[0][1]
    if sampling.greedy:
        assert runs[4][0][0] == autoregressive(target).generate(REPEATING, 40, eos_token_ids=[]).tokens
    with pytest.raises(SpecResearchError, match="lookup must be >= 0"):
        plain_chain(target, k=2, model=draft, lookup=-1)


def test_siblings_are_the_drafts_next_likeliest_tokens_beside_the_chain(target, far_draft):
    """Each chain token is followed by its siblings: the draft's next likeliest tokens at its
    position (a fresh forward's ranking), leaves under the chain token's parent."""
    drafter = plain_chain(target, k=5, model=far_draft, siblings=2)
    prompt = torch.tensor(prompts(1, seed=50)[0])
    ctx = Context(prompt, GREEDY, None, max_draft=5)
    with torch.inference_mode():
        drafter.prefill(ctx)
        draft = drafter.propose(ctx)
    spine = [i for i in range(len(draft)) if i % 3 == 0]
    chain = draft.tokens[spine]  # [5]
    with torch.inference_mode():
        logits = far_draft.model(torch.cat([prompt, chain])[None]).logits[0, len(prompt) - 1 : -1]  # [5, V]
    assert draft.tokens.tolist() == logits.topk(3).indices.flatten().tolist()  # the chain's token first, then two siblings
    assert draft.parents.tolist() == [-1, -1, -1, 0, 0, 0, 3, 3, 3, 6, 6, 6, 9, 9, 9]
    assert draft.depth == 5 and draft.q is None
    # sibling_confidence keeps the siblings whose path probability reaches it, and only those
    probs = torch.softmax(logits.double(), -1)  # [5, V]
    path = torch.cat([torch.ones(1, dtype=torch.double), probs.gather(-1, chain[:, None])[:, 0].cumprod(0)[:-1]])  # [5] down to each parent
    threshold = 0.05
    sure = plain_chain(target, k=5, model=far_draft, siblings=2, sibling_confidence=threshold)
    with torch.inference_mode():
        sure.prefill(ctx)
        pruned = sure.propose(ctx)
    expected = [x for j in range(5) for r, x in enumerate(logits[j].topk(3).indices.tolist())
                if r == 0 or float(path[j] * probs[j, x]) >= threshold]
    assert pruned.tokens.tolist() == expected and pruned.depth == 5
    assert len(draft) > len(pruned) > 5, "some siblings kept, some dropped"
    with pytest.raises(SpecResearchError, match="siblings must be >= 0"):
        plain_chain(target, k=2, model=far_draft, siblings=-1)
    with pytest.raises(SpecResearchError, match="sibling_confidence must lie in \\[0, 1\\)"):
        plain_chain(target, k=2, model=far_draft, siblings=1, sibling_confidence=1.0)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_a_sibling_taken_drops_the_chain_after_it_from_the_draft_cache(target, far_draft, sampling):
    """When the target takes a sibling in place of a chain token, the draft forgets the rest of its
    chain: each next proposal is the one a fresh drafter makes from the same context and seed. At
    T = 1 the siblings' laws are one-hot rows beside the chain's sampled q."""
    taken = 0

    class Checked(IndependentDrafter):
        def propose_rows(self, ctxs):
            (ctx,) = ctxs  # one prompt: one row
            fresh = plain_chain(target, k=4, model=far_draft, siblings=1)
            state = None if ctx.rng is None else ctx.rng.get_state()
            fresh.prefill(ctx)
            expected = fresh.propose(ctx)
            if state is not None:
                ctx.rng.set_state(state)
            (draft,) = super().propose_rows(ctxs)
            assert draft.tokens.tolist() == expected.tokens.tolist()
            if draft.q is not None:
                siblings = draft.parents[1:] == draft.parents[:-1]  # [N - 1] a node beside the one before it
                assert (draft.q[1:][siblings].max(-1).values == 1).all()
            return [draft]

        def commit_rows(self, ctxs, verdicts):
            nonlocal taken
            taken += self._chains[0][1].accepted(verdicts[0]) < verdicts[0].num_accepted
            super().commit_rows(ctxs, verdicts)

    engine = Engine(target, plain_chain(target, cls=Checked, k=4, model=far_draft, siblings=1), RejectionVerifier(), sampling)
    for i, prompt in enumerate(prompts(4, seed=60)):
        with torch.inference_mode():
            out = engine.generate(prompt, 30, eos_token_ids=[], seed=i)
        if sampling.greedy:
            assert out.tokens == autoregressive(target).generate(prompt, 30, eos_token_ids=[]).tokens
    assert taken >= 2, "the target took a sibling now and then"


@pytest.fixture(scope="module")
def short_engine():
    """Plain decoding on a tiny model of 32 positions."""
    return autoregressive(tiny_model(max_position_embeddings=32))


@pytest.mark.parametrize("prompt, max_new, error", [
    ([1.5, 2], 8, "generate() takes the prompt as a list of integer token ids, got 1.5 (float) at position 0"),
    ([3, True], 8, "generate() takes the prompt as a list of integer token ids, got True (bool) at position 1"),
    ("def f():", 8, "generate() takes token ids, not text: encode it with engine.tokenizer.encode(text)"),
    (torch.tensor([1.0, 2.0]), 8, "generate() takes the prompt as a 1-D tensor of integer token ids (a batch: a 2-D tensor of "
                                  "equal-length prompts, one per row, or a list of prompts), got a 1-D float32 tensor"),
    (torch.tensor([[[1, 2]]]), 8, "generate() takes the prompt as a 1-D tensor of integer token ids (a batch: a 2-D tensor of "
                                  "equal-length prompts, one per row, or a list of prompts), got a 3-D int64 tensor"),
    (torch.zeros(0, 2, dtype=torch.long), 8, "generate() takes the prompt as a 1-D tensor of integer token ids (a batch: a 2-D "
                                             "tensor of equal-length prompts, one per row, or a list of prompts), got a 2-D int64 "
                                             "tensor with no rows"),
    (np.array([[[1, 2]]]), 8, "generate() takes the prompt as a 1-D array of integer token ids (a batch: a 2-D array of "
                              "equal-length prompts, one per row, or a list of prompts), got a 3-D int64 array"),
    (np.array([1.5, 2.0]), 8, "generate() takes the prompt as a 1-D array of integer token ids (a batch: a 2-D array of "
                              "equal-length prompts, one per row, or a list of prompts), got a 1-D float64 array"),
    (torch.tensor([[1.0, 2.0]]), 8, "prompt 0 of the batch: generate() takes the prompt as a 1-D tensor of integer token ids"),
    ({1, 2}, 8, "generate() takes the prompt as a list (or 1-D tensor) of integer token ids, got set"),
    ([], 8, "generate() needs a prompt of at least 1 token id, got 0"),
    ([99999], 8, f"token id 99999 at position 0 of the prompt is outside tiny's vocabulary: ids must be in [0, {VOCAB})"),
    ([-1, 5], 8, f"token id -1 at position 0 of the prompt is outside tiny's vocabulary: ids must be in [0, {VOCAB})"),
    ([1, 2], 0, "max_new_tokens must be an integer >= 1, got 0"),
    ([1, 2], -5, "max_new_tokens must be an integer >= 1, got -5"),
    ([1, 2], 2.0, "max_new_tokens must be an integer >= 1, got 2.0"),
    (list(range(30)), 8, "the prompt (30 tokens) and max_new_tokens=8 need 38 positions, but tiny has 32 "
                         "(max_position_embeddings): the prompt leaves room for 2 new tokens"),
    (list(range(40)), 1, "the prompt (40 tokens) and max_new_tokens=1 need 41 positions, but tiny has 32 "
                         "(max_position_embeddings): the prompt alone fills them"),
])
def test_generate_refuses_a_request_the_target_cannot_decode(short_engine, prompt, max_new, error):
    """The engine's door: one line naming the valid range, before the target runs a forward."""
    calls = []
    target = short_engine.kv
    target.prefill = lambda *a, **k: calls.append(a)  # an instance attribute: the class's stays as it is
    try:
        with pytest.raises(SpecResearchError) as err:
            short_engine.generate(prompt, max_new)
    finally:
        del target.prefill
    assert str(err.value).startswith(error) and "\n" not in str(err.value), err.value
    assert calls == []


def test_a_2d_tensor_or_array_is_a_batch_of_equal_length_prompts(short_engine):
    """generate()'s docstring: a batch is a list of prompts, or a 2-D tensor or numpy array (one prompt
    per row); each decodes what the list of rows decodes."""
    rows = [[5, 6, 7, 5], [7, 6, 5, 7]]
    expected = [o.tokens for o in short_engine.generate(rows, 6, eos_token_ids=[])]
    for batch in (torch.tensor(rows), torch.tensor(rows, dtype=torch.int32), np.array(rows), [np.array(r) for r in rows]):
        outputs = short_engine.generate(batch, 6, eos_token_ids=[])
        assert isinstance(outputs, list) and [o.tokens for o in outputs] == expected


def test_generate_takes_a_list_a_tuple_a_tensor_or_an_array_of_ids_up_to_the_last_position(short_engine):
    """Every integer form of one prompt decodes alike; a prompt and max_new_tokens that fill the
    positions exactly still decode, as do sample_first=False prompts of two tokens."""
    ids = [5, 6, 7, 5, 6]
    expected = short_engine.generate(ids, 6, eos_token_ids=[]).tokens
    for prompt in (tuple(ids), torch.tensor(ids), torch.tensor(ids, dtype=torch.int32), np.array(ids), [np.int64(i) for i in ids]):
        assert short_engine.generate(prompt, 6, eos_token_ids=[]).tokens == expected
    assert len(short_engine.generate(list(range(28)), 4, eos_token_ids=[]).tokens) == 4  # 28 + 4 = the 32 positions
    assert len(short_engine.generate([5, 6], 3, eos_token_ids=[], sample_first=False).tokens) == 3
    with pytest.raises(SpecResearchError, match=r"at least 2 token ids with sample_first=False, got 1"):
        short_engine.generate([5], 3, sample_first=False)


def test_without_the_time_split_a_run_times_only_its_total(target, close_draft):
    """time_split=False (stats.time_split; auto turns it off on CUDA, where each phase's sync would slow
    the step): the same tokens and counters, the total timed, the phases not."""
    outs = {split: Engine(target, plain_chain(target, k=3, model=close_draft), RejectionVerifier(), SamplingParams(temperature=1.0),
                          time_split=split).generate(PLAIN, 16, eos_token_ids=[], seed=5) for split in (True, False)}
    on, off = outs[True].stats, outs[False].stats
    assert outs[True].tokens == outs[False].tokens and (on.steps, on.accepted) == (off.steps, off.accepted)
    assert on.split_timed and on.time_verify > 0 and on.time_draft > 0
    assert not off.split_timed and off.time_total > 0 and off.time_draft == off.time_verify == off.time_accept == 0
    assert Engine(target, NoDrafter(), GreedyVerifier(), GREEDY).time_split  # auto: on the CPU


def test_greedy_decoding_takes_the_argmax_and_builds_no_law(target, close_draft, monkeypatch):
    """At T = 0 neither plain nor speculative decoding turns the vocabulary's logits into
    probabilities or draws a token: the steps decide from the argmax (Verifier.verify_argmax), with the
    same tokens and acceptance as the verifier's own rule on one-hot laws."""
    import specresearch.engine as engine_module
    import specresearch.verifiers.base as verifiers_base

    ids = prompts(3, seed=5)
    engines = [autoregressive(target), Engine(target, plain_chain(target, k=3, model=close_draft), RejectionVerifier(), GREEDY)]
    before = [[(o.tokens, o.stats.accepted) for o in e.generate(ids, 12, eos_token_ids=[])] for e in engines]

    def built(*args, **kwargs):
        raise AssertionError("a law was built or drawn from at T = 0")

    monkeypatch.setattr(engine_module, "logits_to_probs", built)
    monkeypatch.setattr(verifiers_base, "invert_cdf", built)
    after = [[(o.tokens, o.stats.accepted) for o in e.generate(ids, 12, eos_token_ids=[])] for e in engines]
    assert after == before and any(accepted for _, accepted in after[1])
    with pytest.raises(AssertionError, match="law was built"):  # T > 0 does build p
        Engine(target, NoDrafter(), RejectionVerifier(), SamplingParams(temperature=1.0)).generate(ids[0], 4)
