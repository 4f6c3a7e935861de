"""The records that flow through one decode loop: what a drafter proposes, what a verifier decides,
and what a generation returns. One record shape for every method, so analysis never needs to know
which method ran."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from specresearch.metrics import SpecStats
from specresearch.options.runs import SamplingParams  # noqa: F401  (the engine's sampling settings are the run's)


@dataclass
class Draft:
    """A proposal from a drafter: a chain, or a tree of candidates verified in one target forward.

    tokens: [K] proposed token ids (a chain), or [N] tree nodes with parents before children;
       K may be 0 (the autoregressive baseline).
    q: [K, V] the law each token was sampled from (row i: the law at node i's parent), after the
       same temperature/top-k/top-p as p; None for a deterministic drafter (greedy draft, n-gram
       lookup): verifiers treat it as one-hot.
    parents: [N] index of each node's parent in `tokens`, -1 for a child of the last committed token
       (the root); None for a chain. Siblings are tried in order (multi-step speculative sampling).
    scratch: the last `scratch` nodes are not proposals but the drafter's own work, fed in the same
       forward under the same tree mask (lookahead decoding's Jacobi window): never verified, never
       kept in the cache; their logits go back to the drafter (`Drafter.observe`). Needs parents.
    """

    tokens: Tensor  # [K] or [N + scratch]
    q: Tensor | None = None  # [K, V]
    parents: Tensor | None = None  # [N + scratch]
    scratch: int = 0

    def __post_init__(self):
        if self.scratch and self.parents is None:
            raise ValueError("a draft with scratch nodes must give their parents")

    @classmethod
    def empty(cls, device: torch.device | str | None = None) -> Draft:
        """No proposal: plain decoding's step, or a drafter with nothing to offer."""
        return cls(tokens=torch.empty(0, dtype=torch.long, device=device))

    def __len__(self) -> int:
        """The number of proposed tokens (tree nodes included, scratch nodes not)."""
        return int(self.tokens.numel()) - self.scratch

    @property
    def depth(self) -> int:
        """The longest proposed path: K for a chain."""
        if self.parents is None:
            return len(self)
        return max(node_depths(self.parents[: len(self)]), default=0)


class Trie:
    """Token-tree nodes in insertion order (parents before children): a child equal to an existing
    sibling is the same node unless `merge=False` (sampled siblings keep their own nodes)."""

    def __init__(self):
        self.tokens: list[int] = []
        self.parents: list[int] = []  # -1 = the root
        self._index: dict[tuple[int, int], int] = {}  # (parent, token) -> node

    def find(self, parent: int, token: int) -> int | None:
        """The node of `token` under `parent` (-1 = the root), None if there is none."""
        return self._index.get((parent, token))

    def add(self, parent: int, token: int, merge: bool = True) -> int:
        """The node of `token` under `parent` (-1 = the root), added if new (always, without merge)."""
        if merge and (parent, token) in self._index:
            return self._index[parent, token]
        self._index[parent, token] = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        return len(self.tokens) - 1


def node_depths(parents: Tensor) -> list[int]:
    """[N] parent indices (-1 = root, parents before children) → each node's depth (root's children: 1)."""
    depths: list[int] = []
    for parent in parents.tolist():
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


@dataclass(frozen=True)
class Siblings:
    """The chain drafters' siblings (drafters.base.Chain): beside each chain token x, the `n` likeliest
    tokens of the law x came from, other than x, likeliest first; those with probability 0 are left out
    (top-k / top-p removed them: the target never accepts them), and those whose path probability (the
    chain's probability down to x's parent, times their own) is below `confidence`. n = 0: a plain chain.
    A sibling is a function of the chain's law and token: the exact distortion (stats.exact) applies
    the same rule to every draw of x."""

    n: int = 0
    confidence: float = 0.0

    def of(self, law: Tensor, x: Tensor | int | None = None, path: float = 1.0) -> Tensor:
        """[S] indices into `law` ([V], or [N] over a shortlist), S <= n: the siblings of token `x`
        (None: of a token outside the n likeliest) at path probability `path` down to x's parent."""
        if x is not None:
            law = law.index_fill(-1, torch.as_tensor(x, device=law.device).reshape(1), 0.0)  # the chain's token is no sibling
        top = torch.topk(law, min(self.n, law.numel()))
        return top.indices[(top.values > 0) & (top.values * path >= self.confidence)]


@dataclass
class Verdict:
    """A verifier's decision on one draft.

    tokens: [num_accepted + 1] the accepted draft prefix (the accepted path of a tree), then one
            token from the target: the *recovered* token (sampled from the residual after a
            rejection) or the *bonus* token (sampled from p when every draft token was accepted).
            On the host (the engine reads the ids for its stop checks and writes them into the rows'
            buffer in one copy per step).
    """

    tokens: Tensor  # [n + 1]
    num_accepted: int
    path: list[int] | None = None  # tree drafts: the accepted nodes (indices into Draft.tokens), root first


@dataclass
class GenerationOutput:
    """The result of decoding one prompt, the same for every method (the baseline included)."""

    tokens: list[int]  # new tokens only, after EOS / stop-string / max_new_tokens truncation
    text: str  # the decoded new tokens
    stats: SpecStats = field(default_factory=SpecStats)
    stop_reason: str = "length"  # "eos" | "stop_string" | "length"
