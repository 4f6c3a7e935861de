"""The one decode loop, for every drafter and verifier: draft → verify → roll back → commit.

The autoregressive baseline is this loop with the `none` drafter (k = 0), on the same target
wrapper, so a speedup compares like with like.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from specresearch.drafters.base import Context, Drafter
from specresearch.errors import SpecResearchError
from specresearch.kv import CachedLM
from specresearch.metrics import SpecStats
from specresearch.models import LoadedModel
from specresearch.sampling import logits_to_probs
from specresearch.seeding import stream_seed
from specresearch.types import Draft, GenerationOutput, SamplingParams, Verdict
from specresearch.verifiers.base import Verifier


class DraftLength:
    """How many tokens a chain drafter proposes each step: the engine's decision, from the drafter's
    settings (`Drafter.draft_length`: k, k_policy, k_max), so drafters keep no draft-length state.

    "fixed": k every step. "heuristic": transformers' assisted generation: k += 2 after a fully
    accepted draft, k −= 1 otherwise, within [1, k_max]; every sequence starts from k. Lossless
    either way: k depends on past verdicts only.
    """

    def __init__(self, k: int, policy: str = "fixed", k_max: int | None = None):
        """
        Args:
            k: draft tokens per step (the first step's under the heuristic).
            policy: "fixed" or "heuristic".
            k_max: the largest k the heuristic may reach; None = 4 k.

        The drafter's settings were checked where they entered (options.drafters.DraftLength).
        """
        self.start = self.k = int(k)
        self.policy = policy
        self.k_max = int(k_max) if k_max is not None else 4 * int(k)

    @classmethod
    def of(cls, drafter: Drafter) -> DraftLength | None:
        """The policy `drafter`'s config asks for; None for drafters without a draft length (k = 0)."""
        length = drafter.draft_length()
        return cls(length.k, length.k_policy, length.k_max) if length is not None and length.k else None

    def reset(self) -> None:
        """A new sequence starts from the configured k."""
        self.k = self.start

    def update(self, drafted: int, accepted: int) -> None:
        """After a verification step: the next step's k (unchanged without a draft)."""
        if self.policy == "heuristic" and drafted:
            self.k = min(self.k_max, self.k + 2) if accepted == drafted else max(1, self.k - 1)


class Engine:
    """Speculative decoding of one prompt, or of a batch of prompts together.

    The prefill of the prompt yields the first new token. Invariant between steps: the target's KV
    cache holds every token but the last one sampled, so a step feeds [last token, draft tokens]
    (K + 1 tokens) and gets the K + 1 distributions the verifier needs in one forward. A batch does
    this for every row in the same forward (ragged: each row feeds its own draft, keeps its own
    accepted path, stops on its own; see `CachedLM` for the cache layout), with one generator per row,
    so a row decodes what its prompt decodes alone.
    """

    def __init__(self, target: LoadedModel, drafter: Drafter, verifier: Verifier, sampling: SamplingParams,
                 time_split: bool | str = "auto"):
        """
        Args:
            target: the model whose distribution we decode from.
            drafter: proposes draft tokens (NoDrafter for plain decoding).
            verifier: decides which draft tokens to keep.
            sampling: temperature / top-k / top-p for p (and for q, through the drafter's Context).
            time_split: time each step's phases (stats' time_draft, time_verify, time_accept), with a
                device sync at each phase's ends; without it a step syncs only where its decisions read
                the device (the accepted lengths, the tokens). "auto": on unless the target is on CUDA.
        """
        verifier.check_sampling(sampling)
        drafter.check_sampling(sampling)
        DraftLength.of(drafter)  # refuses a bad draft length before any decode
        self.kv = CachedLM(target)
        self.tokenizer = target.tokenizer
        self.drafter = drafter
        self.verifier = verifier
        self.sampling = sampling
        self.p_sampling = verifier.p_sampling(sampling)  # how logits become the p the verifier reads (the decoding's, as a rule)
        self.argmax = verifier.argmax_path(sampling)  # p one-hot (T = 0): verdicts from the argmax, no law built, nothing drawn
        self.device = target.device
        self.time_split = self.device.type != "cuda" if time_split == "auto" else bool(time_split)
        self.on_tokens: Callable[[int], None] | None = None  # told the number of new tokens of every step (a progress bar)

    @property
    def label(self) -> str:
        """`drafter(k=K) x verifier` (`drafter(depth=D)` for trees): how runs and progress bars name this engine."""
        return f"{self.drafter.name}({self.drafter.size_label}) x {self.verifier.name}"

    def generate(
        self,
        prompt: Sequence[int] | Sequence[Sequence[int]],
        max_new_tokens: int,
        stop_strings: Sequence[str] = (),
        eos_token_ids: Sequence[int] | None = None,
        seed: int | Sequence[int] = 0,
        reuse_prefill: bool = False,
        sample_first: bool = True,
        stop_after: int | None = None,
    ) -> GenerationOutput | list[GenerationOutput]:
        """Decode up to `max_new_tokens` after one prompt (a list of token ids), or after each prompt
        of a batch (a list of such lists): one target forward verifies every row's draft.

        Stops after the first EOS token (kept in the output, as transformers does) or once the
        decoded text contains a stop string (the text is cut before it; the tokens keep the token
        that completed it). Tokens accepted beyond a stop are discarded, so every method stops
        exactly where the baseline does. In a batch each row stops on its own and stops costing
        forwards; its tokens and counters are its own, its times the batch's while it was decoding.

        Args:
            prompt: token ids (a list, a 1-D tensor or numpy array), at least one; or a batch: a list of
                prompts, or a 2-D tensor or numpy array of equal-length prompts (one per row).
            max_new_tokens: the most new tokens to return (per row).
            stop_strings: strings that end generation.
            eos_token_ids: ids that end generation; default: the tokenizer's eos_token_id.
            seed: seeds the generator of every random draw (drafter and verifier), through
                `specresearch.seeding.stream_seed`: one prompt's generator is stream (seed, 0); a batch's
                row b gets stream (seed, b), the b-th stream spawned from `seed` (so a batch of one is
                the prompt alone, and calls with seeds s and s + 1 share no stream); with a list of one
                seed per row, row b gets stream (seed[b], 0) and decodes exactly what
                `generate(prompt[b], seed=seed[b])` does (at fp32).
            reuse_prefill: keep the prompt's prefill (target and drafter) and restore it when the next
                call has the same prompt (a batch: one prompt in every row): for many samples of one
                prompt, not for timing prompts.
            sample_first: True: the prefill yields the first new token, drawn from p alone (plain
                decoding's step, as transformers does). False: the prompt's last token counts as the
                newest one sampled, so every new token comes from a draft-and-verify step: the
                equivalence tests use it to test what the method itself produces (prompts of >= 2 tokens).
            stop_after: end once this many new tokens are out, while drafts may still reach
                `max_new_tokens` (the law tests read the first tokens of full-depth drafts).

        Returns:
            The new tokens and text, with counters and a time split in `stats` (`time_total`: from the
            start to the row's last token); a list of them, in order, for a batch.

        Raises:
            SpecResearchError: a request the target cannot decode (see `check_request`), before any forward.
        """
        rows = _batch(prompt)
        if rows is None:
            if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
                raise SpecResearchError(f"generate() of one prompt takes one integer seed, got {seed!r}")
            return self._decode([self.check_request(prompt, max_new_tokens, sample_first)], [stream_seed(seed, 0)], max_new_tokens,
                                stop_strings, eos_token_ids, reuse_prefill, sample_first, stop_after)[0]
        seeds = _seeds(seed, len(rows))
        checked = []
        for b, row in enumerate(rows):
            if b and row is rows[b - 1]:  # one prompt object repeated (many samples of a prompt): checked once
                checked.append(checked[-1])
                continue
            try:
                checked.append(self.check_request(row, max_new_tokens, sample_first))
            except SpecResearchError as err:
                raise SpecResearchError(f"prompt {b} of the batch: {err}") from None
        return self._decode(checked, seeds, max_new_tokens, stop_strings, eos_token_ids, reuse_prefill, sample_first, stop_after)

    @torch.inference_mode()
    def _decode(self, prompts: list[list[int]], seeds: list[int], max_new_tokens: int, stop_strings: Sequence[str],
                eos_token_ids: Sequence[int] | None, reuse_prefill: bool, sample_first: bool,
                stop_after: int | None) -> list[GenerationOutput]:
        """The decode loop over the rows of a batch (checked prompts); see `generate`.

        A step is batch-wide tensor work: the target's one forward for every row, the verifier's laws
        and draws, and one write of every row's new tokens into the rows' token buffer ([B, T] on the
        device; a row's context is a view of its buffer row). What stays per row in Python is O(1)
        bookkeeping on the host: the Context handed to the drafter, the verdict's few token ids, the
        row's counters (SpecStats) and its stop checks (EOS and length from those ids; a stop string
        decodes the row's last tokens), plus the drafter's own per-row work (see each drafter).
        """
        if eos_token_ids is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
            eos_token_ids = [] if eos is None else [eos]
        eos_set, stops = set(eos_token_ids), list(stop_strings)
        limit = min(max_new_tokens, stop_after or max_new_tokens)  # new tokens out before a row ends
        clock = _Clock(self.device, self.time_split)
        buffer = torch.zeros(len(prompts), max(len(p) for p in prompts) + max_new_tokens, dtype=torch.long)  # [B, T] every row's tokens
        made: dict[int, Tensor] = {}  # each prompt's ids as a tensor, made once for a prompt repeated (many samples of it)
        for b, prompt in enumerate(prompts):
            if id(prompt) not in made:
                made[id(prompt)] = torch.tensor(prompt, dtype=torch.long)
            buffer[b, : len(prompt)] = made[id(prompt)]
        buffer = buffer.to(self.device)
        rows = [_Row(b, prompt, max_new_tokens, torch.Generator(device=self.device).manual_seed(seed), self.drafter)
                for b, (prompt, seed) in enumerate(zip(prompts, seeds))]
        drafter, needs_hidden = self.drafter, self.drafter.needs_hidden

        def context(row: _Row) -> Context:
            room = row.room(max_new_tokens)
            max_draft = room if row.draft_length is None else min(room, row.draft_length.k)
            return Context(buffer[row.index, : row.end], self.sampling, row.rng, max_draft, reuse_prefill, row.hidden)

        def append(rows: list[_Row], verdicts: list[Verdict]) -> None:
            """Each row's verdict tokens, one by one up to the first stop (which ends the row), then one
            write of every row's into the buffer."""
            index: list[int] = []  # (row, position, token) of every token written
            position: list[int] = []
            written: list[int] = []
            for row, verdict in zip(rows, verdicts):
                for tok in verdict.tokens.tolist():
                    index.append(row.index)
                    position.append(row.end)
                    written.append(tok)
                    row.new.append(tok)
                    row.stop = self._stop_reason(row.new, limit, eos_set, stops)
                    if row.stop:
                        row.stats.time_total = clock.since_start()
                        break
            if written:
                at = torch.tensor([index, position, written]).to(self.device)  # [3, N] one copy to the device
                buffer[at[0], at[1]] = at[2]
                if self.on_tokens is not None:
                    self.on_tokens(len(written))

        def going(active: list[_Row], drafted: bool = True) -> list[_Row]:
            """The rows still decoding; the finished ones leave the target's cache and the drafter's (so
            they cost no more forwards), with their count of draft forwards."""
            index = [i for i, row in enumerate(active) if row.stop is None]
            if len(index) < len(active):
                if drafted:
                    for row, count in zip(active, drafter.row_forwards):
                        row.stats.draft_forwards = count
                if index:
                    self.kv.select_rows(index)
                    if drafted:
                        drafter.select_rows(index)
            return [active[i] for i in index]

        clock.start()
        # The prefill gives the first new token, exactly as plain decoding (and transformers) do;
        # without sample_first it leaves the prompt's last token out of the cache, as a step does.
        with clock.phase(rows, "time_prefill"):
            self.kv.reset(buffer.shape[1] + 1)
            self.kv.keep_hidden = needs_hidden
            prompts_fed = [buffer[row.index, : row.start - (not sample_first)] for row in rows]
            logits = self.kv.prefill_rows(prompts_fed, reuse_prefill)  # [B, V]
            if needs_hidden:
                for b, row in enumerate(rows):
                    row.hidden = self.kv.hidden_rows[b]  # [T, H] the prompt tokens' (all but the last without sample_first)
            if sample_first:
                append(rows, self.verify([_NO_DRAFT] * len(rows), logits[:, None], rows))
            active = going(rows, drafted=False)
            if active:
                drafter.prefill_rows([context(row) for row in active])
        while active:
            with clock.phase(active, "time_draft"):
                drafts = drafter.propose_rows([context(row) for row in active])
            with clock.phase(active, "time_verify"):
                last = torch.tensor([row.newest for row in active]).to(self.device)[:, None]  # [B, 1] each row's newest token: the root
                if any(draft.tokens.numel() for draft in drafts):  # then the drafts' tokens (proposals and scratch)
                    tokens = torch.nn.utils.rnn.pad_sequence([draft.tokens.to(self.device) for draft in drafts], batch_first=True)
                    last = torch.cat([last, tokens], 1)  # [B, 1 + K]
                fed = [last[b, : 1 + draft.tokens.numel()] for b, draft in enumerate(drafts)]  # [1 + K_b]: the root, then the draft (views)
                parents = [None if draft.parents is None else torch.cat([_ROOT, draft.parents.cpu() + 1]) for draft in drafts]
                logits = self.kv.forward_rows(fed, parents, padded=True)  # [B, W, V]: row b's first 1 + K_b (+ scratch) its own
            with clock.phase(active, "time_accept"):
                width = 1 + max(len(draft) for draft in drafts)  # proposals; scratch positions come after them
                verdicts = self.verify(drafts, logits[:, :width], active)
                # each row's root and accepted nodes
                kept = [[0] + [1 + i for i in (range(v.num_accepted) if v.path is None else v.path)] for v in verdicts]
                if needs_hidden:
                    for b, row in enumerate(active):
                        row.hidden = self.kv.hidden_rows[b][kept[b]]  # [R, H] the kept path's: the last gave the added token
                self.kv.keep_rows(kept)
            for row, draft, verdict in zip(active, drafts, verdicts):
                chain = self.drafter.k > 0 and draft.parents is None and draft.depth == min(self.drafter.k, row.room(max_new_tokens))
                row.stats.observe(draft.depth, verdict.num_accepted, nodes=draft.tokens.numel(), off_chain=not chain)
                if row.draft_length is not None:
                    row.draft_length.update(draft.depth, verdict.num_accepted)
            append(active, verdicts)
            index = [i for i, row in enumerate(active) if row.stop is None]
            active = going(active)
            if not active:
                break
            with clock.phase(active, "time_draft"):
                for b, i in enumerate(index):
                    if drafts[i].scratch:
                        drafter.observe_row(b, logits[i, len(drafts[i]) + 1 : len(fed[i])])
                drafter.commit_rows([context(row) for row in active], [verdicts[i] for i in index])
        return [self._output(row, stops) for row in rows]

    def verify(self, drafts: list[Draft], logits: Tensor, rows: list[_Row]) -> list[Verdict]:
        """The verifier's verdicts on the B rows' drafts from the target's logits ([B, W, V]: row b's
        first K_b + 1 positions its own): from their argmax where p is one-hot (T = 0), else from p."""
        if self.argmax:
            return self.verifier.verify_argmax(drafts, logits.argmax(-1))
        return self.verifier.verify_rows(drafts, logits_to_probs(logits, self.p_sampling), [row.rng for row in rows])

    def _output(self, row: _Row, stops: list[str]) -> GenerationOutput:
        row.stats.new_tokens = len(row.new)
        text = self._decode_text(row.new)
        if row.stop == "stop_string":
            text = text[: min(i for i in (text.find(s) for s in stops) if i >= 0)]
        return GenerationOutput(tokens=row.new, text=text, stats=row.stats, stop_reason=row.stop)

    def check_request(self, prompt: Sequence[int] | Tensor, max_new_tokens: int, sample_first: bool = True) -> list[int]:
        """The prompt as a list of token ids, or a one-line SpecResearchError for a request the target
        cannot decode: a prompt that is not integer token ids (text, floats, bools), is too short,
        holds an id outside [0, vocab size); a max_new_tokens that is not an integer >= 1; or a
        prompt and max_new_tokens that need more positions than the model has. Once per call, O(T)."""
        if isinstance(prompt, (str, bytes)):
            raise SpecResearchError("generate() takes token ids, not text: encode it with engine.tokenizer.encode(text)")
        if isinstance(prompt, Tensor) or hasattr(prompt, "ndim") and hasattr(prompt, "dtype") and hasattr(prompt, "tolist"):
            kind = "tensor" if isinstance(prompt, Tensor) else "array"
            dtype = str(prompt.dtype).removeprefix("torch.")
            integer = (not (prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool) if kind == "tensor"
                       else getattr(prompt.dtype, "kind", "") in ("i", "u"))
            if prompt.ndim != 1 or not integer:
                raise SpecResearchError(f"generate() takes the prompt as a 1-D {kind} of integer token ids (a batch: a 2-D {kind} of "
                                        f"equal-length prompts, one per row, or a list of prompts), got a {prompt.ndim}-D {dtype} "
                                        f"{kind}{' with no rows' if prompt.ndim == 2 else ''}")
            ids = [int(token) for token in prompt.tolist()]
        elif isinstance(prompt, Sequence) or hasattr(prompt, "tolist"):  # a list, a tuple, a numpy array
            ids = list(prompt) if isinstance(prompt, Sequence) else prompt.tolist()
            if not all(type(token) is int for token in ids):  # (the common case, plain ints, skips the slow ABC check)
                for at, token in enumerate(ids):
                    if not isinstance(token, numbers.Integral) or isinstance(token, bool):
                        raise SpecResearchError(f"generate() takes the prompt as a list of integer token ids, got {token!r} "
                                                f"({type(token).__name__}) at position {at}")
                ids = [int(token) for token in ids]  # numpy integers and the like: plain ints from here on
        else:
            raise SpecResearchError(f"generate() takes the prompt as a list (or 1-D tensor) of integer token ids, got "
                                    f"{type(prompt).__name__}")
        least = 1 if sample_first else 2
        if len(ids) < least:
            raise SpecResearchError(f"generate() needs a prompt of at least {least} token id{'s' * (least > 1)}"
                                    f"{'' if sample_first else ' with sample_first=False'}, got {len(ids)}")
        vocab, name = self.kv.vocab_size, self.kv.lm.name
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise SpecResearchError(f"token id {bad} at position {ids.index(bad)} of the prompt is outside {name}'s "
                                    f"vocabulary: ids must be in [0, {vocab})")
        if not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise SpecResearchError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        limit = self.kv.max_positions
        if limit is not None and len(ids) + max_new_tokens > limit:
            room = (f"the prompt leaves room for {limit - len(ids)} new tokens: lower max_new_tokens or shorten the prompt"
                    if len(ids) < limit else "the prompt alone fills them: shorten it")
            raise SpecResearchError(f"the prompt ({len(ids)} tokens) and max_new_tokens={max_new_tokens} need "
                                    f"{len(ids) + max_new_tokens} positions, but {name} has {limit} (max_position_embeddings): {room}")
        return ids

    def _stop_reason(self, new: list[int], max_new: int, eos: set[int], stops: list[str]) -> str | None:
        """Whether plain decoding would stop after the last token of `new`."""
        if new[-1] in eos:
            return "eos"
        if stops and any(s in self._decode_text(new[-_STOP_WINDOW:]) for s in stops):
            return "stop_string"
        if len(new) >= max_new:
            return "length"
        return None

    def _decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""


def _batch(prompt) -> list | None:
    """The rows of a batch of prompts (a list or tuple of prompts, or a 2-D tensor or numpy array: equal-length
    prompts, one per row); None for one prompt."""
    if (isinstance(prompt, Tensor) and prompt.dim() == 2 or getattr(prompt, "ndim", None) == 2 and hasattr(prompt, "tolist")) \
            and len(prompt):
        return list(prompt)  # its rows: 1-D tensors or arrays, each checked as one prompt
    if isinstance(prompt, (list, tuple)):
        if prompt and all(isinstance(row, (Sequence, Tensor)) and not isinstance(row, (str, bytes)) or getattr(row, "ndim", None) == 1
                          for row in prompt):
            return list(prompt)
    return None


def _seeds(seed: int | Sequence[int], n: int) -> list[int]:
    """Each row's generator seed: stream (seed, b) for row b of one integer seed, stream (seed[b], 0)
    for a list of n integers (what `generate(prompt[b], seed=seed[b])` uses)."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return [stream_seed(seed, b) for b in range(n)]
    seeds = list(seed) if isinstance(seed, Sequence) else None
    if seeds is None or len(seeds) != n or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in seeds):
        raise SpecResearchError(f"generate() of {n} prompts takes one integer seed (row b gets stream b of it: "
                                f"specresearch.seeding.stream_seed(seed, b)) or a list of {n} integers (row b decodes as "
                                f"generate(prompt[b], seed=seed[b]) does), got {seed!r}")
    return [stream_seed(s, 0) for s in seeds]


_NO_DRAFT = Draft.empty()  # the prefill step verifies nothing
_ROOT = torch.tensor([-1])  # the last committed token heads every tree
_STOP_WINDOW = 24  # tokens decoded to look for a stop string ending at the newest token


class _Row:
    """One sequence of a batch, on the host: where its tokens are (its row of the batch's token buffer),
    its new tokens' ids, its generator, draft length and counters."""

    def __init__(self, index: int, prompt: list[int], max_new_tokens: int, rng: torch.Generator, drafter: Drafter):
        self.index, self.start, self.rng = index, len(prompt), rng  # its row of the buffer, the prompt's length
        self.prompt_last = prompt[-1]
        self.new: list[int] = []  # the new tokens (the buffer holds them after the prompt)
        self.draft_length = DraftLength.of(drafter)  # every sequence starts from the configured k
        self.stats = SpecStats(prompt_tokens=len(prompt))
        self.hidden: Tensor | None = None  # [R, H] the target's hidden states of the tokens it took in last (needs_hidden)
        self.stop: str | None = None  # why the row ended: "eos" | "stop_string" | "length"

    @property
    def end(self) -> int:
        """The row's tokens so far: the prompt and the new ones."""
        return self.start + len(self.new)

    @property
    def newest(self) -> int:
        """The newest token (not yet in the target's cache after a step)."""
        return self.new[-1] if self.new else self.prompt_last

    def room(self, max_new_tokens: int) -> int:
        """Draft tokens that fit: the recovered or bonus token comes on top."""
        return max_new_tokens - len(self.new) - 1


class _Clock:
    """Wall-clock timing of the loop's phases, added to the rows decoding in them; synchronises CUDA
    so GPU time lands in the right phase. Without `split` only the total is timed (a sync at a row's end)."""

    def __init__(self, device: torch.device, split: bool = True):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.split = split
        self.t0 = 0.0

    def start(self) -> None:
        self.sync()
        self.t0 = time.perf_counter()

    def since_start(self) -> float:
        self.sync()
        return time.perf_counter() - self.t0

    @contextmanager
    def phase(self, rows: list[_Row], name: str):
        if not self.split:  # (the phases' times stay 0: SpecStats.split_timed)
            yield
            return
        self.sync()
        t0 = time.perf_counter()
        yield
        self.sync()
        seconds = time.perf_counter() - t0
        for row in rows:
            setattr(row.stats, name, getattr(row.stats, name) + seconds)
