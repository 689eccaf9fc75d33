"""Sequential lowering: every scan op becomes plain `scf.for` loops.

This is the meaning of the dialect written as loops; it is the fallback when no
parallel lowering applies, and a cross-check of the interpreter's reference semantics
(the loops, interpreted or compiled, must give the reference's numbers bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, memref, scf
from xdsl.dialects.builtin import IntegerType, ModuleOp
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan
from scanweaver.dialects.scan import LinearRecurrenceOp
from scanweaver.rewrites.loop_utils import (
    const_index,
    const_scalar,
    dim_sizes,
    for_loop,
    inline_region_copy,
    load_as,
    loop_nest,
    mul_add,
)


def _time_index(b: Builder, i: SSAValue, length: SSAValue, reverse: bool) -> SSAValue:
    """t = i, or t = length-1-i when walking the axis backwards."""
    if not reverse:
        return i
    last = b.insert(arith.SubiOp(length, const_index(b, 1))).result
    return b.insert(arith.SubiOp(last, i)).result


def _insert_axis(channel, axis: int, t: SSAValue) -> list[SSAValue]:
    return [*channel[:axis], t, *channel[axis:]]


class LowerAffine(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.AffineOp, rewriter: PatternRewriter) -> None:
        b = Builder(InsertPoint.before(op))
        state_t = op.h.type.element_type  # type: ignore[attr-defined]
        axis = op.axis_value
        sizes = dim_sizes(b, op.h)
        length = sizes[axis]
        channel_sizes = sizes[:axis] + sizes[axis + 1 :]

        def per_channel(cb: Builder, channel) -> None:
            h0 = (
                cb.insert(memref.LoadOp.get(op.init, channel)).res
                if op.init is not None
                else const_scalar(cb, 0, state_t)
            )

            def step(sb: Builder, i: SSAValue, carried):
                t = _time_index(sb, i, length, op.is_reverse)
                idx = _insert_axis(channel, axis, t)
                a = load_as(sb, op.a, idx, state_t)
                x = load_as(sb, op.b, idx, state_t)
                h = mul_add(sb, a, carried[0], x)
                sb.insert(memref.StoreOp.get(h, op.h, idx))
                return [h]

            (last,) = for_loop(
                cb, const_index(cb, 0), length, const_index(cb, 1), [h0], step
            )
            if op.final is not None:
                cb.insert(memref.StoreOp.get(last, op.final, channel))

        loop_nest(b, channel_sizes, per_channel)
        rewriter.erase(op)


class LowerScan(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.ScanOp, rewriter: PatternRewriter) -> None:
        b = Builder(InsertPoint.before(op))
        axis = op.axis_value
        sizes = dim_sizes(b, op.inputs[0])
        length = sizes[axis]
        channel_sizes = sizes[:axis] + sizes[axis + 1 :]
        zero, one = const_index(b, 0), const_index(b, 1)
        non_empty = b.insert(
            arith.CmpiOp(zero, length, "ult")
        ).result  # an empty axis has no first element to seed the scan with

        then_block = Block()
        tb = Builder(InsertPoint.at_end(then_block))

        def per_channel(cb: Builder, channel) -> None:
            first = _insert_axis(channel, axis, _time_index(cb, zero, length, op.is_reverse))
            seed = [cb.insert(memref.LoadOp.get(x, first)).res for x in op.inputs]
            for v, out in zip(seed, op.outputs):
                cb.insert(memref.StoreOp.get(v, out, first))

            def step(sb: Builder, i: SSAValue, carried):
                idx = _insert_axis(channel, axis, _time_index(sb, i, length, op.is_reverse))
                cur = [sb.insert(memref.LoadOp.get(x, idx)).res for x in op.inputs]
                acc = inline_region_copy(sb, op.combine, [*carried, *cur])
                for v, out in zip(acc, op.outputs):
                    sb.insert(memref.StoreOp.get(v, out, idx))
                return acc

            for_loop(cb, one, length, one, seed, step)

        loop_nest(tb, channel_sizes, per_channel)
        tb.insert(scf.YieldOp())
        b.insert(scf.IfOp(non_empty, [], Region(then_block), Region(Block([scf.YieldOp()]))))
        rewriter.erase(op)


class LowerRecurrence(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(
        self, op: scan.RecurrenceOp, rewriter: PatternRewriter
    ) -> None:
        b = Builder(InsertPoint.before(op))
        state_sizes = dim_sizes(b, op.state)

        def step(sb: Builder, i: SSAValue, _carried):
            def update(ub: Builder, k) -> None:
                a, x = inline_region_copy(ub, op.coeffs, [i, *k])
                h = ub.insert(memref.LoadOp.get(op.state, k)).res
                ub.insert(memref.StoreOp.get(mul_add(ub, a, h, x), op.state, k))

            loop_nest(sb, state_sizes, update)
            inline_region_copy(sb, op.emit, [i, op.state])
            return []

        for_loop(b, op.lb, op.ub, op.step, [], step)
        rewriter.erase(op)


class LowerLinearRecurrence(RewritePattern):
    """K-vector state, unrolled: s'[j] = ((M[j][0]*s[0] + M[j][1]*s[1]) + ...) + v[j]."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: LinearRecurrenceOp, rewriter: PatternRewriter) -> None:
        b = Builder(InsertPoint.before(op))
        k = op.size
        float_state = not isinstance(op.state_type.element_type, IntegerType)
        add = arith.AddfOp if float_state else arith.AddiOp
        mul = arith.MulfOp if float_state else arith.MuliOp

        def step(sb: Builder, i: SSAValue, _carried):
            coeffs = inline_region_copy(sb, op.coeffs, [i])
            m, v = coeffs[: k * k], coeffs[k * k :]
            index = [const_index(sb, j) for j in range(k)]
            old = [sb.insert(memref.LoadOp.get(op.state, [index[j]])).res for j in range(k)]
            for j in range(k):
                acc = sb.insert(mul(m[j * k], old[0])).result
                for c in range(1, k):
                    acc = sb.insert(add(acc, sb.insert(mul(m[j * k + c], old[c])).result)).result
                new = sb.insert(add(acc, v[j])).result
                sb.insert(memref.StoreOp.get(new, op.state, [index[j]]))
            inline_region_copy(sb, op.emit, [i, op.state])
            return []

        for_loop(b, op.lb, op.ub, op.step, [], step)
        rewriter.erase(op)


@dataclass(frozen=True)
class ScanToLoops(ModulePass):
    """Lower every scan op to sequential scf loops."""

    name = "scan-to-loops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [LowerAffine(), LowerScan(), LowerRecurrence(), LowerLinearRecurrence()]
            ),
            apply_recursively=False,
        ).rewrite_module(op)


__all__ = ["ScanToLoops"]
