"""`math-exp-to-polynomial` is its own CPU stage (issue 9): `scan-to-cpu` marks the
math.exp / math.log1p ops of the recurrences it vectorises (`scanweaver.poly_exp`) and
the stage, run right after it with `marked_only`, expands only those; every other
math.exp (the sequential fallback, user code outside scans) keeps its libm call."""

from __future__ import annotations

from pathlib import Path

from scanweaver.compiler import lower
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.exp_polynomial import POLY_MARK, ExpToPolynomial
from scanweaver.rewrites.pipeline import stages_for
from scanweaver.rewrites.scan_to_cpu import ScanToCpu

REPO = Path(__file__).resolve().parents[1]
RECURRENCE = (REPO / "filecheck" / "cpu" / "recurrence.mlir").read_text()

# A math.exp outside any scan, and one in a scan.scan combine (the sequential lowering).
PLAIN_EXPS = """
func.func @f(%x: memref<4x8xf32>, %y: memref<4x8xf32>, %v: f32, %out: memref<f32>) {
  %e = math.exp %v : f32
  memref.store %e, %out[] : memref<f32>
  scan.scan ins(%x : memref<4x8xf32>) outs(%y : memref<4x8xf32>) axis 1 {
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    %t = math.exp %s : f32
    scan.yield %t : f32
  }
  func.return
}
"""


def _marked(text: str) -> int:
    return text.count(POLY_MARK)


def test_scan_to_cpu_marks_what_it_vectorises_and_the_stage_expands_it():
    module = parse_ir(RECURRENCE)
    ScanToCpu().apply(make_context(), module)
    after_cpu = print_ir(module)
    assert _marked(after_cpu) == after_cpu.count("math.exp") + after_cpu.count("math.log1p") >= 3
    ExpToPolynomial(marked_only=True).apply(make_context(), module)
    module.verify()
    after = print_ir(module)
    assert _marked(after) == 0 and "math.exp" not in after and "math.log1p" not in after


def test_the_cpu_pipeline_runs_the_stage_after_scan_to_cpu():
    names = [s.name for s in stages_for("cpu")]
    assert names.index("math-exp-to-polynomial") == names.index("scan-to-cpu") + 1
    stage = stages_for("cpu")[names.index("math-exp-to-polynomial")]
    assert stage.marked_only
    assert "math-exp-to-polynomial" not in [s.name for s in stages_for("gpu") + stages_for("loops")]
    out = lower(RECURRENCE, "cpu").text
    assert _marked(out) == 0 and "math.exp" not in out


def test_unmarked_exps_keep_libm():
    out = lower(PLAIN_EXPS, "cpu").text
    assert out.count("math.exp") == 2 and _marked(out) == 0
    module = parse_ir(PLAIN_EXPS)
    before = print_ir(module)
    ExpToPolynomial(marked_only=True).apply(make_context(), module)
    assert print_ir(module) == before
    ExpToPolynomial().apply(make_context(), module)  # run alone: every f32 exp
    assert "math.exp" not in print_ir(module)


def test_without_poly_exp_nothing_is_marked():
    module = parse_ir(RECURRENCE)
    ScanToCpu(poly_exp=False).apply(make_context(), module)
    text = print_ir(module)
    assert _marked(text) == 0 and "math.exp" in text
