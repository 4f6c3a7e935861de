"""The law tests against lossy mutants: `python -m tests.mutants` applies each plausible lossy bug below,
one at a time, to a scratch copy of the checkout, runs the tests of tests/verifiers/test_lossless.py that
concern it there, and prints which killed it and how strongly: the smallest p-value of the Monte
Carlo law tests (`law_pvalues`) and the largest exact TV of the enumeration test (exact: no noise).

A mutant is killed when some test fails; killed with margin when the failure is not near the tests'
α = 1e-3: a Monte Carlo p below 1e-6 or an exact TV above the 1e-9 tolerance (the enumeration test
logs the larger of its law's TV to p and the TV of the p the verifier read to the target's). The
scratch copy is imported first (PYTHONPATH), so the installed package is not touched.

Six of them apply a temperature or a truncation to only one of p and q (a draft that draws from its
law after the sampling settings but reports it at T = 1 or before top-p, a verifier's p at T = 1 or
without top-k): equivalent at T = 1 without truncation, they are run against the law tests' settings
beyond it (`-k "T0.7 or T1.5"`: the exact law at T = 0.7 and at T = 1.5 with top-p, the Monte Carlo
law at T = 0.7 with top-k). A draft that draws and reports the same law at another temperature is no
mutant: rejection sampling is exact for any q it is told truly.

    python -m tests.mutants                        # every mutant (about 50 minutes on 2 cores)
    python -m tests.mutants --only tree-no-residual-update --workers 1
    python -m tests.mutants --json docs/results/data/2026-11-28-law-test-mutants.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from specresearch.errors import fail, report_problem
from specresearch.reports import checked

ROOT = Path(__file__).resolve().parent.parent
ALPHA, MARGIN, EXACT = 1e-3, 1e-6, 1e-9

BASIC = "pld or (independent and default) or (tree and static) or (medusa and sample)"  # modes of every draft kind
SAMPLED = "(independent and default) or (self_draft and default) or (tree and sample) or (medusa and sample) or (eagle and chain)"
CHAINS = "(independent and default) or (self_draft and default) or (eagle and chain)"  # sampled chains, of three drafters
# The law tests' sampling settings beyond T = 1 (test_lossless.EXACT, MC_EXTRA: their names end the ids): a
# temperature or a truncation applied to one of p and q only is invisible at T = 1 without truncation.
NOT_T1 = "(T0.7 or T1.5)"
TOP_P = "T1.5"  # the exact test's top-p setting (T = 1.5, top-k 4, top-p 0.9)


def _sampling(params: str) -> str:
    """Source text of SamplingParams at T = 1 with the top-k and top-p of `params` (a mutant's edit)."""
    return f"SamplingParams(1.0, {params}.top_k, {params}.top_p)"


@dataclass
class Mutant:
    name: str
    what: str  # the bug, in a few words
    file: str  # relative to the checkout
    edits: list[tuple[str, str]]  # (old, new): each old occurs exactly once in the file
    select: str = BASIC  # pytest -k: the law tests it is run against


MUTANTS = [
    # -- acceptance
    Mutant("accept-power-0.9", "accept with min(1, p/q)^0.9", "specresearch/verifiers/rejection.py",
           [("(p / q.clamp_min(torch.finfo(q.dtype).tiny)).clamp(max=1.0)", "(p / q.clamp_min(torch.finfo(q.dtype).tiny)).clamp(max=1.0) ** 0.9")]),
    Mutant("accept-ignores-q", "accept with min(1, p): q left out of the ratio", "specresearch/verifiers/rejection.py",
           [("return acceptance_probability(px, qx)", "return acceptance_probability(px, torch.ones_like(qx))")], SAMPLED),
    Mutant("accept-q-of-next-token", "each draft token's ratio read with the next token's q row", "specresearch/verifiers/base.py",
           [("q[b, : len(draft)] = draft.q[: len(draft)]", "q[b, : len(draft)] = draft.q[: len(draft)].roll(-1, 0)")], SAMPLED),
    Mutant("accept-p-of-next-position", "acceptance read from p one position late", "specresearch/verifiers/base.py",
           [("self.acceptance(p[:, :width].reshape(-1, vocab)", "self.acceptance(p[:, 1 : width + 1].reshape(-1, vocab)")]),
    Mutant("one-uniform-per-chain", "one uniform for every position of a row's chain", "specresearch/verifiers/base.py",
           [("torch.rand(int(k_b) + 1, generator=rng, dtype=torch.float64, device=device)",
             "torch.cat([torch.rand(1, generator=rng, dtype=torch.float64, device=device).expand(int(k_b)), "
             "torch.rand(1, generator=rng, dtype=torch.float64, device=device)])")], "independent or pld or self_draft"),
    # -- residual and bonus
    Mutant("recovered-from-p", "after a rejection, the token drawn from p instead of the residual", "specresearch/verifiers/rejection.py",
           [("return p if q is None else residual(p, q)", "return p")]),
    Mutant("residual-swapped", "residual norm(max(q - p, 0))", "specresearch/verifiers/rejection.py",
           [("r = (p - q).clamp_min(0.0)", "r = (q - p).clamp_min(0.0)")]),
    Mutant("residual-absolute", "residual norm(|p - q|)", "specresearch/verifiers/rejection.py",
           [("r = (p - q).clamp_min(0.0)", "r = (p - q).abs()")]),
    Mutant("bonus-at-k-1", "the bonus token read from p at the last draft position (K - 1)", "specresearch/verifiers/base.py",
           [("law = self.fallback(p_n, None)", "law = self.fallback(p[torch.arange(rows, device=p.device), (n - 1).clamp_min(0)], None)"),
            ("law[bonus] = self.fallback(p_n[bonus], None)", "law[bonus] = self.fallback(p[bonus, n[bonus] - 1], None)")],
           "independent or pld or self_draft or cross_vocab"),
    Mutant("recovered-one-late", "the recovered token drawn from the residual one position late", "specresearch/verifiers/base.py",
           [("law = self.fallback(p_n, q[torch.arange(rows, device=p.device), n])",
             "law = self.fallback(p[torch.arange(rows, device=p.device), n + 1], q[torch.arange(rows, device=p.device), n])"),
            ("law[rejected] = self.fallback(p_n[rejected], q[rejected, n[rejected]])",
             "law[rejected] = self.fallback(p[rejected, n[rejected] + 1], q[rejected, n[rejected]])")],
           "independent or pld or self_draft or cross_vocab"),
    # -- trees
    Mutant("tree-no-residual-update", "a tree's residual not updated after a rejected sibling", "specresearch/verifiers/base.py",
           [("law[rejected.to(device)] = self.fallback(law[rejected.to(device)], q_c[(~ok).to(device)])", "pass")],
           "tree or medusa or (independent and siblings)"),
    Mutant("tree-residual-from-p", "each sibling faces the node's p minus its own q, not the running residual",
           "specresearch/verifiers/base.py",
           [("law[rejected.to(device)] = self.fallback(law[rejected.to(device)], q_c[(~ok).to(device)])",
             "law[rejected.to(device)] = self.fallback(p[rejected.to(device), node[rejected].to(device) + 1], q_c[(~ok).to(device)])")],
           "tree or medusa or (independent and siblings)"),
    Mutant("tree-row-off-by-one", "after an accepted child, its children verified against the parent's p row",
           "specresearch/verifiers/base.py", [("law[taken.to(device)] = p[taken.to(device), child[ok].to(device) + 1]", "law[taken.to(device)] = p[taken.to(device), child[ok].to(device)]")], "tree or medusa"),
    Mutant("siblings-report-chain-q", "a chain's siblings report the chain token's q instead of one-hot", "specresearch/drafters/base.py",
           [("qs += [self.qs[i], *torch.nn.functional.one_hot(others, self.qs[i].numel()).to(self.qs[i].dtype)]",
             "qs += [self.qs[i]] * (1 + len(others))")], "siblings"),
    Mutant("tree-children-without-replacement", "a tree's sampled children drawn without replacement", "specresearch/drafters/tree.py",
           [("torch.multinomial(rows, width, replacement=True, generator=ctxs[b].rng)",
             "torch.multinomial(rows, width, replacement=False, generator=ctxs[b].rng)")], "tree and sample"),
    Mutant("medusa-children-without-replacement", "Medusa's sampled children drawn without replacement", "specresearch/drafters/medusa.py",
           [("torch.multinomial(laws[d], w, replacement=True, generator=ctx.rng)",
             "torch.multinomial(laws[d], w, replacement=False, generator=ctx.rng)")], "medusa and sample"),
    Mutant("tree-budget-keeps-likeliest", "a dynamic tree's budget keeps the likeliest sampled children", "specresearch/drafters/tree.py",
           [('keep = self._budget_sampled(nodes) if self.settings.children == "sample" else self._budget_top(nodes, budget)',
             "keep = self._budget_top(nodes, budget)")], "tree and dynamic and sample"),
    Mutant("medusa-q-of-next-head", "Medusa's sampled nodes report the next head's law", "specresearch/drafters/medusa.py",
           [("q = laws[[len(c) - 1 for c in choices]]", "q = laws[[min(len(c), len(laws) - 1) for c in choices]]")], "medusa and sample"),
    # -- chains and the drafters' laws
    Mutant("chain-q-before-top-k", "a chain reports its softmax before top-k (transformers #47932)", "specresearch/drafters/base.py",
           [("self.qs.append(q if self.shortlist is None else self.shortlist.widen(q))",
             "self.qs.append(torch.softmax(logits.float(), -1) if self.shortlist is None else self.shortlist.widen(torch.softmax(logits.float(), -1)))")],
           SAMPLED),
    Mutant("chain-q-untempered", "a chain draws from q at T but reports q at T = 1 (p tempered, the ratio's q not)",
           "specresearch/drafters/base.py",
           [("self.qs.append(q if self.shortlist is None else self.shortlist.widen(q))",
             f"reported = logits_to_probs(logits, {_sampling('self.ctx.sampling')})\n"
             "            self.qs.append(reported if self.shortlist is None else self.shortlist.widen(reported))")],
           f"({CHAINS}) and {NOT_T1}"),
    Mutant("chain-q-without-top-p", "a chain draws from q after top-p but reports q before it (top-p on p only)",
           "specresearch/drafters/base.py",
           [("self.qs.append(q if self.shortlist is None else self.shortlist.widen(q))",
             "reported = logits_to_probs(logits, SamplingParams(self.ctx.sampling.temperature, self.ctx.sampling.top_k))\n"
             "            self.qs.append(reported if self.shortlist is None else self.shortlist.widen(reported))")],
           f"({CHAINS}) and {TOP_P}"),
    Mutant("tree-q-untempered", "a sampled tree's children drawn at T, their q reported at T = 1", "specresearch/drafters/tree.py",
           [('q = widen(laws[at + w]) if self.settings.children == "sample" else None',
             f"q = widen(ranking_probs(torch.cat([logits[b] for b in live]), {_sampling('sampling')})[at + w]) "
             'if self.settings.children == "sample" else None')], f"tree and sample and {NOT_T1}"),
    Mutant("medusa-q-untempered", "Medusa's sampled children drawn at T, their q reported at T = 1", "specresearch/drafters/medusa.py",
           [("q = laws[[len(c) - 1 for c in choices]]", f"q = logits_to_probs(logits, {_sampling('ctx.sampling')})[[len(c) - 1 for c in choices]]")],
           f"medusa and sample and {NOT_T1}"),
    Mutant("lookup-guess-kept", "the lookup cascade keeps the guess where the draft's argmax agrees, not the draft's sample",
           "specresearch/drafters/independent.py",
           [("            x = chain.add(row)\n            ahead = ",
             "            x = chain.add(row)\n            if i < guess.numel() and x != guess[i] and int(row.argmax()) == int(guess[i]):\n"
             "                chain.tokens[-1] = x = guess[i]\n            ahead = ")],
           "independent and lookup"),
    # -- the target's p
    Mutant("p-untempered", "the verifier's p from the target's logits at T = 1 (q tempered, p not)", "specresearch/engine.py",
           [("logits_to_probs(logits, self.p_sampling)", f"logits_to_probs(logits, {_sampling('self.p_sampling')})")],
           f"({BASIC}) and {NOT_T1}"),
    Mutant("p-without-top-k", "the verifier's p without top-k (top-k on q only)", "specresearch/verifiers/base.py",
           [('(see RelaxedVerifier)."""\n        return sampling\n',
             '(see RelaxedVerifier)."""\n        return SamplingParams(sampling.temperature, 0, sampling.top_p)\n')],
           f"({BASIC}) and {NOT_T1}"),
    # -- batches and seeds
    Mutant("rows-verified-against-another-row", "in a batch of chains, row b verified against row b - 1's p", "specresearch/verifiers/base.py",
           [("laws = p if whole else p[chains]", "laws = p.roll(1, 0) if whole else p[chains]")], "independent or pld or self_draft"),
    Mutant("rows-share-one-stream", "every row of a batch gets the seed's first stream", "specresearch/engine.py",
           [("return [stream_seed(seed, b) for b in range(n)]", "return [stream_seed(seed, 0) for b in range(n)]")], BASIC),
    # -- a lossy rule claiming losslessness
    Mutant("relaxed-rules-claim-lossless", "typical, margin and top-k acceptance claim to be lossless", "specresearch/verifiers/relaxed.py",
           [("    lossless = False\n", "    lossless = True\n")], "typical and (pld or (independent and default) or (medusa and top))"),
]


def scratch_copy(dest: Path) -> None:
    """The checkout's package, configs and tests (what the law tests import) under dest."""
    for name in ("specresearch", "conf", "tests"):
        if (ROOT / name).exists():
            shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml",):
        shutil.copy(ROOT / name, dest / name)


def apply(mutant: Mutant, root: Path) -> None:
    path = root / mutant.file
    text = path.read_text()
    for old, new in mutant.edits:
        if text.count(old) != 1:
            raise SystemExit(f"mutant {mutant.name}: {mutant.file} holds its text {text.count(old)} times (it must be once): {old!r}")
        text = text.replace(old, new)
    path.write_text(text)


def run(mutant: Mutant | None, workers: int) -> dict:
    """Run the mutant's law tests on a mutated scratch copy (None: unmutated, the whole law test): its row of the table."""
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        root = Path(tmp)
        scratch_copy(root)
        if mutant is not None:
            apply(mutant, root)
        log = root / "law.jsonl"
        env = {**os.environ, "PYTHONPATH": str(root), "SPECRESEARCH_LAW_LOG": str(log), "OMP_NUM_THREADS": "1"}  # (2 processes on 2 cores)
        where = subprocess.run([sys.executable, "-c", "import specresearch; print(specresearch.__file__)"], cwd=root, env=env,
                               capture_output=True, text=True, check=True).stdout.strip()
        if not where.startswith(str(root)):
            raise SystemExit(f"the scratch copy is not what runs (specresearch from {where})")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/verifiers/test_lossless.py", "-k",
               f"(sampled_output or exact_law) and ({mutant.select if mutant else 'rejection'})"]
        if workers > 1:
            cmd += ["-n", str(workers)]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t0
        lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-300:]
    counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|error|errors)", tail)}
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    pvalues = [(min(line["p"].values()), line["test"]) for line in lines if line["p"]]
    tvs = [(line["tv"], line["test"]) for line in lines if line["tv"] is not None]
    min_p, max_tv = min(pvalues, default=(None, None)), max(tvs, default=(None, None))
    return {"mutant": mutant.name if mutant else "(none)", "what": mutant.what if mutant else "the checkout as it is",
            "file": mutant.file if mutant else "", "select": mutant.select if mutant else "rejection",
            "tests": failed + counts.get("passed", 0), "failed": failed, "killed": proc.returncode != 0,
            "min_p": min_p[0], "min_p_test": min_p[1], "max_tv": max_tv[0], "max_tv_test": max_tv[1],
            "margin": bool((min_p[0] is not None and min_p[0] < MARGIN) or (max_tv[0] is not None and max_tv[0] > EXACT)),
            "seconds": round(seconds, 1), "pytest": tail}


