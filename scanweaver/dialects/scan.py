"""The `scan` dialect: affine recurrences and associative scans on memrefs.

Three computational ops, all in destination-passing style on memrefs:

* `scan.affine`  — first-order affine recurrence `h_t = a_t * h_{t-1} + b_t` along one
  axis of N-d memrefs; every other dimension is an independent channel.
* `scan.scan`    — generic inclusive associative scan of k operands with a combine
  region (tuple state, like Triton's `tt.scan`).
* `scan.recurrence` — the fused form produced by raising loops: a `coeffs` region
  computes `(a, b)` per step and state element (the producer), an `emit` region reads
  the freshly updated state each step (the consumer). Lowerings fuse both into the scan,
  so no array of a, b or h is ever materialised unless the user's program stores it.

`scan.yield` terminates the regions.  Exact semantics (the golden reference) live in
`scanweaver/interp/scan_impls.py`.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    I64,
    BFloat16Type,
    ComplexType,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Dialect, Region, SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
    var_operand_def,
)
from xdsl.traits import (
    EffectInstance,
    IsTerminator,
    MemoryEffect,
    MemoryEffectKind,
    Pure,
    RecursiveMemoryEffect,
)
from xdsl.utils.exceptions import VerifyException

# ---------------------------------------------------------------------------
# Element-type rules
# ---------------------------------------------------------------------------

#: State types a recurrence can carry: float math or wrap-around integer math.
STATE_TYPES = (Float32Type, Float64Type)
LOW_PRECISION_INPUTS = (Float16Type, BFloat16Type)


SUPPORTED_STATES = "f32, f64, i32, i64, complex<f32> or complex<f64>"


def is_complex_state_type(t: Attribute) -> bool:
    """complex<f32> / complex<f64>: an affine recurrence over C is as associative as over R."""
    return isinstance(t, ComplexType) and isinstance(t.element_type, STATE_TYPES)


def is_supported_state_type(t: Attribute) -> bool:
    if isinstance(t, STATE_TYPES) or is_complex_state_type(t):
        return True
    return isinstance(t, IntegerType) and t.width.data in (32, 64)


def check_input_state_types(op_name: str, in_t: Attribute, state_t: Attribute) -> None:
    """Inputs share the state type, except f16/bf16 inputs which accumulate in f32.
    A complex state takes inputs of exactly its type (no widening, no real inputs)."""
    if not is_supported_state_type(state_t):
        raise VerifyException(
            f"'{op_name}': state element type {state_t} is not supported "
            f"(expected {SUPPORTED_STATES})"
        )
    if in_t == state_t:
        return
    if isinstance(state_t, ComplexType) or isinstance(in_t, ComplexType):
        raise VerifyException(
            f"'{op_name}': input element type {in_t} does not match state element type "
            f"{state_t} (a, b and h of a complex recurrence share one complex type)"
        )
    if isinstance(in_t, LOW_PRECISION_INPUTS) and isinstance(state_t, Float32Type):
        return
    raise VerifyException(
        f"'{op_name}': input element type {in_t} does not match state element type "
        f"{state_t} (only f16/bf16 inputs may widen to an f32 state)"
    )


def _memref(op_name: str, what: str, value: SSAValue) -> MemRefType:
    if not isinstance(value.type, MemRefType):
        raise VerifyException(f"'{op_name}': {what} must be a memref, got {value.type}")
    return value.type


def _check_same_shape(op_name: str, what: str, t: MemRefType, ref: MemRefType) -> None:
    shape, ref_shape = t.get_shape(), ref.get_shape()
    if len(shape) != len(ref_shape) or any(
        x != y and x != DYNAMIC_INDEX and y != DYNAMIC_INDEX for x, y in zip(shape, ref_shape)
    ):
        raise VerifyException(
            f"'{op_name}': {what} has shape {_shape_str(shape)}, expected "
            f"{_shape_str(ref_shape)}"
        )


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + "x".join("?" if d == DYNAMIC_INDEX else str(d) for d in shape) + ")"


def _check_axis(op_name: str, axis: int, rank: int) -> None:
    if rank < 1:
        raise VerifyException(f"'{op_name}': operands must have rank >= 1")
    if not 0 <= axis < rank:
        raise VerifyException(
            f"'{op_name}': axis {axis} is out of range for rank-{rank} operands "
            f"(expected 0 <= axis < {rank})"
        )


def _without_axis(shape: Sequence[int], axis: int) -> tuple[int, ...]:
    return tuple(d for i, d in enumerate(shape) if i != axis)


# ---------------------------------------------------------------------------
# Memory effects
# ---------------------------------------------------------------------------


class ReadsInputsWritesOutputs(MemoryEffect):
    """The op reads the memrefs of `read_operands()`, writes those of
    `written_operands()`, and has the effects of the ops in its regions.

    Declared so that generic passes (dce, cse, licm) see exactly what a scan touches:
    `RecursiveMemoryEffect` alone would call a scan with a pure combine region pure."""

    @classmethod
    def get_effects(cls, op):
        inner = RecursiveMemoryEffect.get_effects(op)
        if inner is None:
            return None
        reads = {EffectInstance(MemoryEffectKind.READ, v) for v in op.read_operands()}
        writes = {EffectInstance(MemoryEffectKind.WRITE, v) for v in op.written_operands()}
        return inner | reads | writes


# ---------------------------------------------------------------------------
# scan.yield
# ---------------------------------------------------------------------------


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Terminator of `scan.scan` and `scan.recurrence` regions."""

    name = "scan.yield"
    arguments = var_operand_def()
    assembly_format = "attr-dict ($arguments^ `:` type($arguments))?"
    traits = traits_def(IsTerminator(), Pure())

    def __init__(self, *operands: SSAValue):
        super().__init__(operands=[operands])


