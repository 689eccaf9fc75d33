"""The arithmetic of chunk aggregates (prod a, scan from 0) per tile, by mode, for the
parallel-in-time (chunked) affine scan; the tiles of `cpu_affine_tiles` run it."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import Builder
from xdsl.dialects import arith, math
from xdsl.dialects.builtin import Float32Type, Float64Type, i64, VectorType
from xdsl.ir import Attribute, SSAValue

from scanweaver.rewrites.cpu_vector_builders import _B, _mul, _res, _step

# ---------------------------------------------------------------------------
# Chunk aggregates for the parallel-in-time (chunked) scan
# ---------------------------------------------------------------------------

#: Aggregate arithmetic by mode, and the outputs of `@aggregate` in order.
#:   exact  integers: (A, B) in the element type (wrap-around arithmetic is exact)
#:   wide   f32 inputs: f64 arithmetic; A = A_m * 2^E
#:   dd     f64 inputs: compensated arithmetic (error-free FMA products and TwoSum,
#:          the errors carried in a second chain, as in compensated Horner): A and B
#:          as unevaluated sums hi + lo, about twice the f64 precision; A = A_m * 2^E
#: The main chains keep the sequential loop's latency (one multiply, or multiply and
#: add, per step); the error terms run beside them.
#: The product of `a` over a chunk never overflows to inf or underflows into
#: denormals where the sequential loop never forms it (nor runs at denormal speed):
#: every `a` (wide mode: every product of WIDE_GROUP_STEPS steps of `a`) is split into
#: an exact power of two, whose exponent is added to E (i64), and a mantissa near 1;
#: the product of mantissas is renormalised by a power of two
#: once per tile of time steps, chosen from its value at the start of the tile (off
#: the critical path).  The carry code (runtime/cpu_scan.py) applies 2^E when it
#: multiplies A by a carry.  B is the scan from 0 at its true scale; where it
#: overflows (inf), or the inputs hold Inf/NaN, the runtime runs that chunk sequentially.
AGGREGATE_MODES = {
    "exact": ("A", "B"),
    "wide": ("A", "E", "B"),
    "dd": ("A_hi", "A_lo", "E", "B_hi", "B_lo"),
}


def aggregate_mode(el: Attribute) -> str:
    if isinstance(el, Float32Type):
        return "wide"
    if isinstance(el, Float64Type):
        return "dd"
    return "exact"


def _fop(b: Builder, cls: type, *operands: SSAValue) -> SSAValue:
    return _res(b.insert(cls(*operands)))


def _two_sum(b: Builder, x: SSAValue, y: SSAValue) -> tuple[SSAValue, SSAValue]:
    """s + e == x + y exactly (Knuth's TwoSum, any order of magnitudes)."""
    s = _fop(b, arith.AddfOp, x, y)
    z = _fop(b, arith.SubfOp, s, x)
    e1 = _fop(b, arith.SubfOp, x, _fop(b, arith.SubfOp, s, z))
    e2 = _fop(b, arith.SubfOp, y, z)
    return s, _fop(b, arith.AddfOp, e1, e2)


def _prod_err(b: Builder, x: SSAValue, y: SSAValue, p: SSAValue) -> SSAValue:
    """x*y - p exactly, for p = fl(x*y) (FMA; exact unless the product underflows)."""
    return _fop(b, math.FmaOp, x, y, _fop(b, arith.NegfOp, p))


def _exponent_split(b: Builder, x: SSAValue) -> tuple[SSAValue, SSAValue]:
    """(2^-k, k) for f64 vector x, k its unbiased exponent clamped to [-1023, 1022]:
    x * 2^-k is exact and in [1, 2) for normal x (in [2^-52, 1) for denormals); zero
    keeps 0, inf and NaN stay non-finite."""
    bb = _B(b)
    vt = x.type
    assert isinstance(vt, VectorType)
    it = VectorType(i64, vt.get_shape())
    bits = _fop(b, lambda v: arith.BitcastOp(v, it), x)
    field = bb.ins(arith.AndIOp(bb.ins(arith.ShRUIOp(bits, bb.splat_const(52, it))), bb.splat_const(0x7FF, it)))
    k = bb.ins(arith.SubiOp(field, bb.splat_const(1023, it)))
    k = bb.ins(arith.MaxSIOp(bb.ins(arith.MinSIOp(k, bb.splat_const(1022, it))), bb.splat_const(-1023, it)))
    # 2^-k has the biased exponent 1023 - k in [1, 2046]: a normal power of two.
    fbits = bb.ins(arith.ShLIOp(bb.ins(arith.SubiOp(bb.splat_const(1023, it), k)), bb.splat_const(52, it)))
    return _fop(b, lambda v: arith.BitcastOp(v, vt), fbits), k


def _aggregate_init(bb: _B, mode: str, vt: VectorType) -> list[SSAValue]:
    """The identity aggregate (A = 1, E = 0, B = 0) in the mode's representation."""
    if mode == "exact":
        return [bb.splat_const(1, vt), bb.splat_const(0, vt)]
    wt = VectorType(Float64Type(), vt.get_shape())
    one, zero = bb.splat_const(1.0, wt), bb.splat_const(0.0, wt)
    e0 = bb.splat_const(0, VectorType(i64, vt.get_shape()))
    return [one, e0, zero] if mode == "wide" else [one, zero, e0, zero, zero]


#: Steps of f32 `a` multiplied together in f64 before their exponent is split off (wide
#: mode): |a| < 2^128 and any nonzero f32 >= 2^-149, so the product of four is a normal
#: f64 (in [2^-596, 2^512]) or zero, inf or NaN where an input is; the first product
#: of two is exact (24-bit mantissas), the others round once each, as the per-step
#: products of mantissas did.  One exponent split per four steps instead of one per step.
WIDE_GROUP_STEPS = 4


def _times_group(b: Builder, ph: SSAValue, e: SSAValue, group: Sequence[SSAValue]) -> tuple[SSAValue, SSAValue]:
    """(ph, e) times the product of the f64-widened f32 steps in `group` (at most
    WIDE_GROUP_STEPS): its mantissa into ph, its exponent into e."""
    prod = group[0]
    for a in group[1:]:
        prod = _fop(b, arith.MulfOp, prod, a)
    inv, kp = _exponent_split(b, prod)  # normal (or 0, inf, NaN): mantissa in [1, 2)
    return _fop(b, arith.MulfOp, ph, _fop(b, arith.MulfOp, prod, inv)), _B(b).ins(arith.AddiOp(e, kp))


def _aggregate_block(
    b: Builder, mode: str, a_steps: Sequence[SSAValue], x_steps: Sequence[SSAValue], hs: list[SSAValue]
) -> list[SSAValue]:
    """Time steps (A, B) <- (A*a, a*B + x) over one tile, in the mode's arithmetic."""
    if mode == "exact":
        prod, acc = hs
        for a, x in zip(a_steps, x_steps):
            prod, acc = _mul(b, a, prod), _step(b, a, acc, x)
        return [prod, acc]
    bb = _B(b)
    if mode == "wide":
        ph, e, bh = hs
        wt = ph.type
        factor, k = _exponent_split(b, ph)  # from the tile's start: off the chain
        group: list[SSAValue] = []
        for i, (a, x) in enumerate(zip(a_steps, x_steps)):
            a = _fop(b, lambda v: arith.ExtFOp(v, wt), a)
            x = _fop(b, lambda v: arith.ExtFOp(v, wt), x)
            bh = _step(b, a, bh, x)
            group.append(a)
            if len(group) == WIDE_GROUP_STEPS or i == len(a_steps) - 1:
                ph, e = _times_group(b, ph, e, group)
                group = []
        return [_fop(b, arith.MulfOp, ph, factor), bb.ins(arith.AddiOp(e, k)), bh]
    ph, pl, e, bh, bl = hs
    factor, k = _exponent_split(b, ph)
    for a, x in zip(a_steps, x_steps):
        # B: compensated Horner step; bh is the sequential loop's own f64 chain.
        p = _fop(b, arith.MulfOp, a, bh)
        s, sigma = _two_sum(b, p, x)
        pi = _prod_err(b, a, bh, p)
        bl = _fop(b, math.FmaOp, a, bl, _fop(b, arith.AddfOp, pi, sigma))
        bh = s
        # A: compensated product of the mantissas of a (in [2^-52, 2): no under/overflow).
        inv, ka = _exponent_split(b, a)
        an = _fop(b, arith.MulfOp, a, inv)
        p = _fop(b, arith.MulfOp, ph, an)
        pl = _fop(b, math.FmaOp, pl, an, _prod_err(b, ph, an, p))
        ph = p
        e = bb.ins(arith.AddiOp(e, ka))
    ph, pl = _fop(b, arith.MulfOp, ph, factor), _fop(b, arith.MulfOp, pl, factor)
    return [ph, pl, bb.ins(arith.AddiOp(e, k)), bh, bl]
