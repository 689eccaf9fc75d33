"""A (re, im) pair recurrence written by hand becomes a complex `scan.recurrence`.

The raise finds `hr' = p*hr - q*hi + br, hi' = q*hr + p*hi + bi` (two real carried
values) as a coupled 2x2 `scan.linear_recurrence` with the matrix

    [[p, -q],
     [q,  p]]         (rows: the new re, the new im)

which is multiplication by the complex number p + qi.  `scan-pairs-to-complex` recognises that
rotation-scaling shape (the same SSA value on the diagonal, one off-diagonal entry the
`arith.negf` of the other) and rewrites the op into a diagonal complex recurrence:
a = create(p, q), b = create(br, bi), the state one complex value.  It is exact:
`linear_recurrence` computes `(p*s0 + (-q)*s1) + br` and `(q*s0 + p*s1) + bi`, and
complex.mul then complex.add compute `(p*s0 - q*s1) + br` and `(p*s1 + q*s0) + bi`,
the same roundings (negation is exact, x + (-y) is x - y, products and sums commute).

The old `memref<2xT>` state stays the program's view: the emit region first writes
the complex state's parts into it, and after the op it holds the final (re, im), so
everything that read it (emit, the code after the loop) is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, memref
from xdsl.dialects import complex as cx
from xdsl.dialects.builtin import ComplexType, Float32Type, Float64Type, IndexType, IntegerAttr, MemRefType, ModuleOp
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan


def _negates(x: SSAValue, y: SSAValue) -> bool:
    """Whether x is `arith.negf y`."""
    return isinstance(x.owner, arith.NegfOp) and x.owner.operand is y


def rotation_parts(op: scan.LinearRecurrenceOp) -> tuple[int, int] | None:
    """(index of p, index of q) in the coeffs yield when the 2x2 matrix is
    [[p, -q], [q, p]] (multiplication by p + qi), else None."""
    if op.size != 2 or not isinstance(op.state_type.element_type, Float32Type | Float64Type):
        return None
    last = op.coeffs.block.last_op
    assert isinstance(last, scan.YieldOp)
    m00, m01, m10, m11 = last.arguments[:4]
    if m00 is not m11:
        return None
    if _negates(m01, m10):
        return 0, 2  # q = m10
    return None


def _index(b: Builder, v: int) -> SSAValue:
    return b.insert(arith.ConstantOp(IntegerAttr(v, IndexType()))).result


class PairRecurrenceToComplex(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.LinearRecurrenceOp, rewriter: PatternRewriter) -> None:
        parts = rotation_parts(op)
        if parts is None:
            return
        real_t = op.state_type.element_type
        ct = ComplexType(real_t)
        pair = op.state
        b = Builder(InsertPoint.before(op))
        zero, one = _index(b, 0), _index(b, 1)
        state = b.insert(memref.AllocaOp.get(ct, shape=[])).memref
        init = b.insert(
            cx.CreateOp(b.insert(memref.LoadOp.get(pair, [zero])).res, b.insert(memref.LoadOp.get(pair, [one])).res, ct)
        ).complex
        b.insert(memref.StoreOp.get(init, state, []))

        # coeffs: the old body, yielding (p + qi, br + bi i)
        coeffs = op.coeffs.clone()
        cy = coeffs.block.last_op
        assert isinstance(cy, scan.YieldOp)
        vals = list(cy.arguments)
        cb = Builder(InsertPoint.before(cy))
        a = cb.insert(cx.CreateOp(vals[parts[0]], vals[parts[1]], ct)).complex
        x = cb.insert(cx.CreateOp(vals[4], vals[5], ct)).complex
        cy.detach()
        cy.erase()
        cb = Builder(InsertPoint.at_end(coeffs.block))
        cb.insert(scan.YieldOp(a, x))

        # emit: write the parts into the pair view, then the old consumer on that view
        emit_block = Block(arg_types=[IndexType(), MemRefType(ct, [])])
        eb = Builder(InsertPoint.at_end(emit_block))
        self._store_parts(eb, emit_block.args[1], pair)
        old = op.emit.clone()
        old_block = old.block
        old_block.args[0].replace_all_uses_with(emit_block.args[0])
        old_block.args[1].replace_all_uses_with(pair)
        for o in list(old_block.ops):
            o.detach()
            emit_block.add_op(o)

        new = scan.RecurrenceOp(op.lb, op.ub, op.step, state, coeffs, Region(emit_block))
        rewriter.insert(new, InsertPoint.before(op))
        after = Builder(InsertPoint.after(new))
        self._store_parts(after, state, pair)
        rewriter.erase(op)

    @staticmethod
    def _store_parts(b: Builder, state: SSAValue, pair: SSAValue) -> None:
        z = b.insert(memref.LoadOp.get(state, [])).res
        zero, one = _index(b, 0), _index(b, 1)
        b.insert(memref.StoreOp.get(b.insert(cx.ReOp(z)).result, pair, [zero]))
        b.insert(memref.StoreOp.get(b.insert(cx.ImOp(z)).result, pair, [one]))


@dataclass(frozen=True)
class PairsToComplex(ModulePass):
    """Rewrite rotation-scaling 2x2 `scan.linear_recurrence`s as complex `scan.recurrence`s.

    Runs after `scanweaver-raise` for the CPU and loops targets; the GPU target keeps
    the 2x2 form, which its fused linear-recurrence kernel takes."""

    name = "scan-pairs-to-complex"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(PairRecurrenceToComplex(), apply_recursively=False).rewrite_module(op)





# ---------------------------------------------------------------------------
# The other way, for the GPU: a rank-0 complex state as a (re, im) pair
# ---------------------------------------------------------------------------


class ComplexRecurrenceToPair(RewritePattern):
    """A `scan.recurrence` over one complex value becomes the 2x2 rotation-scaling
    `scan.linear_recurrence` on (re, im), which the GPU's fused linear-recurrence kernel
    takes.  Loads of the complex state (in emit and after the op) read the pair."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.RecurrenceOp, rewriter: PatternRewriter) -> None:
        st = op.state_type
        if st.get_num_dims() != 0 or not isinstance(st.element_type, ComplexType):
            return
        state = op.state
        later = [u.operation for u in state.uses if u.operation is not op]
        if not all(
            isinstance(o, memref.LoadOp) and o.parent_block() is op.parent_block() and op.is_before_in_block(o)
            or (isinstance(o, memref.StoreOp | memref.LoadOp) and o.parent_block() is op.parent_block()
                and o.is_before_in_block(op))
            for o in later
        ):
            return  # the state escapes in a way this rewrite does not follow
        ct, real_t = st.element_type, st.element_type.element_type
        b = Builder(InsertPoint.before(op))
        pair = b.insert(memref.AllocaOp.get(real_t, shape=[2])).memref
        init = b.insert(memref.LoadOp.get(state, [])).res
        zero, one = _index(b, 0), _index(b, 1)
        b.insert(memref.StoreOp.get(b.insert(cx.ReOp(init)).result, pair, [zero]))
        b.insert(memref.StoreOp.get(b.insert(cx.ImOp(init)).result, pair, [one]))

        coeffs = op.coeffs.clone()
        cy = coeffs.block.last_op
        assert isinstance(cy, scan.YieldOp)
        a, x = cy.arguments
        cb = Builder(InsertPoint.before(cy))
        p, q = cb.insert(cx.ReOp(a)).result, cb.insert(cx.ImOp(a)).result
        minus_q = cb.insert(arith.NegfOp(q)).result
        br, bi = cb.insert(cx.ReOp(x)).result, cb.insert(cx.ImOp(x)).result
        cy.detach()
        cy.erase()
        Builder(InsertPoint.at_end(coeffs.block)).insert(scan.YieldOp(p, minus_q, q, p, br, bi))

        emit = op.emit.clone()
        eblock = emit.block
        view = eblock.insert_arg(MemRefType(real_t, [2]), 2)
        for load in [u.operation for u in eblock.args[1].uses]:
            if not isinstance(load, memref.LoadOp):
                return
            self._read_pair(rewriter, load, view, ct)
        eblock.args[1].replace_all_uses_with(view)  # nothing left: every use was a load
        eblock.erase_arg(eblock.args[1])
        new = scan.LinearRecurrenceOp(op.lb, op.ub, op.step, pair, coeffs, emit)
        rewriter.insert(new, InsertPoint.before(op))
        for o in later:
            if isinstance(o, memref.LoadOp) and op.is_before_in_block(o):
                self._read_pair(rewriter, o, pair, ct)
        rewriter.erase(op)

    @staticmethod
    def _read_pair(rewriter: PatternRewriter, load: memref.LoadOp, pair: SSAValue, ct: ComplexType) -> None:
        b = Builder(InsertPoint.before(load))
        zero, one = _index(b, 0), _index(b, 1)
        re = b.insert(memref.LoadOp.get(pair, [zero])).res
        im = b.insert(memref.LoadOp.get(pair, [one])).res
        rewriter.replace(load, cx.CreateOp(re, im, ct))


@dataclass(frozen=True)
class ComplexToPairs(ModulePass):
    """GPU target: rank-0 complex recurrences as 2x2 real linear recurrences."""

    name = "scan-complex-to-pairs"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(ComplexRecurrenceToPair(), apply_recursively=False).rewrite_module(op)
__all__ = ["ComplexToPairs", "PairRecurrenceToComplex", "PairsToComplex", "rotation_parts"]
