"""Medusa: heads train on a tiny model's own predictions (the loss falls), checkpoints round-trip
and record the prompts that trained them, a run on those prompts is refused, decoding with
untrained heads keeps greedy identity and the target's law at T = 1 (tiny model; the training
command end to end: test_train.py)."""

import ast
import hashlib
import itertools
import json
import math
import random
import subprocess
import sys

import pytest
import torch

from specresearch.data import load_prompts, prompt_record, stdlib_prompts
from specresearch.drafters import Context, MedusaDrafter, NoDrafter, checkpoints
from specresearch.drafters.medusa import DEFAULT_CHOICES, BranchRate, MedusaHeads, best_choices, checkpoint_path, sized_choices
from specresearch.drafters.ngram import lookup, match_rows
from specresearch.drafters.tree import Sizer
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM, interpolated
from specresearch.kv import costs as target_module
from specresearch.measure import run, trained_on_tags
from specresearch.models import load_model
from specresearch.train import (
    MAX_HEADS,
    SHARD,
    build_cache,
    check_training,
    generate_batch,
    self_cache,
    text_cache,
    train,
    training_prompts,
    training_texts,
)
from specresearch.types import SamplingParams, node_depths
from specresearch.verifiers import GreedyVerifier, MarginVerifier, RejectionVerifier, TypicalVerifier
from specresearch.vocab import Shortlist
from tests.helpers import make_cfg, train_cfg
from tests.tiny import PLAIN, REPEATING, cyclic_tiny, equivalence_report, tiny_model


def noisy_heads(seed: int = 0, heads: int = 4) -> MedusaHeads:
    """Untrained heads with random blocks: they propose something other than the lm head's top tokens."""
    module = MedusaHeads(64, heads)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return module


def test_text_cache_labels_are_the_targets_top1_on_the_text(target):
    text = target.tokenizer.encode("def f(x):\n    return x + 1\n" * 4, add_special_tokens=False)
    cache = text_cache(target, [text], tokens=60, seq_len=30, heads=2, held_out=0.5)
    assert cache.hidden.shape == (60, 64) and cache.labels.shape == (60, 2)
    ids = torch.tensor(text[:30])
    with torch.no_grad():
        top1 = target.model(ids[None]).logits[0].argmax(-1)  # [30]
    assert cache.labels[:28, 0].tolist() == top1[1:29].tolist()  # head 1 at t: the target's guess for t + 2
    assert cache.labels[:27, 1].tolist() == top1[2:29].tolist()
    assert (cache.labels[29:30, 0] == -100).all() and (cache.labels[28:30, 1] == -100).all()  # past the chunk's end
    assert cache.held_out.tolist() == [False] * 30 + [True] * 30
    assert cache.tokens[:29].tolist() == ids[1:].tolist() and cache.tokens[29] == -100 and cache.seq.tolist() == [0] * 30 + [1] * 30


def test_batched_continuations_are_the_targets_own_greedy_text(target):
    """Left padding and per-row positions: each row continues exactly as the target alone would."""
    prompts = [[5, 6, 7], list(PLAIN) + [9, 9, 9, 40], [1]]
    tokens, hidden = generate_batch(target, prompts, 12)  # [3, 12], [3, 12, 64]
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    lm_head = target.model.get_output_embeddings()
    for prompt, row, h in zip(prompts, tokens, hidden):
        assert row.tolist() == baseline.generate(prompt, 12, eos_token_ids=[]).tokens
        with torch.no_grad():
            assert lm_head(h).argmax(-1).tolist() == row.tolist()  # each hidden state produced its token
    sampled, _ = generate_batch(target, prompts, 12, temperature=1.0, gen=torch.Generator().manual_seed(0))
    assert not torch.equal(sampled, tokens)


def test_self_cache_labels_are_the_generated_tokens_after_the_next(target):
    prompts = [[5, 6, 7], list(PLAIN), [1], [9, 8]]
    cache = self_cache(target, prompts, tokens=4 * 10, new=10, heads=3, held_out=0.25, batch=3)
    sizes = [len(p) - 1 + 10 for p in prompts]  # a prompt's positions before its last, then the 10 that produced tokens
    assert cache.hidden.shape == (sum(sizes), 64) and cache.labels.shape == (sum(sizes), 3)
    assert cache.seq.tolist() == [i for i, n in enumerate(sizes) for _ in range(n)]
    tokens, hidden = generate_batch(target, prompts, 10)
    gen = ~cache.prompt
    torch.testing.assert_close(cache.hidden[gen], hidden.flatten(0, 1), rtol=1e-4, atol=1e-4)  # in prompt order, though batched by
    # length (batches of other widths take other kernels: fp32 rounding, not a wrong row)
    assert torch.equal(cache.tokens[gen], tokens.flatten())
    start = 0
    for i, p in enumerate(prompts):
        rows = slice(start, start + sizes[i])
        assert cache.prompt[rows].tolist() == [True] * (len(p) - 1) + [False] * 10
        assert cache.tokens[rows].tolist() == p[1:] + tokens[i].tolist()  # the token after each position
        if len(p) > 1:  # a prompt's own features, as the target alone computes them
            reader = CachedLM(target)
            reader.keep_hidden = True
            reader.reset()
            reader.prefill_rows([torch.tensor(p)])  # the hidden states of every prompt token
            torch.testing.assert_close(cache.hidden[rows][: len(p) - 1], reader.hidden[:-1], atol=1e-4, rtol=1e-4)
        lab = cache.labels[rows][len(p) - 1 :]
        assert (cache.labels[rows][: len(p) - 1] == -100).all()  # no head learns from a prompt's positions
        for k in range(3):
            assert lab[: 9 - k, k].tolist() == tokens[i, 1 + k :].tolist()  # head k at t: token t + 2 + k
            assert (lab[9 - k :, k] == -100).all()
        assert cache.held_out[rows].tolist() == [i == 3] * sizes[i]  # the last prompt is held out
        start += sizes[i]


