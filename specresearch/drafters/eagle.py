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
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from transformers import AutoModel, DynamicCache

from specresearch.drafters.base import Chain, Context, Drafter
from specresearch.drafters.checkpoints import checkpoint_record, find_checkpoint, load_checkpoint, save_checkpoint
from specresearch.drafters.training import Cache, optimise, rate_name
from specresearch.drafters.tree import TreeShape, sizer, tree_draft
from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM
from specresearch.models import LoadedModel, default_cache_dir
from specresearch.options import drafters as options
from specresearch.options import make
from specresearch.types import Draft, SamplingParams, Verdict
from specresearch.vocab import Shortlist

if TYPE_CHECKING:
    from specresearch.options.runs import Train  # the node conf/train.yaml gives (a DictConfig with these keys)

EAGLE_CLIP = 0.5  # EAGLE's gradient-norm clip


class EagleHead(nn.Module):
    """fc([norm(e(x)); norm(f)]) → one decoder layer (the target's architecture and sizes, its own final
    norm) → the next feature. The token embedding e and the lm head are the target's, frozen, not saved.

    Both inputs pass an RMS norm of their own first (EAGLE-3): a token's embedding is two hundred times
    smaller than a feature (Qwen2.5-Coder-1.5B: RMS 0.017 against 3.8), so without them the head starts
    blind to the token it drafts from and learns to read it only slowly."""

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
        eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.embed_norm, self.feature_norm = nn.RMSNorm(hidden, eps=eps), nn.RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden)
        self.layer = AutoModel.from_config(cfg).float()  # trained in float32 (the config may say bf16); cast when drafting

    def forward(self, embeds: Tensor, features: Tensor, cache: DynamicCache | None = None, mask: Tensor | None = None,
                positions: Tensor | None = None) -> Tensor:
        """[B, T, H] token embeddings e(x_{t+1}) and [B, T, H] features f_t → [B, T, H] predicted f̂_{t+1}
        (after the pairs in `cache`; `mask` [B, past + T]: 0 = padding, or a 4D additive one;
        `positions` [B, T]: None = after the cache)."""
        return self.layer(inputs_embeds=self.inputs(embeds, features), cache=cache, use_cache=cache is not None, attention_mask=mask,
                          position_ids=positions).last_hidden_state

    def inputs(self, embeds: Tensor, features: Tensor) -> Tensor:
        """[..., T, H] the decoder layer's inputs fc([norm(e(x)); norm(f)]) of the pairs (f_t, x_{t+1})."""
        dtype = self.fc.weight.dtype
        return self.fc(torch.cat([self.embed_norm(embeds.to(dtype)), self.feature_norm(features.to(dtype))], dim=-1))

    def save(self, path: Path, meta: dict | None = None) -> None:
        """safetensors weights, with `meta` (target, training) in a JSON file beside them."""
        save_checkpoint(self, path, {**self.config, **(meta or {})})

    @classmethod
    def load(cls, path: Path, config) -> tuple[EagleHead, dict]:
        """A head for a target of `config` and its JSON from `path` (see base.load_checkpoint: a bad file,
        or one saved for another target's shape, is a one-line error)."""
        return load_checkpoint("eagle", path, lambda meta: cls(config))


