"""model.kernels=invariant: the target's law at a context is the same bits whatever the forward's shape.

In bf16 a context's law moves with the number of query tokens a forward carries (1 in plain decoding, k + 1
in a verification, L - 1 in teacher forcing); with the invariant kernels it does not, so a speculative
method reads bit for bit the law plain decoding samples from. Checked on a tiny bf16 model whose default
kernels do move (a 140-token context, small weights): each product row alone, attention over a shared
prefix or a copied prompt, one query a forward against chunks of 5 and 17 and rows, and every law the
engine's verifier reads for five drafters against the baseline's own path (benchmarks/engine_laws.py).
"""

import copy

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specresearch import build_engine, compose
from specresearch.attention import INVARIANT_ATTENTION, SharedPrefix, shares_prefix
from specresearch.errors import SpecResearchError
from specresearch.models import load_model
from specresearch.models.kernels import InvariantLinear, blocked_product, invariant_block
from tests.helpers import script

TINY = {"hidden_size": 64, "num_heads": 4, "num_layers": 2, "init_std": 0.05}  # small weights: near-ties, where bf16 rounding shows
PROMPT = list(range(3, 143))  # 140 tokens: attention long enough for the default kernels' blocking to move a law


def _tiny(kernels: str = "invariant"):
    return load_model("tiny", dtype="bfloat16", kernels=kernels, tiny=TINY)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@torch.inference_mode()
def test_each_row_of_an_invariant_product_is_the_row_computed_alone(dtype):
    gen = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(96, 300, dtype=dtype)
    layer.__class__ = InvariantLinear
    layer.block = invariant_block(layer.weight)
    x = torch.randn(70, 96, generator=gen).to(dtype)  # [70, in]
    x[::4] *= 100
    alone = torch.cat([layer(x[j : j + 1]) for j in range(70)])  # [70, out]
    for m in (2, 5, 17, 70):
        assert torch.equal(layer(x[:m]), alone[:m]), m
    torch.testing.assert_close(alone, torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=2e-2, atol=1e-1)
    for block in (1, 3):  # any fixed block is exact arithmetic's product, each row padded the same way
        torch.testing.assert_close(blocked_product(layer.weight, x, block), x @ layer.weight.T, rtol=2e-2, atol=1e-1)


@torch.inference_mode()
def test_a_shared_prefix_and_a_copied_prompt_give_the_same_bits():
    lm = _tiny()
    model = lm.model
    assert shares_prefix(model) and model.config._attn_implementation == INVARIANT_ATTENTION
    gen = torch.Generator().manual_seed(1)
    prompt, fed = torch.tensor([PROMPT]), torch.randint(0, 300, (3, 4), generator=gen)
    cache = DynamicCache(config=model.config)
    model(input_ids=prompt, cache=cache, use_cache=True)
    prefix = SharedPrefix.of(cache, len(PROMPT))
    held = copy.deepcopy(cache)
    held.batch_repeat_interleave(3)
    want = model(input_ids=fed, cache=held, use_cache=True).logits  # [3, 4, V]
    positions = (len(PROMPT) + torch.arange(4)).expand(3, -1)
    got = model(input_ids=fed, cache=DynamicCache(config=model.config), use_cache=True, position_ids=positions, prefix=prefix).logits
    assert torch.equal(got, want)


@torch.inference_mode()
def test_one_query_a_forward_chunks_and_rows_give_the_same_bits():
    """The law after each of 19 tokens: fed one a forward (plain decoding), 5 or 17 a forward (verifications),
    or all at once in a batch of 3 rows (teacher forcing): the same bits. The default kernels differ here."""
    ids = torch.cat([torch.tensor([PROMPT]), torch.randint(0, 300, (1, 19), generator=torch.Generator().manual_seed(2))], 1)

    def laws(model, chunk: int, rows: int = 1) -> torch.Tensor:
        batch = torch.cat([ids, torch.randint(0, 300, (rows - 1, ids.shape[1]), generator=torch.Generator().manual_seed(3))])
        cache = DynamicCache(config=model.config)
        out = [model(batch[:, : len(PROMPT)], cache=cache, use_cache=True).logits[0, -1:]]
        for s in range(len(PROMPT), ids.shape[1] - 1, chunk):
            out.append(model(batch[:, s : min(s + chunk, ids.shape[1] - 1)], cache=cache, use_cache=True).logits[0])
        return torch.cat(out)  # [20, V]

    with torch.inference_mode():
        model = _tiny().model
        one = laws(model, 1)
        for chunk, rows in ((5, 1), (17, 1), (19, 3)):
            assert torch.equal(laws(model, chunk, rows), one), (chunk, rows)
        default = _tiny("auto").model
        moved = [not torch.equal(laws(default, chunk), laws(default, 1)) for chunk in (5, 17)]
    print(f"default kernels: the laws of chunks of 5 / 17 differ from one query a forward: {moved}")


