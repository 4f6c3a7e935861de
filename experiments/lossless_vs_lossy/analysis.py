"""lossless_vs_lossy: drafter x verifier setting x T -> speed, τ, exact distortion (the frontier), the battery's
verdict where it ran, pass@1 where it ran; the published trade-offs beside."""

from __future__ import annotations

import json
import math
from pathlib import Path

from matplotlib.figure import Figure
from specresearch.analysis import intervals, published, seeds
from specresearch.analysis.format import DASH, Col, Table, missing, num, num3, pvalue, signed, speed, temperature, text
from specresearch.analysis.report import Report, caption, latest_by, lossless, verdict
from specresearch.analysis.runs import Run, Study

from specresearch import figures
from specresearch.records import BASELINE, METHOD

SCORE = "pass@1"
RULE = {"typical": (("epsilon", "ε"), ("delta", "δ")), "margin": (("margin", "margin"), ("ratio", "ratio")), "topk": (("k", "k"),)}
MARKERS = {"independent": "o", "medusa": "s"}
COLORS = {"rejection": "black", "typical": "C0", "margin": "C1", "topk": "C2", "greedy": "grey"}


def rule(run: Run) -> str:
    """The verifier's own setting, e.g. "ε 0.09, δ 0.3" ("–" for rejection)."""
    parts = [f"{label} {run.param(f'verifier.{key}')}" for key, label in RULE.get(run.verifier, ()) if run.param(f"verifier.{key}")]
    return ", ".join(parts) or DASH


