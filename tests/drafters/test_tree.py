"""The tree drafter: a draft model's tree grown level by level under the tree mask, greedy identity
with the baseline (static, dynamic, ensemble), the target's law under multi-step speculative
sampling at T = 1 (top and sampled children), typical acceptance on trees, and errors."""

import functools

import pytest
import torch

from specresearch.drafters import Context, NoDrafter, TreeDrafter
from specresearch.drafters.tree import Sizer
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM, interpolated
from specresearch.types import Draft, SamplingParams, node_depths
from specresearch.verifiers import GreedyVerifier, RejectionVerifier, TypicalVerifier
from tests.tiny import PLAIN, REPEATING, equivalence_report, tiny_model


@torch.inference_mode()
def test_a_tree_grown_over_several_forwards_sees_only_its_ancestors(target):
    """Level 2 fed in a second call (tree=start) gets the logits of its path decoded as a chain."""
    prompt = torch.tensor([5, 9, 33, 2])
    grown = CachedLM(target)
    grown.reset()
    grown.prefill_rows([prompt])
    start = grown.length
    first = grown.forward_rows([torch.tensor([40, 41, 42])], [torch.tensor([-1, -1, -1])], tree=start)[0]
    second = grown.forward_rows([torch.tensor([50, 51])], [torch.tensor([2, 0])], tree=start)[0]
    for nodes, logits in (([42, 50], second[0]), ([40, 51], second[1]), ([41], first[1])):
        chain = CachedLM(target)
        chain.reset()
        chain.prefill_rows([prompt])
        torch.testing.assert_close(logits, chain.forward_rows([torch.tensor(nodes)], [None])[0][-1], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="not a tree"):
        grown.forward_rows([torch.tensor([1])], [torch.tensor([-1])], tree=start + 1)


@torch.inference_mode()
def test_rows_trees_grown_over_several_forwards_see_only_their_ancestors(target):
    """Two rows of different lengths grow their trees in the same forwards (forward_rows with tree=start),
    one row feeding nothing in the second: every node gets the logits of its path decoded as a chain."""
    prompts = [torch.tensor([5, 9, 33, 2]), torch.tensor([7, 3])]
    grown = CachedLM(target)
    grown.reset()
    grown.prefill_rows(prompts)
    start = grown.length
    first = grown.forward_rows([torch.tensor([40, 41, 42]), torch.tensor([60])], [torch.tensor([-1, -1, -1]), torch.tensor([-1])], tree=start)
    second = grown.forward_rows([torch.tensor([50, 51]), torch.tensor([], dtype=torch.long)], [torch.tensor([2, 0]), torch.tensor([], dtype=torch.long)],
                                tree=start)
    third = grown.forward_rows([torch.tensor([52]), torch.tensor([61])], [torch.tensor([3]), torch.tensor([0])], tree=start)
    paths = [(0, [42, 50], second[0][0]), (0, [40, 51], second[0][1]), (0, [41], first[0][1]), (0, [42, 50, 52], third[0][0]),
             (1, [60], first[1][0]), (1, [60, 61], third[1][0])]
    for b, nodes, logits in paths:
        chain = CachedLM(target)
        chain.reset()
        chain.prefill_rows([prompts[b]])
        torch.testing.assert_close(logits, chain.forward_rows([torch.tensor(nodes)], [None])[0][-1], atol=1e-4, rtol=0)
    grown.crop_rows(start, [4, 2])  # the trees dropped: each row goes on after its prompt
    after = grown.forward_rows([torch.tensor([8]), torch.tensor([8])], [None, None])
    for b in range(2):
        chain = CachedLM(target)
        chain.reset()
        chain.prefill_rows([prompts[b]])
        torch.testing.assert_close(after[b][0], chain.forward_rows([torch.tensor([8])], [None])[0][-1], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="not trees"):
        grown.forward_rows([torch.tensor([1]), torch.tensor([1])], [torch.tensor([-1]), torch.tensor([-1])], tree=start - 1)


