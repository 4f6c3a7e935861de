"""Tree attention: the mask and position ids of token-tree nodes fed after a cache, and their ancestry."""

from __future__ import annotations

import torch
from torch import Tensor


def tree_attention(known: Tensor, parents: Tensor, length: int, start: int, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """The attention of K more tree nodes fed after a cache of `length` tokens whose tree began at `start`.

    Args:
        known: [n, n] bool ancestry of the n tree nodes cached since `start` (row i: node i and its ancestors).
        parents: [K] each new node's parent among the tree's nodes (these included), -1 = the token before the tree.
        length, start: the cache's length (n = length - start) and where the tree began.
        dtype: the mask's dtype.

    Returns:
        [n + K, n + K] the ancestry with the new nodes (`tree_ancestry`), the [1, 1, K, length + K] additive
        mask (each new node sees the cache before the tree, its ancestors and itself), and [K] positions
        (start + depth - 1: a node sits where its path, decoded as a chain, would put it).
    """
    ancestors = tree_ancestry(known, parents)
    rows = ancestors[known.shape[0] :]  # [K, n + K]
    mask = torch.zeros(1, 1, rows.shape[0], length + rows.shape[0], dtype=dtype)  # [1, 1, K, L + K]
    mask[0, 0, :, start:].masked_fill_(~rows, torch.finfo(dtype).min)
    return ancestors, mask, start + rows.sum(-1) - 1


def tree_ancestry(known: Tensor, parents: Tensor) -> Tensor:
    """[n + K, n + K] bool: the ancestry `known` ([n, n], row i: node i and its ancestors) of a tree's n
    nodes, grown by K nodes under `parents` ([K], indices among all n + K nodes, -1 = the tree's root)."""
    n, k = known.shape[0], parents.numel()
    ancestors = torch.zeros(n + k, n + k, dtype=torch.bool)
    ancestors[:n, :n] = known
    if k and int(parents.max()) < n:  # a new level: every parent known, one gather
        ancestors[n:] = ancestors[parents.clamp(min=0)] & (parents >= 0)[:, None]
        ancestors[n:, n:] |= torch.eye(k, dtype=torch.bool)
        return ancestors
    for i, parent in enumerate(parents.tolist(), start=n):
        ancestors[i, i] = True
        if parent >= 0:
            ancestors[i] |= ancestors[parent]
    return ancestors