def test_self_cache_stops_at_eos():
    lm = cyclic_tiny(0)  # its own model and tokenizer: the EOS can be changed
    tokens, _ = generate_batch(lm, [[10, 11]], 8)
    lm.tokenizer.eos_token_id = int(tokens[0, 3])  # the fourth new token ends the text (a cycle of 5: no repeat before)
    cache = self_cache(lm, [[10, 11]], tokens=8, new=8, heads=2, held_out=0.0)
    assert cache.labels.shape == (1 + 4, 2)  # the prompt's first token, then the positions that produced tokens 1..4 (the EOS)
    assert cache.labels[1:, 0].tolist() == tokens[0, 1:4].tolist() + [-100]
    assert cache.labels[1:, 1].tolist() == tokens[0, 2:4].tolist() + [-100, -100]


def test_function_prompts_stop_after_the_docstring():
    prompts = stdlib_prompts()
    assert len(prompts) > 500 and len({p.id for p in prompts}) == len(prompts)
    assert "stdlib/difflib.get_close_matches" in {p.id for p in prompts}  # named as the stdlib_doctest task names it
    for p in prompts[:200]:
        tree = ast.parse(p.text + "    pass\n")  # the def and its docstring, nothing after
        fn = tree.body[0]
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(fn)
        assert len(fn.body) == 2


def test_text_data_is_kept_in_chunks_that_more_tokens_extend(tmp_path, target, monkeypatch):
    """data=text: whole groups of SHARD chunks go to disk as computed; asking for more tokens of the same
    text computes only the chunks it adds, and the data equals the data computed without the disk."""
    text = [target.tokenizer.encode(p.text, add_special_tokens=False) for p in training_prompts(["python-stdlib"], 0, files=True)[:3]]
    seq = 16
    forwards = []
    real = CachedLM.forward_rows
    monkeypatch.setattr(CachedLM, "forward_rows", lambda self, *a, **k: forwards.append(1) or real(self, *a, **k))
    small = text_cache(target, text, 2 * SHARD * seq, seq, 3, 0.1, tmp_path)
    assert len(forwards) == 2 * SHARD and len(list(tmp_path.glob("chunks-*.safetensors"))) == 2
    forwards.clear()
    large = text_cache(target, text, 3 * SHARD * seq + 7, seq, 3, 0.1, tmp_path)
    assert len(forwards) == SHARD + 1  # the third group and the part chunk after it: the first two come from disk
    assert len(list(tmp_path.glob("chunks-*.safetensors"))) == 3  # a part group is not kept
    fresh = text_cache(target, text, 3 * SHARD * seq + 7, seq, 3, 0.1)
    for name in ("labels", "held_out", "tokens", "seq", "prompt"):
        assert torch.equal(getattr(large, name), getattr(fresh, name)), name
    torch.testing.assert_close(large.hidden, fresh.hidden)
    torch.testing.assert_close(large.hidden[: small.hidden.shape[0]], small.hidden)
    assert large.held_out.sum() > 0 and not large.held_out[: 2 * SHARD * seq].any()

    cfg = train_cfg(data="text", tokens=SHARD * seq, seq_len=seq, cache=True).train
    _, path, record = build_cache(target, cfg, str(tmp_path / "models"))
    assert path.is_dir() and json.loads((path / "spec.json").read_text())["seq_len"] == seq and record["prompts"] >= 1


def test_text_data_reads_chat_answers_and_mixes_the_corpora_by_tokens(target):
    """data=text: a ShareGPT text is the first turn with the answer it got, through the chat template;
    each next text comes from the corpus read least so far, so both give about equal tokens."""
    used, texts = training_texts(target.tokenizer, ["python-stdlib", "sharegpt"], 0, 200_000)
    assert sum(map(len, texts)) >= 200_000 and len(used) == len(texts)
    read = {"python-stdlib": 0, "sharegpt": 0}
    for p, ids in zip(used, texts):
        assert p.meta["corpus"] == min(read, key=read.__getitem__)  # the corpus behind (ties: the first)
        read[p.meta["corpus"]] += len(ids)
        if p.meta["corpus"] == "sharegpt":
            assert p.meta["reply"] and ids == target.tokenizer.encode(p.text + p.meta["reply"])  # the tiny template joins the turns
    longest = max(map(len, texts))
    assert abs(read["python-stdlib"] - read["sharegpt"]) <= longest and min(read.values()) > 0
    few, _ = training_texts(target.tokenizer, ["python-stdlib", "sharegpt"], 0, 1000)
    assert [p.id for p in few] == [p.id for p in used[: len(few)]]  # more tokens read on: the same texts first


def test_data_is_cached_once_and_reused_for_other_heads(tmp_path, target, monkeypatch):
    cfg = train_cfg(data="self", tokens=64, new=16, cache=True, heads=2)
    first, path, record = build_cache(target, cfg.train, str(tmp_path))
    assert path is not None and path.is_file() and first.labels.shape[1] == 2
    assert record["prompts"] == 4 == len(record["ids"])  # tokens / new prompts

    def boom(*a, **k):
        raise AssertionError("the data should come from the cache")

    monkeypatch.setattr("specresearch.train.self_cache", boom)
    again, same, same_record = build_cache(target, train_cfg(data="self", tokens=64, new=16, cache=True, heads=3, lr=1.0).train, str(tmp_path))
    assert same == path and again.labels.shape[1] == 3 and same_record == record  # the record is kept beside the data
    torch.testing.assert_close(again.hidden, first.hidden)
    assert torch.equal(again.labels[:, :2], first.labels)
    with pytest.raises(AssertionError, match="from the cache"):
        build_cache(target, train_cfg(data="self", tokens=64, new=8, cache=True).train, str(tmp_path))  # other data
    with pytest.raises(SpecResearchError, match=f"at most {MAX_HEADS}"):
        build_cache(target, train_cfg(heads=MAX_HEADS + 1).train, str(tmp_path))


