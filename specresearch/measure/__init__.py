"""What `specresearch` (the command) measures: one config's method against the autoregressive baseline on
the same prompts, interleaved, with the distribution-equivalence battery when it samples. The parts:

- `runner`: the run itself (`run`), and what it checks before it waits for the speed lock (`check_run`);
- `results`: the per-prompt records and sums (`Results`), and the table printed at the end;
- `equivalence`: the battery inside a run: samples of both sides, teacher forcing, the tests, A/A.

(benchmarks/speed.py is the other measurement: every method side by side with transformers' generate.)
"""

from specresearch.measure.equivalence import (
    Baseline,
    aa_report,
    auto_samples,
    baseline_cache,
    baseline_samples,
    equivalence,
    method_samples,
    score,
    stats_rows,
)
from specresearch.measure.results import Results, format_table
from specresearch.measure.runner import check_run, compiled_reference, divergence_gap, run, trained_on_tags

__all__ = ["Baseline", "Results", "aa_report", "auto_samples", "baseline_cache", "baseline_samples", "check_run",
           "compiled_reference", "divergence_gap",
           "equivalence", "format_table", "method_samples", "run", "score", "stats_rows", "trained_on_tags"]
