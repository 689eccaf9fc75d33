"""Reference (sequential) semantics of `scan.linear_recurrence` for the xDSL interpreter.

Register with `interpreter.register_implementations(LinearScanFunctions())`.
"""

from __future__ import annotations

from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)

from scanweaver.dialects.scan_linear import LinearRecurrenceOp
from scanweaver.interp.numerics import round_to


@register_impls
class LinearScanFunctions(InterpreterFunctions):
    @impl(LinearRecurrenceOp)
    def run_linear_recurrence(
        self, interpreter: Interpreter, op: LinearRecurrenceOp, args: PythonValues
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