@pytest.mark.parametrize("data", ["self", "text"])
def test_held_out_agreement_is_reported_per_corpus(tmp_path, target, data):
    """Held-out data of two corpora: each position knows its corpus, and each corpus's rates are those
    of its own positions (the pooled rate is their mean weighted by positions)."""
    cfg = train_cfg(data=data, tokens=1024, new=16, seq_len=32, held_out=0.5, heads=2, epochs=1, corpora=["python-stdlib", "sharegpt"])
    cache, _, record = build_cache(target, cfg.train, str(tmp_path))
    chat = [i for i in record["ids"] if i.startswith("sharegpt/")]
    assert chat and len(chat) < record["prompts"]  # both corpora made the data
    assert set(cache.source.unique().tolist()) == {0, 1}
    if data == "self":  # a prompt's positions all carry its corpus, and as many prompts are chat as the record says
        firsts = torch.cat([torch.tensor([True]), cache.seq[1:] != cache.seq[:-1]])  # [N] each prompt's first position
        assert torch.equal(cache.source, cache.source[firsts][cache.seq]) and int(cache.source[firsts].sum()) == len(chat)
    masks = cache.held_out_by_corpus(list(cfg.train.corpora))
    assert set(masks) == {"python-stdlib", "sharegpt"} and torch.equal(masks["python-stdlib"] | masks["sharegpt"], cache.held_out)
    _, summary = MedusaDrafter.fit(cfg.train, target, cache)
    for head in range(2):
        labelled = {c: int((m & (cache.labels[:, head] >= 0)).sum()) for c, m in masks.items()}
        pooled = sum(summary[f"held_out_acc_head{head + 1}_{c}"] * n for c, n in labelled.items()) / sum(labelled.values())
        assert summary[f"held_out_acc_head{head + 1}"] == pytest.approx(pooled)
    one = train_cfg(data=data, tokens=1024, new=16, seq_len=32, held_out=0.5, heads=2, corpora=["python-stdlib"])
    assert build_cache(target, one.train, str(tmp_path))[0].held_out_by_corpus(["python-stdlib"]) == {}  # one corpus: the pooled rate says it all


@pytest.mark.parametrize("bad, match", [({"data": "web"}, "valid are self, text"), ({"corpora": ["wiki"]}, "valid are python-stdlib, sharegpt"),
                                        ({"corpora": ["mtbench"]}, "evaluation only"), ({"corpora": ["python-stdlib", "humaneval"]}, "evaluation only"),
                                        ({"new": 0}, "must be >= 1"), ({"temperature": -1.0}, "temperature >= 0"),
                                        ({"ttt": 0}, "epochs and ttt must be >= 1"), ({"noise": -0.1}, "noise >= 0"),
                                        ({"token_loss": -1.0}, "token_loss >= 0"), ({"feature_loss": -1.0}, "feature_loss >= 0"),
                                        ({"token_loss": 0.0, "feature_loss": 0.0}, "not both 0")])
def test_bad_training_settings_are_refused(bad, match):
    cfg = train_cfg(**bad)
    with pytest.raises(SpecResearchError, match=match):
        check_training(cfg)


def test_heads_learn_the_targets_own_text(target):
    heads, summary = train(train_cfg(data="self", corpora=["python-stdlib", "sharegpt"], tokens=640, new=32, epochs=4), target)
    assert summary["last_loss"] < summary["first_loss"] - 0.5
    assert 0 < summary["held_out_positions"] < summary["positions"] <= 640  # texts end at an EOS
    record = summary["trained_on"]  # the 640 / 32 prompts continued, held-out ones included
    assert record["sources"] == ["python-stdlib", "sharegpt"] and record["split"] == "train" and record["prompts"] == 20 == len(record["ids"])
    assert {i.split("/")[0] for i in record["ids"]} == {"stdlib", "sharegpt"}


def test_heads_learn_the_targets_predictions(target):
    heads, summary = train(train_cfg(), target)
    assert summary["last_loss"] < summary["first_loss"] - 0.5
    assert summary["held_out_positions"] > 0 and 0 <= summary["held_out_acc_head1"] <= 1
    assert 0 <= summary["train_acc_head2"] <= 1  # the same measure on as many training positions
    assert summary["steps"] == 3 * summary["train_positions"] // 32


def test_heads_trained_on_a_shortlist_count_labels_off_it_as_misses_and_decode_with_it(tmp_path, target, monkeypatch):
    """train.vocab: the heads learn over the shortlist's rows only; their reported held-out agreement is
    that of their shortlisted top-1 with the target's own token (a label off the list: a miss), and a
    drafter built on the checkpoint scores that shortlist without being told (drafter.vocab=null)."""
    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path / "cache"))  # the token counts
    cfg = train_cfg(vocab=40, vocab_corpus="python-stdlib", heads=2, epochs=2)
    cache, _, _ = build_cache(target, cfg.train)
    heads, summary = MedusaDrafter.fit(cfg.train, target, cache)
    shortlist = Shortlist.load(target.model.get_output_embeddings(), target.tokenizer, 40, "python-stdlib", None)
    labels = cache.labels[cache.held_out]  # [N, 2]
    assert 0 < int(torch.isin(labels[:, 0], shortlist.ids, invert=True).sum()) < int((labels[:, 0] >= 0).sum())  # some off the list
    with torch.no_grad():
        top = shortlist.ids[heads(cache.hidden[cache.held_out], shortlist.head).argmax(-1)]  # [2, N] token ids
    for head in range(2):
        valid = labels[:, head] >= 0
        assert summary[f"held_out_acc_head{head + 1}"] == pytest.approx(float((top[head][valid] == labels[valid, head]).float().mean()))
    path = tmp_path / "heads.safetensors"
    heads.save(path, {"target": "tiny", "train": {"vocab": 40, "vocab_corpus": "python-stdlib"}, "rank_acc": summary["rank_acc"]})
    drafter = MedusaDrafter(target, checkpoint=str(path))
    assert drafter.shortlist is not None and torch.equal(drafter.shortlist.ids, shortlist.ids)
    assert MedusaDrafter(target, checkpoint=str(path), vocab=60).shortlist.ids.numel() == 60  # asked for: as asked
    with pytest.raises(SpecResearchError, match="not with train.own_lm_head=true"):
        MedusaDrafter.fit(train_cfg(vocab=40, own_lm_head=True).train, target, cache)


