"""Tables (markdown, LaTeX) and figures (PNG) of a study, built from its MLflow runs only.

`python -m analysis.tables experiment=NAME` (see analysis/README.md); `analysis.studies.STUDIES`
holds one builder per study; `analysis.published` the published numbers printed beside ours.
"""
