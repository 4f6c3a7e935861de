"""Prompt lookup decoding: the matcher on hand-made sequences, proposals, greedy identity with the
baseline on tiny fp32 models, and the target's law under rejection sampling (battery)."""

import pytest
import torch

from specresearch.drafters import Context, NoDrafter, PromptLookupDrafter
from specresearch.drafters.ngram import continuation_start, lookup, lookup_rows, match_rows
from specresearch.engine import DraftLength, Engine
from specresearch.errors import SpecResearchError
from specresearch.types import SamplingParams
from specresearch.verifiers import GreedyVerifier, RejectionVerifier
from tests.tiny import PLAIN, REPEATING, cyclic_tiny, equivalence_report, plain_chain, tiny_model


def t(*ids: int) -> torch.Tensor:
    return torch.tensor(ids)


def test_matcher_finds_the_continuation():
    #            0  1  2  3  4  5  6  7
    tokens = t(5, 6, 7, 8, 9, 5, 6, 7)
    assert continuation_start(tokens, 3) == 3  # 5 6 7 at 0 → 8 follows
    assert continuation_start(tokens, 2) == 3  # 6 7 at 1
    assert continuation_start(tokens, 4) is None  # 9 5 6 7 occurs only as the suffix
    assert continuation_start(t(1, 2, 3), 1) is None  # 3 never occurred before
    assert continuation_start(t(4), 1) is None and continuation_start(t(4, 4), 2) is None  # too short


def test_matcher_first_or_last_occurrence_and_overlap():
    tokens = t(1, 2, 9, 1, 2, 8, 1, 2)
    assert continuation_start(tokens, 2, "first") == 2
    assert continuation_start(tokens, 2, "last") == 5
    # overlap: in a run of one token the occurrence right before the suffix overlaps it
    assert continuation_start(t(3, 3, 3, 3), 2, "last") == 3  # 3 3 at 1 → the last 3 follows
    assert continuation_start(t(3, 3, 3, 3), 2, "first") == 2


def ctx(tokens: torch.Tensor, max_draft: int = 100) -> Context:
    return Context(tokens, SamplingParams(), None, max_draft)


def test_proposals_prefer_long_ngrams_and_respect_k():
    """The engine passes the step's k as Context.max_draft (DraftLength)."""
    tokens = t(1, 2, 3, 4, 5, 6, 0, 3, 9, 9, 0, 2, 3)
    # the 2-gram 2 3 (at 1) wins over the 1-gram 3 (first at 2 too, but also at 7)
    assert PromptLookupDrafter(max_ngram=2).propose(ctx(tokens, 3)).tokens.tolist() == [4, 5, 6]
    assert PromptLookupDrafter(max_ngram=2).propose(ctx(tokens, 10)).tokens.tolist() == [4, 5, 6, 0, 3, 9, 9, 0, 2, 3]
    assert PromptLookupDrafter(max_ngram=2).propose(ctx(tokens, 2)).tokens.tolist() == [4, 5]
    assert PromptLookupDrafter(max_ngram=1, match="last").propose(ctx(tokens, 3)).tokens.tolist() == [9, 9, 0]
    draft = PromptLookupDrafter(min_ngram=2).propose(ctx(t(1, 2, 3, 7), 3))
    assert len(draft) == 0 and draft.q is None


@pytest.mark.parametrize("match", ["first", "last"])
def test_rows_are_looked_up_together_as_each_alone(match):
    """lookup_rows (a batch's rows at once) returns, row by row, what lookup returns: contexts of other
    lengths (one shorter than the n-gram), small vocabularies (many matches, overlaps), k from 0 up; and
    match_rows the n of the longest n-gram each row's continuation follows (0: none returned)."""
    gen = torch.Generator().manual_seed(0)
    met = set()
    for vocab in (2, 3, 7):
        contexts = [torch.randint(0, vocab, (n,), generator=gen) for n in (1, 2, 5, 9, 17, 30)]
        k = [3, 0, 8, 1, 10, 4]
        for max_ngram, min_ngram in ((3, 1), (2, 2), (4, 2)):
            together = lookup_rows(contexts, k, max_ngram, min_ngram, match)
            alone = [lookup(c, kb, max_ngram, min_ngram, match) for c, kb in zip(contexts, k)]
            assert [x.tolist() for x in together] == [x.tolist() for x in alone]
            assert any(len(x) for x in alone) and any(not len(x) for x in alone)  # matches and misses both met
            found, ngram = match_rows(contexts, k, max_ngram, min_ngram, match)
            assert [x.tolist() for x in found] == [x.tolist() for x in alone]
            longest = [next((n for n in range(max_ngram, min_ngram - 1, -1) if continuation_start(c, n, match) is not None), 0)
                       if kb > 0 else 0 for c, kb in zip(contexts, k)]
            assert ngram == longest
            met.update(ngram)
    assert met == {0, 1, 2, 3, 4}  # every n met, and no match


