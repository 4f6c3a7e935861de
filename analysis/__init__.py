"""Tables (markdown, LaTeX) and figures (PNG) of a study, built from its MLflow runs only.

`python -m specresearch.analysis experiment=NAME` (see README.md here). Each study's own analysis is
`experiments/NAME/analysis.py` (found by specresearch.analysis.studies), its published
numbers `experiments/NAME/published.json` (read by specresearch.analysis.published); the
helpers they share are here: report.py, format.py, runs.py (and the plots, specresearch.figures).
"""
