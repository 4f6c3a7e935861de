"""The package's imports go one way: no module imports, directly or through others, a module that
imports it back. Every import counts, also those inside functions (imported late to keep `--help`
fast, they still bind the two modules together), and importing `a.b.c` runs the packages `a.b` above
it. The root package is the exception: it only names the Python API, lazily (its `__getattr__`)."""

from __future__ import annotations

import ast
from pathlib import Path

import specresearch

ROOT = Path(specresearch.__file__).resolve().parent
PACKAGE = "specresearch"


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 more
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` names a module; a symbol's module is its prefix
                target = target.rpartition(".")[0]
            if target and target != name:
                out |= {target} | {p for p in _packages_above(target) if not f"{name}.".startswith(f"{p}.")}
    return out


def _packages_above(module: str) -> list[str]:
    """`a.b.c` runs the package `a.b` first (not the root: it imports nothing at import time), unless
    the importer lives in that package: its package ran before it."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (as a path a -> ... -> a), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def test_the_import_graph_has_no_cycle():
    found = cycle(graph())
    assert found is None, "import cycle: " + " -> ".join(found)


def test_the_walk_sees_imports_inside_functions_and_cycles():
    """The checker itself: a function-level import is an edge, and a cycle through one is found."""
    g = graph()
    assert "specresearch.evaluation.runner" in g["specresearch.__main__"]  # imported inside `work`
    assert "specresearch.engine" in g["specresearch.app"]  # inside build_engine
    assert "specresearch.drafters" in g["specresearch.engine"]  # the package above drafters.base runs too
    assert cycle({**g, "specresearch.records": g["specresearch.records"] | {"specresearch.app"}}) is not None
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_root_package_imports_nothing_when_imported():
    """`import specresearch` is cheap and binds nothing: the API is resolved on first use."""
    tree = ast.parse((ROOT / "__init__.py").read_text())
    assert not [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) and node.module != "__future__"]


def test_every_entry_point_opens_its_run_through_tracked_run():
    """Experiment, eval, training and the benchmark open and end runs only through app.tracked_run
    (FINISHED, or FAILED with what was measured): no other module starts or ends a tracker's run."""
    benchmarks = ROOT.parent / "benchmarks"
    files = [*modules().values(), *(sorted(benchmarks.glob("*.py")) if benchmarks.is_dir() else [])]
    callers = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("start", "end") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "tracker":
                callers.add(path.name)
    assert callers == {"app.py"}
    users = {path.name for path in files if "tracked_run(" in path.read_text()} - {"app.py", "__init__.py"}
    assert {"speed.py", "runner.py", "train.py"} <= users
    assert benchmarks.is_dir() is ("speed.py" in users)
