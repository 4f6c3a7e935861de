"""specresearch as an lm-eval model, registered as `specresearch`.

`generate_until` decodes through the engine, so any drafter × verifier is scored by any lm-eval
generation task; `loglikelihood` scores with the target alone (speculation never changes the
target's probabilities, so the method and the baseline give the same numbers there).

From the lm-eval command line the model arguments are our Hydra overrides, and lm-eval's usual
`pretrained=NAME` names the target (as `model=NAME` or `model.name=NAME` would):

    lm-eval run --model specresearch --model_args pretrained=qwen2.5-coder-1.5b,drafter=pld,drafter.k=4 ...

From Python, hand it an engine: `SpecResearchLM(engine=Engine(...), seed=0)`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from specresearch.build import build_engine
from specresearch.config import compose, options
from specresearch.engine import Engine
from specresearch.errors import SpecResearchError
from specresearch.records import code_tags
from specresearch.seeding import stream_seed
from specresearch.types import GenerationOutput, SamplingParams

MAX_GEN_TOKS = 256  # lm-eval's usual default when a task does not say
_SAMPLING_KEYS = ("do_sample", "temperature", "top_p", "top_k")
_IGNORED_KEYS = ("until", "max_gen_toks", "max_new_tokens", "num_beams", "repetition_penalty")


@register_model("specresearch")
class SpecResearchLM(TemplateLM):
    """An lm-eval `LM` backed by one specresearch engine; `generate_until` decodes `batch_size`
    requests per `Engine.generate` call (lm-eval's `--batch_size N`).

    Every `generate_until` request and its output are kept in `self.outputs` (tokens, stop reason,
    speed counters), in the requests' order, so a runner can report τ and tokens/s next to the score.
    """

    backend = "causal"

    def __init__(self, engine: Engine | None = None, seed: int | None = None, max_length: int | None = None,
                 batch_size: int | str | None = None, max_batch_size: int | None = None, device: str | None = None,
                 pretrained: str | None = None, first_index: int = 0, **overrides: Any):
        """
        Args:
            engine: the engine to decode with; None builds one from `overrides`.
            seed: request i of a `generate_until` call is decoded with stream `first_index + i` of this
                seed (`specresearch.seeding.stream_seed(seed, first_index + i)`; default: the config's
                `seed`, 0).
            max_length: the longest context scored by `loglikelihood_rolling` (default: the model's
                position limit, at most 4096).
            batch_size: requests decoded together by `generate_until` (lm-eval's `--batch_size N`): an
                integer >= 1, or the string of one as lm-eval's command line gives it; default: the
                config's `batch_size` (1). lm-eval's `auto` is refused: give a number.
            max_batch_size: lm-eval's cap for `batch_size=auto`; refused, as `auto` is.
            device: lm-eval's `--device`: the same as the override `model.device=...` (its default
                cuda:0 falls back to `auto` where CUDA is missing, as lm-eval's hf model does).
            pretrained: lm-eval's name for the target model: a preset of conf/model
                (`qwen2.5-coder-1.5b`, `tiny`, ...) as `model=NAME`, else (a Hugging Face id, a local
                directory, a .gguf file) as `model.name=NAME`. Given with a different `model` or
                `model.name`, it is refused.
            first_index: the index of the first request among the task's problems (a run's `eval.offset`),
                so problem i gets stream i whatever slice holds it.
            overrides: Hydra overrides of conf/config.yaml (`drafter=pld`, `drafter.k=4`, `model=tiny`,
                `sampling=random`, ...), as lm-eval's `--model_args` passes them.
        """
        super().__init__()
        size = None if batch_size is None else batch_size_of(batch_size)  # refused before any model loads
        if not isinstance(first_index, int) or isinstance(first_index, bool) or first_index < 0:
            raise SpecResearchError(f"model specresearch: first_index must be an integer >= 0, got {first_index!r}")
        if max_batch_size is not None:
            raise SpecResearchError(f"model specresearch: max_batch_size goes with batch_size=auto, which it does not "
                                    f"offer: give batch_size=N (an integer >= 1), got max_batch_size={max_batch_size!r}")
        if pretrained is not None:
            overrides = target_overrides(str(pretrained), overrides)
        if engine is None:
            if device is not None and not (device.startswith("cuda") and not torch.cuda.is_available()):
                overrides.setdefault("model.device", device)  # lm-eval's default is cuda:0: where there is none, `auto`
            cfg = compose_config(overrides if seed is None else {**overrides, "seed": seed})
            engine, seed = build_engine(cfg), int(cfg.seed)
            size = size or int(cfg.batch_size)
        elif overrides:
            raise SpecResearchError(f"give either an engine or config overrides, not both (got {sorted(overrides)})")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.seed = seed or 0
        self.first_index = first_index
        self.batch_size = size or 1
        config = engine.kv.lm.model.config
        self.max_length = max_length or min(int(getattr(config, "max_position_embeddings", 4096) or 4096), 4096)
        self._engines: dict[SamplingParams, Engine] = {engine.sampling: engine}
        self.outputs: list[tuple[Any, GenerationOutput]] = []  # (lm-eval Instance, its output) per request

    # -- what lm-eval asks of a causal LM -------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", type(self.tokenizer).__name__)).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return list(self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens)))

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, add_generation_prompt=add_generation_prompt, tokenize=False)

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.tokenizer, "chat_template", None) if chat_template else None

    def get_model_info(self) -> dict[str, str]:
        """What lm-eval adds to its results' `config` about the model: the target's dtype and the code
        that ran it (records.code_tags: git commit and dirty flag, versions of specresearch, torch,
        transformers and lm-eval), under the names MLflow's tags have."""
        return {"model_dtype": str(self.engine.kv.lm.dtype).removeprefix("torch."), **code_tags()}

    @torch.inference_mode()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """Sum of the target's log p over each continuation, and whether it is the target's greedy choice."""
        out = []
        for _, context, continuation in tqdm(requests, desc="loglikelihood", disable=disable_tqdm):
            out.append(self._score(context, continuation))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts, in windows of `max_length` tokens (lm-eval's perplexity tasks)."""
        out = []
        for (text,) in tqdm([r.args for r in requests], desc="loglikelihood_rolling", disable=disable_tqdm):
            windows = get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id, self.max_length, context_len=1)
            out.append(sum(self._score(*make_disjoint_window(w))[0] for w in windows))
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode each request's context through the engine until one of its `until` strings, EOS or
        `max_gen_toks` tokens. The task's `do_sample`/`temperature`/`top_p`/`top_k`, where it sets
        them, override the configured sampling (as in lm-eval's own models).

        Requests that decode alike (same sampling, `until` and `max_gen_toks`) go to the engine
        `batch_size` at a time, longest context first (as lm-eval's own models batch); request i is
        seeded `stream_seed(seed, first_index + i)` whatever its batch, so the texts do not depend on the
        batch size (exactly at T = 0 in fp32), and no two requests, nor two seeds, share a stream. Every
        request is checked before the first is decoded.

        Returns:
            The generated texts, in the requests' order.
        """
        jobs = [self._job(i, request) for i, request in enumerate(requests)]  # refuse a bad request before any decoding
        groups: dict[tuple, list[int]] = {}
        for i, (ids, until, max_new, engine) in enumerate(jobs):
            groups.setdefault((engine.sampling, until, max_new), []).append(i)
        results: list[GenerationOutput | None] = [None] * len(jobs)
        desc = f"generate ({self.engine.label}{f', batch {self.batch_size}' if self.batch_size > 1 else ''})"
        try:
            with tqdm(total=len(jobs), desc=desc, disable=disable_tqdm) as bar:
                for (sampling, until, max_new), members in groups.items():
                    members = sorted(members, key=lambda i: -len(jobs[i][0]))  # similar lengths share a batch
                    for start in range(0, len(members), self.batch_size):
                        batch = members[start:start + self.batch_size]
                        outs = self._engines[sampling].generate([jobs[i][0] for i in batch], max_new, stop_strings=list(until),
                                                                seed=[stream_seed(self.seed, self.first_index + i) for i in batch])
                        for i, output in zip(batch, outs):
                            results[i] = output
                        bar.update(len(batch))
        finally:  # what was decoded, in the requests' order, even when a later batch fails
            self.outputs.extend((request, r) for request, r in zip(requests, results) if r is not None)
        return [r.text for r in results]

    # -- helpers ---------------------------------------------------------------------------------

    def _job(self, i: int, request) -> tuple[list[int], tuple[str, ...], int, Engine]:
        """Request i's context ids, stop strings, token budget and engine (refused in one line if unusable)."""
        context, gen_kwargs = request.args
        kwargs = dict(gen_kwargs or {})
        until = kwargs.get("until") or []
        until = (until,) if isinstance(until, str) else tuple(until)
        max_new = int(kwargs.get("max_gen_toks", kwargs.get("max_new_tokens", MAX_GEN_TOKS)))
        ids = self.tok_encode(context)
        if not ids:
            raise SpecResearchError(f"request {i}: the context encodes to no tokens")
        return ids, until, max_new, self._engine_for(kwargs)

    def _engine_for(self, gen_kwargs: dict) -> Engine:
        """The engine for the request's sampling: the configured one unless the task sets its own."""
        unknown = sorted(set(gen_kwargs) - set(_SAMPLING_KEYS) - set(_IGNORED_KEYS))
        if unknown:
            takes = ", ".join(_SAMPLING_KEYS + _IGNORED_KEYS[:3])
            raise SpecResearchError(f"unsupported generation_kwargs {unknown}: specresearch takes {takes}")
        sampling = self.engine.sampling
        if gen_kwargs.get("do_sample") is False:
            sampling = replace(sampling, temperature=0.0)
        elif "temperature" in gen_kwargs:
            sampling = replace(sampling, temperature=float(gen_kwargs["temperature"]))
        if "top_p" in gen_kwargs:
            sampling = replace(sampling, top_p=float(gen_kwargs["top_p"]))
        if "top_k" in gen_kwargs:
            sampling = replace(sampling, top_k=int(gen_kwargs["top_k"]))
        if sampling not in self._engines:
            base = self.engine
            self._engines[sampling] = Engine(base.kv.lm, base.drafter, base.verifier, sampling, base.time_split)
        return self._engines[sampling]

    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        model = self.engine.kv.lm.model
        ids = (context + continuation)[-(self.max_length + 1):]
        n = len(continuation)
        inputs = torch.tensor([ids[:-1]], device=self.engine.device)  # [1, T]
        logits = model(input_ids=inputs, use_cache=False).logits[0, -n:].float()  # [n, V]
        logp = F.log_softmax(logits, dim=-1)
        target = torch.tensor(ids[-n:], device=logp.device)  # [n]
        return float(logp.gather(-1, target[:, None]).sum()), bool((logits.argmax(-1) == target).all())


def batch_size_of(value: Any) -> int:
    """lm-eval's `batch_size` (an integer, or the string of one from its command line) as an int.

    Raises:
        SpecResearchError: anything else, `auto` and `auto:N` included.
    """
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise SpecResearchError(f"model specresearch: batch_size must be an integer >= 1 (lm-eval's 'auto' is not "
                            f"offered: give a number, e.g. --batch_size 8), got {value!r}")


def target_overrides(pretrained: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with lm-eval's `pretrained=NAME` as our target key: `model=NAME` for a preset of
    conf/model, else `model.name=NAME`.

    Raises:
        SpecResearchError: `model` or `model.name` is given too and names another model.
    """
    for key in ("model", "model.name"):
        if key in overrides and str(overrides[key]) != pretrained:
            raise SpecResearchError(f"model_args: pretrained={pretrained} and {key}={overrides[key]} both name the "
                                    "target model and differ: give one of them")
    key = "model" if pretrained in options("model") else "model.name"
    return {key: pretrained, **overrides}


def compose_config(overrides: dict[str, Any]) -> DictConfig:
    """conf/config.yaml composed with `key=value` overrides (values as lm-eval parsed them)."""
    try:
        return compose(overrides)
    except SpecResearchError as err:
        unknown = re.search(r"(?:^Could not override|has no setting) '([^']+)'", str(err))  # Hydra's advice (`+key=...`) would be ignored
        raise SpecResearchError(f"model_args: {_unknown_key(unknown[1], overrides) if unknown else err}") from None


def _unknown_key(key: str, overrides: dict[str, Any]) -> str:
    parent = key.rpartition(".")[0]
    try:
        node = compose({k: v for k, v in overrides.items() if k != key})
        node = OmegaConf.select(node, parent) if parent else node
    except SpecResearchError:
        node = None
    valid = [k for k in node if not str(k).startswith("_")] if isinstance(node, DictConfig) else []
    if parent:
        return f"unknown key '{key}': valid under {parent} are {', '.join(sorted(valid))}"
    valid += ["pretrained", "device", "batch_size", "max_length"]  # the constructor's own
    return f"unknown key '{key}': valid are {', '.join(sorted(valid))}, and their keys (model.dtype=float32, drafter.k=4)"
