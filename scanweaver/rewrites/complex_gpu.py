"""`scan-complex-affine-to-recurrence`: a complex `scan.affine` as one complex
`scan.recurrence` per channel, the form the GPU's fused (re, im) kernel takes.

    scan.affine %a, %b init %h0 into %h final %hT axis k [reverse]   (complex elements)

becomes a loop nest over the channel dimensions (every dimension but k, in order)
around a rank-0 complex recurrence over the L = dim(h, k) steps:

    scf.for %c0 ... scf.for %cm {                    (the channel dims, outermost first;
                                                      a one-trip loop for rank 1)
      %s = memref.alloca() : memref<complex<T>>
      %s[] = %h0[c]                                  (0 without init)
      scan.recurrence 0 to L step 1 state(%s) coeffs {
      ^(%i):  %t = i (forward) or (L - 1) - i (reverse)
              scan.yield %a[c with t], %b[c with t]
      } emit {
      ^(%i, %st):  %h[c with t] = %st[]
      }
      %hT[c] = %s[]                                  (final only; h0 / 0 when L = 0)
    }

Sequentially this is the reference loop of `scan-to-loops` exactly: per step
`s = a_t * s + b_t` (complex.mul then complex.add), the same visiting order in time,
so the interpreter gives the same bits.  `scan-complex-to-pairs` then turns each
recurrence into the 2x2 rotation-scaling `scan.linear_recurrence` on (re, im) (exact:
see raise_complex_pairs.py) and `scan-to-gpu` makes it the fused nest kernel: one block
per channel, time split over the threads (the kernel reassociates the products of a,
so parallel results agree to rounding, not bit for bit).  Memory stays complex
(interleaved (re, im) pairs after `convert-complex-to-llvm`).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import complex as cx
from xdsl.dialects import memref
from xdsl.dialects.builtin import ComplexType, Float64Type, IndexType, IntegerType, MemRefType, ModuleOp
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan
from scanweaver.rewrites.affine_to_pairs import Emitter


def _with_axis(channel: list[SSAValue], axis: int, t: SSAValue) -> list[SSAValue]:
    return [*channel[:axis], t, *channel[axis:]]


class ComplexAffinePerChannel(RewritePattern):
    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.AffineOp, rewriter: PatternRewriter, /):
        h_type = op.h.type
        assert isinstance(h_type, MemRefType)
        ct = h_type.element_type
        if not isinstance(ct, ComplexType):
            return
        axis, rank = op.axis_value, h_type.get_num_dims()
        e = Emitter(InsertPoint.before(op))
        length = e.dim(op.h, axis)
        last = e.sub(length, e.index(1))
        channel_bounds = [e.dim(op.h, d) for d in range(rank) if d != axis]
        # The time index of step i: i, or (L - 1) - i reversed (emit's `c - t` form).
        def time_of(b: Emitter, i: SSAValue) -> SSAValue:
            return b.sub(last, i) if op.is_reverse else i

        def per_channel(ce: Emitter, ivs: list[SSAValue]) -> None:
            ch = ivs if rank > 1 else []
            state = ce.val(memref.AllocaOp.get(ct, shape=[]))
            # (a zero start is built in the channel body: the kernel clones its prologue)
            if op.init is not None:
                start = ce.load(op.init, ch)
            else:
                start = ce.val(cx.ConstantOp.from_floats((0.0, 0.0), ct.element_type))  # type: ignore[arg-type]
            ce.store(start, state, [])

            coeffs = Block(arg_types=[IndexType()])
            k = ce.child(coeffs)
            t = time_of(k, coeffs.args[0])
            k.op(scan.YieldOp(k.load(op.a, _with_axis(ch, axis, t)), k.load(op.b, _with_axis(ch, axis, t))))

            emit = Block(arg_types=[IndexType(), MemRefType(ct, [])])
            m = ce.child(emit)
            m.store(m.load(emit.args[1], []), op.h, _with_axis(ch, axis, time_of(m, emit.args[0])))
            m.op(scan.YieldOp())

            ce.op(scan.RecurrenceOp(ce.index(0), length, ce.index(1), state, Region(coeffs), Region(emit)))
            if op.final is not None:
                ce.store(ce.load(state, []), op.final, ch)

        # one sequence (rank 1): a one-trip channel loop, the nest kernel's one block
        e.loop_nest(channel_bounds or [e.index(1)], per_channel)
        rewriter.erase(op)


@dataclass(frozen=True)
class ComplexAffineToRecurrence(ModulePass):
    """GPU target: complex `scan.affine` as per-channel complex recurrences (module doc)."""

    name = "scan-complex-affine-to-recurrence"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(ComplexAffinePerChannel(), apply_recursively=False).rewrite_module(op)


#: Most complex values in one state the GPU's diagonal recurrence kernel takes (ptxas:
#: 16 keeps sm_80/sm_90 free of spills and stack frames in f32 and f64; larger states,
#: or dynamic ones, stay host loops).
MAX_COMPLEX_STATE = 16


def component_words(el) -> int:
    """32-bit registers of one real component of `el`: 2 for f64 and i64 (and
    complex<f64>), else 1."""
    if isinstance(el, ComplexType):
        el = el.element_type
    wide = isinstance(el, Float64Type) or (isinstance(el, IntegerType) and el.width.data == 64)
    return 2 if wide else 1


def state_words(el) -> int:
    """32-bit registers of one state element: 1 for f32 (and narrower), 2 for f64, i64
    and complex<f32>, 4 for complex<f64>. The kernels' register budgets (items per
    thread, kept pairs, vector loads, staging) count by it: counted by elements, a state
    of 16 f64 took f32's budgets and spilled (ptxas, selective scan: 20 to 580 spill
    stores on sm_80 / sm_90)."""
    return (2 if isinstance(el, ComplexType) else 1) * component_words(el)


__all__ = ["MAX_COMPLEX_STATE", "ComplexAffineToRecurrence", "component_words", "state_words"]
