"""The verifier interface: a chain verifier is two functions, the probability of accepting each draft
token and the law of the token the target adds; one loop turns them into a verdict, and the exact
one-step law (`specresearch.stats.exact`) is computed from the same two."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

from specresearch.options import implements
from specresearch.sampling import invert_cdf
from specresearch.types import Draft, SamplingParams, Verdict


class Verifier(ABC):
    """Decides, from the target's distributions, how much of a draft to keep.

    Terms (Leviathan et al., 2023): *accepted* draft tokens are kept; after the first rejection the
    target adds a *recovered* token; when every draft token is accepted it adds a *bonus* token from
    p at the position after the draft. Either way a step yields num_accepted + 1 tokens.

    Draft token i is accepted with probability `acceptance(p, q, x)[i]` (one uniform draw each),
    up to the first rejection; the added token is drawn from `fallback(p[n], q[n])` at the first
    rejected position n, or from `fallback(p[K], None)` at the bonus position.
    """

    lossless: bool  # the claim that outputs follow the target's law exactly; tests must prove it
    name: str

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        implements(cls)  # a verifier declares its settings (`Settings = options.NAME`): verifier=NAME builds it

    def check_sampling(self, sampling: SamplingParams) -> None:
        """Raise SpecResearchError if this rule cannot run with these sampling settings."""

    def p_sampling(self, sampling: SamplingParams) -> SamplingParams:
        """How the engine turns the target's logits into the p this verifier reads: the decoding's own
        settings, unless a rule asks for another view of the target (see RelaxedVerifier)."""
        return sampling

    def argmax_path(self, sampling: SamplingParams) -> bool:
        """Whether, decoding with `sampling`, this rule's verdict is the longest draft prefix (tree path)
        of the target's argmax tokens, then the argmax after it: so wherever the p it reads
        (`p_sampling`) is one-hot, at temperature 0. The engine then verifies by `verify_argmax`
        from the logits' argmax alone: no [B, W, V] law is built and nothing is drawn."""
        return self.p_sampling(sampling).greedy

    def verify_argmax(self, drafts: Sequence[Draft], top: Tensor) -> list[Verdict]:
        """`verify_rows` where `argmax_path` holds, from the target's argmax `top` ([B, W]) alone:
        a tree's path is the one multi-step speculative sampling walks (each node's first child
        equal to the argmax there; see `argmax_verdicts`)."""
        return argmax_verdicts(drafts, top)

    @abstractmethod
    def acceptance(self, p: Tensor, q: Tensor, x: Tensor) -> Tensor:
        """The probability of keeping each draft token.

        Args:
            p: [K, V] target laws at the draft positions.
            q: [K, V] the laws the draft tokens were drawn from (one-hot for a deterministic drafter).
            x: [K] the draft tokens, or [K, M]: M candidate tokens per position (`acceptance_all`).

        Returns:
            [K] (or [K, M]) probabilities in [0, 1] (0 or 1 for a deterministic rule).
        """

    def acceptance_all(self, p: Tensor, q: Tensor) -> Tensor:
        """[K, V]: `acceptance` of every token of the vocabulary as the draft at each of K positions
        (a(x) for every x, the exact laws' ingredient: `specresearch.stats.exact`)."""
        return self.acceptance(p, q, torch.arange(p.shape[-1], device=p.device).expand(p.shape[0], -1))

    @abstractmethod
    def fallback(self, p: Tensor, q: Tensor | None) -> Tensor:
        """The law of the token the target adds.

        Args:
            p: [V] the target's law at that position.
            q: [V] the draft's law there after a rejection; None at the bonus position.

        Returns:
            [V] probabilities (need not be normalised).
        """

    def __call__(self, draft: Draft, p: Tensor, rng: torch.Generator | None = None) -> Verdict:
        """Verify one draft.

        Args:
            draft: K proposed tokens (a chain or a tree) and their law q ([K, V], or None for a
                deterministic drafter).
            p: [K + 1, V] target probabilities after temperature/top-k/top-p: row 0 is the law of
                the token after the last committed one, row i + 1 the law after draft token i (for a
                chain: row i is the law at draft position i, row K the bonus position).
            rng: the generator for every random draw (reproducible tests).

        Returns:
            The accepted prefix (or tree path) plus one recovered or bonus token.
        """
        return self.verify_rows([draft], p[None], [rng])[0]

    def verify_rows(self, drafts: Sequence[Draft], p: Tensor, rngs: Sequence[torch.Generator | None]) -> list[Verdict]:
        """Verify the drafts of B rows (a batch), row b exactly as `self(drafts[b], p[b, :K_b + 1], rngs[b])`
        would: the chains together (one `acceptance` and at most two `fallback` calls for all of them,
        each row drawing its uniforms from its own generator in the same order), the trees together
        (`_verify_trees`).

        Args:
            drafts: B drafts (chains or trees).
            p: [B, W, V] row b's target laws in its first K_b + 1 positions (W >= every K_b + 1).
            rngs: B generators.

        Returns:
            B verdicts.
        """
        verdicts: list[Verdict | None] = [None] * len(drafts)
        chains = [b for b, draft in enumerate(drafts) if draft.parents is None]
        trees = [b for b, draft in enumerate(drafts) if draft.parents is not None]
        if trees:
            for b, verdict in zip(trees, self._verify_trees([drafts[b] for b in trees], p if len(trees) == len(drafts) else p[trees],
                                                              [rngs[b] for b in trees])):
                verdicts[b] = verdict
        if chains:
            whole = len(chains) == len(drafts)  # (no copy of p for a batch of chains)
            laws = p if whole else p[chains]
            for b, verdict in zip(chains, self._verify_chains([drafts[b] for b in chains], laws, [rngs[b] for b in chains])):
                verdicts[b] = verdict
        return verdicts

    def _verify_chains(self, drafts: list[Draft], p: Tensor, rngs: list[torch.Generator | None]) -> list[Verdict]:
        """The chains of `verify_rows` (p [B, W, V]), every row at once. Row b draws its K_b + 1 uniforms from
        its generator in one call; it accepts its first n_b tokens (u_i < acceptance_i up to the first
        failure), then draws the added token from `fallback` at position n_b with its last uniform.
        Per row only that draw and its verdict; the rest are tensor ops over the rows."""
        rows, vocab, device = len(drafts), p.shape[-1], p.device
        k = torch.tensor([len(draft) for draft in drafts])  # [B]
        width = int(k.max())
        u = torch.nn.utils.rnn.pad_sequence([torch.rand(int(k_b) + 1, generator=rng, dtype=torch.float64, device=device)
                                             for k_b, rng in zip(k, rngs)], batch_first=True)  # [B, K + 1] (0 past a row's K_b + 1)
        x = torch.nn.utils.rnn.pad_sequence([draft.tokens[: len(draft)].to(device) for draft in drafts],
                                            batch_first=True)  # [B, K] (0 past a row's K_b)
        n = torch.zeros(rows, dtype=torch.long, device=device)  # [B] accepted per row
        if width:
            real = torch.arange(width) < k[:, None]  # [B, K] a row's own draft positions
            drawn = torch.tensor([draft.q is not None for draft in drafts])  # [B] rows whose q is a law
            q = p.new_zeros(rows, width, vocab)  # [B, K, V]: each row's q, one-hot at the token where it has none
            one_hot = (~(real & drawn[:, None])).reshape(-1).nonzero().squeeze(1).to(device)  # [M] (padding included)
            q.view(-1, vocab)[one_hot, x.reshape(-1)[one_hot]] = 1.0
            for b, draft in enumerate(drafts):  # (row by row: no [ΣK, V] copy of the laws on the way)
                if draft.q is not None:
                    q[b, : len(draft)] = draft.q[: len(draft)]
            accept = self.acceptance(p[:, :width].reshape(-1, vocab), q.reshape(-1, vocab), x.reshape(-1)).view(rows, width)
            n = ((u[:, :width] < accept) & real.to(device)).int().cumprod(1).sum(1)  # [B] (nothing kept past a row's K_b)
        at = n.tolist()
        p_n = p[torch.arange(rows, device=p.device), n]  # [B, V] the law where each row's added token goes
        bonus = (torch.tensor(at) == k).to(device)  # [B] rows that kept their whole draft
        rejected = ~bonus
        if bool(bonus.all()):  # [B, V] the law of each row's added token
            law = self.fallback(p_n, None)
        elif not bool(bonus.any()):
            law = self.fallback(p_n, q[torch.arange(rows, device=p.device), n])
        else:
            law = torch.empty_like(p_n)
            law[bonus] = self.fallback(p_n[bonus], None)
            law[rejected] = self.fallback(p_n[rejected], q[rejected, n[rejected]])
        y = invert_cdf(law, u.gather(1, k.to(device)[:, None])).tolist()  # [B] each row's last uniform
        x = x.tolist()
        return [Verdict(tokens=torch.tensor(x[b][: at[b]] + [y[b]]), num_accepted=at[b]) for b in range(rows)]

    def _verify_trees(self, drafts: list[Draft], p: Tensor, rngs: list[torch.Generator | None]) -> list[Verdict]:
        """The trees of `verify_rows` (p [B, W, V]), every row walked at once: multi-step speculative
        sampling (SpecInfer, Miao et al. 2024) in terms of the same two functions. At each node the row
        tries the children in order, accepting child x with probability `acceptance(p, q, x)`; after a
        rejection p ← `fallback(p, q)` (the residual, for rejection sampling) and the next child is tried
        against it. The first accepted child becomes the node; when every child is rejected the added
        token comes from the current p, at a leaf from `fallback(p, None)`. Lossless for rejection
        sampling with deterministic children (q one-hot: p(x) is zeroed and renormalised after a
        rejection) and with children drawn independently from the node's q; greedy keeps the longest
        path of argmax tokens.

        Row b draws its N_b + 1 uniforms from its own generator in one call (its t-th try reads the t-th,
        the added token the last), so it walks as it would alone. One step of the walk tries the next
        child of every row still walking: its acceptance, its residual and its move are tensor ops over
        those rows; the walk takes as many steps as the longest row's tries.
        """
        rows, vocab, device = len(drafts), p.shape[-1], p.device
        k = [len(draft) for draft in drafts]
        width = max(k)
        x = torch.nn.utils.rnn.pad_sequence([d.tokens[: k[b]].to(device) for b, d in enumerate(drafts)], batch_first=True)  # [B, N]
        parent = torch.nn.utils.rnn.pad_sequence([d.parents[: k[b]].cpu() for b, d in enumerate(drafts)], batch_first=True,
                                                 padding_value=-2)  # [B, N] (-2: no node)
        node_ids = torch.arange(width)
        earlier = (parent[:, :, None] == parent[:, None, :]) & (node_ids[None, :] < node_ids[:, None])  # [B, N, N] an earlier sibling
        rank = earlier.sum(-1)  # [B, N] each node's place among its parent's children
        # [B, N + 1, C + 1]: node v's j-th child at [b, v + 1, j], then -1
        child_at = torch.full((rows, width + 1, int(rank.max()) + 2 if width else 1), -1)
        real = parent > -2
        child_at[real.nonzero(as_tuple=True)[0], parent[real] + 1, rank[real]] = node_ids.expand(rows, -1)[real]
        sampled = [b for b, d in enumerate(drafts) if d.q is not None]  # rows whose q is a law (the others': one-hot)
        q_rows = torch.cat([drafts[b].q[: k[b]].to(device=device, dtype=p.dtype) for b in sampled]) if sampled else None  # [ΣN_b, V]
        sizes = torch.tensor([k[b] for b in sampled], dtype=torch.long)
        offset = torch.full((rows,), -1)  # [B] where each sampled row's q starts in q_rows
        offset[sampled] = sizes.cumsum(0) - sizes
        u = torch.stack([torch.rand(width + 1, generator=rng, dtype=torch.float64, device=device) for rng in rngs])  # [B, N + 1]
        node = torch.full((rows,), -1)  # [B] each row's current node (-1: the root)
        tries = torch.zeros(rows, dtype=torch.long)  # [B] the children each row has tried
        law = p[:, 0].clone()  # [B, V] the law each row's next child faces (p at its node, or a residual of it)
        path: list[list[int]] = [[] for _ in range(rows)]
        walking = torch.ones(rows, dtype=torch.bool)
        while bool(walking.any()):
            at = walking.nonzero()[:, 0]  # [R] the rows still walking, each at its node
            first = child_at[at, node[at] + 1, 0]  # [R] each one's first child (-1: a leaf)
            leaf = at[first < 0]
            if leaf.numel():  # no child: the bonus token comes from fallback(p, None)
                law[leaf.to(device)] = self.fallback(law[leaf.to(device)], None)
                walking[leaf] = False
            trying, j = at[first >= 0], 0
            while trying.numel():
                child = child_at[trying, node[trying] + 1, j]  # [R] each row's next child (-1: none left)
                walking[trying[child < 0]] = False  # every child rejected: the token comes from the residual
                trying, child = trying[child >= 0], child[child >= 0]
                if not trying.numel():
                    break
                r, c = trying.to(device), child.to(device)
                x_c = x[r, c]  # [R]
                q_c = torch.nn.functional.one_hot(x_c, vocab).to(p.dtype)  # [R, V] the laws the children were drawn from
                drawn = offset[trying] >= 0
                if bool(drawn.any()):
                    q_c[drawn.to(device)] = q_rows[(offset[trying][drawn] + child[drawn]).to(device)]
                ok = (u[r, tries[trying].to(device)] < self.acceptance(law[r], q_c, x_c)).cpu()  # [R]
                tries[trying] += 1
                taken, rejected = trying[ok], trying[~ok]
                for b, c in zip(taken.tolist(), child[ok].tolist()):
                    path[b].append(c)
                node[taken] = child[ok]
                law[taken.to(device)] = p[taken.to(device), child[ok].to(device) + 1]
                law[rejected.to(device)] = self.fallback(law[rejected.to(device)], q_c[(~ok).to(device)])
                trying, j = rejected, j + 1
        y = invert_cdf(law, u[:, width:]).tolist()  # [B] the added tokens
        x = x.tolist()
        return [Verdict(tokens=torch.tensor([x[b][i] for i in path[b]] + [y[b]]), num_accepted=len(path[b]), path=path[b])
                for b in range(rows)]


