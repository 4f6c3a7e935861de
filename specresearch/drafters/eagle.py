"""EAGLE (Li et al., 2024): a one-layer draft head that runs autoregressively on the target's features.

At position t the head reads the target's final hidden state f_t and the token x_{t+1} that came out
of it, fc([e(x_{t+1}); f_t]) → one decoder layer of the target's own architecture (with its own KV
cache) → f̂_{t+1}, and the target's frozen lm head turns f̂_{t+1} into a guess for x_{t+2}. Drafting
feeds its own f̂ back for the following tokens; after each verification the target's true features
of the accepted tokens replace them. Trained by `python -m specresearch.train drafter=eagle` on the
same self-distillation data as Medusa's heads.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import AutoModel, DynamicCache

from specresearch.drafters.base import Chain, Context, Drafter, checkpoint_record, find_checkpoint, save_checkpoint
from specresearch.drafters.training import Cache, optimise
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel, default_cache_dir
from specresearch.types import Draft, Verdict
from specresearch.vocab import Shortlist

if TYPE_CHECKING:
    from omegaconf import DictConfig

EAGLE_CLS = 0.1  # EAGLE's weight of the token loss beside the feature regression (Li et al., 2024)
EAGLE_CLIP = 0.5  # EAGLE's gradient-norm clip


class EagleHead(nn.Module):
    """fc([e(x); f]) → one decoder layer (the target's architecture and sizes, its own final norm)
    → the next feature. The token embedding e and the lm head are the target's, frozen, not saved."""

    def __init__(self, config):
        super().__init__()
        cfg = copy.deepcopy(config)
        cfg.num_hidden_layers = 1
        cfg.vocab_size = 1  # fed inputs_embeds: no embedding table of its own
        cfg.pad_token_id = None
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:1]
        hidden = cfg.hidden_size
        self.config = {"hidden": int(hidden)}
        self.fc = nn.Linear(2 * hidden, hidden)
        self.layer = AutoModel.from_config(cfg).float()  # trained in float32 (the config may say bf16); cast when drafting

    def forward(self, embeds: Tensor, features: Tensor, cache: DynamicCache | None = None, mask: Tensor | None = None) -> Tensor:
        """[B, T, H] token embeddings e(x_{t+1}) and [B, T, H] features f_t → [B, T, H] predicted f̂_{t+1}
        (after the pairs in `cache`; `mask` [B, past + T]: 0 = padding)."""
        dtype = self.fc.weight.dtype
        x = self.fc(torch.cat([embeds.to(dtype), features.to(dtype)], dim=-1))  # [B, T, H]
        return self.layer(inputs_embeds=x, past_key_values=cache, use_cache=cache is not None, attention_mask=mask).last_hidden_state

    def save(self, path: Path, meta: dict | None = None) -> None:
        """safetensors weights, with `meta` (target, training) in a JSON file beside them."""
        save_checkpoint(self, path, {**self.config, **(meta or {})})

    @classmethod
    def load(cls, path: Path, config) -> tuple[EagleHead, dict]:
        meta = json.loads(path.with_suffix(".json").read_text())
        head = cls(config)
        head.load_state_dict(load_file(str(path)))
        return head, meta