# ---------------------------------------------------------------------------
# scan.affine
# ---------------------------------------------------------------------------


class AlongAxis:
    """Accessors for ops with an `axis` property and an optional `reverse` flag."""

    @property
    def axis_value(self) -> int:
        return self.axis.value.data  # type: ignore[attr-defined]

    @property
    def is_reverse(self) -> bool:
        return self.reverse is not None  # type: ignore[attr-defined]


@irdl_op_definition
class AffineOp(AlongAxis, IRDLOperation):
    """`h_t = a_t * h_{t-1} + b_t` along `axis`; other dimensions are channels.

    `init` (optional, shape of h without `axis`) is `h_{-1}`; zero when absent.
    `final` (optional, same shape as init) receives the last state.
    With `reverse`, time runs from the end of the axis to its start.

        scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse
            : memref<4x128xf32>, memref<4x128xf32>, memref<4xf32>
            -> memref<4x128xf32>, memref<4xf32>
    """

    name = "scan.affine"

    a = operand_def(MemRefType)
    b = operand_def(MemRefType)
    init = opt_operand_def(MemRefType)
    h = operand_def(MemRefType)
    final = opt_operand_def(MemRefType)

    axis = prop_def(IntegerAttr[I64])
    reverse = opt_prop_def(UnitAttr)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(ReadsInputsWritesOutputs())
    assembly_format = (
        "$a `,` $b (`init` $init^)? `into` $h (`final` $final^)? `axis` $axis "
        "(`reverse` $reverse^)? attr-dict `:` type($a) `,` type($b) (`,` type($init)^)? "
        "`->` type($h) (`,` type($final)^)?"
    )

    def __init__(
        self,
        a: SSAValue,
        b: SSAValue,
        h: SSAValue,
        axis: int,
        *,
        init: SSAValue | None = None,
        final: SSAValue | None = None,
        reverse: bool = False,
    ):
        super().__init__(
            operands=[a, b, [init] if init else [], h, [final] if final else []],
            properties={
                "axis": IntegerAttr(axis, i64),
                **({"reverse": UnitAttr()} if reverse else {}),
            },
        )

    def read_operands(self) -> list[SSAValue]:
        return [self.a, self.b] + ([self.init] if self.init is not None else [])

    def written_operands(self) -> list[SSAValue]:
        return [self.h] + ([self.final] if self.final is not None else [])

    def verify_(self) -> None:
        n = self.name
        a_t = _memref(n, "operand 'a'", self.a)
        b_t = _memref(n, "operand 'b'", self.b)
        h_t = _memref(n, "operand 'h'", self.h)
        _check_axis(n, self.axis_value, h_t.get_num_dims())
        _check_same_shape(n, "operand 'a'", a_t, h_t)
        _check_same_shape(n, "operand 'b'", b_t, h_t)
        if a_t.element_type != b_t.element_type:
            raise VerifyException(
                f"'{n}': operands 'a' ({a_t.element_type}) and 'b' "
                f"({b_t.element_type}) must have the same element type"
            )
        check_input_state_types(n, a_t.element_type, h_t.element_type)
        channel_shape = _without_axis(h_t.get_shape(), self.axis_value)
        for what, v in (("init", self.init), ("final", self.final)):
            if v is None:
                continue
            t = _memref(n, f"operand '{what}'", v)
            if t.element_type != h_t.element_type:
                raise VerifyException(
                    f"'{n}': operand '{what}' has element type {t.element_type}, "
                    f"expected the state type {h_t.element_type}"
                )
            _check_same_shape(
                n,
                f"operand '{what}' (h without axis {self.axis_value})",
                t,
                MemRefType(h_t.element_type, channel_shape),
            )

