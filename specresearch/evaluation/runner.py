"""`python -m specresearch eval=humaneval|stdlib_doctest`: a drafter × verifier's quality against the target alone.

The same lm-eval task runs twice on the same target, through the engine: with the `none` drafter
(the baseline) and with the configured method. Both scores, their difference, a paired test of that
difference (exact McNemar on the per-problem outcomes) and each problem's two completions go to
MLflow, next to the decoding speed measured on the same generations.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from scipy.stats import binomtest

from specresearch.build import build, build_engine, claim_params
from specresearch.errors import SpecResearchError
from specresearch.evaluation.plugin import TASKS_DIR
from specresearch.metrics import SpecStats
from specresearch.models import cache_root, machine_tags
from specresearch.records import SOLVED_TAG, EvalRecord, EvalSide, flatten, json_text
from specresearch.tracking import browse_line, tracked_run
from specresearch.types import GenerationOutput

log = logging.getLogger(__name__)

TASKS = {  # task -> the module that scores it
    "humaneval_offline": "specresearch.evaluation.humaneval",
    "stdlib_doctest": "specresearch.evaluation.stdlib_doctest",
}
UNSAFE = {"humaneval_offline", "stdlib_doctest"}  # tasks that execute model-written code


@dataclass
class Side:
    """One evaluation (baseline or method): lm-eval's scores, its per-problem samples, the generations."""

    scores: dict[str, float] = field(default_factory=dict)  # metric -> value, lm-eval's names ("pass@1", "pass@1_stderr")
    samples: list[dict] = field(default_factory=list)  # lm-eval's logged samples, in doc order
    outputs: dict[int, GenerationOutput] = field(default_factory=dict)  # doc_id -> its generation
    details: dict[str, dict] = field(default_factory=dict)  # doc key -> the sandbox's {"status", "detail"}
    cached: str | None = None  # the cache file it was read from, if it was not measured in this run

    @property
    def stats(self) -> SpecStats:
        total = SpecStats()
        for output in self.outputs.values():
            total = total.merge(output.stats)
        return total

    def to_json(self) -> str:
        outputs = {doc: {"tokens": o.tokens, "text": o.text, "stop_reason": o.stop_reason, "stats": asdict(o.stats)}
                   for doc, o in self.outputs.items()}
        data = {"scores": self.scores, "samples": self.samples, "outputs": outputs, "details": self.details}
        return json.dumps(data, default=lambda v: v.item() if hasattr(v, "item") else str(v))

    @classmethod
    def from_json(cls, text: str, path: str) -> Side:
        data = json.loads(text)
        outputs = {int(doc): GenerationOutput(o["tokens"], o["text"], SpecStats(**o["stats"]), o["stop_reason"])
                   for doc, o in data["outputs"].items()}
        return cls(data["scores"], data["samples"], outputs, data["details"], cached=path)


