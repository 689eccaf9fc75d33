"""`scan-to-cpu`: lower scan ops to fast CPU loops (explicit `vector` dialect code).

A sequential scan is latency-bound on one multiply-add chain (DESIGN.md section 3), so
every fast path here runs many *independent* chains at once, one per vector lane, while
keeping each chain's arithmetic exactly the sequential one (separate multiply and add,
no FMA contraction, the same order).  Results are therefore bit-identical to the
interpreter and to `scan-to-loops` for `scan.affine`.

scan.affine, time axis innermost (`(..., C, L)`, the usual row-major layout)
    Channels go in groups of G lanes (G = 256 bits / element width: 8 for f32/i32,
    4 for f64/i64).  Each time loop iteration loads a tile of G rows x T = 2G columns
    (64 bytes per row: one cache line), transposes it in registers with
    `vector.shuffle` (the classic unpack/shuffle/permute network), runs T steps of
    `h = a*h + b` on vector<G> (G chains in the lanes), transposes the states back and
    stores the rows.  Rows are *skewed*: lane g works on time block k - g at
    iteration k, so that the G rows of a tile do not all hit the same cache set when
    the row length is a power of two (without the skew, 4 KiB-strided rows thrash L1
    and alias in the store buffer: measured 2x slower).  The skewed edges, the time
    remainder (L mod T) and a partial channel group run a masked variant of the same
    body (`vector.maskedload` with the identity step `a = 1, b = -0.0` in lanes that
    have nothing to do, `vector.maskedstore`), so no scalar clean-up code is needed.
scan.affine, time axis not innermost (`(L, C)`: channels contiguous)
    No transposes: vector<G> loads across channels, 4 independent vectors per time
    loop (4G channels), then single vectors, then one masked vector.
scan.recurrence with a rank-1 static state `memref<N x f32|f64>` (the Mamba shape)
    The state lives in a `vector<N>` register value for the whole time loop.  The
    `coeffs` region is vectorised over the state index (values that do not depend on it
    stay scalar and are broadcast where needed; a load whose last index is the state
    index becomes `vector.load`, any other varying load a gather of scalar loads);
    `emit` is cloned with its inner `scf.for %n = 0 to N` reduction loops vectorised
    (`vector.reduction`, ordered or reassociated: `reassoc_reductions`), its loops
    over the state that store state elements elsewhere become vector stores, and any
    other read of the state reading the memref, which then is kept up to date every step.
    `math.exp` inside becomes the polynomial of `exp_polynomial.py` (vector and scalar).
everything else (scan.scan, f16/bf16 inputs, rank-1 affine, non-identity layouts,
recurrences the vectoriser does not understand)
    the sequential lowering of `scan_to_loops.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, math, memref, scf, vector
from xdsl.dialects.builtin import (
    DenseArrayBase,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    NoneAttr,
    VectorType,
    i1,
    i64,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
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
from scanweaver.rewrites.loop_utils import (
    const_index,
    const_scalar,
    dim_sizes,
    for_loop,
    loop_nest,
    mul_add,
)
from scanweaver.rewrites.scan_to_loops import LowerAffine, LowerRecurrence, LowerScan

# ---------------------------------------------------------------------------
# Small builders
# ---------------------------------------------------------------------------


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


def _step(b: Builder, a: SSAValue, h: SSAValue, x: SSAValue) -> SSAValue:
    """a*h + x, unfused (mul_add handles vectors as well as scalars)."""
    el = a.type.element_type if isinstance(a.type, VectorType) else a.type
    if isinstance(el, IntegerType):
        return _res(b.insert(arith.AddiOp(_res(b.insert(arith.MuliOp(a, h))), x)))
    return _res(b.insert(arith.AddfOp(_res(b.insert(arith.MulfOp(a, h))), x)))


# ---------------------------------------------------------------------------
# scan.affine, time innermost: skewed transposed tiles
# ---------------------------------------------------------------------------


@dataclass
class _Tiles:
    """Everything the tile bodies of one channel group need."""

    op: scan.AffineOp
    outer: list[SSAValue]  # indices of the dims before the channel dim
    c0: SSAValue  # first channel of the group
    C: SSAValue
    L: SSAValue
    NBt: SSAValue  # ceil(L / T) time blocks
    G: int
    T: int
    skew: int
    vt: VectorType
    partial: bool  # channels c0.. past C are masked off

    @property
    def Q(self) -> int:
        return self.T // self.G

    @property
    def reverse(self) -> bool:
        return self.op.is_reverse


def _tile_rows(bb: _B, tl: _Tiles) -> tuple[list[SSAValue], list[SSAValue | None]]:
    """Row index and (for a partial group) row validity of each lane."""
    rows, valid = [], []
    for g in range(tl.G):
        r = bb.add(tl.c0, bb.idx(g)) if g else tl.c0
        if tl.partial:
            valid.append(bb.cmp(r, tl.C, "slt"))
            r = bb.min(r, bb.sub(tl.C, bb.idx(1)))
        else:
            valid.append(None)
        rows.append(r)
    return rows, valid


def _tile_body(
    b: Builder, tl: _Tiles, k: SSAValue, h: SSAValue, masked: bool, rows, row_valid
) -> SSAValue:
    """One iteration k: lane g does time block m = k - g*skew of its row."""
    bb = _B(b)
    G, T, Q, vt = tl.G, tl.T, tl.Q, tl.vt
    el = vt.element_type
    op = tl.op
    one, neg_zero = _neutral(el)
    mask_t = VectorType(i1, [G])
    zero_i, last_blk = bb.idx(0), bb.sub(tl.NBt, bb.idx(1))
    if masked:
        ones_v, negz_v = bb.splat_const(one, vt), bb.splat_const(neg_zero, vt)
    cols: list[SSAValue] = []
    masks: list[list[SSAValue]] = []
    a_rows: list[list[SSAValue]] = [[] for _ in range(Q)]
    b_rows: list[list[SSAValue]] = [[] for _ in range(Q)]
    for g in range(G):
        m = bb.sub(k, bb.idx(g * tl.skew)) if g else k
        if masked:
            valid = bb.and_(bb.cmp(m, zero_i, "sge"), bb.cmp(m, tl.NBt, "slt"))
            if row_valid[g] is not None:
                valid = bb.and_(valid, row_valid[g])
            m = bb.min(bb.max(m, zero_i), last_blk)
        blk = bb.sub(last_blk, m) if tl.reverse else m
        if masked:
            blk = bb.max(blk, zero_i)  # L == 0: no block at all, keep the address sane
        col = bb.mul(blk, bb.idx(T))
        cols.append(col)
        row_masks = []
        if masked:
            n = bb.select(valid, bb.min(bb.sub(tl.L, col), bb.idx(T)), zero_i)
        for q in range(Q):
            cq = bb.add(col, bb.idx(q * G)) if q else col
            index = [*tl.outer, rows[g], cq]
            if masked:
                nq = bb.min(bb.max(bb.sub(n, bb.idx(q * G)) if q else n, zero_i), bb.idx(G))
                mq = bb.ins(vector.CreateMaskOp([nq], mask_t))
                row_masks.append(mq)
                a_rows[q].append(bb.ins(vector.MaskedLoadOp(op.a, index, mq, ones_v)))
                b_rows[q].append(bb.ins(vector.MaskedLoadOp(op.b, index, mq, negz_v)))
            else:
                a_rows[q].append(bb.ins(vector.LoadOp(op.a, index, vt)))
                b_rows[q].append(bb.ins(vector.LoadOp(op.b, index, vt)))
        masks.append(row_masks)
    # Time steps: sub-tile q holds steps q*G .. q*G+G-1 of the block, one per column.
    order = range(Q - 1, -1, -1) if tl.reverse else range(Q)
    h_cols: dict[int, list[SSAValue]] = {}
    for q in order:
        a_t = transpose_rows(b, a_rows[q], vt)
        b_t = transpose_rows(b, b_rows[q], vt)
        states: list[SSAValue] = [h] * G
        for j in (range(G - 1, -1, -1) if tl.reverse else range(G)):
            h = _step(b, a_t[j], h, b_t[j])
            states[j] = h
        h_cols[q] = transpose_rows(b, states, vt)
    # Store row by row, both halves of a row's cache line together.
    for g in range(G):
        for q in range(Q):
            cq = bb.add(cols[g], bb.idx(q * G)) if q else cols[g]
            index = [*tl.outer, rows[g], cq]
            if masked:
                b.insert(vector.MaskedStoreOp(op.h, index, masks[g][q], h_cols[q][g]))
            else:
                b.insert(vector.StoreOp(h_cols[q][g], op.h, index))
    return h


def _tile_group(b: Builder, tl: _Tiles) -> None:
    """All time blocks of one channel group: masked edges around an unmasked steady loop."""
    bb = _B(b)
    op, G, vt = tl.op, tl.G, tl.vt
    el = vt.element_type
    rows, row_valid = _tile_rows(bb, tl)
    group_mask = None
    if tl.partial:
        group_mask = bb.ins(vector.CreateMaskOp([bb.sub(tl.C, tl.c0)], VectorType(i1, [G])))
    zero_v = bb.splat_const(0, vt)
    if op.init is not None:
        index = [*tl.outer, tl.c0]
        if tl.partial:
            h0 = bb.ins(vector.MaskedLoadOp(op.init, index, group_mask, zero_v))
        else:
            h0 = bb.ins(vector.LoadOp(op.init, index, vt))
    else:
        h0 = zero_v
    span = (G - 1) * tl.skew
    total = bb.add(tl.NBt, bb.idx(span))
    one = bb.idx(1)

    def run(lo, hi, h, masked) -> SSAValue:
        def body(sb: Builder, k: SSAValue, carried):
            return [_tile_body(sb, tl, k, carried[0], masked, rows, row_valid)]

        return for_loop(b, lo, hi, one, [h], body)[0]

    if tl.partial:
        h = run(bb.idx(0), total, h0, True)
    else:
        nbf = bb.ins(arith.DivUIOp(tl.L, bb.idx(tl.T)))  # full blocks
        # Lanes' block sequence numbers m that are full blocks: [m_lo, m_hi).
        m_lo = bb.sub(tl.NBt, nbf) if tl.reverse else bb.idx(0)
        m_hi = tl.NBt if tl.reverse else nbf
        first = bb.min(bb.add(m_lo, bb.idx(span)), total)
        steady_end = bb.max(first, m_hi)
        h = run(bb.idx(0), first, h0, True)
        h = run(first, steady_end, h, False)
        h = run(steady_end, total, h, True)
    if op.final is not None:
        index = [*tl.outer, tl.c0]
        if tl.partial:
            b.insert(vector.MaskedStoreOp(op.final, index, group_mask, h))
        else:
            b.insert(vector.StoreOp(h, op.final, index))


def lower_affine_tiled(b: Builder, op: scan.AffineOp, skew: int = 1) -> None:
    """Channels (dim rank-2) in groups of G lanes, time (dim rank-1) in tiles of T = 2G."""
    h_t = op.h.type
    assert isinstance(h_t, MemRefType)
    el = h_t.element_type
    bits = _element_bits(el)
    assert bits is not None
    G = 256 // bits
    T = 2 * G
    vt = VectorType(el, [G])
    bb = _B(b)
    sizes = dim_sizes(b, op.h)
    r = len(sizes)
    C, L = sizes[r - 2], sizes[r - 1]
    nbt = bb.ins(arith.DivUIOp(bb.add(L, bb.idx(T - 1)), bb.idx(T)))
    full_c = bb.mul(bb.ins(arith.DivUIOp(C, bb.idx(G))), bb.idx(G))

    def per_outer(ob: Builder, outer: Sequence[SSAValue]) -> None:
        obb = _B(ob)

        def group(gb: Builder, c0: SSAValue, _carried):
            _tile_group(gb, _Tiles(op, list(outer), c0, C, L, nbt, G, T, skew, vt, False))
            return []

        for_loop(ob, obb.idx(0), full_c, obb.idx(G), [], group)
        # The partial group, if any: a loop of 0 or 1 trip.
        def partial(gb: Builder, c0: SSAValue, _carried):
            _tile_group(gb, _Tiles(op, list(outer), c0, C, L, nbt, G, T, skew, vt, True))
            return []

        for_loop(ob, full_c, C, obb.idx(G), [], partial)

    loop_nest(b, sizes[: r - 2], per_outer)


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
    bb = _B(b)
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


def affine_fast_path(op: scan.AffineOp) -> str | None:
    """Which fast lowering applies ('tiled', 'channels'), or None for the sequential one."""
    h_t = op.h.type
    if not isinstance(h_t, MemRefType):
        return None
    el = h_t.element_type
    if _element_bits(el) is None:
        return None
    operands = [op.a, op.b, op.h] + [v for v in (op.init, op.final) if v is not None]
    for v in operands:
        if not _identity_layout(v.type):
            return None
        if v.type.element_type != el:  # type: ignore[attr-defined]
            return None  # f16/bf16 inputs widening to f32: sequential
    r = h_t.get_num_dims()
    if r < 2:
        return None
    return "tiled" if op.axis_value == r - 1 else "channels"


class LowerAffineCpu(RewritePattern):
    def __init__(self, skew: int = 1):
        self.skew = skew

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.AffineOp, rewriter: PatternRewriter) -> None:
        path = affine_fast_path(op)
        if path is None:
            return  # left for the sequential fallback
        b = Builder(InsertPoint.before(op))
        if path == "tiled":
            lower_affine_tiled(b, op, self.skew)
        else:
            lower_affine_channels(b, op)
        rewriter.erase(op)


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanToCpu(ModulePass):
    """Lower scan ops to vectorised CPU loops; sequential loops where no fast path applies.

    Options: `skew` (time blocks between neighbouring lanes of a tile, >= 1),
    `reassoc_reductions` (tree-order vector reductions in recurrence consumers: faster,
    not bit-identical to the sequential sum), `poly_exp` (polynomial math.exp inside
    vectorised recurrences).
    """

    name = "scan-to-cpu"

    skew: int = 1
    reassoc_reductions: bool = True
    poly_exp: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from scanweaver.rewrites.recurrence_cpu import LowerRecurrenceCpu

        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    LowerAffineCpu(max(1, self.skew)),
                    LowerRecurrenceCpu(self.reassoc_reductions, self.poly_exp),
                ]
            ),
            apply_recursively=False,
        ).rewrite_module(op)
        # Whatever is left takes the sequential lowering.
        PatternRewriteWalker(
            GreedyRewritePatternApplier([LowerAffine(), LowerScan(), LowerRecurrence()]),
            apply_recursively=False,
        ).rewrite_module(op)


__all__ = ["ScanToCpu", "affine_fast_path", "transpose_rows"]
