"""An option is registered where it is written: a settings dataclass with an `option` joins its group, and
the class that declares it `Settings` is what the option builds (`_target_`), with no list of options and
no class path written by hand. A drafter defined here, in a test module, with no other edit, is composed,
checked, built and held to the lossless laws like the package's own."""

from __future__ import annotations

import ast
from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from hydra.core.config_store import ConfigStore

import specresearch.drafters
import specresearch.tracking
import specresearch.verifiers  # noqa: F401  (the package's classes bind their options)
from specresearch import config, options
from specresearch.drafters.base import Context, Drafter
from specresearch.errors import SpecResearchError
from specresearch.options import REGISTRY, drafters, make, target
from specresearch.options.conf import CONF_DIR
from specresearch.options.groups import OPTIONS
from specresearch.settings import built_by
from specresearch.types import Draft
from tests.verifiers import test_lossless

OPTIONS_DIR = Path(options.__file__).parent


# A drafter of this module's own: its settings and its class, nothing else (the two hand-written places).
@dataclass
class Bigram(drafters.DraftLength):
    """Chain the token that followed each token's last occurrence in the context (a bigram cache)."""
    option: ClassVar[str] = "bigram_test"


class BigramDrafter(Drafter):
    """The context's own bigrams: after token x, propose what followed x last time, k tokens deep. No model,
    deterministic (q = None): greedy and rejection verification keep it lossless."""

    name = "bigram"
    Settings = Bigram

    def __init__(self, target=None, **given):
        self.settings = make(self.Settings, given)

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        drafts = []
        for ctx in ctxs:
            ids = ctx.tokens.tolist()
            following = dict(zip(ids[:-1], ids[1:]))  # token -> the token after its last occurrence
            chain, x = [], ids[-1]
            while len(chain) < ctx.max_draft and x in following:
                chain.append(x := following[x])
            drafts.append(Draft(tokens=torch.tensor(chain, dtype=torch.long, device=ctx.tokens.device)))
        return drafts


REGISTRY["drafter"].pop(Bigram.option)  # the other tests of a session see the package's options; `bigram` puts it back


@pytest.fixture
def bigram():
    REGISTRY["drafter"][Bigram.option] = Bigram
    config.register_options()
    yield BigramDrafter
    REGISTRY["drafter"].pop(Bigram.option, None)
    ConfigStore.instance().repo.get("drafter", {}).pop(f"{Bigram.option}.yaml", None)


def test_a_drafter_defined_in_a_test_module_is_composed_checked_and_built(bigram):
    assert target(bigram.Settings) == f"{__name__}.BigramDrafter"
    assert "bigram_test" in config.options("drafter") and not (CONF_DIR / "drafter" / "bigram_test.yaml").exists()
    cfg = config.compose(["model=tiny", "drafter=bigram_test", "drafter.k=3", "tracker=none"])
    assert cfg.drafter._target_ == target(bigram.Settings) and cfg.drafter.k == 3
    assert built_by("drafter", cfg.drafter._target_) is bigram.Settings
    with pytest.raises(SpecResearchError, match="drafter=bigram_test has no setting 'drafter.lookup': valid are drafter.k, drafter.k_max, drafter.k_policy"):
        config.compose(["model=tiny", "drafter=bigram_test", "drafter.lookup=2"])
    with pytest.raises(SpecResearchError, match="needs k >= 1"):
        config.compose(["model=tiny", "drafter=bigram_test", "drafter.k=0"])


@pytest.mark.parametrize("setting", ["landing", "rejecting"])
def test_a_drafter_defined_in_a_test_module_keeps_the_exact_law(bigram, setting, tmp_path, request):
    test_lossless.test_exact_law_through_the_drafters_own_draws("bigram_test", (), "rejection", setting,
                                                                test_lossless.EXACT["T0.7-k4"], tmp_path, request)


def test_a_drafter_defined_in_a_test_module_keeps_greedy_identity(bigram, tmp_path):
    test_lossless.test_greedy_output_equals_plain_decoding("bigram_test", (), "greedy", tmp_path)


def test_every_package_option_builds_the_class_that_declares_it():
    for group in ("drafter", "verifier", "tracker"):
        for name, schema in OPTIONS[group].items():
            assert schema.builds and target(schema), f"{group}={name}: no class declares {schema.__name__} its Settings"
            module, _, cls = target(schema).rpartition(".")
            assert getattr(__import__(module, fromlist=[cls]), cls).Settings is schema
            assert "_target_" not in {f.name for f in fields(schema)}


def test_no_class_path_is_written_in_the_options():
    """`_target_` is derived: no string in specresearch/options names a class of the package."""
    for path in OPTIONS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not node.value.startswith(("specresearch.drafters.", "specresearch.verifiers.", "specresearch.tracking.")), \
                    (path.name, node.value)


def test_an_option_name_and_a_settings_class_are_taken_once():
    with pytest.raises(TypeError, match="drafter=pld is specresearch.options.drafters.PromptLookup already"):
        @dataclass
        class Another(drafters.DraftLength):
            option: ClassVar[str] = "pld"
    assert REGISTRY["drafter"]["pld"] is drafters.PromptLookup
    with pytest.raises(TypeError, match="which specresearch.drafters.pld.PromptLookupDrafter declares already"):
        class Twin(Drafter):
            Settings = drafters.PromptLookup

            def propose_rows(self, ctxs):
                return []