def argmax_verdicts(drafts: Sequence[Draft], top: Tensor, longest: bool = False) -> list[Verdict]:
    """What a verifier decides where every p is one-hot (`Verifier.argmax_path`), from the argmax alone:
    row b keeps the longest prefix of its chain whose tokens are the target's argmax, or a path of
    its tree whose every node is the argmax after its parent: the first such child at each node
    (multi-step speculative sampling's walk), or with `longest` the deepest such node's path
    (the relaxed verifiers' rule; the first of equally deep ones); then adds the argmax after it.

    Args:
        drafts: B drafts (chains or trees).
        top: [B, W] row b's target argmax in its first K_b + 1 positions (as p's rows in `verify_rows`).
        longest: trees: the deepest passing path instead of the first-child walk (they differ only
            where siblings repeat a token).

    Returns:
        B verdicts.
    """
    verdicts = []
    for draft, t in zip(drafts, top.tolist()):
        x = draft.tokens[: len(draft)].tolist()
        if draft.parents is None:
            n = 0
            while n < len(x) and x[n] == t[n]:
                n += 1
            tokens, path, last = x[:n], None, n
        else:
            parents = draft.parents[: len(x)].tolist()
            if longest:
                depth = {-1: 0}  # passing node -> its depth (parents come before their children)
                for i, parent in enumerate(parents):
                    if parent in depth and x[i] == t[parent + 1]:
                        depth[i] = depth[parent] + 1
                node, path = max(depth, key=depth.__getitem__), []
                while node >= 0:
                    path.append(node)
                    node = parents[node]
                path.reverse()
            else:
                children: dict[int, list[int]] = {}
                for i, parent in enumerate(parents):
                    children.setdefault(parent, []).append(i)
                path, node = [], -1
                while (child := next((c for c in children.get(node, ()) if x[c] == t[node + 1]), None)) is not None:
                    path.append(child)
                    node = child
            tokens, last = [x[i] for i in path], (path[-1] if path else -1) + 1  # p's row after node i is i + 1 (row 0: the root's)
        verdicts.append(Verdict(tokens=torch.tensor(tokens + [t[last]]), num_accepted=len(tokens), path=path))
    return verdicts


def draft_law(draft: Draft, p: Tensor) -> Tensor:
    """[K, V] the law each draft token was drawn from, in p's dtype: draft.q, or one-hot rows."""
    if draft.q is not None:
        return draft.q.to(device=p.device, dtype=p.dtype)
    return one_hot(draft.tokens.to(p.device), p.shape[-1]).to(p.dtype)


def one_hot(tokens: Tensor, vocab_size: int) -> Tensor:
    """[K] token ids → [K, V] one-hot laws, the q of a deterministic drafter."""
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


def at(p: Tensor, x: Tensor) -> Tensor:
    """p's probabilities of tokens x, row by row: p [K, V], x [K] -> [K]; x [K, M] -> [K, M]."""
    return p.gather(-1, x.reshape(x.shape[0], -1)).view_as(x)


def rowwise(v: Tensor, x: Tensor) -> Tensor:
    """A value per row (v: [K]) shaped to broadcast against tokens x ([K] or [K, M])."""
    return v.view(-1, *([1] * (x.dim() - 1)))


def argmax_law(p: Tensor) -> Tensor:
    """[..., V] → the one-hot law of each row's argmax."""
    return torch.zeros_like(p).scatter_(-1, p.argmax(-1, keepdim=True), 1.0)