def unroll(head: EagleHead, embeds: Tensor, features: Tensor, levels: int, start: int = 0) -> list[Tensor]:
    """The head drafting `levels` steps from every position of one sequence at once (EAGLE-3's
    training-time test), one forward per step over a shared KV cache.

    Step 0 reads the pairs (f_i, x_{i+1}) ([T, H] features, [T, H] embeddings of the tokens after them)
    causally. Step l at index i reads (f̂_i of step l - 1, x_{i+1}) and attends, as drafting would, to
    the target's features up to i - l and to steps 1..l of its own chain (indices i - l + 1..i). Steps
    after the first run on rows from `start` on only (a prompt's rows are context, not drafted from).
    A row whose chain would begin before `start` or before the sequence sees only itself: its output
    means nothing (`chained` says which do).

    Returns:
        per step, [T, H]: row i is that step's f̂_{i+1} (zeros before `start` after step 0).
    """
    t, h = features.shape
    dev, dtype = features.device, head.fc.weight.dtype
    i = torch.arange(t, device=dev)  # [T]
    rows = i[start:]  # [R] the rows steps 1.. compute
    cache = DynamicCache(config=head.layer.config)
    outs = [head(embeds[None], features[None], cache, None, i[None])[0]]  # [T, H]: step 0, causal
    for l in range(1, levels):
        f = outs[-1][(rows - 1).clamp_min(0)]  # [R, H] step l - 1's f̂_i (made at i - 1)
        seen = torch.zeros(rows.numel(), t + l * rows.numel(), dtype=torch.bool, device=dev)  # [R, T + l R] keys: step 0, then steps 1..l
        seen[:, :t] = i[None, :] <= (rows - l)[:, None]  # the target's features up to where the chain began
        ok = chained(rows, l, start)  # [R]
        for m in range(1, l + 1):  # its own chain's steps 1..l, at indices i - l + m
            seen[ok.nonzero()[:, 0], t + (m - 1) * rows.numel() + rows[ok] - l + m - start] = True
        seen[(~ok).nonzero()[:, 0], t + (l - 1) * rows.numel() + rows[~ok] - start] = True  # chainless rows: themselves
        mask = torch.zeros(seen.shape, dtype=dtype, device=dev).masked_fill_(~seen, torch.finfo(dtype).min)
        out = head(embeds[None, start:], f[None], cache, mask[None, None], rows[None])[0]  # [R, H]
        outs.append(torch.cat([out.new_zeros(start, h), out]))
    return outs


def chained(rows: Tensor, step: int, start: int = 0) -> Tensor:
    """[R] bool: whether step `step` of `unroll` at each of `rows` has its whole chain (rows >= step,
    and its chain's first drafted index i - step + 1 >= `start` for steps after the first)."""
    return (rows >= step) & ((rows - step + 1 >= start) | (step == 0))