def run_eval(cfg: DictConfig) -> dict[str, float]:
    """Score the baseline and the method on `cfg.eval.task`; log scores, deltas and samples.

    Returns:
        The summary metrics (also logged to the tracker and written to Hydra's output folder).
    """
    from specresearch.evaluation.lm import SpecResearchLM

    ec = cfg.eval
    chosen = check_eval(ec)
    first = chosen[0] if chosen else 0  # problem i is decoded with stream_seed(cfg.seed, i), whatever slice holds it
    batch = int(cfg.get("batch_size", 1))  # prompts decoded together (checked >= 1 with the run's options)
    tracker = build(cfg.tracker)
    tracker.check_reachable()  # where results go, before any model loads
    if ec.reuse_baseline:
        cache_root(cfg.model.get("cache_dir"))  # where the baseline's scores are kept: before any model loads
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # our tasks need no download: make sure nothing tries one
        os.environ.setdefault(var, "1")
    layers: dict[str, bool] = {}
    if ec.task in UNSAFE:
        os.environ["SPECRESEARCH_ALLOW_CODE_EXECUTION"] = "1"  # the user opted in: check_eval() made sure
        from specresearch.evaluation import sandbox

        sandbox.configure(sandbox.Limits(timeout=ec.sandbox.timeout, memory_mb=ec.sandbox.memory_mb),
                          require_isolation=ec.sandbox.require_isolation)
        layers = sandbox.check_isolation()  # refuse a weak sandbox before the model loads
    method = build_engine(cfg)
    baseline = build_engine(cfg, baseline=True, target=method.kv.lm) if ec.baseline else None
    label = f"eval {ec.task}: {method.label}"
    sides: dict[str, Side] = {}
    layer_metrics = {f"sandbox_{layer}": float(on) for layer, on in layers.items()}  # the isolation the code ran under
    with tracked_run(tracker, cfg, label, lambda: _report(sides, layer_metrics, batch), tags=machine_tags(method.kv.lm),
                     params=claim_params(method)) as run:
        if baseline is not None:
            cache = baseline_cache(cfg, method.kv.lm) if ec.reuse_baseline else None
            if cache is not None and cache.is_file():
                sides["baseline"] = Side.from_json(cache.read_text(), str(cache))
                log.info(f"baseline: reusing the scores and generations of an identical earlier run ({cache})")
            else:
                lm = SpecResearchLM(engine=baseline, seed=cfg.seed, first_index=first, batch_size=batch)
                sides["baseline"] = evaluate(lm, ec, chosen)
                if cache is not None:
                    cache.parent.mkdir(parents=True, exist_ok=True)
                    cache.write_text(sides["baseline"].to_json())
        lm = SpecResearchLM(engine=method, seed=cfg.seed, first_index=first, batch_size=batch)
        sides["method"] = evaluate(lm, ec, chosen)
        run.tag(solved_tags(sides))
    record = summarise(sides, batch)
    log.info(format_summary(cfg, label, record))
    browse_line(tracker)
    return {**flatten(record), **layer_metrics}


def check_eval(ec: DictConfig) -> list[int] | None:
    """Refuse what cannot run, before anything is loaded. Returns the problems `eval.offset` selects
    (`problems`), None without one."""
    if ec.task not in TASKS:
        raise SpecResearchError(f"unknown eval.task '{ec.task}': valid are {', '.join(TASKS)}")
    if ec.limit is not None and int(ec.limit) < 1:
        raise SpecResearchError(f"eval.limit must be >= 1 (or null: all), got {ec.limit}")
    chosen = problems(ec)
    if ec.task in UNSAFE:
        from specresearch.evaluation.sandbox import check_allowed

        check_allowed(confirmed=True)  # only SPECRESEARCH_ALLOW_CODE_EXECUTION=0 (or a bad value) refuses here
    if ec.task in UNSAFE and not (ec.allow_code_execution or os.environ.get("SPECRESEARCH_ALLOW_CODE_EXECUTION") == "1"):
        raise SpecResearchError(
            f"eval.task={ec.task} executes model-written code (in a sandbox: a separate process with time and memory "
            "limits, no network, writes only in a temporary folder; see README, 'Quality'). Opt in with "
            "eval.allow_code_execution=true (or SPECRESEARCH_ALLOW_CODE_EXECUTION=1)"
        )
    return chosen


def problems(ec: DictConfig) -> list[int] | None:
    """The indices of the problems `eval.offset` and `eval.limit` select (offset .. offset + limit − 1, or
    to the task's end), checked against the task's size; None at offset 0 (lm-eval's `limit`: the first N)."""
    offset = ec.get("offset", 0)
    if not isinstance(offset, int) or offset < 0:
        raise SpecResearchError(f"eval.offset must be an integer >= 0 (the first problem scored), got {offset!r}")
    if offset == 0:
        return None
    from lm_eval.tasks import TaskManager

    size = len(TaskManager(include_path=str(TASKS_DIR), include_defaults=False).load([ec.task])["tasks"][ec.task].eval_docs)
    stop = size if ec.limit is None else offset + int(ec.limit)
    if stop > size or offset >= size:
        raise SpecResearchError(f"eval.offset={offset} eval.limit={ec.limit}: {ec.task} has {size} problems (0-{size - 1}); "
                                f"the last one would be {max(stop, offset + 1) - 1}")
    return list(range(offset, stop))


