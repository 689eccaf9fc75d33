"""Small vector-code builders shared by the CPU lowerings of `scan-to-cpu`:
SSA helpers, the in-register transpose of tiles, the affine step."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import Builder
from xdsl.dialects import arith, vector
from xdsl.dialects.builtin import (
    DenseArrayBase,
    Float32Type,
    Float64Type,
    i64,
    IntegerType,
    MemRefType,
    NoneAttr,
    VectorType,
)
from xdsl.ir import Attribute, Operation, SSAValue

from scanweaver.rewrites.loop_utils import const_index, const_scalar


def _res(op: Operation) -> SSAValue:
    return op.results[0]


class _B:
    """A Builder with terse integer/index helpers (the lowering reads like the loops)."""

    def __init__(self, b: Builder):
        self.b = b

    def ins(self, op: Operation) -> SSAValue:
        return _res(self.b.insert(op))

    def idx(self, v: int) -> SSAValue:
        return const_index(self.b, v)

    def add(self, x, y) -> SSAValue:
        return self.ins(arith.AddiOp(x, y))

    def sub(self, x, y) -> SSAValue:
        return self.ins(arith.SubiOp(x, y))

    def mul(self, x, y) -> SSAValue:
        return self.ins(arith.MuliOp(x, y))

    def min(self, x, y) -> SSAValue:
        return self.ins(arith.MinSIOp(x, y))

    def max(self, x, y) -> SSAValue:
        return self.ins(arith.MaxSIOp(x, y))

    def cmp(self, x, y, pred: str) -> SSAValue:
        return self.ins(arith.CmpiOp(x, y, pred))

    def select(self, c, x, y) -> SSAValue:
        return self.ins(arith.SelectOp(c, x, y))

    def and_(self, x, y) -> SSAValue:
        return self.ins(arith.AndIOp(x, y))

    def splat(self, scalar: SSAValue, vt: VectorType) -> SSAValue:
        return self.ins(vector.BroadcastOp(scalar, vt))

    def splat_const(self, value: float | int, vt: VectorType) -> SSAValue:
        return self.splat(const_scalar(self.b, value, vt.element_type), vt)


def _element_bits(t: Attribute) -> int | None:
    if isinstance(t, Float32Type):
        return 32
    if isinstance(t, Float64Type):
        return 64
    if isinstance(t, IntegerType) and t.width.data in (32, 64):
        return t.width.data
    return None


def _identity_layout(t: Attribute) -> bool:
    return isinstance(t, MemRefType) and isinstance(t.layout, NoneAttr)


def _shuffle(b: _B, x: SSAValue, y: SSAValue, mask: Sequence[int], vt: VectorType) -> SSAValue:
    return b.ins(vector.ShuffleOp(x, y, DenseArrayBase.from_list(i64, list(mask)), result_type=vt))


def transpose_rows(b: Builder, rows: Sequence[SSAValue], vt: VectorType) -> list[SSAValue]:
    """Transpose an n x n tile held as n row vectors of `vt` (n = lanes, a power of 2).

    8 and 4 lanes use the classic in-lane network (unpack, shuffle, 128-bit permute) that
    x86 executes as single-cycle shuffles; other sizes a generic interleave network.
    """
    n = len(rows)
    bb = _B(b)

    def sh(x, y, m):
        return _shuffle(bb, x, y, m, vt)

    if n == 1:
        return list(rows)
    if n == 8:
        s = transpose_lane_tiles(b, rows, vt)
        p0, p1 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
        return [sh(s[i], s[i + 4], p0) for i in range(4)] + [sh(s[i], s[i + 4], p1) for i in range(4)]
    if n == 4:
        t0, t1, t2, t3 = transpose_lane_tiles(b, rows, vt)
        p0, p1 = [0, 1, 4, 5], [2, 3, 6, 7]
        return [sh(t0, t2, p0), sh(t1, t3, p0), sh(t0, t2, p1), sh(t1, t3, p1)]
    assert n & (n - 1) == 0, "lanes must be a power of two"
    lo = [v for k in range(n // 2) for v in (k, n + k)]
    hi = [v for k in range(n // 2) for v in (n // 2 + k, n + n // 2 + k)]
    vs = list(rows)
    for _ in range(n.bit_length() - 1):
        out: list[SSAValue] = []
        for k in range(n // 2):
            out += [sh(vs[k], vs[k + n // 2], lo), sh(vs[k], vs[k + n // 2], hi)]
        vs = out
    return vs


def transpose_lane_tiles(b: Builder, vs: Sequence[SSAValue], vt: VectorType) -> list[SSAValue]:
    """Transpose, in each 128-bit lane on its own, the k x k tiles held by every k vectors
    of `vt` (k = the lane's elements: 4 for 32-bit, 2 for 64-bit), with in-lane
    shuffles only (unpack and shufps, which also issue on port 1; the lane-crossing
    ones, vperm2f128 and friends, only on port 5).

    For vectors [row i, t0..k-1 | row i+k, t0..k-1] (i < k) this gives the columns
    [rows 0..k-1, t_j | rows k..2k-1, t_j]: the transpose of 2k rows whose lane
    halves were paired by the loads (`load_lane_pairs`)."""
    bb = _B(b)
    k = 16 // (vt.element_type.bitwidth // 8)  # type: ignore[attr-defined]
    n = vt.get_shape()[0]

    def sh(x, y, m):
        return _shuffle(bb, x, y, m, vt)

    out: list[SSAValue] = []
    for i0 in range(0, len(vs), k):
        blk = list(vs[i0 : i0 + k])
        if k == 2:
            lo = [v for j in range(0, n, 2) for v in (j, n + j)]
            out += [sh(blk[0], blk[1], lo), sh(blk[0], blk[1], [m + 1 for m in lo])]
            continue
        u0, u1 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
        s0, s1 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
        t = [sh(blk[0], blk[1], u0), sh(blk[0], blk[1], u1), sh(blk[2], blk[3], u0), sh(blk[2], blk[3], u1)]
        out += [sh(t[0], t[2], s0), sh(t[0], t[2], s1), sh(t[1], t[3], s0), sh(t[1], t[3], s1)]
    return out


def load_lane_pairs(b: Builder, ref: SSAValue, index_lo: Sequence[SSAValue], index_hi: Sequence[SSAValue],
                    vt: VectorType) -> SSAValue:
    """One vector of `vt`: lane 0 loaded from index_lo, lane 1 from index_hi (half a
    vector each): the lane-crossing step of a transpose done by the load unit
    (vinsertf128 from memory: a load and an any-port blend, no port-5 shuffle)."""
    bb = _B(b)
    n = vt.get_shape()[0]
    half = VectorType(vt.element_type, [n // 2])
    lo = bb.ins(vector.LoadOp(ref, list(index_lo), half))
    hi = bb.ins(vector.LoadOp(ref, list(index_hi), half))
    return _shuffle(bb, lo, hi, list(range(n)), vt)


def _neutral(el: Attribute) -> tuple[float | int, float | int]:
    """(a, b) of an exact identity step: 1*h + (-0.0) == h for every float h, signed zeros too."""
    if isinstance(el, IntegerType):
        return 1, 0
    return 1.0, -0.0


def _mul(b: Builder, x: SSAValue, y: SSAValue) -> SSAValue:
    el = x.type.element_type if isinstance(x.type, VectorType) else x.type
    return _res(b.insert(arith.MuliOp(x, y) if isinstance(el, IntegerType) else arith.MulfOp(x, y)))


def _step(b: Builder, a: SSAValue, h: SSAValue, x: SSAValue) -> SSAValue:
    """a*h + x, unfused (mul_add handles vectors as well as scalars)."""
    el = a.type.element_type if isinstance(a.type, VectorType) else a.type
    if isinstance(el, IntegerType):
        return _res(b.insert(arith.AddiOp(_res(b.insert(arith.MuliOp(a, h))), x)))
    return _res(b.insert(arith.AddfOp(_res(b.insert(arith.MulfOp(a, h))), x)))
