"""scanweaver-raise: analysis decisions, IR shapes, and semantics preservation.

Golden checks interpret the original loops and the raised IR on the same inputs with
the xDSL interpreter oracle and compare every output (bit for bit for integers and for
the plain `a*h + b` forms, ~1e-5 relative otherwise).
"""

from __future__ import annotations

import io
import re
from contextlib import redirect_stderr

import numpy as np
import pytest
from xdsl.dialects import scf

import scanweaver.interp.run as run_mod
from scanweaver.dialects.scan import RecurrenceOp
from scanweaver.dialects.scan import LinearRecurrenceOp
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.raise_affine import (
    RaiseRecurrences,
    analyze_loop,
    raise_recurrences,
)
from scanweaver.workloads import loops

# ---------------------------------------------------------------------------
# Helpers shared with the other raise / workload test modules
# ---------------------------------------------------------------------------

def module_of(src):
    return parse_ir(src) if isinstance(src, str) else parse_ir(print_ir(src))


def raised(src):
    """(original module, raised module, raised ops): the original is left untouched."""
    module = module_of(src)
    original = parse_ir(print_ir(module))
    ops, _ = raise_recurrences(module)
    module.verify()
    return original, module, ops


def run_both(original, raised_module, fname, args):
    a1 = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
    a2 = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
    r1 = run_mod.run_function(original, fname, *a1)
    r2 = run_mod.run_function(raised_module, fname, *a2)
    return (a1, r1), (a2, r2)


def assert_same(x, y, exact):
    x, y = np.asarray(x), np.asarray(y)
    if exact:
        np.testing.assert_array_equal(x, y)
    else:
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def golden(src, fname, args, *, exact=False, expect=None):
    """Raise `src`, interpret both versions on `args`, assert identical outputs."""
    original, module, ops = raised(src)
    if expect is not None:
        assert [op.name for op in ops] == expect
    (a1, r1), (a2, r2) = run_both(original, module, fname, args)
    for x, y in zip(a1 + list(r1), a2 + list(r2)):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert_same(x, y, exact)
        else:
            same_nan = x != x and y != y  # NaN results agree with each other
            assert (x == y or same_nan) if exact else np.isclose(x, y, rtol=1e-5, atol=1e-6)
    return module, a2, r2


def first_loop(module):
    return next(op for op in module.walk() if isinstance(op, scf.ForOp))


def loop_decisions(src):
    module = module_of(src)
    return [analyze_loop(op) for op in module.walk() if isinstance(op, scf.ForOp)]


RNG = np.random.default_rng(0)


