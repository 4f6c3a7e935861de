"""Drafters: what proposes the tokens the target verifies."""

from specresearch.drafters.base import Context, Drafter
from specresearch.drafters.cross_vocab import CrossVocabDrafter
from specresearch.drafters.eagle import EagleDrafter
from specresearch.drafters.independent import IndependentDrafter
from specresearch.drafters.lookahead import LookaheadDrafter
from specresearch.drafters.medusa import MedusaDrafter
from specresearch.drafters.none import NoDrafter
from specresearch.drafters.pld import PromptLookupDrafter
from specresearch.drafters.self_draft import SelfDraftDrafter
from specresearch.drafters.tree import TreeDrafter

__all__ = ["Context", "CrossVocabDrafter", "Drafter", "EagleDrafter", "IndependentDrafter", "LookaheadDrafter", "MedusaDrafter",
           "NoDrafter", "PromptLookupDrafter", "SelfDraftDrafter", "TreeDrafter"]