def test_heads_with_their_own_lm_heads_train_and_round_trip(tmp_path, target):
    heads, summary = train(train_cfg(own_lm_head=True, epochs=2), target)
    assert summary["last_loss"] < summary["first_loss"]
    lm_head = target.model.get_output_embeddings()
    assert not torch.equal(heads.lm_heads[0].weight, lm_head.weight)  # trained away from the copy
    heads.save(tmp_path / "own.safetensors", {"target": "tiny"})
    loaded, _ = MedusaHeads.load(tmp_path / "own.safetensors")
    h = torch.randn(2, 64)
    torch.testing.assert_close(loaded(h, lm_head), heads(h, lm_head))


def test_checkpoint_round_trip_and_missing_checkpoint(tmp_path, target):
    heads = noisy_heads()
    path = checkpoint_path("tiny", tmp_path)
    heads.save(path, {"target": "tiny"})
    loaded, meta = MedusaHeads.load(path)
    h = torch.randn(3, 64)
    lm_head = target.model.get_output_embeddings()
    torch.testing.assert_close(loaded(h, lm_head), heads(h, lm_head))
    assert meta["target"] == "tiny" and meta["heads"] == 4
    assert MedusaDrafter(target, cache_dir=str(tmp_path)).heads.config == heads.config
    with pytest.raises(SpecResearchError, match="python -m specresearch.train drafter=medusa model.name=tiny"):
        MedusaDrafter(target, cache_dir=str(tmp_path / "empty"))


def test_shipped_heads_load_when_none_were_trained_here(tmp_path, target, monkeypatch):
    """Heads shipped in the package (specresearch/weights/medusa/<target>/) serve when the cache has none;
    heads trained here win over them."""
    monkeypatch.setattr(checkpoints, "SHIPPED", tmp_path / "weights")
    shipped, trained = noisy_heads(seed=1, heads=3), noisy_heads(seed=2, heads=4)
    shipped.save(tmp_path / "weights" / "medusa" / "tiny" / "heads.safetensors", {"target": "tiny"})
    assert MedusaDrafter(target, cache_dir=str(tmp_path / "cache")).heads.config == shipped.config
    trained.save(checkpoint_path("tiny", tmp_path / "cache"), {"target": "tiny"})
    assert MedusaDrafter(target, cache_dir=str(tmp_path / "cache")).heads.config == trained.config


def test_medusa_choices_must_form_a_tree_its_heads_can_draft_and_each_node_is_its_heads_ranked_token(target):
    drafter = MedusaDrafter(target, heads=noisy_heads(), choices=[[0], [1], [0, 0], [0, 1], [0, 0, 0]], lookup=0)
    assert drafter.depth == 3 and drafter.k == 0  # k (draft tokens per step) has no meaning for a tree
    with pytest.raises(SpecResearchError, match="missing"):
        MedusaDrafter(target, heads=noisy_heads(), choices=[[0], [1, 0]])
    with pytest.raises(SpecResearchError, match="heads"):
        MedusaDrafter(target, heads=noisy_heads(heads=2), choices=[[0], [0, 0], [0, 0, 0]])
    default = MedusaDrafter(target, heads=noisy_heads(), lookup=0)  # the heads' tree alone
    ctx = Context(torch.tensor(PLAIN), SamplingParams(), None, 100, hidden=torch.randn(1, 64))
    draft = default.propose(ctx)
    assert len(draft) == len(DEFAULT_CHOICES) == 8 and draft.depth == 3 and draft.q is None
    logits = default.heads(ctx.hidden[-1], target.model.get_output_embeddings())  # [K, V]
    for c, token, parent in zip(default.choices, draft.tokens.tolist(), draft.parents.tolist()):
        assert token == int(logits[len(c) - 1].topk(c[-1] + 1).indices[c[-1]])  # head d's token of rank c[-1]
        assert parent == (default.choices.index(c[:-1]) if len(c) > 1 else -1)
    short = default.propose(Context(ctx.tokens, ctx.sampling, None, 1, hidden=ctx.hidden))
    assert short.depth == 1 and node_depths(short.parents) == [1, 1]


def test_lookup_is_a_branch_of_the_heads_tree_sharing_their_nodes(target):
    """drafter.lookup: the heads' tree unchanged, then prompt lookup's continuation from the root,
    along the heads' nodes while they hold its tokens and on as new nodes below (no two siblings
    alike), deeper than the heads reach; refused with sampled children."""
    heads = noisy_heads()
    plain, branched = MedusaDrafter(target, heads=heads, shape=None, lookup=0), MedusaDrafter(target, heads=heads, shape=None, lookup=6)
    assert branched.depth == 6 and plain.depth == 3
    hidden = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    first = int(plain.heads(hidden[-1], target.model.get_output_embeddings())[0].argmax())  # the heads' rank-0 token at depth 1
    for prompt in (REPEATING, [7, 8, first, 9, 10, 11, 12, 13, 7, 8]):  # the second's continuation starts with the heads' token
        ctx = Context(torch.tensor(prompt), SamplingParams(), None, 100, hidden=hidden)
        guess = lookup(ctx.tokens, 6, match="last").tolist()
        heads_only, draft = plain.propose(ctx), branched.propose(ctx)
        n = len(heads_only)
        assert torch.equal(draft.tokens[:n], heads_only.tokens) and torch.equal(draft.parents[:n], heads_only.parents)
        node, path = -1, []
        for token in guess:  # the guess is a path from the root
            node = next(i for i, (t, a) in enumerate(zip(draft.tokens.tolist(), draft.parents.tolist())) if a == node and t == token)
            path.append(node)
        pairs = list(zip(draft.parents.tolist(), draft.tokens.tolist()))
        assert len(set(pairs)) == len(pairs) and len(draft) == n + sum(i >= n for i in path)  # merged: no node twice
        assert draft.depth == len(guess) > 3 and draft.q is None
    assert path[0] < n  # the second prompt's guess went through the heads' node
    short = branched.propose(Context(ctx.tokens, ctx.sampling, None, 2, hidden=hidden))
    assert short.depth == 2  # within the step's room, as the heads' paths
    with pytest.raises(SpecResearchError, match="children=top"):
        MedusaDrafter(target, heads=heads, lookup=4, children="sample")


