"""The harness's first-call breakdown (bench/cpu_goals.py): stages of profiled functions,
a real cold process's breakdown, and its table and reason in the README text."""

from __future__ import annotations

from scanweaver.bench import cpu_goals, plots
from scanweaver.bench.miss_reasons import first_call_cold_reason, reason_for


def test_stages_of_profiled_functions():
    stage = cpu_goals.first_call_stage
    assert stage("~", "<built-in method builtins.compile>").startswith("compiling Python")
    assert stage("/v/site-packages/xdsl/ir/core.py", "walk").startswith("xDSL")
    assert stage("/v/site-packages/llvmlite/binding/ffi.py", "__call__").startswith("LLVM")
    assert stage("~", "<method 'poll' of 'select.poll' objects>").startswith("waiting for subprocesses")
    assert stage("/w/scanweaver/runtime/cpu_jit.py", "kernel").startswith("ScanWeaver")
    assert stage("<frozen importlib._bootstrap>", "_find_and_load").startswith("the import machinery")
    assert stage("/usr/lib/python3.11/json/decoder.py", "decode").startswith("other")


def test_a_cold_selective_first_call_breakdown():
    """A real cold process (no first tier for the selective scan: it builds the full
    kernel, so xDSL and llvmlite are loaded and both take time)."""
    row = cpu_goals._breakdown_process("selective_scan")
    assert "error" not in row, row
    stages = row["stages_s"]
    assert abs(sum(stages.values()) - row["profiled_s"]) < 1e-9
    assert row["packages"] == ["llvmlite", "xdsl"]
    assert stages["xDSL (its import, IR building, passes, printing)"] > 0
    assert stages["compiling Python sources to bytecode"] > 0


def test_the_breakdown_renders_with_its_reason():
    breakdown = {"linear_scan": {"stages_s": {"compiling Python sources to bytecode": 0.3, "other (x)": 0.1},
                                 "profiled_s": 0.4, "packages": ["llvmlite"]},
                 "selective_scan": {"error": ["RuntimeError: no"]}}
    result = {"cases": [], "cpu_goals": {"first_call": {"targets_s": {"cold": 1.0, "warm": 0.05}, "rows": {
        "linear_scan": {"cold": {"import_numpy_s": 0.1, "import_scanweaver_s": 0.01, "first_call_s": 1.5,
                                 "total_s": 1.6, "process_wall_s": 2.0}}}, "breakdown": breakdown}}}
    text = "\n".join(plots.goals_text(result))
    assert "| linear_scan | compiling Python sources to bytecode | 0.300 | 75% |" in text
    assert "| linear_scan | total (packages loaded: llvmlite) | 0.400 | 100% |" in text
    reason = first_call_cold_reason(breakdown)
    assert reason.startswith(reason_for("first_call_cold"))
    assert "linear_scan: compiling Python sources to bytecode 75%, other (x) 25% (packages loaded: llvmlite)" in reason
    assert "Why (cold): " + reason in text
