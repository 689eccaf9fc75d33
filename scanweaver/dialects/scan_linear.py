"""`scan.linear_recurrence`: a coupled (matrix-valued) affine recurrence.

Registered into the `scan` dialect (see `scan.py`'s `Scan = Dialect(...)`).  The raise
pass produces it for loops carrying K > 1 values that depend linearly on each other,
e.g. a second-order IIR filter `y_t = c1*y_{t-1} + c2*y_{t-2} + x_t` carried as
`(y_{t-1}, y_{t-2})`.  The step map `s -> M_t s + v_t` composes associatively
(`(M1, v1) • (M2, v2) = (M2 M1, M2 v1 + v2)`), so it scans like `scan.recurrence`.

`state` is a `memref<Kx T>` holding the initial state on entry and the final state on
exit.  Sequential meaning (each product and sum rounded to T, summed left to right):

    for i in range(lb, ub, step):
        M[K][K], v[K] = coeffs(i)          # yields M row-major, then v: K*K + K values
        s'[j] = (((M[j][0]*s[0]) + M[j][1]*s[1]) + ... + M[j][K-1]*s[K-1]) + v[j]
        state = s'
        emit(i, state)

`coeffs` must not read `state`; `emit` may read but not write it.

    scan.linear_recurrence %lb to %ub step %c1 state(%s : memref<2xf32>)
    coeffs {
    ^bb0(%i: index):
      ...
      scan.yield %m00, %m01, %m10, %m11, %v0, %v1 : f32, f32, f32, f32, f32, f32
    } emit {
    ^bb0(%i: index, %s: memref<2xf32>):
      scan.yield
    }
"""

from __future__ import annotations

from xdsl.dialects.builtin import IndexType, MemRefType
from xdsl.ir import Region, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, region_def, traits_def
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import RecursiveMemoryEffect
from xdsl.utils.exceptions import VerifyException

# `scan.py` imports this module to register the op, so this module takes what it needs
# from `scan.py` inside functions, never at import time (no import cycle either way).


@irdl_op_definition
class LinearRecurrenceOp(IRDLOperation):
    """`s_t = M_t s_{t-1} + v_t` over a K-vector state; see the module docstring."""

    name = "scan.linear_recurrence"

    lb = operand_def(IndexType)
    ub = operand_def(IndexType)
    step = operand_def(IndexType)
    state = operand_def(MemRefType)
    coeffs = region_def("single_block")
    emit = region_def("single_block")

    traits = traits_def(RecursiveMemoryEffect())

    def __init__(
        self,
        lb: SSAValue,
        ub: SSAValue,
        step: SSAValue,
        state: SSAValue,
        coeffs: Region,
        emit: Region,
    ):
        super().__init__(operands=[lb, ub, step, state], regions=[coeffs, emit])

    @property
    def state_type(self) -> MemRefType:
        assert isinstance(self.state.type, MemRefType)
        return self.state.type

    @property
    def size(self) -> int:
        return self.state_type.get_shape()[0]

    def verify_(self) -> None:
        from scanweaver.dialects.scan import YieldOp, _memref, is_supported_state_type

        n = self.name
        st = _memref(n, "operand 'state'", self.state)
        el = st.element_type
        if not is_supported_state_type(el):
            raise VerifyException(
                f"'{n}': state element type {el} is not supported "
                "(expected f32, f64, i32 or i64)"
            )
        shape = st.get_shape()
        if len(shape) != 1 or shape[0] < 1:
            raise VerifyException(
                f"'{n}': state must be a rank-1 memref of static size K >= 1, got {st}"
            )
        k = shape[0]
        cargs = [a.type for a in self.coeffs.block.args]
        if cargs != [IndexType()]:
            raise VerifyException(
                f"'{n}': coeffs region must take one index argument (the step index), "
                f"got ({', '.join(map(str, cargs))})"
            )
        last = self.coeffs.block.last_op
        want = k * k + k
        if not isinstance(last, YieldOp) or [v.type for v in last.arguments] != [
            el
        ] * want:
            raise VerifyException(
                f"'{n}': coeffs region must end with a 'scan.yield' of {want} values "
                f"of type {el} (the {k}x{k} matrix row-major, then the {k}-vector)"
            )
        eargs = [a.type for a in self.emit.block.args]
        if eargs != [IndexType(), st]:
            raise VerifyException(
                f"'{n}': emit region must take (index, {st}) arguments, got "
                f"({', '.join(map(str, eargs))})"
            )
        last = self.emit.block.last_op
        if not isinstance(last, YieldOp) or last.arguments:
            raise VerifyException(
                f"'{n}': emit region must end with a 'scan.yield' without values"
            )

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.lb)
        printer.print_string(" to ")
        printer.print_operand(self.ub)
        printer.print_string(" step ")
        printer.print_operand(self.step)
        printer.print_string(" state(")
        printer.print_operand(self.state)
        printer.print_string(" : ")
        printer.print_attribute(self.state.type)
        printer.print_string(")")
        printer.print_op_attributes(self.attributes, print_keyword=True)
        printer.print_string(" coeffs ")
        printer.print_region(self.coeffs)
        printer.print_string(" emit ")
        printer.print_region(self.emit)

    @classmethod
    def parse(cls, parser: Parser) -> LinearRecurrenceOp:
        from scanweaver.dialects.scan import _parse_keyword_attrs

        idx = IndexType()
        lb = parser.resolve_operand(parser.parse_unresolved_operand(), idx)
        parser.parse_keyword("to")
        ub = parser.resolve_operand(parser.parse_unresolved_operand(), idx)
        parser.parse_keyword("step")
        step = parser.resolve_operand(parser.parse_unresolved_operand(), idx)
        parser.parse_keyword("state")
        parser.parse_punctuation("(")
        name = parser.parse_unresolved_operand()
        parser.parse_punctuation(":")
        state = parser.resolve_operand(name, parser.parse_type())
        parser.parse_punctuation(")")
        attrs = _parse_keyword_attrs(parser)
        parser.parse_keyword("coeffs")
        coeffs = parser.parse_region()
        parser.parse_keyword("emit")
        emit = parser.parse_region()
        op = cls(lb, ub, step, state, coeffs, emit)
        op.attributes.update(attrs)
        return op
