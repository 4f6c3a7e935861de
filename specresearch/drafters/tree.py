"""Token trees from draft models (SpecInfer, Miao et al. 2024; EAGLE-2's dynamic trees, Li et al.
2024): the draft model expands several candidates per position, level by level under a tree mask,
and the target verifies the whole tree in one forward."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from specresearch.drafters.base import Context, Drafter
from specresearch.drafters.draft_model import DraftModel
from specresearch.errors import SpecResearchError
from specresearch.kv import COST_SIZES, interpolated, kept_cost_curve, rows_interpolated
from specresearch.kv.costs import BATCH_ROWS, BATCH_TOKENS
from specresearch.models import LoadedModel
from specresearch.options import drafters as options
from specresearch.options import make
from specresearch.sampling import ranking_probs
from specresearch.types import Draft, SamplingParams, Trie, Verdict


def free_memory_bytes(device: torch.device) -> int | None:
    """The memory free for tensors on `device` now: CUDA's free memory, or on Linux MemAvailable; None when unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def check_fits(target: LoadedModel, nodes: int, path: str) -> None:
    """Refuse, before anything is allocated, a tree the machine cannot verify. Feeding K = `nodes` + 1 tokens
    makes at least the target's logits and the verifier's laws, [K, V] in float32 several times over
    (LAW_COPIES), the tree's attention mask, [K, cache + K] in the model's dtype, and its ancestry, [K, K] bool
    (target.tree_attention): a lower bound (no cache, no activations) that must fit in half the free memory
    (the rest: the models, the cache, the activations). drafter.nodes=100000 on the tiny model asked for 40 GB
    of mask alone."""
    free = free_memory_bytes(target.device)
    if free is None:
        return
    vocab = int(target.model.config.vocab_size)
    linear, square = vocab * 4 * LAW_COPIES, target.model.dtype.itemsize + 1  # bytes per K and per K²
    need = (nodes + 1) * linear + (nodes + 1) ** 2 * square
    budget = free // 2
    if need > budget:
        most = max(1, int((-linear + math.sqrt(linear**2 + 4 * square * budget)) / (2 * square)) - 1)
        raise SpecResearchError(f"{path}: a tree of {nodes:,} nodes needs at least {need / 2**30:,.1f} GiB to verify (the target's "
                                f"laws over {vocab:,} tokens and the tree's attention mask), more than half the {free / 2**30:.1f} GiB "
                                f"free on {target.device}: valid are trees of at most {most:,} nodes here")


LAW_COPIES = 4  # [nodes + 1, V] float32 tensors alive at once in a verification: logits, p, residual, a copy


