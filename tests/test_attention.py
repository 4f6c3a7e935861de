"""Attention over a prompt that every row of a batch shares (specresearch.attention): a forward of rows
that attend over one copy of the prompt equals, in float64, the forward with the prompt copied into
every row's cache (grouped key/value heads, causal, additive and boolean masks); without a prefix the
attention is transformers' SDPA itself; the battery's batched draws and teacher forcing use it."""

import copy

import pytest
import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from specresearch.attention import PREFIX_ATTENTION, SharedPrefix, shares_prefix, use_prefix_attention
from specresearch.kv import decode_batch
from specresearch.types import SamplingParams
from tests.tiny import tiny_model

P, B = 23, 5


def _model(kv_heads: int) -> torch.nn.Module:
    """A tiny Qwen2 in float64 with 4 query heads over `kv_heads` key/value heads."""
    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, max_position_embeddings=256, attn_implementation="sdpa")
    torch.manual_seed(0)
    return use_prefix_attention(Qwen2ForCausalLM(config).double().eval())


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@torch.inference_mode()
def test_rows_over_a_shared_prefix_equal_rows_that_hold_the_prompt(kv_heads):
    model = _model(kv_heads)
    assert shares_prefix(model) and model.config._attn_implementation == PREFIX_ATTENTION
    gen = torch.Generator().manual_seed(1)
    prompt, fed, more = (torch.randint(0, 97, shape, generator=gen) for shape in ((1, P), (B, 4), (B, 3)))
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt, cache=cache, use_cache=True)
    prefix = SharedPrefix.of(cache, P)
    held = copy.deepcopy(cache)
    held.batch_repeat_interleave(B)  # the prompt in every row's cache
    own = DynamicCache(config=model.config)  # the rows' own tokens only
    positions = (P + torch.arange(7)).expand(B, -1)
    # 4 tokens per row, causal (no mask given)
    want = model(input_ids=fed, cache=held, use_cache=True).logits
    got = model(input_ids=fed, cache=own, use_cache=True, position_ids=positions[:, :4], prefix=prefix).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # 3 more under a mask that hides row b's first b own tokens (additive over the held prompt and the own slots; boolean over the own)
    seen = torch.ones(B, 3, 7, dtype=torch.bool).tril(4)  # [B, W, own slots]
    for b in range(B):
        seen[b, :, : min(b, 4)] = False
    additive = torch.zeros(B, 1, 3, P + 7, dtype=torch.float64)
    additive[:, 0, :, P:].masked_fill_(~seen, torch.finfo(torch.float64).min)
    want = model(input_ids=more, cache=held, use_cache=True, attention_mask=additive).logits
    for mask in (additive[..., P:], seen[:, None]):
        rows = copy.deepcopy(own)
        got = model(input_ids=more, cache=rows, use_cache=True, position_ids=positions[:, 4:], attention_mask=mask, prefix=prefix).logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@torch.inference_mode()
def test_without_a_prefix_the_attention_is_sdpa_itself():
    shared, plain = _model(2), _model(2)
    plain.set_attn_implementation("sdpa")
    x = torch.randint(0, 97, (3, 9), generator=torch.Generator().manual_seed(2))
    assert torch.equal(shared(input_ids=x).logits, plain(input_ids=x).logits)
    eager = copy.deepcopy(plain)
    eager.set_attn_implementation("eager")
    assert not shares_prefix(use_prefix_attention(eager))  # another implementation is left alone (rows then copy the prompt)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@torch.inference_mode()
