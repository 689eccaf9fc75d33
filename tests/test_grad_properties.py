"""scanweaver-grad on random loops: the expression trees of the raise property tests,
in float64, raised, differentiated, and checked against finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from grad_oracle import check_vjp, raise_and_grad
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_raise_properties import affine, trees

from scanweaver.dialects import scan
from scanweaver.ir import parse_ir
from scanweaver.rewrites.grad import GradRefused
from scanweaver.rewrites.raise_affine import raise_recurrences

L = 5


class FloatEmitter:
    def __init__(self):
        self.lines, self.n = [], 0

    def fresh(self) -> str:
        self.n += 1
        return f"%v{self.n}"

    def emit(self, t) -> str:
        if isinstance(t, str):
            return {"h": "%h", "x": "%x", "c": "%c", "k": "%k", "i": "%iv"}[t]
        kind, *kids = t
        args = [self.emit(c) for c in kids]
        r = self.fresh()
        if kind in ("add", "sub", "mul"):
            self.lines.append(f"{r} = arith.{kind}f {args[0]}, {args[1]} : f64")
        elif kind == "neg":
            self.lines.append(f"{r} = arith.negf {args[0]} : f64")
        elif kind == "div":
            self.lines.append(f"{r} = arith.divf {args[0]}, %seven : f64")
        else:
            p = self.fresh()
            self.lines.append(f"{p} = arith.cmpf olt, {args[0]}, {args[1]} : f64")
            self.lines.append(f"{r} = arith.select {p}, {args[2]}, {args[3]} : f64")
        return r


def program(tree, form: str) -> str:
    e = FloatEmitter()
    hn = e.emit(tree)
    body = "\n      ".join(e.lines)
    m = f"memref<{L}xf64>"
    pre = f"""
  %c0 = arith.constant 0 : index
  %cl = arith.constant {L} : index
  %c1 = arith.constant 1 : index
  %k = arith.constant -0.75 : f64
  %seven = arith.constant 7.0 : f64"""
    loads = f"""%x = memref.load %xs[%i] : {m}
      %c = memref.load %cs[%i] : {m}
      %ii = arith.index_cast %i : index to i64
      %if = arith.sitofp %ii : i64 to f64
      %iv = arith.mulf %if, %k : f64"""
    # the consumer is nonlinear in the state: its reverse needs the recomputed states
    consumers = f"""memref.store {hn}, %y[%i] : {m}
      %sq = arith.mulf {hn}, {hn} : f64
      memref.store %sq, %z[%i] : {m}"""
    if form == "iter_args":
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: memref<1xf64>) {{{pre}
  %h0 = memref.load %st[%c0] : memref<1xf64>
  %r = scf.for %i = %c0 to %cl step %c1 iter_args(%h = %h0) -> (f64) {{
      {loads}
      {body}
      {consumers}
      scf.yield {hn} : f64
  }}
  memref.store %r, %st[%c0] : memref<1xf64>
  func.return
}}
"""
    return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: memref<1xf64>) {{{pre}
  scf.for %i = %c0 to %cl step %c1 {{
      {loads}
      %h = memref.load %st[%c0] : memref<1xf64>
      {body}
      memref.store {hn}, %st[%c0] : memref<1xf64>
      {consumers}
  }}
  func.return
}}
"""


def _args(rng):
    m = lambda: rng.uniform(-1.0, 1.0, L)  # noqa: E731
    return [m(), m(), np.zeros(L), np.zeros(L), rng.uniform(-1.0, 1.0, 1)]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees, form=st.sampled_from(["iter_args", "memref"]), seed=st.integers(0, 2**32 - 1))
def test_random_affine_loops_vjp_matches_finite_differences(tree, form, seed):
    assume(affine(tree))
    text = raise_and_grad(program(tree, form), chunk=2)
    assert "@f_vjp" in text
    rng = np.random.default_rng(seed)
    # selects make F piecewise smooth: a step that crosses a branch is not a derivative
    check_vjp(text, "f", _args(rng), rng, eps=1e-7, tol=1e-5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree=st.one_of(
        trees.map(lambda t: ("add", ("mul", "h", "h"), t)),  # state times state
        trees.map(lambda t: ("sel", "h", "x", t, "c")),  # the state in a select condition
    ),
    form=st.sampled_from(["iter_args", "memref"]),
)
def test_loops_left_unraised_are_refused(tree, form):
    """Loops the raise pass leaves alone (state multiplied by state, state in a select
    condition) are refused with a reason, never differentiated wrongly."""
    src = program(tree, form)
    module = parse_ir(src)
    raise_recurrences(module)
    assume(not any(isinstance(op, scan.RecurrenceOp) for op in module.walk()))
    with pytest.raises(GradRefused, match="not raised into a scan"):
        raise_and_grad(src)
