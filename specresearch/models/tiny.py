"""Tiny random-weight models built from a config (seeded), with their byte and byte-pair tokenizers: the
tests' and quick tries' models."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from specresearch.errors import SpecResearchError
from specresearch.models.loaded import LoadedModel


class ByteTokenizer:
    """The tiny models' tokenizer: ids 0..255 are bytes, 256 is eos; eos and ids >= 257 decode to ""."""

    eos_token_id = 256
    bos_token_id = None
    pad_token_id = None
    chat_template = None

    def __init__(self, vocab_size: int = 320):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        # eos and the ids above it have no text, skipped or not
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {f"<{i}>": i for i in range(self.vocab_size)}

    def token_bytes(self) -> list[bytes | None]:
        """Each id's bytes (None: eos and the ids above it)."""
        return [bytes([i]) if i < 256 else None for i in range(self.vocab_size)]

    def encode_bytes(self, data: bytes) -> list[int]:
        return list(data)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False, **kwargs):
        text = "".join(m["content"] for m in messages)
        return self.encode(text) if tokenize else text


class PairTokenizer(ByteTokenizer):
    """A second tiny vocabulary, for drafts across tokenizers: ids 0..255 are bytes and 256 eos, as in
    ByteTokenizer, and the ids above are byte pairs (`PAIRS`: two of the letters a..h), taken greedily
    from the left, so a text splits differently than in bytes."""

    PAIRS = [bytes([a, b]) for a in b"abcdefgh" for b in b"abcdefgh"]

    def __init__(self, vocab_size: int = 320):
        super().__init__(vocab_size)
        self.pairs = self.PAIRS[: max(0, vocab_size - 257)]
        self.pair_ids = {pair: 257 + j for j, pair in enumerate(self.pairs)}
        self.pieces = [bytes([i]) if i < 256 else self.pairs[i - 257] if 257 <= i < 257 + len(self.pairs) else None
                       for i in range(vocab_size)]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        ids, i = [], 0
        while i < len(data):
            pair = self.pair_ids.get(data[i : i + 2])
            ids.append(data[i] if pair is None else pair)
            i += 1 if pair is None else 2
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return b"".join(self.pieces[i] or b"" for i in ids if 0 <= i < self.vocab_size).decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        return {f"<{self.pieces[i].hex()}>" if i > 256 and self.pieces[i] else name: i for name, i in super().get_vocab().items()}

    def token_bytes(self) -> list[bytes | None]:
        return list(self.pieces)


TINY_TOKENIZERS = {"bytes": ByteTokenizer, "pairs": PairTokenizer}  # model.tiny.tokenizer


