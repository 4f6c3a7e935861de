"""The tests mirror the package, as vLLM's tests/v1/spec_decode/ mirrors its source: each folder of tests/ is a
package of specresearch (or the checkout's analysis/ or benchmarks/), and each test file names what it tests: a
module of its folder (benchmarks/: a script), the folder's package as a whole, or a topic listed here with why."""

from pathlib import Path

import specresearch
from tests.helpers import ROOT

PACKAGE = Path(specresearch.__file__).resolve().parent
TESTS = ROOT / "tests"
FOLDERS = {"analysis": ROOT / "analysis", "benchmarks": ROOT / "benchmarks"}  # the checkout's, beside the package's own
TOPICS = {  # tests that span their folder (or, at the top, the whole project) rather than one module of it
    "verifiers/test_lossless.py": "every drafter mode x lossless verifier: the law of what the engine emits",
    "evaluation/test_lm_eval_habits.py": "lm-eval's own conventions, kept by the evaluation package",
    "models/test_console.py": "what loading a model prints",
    "sweeps/test_mlflow_records.py": "what a run and a sweep leave in MLflow",
    "options/test_registry.py": "options.REGISTRY: an option registered where it is written",
    "test_config_check.py": "settings.check_config on composed configs",
    "test_docs.py": "the docs build and agree with the results",
    "test_faults.py": "a failing or interrupted run is recorded, not lost",
    "test_help.py": "--help of each command",
    "test_imports.py": "the floors of the house",
    "test_layout.py": "this file",
    "test_metrics_sampling.py": "metrics.py and sampling.py",
    "test_mutants.py": "tests/mutants.py stays armed",
    "test_startup.py": "what importing the package costs",
    "test_wheel.py": "the built wheel installs and runs",
}


def test_each_test_folder_is_a_package_of_the_source():
    folders = {p.name for p in TESTS.iterdir() if (p / "__init__.py").is_file()}
    assert folders, "no test folders found"
    sources = {name: FOLDERS.get(name, PACKAGE / name) for name in folders}
    assert all(path.is_dir() for path in sources.values()), {n: str(p) for n, p in sources.items() if not p.is_dir()}


def test_each_test_file_names_what_it_tests():
    unnamed = []
    for test in sorted(TESTS.rglob("test_*.py")):
        where = test.relative_to(TESTS)
        name = test.stem.removeprefix("test_")
        if len(where.parts) == 1:
            mirrored = (PACKAGE / f"{name}.py").is_file()
        else:
            folder = where.parts[0]
            source = FOLDERS.get(folder, PACKAGE / folder)
            mirrored = name == folder or (source / f"{name}.py").is_file()
        if not mirrored and where.as_posix() not in TOPICS:
            unnamed.append(where.as_posix())
    assert not unnamed, f"test files that name no module, script or listed topic: {unnamed}"
    stale = [t for t in TOPICS if not (TESTS / t).is_file()]
    assert not stale, f"topics listed for test files that are gone: {stale}"