def eagle_path(target_name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the head trained for `target_name` lives: <model cache>/eagle/<target>/head.safetensors."""
    return Path(cache_dir or default_cache_dir()) / "eagle" / target_name.replace("/", "--") / "head.safetensors"


class EagleDrafter(Drafter):
    """Drafts a chain of k tokens with an EAGLE head: its argmax at T = 0 (q = None), samples from its
    law at T > 0 (q returned). Lossless with greedy and rejection sampling; typical/margin/topk verify
    it lossily as any chain."""

    name = "eagle"
    needs_hidden = True
    suggested_verifier = "greedy"  # Trainable: train suggests decoding with it
    default_checkpoint = staticmethod(eagle_path)

    @classmethod
    def run_label(cls, tc: DictConfig) -> str:
        return "eagle"

    def __init__(
        self,
        target: LoadedModel,
        k: int = 4,
        checkpoint: str | None = None,
        k_policy: str = "fixed",
        k_max: int | None = None,
        vocab: int | None = None,
        vocab_corpus: str = "python-stdlib",
        head: EagleHead | None = None,
        cache_dir: str | None = None,
    ):
        """
        Args:
            target: the target model the head was trained on.
            k: draft tokens per step (a maximum under k_policy=heuristic).
            checkpoint: the head's safetensors file; None = this target's in the model cache.
            k_policy, k_max: how k evolves within a sequence (see engine.DraftLength).
            vocab: the head's lm head scores only the `vocab` most frequent tokens (FR-Spec): the
                lm head is most of a draft step's cost. None = the whole vocabulary. Lossless either way.
            vocab_corpus: offline text the frequencies come from (see specresearch.vocab).
            head: a head to use instead of a checkpoint (tests, a freshly trained head).
            cache_dir: the model cache the default checkpoint lives in (None = the default cache).
        """
        if k < 1:
            raise SpecResearchError(f"drafter.k must be >= 1, got {k}")
        self.k, self.k_policy, self.k_max = int(k), k_policy, k_max  # the engine's DraftLength reads them
        if head is None:
            path = find_checkpoint("eagle", target.name, checkpoint, eagle_path(target.name, cache_dir))
            head, meta = EagleHead.load(path, target.model.config)
            self.trained_on = checkpoint_record("eagle", path, meta)
        self.head = head.to(device=target.device, dtype=target.dtype).eval()
        self.embed = target.model.get_input_embeddings()
        self.lm_head = target.model.get_output_embeddings()
        self.shortlist: Shortlist | None = None  # the tokens the head may propose; None = all
        if vocab is not None:
            self.shortlist = Shortlist.load(self.lm_head, target.tokenizer, int(vocab), vocab_corpus, cache_dir)
            self.lm_head = self.shortlist.head
        self.cache: DynamicCache | None = None
        self.length = 0  # (feature, token) pairs of the accepted text in the head's cache
        self.feature: Tensor | None = None  # [H] f̂ after the last accepted pair: the head's guess source for the next token
        self._forwards = 0

    @classmethod
    def fit(cls, tc: DictConfig, lm: LoadedModel, cache: Cache, tracker=None) -> tuple[EagleHead, dict]:
        """An EAGLE head, one cached sequence (a prompt's continuation, or a text chunk) per step: from each
        pair (f_t, x_{t+1}) it predicts f_{t+1} (smooth L1) and, through the target's lm head, x_{t+2}
        (cross-entropy, weight EAGLE_CLS), as in the paper."""
        lm_head, embed = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
        head = EagleHead(lm.model.config).to(lm.device)
        ids, counts = torch.unique_consecutive(cache.seq, return_counts=True)
        spans = [(int(s), int(n)) for s, n in zip(counts.cumsum(0) - counts, counts) if n > 2]  # (start, length)
        train_spans = [sp for sp in spans if not bool(cache.held_out[sp[0]])]
        if not train_spans:
            raise SpecResearchError("drafter=eagle needs training sequences of 3 or more tokens: raise train.tokens or lower train.held_out")
        gen = torch.Generator().manual_seed(tc.seed)

        def predict(start: int, n: int) -> tuple[Tensor, Tensor, Tensor]:
            """One sequence → (f̂_{t+1} [M, H], f_{t+1} [M, H], x_{t+2} [M]) at its M valid pairs."""
            f = cache.hidden[start : start + n].to(device=lm.device, dtype=torch.float32)  # [n, H]
            x = cache.tokens[start : start + n].to(lm.device)  # [n]: the token after each position
            valid = (x[:-1] >= 0) & (x[1:] >= 0)  # [n - 1]
            f_hat = head(embed(x[:-1].clamp_min(0))[None], f[:-1][None])[0]  # [n - 1, H]
            return f_hat[valid], f[1:][valid], x[1:][valid]

        def batch_loss(step: int) -> tuple[Tensor, Tensor]:
            f_hat, f_next, label = predict(*train_spans[int(torch.randint(len(train_spans), (1,), generator=gen))])
            logits = lm_head(f_hat.to(lm_head.weight.dtype)).float()  # [M, V]
            loss = nn.functional.smooth_l1_loss(f_hat, f_next) + EAGLE_CLS * nn.functional.cross_entropy(logits, label)
            return loss, (logits.argmax(-1) == label).float().mean()[None]

        def agreement(chosen: list[tuple[int, int]]) -> float:
            hits = total = 0
            with torch.inference_mode():
                for start, n in chosen:
                    f_hat, _, label = predict(start, n)
                    hits += int((lm_head(f_hat.to(lm_head.weight.dtype)).argmax(-1) == label).sum())
                    total += label.numel()
            return hits / max(1, total)

        steps = max(1, tc.epochs * len(train_spans))
        first_loss, last_loss = optimise(head, steps, batch_loss, tc, tracker, "eagle head", clip=EAGLE_CLIP)
        held_spans = [sp for sp in spans if bool(cache.held_out[sp[0]])]
        return head, {
            "train_positions": sum(n for _, n in train_spans),
            "steps": steps,
            "first_loss": first_loss,
            "last_loss": last_loss,
            **({"held_out_acc_head1": agreement(held_spans)} if held_spans else {}),
            "train_acc_head1": agreement(train_spans[: max(1, len(held_spans))]),
        }

    def _feed(self, features: Tensor, tokens: Tensor) -> Tensor:
        """Feed pairs (f_t, x_{t+1}) ([T, H], [T]) after the cached ones; return [T, H] the f̂_{t+1}."""
        self._forwards += 1
        return self.head(self.embed(tokens)[None], features[None], self.cache)[0]

    def prefill(self, ctx: Context) -> None:
        if ctx.hidden is None:
            raise SpecResearchError("drafter=eagle needs the target's hidden states (Context.hidden); run it through the Engine")
        self.cache = DynamicCache(config=self.head.layer.config)
        self.feature = self._feed(ctx.hidden, ctx.tokens[1:])[-1]  # the prompt's features, each with the token after it
        self.length = self.cache.get_seq_length()

    def propose(self, ctx: Context) -> Draft:
        chain = Chain(ctx, self.shortlist)
        f = self.feature  # [H]
        for i in range(ctx.max_draft):
            x = chain.add(self.lm_head(f).float())  # from [V] logits, or [N] over the shortlist
            if i + 1 < ctx.max_draft:
                f = self._feed(f[None], x[None])[-1]  # the head's own feature stands in for the target's
        return chain.draft()

    def commit(self, ctx: Context, verdict: Verdict) -> None:
        # Drop the drafted pairs, then feed the target's own features of the tokens it kept, each with
        # the token that followed it (the accepted draft tokens and the added one).
        drafted = self.cache.get_seq_length() - self.length
        if drafted > 0:
            self.cache.crop(-drafted)
        rows = ctx.hidden.shape[0]  # the last token before the step, then the accepted ones
        self.feature = self._feed(ctx.hidden, ctx.tokens[-rows:])[-1]
        self.length = self.cache.get_seq_length()

    @property
    def draft_forwards(self) -> int:
        return self._forwards
