"""Reference (sequential) semantics of the scan dialect for the xDSL interpreter.

These implementations are the golden oracle every lowering is checked against, so
they are written to be obviously correct rather than fast: they walk the time axis
one step at a time exactly as the op documentation says.
"""

from __future__ import annotations

import itertools
from typing import Any

from xdsl.dialects.builtin import ComplexType, IntegerType
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    ReturnedValues,
    TerminatorValue,
    impl,
    impl_terminator,
    register_impls,
)
from xdsl.interpreters.shaped_array import ShapedArray
from xdsl.ir import Attribute

from scanweaver.dialects import scan
from scanweaver.interp.numerics import round_to


def state_arith(state_type: Attribute):
    """Return (mul_add, zero) for the state type.

    The product and the sum are rounded separately (floats to the state width,
    integers wrapped): this is what unfused `mulf`/`addf` or `muli`/`addi` compute, so
    the reference agrees bit for bit with the loop form it replaces.
    """

    if isinstance(state_type, ComplexType):  # (re, im) tuples, complex.mul then complex.add
        from scanweaver.interp.complex_impls import complex_zero, state_mul_add

        return (lambda a, h, b: state_mul_add(state_type, a, h, b)), complex_zero()

    def mul_add(a, h, b):
        return round_to(state_type, round_to(state_type, a * h) + b)

    return mul_add, (0 if isinstance(state_type, IntegerType) else 0.0)


def _time_order(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


def _channels(shape: list[int], axis: int):
    """All index tuples of `shape` with the `axis` entry left out."""
    return itertools.product(*(range(d) for i, d in enumerate(shape) if i != axis))


def _with_axis(channel: tuple[int, ...], axis: int, t: int) -> tuple[int, ...]:
    return channel[:axis] + (t,) + channel[axis:]


@register_impls
class ScanFunctions(InterpreterFunctions):
    @impl(scan.AffineOp)
    def run_affine(
        self, interpreter: Interpreter, op: scan.AffineOp, args: PythonValues
    ) -> PythonValues:
        names = ["a", "b"] + (["init"] if op.init else []) + ["h"]
        values = dict(zip(names + (["final"] if op.final else []), args))
        a: ShapedArray[Any] = values["a"]
        b: ShapedArray[Any] = values["b"]
        h: ShapedArray[Any] = values["h"]
        init = values.get("init")
        final = values.get("final")
        state_type = op.h.type.element_type  # type: ignore[attr-defined]
        mul_add, zero = state_arith(state_type)
        axis = op.axis_value
        for channel in _channels(h.shape, axis):
            state = init.load(channel) if init is not None else zero
            for t in _time_order(h.shape[axis], op.is_reverse):
                idx = _with_axis(channel, axis, t)
                state = mul_add(a.load(idx), state, b.load(idx))
                h.store(idx, state)
            if final is not None:
                final.store(channel, state)
        return ()

    @impl(scan.ScanOp)
    def run_scan(
        self, interpreter: Interpreter, op: scan.ScanOp, args: PythonValues
    ) -> PythonValues:
        k = len(op.inputs)
        ins: list[ShapedArray[Any]] = list(args[:k])
        outs: list[ShapedArray[Any]] = list(args[k:])
        axis = op.axis_value
        shape = ins[0].shape
        for channel in _channels(shape, axis):
            acc: tuple[Any, ...] | None = None
            for t in _time_order(shape[axis], op.is_reverse):
                idx = _with_axis(channel, axis, t)
                cur = tuple(x.load(idx) for x in ins)
                acc = (
                    cur
                    if acc is None
                    else interpreter.run_ssacfg_region(
                        op.combine, acc + cur, "scan.combine"
                    )
                )
                for out, v in zip(outs, acc):
                    out.store(idx, v)
        return ()

    @impl(scan.RecurrenceOp)
    def run_recurrence(
        self, interpreter: Interpreter, op: scan.RecurrenceOp, args: PythonValues
    ) -> PythonValues:
        lb, ub, step, state = args  # state: initial values in, final values out
        mul_add, _ = state_arith(op.state_type.element_type)
        indices = list(itertools.product(*(range(d) for d in state.shape)))
        for i in range(lb, ub, step):
            # All (a, b) of a step are computed before the state changes, matching the
            # op's contract that `coeffs` does not observe the state.
            coeffs = [
                interpreter.run_ssacfg_region(op.coeffs, (i, *k), "scan.coeffs")
                for k in indices
            ]
            for k, (a, b) in zip(indices, coeffs):
                state.store(k, mul_add(a, state.load(k), b))
            interpreter.run_ssacfg_region(op.emit, (i, state), "scan.emit")
        return ()

    @impl(scan.LinearRecurrenceOp)
    def run_linear_recurrence(
        self, interpreter: Interpreter, op: scan.LinearRecurrenceOp, args: PythonValues
    ) -> PythonValues:
        lb, ub, step, state = args  # state: initial values in, final values out
        el = op.state_type.element_type
        k = op.size
        for i in range(lb, ub, step):
            values = interpreter.run_ssacfg_region(op.coeffs, (i,), "scan.coeffs")
            m, v = values[: k * k], values[k * k :]
            old = [state.load((j,)) for j in range(k)]
            for j in range(k):
                acc = round_to(el, m[j * k] * old[0])
                for c in range(1, k):
                    acc = round_to(el, acc + round_to(el, m[j * k + c] * old[c]))
                state.store((j,), round_to(el, acc + v[j]))
            interpreter.run_ssacfg_region(op.emit, (i, state), "scan.emit")
        return ()

    @impl_terminator(scan.YieldOp)
    def run_yield(
        self, interpreter: Interpreter, op: scan.YieldOp, args: PythonValues
    ) -> tuple[TerminatorValue, PythonValues]:
        return ReturnedValues(args), ()
