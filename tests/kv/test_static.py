"""The static KV cache (model.cache=static: kv.StaticSlots) and the compiled decoder
(model.compile=true): every drafter in each of its modes decodes exactly what it decodes with the
dynamic cache (fp32, tiny models, greedy), one sequence and a batch; the slots are preallocated and
reused; a compiled engine decodes what the eager one does, for every drafter; what the static cache
cannot do is refused in one line."""

import pytest
import torch

from specresearch.build import build_engine
from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM, StaticSlots
from specresearch.models import load_model
from specresearch.options.groups import OPTIONS
from tests.cases import modes
from tests.helpers import make_cfg, tiny_engine
from tests.tiny import PLAIN, REPEATING, drafter_cfg

PROMPTS = [REPEATING, PLAIN]


@pytest.mark.parametrize("drafter, overrides", [pytest.param(d, o, id=f"{d}[{m}]") for d, m, o in modes()])
def test_static_cache_decodes_what_the_dynamic_one_does(drafter, overrides, tmp_path):
    """Greedy tokens of every drafter x mode equal the dynamic cache's (the draft
    model's cache follows model.cache too), one sequence and a batch of three: rollbacks, tree paths
    kept in place, rows' holes compacted and finished rows dropped."""
    outs = {}
    for cache in ("dynamic", "static"):
        try:
            engine = build_engine(drafter_cfg(drafter, tmp_path, *(f"drafter.{o}" for o in overrides), "verifier=greedy", "sampling=greedy",
                                              f"model.cache={cache}"))
        except SpecResearchError:  # a mode that samples its draft (children=sample): a last-bit difference of q may
            # change a drawn child and with it every later draw, so its runs are equal in law only (test_lossless);
            # its cache paths (tree levels, paths kept in place) are its greedy sibling mode's
            pytest.skip("samples its draft: no greedy run")
        assert (engine.kv.static is not None) == (cache == "static")
        outs[cache] = [engine.generate(p, 32, eos_token_ids=[]) for p in PROMPTS]
        outs[cache] += engine.generate([*PROMPTS, PLAIN[:5]], 32, eos_token_ids=[])  # a batch: rows of other lengths, in one cache
    assert [o.tokens for o in outs["static"]] == [o.tokens for o in outs["dynamic"]]
    # (accepted counts may differ: a forward over the masked slots rounds in the last bits, which flips
    # a random draft's near-ties; the tokens may not)


@pytest.mark.e2e  # torch.compile's graphs: long
@pytest.mark.parametrize("drafter", sorted(OPTIONS["drafter"]))
def test_a_compiled_engine_decodes_what_the_eager_one_does(drafter, tmp_path):
    """model.compile=true (inductor on the CPU; target and draft model compiled) against the eager static
    engine, every drafter of conf/drafter in its default mode: the same greedy tokens at fp32."""
    tokens = {}
    for compiled in (False, True):
        engine = build_engine(drafter_cfg(drafter, tmp_path, "verifier=greedy", "sampling=greedy", "model.cache=static",
                                          f"model.compile={str(compiled).lower()}"))
        tokens[compiled] = engine.generate(REPEATING, 12, eos_token_ids=[]).tokens
        assert (engine.kv.lm.compiled is not None) == compiled  # (made at the first compiled forward)
    # the target's logits came from the whole model compiled (its lm head in the graph), unless the drafter reads hidden states
    # (then the graph without the head; shape=auto's cost measurement may compile the whole model beside it)
    graphs = set(engine.kv.lm.compiled)
    assert (False in graphs) == engine.drafter.needs_hidden and (True in graphs or engine.drafter.needs_hidden)
    assert tokens[True] == tokens[False]


@torch.inference_mode()
def test_slots_are_preallocated_reused_and_grown_in_blocks():
    lm = load_model("tiny", device="cpu", cache="static")
    target = CachedLM(lm)
    target.reset(10)
    slots = target.static
    target.prefill_rows([torch.tensor(PLAIN)])
    keys = slots.cache.layers[0].keys
    assert slots.capacity == StaticSlots.BLOCK and keys.shape[2] == StaticSlots.BLOCK
    target.forward_rows([torch.tensor([5, 6, 7])], [None])
    target.truncate_rows([len(PLAIN) + 1])  # a rejection: the write position moves back, nothing is freed
    assert int(slots.cache.layers[0].cumulative_length) == target.length == len(PLAIN) + 1
    target.reset(10)
    assert slots.cache.layers[0].keys is keys  # a new sequence reuses the slots (compiled graphs keep their addresses)
    target.prefill_rows([torch.tensor(PLAIN)])
    before = target.forward_rows([torch.tensor([9] * 3)], [None])[0]  # [3, V]
    target.truncate_rows([len(PLAIN)])
    target.forward_rows([torch.tensor([1] * (StaticSlots.BLOCK - len(PLAIN)))], [None])  # fills the slots
    target.forward_rows([torch.tensor([2, 3])], [None])  # needs more: a larger cache with what was written
    assert slots.capacity == 2 * StaticSlots.BLOCK
    target.truncate_rows([len(PLAIN)])
    torch.testing.assert_close(target.forward_rows([torch.tensor([9] * 3)], [None])[0], before)


