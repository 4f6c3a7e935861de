"""Medusa (Cai et al., 2024): K extra heads on the target's last hidden state guess the tokens after
the next one; their top choices make a token tree the target verifies in one forward. The heads are
trained on the target's own predictions (`python -m specresearch.train`)."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import operator
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from specresearch.drafters.base import Context, Drafter, common_prefix
from specresearch.drafters.checkpoints import checkpoint_record, find_checkpoint, load_checkpoint, save_checkpoint
from specresearch.drafters.ngram import match_rows
from specresearch.drafters.training import Cache, hits, optimise, rate_name
from specresearch.drafters.tree import Sizer, check_fits
from specresearch.errors import SpecResearchError
from specresearch.models import LoadedModel, default_cache_dir, say_once
from specresearch.options import drafters as options
from specresearch.options import make
from specresearch.sampling import logits_to_probs
from specresearch.types import Draft, SamplingParams, Trie, Verdict
from specresearch.vocab import Shortlist

if TYPE_CHECKING:
    from specresearch.options.runs import Train  # the node conf/train.yaml gives (a DictConfig with these keys)

log = logging.getLogger(__name__)

# Medusa's "tree of choices": each path lists, per depth, which of that head's top tokens to take.
# 8 nodes, depth 3 (the default 3 heads): sized for a 2-core CPU, where verifying 9 tokens costs
# ~2.2 one-token forwards (Medusa's GPU default has 64 nodes over 4 heads).
DEFAULT_CHOICES = [[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0], [0, 1, 0], [0, 0, 1]]
RANKS = 10  # ranks whose held-out hit rates the checkpoint keeps (drafter=medusa builds its tree from them)
NGRAM = 3  # the lookup branch continues the context's last n-gram, n from NGRAM down to 1


def best_choices(rank_acc: Sequence[Sequence[float]], nodes: int) -> list[tuple[int, ...]]:
    """Medusa's sparse tree of choices from measured head accuracies: the `nodes` paths most likely to
    be accepted whole, taking head d's rank-r token to be the target's own with probability
    rank_acc[d][r], independently across depths (as Medusa's tree search does). Their probabilities sum
    to the expected accepted length, so the `nodes` likeliest paths maximise it; the set holds every
    path's parent, since a path is at most as likely as its parent.

    Args:
        rank_acc: [K][R] per head, the held-out hit rate of each rank (the checkpoint's "rank_acc").
        nodes: the tree's size.

    Returns:
        Paths of per-depth ranks, likeliest first.
    """
    frontier = [(-float(a), (r,)) for r, a in enumerate(rank_acc[0])]
    heapq.heapify(frontier)
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < nodes:
        neg, path = heapq.heappop(frontier)
        chosen.append(path)
        if len(path) < len(rank_acc):
            for r, a in enumerate(rank_acc[len(path)]):
                heapq.heappush(frontier, (neg * float(a), (*path, r)))
    return chosen


def sized_choices(rank_acc: Sequence[Sequence[float]], cost: Callable[[int], float], nodes: int) -> tuple[list[tuple[int, ...]], float]:
    """Sequoia's sizing (Chen et al., 2024) of Medusa's tree: of the trees `best_choices` makes (the
    likeliest paths, which maximise the expected accepted length for their size), the size in
    1..`nodes` whose predicted speedup τ(n) / v(n + 1) is largest, where τ(n) = 1 + the sum of the
    n paths' probabilities (the expected tokens per verification, bonus included) and v(m) the
    measured cost of verifying m tokens over one token's (drafters.tree.Sizer, with no drafting
    time). The heads' own cost, the prefill and the acceptance step are left out (9%, 14% and 4% of
    the README's shape=auto run).

    Args:
        rank_acc: [K][R] the heads' held-out hit rate per rank.
        cost: v(m), m tokens fed to the target (the root and n nodes) over one token.
        nodes: the largest tree considered.

    Returns:
        The chosen paths and the predicted speedup over plain decoding.
    """
    paths = best_choices(rank_acc, nodes)
    sizer = Sizer(cost, unit=1.0)
    n = sizer.size([math.prod(float(rank_acc[d][r]) for d, r in enumerate(path)) for path in paths], drafting=0.0)
    return paths[:n], sizer.predicted_speedup


class ResBlock(nn.Module):
    """h + SiLU(W h + b), W initialised to zero: an untrained head starts as the target's lm head."""

    def __init__(self, hidden: int):
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: Tensor) -> Tensor:
        return h + nn.functional.silu(self.linear(h))