def test_bad_settings_name_the_valid_ones():
    with pytest.raises(SpecResearchError, match="k >= 1"):
        PromptLookupDrafter(k=0)
    with pytest.raises(SpecResearchError, match="min_ngram <= max_ngram"):
        PromptLookupDrafter(min_ngram=3, max_ngram=2)
    with pytest.raises(SpecResearchError, match="valid are first, last"):
        PromptLookupDrafter(match="random")


@pytest.mark.parametrize("k", [1, 4, 10])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("model", ["random", "cyclic"])
def test_greedy_output_equals_the_baseline(k, seed, model):
    """A random tiny model (drafts found in the prompt, mostly rejected) and a repeating one (drafts
    accepted): both give the baseline's tokens, prompts with and without repetition."""
    if model == "cyclic":
        target = cyclic_tiny(seed)
    else:
        target = tiny_model(seed)
    engine = Engine(target, PromptLookupDrafter(k=k), GreedyVerifier(), SamplingParams())
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    drafted = accepted = 0
    for prompt in (REPEATING, PLAIN):
        out = engine.generate(prompt, 40, eos_token_ids=[])
        assert out.tokens == baseline.generate(prompt, 40, eos_token_ids=[]).tokens
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert drafted > 0  # the lookup found something to propose
    if model == "cyclic":
        assert accepted > drafted / 2 and out.stats.tau > 1.5


def test_rejection_sampling_with_lookup_drafts_follows_the_target(target):
    """Deterministic drafts at T = 1 through the engine: the battery sees no difference from the
    target's own samples (the drafts are often rejected, exercising the one-hot residual)."""
    sampling = SamplingParams(temperature=1.0)
    engine = Engine(target, PromptLookupDrafter(k=4), RejectionVerifier(), sampling)
    report = equivalence_report(engine, REPEATING, seed=50)
    assert not report.reject, report.format()
    stats = engine.generate(REPEATING, 30, eos_token_ids=[], seed=3).stats
    assert stats.drafted > 0 and stats.accepted < stats.drafted


def test_heuristic_k_policy_follows_transformers_schedule(target):
    length = DraftLength.of(PromptLookupDrafter(k=4, k_policy="heuristic", k_max=7))
    ks = []
    for drafted, accepted in [(4, 4), (6, 6), (7, 7), (7, 2), (6, 0), (0, 0)]:
        length.update(drafted, accepted)
        ks.append(length.k)
    assert ks == [6, 7, 7, 6, 5, 5]  # +2 capped at k_max, −1 after a rejection, unchanged without a draft
    length.reset()
    assert length.k == 4  # every sequence starts from the configured k
    fixed = DraftLength.of(PromptLookupDrafter(k=4))
    fixed.update(4, 4)
    assert fixed.k == 4 and DraftLength.of(NoDrafter()) is None
    with pytest.raises(SpecResearchError, match="valid are fixed, heuristic"):
        Engine(target, PromptLookupDrafter(k_policy="grow"), GreedyVerifier(), SamplingParams())
    with pytest.raises(SpecResearchError, match="drafter.k_max must be >= drafter.k, got 2 < 4"):
        Engine(target, PromptLookupDrafter(k=4, k_max=2), GreedyVerifier(), SamplingParams())


@pytest.mark.parametrize("name", ["pld", "independent"])
def test_heuristic_k_keeps_greedy_identity(target, name):

    if name == "pld":
        target = cyclic_tiny(0)
        drafter = PromptLookupDrafter(k=1, k_policy="heuristic")
    else:
        draft = tiny_model(noise=0.01, noise_seed=5)
        drafter = plain_chain(target, k=2, model=draft, k_policy="heuristic", k_max=12)
    engine = Engine(target, drafter, GreedyVerifier(), SamplingParams())
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    longest = 0
    for prompt in (REPEATING, PLAIN):
        out = engine.generate(prompt, 40, eos_token_ids=[])
        assert out.tokens == baseline.generate(prompt, 40, eos_token_ids=[]).tokens
        longest = max(longest, len(out.stats.drafted_at))
    assert longest > drafter.k  # k grew past its start value
