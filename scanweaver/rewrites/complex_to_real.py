"""`scan-complex-to-real`: complex arithmetic becomes real arithmetic on (re, im) pairs.

Runs after the scan ops are lowered to loops (a complex `scan.affine` becomes a loop of
`complex.mul` + `complex.add`).  Each complex op is rewritten into `arith`/`math` ops
on its operands' `complex.re`/`complex.im`, wrapped back with `complex.create`; then
`re(create(x, y)) = x` folds the wrappers away, so a loop carrying a complex state
computes on two real registers.  What stays complex is only storage (memref elements,
`scf.for` iter_args, constants), which MLIR's `convert-complex-to-llvm` maps onto
`{re, im}` structs.

The formulas are the ones the interpreter uses (interp/complex_impls.py), operation
for operation, so compiled and interpreted complex<f32> agree bit for bit.  No
C99 Annex G NaN recovery: (inf + 0i) * (0 + 1i) gives NaN parts where C gives inf
(the recurrences here multiply finite values; Inf/NaN propagate as in real code).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith
from xdsl.dialects import complex as cx
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import ComplexType, FloatAttr, ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.transforms.dead_code_elimination import region_dce


class _Real:
    """Builds real ops before an op; names read like the formulas."""

    def __init__(self, op: Operation):
        self.b = Builder(InsertPoint.before(op))

    def parts(self, z: SSAValue) -> tuple[SSAValue, SSAValue]:
        return self.b.insert(cx.ReOp(z)).result, self.b.insert(cx.ImOp(z)).result

    def add(self, x, y):
        return self.b.insert(arith.AddfOp(x, y)).result

    def sub(self, x, y):
        return self.b.insert(arith.SubfOp(x, y)).result

    def mul(self, x, y):
        return self.b.insert(arith.MulfOp(x, y)).result

    def div(self, x, y):
        return self.b.insert(arith.DivfOp(x, y)).result

    def neg(self, x):
        return self.b.insert(arith.NegfOp(x)).result

    def abs(self, x):
        return self.b.insert(mathd.AbsFOp(x)).result

    def const(self, value: float, like: SSAValue):
        return self.b.insert(arith.ConstantOp(FloatAttr(value, like.type))).result

    def cmp(self, pred: str, x, y):
        return self.b.insert(arith.CmpfOp(x, y, pred)).result

    def select(self, c, x, y):
        return self.b.insert(arith.SelectOp(c, x, y)).result

    def unary(self, cls, x):
        return self.b.insert(cls(x)).result


def _replace_complex(rewriter: PatternRewriter, op: Operation, re: SSAValue, im: SSAValue) -> None:
    t = op.results[0].type
    assert isinstance(t, ComplexType)
    rewriter.replace(op, cx.CreateOp(re, im, t))


class AddToReal(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.AddOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        (a, b), (c, d) = r.parts(op.lhs), r.parts(op.rhs)
        _replace_complex(rewriter, op, r.add(a, c), r.add(b, d))


class SubToReal(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.SubOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        (a, b), (c, d) = r.parts(op.lhs), r.parts(op.rhs)
        _replace_complex(rewriter, op, r.sub(a, c), r.sub(b, d))


class MulToReal(RewritePattern):
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.MulOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        (a, b), (c, d) = r.parts(op.lhs), r.parts(op.rhs)
        re = r.sub(r.mul(a, c), r.mul(b, d))
        im = r.add(r.mul(a, d), r.mul(b, c))
        _replace_complex(rewriter, op, re, im)


class DivToReal(RewritePattern):
    """Smith's algorithm: divide through by the larger part of the divisor (no
    overflow of c*c + d*d); both branches computed, one selected."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.DivOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        (a, b), (c, d) = r.parts(op.lhs), r.parts(op.rhs)
        c_wide = r.cmp("oge", r.abs(c), r.abs(d))
        # |c| >= |d|: q = d/c, den = c + d*q
        q1 = r.div(d, c)
        den1 = r.add(c, r.mul(d, q1))
        re1 = r.div(r.add(a, r.mul(b, q1)), den1)
        im1 = r.div(r.sub(b, r.mul(a, q1)), den1)
        # else: q = c/d, den = c*q + d
        q2 = r.div(c, d)
        den2 = r.add(r.mul(c, q2), d)
        re2 = r.div(r.add(r.mul(a, q2), b), den2)
        im2 = r.div(r.sub(r.mul(b, q2), a), den2)
        _replace_complex(rewriter, op, r.select(c_wide, re1, re2), r.select(c_wide, im1, im2))