SHAPE_KEYS = ("hidden", "heads", "layers", "own_lm_head", "vocab")  # MedusaHeads' arguments, as its JSON keeps them


class MedusaHeads(nn.Module):
    """K Medusa-1 heads: head i (0-based) maps the hidden state at position t to logits for the token
    at t + 2 + i, through `layers` residual blocks and an lm head: the target's, shared and frozen
    (not a parameter here, not saved), or with `own_lm_head` a trainable copy per head, initialised
    from the target's (`init_lm_heads`) and saved with the blocks."""

    def __init__(self, hidden: int, heads: int = 3, layers: int = 1, own_lm_head: bool = False, vocab: int = 0):
        super().__init__()
        self.config = {"hidden": int(hidden), "heads": int(heads), "layers": int(layers), "own_lm_head": bool(own_lm_head),
                       "vocab": int(vocab)}
        self.blocks = nn.ModuleList(nn.Sequential(*(ResBlock(hidden) for _ in range(layers))) for _ in range(heads))
        if own_lm_head and vocab < 1:
            raise SpecResearchError("Medusa heads with their own lm heads need the vocabulary size")
        self.lm_heads = nn.ModuleList(nn.Linear(hidden, vocab, bias=False) for _ in range(heads)) if own_lm_head else None

    def init_lm_heads(self, lm_head: nn.Module) -> None:
        """Copy the target's lm head into every head's own (with own_lm_head)."""
        with torch.no_grad():
            for own in self.lm_heads or ():
                own.weight.copy_(lm_head.weight)

    def forward(self, h: Tensor, lm_head: nn.Module) -> Tensor:
        """[..., H] hidden states → [K, ..., V] logits, one row block per head (with the shared lm
        head, one call for all heads: at decode time K rows stream the vocabulary matrix once)."""
        x = torch.stack([block(h) for block in self.blocks])  # [K, ..., H]
        if self.lm_heads is None:
            return lm_head(x.to(lm_head.weight.dtype))  # trained in float32 on a bf16 target's frozen lm head
        return torch.stack([own(xi) for own, xi in zip(self.lm_heads, x)])

    def save(self, path: Path, meta: dict | None = None) -> None:
        """safetensors weights, with the shape and `meta` (target, training) in a JSON file beside them."""
        save_checkpoint(self, path, {**self.config, **(meta or {})})

    @classmethod
    def load(cls, path: Path) -> tuple[MedusaHeads, dict]:
        """Heads and their JSON from `path` (see base.load_checkpoint: a bad file is a one-line error)."""
        return load_checkpoint("medusa", path, lambda meta: cls(*(meta[key] for key in SHAPE_KEYS)), SHAPE_KEYS)