def evaluate(lm, ec: DictConfig, chosen: list[int] | None = None) -> Side:
    """Run lm-eval's task on one model (the problems `chosen`, else lm-eval's `limit` first ones);
    collect scores, samples, sandbox outcomes and speed."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from specresearch.evaluation.sandbox import OUTCOMES

    OUTCOMES.clear()
    results = simple_evaluate(
        model=lm, tasks=[ec.task], task_manager=TaskManager(include_path=str(TASKS_DIR), include_defaults=False),
        limit=None if chosen else ec.limit, samples={ec.task: chosen} if chosen else None,
        log_samples=True, confirm_run_unsafe_code=True, bootstrap_iters=0,
    )
    scores = {key.split(",")[0]: float(v) for key, v in results["results"][ec.task].items()
              if "," in key and isinstance(v, (int, float))}  # "metric,filter" keys; stderr "N/A" dropped
    return Side(scores=scores, samples=sorted(results["samples"][ec.task], key=lambda s: s["doc_id"]),
                outputs={request.doc_id: output for request, output in lm.outputs},
                details={key: {"status": o.status, "detail": o.detail} for key, o in OUTCOMES.items()})


def baseline_cache(cfg: DictConfig, target) -> Path:
    """Where the baseline's evaluation is kept for reuse: keyed by everything it depends on (the
    target and its resolved dtype, sampling, seed, task and its scorer, limit, library versions),
    never by the method, so a sweep over methods scores the target alone once."""
    import importlib

    import torch
    import transformers

    from specresearch import __version__
    from specresearch.models import default_cache_dir

    task = cfg.eval.task
    scorer = importlib.import_module(TASKS[task])
    key = json.dumps({
        "model": OmegaConf.to_container(cfg.model, resolve=True), "dtype": str(target.dtype), "device": str(target.device),
        "sampling": OmegaConf.to_container(cfg.sampling, resolve=True), "seed": cfg.seed, "task": task, "limit": cfg.eval.limit,
        **({"offset": cfg.eval.offset} if cfg.eval.get("offset") else {}),  # absent at 0: earlier runs' keys stay valid
        # sampled baselines of the old seeds (seed + i) are not reused
        **({"seeds": "stream_seed"} if float(cfg.sampling.temperature) > 0 else {}),
        # rows decoded together: the same texts in exact arithmetic, not in bf16 (absent at 1: earlier keys stay valid)
        **({"batch_size": int(cfg.batch_size)} if int(cfg.get("batch_size", 1)) != 1 else {}),
        "task_file": (TASKS_DIR / f"{task}.yaml").read_text(), "scorer": Path(scorer.__file__).read_text(),
        "sandbox": OmegaConf.to_container(cfg.eval.sandbox, resolve=True),
        "versions": [__version__, torch.__version__, transformers.__version__],
    }, sort_keys=True)
    root = Path(cfg.model.cache_dir).expanduser() if cfg.model.cache_dir else default_cache_dir()
    return root / "eval-baselines" / f"{task}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def summarise(sides: dict[str, Side], batch: int = 1) -> EvalRecord:
    """Scores of each side, the method's delta, the paired test, and the decoding speed (only of one
    prompt at a time: a batch's rows share their times, so their tokens per second are not a speed)."""
    record = EvalRecord({name: EvalSide(dict(side.scores), side.stats) for name, side in sides.items()},
                        problems=len(next(reversed(sides.values())).samples) if sides else None)  # the side evaluated last
    if len(sides) == 2 and sides["method"].samples:
        base, meth = sides["baseline"], sides["method"]
        record.delta = {metric: value - base.scores[metric] for metric, value in meth.scores.items()
                        if not metric.endswith("_stderr") and metric in base.scores}
        metric = _primary(meth)
        pairs = [(b[metric], m[metric]) for b, m in zip(base.samples, meth.samples)]
        better = sum(m > b for b, m in pairs)  # problems only the method solves
        worse = sum(b > m for b, m in pairs)  # problems only the baseline solves
        record.method_only, record.baseline_only = better, worse
        record.mcnemar_p = binomtest(better, better + worse).pvalue if better + worse else 1.0
        same = [b["filtered_resps"] == m["filtered_resps"] for b, m in zip(base.samples, meth.samples)]
        record.identity_rate = sum(same) / len(same) if same else math.nan
        base_speed, meth_speed = base.stats.tokens_per_s, meth.stats.tokens_per_s
        if base.cached is None and base_speed and batch == 1:  # speed is only compared within one run, row by row
            record.speedup = meth_speed / base_speed
        record.baseline_reused = float(base.cached is not None)
    return record


