"""`scan-affine-to-pairs`: an affine recurrence as an associative scan over (a, b) pairs.

    h_t = a_t * h_{t-1} + b_t

is the inclusive scan of the pairs (a_t, b_t) under

    (a1, b1) • (a2, b2) = (a1 * a2,  a2 * b1 + b2)        (apply 1 first, then 2)

whose b component is h_t.  The initial state is folded into the first element of the
time order (`b_first := a_first * h0 + b_first`), so the scan starts from the exact
value the sequential recurrence computes first; `reverse` keeps its meaning on the
`scan.scan`.  The b component is rounded exactly like the sequential form
(`round(round(a2 * b1) + b2)`), so the sequential reading of the scan agrees bit for
bit with the reference `scan.affine`.

`scan.affine %a, %b init %h0 into %h final %hT axis k` becomes

    %pa, %pb = alloc            (state-typed copies of a, b; f16/bf16 widened by extf)
    copy a -> pa, b -> pb       (scf loops)
    pb[first] = pa[first] * h0[c] + pb[first]      (per channel c, if init and L > 0)
    %qa = alloc
    scan.scan ins(%pa, %pb) outs(%qa, %h) axis k [reverse] { pair combine }
    hT[c] = h[last]  (or h0 / 0 when L == 0)
    dealloc %pa, %pb, %qa

The helpers here (`Emitter`, `PairArith`) are shared with the GPU lowering: the
combine is emitted as plain `arith` ops in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, memref, scf
from xdsl.dialects import complex as cx
from xdsl.dialects.builtin import (
    ComplexType,
    DYNAMIC_INDEX,
    Float32Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan

# ---------------------------------------------------------------------------
# Small IR emission helpers (shared with the GPU lowering)
# ---------------------------------------------------------------------------


class Emitter:
    """Appends ops at an insertion point; structured control flow through callbacks."""

    def __init__(self, where: InsertPoint | Block, parent: Emitter | None = None):
        if isinstance(where, Block):
            where = InsertPoint.at_end(where)
        self.builder = Builder(where)
        # Constants are created once, at the outermost emitter's insertion point (which
        # dominates every nested region built from it), and reused.
        self._const_builder: Builder = parent._const_builder if parent else self.builder
        self._consts: dict[tuple[object, Attribute], SSAValue] = parent._consts if parent else {}

    def child(self, block: Block) -> Emitter:
        return Emitter(block, self)

    def op(self, op: Operation) -> Operation:
        self.builder.insert(op)
        return op

    def val(self, op: Operation) -> SSAValue:
        return self.op(op).results[0]

    # -- constants ---------------------------------------------------------------
    def index(self, value: int) -> SSAValue:
        return self.const(value, IndexType())

    def const(self, value: int | float, t: Attribute) -> SSAValue:
        is_int = isinstance(t, (IntegerType, IndexType))
        key = (int(value) if is_int else float(value), t)
        if key not in self._consts:
            if isinstance(t, ComplexType):  # value + 0i
                op = cx.ConstantOp.from_floats((float(value), 0.0), t.element_type)  # type: ignore[arg-type]
                self._const_builder.insert(op)
                self._consts[key] = op.complex
                return op.complex
            attr = IntegerAttr(int(value), t) if is_int else FloatAttr(float(value), t)  # type: ignore[arg-type]
            op = arith.ConstantOp(attr)
            self._const_builder.insert(op)
            self._consts[key] = op.result
        return self._consts[key]

    # -- index arithmetic ----------------------------------------------------------
    def add(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.val(arith.AddiOp(x, y))

    def sub(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.val(arith.SubiOp(x, y))

    def mul(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.val(arith.MuliOp(x, y))

    def divu(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.val(arith.DivUIOp(x, y))

    def remu(self, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.val(arith.RemUIOp(x, y))

    def cmp(self, pred: str, x: SSAValue, y: SSAValue) -> SSAValue:
        return self.val(arith.CmpiOp(x, y, pred))

    # -- memory -----------------------------------------------------------------------
    def load(self, ref: SSAValue, indices: Sequence[SSAValue]) -> SSAValue:
        return self.val(memref.LoadOp.get(ref, list(indices)))

    def store(self, value: SSAValue, ref: SSAValue, indices: Sequence[SSAValue]) -> None:
        self.op(memref.StoreOp.get(value, ref, list(indices)))

    def dim(self, ref: SSAValue, axis: int) -> SSAValue:
        t = ref.type
        assert isinstance(t, MemRefType)
        size = t.get_shape()[axis]
        if size != DYNAMIC_INDEX:
            return self.index(size)
        return self.val(memref.DimOp(ref, self.index(axis)))

    # -- structured control flow ------------------------------------------------------------
    def for_(
        self,
        lb: SSAValue,
        ub: SSAValue,
        step: SSAValue,
        iter_args: Sequence[SSAValue],
        body: Callable[[Emitter, SSAValue, Sequence[SSAValue]], Sequence[SSAValue] | None],
    ) -> Sequence[SSAValue]:
        block = Block(arg_types=[IndexType(), *(v.type for v in iter_args)])
        inner = self.child(block)
        yielded = body(inner, block.args[0], block.args[1:]) or []
        inner.op(scf.YieldOp(*yielded))
        loop = self.op(scf.ForOp(lb, ub, step, list(iter_args), block))
        return loop.results

    def if_(
        self,
        cond: SSAValue,
        result_types: Sequence[Attribute],
        then: Callable[[Emitter], Sequence[SSAValue] | None],
        else_: Callable[[Emitter], Sequence[SSAValue] | None] | None = None,
    ) -> Sequence[SSAValue]:
        then_block = Block()
        inner = self.child(then_block)
        inner.op(scf.YieldOp(*(then(inner) or [])))
        else_region: Region | None = None
        if else_ is not None or result_types:
            else_block = Block()
            other = self.child(else_block)
            other.op(scf.YieldOp(*((else_(other) if else_ else None) or [])))
            else_region = Region(else_block)
        op = self.op(scf.IfOp(cond, list(result_types), Region(then_block), else_region))
        return op.results

    def loop_nest(
        self,
        bounds: Sequence[SSAValue],
        body: Callable[[Emitter, list[SSAValue]], None],
    ) -> None:
        """Perfect scf.for nest over [0, bound) for each bound (row-major)."""
        zero, one = self.index(0), self.index(1)

        def level(e: Emitter, depth: int, ivs: list[SSAValue]) -> None:
            if depth == len(bounds):
                body(e, ivs)
                return
            e.for_(zero, bounds[depth], one, [], lambda ie, iv, _: level(ie, depth + 1, [*ivs, iv]))

        level(self, 0, [])


@dataclass(frozen=True)
class PairArith:
    """Arithmetic of the affine pair monoid over one state type (float, wrapping int, or
    complex: `complex.mul`/`complex.add`, which `scan-complex-to-real` later makes the
    interpreter's real formulas on (re, im) registers)."""

    state_type: Attribute

    @property
    def is_int(self) -> bool:
        return isinstance(self.state_type, IntegerType)

    @property
    def is_complex(self) -> bool:
        return isinstance(self.state_type, ComplexType)

    def mul(self, e: Emitter, x: SSAValue, y: SSAValue) -> SSAValue:
        if self.is_complex:
            return e.val(cx.MulOp(x, y))
        return e.val(arith.MuliOp(x, y) if self.is_int else arith.MulfOp(x, y))

    def add(self, e: Emitter, x: SSAValue, y: SSAValue) -> SSAValue:
        if self.is_complex:
            return e.val(cx.AddOp(x, y))
        return e.val(arith.AddiOp(x, y) if self.is_int else arith.AddfOp(x, y))

    def one(self, e: Emitter) -> SSAValue:
        return e.const(1, self.state_type)

    def zero(self, e: Emitter) -> SSAValue:
        return e.const(0, self.state_type)

    def identity(self, e: Emitter) -> tuple[SSAValue, SSAValue]:
        """(1, 0): leaves every state unchanged."""
        return self.one(e), self.zero(e)

    def apply(self, e: Emitter, a: SSAValue, h: SSAValue, b: SSAValue) -> SSAValue:
        """a * h + b, product and sum rounded separately (like the reference)."""
        return self.add(e, self.mul(e, a, h), b)

    def combine(
        self,
        e: Emitter,
        first: tuple[SSAValue, SSAValue],
        second: tuple[SSAValue, SSAValue],
    ) -> tuple[SSAValue, SSAValue]:
        """(a1, b1) • (a2, b2) = (a1 * a2, a2 * b1 + b2): apply `first`, then `second`."""
        (a1, b1), (a2, b2) = first, second
        return self.mul(e, a1, a2), self.apply(e, a2, b1, b2)

    def widen(self, e: Emitter, value: SSAValue) -> SSAValue:
        """Bring an input element to the state type (f16/bf16 -> f32 via extf)."""
        if value.type == self.state_type:
            return value
        assert isinstance(self.state_type, Float32Type), "only f16/bf16 inputs widen"
        return e.val(arith.ExtFOp(value, self.state_type))

    def combine_region(self) -> Region:
        """The `scan.scan` combine region `(a1, b1, a2, b2) -> (a, b)`."""
        t = self.state_type
        block = Block(arg_types=[t, t, t, t])
        e = Emitter(block)
        a1, b1, a2, b2 = block.args
        a, b = self.combine(e, (a1, b1), (a2, b2))
        e.op(scan.YieldOp(a, b))
        return Region(block)


def is_pair_combine(op: scan.ScanOp) -> bool:
    """True when `op` is a 2-operand scan whose combine is exactly `PairArith.combine`."""
    if len(op.inputs) != 2:
        return False
    block = op.combine.block
    ops = list(block.ops)
    if len(ops) != 4:
        return False
    a1, b1, a2, b2 = block.args
    mul_ab, mul_ba, add, yld = ops
    muls = (arith.MulfOp, arith.MuliOp)
    adds = (arith.AddfOp, arith.AddiOp)
    if not (isinstance(mul_ab, muls) and isinstance(mul_ba, muls) and isinstance(add, adds)):
        return False
    if not isinstance(yld, scan.YieldOp):
        return False
    return (
        {mul_ab.lhs, mul_ab.rhs} == {a1, a2}
        and {mul_ba.lhs, mul_ba.rhs} == {a2, b1}
        and {add.lhs, add.rhs} == {mul_ba.result, b2}
        and tuple(yld.arguments) == (mul_ab.result, add.result)
    )


# ---------------------------------------------------------------------------
# The rewrite
# ---------------------------------------------------------------------------


def _with_axis(channel: Sequence[SSAValue], axis: int, t: SSAValue) -> list[SSAValue]:
    return [*channel[:axis], t, *channel[axis:]]


class AffineToPairScan(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.AffineOp, rewriter: PatternRewriter, /):
        h_type = op.h.type
        assert isinstance(h_type, MemRefType)
        state_t = h_type.element_type
        pairs = PairArith(state_t)
        axis = op.axis_value
        rank = h_type.get_num_dims()
        e = Emitter(InsertPoint.before(op))

        dyn = [e.dim(op.h, i) for i in range(rank) if h_type.get_shape()[i] == DYNAMIC_INDEX]
        pair_t = MemRefType(state_t, h_type.get_shape())
        pa = e.val(memref.AllocOp(dyn, [], pair_t))
        pb = e.val(memref.AllocOp(dyn, [], pair_t))
        qa = e.val(memref.AllocOp(dyn, [], pair_t))

        bounds = [e.dim(op.h, i) for i in range(rank)]

        def copy(ie: Emitter, ivs: list[SSAValue]) -> None:
            ie.store(pairs.widen(ie, ie.load(op.a, ivs)), pa, ivs)
            ie.store(pairs.widen(ie, ie.load(op.b, ivs)), pb, ivs)

        e.loop_nest(bounds, copy)

        length = bounds[axis]
        zero_i, one_i = e.index(0), e.index(1)
        first = e.sub(length, one_i) if op.is_reverse else zero_i
        last = zero_i if op.is_reverse else e.sub(length, one_i)
        nonempty = e.cmp("sgt", length, zero_i)
        channel_bounds = [b for i, b in enumerate(bounds) if i != axis]

        if op.init is not None:
            init = op.init

            def fold_init(ie: Emitter) -> None:
                def per_channel(ce: Emitter, ch: list[SSAValue]) -> None:
                    idx = _with_axis(ch, axis, first)
                    b0 = pairs.apply(ce, ce.load(pa, idx), ce.load(init, ch), ce.load(pb, idx))
                    ce.store(b0, pb, idx)

                ie.loop_nest(channel_bounds, per_channel)

            e.if_(nonempty, [], fold_init)

        e.op(scan.ScanOp([pa, pb], [qa, op.h], axis, pairs.combine_region(), reverse=op.is_reverse))

        if op.final is not None:
            final, init = op.final, op.init

            def write_final(ie: Emitter) -> None:
                def per_channel(ce: Emitter, ch: list[SSAValue]) -> None:
                    ce.store(ce.load(op.h, _with_axis(ch, axis, last)), final, ch)

                ie.loop_nest(channel_bounds, per_channel)

            def write_init(ie: Emitter) -> None:
                def per_channel(ce: Emitter, ch: list[SSAValue]) -> None:
                    v = ce.load(init, ch) if init is not None else pairs.zero(ce)
                    ce.store(v, final, ch)

                ie.loop_nest(channel_bounds, per_channel)

            e.if_(nonempty, [], write_final, write_init)

        for buf in (pa, pb, qa):
            e.op(memref.DeallocOp.get(buf))
        rewriter.erase(op)


@dataclass(frozen=True)
class AffineToPairs(ModulePass):
    """Rewrite every `scan.affine` as a `scan.scan` over (a, b) pairs (see module doc)."""

    name = "scan-affine-to-pairs"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(AffineToPairScan(), apply_recursively=False).rewrite_module(op)
