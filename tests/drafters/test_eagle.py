"""EAGLE: the head drafts on the target's features; losslessness does not depend on it (greedy
identity with an untrained head, the target's law at T = 1); trained on a tiny model's own text its
loss falls and its drafts get accepted; checkpoints round-trip (the training command end to end:
test_train.py)."""

import dataclasses

import pytest
import torch
from transformers import DynamicCache

from specresearch.drafters import Context, NoDrafter
from specresearch.drafters.eagle import EagleDrafter, EagleHead, chained, eagle_path, unroll
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.train import MAX_PROMPT, build_cache, check_training, train, training_prompts
from specresearch.types import SamplingParams
from specresearch.verifiers import GreedyVerifier, RejectionVerifier, TypicalVerifier
from specresearch.vocab import Shortlist
from tests.helpers import train_cfg
from tests.tiny import PLAIN, REPEATING, cyclic_tiny, equivalence_report, tiny_model

EAGLE = "specresearch.drafters.eagle.EagleDrafter"
# the first two training prompts of the tiny model's head below (bytes are the tiny tokenizer's tokens)
CODE = [ids for ids in (list(p.text.encode()) for p in training_prompts(["python-stdlib", "sharegpt"], 0)) if len(ids) <= MAX_PROMPT][:2]


@pytest.fixture(scope="module")
def cyclic():
    """A tiny model whose greedy text cycles, and an EAGLE head trained on its own continuations."""
    lm = cyclic_tiny(0)
    cfg = train_cfg(data="self", corpora=["python-stdlib", "sharegpt"], tokens=96 * 24, new=24, epochs=6, lr=5e-3)  # lr 1e-2 spiked: a last-bit change of the kernels cost half the acceptance
    cfg.drafter = {"_target_": EAGLE}
    head, summary = train(cfg, lm)
    return lm, head, summary


def baseline_tokens(lm, prompt, n=30):
    return Engine(lm, NoDrafter(), GreedyVerifier(), SamplingParams()).generate(prompt, n, eos_token_ids=[]).tokens


@pytest.mark.parametrize("verifier", [GreedyVerifier(), TypicalVerifier(recover="greedy")])
def test_greedy_output_equals_the_baseline_with_an_untrained_head(target, verifier):
    torch.manual_seed(0)
    engine = Engine(target, EagleDrafter(target, k=3, head=EagleHead(target.model.config)), verifier, SamplingParams())
    for prompt in (REPEATING, PLAIN):
        out = engine.generate(prompt, 30, eos_token_ids=[])
        assert out.tokens == baseline_tokens(target, prompt)
        assert out.stats.drafted > 0 and out.stats.draft_forwards > 0


@pytest.mark.e2e  # trains a head (seconds of CPU each)
def test_the_head_learns_and_its_drafts_are_accepted(cyclic):
    lm, head, summary = cyclic
    assert summary["last_loss"] < summary["first_loss"] / 2
    assert summary["held_out_acc_head1"] > 0.5  # the cycle's next token, from the features
    for k in (1, 4):
        engine = Engine(lm, EagleDrafter(lm, k=k, head=head), GreedyVerifier(), SamplingParams())
        for prompt in CODE:  # what it learnt: the cycles its training prompts lead the model into
            out = engine.generate(prompt, 40, eos_token_ids=[])
            assert out.tokens == baseline_tokens(lm, prompt, 40)
            assert out.stats.accepted > out.stats.drafted / 2  # its own features carry it along the chain


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_batch_drafts_every_row_in_one_head_forward_per_token_or_level(cyclic, tree, temperature):
    """Each row of a batch drafts (and decodes) what it drafts alone with its seed, accepted
    drafts included, while the head runs once per drafted token or tree level for all rows."""
    lm, head, _ = cyclic
    engine = Engine(lm, EagleDrafter(lm, k=4, head=head, tree=tree, depth=4, nodes=8), RejectionVerifier(), SamplingParams(temperature=temperature))
    prompts = [*CODE, CODE[0][4:], CODE[1][7:]]  # the cycles the head learnt, from prompts of four lengths
    alone = [engine.generate(p, 24, eos_token_ids=[], seed=b) for b, p in enumerate(prompts)]
    calls = []
    hook = head.layer.register_forward_hook(lambda *_: calls.append(1))
    try:
        batch = engine.generate(prompts, 24, eos_token_ids=[], seed=list(range(len(prompts))))  # row b: what seed b gives alone
    finally:
        hook.remove()
    assert [(o.tokens, o.stats.accepted, o.stats.draft_forwards) for o in batch] == [(o.tokens, o.stats.accepted, o.stats.draft_forwards) for o in alone]
    assert sum(o.stats.accepted for o in batch) > sum(o.stats.drafted for o in batch) / 4  # the drafts land: their path is exercised
    forwards = [o.stats.draft_forwards for o in batch]
    assert max(forwards) <= len(calls) < sum(forwards)