def numerics(run: Run) -> str:
    """The target's numerics: its dtype as it ran, and its kernels where not the default ("bf16, invariant kernels")."""
    used = run.param("model.dtype_used") or "?"
    kernels = run.param("model.kernels")
    return {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(used, used) + (
        f", {kernels} kernels" if kernels not in (None, "", "auto") else "")


def _cell(run: Run) -> tuple[str, str, str, float, str]:
    """(drafter, verifier, its setting, T, the target's numerics): one cell of the frontier."""
    return (run.method, run.verifier, rule(run), run.temperature, numerics(run))


def _key(record: dict) -> tuple[str, str, str, float, str]:
    """A table record's cell, as _cell names a run's."""
    return (record["drafter"], record["verifier"], record["setting"], record["T"], record["target"])


def _order(key: tuple[str, str, str, float, str]) -> tuple:
    drafter, verifier, setting, t, target = key
    return (drafter, t, list(COLORS).index(verifier) if verifier in COLORS else 9, setting, target)


def report(study: Study) -> Report:
    """Table `frontier`: every cell's speedup, τ, exact distortion (mean TV with its interval over prompts, 90% quantile,
    KL, the first draft token's kept probability); table `battery`: the cells the equivalence battery ran on; table
    `quality`: pass@1 of method and target with McNemar's p; the published trade-offs; figure: speedup against
    distortion (and against pass@1 where measured), lossless points on the zero line, the frontier drawn."""
    report = Report(study.name)
    cells = latest_by([run for run in study.speed if _frontier(run)], _cell, report.notes)
    tagged = [run for run in study.quality if seeds.solved(run.tags, METHOD) is not None]  # scored over seeds
    quality = latest_by([run for run in study.quality if run not in tagged], _cell, report.notes)  # the one-seed pass
    records = []
    for key in sorted(cells, key=_order):
        run = cells[key]
        r, d = run.speed_record, run.speed_record.distortion
        q = quality.get(key)
        records.append(dict(
            drafter=key[0], verifier=key[1], setting=key[2], T=key[3], target=key[4], lossless=lossless(run), run=run.id,
            speedup=r.speedup, tau=r.method.tau, prompts=r.prompts,
            tv=(d.get("tv_mean", math.nan), d.get("tv_mean_ci_low", math.nan), d.get("tv_mean_ci_high", math.nan)),
            tv90=d.get("tv_q90", math.nan), kl=d.get("kl_mean", math.nan), kept=d.get("kept_mean", math.nan),
            positions=d.get("positions", math.nan), verdict=verdict(run) if r.equivalence else None,
            eq=r.equivalence, quality=q.eval_record if q else None,
        ))
    report.tables.append(Table(
        "frontier", "Lossless vs lossy: speed and exact distortion per cell",
        caption("One row per cell (drafter, verifier setting, T, the target's numerics: its dtype as run, and its kernels "
                "where not the default): speedup over the baseline (tokens/s, prompts interleaved) and "
                "τ from the speed comparison; exact distortion of the first token each verification step emits, along the "
                "target's own continuations (stats.distortion): mean TV to the target's p with a 95% bootstrap interval over "
                "prompts, its 90% quantile over positions, the mean KL(law ‖ p) in nats, and the probability that the step's "
                "first token is the draft's. Rows \"the target's numerics\" (no run: benchmarks/numerics_distortion.py's newest "
                "page) put on the same axis the TV by which the target's own kernels move each step's law: the p a "
                "verification forward reads against the p after one query a forward, along the same text.",
                list(cells.values()), study),
        [Col("drafter", "drafter", text, "l"), Col("verifier", lambda r: r["verifier"] + (" (lossless)" if r["lossless"] else ""),
                                                   text, "l"),
         Col("setting", "setting", text, "l"), Col("T", "T", temperature), Col("target", "target", text, "l"),
         Col("speedup", "speedup", speed), Col("τ", "tau", num),
         Col("TV mean [95% CI]", "tv", _tv_cell), Col("TV 90%", "tv90", _small), Col("KL (nats)", "kl", _small),
         Col("first token drafted", "kept", num3), Col("positions", "positions", lambda x: DASH if missing(x) else f"{x:.0f}")],
        records + numerics_records({run.param("model.name") for run in cells.values()})))
    tested = [r for r in records if r["eq"]]
    if tested:
        report.tables.append(Table(
            "battery", "The equivalence battery on the real pair",
            caption("Cells where the battery ran (stats.samples): sequences per side, its Holm verdict, the smallest Holm "
                    "p, the plug-in mean position TV beside two samples of one law (its noise floor), the smallest position "
                    "TV it detects with 80% power at this N, and the method's draws per second."
                    + (" Drafter none is the control: plain decoding through the engine's batched steps against the same "
                       "target side, so a verdict there is the target's own numerics, not a rule."
                       if any(r["drafter"] == "none" for r in tested) else ""),
                    [cells[_key(r)] for r in tested], study),
            [Col("drafter", "drafter", text, "l"), Col("verifier", "verifier", text, "l"), Col("setting", "setting", text, "l"),
             Col("T", "T", temperature), Col("target", "target", text, "l"),
             Col("N per side", lambda r: r["eq"].get("samples_method", math.nan),
                                              lambda x: DASH if missing(x) else f"{x:,.0f}"),
             Col("verdict", "verdict", text, "l"), Col("smallest Holm p", lambda r: r["eq"].get("min_holm_p", math.nan), pvalue),
             Col("position TV (noise floor)", lambda r: (r["eq"].get("tv_position", math.nan), r["eq"].get("tv_position_null", math.nan)),
                 lambda v: DASH if missing(v[0]) else f"{v[0]:.3f} ({num3(v[1])})"),
             Col("detectable TV", lambda r: r["eq"].get("power_min_tv_position", math.nan), num3),
             Col("exact TV mean", lambda r: r["tv"][0], _small),
             Col("method samples/s", lambda r: r["eq"].get("samples_per_s_method", math.nan), num)],
            tested))
    scored = [r for r in records if r["quality"] is not None]
    if scored:
        report.tables.append(Table(
            "quality", "pass@1 per setting (HumanEval, by execution)",
            caption("Quality runs (eval=humaneval) joined with the speed cells: pass@1 of the method and of the target alone at "
                    "the same T with their 95% Wilson intervals, the difference with its 95% interval (paired by problem: from the "
                    "problems only one side solves) and McNemar's exact p.",
                    [quality[_key(r)] for r in scored], study),
            [Col("drafter", "drafter", text, "l"), Col("verifier", "verifier", text, "l"), Col("setting", "setting", text, "l"),
             Col("T", "T", temperature), Col("problems", lambda r: r["quality"].problems, lambda x: DASH if missing(x) else f"{x:.0f}"),
             Col("method pass@1 [95% CI]", lambda r: _score(r, METHOD), _with_ci),
             Col("target pass@1 [95% CI]", lambda r: _score(r, BASELINE), _with_ci),
             Col("Δ [95% CI] (McNemar p)", lambda r: r["quality"], _delta_cell),
             Col("speedup", "speedup", speed), Col("TV mean", lambda r: r["tv"][0], _small)],
            scored))
    timed = speed_over_prompts([run for run in study.speed if intervals.per_prompt(run.tags) is not None and not _frontier(run)],
                               {_key(r): r["tv"][0] for r in records})
    if timed:
        report.tables.append(Table(
            "speed_intervals", "Speed with intervals over prompts, and what each rule buys over rejection sampling",
            caption("Speed cells measured for their intervals (stats.distortion=0, each prompt's tokens and seconds kept): per "
                    "prompt set and cell, the speedup over the baseline (pooled over prompts, interleaved prompt by prompt) and "
                    "τ, each with its 95% BCa bootstrap interval over prompts; the difference of the speedup to rejection "
                    "sampling's with the same drafter, T and prompts (same seeds), paired by prompt, with its 95% BCa interval; "
                    "and the cell's exact distortion from the frontier table (its prompts: HumanEval 156-159).",
                    [r["run"] for r in timed], study),
            [Col("prompts", "dataset", text, "l"), Col("drafter", "drafter", text, "l"), Col("verifier", "verifier", text, "l"),
             Col("setting", "setting", text, "l"), Col("T", "T", temperature), Col("n", "n", lambda x: f"{x:.0f}"),
             Col("speedup [95% CI]", "speedup", _interval_cell), Col("τ [95% CI]", "tau", _interval_cell),
             Col("Δ speedup vs rejection [95% CI]", "vs_rejection", lambda v: _interval_cell(v, signed)),
             Col("TV mean", "tv", _small)],
            timed))
        report.figures["lossless_vs_lossy_speed_intervals.png"] = speed_figure(timed)
    over_seeds = quality_over_seeds(tagged)
    if over_seeds:
        report.tables.append(Table(
            "quality_seeds", "pass@1 over seeds, paired by problem",
            caption("Quality runs at several seeds (`seed=1,2,...`, each its own streams; lossless_vs_lossy/quality=NAME): per "
                    "task and setting, pass@1 as the mean over problems of each problem's pass rate over the seeds, with a 95% "
                    "t interval over problems; the difference to the target alone at the same T and seeds (each run's own "
                    "baseline side), paired by problem, with its 95% interval and the paired t test's p; the smallest "
                    "difference this comparison detects with 80% power at the 5% level; and the difference to the target "
                    "alone at the next lower T measured (the reference a rule that sharpens the law is read against). The "
                    "target alone's rows are its baseline sides (and drafter none's runs).",
                    [run for group in over_seeds for run in group["runs"]], study),
            [Col("task", "task", text, "l"), Col("drafter", "drafter", text, "l"), Col("verifier", "verifier", text, "l"),
             Col("setting", "setting", text, "l"), Col("T", "T", temperature),
             Col("seeds", "seeds", text), Col("problems", "problems", lambda x: f"{x:.0f}"),
             Col("pass@1 [95% CI]", "rate", _rate_cell), Col("Δ vs the target [95% CI] (p)", "vs_target", _paired_cell),
             Col("detectable Δ", lambda r: r["vs_target"].detectable if r["vs_target"] else math.nan, num3),
             Col("Δ vs the target at a lower T [95% CI] (p)", "vs_lower", _lower_cell)],
            over_seeds))
    sharper = temperature_table({run.param("model.name") for run in cells.values()})
    if sharper:
        report.tables.append(sharper)
    rows = verdict_rows(records, timed, over_seeds)
    if rows:
        report.tables.append(Table(
            "verdicts", "Per setting: what it buys, what it costs, how sure we are",
            caption("One row per drafter and verifier setting measured with intervals: the speedup on held-out code and chat "
                    "prompts, each with its difference to rejection sampling's on the same prompts (95% BCa intervals over "
                    "prompts: speed_intervals), τ on code; each step's exact distortion (mean TV of its first token to p: "
                    "frontier) and the battery's verdict with its surprisal deficit (nats/token) where it ran at this T (and where it "
                    "ran with the target's other numerics: invariant kernels, float32); pass@1's "
                    "difference to the target alone at the same T and seeds per task (95% t interval over problems: "
                    "quality_seeds).", [r["run"] for r in timed] + [run for g in over_seeds for run in g["runs"]], study),
            [Col("drafter", "drafter", text, "l"), Col("verifier", lambda r: r["verifier"] + (" (lossless)" if r["lossless"] else ""),
                                                       text, "l"),
             Col("setting", "setting", text, "l"), Col("T", "T", temperature),
             Col("speedup, code [95% CI]", "code", _interval_cell),
             Col("Δ vs rejection, code [95% CI]", "code_vs_rejection", lambda v: _interval_cell(v, signed)),
             Col("speedup, chat [95% CI]", "chat", _interval_cell),
             Col("Δ vs rejection, chat [95% CI]", "chat_vs_rejection", lambda v: _interval_cell(v, signed)),
             Col("τ, code", "tau", num), Col("exact TV", "tv", _small), Col("battery (surprisal deficit)", "battery", text, "l"),
             Col("Δ pass@1, HumanEval [95% CI]", "humaneval_offline", _paired_cell),
             Col("Δ pass@1, stdlib doctests [95% CI]", "stdlib_doctest", _paired_cell)],
            rows))
    for name, table in published.load(study.name).items():
        report.tables.append(published.published_table(f"published_{name}", _TITLES.get(name, name), table.rows, what=table.about))
    report.figures["lossless_vs_lossy_frontier.png"] = frontier(records)
    return report


NUMERICS = Path(__file__).resolve().parents[2] / "docs" / "results" / "data"  # *-numerics-distortion.json: numerics_distortion.py


def _newest_page(kind: str, models: set[str]) -> dict | None:
    """The newest committed page DATE-`kind`.json (a benchmark script's) whose target is one of `models`; None: none."""
    pages = [json.loads(p.read_text()) for p in sorted(NUMERICS.glob(f"*-{kind}.json"))]
    pages = [p for p in pages if p["data"].get("model") in models]
    return pages[-1] if pages else None


def numerics_records(models: set[str]) -> list[dict]:
    """The frontier's numerics rows: per drafter arm and T, the TV by which the target's own kernels move each step's law
    (the p a verification forward reads against one query a forward), from the newest committed page of
    benchmarks/numerics_distortion.py whose target is one of the study's `models`; none where there is none."""
    page = _newest_page("numerics-distortion", models)
    if page is None:
        return []
    kernels = page["title"].rsplit(", ", 2)[-2:]  # dtype, kernels
    return [dict(drafter=c["arm"], verifier=f"the target's numerics ({', '.join(kernels)}: verification vs 1 query)", setting=DASH,
                 T=c["temperature"], target=", ".join(kernels), lossless=False, speedup=math.nan, tau=math.nan, prompts=c["prompts"],
                 tv=(c["numerics_tv_mean"], math.nan, math.nan), tv90=c["numerics_tv_q90"], kl=math.nan, kept=math.nan,
                 positions=c["positions"], verdict=None, eq=None, quality=None) for c in page["data"]["cells"]]


def temperature_table(models: set[str]) -> Table | None:
    """Table `effective_temperature`: per rule, its exact step law against the target's at other temperatures (the TV to p
    at the run's T and at 0.5, the nearest T' and the TV there), from the newest committed page of
    benchmarks/effective_temperature.py whose target is one of the study's `models`; None where there is none."""
    page = _newest_page("effective-temperature", models)
    if page is None:
        return None
    t = page["data"]["temperature"]

    def ci(key: str):
        return lambda c: f"{c[key]:.4f} [{c[key + '_ci_low']:.4f}, {c[key + '_ci_high']:.4f}]"

    return Table(
        "effective_temperature", "Is a lossy rule a lower temperature? Each step's law against the target's at T'",
        f"{page['notes'][0]} From benchmarks/effective_temperature.py's page of {page['date']} ({page['prompts']}; {page['machine']}).",
        [Col("rule", "label", text, "l"), Col(f"TV to p at T = {t:g} [95% CI]", ci("tv_mean"), text),
         Col("TV to p at T' = 0.5", lambda c: c.get("tv_mean_at_0.5", math.nan), _small),
         Col("nearest T'", "nearest_temperature", temperature), Col("TV there [95% CI]", ci("nearest_tv_mean"), text),
         Col("positions nearer there", "nearest_closer", num3)],
        page["data"]["cells"])


_TITLES = {"medusa_typical": "Medusa's typical acceptance (Cai et al. 2024)", "bild": "BiLD (Kim et al. 2023)",
           "speculative_cascades": "Speculative cascades (Narasimhan et al. 2025)"}


def _small(x) -> str:
    return DASH if missing(x) else ("0" if abs(x) < 5e-5 else f"{x:.4f}")


def _tv_cell(v) -> str:
    mean, low, high = v
    return DASH if missing(mean) else _small(mean) if missing(low) else f"{_small(mean)} [{_small(low)}, {_small(high)}]"


def _score(r: dict, side: str) -> tuple[float, float]:
    q = r["quality"]
    return q.score(side, SCORE), q.problems


def wilson(rate: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a pass rate over n problems (95% at z = 1.96)."""
    centre, half = rate + z * z / (2 * n), z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def _with_ci(v) -> str:
    value, n = v
    if missing(value):
        return DASH
    return num3(value) + ("" if n is None or missing(n) else " [{}, {}]".format(*(num3(x) for x in wilson(value, n))))


def paired_interval(only_method: float, only_target: float, problems: float, z: float = 1.96) -> tuple[float, float]:
    """The 95% interval of a paired difference of two pass rates (method − target) over the same problems, from the
    discordant counts (solved only by the method, only by the target): (b − c)/n ± z √(b + c − (b − c)²/n) / n."""
    d = (only_method - only_target) / problems
    half = z * math.sqrt(max(only_method + only_target - (only_method - only_target) ** 2 / problems, 0.0)) / problems
    return d - half, d + half


def _delta_cell(q) -> str:
    delta, p = q.delta_of(SCORE), q.mcnemar_p
    if missing(delta):
        return DASH
    ci = "" if None in (q.method_only, q.baseline_only, q.problems) else " [{}, {}]".format(
        *(signed(x) for x in paired_interval(q.method_only, q.baseline_only, q.problems)))
    return signed(delta) + ci + ("" if p is None or missing(p) else f" (p {pvalue(p)})")


TARGET = "the target alone"


def _frontier(run: Run) -> bool:
    """A cell of the frontier: its run measured the exact distortion or ran the battery (stats.distortion or stats.samples
    set), where the cells timed for their intervals (speed_over_prompts) set neither."""
    return any(run.param(key) not in (None, "0", "0.0") for key in ("stats.distortion", "stats.samples"))


def _prompt_set(run: Run) -> str:
    """The prompts a speed run decoded, as a reader names them: "humaneval 128-143", "mtbench questions 3-4 of each category"."""
    name, offset = run.dataset, int(run.number("dataset.offset") or 0)
    per = run.param("dataset.per_category")
    if per not in (None, "None", "null"):
        return f"{name} questions {offset + 1}-{offset + int(per)} of each category"
    n = run.number("dataset.num_prompts")
    return f"{name} {offset}-{offset + int(n) - 1}" if not missing(n) else f"{name} from {offset}"


def speed_over_prompts(runs: list[Run], distortion: dict[tuple, float]) -> list[dict]:
    """One record per prompt set and cell timed with per-prompt data (the latest run of each): speedup and τ with their
    intervals over prompts, the paired difference to rejection sampling's speedup (same prompt set, drafter, T and
    target numerics), and the cell's exact distortion where the frontier has it."""
    cells = latest_by(runs, lambda run: (_prompt_set(run), *_cell(run)))
    records = []
    for key in sorted(cells, key=lambda k: (k[0], _order(k[1:]))):
        run, prompts = cells[key], intervals.per_prompt(cells[key].tags)
        reference = cells.get((key[0], key[1], "rejection", DASH, *key[4:]))
        records.append(dict(dataset=key[0], drafter=key[1], verifier=key[2], setting=key[3], T=key[4], target=key[5], run=run,
                            n=len(prompts), speedup=intervals.speedup(prompts), tau=intervals.tau(prompts),
                            vs_rejection=None if reference is None or reference is run else
                            intervals.difference(prompts, intervals.per_prompt(reference.tags)),
                            tv=distortion.get(key[1:], math.nan)))
    return records


def verdict_rows(frontier: list[dict], timed: list[dict], over_seeds: list[dict]) -> list[dict]:
    """The verdict table's rows: every setting (drafter, verifier, its setting, T, the target's numerics) that was timed
    with intervals or scored over seeds, with its speed cells per prompt set, its frontier cell and its quality rows."""
    cells = {_key(r): r for r in frontier}
    settings = sorted({_key(r) for r in timed} | {_key(r) for r in over_seeds if r["verifier"] != TARGET}, key=_order)
    rows = []
    for k in settings:
        speed = {r["dataset"].split()[0]: r for r in timed if _key(r) == k}
        code, chat, cell = speed.get("humaneval"), speed.get("mtbench"), cells.get(k, {})
        eq = cell.get("eq") or {}
        battery = DASH if not cell.get("verdict") else cell["verdict"] + (
            f" ({signed(eq['surprisal_deficit'])})" if not missing(eq.get("surprisal_deficit", math.nan)) else "")
        others = [c for c in frontier if _key(c)[:4] == k[:4] and _key(c)[4] != k[4] and c.get("verdict")]  # other numerics
        battery += "".join(f"; {c['verdict']} with {c['target']}" for c in others)
        quality = {r["task"]: r["vs_target"] for r in over_seeds if _key(r) == k}
        rows.append(dict(drafter=k[0], verifier=k[1], setting=k[2], T=k[3], target=k[4],
                         lossless=cell.get("lossless", k[1] == "rejection"),
                         code=code["speedup"] if code else None, chat=chat["speedup"] if chat else None,
                         code_vs_rejection=code["vs_rejection"] if code else None,
                         chat_vs_rejection=chat["vs_rejection"] if chat else None, tau=code["tau"].value if code else math.nan,
                         tv=cell.get("tv", (math.nan,))[0], battery=battery, **quality))
    return rows


def _interval_cell(v: intervals.Interval | None, fmt=num) -> str:
    if v is None or missing(v.value):
        return DASH
    return fmt(v.value) + ("" if missing(v.low) else f" [{fmt(v.low)}, {fmt(v.high)}]")


def quality_over_seeds(runs: list[Run]) -> list[dict]:
    """One record per task and setting scored with per-problem outcomes (quality runs tagged records.SOLVED_TAG): the
    setting's seeds (of several runs at one seed, the latest), its pass@1 over seeds, its paired difference to the target
    alone at the same T and seeds and to the target alone at the next lower T measured; the target alone's own rows
    (its baseline sides, or drafter none's method side) first at each task and T."""
    settings: dict[tuple, dict[int, Run]] = {}  # (task, cell) -> seed -> its latest run
    for run in sorted(runs, key=lambda r: r.start):
        settings.setdefault((run.param("eval.task"), _cell(run)), {})[int(run.number("seed"))] = run
    targets: dict[tuple, seeds.Outcomes] = {}  # (task, T, numerics) -> the target alone's outcomes per seed
    target_runs: dict[tuple, list[Run]] = {}
    for (task, cell), by_seed in settings.items():
        for seed, run in by_seed.items():
            got = seeds.solved(run.tags, METHOD if cell[0] == "none" else BASELINE)
            if got is not None and seed not in targets.setdefault((task, cell[3], cell[4]), {}):
                targets[(task, cell[3], cell[4])][seed] = got
                target_runs.setdefault((task, cell[3], cell[4]), []).append(run)

    def lower(task: str, t: float, numerics: str, outcomes: seeds.Outcomes) -> tuple[float, seeds.Paired] | None:
        below = sorted(T for (k, T, n) in targets if k == task and n == numerics and T < t)
        return (below[-1], seeds.paired(outcomes, targets[(task, below[-1], numerics)])) if below else None

    records = []
    for (task, t, numerics), outcomes in sorted(targets.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        records.append(dict(task=task, drafter=DASH, verifier=TARGET, setting=DASH, T=t, target=numerics,
                            seeds=_seeds(outcomes), problems=seeds.rate(outcomes).problems, rate=seeds.rate(outcomes),
                            vs_target=None, vs_lower=lower(task, t, numerics, outcomes), runs=target_runs[(task, t, numerics)]))
    for (task, cell), by_seed in sorted(settings.items(), key=lambda kv: (kv[0][0], _order(kv[0][1]))):
        if cell[0] == "none":
            continue
        method = {seed: seeds.solved(run.tags, METHOD) for seed, run in by_seed.items()}
        own = {seed: got for seed, run in by_seed.items() if (got := seeds.solved(run.tags, BASELINE)) is not None}
        records.append(dict(task=task, drafter=cell[0], verifier=cell[1], setting=cell[2], T=cell[3], target=cell[4],
                            seeds=_seeds(method), problems=seeds.rate(method).problems, rate=seeds.rate(method),
                            vs_target=seeds.paired(method, own) if own else None,
                            vs_lower=lower(task, cell[3], cell[4], method), runs=list(by_seed.values())))
    return records


def _seeds(outcomes: seeds.Outcomes) -> str:
    return f"{len(outcomes)} ({', '.join(str(s) for s in sorted(outcomes))})"


def _rate_cell(r: seeds.Rate) -> str:
    return DASH if missing(r.value) else f"{num3(r.value)} [{num3(r.low)}, {num3(r.high)}]"


def _paired_cell(d: seeds.Paired | None) -> str:
    if d is None or missing(d.delta):
        return DASH
    return f"{signed(d.delta)} [{signed(d.low)}, {signed(d.high)}] (p {pvalue(d.p)})"


def _lower_cell(v: tuple[float, seeds.Paired] | None) -> str:
    return DASH if v is None else f"T {v[0]:g}: {_paired_cell(v[1])}"


def speed_figure(timed: list[dict]) -> Figure:
    """A panel per prompt set: each timed cell's speedup with its 95% interval over prompts (error bar) against its exact
    distortion from the frontier (lossless at 0; a cell without one drawn at its own place on the right, at "no TV"),
    colour: verifier, marker: drafter."""
    sets = sorted({r["dataset"] for r in timed})
    fig, axes = figures.panels(len(sets), width=5.0, height=3.6)
    for ax, name in zip(axes, sets):
        here = [r for r in timed if r["dataset"] == name]
        right = max([r["tv"] for r in here if not missing(r["tv"])] + [0.05]) * 1.15
        for r in here:
            s = r["speedup"]
            x = max(r["tv"], 0.0) if not missing(r["tv"]) else right
            low, high = (s.value, s.value) if missing(s.low) else (s.low, s.high)
            ax.errorbar(x, s.value, yerr=[[s.value - low], [high - s.value]], fmt=MARKERS.get(r["drafter"], "^"), capsize=3,
                        color=COLORS.get(r["verifier"], "C7"), label=f"{r['drafter']} × {r['verifier']}")
            ax.annotate(r["setting"] if r["setting"] != DASH else r["verifier"], (x, s.value), textcoords="offset points",
                        xytext=(4, 3), fontsize=6)
        ax.axvline(0.0, color="grey", linewidth=0.6)
        ax.set_xlabel("exact distortion: mean TV of the first token to p (frontier)")
        ax.set_ylabel("speedup (×), 95% interval over prompts")
        ax.set_title(f"{name}, T = {', '.join(f'{t:g}' for t in sorted({r['T'] for r in here}))}", fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=6)
    fig.tight_layout()
    return fig


def pareto(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The frontier of (distortion, speedup) points: those no other point beats on both (less distortion, more
    speed), by increasing distortion."""
    best, out = -math.inf, []
    for x, y in sorted(points, key=lambda p: (p[0], -p[1])):
        if y > best:
            out.append((x, y))
            best = y
    return out


def frontier(records: list[dict]) -> Figure:
    """Top row: speedup against mean exact TV, a panel per T (colour: verifier, marker: drafter), lossless at 0, each
    drafter's frontier drawn (solid: independent, dashed: medusa); bottom row: speedup against pass@1 where quality ran."""
    temps = sorted({r["T"] for r in records}) or [math.nan]
    fig, axes = figures.panels(2 * len(temps), width=5.0, height=3.6)
    for i, t in enumerate(temps):
        ax, bx = axes[i], axes[len(temps) + i]
        here = [r for r in records if r["T"] == t and r["drafter"] != "none" and not missing(r["speedup"])]  # none: the battery's control
        for r in here:
            if not missing(r["tv"][0]):
                ax.scatter(max(r["tv"][0], 0.0), r["speedup"], color=COLORS.get(r["verifier"], "C7"),
                           marker=MARKERS.get(r["drafter"], "^"), s=40, label=f"{r['drafter']} × {r['verifier']}")
        for drafter in sorted({r["drafter"] for r in here}):
            line = pareto([(max(r["tv"][0], 0.0), r["speedup"]) for r in here if r["drafter"] == drafter and not missing(r["tv"][0])])
            if len(line) > 1:
                ax.plot(*zip(*line), color="grey", linewidth=0.8, linestyle="-" if drafter == "independent" else "--")
        ax.axvline(0.0, color="grey", linewidth=0.6)
        ax.set_xlabel("exact distortion: mean TV of the first token to p")
        ax.set_ylabel("speedup (×)")
        ax.set_title(f"T = {t:g}: speed vs distortion", fontsize=10)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            unique = dict(zip(labels, handles))
            ax.legend(unique.values(), unique.keys(), fontsize=6)
        else:
            figures.empty(ax, "no cell with a distortion")
        scored = [r for r in here if r["quality"] is not None and not missing(r["quality"].score(METHOD, SCORE))]
        for r in scored:
            bx.scatter(r["quality"].score(METHOD, SCORE), r["speedup"], color=COLORS.get(r["verifier"], "C7"),
                       marker=MARKERS.get(r["drafter"], "^"), s=40)
            bx.annotate(r["setting"] if r["setting"] != DASH else r["verifier"], (r["quality"].score(METHOD, SCORE), r["speedup"]),
                        textcoords="offset points", xytext=(4, 3), fontsize=6)
        targets = {round(r["quality"].score(BASELINE, SCORE), 4) for r in scored if not missing(r["quality"].score(BASELINE, SCORE))}
        for value in targets:
            bx.axvline(value, color="grey", linestyle="--", linewidth=0.8)
        if not scored:
            figures.empty(bx, "pass@1 not measured at this T")
        bx.set_xlabel("pass@1 (HumanEval; dashed: the target alone)")
        bx.set_ylabel("speedup (×)")
        bx.set_title(f"T = {t:g}: speed vs quality", fontsize=10)
    fig.tight_layout()
    return fig
