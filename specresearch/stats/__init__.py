"""Distribution equivalence: exact single-step laws of verifiers, and the sequence-level test battery
that decides whether a drafter × verifier samples from the target's law (see docs/concepts/lossless.md)."""

from specresearch.stats.battery import Report, battery, calibration, family_size, holm, position_df, samples_for_tv
from specresearch.stats.exact import acceptance_rate, draft_first_token_law, first_token_law, sibling_law, single_step_tv, total_variation
from specresearch.stats.floor import NumericFloor, numeric_floor
from specresearch.stats.samples import Conditionals, Samples, Stream, sample_engine, sample_seeds, sample_target, teacher_force

__all__ = [
    "Report", "battery", "calibration", "family_size", "holm", "position_df", "samples_for_tv",
    "acceptance_rate", "draft_first_token_law", "first_token_law", "sibling_law", "single_step_tv", "total_variation",
    "NumericFloor", "numeric_floor", "Conditionals", "Samples", "Stream", "sample_engine", "sample_seeds", "sample_target", "teacher_force",
]
