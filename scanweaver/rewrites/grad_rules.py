"""Reverse-mode rules of the scalar arith/math ops, for the `scanweaver-grad` pass.

Each rule gets the op's primal operands and result (already emitted in the VJP) and the
cotangent `d` of the result, and returns one cotangent per operand (None: no
contribution).  Rules emit their ops through `e` (an `Emit` from `grad.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.dialects import arith
from xdsl.dialects import math as mathd
from xdsl.ir import Operation, SSAValue

Cotangents = Sequence[SSAValue | None]
Rule = Callable[["object", Sequence[SSAValue], SSAValue, SSAValue], Cotangents]


def _add(e, x, d, r):
    return [d, d]


def _sub(e, x, d, r):
    return [d, e.neg(d)]


def _mul(e, x, d, r):
    return [e.mul(d, x[1]), e.mul(d, x[0])]


def _div(e, x, d, r):
    # r = x/y:  dx = d/y,  dy = -d*r/y
    dx = e.div(d, x[1])
    return [dx, e.neg(e.mul(dx, r))]


def _neg(e, x, d, r):
    return [e.neg(d)]


def _exp(e, x, d, r):
    return [e.mul(d, r)]


def _log(e, x, d, r):
    return [e.div(d, x[0])]


def _log1p(e, x, d, r):
    return [e.div(d, e.add(e.fconst(1.0, x[0].type), x[0]))]


def _sqrt(e, x, d, r):
    return [e.div(e.mul(d, e.fconst(0.5, r.type)), r)]


def _tanh(e, x, d, r):
    return [e.mul(d, e.sub(e.fconst(1.0, r.type), e.mul(r, r)))]


def _select(e, x, d, r):
    zero = e.fconst(0.0, d.type)
    return [None, e.select(x[0], d, zero), e.select(x[0], zero, d)]


def _maxnum(e, x, d, r):
    # the derivative goes to the operand that was picked (the first one on ties)
    first = arith.CmpfOp(r, x[0], "oeq")
    e.put(first)
    zero = e.fconst(0.0, d.type)
    return [e.select(first.result, d, zero), e.select(first.result, zero, d)]


def _extf(e, x, d, r):
    return [e.put(arith.TruncFOp(d, x[0].type)).result]


def _truncf(e, x, d, r):
    return [e.put(arith.ExtFOp(d, x[0].type)).result]


def _fma(e, x, d, r):
    return [e.mul(d, x[1]), e.mul(d, x[0]), d]


def _absf(e, x, d, r):
    neg = e.put(arith.CmpfOp(x[0], e.fconst(0.0, x[0].type), "olt")).result
    return [e.select(neg, e.neg(d), d)]


RULES: dict[type[Operation], Rule] = {
    arith.AddfOp: _add,
    arith.SubfOp: _sub,
    arith.MulfOp: _mul,
    arith.DivfOp: _div,
    arith.NegfOp: _neg,
    arith.SelectOp: _select,
    arith.MaxnumfOp: _maxnum,
    arith.MinnumfOp: _maxnum,  # same rule: the picked operand gets the derivative
    arith.MaximumfOp: _maxnum,
    arith.MinimumfOp: _maxnum,
    arith.ExtFOp: _extf,
    arith.TruncFOp: _truncf,
    mathd.ExpOp: _exp,
    mathd.LogOp: _log,
    mathd.Log1pOp: _log1p,
    mathd.SqrtOp: _sqrt,
    mathd.TanhOp: _tanh,
    mathd.FmaOp: _fma,
    mathd.AbsFOp: _absf,
}

#: Ops without a derivative to propagate (index math, comparisons, integer casts).
INACTIVE = (
    arith.ConstantOp,
    arith.CmpfOp,
    arith.CmpiOp,
    arith.AddiOp,
    arith.SubiOp,
    arith.MuliOp,
    arith.DivUIOp,
    arith.DivSIOp,
    arith.RemUIOp,
    arith.RemSIOp,
    arith.MinSIOp,
    arith.MaxSIOp,
    arith.MinUIOp,
    arith.MaxUIOp,
    arith.IndexCastOp,
    arith.ExtSIOp,
    arith.ExtUIOp,
    arith.TruncIOp,
    arith.AndIOp,
    arith.OrIOp,
    arith.XOrIOp,
    arith.SIToFPOp,
    arith.UIToFPOp,
    arith.FPToSIOp,
    arith.FPToUIOp,
    mathd.FloorOp,
    mathd.CeilOp,
)
