"""The package's imports go one way, down the floors of the design card (shells, runs, build, core,
services, ground): no module imports a module of a floor above its own, and none imports, directly or
through others, a module that imports it back. Every import counts, also those inside functions
(imported late to keep `--help` fast, they still bind the two modules together), and importing
`a.b.c` runs the packages `a.b` above it. The root package is the exception: it only names the
Python API, lazily (its `__getattr__`)."""

from __future__ import annotations

import ast
from pathlib import Path

import specresearch

ROOT = Path(specresearch.__file__).resolve().parent
PACKAGE = "specresearch"
# Folders of the top level and the dotted names their modules have (pyproject's package-dir): the
# analysis is imported as specresearch.analysis; a study's analysis.py is loaded from its file.
TOP = {ROOT: PACKAGE, ROOT.parent / "analysis": "specresearch.analysis", ROOT.parent / "experiments": "experiments"}

# The floors, top to bottom (the design card's): a module may import modules of its own floor (the
# cycle test keeps those apart) and of the floors below. A module's floor is its longest prefix here.
FLOORS = {
    "shells": ["specresearch.__main__", "specresearch.cli", "specresearch.train.__main__", "specresearch.analysis",
               "experiments"],
    "runs": ["specresearch.measure", "specresearch.train", "specresearch.evaluation", "specresearch.stats",
             "specresearch.sweeps"],
    "build": ["specresearch.build"],
    # The config layer: a composed config checked (OmegaConf), the run's config, the results format; above the core,
    # which takes the settings dataclasses themselves (specresearch.options) and never a config.
    "config": ["specresearch.settings", "specresearch.config", "specresearch.reports"],
    "core": ["specresearch.engine", "specresearch.kv", "specresearch.drafters", "specresearch.verifiers"],
    "services": ["specresearch.models", "specresearch.stores", "specresearch.attention", "specresearch.data", "specresearch.vocab", "specresearch.tracking",
                 "specresearch.records", "specresearch.figures", "specresearch.assets"],
    "ground": ["specresearch.types", "specresearch.metrics", "specresearch.sampling", "specresearch.seeding", "specresearch.errors", "specresearch.interrupts",
               "specresearch.options"],
}
CORE = "core"
CONFIG_LIBRARIES = ("omegaconf", "hydra")  # what the core never runs, directly or through the modules it imports


def modules() -> dict[str, Path]:
    """Every module of the package, the analysis and the studies: dotted name -> file."""
    found = {}
    for folder, package in TOP.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def floor(module: str) -> int:
    """The floor of a module, counted from the top (0 = shells)."""
    prefixes = [(len(p), i) for i, names in enumerate(FLOORS.values()) for p in names
                if module == p or module.startswith(p + ".")]
    assert prefixes, f"{module} has no floor: add it to FLOORS"
    return max(prefixes)[1]


