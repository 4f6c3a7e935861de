"""Token frequencies on offline text, for drafts restricted to the most frequent tokens (FR-Spec,
Zhao et al., 2025): the draft's lm head then scores N rows instead of the whole vocabulary."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.models import default_cache_dir

CORPORA = ("python-stdlib", "sharegpt", "mtbench")
SHAREGPT_BYTES = 8 << 20  # the sharegpt corpus: this much of the training side's chats


def check_corpus(corpus: str, what: str = "vocabulary corpus") -> None:
    """Refuse a `corpus` that `corpus_texts` does not know (`what`: the setting's name in the message)."""
    if not set(corpus.split("+")) <= set(CORPORA):
        raise SpecResearchError(f"unknown {what} '{corpus}': valid are {', '.join(CORPORA)}, or several joined by '+'")


def corpus_texts(corpus: str) -> list[str]:
    """Offline text to count tokens on. Never the evaluation prompts (HumanEval): ranking on them would
    leak the test set into the draft.

    Args:
        corpus: "python-stdlib" (the .py files of this Python's standard library, in path order, up
            to 8 MB: code, as our code targets see), "sharegpt" (the training side's ShareGPT first turns
            with the answers they got, up to 8 MB: chat, markdown and fenced code, as chat targets write
            it), "mtbench" (the 80 MT-Bench questions: evaluation prompts, for tests only), or several
            joined by "+" ("python-stdlib+sharegpt": their counts added).
    """
    check_corpus(corpus)
    if "+" in corpus:
        return [text for part in corpus.split("+") for text in corpus_texts(part)]
    if corpus == "python-stdlib":
        from specresearch.data import stdlib_files

        return [text for _, text in stdlib_files()]
    if corpus == "sharegpt":
        from specresearch.data import train_side

        texts, size = [], 0
        for p in train_side("sharegpt"):
            texts.append(f"{p.text}\n{p.meta['reply']}")
            size += len(texts[-1])
            if size >= SHAREGPT_BYTES:
                break
        return texts
    from specresearch.data import load_prompts  # mtbench

    return [p.text for p in load_prompts("mtbench", None)]


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


@dataclass
class Shortlist:
    """FR-Spec's vocabulary shortlist for a drafter: the tokens it may propose and a draft lm head that
    scores only them (the lm head is most of a draft step's cost)."""

    ids: Tensor  # [N] token ids, most frequent first (the EOS always among them)
    head: torch.nn.Linear  # N rows of an lm head (a bias-free linear layer): logits over `ids`, in order
    vocab_size: int  # V: the whole vocabulary, the length of the q rows the verifier compares with p

    @classmethod
    def load(cls, lm_head: torch.nn.Module, tokenizer, n: int, corpus: str, cache_dir: str | Path | None) -> Shortlist:
        """The `n` most frequent tokens of `corpus` and their rows of `lm_head`.

        Args:
            lm_head: the output embedding the draft scores with (a linear layer without bias).
            tokenizer, n, corpus: as for `frequent_tokens`.
            cache_dir: the model cache (None = the default one); the counts go to its vocab/ folder.
        """
        if getattr(lm_head, "bias", None) is not None:
            raise SpecResearchError("drafter.vocab needs an lm head without a bias")
        weight = lm_head.weight.detach()  # [V, H]
        ids = frequent_tokens(tokenizer, n, corpus, Path(cache_dir or default_cache_dir()) / "vocab").to(weight.device)
        head = torch.nn.Linear(weight.shape[1], ids.numel(), bias=False, device=weight.device, dtype=weight.dtype)
        head.weight = torch.nn.Parameter(weight[ids], requires_grad=False)  # [N, H]
        return cls(ids, head, weight.shape[0])

    def widen(self, q: Tensor) -> Tensor:
        """[..., N] a law over the shortlist → [..., V], zero elsewhere: the q a shortlisted draft drew
        from, as the verifier compares it with p."""
        return torch.zeros(*q.shape[:-1], self.vocab_size, dtype=q.dtype, device=q.device).index_copy_(-1, self.ids, q)
