"""The one decode loop, for every drafter and verifier: draft → verify → roll back → commit.

The autoregressive baseline is this loop with the `none` drafter (k = 0), on the same target
wrapper, so a speedup compares like with like.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

from specresearch import settings
from specresearch.drafters.base import Context, Drafter
from specresearch.errors import SpecResearchError
from specresearch.metrics import SpecStats
from specresearch.models import LoadedModel
from specresearch.sampling import logits_to_probs
from specresearch.target import Target
from specresearch.types import Draft, GenerationOutput, SamplingParams, Verdict
from specresearch.verifiers.base import Verifier


class DraftLength:
    """How many tokens a chain drafter proposes each step: the engine's decision, from the drafter's
    config (`drafter.k`, `drafter.k_policy`, `drafter.k_max`), so drafters keep no draft-length state.

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
        """
        settings.check_draft_length("drafter", k, policy, k_max)
        self.start = self.k = int(k)
        self.policy = policy
        self.k_max = int(k_max) if k_max is not None else 4 * int(k)

    @classmethod
    def of(cls, drafter: Drafter) -> DraftLength | None:
        """The policy `drafter`'s config asks for; None for drafters without a draft length (k = 0)."""
        return cls(drafter.k, drafter.k_policy, drafter.k_max) if drafter.k else None

    def reset(self) -> None:
        """A new sequence starts from the configured k."""
        self.k = self.start

    def update(self, drafted: int, accepted: int) -> None:
        """After a verification step: the next step's k (unchanged without a draft)."""
        if self.policy == "heuristic" and drafted:
            self.k = min(self.k_max, self.k + 2) if accepted == drafted else max(1, self.k - 1)


