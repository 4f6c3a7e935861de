"""stdlib_doctest: write a function of Python's standard library from its signature and docstring;
scored by running the docstring's own examples (doctest) against the completion, in the sandbox.

A second execution-scored code task that needs no download: the problems are read from the running
interpreter's standard library (public top-level functions whose docstrings hold examples and whose
own body passes them: FUNCTIONS, checked on CPython 3.11). The completion is executed inside the
function's module, so the module's private helpers are there, as for the original.

Caveats: the standard library is in every code model's training data (this measures a delta between
decoding methods, not a model's ability), and the prompts overlap `specresearch.train`'s
self-distillation prompts (functions cut after their docstring): a Medusa/EAGLE head trained by
`train.data=self` has seen them, so its acceptance here is optimistic.
"""

from __future__ import annotations

import ast
import importlib.util

from specresearch.evaluation import sandbox

# (module, function): public top-level functions with doctests that their own body passes and `return None` fails
# (found by scanning CPython 3.11's standard library; a function missing from the running Python is skipped).
FUNCTIONS: tuple[tuple[str, str], ...] = tuple((module, name) for module, names in (
    ('difflib', 'get_close_matches IS_CHARACTER_JUNK unified_diff context_diff ndiff restore'),
    ('enum', 'bin'),
    ('heapq', 'merge'),
    ('ipaddress', 'summarize_address_range'),
    ('pickle', 'encode_long decode_long'),
    ('pickletools', 'read_uint1 read_uint2 read_int4 read_uint4 read_uint8 read_stringnl read_stringnl_noescape_pair '
                    'read_string1 read_string4 read_bytes1 read_bytes4 read_bytes8 read_bytearray8 read_unicodestringnl '
                    'read_unicodestring1 read_unicodestring4 read_unicodestring8 read_decimalnl_short read_decimalnl_long '
                    'read_floatnl read_float8 read_long1 read_long4'),
    ('statistics', 'mean fmean geometric_mean harmonic_mean median median_low median_high median_grouped mode multimode '
                   'variance pvariance stdev pstdev covariance correlation linear_regression'),
    ('typing', 'get_origin get_args is_typeddict'),
) for name in names.split())


def problems(functions=None) -> list[dict]:
    """The problems: task_id, module, name, prompt (up to the docstring's end), canonical_solution (the body)."""
    out = []
    for module, name in functions if functions is not None else FUNCTIONS:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        with open(spec.origin, encoding="utf-8") as f:
            lines = f.read().splitlines(keepends=True)
        tree = ast.parse("".join(lines))
        node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if node is None or not node.body or not isinstance(node.body[0], ast.Expr):
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
        doc_end = node.body[0].end_lineno
        out.append({"task_id": f"stdlib/{module}.{name}", "module": module, "name": name,
                    "prompt": "".join(lines[start:doc_end]), "canonical_solution": "".join(lines[doc_end:node.end_lineno])})
    return out


def program(doc: dict, completion: str) -> str:
    """The program run in the sandbox: define prompt + completion inside the module, run its doctests."""
    return f"""import doctest, importlib, sys
module = importlib.import_module({doc["module"]!r})
exec(compile({(doc["prompt"] + completion)!r}, "<completion>", "exec"), module.__dict__)
function = module.__dict__[{doc["name"]!r}]
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
for test in doctest.DocTestFinder(recurse=False).find(function, {doc["name"]!r}, module=False, globs=dict(module.__dict__)):
    runner.run(test, out=sys.stderr.write)
failed, attempted = runner.summarize(verbose=False)
sys.exit(1 if failed or not attempted else 0)
"""


def load(**_):
    """The problems as a datasets.DatasetDict with one `test` split (lm-eval's `custom_dataset`).
    lm-eval calls it when it builds the task, before any generation: the sandbox's refusals come now."""
    import datasets

    sandbox.preflight()
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(problems())})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """pass@1 of one completion: 1.0 if every example of the function's docstring passes."""
    return sandbox.score(doc["task_id"], program(doc, results[0]))
