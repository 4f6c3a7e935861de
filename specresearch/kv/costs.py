"""The cost curve: the machine's measured seconds of a forward of n tokens, which tree sizing
(shape=auto) weighs acceptance against; measured once per machine and model and kept in the model cache."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from specresearch.kv.cached import CachedLM
from specresearch.models import LoadedModel, default_cache_dir, machine_tags
from specresearch.models.kernels import routes

log = logging.getLogger(__name__)

# tokens per verification forward measured for a tree's sizing (shape=auto); 16 and 17 both, as kernels step there (on
# AMX 17 to 32 bf16 rows are padded to 33: v(16) 1.23 against v(17) 1.5, which 9 and 17 alone would put at 1.45)
COST_SIZES = (1, 2, 3, 5, 9, 16, 17, 33, 65, 129)
# a batch's verification is measured at 2, 4, 8 rows and the batch's own (between them interpolated), each up to this
# many tokens a forward (beyond, in proportion to its tokens): a run of 110 rows measures a few forwards, not minutes
BATCH_ROWS, BATCH_TOKENS = (2, 4, 8), 256
KEPT_REPEATS = 5  # timings of each size in a kept cost curve (measured once per machine and model)
KEPT_MEASURE = "interleaved"  # how kept curves are measured (part of their key: a file measured otherwise is measured again)


Shape = int | tuple[int, int]  # a forward's shape: n tokens to one row, or (rows, n): n tokens to each of `rows` rows


@torch.inference_mode()
def forward_seconds(lm: LoadedModel, ids: list[int], sizes: Sequence[Shape], repeats: int = 3) -> list[float]:
    """The model's measured seconds for a forward of n tokens after `ids`, for each n in `sizes` (the
    fastest of `repeats`: noise only adds); a size (rows, n) feeds n tokens to each of `rows` rows that
    all hold `ids` (a batch's verification: the batch engine pads every row to the widest).

    Each size is run once untimed first (a kernel's first call may lay out its weights or warm its caches),
    then the sizes are timed interleaved, one round of all of them per repeat: a machine whose speed drifts
    during the measurement (another process, frequency) moves every size alike, not the ratios v(n).

    Args:
        lm: the model, as it will run (device, dtype, kernels).
        ids: [T] the context the forwards follow (T >= 2).
        sizes: numbers of tokens to feed (>= 1), or (rows, tokens) pairs.
        repeats: timings of each size.
    """
    shapes = [_shape(size) for size in sizes]
    models = {}  # rows -> a CachedLM holding that many rows of the context
    for rows in sorted({rows for rows, _ in shapes}):
        models[rows] = CachedLM(lm)
        models[rows].reset()
        models[rows].prefill_rows([torch.tensor(ids[:-1])] * rows)
    fed = {(rows, n): [torch.tensor(ids[-1:] * n)] * rows for rows, n in sorted(set(shapes))}
    for (rows, _), chains in fed.items():  # untimed: first calls
        timed_forwards(models[rows], chains, 1)
    rounds = [{shape: timed_forwards(models[shape[0]], chains, 1) for shape, chains in fed.items()} for _ in range(repeats)]
    return [min(r[shape] for r in rounds) for shape in shapes]


def _shape(size: Shape) -> tuple[int, int]:
    """(rows, tokens per row) of a size: n is (1, n)."""
    return (1, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _key(size: Shape) -> str:
    """A size's key in a kept cost file: "n" for one row, "RxN" for R rows of n tokens."""
    rows, n = _shape(size)
    return str(n) if rows == 1 else f"{rows}x{n}"


def timed_forwards(model: CachedLM, fed: list[torch.Tensor], repeats: int) -> float:
    """The fastest of `repeats` forwards of row b's chain `fed[b]` ([n_b] tokens) on `model`'s rows, each
    rolled back after it (noise only adds)."""
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    kept = list(model.lengths)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model.forward_rows(fed, [None] * len(fed))
        sync()
        runs.append(time.perf_counter() - t0)
        model.truncate_rows(kept)
    return min(runs)


def cost_curve(lm: LoadedModel, ids: list[int], sizes: list[int], repeats: int = 3) -> list[float]:
    """The model's measured cost of a forward of n tokens after `ids`, over one token's, for each n in
    `sizes` (see `forward_seconds`): the v(n) that speculative decoding's predictions (Leviathan's k,
    a tree's size) are made with."""
    one, *times = forward_seconds(lm, ids, [1, *sizes], repeats)
    return [t / one for t in times]


def kept_cost_curve(lm: LoadedModel, sizes: Sequence[Shape]) -> tuple[list[float], float]:
    """`cost_curve` at `sizes` (after 129 tokens; a size (rows, n) is a batch's forward of n tokens a row, over one
    row's one token, see `forward_seconds`) and the seconds of one token's forward, measured once
    per machine and model and kept in the model cache: <cache>/costs/<model>/<key>.json, the key
    hashing what the costs depend on (models.machine_tags: processor or GPU, threads, torch, dtype,
    device; the model's config, KV cache kind, compile and kernels with their few-row routes), not its weights. Sizes not kept
    yet are measured and added; delete the file to measure again (e.g. after a driver update). A
    cache that cannot be written only costs the measurement again."""
    setup = {**machine_tags(lm), "config": lm.model.config.to_json_string(use_diff=False), "cache": lm.cache,
             "compile": lm.compile, "linears": sorted({type(m).__name__ for m in lm.model.modules() if isinstance(m, torch.nn.Linear)}),
             "routes": routes(), "measure": KEPT_MEASURE}
    key = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:16]
    path = Path(lm.cache_dir or default_cache_dir()) / "costs" / lm.name.replace("/", "--") / f"{key}.json"
    kept, v = _read_costs(path)
    missing = list(dict.fromkeys(_key(n) for n in sizes if _key(n) not in v))
    if missing or "one_token_s" not in kept:
        shapes = [_size(key) for key in missing]
        one, *seconds = forward_seconds(lm, list(range(2, 131)), [1, *shapes], KEPT_REPEATS)  # any 129 tokens: costs, not content
        v.update({key: t / one for key, t in zip(missing, seconds)})
        kept = {"model": lm.name, "machine": {k: setup[k] for k in setup if k != "config"}, "one_token_s": kept.get("one_token_s", one),
                "v": {key: v[key] for key in sorted(v, key=lambda key: _shape(_size(key)))}, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:  # whole or not at all: a run beside this one reads either file, never half of one
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(kept, indent=1))
            tmp.replace(path)  # over a damaged file, a FIFO or a link too; not over a folder
        except OSError:
            tmp.unlink(missing_ok=True)
    return [v[_key(n)] for n in sizes], float(kept["one_token_s"])


def _size(key: str) -> Shape:
    """A kept cost file's key as a size: "n" or "RxN" (ValueError if it is neither)."""
    parts = [int(part) for part in key.split("x")]
    if len(parts) > 2 or min(parts) < 1:
        raise ValueError(f"a size of {key!r}")
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def _read_costs(path: Path) -> tuple[dict, dict[str, float]]:
    """A kept cost file (kept_cost_curve) and its v by size, or ({}, {}) when there is none; a file that cannot
    be read (not a regular file, e.g. a FIFO or a folder; unreadable; over 1 MiB), is not JSON (random bytes,
    nesting too deep to parse) or is not a mapping with a positive finite `one_token_s` and positive finite
    numbers as v (damaged, edited, NaN) is set aside with one line saying so, to be measured again and replaced."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return {}, {}
    except OSError as err:  # a loop of links, a folder we may not enter
        return _unusable(path, err)
    try:
        if not stat.S_ISREG(info.st_mode):  # a FIFO would block the read for ever
            raise ValueError("not a regular file")
        if info.st_size > 2**20:  # a few hundred bytes when whole: do not read a huge file into memory
            raise ValueError(f"{info.st_size:,} bytes")
        kept = json.loads(path.read_bytes())
        v = {_key(_size(n)): x for n, x in kept["v"].items()}
        one = kept["one_token_s"]
        if not all(_positive_number(x) for x in [one, *v.values()]):
            raise ValueError("one_token_s and v must be positive finite numbers")
        return kept, {n: float(x) for n, x in v.items()}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as err:  # bytes: UnicodeDecodeError
        return _unusable(path, err)


def _positive_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _unusable(path: Path, err: BaseException) -> tuple[dict, dict[str, float]]:
    log.warning(f"warning: the kept cost file {path} is not usable ({type(err).__name__}: {str(err)[:200]}): "
                "measuring again and replacing it")
    return {}, {}


def interpolated(sizes: Sequence[int], values: Sequence[float], proportional: bool = False) -> Callable[[int], float]:
    """A function of m from its values at `sizes` (increasing): linear in between, constant beyond (`proportional`:
    beyond the last size, in proportion to m, as a forward of many tokens costs)."""
    def at(m: int) -> float:
        for (a, va), (b, vb) in zip(zip(sizes, values), zip(sizes[1:], values[1:])):
            if a <= m <= b:
                return va + (vb - va) * (m - a) / (b - a)
        if m < sizes[0]:
            return values[0]
        return values[-1] * m / sizes[-1] if proportional else values[-1]

    return at


def rows_interpolated(curves: Mapping[int, Callable[[int], float]]) -> Callable[[int, int], float]:
    """A function of (rows, m) from curves of m measured at some numbers of rows: `interpolated` in rows between
    the nearest two, constant beyond."""
    counts = sorted(curves)
    return lambda rows, m: interpolated(counts, [curves[r](m) for r in counts])(rows)
