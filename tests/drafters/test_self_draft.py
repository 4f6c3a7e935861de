"""Self-drafting by layer skipping: the layer choice, a view that shares the target's weights and
leaves it untouched, greedy identity with the baseline, and the target's law at T = 1."""

import pytest
import torch

from specresearch.drafters import NoDrafter, SelfDraftDrafter
from specresearch.drafters.self_draft import skipped_layers
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.types import SamplingParams
from specresearch.verifiers import GreedyVerifier, RejectionVerifier
from tests.tiny import equivalence_report, tiny_model


def tiny(seed: int = 0):
    return tiny_model(seed, num_layers=6)


def test_layer_choice():
    assert skipped_layers(6, [3, 1, 3], None, None) == [1, 3]
    assert skipped_layers(6, None, 4, None) == [4, 5]
    ratio = skipped_layers(28, None, None, 0.5)
    assert len(ratio) == 14 and 0 not in ratio and 27 not in ratio
    for args, message in [
        (([0, 2], None, None), r"in \[1, 5\]"),
        (([2], 3, None), "one of drafter.skip and drafter.exit_layer"),
        ((None, 6, None), r"exit_layer must lie in \[1, 5\]"),
        ((None, None, 1.5), "skip_ratio in"),
    ]:
        with pytest.raises(SpecResearchError, match=message):
            skipped_layers(6, *args)


def test_the_view_shares_weights_and_leaves_the_target_alone():
    target = tiny()
    drafter = SelfDraftDrafter(target, k=3, skip=[2, 4])
    view = drafter.draft.model
    assert len(target.model.model.layers) == 6 and len(view.model.layers) == 4
    assert view.model.layers[2] is target.model.model.layers[3]  # the same module: no copy
    assert view.lm_head.weight.data_ptr() == target.model.lm_head.weight.data_ptr()
    ids = torch.tensor([[5, 6, 7]])
    with torch.inference_mode():
        assert not torch.allclose(view(input_ids=ids).logits, target.model(input_ids=ids).logits)


@pytest.mark.parametrize("setting", [{"skip": [2, 3]}, {"exit_layer": 4}, {"skip_ratio": 0.5}])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_output_equals_the_baseline(setting, k, seed):
    target = tiny(seed)
    engine = Engine(target, SelfDraftDrafter(target, k=k, **setting), GreedyVerifier(), SamplingParams())
    baseline = Engine(target, NoDrafter(), GreedyVerifier(), SamplingParams())
    accepted = 0
    for prompt in ([1, 2, 3], [40, 41, 42, 40, 41, 42, 40]):
        out = engine.generate(prompt, 30, eos_token_ids=[])
        assert out.tokens == baseline.generate(prompt, 30, eos_token_ids=[]).tokens
        accepted += out.stats.accepted
    assert accepted > 0


def test_rejection_sampling_follows_the_target():
    target, sampling, prompt = tiny(), SamplingParams(temperature=1.0), [1, 2, 3, 4]
    engine = Engine(target, SelfDraftDrafter(target, k=3, skip=[2, 3]), RejectionVerifier(), sampling)
    report = equivalence_report(engine, prompt, seed=70)
    assert not report.reject, report.format()
    stats = engine.generate(prompt, 30, eos_token_ids=[], seed=3).stats
    assert 0 < stats.accepted < stats.drafted


def test_greedy_layer_search_picks_the_best_single_layer_first():
    from specresearch.drafters.self_draft import agreement, search_skip

    target = tiny()
    tokens = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0))
    chosen, scores = search_skip(target, tokens, 3)
    assert len(set(chosen)) == 3 and all(1 <= layer < 6 for layer in chosen)
    reference = target.model(input_ids=tokens[None]).logits[0, :-1].argmax(-1)
    singles = {layer: agreement(target, [layer], tokens, reference) for layer in range(1, 6)}
    assert scores[0] == max(singles.values()) == singles[chosen[0]]
    with pytest.raises(SpecResearchError, match="skip 1 to 5 of 6"):
        search_skip(target, tokens, 6)