# ---------------------------------------------------------------------------
# scan.scan
# ---------------------------------------------------------------------------


@irdl_op_definition
class ScanOp(AlongAxis, IRDLOperation):
    """Inclusive associative scan of k operands along `axis`.

    out[0] = in[0]; out[t] = combine(out[t-1], in[t]).  With `reverse` the axis is
    walked from its end: out[L-1] = in[L-1]; out[t] = combine(out[t+1], in[t]).
    The combine region takes 2k scalars (accumulator values first, then the new
    element's values) and yields k scalars.  Combine must be associative for parallel
    lowerings to agree with this sequential definition.

        scan.scan ins(%a, %b : memref<8x64xf32>, memref<8x64xf32>)
                  outs(%pa, %pb : memref<8x64xf32>, memref<8x64xf32>) axis 1 {
        ^bb0(%a1: f32, %b1: f32, %a2: f32, %b2: f32):
          ...
          scan.yield %ra, %rb : f32, f32
        }
    """

    name = "scan.scan"

    inputs = var_operand_def(MemRefType)
    outputs = var_operand_def(MemRefType)
    axis = prop_def(IntegerAttr[I64])
    reverse = opt_prop_def(UnitAttr)
    combine = region_def("single_block")

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(ReadsInputsWritesOutputs())
    # `attributes {...}` (with the keyword): a bare `{` would read as the region.
    assembly_format = (
        "`ins` `(` $inputs `:` type($inputs) `)` `outs` `(` $outputs `:` type($outputs) `)` "
        "`axis` $axis (`reverse` $reverse^)? attr-dict-with-keyword $combine"
    )

    def __init__(
        self,
        inputs: Sequence[SSAValue],
        outputs: Sequence[SSAValue],
        axis: int,
        combine: Region,
        *,
        reverse: bool = False,
    ):
        super().__init__(
            operands=[inputs, outputs],
            properties={
                "axis": IntegerAttr(axis, i64),
                **({"reverse": UnitAttr()} if reverse else {}),
            },
            regions=[combine],
        )

    def read_operands(self) -> Sequence[SSAValue]:
        return self.inputs

    def written_operands(self) -> Sequence[SSAValue]:
        return self.outputs

    def verify_(self) -> None:
        n = self.name
        k = len(self.inputs)
        if k == 0:
            raise VerifyException(f"'{n}': expected at least one input")
        if len(self.outputs) != k:
            raise VerifyException(
                f"'{n}': expected as many outputs as inputs ({k}), got "
                f"{len(self.outputs)}"
            )
        ref = _memref(n, "input #0", self.inputs[0])
        _check_axis(n, self.axis_value, ref.get_num_dims())
        el_types = []
        for i, (x, y) in enumerate(zip(self.inputs, self.outputs)):
            xt = _memref(n, f"input #{i}", x)
            yt = _memref(n, f"output #{i}", y)
            _check_same_shape(n, f"input #{i}", xt, ref)
            _check_same_shape(n, f"output #{i}", yt, ref)
            if xt.element_type != yt.element_type:
                raise VerifyException(
                    f"'{n}': output #{i} has element type {yt.element_type}, "
                    f"expected {xt.element_type} like input #{i}"
                )
            el_types.append(xt.element_type)
        block = self.combine.block
        arg_types = [a.type for a in block.args]
        if arg_types != el_types + el_types:
            raise VerifyException(
                f"'{n}': combine region must take {2 * k} arguments of types "
                f"({', '.join(map(str, el_types + el_types))}), got "
                f"({', '.join(map(str, arg_types))})"
            )
        last = block.last_op
        if not isinstance(last, YieldOp):
            raise VerifyException(f"'{n}': combine region must end with scan.yield")
        yielded = [v.type for v in last.arguments]
        if yielded != el_types:
            raise VerifyException(
                f"'{n}': combine region must yield {k} values of types "
                f"({', '.join(map(str, el_types))}), got "
                f"({', '.join(map(str, yielded))})"
            )