class Sizer:
    """`drafter.shape=auto` for a dynamic tree: Sequoia's hardware-aware sizing (Chen et al., 2024),
    made per step from the draft's own confidence as EAGLE-2 ranks nodes. Of the nodes a step grew,
    ranked by cumulative draft probability q(path), it keeps the n whose predicted speedup
    τ̂(n) / (d + v(n + 1)) is largest: τ̂(n) = 1 + the n best q(path) (the expected accepted length,
    bonus token included, if the draft is calibrated), d the step's drafting time and v(m) the target's
    measured time to verify m tokens, both over the target's time for one token.
    """

    def __init__(self, v: Callable[[int], float], unit: float, batch: Callable[[int, int], float] | None = None):
        """
        Args:
            v: the target's time to verify m tokens over its time for one.
            unit: the target's seconds for one token.
            batch: batch(rows, m), the target's time to verify m tokens in each of `rows` rows (a batch's forward,
                every row padded to the widest) over its time for one token of one row; None: not measured yet
                (a batch counts as one row of rows x m tokens).
        """
        self.v, self.unit, self.batch = v, unit, batch
        # target-forward costs, and what plain decoding of as many rows would pay for the predicted tokens, over steps
        self.cost = self.plain = 0.0

    @classmethod
    def measure(cls, target: LoadedModel, most: int, rows: int = 1) -> Sizer:
        """A Sizer with the target's v(m) measured for m up to `most` + 1 (the root and `most` nodes), and with
        `rows` > 1 a batch's verification (kv.costs.BATCH_ROWS and `rows` rows measured, up to BATCH_TOKENS tokens a
        forward; interpolated between), once per machine and target (target.kept_cost_curve: a second run sizes at
        no cost)."""
        sizes = sorted({*(m for m in COST_SIZES if m <= most + 1), most + 1})
        batches = {r: [m for m in sizes if r * m <= max(BATCH_TOKENS, r)] for r in {*(r for r in BATCH_ROWS if r < rows), rows} if r > 1}
        shapes = [(r, m) for r, ms in {1: sizes, **batches}.items() for m in ms]
        v, one = kept_cost_curve(target, shapes)
        measured = dict(zip(shapes, v))
        curves = {r: interpolated(ms, [measured[r, m] for m in ms], proportional=r > 1) for r, ms in {1: sizes, **batches}.items()}
        return cls(curves[1], one, rows_interpolated(curves) if batches else None)

    def verify(self, rows: int, m: int) -> float:
        """The target's time to verify m tokens in each of `rows` rows, over its time for one token of one row."""
        if rows == 1:
            return self.v(m)
        return self.batch(rows, m) if self.batch is not None else self.v(rows * m)

    def per_token(self, rows: int) -> float:
        """Plain decoding's cost of a token at `rows` rows (one forward of a token per row, shared)."""
        return 1.0 if rows == 1 else self.verify(rows, 1) / rows

    def size(self, probs: Sequence[float], drafting: float) -> int:
        """How many of the nodes to keep (>= 1; the smallest of equally good sizes).

        Args:
            probs: the nodes' path probabilities (the chance each is accepted with all its ancestors), best first.
            drafting: the step's drafting seconds so far.
        """
        d = drafting / self.unit
        tau, best = 1.0, (0.0, 1, 1.0)  # (predicted speedup, n, τ̂(n))
        for n, p in enumerate(probs, start=1):
            tau += p
            speedup = tau / (d + self.v(n + 1))
            if speedup > best[0]:
                best = (speedup, n, tau)
        self.record(best[2], best[1] + 1, drafting)
        return best[1]

    def grows(self, tau: float, path: float, rate: float, m: int, more: int, drafting: float, first: float, later: float,
              left: int, rows: int = 1, width: int = 1) -> bool:
        """Whether drafting on pays for a chain (drafter=independent shape=auto): whether some j in 1..`left`
        more tokens, each kept with chance `rate` once the one before it is, add tokens at a better rate than
        the run's: their expected tokens over their cost (drafting, and what they add to the verification
        forward) beat the predicted speedup of the steps so far (this step's own, on the first). The run's
        rate, not the step's: the stop maximizes tokens per time over the whole run (renewal-reward), so a step
        whose first tokens came free from prompt lookup drafts on as any other would. A horizon, not one
        token: a curve with a step (a kernel's row blocks) would stop a myopic chain at the step's foot.

        In a batch of `rows` rows the verification forward carries every row padded to the widest (`width`):
        a chain below it verifies its next tokens for nothing, a chain that widens it pays the widening for
        every row, and the rate to beat is the batch's tokens per time (plain decoding's `rows` tokens a
        forward, times the predicted speedup).

        Args:
            tau: τ̂ of the draft so far (1 + its nodes' chances of being kept).
            path: the chance of keeping the whole chain so far.
            rate: each next token's chance of being kept after the one before it.
            m: tokens the verification forward carries now for this row (the root and the draft's nodes).
            more: tokens each next one adds to it (it and its siblings).
            drafting: the step's drafting seconds so far.
            first: the next token's drafting seconds (0 where its law is already computed).
            later: each later token's drafting seconds.
            left: the most tokens the chain may still take.
            rows: the rows verified together (the batch).
            width: the widest row's tokens in the verification so far (at least `m`).
        """
        width = max(width, m)
        bar = (self.predicted_speedup / self.per_token(rows) if self.cost
               else tau * rows / (drafting / self.unit + self.verify(rows, width)))
        gained, cost = 0.0, first / self.unit
        for j in range(1, left + 1):
            path *= rate
            gained += path
            if gained > bar * (cost + self.verify(rows, max(width, m + j * more)) - self.verify(rows, width)):
                return True
            cost += later / self.unit
        return False

    def record(self, tau: float, m: int, drafting: float, rows: int = 1) -> None:
        """One step's prediction for the running predicted speedup: τ̂ tokens (summed over the rows) for drafting
        seconds and a verification forward of m tokens (in each of `rows` rows)."""
        self.cost += drafting / self.unit + self.verify(rows, m)
        self.plain += tau * self.per_token(rows)

    @property
    def predicted_speedup(self) -> float | None:
        """Predicted tokens per time over plain decoding's (of as many rows), over the steps sized so far."""
        return self.plain / self.cost if self.cost else None


