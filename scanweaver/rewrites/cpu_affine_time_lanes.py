"""Integer `scan.affine` rows with time in the vector lanes: `build_time_lanes_scan`
builds `func.func @affine_time_lanes` already lowered (vector/scf/arith/memref).

Each row is read in order, one vector of G consecutive steps at a time, so a core has
three streams (a, b, h) per row instead of the 3*G of the transposed tiles.  Inside a
vector the steps are combined by a log-step (Hillis-Steele) scan of the pairs
(a, b) . (a', b') = (a*a', a'*b + b'): after log2(G) shifts lane j holds the pair of
steps t0..t0+j (reverse: t0+j..t0+G-1).  Then h = A * carry + B per lane, and the
carry to the next vector is A_last * carry + B_last: a scalar multiply-add per G steps,
the only chain.  Exact only where multiply and add are associative and distribute:
integer wrap-around arithmetic (a ring), so the results are the loop's bit for bit;
never used for floats.
"""

from __future__ import annotations

from xdsl.builder import Builder
from xdsl.dialects import arith, func, memref, vector
from xdsl.dialects.builtin import DYNAMIC_INDEX, IntegerType, MemRefType, ModuleOp, VectorType
from xdsl.ir import Block, Region, SSAValue
from xdsl.rewriter import InsertPoint

from scanweaver.rewrites.cpu_vector_builders import _B, _shuffle, _step
from scanweaver.rewrites.loop_utils import dim_sizes, for_loop


def _shifted(bb: _B, v: SSAValue, fill: SSAValue, s: int, G: int, reverse: bool, vt: VectorType) -> SSAValue:
    """v moved s lanes towards the scan's later steps, `fill` in the lanes it leaves."""
    if reverse:  # lane j takes lane j+s (later in the scan = lower t)
        mask = [j + s if j + s < G else G + j for j in range(G)]
    else:  # lane j takes lane j-s
        mask = [j - s if j >= s else G + j for j in range(G)]
    return _shuffle(bb, v, fill, mask, vt)


def _vector_step(b: Builder, a_ref, b_ref, h_ref, row, t, carry, G: int, reverse: bool, vt: VectorType):
    """Scan the G steps at t..t+G-1 of `row` from `carry`; store h; return the new carry."""
    bb = _B(b)
    A = bb.ins(vector.LoadOp(a_ref, [row, t], vt))
    B = bb.ins(vector.LoadOp(b_ref, [row, t], vt))
    ones, zeros = bb.splat_const(1, vt), bb.splat_const(0, vt)
    s = 1
    while s < G:  # lane j: the pair of its 2s latest steps (fewer at the start)
        A_s = _shifted(bb, A, ones, s, G, reverse, vt)
        B_s = _shifted(bb, B, zeros, s, G, reverse, vt)
        B = bb.ins(arith.AddiOp(bb.ins(arith.MuliOp(A, B_s)), B))
        A = bb.ins(arith.MuliOp(A, A_s))
        s *= 2
    h = _step(b, A, bb.splat(carry, vt), B)
    b.insert(vector.StoreOp(h, h_ref, [row, t]))
    last = 0 if reverse else G - 1
    a_last = bb.ins(vector.ExtractOp(A, [last], vt.element_type))
    b_last = bb.ins(vector.ExtractOp(B, [last], vt.element_type))
    return _step(b, a_last, carry, b_last)


def _scalar_step(b: Builder, a_ref, b_ref, h_ref, row, t, carry):
    a_t = b.insert(memref.LoadOp.get(a_ref, [row, t])).res
    b_t = b.insert(memref.LoadOp.get(b_ref, [row, t])).res
    h = _step(b, a_t, carry, b_t)
    b.insert(memref.StoreOp.get(h, h_ref, [row, t]))
    return h


def build_time_lanes_scan(el: IntegerType, reverse: bool = False, vector_bits: int = 256) -> ModuleOp:
    """`func.func @affine_time_lanes(a, b, h0, h, final)`: a, b, h `memref<?x?xT>` (rows,
    time innermost), h0 and final `memref<?xT>`; h[c, t] = a[c, t] * h[c, t-1] + b[c, t]
    from h0[c] (reverse: from the end), final[c] the last state.  T: i32 or i64.
    vector_bits: the vectors' width (G = vector_bits / width of T steps each)."""
    assert isinstance(el, IntegerType), "time-lane scans are exact only for integers"
    G = vector_bits // el.width.data
    vt = VectorType(el, [G])
    dyn2, dyn1 = MemRefType(el, [DYNAMIC_INDEX] * 2), MemRefType(el, [DYNAMIC_INDEX])
    arg_types = [dyn2, dyn2, dyn1, dyn2, dyn1]
    block = Block(arg_types=arg_types)
    a_ref, b_ref, h0_ref, h_ref, final_ref = block.args
    b = Builder(InsertPoint.at_end(block))
    bb = _B(b)
    C, L = dim_sizes(b, h_ref)
    nf = bb.ins(arith.DivUIOp(L, bb.idx(G)))  # full vectors: steps 0 .. main-1
    main = bb.mul(nf, bb.idx(G))
    one, zero = bb.idx(1), bb.idx(0)

    def row_body(rb: Builder, row: SSAValue, _carried):
        rbb = _B(rb)
        carry = rb.insert(memref.LoadOp.get(h0_ref, [row])).res

        def vectors(vb: Builder, j: SSAValue, c):
            vbb = _B(vb)
            if reverse:  # vectors from the last full one down
                j = vbb.sub(vbb.sub(nf, vbb.idx(1)), j)
            t = vbb.mul(j, vbb.idx(G))
            return [_vector_step(vb, a_ref, b_ref, h_ref, row, t, c[0], G, reverse, vt)]

        def tail(tb: Builder, i: SSAValue, c):
            t = _B(tb).sub(_B(tb).sub(L, _B(tb).idx(1)), i) if reverse else i
            return [_scalar_step(tb, a_ref, b_ref, h_ref, row, t, c[0])]

        if reverse:  # the steps past the full vectors come first
            (carry,) = for_loop(rb, zero, rbb.sub(L, main), one, [carry], tail)
            (carry,) = for_loop(rb, zero, nf, one, [carry], vectors)
        else:
            (carry,) = for_loop(rb, zero, nf, one, [carry], vectors)
            (carry,) = for_loop(rb, main, L, one, [carry], tail)
        rb.insert(memref.StoreOp.get(carry, final_ref, [row]))
        return []

    for_loop(b, zero, C, one, [], row_body)
    b.insert(func.ReturnOp())
    fn = func.FuncOp("affine_time_lanes", (arg_types, []), Region(block))
    return ModuleOp([fn])


__all__ = ["build_time_lanes_scan"]