@pytest.mark.parametrize("drafter", ["independent", "tree", "pld", "lookahead", "self_draft"])
def test_every_law_the_verifier_reads_is_plain_decodings_bit_for_bit(drafter):
    """benchmarks/engine_laws.py's audit in bf16 with the invariant kernels: 8 rows x 8 tokens decoded as the
    battery's method side does (chains, trees, siblings, rows leaving), every node's logits the same bits as
    the baseline's path (the shared prompt, then one query a forward)."""
    laws = script("benchmarks/engine_laws.py")
    engine = build_engine(compose(["model=tiny", "model.dtype=bfloat16", "model.kernels=invariant", *(f"model.tiny.{k}={v}" for k, v in
                                   TINY.items() if k != "init_std"), f"+model.tiny.init_std={TINY['init_std']}", f"drafter={drafter}", "verifier=rejection", "sampling=random", "sampling.temperature=0.7"]))
    found = laws.audit(engine, PROMPT, rows=8, tokens=8, seed=0)
    assert {r["at"] for r in found} >= set(range(8)) and len(found) >= 64
    assert all(r["same_bits"] for r in found) and max(r["tv"] for r in found) == 0.0


def test_invariant_kernels_are_refused_under_compile():
    with pytest.raises(SpecResearchError, match="kernels=invariant cannot run under model.compile=true"):
        build_engine(compose(["model=tiny", "model.kernels=invariant", "model.cache=static", "model.compile=true"]))


@torch.inference_mode()
def test_the_numeric_floor_is_zero_with_invariant_kernels_and_sees_the_defaults():
    """stats.floor: the baseline's sequences re-read along 1-query and (k + 1)-query forwards. With the invariant
    kernels the paths are the same bits (floor exactly 0); with the defaults, where this machine's kernels move a
    law between those paths (checked first on the model itself), the floor is positive."""
    from specresearch.stats import numeric_floor, sample_target
    from specresearch.types import SamplingParams

    sampling = SamplingParams(temperature=0.7)
    floors = {}
    for kernels in ("invariant", "auto"):
        lm = _tiny(kernels)
        tokens = sample_target(lm, PROMPT, 48, 6, sampling, seed=0, batch=16).tokens  # [48, 6]
        floors[kernels] = numeric_floor(lm, [PROMPT], [tokens], sampling, chunk=5, batch=16)
    assert floors["invariant"].verify.max() == 0 and floors["invariant"].score.max() == 0 and floors["invariant"].bound.max() == 0
    f = floors["auto"]
    assert f.verify.shape == (6,) and f.sequences == 48 and f.chunk == 5
    assert np.allclose(f.bound, np.cumsum(f.verify)) and (f.verify >= 0).all()
    model, cut = lm.model, len(PROMPT) - 1  # the floor's two paths for the first sequence: after the prompt but its last token,
    ids = torch.tensor([PROMPT + tokens[0, :4].tolist()])  # [1, P + 4] the prompt's last token and 4 more, 5 queries or 1 a forward
    laws = []
    for chunk in (5, 1):
        cache = DynamicCache(config=model.config)
        model(ids[:, :cut], cache=cache, use_cache=True)
        laws.append(torch.cat([model(ids[:, t : t + chunk], cache=cache, use_cache=True).logits[0] for t in range(cut, ids.shape[1], chunk)]))
    if torch.equal(*laws):
        pytest.skip("this machine's default bf16 kernels give 1 and 5 queries a forward the same bits: nothing for the floor to see")
    assert f.verify.max() > 0


def test_a_rejection_is_judged_against_the_numeric_floor():
    """Report.numerics: a rejection at a position whose TV above its noise floor exceeds what the numerics can put
    there is "beyond"; one within that bound, or by a test that reads no position, "within"; negligible numerics
    (fp32's, the invariant kernels' 0): "beyond"."""
    from specresearch.stats import NumericFloor, Report
    from specresearch.stats.battery import TestResult

    def report(tv3: float, verify: float, rejected: str = "position_3") -> Report:
        tests = [TestResult("surprisal_z", 0.0, 0.5, kind="one-sample"), TestResult(rejected, 30.0, 1e-6, df=5)]
        return Report(tests=tests, holm=[1.0, 2e-6], bh=[0.5, 2e-6], alpha=0.01, controls=[], power={"min_tv_position": 0.02},
                      tv_by_position=np.array([0.01, 0.01, tv3]), tv_null_by_position=np.array([0.01, 0.01, 0.01]),
                      floor=NumericFloor(np.full(3, verify), np.zeros(3), 5, 100))

    assert report(tv3=0.03, verify=0.01).numerics == "within"  # excess 0.02 <= bound 0.03
    assert report(tv3=0.30, verify=0.01).numerics == "beyond"  # excess 0.29 > 0.03
    assert report(tv3=0.30, verify=0.01, rejected="pit_ks").numerics == "within"  # no position to compare
    assert report(tv3=0.03, verify=1e-6, rejected="pit_ks").numerics == "beyond"  # negligible numerics
    assert report(tv3=0.03, verify=0.0).summary()["beyond_numerics"] == 1.0
    quiet = report(tv3=0.03, verify=0.01)
    quiet.holm = [1.0, 0.5]
    assert quiet.numerics is None and "beyond_numerics" not in quiet.summary()
