"""N-gram lookup: the continuation of an earlier occurrence of a context's last n-gram, for one context
or a batch of them (prompt lookup decoding's draft; the chain drafters' own guesses, `lookup=`)."""

from __future__ import annotations

import torch
from torch import Tensor


def lookup(tokens: Tensor, k: int, max_ngram: int = 3, min_ngram: int = 1, match: str = "first") -> Tensor:
    """Prompt lookup: the up to `k` tokens that followed an earlier occurrence of the context's last
    n-gram, n from `max_ngram` down to `min_ngram` (longer first).

    Args:
        tokens: [T] the context.
        k: the most tokens returned.
        max_ngram, min_ngram: the suffix lengths looked up.
        match: which occurrence to continue: "first" or "last".

    Returns:
        [G] the continuation (G <= k; empty when nothing matches or k <= 0).
    """
    if k > 0:
        for n in range(max_ngram, min_ngram - 1, -1):
            start = continuation_start(tokens, n, match)
            if start is not None:
                return tokens[start : start + k].clone()
    return tokens[:0].clone()


def continuation_start(tokens: Tensor, n: int, match: str = "first") -> int | None:
    """Where the continuation of an earlier occurrence of the last n tokens begins.

    Args:
        tokens: [T] the context.
        n: the n-gram size.
        match: "first" or "last" occurrence.

    Returns:
        The index i + n of the chosen occurrence tokens[i : i + n] (i + n < T, so at least one token
        follows it and the occurrence is not the suffix itself), or None.
    """
    length = tokens.numel()
    if length <= n:
        return None
    windows = tokens[: length - 1].unfold(0, n, 1)  # [T - n, n]: windows that a token follows
    hits = (windows == tokens[length - n :]).all(-1).nonzero()  # [M, 1]
    if not hits.numel():
        return None
    return int(hits[0 if match == "first" else -1]) + n


def lookup_rows(contexts: list[Tensor], k: list[int], max_ngram: int = 3, min_ngram: int = 1, match: str = "first") -> list[Tensor]:
    """`lookup` for many contexts at once: for each n, every row's n-token windows compared with its
    own suffix in one comparison of the padded rows ([B, T, n]).

    Args:
        contexts: B contexts ([T_b] each).
        k: the most tokens returned per row.
        max_ngram, min_ngram, match: as in `lookup`.

    Returns:
        B continuations, each what `lookup(contexts[b], k[b], ...)` returns.
    """
    return match_rows(contexts, k, max_ngram, min_ngram, match)[0]


def match_rows(contexts: list[Tensor], k: list[int], max_ngram: int = 3, min_ngram: int = 1,
               match: str = "first") -> tuple[list[Tensor], list[int]]:
    """`lookup_rows`, with the length n of the n-gram each row's continuation follows (0: none matched;
    a longer match is a likelier continuation)."""
    lengths = torch.tensor([c.numel() for c in contexts])  # [B]
    rows = torch.nn.utils.rnn.pad_sequence(list(contexts), batch_first=True, padding_value=-1)  # [B, T] (-1 matches no token)
    width = rows.shape[1]
    at = torch.arange(width, device=rows.device)
    start = torch.full((len(contexts),), -1, dtype=torch.long, device=rows.device)  # [B] where each row's continuation begins
    matched = torch.zeros(len(contexts), dtype=torch.long, device=rows.device)  # [B] the n of each row's match (0: none)
    for n in range(max_ngram, min_ngram - 1, -1):
        if width <= n:
            continue
        suffix = rows.gather(1, (lengths[:, None] - n + torch.arange(n)).clamp(min=0).to(rows.device))  # [B, n]
        windows = rows[:, : width - 1].unfold(1, n, 1)  # [B, T - n, n] the windows that a token follows
        follows = at[: width - n] + n < lengths[:, None].to(rows.device)  # [B, T - n] inside the row, a token after it
        hits = (windows == suffix[:, None]).all(-1) & follows & (lengths[:, None] > n).to(rows.device)  # [B, T - n]
        if match == "first":
            found = torch.where(hits.any(1), hits.float().argmax(1) + n, -1)
        else:
            found = torch.where(hits.any(1), width - n - 1 - hits.flip(1).float().argmax(1) + n, -1)
        matched = torch.where((start < 0) & (found >= 0), n, matched)
        start = torch.where(start < 0, found, start)
    continuations = [c[s : s + max(kb, 0)].clone() if s >= 0 and kb > 0 else c[:0].clone()
                     for c, s, kb in zip(contexts, start.tolist(), k)]
    return continuations, [n if g.numel() else 0 for g, n in zip(continuations, matched.tolist())]
