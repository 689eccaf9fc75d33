"""Symbolic affine forms over loop-carried state, and their materialisation as IR.

A value computed in a loop body is *affine in the state* when it equals

    sum_k  coef_k * h_k  +  const

where the `h_k` are the carried state variables and every `coef_k`, `const` is
independent of the state.  Coefficients are kept as small expression trees (`Term`s)
over state-independent SSA values of the original loop, so the analysis never touches
the IR; `Materializer` turns terms into arith ops (in the `coeffs` region of the raised
op) once the loop is known to be affine.

Terms are tuples:  ZERO, ONE, ("v", ssa), ("add"|"sub"|"mul"|"div", x, y), ("neg", x),
("sel", cond_ssa, x, y), ("if", cond_ssa, x, y).  "if" is a select whose branches may
read values computed under an `scf.if` (a masked update): it is materialised as an
`scf.if` yielding the branch terms, so that nothing the loop ran conditionally (a load
that may be out of bounds when the mask is off) runs unconditionally.  The smart constructors fold the 0/1 identities, so the common
`a*h + b` keeps `a` and `b` as they are and the raised op computes the very same
`round(round(a*h) + b)` as the loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from xdsl.builder import Builder
from xdsl.dialects import arith, scf
from xdsl.dialects.builtin import ComplexType, FloatAttr, IntegerAttr, IntegerType
from xdsl.ir import Attribute, Block, Region, SSAValue
from xdsl.rewriter import InsertPoint

Term = tuple
ZERO: Term = ("0",)
ONE: Term = ("1",)


def leaf(value: SSAValue) -> Term:
    """A state-independent SSA value; literal 0 and 1 constants fold to ZERO / ONE."""
    op = value.owner
    if isinstance(op, arith.ConstantOp) and isinstance(
        op.value, FloatAttr | IntegerAttr
    ):
        v = op.value.value.data
        if v == 0 and math.copysign(1.0, float(v)) > 0:
            return ZERO
        if v == 1:
            return ONE
    return ("v", value)


def same(x: Term, y: Term) -> bool:
    """Structural equality, comparing SSA leaves by identity."""
    if len(x) != len(y) or x[0] != y[0]:
        return False
    for a, b in zip(x[1:], y[1:]):
        if isinstance(a, tuple):
            if not isinstance(b, tuple) or not same(a, b):
                return False
        elif a is not b:
            return False
    return True


def add(x: Term, y: Term) -> Term:
    if x is ZERO:
        return y
    if y is ZERO:
        return x
    return ("add", x, y)


def neg(x: Term) -> Term:
    if x is ZERO:
        return ZERO
    if x[0] == "neg":
        return x[1]
    return ("neg", x)


def sub(x: Term, y: Term) -> Term:
    if y is ZERO:
        return x
    if x is ZERO:
        return neg(y)
    return ("sub", x, y)


def mul(x: Term, y: Term) -> Term:
    if x is ZERO or y is ZERO:
        return ZERO
    if x is ONE:
        return y
    if y is ONE:
        return x
    return ("mul", x, y)


def div(x: Term, y: Term) -> Term:
    if x is ZERO or y is ONE:
        return x
    return ("div", x, y)


def select(cond: SSAValue, x: Term, y: Term) -> Term:
    if same(x, y):
        return x
    return ("sel", cond, x, y)


def if_(cond: SSAValue, x: Term, y: Term) -> Term:
    if same(x, y):
        return x
    return ("if", cond, x, y)


def leaves(t: Term) -> list[SSAValue]:
    """Every SSA value a term reads (leaves and select conditions)."""
    out: list[SSAValue] = []
    for part in t[1:]:
        if isinstance(part, tuple):
            out.extend(leaves(part))
        else:
            out.append(part)
    return out


def _complex_dialect():
    """xDSL's complex dialect, imported where a complex form is emitted: a real
    kernel's cold build does not pay its import (about 40 ms, `python -X importtime`)."""
    from xdsl.dialects import complex as cx

    return cx


@dataclass
class AffineForm:
    """`sum_k coefs[k] * h_k + const`; absent keys are ZERO."""

    coefs: dict[int, Term] = field(default_factory=dict)
    const: Term = ZERO

    @staticmethod
    def constant(t: Term) -> AffineForm:
        return AffineForm({}, t)

    @staticmethod
    def state(k: int) -> AffineForm:
        return AffineForm({k: ONE}, ZERO)

    def coef(self, k: int) -> Term:
        return self.coefs.get(k, ZERO)

    def _combine(self, other: AffineForm, f: Callable[[Term, Term], Term]) -> AffineForm:
        keys = sorted(set(self.coefs) | set(other.coefs))
        coefs = {k: f(self.coef(k), other.coef(k)) for k in keys}
        return AffineForm(
            {k: c for k, c in coefs.items() if c is not ZERO}, f(self.const, other.const)
        )

    def __add__(self, other: AffineForm) -> AffineForm:
        return self._combine(other, add)

    def __sub__(self, other: AffineForm) -> AffineForm:
        return self._combine(other, sub)

    def neg(self) -> AffineForm:
        return AffineForm({k: neg(c) for k, c in self.coefs.items()}, neg(self.const))

    def scale(self, t: Term, *, divide: bool = False) -> AffineForm:
        f = div if divide else mul
        coefs = {k: f(c, t) for k, c in self.coefs.items()}
        return AffineForm(
            {k: c for k, c in coefs.items() if c is not ZERO}, f(self.const, t)
        )

    def select(self, cond: SSAValue, other: AffineForm) -> AffineForm:
        return self._combine(other, lambda x, y: select(cond, x, y))

    def branch(self, cond: SSAValue, other: AffineForm) -> AffineForm:
        """`cond ? self : other` with each side evaluated only when taken."""
        return self._combine(other, lambda x, y: if_(cond, x, y))

    @property
    def is_constant(self) -> bool:
        return not self.coefs

    def all_leaves(self) -> list[SSAValue]:
        out = leaves(self.const)
        for c in self.coefs.values():
            out.extend(leaves(c))
        return out


