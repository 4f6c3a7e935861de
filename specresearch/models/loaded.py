"""A loaded model: the module, its tokenizer and how it runs (LoadedModel), and what two of them must share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specresearch.errors import SpecResearchError


@dataclass
class LoadedModel:
    """A causal LM ready to decode, with its tokenizer."""

    model: torch.nn.Module  # a transformers CausalLM in eval mode, on `device`, in `dtype`
    tokenizer: Any  # HF tokenizer, or ByteTokenizer for tiny models
    name: str
    device: torch.device
    dtype: torch.dtype
    cache_dir: str | None = None  # the model cache it was loaded with (model.cache_dir; None = the default): where
    # what is made for it (trained heads, vocabulary counts, distillation data) is kept
    cache: str = "dynamic"  # the KV cache its Targets keep (model.cache): dynamic (grows per token) or static (preallocated)
    compile: bool = False  # model.compile: its decoder runs under torch.compile at fixed widths (needs cache static)
    compiled: Any = None  # its compiled decoder and whole model, made at their first compiled forwards (target.static._compiled)


def logit_width(lm: LoadedModel) -> int:
    """The number of logits the model gives per position (its vocabulary, padded as the model has it)."""
    return lm.model.get_output_embeddings().weight.shape[0]


def check_same_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose tokens do not mean the same as the target's.

    Args:
        target: the target model.
        draft: the draft model.
    """
    tv, dv = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if tv != dv:
        raise SpecResearchError(
            f"draft '{draft.name}' ({len(dv)} tokens) and target '{target.name}' ({len(tv)} tokens) have different "
            "vocabularies: a draft in another vocabulary drafts with drafter=cross_vocab (drafter.model.name=NAME)"
        )
    tw, dw = logit_width(target), logit_width(draft)
    if tw != dw:  # same tokens, but p and q would not line up
        raise SpecResearchError(
            f"draft '{draft.name}' gives {dw} logits and target '{target.name}' {tw}: same tokenizer but different "
            "output sizes is not supported yet"
        )
