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
        u0, u1 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
        s0, s1 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
        p0, p1 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
        t: list[SSAValue] = []
        for i in range(0, 8, 2):
            t += [sh(rows[i], rows[i + 1], u0), sh(rows[i], rows[i + 1], u1)]
        s: list[SSAValue] = [rows[0]] * 8
        for i in (0, 4):
            s[i + 0] = sh(t[i], t[i + 2], s0)
            s[i + 1] = sh(t[i], t[i + 2], s1)
            s[i + 2] = sh(t[i + 1], t[i + 3], s0)
            s[i + 3] = sh(t[i + 1], t[i + 3], s1)
        return [sh(s[i], s[i + 4], p0) for i in range(4)] + [sh(s[i], s[i + 4], p1) for i in range(4)]
    if n == 4:
        t0, t1 = sh(rows[0], rows[1], [0, 4, 2, 6]), sh(rows[0], rows[1], [1, 5, 3, 7])
        t2, t3 = sh(rows[2], rows[3], [0, 4, 2, 6]), sh(rows[2], rows[3], [1, 5, 3, 7])
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
