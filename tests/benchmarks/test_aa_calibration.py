"""benchmarks/aa_calibration.py: the A/A calibration of the battery, repeated, sized by auto N, with a lossy control,
and its results page."""

import json

import pytest

from tests.helpers import results_hook, script

pytestmark = pytest.mark.e2e  # runs benchmarks/aa_calibration.py as its users do


def test_aa_calibration_repeats_both_comparisons_and_writes_a_results_page(tmp_path):
    """benchmarks/aa_calibration.py: its core (`calibrate`) on 3 repeats of 30 samples a side, then its
    page: the verdict's and every test's rates with Clopper-Pearson intervals, KS p-values, a command
    without machine paths, and a page the docs hook renders."""
    import torch

    aa = script("benchmarks/aa_calibration.py")
    seen = []
    threads = torch.get_num_threads()
    try:  # one thread, as the script runs (two on a busy 2-core machine made its small calls 40-90x slower)
        torch.set_num_threads(1)
        result = aa.calibrate(3, 30, progress=lambda kind, r: seen.append((kind, r)))
        assert aa.main(["--repeats", "3", "--samples", "20", "--out", str(tmp_path / "aa.json")]) == 0  # as a user runs it
    finally:
        torch.set_num_threads(threads)
    assert seen == [("aa", 0), ("method", 0), ("aa", 1), ("method", 1), ("aa", 2), ("method", 2)]
    assert result["config"]["method"] == "pld(k=10) x rejection" and result["config"]["prompt_tokens"] > 100
    for side in ("aa", "method"):
        cal, tests = result[side]["calibration"], result[side]["tests"]
        assert cal["repeats"] == 3 and 0 <= cal["rate_ci_low"] <= cal["rate"] <= cal["rate_ci_high"] <= 1
        assert "surprisal_z" in tests and "position_8" in tests and all(0 <= t["p_uniform"] <= 1 for t in tests.values())
        assert all(len(ps) == 3 for ps in result[side]["pvalues"].values())
    assert result["aa"]["pvalues"]["surprisal_z"] != result["method"]["pvalues"]["surprisal_z"]
    data = json.loads((tmp_path / "aa.json").read_text())
    assert data["command"] == ["python benchmarks/aa_calibration.py --repeats 3 --samples 20 --out aa.json"]
    assert data["data"]["result"]["config"]["samples"] == 20 and "cores" in data["machine"] and str(tmp_path) not in json.dumps(data)
    page = results_hook().render(results_hook().load(tmp_path / "aa.json"), "aa.json")
    assert "| A/A (target vs target) | **Holm verdict** | " in page and "KS uniformity p" in page


def test_aa_calibration_sizes_auto_n_runs_aa_alone_and_measures_a_lossy_control(tmp_path, capsys):
    """benchmarks/aa_calibration.py's options: --samples auto sizes N once as stats.samples=auto would (for a
    position TV of 0.3 here, so N stays small) and --aa-only runs the A/A comparison alone; every test has its
    far-tail rate (raw p below alpha / m); --lossy runs margin 0.01 over a plain chain in the method's place,
    its exact first-position TV beside the power the battery states; bad values are refused naming the
    valid ones."""
    import torch

    from specresearch.stats import samples_for_tv

    aa = script("benchmarks/aa_calibration.py")
    seen = []
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        result = aa.calibrate(2, "auto", progress=lambda kind, r: seen.append((kind, r)), comparisons=["aa"], tv=0.3)
        out = tmp_path / "power.json"
        assert aa.main(["--repeats", "2", "--samples", "40", "--lossy", "verifier=margin verifier.margin=0.01", "--tv", "exact",
                        "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    sizing, n = result["auto"], result["config"]["samples"]
    assert seen == [("auto", n), ("aa", 0), ("aa", 1)] and "method" not in result and result["config"]["method"] is None
    assert sizing["n"] == n >= samples_for_tv(0.3, sizing["position_df"], 8) > 0 and result["config"]["samples_asked"] == "auto"
    s = result["aa"]
    assert s["family_size"] == 14 and s["tail_level"] == pytest.approx(0.01 / 14)
    assert all(t["tail_rejections"] <= t["rejections"] and t["tail_ci_low"] <= t["tail_rate"] <= t["tail_ci_high"] for t in s["tests"].values())
    assert s["calibration"]["versus_alpha"] == "contains alpha"  # 0 or 1 of 2: an interval that wide holds 0.01
    assert aa.versus_alpha(0.001, 0.009, 0.01) == "below alpha" and aa.versus_alpha(0.02, 0.05, 0.01) == "above alpha"

    data = json.loads(out.read_text())
    lossy = data["data"]["result"]
    assert data["command"] == ["python benchmarks/aa_calibration.py --repeats 2 --samples 40 --lossy 'verifier=margin verifier.margin=0.01' "
                               "--tv exact --out power.json"]
    assert lossy["config"]["comparisons"] == ["lossy"] and lossy["config"]["method"] == "independent(k=4) x margin"
    assert "drafter=plain_chain" in lossy["config"]["overrides"] and "aa" not in lossy
    tv1 = lossy["exact"]["tv"][0]
    assert tv1 > 0.1 and lossy["config"]["tv"] == pytest.approx(int(tv1 * 1000) / 1000)  # floored to 3 decimals
    stated = lossy["lossy"]["stated_power"]
    assert stated["exact_tv_position_1"] == tv1 and 0 < stated["position_1_power_min"] <= stated["position_1_power"] < 1
    page = results_hook().render(results_hook().load(out), "power.json")
    assert "| **Holm verdict** |" in page and "stated power at this N" in page and "far tail: raw p < alpha / 14" in page

    for argv, says in ((["--samples", "many"], "valid are an integer >= 10 (sequences per side) or auto"),
                       (["--tv", "2"], "valid are a number in (0, 1) or exact"),
                       (["--tv", "exact"], "valid only with --lossy"),
                       (["--aa-only", "--lossy", "verifier=margin"], "not allowed with argument")):
        with pytest.raises(SystemExit):
            aa.main([*argv, "--out", str(tmp_path / "x.json")])
        assert says in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv, says", [
    (["--method", "drafter=nope"], "error: --method 'drafter=nope': unknown drafter 'nope': valid are cross_vocab, eagle, independent,"),
    (["--lossy", "verifier=nope"], "error: --lossy 'verifier=nope': unknown verifier 'nope': valid are "),
    (["--out", "/proc/specresearch-x"],
     "error: cannot write the report /proc/specresearch-x (--out): cannot create a file in /proc (No such file or directory)"),
])
def test_a_bad_method_or_out_is_one_line_before_anything_runs(argv, says, tmp_path, monkeypatch, capsys):
    """An unknown option in --method or --lossy (a traceback from the engine's build) and an --out that cannot be
    written (a traceback after every repeat) are refused in one line, exit 2, before calibrate runs."""
    aa = script("benchmarks/aa_calibration.py")
    monkeypatch.setattr(aa, "calibrate", lambda *a, **k: pytest.fail("the repeats ran"))
    with pytest.raises(SystemExit) as exit_:
        aa.main(["--repeats", "2", "--out", str(tmp_path / "x.json"), *argv])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and line.startswith(says), line
    assert not any(tmp_path.iterdir())