# ---------------------------------------------------------------------------
# scan.recurrence
# ---------------------------------------------------------------------------


class LoopRecurrence(IRDLOperation):
    """Shared shape of `scan.recurrence` and `scan.linear_recurrence`: a loop from `lb`
    to `ub` by `step` whose state lives in the `state` memref (initial values in, final
    values out), with a `coeffs` region (producer) and an `emit` region (consumer)."""

    lb = operand_def(IndexType)
    ub = operand_def(IndexType)
    step = operand_def(IndexType)
    state = operand_def(MemRefType)
    coeffs = region_def("single_block")
    emit = region_def("single_block")

    # The op reads and writes `state`; loads and stores of other memrefs sit in the regions.
    traits = traits_def(ReadsInputsWritesOutputs())
    assembly_format = (
        "$lb `to` $ub `step` $step `state` `(` $state `:` type($state) `)` "
        "attr-dict-with-keyword `coeffs` $coeffs `emit` $emit"
    )

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

    def read_operands(self) -> list[SSAValue]:
        return [self.state]

    def written_operands(self) -> list[SSAValue]:
        return [self.state]

    @property
    def state_type(self) -> MemRefType:
        assert isinstance(self.state.type, MemRefType)
        return self.state.type

    def _verify_state_and_emit(self) -> MemRefType:
        n = self.name
        st = _memref(n, "operand 'state'", self.state)
        if not is_supported_state_type(st.element_type):
            raise VerifyException(
                f"'{n}': state element type {st.element_type} is not supported "
                f"(expected {SUPPORTED_STATES})"
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
        return st

    def _coeff_types(self) -> tuple[list[Attribute], list[Attribute] | None]:
        """(argument types of coeffs, types it yields or None without a scan.yield)."""
        last = self.coeffs.block.last_op
        yielded = [v.type for v in last.arguments] if isinstance(last, YieldOp) else None
        return [a.type for a in self.coeffs.block.args], yielded

@irdl_op_definition
class RecurrenceOp(LoopRecurrence):
    """A loop-shaped affine recurrence with its producer and consumer attached.

    `state` is a memref (rank 0 for one scalar state, rank r for r-d channels) holding
    the initial state on entry and the final state on exit.  Sequential meaning:

        for i in range(lb, ub, step):
            for k in indices(state):
                a, b = coeffs(i, *k)
                state[k] = a * state[k] + b
            emit(i, state)

    `coeffs` must not read `state`; `emit` may read `state` but must not write it.
    Both may read any other memref; `emit` may write memrefs other than `state`.

        scan.recurrence %i = %lb to %ub step %c1 state(%h : memref<16xf32>)
        coeffs {
        ^bb0(%i: index, %n: index):
          ...
          scan.yield %a, %b : f32, f32
        } emit {
        ^bb0(%i: index, %s: memref<16xf32>):
          ...
          scan.yield
        }
    """

    name = "scan.recurrence"

    def verify_(self) -> None:
        n = self.name
        st = self._verify_state_and_emit()
        el = st.element_type
        rank = st.get_num_dims()
        cargs, yielded = self._coeff_types()
        if cargs != [IndexType()] * (1 + rank):
            raise VerifyException(
                f"'{n}': coeffs region must take {1 + rank} index arguments (the step "
                f"index, then one per state dimension), got "
                f"({', '.join(map(str, cargs))})"
            )
        if yielded != [el, el]:
            raise VerifyException(
                f"'{n}': coeffs region must end with 'scan.yield %a, %b : {el}, {el}'"
            )


@irdl_op_definition
class LinearRecurrenceOp(LoopRecurrence):
    """A coupled (matrix-valued) affine recurrence over a K-vector state.

    The raise pass produces it for loops carrying K > 1 values that depend linearly on
    each other, e.g. a second-order IIR filter `y_t = c1*y_{t-1} + c2*y_{t-2} + x_t`
    carried as `(y_{t-1}, y_{t-2})`.  The step map `s -> M_t s + v_t` composes
    associatively (`(M1, v1) • (M2, v2) = (M2 M1, M2 v1 + v2)`), so it scans like
    `scan.recurrence`.  `state` is a `memref<KxT>`.  Sequential meaning (each product
    and sum rounded to T, summed left to right):

        for i in range(lb, ub, step):
            M[K][K], v[K] = coeffs(i)          # yields M row-major, then v: K*K + K values
            s'[j] = (((M[j][0]*s[0]) + M[j][1]*s[1]) + ... + M[j][K-1]*s[K-1]) + v[j]
            state = s'
            emit(i, state)

    `coeffs` must not read `state`; `emit` may read but not write it.
    """

    name = "scan.linear_recurrence"

    @property
    def size(self) -> int:
        return self.state_type.get_shape()[0]

    def verify_(self) -> None:
        n = self.name
        st = self._verify_state_and_emit()
        el = st.element_type
        if isinstance(el, ComplexType):
            raise VerifyException(
                f"'{n}': a complex state is not supported for the coupled (matrix) "
                "recurrence; use scan.recurrence (complex state is diagonal)"
            )
        shape = st.get_shape()
        if len(shape) != 1 or shape[0] < 1:
            raise VerifyException(
                f"'{n}': state must be a rank-1 memref of static size K >= 1, got {st}"
            )
        k = shape[0]
        cargs, yielded = self._coeff_types()
        if cargs != [IndexType()]:
            raise VerifyException(
                f"'{n}': coeffs region must take one index argument (the step index), "
                f"got ({', '.join(map(str, cargs))})"
            )
        want = k * k + k
        if yielded != [el] * want:
            raise VerifyException(
                f"'{n}': coeffs region must end with a 'scan.yield' of {want} values "
                f"of type {el} (the {k}x{k} matrix row-major, then the {k}-vector)"
            )


Scan = Dialect("scan", [AffineOp, ScanOp, RecurrenceOp, LinearRecurrenceOp, YieldOp], [])
