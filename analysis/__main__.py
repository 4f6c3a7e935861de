"""`python -m specresearch.analysis experiment=NAME`: a study's tables and figures (see tables.py)."""

import sys

from specresearch.analysis.tables import main

sys.exit(main())
