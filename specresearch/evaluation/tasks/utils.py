"""The functions our task files name with `!function utils.<name>` (lm-eval imports this file by path)."""

from specresearch.evaluation import humaneval, stdlib_doctest

doc_to_text = humaneval.doc_to_text
load = humaneval.load
process_results = humaneval.process_results
load_stdlib_doctest = stdlib_doctest.load
process_stdlib_doctest = stdlib_doctest.process_results
