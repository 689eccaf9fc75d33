"""`scan-to-cpu`: lower scan ops to fast CPU loops (explicit `vector` dialect code).

A sequential scan is latency-bound on one multiply-add chain (shared/DESIGN.md section 3), so
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
    stores the rows.  Long rows are *skewed*: lane g works on time block k - s*g at
    iteration k (s = 2 by default), so that the G rows of a tile do not all hit the same
    cache set when the row length is a power of two (without the skew, 4 KiB-strided
    rows thrash L1 and alias in the store buffer: measured 2x slower).  The skewed edges, the time
    remainder (L mod T) and a partial channel group run a masked variant of the same
    body (`vector.maskedload` with the identity step `a = 1, b = -0.0` in lanes that
    have nothing to do, `vector.maskedstore`), so no scalar clean-up code is needed.
    When h is large (NONTEMPORAL_MIN_BYTES) and its rows are 32-byte aligned (runtime
    tests), the steady loop stores h with streaming stores (`nontemporal`, aligned:
    vmovntps), saving the read-for-ownership of every output line.
scan.affine, time axis not innermost (`(L, C)`: channels contiguous)
    No transposes: vector<G> loads across channels, 4 independent vectors per time
    loop (4G channels), then single vectors, then one masked vector.
scan.recurrence with a rank-1 static state `memref<N x f32|f64|i32|i64>` (the Mamba shape)
    The state lives in a `vector<N>` register value for the whole time loop.  The
    `coeffs` region is vectorised over the state index (values that do not depend on it
    stay scalar and are broadcast where needed; a load whose last index is the state
    index becomes `vector.load`, any other varying load a gather of scalar loads);
    `emit` is cloned with its inner `scf.for %n = 0 to N` reduction loops vectorised
    (`vector.reduction`, reassociated by default: `reassoc_reductions=false` keeps the
    sequential order), its loops over the state that store state elements elsewhere
    become vector stores, and any other read of the state reading the memref, which then
    is kept up to date every step.  Work that depends on time only (softplus of delta,
    silu(z), D*u: loads whose last index is the step) is vectorised over TIME_BLOCK = 16
    steps at a time, in a prologue of each block of unrolled steps, when it contains
    math functions or divisions.  `math.exp` and `math.log1p` inside become the
    polynomials of `exp_polynomial.py` (vector and scalar): libm would be called per lane.
everything else (scan.scan, f16/bf16 inputs, rank-1 affine, non-identity layouts,
recurrences the vectoriser does not understand)
    the sequential lowering of `scan_to_loops.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, func, math, memref, scf, vector
from xdsl.dialects.builtin import (
    BoolAttr,
    i32,
    DYNAMIC_INDEX,
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
from xdsl.dialects.utils.fast_math import FastMathFlag
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.traits import IsTerminator, is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.errors import CannotLower
from scanweaver.rewrites.loop_utils import (
    const_index,
    const_scalar,
    dim_sizes,
    for_loop,
    loop_nest,
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


def _mul(b: Builder, x: SSAValue, y: SSAValue) -> SSAValue:
    el = x.type.element_type if isinstance(x.type, VectorType) else x.type
    return _res(b.insert(arith.MuliOp(x, y) if isinstance(el, IntegerType) else arith.MulfOp(x, y)))


def _step(b: Builder, a: SSAValue, h: SSAValue, x: SSAValue) -> SSAValue:
    """a*h + x, unfused (mul_add handles vectors as well as scalars)."""
    el = a.type.element_type if isinstance(a.type, VectorType) else a.type
    if isinstance(el, IntegerType):
        return _res(b.insert(arith.AddiOp(_res(b.insert(arith.MuliOp(a, h))), x)))
    return _res(b.insert(arith.AddfOp(_res(b.insert(arith.MulfOp(a, h))), x)))


# ---------------------------------------------------------------------------
# scan.affine, time innermost: skewed transposed tiles
# ---------------------------------------------------------------------------


#: Rows of at least LONG_ROW_BLOCKS time blocks (2048 f32 steps) get the full skew,
#: rows of MEDIUM_ROW_BLOCKS .. LONG_ROW_BLOCKS a skew of 1, shorter rows none: the
#: 2*(G-1)*skew masked edge iterations would be a large part of their work (measured,
#: 1 core, medians over allocations: 1024x256 f32 0.11 ms unskewed vs 0.18 skewed;
#: 1024x1024 0.57 unskewed, 0.44 with skew 1, 0.53 with skew 2).
LONG_ROW_BLOCKS = 128
MEDIUM_ROW_BLOCKS = 32

#: Rows of at least this many time blocks get software prefetch.
PREFETCH_MIN_BLOCKS = 32

#: memref.prefetch locality hint: 2 (prefetcht1, into L2) measured best: 1024x4096 f32
#: on 2 cores 1.80 ms vs 2.06 ms with 3 (into L1) and 2.2 ms without prefetch; with
#: 24 row streams per core the L1 miss buffers, not DRAM, were the limit.
PREFETCH_LOCALITY = 2

#: Non-temporal (streaming) stores of h in the unmasked steady loop: an h of at least
#: NONTEMPORAL_MIN_BYTES (a runtime test on the memref passed in) is written with
#: `vector.store {nontemporal = true, alignment = 32}` (vmovntps: no read-for-ownership
#: of the stored lines, a third less DRAM traffic), when its rows are 32-byte aligned
#: (aligned pointer + offset, and every outer stride, multiples of 32 bytes; another
#: runtime test, else the ordinary stores).  Smaller outputs stay in cache for the
#: reader: streaming them to DRAM would cost more than the saved read.
#: Ordering: NT stores are weakly ordered, but they are drained by any serialising
#: event before another thread can observe h: the OpenMP barrier closing the parallel
#: region and the thread-pool join (both locked read-modify-writes, which order
#: earlier NT stores on x86), and the return to the caller on the same thread
#: (program order holds for the storing thread itself).  No explicit sfence needed.
NONTEMPORAL_MIN_BYTES = 8 << 20


@dataclass
class _Tiles:
    """Everything the tile bodies of one channel group need."""

    op: "_AffineOperands"
    outer: list[SSAValue]  # indices of the dims before the channel dim
    c0: SSAValue  # first channel of the group
    C: SSAValue
    L: SSAValue
    NBt: SSAValue  # ceil(L / T) time blocks
    G: int
    T: int
    skew: SSAValue  # time blocks between neighbouring lanes (a runtime value)
    vt: VectorType
    partial: bool  # channels c0.. past C are masked off
    aggregate: bool = False  # compute (prod a, scan from 0) per row, store no h
    agg_mode: str = "exact"  # aggregate arithmetic: see AGGREGATE_MODES
    prefetch: int = 0  # software prefetch distance in time blocks (0: none)
    prefetch_h: bool = False  # also prefetch the output rows for writing
    long_rows: SSAValue | None = None  # i1: rows long enough to prefetch
    nt_ok: SSAValue | None = None  # i1: h large and 32-byte aligned rows (NT stores allowed)
    nontemporal: bool = False  # this copy of the body stores h non-temporally

    @property
    def Q(self) -> int:
        return self.T // self.G

    @property
    def reverse(self) -> bool:
        return self.op.is_reverse


def _prefetch(b: Builder, ref: SSAValue, index: Sequence[SSAValue], write: bool = False) -> None:
    """memref.prefetch (locality 3, data cache); xDSL has no such op: generic form."""
    from scanweaver.rewrites.exp_polynomial import generic_op_class

    cls = generic_op_class("memref.prefetch", ("isDataCache", "isWrite", "localityHint"), pure=False)
    b.insert(
        cls.create(
            operands=[ref, *index],
            properties={
                "isDataCache": BoolAttr.from_bool(True),
                "isWrite": BoolAttr.from_bool(write),
                "localityHint": IntegerAttr(PREFETCH_LOCALITY, i32),
            },
        )
    )


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
    b: Builder, tl: _Tiles, k: SSAValue, hs: list[SSAValue], masked: bool, rows, row_valid, shifts
) -> list[SSAValue]:
    """One iteration k: lane g does time block m = k - g*skew of its row.

    `hs` is [h] for a scan, [A, B] for an aggregate (A = product of a, B = the scan
    from 0): an aggregate stores nothing.
    """
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
        m = bb.sub(k, shifts[g]) if g else k
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
        if tl.prefetch and not masked:
            # Software prefetch of this row `prefetch` blocks ahead (clamped into the row).
            ahead = bb.sub(col, bb.idx(tl.prefetch * T)) if tl.reverse else bb.add(col, bb.idx(tl.prefetch * T))
            ahead = bb.max(bb.min(ahead, bb.sub(tl.L, bb.idx(T))), zero_i)
            for ref in (op.a, op.b):
                _prefetch(b, ref, [*tl.outer, rows[g], ahead])
            if tl.prefetch_h and not tl.aggregate:
                _prefetch(b, op.h, [*tl.outer, rows[g], ahead], write=True)
    # Time steps: sub-tile q holds steps q*G .. q*G+G-1 of the block, one per column.
    order = range(Q - 1, -1, -1) if tl.reverse else range(Q)
    h_cols: dict[int, list[SSAValue]] = {}
    for q in order:
        a_t = transpose_rows(b, a_rows[q], vt)
        b_t = transpose_rows(b, b_rows[q], vt)
        if tl.aggregate:
            steps = range(G - 1, -1, -1) if tl.reverse else range(G)
            hs = _aggregate_block(b, tl.agg_mode, [a_t[j] for j in steps], [b_t[j] for j in steps], hs)
            continue
        h = hs[0]
        states: list[SSAValue] = [h] * G
        for j in (range(G - 1, -1, -1) if tl.reverse else range(G)):
            h = _step(b, a_t[j], h, b_t[j])
            states[j] = h
        hs = [h]
        h_cols[q] = transpose_rows(b, states, vt)
    if tl.aggregate:
        return hs
    # Store row by row, both halves of a row's cache line together.
    for g in range(G):
        for q in range(Q):
            cq = bb.add(cols[g], bb.idx(q * G)) if q else cols[g]
            index = [*tl.outer, rows[g], cq]
            if masked:
                b.insert(vector.MaskedStoreOp(op.h, index, masks[g][q], h_cols[q][g]))
            elif tl.nontemporal:
                st = b.insert(vector.StoreOp(h_cols[q][g], op.h, index, BoolAttr.from_bool(True)))
                # Needed for LLVM to emit vmovntps (it is only legal aligned); the
                # runtime test nt_ok guarantees it: rows are 32-byte aligned and the
                # column cq is a multiple of G elements (32 bytes).
                st.attributes["alignment"] = IntegerAttr(32, i64)
            else:
                b.insert(vector.StoreOp(h_cols[q][g], op.h, index))
    return hs


def _tile_group(b: Builder, tl: _Tiles) -> None:
    """All time blocks of one channel group: masked edges around an unmasked steady loop."""
    bb = _B(b)
    op, G, vt = tl.op, tl.G, tl.vt
    rows, row_valid = _tile_rows(bb, tl)
    group_mask = None
    if tl.partial:
        group_mask = bb.ins(vector.CreateMaskOp([bb.sub(tl.C, tl.c0)], VectorType(i1, [G])))
    zero_v = bb.splat_const(0, vt)
    if op.init is not None and not tl.aggregate:
        index = [*tl.outer, tl.c0]
        if tl.partial:
            h0 = bb.ins(vector.MaskedLoadOp(op.init, index, group_mask, zero_v))
        else:
            h0 = bb.ins(vector.LoadOp(op.init, index, vt))
    else:
        h0 = zero_v
    shifts = [bb.mul(bb.idx(g), tl.skew) if g > 1 else tl.skew for g in range(G)]
    span = shifts[G - 1]
    total = bb.add(tl.NBt, span)
    one = bb.idx(1)

    def run(lo, hi, hs, masked, builder: Builder = b, tiles: _Tiles = tl) -> list[SSAValue]:
        def body(sb: Builder, k: SSAValue, carried):
            return _tile_body(sb, tiles, k, list(carried), masked, rows, row_valid, shifts)

        return list(for_loop(builder, lo, hi, one, hs, body))

    def steady_pf(lo, hi, hs, builder: Builder, tiles: _Tiles) -> list[SSAValue]:
        """The unmasked loop; with software prefetch only for long rows (a runtime test):
        for rows that stay in cache the prefetches cost more than they bring."""
        if not tiles.prefetch or tiles.long_rows is None:
            return run(lo, hi, hs, False, builder, replace(tiles, prefetch=0))
        blocks = []
        for pf in (tiles.prefetch, 0):
            blk = Block()
            ib = Builder(InsertPoint.at_end(blk))
            out = run(lo, hi, hs, False, ib, replace(tiles, prefetch=pf))
            ib.insert(scf.YieldOp(*out))
            blocks.append(Region(blk))
        op_if = builder.insert(scf.IfOp(tiles.long_rows, [v.type for v in hs], blocks[0], blocks[1]))
        return list(op_if.results)

    def steady(lo, hi, hs) -> list[SSAValue]:
        """steady_pf, with non-temporal h stores when nt_ok (a runtime test)."""
        if tl.nt_ok is None or tl.aggregate:
            return steady_pf(lo, hi, hs, b, tl)
        blocks = []
        for nt in (True, False):
            blk = Block()
            ib = Builder(InsertPoint.at_end(blk))
            out = steady_pf(lo, hi, hs, ib, replace(tl, nontemporal=nt))
            ib.insert(scf.YieldOp(*out))
            blocks.append(Region(blk))
        op_if = b.insert(scf.IfOp(tl.nt_ok, [v.type for v in hs], blocks[0], blocks[1]))
        return list(op_if.results)

    h0s = _aggregate_init(bb, tl.agg_mode, vt) if tl.aggregate else [h0]
    if tl.partial:
        hs = run(bb.idx(0), total, h0s, True)
    else:
        nbf = bb.ins(arith.DivUIOp(tl.L, bb.idx(tl.T)))  # full blocks
        # Lanes' block sequence numbers m that are full blocks: [m_lo, m_hi).
        m_lo = bb.sub(tl.NBt, nbf) if tl.reverse else bb.idx(0)
        m_hi = tl.NBt if tl.reverse else nbf
        first = bb.min(bb.add(m_lo, span), total)
        steady_end = bb.max(first, m_hi)
        hs = run(bb.idx(0), first, h0s, True)
        hs = steady(first, steady_end, hs)
        hs = run(steady_end, total, hs, True)
    outs = [op.final] if not tl.aggregate else op.aggregate_outputs()
    for out, h in zip(outs, hs):
        if out is None:
            continue
        index = [*tl.outer, tl.c0]
        if tl.partial:
            b.insert(vector.MaskedStoreOp(out, index, group_mask, h))
        else:
            b.insert(vector.StoreOp(h, out, index))


def _nontemporal_ok(bb: _B, h: SSAValue, sizes: Sequence[SSAValue], el_bytes: int) -> SSAValue:
    """i1: h holds at least NONTEMPORAL_MIN_BYTES and every row starts 32-byte aligned."""
    meta = bb.b.insert(memref.ExtractStridedMetaDataOp(h))
    ptr = bb.ins(memref.ExtractAlignedPointerAsIndexOp.get(h))
    start = bb.add(ptr, bb.mul(meta.offset, bb.idx(el_bytes)))
    lanes = 32 // el_bytes
    rem = bb.ins(arith.RemUIOp(start, bb.idx(32)))
    ok = bb.cmp(rem, bb.idx(0), "eq")
    for stride in list(meta.strides)[:-1]:
        ok = bb.and_(ok, bb.cmp(bb.ins(arith.RemUIOp(stride, bb.idx(lanes))), bb.idx(0), "eq"))
    total = sizes[0]
    for s_ in sizes[1:]:
        total = bb.mul(total, s_)
    big = bb.cmp(total, bb.idx(NONTEMPORAL_MIN_BYTES // el_bytes), "sge")
    return bb.and_(ok, big)


@dataclass
class _AffineOperands:
    """The operands the tile code reads (a scan.affine's, or an aggregate's)."""

    a: SSAValue
    b: SSAValue
    h: SSAValue  # the output of the shape of a (for an aggregate: a, never written)
    init: SSAValue | None  # aggregate: the A output
    final: SSAValue | None  # aggregate: the B output
    is_reverse: bool
    agg_outs: tuple[SSAValue, ...] = ()  # aggregate: all outputs, in AGGREGATE_MODES order

    def aggregate_outputs(self) -> list[SSAValue | None]:
        return list(self.agg_outs) if self.agg_outs else [self.init, self.final]


def lower_affine_tiled(
    b: Builder,
    op: scan.AffineOp | _AffineOperands,
    skew: int = 1,
    aggregate: bool = False,
    prefetch: int = 0,
    prefetch_h: bool = False,
    parallel: bool = False,
    nontemporal: bool = False,
    agg_mode: str = "exact",
) -> None:
    """Channels (dim rank-2) in groups of G lanes, time (dim rank-1) in tiles of T = 2G.

    nontemporal: the steady loop stores h with streaming stores when h is large and
    its rows 32-byte aligned (runtime tests, see NONTEMPORAL_MIN_BYTES).

    parallel: the loop over the full channel groups is an `scf.parallel` (for
    `convert-scf-to-openmp`: an `omp.wsloop`) instead of an `scf.for`; same body.
    """
    if isinstance(op, scan.AffineOp):
        op = _AffineOperands(op.a, op.b, op.h, op.init, op.final, op.is_reverse)
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
    # Skew only rows long enough for the masked edges to be a small part of the work.
    long_rows = bb.cmp(nbt, bb.idx(LONG_ROW_BLOCKS), "sge")
    medium_rows = bb.cmp(nbt, bb.idx(MEDIUM_ROW_BLOCKS), "sge")
    skew_v = bb.select(long_rows, bb.idx(skew), bb.select(medium_rows, bb.idx(min(skew, 1)), bb.idx(0)))
    prefetch_rows = bb.cmp(nbt, bb.idx(PREFETCH_MIN_BLOCKS), "sge")
    nt_ok = _nontemporal_ok(bb, op.h, sizes, bits // 8) if nontemporal and not aggregate else None

    def per_outer(ob: Builder, outer: Sequence[SSAValue]) -> None:
        obb = _B(ob)

        def group(gb: Builder, c0: SSAValue, _carried):
            _tile_group(
                gb,
                _Tiles(
                    op, list(outer), c0, C, L, nbt, G, T, skew_v, vt, False, aggregate, agg_mode, prefetch,
                    prefetch_h, prefetch_rows, nt_ok,
                ),
            )
            return []

        if parallel:
            blk = Block(arg_types=[IndexType()])
            pb = Builder(InsertPoint.at_end(blk))
            group(pb, blk.args[0], [])
            pb.insert(scf.ReduceOp())
            ob.insert(scf.ParallelOp([obb.idx(0)], [full_c], [obb.idx(G)], Region(blk)))
        else:
            for_loop(ob, obb.idx(0), full_c, obb.idx(G), [], group)
        # The partial group, if any: a loop of 0 or 1 trip.
        def partial(gb: Builder, c0: SSAValue, _carried):
            _tile_group(gb, _Tiles(op, list(outer), c0, C, L, nbt, G, T, skew_v, vt, True, aggregate, agg_mode))
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
#: every `a` is split into an exact power of two, whose exponent is added to E (i64),
#: and a mantissa near 1; the product of mantissas is renormalised by a power of two
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
        for a, x in zip(a_steps, x_steps):
            a = _fop(b, lambda v: arith.ExtFOp(v, wt), a)
            x = _fop(b, lambda v: arith.ExtFOp(v, wt), x)
            bh = _step(b, a, bh, x)
            inv, ka = _exponent_split(b, a)  # f32 values are normal f64: mantissa in [1, 2)
            ph = _fop(b, arith.MulfOp, ph, _fop(b, arith.MulfOp, a, inv))
            e = bb.ins(arith.AddiOp(e, ka))
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


def build_chunk_aggregate(el: Attribute, rank: int = 3, reverse: bool = False, skew: int = 1) -> ModuleOp:
    """`func.func @aggregate(a, b, outs...)` for the chunked (parallel-in-time) scan.

    a, b: `memref<?x..x?xT>` of rank >= 2, time innermost; outs: the same without the
    time dim, one per entry of AGGREGATE_MODES[aggregate_mode(T)] (f64 for floats, i64 for E).
    Per row: A = product of a over time, B = the scan's last value from h = 0, i.e.
    the row's combined pair (a1, b1) . (a2, b2) . ... applied in time order (from the
    end when `reverse`), f32 rows in f64, f64 rows in double-double, the product
    renormalised (see AGGREGATE_MODES).  Uses the same skewed tiles as `scan.affine`.
    """
    mode = aggregate_mode(el)
    dyn = [DYNAMIC_INDEX] * rank
    full_t = MemRefType(el, dyn)
    acc_el = el if mode == "exact" else Float64Type()
    out_ts = [MemRefType(i64 if name == "E" else acc_el, dyn[:-1]) for name in AGGREGATE_MODES[mode]]
    arg_types = [full_t, full_t] + out_ts
    block = Block(arg_types=arg_types)
    a, x, *outs = block.args
    b = Builder(InsertPoint.at_end(block))
    operands = _AffineOperands(a, x, a, outs[0], outs[-1], reverse, tuple(outs))
    lower_affine_tiled(b, operands, skew, aggregate=True, agg_mode=mode)
    b.insert(func.ReturnOp())
    fn = func.FuncOp("aggregate", (arg_types, []), Region(block))
    return ModuleOp([fn])


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
    def __init__(
        self,
        skew: int = 1,
        prefetch: int = 0,
        prefetch_h: bool = False,
        parallel_channels: bool = False,
        nontemporal: bool = True,
    ):
        self.nontemporal = nontemporal
        self.skew = skew
        self.prefetch = prefetch
        self.prefetch_h = prefetch_h
        self.parallel_channels = parallel_channels

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.AffineOp, rewriter: PatternRewriter) -> None:
        path = affine_fast_path(op)
        if path is None:
            return  # left for the sequential fallback
        b = Builder(InsertPoint.before(op))
        if path == "tiled":
            lower_affine_tiled(
                b,
                op,
                self.skew,
                prefetch=self.prefetch,
                prefetch_h=self.prefetch_h,
                parallel=self.parallel_channels,
                nontemporal=self.nontemporal,
            )
        else:
            lower_affine_channels(b, op)
        rewriter.erase(op)


# ---------------------------------------------------------------------------
# scan.recurrence: the state vector in registers, regions vectorised over it
# ---------------------------------------------------------------------------


#: The vectoriser does not handle this recurrence (the sequential lowering will).
_Unsupported = CannotLower


_REDUCTIONS: dict[type, vector.CombiningKindFlag] = {
    arith.AddfOp: vector.CombiningKindFlag.ADD,
    arith.AddiOp: vector.CombiningKindFlag.ADD,
    arith.MulfOp: vector.CombiningKindFlag.MUL,
    arith.MuliOp: vector.CombiningKindFlag.MUL,
    arith.MaximumfOp: vector.CombiningKindFlag.MAXIMUMF,
    arith.MinimumfOp: vector.CombiningKindFlag.MINIMUMF,
    arith.MaxnumfOp: vector.CombiningKindFlag.MAXNUMF,
    arith.MinnumfOp: vector.CombiningKindFlag.MINNUMF,
    arith.MaxSIOp: vector.CombiningKindFlag.MAXSI,
    arith.MinSIOp: vector.CombiningKindFlag.MINSI,
    arith.AndIOp: vector.CombiningKindFlag.AND,
    arith.OrIOp: vector.CombiningKindFlag.OR,
    arith.XOrIOp: vector.CombiningKindFlag.XOR,
}

MAX_STATE_LANES = 64


@dataclass
class _Val:
    """How an original SSA value lives in the vectorised loop.

    kind "u": uniform (one scalar, `new`); "v": varying (`new` is vector<N>);
    "i": an index equal to the state index plus `new` (`const` when known);
    "state": the state memref (its elements are the register vector).
    """

    kind: str
    new: SSAValue | None = None
    const: int | None = None


def _vectorised(op: Operation, operands: Sequence[SSAValue], lanes: int) -> Operation:
    """The elementwise `op` on vector operands (a generic twin where xDSL wants scalars)."""
    from scanweaver.rewrites.exp_polynomial import vector_compatible

    new = type(op).create(
        operands=list(operands),
        result_types=[VectorType(r.type, [lanes]) for r in op.results],
        properties=dict(op.properties),
        attributes=dict(op.attributes),
    )
    return vector_compatible(new)


#: Steps per block of the time-vectorised prologue of a recurrence.
TIME_BLOCK = 16


@dataclass
class _HoistPlan:
    """Ops of the regions that depend on time only, computed T steps at a time.

    kinds: result -> "inv" (loop-invariant scalar) or "tv" (vector over T steps).
    exported: hoisted values the per-step code uses.
    """

    ops: list[Operation]
    kinds: dict[SSAValue, str]
    exported: list[SSAValue]


def _const_int(v: SSAValue) -> int | None:
    owner = v.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return owner.value.value.data
    return None


class _RecurrenceVectorizer:
    def __init__(self, op: scan.RecurrenceOp, reassoc: bool):
        self.op = op
        st = op.state_type
        self.N = st.get_shape()[0]
        self.el = st.element_type
        self.vt = VectorType(self.el, [self.N])
        self.reassoc = reassoc
        self.needs_state_store = False
        self.state_values = {op.state, op.emit.block.args[1]}
        self.state_vec: SSAValue | None = None
        self.skip: set[Operation] = set()

    # -- values ------------------------------------------------------------

    def val(self, env: dict[SSAValue, _Val], v: SSAValue) -> _Val:
        if v in env:
            return env[v]
        if v in self.state_values:
            return _Val("state")
        return _Val("u", v)  # defined outside the regions: loop-invariant

    def uniform(self, env, v: SSAValue) -> SSAValue:
        x = self.val(env, v)
        if x.kind != "u":
            raise _Unsupported(f"value {v} is not uniform")
        assert x.new is not None
        return x.new

    def as_vector(self, b: _B, env, v: SSAValue) -> SSAValue:
        x = self.val(env, v)
        if x.kind == "v":
            assert x.new is not None
            return x.new
        if x.kind == "u":
            assert x.new is not None
            t = x.new.type
            if isinstance(t, IndexType | VectorType):
                raise _Unsupported("cannot broadcast this value")
            return b.splat(x.new, VectorType(t, [self.N]))
        raise _Unsupported(f"cannot use {x.kind} value {v} as a vector")

    def lane_index(self, b: _B, x: _Val, n: int) -> SSAValue:
        assert x.new is not None
        return b.add(x.new, b.idx(n)) if n else x.new

    # -- cloning uniform ops -------------------------------------------------

    def _outside_refs(self, op: Operation) -> list[SSAValue]:
        """Operands used in op (nested regions included) that are defined outside it."""
        inner: set[SSAValue] = set()
        for o in op.walk():
            inner.update(o.results)
            for r in o.regions:
                for blk in r.blocks:
                    inner.update(blk.args)
        refs = []
        for o in op.walk():
            for v in o.operands:
                if v not in inner:
                    refs.append(v)
        return refs

    def clone_uniform(self, b: Builder, env, op: Operation) -> None:
        mapper: dict[SSAValue, SSAValue] = {}
        for v in self._outside_refs(op):
            x = self.val(env, v)
            if x.kind == "state":
                self.needs_state_store = True
                mapper[v] = self.op.state
            elif x.kind == "u":
                assert x.new is not None
                mapper[v] = x.new
            else:
                raise _Unsupported(f"'{op.name}' uses a value that depends on the state index")
        new = b.insert(op.clone(value_mapper=mapper))
        for old, nv in zip(op.results, new.results):
            env[old] = _Val("u", nv)

    # -- one block -----------------------------------------------------------

    def block(self, b: Builder, block: Block, env: dict[SSAValue, _Val], in_vector_loop: bool) -> list[SSAValue]:
        """Vectorise `block` into `b`; return the (original) values its terminator yields."""
        for op in block.ops:
            if op is block.last_op and op.has_trait(IsTerminator):
                return list(op.operands)
            if op in self.skip:
                continue  # computed for a whole block of steps (time-vectorised)
            self.one(b, op, env, in_vector_loop)
        return []

    def one(self, b: Builder, op: Operation, env, in_vector_loop: bool) -> None:
        bb = _B(b)
        kinds = [self.val(env, v).kind for v in op.operands]
        if isinstance(op, memref.LoadOp):
            self.load(bb, op, env, kinds)
            return
        if isinstance(op, memref.StoreOp):
            self.store(bb, op, env, kinds, in_vector_loop)
            return
        if isinstance(op, scf.ForOp) and self.is_state_loop(op):
            if in_vector_loop:
                raise _Unsupported("nested loops over the state")
            self.vector_loop(b, op, env)
            return
        if op.regions or all(k == "u" for k in kinds):
            if in_vector_loop and not is_side_effect_free(op) and not isinstance(op, memref.LoadOp):
                # Run once instead of N times: only sound for pure ops.
                raise _Unsupported(f"'{op.name}' with side effects inside a loop over the state")
            self.clone_uniform(b, env, op)
            return
        if "state" in kinds:
            raise _Unsupported(f"'{op.name}' uses the state memref")
        if isinstance(op, arith.AddiOp | arith.SubiOp) and "i" in kinds:
            x, y = (self.val(env, v) for v in op.operands)
            if isinstance(op, arith.AddiOp) and x.kind == "u" and y.kind == "i":
                x, y = y, x
            if x.kind == "i" and y.kind == "u":
                assert x.new is not None and y.new is not None
                c = _const_int(y.new)
                if isinstance(op, arith.AddiOp):
                    env[op.results[0]] = _Val("i", bb.add(x.new, y.new), None if x.const is None or c is None else x.const + c)
                else:
                    env[op.results[0]] = _Val("i", bb.sub(x.new, y.new), None if x.const is None or c is None else x.const - c)
                return
            raise _Unsupported("unsupported arithmetic on the state index")
        if "i" in kinds:
            raise _Unsupported(f"'{op.name}' on the state index")
        if op.dialect_name() not in ("arith", "math"):
            raise _Unsupported(f"'{op.name}' on values that depend on the state index")
        operands = [self.as_vector(bb, env, v) for v in op.operands]
        new = b.insert(_vectorised(op, operands, self.N))
        for old, nv in zip(op.results, new.results):
            env[old] = _Val("v", nv)

    def _contiguous_last(self, ref: SSAValue, kinds: list[str]) -> bool:
        """Only the last index varies (as state index + offset) on a unit-stride dim."""
        if "v" in kinds or kinds.count("i") != 1 or kinds[-1] != "i":
            return False
        return _identity_layout(ref.type)

    def load(self, bb: _B, op: memref.LoadOp, env, kinds) -> None:
        ref_kind, idx_kinds = kinds[0], kinds[1:]
        res = op.results[0]
        if ref_kind == "state":
            (x,) = (self.val(env, v) for v in op.indices)
            assert self.state_vec is not None
            if x.kind == "i" and x.const == 0:
                env[res] = _Val("v", self.state_vec)
            elif x.kind == "u":
                assert x.new is not None
                env[res] = _Val("u", bb.ins(vector.ExtractOp(self.state_vec, [x.new], self.el)))
            else:
                raise _Unsupported("state read at a shifted index")
            return
        if all(k == "u" for k in kinds):
            self.clone_uniform(bb.b, env, op)
            return
        if ref_kind != "u" or "v" in idx_kinds:
            raise _Unsupported("load through a varying index")
        ref = self.uniform(env, op.memref)
        xs = [self.val(env, v) for v in op.indices]
        if self._contiguous_last(op.memref, idx_kinds):
            index = [x.new for x in xs]
            env[res] = _Val("v", bb.ins(vector.LoadOp(ref, index, VectorType(res.type, [self.N]))))
            return
        # Gather: one scalar load per lane.
        vec = None
        for n in range(self.N):
            index = [self.lane_index(bb, x, n) if x.kind == "i" else x.new for x in xs]
            scalar = bb.ins(memref.LoadOp.get(ref, index))
            if vec is None:
                vec = bb.splat(scalar, VectorType(res.type, [self.N]))
            else:
                vec = bb.ins(vector.InsertOp(scalar, vec, [n]))
        env[res] = _Val("v", vec)

    def store(self, bb: _B, op: memref.StoreOp, env, kinds, in_vector_loop: bool) -> None:
        value_kind, ref_kind, idx_kinds = kinds[0], kinds[1], kinds[2:]
        if ref_kind == "state":
            raise _Unsupported("emit writes the state")
        if all(k == "u" for k in kinds):
            if in_vector_loop:
                raise _Unsupported("a store to one location inside a loop over the state")
            self.clone_uniform(bb.b, env, op)
            return
        if ref_kind != "u" or "v" in idx_kinds or value_kind not in ("u", "v"):
            raise _Unsupported("store through a varying index")
        ref = self.uniform(env, op.memref)
        xs = [self.val(env, v) for v in op.indices]
        if "i" not in idx_kinds:
            raise _Unsupported("varying value stored to one location")
        value = self.as_vector(bb, env, op.value)
        if self._contiguous_last(op.memref, idx_kinds):
            bb.b.insert(vector.StoreOp(value, ref, [x.new for x in xs]))
            return
        for n in range(self.N):  # scatter
            index = [self.lane_index(bb, x, n) if x.kind == "i" else x.new for x in xs]
            lane = bb.ins(vector.ExtractOp(value, [n], value.type.element_type))  # type: ignore[attr-defined]
            bb.b.insert(memref.StoreOp.get(lane, ref, index))

    # -- loops over the state index --------------------------------------------

    def is_state_loop(self, op: scf.ForOp) -> bool:
        if _const_int(op.lb) != 0 or _const_int(op.step) != 1:
            return False
        ub = op.ub
        if _const_int(ub) != self.N:
            owner = ub.owner
            if not (isinstance(owner, memref.DimOp) and owner.source in self.state_values):
                return False
        iv = op.body.block.args[0]
        return bool(iv.uses) or any(v in self.state_values for v in self._outside_refs(op))

    def vector_loop(self, b: Builder, op: scf.ForOp, env) -> None:
        """`for n in 0..N` with reductions in iter_args -> vector code + vector.reduction."""
        bb = _B(b)
        block = op.body.block
        iv, accs = block.args[0], list(block.args[1:])
        yield_op = block.last_op
        assert yield_op is not None
        yielded = list(yield_op.operands)
        combine: dict[int, tuple[Operation, SSAValue]] = {}
        for pos, acc in enumerate(accs):
            uses = list(acc.uses)
            if len(uses) != 1:
                raise _Unsupported("loop-carried value that is not a reduction")
            user = uses[0].operation
            kind = _REDUCTIONS.get(type(user))
            if kind is None or user.results[0] is not yielded[pos] or len(list(user.results[0].uses)) != 1:
                raise _Unsupported("loop-carried value that is not a reduction")
            other = user.operands[1] if user.operands[0] is acc else user.operands[0]
            if other is acc:
                raise _Unsupported("reduction of the accumulator with itself")
            combine[pos] = (user, other)
        skip = {user for user, _ in combine.values()}
        inner = dict(env)
        inner[iv] = _Val("i", bb.idx(0), 0)
        for a in accs:
            inner[a] = _Val("acc")
        for inner_op in block.ops:
            if inner_op is yield_op or inner_op in skip:
                continue
            self.one(b, inner_op, inner, True)
        for pos, (user, other) in combine.items():
            x = self.as_vector(bb, inner, other)
            init = self.uniform(env, op.iter_args[pos])
            fm = None
            if self.reassoc and isinstance(init.type, Float32Type | Float64Type):
                fm = arith.FastMathFlagsAttr([FastMathFlag.REASSOC])
            red = vector.ReductionOp.build(
                operands=[x, init],
                result_types=[init.type],
                properties={"kind": vector.CombiningKindAttr(_REDUCTIONS[type(user)]),
                            **({"fastmath": fm} if fm is not None else {})},
            )
            env[op.results[pos]] = _Val("u", _res(b.insert(red)))

    # -- time-vectorised prologue ------------------------------------------------

    def hoist_plan(self) -> _HoistPlan | None:
        """Which region ops depend on time only (and whether blocking them pays)."""
        op = self.op
        if _const_int(op.step) != 1:
            return None
        inside: set[SSAValue] = set()
        for o in op.walk():
            if o is op:
                continue
            inside.update(o.results)
        for region in op.regions:
            inside.update(region.block.args)
        written = {o.memref for o in op.walk() if isinstance(o, memref.StoreOp)}
        kinds: dict[SSAValue, str] = {}
        ops: list[Operation] = []
        expensive = False
        for region in (op.coeffs, op.emit):
            time_arg = region.block.args[0]
            for o in region.block.ops:
                if o.has_trait(IsTerminator):
                    continue
                kind = self._hoist_kind(o, kinds, inside, written, time_arg)
                if kind is None:
                    continue
                ops.append(o)
                for r in o.results:
                    kinds[r] = kind
                if kind == "tv" and (o.dialect_name() == "math" or isinstance(o, arith.DivfOp)):
                    expensive = True
        if not expensive:
            return None
        hoisted = set(ops)
        exported = [
            v for o in ops for v in o.results if any(u.operation not in hoisted for u in v.uses)
        ]
        return _HoistPlan(ops, kinds, exported)

    def _hoist_kind(self, o: Operation, kinds, inside, written, time_arg) -> str | None:
        def kind_of(v: SSAValue) -> str | None:
            if v is time_arg:
                return "time"
            if v in kinds:
                return kinds[v]
            if v not in inside and v not in self.state_values:
                return "inv"
            return None

        if isinstance(o, arith.ConstantOp):
            return "inv"
        ks = [kind_of(v) for v in o.operands]
        if None in ks:
            return None
        if isinstance(o, memref.LoadOp):
            if o.memref in written or ks[0] != "inv":
                return None
            idx = ks[1:]
            if all(k == "inv" for k in idx):
                return "inv"
            if idx and idx[-1] == "time" and all(k == "inv" for k in idx[:-1]):
                return "tv" if _identity_layout(o.memref.type) else None
            return None
        if o.regions or o.dialect_name() not in ("arith", "math") or not is_side_effect_free(o):
            return None
        if "time" in ks:
            return None  # index arithmetic on the step: per step
        if "tv" not in ks:
            return "inv"
        if any(isinstance(r.type, IndexType | VectorType) for r in o.results):
            return None
        return "tv"

    def prologue(self, b: Builder, i0: SSAValue, plan: _HoistPlan) -> dict[SSAValue, SSAValue]:
        """The hoisted ops for steps i0 .. i0+T-1: scalars ("inv") and vector<T> ("tv")."""
        bb = _B(b)
        vals: dict[SSAValue, SSAValue] = {}
        get = lambda v: vals.get(v, v)  # noqa: E731 - defined outside: itself
        for o in plan.ops:
            kind = plan.kinds[o.results[0]] if o.results else "inv"
            if kind == "inv":
                new = b.insert(o.clone(value_mapper={v: get(v) for v in o.operands}))
            elif isinstance(o, memref.LoadOp):
                index = [get(v) for v in o.indices[:-1]] + [i0]
                res_t = VectorType(o.results[0].type, [TIME_BLOCK])
                new = b.insert(vector.LoadOp(get(o.memref), index, res_t))
            else:
                operands = [
                    vals[v] if plan.kinds.get(v) == "tv" else bb.splat(get(v), VectorType(v.type, [TIME_BLOCK]))
                    for v in o.operands
                ]
                new = b.insert(_vectorised(o, operands, TIME_BLOCK))
            for r, nr in zip(o.results, new.results):
                vals[r] = nr
        return vals

    # -- the whole op ----------------------------------------------------------

    def step(self, b: Builder, i: SSAValue, h: SSAValue, pre: dict[SSAValue, _Val], store_points) -> SSAValue:
        """One step: coeffs (vectorised over the state), the update, emit."""
        sb = _B(b)
        op = self.op
        cargs = op.coeffs.block.args
        env: dict[SSAValue, _Val] = {cargs[0]: _Val("u", i), cargs[1]: _Val("i", sb.idx(0), 0), **pre}
        a, x = self.block(b, op.coeffs.block, env, False)
        av, xv = self.as_vector(sb, env, a), self.as_vector(sb, env, x)
        h = _step(b, av, h, xv)
        self.state_vec = h
        store_points.append(b.insert(vector.StoreOp(h, op.state, [sb.idx(0)])))
        eargs = op.emit.block.args
        eenv: dict[SSAValue, _Val] = {eargs[0]: _Val("u", i), **pre}
        self.block(b, op.emit.block, eenv, False)
        return h

    def build(self, b: Builder) -> None:
        op = self.op
        bb = _B(b)
        zero = bb.idx(0)
        h = bb.ins(vector.LoadOp(op.state, [zero], self.vt))
        store_points: list[Operation] = []
        plan = self.hoist_plan()
        if plan is not None:
            T = TIME_BLOCK
            span = bb.sub(op.ub, op.lb)
            nonneg = bb.max(span, zero)
            blocked_end = bb.add(op.lb, bb.mul(bb.ins(arith.DivUIOp(nonneg, bb.idx(T))), bb.idx(T)))

            def block_body(sb: Builder, i0: SSAValue, carried):
                sbb = _B(sb)
                vals = self.prologue(sb, i0, plan)
                hv = carried[0]
                self.skip = set(plan.ops)
                for j in range(T):
                    i = sbb.add(i0, sbb.idx(j)) if j else i0
                    pre: dict[SSAValue, _Val] = {}
                    for v in plan.exported:
                        nv = vals[v]
                        if plan.kinds[v] == "tv":
                            nv = sbb.ins(vector.ExtractOp(nv, [j], v.type))
                        pre[v] = _Val("u", nv)
                    hv = self.step(sb, i, hv, pre, store_points)
                self.skip = set()
                return [hv]

            (h,) = for_loop(b, op.lb, blocked_end, bb.idx(T), [h], block_body)
            lb = blocked_end
        else:
            lb = op.lb

        def body(sb: Builder, i: SSAValue, carried):
            return [self.step(sb, i, carried[0], {}, store_points)]

        (h,) = for_loop(b, lb, op.ub, op.step, [h], body)
        if not self.needs_state_store:
            for marker in store_points:
                marker.detach()
                marker.erase()
        b.insert(vector.StoreOp(h, op.state, [zero]))


def recurrence_fast_path(op: scan.RecurrenceOp) -> bool:
    st = op.state_type
    if st.get_num_dims() != 1 or not _identity_layout(st):
        return False
    n = st.get_shape()[0]
    return 0 < n <= MAX_STATE_LANES and _element_bits(st.element_type) is not None


class LowerRecurrenceCpu(RewritePattern):
    def __init__(self, reassoc: bool = True, poly_exp: bool = True):
        self.reassoc = reassoc
        self.poly_exp = poly_exp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.RecurrenceOp, rewriter: PatternRewriter) -> None:
        if not recurrence_fast_path(op):
            return
        scratch = Block()
        try:
            _RecurrenceVectorizer(op, self.reassoc).build(Builder(InsertPoint.at_end(scratch)))
        except _Unsupported:
            for o in reversed(list(scratch.ops)):
                o.detach()
                o.erase(safe_erase=False)
            return  # the sequential lowering takes it
        if self.poly_exp:
            from scanweaver.rewrites.exp_polynomial import rewrite_exps, rewrite_log1ps

            for o in list(scratch.ops):
                rewrite_exps(o)
                rewrite_log1ps(o)
        for o in list(scratch.ops):
            o.detach()
            rewriter.insert(o, InsertPoint.before(op))
        rewriter.erase(op)


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScanToCpu(ModulePass):
    """Lower scan ops to vectorised CPU loops; sequential loops where no fast path applies.

    Options: `skew` (time blocks between neighbouring lanes of a tile, >= 1; 2 keeps a
    row's stores two iterations away from the 4 KiB-aliasing loads of the next row),
    `prefetch` (software prefetch distance of a and b, in time blocks; 0 = none),
    `reassoc_reductions` (tree-order vector reductions in recurrence consumers: faster,
    not bit-identical to the sequential sum), `poly_exp` (polynomial math.exp inside
    vectorised recurrences), `parallel_channels` (the loop over channel groups of a
    time-innermost `scan.affine` is an `scf.parallel`, for `convert-scf-to-openmp`),
    `nontemporal` (streaming stores of large, 32-byte aligned h: NONTEMPORAL_MIN_BYTES).
    """

    name = "scan-to-cpu"

    skew: int = 2
    prefetch: int = 16
    prefetch_h: bool = False
    reassoc_reductions: bool = True
    poly_exp: bool = True
    parallel_channels: bool = False
    nontemporal: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    LowerAffineCpu(
                        max(1, self.skew), max(0, self.prefetch), self.prefetch_h, self.parallel_channels,
                        self.nontemporal,
                    ),
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


__all__ = [
    "AGGREGATE_MODES",
    "ScanToCpu",
    "affine_fast_path",
    "aggregate_mode",
    "build_chunk_aggregate",
    "transpose_rows",
]