def _short(test: str | None) -> str:
    return "" if not test else test.split("[", 1)[1].rstrip("]") if "[" in test else test


def row_cells(r: dict) -> list[str]:
    p = "" if r["min_p"] is None else f"{r['min_p']:.1e} ({_short(r['min_p_test'])})"
    tv = "" if r["max_tv"] is None else f"{r['max_tv']:.1e} ({_short(r['max_tv_test'])})"
    verdict = ("killed" + (", with margin" if r["margin"] else ", NEAR ALPHA")) if r["killed"] else "SURVIVED"
    return [f"`{r['mutant']}`", r["what"], f"{r['failed']}/{r['tests']}", p, tv, verdict]


# What a report's rows are read for (of the keys `run` gives a row): `row_cells`, the summary, the order.
ROW_KEYS = ("mutant", "what", "tests", "failed", "killed", "min_p", "min_p_test", "max_tv", "max_tv_test", "margin", "seconds")


def earlier(path: Path, others: set[str]) -> tuple[dict, list[str]]:
    """The rows of mutants `others` in the report at `path` that this command keeps (by name) and its commands,
    or a one-line refusal (exit 2) where `path` is not such a report: read before any mutant runs."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, not JSON
        fail(f"--json {path} cannot be read as JSON ({type(err).__name__}): give the report python -m tests.mutants wrote, "
             "or a new path")
    data = report.get("data") if isinstance(report, dict) else None
    rows = data.get("mutants") if isinstance(data, dict) else None
    command = report.get("command") if isinstance(report, dict) else None
    if not (isinstance(rows, list) and all(isinstance(r, dict) and set(ROW_KEYS) <= r.keys() for r in rows)
            and isinstance(command, list) and all(isinstance(c, str) for c in command)):
        fail(f"--json {path} is not a report of python -m tests.mutants (command: a list of strings; data.mutants: rows "
             f"with {', '.join(ROW_KEYS)}): give the report it wrote, or a new path")
    return {r["mutant"]: r for r in rows if r["mutant"] in others}, command


COLUMNS = ["mutant", "the bug", "tests failed", "smallest p (Monte Carlo)", "largest exact TV (enumeration)", "verdict"]


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "?") if Path("/proc/cpuinfo").exists() else platform.processor()
    import torch

    return f"{os.cpu_count()}-core {cpu}, CPU, torch {torch.__version__}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=[m.name for m in MUTANTS], metavar="NAME", help="these mutants only")
    parser.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per mutant (1: one process)")
    parser.add_argument("--json", type=Path, help="write the table here (the docs' results format)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    problem = None if args.json is None else report_problem(args.json, "--json")
    if problem:  # before the mutants run (minutes each), not after them
        fail(problem)
    kept, commands = {}, []  # with --only and an existing --json: the other mutants' rows are kept (their runs are not redone)
    if args.only and args.json and args.json.exists():
        kept, commands = earlier(args.json, {m.name for m in MUTANTS} - set(args.only))
    rows = []
    print(" | ".join(COLUMNS), flush=True)
    for mutant in chosen:
        rows.append(run(mutant, args.workers))
        print(" | ".join(row_cells(rows[-1])) + f" | {rows[-1]['seconds']:.0f} s", flush=True)
    order = {m.name: i for i, m in enumerate(MUTANTS)}
    rows = sorted([*kept.values(), *rows], key=lambda r: order.get(r["mutant"], len(order)))
    killed = sum(r["killed"] for r in rows)
    margin = sum(r["killed"] and r["margin"] for r in rows)
    print(f"{killed}/{len(rows)} killed, {margin} with margin (p < {MARGIN:g} or exact TV > {EXACT:g})")
    if args.json:
        report = {
            "title": "The law tests against lossy mutants",
            "date": datetime.date.today().isoformat(),
            "machine": machine(),
            "topic": "lossless",
            "command": ([f"python -m tests.mutants --workers {args.workers} --json {args.json.as_posix()}"] if not kept else commands)
                       + ([f"python -m tests.mutants --only {' '.join(args.only)} --workers {args.workers} --json {args.json.as_posix()}"]
                          if args.only else []),
            "prompts": ("tests/verifiers/test_lossless.py's law tests (2,880 ragged-batch decodes at T = 1 in two settings, `landing` and "
                        "`rejecting`, per drafter mode, and at T = 0.7, top-k 20 in `rejecting` per drafter) and its exact "
                        "enumeration (T = 1, top-k 4; T = 0.7, top-k 4; T = 1.5, top-k 4, top-p 0.9), run on a scratch copy of "
                        "the checkout with one mutant applied; each mutant against the modes and settings its bug touches"),
            "columns": COLUMNS,
            "rows": [row_cells(r) for r in rows],
            "notes": [f"{killed} of {len(rows)} mutants killed, {margin} with margin: a Monte Carlo p below {MARGIN:g} or an "
                      f"exact TV above the enumeration test's tolerance {EXACT:g} (the tests' α is {ALPHA:g}).",
                      "Tests failed: failing / run among the selected law tests (`-k`, in tests/mutants.py). Smallest p: "
                      "over every p-value the Monte Carlo law tests logged (first, second, joint, recovered), with the "
                      "test that gave it; exact TV: the enumeration test's distance of the first token's law to p.",
                      f"Took {sum(r['seconds'] for r in rows) / 60:.0f} minutes (the sum of the rows' runs; each later command "
                      "re-ran the mutants it names and kept the other rows).",
                      "Not in the table: a cross-vocabulary mapping bug (cross_vocab's shared q widened onto the draft's ids "
                      "instead of their target twins) is an equivalent mutant here: the tests' two tiny tokenizers give the "
                      "shared bytes the same ids, so the mapping is the identity and the bug changes nothing they run."],
            "data": {"mutants": rows},
        }
        checked(report, str(args.json))  # the docs' one results format (specresearch.reports)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if killed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