def test_shape_auto_keeps_the_lookup_branch_while_its_measured_acceptance_pays(target, monkeypatch):
    """With shape=auto the branch's new nodes are kept while (τ̂ + their chances of being kept) / v(m)
    grows: its first three at the prior (kept 1/2, 1/4, 1/8, 1/16 ... against 0.1 a node of cost here),
    its first tokens only once only they are kept, all of it once it is kept whole, none once branches
    after the same n-gram were offered and never kept; what branches after another n-gram did leaves it
    alone."""
    monkeypatch.setattr(Sizer, "measure", classmethod(lambda cls, target, most: Sizer(lambda m: 1 + 0.1 * (m - 1), 1.0)))
    heads = noisy_heads()
    drafter = MedusaDrafter(target, heads=heads, lookup=5)
    ctx = Context(torch.tensor(REPEATING), SamplingParams(), None, 100, hidden=torch.randn(1, 64, generator=torch.Generator().manual_seed(0)))
    n = match_rows([ctx.tokens], [5], match="last")[1][0]
    assert n == 3
    heads_only = MedusaDrafter(target, heads=heads, shape=None, lookup=0).propose(ctx)
    assert len(drafter.propose(ctx)) == len(heads_only) + 3
    for _ in range(40):
        drafter.rate.update(5, 2, n)  # the first two tokens always kept, the third never
    assert len(drafter.propose(ctx)) == len(heads_only) + 2
    drafter = MedusaDrafter(target, heads=heads, lookup=5)
    for _ in range(40):
        drafter.rate.update(5, 0, 1)  # after a 1-gram: never kept
    assert len(drafter.propose(ctx)) == len(heads_only) + 3  # after this 3-gram: the prior still
    for _ in range(40):
        drafter.rate.update(5, 5, n)  # kept whole
    assert len(drafter.propose(ctx)) == len(heads_only) + 5
    drafter = MedusaDrafter(target, heads=heads, lookup=5)
    for _ in range(40):
        drafter.rate.update(5, 0, n)  # 1/42 a node: below the 0.56 x 0.1 its cost takes from the speedup
    assert torch.equal(drafter.propose(ctx).tokens, heads_only.tokens)


def test_branch_rates_are_conditional_per_depth_and_per_match_length():
    """A step that rejected the branch's first token (or offered only its first tokens) says nothing of
    the deeper ones: each depth's rate counts only the steps that reached it, so early misses do not
    cut the branch for good; the chance of keeping the first i is the product of the rates up to i."""
    rate = BranchRate(4)
    assert rate.probs(4, 3) == pytest.approx([1 / 2, 1 / 4, 1 / 8, 1 / 16])  # Laplace's prior
    for _ in range(10):
        rate.update(4, 0, 1)  # after a 1-gram, rejected at once
    assert rate.probs(4, 1) == pytest.approx([1 / 12, 1 / 24, 1 / 48, 1 / 96])
    assert rate.probs(4, 3) == pytest.approx([1 / 2, 1 / 4, 1 / 8, 1 / 16])  # other matches untouched
    for _ in range(2):
        rate.update(4, 4, 1)  # kept whole
    rate.update(2, 2, 1)  # offered two, kept both: says nothing of depths 2, 3
    first = 4 / 15
    assert rate.probs(4, 1) == pytest.approx([first, first * 4 / 5, first * 4 / 5 * 3 / 4, first * 4 / 5 * 3 / 4 * 3 / 4])


def test_lookup_in_the_tree_accepts_past_the_heads_and_stays_greedy_exact(monkeypatch):
    """On a model whose text repeats, the lookup branch (sized by shape=auto on a fixed cost curve)
    carries steps past the heads' depth (what the heads alone cannot reach) and the output is plain
    greedy decoding's."""
    monkeypatch.setattr(Sizer, "measure", classmethod(lambda cls, target, most: Sizer(lambda m: 1 + 0.1 * (m - 1), 1.0)))
    lm = cyclic_tiny(0)
    baseline = Engine(lm, NoDrafter(), GreedyVerifier(), SamplingParams()).generate(PLAIN, 40, eos_token_ids=[])
    deepest = {}
    for lookup_n in (0, 6):
        drafter = MedusaDrafter(lm, heads=MedusaHeads(64, 3), lookup=lookup_n)
        out = Engine(lm, drafter, GreedyVerifier(), SamplingParams()).generate(PLAIN, 40, eos_token_ids=[])
        assert out.tokens == baseline.tokens
        deepest[lookup_n] = len(out.stats.accepted_at) - out.stats.accepted_at[::-1].count(0)
    assert deepest[0] <= 3 < deepest[6]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_best_choices_are_the_likeliest_paths(seed):
    """Against brute force: every path of ranks, scored by the product of its heads' hit rates."""
    gen = torch.Generator().manual_seed(seed)
    rank_acc = (torch.rand(3, 4, generator=gen) / 2).tolist()
    every = [p for d in (1, 2, 3) for p in itertools.product(range(4), repeat=d)]
    prob = {p: math.prod(rank_acc[d][r] for d, r in enumerate(p)) for p in every}
    for nodes in (1, 5, 16, 40):
        tree = best_choices(rank_acc, nodes)
        assert len(tree) == nodes == len(set(tree))
        assert all(p[:-1] in tree for p in tree if len(p) > 1)  # parents included
        kth = sorted(prob.values(), reverse=True)[nodes - 1]
        assert min(prob[p] for p in tree) == pytest.approx(kth)  # no left-out path is likelier
    assert best_choices([[0.6, 0.2], [0.5, 0.1], [0.4, 0.1]], 4) == [(0,), (0, 0), (1,), (0, 0, 0)]


