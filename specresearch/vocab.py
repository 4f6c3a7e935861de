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
    def load(cls, lm_head: torch.nn.Module, tokenizer, n: int, corpus: str, cache_dir: str | Path | None,
             allowed: Tensor | None = None) -> Shortlist:
        """The `n` most frequent tokens of `corpus` (of the tokens `allowed`, if given) and their rows of `lm_head`.

        Args:
            lm_head: the output embedding the draft scores with (a linear layer without bias).
            tokenizer, n, corpus: as for `frequent_tokens`.
            cache_dir: the model cache (None = the default one); the counts go to its vocab/ folder.
            allowed: [A] the only tokens to choose from (a cross-vocabulary draft's shared ones); None = all.
        """
        folder = Path(cache_dir or default_cache_dir()) / "vocab"
        if allowed is None:
            return cls.of(lm_head, frequent_tokens(tokenizer, n, corpus, folder))
        ranked = frequent_tokens(tokenizer, lm_head.weight.shape[0], corpus, folder)  # every token seen, most frequent first
        return cls.of(lm_head, ranked[torch.isin(ranked, allowed.to(ranked.device))][:n])

    @classmethod
    def of(cls, lm_head: torch.nn.Module, ids: Tensor) -> Shortlist:
        """The tokens `ids` ([N]) and their rows of `lm_head` (a linear layer without bias)."""
        if getattr(lm_head, "bias", None) is not None:
            raise SpecResearchError("drafter.vocab needs an lm head without a bias")
        weight = lm_head.weight.detach()  # [V, H]
        ids = ids.to(weight.device)
        head = torch.nn.Linear(weight.shape[1], ids.numel(), bias=False, device=weight.device, dtype=weight.dtype)
        head.weight = torch.nn.Parameter(weight[ids], requires_grad=False)  # [N, H]
        return cls(ids, head, weight.shape[0])

    def widen(self, q: Tensor) -> Tensor:
        """[..., N] a law over the shortlist → [..., V], zero elsewhere: the q a shortlisted draft drew
        from, as the verifier compares it with p."""
        return torch.zeros(*q.shape[:-1], self.vocab_size, dtype=q.dtype, device=q.device).index_copy_(-1, self.ids, q)


# -- drafts in another vocabulary ---------------------------------------------------------------------


def token_pieces(tokenizer, size: int | None = None) -> list[bytes | None]:
    """The bytes each token id stands for: [size] (default: the tokenizer's length), None for an id
    without text. A special or added token stands for its own text ("<|im_end|>"): a tokenizer that
    has the same one finds it in text again.

    Reads byte-level BPE (GPT-2's byte-to-character table: Qwen, SmolLM2, Llama 3), SentencePiece-style
    vocabularies ("▁" for a space, "<0xNN>" byte fallback: Gemma, Llama 2) and, for others, each
    token's own decoded text; a tokenizer may give its own (`token_bytes()`, as the tiny models' do).
    """
    own = getattr(tokenizer, "token_bytes", None)
    if callable(own):
        pieces = list(own())
    else:
        vocab = tokenizer.get_vocab()
        added = {i for i in getattr(tokenizer, "added_tokens_decoder", {})}
        kind = _decoder_kind(tokenizer)
        unicode_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
        pieces = [None] * max(len(tokenizer), max(vocab.values(), default=-1) + 1)
        for token, i in vocab.items():
            if i in added:
                pieces[i] = token.encode()
            elif kind == "bytes" and all(c in unicode_to_byte for c in token):
                pieces[i] = bytes(unicode_to_byte[c] for c in token)
            elif kind == "metaspace" and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                pieces[i] = bytes([int(token[3:5], 16)])
            elif kind == "metaspace":
                pieces[i] = token.replace("\u2581", " ").encode()
            else:
                pieces[i] = tokenizer.convert_tokens_to_string([token]).encode()
    size = len(pieces) if size is None else size
    return (pieces + [None] * size)[:size]