class Engine:
    """Speculative decoding of one prompt at a time (batch size 1).

    The prefill of the prompt yields the first new token. Invariant between steps: the target's KV
    cache holds every token but the last one sampled, so a step feeds [last token, draft tokens]
    (K + 1 tokens) and gets the K + 1 distributions the verifier needs in one forward.
    """

    def __init__(self, target: LoadedModel, drafter: Drafter, verifier: Verifier, sampling: SamplingParams):
        """
        Args:
            target: the model whose distribution we decode from.
            drafter: proposes draft tokens (NoDrafter for plain decoding).
            verifier: decides which draft tokens to keep.
            sampling: temperature / top-k / top-p for p (and for q, through the drafter's Context).
        """
        verifier.check(sampling)
        drafter.check(sampling)
        self.draft_length = DraftLength.of(drafter)
        self.target = Target(target)
        self.tokenizer = target.tokenizer
        self.drafter = drafter
        self.verifier = verifier
        self.sampling = sampling
        self.p_sampling = verifier.p_sampling(sampling)  # how logits become the p the verifier reads (the decoding's, as a rule)
        self.device = target.device

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
        """Decode one prompt (a list of token ids), or a batch of them (a list of such lists).

        A batch returns one GenerationOutput per prompt, in order; row b is seeded with `seed + b` (or
        `seed[b]` for a list of seeds), and its output is the one `generate(prompt[b], seed=seed + b)`
        returns (exactly at fp32; see `_generate` for the arguments). Each row's stats count its own
        tokens; their times are the batch's while the row was decoding (`time_total`: from the batch's
        start to the row's last token), so a batch's throughput is its tokens over the longest row's time.
        """
        rows = _batch(prompt)
        if rows is None:
            if not isinstance(seed, numbers.Integral):
                raise SpecResearchError(f"generate() of one prompt takes one integer seed, got {seed!r}")
            return self._generate(prompt, max_new_tokens, stop_strings, eos_token_ids, seed, reuse_prefill, sample_first, stop_after)
        seeds = _seeds(seed, len(rows))
        return [self._generate(p, max_new_tokens, stop_strings, eos_token_ids, s, reuse_prefill, sample_first, stop_after)
                for p, s in zip(rows, seeds)]

    @torch.inference_mode()
    def _generate(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        stop_strings: Sequence[str] = (),
        eos_token_ids: Sequence[int] | None = None,
        seed: int = 0,
        reuse_prefill: bool = False,
        sample_first: bool = True,
        stop_after: int | None = None,
    ) -> GenerationOutput:
        """Decode up to `max_new_tokens` after `prompt`.

        Stops after the first EOS token (kept in the output, as transformers does) or once the
        decoded text contains a stop string (the text is cut before it; the tokens keep the token
        that completed it). Tokens accepted beyond a stop are discarded, so every method stops
        exactly where the baseline does.

        Args:
            prompt: token ids, at least one.
            max_new_tokens: the most new tokens to return.
            stop_strings: strings that end generation.
            eos_token_ids: ids that end generation; default: the tokenizer's eos_token_id.
            seed: seeds the generator of every random draw (drafter and verifier).
            reuse_prefill: keep the prompt's prefill (target and drafter) and restore it when the next
                call has the same prompt: for many samples of one prompt, not for timing prompts.
            sample_first: True: the prefill yields the first new token, drawn from p alone (plain
                decoding's step, as transformers does). False: the prompt's last token counts as the
                newest one sampled, so every new token comes from a draft-and-verify step: the
                equivalence tests use it to test what the method itself produces (prompts of >= 2 tokens).
            stop_after: end once this many new tokens are out, while drafts may still reach
                `max_new_tokens` (the law tests read the first tokens of full-depth drafts).

        Returns:
            The new tokens and text, with counters and a time split in `stats`.

        Raises:
            SpecResearchError: a request the target cannot decode (see `check_request`), before any forward.
        """
        prompt = self.check_request(prompt, max_new_tokens, sample_first)
        if eos_token_ids is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
            eos_token_ids = [] if eos is None else [eos]
        eos_set, stops = set(eos_token_ids), list(stop_strings)
        rng = torch.Generator(device=self.device).manual_seed(seed)
        start = len(prompt)
        tokens = torch.empty(start + max_new_tokens, dtype=torch.long, device=self.device)
        tokens[:start] = torch.tensor(prompt, dtype=torch.long)
        new: list[int] = []  # the same tokens as tokens[start:], on the host, for the stop checks
        limit = min(max_new_tokens, stop_after or max_new_tokens)  # new tokens out before the loop ends
        stats = SpecStats(prompt_tokens=start)
        forwards_before = self.drafter.draft_forwards
        clock = _Clock(self.device)
        hidden: Tensor | None = None  # [R, H] the target's hidden states of the tokens it took in last (needs_hidden)

        def room() -> int:
            return max_new_tokens - len(new) - 1  # draft tokens that fit: the recovered or bonus token comes on top

        def context() -> Context:
            max_draft = room() if self.draft_length is None else min(room(), self.draft_length.k)
            return Context(tokens[: start + len(new)], self.sampling, rng, max_draft, reuse_prefill, hidden)

        def append(verdict: Verdict) -> str | None:
            """Append the verdict's tokens one by one, up to the first stop; return the stop reason."""
            at = start + len(new)
            tokens[at : at + verdict.tokens.numel()] = verdict.tokens
            for tok in verdict.tokens.tolist():
                new.append(tok)
                reason = self._stop_reason(new, limit, eos_set, stops)
                if reason:
                    return reason
            return None

        with clock.total(stats):
            # The prefill gives the first new token, exactly as plain decoding (and transformers) do;
            # without sample_first it leaves the prompt's last token out of the cache, as a step does.
            with clock.phase(stats, "time_prefill"):
                if self.draft_length is not None:
                    self.draft_length.reset()
                self.target.reset()
                self.target.keep_hidden = self.drafter.needs_hidden
                logits = self.target.prefill(tokens[: start if sample_first else start - 1], reuse_prefill)  # [1, V]
                if self.drafter.needs_hidden:
                    hidden = self.target.hidden  # [T, H] the prompt tokens' (all but the last without sample_first)
                stop_reason = append(self.verifier(_NO_DRAFT, logits_to_probs(logits, self.p_sampling), rng)) if sample_first else None
                if stop_reason is None:
                    self.drafter.prefill(context())
            while stop_reason is None:
                with clock.phase(stats, "time_draft"):
                    draft = self.drafter.propose(context())
                with clock.phase(stats, "time_verify"):
                    cached = self.target.length
                    last = tokens[start + len(new) - 1 : start + len(new)]  # [1] not yet in the cache
                    fed = torch.cat([last, draft.tokens.to(self.device)])  # [1 + K]: the root, then the draft
                    parents = None if draft.parents is None else torch.cat([_ROOT, draft.parents.cpu() + 1])
                    logits = self.target.forward(fed, parents=parents)  # [1 + K, V]
                with clock.phase(stats, "time_accept"):
                    k = len(draft)  # proposals; scratch rows come after them
                    p = logits_to_probs(logits[: k + 1], self.p_sampling)  # [K+1, V]
                    verdict = self.verifier(draft, p, rng)
                    path = range(verdict.num_accepted) if verdict.path is None else verdict.path
                    rows = [0] + [1 + i for i in path]  # the root and the accepted nodes
                    if self.drafter.needs_hidden:
                        hidden = self.target.hidden[rows]  # [R, H] the kept path's: the last gave the added token
                    self.target.keep(cached, rows)
                chain = self.drafter.k > 0 and draft.parents is None and draft.depth == min(self.drafter.k, room())
                stats.observe(draft.depth, verdict.num_accepted, nodes=draft.tokens.numel(), off_chain=not chain)
                if self.draft_length is not None:
                    self.draft_length.update(draft.depth, verdict.num_accepted)
                stop_reason = append(verdict)
                if stop_reason is None:
                    with clock.phase(stats, "time_draft"):
                        if draft.scratch:
                            self.drafter.observe(logits[k + 1 :])
                        self.drafter.commit(context(), verdict)
        stats.new_tokens = len(new)
        stats.draft_forwards = self.drafter.draft_forwards - forwards_before
        text = self._decode(new)
        if stop_reason == "stop_string":
            text = text[: min(i for i in (text.find(s) for s in stops) if i >= 0)]
        return GenerationOutput(tokens=new, text=text, stats=stats, stop_reason=stop_reason)

    def check_request(self, prompt: Sequence[int] | Tensor, max_new_tokens: int, sample_first: bool = True) -> list[int]:
        """The prompt as a list of token ids, or a one-line SpecResearchError for a request the target
        cannot decode: a prompt that is not integer token ids (text, floats, bools), is too short,
        holds an id outside [0, vocab size); a max_new_tokens that is not an integer >= 1; or a
        prompt and max_new_tokens that need more positions than the model has. Once per call, O(T)."""
        if isinstance(prompt, (str, bytes)):
            raise SpecResearchError("generate() takes token ids, not text: encode it with engine.tokenizer.encode(text)")
        if isinstance(prompt, Tensor):
            if prompt.dim() != 1 or prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
                raise SpecResearchError(f"generate() takes the prompt as a 1-D tensor of integer token ids, got a "
                                        f"{prompt.dim()}-D {str(prompt.dtype).removeprefix('torch.')} tensor")
            ids = prompt.tolist()
        elif isinstance(prompt, Sequence) or hasattr(prompt, "tolist"):  # a list, a tuple, a numpy array
            ids = list(prompt) if isinstance(prompt, Sequence) else prompt.tolist()
            for at, token in enumerate(ids):
                if not isinstance(token, numbers.Integral) or isinstance(token, bool):
                    raise SpecResearchError(f"generate() takes the prompt as a list of integer token ids, got {token!r} "
                                            f"({type(token).__name__}) at position {at}")
        else:
            raise SpecResearchError(f"generate() takes the prompt as a list (or 1-D tensor) of integer token ids, got "
                                    f"{type(prompt).__name__}")
        least = 1 if sample_first else 2
        if len(ids) < least:
            raise SpecResearchError(f"generate() needs a prompt of at least {least} token id{'s' * (least > 1)}"
                                    f"{'' if sample_first else ' with sample_first=False'}, got {len(ids)}")
        vocab, name = self.target.vocab_size, self.target.lm.name
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise SpecResearchError(f"token id {bad} at position {ids.index(bad)} of the prompt is outside {name}'s "
                                    f"vocabulary: ids must be in [0, {vocab})")
        ids = [int(token) for token in ids]  # numpy integers and the like: plain ints from here on
        if not isinstance(max_new_tokens, numbers.Integral) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise SpecResearchError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        limit = self.target.max_positions
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
        if stops and any(s in self._decode(new[-_STOP_WINDOW:]) for s in stops):
            return "stop_string"
        if len(new) >= max_new:
            return "length"
        return None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True) if self.tokenizer is not None else ""


