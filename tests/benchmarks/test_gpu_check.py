"""benchmarks/gpu_check.py, the GPU check anyone can run, keeps working: its --dry run (the same code
paths on the CPU, tiny shapes) covers every drafter x verifier of conf/ identical to plain decoding at
T = 0, every lossless verifier at T = 1, every drafting mode, and times every speed method; and its
YAML reader (no Hydra on the GPU machines) composes every option as Hydra does."""

import json
import subprocess
import sys

import pytest
from hydra.utils import get_class
from omegaconf import OmegaConf

from specresearch import reports
from specresearch.config import CONF_DIR, compose
from tests.helpers import ROOT, made_once, results_hook, script

pytestmark = pytest.mark.e2e  # runs benchmarks/gpu_check.py --dry

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def gpu_check():
    """benchmarks/gpu_check.py, imported (a script, not a module of the package)."""
    return script("benchmarks/gpu_check.py")


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def _dry_run(folder):
    out = folder / "x.json"
    result = subprocess.run([sys.executable, str(SCRIPT), "--dry", "--out", str(out)], capture_output=True, text=True,
                            cwd=folder, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"wrote {out}" in result.stdout


@pytest.fixture(scope="session")
def report(tmp_path_factory):
    """The --dry run's report, made once for the whole run (its workers share it: helpers.made_once)."""
    return reports.raw(json.loads((made_once(tmp_path_factory, "gpu_check", _dry_run) / "x.json").read_text()))


def test_the_report_records_versions_device_and_settings(report):
    assert report["dry"] is True and report["device"]["type"] == "cpu" and report["device"]["name"]
    for key in ("python", "torch", "transformers", "specresearch"):
        assert report["versions"][key], key
    assert report["settings"]["tokens"] == 16 and report["settings"]["prompt_tokens"] == 228


def test_every_drafter_x_verifier_equals_plain_decoding_at_t0(report):
    m = report["matrix"]
    assert m["status"] == "ok" and m["device"] == "cpu"
    drafters, verifiers = _options("drafter"), _options("verifier")
    assert m["drafters"] == drafters and m["verifiers"] == verifiers and len(drafters) >= 8
    assert set(m["t0"]) == set(drafters)
    for d in drafters:
        assert set(m["t0"][d]) == set(verifiers), d
        for v, c in m["t0"][d].items():
            assert c["status"] == "ok" and c["identical"] == c["of"] == m["prompts"] == 2, (d, v, c)
    assert all(m["baseline_equals_generate"])  # our plain decoding is transformers' greedy generate
    summary = m["summary"]
    assert summary["ok"] and summary["t0_identical"] == summary["t0_cells"] == len(drafters) * len(verifiers)


def test_every_drafter_samples_with_every_lossless_verifier_and_runs_every_mode(report):
    m = report["matrix"]
    assert m["t1_verifiers"] == ["rejection"]  # greedy verification refuses T = 1; the relaxed rules are lossy
    for d in m["drafters"]:
        assert set(m["t1"][d]) == set(m["t1_verifiers"])
        assert all(c["status"] == "ok" and c["all_tokens"] and c["tau"] >= 1 for c in m["t1"][d].values()), d
        cls = get_class(OmegaConf.load(CONF_DIR / "drafter" / f"{d}.yaml")._target_)
        other = [mode for mode, overrides in cls.modes.items() if overrides]
        assert list(m["modes"][d]) == other, d
        for mode, c in m["modes"][d].items():  # on the CPU every mode runs: int8 drafts are refused on CUDA only
            assert c["status"] == "ok", (d, mode, c)
            if "sampling" in c:  # a mode for T > 0 (children=sample): refused at T = 0, run at T = 1
                assert "children=sample" in c["overrides"] and c["all_tokens"]
            else:
                assert c["identical"] == c["of"], (d, mode, c)
    assert any("sampling" in c for row in m["modes"].values() for c in row.values())


def test_the_speed_section_times_every_method(report):
    s = report["speed"]
    assert s["status"] == "ok" and not s["failed"]
    names = [r["method"] for r in s["rows"]]
    assert names[:4] == ["generate", "generate_compiled", "baseline", "baseline_compiled"]
    assert [gpu_check().short(n) for n in names[4:]] == ["pld", "medusa", "independent", "pld_compiled"]
    assert [r["compiled"] for r in s["rows"]] == [False, True, False, True, False, False, False, True]  # the rows say it
    for r in s["rows"]:
        assert r["tokens_per_s"] > 0 and len(r["warmup_seconds"]) == 2, r
        assert r["identical_to_generate"], r["method"]  # fp32: every plain and speculative greedy decoding is generate's
    ours = {r["method"]: r for r in s["rows"][2:]}
    for name, r in ours.items():
        assert r["tau"] >= 1 and r["v"] > 0 and abs(sum(r["time_split"].values()) - 1) < 1e-6, name
    independent = next(r for n, r in ours.items() if n.startswith("independent"))
    assert independent["c"] > 0 and independent["draft_forwards"] > 0
    assert len(s["v_curve"]) == 17 and s["v_curve"][0] == 1 and min(s["v_curve"]) > 0
    assert s["c_draft"] > 0 and s["prompt_tokens"] == 228 and s["new_tokens"] == 16


def test_the_report_becomes_a_results_page(report, tmp_path):
    """A report dropped into docs/results/data/ renders (docs/hooks/results.py): a row per timed method with
    its ratios, the device and versions as the machine, the command, the matrix's summary among the notes."""
    hook = results_hook()
    gpu_check().write(report, path := tmp_path / "gpu.json")  # as the script writes it
    page = hook.load(path)
    assert [row[0] for row in page["rows"]] == [r["method"] for r in report["speed"]["rows"]]
    assert all(len(row) == len(page["columns"]) for row in page["rows"])
    by_name = {row[0]: dict(zip(page["columns"], row)) for row in page["rows"]}
    assert by_name["generate"]["vs generate"] == "1.00x" and by_name["baseline"]["vs our baseline"] == "1.00x"
    assert by_name["baseline_compiled"]["vs our baseline"] == "1.00x"  # a compiled method against the compiled baseline
    assert report["device"]["name"] in page["machine"] and report["versions"]["torch"] in page["machine"]
    assert page["command"][0].startswith("python benchmarks/gpu_check.py --dry")
    summary = report["matrix"]["summary"]
    matrix = [note for note in page["notes"] if note.startswith("Matrix on cpu")]
    assert len(matrix) == 1 and f"T = 0 {summary['t0_identical']}/{summary['t0_cells']}" in matrix[0]
    assert "| method | tok/s |" in hook.render(page, path.name)
    assert str(ROOT) not in path.read_text() and report["versions"]["specresearch_from"] == "specresearch"  # no host folder


@pytest.mark.parametrize("group", ["drafter", "verifier"])
def test_the_yaml_reader_composes_every_option_as_hydra_does(group):
    g = gpu_check()
    model = g.node("model", "tiny")
    for name in _options(group):
        hydra = OmegaConf.to_container(compose(["model=tiny", f"{group}={name}"])[group], resolve=True)
        assert g.node(group, name, model) == hydra, name
    if group == "drafter":  # overrides: a changed setting, a new nested key (Hydra's +key)
        overrides = ["branching=null", *g.TINY_DRAFT]
        hydra = compose(["model=tiny", "drafter=tree", *(f"drafter.{o}" for o in overrides[:2]), f"+drafter.{overrides[2]}"])
        assert g.node("drafter", "tree", model, overrides) == OmegaConf.to_container(hydra.drafter, resolve=True)


def test_the_yaml_reader_refuses_an_interpolation_it_cannot_fill(tmp_path, monkeypatch):
    g = gpu_check()
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "odd.yaml").write_text("_target_: x.Y\nseed: ${seed}\n")
    monkeypatch.setattr(g, "CONF", tmp_path)
    with pytest.raises(ValueError, match=r"drafter/odd.yaml: .*\$\{seed\}"):
        g.node("drafter", "odd", {"dtype": "auto"})