def test_the_default_tree_comes_from_the_checkpoints_accuracies(tmp_path, target):
    path = tmp_path / "heads.safetensors"
    rank_acc = [[0.5, 0.2, 0.1], [0.3, 0.1, 0.05], [0.2, 0.1, 0.0], [0.1, 0.0, 0.0]]
    noisy_heads().save(path, {"target": "tiny", "rank_acc": rank_acc})
    drafter = MedusaDrafter(target, checkpoint=str(path), nodes=6, shape=None)  # shape=null: the `nodes` likeliest paths
    assert sorted(drafter.choices) == sorted(best_choices(rank_acc, 6))
    assert MedusaDrafter(target, checkpoint=str(path), choices=[[0], [0, 0]]).choices == [(0,), (0, 0)]  # explicit wins
    with pytest.raises(SpecResearchError, match="nodes must be >= 1"):
        MedusaDrafter(target, checkpoint=str(path), nodes=0)


@pytest.mark.parametrize("verifier", [GreedyVerifier(), TypicalVerifier(recover="greedy"), MarginVerifier(recover="greedy")])
@pytest.mark.parametrize("model", ["random", "cyclic"])
def test_greedy_output_equals_the_baseline_with_untrained_heads(target, verifier, model):
    """Losslessness does not depend on the heads: noisy heads (random model) and zero-initialised
    ones, which copy the lm head's choices (cyclic model: some accepted)."""
    lm = target if model == "random" else cyclic_tiny(0)
    heads = noisy_heads() if model == "random" else MedusaHeads(64, 4)
    engine = Engine(lm, MedusaDrafter(lm, heads=heads), verifier, SamplingParams())
    baseline = Engine(lm, NoDrafter(), GreedyVerifier(), SamplingParams())
    nodes = 0
    for prompt in (REPEATING, PLAIN):
        out = engine.generate(prompt, 30, eos_token_ids=[])
        assert out.tokens == baseline.generate(prompt, 30, eos_token_ids=[]).tokens
        nodes += out.stats.nodes
    assert nodes > 0


def test_a_shortlist_vocabulary_drafts_only_its_tokens_and_stays_lossless(tmp_path, target):
    heads = noisy_heads()
    drafter = MedusaDrafter(target, heads=heads, vocab=40, cache_dir=str(tmp_path), lookup=0)  # the heads' tokens only
    assert drafter.shortlist.ids.numel() == 40 and (tmp_path / "vocab").is_dir()
    allowed = set(drafter.shortlist.ids.tolist())
    ctx = Context(torch.tensor(PLAIN), SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), 100, hidden=torch.randn(1, 64))
    full = MedusaDrafter(target, heads=heads, lookup=0).propose(ctx)
    assert not set(full.tokens.tolist()) <= allowed  # the whole vocabulary proposes others
    assert set(drafter.propose(ctx).tokens.tolist()) <= allowed
    sampled = MedusaDrafter(target, heads=heads, vocab=40, children="sample", lookup=0, cache_dir=str(tmp_path)).propose(ctx)
    assert sampled.q.shape == (len(sampled), 320) and set(sampled.tokens.tolist()) <= allowed
    torch.testing.assert_close(sampled.q.sum(-1), torch.ones(len(sampled)))
    assert (sampled.q[:, [t for t in range(320) if t not in allowed]] == 0).all()  # q: the law it drew from
    engine = Engine(target, drafter, GreedyVerifier(), SamplingParams())
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    assert engine.generate(PLAIN, 20, eos_token_ids=[]).tokens == baseline.generate(PLAIN, 20, eos_token_ids=[]).tokens
    with pytest.raises(SpecResearchError, match="not train.own_lm_head"):
        MedusaDrafter(target, heads=MedusaHeads(64, 3, own_lm_head=True, vocab=320), vocab=40, cache_dir=str(tmp_path))


@pytest.mark.parametrize("children", ["top", "sample"])
def test_rejection_sampling_with_medusa_follows_the_target(target, children):
    engine = Engine(target, MedusaDrafter(target, heads=MedusaHeads(64, 4), children=children, lookup=0),
                    RejectionVerifier(), SamplingParams(temperature=1.0))
    report = equivalence_report(engine, REPEATING, seed=70)
    assert not report.reject, report.format()


def test_a_run_on_prompts_that_trained_the_heads_is_refused(tmp_path, capsys):
    """The checkpoint records the prompts that trained it; a run whose prompts are among them stops
    before decoding, one that is not logs the record; weights without a record run with a warning."""
    lm = load_model("tiny", device="cpu", tiny=dict(make_cfg("model=tiny").model.tiny))
    path = tmp_path / "heads.safetensors"
    trained = load_prompts("mtbench")[:3]
    MedusaHeads(lm.model.config.hidden_size, 3).save(path, {"target": "tiny", "trained_on": prompt_record(["mtbench"], trained)})
    args = ["model=tiny", "drafter=medusa", f"drafter.checkpoint={path}", "tracker=none", "max_new_tokens=4", "warmup=false"]
    with pytest.raises(SpecResearchError, match=r"trained on 1 of this run's prompts \(mtbench/83\)"):
        run(make_cfg(*args, "dataset=mtbench", "dataset.offset=2", "dataset.num_prompts=3"))  # the third trained them
    assert run(make_cfg(*args, "dataset=mtbench", "dataset.offset=3", "dataset.num_prompts=1"))["prompts"] == 1
    tags = trained_on_tags(MedusaDrafter(lm, checkpoint=str(path)), load_prompts("humaneval", 2))
    assert tags["drafter.trained_on.sources"] == "mtbench" and tags["drafter.trained_on.prompts"] == "3"
    assert tags["drafter.trained_on.prompts_sha256"] == hashlib.sha256("\n".join(sorted(p.id for p in trained)).encode()).hexdigest()
    capsys.readouterr()
    MedusaHeads(lm.model.config.hidden_size, 3).save(path, {"target": "tiny"})  # trained before records were kept
    old = MedusaDrafter(lm, checkpoint=str(path))
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("warning: the medusa weights at") and "may overlap MT-bench" in warning and "\n" not in warning
    assert trained_on_tags(old, load_prompts("mtbench", 2)) == {"drafter.trained_on.sources": "unknown"}


