"""`scan.affine` with channels innermost (`(L, C)`): plain vectors across the
contiguous channels, no transposes."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import Builder
from xdsl.dialects import arith, vector
from xdsl.dialects.builtin import i1, MemRefType, VectorType
from xdsl.ir import SSAValue

from scanweaver.dialects import scan
from scanweaver.rewrites.cpu_vector_builders import _B, _element_bits, _neutral, _step
from scanweaver.rewrites.loop_utils import dim_sizes, for_loop, loop_nest

# ---------------------------------------------------------------------------
# scan.affine, channels innermost: plain vectors across channels
# ---------------------------------------------------------------------------


def lower_affine_channels(b: Builder, op: scan.AffineOp, unroll: int = 4) -> None:
    """Time axis not innermost: the innermost dim holds channels, contiguous in memory."""
    h_t = op.h.type
    assert isinstance(h_t, MemRefType)
    el = h_t.element_type
    bits = _element_bits(el)
    assert bits is not None
    G = 256 // bits
    vt = VectorType(el, [G])
    axis = op.axis_value
    sizes = dim_sizes(b, op.h)
    r = len(sizes)
    L, W = sizes[axis], sizes[r - 1]
    others = [d for d in range(r - 1) if d != axis]
    one_v, negz_v = _neutral(el)

    def per_outer(ob: Builder, outer_vals: Sequence[SSAValue]) -> None:
        obb = _B(ob)
        outer = dict(zip(others, outer_vals))

        def full_index(t: SSAValue, c: SSAValue) -> list[SSAValue]:
            return [t if d == axis else c if d == r - 1 else outer[d] for d in range(r)]

        def chan_index(c: SSAValue) -> list[SSAValue]:  # init/final: h without axis
            return [c if d == r - 1 else outer[d] for d in range(r) if d != axis]

        def groups(gb: Builder, c0: SSAValue, count: int, mask: SSAValue | None) -> None:
            gbb = _B(gb)
            starts = [gbb.add(c0, gbb.idx(u * G)) if u else c0 for u in range(count)]
            zero_v = gbb.splat_const(0, vt)
            hs = []
            for c in starts:
                if op.init is None:
                    hs.append(zero_v)
                elif mask is not None:
                    hs.append(gbb.ins(vector.MaskedLoadOp(op.init, chan_index(c), mask, zero_v)))
                else:
                    hs.append(gbb.ins(vector.LoadOp(op.init, chan_index(c), vt)))
            if mask is not None:
                ones, negz = gbb.splat_const(one_v, vt), gbb.splat_const(negz_v, vt)

            def step(sb: Builder, i: SSAValue, carried):
                sbb = _B(sb)
                t = sbb.sub(sbb.sub(L, sbb.idx(1)), i) if op.is_reverse else i
                out = []
                for c, hv in zip(starts, carried):
                    idx = full_index(t, c)
                    if mask is not None:
                        av = sbb.ins(vector.MaskedLoadOp(op.a, idx, mask, ones))
                        xv = sbb.ins(vector.MaskedLoadOp(op.b, idx, mask, negz))
                    else:
                        av = sbb.ins(vector.LoadOp(op.a, idx, vt))
                        xv = sbb.ins(vector.LoadOp(op.b, idx, vt))
                    hn = _step(sb, av, hv, xv)
                    if mask is not None:
                        sb.insert(vector.MaskedStoreOp(op.h, idx, mask, hn))
                    else:
                        sb.insert(vector.StoreOp(hn, op.h, idx))
                    out.append(hn)
                return out

            last = for_loop(gb, gbb.idx(0), L, gbb.idx(1), hs, step)
            if op.final is not None:
                for c, hv in zip(starts, last):
                    if mask is not None:
                        gb.insert(vector.MaskedStoreOp(op.final, chan_index(c), mask, hv))
                    else:
                        gb.insert(vector.StoreOp(hv, op.final, chan_index(c)))

        wide = unroll * G
        w_wide = obb.mul(obb.ins(arith.DivUIOp(W, obb.idx(wide))), obb.idx(wide))
        w_one = obb.mul(obb.ins(arith.DivUIOp(W, obb.idx(G))), obb.idx(G))

        def wide_body(gb: Builder, c0: SSAValue, _c):
            groups(gb, c0, unroll, None)
            return []

        def one_body(gb: Builder, c0: SSAValue, _c):
            groups(gb, c0, 1, None)
            return []

        def masked_body(gb: Builder, c0: SSAValue, _c):
            gbb = _B(gb)
            mask = gbb.ins(vector.CreateMaskOp([gbb.sub(W, c0)], VectorType(i1, [G])))
            groups(gb, c0, 1, mask)
            return []

        for_loop(ob, obb.idx(0), w_wide, obb.idx(wide), [], wide_body)
        for_loop(ob, w_wide, w_one, obb.idx(G), [], one_body)
        for_loop(ob, w_one, W, obb.idx(G), [], masked_body)

    loop_nest(b, [sizes[d] for d in others], per_outer)