def sizer(shape: str | None, target: LoadedModel, tree: TreeShape) -> Sizer | None:
    """The Sizer `drafter.shape` asks for (None: the tree keeps up to `nodes` nodes; the settings refused
    a shape that cannot be lossless or has nothing to size)."""
    return None if shape is None else Sizer.measure(target, tree.settings.nodes)


@dataclass
class TreeShape:
    """How a token tree grows from a draft's laws, level by level, whatever computes them (a draft
    model, an EAGLE head):

    - static (`branching=[b1, b2, ...]`): every node at depth d gets b_d children;
    - dynamic (`branching=None`; EAGLE-2): every expanded node gets `topk` children scored by their
      cumulative draft log-probability; the `topk` best of a level are expanded further, up to
      `depth` levels, and the `nodes` best nodes of all make the tree (parents score at least as
      high as their children, so the set is a tree). With sampled children the budget keeps whole
      sibling groups instead, breadth first (see `_budget_sampled`): selecting samples by their
      values would change their law.

    Children are the draft's top tokens (`children=top`: deterministic, q = None; lossless with
    greedy and with rejection sampling, which treats them as one-hot) or, at T > 0, drawn
    independently from the draft's q (`children=sample`, SpecInfer's sampled siblings; q is returned).

    With `chain_confidence`, the tree stops growing after a level none of whose nodes has a path
    probability (the product of the draft's probabilities down to it, its cumulative confidence) of
    at least that: the chain drafters' stop, per path. It saves the draft forwards of levels the target
    would hardly reach. Lossless: whether a level is expanded depends on the nodes above it only.
    """

    # A tree drafter's settings (options.drafters.Tree: static with `branching`, the path-probability stop) or
    # EAGLE's (options.drafters.Eagle: dynamic, no stop), checked there: topk, depth, nodes, children.
    settings: options.DynamicTree
    sizer: Sizer | None = None  # shape=auto: how many of the (at most `nodes`) best nodes each step keeps

    def __post_init__(self):
        branching = getattr(self.settings, "branching", None)
        self.branching = None if branching is None else [int(b) for b in branching]  # None: dynamic
        self.depth = len(self.branching) if self.branching is not None else int(self.settings.depth)  # the longest path
        self.chain_confidence: float | None = getattr(self.settings, "chain_confidence", None)

    @property
    def most(self) -> int:
        """The most nodes a tree of this shape holds: a static tree's every node, else `nodes`."""
        return self.settings.nodes if self.branching is None else sum(math.prod(self.branching[: i + 1]) for i in range(self.depth))

    def check_sampling(self, sampling: SamplingParams) -> None:
        if self.settings.children == "sample" and sampling.greedy:
            raise SpecResearchError("drafter.children=sample draws children from q at temperature > 0; "
                                    "use children=top for greedy decoding")

    def grow_rows(self, ctxs: list[Context], depths: list[int], root: Callable[[int], Tensor],
                  expand: Callable[[dict[int, tuple[Tensor, Tensor]]], Sequence[Tensor]], token: Callable[[int], int] = int,
                  widen: Callable[[Tensor], Tensor] = lambda q: q, started: float | None = None) -> list[Nodes]:
        """Every row's tree, grown level by level for all rows at once: one ranking of every row's frontier
        laws and one top-k (or, sampled, one draw per row from its own generator) per level, then one
        expansion of every row's new frontier (`expand`: one draft forward). What stays per row is its
        nodes' bookkeeping.

        Args:
            ctxs: the rows' steps (sampling, rng); every row decodes with the same sampling settings.
            depths: each row's most levels (its draft budget allowing); 0: no tree ([]).
            root: root(b) is row b's [1, V] (or [1, N] over a shortlist) draft logits after its last committed token.
            expand: expand(requests) feeds each requesting row b its level's (tokens [W_b], parents [W_b]: indices
                among the row's nodes expanded before, -1 = the root) in one forward and returns logits
                indexable by b ([W_b, V] after each).
            token, widen: a shortlisted draft's index → token id, and [N] law → [V] (see DraftModel).
            started: when the step's drafting began (time.perf_counter; the sizer counts it); None = now.

        Returns:
            Each row's tree: (token, parent, q or None) per node, parents first.
        """
        started = time.perf_counter() if started is None else started
        live = [b for b, depth in enumerate(depths) if depth > 0]
        nodes: dict[int, list[tuple[int, int, Tensor | None, float]]] = {b: [] for b in live}  # (token, parent, q, cumulative log q)
        fed: dict[int, dict[int, int]] = {b: {} for b in live}  # per row: node -> its index among the nodes expanded
        frontier = {b: [-1] for b in live}  # the nodes whose children this level adds (-1 = the root)
        logits = {b: root(b) for b in live}  # [W_b, V or N]
        level = 0
        while live:
            sampling = ctxs[live[0]].sampling
            laws = ranking_probs(torch.cat([logits[b] for b in live]), sampling)  # [ΣW, V or N]: q at T > 0; at T = 0 the softmax ranks
            sizes = [len(frontier[b]) for b in live]
            width = self.branching[level] if self.branching is not None else self.settings.topk
            if self.settings.children == "sample":  # [ΣW, width] each frontier node's children, each row's from its own generator
                xs = torch.cat([torch.multinomial(rows, width, replacement=True, generator=ctxs[b].rng)
                                for b, rows in zip(live, laws.split(sizes))])
            else:
                xs = torch.topk(laws, min(width, laws.shape[-1])).indices
            log_q = laws.gather(1, xs).log().tolist()  # [ΣW, width] (-inf: top-k / top-p removed it, the target would never accept it)
            xs = xs.tolist()
            requests: dict[int, tuple[Tensor, Tensor]] = {}
            at = 0
            for b, size in zip(live, sizes):
                tree, new = nodes[b], []
                for w, parent in enumerate(frontier[b]):
                    base = tree[parent][3] if parent >= 0 else 0.0
                    q = widen(laws[at + w]) if self.settings.children == "sample" else None  # [V] the law the children were drawn from
                    for x, log in zip(xs[at + w], log_q[at + w]):
                        if log > -math.inf:
                            new.append(len(tree))
                            tree.append((token(x), parent, q, base + log))
                at += size
                if level == depths[b] - 1 or not new:
                    continue
                if self.chain_confidence is not None and max(tree[i][3] for i in new) < math.log(self.chain_confidence):
                    continue  # no path of this level is likely enough to grow further
                if self.branching is None:  # EAGLE-2: expand only the level's best
                    new = sorted(new, key=lambda i: -tree[i][3])[: self.settings.topk]
                for i in new:
                    fed[b][i] = len(fed[b])
                frontier[b] = new
                requests[b] = (torch.tensor([tree[i][0] for i in new], device=ctxs[b].tokens.device),
                               torch.tensor([fed[b].get(tree[i][1], -1) for i in new]))
            if requests:
                out = expand(requests)
                logits = {b: out[b] for b in requests}  # [W_b, V]
            live, level = list(requests), level + 1
        return [self._budget(nodes[b], started) if b in nodes else [] for b in range(len(ctxs))]

    def _budget(self, nodes: list[tuple[int, int, Tensor | None, float]], started: float) -> Nodes:
        """A grown tree cut to its budget (dynamic trees: `nodes`, or the sizer's size), as (token, parent, q) nodes."""
        if self.branching is None and (len(nodes) > self.settings.nodes or self.sizer is not None):
            budget = min(self.settings.nodes, len(nodes))
            if self.sizer is not None:  # children are top here (shape=auto refuses sampled ones)
                best = sorted((s for *_, s in nodes), reverse=True)[:budget]
                budget = self.sizer.size([math.exp(s) for s in best], time.perf_counter() - started)
            keep = self._budget_sampled(nodes) if self.settings.children == "sample" else self._budget_top(nodes, budget)
            new_index = {old: new for new, old in enumerate(keep)}
            nodes = [(t, new_index.get(p, -1), q, s) for t, p, q, s in (nodes[i] for i in keep)]
        return [(t, p, q) for t, p, q, _ in nodes]

    def _budget_top(self, nodes: list, budget: int | None = None) -> list[int]:
        """EAGLE-2's reranking: the `budget` (default `nodes`) best by cumulative draft log-probability
        (a parent scores at least as high as its children, so the set is a tree). Lossless for top
        children: they are deterministic, and any choice of them is."""
        return sorted(sorted(range(len(nodes)), key=lambda i: (-nodes[i][3], i))[: self.settings.nodes if budget is None else budget])

    def _budget_sampled(self, nodes: list) -> list[int]:
        """The budget for sampled children, kept lossless: whole sibling groups, breadth first (by the
        parent's depth, then its score), the last one cut by draw order, never by value.

        Multi-step speculative sampling is exact when the children a node keeps are independent draws
        from its q, however many there are, as long as their number depends only on tokens above
        them. Keeping the likeliest samples breaks that (the kept siblings over-represent q's top
        tokens: the target's top token came out 81% of the time where p = 0.40); so does a group
        competing for the budget with deeper groups, whose existence depends on its own values.
        """
        depth = {-1: 0}
        groups: dict[int, list[int]] = {}  # parent -> its children, in draw order
        for i, (_, parent, _, _) in enumerate(nodes):
            depth[i] = depth[parent] + 1
            groups.setdefault(parent, []).append(i)
        order = sorted(groups, key=lambda g: (depth[g], -nodes[g][3] if g >= 0 else 0.0, g))
        kept: set[int] = set()
        for parent in order:
            if parent >= 0 and parent not in kept:
                continue
            room = self.settings.nodes - len(kept)
            kept.update(groups[parent][:room])
            if room <= len(groups[parent]):
                break
        return sorted(kept)