def test_sequoia_sizing_trades_the_expected_length_against_the_measured_cost():
    rank_acc = [[0.6, 0.2, 0.1], [0.4, 0.1, 0.05], [0.3, 0.1, 0.0]]
    paths = best_choices(rank_acc, 20)
    flat, flat_speedup = sized_choices(rank_acc, lambda m: 1.0, 20)  # verifying costs nothing extra: take every path
    assert flat == paths and flat_speedup == pytest.approx(1 + sum(math.prod(rank_acc[d][r] for d, r in enumerate(p)) for p in paths))
    steep, steep_speedup = sized_choices(rank_acc, lambda m: float(m), 20)  # each token costs a forward: one node at most
    assert steep == paths[:1] and steep_speedup == pytest.approx(1.6 / 2)
    knee, _ = sized_choices(rank_acc, interpolated([1, 3, 5, 21], [1.0, 1.0, 1.3, 3.0]), 20)
    assert 2 <= len(knee) <= 4 and knee == paths[: len(knee)]  # cheap up to 2 nodes, then dear
    assert interpolated([1, 3], [1.0, 2.0])(2) == 1.5 and interpolated([1, 3], [1.0, 2.0])(9) == 2.0


def test_shape_auto_sizes_the_tree_on_this_machine_once(tmp_path, target, monkeypatch):
    """The default shape=auto sizes the tree from the heads' hit rates and this machine's costs, which
    are measured once and kept in the model cache: a second drafter measures nothing (a larger tree
    measures only what it adds). Choices given are the tree; heads without hit rates get the default tree.
    (The heads' tree alone: lookup=0; the lookup branch's sizing has its own tests.)"""
    monkeypatch.setenv("SPECRESEARCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "heads.safetensors"
    rank_acc = [[0.5, 0.2, 0.1], [0.3, 0.1, 0.05], [0.2, 0.1, 0.0], [0.1, 0.0, 0.0]]
    noisy_heads().save(path, {"target": "tiny", "rank_acc": rank_acc})
    drafter = MedusaDrafter(target, checkpoint=str(path), nodes=12, lookup=0)
    assert 1 <= len(drafter.choices) <= 12 and sorted(drafter.choices) == sorted(best_choices(rank_acc, len(drafter.choices)))
    assert drafter.predicted_speedup > 0
    kept, = (tmp_path / "cache" / "costs" / "tiny").glob("*.json")
    record = json.loads(kept.read_text())
    assert sorted(map(int, record["v"])) == [1, 2, 3, 5, 9, 13] and record["machine"]["specresearch.processor"]

    measured = []
    real = target_module.forward_seconds
    monkeypatch.setattr(target_module, "forward_seconds", lambda lm, ids, sizes, *a: measured.append(sizes) or real(lm, ids, sizes, *a))
    again = MedusaDrafter(target, checkpoint=str(path), nodes=12, lookup=0)
    assert measured == [] and again.choices == drafter.choices and again.predicted_speedup == drafter.predicted_speedup
    MedusaDrafter(target, checkpoint=str(path), nodes=20, lookup=0)
    assert measured == [[1, 16, 17, 21]]  # the one token (the unit) and the sizes not kept yet
    assert sorted(map(int, json.loads(kept.read_text())["v"])) == [1, 2, 3, 5, 9, 13, 16, 17, 21]

    assert MedusaDrafter(target, checkpoint=str(path), choices=[[0]]).choices == [(0,)]  # given choices are the tree
    plain = MedusaDrafter(target, heads=noisy_heads(), lookup=0)  # no hit rates: the default tree
    assert sorted(plain.choices) == sorted(map(tuple, DEFAULT_CHOICES)) and plain.predicted_speedup is None
    with pytest.raises(SpecResearchError, match="valid are null \\(nodes as given\\), auto"):
        MedusaDrafter(target, checkpoint=str(path), shape="optimal")


def _rewrite_json(change):
    def damage(path):
        sidecar = path.with_suffix(".json")
        sidecar.write_text(change(sidecar.read_text()))
    return damage


BAD_CHECKPOINTS = {  # what is done to a whole checkpoint -> the start of the error, after the file it names
    "random bytes": (lambda path: path.write_bytes(random_bytes(4000)), "{path} is not a whole safetensors file ("),
    "cut short": (lambda path: path.write_bytes(path.read_bytes()[:-100]), "{path} is not a whole safetensors file ("),
    "no json": (lambda path: path.with_suffix(".json").unlink(), "the medusa checkpoint {path} has no heads.json beside it"),
    "json not json": (_rewrite_json(lambda text: text[:-5]), "{json} (beside the medusa checkpoint) is not readable JSON ("),
    "json not an object": (_rewrite_json(lambda text: "[1, 2]"), "{json} (beside the medusa checkpoint) holds list, not a JSON object"),
    "json lacks keys": (_rewrite_json(lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k not in ("heads", "vocab")})),
                        "{json} (beside the medusa checkpoint) lacks heads, vocab"),
    "json bad value": (_rewrite_json(lambda text: json.dumps({**json.loads(text), "hidden": "wide"})),
                       "{json} (beside the medusa checkpoint) gives a shape that builds no medusa module ("),
    "json of another shape": (_rewrite_json(lambda text: json.dumps({**json.loads(text), "layers": 2})),
                              "the weights in {path} do not fit the medusa module its JSON and this target describe (Missing key(s)"),
}