class ExpToReal(RewritePattern):
    """exp(a + bi) = e^a cos b + (e^a sin b) i."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.ExpOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        a, b = r.parts(op.complex)
        e = r.unary(mathd.ExpOp, a)
        re = r.mul(e, r.unary(mathd.CosOp, b))
        im = r.mul(e, r.unary(mathd.SinOp, b))
        _replace_complex(rewriter, op, re, im)


class AbsToReal(RewritePattern):
    """|a + bi| = m sqrt((a/m)^2 + (b/m)^2) with m = max(|a|, |b|): no overflow for
    large parts; m itself when it is 0 or inf; NaN when a part is NaN."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.AbsOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        a, b = r.parts(op.complex)
        m = r.b.insert(arith.MaximumfOp(r.abs(a), r.abs(b))).result
        u, v = r.div(a, m), r.div(b, m)
        scaled = r.mul(m, r.unary(mathd.SqrtOp, r.add(r.mul(u, u), r.mul(v, v))))
        edge = r.b.insert(
            arith.OrIOp(r.cmp("oeq", m, r.const(0.0, m)), r.cmp("oeq", m, r.const(float("inf"), m)))
        ).result
        rewriter.replace(op, [], [r.select(edge, m, scaled)])


class ConjToReal(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.ConjOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        a, b = r.parts(op.complex)
        _replace_complex(rewriter, op, a, r.neg(b))


class NegToReal(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: cx.NegOp, rewriter: PatternRewriter) -> None:
        r = _Real(op)
        a, b = r.parts(op.complex)
        _replace_complex(rewriter, op, r.neg(a), r.neg(b))


class FoldPartOfCreate(RewritePattern):
    """re(create(x, y)) = x, im(create(x, y)) = y; parts of a constant are constants."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, cx.ReOp | cx.ImOp):
            return
        src = op.complex.owner
        k = 0 if isinstance(op, cx.ReOp) else 1
        if isinstance(src, cx.CreateOp):
            rewriter.replace(op, [], [src.operands[k]])
        elif isinstance(src, cx.ConstantOp):
            part = src.value.data[k]
            assert isinstance(part, FloatAttr)
            rewriter.replace(op, arith.ConstantOp(FloatAttr(part.value.data, op.result.type)))


#: Complex ops this pass turns into real arithmetic (create/re/im/constant remain).
ARITHMETIC = (cx.AddOp, cx.SubOp, cx.MulOp, cx.DivOp, cx.ExpOp, cx.AbsOp, cx.ConjOp, cx.NegOp)
STORAGE = (cx.CreateOp, cx.ReOp, cx.ImOp, cx.ConstantOp)


@dataclass(frozen=True)
class ComplexToReal(ModulePass):
    """Rewrite complex arithmetic as real arithmetic on (re, im) pairs."""

    name = "scan-complex-to-real"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not any(o.dialect_name() == "complex" for o in op.walk()):
            return  # real-only modules: nothing to do (and no walk of the patterns)
        from scanweaver.errors import ScanWeaverTypeError

        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    AddToReal(),
                    SubToReal(),
                    MulToReal(),
                    DivToReal(),
                    ExpToReal(),
                    AbsToReal(),
                    ConjToReal(),
                    NegToReal(),
                    FoldPartOfCreate(),
                ]
            )
        ).rewrite_module(op)
        region_dce(op.body)
        left = sorted({o.name for o in op.walk() if o.dialect_name() == "complex" and not isinstance(o, STORAGE)})
        if left:
            raise ScanWeaverTypeError(
                f"scan-complex-to-real: no real lowering for {', '.join(left)} (supported: "
                + ", ".join(c.name for c in ARITHMETIC)
                + ")"
            )


__all__ = ["ComplexToReal"]