def rand(shape, dtype=np.float32, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


# ---------------------------------------------------------------------------
# Hand-written single loops
# ---------------------------------------------------------------------------


def scalar_loop(update: str, el: str = "f32", n: int = 6, extra: str = "") -> str:
    """`@f(x, c, y, h0) -> h`: h carried as an iter_arg; `update` defines %hn from %h,
    %x (= x[i]), %c (= c[i]), %k (a loop-invariant constant) and %i."""
    return f"""
func.func @f(%xs: memref<{n}x{el}>, %cs: memref<{n}x{el}>, %y: memref<{n}x{el}>, %h0: {el}) -> {el} {{
  %c0 = arith.constant 0 : index
  %cn = arith.constant {n} : index
  %c1 = arith.constant 1 : index
  %k = arith.constant 3 : {el}
  %r = scf.for %i = %c0 to %cn step %c1 iter_args(%h = %h0) -> ({el}) {{
    %x = memref.load %xs[%i] : memref<{n}x{el}>
    %c = memref.load %cs[%i] : memref<{n}x{el}>
    {update}
    memref.store %hn, %y[%i] : memref<{n}x{el}>
    {extra}
    scf.yield %hn : {el}
  }}
  func.return %r : {el}
}}
"""


AFFINE_UPDATES = {
    "a_h_plus_b": "%ah = arith.mulf %c, %h : f32\n %hn = arith.addf %ah, %x : f32",
    "h_a_plus_b": "%ah = arith.mulf %h, %c : f32\n %hn = arith.addf %x, %ah : f32",
    "two_terms": (
        "%t1 = arith.mulf %h, %c : f32\n %t2 = arith.mulf %h, %x : f32\n"
        " %t3 = arith.addf %t1, %t2 : f32\n %hn = arith.addf %t3, %x : f32"
    ),
    "sub_neg": (
        "%t1 = arith.subf %x, %h : f32\n %t2 = arith.negf %t1 : f32\n"
        " %hn = arith.mulf %t2, %c : f32"
    ),
    "div_invariant": "%t1 = arith.addf %h, %x : f32\n %hn = arith.divf %t1, %k : f32",
    "select_reset": (
        "%z = arith.constant 0.0 : f32\n %p = arith.cmpf ogt, %x, %z : f32\n"
        " %kept = arith.select %p, %z, %h : f32\n %ah = arith.mulf %c, %kept : f32\n"
        " %hn = arith.addf %ah, %x : f32"
    ),
    "select_both_affine": (
        "%z = arith.constant 0.0 : f32\n %p = arith.cmpf ogt, %x, %z : f32\n"
        " %t1 = arith.mulf %h, %c : f32\n %t2 = arith.addf %h, %x : f32\n"
        " %hn = arith.select %p, %t1, %t2 : f32"
    ),
    "exp_of_input": (
        "%e = math.exp %c : f32\n %ah = arith.mulf %e, %h : f32\n"
        " %hn = arith.addf %ah, %x : f32"
    ),
    "invariant_only": "%hn = arith.addf %x, %k : f32",
    "uses_index": (
        "%ii = arith.index_cast %i : index to i32\n %fi = arith.sitofp %ii : i32 to f32\n"
        " %ah = arith.mulf %fi, %h : f32\n %hn = arith.addf %ah, %x : f32"
    ),
}

REJECTED_UPDATES = {
    "exp_of_state": ("%e = math.exp %h : f32\n %hn = arith.addf %e, %x : f32", "math.exp"),
    "h_times_h": ("%hh = arith.mulf %h, %h : f32\n %hn = arith.addf %hh, %x : f32", "h*h"),
    "state_in_select_cond": (
        "%z = arith.constant 0.0 : f32\n %p = arith.cmpf ogt, %h, %z : f32\n"
        " %hn = arith.select %p, %x, %h : f32",
        "condition (arith.cmpf)",
    ),
    "divide_by_state": ("%hn = arith.divf %x, %h : f32", "divisor"),
    "state_as_index": (
        "%fi = arith.fptosi %h : f32 to i32\n %ii = arith.index_cast %fi : i32 to index\n"
        " %v = memref.load %xs[%ii] : memref<6xf32>\n %hn = arith.addf %v, %h : f32",
        "arith.fptosi",
    ),
    # Issue 14: an escaping value affine in the previous state is an extra state
    # component now (see test_escaping_old_state_is_an_extra_state_component); this
    # loop is still refused because its coefficient c[i] is read from c, which it writes.
    "intermediate_escapes": (
        "%ah = arith.mulf %c, %h : f32\n memref.store %ah, %cs[%i] : memref<6xf32>\n"
        " %hn = arith.addf %ah, %x : f32",
        "memref that the loop writes",
    ),
    "state_under_tanh": ("%e = math.tanh %h : f32\n %hn = arith.mulf %e, %x : f32", "math.tanh"),
}


@pytest.mark.parametrize("name", sorted(AFFINE_UPDATES))
def test_scalar_affine_forms_are_raised_and_agree(name):
    src = scalar_loop(AFFINE_UPDATES[name])
    (decision,) = loop_decisions(src)
    assert decision.affine, decision.reason
    assert decision.kind == "scalar"
    x, c, y = rand(6), rand(6), np.zeros(6, np.float32)
    module, _, _ = golden(src, "f", [x, c, y, 0.25], expect=["scan.recurrence"])
    assert not any(isinstance(op, scf.ForOp) for op in module.walk())


def test_plain_form_is_bit_exact_and_coeffs_reuse_values():
    src = scalar_loop(AFFINE_UPDATES["a_h_plus_b"])
    x, c, y = rand(6), rand(6), np.zeros(6, np.float32)
    module, _, _ = golden(src, "f", [x, c, y, 0.5], exact=True)
    rec = next(op for op in module.walk() if isinstance(op, RecurrenceOp))
    # coeffs yield the loaded values themselves: no re-association.
    body = [op.name for op in rec.coeffs.block.ops]
    assert body == ["memref.load", "memref.load", "scan.yield"]


def test_two_terms_sum_their_coefficients():
    module = module_of(scalar_loop(AFFINE_UPDATES["two_terms"]))
    raise_recurrences(module)
    rec = next(op for op in module.walk() if isinstance(op, RecurrenceOp))
    a = rec.coeffs.block.last_op.arguments[0]
    assert a.owner.name == "arith.addf"


@pytest.mark.parametrize("name", sorted(REJECTED_UPDATES))
def test_non_affine_loops_are_kept_with_reason(name):
    update, why = REJECTED_UPDATES[name]
    src = scalar_loop(update)
    (decision,) = loop_decisions(src)
    assert not decision.affine
    assert why in decision.reason, decision.reason
    module = module_of(src)
    before = print_ir(module)
    ops, diags = raise_recurrences(module)
    assert ops == [] and print_ir(module) == before
    assert len(diags) == 1 and diags[0].startswith("@f:scf.for#0: scanweaver-raise:")


def test_escaping_old_state_is_an_extra_state_component():
    # Issue 14 (once refused: "a value depending on the previous state escapes the
    # update"): the stored previous state is a second state component.
    src = scalar_loop("memref.store %h, %cs[%i] : memref<6xf32>\n %hn = arith.addf %h, %x : f32")
    (decision,) = loop_decisions(src)
    assert decision.affine and decision.kind == "linear"
    x, c, y = rand(6), rand(6), np.zeros(6, np.float32)
    golden(src, "f", [x, c, y, 0.25], exact=True, expect=["scan.linear_recurrence"])


def test_diagnose_option_writes_stderr():
    module = module_of(scalar_loop(REJECTED_UPDATES["h_times_h"][0]))
    err = io.StringIO()
    with redirect_stderr(err):
        RaiseRecurrences(diagnose=True).apply(None, module)  # type: ignore[arg-type]
    assert re.fullmatch(
        r"@f:scf\.for#0: scanweaver-raise: loop not raised: .*h\*h.*\n", err.getvalue()
    )
    err = io.StringIO()
    with redirect_stderr(err):
        RaiseRecurrences().apply(None, module)  # type: ignore[arg-type]
    assert err.getvalue() == ""


def test_loops_without_state_are_not_diagnosed():
    src = """
func.func @f(%x: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c4 = arith.constant 4 : index
  %c1 = arith.constant 1 : index
  %z = arith.constant 0.0 : f32
  scf.for %i = %c0 to %c4 step %c1 {
    memref.store %z, %x[%i] : memref<4xf32>
  }
  func.return
}
"""
    (decision,) = loop_decisions(src)
    assert not decision.affine and decision.kind == "none"
    assert raise_recurrences(module_of(src)) == ([], [])


@pytest.mark.parametrize("el,dtype", [("i32", np.int32), ("i64", np.int64)])
def test_integer_loop_bit_exact_with_wraparound(el, dtype):
    update = (
        "%t1 = arith.muli %h, %c : {el}\n %t2 = arith.muli %x, %h : {el}\n"
        " %t3 = arith.subi %t1, %t2 : {el}\n %hn = arith.addi %t3, %x : {el}"
    ).format(el=el)
    src = scalar_loop(update, el=el, n=8)
    info = np.iinfo(dtype)
    x = RNG.integers(info.min // 4, info.max // 4, size=8, dtype=dtype)
    c = RNG.integers(info.min // 4, info.max // 4, size=8, dtype=dtype)
    golden(src, "f", [x, c, np.zeros(8, dtype), 12345], exact=True)


def test_f64_loop():
    src = scalar_loop(AFFINE_UPDATES["two_terms"].replace("f32", "f64"), el="f64")
    golden(src, "f", [rand(6, np.float64), rand(6, np.float64), np.zeros(6), 0.5])


def test_state_used_in_scf_if_is_rejected():
    # Issue 14: `scf.if` yielding the new state on a state-independent condition is a
    # masked update (raised, see test_raise_forms.py); the previous state used in a
    # branch that yields nothing is still refused.
    update = (
        "%z = arith.constant 0.0 : f32\n %p = arith.cmpf ogt, %x, %z : f32\n"
        " scf.if %p {\n %q = arith.addf %h, %x : f32\n"
        " memref.store %q, %xs[%i] : memref<6xf32>\n }\n %hn = arith.addf %h, %x : f32"
    )
    (decision,) = loop_decisions(scalar_loop(update))
    assert not decision.affine and "nested region of scf.if" in decision.reason


def test_coefficient_reading_written_memref_is_rejected():
    # c[i] is read for the coefficient but the loop also writes c.
    update = "%ah = arith.mulf %c, %h : f32\n %hn = arith.addf %ah, %x : f32"
    src = scalar_loop(update, extra="memref.store %x, %cs[%i] : memref<6xf32>")
    (decision,) = loop_decisions(src)
    assert not decision.affine and "memref that the loop writes" in decision.reason


def test_emit_may_use_the_new_state_nonlinearly():
    update = "%ah = arith.mulf %c, %h : f32\n %hn = arith.addf %ah, %x : f32"
    extra = "%sq = arith.mulf %hn, %hn : f32\n %e = math.exp %sq : f32\n memref.store %e, %cs[%i] : memref<6xf32>"
    src = scalar_loop(update, extra=extra).replace(
        "%c = memref.load %cs[%i]", "%c = memref.load %xs[%i]"
    )
    golden(src, "f", [rand(6), rand(6), np.zeros(6, np.float32), 0.1], exact=True)


# ---------------------------------------------------------------------------
# Memref state and state vectors
# ---------------------------------------------------------------------------

VECTOR_2D = """
func.func @v(%x: memref<5x3xf32>, %a: memref<3xf32>, %h: memref<2x3xf32>, %y: memref<5xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %z = arith.constant 0.0 : f32
  scf.for %t = %c0 to %c5 step %c1 {
    %s = scf.for %n = %c0 to %c3 step %c1 iter_args(%acc = %z) -> (f32) {
      %hv = memref.load %h[%c1, %n] : memref<2x3xf32>
      %av = memref.load %a[%n] : memref<3xf32>
      %xv = memref.load %x[%t, %n] : memref<5x3xf32>
      %m = arith.mulf %av, %hv : f32
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%c1, %n] : memref<2x3xf32>
      %acc2 = arith.addf %acc, %hn : f32
      scf.yield %acc2 : f32
    }
    memref.store %s, %y[%t] : memref<5xf32>
  }
  func.return
}
"""


def test_state_row_of_larger_memref_uses_temporary_and_write_through():
    original, module, ops = raised(VECTOR_2D)
    assert [op.name for op in ops] == ["scan.recurrence"]
    (rec,) = ops
    assert rec.state.type.get_shape() == (3,)
    assert rec.state.owner.name == "memref.alloca"
    args = [rand((5, 3)), rand(3), rand((2, 3)), np.zeros(5, np.float32)]
    golden(VECTOR_2D, "v", args, exact=True)


def test_cross_channel_read_falls_back_to_temporary():
    # Reading h[n] of the *previous* channel after its update: not a direct state.
    src = """
func.func @v(%x: memref<4x3xf32>, %h: memref<3xf32>, %y: memref<4x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c4 = arith.constant 4 : index
  %half = arith.constant 0.5 : f32
  scf.for %t = %c0 to %c4 step %c1 {
    %first = memref.load %h[%c0] : memref<3xf32>
    scf.for %n = %c0 to %c3 step %c1 {
      %hv = memref.load %h[%n] : memref<3xf32>
      %xv = memref.load %x[%t, %n] : memref<4x3xf32>
      %m = arith.mulf %half, %hv : f32
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%n] : memref<3xf32>
      %h0 = memref.load %h[%c0] : memref<3xf32>
      %d = arith.subf %h0, %first : f32
      memref.store %d, %y[%t, %n] : memref<4x3xf32>
    }
  }
  func.return
}
"""
    (decision, _) = loop_decisions(src)
    assert decision.affine and decision.kind == "vector" and not decision.plan.direct
    golden(src, "v", [rand((4, 3)), rand(3), np.zeros((4, 3), np.float32)], exact=True)


def test_inner_loop_carried_value_in_coefficient_is_rejected():
    src = VECTOR_2D.replace("%m = arith.mulf %av, %hv", "%m = arith.mulf %acc, %hv")
    decisions = loop_decisions(src)
    assert not decisions[0].affine
    assert "loop-carried value of an inner loop" in decisions[0].reason


def test_channel_loop_with_dynamic_bound():
    # Issue 14: a loop-invariant channel count is raised (a dynamic temporary state);
    # one computed inside the time loop is refused.
    src = VECTOR_2D.replace(
        "func.func @v(%x: memref<5x3xf32>", "func.func @v(%nn: index, %x: memref<5x3xf32>"
    ).replace("scf.for %n = %c0 to %c3", "scf.for %n = %c0 to %nn")
    decision = loop_decisions(src)[0]
    assert decision.affine and decision.kind == "vector"
    bad = src.replace(
        "%s = scf.for %n = %c0 to %nn",
        "%nt = arith.addi %t, %c1 : index\n    %s = scf.for %n = %c0 to %nt",
    )
    decision = loop_decisions(bad)[0]
    assert not decision.affine and "loop-invariant" in decision.reason


def test_loops_inside_raised_regions_are_left_alone():
    module = loops.selective_scan_loops(1, 1, 2, 2)
    ops, _ = raise_recurrences(module)
    assert len(ops) == 1
    # The y reduction over channels stays an scf.for inside emit.
    assert any(isinstance(op, scf.ForOp) for op in ops[0].emit.walk())


def test_standalone_reduction_is_raised():
    module = loops.cumsum_loops(2, 3, "i32")
    ops, _ = raise_recurrences(module)
    assert [op.name for op in ops] == ["scan.recurrence"]


# ---------------------------------------------------------------------------
# Workloads through the pass
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_ema(dtype):
    np_t = np.float32 if dtype == "f32" else np.float64
    args = [rand((2, 5), np_t), rand(2, np_t, 0, 1), rand(2, np_t), np.zeros((2, 5), np_t),
            np.zeros(2, np_t)]
    golden(loops.ema_loops(2, 5, dtype), "ema", args, exact=True, expect=["scan.recurrence"])


def test_discounted_return_memref_state():
    args = [rand((2, 5)), rand(2, np.float32, 0, 1), rand(2), np.zeros((2, 5), np.float32)]
    module, _, _ = golden(
        loops.discounted_return_loops(2, 5), "discounted_return", args, exact=True,
        expect=["scan.recurrence"],
    )
    rec = next(op for op in module.walk() if isinstance(op, RecurrenceOp))
    assert rec.state.type.get_shape() == ()


def test_reset_vector_state_is_direct():
    done = np.array([0, 1, 0, 0, 1, 0], np.int32)
    args = [rand((6, 3)), rand((6, 3)), done, rand(3), np.zeros((6, 3), np.float32)]
    module, _, _ = golden(loops.reset_loops(3, 6), "reset", args, exact=True,
                          expect=["scan.recurrence"])
    rec = next(op for op in module.walk() if isinstance(op, RecurrenceOp))
    fn = next(op for op in module.walk() if op.name == "func.func")
    assert rec.state is fn.body.block.args[3]  # %h itself, no temporary


@pytest.mark.parametrize("dtype", ["f32", "f64", "i32", "i64"])
def test_iir2_linear_recurrence(dtype):
    np_t = np.dtype({"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}[dtype])
    if np_t.kind == "i":
        info = np.iinfo(np_t)
        x = RNG.integers(info.min // 2, info.max // 2, size=(2, 6), dtype=np_t)
        c1 = RNG.integers(-1000, 1000, size=2, dtype=np_t)
        c2 = RNG.integers(-1000, 1000, size=2, dtype=np_t)
    else:
        x, c1, c2 = rand((2, 6), np_t), rand(2, np_t), rand(2, np_t)
    module, _, _ = golden(loops.iir2_loops(2, 6, dtype), "iir2", [x, c1, c2, np.zeros((2, 6), np_t)],
                          exact=True, expect=["scan.linear_recurrence"])
    rec = next(op for op in module.walk() if isinstance(op, LinearRecurrenceOp))
    assert rec.size == 2 and len(rec.coeffs.block.last_op.arguments) == 6


@pytest.mark.parametrize("kind", ["cumsum", "cumprod"])
@pytest.mark.parametrize("dtype", ["i32", "i64", "f32"])
def test_prefix_loops(kind, dtype):
    builder = loops.cumsum_loops if kind == "cumsum" else loops.cumprod_loops
    np_t = np.dtype({"f32": np.float32, "i32": np.int32, "i64": np.int64}[dtype])
    if np_t.kind == "i":
        info = np.iinfo(np_t)
        x = RNG.integers(info.min, info.max, size=(2, 5), dtype=np_t)  # overflows: wraps
    else:
        x = rand((2, 5), np_t)
    golden(builder(2, 5, dtype), kind, [x, np.zeros((2, 5), np_t)], exact=True,
           expect=["scan.recurrence"])


def test_raised_ir_roundtrips_through_text():
    for builder in (loops.ema_loops, loops.discounted_return_loops, loops.reset_loops):
        _, module, _ = raised(builder(2, 3))
        text = print_ir(module)
        assert print_ir(parse_ir(text)) == text


# ---------------------------------------------------------------------------
# scan.linear_recurrence: text round trip and verifier
# ---------------------------------------------------------------------------


def test_linear_recurrence_roundtrips():
    from xdsl.parser import Parser

    _, module, _ = raised(loops.iir2_loops(2, 4))
    text = print_ir(module)
    again = Parser(make_context(), text).parse_module()
    again.verify()
    assert print_ir(again) == text


def test_linear_recurrence_verifier_counts_coefficients():
    from xdsl.parser import Parser
    from xdsl.utils.exceptions import VerifyException

    text = """
func.func @f(%s: memref<2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %one = arith.constant 1.0 : f32
  scan.linear_recurrence %c0 to %c1 step %c1 state(%s : memref<2xf32>) coeffs {
  ^bb0(%i: index):
    scan.yield %one, %one, %one, %one, %one : f32, f32, f32, f32, f32
  } emit {
  ^bb0(%i: index, %st: memref<2xf32>):
    scan.yield
  }
  func.return
}
"""
    module = Parser(make_context(), text).parse_module()
    with pytest.raises(VerifyException, match="6 values"):
        module.verify()
