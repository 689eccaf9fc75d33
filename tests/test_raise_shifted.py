"""scanweaver-raise on state carried through memory at a shifted index.

`y[.., t] = a*y[.., t-1] + x` (forward) or `y[.., t] = a*y[.., t+1] + x` (reverse walk)
becomes a `scan.recurrence` on a temporary state initialised from the element before
the first step, with an emit that writes each new state through to `y[.., t]`.
Golden checks interpret the original and the raised IR on the same inputs, bit for bit.
"""

from __future__ import annotations

import io
import re
from contextlib import redirect_stderr

import numpy as np
import pytest

from scanweaver.ir import print_ir
from scanweaver.rewrites.raise_affine import (
    RaiseRecurrences,
    analyze_loop,
    raise_recurrences,
)
from scanweaver.workloads import loops
from test_raise import first_loop, golden, module_of

RNG = np.random.default_rng(7)

NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}


def inputs(shape, dtype):
    t = np.dtype(NP[dtype])
    if t.kind == "i":
        info = np.iinfo(t)
        # full range: products overflow and must wrap identically
        return RNG.integers(info.min, info.max, size=shape, dtype=t)
    return RNG.uniform(-1.0, 1.0, size=shape).astype(t)


# ---------------------------------------------------------------------------
# The workload builder: forward and reverse, f32 and i32, several shapes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", ["f32", "i32", "f64", "i64"])
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("L", [1, 2, 7])
def test_shifted_builder_bit_exact(reverse, dtype, channels, L):
    src = loops.shifted_recurrence_loops(channels, L, reverse=reverse, dtype=dtype)
    a, x, y = (inputs((channels, L), dtype) for _ in range(3))
    module, outs, _ = golden(src, "shifted_recurrence", [a, x, y], exact=True,
                             expect=["scan.recurrence"])
    text = print_ir(module)
    assert "scan.recurrence" in text and "scf.for %t =" not in text
    assert "scf.for %i =" not in text


def test_shifted_builder_matches_numpy():
    C, L = 2, 6
    a, x, y = (inputs((C, L), "f64") for _ in range(3))
    for reverse in (False, True):
        _, outs, _ = golden(loops.shifted_recurrence_loops(C, L, reverse, "f64"),
                            "shifted_recurrence", [a, x, y.copy()], exact=True)
        ref = y.copy()
        ts = range(L - 2, -1, -1) if reverse else range(1, L)
        for t in ts:
            prev = ref[:, t + 1] if reverse else ref[:, t - 1]
            ref[:, t] = a[:, t] * prev + x[:, t]
        np.testing.assert_array_equal(outs[2], ref)


def test_shifted_decision_and_ir_shape():
    module = module_of(loops.shifted_recurrence_loops(2, 5))
    loop = [op for op in module.walk() if op.name == "scf.for"][1]
    d = analyze_loop(loop)
    assert d.affine and d.kind == "memref" and d.plan.time_pos == 1
    ops, diags = raise_recurrences(module)
    assert [op.name for op in ops] == ["scan.recurrence"] and diags == []
    text = print_ir(module)
    assert "memref.alloca() : memref<f32>" in text
    # the initial state is y[c, 0], the write-through store is y[c, t]
    assert re.search(r"memref.store %\w+, %y\[%c, %t_?\w*\]", text)


# ---------------------------------------------------------------------------
# Hand-written loops
# ---------------------------------------------------------------------------


def shifted_loop(*, lb=1, ub=6, step=1, prev="%tm", extra_before="", extra_after="",
                 el="f32", n=6, tindex="%i") -> str:
    """@f(a, x, y, out): for i: t = tindex; y[t] = a[t]*y[prev] + x[t].
    Defined index values: %tm = t-1, %tp = t+1, %tm2 = t-2."""
    return f"""
func.func @f(%a: memref<{n}x{el}>, %x: memref<{n}x{el}>, %y: memref<{n}x{el}>, %out: memref<{n}x{el}>) {{
  %lb = arith.constant {lb} : index
  %ub = arith.constant {ub} : index
  %st = arith.constant {step} : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %lb to %ub step %st {{
    %t = arith.addi {tindex}, %c1 : index
    %t0 = arith.subi %t, %c1 : index
    %tm = arith.subi %t0, %c1 : index
    %tp = arith.addi %t0, %c1 : index
    %tm2 = arith.subi %t0, %c2 : index
    %av = memref.load %a[%t0] : memref<{n}x{el}>
    %xv = memref.load %x[%t0] : memref<{n}x{el}>
    %old = memref.load %y[{prev}] : memref<{n}x{el}>
    {extra_before}
    %m = {"arith.mulf" if el.startswith("f") else "arith.muli"} %av, %old : {el}
    %new = {"arith.addf" if el.startswith("f") else "arith.addi"} %m, %xv : {el}
    memref.store %new, %y[%t0] : memref<{n}x{el}>
    {extra_after}
  }}
  func.return
}}
"""


def run_hand(src, el="f32", n=6, exact=True):
    args = [inputs((n,), el) for _ in range(4)]
    return golden(src, "f", args, exact=exact, expect=["scan.recurrence"])


@pytest.mark.parametrize("el", ["f32", "i32"])
def test_hand_forward_with_consumers(el):
    # a second read of y[t-1] before the store feeds the update; a read of y[t]
    # after the store is a consumer: both see the loop's values
    mul = "arith.mulf" if el == "f32" else "arith.muli"
    src = shifted_loop(
        el=el,
        extra_before=f"%again = memref.load %y[%tm] : memref<6x{el}>",
        extra_after=f"%newer = memref.load %y[%t0] : memref<6x{el}>\n"
        f"    %p = {mul} %newer, %xv : {el}\n"
        f"    memref.store %p, %out[%tm] : memref<6x{el}>",
    ).replace(f"{mul} %av, %old", f"{mul} %av, %again")
    module, _, _ = run_hand(src, el)
    assert "scf.for" not in print_ir(module)


