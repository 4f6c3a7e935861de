"""The `none` drafter: plain autoregressive decoding through the same engine (k = 0)."""

from __future__ import annotations

from specresearch.drafters.base import Context, Drafter
from specresearch.options import drafters as options
from specresearch.types import Draft


class NoDrafter(Drafter):
    """Proposes nothing, so each step is one target forward and one sampled token: the baseline."""

    Settings = options.NoDrafter
    name = "none"

    def __init__(self, target=None, **_):
        pass

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        return [Draft.empty(ctxs[0].tokens.device)] * len(ctxs)  # one empty draft for every row