class Materializer:
    """Emits the arith ops computing terms, through `builder`.

    `leaf_value` maps an original SSA leaf to its value at the insertion point (the
    raise pass clones the leaf's state-independent slice there).  Common subterms are
    emitted once.  `scope(builder)` gives the `leaf_value` for a nested block (the
    branches of an "if" term); without it "if" terms cannot be materialised.
    """

    def __init__(
        self,
        builder: Builder,
        element_type: Attribute,
        leaf_value: Callable[[SSAValue], SSAValue],
        scope: Callable[[Builder], Callable[[SSAValue], SSAValue]] | None = None,
    ):
        self.builder = builder
        self.type = element_type
        self.leaf_value = leaf_value
        self.scope = scope
        self.is_int = isinstance(element_type, IntegerType)
        self.is_complex = isinstance(element_type, ComplexType)
        self._consts: dict[int | str, SSAValue] = {}
        self._done: list[tuple[Term, SSAValue]] = []

    def _const(self, v: int | float) -> SSAValue:
        if self.is_complex:  # v + 0i (the -0 addend: -0 - 0i, the identity of complex.add)
            key = "c-0" if v == 0 and math.copysign(1.0, v) < 0 else v
            if key not in self._consts:
                part = float(v)
                parts = (part, part if key == "c-0" else 0.0)
                op = _complex_dialect().ConstantOp.from_floats(parts, self.type.element_type)
                self._consts[key] = self.builder.insert(op).complex
            return self._consts[key]
        if v not in self._consts:
            attr = (
                IntegerAttr(v, self.type) if self.is_int else FloatAttr(float(v), self.type)
            )
            self._consts[v] = self.builder.insert(arith.ConstantOp(attr)).result
        return self._consts[v]

    def emit_addend(self, t: Term) -> SSAValue:
        """`t` as the `b` of `a*h + b`: a zero there is -0.0 for floats, the exact
        additive identity (`x + -0.0 == x` for every x, -0.0 included), so that steps
        without an addend (a masked-off step, `h = a*h`) keep the sign of a zero."""
        if self.is_int or t[0] not in ("0", "sel", "if"):
            return self.emit(t)
        if t is ZERO and self.is_complex:
            return self._const(-0.0)
        if t is ZERO:
            if "-0" not in self._consts:
                attr = FloatAttr(-0.0, self.type)
                self._consts["-0"] = self.builder.insert(arith.ConstantOp(attr)).result
            return self._consts["-0"]
        if t[0] == "sel":
            cond = self.leaf_value(t[1])
            x, y = self.emit_addend(t[2]), self.emit_addend(t[3])
            return self.builder.insert(arith.SelectOp(cond, x, y)).result
        return self._emit_if(t, addend=True)

    def emit(self, t: Term) -> SSAValue:
        if t is ZERO:
            return self._const(0)
        if t is ONE:
            return self._const(1)
        for done, value in self._done:
            if same(done, t):
                return value
        value = self._emit(t)
        self._done.append((t, value))
        return value

    def _emit_if(self, t: Term, addend: bool) -> SSAValue:
        assert self.scope is not None, "an 'if' term needs a scope for its branches"
        cond = self.leaf_value(t[1])
        regions = []
        for branch in t[2:]:
            block = Block()
            inner = Builder(InsertPoint.at_end(block))
            sub = Materializer(inner, self.type, self.scope(inner), self.scope)
            v = sub.emit_addend(branch) if addend else sub.emit(branch)
            inner.insert(scf.YieldOp(v))
            regions.append(Region(block))
        return self.builder.insert(scf.IfOp(cond, [self.type], *regions)).results[0]

    def _emit(self, t: Term) -> SSAValue:
        kind = t[0]
        if kind == "v":
            return self.leaf_value(t[1])
        b, ints = self.builder, self.is_int
        if kind == "neg":
            x = self.emit(t[1])
            if self.is_complex:
                return b.insert(_complex_dialect().NegOp(x)).result
            if ints:
                return b.insert(arith.SubiOp(self._const(0), x)).result
            return b.insert(arith.NegfOp(x)).result
        if kind == "sel":
            cond = self.leaf_value(t[1])
            x, y = self.emit(t[2]), self.emit(t[3])
            return b.insert(arith.SelectOp(cond, x, y)).result
        if kind == "if":
            return self._emit_if(t, addend=False)
        x, y = self.emit(t[1]), self.emit(t[2])
        if self.is_complex:
            cx = _complex_dialect()
            cop = {"add": cx.AddOp, "sub": cx.SubOp, "mul": cx.MulOp, "div": cx.DivOp}[kind]
            return b.insert(cop(x, y)).result
        op_type = {
            ("add", False): arith.AddfOp,
            ("sub", False): arith.SubfOp,
            ("mul", False): arith.MulfOp,
            ("div", False): arith.DivfOp,
            ("add", True): arith.AddiOp,
            ("sub", True): arith.SubiOp,
            ("mul", True): arith.MuliOp,
        }[(kind, ints)]
        return b.insert(op_type(x, y)).result