@torch.inference_mode()
def test_a_batch_grows_every_rows_tree_in_one_draft_forward_per_level(target, close_draft):
    """A batch's trees are each row's own, grown together: the draft model runs once per
    level for all rows, not once per row."""
    prompts = [REPEATING, PLAIN, REPEATING[3:] + PLAIN]
    drafter = TreeDrafter(target, model=close_draft, branching=None, topk=3, depth=3, nodes=8)
    engine = Engine(target, drafter, GreedyVerifier(), SamplingParams())
    alone = [engine.generate(p, 16, eos_token_ids=[]) for p in prompts]
    calls = []
    hook = close_draft.model.base_model.register_forward_hook(lambda *_: calls.append(1))
    try:
        batch = engine.generate(prompts, 16, eos_token_ids=[])
    finally:
        hook.remove()
    assert [out.tokens for out in batch] == [out.tokens for out in alone]
    assert [out.stats.draft_forwards for out in batch] == [out.stats.draft_forwards for out in alone]
    forwards = [out.stats.draft_forwards for out in batch]
    assert max(forwards) + 1 <= len(calls) < sum(forwards)  # one prefill, then forwards the rows share


@torch.inference_mode()
def test_static_trees_take_their_branching_and_dynamic_trees_their_node_budget(target, close_draft):
    """A static tree has branching[d] children per node at depth d (one draft forward per fed level); a
    dynamic one keeps `nodes` nodes at most `depth` deep, parents first, never deeper than the tokens left."""
    ctx = Context(torch.tensor(REPEATING), SamplingParams(), torch.Generator().manual_seed(0), 100)
    static = TreeDrafter(target, model=close_draft, branching=[3, 2, 1])
    static.prefill(ctx)
    tree = static.propose(ctx)
    assert len(tree) == 3 + 6 + 6 and tree.depth == 3 and tree.q is None
    assert sorted(node_depths(tree.parents)) == [1] * 3 + [2] * 6 + [3] * 6
    assert static.draft_forwards == 3  # one forward per level, the last level is not fed
    dynamic = TreeDrafter(target, model=close_draft, branching=None, topk=3, depth=4, nodes=7)
    dynamic.prefill(ctx)
    tree = dynamic.propose(ctx)
    assert len(tree) == 7 and tree.depth <= 4
    depths = node_depths(tree.parents)
    assert all(p < i for i, p in enumerate(tree.parents.tolist()))  # parents first: a tree
    assert depths.count(1) >= 1
    dynamic.prefill(ctx)
    short = dynamic.propose(Context(ctx.tokens, ctx.sampling, ctx.rng, 2))
    assert short.depth <= 2  # never deeper than the tokens left


