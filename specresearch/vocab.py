"""Token frequencies on offline text, for drafts restricted to the most frequent tokens (FR-Spec,
Zhao et al., 2025): the draft's lm head then scores N rows instead of the whole vocabulary."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import torch
from torch import Tensor

from specresearch.errors import SpecResearchError

CORPORA = ("python-stdlib", "mtbench")


def corpus_texts(corpus: str) -> list[str]:
    """Offline text to count tokens on. Never the evaluation prompts (HumanEval): ranking on them would
    leak the test set into the draft.

    Args:
        corpus: "python-stdlib" (the .py files of this Python's standard library, in path order, up
            to 8 MB: code, as our code targets see) or "mtbench" (the 80 MT-Bench questions).
    """
    if corpus == "python-stdlib":
        from specresearch.data import stdlib_files

        return [text for _, text in stdlib_files()]
    if corpus == "mtbench":
        from specresearch.data import load_prompts

        return [p.text for p in load_prompts("mtbench", None)]
    raise SpecResearchError(f"unknown vocabulary corpus '{corpus}': valid are {', '.join(CORPORA)}")


def frequent_tokens(tokenizer, n: int, corpus: str = "python-stdlib", cache_dir: Path | None = None) -> Tensor:
    """The `n` most frequent token ids of `tokenizer` on `corpus`, most frequent first, with the
    tokenizer's EOS always included (a draft must be able to propose the end).

    Counts are cached as JSON in `cache_dir` (keyed by corpus and a hash of the vocabulary), so the
    corpus is tokenized once per tokenizer.

    Returns:
        [n] int64 token ids (fewer if the corpus has fewer distinct tokens: then every seen token).
    """
    if n < 1:
        raise SpecResearchError(f"the draft vocabulary must keep >= 1 token, got {n}")
    counts = _counts(tokenizer, corpus, cache_dir)
    ranked = [tok for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    eos = getattr(tokenizer, "eos_token_id", None)
    keep = ranked[:n]
    if eos is not None and eos not in keep:
        keep = keep[: n - 1] + [eos]
    return torch.tensor(keep, dtype=torch.long)


def _counts(tokenizer, corpus: str, cache_dir: Path | None) -> dict[int, int]:
    vocab = sorted(tokenizer.get_vocab().items())
    key = hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"token-counts-{corpus}-{key}.json" if cache_dir else None
    if path is not None and path.is_file():
        return {int(t): c for t, c in json.loads(path.read_text()).items()}
    counts: Counter[int] = Counter()
    for text in corpus_texts(corpus):
        counts.update(tokenizer.encode(text, add_special_tokens=False))
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(counts))
        tmp.replace(path)
    return dict(counts)


def shortlist_head(lm_head: torch.nn.Module, tokenizer, n: int, corpus: str, cache_dir: Path) -> tuple[torch.nn.Linear, Tensor]:
    """An lm head that scores only the `n` most frequent tokens (FR-Spec) for a drafter that reuses the
    target's own: a bias-free linear layer holding their rows, and [n] their token ids.

    Args:
        lm_head: the target's output embedding (a linear layer without bias).
        tokenizer, n, corpus, cache_dir: as for `frequent_tokens`.
    """
    if getattr(lm_head, "bias", None) is not None:
        raise SpecResearchError("drafter.vocab needs an lm head without a bias")
    weight = lm_head.weight.detach()  # [V, H]
    ids = frequent_tokens(tokenizer, n, corpus, cache_dir).to(weight.device)
    head = torch.nn.Linear(weight.shape[1], ids.numel(), bias=False, device=weight.device, dtype=weight.dtype)
    head.weight = torch.nn.Parameter(weight[ids], requires_grad=False)  # [n, H]
    return head, ids


def widen(q: Tensor, ids: Tensor, vocab_size: int) -> Tensor:
    """[..., n] a law over the tokens `ids` → [..., vocab_size], zero elsewhere: the q a drafter
    restricted to a shortlist drew from, as the verifier compares it with p."""
    return torch.zeros(*q.shape[:-1], vocab_size, dtype=q.dtype, device=q.device).index_copy_(-1, ids, q)