def tiny_model(
    vocab_size: int = 320,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
    init_std: float = 0.5,
    noise: float = 0.0,
    noise_seed: int = 1,
    max_position_embeddings: int = 2048,
    tokenizer: str = "bytes",
    cycle: int = 0,
    logit_scale: float = 1.0,
) -> LoadedModel:
    """A random-weight Qwen2-architecture model with a byte tokenizer, fp32 on cpu.

    Args:
        vocab_size: logits per position; < 257 is allowed (then use token ids directly).
        hidden_size: model width (a multiple of num_heads).
        num_layers: transformer blocks.
        num_heads: attention heads (no grouped kv heads).
        seed: same seed, same weights; the global RNG is left as it was.
        init_std: std of the normal init of every weight matrix (transformers' initializer_range). Logits
            scale with init_std * sqrt(hidden_size): 0.5 makes the next-token distributions peaky (mean
            max prob ~0.5 at vocab 320, hidden 64) so greedy choices are not near-ties.
        noise: if > 0, add N(0, noise^2) to every parameter: a copy close to, not equal to, the seed's model.
        noise_seed: seed of that noise.
        max_position_embeddings: longest sequence.
        tokenizer: "bytes" (ByteTokenizer) or "pairs" (PairTokenizer: the same bytes, and byte pairs
            above eos: a draft whose vocabulary differs from a "bytes" target's).
        cycle: if > 0, a model whose greedy text repeats (`cycle_next`): its embeddings, scaled up, dominate
            the residual stream and its lm head maps each token to the next one of a random cycle of
            `cycle` tokens (the layers still add their part: the argmax is the model's, not a table's).
            Drafts of the same seed (and noise) land on it: the tests that must see drafts accepted.
        logit_scale: scales a cyclic model's logits: at 3e-4 the argmax still cycles and the law at T = 1
            is random (top ≈ 0.85).

    Returns:
        The model (eval mode, float32, cpu) and its tokenizer.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specresearch.attention import use_prefix_attention

    _check_tiny(vocab_size, hidden_size, num_layers, num_heads, max_position_embeddings, init_std, noise, cycle, logit_scale)
    if tokenizer not in TINY_TOKENIZERS:
        raise SpecResearchError(f"unknown model.tiny.tokenizer '{tokenizer}': valid are {', '.join(TINY_TOKENIZERS)}")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=init_std,
        tie_word_embeddings=False,
        eos_token_id=ByteTokenizer.eos_token_id if vocab_size > ByteTokenizer.eos_token_id else None,
        bos_token_id=None,
        attn_implementation="sdpa",  # matches a full forward to ~1e-5 with a DynamicCache and multi-token steps
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float().eval()
    if cycle:
        with torch.no_grad():
            embed = model.model.embed_tokens.weight
            embed.mul_(1000.0)
            prev = torch.argsort(cycle_next(vocab_size, seed, cycle))  # [V] the token before each one in its cycle
            model.lm_head.weight.copy_(embed[prev] * logit_scale)  # logit of j ∝ <e_prev(j), h>: largest for j = next(t)
    if noise > 0:
        gen = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * noise)
    model.generation_config.pad_token_id = config.eos_token_id
    return LoadedModel(use_prefix_attention(model), TINY_TOKENIZERS[tokenizer](vocab_size), "tiny", torch.device("cpu"), torch.float32)


def cycle_next(vocab_size: int, seed: int, cycle: int) -> Tensor:
    """[V] the next token of each token's cycle in a cyclic tiny model (`tiny_model(cycle=...)`): a random
    permutation of the vocabulary (seeded) cut into cycles of `cycle` tokens (the last may be shorter)."""
    order = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))
    following = torch.empty(vocab_size, dtype=torch.long)
    for i in range(0, vocab_size, cycle):
        block = order[i : i + cycle]
        following[block] = block.roll(-1)
    return following


TINY_MIN_VOCAB = 2  # the fewest tokens a model can choose between


def check_tiny_args(tiny: dict | None, path: str = "model.tiny") -> tuple[Any, int]:
    """Refuse, without building it, a tiny model `tiny_model(**tiny)` would refuse (an unknown setting,
    a size out of range, an unknown tokenizer), in one line; so a run refuses it before it waits for the
    speed lock or loads anything. Returns its tokenizer and its max_position_embeddings."""
    args = dict(tiny or {})
    params = inspect.signature(tiny_model).parameters
    unknown = [key for key in args if key not in params]
    if unknown:
        raise SpecResearchError(f"{path} has no setting '{unknown[0]}': valid are {', '.join(params)}")
    a = {key: args.get(key, p.default) for key, p in params.items()}
    _check_tiny(a["vocab_size"], a["hidden_size"], a["num_layers"], a["num_heads"], a["max_position_embeddings"],
                a["init_std"], a["noise"], a["cycle"], a["logit_scale"])
    if a["tokenizer"] not in TINY_TOKENIZERS:
        raise SpecResearchError(f"unknown {path}.tokenizer '{a['tokenizer']}': valid are {', '.join(TINY_TOKENIZERS)}")
    return TINY_TOKENIZERS[a["tokenizer"]](a["vocab_size"]), a["max_position_embeddings"]


def _check_tiny(vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, max_positions: int,
                init_std: float, noise: float, cycle: int = 0, logit_scale: float = 1.0) -> None:
    """Refuse sizes a Qwen2 model cannot be built or run with, in one line naming the valid range."""
    for key, value, least in (("vocab_size", vocab_size, TINY_MIN_VOCAB), ("hidden_size", hidden_size, 2),
                              ("num_layers", num_layers, 1), ("num_heads", num_heads, 1),
                              ("max_position_embeddings", max_positions, 1), ("cycle", cycle, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise SpecResearchError(f"model.tiny.{key} must be an integer >= {least}, got {value!r}")
    if hidden_size % (2 * num_heads):
        near = max(2 * num_heads, round(hidden_size / (2 * num_heads)) * 2 * num_heads)
        raise SpecResearchError(
            f"model.tiny.hidden_size must be a multiple of 2 x num_heads ({2 * num_heads}: each of the {num_heads} heads "
            f"gets an even width for its rotary embedding), got {hidden_size}: e.g. {near}"
        )
    for key, value in (("init_std", init_std), ("noise", noise), ("logit_scale", logit_scale)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise SpecResearchError(f"model.tiny.{key} must be a number >= 0, got {value!r}")