@pytest.mark.parametrize("start", [0, 5])
def test_training_time_test_sees_what_drafting_sees(target, start):
    """Step l of `unroll` at row i is the head's guess after the target's features up to i - l and l
    steps of its own chain: the same numbers as feeding them one by one into a KV cache, as drafting does.
    In float64: the two reduce in different orders (one batched unroll, token-by-token replays), which in
    float32 differ by up to ~3e-4 with the thread count (the sums split over cores), not in float64."""
    torch.manual_seed(0)
    head = EagleHead(target.model.config).double().eval()
    t, h = 12, target.model.config.hidden_size
    features, embeds = torch.randn(t, h, dtype=torch.float64), torch.randn(t, h, dtype=torch.float64)
    with torch.no_grad():
        steps = unroll(head, embeds, features, 3, start)
        for l in range(3):
            rows = torch.arange(t)[chained(torch.arange(t), l, start)].tolist()
            assert rows == [i for i in range(t) if i >= l and (l == 0 or i - l + 1 >= start)]
            for i in rows:
                cache = DynamicCache(config=head.layer.config)
                f = head(embeds[None, : i - l + 1], features[None, : i - l + 1], cache)[0, -1]  # the real pairs, then the chain
                for j in range(i - l + 1, i + 1):
                    f = head(embeds[None, j : j + 1], f[None, None], cache)[0, -1]
                torch.testing.assert_close(steps[l][i], f, atol=1e-10, rtol=1e-10)
        assert not torch.allclose(steps[1][6], steps[0][6])  # its own feature is not the target's


def test_the_dynamic_tree_scores_each_node_after_its_path_drafted_as_a_chain(target):
    """EAGLE-2 over the head: a node's children are the head's top tokens after its path, the numbers
    a chain drafted along that path gives (the tree mask and positions are right)."""
    torch.manual_seed(0)
    head = EagleHead(target.model.config)
    prompt, hidden = torch.tensor(PLAIN + [5]), torch.randn(len(PLAIN), 64)
    tree, chain = (EagleDrafter(target, head=head, **kw) for kw in ({"tree": True, "topk": 3, "depth": 3, "nodes": 100}, {}))
    with torch.no_grad():  # as the engine drafts
        for drafter in (tree, chain):
            drafter.prefill(Context(prompt, SamplingParams(), None, 10, hidden=hidden))
        draft = tree.propose(Context(prompt, SamplingParams(), None, 10))
        tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
        assert len(tokens) == 3 + 9 + 9  # 3 children of the root, of the 3 best of each level
        for node in [-1, *range(len(tokens))]:
            children = {t for t, p in zip(tokens, parents) if p == node}
            if not children:
                continue
            path, i = [], node
            while i >= 0:
                path, i = [tokens[i], *path], parents[i]
            start, lengths = chain.draft.length, list(chain.draft.lengths)  # the one row's pairs in the head's slots
            f = chain.features[0]
            for x in path:
                f = chain._feed([f[None]], [torch.tensor([x])])[0][-1]
            chain.draft.crop_rows(start, lengths)
            assert children == set(torch.topk(chain.lm_head(f), 3).indices.tolist())