def libraries(path: Path) -> set[str]:
    """The top-level names of what module `path` imports from outside the package (absolute imports), anywhere in its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out - {PACKAGE}


def config_leaks(g: dict[str, set[str]], uses: dict[str, set[str]]) -> list[str]:
    """Each path by which a core module reaches a config library (CONFIG_LIBRARIES): "a -> b -> omegaconf"."""
    leaks = []
    for start in sorted(m for m in g if m != PACKAGE and list(FLOORS)[floor(m)] == CORE):
        seen, todo = {start: [start]}, [start]
        while todo:
            module = todo.pop()
            leaks += [" -> ".join([*seen[module], lib]) for lib in sorted(uses.get(module, set()) & set(CONFIG_LIBRARIES))]
            for nxt in sorted(g[module] - {PACKAGE}):
                if nxt not in seen:
                    seen[nxt] = [*seen[module], nxt]
                    todo.append(nxt)
    return leaks


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


def test_no_import_runs_up_a_floor():
    upward = sorted(f"{a} ({list(FLOORS)[floor(a)]}) imports {b} ({list(FLOORS)[floor(b)]})"
                    for a, targets in graph().items() if a != PACKAGE for b in targets - {PACKAGE} if floor(b) < floor(a))
    assert not upward, "imports that run up a floor:\n" + "\n".join(upward)


def test_the_core_runs_no_config_library():
    """No module of the core imports OmegaConf or Hydra, nor any module it imports does (the floors keep the
    settings check, the run's config and the results format above it)."""
    leaks = config_leaks(graph(), {name: libraries(path) for name, path in modules().items()})
    assert not leaks, "the core reaches a config library:\n" + "\n".join(leaks)


def test_the_config_tests_can_fail():
    """A core file that imports OmegaConf, or the settings check, or the reports, is refused."""
    g = graph()
    uses = {name: libraries(path) for name, path in modules().items()}
    assert config_leaks(g, {**uses, "specresearch.verifiers.base": uses["specresearch.verifiers.base"] | {"omegaconf"}})
    assert config_leaks({**g, "specresearch.models.loading": g["specresearch.models.loading"] | {"specresearch.tracking"}},
                        {**uses, "specresearch.tracking": {"omegaconf"}})  # through a service
    for above in ("specresearch.settings", "specresearch.reports", "specresearch.config"):
        assert floor(above) < floor("specresearch.engine") < floor("specresearch.options")


def test_every_module_has_a_floor_and_the_floor_test_can_fail():
    g = graph()
    assert {list(FLOORS)[floor(m)] for m in g if m != PACKAGE} == set(FLOORS)
    assert floor("specresearch.train.__main__") < floor("specresearch.train") < floor("specresearch.build") \
        < floor("specresearch.engine") < floor("specresearch.tracking") < floor("specresearch.types")
    assert floor("specresearch.records") > floor("specresearch.cli")  # so records importing cli would be refused


def test_the_walk_sees_imports_inside_functions_and_cycles():
    """The checker itself: a function-level import is an edge, and a cycle through one is found."""
    g = graph()
    assert "specresearch.evaluation.runner" in g["specresearch.__main__"]  # imported inside `work`
    assert "specresearch.engine" in g["specresearch.build"]  # inside build_engine
    assert "specresearch.drafters" in g["specresearch.engine"]  # the package above drafters.base runs too
    assert cycle({**g, "specresearch.records": g["specresearch.records"] | {"specresearch.tracking"}}) is not None
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_root_package_imports_nothing_when_imported():
    """`import specresearch` is cheap and binds nothing: the API is resolved on first use."""
    tree = ast.parse((ROOT / "__init__.py").read_text())
    assert not [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) and node.module != "__future__"]


def test_every_entry_point_opens_its_run_through_tracked_run():
    """Speed, eval, training and the benchmark open and end runs only through tracking.tracked_run
    (FINISHED, or FAILED with what was measured): no other module starts or ends a tracker's run."""
    benchmarks = ROOT.parent / "benchmarks"
    files = [*modules().values(), *(sorted(benchmarks.glob("*.py")) if benchmarks.is_dir() else [])]
    callers = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("start", "end") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "tracker":
                callers.add(path.name)
    assert callers == {"tracking.py"}
    users = {f"{path.parent.name}/{path.name}" for path in files if "tracked_run(" in path.read_text()} - {"specresearch/tracking.py", "specresearch/__init__.py"}
    assert {"measure/runner.py", "evaluation/runner.py", "train/__init__.py"} <= users
    assert benchmarks.is_dir() is ("benchmarks/speed.py" in users)


def test_every_library_the_package_imports_is_declared():
    """A module the package or its analysis imports from outside the standard library comes from a distribution
    pyproject.toml declares (a dependency, or an extra): none arrives only because another library happens to pull it in."""
    import importlib.metadata
    import re
    import sys

    import tomllib

    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    declared = {re.split(r"[<>=!~\[; ]", d)[0].lower().replace("_", "-") for d in wanted}
    providers = importlib.metadata.packages_distributions()
    undeclared = set()
    for folder in TOP:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - {PACKAGE, "experiments", "__future__"}:
                    if not {d.lower().replace("_", "-") for d in providers.get(top, [])} & declared:
                        undeclared.add(f"{top} ({path.relative_to(ROOT.parent)})")
    assert not undeclared, sorted(undeclared)