@torch.inference_mode()
def test_chain_confidence_stops_a_tree_after_a_level_without_a_likely_path(target):
    """A level is grown only below a level with a path the draft gives at least the threshold (its
    probabilities multiplied down the path, from fresh forwards); trees stop before `depth` then."""
    draft, threshold, depth, stopped = tiny_model(noise=0.03, noise_seed=5), 0.3, 8, 0
    drafter = TreeDrafter(target, model=draft, branching=None, topk=2, depth=depth, nodes=64, chain_confidence=threshold)
    for seed in range(6):
        prompt = torch.randint(0, 256, (6,), generator=torch.Generator().manual_seed(seed))
        ctx = Context(prompt, SamplingParams(), None, 100)
        drafter.prefill(ctx)
        tree = drafter.propose(ctx)
        parents, tokens, levels = tree.parents.tolist(), tree.tokens.tolist(), node_depths(tree.parents)
        path = []
        for i, parent in enumerate(parents):
            ids = [tokens[i]]
            while parent >= 0:
                ids.insert(0, tokens[parent])
                parent = parents[parent]
            logits = draft.model(torch.cat([prompt, torch.tensor(ids[:-1], dtype=torch.long)])[None]).logits[0, len(prompt) - 1 :]
            path.append(float(torch.softmax(logits.double(), -1).gather(-1, torch.tensor(ids)[:, None]).prod()))
        best = [max(p for p, level in zip(path, levels) if level == d) for d in range(1, tree.depth + 1)]
        assert min(best[:-1], default=1.0) >= threshold - 1e-6  # every level but the last was grown further
        assert best[-1] < threshold + 1e-6 or tree.depth == depth
        stopped += tree.depth < depth
    assert stopped >= 2, "some trees stop before their depth"
    with pytest.raises(SpecResearchError, match="chain_confidence must lie in \\(0, 1\\)"):
        TreeDrafter(target, model=draft, branching=None, chain_confidence=1.0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("shape", ["static", "dynamic", "ensemble"])
def test_greedy_output_equals_the_baseline(target, close_draft, seed, shape):
    options = {"static": {"branching": [2, 2, 1]}, "dynamic": {"branching": None, "topk": 3, "depth": 4, "nodes": 9},
               "ensemble": {"branching": [2, 1], "ensemble": [tiny_model(noise=0.02, noise_seed=9)]}}[shape]
    engine = Engine(target, TreeDrafter(target, model=close_draft, **options), GreedyVerifier(), SamplingParams())
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    accepted = 0
    for prompt in (REPEATING, PLAIN):
        out = engine.generate(prompt, 40, eos_token_ids=[], seed=seed)
        assert out.tokens == baseline.generate(prompt, 40, eos_token_ids=[]).tokens
        accepted += out.stats.accepted
    assert accepted > 0
    assert out.stats.nodes > out.stats.drafted  # wider than a chain
    assert out.stats.off_chain == out.stats.steps  # no step is Leviathan's chain: his prediction does not apply


@pytest.mark.parametrize("children", ["top", "sample"])
def test_rejection_sampling_on_trees_follows_the_target(target, close_draft, children):
    engine = Engine(target, TreeDrafter(target, model=close_draft, branching=[2, 2], children=children),
                    RejectionVerifier(), SamplingParams(temperature=1.0))
    stats = engine.generate(REPEATING, 30, eos_token_ids=[], seed=3).stats
    assert 0 < stats.accepted < stats.drafted
    report = equivalence_report(engine, REPEATING, seed=60)
    assert not report.reject, report.format()


def test_typical_on_a_tree_keeps_the_longest_passing_path():
    V = 5
    p = torch.full((6, V), 0.01)
    p[:, 0] = 0.96  # every position: token 0 likely, others unlikely
    p[0, 1], p[0, 0] = 0.5, 0.47  # after the root: 0 and 1 both pass
    p = p / p.sum(-1, keepdim=True)
    # root → 1 (node 0) → 0 (node 2); root → 0 (node 1) → 3 (node 3, fails)
    tokens, parents = torch.tensor([1, 0, 0, 3]), torch.tensor([-1, -1, 0, 1])
    verdict = TypicalVerifier(recover="greedy")(Draft(tokens=tokens, parents=parents), p, None)
    assert verdict.path == [0, 2] and verdict.tokens.tolist() == [1, 0, 0]
    # a tie in length goes to the path likelier under p
    tokens, parents = torch.tensor([1, 0]), torch.tensor([-1, -1])
    assert TypicalVerifier(recover="greedy")(Draft(tokens=tokens, parents=parents), p, None).path == [0]


def test_typical_tree_at_temperature_zero_equals_the_baseline(target, close_draft):
    engine = Engine(target, TreeDrafter(target, model=close_draft, branching=[2, 1]), TypicalVerifier(recover="greedy"), SamplingParams())
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    assert engine.generate(PLAIN, 30, eos_token_ids=[]).tokens == baseline.generate(PLAIN, 30, eos_token_ids=[]).tokens


def test_bad_settings_name_the_valid_ones(target, close_draft):
    with pytest.raises(SpecResearchError, match="valid are top, sample"):
        TreeDrafter(target, model=close_draft, children="beam")
    with pytest.raises(SpecResearchError, match="counts >= 1"):
        TreeDrafter(target, model=close_draft, branching=[2, 0])
    with pytest.raises(SpecResearchError, match="needs a draft model"):
        TreeDrafter(target)
    with pytest.raises(SpecResearchError, match="temperature > 0"):
        Engine(target, TreeDrafter(target, model=close_draft, children="sample"), GreedyVerifier(), SamplingParams())
    with pytest.raises(SpecResearchError, match="valid are null .*, auto"):
        TreeDrafter(target, model=close_draft, branching=None, shape="best")
    with pytest.raises(SpecResearchError, match="set drafter.branching=null"):
        TreeDrafter(target, model=close_draft, shape="auto")
    with pytest.raises(SpecResearchError, match="use drafter.children=top"):
        TreeDrafter(target, model=close_draft, branching=None, children="sample", shape="auto")


def test_auto_size_keeps_the_nodes_with_the_best_predicted_speedup():
    """τ̂(n) = 1 + the n best q(path); v flat up to 5 tokens, then steep: the knee is 4 nodes (root + 4 = 5
    tokens); a long drafting time makes verification relatively cheap, so the whole tree pays."""
    v = interpolated([1, 5, 9], [1.0, 1.0, 3.0])
    probs = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]

    def best(d: float) -> int:  # the predicted speedup of every size, by brute force
        return max(range(1, 9), key=lambda n: (1 + sum(probs[:n])) / (d + v(n + 1)))

    sizer = Sizer(v, unit=0.5)
    assert sizer.size(probs, drafting=0.0) == best(0.0) == 4
    assert sizer.size(probs, drafting=50.0) == best(100.0) == 8  # 50 s = 100 target forwards
    assert sizer.predicted_speedup == pytest.approx((4.0 + 5.4) / (1.0 + 100.0 + 3.0))