def solved_tags(sides: dict[str, Side]) -> dict[str, str]:
    """Each side's per-problem outcomes as one tag (SOLVED_TAG + side): the first problem's index, then a "1" for each
    problem its primary score solved (1) and a "0" for each it failed (0), in problem order ("156:0110"). What the
    analysis pairs seeds and settings by, problem by problem; none for a side whose problems are not consecutive or
    whose scores are not 0 or 1."""
    tags = {}
    for name, side in sides.items():
        if not side.samples:
            continue
        metric = _primary(side)
        docs, scores = [s["doc_id"] for s in side.samples], [s.get(metric) for s in side.samples]
        if docs == list(range(docs[0], docs[0] + len(docs))) and all(v in (0, 1) for v in scores):
            tags[SOLVED_TAG + name] = f"{docs[0]}:" + "".join(str(int(v)) for v in scores)
    return tags


def _primary(side: Side) -> str:
    return next(metric for metric in side.scores if not metric.endswith("_stderr"))


def sample_records(sides: dict[str, Side]) -> list[dict]:
    """One record per problem: each side's completion, score, sandbox verdict and decoding counters."""
    records: dict[int, dict] = {}
    for name, side in sides.items():
        for sample in side.samples:
            doc = sample["doc"]
            key = doc.get("task_id", sample["doc_id"])
            record = records.setdefault(sample["doc_id"], {"doc_id": sample["doc_id"], "id": key})
            output = side.outputs.get(sample["doc_id"])
            outcome = side.details.get(key, {})
            record[name] = {
                "completion": sample["filtered_resps"][0] if sample["filtered_resps"] else None,
                **{metric: sample[metric] for metric in side.scores if metric in sample},
                "status": outcome.get("status"),
                "detail": outcome.get("detail"),
                **({"new_tokens": len(output.tokens), "stop_reason": output.stop_reason, "tau": output.stats.tau,
                    "tokens_per_s": output.stats.tokens_per_s} if output is not None else {}),
            }
    return [records[k] for k in sorted(records)]


def _report(sides: dict[str, Side], extra: dict[str, float], batch: int = 1) -> tuple[dict[str, float], dict[str, str]]:
    """What was measured so far (also of a failed run): the summary and per-problem records."""
    records = "".join(json_text(r, indent=None, default=str) + "\n" for r in sample_records(sides))
    summary = flatten(summarise(sides, batch)) if sides else {}  # nothing evaluated yet: nothing to record
    return {**summary, **extra}, {"samples.jsonl": records}


def format_summary(cfg: DictConfig, label: str, r: EvalRecord) -> str:
    """The table printed at the end of an evaluation."""
    scores = list(r.delta) or [k for side in r.sides.values() for k in side.scores if not k.endswith("_stderr")]
    lines = ["", f"specresearch  {label}  target={cfg.model.name}  T={cfg.sampling.temperature}  "
                 f"problems={r.problems if r.problems is not None else '?'}",
             f"{'':16}{'baseline':>10}{'method':>10}{'delta':>10}"]
    for name in dict.fromkeys(scores):
        lines.append(f"{name:16}{r.score('baseline', name):>10.3f}{r.score('method', name):>10.3f}{r.delta_of(name):>+10.3f}")
    if r.mcnemar_p is not None:
        lines.append(f"paired: solved only by the method {r.method_only:.0f}, only by the baseline {r.baseline_only:.0f}; "
                     f"exact McNemar p = {r.mcnemar_p:.3g}; identical completions {r.identity_rate:.0%}")
    method = r.sides.get("method")
    if r.speedup is None and method is not None and int(cfg.get("batch_size", 1)) != 1:
        lines.append(f"decoding: method tau {method.stats.tau:.2f}; {cfg.batch_size} prompts decoded together, so no speed "
                     "(the rows share their times): the speed experiment measures batches side by side")
    elif r.speedup is None and method is not None:
        lines.append(f"decoding: method {method.stats.tokens_per_s:.2f} tok/s, tau {method.stats.tau:.2f} (the baseline's generations "
                     "were reused, so no speedup: the speed experiment measures them side by side)")
    if r.speedup is not None:
        lines.append(f"decoding on these generations: baseline {r.sides['baseline'].stats.tokens_per_s:.2f} tok/s, method "
                     f"{method.stats.tokens_per_s:.2f} tok/s ({r.speedup:.2f}x, tau {method.stats.tau:.2f}); "
                     "not interleaved prompt by prompt: the speed experiment is the reference for speedups")
    return "\n".join(lines)
