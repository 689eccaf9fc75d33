"""scanweaver-raise diagnostics: one line per loop that carries state, raised or not.

Each refusal reason is pinned by one small loop (the whole line, location included);
the raised kinds are pinned by the forms of test_raise_forms.py; `scanweaver compile
-v` prints the same lines.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_raise import scalar_loop
from test_raise_forms import (
    FMA,
    LSE,
    POWF,
    dyn_channels,
    lfilter,
    masked,
    multilag,
    retnet,
    running,
)

from scanweaver.ir import parse_ir
from scanweaver.rewrites.raise_affine import raise_recurrences


def report_of(src: str, **kw) -> list[str]:
    report: list[str] = []
    raise_recurrences(parse_ir(src), report=report, **kw)
    return report


NOT_RAISED = "@f:scf.for#0: scanweaver-raise: loop not raised: "

# (update of scalar_loop, the reason); %h is the state, %x = x[i], %c = c[i], %k = 3.
REASONS = {
    "h_times_h": ("%hh = arith.mulf %h, %h : f32\n %hn = arith.addf %hh, %x : f32",
                  "the state is multiplied by a state-dependent value (arith.mulf h*h)"),
    "fma_h_h": ("%hn = math.fma %h, %h, %x : f32",
                "the state is multiplied by a state-dependent value (math.fma h*h)"),
    "divisor": ("%hn = arith.divf %x, %h : f32",
                "the state is used as a divisor (arith.divf by a state-dependent value)"),
    "select_cond": ("%z = arith.constant 0.0 : f32\n %p = arith.cmpf ogt, %h, %z : f32\n"
                    " %hn = arith.select %p, %x, %h : f32",
                    "the state is used in a condition (arith.cmpf)"),
    "exp": ("%e = math.exp %h : f32\n %hn = arith.addf %e, %x : f32",
            "the state flows into math.exp (non-affine)"),
    "index": ("%fi = arith.fptosi %h : f32 to i32\n %ii = arith.index_cast %fi : i32 to index\n"
              " %v = memref.load %xs[%ii] : memref<6xf32>\n %hn = arith.addf %v, %h : f32",
              "the state is converted by arith.fptosi (mixed precision is not supported)"),
    "widen": ("%w = arith.extf %h : f32 to f64\n %w2 = arith.truncf %w : f64 to f32\n"
              " %hn = arith.addf %w2, %x : f32",
              "the state is converted by arith.extf (mixed precision is not supported)"),
    "call": ("%hn = func.call @g(%h) : (f32) -> f32",
             "the loop body calls @g"),
    "written_coefficient": (
        "%ah = arith.mulf %c, %h : f32\n %hn = arith.addf %ah, %x : f32\n"
        " memref.store %x, %cs[%i] : memref<6xf32>",
        "a coefficient reads a memref that the loop writes"),
    "maxnumf": ("%hn = arith.maxnumf %h, %x : f32",
                "arith.maxnumf is associative but not exactly (llvm.maxnum/minnum may return "
                "either zero for -0 and +0); use arith.maximumf / arith.minimumf"),
    "state_in_if_without_else": (
        "%z = arith.constant 0.0 : f32\n %p = arith.cmpf ogt, %x, %z : f32\n"
        " scf.if %p {\n %q = arith.addf %h, %x : f32\n memref.store %q, %xs[%i] : memref<6xf32>\n }\n"
        " %hn = arith.addf %h, %x : f32",
        "the state is used inside a nested region of scf.if"),
    "state_if_condition": (
        "%z = arith.constant 0.0 : f32\n %p = arith.cmpf ogt, %x, %z : f32\n"
        " %hn = scf.if %p -> (f32) {\n %e = math.exp %h : f32\n scf.yield %e : f32\n"
        " } else {\n scf.yield %h : f32\n }",
        "the state flows into math.exp (non-affine)"),
}


@pytest.mark.parametrize("name", sorted(REASONS))
def test_each_refusal_reason_is_one_line_with_the_location(name):
    update, reason = REASONS[name]
    src = scalar_loop(update)
    if "@g" in update:
        src += "func.func private @g(f32) -> f32\n"
    assert report_of(src) == [NOT_RAISED + reason]


def test_int_division_and_low_precision_reasons():
    src = scalar_loop("%hn = arith.divsi %h, %x : i32", el="i32")
    assert report_of(src) == [NOT_RAISED + "integer division of the state is not affine (arith.divsi)"]
    src = scalar_loop("%hn = arith.addf %h, %x : f16", el="f16")
    assert report_of(src) == [NOT_RAISED + (
        "carried value #0 is f16: a low-precision state is rounded to f16 after every step, "
        "and the scan ops carry f32, f64, i32 or i64 state; widening it would change the "
        "results, so it is not raised")]


def test_memref_state_reasons():
    twice = dyn_channels().replace(
        "memref.store %hn, %y[%t, %c] : memref<?x?xf32>",
        "memref.store %hn, %y[%t, %c] : memref<?x?xf32>\n      memref.store %xv, %h[%c] : memref<?xf32>")
    # h[c] stored twice (the second store wins): raised once both reshapes apply.
    assert report_of(twice) == [
        "@ema:scf.for#0: scanweaver-raise: loop raised to scan.linear_recurrence (1 coupled "
        "carried value(s) and 1 escaping value(s) as extra state), after moving the channel "
        "loop outside the time loop and carrying the state in memory as iter_args"]
    # Two elements at run-time indices may be one: no reshape, the first reason.
    at_k = """