def test_the_check_fails_on_a_cell_that_differs_and_passes_a_refused_mode():
    g = gpu_check()
    ok = {"status": "ok", "identical": 2, "of": 2}
    matrix = {"t0": {"pld": {"greedy": dict(ok)}}, "t1": {"pld": {"rejection": {"status": "ok", "all_tokens": True}}},
              "modes": {"tree": {"int8": {"status": "refused", "error": "SpecResearchError: CPU only"}}},
              "baseline_equals_generate": [True, True]}
    assert g.matrix_summary(matrix)["ok"]
    matrix["t0"]["pld"]["greedy"]["identical"] = 1
    assert not g.matrix_summary(matrix)["ok"]
    matrix["t0"]["pld"]["greedy"]["identical"] = 2
    matrix["modes"]["tree"]["int8"]["status"] = "error"
    assert not g.matrix_summary(matrix)["ok"]


@pytest.mark.parametrize("args, error", [
    (["--tokens", "0"], "argument --tokens: must be >= 1, got 0"),
    (["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    (["--tokens", "-5"], "argument --tokens: must be >= 1, got -5"),
    (["--k", "x"], "argument --k: not a number: 'x'"),
    (["--only", "nope"], "--only: unknown method 'nope': valid are generate, generate_compiled, baseline"),
    (["--out", "/proc/x"], "--out /proc/x: cannot write the report there"),
    (["--out", "{tmp}"], "--out {tmp}: cannot write the report there"),
    (["--out", "{tmp}/file/x.json"], "--out {tmp}/file/x.json: cannot write the report there"),
    (["--only", "generate,"], "--only: unknown method '': valid are generate"),
    (["--budget", "nan"], "argument --budget: must be >= 0.0, got nan"),
    (["--prompt-tokens", "0"], "argument --prompt-tokens: must be >= 1, got 0"),
    (["--skip", "matrix", "--skip", "speed"], "--skip matrix --skip speed leaves nothing to check"),
])
def test_bad_arguments_are_refused_before_any_work(args, error, tmp_path):
    """0 is not silently a default, a negative does not fail inside the run, an unknown --only does not time nothing and
    exit 0, an unwritable --out (in /proc, a folder, under a file) does not fail after the work: each is argparse's one
    error line, exit 2, and nothing is written."""
    (tmp_path / "file").write_text("")
    script = ROOT / "benchmarks" / "gpu_check.py"
    args = [a.format(tmp=tmp_path) for a in args]
    result = subprocess.run([sys.executable, str(script), "--dry", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"gpu_check.py: error: {error.format(tmp=tmp_path)}"), result.stderr
    assert result.stdout == ""  # no section started
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # no report, no probe left behind