def test_a_batch_chain_pays_for_widening_the_batchs_verification_only():
    """shape=auto in a batch: the verification pads every row to the widest, so a row below it drafts on to it
    for its drafting alone, while the row that widens it pays the widening of every row (batch(rows, m)); one
    row reads the one-row curve, and a batch whose curve is not measured counts as one row of rows x m."""
    flat, steep = (lambda m: 1.0), (lambda rows, m: 1.0 + 10 * (m - 1))
    sizer = Sizer(flat, unit=1.0, batch=steep)
    grows = functools.partial(sizer.grows, 1.9, 0.9, 0.9, 2, 1, 0.0, 0.0, 0.0, 3)  # τ̂ 1.9 after one token at 0.9, 3 more allowed
    assert grows() and grows(rows=1, width=5), "one row: the flat curve"
    assert not grows(rows=2, width=2), "the widest row of two would widen the batch's forward: 10 forwards a token"
    assert grows(rows=2, width=4), "below the widest: its next tokens are verified in the padding"
    assert Sizer(lambda m: 1.0 if m <= 4 else 9.0, unit=1.0).verify(2, 2) == 1.0 < Sizer(lambda m: 1.0 if m <= 4 else 9.0, 1.0).verify(2, 3)
    sizer.record(4.0, 3, drafting=1.0, rows=2)  # 4 tokens from 2 rows, where plain decoding makes 2 a forward (batch(2, 1) = 1)
    assert sizer.predicted_speedup == pytest.approx((4.0 * 1.0 / 2) / (1.0 + 21.0))


@torch.inference_mode()
def test_an_auto_sized_tree_keeps_at_most_its_nodes_and_predicts_its_speedup(target, close_draft):
    ctx = Context(torch.tensor(REPEATING), SamplingParams(), torch.Generator().manual_seed(0), 100)
    auto = TreeDrafter(target, model=close_draft, branching=None, topk=3, depth=4, nodes=7, shape="auto")
    assert auto.predicted_speedup is None  # nothing sized yet
    sizes = []
    for _ in range(3):
        auto.prefill(ctx)
        tree = auto.propose(ctx)
        sizes.append(len(tree))
        assert all(p < i for i, p in enumerate(tree.parents.tolist()))  # a tree, parents first
    assert all(1 <= n <= 7 for n in sizes) and auto.predicted_speedup > 0


@torch.inference_mode()
def test_a_cheap_draft_model_grows_trees_of_its_shortlist(target, close_draft, tmp_path):
    """drafter.model.vocab / quantize reach the tree (and each ensemble member): every node is a
    shortlisted token, every sampled child's q is zero off the shortlist, the draft runs int8 linears,
    and the tree still holds children the shortlist allows only (the full draft proposes others)."""
    spec = {"name": "tiny", "device": "cpu", "tiny": {"vocab_size": 320, "seed": 0, "noise": 0.01, "noise_seed": 5},
            "vocab": 40, "vocab_corpus": "mtbench", "quantize": "int8", "cache_dir": str(tmp_path)}
    cheap = TreeDrafter(target, model=spec, branching=None, topk=3, depth=3, nodes=10, children="sample", ensemble=[spec])
    allowed = set(cheap.drafts[0].shortlist.ids.tolist())
    assert all(not any(type(m) is torch.nn.Linear for m in d.model.modules()) for d in cheap.drafts), "int8 linears"
    ctx = Context(torch.tensor(REPEATING), SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), 100)
    cheap.prefill(ctx)
    tree = cheap.propose(ctx)
    assert set(tree.tokens.tolist()) <= allowed and tree.q.shape == (len(tree), 320)
    assert float(tree.q[:, sorted(set(range(320)) - allowed)].abs().sum()) == 0 and torch.allclose(tree.q.sum(-1), torch.ones(len(tree)))
    full = TreeDrafter(target, model=close_draft, branching=None, topk=3, depth=3, nodes=10, children="sample")
    full.prefill(ctx)
    assert not set(full.propose(ctx).tokens.tolist()) <= allowed