func.func @zk(%x: memref<8xf32>, %z: memref<4xf32>, %k: index, %k1: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scf.for %t = %c0 to %c8 step %c1 {
    %xv = memref.load %x[%t] : memref<8xf32>
    %s1 = memref.load %z[%k] : memref<4xf32>
    %s2 = memref.load %z[%k1] : memref<4xf32>
    %a = arith.addf %s2, %xv : f32
    memref.store %a, %z[%k] : memref<4xf32>
    memref.store %s1, %z[%k1] : memref<4xf32>
  }
  func.return
}
"""
    assert report_of(at_k) == [
        "@zk:scf.for#0: scanweaver-raise: loop not raised: several memref locations carry state "
        "(only one state memref per loop is supported; carry coupled state as iter_args)"]
    inner = dyn_channels("").replace(
        "scf.for %c = %c0 to %nc", "%nc = arith.addi %t, %c1 : index\n    scf.for %c = %c0 to %nc")
    assert report_of(inner)[0] == (
        "@ema:scf.for#0: scanweaver-raise: loop not raised: the channel count is computed inside "
        "the time loop (it must be loop-invariant, e.g. a memref.dim before the loop)")
    lag9 = report_of(multilag(lags=(1, 9)))
    assert lag9 == ["@iir:scf.for#0: scanweaver-raise: loop not raised: the state is loaded at t-9 "
                    "but the previous step stored t-1 (the shift must be 1 to 8 loop steps)"]


def test_logsumexp_reason_without_reassociation():
    assert report_of(LSE) == [
        "@lse:scf.for#0: scanweaver-raise: loop not raised: an online log-sum-exp pair is "
        "associative, but its combine sums floats: raised to scan.scan only with "
        "reassociate=true (see the README's numerics)"]


RAISED = {
    "dynamic channels": (dyn_channels(), "@ema:scf.for#0", "scan.recurrence (1-d channel state, "
                         "dynamic channel count, the memref itself)"),
    "multi-lag": (multilag(), "@iir:scf.for#0",
                  "scan.linear_recurrence (a 3-lag recurrence on its companion state)"),
    "lfilter": (lfilter(), "@lfilter:scf.for#0", "scan.linear_recurrence (2 coupled carried "
                "value(s) and 1 escaping value(s) as extra state)"),
    "masked": (masked(), "@masked:scf.for#0", "scan.recurrence (one carried value)"),
    "fma": (FMA, "@fma:scf.for#0", "scan.recurrence (one carried value)"),
    "powf": (POWF, "@decay:scf.for#0", "scan.recurrence (one carried value)"),
    "2-d state": (retnet(), "@retnet:scf.for#0",
                  "scan.recurrence (2-d channel state, the memref itself)"),
    "running max": (running("arith.maximumf", "f32"), "@run:scf.for#0",
                    "scan.scan (associative arith.maximumf)"),
}


@pytest.mark.parametrize("name", sorted(RAISED))
def test_each_raised_form_is_one_line_saying_what_it_became(name):
    src, label, what = RAISED[name]
    assert report_of(src) == [f"{label}: scanweaver-raise: loop raised to {what}"]


def test_diagnose_pass_option_and_compile_verbose_print_the_report(tmp_path):
    src = retnet().replace("%gs = arith.mulf %gamma, %s", "%gs = arith.mulf %s, %s")
    want = report_of(src)
    assert len(want) == 2  # the time loop (S*S) and the readout reduction
    f = tmp_path / "in.mlir"
    f.write_text(src)
    bindir = __import__("os").path.dirname(sys.executable)
    r = subprocess.run([f"{bindir}/xdsl-opt", str(f), "-p", "scanweaver-raise{diagnose=true}"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr.splitlines() == want
    r = subprocess.run([sys.executable, "-m", "scanweaver.cli", "compile", str(f), "--target", "mlir",
                        "--lower-for", "loops", "-o", str(tmp_path / "out.mlir"), "-v"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "scanweaver-raise:" in x]
    assert lines == want


def test_memref_state_updated_under_scf_if_reasons():
    src = """