def test_a_masked_forward_of_grouped_heads_is_sdpa_to_the_bit(dtype):
    """Rows of several queries under a mask (a batch's verification, a tree), where transformers' SDPA copies each
    key/value head for its query heads and ours reads them in place: the same bits, in every dtype."""
    shared, plain = _model(2).to(dtype), _model(2).to(dtype)
    plain.set_attn_implementation("sdpa")
    gen = torch.Generator().manual_seed(3)
    prompt, fed = torch.randint(0, 97, (3, 11), generator=gen), torch.randint(0, 97, (3, 5), generator=gen)
    seen = torch.ones(3, 5, 16, dtype=torch.bool).tril(11)  # [B, W, slots] a chain after the prompt ...
    seen[1, :, :4] = False  # ... row 1 left-padded, row 2 a tree whose second branch hides the first
    seen[2, 3:, 12:14] = False
    additive = torch.zeros(3, 1, 5, 16, dtype=dtype).masked_fill_(~seen[:, None], torch.finfo(dtype).min)
    for mask in (additive, seen[:, None]):
        logits = []
        for model in (shared, plain):
            cache = DynamicCache(config=model.config)
            model(input_ids=prompt, cache=cache, use_cache=True)
            logits.append(model(input_ids=fed, cache=cache, use_cache=True, attention_mask=mask).logits)
        assert torch.equal(*logits)


@torch.inference_mode()
def test_batched_draws_over_a_shared_prompt_are_the_draws_from_copies():
    """decode_batch (the battery's baseline draws) with the prompt held once draws, greedy and sampled with
    one generator, the tokens it draws with the prompt copied into every row (fp32)."""
    lm = tiny_model()
    assert shares_prefix(lm.model)
    prompt = torch.tensor([[10, 11, 12, 13, 14, 10, 11, 12, 13, 14, 10, 11, 200, 7]])
    cache = DynamicCache(config=lm.model.config)
    lm.model(input_ids=prompt[:, :-1], cache=cache, use_cache=True)
    prefix = SharedPrefix.of(cache, prompt.shape[1] - 1)
    ids = prompt[:, -1:].expand(6, 1)
    for sampling in (SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)):
        held = copy.deepcopy(cache)
        held.batch_repeat_interleave(6)
        want = decode_batch(lm, held, ids, 12, sampling, torch.Generator().manual_seed(3))[0]
        got = decode_batch(lm, DynamicCache(config=lm.model.config), ids, 12, sampling, torch.Generator().manual_seed(3),
                           positions=torch.full((6, 1), prompt.shape[1] - 1), prefix=prefix)[0]
        assert torch.equal(got, want)


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("forward_first", [False, True])
@torch.inference_mode()
def test_a_row_rolled_back_into_the_shared_prompt_decodes_as_its_own_tokens(static, forward_first):
    """CachedLM.truncate_rows below the prompt the rows share (a draft that re-encodes its context may part
    from the prompt's tokens): every row gets its own copy of the prompt, and each row's next logits are
    those of its own tokens alone (fp32), with or without a step of rows before it, dynamic or static cache."""
    from specresearch.kv import CachedLM

    lm = tiny_model()
    gen = torch.Generator().manual_seed(4)
    prompt, step, fed = torch.randint(0, 320, (20,), generator=gen), torch.randint(0, 320, (3, 2), generator=gen), torch.randint(0, 320, (3, 3), generator=gen)
    target = CachedLM(lm, static=static)
    target.reset(64)
    target.prefill_rows([prompt] * 3)
    assert target.prefix is not None
    tokens = [prompt.clone() for _ in range(3)]
    if forward_first:
        target.forward_rows(list(step), [None] * 3)
        target.keep_rows([range(2)] * 3)
        tokens = [torch.cat([prompt, s]) for s in step]
    lengths = [15, 20, 21] if forward_first else [15, 20, 19]
    target.truncate_rows(lengths)
    assert target.prefix is None and target.lengths == lengths
    got = target.forward_rows(list(fed), [None] * 3)
    for b in range(3):
        ids = torch.cat([tokens[b][: lengths[b]], fed[b]])[None]
        want = lm.model(input_ids=ids).logits[0, -3:]
        torch.testing.assert_close(got[b], want, rtol=1e-4, atol=1e-4)