def checkpoint_path(target_name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the heads trained for `target_name` live: <model cache>/medusa/<target>/heads.safetensors."""
    return Path(cache_dir or default_cache_dir()) / "medusa" / target_name.replace("/", "--") / "heads.safetensors"


def accuracy(heads: MedusaHeads, lm_head: torch.nn.Module, cache: Cache, mask: Tensor, ranks: int = RANKS, batch: int = 256,
             rows_of: Tensor | None = None) -> Tensor:
    """[K, ranks] per head, the share of the positions in `mask` whose label (the target's own token)
    is the head's rank-r token: column 0 is the top-1 agreement; a row's sum, the top-`ranks` one.
    `rows_of`: [V] each token's row of a shortlist `lm_head` (`shortlist_rows`); a label off the
    shortlist counts a miss."""
    found = torch.zeros(heads.config["heads"], ranks)
    counts = torch.zeros(heads.config["heads"])
    rows = mask.nonzero()[:, 0]
    with torch.inference_mode():
        for s in range(0, rows.numel(), batch):
            r = rows[s : s + batch]
            logits = heads(cache.hidden[r].to(device=lm_head.weight.device, dtype=torch.float32), lm_head)  # [K, B, V]
            labels = cache.labels[r].T if rows_of is None else shortlist_labels(cache.labels[r].T, rows_of.cpu())  # [K, B]
            h, c = hits(logits.topk(ranks, dim=-1).indices.cpu(), labels)
            found, counts = found + h, counts + c
    return found / counts.clamp_min(1)[:, None]


def shortlist_rows(shortlist: Shortlist) -> Tensor:
    """[V] each token's row of the shortlist's head, N (no row) for a token off it."""
    n = shortlist.ids.numel()
    return torch.full((shortlist.vocab_size,), n, dtype=torch.long, device=shortlist.ids.device).index_copy_(
        0, shortlist.ids, torch.arange(n, device=shortlist.ids.device))


def shortlist_labels(labels: Tensor, rows_of: Tensor) -> Tensor:
    """Token labels (−100 = none) → rows of the shortlist head: N for a token off it (a label no row
    predicts: a miss), −100 kept."""
    return torch.where(labels >= 0, rows_of[labels.clamp_min(0)], labels)


class BranchRate:
    """The lookup branch's measured acceptance by depth, per length n of the n-gram it continues: of
    the steps that offered its token at depth i and kept the i before it, the share that kept it too
    (Laplace's rule: 1/2 before any); the chance of keeping its first i + 1 tokens is the product of
    those up to i.

    Conditional rates, because a branch is cut where it stops paying: a step that offers only its first
    tokens, or rejects the first, says nothing of the deeper ones' chances once those are reached (an
    unconditional share would count it against them, and early misses would cut the branch for good).
    Per n, because a continuation of a longer match is kept more often (HumanEval 100-103, the heads'
    4 nodes with the whole branch: its first token kept 0.67 of the time after a 3-gram, 0.36 after a
    1-gram)."""

    def __init__(self, most: int, ngrams: int = NGRAM):
        # [n][i] per match length n (0..ngrams) and depth i (0-based): steps offering token i after keeping 0..i-1 / keeping it
        self.offered = [[0] * most for _ in range(ngrams + 1)]
        self.kept = [[0] * most for _ in range(ngrams + 1)]

    def probs(self, count: int, n: int) -> list[float]:
        """The chances of keeping the first 1..`count` tokens of a branch that continues an n-gram."""
        rates = [(k + 1) / (o + 2) for k, o in zip(self.kept[n][:count], self.offered[n][:count])]
        return list(itertools.accumulate(rates, operator.mul))

    def update(self, offered: int, kept: int, n: int) -> None:
        """One step offered the first `offered` tokens of a branch after an n-gram and accepted its first `kept`."""
        for i in range(min(offered, kept + 1)):
            self.offered[n][i] += 1
            self.kept[n][i] += i < kept


class MedusaDrafter(Drafter):
    """Proposes Medusa's tree of choices from the heads applied to the target's hidden state at the
    position that predicted the newest token: head d's top tokens are the candidates at depth d.

    Children are the heads' top tokens (`children=top`: deterministic, q = None; lossless with greedy
    and rejection sampling, verified by multi-step speculative sampling) or, at T > 0, drawn
    independently from the heads' laws (`children=sample`: q = that head's law after the sampling
    settings; lossless with rejection sampling). `typical` (Medusa's default) and `margin` verify the
    tree lossily (longest passing path).

    With `lookup`, prompt lookup's continuation (the tokens that followed the last earlier occurrence
    of the context's last n-gram) is a branch of the same tree: it follows the heads' nodes while they
    hold its tokens and goes on as new nodes, deeper than the heads reach, all verified in the one
    forward. It depends on the context alone (q = None), so each rule verifies it as it verifies the
    heads' candidates. With shape=auto the branch is cut per step where it stops paying: the prefix with
    the best predicted speedup (τ̂ / v(m), as Sequoia's) is kept, τ̂ crediting each new node with the
    measured chance that the branch is kept down to it (`BranchRate`: per depth, the share of the steps
    that reached it and kept it, from a prior of 1/2, multiplied down the branch; per length of the
    n-gram the branch continues) and v(m) this target's measured cost of verifying the tree's m tokens.
    It depends on past verdicts only, as a chain's heuristic k does, so it stays lossless.
    """

    name = "medusa"
    modes = {"top": ("lookup=0",), "sample": ("children=sample", "lookup=0"), "lookup": ()}  # lookup: the default
    needs_hidden = True
    suggested_verifier = "typical"  # Trainable: Medusa's own acceptance
    default_checkpoint = staticmethod(checkpoint_path)

    @classmethod
    def run_label(cls, tc: Train) -> str:
        return f"medusa x{tc.heads}"

    Settings = options.Medusa

    def __init__(self, target: LoadedModel, heads: MedusaHeads | None = None, **given):
        """
        Args:
            target: the target model the heads were trained on.
            heads: heads to use instead of a checkpoint (tests, freshly trained heads).
            **given: the settings (`Settings`), the rest at their defaults. `choices` (paths of per-depth
                ranks, e.g. [[0], [0, 0], [1]]) are used as given (`shape` is not applied); None = sized
                by `shape`: of the likeliest paths by the checkpoint's held-out accuracies
                (`best_choices`), or DEFAULT_CHOICES for heads without them. shape="auto": Sequoia's
                sizing (`sized_choices`): the size in 1..`nodes` with the best predicted speedup, from the
                checkpoint's hit rates and this target's cost of verifying m tokens on this machine
                (measured once, a few seconds, and kept in the model cache: target.kept_cost_curve).
                `vocab`: the heads' lm head reads the `vocab` most frequent tokens' rows only (FR-Spec);
                None = the shortlist the heads were trained on, else the whole vocabulary. Lossless either way.
        """
        s = self.settings = make(self.Settings, given)
        checkpoint, choices, nodes, shape, children = s.checkpoint, s.choices, s.nodes, s.shape, s.children
        vocab, vocab_corpus, cache_dir = s.vocab, s.vocab_corpus, s.cache_dir
        check_fits(target, (nodes if choices is None else len(choices)) + s.lookup,
                   "drafter.nodes" if choices is None else "drafter.choices")
        meta: dict = {}
        if heads is None:
            path = find_checkpoint("medusa", target.name, checkpoint, checkpoint_path(target.name, cache_dir))
            heads, meta = MedusaHeads.load(path)
            self.trained_on = checkpoint_record("medusa", path, meta)
        self.lookup = s.lookup
        sizes = shape == "auto" and (self.lookup or (choices is None and meta.get("rank_acc")))  # the heads' tree or the branch
        self.sizer = Sizer.measure(target, nodes + self.lookup) if sizes else None  # v(m) up to the widest tree
        if shape == "auto" and choices is None:
            if meta.get("rank_acc"):
                choices, self.predicted_speedup = sized_choices(meta["rank_acc"], self.sizer.v, nodes)
                log.info("drafter.shape=auto: a tree of %d nodes, %d deep, predicted speedup %.2fx (Sequoia sizing, measured v)",
                         len(choices), max(map(len, choices)), self.predicted_speedup)
            else:
                say_once("drafter.shape=auto: these heads record no held-out hit rates (heads not trained by specresearch.train): "
                         f"Medusa's default {len(DEFAULT_CHOICES)}-node tree instead")
        if choices is None:
            choices = best_choices(meta["rank_acc"], nodes) if meta.get("rank_acc") else DEFAULT_CHOICES
        choices = [tuple(int(r) for r in c) for c in choices]
        hidden = target.model.get_output_embeddings().weight.shape[1]
        if heads.config["hidden"] != hidden:
            raise SpecResearchError(f"the heads expect hidden size {heads.config['hidden']}, {target.name} has {hidden}")
        depth = max(len(c) for c in choices)
        if depth > heads.config["heads"]:
            raise SpecResearchError(f"drafter.choices go {depth} deep but there are {heads.config['heads']} heads")
        self.choices = sorted(choices, key=lambda c: (len(c), c))  # parents before children
        self.children = children
        self.heads = heads.to(device=target.device, dtype=target.dtype).eval()
        self.lm_head = target.model.get_output_embeddings()
        self.shortlist: Shortlist | None = None  # the tokens the heads may propose; None = all
        trained = meta.get("train") or {}
        if vocab is None and trained.get("vocab"):  # heads trained on a shortlist score it (its rows are all they learned)
            vocab, vocab_corpus = trained["vocab"], trained.get("vocab_corpus", vocab_corpus)
        if vocab is not None:
            if heads.lm_heads is not None:
                raise SpecResearchError("drafter.vocab needs heads on the target's own lm head (not train.own_lm_head)")
            self.shortlist = Shortlist.load(self.lm_head, target.tokenizer, int(vocab), vocab_corpus, cache_dir)
            self.lm_head = self.shortlist.head
        self.depth = max(depth, self.lookup)  # the longest path: the heads', or the lookup branch's
        # τ̂ of the heads' tree: 1 + its paths' chances of being accepted whole (hit rates per rank; unknown: none)
        rank_acc = meta.get("rank_acc")
        self._tau = 1 + (sum(math.prod(rank_acc[d][r] for d, r in enumerate(c)) for c in self.choices) if rank_acc else 0.0)
        self.rate = BranchRate(self.lookup)
        self._branches: list[tuple[list[int], int]] = []  # each row's lookup-branch nodes of the last step (root first), its n-gram's n
        self._width = [1 + max(c[d] for c in choices if len(c) > d) for d in range(depth)]  # top-k per head

    def check_sampling(self, sampling: SamplingParams) -> None:
        if self.children == "sample" and sampling.greedy:
            raise SpecResearchError("drafter.children=sample draws children from the heads' laws at temperature > 0; "
                                    "use children=top for greedy decoding")

    def propose_rows(self, ctxs: Sequence[Context]) -> list[Draft]:
        """One tree per row: the heads read every row's hidden state in one forward (the lm head's
        matrix streamed once for all rows and heads), then each row's tree comes from its own top
        tokens (or draws from its own generator), as it would alone."""
        if any(ctx.hidden is None for ctx in ctxs):
            raise SpecResearchError("drafter=medusa needs the target's hidden state (Context.hidden); run it through the Engine")
        drafts = [Draft.empty(ctx.tokens.device) for ctx in ctxs]
        self._branches = [([], 0) for _ in ctxs]
        live = [b for b, ctx in enumerate(ctxs) if ctx.max_draft >= 1]
        if live:
            logits = self.heads(torch.stack([ctxs[b].hidden[-1] for b in live]), self.lm_head).float()  # [K, B', V] or [K, B', N]
            room = [min(self.lookup, ctxs[b].max_draft) for b in live]
            found, ngram = (match_rows([ctxs[b].tokens for b in live], room, NGRAM, match="last") if self.lookup
                            else ([ctxs[b].tokens[:0] for b in live], [0] * len(live)))  # [G_b] each row's lookup branch, its n
            for j, b in enumerate(live):
                drafts[b], branch = self._tree(ctxs[b], logits[:, j], found[j], ngram[j])
                self._branches[b] = (branch, ngram[j])
        return drafts

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        """The lookup branch's acceptance (`BranchRate`): how far each row's accepted path followed it."""
        for (branch, n), verdict in zip(self._branches, verdicts):
            if branch:
                self.rate.update(len(branch), common_prefix(branch, verdict.path), n)

    def _tree(self, ctx: Context, logits: Tensor, guess: Tensor, n: int) -> tuple[Draft, list[int]]:
        """The tree of choices (those within ctx.max_draft) from one row's head logits ([K, V] or [K, N]),
        with prompt lookup's `guess` ([G], G <= ctx.max_draft; the continuation of an n-gram) as a branch
        from the root (as much of it as `_branch_length` keeps). Returns the draft and the branch's nodes,
        root first."""
        device = ctx.tokens.device
        choices = [c for c in self.choices if len(c) <= ctx.max_draft]
        widths = self._width[: max(map(len, choices))]  # the heads this step's tree reads (all but near the end)
        if self.children == "top":
            laws, q = None, None
            ranked = [torch.topk(logits[d], w).indices for d, w in enumerate(widths)]
        else:
            laws = logits_to_probs(logits, ctx.sampling)  # [K, V] or [K, N]
            ranked = [torch.multinomial(laws[d], w, replacement=True, generator=ctx.rng) for d, w in enumerate(widths)]
        if self.shortlist is not None:
            ranked = [self.shortlist.ids[r] for r in ranked]
        ranked = [r.tolist() for r in ranked]
        index = {c: i for i, c in enumerate(choices)}
        tokens = [ranked[len(c) - 1][c[-1]] for c in choices]
        parents = [index[c[:-1]] if len(c) > 1 else -1 for c in choices]
        branch = []  # the lookup branch's nodes, root first
        if guess.numel():  # its prefix the heads already hold is their nodes; the rest hangs below (children=top only)
            trie = Trie()
            for token, parent in zip(tokens, parents):
                trie.add(parent, token)
            for token in guess[: self._branch_length(trie, guess.tolist(), len(tokens), n)].tolist():
                branch.append(trie.add(branch[-1] if branch else -1, token))
            tokens, parents = trie.tokens, trie.parents
        if laws is not None:
            q = laws[[len(c) - 1 for c in choices]]  # [M, V]: node at depth d was drawn from head d's law
            if self.shortlist is not None:  # the law over the whole vocabulary: zero off the shortlist
                q = self.shortlist.widen(q)
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long, device=device), q=q, parents=torch.tensor(parents)), branch

    def _branch_length(self, trie: Trie, guess: list[int], heads: int, n: int) -> int:
        """How much of the lookup `guess` (the continuation of an n-gram) joins a tree of `heads` nodes
        (`trie`): all of it without shape=auto, else the prefix with the best predicted speedup (τ̂ + the
        new nodes' measured chances of being kept, `BranchRate`) / v(heads + 1 + new nodes); the heads'
        own nodes along it cost nothing."""
        if self.sizer is None:
            return len(guess)
        tau, new, node, best = self._tau, 0, -1, (self._tau / self.sizer.v(heads + 1), 0)
        for i, (token, rate) in enumerate(zip(guess, self.rate.probs(len(guess), n))):
            node = trie.find(node, token) if node is not None else None
            if node is None:  # a new node (and so is every one below it)
                new, tau = new + 1, tau + rate
            speedup = tau / self.sizer.v(heads + 1 + new)
            if speedup > best[0]:
                best = (speedup, i + 1)
        return best[1]

    @classmethod
    def fit(cls, tc: Train, lm: LoadedModel, cache: Cache, tracker=None) -> tuple[MedusaHeads, dict]:
        """Medusa heads on random batches of `tc.batch` cached positions: cross-entropy on each head's
        label (the target's top-1), and with `tc.soft` > 0 the KL divergence KL(p ‖ q) from the target's
        whole law p at the label's position (its lm head on the cached hidden state there: soft labels,
        as Medusa-2's self-distillation; no extra target forward) to the head's q, weighted soft against
        1 − soft. With `tc.vocab` the heads score only the `tc.vocab` most frequent tokens of
        `tc.vocab_corpus` (FR-Spec), in training and then at decode time (the drafter reads the
        checkpoint's train.vocab): the frozen lm head is most of a step's cost (5x faster steps at
        32,768 of Qwen's 151,936); a label off the shortlist is left out of the loss and counts a miss."""
        lm_head = lm.model.get_output_embeddings()
        heads = MedusaHeads(cache.hidden.shape[1], tc.heads, tc.layers, tc.own_lm_head, lm_head.weight.shape[0])
        heads.init_lm_heads(lm_head)
        rows_of = None  # [V] token → row of the shortlist head (train.vocab), else the lm head's own rows
        if tc.get("vocab"):
            if tc.own_lm_head:
                raise SpecResearchError("train.vocab trains heads on the target's own lm head: not with train.own_lm_head=true")
            shortlist = Shortlist.load(lm_head, lm.tokenizer, int(tc.vocab), tc.vocab_corpus, lm.cache_dir)
            lm_head, rows_of = shortlist.head, shortlist_rows(shortlist)
        heads.to(lm.device)
        train_rows = (~cache.held_out & (cache.labels[:, 0] >= 0)).nonzero()[:, 0]
        gen = torch.Generator().manual_seed(tc.seed)
        soft = float(tc.get("soft", 0.0))
        ahead = 1 + torch.arange(tc.heads)[:, None]  # [K, 1]: head i's label is the target's top-1 at row r + 1 + i

        def batch_loss(step: int) -> tuple[Tensor, Tensor]:
            r = train_rows[torch.randint(train_rows.numel(), (tc.batch,), generator=gen)]  # [B]
            logits = heads(cache.hidden[r].to(device=lm.device, dtype=torch.float32), lm_head).float()  # [K, B, V]
            lab = cache.labels[r].T.to(lm.device)  # [K, B]
            if rows_of is not None:
                lab = shortlist_labels(lab, rows_of)
            right, counts = hits(logits.argmax(-1, keepdim=True), lab)
            off = lab >= logits.shape[-1]  # off the shortlist: a miss, no loss
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), lab.masked_fill(off, -100).flatten(), ignore_index=-100)
            if soft:
                at = (r[None] + ahead).clamp(max=len(cache.hidden) - 1)  # [K, B] the rows whose hidden state gave each label
                labelled = (lab >= 0) & (cache.seq[at] == cache.seq[r][None]).to(lm.device)  # [K, B] (a label never crosses a sequence)
                with torch.no_grad():
                    p = torch.softmax(lm_head(cache.hidden[at].to(device=lm.device, dtype=lm_head.weight.dtype)).float(), -1)  # [K, B, V]
                kl = (torch.xlogy(p, p) - p * torch.log_softmax(logits, -1)).sum(-1)  # [K, B]
                loss = (1 - soft) * loss + soft * kl[labelled].mean()
            return loss, right[:, 0] / counts.clamp_min(1)

        steps = max(1, tc.epochs * train_rows.numel() // tc.batch)
        first_loss, last_loss = optimise(heads, steps, batch_loss, tc, tracker, "medusa heads")
        held = accuracy(heads, lm_head, cache, cache.held_out, rows_of=rows_of) if bool(cache.held_out.any()) else None  # [K, RANKS]
        seen = torch.zeros_like(cache.held_out)  # as many training positions, to show the generalisation gap
        seen[train_rows[torch.randperm(train_rows.numel(), generator=gen)[: max(1, int(cache.held_out.sum()))]]] = True
        fit = accuracy(heads, lm_head, cache, seen, rows_of=rows_of)[:, 0].tolist()
        per_corpus = {corpus: accuracy(heads, lm_head, cache, mask, rows_of=rows_of)[:, 0].tolist()
                      for corpus, mask in cache.held_out_by_corpus(list(tc.corpora)).items()}
        return heads, {
            "train_positions": int(train_rows.numel()),
            "steps": steps,
            "first_loss": first_loss,
            "last_loss": last_loss,
            **{rate_name("held_out", i): a for i, a in enumerate([] if held is None else held[:, 0].tolist())},
            **{f"held_out_top5_head{i + 1}": a for i, a in enumerate([] if held is None else held[:, :5].sum(-1).tolist())},
            **{rate_name("held_out", i, corpus): a for corpus, accs in per_corpus.items() for i, a in enumerate(accs)},
            **{rate_name("train", i): a for i, a in enumerate(fit)},
            "rank_acc": None if held is None else held.tolist(),  # [K][RANKS] held-out hit rate of each head's rank-r token
        }

