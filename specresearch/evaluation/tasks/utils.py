"""The functions our task files name with `!function utils.<name>` (lm-eval imports this file by path)."""

from specresearch.evaluation.humaneval import doc_to_text, load, process_results  # noqa: F401