def eagle_path(target_name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the head trained for `target_name` lives: <model cache>/eagle/<target>/head.safetensors."""
    return Path(cache_dir or default_cache_dir()) / "eagle" / target_name.replace("/", "--") / "head.safetensors"


class EagleDrafter(Drafter):
    """Drafts with an EAGLE head: a chain of k tokens (its argmax at T = 0, q = None; samples from its
    law at T > 0, q returned), or with `tree` EAGLE-2's dynamic tree (drafters.tree.TreeShape: the
    `topk` best children of the level's `topk` best nodes by cumulative draft probability, `depth`
    levels, the `nodes` best kept), each node's children drawn from the head run on its parent's f̂.
    Lossless with greedy and rejection sampling; typical/margin/topk verify it lossily."""

    name = "eagle"
    modes = {"chain": (), "dynamic tree": ("tree=true",), "dynamic tree, auto size": ("tree=true", "shape=auto"),
             "dynamic tree, sampled": ("tree=true", "children=sample")}
    needs_hidden = True
    suggested_verifier = "greedy"  # Trainable: train suggests decoding with it
    default_checkpoint = staticmethod(eagle_path)

    @classmethod
    def run_label(cls, tc: Train) -> str:
        return "eagle"

    Settings = options.Eagle

    def __init__(self, target: LoadedModel, head: EagleHead | None = None, **given):
        """
        Args:
            target: the target model the head was trained on.
            head: a head to use instead of a checkpoint (tests, a freshly trained head).
            **given: the settings (`Settings`), the rest at their defaults: a chain of k (k_policy, k_max:
                engine.DraftLength), or with tree=true EAGLE-2's dynamic tree (topk, depth, nodes,
                children: drafters.tree.TreeShape; shape="auto": drafters.tree.Sizer). `vocab`: the head's
                lm head scores only the most frequent tokens (FR-Spec: the lm head is most of a draft
                step's cost). Lossless either way.
        """
        s = self.settings = make(self.Settings, given)
        checkpoint, vocab, vocab_corpus, cache_dir = s.checkpoint, s.vocab, s.vocab_corpus, s.cache_dir
        self.shape = TreeShape(s) if s.tree else None
        if self.shape is not None:
            self.shape.sizer = sizer(s.shape, target, self.shape)
            self.depth = self.shape.depth
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
        weight = self.head.fc.weight  # the head's layer as a CachedLM: each row's (feature, token) pairs in its own slots
        self.draft = CachedLM(LoadedModel(_Features(self.head.layer), None, "eagle head", weight.device, weight.dtype))
        self.features: list[Tensor] = []  # per row, [H] f̂ after its last accepted pair: the source of its next guess

    @classmethod
    def fit(cls, tc: Train, lm: LoadedModel, cache: Cache, tracker=None) -> tuple[EagleHead, dict]:
        """An EAGLE head, one cached sequence (a prompt with its continuation, or a text chunk) per step.

        From each pair (f_t, x_{t+1}) the head predicts f_{t+1} (smooth L1, weight `tc.feature_loss`; EAGLE-3
        drops it) and, through the target's lm
        head, the target's token x_{t+2} (its own with data=self, its top-1 on the text with data=text;
        cross-entropy, weight `tc.token_loss`; the paper's 0.1; over the `tc.vocab` most frequent tokens
        of `tc.vocab_corpus` only if set, FR-Spec, a label outside them counting a miss), with uniform noise of half-width
        `tc.noise` on the target's features (EAGLE-1). With `tc.ttt` = L > 1 it also drafts as it will at
        decode time (EAGLE-3's training-time test): step l reads its own f̂ of step l - 1 and the true
        tokens, attending to the target's features up to where the chain began (`unroll`). The loss
        counts generated positions only; a prompt's positions are context. With `tc.init` (a head's
        safetensors file) training goes on from that head instead of a fresh one."""
        lm_head, embed = lm.model.get_output_embeddings(), lm.model.get_input_embeddings()
        short = torch.arange(lm_head.weight.shape[0], device=lm.device)  # token id → its row of the lm head trained through
        if tc.get("vocab"):  # the token loss over the shortlist only (FR-Spec): the lm head is most of a step's cost
            shortlist = Shortlist.load(lm_head, lm.tokenizer, int(tc.vocab), tc.vocab_corpus, lm.cache_dir)
            lm_head = shortlist.head
            short = torch.full_like(short, -100).index_copy_(0, shortlist.ids, torch.arange(shortlist.ids.numel(), device=lm.device))
        head = EagleHead(lm.model.config).to(lm.device)
        norm = getattr(lm.model.base_model, "norm", None)  # the target's final norm: its features' scale
        if norm is not None and getattr(head.layer, "norm", None) is not None and norm.weight.shape == head.layer.norm.weight.shape:
            with torch.no_grad():  # start the head's own final norm at the target's (Qwen2.5: weights about 4.6, not 1)
                head.layer.norm.weight.copy_(norm.weight.float())
        if tc.get("init"):  # go on training a head trained before (its files were checked with the settings; its shape is checked here)
            try:
                head.load_state_dict(EagleHead.load(Path(tc.init), lm.model.config)[0].state_dict())
            except SpecResearchError as err:
                raise SpecResearchError(f"train.init: {str(err).replace('point drafter.checkpoint at', 'point train.init at')}") from None
        _, counts = torch.unique_consecutive(cache.seq, return_counts=True)
        spans = [(int(s), int(n)) for s, n in zip(counts.cumsum(0) - counts, counts) if n > 2]  # (start, length)
        train_spans = [sp for sp in spans if not bool(cache.held_out[sp[0]])]
        if not train_spans:
            raise SpecResearchError("drafter=eagle needs training sequences of 3 or more tokens: raise train.tokens or "
                                    "lower train.held_out")
        gen = torch.Generator().manual_seed(tc.seed)
        levels = int(tc.ttt)

        def predict(start: int, n: int, noise: float = 0.0) -> tuple[list[Tensor], Tensor, Tensor, Tensor]:
            """One sequence → per step l ([M_l, H] f̂_{t+1}), and the targets f_{t+1} [M_0, H], x_{t+2} [M_0]
            at the M_0 scored pairs, and their positions [M_0] in the cache (M_l: those with a whole
            chain of l steps before, the last rows of M_0)."""
            f = cache.hidden[start : start + n].to(device=lm.device, dtype=torch.float32)  # [n, H]
            x = cache.tokens[start : start + n].to(lm.device)  # [n]: the token after each position
            y = cache.labels[start : start + n - 1, 0].to(lm.device)  # [n - 1]: the target's token t + 2 after the pair t → t + 1
            scored = ((x[1:] >= 0) & (y >= 0) & ~cache.prompt[start + 1 : start + n].to(lm.device)).nonzero()[:, 0]  # [M_0]
            first = max(0, int(scored[0]) - levels + 1) if scored.numel() else 0  # steps 1.. run from here
            f_in = f[:-1]
            if noise > 0:
                f_in = f_in + (torch.rand(f_in.shape, generator=gen) * 2 - 1).to(f_in) * noise
            with torch.autocast(lm.device.type, dtype=torch.bfloat16, enabled=lm.dtype == torch.bfloat16):
                steps = unroll(head, embed(x[:-1].clamp_min(0)), f_in, levels, first)  # levels x [n - 1, H]
            f_hats = [out[scored[chained(scored, l, first)]].float() for l, out in enumerate(steps)]
            return f_hats, f[1:][scored], y[scored], start + 1 + scored.cpu()

        def batch_loss(step: int) -> tuple[Tensor, Tensor]:
            f_hats, f_next, label, _ = predict(*train_spans[int(torch.randint(len(train_spans), (1,), generator=gen))], noise=tc.noise)
            loss, acc = 0.0, []
            label = short[label]  # [M_0] its index in the shortlist, -100 outside it
            for f_hat in f_hats:
                m = f_hat.shape[0]
                logits = lm_head(f_hat.to(lm_head.weight.dtype)).float()  # [M_l, V] or [M_l, N]
                token = nn.functional.cross_entropy(logits, label[-m:]) if bool((label[-m:] >= 0).any()) else logits.sum() * 0
                loss = loss + tc.feature_loss * nn.functional.smooth_l1_loss(f_hat, f_next[-m:]) + tc.token_loss * token
                acc.append((logits.argmax(-1) == label[-m:]).float().mean())
            return loss / len(f_hats), torch.stack(acc)

        def agreement(chosen: list[tuple[int, int]], masks: dict[str | None, Tensor]) -> dict[str | None, list[float]]:
            """Per mask ([N] bool over the cache's positions), per step l, the share of the scored pairs in
            it whose top-1 is the target's token (given the true tokens before)."""
            hits = {name: [0] * levels for name in masks}
            total = {name: [0] * levels for name in masks}
            with torch.inference_mode():
                for start, n in chosen:
                    f_hats, _, label, where = predict(start, n)
                    for l, f_hat in enumerate(f_hats):
                        m = f_hat.shape[0]
                        right = (lm_head(f_hat.to(lm_head.weight.dtype)).argmax(-1) == short[label[-m:]]).cpu()  # [M_l]
                        for name, mask in masks.items():
                            inside = mask[where[-m:]]  # [M_l]
                            hits[name][l] += int((right & inside).sum())
                            total[name][l] += int(inside.sum())
            return {name: [h / max(1, t) for h, t in zip(hits[name], total[name])] for name in masks}

        steps = max(1, tc.epochs * len(train_spans))
        first_loss, last_loss = optimise(head, steps, batch_loss, tc, tracker, "eagle head", clip=EAGLE_CLIP)
        held_spans = [sp for sp in spans if bool(cache.held_out[sp[0]])]
        held = agreement(held_spans, {None: cache.held_out, **cache.held_out_by_corpus(list(tc.corpora))}) if held_spans else {}
        fit = agreement(train_spans[: max(1, len(held_spans))], {None: torch.ones_like(cache.held_out)})[None]
        return head, {
            "train_positions": int(sum(int((~cache.prompt[s : s + n]).sum()) for s, n in train_spans)),
            "steps": steps,
            "first_loss": first_loss,
            "last_loss": last_loss,
            **{rate_name("held_out", l, corpus): a for corpus, accs in held.items() for l, a in enumerate(accs)},
            **{rate_name("train", l): a for l, a in enumerate(fit)},
        }

    def draft_length(self):
        """A chain's k, k_policy and k_max; None for a tree (it sizes its drafts itself)."""
        return None if self.shape is not None else super().draft_length()

    def check_sampling(self, sampling: SamplingParams) -> None:
        if self.shape is not None:
            self.shape.check_sampling(sampling)

    def _pairs(self, features: Tensor, tokens: Tensor) -> Tensor:
        """[T, H] the head layer's inputs of the pairs (features [T, H], tokens [T])."""
        return self.head.inputs(self.embed(tokens), features)

    def _feed(self, features: list[Tensor], tokens: list[Tensor], parents: list[Tensor | None] | None = None,
              tree: int | None = None) -> list[Tensor]:
        """Feed each row's pairs (none where tokens[b] is empty); [n_b, H] their f̂ per row."""
        fed = list(self._pairs(torch.cat(features), torch.cat(tokens)).split([len(x) for x in tokens]))  # every row's in one call
        out = self.draft.forward_rows(fed, parents or [None] * len(fed), tree=tree)
        if tree is None:
            self.draft.keep_rows([range(len(x)) for x in fed])
        self.count(b for b, x in enumerate(fed) if len(x))
        return out

    def prefill_rows(self, ctxs: list[Context]) -> None:
        if any(ctx.hidden is None for ctx in ctxs):
            raise SpecResearchError("drafter=eagle needs the target's hidden states (Context.hidden); run it through the Engine")
        super().prefill_rows(ctxs)
        self.draft.reset()
        out = self.draft.prefill_rows([self._pairs(ctx.hidden, ctx.tokens[1:]) for ctx in ctxs])  # [B, H]
        self.count(range(len(ctxs)))
        self.features = list(out)

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        start, lengths = self.draft.length, list(self.draft.lengths)  # the drafted pairs are dropped after drafting
        drafts = self._trees(ctxs) if self.shape is not None else self._chains(ctxs)
        self.draft.crop_rows(start, lengths)
        return drafts

    def _chains(self, ctxs: list[Context]) -> list[Draft]:
        """Each row's chain: one head forward per drafted token feeds every row still drafting its own f̂
        (the head's feature stands in for the target's) with the token drawn from it."""
        chains = [Chain(ctx, self.shortlist) for ctx in ctxs]
        f = list(self.features)
        none = torch.zeros(0, dtype=torch.long, device=ctxs[0].tokens.device)
        for i in range(max(ctx.max_draft for ctx in ctxs)):
            x = [chain.add(self.lm_head(f[b]).float())[None] if i < ctx.max_draft else none
                 for b, (ctx, chain) in enumerate(zip(ctxs, chains))]
            x = [token if i + 1 < ctx.max_draft else none for token, ctx in zip(x, ctxs)]  # the chain's last token is not fed
            if not any(len(token) for token in x):
                break
            out = self._feed([f[b][None][: len(token)] for b, token in enumerate(x)], x)
            f = [o[-1] if len(token) else old for o, token, old in zip(out, x, f)]
        return [chain.draft() for chain in chains]

    def _trees(self, ctxs: list[Context]) -> list[Draft]:
        """EAGLE-2: each row's tree grows level by level; a level's nodes of every row are fed together
        (each row's under its own tree mask), each as the pair (its parent's f̂, its token), and their f̂
        score their children."""
        started = time.perf_counter()
        depths = [min(self.depth, ctx.max_draft) for ctx in ctxs]
        start, device = self.draft.length, ctxs[0].tokens.device
        expanded: list[list[Tensor]] = [[] for _ in ctxs]  # per row, per expanded node its f̂ [H]
        none = torch.zeros(0, dtype=torch.long)

        def expand(requests: dict[int, tuple[Tensor, Tensor]]) -> dict[int, Tensor]:
            rows = range(len(ctxs))
            features = [torch.stack([self.features[b] if p < 0 else expanded[b][p] for p in requests[b][1].tolist()])
                        if b in requests else self.features[b][None][:0] for b in rows]  # [W_b, H] each node's parent's f̂
            out = self._feed(features, [requests[b][0] if b in requests else none.to(device) for b in rows],
                             [requests[b][1] if b in requests else none for b in rows], tree=start)
            for b in requests:
                expanded[b].extend(out[b])
            logits = self.lm_head(torch.cat([out[b] for b in requests])).float().split([len(out[b]) for b in requests])
            return dict(zip(requests, logits))  # [W_b, V] or [W_b, N] per row

        trees = self.shape.grow_rows(ctxs, depths, lambda b: self.lm_head(self.features[b])[None].float(), expand,
                                     self.token, self.widen, started)
        return [tree_draft([nodes], device) if depth > 0 else Draft.empty(device) for nodes, depth in zip(trees, depths)]

    def token(self, x: int) -> int:
        """The token id of index `x` of the head's logits (its shortlist's, if it has one)."""
        return x if self.shortlist is None else int(self.shortlist.ids[x])

    def widen(self, q: Tensor) -> Tensor:
        """[..., N] a law over the head's logits → [..., V] over the whole vocabulary."""
        return q if self.shortlist is None else self.shortlist.widen(q)

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        # The drafted pairs are gone (propose_rows); feed the target's own features of the tokens it
        # kept, each with the token that followed it (the last token before the step, the accepted ones).
        out = self._feed([ctx.hidden for ctx in ctxs], [ctx.tokens[-ctx.hidden.shape[0]:] for ctx in ctxs])
        self.features = [o[-1] for o in out]

    def select_rows(self, index: list[int]) -> None:
        super().select_rows(index)
        self.draft.select_rows(index)
        self.features = [self.features[i] for i in index]

    @property
    def predicted_speedup(self) -> float | None:
        """shape=auto's predicted speedup over the steps so far (None without it)."""
        return None if self.shape is None or self.shape.sizer is None else self.shape.sizer.predicted_speedup


class _Features(nn.Module):
    """The head's decoder layer as the model a CachedLM runs: fed input embeddings (the pairs'
    `EagleHead.inputs`), its "logits" are its output features f̂."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    @property
    def base_model(self) -> nn.Module:
        return self.layer

    @property
    def config(self):
        return self.layer.config

    @property
    def dtype(self) -> torch.dtype:
        return self.layer.dtype

    def get_input_embeddings(self) -> nn.Module:
        return self.layer.get_input_embeddings()

    def get_output_embeddings(self) -> nn.Module:
        return nn.Identity()

    def forward(self, logits_to_keep: int = 0, **inputs) -> SimpleNamespace:
        return SimpleNamespace(logits=self.layer(**inputs).last_hidden_state[:, -logits_to_keep:])  # [B, K, H]