Nodes = list[tuple[int, int, Tensor | None]]  # a grown tree: (token, parent, q or None) per node, parents first


def tree_draft(trees: Sequence[Nodes], device: torch.device, merge: bool = False) -> Draft:
    """One draft of one or more grown trees: merged as a trie with `merge` (top children), else side
    by side (sampled children: merging them would change their law)."""
    trie = Trie()
    qs: list[Tensor] = []
    for nodes in trees:
        local: list[int] = []  # this tree's node -> merged node
        for token, parent, q in nodes:
            local.append(trie.add(-1 if parent < 0 else local[parent], token, merge=merge))
            if q is not None:  # sampled children: every one is a new node
                qs.append(q)
    return Draft(
        tokens=torch.tensor(trie.tokens, dtype=torch.long, device=device),
        q=torch.stack(qs) if qs else None,  # [N, V]: row i is the law node i was drawn from
        parents=torch.tensor(trie.parents, dtype=torch.long),
    )


class TreeDrafter(Drafter):
    """Each step, every draft model grows a tree (`TreeShape`: static, or EAGLE-2's dynamic one) after
    the last committed token, one draft forward per level (the level's nodes fed together under the
    tree mask, against the draft's own cache). Several draft models (`ensemble`) make one tree: merged
    as a trie for top children, side by side for sampled ones (merging sampled siblings would change
    their law)."""

    name = "tree"
    modes = {"static top": (), "static sample": ("children=sample",), "dynamic top": ("branching=null",),
             "dynamic top, auto size": ("branching=null", "shape=auto"),
             "dynamic sample": ("branching=null", "children=sample"),
             "dynamic, confidence stop": ("branching=null", "chain_confidence=0.2"),
             "dynamic sample, confidence stop": ("branching=null", "children=sample", "chain_confidence=0.2"),
             "dynamic sample, cheap draft": ("branching=null", "children=sample", "model.vocab=200",
                                             "model.vocab_corpus=mtbench", "model.quantize=int8")}

    Settings = options.Tree

    def __init__(self, target: LoadedModel, model: Mapping | LoadedModel | DraftModel | None = None,
                 ensemble: Sequence[Mapping | LoadedModel | DraftModel] = (), **given):
        """
        Args:
            target: the target model; every draft must share its vocabulary.
            model: the draft model: load_model() arguments plus the cheaper-draft options `vocab`,
                `vocab_corpus`, `quantize` (drafters.draft_model), a LoadedModel or a DraftModel.
            ensemble: more draft models whose trees are merged with the first's (SpecInfer).
            **given: the settings (`Settings`), the rest at their defaults: the tree's shape (TreeShape:
                `branching` children per node at each depth, static, or None: dynamic, EAGLE-2, with
                `topk`, `depth`, `nodes`; `children` top or sample, T > 0 only; `chain_confidence`), and
                `shape`: "auto", each step keeps the number of nodes (up to `nodes`) with the best
                predicted speedup (`Sizer`: the draft's confidence, the step's drafting time, the
                target's measured verification cost); dynamic trees with top children only.
        """
        s = self.settings = make(self.Settings, given)
        if model is None:
            raise SpecResearchError("drafter=tree needs a draft model: set drafter.model.name")
        self.shape = TreeShape(s)
        check_fits(target, self.shape.most, "drafter.nodes" if s.branching is None else "drafter.branching")  # before sizer measures
        self.shape.sizer = sizer(s.shape, target, self.shape)
        self.depth = self.shape.depth
        self.drafts = [DraftModel.load(spec, target) for spec in [model, *ensemble]]

    def check_sampling(self, sampling: SamplingParams) -> None:
        self.shape.check_sampling(sampling)

    def prefill_rows(self, ctxs: list[Context]) -> None:
        super().prefill_rows(ctxs)
        for draft in self.drafts:
            draft.reset()
            draft.prefill_rows([ctx.tokens[:-1] for ctx in ctxs], reuse=ctxs[0].reuse_prefill)

    def propose_rows(self, ctxs: list[Context]) -> list[Draft]:
        depths = [min(self.depth, ctx.max_draft) for ctx in ctxs]
        grown = [self._grow(draft, ctxs, depths) for draft in self.drafts]  # per draft model, per row
        device, merge = ctxs[0].tokens.device, self.settings.children == "top"
        return [tree_draft([trees[b] for trees in grown], device, merge) if depth > 0 else Draft.empty(device)
                for b, depth in enumerate(depths)]

    def _grow(self, draft: DraftModel, ctxs: list[Context], depths: list[int]) -> list[Nodes]:
        """One draft model's tree per row, [] for a row that drafts nothing: every row's level fed in one
        draft forward (each row's tree under its own mask, in its own slots of the draft's cache)."""
        started = time.perf_counter()
        live = [depth > 0 for depth in depths]
        fed = [ctx.tokens[n:] if on else ctx.tokens[:0] for ctx, n, on in zip(ctxs, draft.lengths, live)]  # [P] unseen committed tokens
        logits = draft.forward_rows(fed, [None] * len(fed))  # [P, V] per row ([P, N] over a shortlist)
        draft.keep_rows([range(tokens.numel()) for tokens in fed])
        start, lengths = draft.length, list(draft.lengths)
        self.count(b for b, on in enumerate(live) if on)
        empty = torch.zeros(0, dtype=torch.long)

        def expand(requests: dict[int, tuple[Tensor, Tensor]]) -> list[Tensor]:
            self.count(requests)
            rows = range(len(ctxs))
            return draft.forward_rows([requests[b][0] if b in requests else empty for b in rows],
                                      [requests[b][1] if b in requests else empty for b in rows], tree=start)  # [W_b, V] per row

        trees = self.shape.grow_rows(ctxs, depths, lambda b: logits[b][-1:], expand, draft.token, draft.widen, started)
        draft.crop_rows(start, lengths)
        return trees

    def commit_rows(self, ctxs: list[Context], verdicts: list[Verdict]) -> None:
        for draft in self.drafts:  # each draft cache holds each row's accepted sequence but its last token
            draft.truncate_rows([min(n, ctx.tokens.numel() - 1) for n, ctx in zip(draft.lengths, ctxs)])

    def select_rows(self, index: list[int]) -> None:
        super().select_rows(index)
        for draft in self.drafts:
            draft.select_rows(index)

    @property
    def predicted_speedup(self) -> float | None:
        """shape=auto's predicted speedup over the steps so far (None without it)."""
        return None if self.shape.sizer is None else self.shape.sizer.predicted_speedup