def random_bytes(n: int) -> bytes:
    return random.Random(0).randbytes(n)


@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_a_bad_checkpoint_is_one_line_naming_the_file_and_what_to_do(tmp_path, target, case):
    damage, error = BAD_CHECKPOINTS[case]
    path = tmp_path / "heads.safetensors"
    MedusaHeads(target.model.config.hidden_size, 3).save(path, {"target": "tiny"})
    damage(path)
    with pytest.raises(SpecResearchError) as err:
        MedusaDrafter(target, checkpoint=str(path))
    msg = str(err.value)
    assert msg.startswith(error.format(path=path, json=path.with_suffix(".json"))) and "\n" not in msg, msg
    assert "python -m specresearch.train drafter=medusa" in msg


def test_heads_without_a_training_record_warn_once_per_process(tmp_path, target, capsys):
    path = tmp_path / "heads.safetensors"
    noisy_heads().save(path, {"target": "tiny"})  # no trained_on: trained before runs recorded it
    for _ in range(3):
        MedusaDrafter(target, checkpoint=str(path))
    assert capsys.readouterr().err.count("do not record their training prompts") == 1


def test_a_saved_checkpoint_leaves_no_temporary_file(tmp_path, target):
    path = tmp_path / "heads.safetensors"
    MedusaHeads(target.model.config.hidden_size, 3).save(path, {"target": "tiny"})
    MedusaHeads(target.model.config.hidden_size, 2).save(path, {"target": "tiny"})  # over the first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.json", "heads.safetensors"]
    assert MedusaDrafter(target, checkpoint=str(path), choices=[[0], [0, 0]]).heads.config["heads"] == 2


@pytest.mark.e2e  # runs the command line
def test_the_command_line_refuses_a_bad_checkpoint_in_one_line_and_leaves_no_output_folder(tmp_path):
    """Exit 2, one `error:` line naming the file, no traceback, and no empty outputs/DATE/TIME/ left."""
    path = tmp_path / "ckpt" / "heads.safetensors"
    path.parent.mkdir()
    path.write_bytes(random_bytes(4000))
    path.with_suffix(".json").write_text(json.dumps({"hidden": 64, "heads": 3, "layers": 1, "own_lm_head": False, "vocab": 0,
                                                     "target": "tiny"}))
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "specresearch", "model=tiny", "drafter=medusa", f"drafter.checkpoint={path}",
                           "tracker=none", "max_new_tokens=4", "warmup=false"], cwd=work, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {path} is not a whole safetensors file (") and "Traceback" not in proc.stderr, proc.stderr
    assert list(work.iterdir()) == []  # no outputs/ (nor anything else) made for the refused run


@pytest.mark.parametrize("children", ["top", "sample"])
def test_a_batchs_rows_are_drafted_by_one_heads_forward_each_as_alone(target, children, monkeypatch):
    """A batch's rows (Drafter.propose_rows): the heads read every row's hidden state in one forward; each row's tree (tokens, parents
    and, sampled, q) is the one the row gets alone, its draws from its own generator; a row with no room
    to draft gets an empty draft."""
    heads = MedusaHeads(target.model.config.hidden_size, 3)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
    drafter = MedusaDrafter(target, heads=heads, shape=None, children=children, lookup=0)
    sampling = SamplingParams(temperature=1.0)
    hidden = torch.randn(4, 3, target.model.config.hidden_size, generator=torch.Generator().manual_seed(0))

    def contexts() -> list[Context]:
        return [Context(torch.tensor(REPEATING), sampling, torch.Generator().manual_seed(b), room, hidden=hidden[b])
                for b, room in enumerate([3, 2, 0, 3])]

    alone = [drafter.propose(ctx) for ctx in contexts()]
    calls = []
    forward = MedusaHeads.forward
    monkeypatch.setattr(MedusaHeads, "forward", lambda self, *a: calls.append(1) or forward(self, *a))
    drafter.prefill_rows(contexts())
    together = drafter.propose_rows(contexts())
    assert len(calls) == 1 and len(together[2]) == 0 and max(node_depths(together[1].parents)) == 2
    for got, want in zip(together, alone):
        assert torch.equal(got.tokens, want.tokens) and (got.parents is None or torch.equal(got.parents, want.parents))
        assert (got.q is None) == (want.q is None) == (children == "top" or not len(want))
        if got.q is not None:
            torch.testing.assert_close(got.q, want.q)


@pytest.mark.parametrize("drafter", ["medusa", "tree"])
def test_a_tree_the_machine_cannot_hold_is_refused_before_anything_is_allocated(drafter, monkeypatch):
    """drafter.nodes=100000 on the tiny model died after 44 s allocating 40 GB (the tree's attention mask, 100,001² float32):
    now one line naming the size the machine can hold, and that size is not refused."""
    from specresearch.build import build
    from specresearch.config import compose
    from specresearch.drafters import tree

    target = tiny_model()
    monkeypatch.setattr(tree, "free_memory_bytes", lambda device: 16 * 2**30)  # half of it: 8 GiB for 5,120 B x K + 5 B x K²
    extra = ["drafter.model.name=tiny", "drafter.branching=null"] if drafter == "tree" else ["drafter.lookup=0"]

    def cfg(nodes):
        return compose(["model=tiny", f"drafter={drafter}", f"drafter.nodes={nodes}", "drafter.shape=null", *extra]).drafter

    with pytest.raises(SpecResearchError, match=r"^drafter.nodes: a tree of 100,000 nodes needs at least 47.0 GiB to verify \(the target's "
                                                r"laws over 320 tokens and the tree's attention mask\), more than half the 16.0 GiB "
                                                r"free on cpu: valid are trees of at most 40,938 nodes here$"):
        build(cfg(100000), target=target)
    tree.check_fits(target, 40938, "drafter.nodes")  # the largest it names is not refused, one more is
    with pytest.raises(SpecResearchError, match="at most 40,938 nodes"):
        tree.check_fits(target, 40939, "drafter.nodes")