func.func @f(%x: memref<6xf32>, %m: memref<6xi32>, %h: memref<f32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c6 = arith.constant 6 : index
  %z = arith.constant 0 : i32
  scf.for %t = %c0 to %c6 step %c1 {
    %mv = memref.load %m[%t] : memref<6xi32>
    %p = arith.cmpi ne, %mv, %z : i32
    %hv = memref.load %h[] : memref<f32>
    scf.if %p {
      %xv = memref.load %x[%t] : memref<6xf32>
      %hn = arith.addf %hv, %xv : f32
      memref.store %hn, %h[] : memref<f32>
    } else {
      %hn = arith.subf %hv, %hv : f32
      memref.store %hn, %h[] : memref<f32>
    }
  }
  func.return
}
"""
    # An else branch that writes the state too: not searched for state, said so.
    assert report_of(src) == [NOT_RAISED + (
        "the state in memory is updated under scf.if, but not as `if m { load; store }` (an "
        "else branch, or the state loaded outside the scf.if): carry the state as an iter_arg, "
        "or select the new value with arith.select / an scf.if yielding it")]
    # Without the else branch, but the state loaded before the scf.if.
    no_else = src[: src.index("    } else {")] + "    }\n  }\n  func.return\n}\n"
    assert report_of(no_else) == report_of(src)
    # Loaded inside: raised (test_raise_forms.py); the state read in the condition is not.
    inside = no_else.replace("    %hv = memref.load %h[] : memref<f32>\n    scf.if %p {",
                             "    scf.if %p {\n      %hv = memref.load %h[] : memref<f32>")
    # The state read in the condition.
    assert report_of(inside)[0].endswith("loop raised to scan.recurrence (state at one memref location)")
    cond = inside.replace("%p = arith.cmpi ne, %mv, %z : i32",
                          "%h1 = memref.load %h[] : memref<f32>\n    %zf = arith.constant 0.0 : f32\n"
                          "    %p = arith.cmpf ogt, %h1, %zf : f32")
    assert report_of(cond) == [NOT_RAISED + "the state is used in a condition (scf.if)"]