@torch.inference_mode()
def test_a_compiled_decoder_decodes_what_the_eager_one_does(tmp_path):
    """model.compile=true (inductor on the CPU): plain decoding gives the eager tokens, and a padded chain
    and a padded tree (3 tokens at width 4) give the eager logits. Two graphs: widths 4 and 1."""
    tokens, logits = {}, {}
    for compiled in (False, True):
        cfg = make_cfg("model=tiny", "drafter=none", "verifier=greedy", "sampling=greedy", "model.cache=static", f"model.compile={str(compiled).lower()}")
        engine = build_engine(cfg, baseline=True)
        tokens[compiled] = engine.generate(PLAIN, 12, eos_token_ids=[]).tokens  # prefill at width 4, then width 1
        target = CachedLM(engine.kv.lm)
        target.reset(len(PLAIN) + 8)
        target.prefill_rows([torch.tensor(PLAIN)])
        chain = target.forward_rows([torch.tensor([5, 6, 7])], [None])[0]  # [3, V]
        target.truncate_rows([len(PLAIN)])
        tree = target.forward_rows([torch.tensor([5, 6, 9])], [torch.tensor([-1, 0, 0])])[0]
        logits[compiled] = torch.cat([chain, tree])
    assert engine.kv.lm.compiled is not None and tokens[True] == tokens[False]
    torch.testing.assert_close(logits[True], logits[False], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("overrides, says", [
    (["model.cache=paged"], "unknown model.cache 'paged': valid are dynamic, static"),
    (["model.compile=true"], "model.compile=true needs model.cache=static"),
    (["model.cache=static", "model.compile=true", "batch_size=2"], "model.compile=true compiles the decoder of one sequence: batch_size=2"),
], ids=["unknown-cache", "compile-dynamic", "compile-batch"])
def test_what_the_static_cache_cannot_do_is_refused_in_one_line(overrides, says):
    from specresearch import settings

    with pytest.raises(SpecResearchError) as err:
        settings.check_config(make_cfg("model=tiny", *overrides))
    assert str(err.value).startswith(says) and "\n" not in str(err.value)




@torch.inference_mode()
def test_a_kept_prefill_serves_static_batches_of_any_size():
    """Many samples of one prompt (the battery's way: reuse_prefill, batches of the prompt repeated): the kept
    prefill is restored into each new batch's slots, so every row decodes what the prompt decodes alone."""
    engine = tiny_engine("drafter=pld", "verifier=greedy", "sampling=greedy", "model.cache=static")
    alone = engine.generate(REPEATING, 12, eos_token_ids=[]).tokens
    for rows in (3, 1, 2):  # a new batch size each time: new slots, the prompt copied in
        outs = engine.generate([REPEATING] * rows, 12, eos_token_ids=[], reuse_prefill=True, sample_first=False)
        again = engine.generate(REPEATING, 12, eos_token_ids=[], reuse_prefill=True, sample_first=False)
        assert [o.tokens for o in outs] == [again.tokens] * rows
    assert engine.generate([REPEATING] * 2, 12, eos_token_ids=[], reuse_prefill=True)[1].tokens == alone


@torch.inference_mode()
def test_a_kept_prefill_longer_than_the_first_slots_is_restored(tmp_path):
    """A draft model's static cache is reset without the prompt's size (one block of slots): a kept prefill of a
    longer prompt is restored into larger slots (the battery's batches of one long prompt), as the dynamic cache does."""
    prompt = (REPEATING + PLAIN) * 24  # 384 tokens: more than one block of slots
    assert len(prompt) > StaticSlots.BLOCK
    outs = {}
    for cache in ("dynamic", "static"):
        engine = build_engine(drafter_cfg("independent", tmp_path, "verifier=greedy", "sampling=greedy", f"model.cache={cache}"))
        outs[cache] = [[o.tokens for o in engine.generate([prompt] * rows, 8, eos_token_ids=[], reuse_prefill=True, sample_first=False)]
                       for rows in (2, 3)]
    assert outs["static"] == outs["dynamic"]
    assert all(row == outs["dynamic"][0][0] for batch in outs["dynamic"] for row in batch)
