"""The functions our task files name with `!function utils.<name>` (lm-eval imports this file by path)."""

from specresearch.evaluation import stdlib_doctest
from specresearch.evaluation.humaneval import doc_to_text, load, process_results  # noqa: F401

load_stdlib_doctest = stdlib_doctest.load
process_stdlib_doctest = stdlib_doctest.process_results
