"""`scan-complex-affine-to-loops`: a complex `scan.affine` whose axis is not the last
dimension becomes time-major loops, the channels after the axis innermost.

    for outer channels o (dims before the axis):
      t0:  h[o, t0, i] = a[o, t0, i] * init[o, i] + b[o, t0, i]      for all i
      t:   h[o, t, i]  = a[o, t, i] * h[o, t-1, i] + b[o, t, i]      for all i (t after t0)
      final[o, i] = h[o, t_last, i]

The inner loop runs over independent channels that are contiguous in memory: its
iterations overlap (throughput-bound) where a channel-at-a-time loop waits on the
complex multiply-add chain of one channel (latency-bound), and the API scans
(L, N) data along axis 0 with no transposed copies.  The arithmetic per element is the
reference's (complex.mul then complex.add, `scan-complex-to-real` makes it real), so
results are bit for bit those of `scan-to-loops`.  Real states and last-axis scans are
left to the other lowerings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, memref, scf
from xdsl.dialects.builtin import ComplexType, ModuleOp
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan
from scanweaver.rewrites.complex_gpu import MAX_COMPLEX_STATE
from scanweaver.rewrites.loop_utils import const_index, const_scalar, dim_sizes, for_loop, loop_nest, mul_add


class LowerComplexAffineTimeMajor(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.AffineOp, rewriter: PatternRewriter) -> None:
        state_t = op.h.type.element_type  # type: ignore[attr-defined]
        rank = op.h.type.get_num_dims()  # type: ignore[attr-defined]
        axis = op.axis_value
        if not isinstance(state_t, ComplexType) or axis == rank - 1:
            return
        b = Builder(InsertPoint.before(op))
        sizes = dim_sizes(b, op.h)
        length, outer_sizes, inner_sizes = sizes[axis], sizes[:axis], sizes[axis + 1 :]
        zero, one = const_index(b, 0), const_index(b, 1)
        last = b.insert(arith.SubiOp(length, one)).result
        first_t, last_t = (last, zero) if op.is_reverse else (zero, last)
        non_empty = b.insert(arith.CmpiOp(zero, length, "ult")).result

        def at(o, t, i) -> list[SSAValue]:
            return [*o, t, *i]

        def per_outer(ob: Builder, o) -> None:
            def first_step(ib: Builder, i) -> None:
                prev = (
                    ib.insert(memref.LoadOp.get(op.init, [*o, *i])).res
                    if op.init is not None
                    else const_scalar(ib, 0, state_t)
                )
                self._step(ib, op, at(o, first_t, i), prev)

            def later_step(tb: Builder, k: SSAValue, _carried):
                # k = 1 .. L-1 steps after the first: t = k (forward) or L-1-k (reverse)
                t = tb.insert(arith.SubiOp(last, k)).result if op.is_reverse else k
                t_prev = (
                    tb.insert(arith.AddiOp(t, one)).result
                    if op.is_reverse
                    else tb.insert(arith.SubiOp(t, one)).result
                )

                def inner(ib: Builder, i) -> None:
                    prev = ib.insert(memref.LoadOp.get(op.h, at(o, t_prev, i))).res
                    self._step(ib, op, at(o, t, i), prev)

                loop_nest(tb, inner_sizes, inner)
                return []

            loop_nest(ob, inner_sizes, first_step)
            for_loop(ob, one, length, one, [], later_step)
            if op.final is not None:
                final = op.final

                def copy_final(ib: Builder, i) -> None:
                    v = ib.insert(memref.LoadOp.get(op.h, at(o, last_t, i))).res
                    ib.insert(memref.StoreOp.get(v, final, [*o, *i]))

                loop_nest(ob, inner_sizes, copy_final)

        then_block = Block()
        tb = Builder(InsertPoint.at_end(then_block))
        loop_nest(tb, outer_sizes, per_outer)
        tb.insert(scf.YieldOp())
        else_block = Block()
        eb = Builder(InsertPoint.at_end(else_block))
        if op.final is not None and op.init is not None:  # an empty axis: final = init
            fin, ini = op.final, op.init

            def copy_init(cb: Builder, idx) -> None:
                cb.insert(memref.StoreOp.get(cb.insert(memref.LoadOp.get(ini, idx)).res, fin, idx))

            loop_nest(eb, [*outer_sizes, *inner_sizes], copy_init)
        elif op.final is not None:
            fin = op.final

            def zero_final(cb: Builder, idx) -> None:
                cb.insert(memref.StoreOp.get(const_scalar(cb, 0, state_t), fin, idx))

            loop_nest(eb, [*outer_sizes, *inner_sizes], zero_final)
        eb.insert(scf.YieldOp())
        b.insert(scf.IfOp(non_empty, [], Region(then_block), Region(else_block)))
        rewriter.erase(op)

    @staticmethod
    def _step(b: Builder, op: scan.AffineOp, idx: list[SSAValue], prev: SSAValue) -> None:
        a = b.insert(memref.LoadOp.get(op.a, idx)).res
        x = b.insert(memref.LoadOp.get(op.b, idx)).res
        b.insert(memref.StoreOp.get(mul_add(b, a, prev, x), op.h, idx))


@dataclass(frozen=True)
class ComplexAffineToLoops(ModulePass):
    """Time-major loops for complex scan.affine along a non-last axis."""

    name = "scan-complex-affine-to-loops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(LowerComplexAffineTimeMajor(), apply_recursively=False).rewrite_module(op)


def _has_complex_state(op) -> bool:
    if isinstance(op, scan.AffineOp):
        return isinstance(op.h.type.element_type, ComplexType)  # type: ignore[attr-defined]
    if isinstance(op, scan.RecurrenceOp):
        # a static state of several complex values is left to scan-to-gpu's diagonal
        # recurrence kernel (complex pairs; what it refuses becomes loops there)
        st = op.state_type
        several = st.get_num_dims() > 0 and st.has_static_shape() and 1 < math.prod(st.get_shape()) <= MAX_COMPLEX_STATE
        return isinstance(st.element_type, ComplexType) and not several
    if isinstance(op, scan.ScanOp):
        return any(isinstance(v.type.element_type, ComplexType) for v in op.inputs)  # type: ignore[attr-defined]
    return False


class ComplexScanToHostLoops(RewritePattern):
    """The sequential loops of `scan-to-loops`, for complex-state scan ops only."""

    def match_and_rewrite(self, op, rewriter: PatternRewriter) -> None:
        if not _has_complex_state(op):
            return
        from scanweaver.rewrites.scan_to_loops import LowerAffine, LowerRecurrence, LowerScan

        for pattern in (LowerAffine(), LowerScan(), LowerRecurrence()):
            pattern.match_and_rewrite(op, rewriter)


@dataclass(frozen=True)
class ComplexScansToLoops(ModulePass):
    """GPU target: complex scans without a GPU kernel (complex `scan.affine`/`scan.scan`,
    a `scan.recurrence` over more than one complex value) become sequential loops (the
    host part of the program) before `scan-to-gpu` sees them."""

    name = "scan-complex-to-host-loops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(ComplexScanToHostLoops(), apply_recursively=False).rewrite_module(op)


__all__ = ["ComplexAffineToLoops", "ComplexScansToLoops"]
