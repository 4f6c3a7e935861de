"""The numeric floor under a verdict: how far the target's own law moves between the forward paths the
battery's sides read it through, measured along the baseline's own samples.

Plain decoding (the battery's baseline side) reads the target's law after one query token a forward; a
speculative method reads it in verification forwards of k + 1 query tokens; teacher forcing (the
one-sample tests' p) in one forward of L - 1. In exact arithmetic these are one law; in bf16 a kernel
may round differently by the number of queries (measured: mean TV ~0.007 per position, up to 0.05 at
near-ties), and a battery with thousands of samples a side sees that. Here each of `n` baseline
sequences is re-read along the three paths and the TV between the 1-query law and each other path's is
averaged per position. A one-step move of mean TV f_s at position s moves the law of the tokens up to t
by at most Σ_{s≤t} f_s (TV of a joint ≤ the summed expected TVs of its conditionals), so the cumulative
sum bounds the TV the numerics alone can put on position t's marginal: `NumericFloor.bound`.

With model.kernels=invariant every path reads the same bits and the floor is exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from specresearch.models import LoadedModel
from specresearch.sampling import logits_to_probs
from specresearch.stats.samples import SharedPrompt, _chunks
from specresearch.types import SamplingParams


@dataclass
class NumericFloor:
    """Per position t of L, the mean over the baseline's sequences of TV(1-query law, other path's law)."""

    verify: np.ndarray  # [L] against (k + 1)-query forwards (a chain of k verified), the prompt's last token first
    score: np.ndarray  # [L] against teacher forcing (one forward of the sequence)
    chunk: int  # k + 1: the verification forwards' query tokens
    sequences: int  # baseline sequences it was measured along

    @property
    def bound(self) -> np.ndarray:
        """[L] the most TV the verification path's numerics can put on position t's marginal: Σ_{s ≤ t} verify_s."""
        return np.cumsum(self.verify)

    def summary(self) -> dict[str, float]:
        """Flat metrics (`floor_` prefixed by the caller)."""
        return {"verify_mean": float(self.verify.mean()), "verify_max": float(self.verify.max()),
                "score_mean": float(self.score.mean()), "bound_max": float(self.bound.max()), "chunk": self.chunk,
                "sequences": self.sequences}

    def as_dict(self) -> dict:
        return {"verify": self.verify.tolist(), "score": self.score.tolist(), "bound": self.bound.tolist(), "chunk": self.chunk,
                "sequences": self.sequences}


@torch.inference_mode()
def numeric_floor(lm: LoadedModel, prompts: list[list[int]], tokens: list[np.ndarray], sampling: SamplingParams, chunk: int,
                  batch: int = 32) -> NumericFloor:
    """Measure the floor along sampled sequences.

    Args:
        lm: the target, as the battery runs it (dtype, kernels).
        prompts: the prompts' token ids (at least 2 tokens each).
        tokens: per prompt, [n_i, L] of the baseline's sequences that continue it.
        sampling: the laws are compared after the run's temperature, top-k and top-p.
        chunk: query tokens of a verification forward (k + 1).
        batch: sequences per forward.

    Returns:
        The per-position mean TVs over every sequence given.
    """
    verify, score = [], []
    for prompt, x_all in zip(prompts, tokens):
        full, cut = SharedPrompt(lm, prompt), SharedPrompt(lm, prompt[:-1])
        for start, b in zip(range(0, len(x_all), batch), _chunks(len(x_all), batch)):
            x = torch.as_tensor(x_all[start : start + b], device=lm.device)  # [b, L]
            first = full.logits.expand(b, 1, -1)  # [b, 1, V] the law of x[:, 0] from the prompt's prefill (both sides read it)
            one = torch.cat([first, _fed(full, x[:, :-1], 1)], 1)  # [b, L, V] one query a forward: plain decoding
            tf = torch.cat([first, _fed(full, x[:, :-1], x.shape[1])], 1)  # teacher forcing
            last = torch.tensor(prompt[-1:], device=lm.device).expand(b, 1)
            ver = _fed(cut, torch.cat([last, x[:, :-1]], 1), chunk)  # [b, L, V] verification: [prompt's last, drafts...]
            p = logits_to_probs(one.float(), sampling)
            verify.append(_tv(p, logits_to_probs(ver.float(), sampling)))
            score.append(_tv(p, logits_to_probs(tf.float(), sampling)))
    return NumericFloor(np.concatenate(verify).mean(0), np.concatenate(score).mean(0), chunk, sum(len(x) for x in tokens))


@torch.inference_mode()
def one_query_laws(lm: LoadedModel, prompt: list[int], text: list[int], sampling: SamplingParams) -> Tensor:
    """[L, V] the target's law at each position of `text` ([L] tokens after `prompt`) as plain decoding reads it:
    the prompt but its last token prefilled, then one query token a forward (the prompt's last, then the text's)."""
    cut = SharedPrompt(lm, prompt[:-1])
    ids = torch.tensor([prompt[-1:] + list(text[:-1])], device=lm.device)  # [1, L]
    return logits_to_probs(_fed(cut, ids, 1)[0].float(), sampling)


def _fed(shared: SharedPrompt, ids: Tensor, chunk: int) -> Tensor:
    """[b, T, V] the logits after each of `ids` ([b, T]) fed after the shared prompt, `chunk` tokens a forward."""
    if ids.shape[1] == 0:
        return shared.logits.new_zeros(ids.shape[0], 0, shared.logits.shape[-1])
    cache, prefix = shared.rows(ids.shape[0])
    positions = shared.positions(ids.shape[0], ids.shape[1])
    out = []
    for s in range(0, ids.shape[1], chunk):
        out.append(shared.lm.model(input_ids=ids[:, s : s + chunk], cache=cache, use_cache=True, position_ids=positions[:, s : s + chunk],
                                   **({"prefix": prefix} if prefix is not None else {})).logits)
    return torch.cat(out, 1)


def _tv(p: Tensor, q: Tensor) -> np.ndarray:
    return (0.5 * (p - q).abs().sum(-1)).double().cpu().numpy()  # [b, L]