def _decoder_kind(tokenizer) -> str | None:
    """How a fast tokenizer's decoder turns tokens into text: "bytes" (byte-level BPE), "metaspace"
    (SentencePiece's "▁" and byte fallback), or None (another: each token's decoded text is used)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {d.get("type") for d in decoder.get("decoders", [decoder])}
    if "ByteLevel" in kinds:
        return "bytes"
    if "Metaspace" in kinds or "ByteFallback" in kinds:
        return "metaspace"
    return None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: each byte as the printable character byte-level BPE vocabularies write it with."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def encode_bytes(tokenizer, data: bytes) -> list[int]:
    """`data` in `tokenizer`'s ids: exactly, for a tokenizer that encodes bytes (`encode_bytes`), else
    its encoding of the text (bytes that are not UTF-8 read as U+FFFD)."""
    own = getattr(tokenizer, "encode_bytes", None)
    if callable(own):
        return own(data)
    return tokenizer.encode(data.decode("utf-8", errors="replace"), add_special_tokens=False)


def complete_utf8(data: bytes) -> bytes:
    """`data` without a UTF-8 character cut off at its end (at most 3 bytes)."""
    for cut in range(1, min(4, len(data)) + 1):
        lead = data[-cut]
        if lead < 0x80:  # ASCII: nothing open
            return data
        if lead >= 0xC0:  # a lead byte: complete when the character's length fits
            need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            return data if cut >= need else data[:-cut]
    return data


class Bridge:
    """Text between a target's vocabulary and a draft's: the target's context in the draft's tokens,
    the draft's text in the target's tokens, and the tokens both vocabularies share (the same bytes),
    for drafts from another model family (drafters.cross_vocab; Timor et al. 2025).

    The EOS of the draft stands for the target's: both end the text. Read-only once built.
    """

    def __init__(self, target_tokenizer, draft_tokenizer, target_vocab: int, draft_vocab: int):
        """
        Args:
            target_tokenizer, draft_tokenizer: the two tokenizers.
            target_vocab, draft_vocab: the models' logit widths (V_t, V_d), which may exceed the tokenizers'.
        """
        self.target_tokenizer, self.draft_tokenizer = target_tokenizer, draft_tokenizer
        self.target_pieces = token_pieces(target_tokenizer, target_vocab)
        self.draft_pieces = token_pieces(draft_tokenizer, draft_vocab)
        index: dict[bytes, int] = {}
        for i, piece in enumerate(self.target_pieces):
            if piece:
                index.setdefault(piece, i)
        twin = [index.get(piece, -1) if piece else -1 for piece in self.draft_pieces]
        self.target_eos = getattr(target_tokenizer, "eos_token_id", None)
        self.draft_eos = getattr(draft_tokenizer, "eos_token_id", None)
        twin_eos = self.target_eos is not None and self.draft_eos is not None and self.draft_eos < draft_vocab
        if twin_eos:
            twin[self.draft_eos] = self.target_eos
        self.twin = torch.tensor(twin, dtype=torch.long)  # [V_d] each draft token's target token with the same bytes; -1: none
        first = {self.target_eos: self.draft_eos} if twin_eos else {}  # each twin's draft token: the EOS, else the first
        for d, t in enumerate(twin):  # of those with its bytes
            if t >= 0:
                first.setdefault(t, d)
        self.shared = torch.tensor(sorted(first.values()), dtype=torch.long)  # [S] the draft tokens with a twin, one per twin
        self.target_vocab = target_vocab

    @property
    def overlap(self) -> float:
        """The share of the target's vocabulary the draft can propose token for token (TLI's reach)."""
        return self.shared.numel() / self.target_vocab

    def target_text(self, ids: list[int]) -> bytes:
        """The bytes of target tokens (those without text add none)."""
        return _text(self.target_pieces, ids)

    def to_draft(self, ids: list[int]) -> list[int]:
        """The target's tokens `ids` as the draft's tokenizer writes their text."""
        return encode_bytes(self.draft_tokenizer, self.target_text(ids))

    def to_target(self, draft_ids: list[int]) -> list[int]:
        """Text the draft wrote (its tokens, up to its EOS, which becomes the target's) in the target's
        tokens: its encoding by the target's tokenizer, without a character cut off at the end."""
        eos = self.draft_eos is not None and self.draft_eos in draft_ids
        if eos:
            draft_ids = draft_ids[: draft_ids.index(self.draft_eos)]
        text = _text(self.draft_pieces, draft_ids)
        if not callable(getattr(self.target_tokenizer, "encode_bytes", None)):  # (it encodes text: a cut character would be U+FFFD)
            text = complete_utf8(text)
        ids = encode_bytes(self.target_tokenizer, text) if text else []
        return ids + [self.target_eos] * (eos and self.target_eos is not None)


def _text(pieces: list[bytes | None], ids: list[int]) -> bytes:
    """The bytes of tokens `ids` by their `pieces` (those without text add none)."""
    return b"".join(pieces[i] or b"" for i in ids)
