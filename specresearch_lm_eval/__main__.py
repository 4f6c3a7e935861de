"""`python -m specresearch_lm_eval ARGS`: lm-eval's own command line (`lm_eval ARGS`) with the hook on,
for where specresearch-lm-eval.pth is not installed (an editable install of a checkout)."""

import specresearch_lm_eval  # noqa: F401 (importing it installs the hook)
from lm_eval.__main__ import cli_evaluate

cli_evaluate()
