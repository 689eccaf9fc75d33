"""Smoke test of the benchmark harness on tiny sizes (no timing assertions)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np

from scanweaver.bench import harness
from scanweaver.bench.peers import Peer, Prepared, default_peers

_ORIGINAL_OPTIONS = harness.Options


def _wrong(inp: dict) -> Prepared:
    b = inp["b"]
    return Prepared(lambda: np.cumsum(b, axis=1), lambda h: h)  # ignores a: wrong


def _broken(inp: dict) -> Prepared:
    def run():
        raise RuntimeError("boom")

    return Prepared(run, lambda h: h)


def test_harness_writes_sane_json(tmp_path):
    cases = [harness.affine_case(16, 64), harness.affine_case(16, 128), harness.selective_case(1, 4, 4, 32, True)]
    wanted = {"scanweaver-cpu", "numpy-loop"}
    peers = [p for p in default_peers() if p.name in wanted]
    peers += [
        Peer("deliberately-wrong", "affine", _wrong),
        Peer("raises", "affine", _broken),
        Peer("needs-missing-lib", "affine", _wrong, requires=("no_such_module_xyz",)),
        Peer("needs-gpu", "selective", _wrong, gpu=True),
    ]
    options = harness.Options(policy=harness.TimingPolicy(min_reps=2, max_reps=3, budget_s=0.0),
                              roofline_bytes=1 << 20, settle_s=0.0, goals=False)
    lines: list[str] = []
    result = harness.run_benchmark(cases, peers, options, progress=lines.append)
    paths = harness.write_outputs(result, tmp_path, "smoke", progress=lines.append)

    data = json.loads(paths["json"].read_text())
    assert data["name"] == "smoke"
    assert {"machine", "versions", "stream_roofline", "cases", "speed_bar", "skipped_peers",
            "scanweaver_compile"} <= set(data)
    assert data["stream_roofline"]["gbs"] > 0
    assert data["versions"]["numpy"] == np.__version__
    assert "affine/needs-missing-lib" in data["skipped_peers"]
    assert len(data["cases"]) == 3
    first = data["cases"][0]
    assert first["workload"] == "affine" and first["params"] == {"channels": 16, "L": 64}
    assert first["min_bytes"] == 3 * 4 * 16 * 64
    res = first["results"]
    assert res["deliberately-wrong"]["status"] == "wrong"
    assert "median_s" not in res["deliberately-wrong"]  # a wrong result is not timed
    assert res["raises"]["status"] == "error" and "boom" in res["raises"]["reason"]
    for name in ("scanweaver-cpu", "numpy-loop"):
        r = res[name]
        assert r["status"] == "ok", r
        assert r["min_s"] <= r["median_s"] <= r["max_s"] and r["reps"] >= 2
        assert r["gbs"] > 0 and r["roofline_fraction"] > 0 and r["error"] < 1e-4
    assert set(first["ratios"]) == {"numpy-loop"}
    sel = data["cases"][2]
    assert sel["results"]["scanweaver-cpu"]["status"] == "ok"
    from scanweaver.bench.peers import gpu_available

    if gpu_available():  # the GPU peer runs, and its deliberately wrong result is caught
        assert sel["results"]["needs-gpu"]["status"] == "wrong"
    else:  # skipped with a reason, never timed
        assert "needs-gpu" not in sel["results"]
        assert data["skipped_peers"]["selective/needs-gpu"]
    readme = paths["readme"].read_text()
    assert "Do not edit by hand" in readme and "deliberately-wrong: max error" in readme
    assert "| 64 |" in readme
    if importlib.util.find_spec("matplotlib"):
        pngs = list(tmp_path.glob("results/*.png"))
        assert pngs and all(p.stat().st_size > 1000 for p in pngs)
        assert data["plots"]
    assert any("deliberately-wrong: wrong" in line for line in lines)


def test_main_parses_and_lists(tmp_path, monkeypatch):
    """`main` runs end to end with a restricted peer list on a stubbed grid."""
    monkeypatch.setattr(harness, "short_grid", lambda: [harness.affine_case(8, 32)])
    monkeypatch.setattr(harness, "Options", _quick_options)
    code = harness.main(["--out", str(tmp_path), "--name", "m", "--peers", "numpy-loop", "--only", "affine"])
    assert code == 0
    data = json.loads((tmp_path / "results" / "m.json").read_text())
    assert set(data["cases"][0]["results"]) == {"scanweaver-cpu", "numpy-loop"}


def _quick_options() -> harness.Options:
    return _ORIGINAL_OPTIONS(policy=harness.TimingPolicy(min_reps=1, max_reps=2, budget_s=0.0),
                           roofline_bytes=1 << 20, settle_s=0.0, goals=False)


def test_goal_shapes_and_dtypes_are_cases():
    cases = harness.shape_grid()
    labels = {c.label for c in cases}
    assert "affine shapes f32 16384x256" in labels and "affine shapes i32 1x16777216" in labels
    assert all(label in harness.SPEED_BAR for label in labels)
    inp = harness.make_inputs(harness.affine_case(3, 50, "int32", shape_grid=True))
    assert inp["a"].dtype == np.int32
    ref = harness.reference(harness.affine_case(3, 50, "int32", shape_grid=True), inp)
    h = np.zeros(3)
    for t in range(50):  # the reference is the sequential loop
        h = inp["a"][:, t] * h + inp["b"][:, t]
    assert np.array_equal(ref[:, -1], h)


def test_cpu_goals_render(tmp_path):
    """The goals section renders each measurement, and one that failed says so."""
    from scanweaver.bench import cpu_goals, plots

    tiny = cpu_goals.tiny_call((2, 8), inner=5, rounds=2)
    assert set(tiny["us_per_call"]) >= {"scanweaver linear_scan"} and all(v > 0 for v in tiny["us_per_call"].values())
    memory = cpu_goals._peak_extra(lambda: np.ones(1000))
    assert memory[1] == 8000 and memory[0] >= 8000
    result = {"cases": [], "cpu_goals": {
        "tiny_call": tiny,
        "neighbours": {"shape": [4, 4], "limits": {"scanweaver": 1.2, "neighbour": 1.1}, "rows": {
            "x": {"scanweaver_solo_s": 1e-3, "scanweaver_mixed_s": 2e-3, "neighbour_solo_s": 1e-3,
                  "neighbour_mixed_s": 1e-3, "scanweaver_slowdown": 2.0, "neighbour_slowdown": 1.0, "met": False}}},
        "first_call": {"error": "RuntimeError: no"},
    }}
    text = "\n".join(plots.goals_text(result))
    assert "| x | 1 | 2 | 2.00x |" in text and "**no**" in text
    assert "first_call: RuntimeError: no" in text


def test_too_slow_eager_peer_is_run_once():
    """A peer with nothing to compile whose checked run exceeds max_seconds is timed by
    that run alone (eager loops over long rows take minutes per run)."""
    calls = []

    def slow(inp: dict) -> Prepared:
        def run():
            calls.append(1)
            return harness._affine_reference(inp["a"].astype(np.float64), inp["b"].astype(np.float64))

        return Prepared(run, lambda h: h)

    case = harness.affine_case(4, 16)
    peers = [Peer("slow", "affine", slow, max_seconds=0.0)]
    options = harness.Options(policy=harness.TimingPolicy(min_reps=3, max_reps=3, budget_s=0.0),
                              roofline_bytes=1 << 20, settle_s=0.0, goals=False)
    result = harness.run_benchmark([case], peers, options, progress=lambda _: None)
    r = result["cases"][0]["results"]["slow"]
    assert r["status"] == "ok" and r["reps"] == 1 and len(calls) == 1


def test_speed_bar_says_by_how_much_and_why_a_goal_is_missed():
    """A missed goal gets its shortfall and a numbered reason; a met goal gets neither."""
    from scanweaver.bench import plots
    from scanweaver.bench.miss_reasons import reason_for, shortfall

    result = {"speed_bar": {
        "affine shapes f64 1024x4096": {"best_peer": {"target": 1.0, "measured": 0.6, "met": False}},
        "affine shapes f32 1024x4096": {"best_peer": {"target": 1.3, "measured": 1.4, "met": True}},
        "selective-grad x": {"backward_over_forward": {"target": 2.5, "measured": 3.0, "met": False}},
    }}
    text = "\n".join(plots._speed_bar_lines(result))
    assert "| affine shapes f64 1024x4096 | speed-up over the best peer | 1.0 | 0.60 | **no** | 40% | (1) |" in text
    assert "| affine shapes f32 1024x4096 | speed-up over the best peer | 1.3 | 1.40 | yes |  |  |" in text
    assert "| 2.5 | 3.00 | **no** | 20% | (2) |" in text
    assert "1. " + reason_for("best_peer", "affine shapes f64 1024x4096") in text
    assert "2. " + reason_for("backward_over_forward") in text
    assert reason_for("best_peer", "f64") != reason_for("best_peer", "f32")
    assert reason_for("no such goal") == "Not analysed yet."
    assert shortfall(3.99, 4.0, at_most=False) == "0.2%"


def test_a_roofline_fraction_beyond_what_memory_moves_is_invalid_not_met():
    """A run whose roofline measurement ran slow (a busy machine) reads fractions far
    above 1: the speed bar reports them as not measured, never as met."""
    from scanweaver.bench import harness, plots

    def case(fraction: float) -> dict:
        return {"label": "affine shapes f32 1024x4096",
                "results": {"scanweaver-cpu": {"status": "ok", "roofline_fraction": fraction}},
                "ratios": {}}

    bar = harness.speed_bar({"cases": [case(2.85)]})["affine shapes f32 1024x4096"]["roofline_fraction"]
    assert bar["met"] is None and "not measured" in bar["invalid"]
    text = "\n".join(plots._speed_bar_lines({"speed_bar": {"affine shapes f32 1024x4096": {"roofline_fraction": bar}}}))
    assert "| 0.85 | 2.85 | **invalid** |" in text
    ok = harness.speed_bar({"cases": [case(0.9)]})["affine shapes f32 1024x4096"]["roofline_fraction"]
    assert ok["met"] is True and "invalid" not in ok