def test_a_shortlist_vocabulary_drafts_only_its_tokens(tmp_path, cyclic):
    lm, head, _ = cyclic
    drafter = EagleDrafter(lm, k=4, head=head, vocab=64, cache_dir=str(tmp_path))
    allowed = set(drafter.shortlist.ids.tolist())
    out = Engine(lm, drafter, GreedyVerifier(), SamplingParams()).generate(CODE[0], 30, eos_token_ids=[])
    assert out.tokens == baseline_tokens(lm, CODE[0]) and out.stats.accepted > 0
    sampling = SamplingParams(temperature=1.0)
    drafter.prefill(Context(torch.tensor(PLAIN + [5]), sampling, None, 10, hidden=torch.randn(len(PLAIN), 64)))
    draft = drafter.propose(Context(torch.tensor(PLAIN + [5]), sampling, torch.Generator().manual_seed(0), 4))  # the engine's k
    assert set(draft.tokens.tolist()) <= allowed and draft.q.shape == (4, 320)
    torch.testing.assert_close(draft.q.sum(-1), torch.ones(4))
    assert (draft.q[:, [t for t in range(320) if t not in allowed]] == 0).all()  # q: the law it drew from


@pytest.mark.e2e  # trains a head (seconds of CPU each)
def test_on_text_the_head_learns_the_targets_token_not_the_texts():
    """data=text: the head's label is the target's top-1 after the text's next token, not the text's own
    token after it (the cyclic model's top-1 follows its cycle, which python's text never does)."""
    lm = cyclic_tiny(0)
    cfg = train_cfg(data="text", corpora=["python-stdlib"], tokens=64 * 60, seq_len=64, epochs=6, lr=1e-2)
    cfg.drafter = {"_target_": EAGLE}
    _, summary = train(cfg, lm)
    assert summary["held_out_acc_head1"] > 0.6  # the text's own next byte: well under 0.1


@pytest.mark.e2e  # trains a head (seconds of CPU each)
def test_a_training_shortlist_counts_a_label_outside_it_as_a_miss(cyclic, tmp_path):
    """train.vocab: the token loss runs over the shortlist only; the reported agreement is still over
    every label, so it cannot exceed the share of labels the shortlist holds, and it learns within it.
    The shortlist's token counts go to the target's own model cache (model.cache_dir)."""
    lm = dataclasses.replace(cyclic[0], cache_dir=str(tmp_path))
    cfg = train_cfg(data="self", corpora=["python-stdlib", "sharegpt"], tokens=96 * 24, new=24, epochs=6, lr=1e-2,
                    vocab=64, vocab_corpus="python-stdlib")
    cfg.drafter = {"_target_": EAGLE}
    _, summary = train(cfg, lm)
    cache, _, _ = build_cache(lm, cfg.train)
    shortlist = Shortlist.load(lm.model.get_output_embeddings(), lm.tokenizer, 64, "python-stdlib", None)
    labels = cache.labels[:, 0][(cache.labels[:, 0] >= 0) & cache.held_out]  # every held-out label
    inside = torch.isin(labels, shortlist.ids).float().mean().item()
    assert 0.1 < inside < 0.9  # the cycles lead out of the shortlist as well as through it
    assert inside / 3 < summary["held_out_acc_head1"] <= inside
    assert list((tmp_path / "vocab").glob("token-counts-python-stdlib-*.json"))


@pytest.mark.parametrize("which", ["untrained", "trained"])
def test_rejection_sampling_with_eagle_follows_the_target(target, cyclic, which):
    lm, head = (target, EagleHead(target.model.config)) if which == "untrained" else cyclic[:2]
    engine = Engine(lm, EagleDrafter(lm, k=3, head=head), RejectionVerifier(), SamplingParams(temperature=1.0))
    report = equivalence_report(engine, REPEATING, seed=90)
    assert not report.reject, report.format()


def test_checkpoint_round_trip_and_missing_checkpoint(tmp_path, target, capsys):
    torch.manual_seed(1)
    head = EagleHead(target.model.config)
    path = eagle_path("tiny", tmp_path)
    head.save(path, {"target": "tiny"})
    loaded, meta = EagleHead.load(path, target.model.config)
    e, f = torch.randn(1, 5, 64), torch.randn(1, 5, 64)
    torch.testing.assert_close(loaded(e, f), head(e, f))
    assert meta["target"] == "tiny"
    capsys.readouterr()
    unrecorded = EagleDrafter(target, cache_dir=str(tmp_path))  # weights that do not say what trained them
    assert unrecorded.head is not None and unrecorded.trained_on == {"checkpoint": str(path)}
    assert "warning: the eagle weights at" in capsys.readouterr().err
    with pytest.raises(SpecResearchError, match="python -m specresearch.train drafter=eagle model.name=tiny"):
        EagleDrafter(target, cache_dir=str(tmp_path / "empty"))
    head.save(tmp_path / "other.safetensors", {"target": "another-model"})
    with pytest.raises(SpecResearchError, match="trained for another-model, not tiny"):
        EagleDrafter(target, checkpoint=str(tmp_path / "other.safetensors"))
    with pytest.raises(SpecResearchError, match="k must be >= 1"):
        EagleDrafter(target, k=0, cache_dir=str(tmp_path))
    with pytest.raises(SpecResearchError, match="set drafter.tree=true"):
        EagleDrafter(target, shape="auto", cache_dir=str(tmp_path))
    with pytest.raises(SpecResearchError, match="use drafter.children=top"):
        EagleDrafter(target, tree=True, children="sample", shape="auto", cache_dir=str(tmp_path))