def test_hand_shift_two_is_a_multi_lag_recurrence():
    # Issue 14: loading t-2 with step 1 (once refused: "the state is loaded at t-2 but
    # the previous step stored t-1") is the multi-lag form y[t] = a*y[t-2] + x.
    args = [inputs((6,), "f32") for _ in range(4)]
    golden(shifted_loop(lb=2, prev="%tm2"), "f", args, exact=True,
           expect=["scan.linear_recurrence"])


def test_hand_step_two_shift_two():
    # step 2, load t-2: the shift equals the step
    run_hand(shifted_loop(lb=2, ub=6, step=2, prev="%tm2"))


def test_hand_reverse_symbolic():
    # t = 4 - i (written as (c4 - i) + 1 - 1), load t+1
    run_hand(shifted_loop(lb=0, ub=5, prev="%tp", tindex="%r"
                          ).replace("%t = arith.addi %r", "%r = arith.subi %c4, %i : index\n    %t = arith.addi %r"))


DYN = """
func.func @f(%a: memref<8xf32>, %x: memref<8xf32>, %y: memref<8xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %hi = arith.subi %n, %c1 : index
  scf.for %i = %c0 to %hi step %c1 {
    %nm2 = arith.subi %n, %c2 : index
    %t = arith.subi %nm2, %i : index
    %tp = arith.addi %t, %c1 : index
    %av = memref.load %a[%t] : memref<8xf32>
    %old = memref.load %y[%tp] : memref<8xf32>
    %xv = memref.load %x[%t] : memref<8xf32>
    %m = arith.mulf %av, %old : f32
    %new = arith.addf %m, %xv : f32
    memref.store %new, %y[%t] : memref<8xf32>
  }
  func.return
}
"""


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_dynamic_bounds_reverse_n_minus_1_minus_i(n):
    a, x, y = (inputs((8,), "f32") for _ in range(3))
    module, _, _ = golden(DYN, "f", [a, x, y, n], exact=True, expect=["scan.recurrence"])
    assert "scf.if" in print_ir(module)  # init guarded: no step, no initial element


CHANNELS = """
func.func @f(%a: memref<5x3xf32>, %x: memref<5x3xf32>, %y: memref<5x3xf32>, %s: memref<5xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %z = arith.constant 0.0 : f32
  scf.for %t = %c1 to %c5 step %c1 {
    %tm = arith.subi %t, %c1 : index
    %sum = scf.for %n = %c0 to %c3 step %c1 iter_args(%acc = %z) -> (f32) {
      %old = memref.load %y[%tm, %n] : memref<5x3xf32>
      %av = memref.load %a[%t, %n] : memref<5x3xf32>
      %xv = memref.load %x[%t, %n] : memref<5x3xf32>
      %m = arith.mulf %av, %old : f32
      %new = arith.addf %m, %xv : f32
      memref.store %new, %y[%t, %n] : memref<5x3xf32>
      %seen = memref.load %y[%t, %n] : memref<5x3xf32>
      %acc2 = arith.addf %acc, %seen : f32
      scf.yield %acc2 : f32
    }
    memref.store %sum, %s[%t] : memref<5xf32>
  }
  func.return
}
"""


def test_channel_shaped_state():
    args = [inputs((5, 3), "f32") for _ in range(3)] + [inputs((5,), "f32")]
    module, _, _ = golden(CHANNELS, "f", args, exact=True, expect=["scan.recurrence"])
    assert "memref.alloca() : memref<3xf32>" in print_ir(module)


# ---------------------------------------------------------------------------
# Rejections: IR unchanged, a reason with diagnose
# ---------------------------------------------------------------------------

REJECTED = {
    "forward_loads_t_plus_1": (shifted_loop(prev="%tp"), r"t\+1 .*walks forward"),
    "second_store": (
        shifted_loop(extra_after="memref.store %xv, %y[%tm] : memref<6xf32>"),
        r"written at several places",
    ),
    "read_t_before_store": (
        shifted_loop(extra_before="%cur = memref.load %y[%t0] : memref<6xf32>\n"
                     "    memref.store %cur, %out[%t0] : memref<6xf32>"),
        r"also accessed by memref.load",
    ),
    "step_two_shift_one": (shifted_loop(lb=2, step=2), r"t-1 .*stored t-2.*step"),
    "nonaffine_update": (
        shifted_loop(extra_before="%sq = arith.mulf %old, %old : f32\n"
                     "    memref.store %sq, %out[%t0] : memref<6xf32>").replace(
            "%m = arith.mulf %av, %old", "%m = arith.mulf %sq, %old"),
        r"h\*h",
    ),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_variants_unchanged_with_reason(name):
    src, pattern = REJECTED[name]
    module = module_of(src)
    before = print_ir(module)
    d = analyze_loop(first_loop(module))
    assert not d.affine and re.search(pattern, d.reason), d.reason
    ops, diags = raise_recurrences(module)
    assert ops == [] and print_ir(module) == before
    assert len(diags) == 1 and re.search(pattern, diags[0])
    err = io.StringIO()
    with redirect_stderr(err):
        RaiseRecurrences(diagnose=True).apply(None, module_of(src))  # type: ignore[arg-type]
    assert re.fullmatch(
        r"@f:scf\.for#0: scanweaver-raise: loop not raised: .*\n", err.getvalue()
    )
    assert re.search(pattern, err.getvalue())
