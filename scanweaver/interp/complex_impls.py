"""Interpreter implementations of the `complex` dialect ops ScanWeaver's IR uses.

A complex SSA value is a `(re, im)` tuple of Python floats, the form xDSL's
`ComplexType` packs into and unpacks from memref buffers.  Every real operation inside
a complex op is rounded to the element type, in the order `scan-complex-to-real`
(rewrites/complex_to_real.py) writes it as real arithmetic: so interpreted and
compiled complex<f32> code agree bit for bit.  The module-level functions below are
that one definition; the pass emits the same formulas op by op.

    add/sub   (x.re ± y.re, x.im ± y.im)
    mul       (x.re*y.re - x.im*y.im,  x.re*y.im + x.im*y.re)
    div       Smith's algorithm (scale by the larger of |y.re|, |y.im|)
    exp       (e*cos(im), e*sin(im)) with e = exp(re)
    abs       m * sqrt((re/m)^2 + (im/m)^2), m = max(|re|, |im|) (0 for 0, inf for inf)
"""

from __future__ import annotations

import math
import struct
from typing import Any

from xdsl.dialects import complex as cx
from xdsl.dialects.builtin import ComplexType, Float32Type
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.ir import Attribute, Operation

from scanweaver.interp.numerics import round_to

Complex = tuple[float, float]


def _div(x: float, y: float) -> float:
    if y == 0:
        if x == 0 or math.isnan(x):
            return math.nan
        return math.copysign(math.inf, x) * math.copysign(1.0, y)
    return x / y


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def _trig(f, x: float) -> float:
    return math.nan if math.isinf(x) else f(x)


def c_add(el: Attribute, x: Complex, y: Complex) -> Complex:
    return (round_to(el, x[0] + y[0]), round_to(el, x[1] + y[1]))


def c_sub(el: Attribute, x: Complex, y: Complex) -> Complex:
    return (round_to(el, x[0] - y[0]), round_to(el, x[1] - y[1]))


def c_mul(el: Attribute, x: Complex, y: Complex) -> Complex:
    r = lambda v: round_to(el, v)  # noqa: E731 - one rounding per real op
    re = r(r(x[0] * y[0]) - r(x[1] * y[1]))
    im = r(r(x[0] * y[1]) + r(x[1] * y[0]))
    return (re, im)


def c_div(el: Attribute, x: Complex, y: Complex) -> Complex:
    r = lambda v: round_to(el, v)  # noqa: E731
    (a, b), (c, d) = x, y
    if abs(c) >= abs(d):
        q = r(_div(d, c))
        den = r(c + r(d * q))
        return (r(_div(r(a + r(b * q)), den)), r(_div(r(b - r(a * q)), den)))
    q = r(_div(c, d))
    den = r(r(c * q) + d)
    return (r(_div(r(r(a * q) + b), den)), r(_div(r(r(b * q) - a), den)))


def c_exp(el: Attribute, x: Complex) -> Complex:
    r = lambda v: round_to(el, v)  # noqa: E731
    e = r(_exp(x[0]))
    return (r(e * r(_trig(math.cos, x[1]))), r(e * r(_trig(math.sin, x[1]))))


def c_abs(el: Attribute, x: Complex) -> float:
    r = lambda v: round_to(el, v)  # noqa: E731
    ax, ay = abs(x[0]), abs(x[1])
    m = math.nan if math.isnan(ax) or math.isnan(ay) else max(ax, ay)
    if m == 0 or math.isinf(m):
        return m
    u, v = r(_div(x[0], m)), r(_div(x[1], m))
    s = r(r(u * u) + r(v * v))
    return r(m * r(math.sqrt(s) if s >= 0 else math.nan))


def _el(op: Operation) -> Attribute:
    """The real element type of the op's first complex operand or result."""
    for v in (*op.results, *op.operands):
        if isinstance(v.type, ComplexType):
            return v.type.element_type
    raise AssertionError(f"{op.name} has no complex value")


def _binary(fn):
    def run(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return (fn(_el(op), tuple(args[0]), tuple(args[1])),)

    return run


@register_impls
class ComplexFunctions(InterpreterFunctions):
    run_add = impl(cx.AddOp)(_binary(c_add))
    run_sub = impl(cx.SubOp)(_binary(c_sub))
    run_mul = impl(cx.MulOp)(_binary(c_mul))
    run_div = impl(cx.DivOp)(_binary(c_div))

    @impl(cx.ExpOp)
    def run_exp(self, interpreter: Interpreter, op: cx.ExpOp, args: PythonValues):
        return (c_exp(_el(op), tuple(args[0])),)

    @impl(cx.AbsOp)
    def run_abs(self, interpreter: Interpreter, op: cx.AbsOp, args: PythonValues):
        return (c_abs(_el(op), tuple(args[0])),)

    @impl(cx.ReOp)
    def run_re(self, interpreter: Interpreter, op: cx.ReOp, args: PythonValues):
        return (args[0][0],)

    @impl(cx.ImOp)
    def run_im(self, interpreter: Interpreter, op: cx.ImOp, args: PythonValues):
        return (args[0][1],)

    @impl(cx.CreateOp)
    def run_create(self, interpreter: Interpreter, op: cx.CreateOp, args: PythonValues):
        return ((args[0], args[1]),)

    @impl(cx.ConjOp)
    def run_conj(self, interpreter: Interpreter, op: cx.ConjOp, args: PythonValues):
        return ((args[0][0], -args[0][1]),)

    @impl(cx.NegOp)
    def run_neg(self, interpreter: Interpreter, op: cx.NegOp, args: PythonValues):
        return ((-args[0][0], -args[0][1]),)

    @impl(cx.ConstantOp)
    def run_constant(self, interpreter: Interpreter, op: cx.ConstantOp, args: PythonValues):
        el = _el(op)
        re, im = (round_to(el, float(v.value.data)) for v in op.value.data)  # type: ignore[attr-defined]
        return ((re, im),)


class ComplexStorage:
    """Packs (re, im) tuples as two adjacent floats (numpy's complex64/complex128 layout).

    Stands in for xDSL 0.74's `ComplexType` packing, whose `pack_into` takes its byte
    offset for an element index and writes outside the buffer."""

    name = "complex"

    def __init__(self, t: ComplexType):
        self._fmt = struct.Struct("<ff" if isinstance(t.element_type, Float32Type) else "<dd")
        self.compile_time_size = self._fmt.size

    def unpack(self, buffer, num: int) -> tuple[Complex, ...]:
        return tuple(self._fmt.iter_unpack(bytes(buffer[: num * self._fmt.size])))

    def iter_unpack(self, buffer):
        return self._fmt.iter_unpack(buffer)

    def pack_into(self, buffer, offset: int, value: Complex) -> None:
        self._fmt.pack_into(buffer, offset, value[0], value[1])

    def pack(self, values) -> bytes:
        return b"".join(self._fmt.pack(v[0], v[1]) for v in values)


def complex_zero() -> Complex:
    return (0.0, 0.0)


def state_mul_add(el: ComplexType, a: Any, h: Any, b: Any) -> Complex:
    """a*h + b for a complex state: complex.mul then complex.add, as the loops write it."""
    t = el.element_type
    return c_add(t, c_mul(t, tuple(a), tuple(h)), tuple(b))