def test_only_trainable_drafters_are_accepted():
    cfg = train_cfg()
    cfg.drafter = {"_target_": "specresearch.drafters.pld.PromptLookupDrafter"}
    with pytest.raises(SpecResearchError, match="trains drafters eagle, medusa: use drafter=eagle or drafter=medusa"):
        check_training(cfg)


@pytest.mark.e2e  # trains a head (seconds of CPU each)
def test_training_goes_on_from_a_head(tmp_path, cyclic):
    """train.init: a second run starts from the trained head's loss, not a fresh head's."""
    lm, head, summary = cyclic
    head.save(tmp_path / "head.safetensors", {"target": "tiny"})
    cfg = train_cfg(data="self", corpora=["python-stdlib", "sharegpt"], tokens=96 * 24, new=24, epochs=1, lr=1e-4,
                    init=str(tmp_path / "head.safetensors"))
    cfg.drafter = {"_target_": EAGLE}
    _, again = train(cfg, lm)
    assert again["first_loss"] < summary["first_loss"] / 10
    assert again["held_out_acc_head1"] >= summary["held_out_acc_head1"] - 0.05


@pytest.mark.parametrize("bad, message", [
    ({"vocab": 0}, "train.vocab must be null or a number of tokens >= 1"),
    ({"vocab": 64, "vocab_corpus": "humaneval"}, "unknown train.vocab_corpus 'humaneval': valid are python-stdlib, sharegpt, mtbench"),
    ({"init": "/nowhere/head.safetensors"}, "train.init: no head at /nowhere/head.safetensors"),
])
def test_bad_training_settings_are_refused(bad, message):
    cfg = train_cfg(**bad)
    cfg.drafter = {"_target_": EAGLE}
    with pytest.raises(SpecResearchError, match=message):
        check_training(cfg)


@pytest.mark.parametrize("damage, error", [
    (lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]), "{path} is not a whole safetensors file ("),
    (lambda path: path.write_bytes(path.read_bytes()[:5]), "{path} is not a whole safetensors file ("),
    (lambda path: path.write_bytes(b""), "{path} is not a whole safetensors file ("),
    (lambda path: path.with_suffix(".json").unlink(), "the eagle checkpoint {path} has no head.json beside it"),
    (lambda path: path.with_suffix(".json").write_text("{"), "{json} (beside the eagle checkpoint) is not readable JSON ("),
])
def test_a_cut_or_damaged_checkpoint_is_one_line_naming_the_file_and_what_to_do(tmp_path, target, damage, error):
    path = tmp_path / "head.safetensors"
    EagleHead(target.model.config).save(path, {"target": "tiny"})
    damage(path)
    with pytest.raises(SpecResearchError) as err:
        EagleDrafter(target, checkpoint=str(path))
    msg = str(err.value)
    assert msg.startswith(error.format(path=path, json=path.with_suffix(".json"))) and "\n" not in msg, msg
    assert "python -m specresearch.train drafter=eagle" in msg


def test_a_head_saved_for_another_shape_is_refused_naming_the_mismatch(tmp_path, target):
    path = tmp_path / "head.safetensors"
    EagleHead(tiny_model(hidden_size=32).model.config).save(path, {"target": "tiny"})  # same name, narrower model
    with pytest.raises(SpecResearchError) as err:
        EagleDrafter(target, checkpoint=str(path))
    msg = str(err.value)
    assert msg.startswith(f"the weights in {path} do not fit the eagle module") and "size mismatch" in msg and "\n" not in msg