def _batch(prompt) -> list | None:
    """The rows of a batch of prompts (a list or tuple of prompts, or a 2-D tensor); None for one prompt."""
    if isinstance(prompt, Tensor):
        return list(prompt) if prompt.dim() == 2 else None
    if isinstance(prompt, (list, tuple)):
        if not prompt:
            raise SpecResearchError("generate() got no prompt: give a list of token ids, or a list of such lists")
        if all(isinstance(row, (Sequence, Tensor)) and not isinstance(row, (str, bytes)) for row in prompt):
            return list(prompt)
    return None


def _seeds(seed: int | Sequence[int], n: int) -> list[int]:
    """One seed per row: seed + b, or the list given (of n integers)."""
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
        return [int(seed) + b for b in range(n)]
    seeds = list(seed) if isinstance(seed, Sequence) else None
    if seeds is None or len(seeds) != n or not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in seeds):
        raise SpecResearchError(f"generate() of {n} prompts takes one integer seed (row b gets seed + b) or a list of {n} integers, got {seed!r}")
    return [int(s) for s in seeds]


_NO_DRAFT = Draft.empty()  # the prefill step verifies nothing
_ROOT = torch.tensor([-1])  # the last committed token heads every tree
_STOP_WINDOW = 24  # tokens decoded to look for a stop string ending at the newest token


class _Clock:
    """Wall-clock timing of the loop's phases; synchronises CUDA so GPU time lands in the right phase."""

    def __init__(self, device: torch.device):
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    @contextmanager
    def phase(self, stats: SpecStats, name: str):
        self.sync()
        t0 = time.perf_counter()
        yield
        self.sync()
        setattr(stats, name, getattr(stats, name) + time.perf_counter() - t0)

    @contextmanager
    def total(self, stats: SpecStats):
        with self.phase(stats, "time_total"):
            yield
