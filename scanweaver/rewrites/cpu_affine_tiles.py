"""`scan.affine` with time innermost (`(..., C, L)`): skewed transposed tiles
(see `scan_to_cpu`'s docstring), the strategy behind `LowerAffineCpu`'s 'tiled' path
and the chunk aggregates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from xdsl.builder import Builder
from xdsl.dialects import arith, memref, scf, vector
from xdsl.dialects.builtin import BoolAttr, IntegerAttr, IntegerType, MemRefType, VectorType, i1, i32, i64
from xdsl.ir import Block, Region, SSAValue
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan
from scanweaver.rewrites.cpu_aggregate_arith import _aggregate_block, _aggregate_init
from scanweaver.rewrites.cpu_channel_groups import channel_groups_loop
from scanweaver.rewrites.cpu_vector_builders import (
    _B,
    _element_bits,
    _mul,
    _neutral,
    _step,
    load_lane_pairs,
    transpose_lane_tiles,
    transpose_rows,
)
from scanweaver.rewrites.loop_utils import dim_sizes, for_loop, loop_nest

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

#: Groups of G rows scanned together in one tile, by element bits: two independent
#: multiply-add chains for f64/i64 (4 lanes: one chain is 8 dependent steps per tile
#: of 32 elements, 2 cycles per element at 4-cycle multiply and add latency).  Their
#: medium rows are not skewed.  Measured here (2 cores, loaded machine, both kernels in
#: one process, medians of 11; numba prange's time over ours): 1024x4096 f64 1.22-1.42
#: with two chains, 0.95-1.03 with one; 64x65536 1.18-1.63 vs 0.94-1.10.
SCAN_CHAINS = {64: 2}

#: Rows of at least this many time blocks get software prefetch: the long rows.  Medium
#: rows do better on the hardware prefetchers alone (measured here, one core, CPU time
#: of interleaved calls: 1024x1024 f32 1.05-1.13x faster without, 512x1536 1.09x, i32
#: 1024x1024 1.05x, f64 1.01-1.03x; 2048x512 unchanged).  Long rows keep it: see
#: PREFETCH_LOCALITY (2 cores); on one core 1024x4096 f32 ran 1.02x without.
PREFETCH_MIN_BLOCKS = LONG_ROW_BLOCKS

#: memref.prefetch locality hint: 2 (prefetcht1, into L2) measured best: 1024x4096 f32
#: on 2 cores 1.80 ms vs 2.06 ms with 3 (into L1) and 2.2 ms without prefetch; with
#: 24 row streams per core the L1 miss buffers, not DRAM, were the limit.
PREFETCH_LOCALITY = 2

#: Non-temporal (streaming) stores of h in the unmasked steady loop: an h of at least
#: NONTEMPORAL_MIN_BYTES (a runtime test on the memref passed in) is written with
#: `vector.store {nontemporal = true, alignment = 32}` (vmovntps: no read-for-ownership
#: of the stored lines, a third less DRAM traffic), when its rows start on a cache line
#: (aligned pointer + offset, and every outer stride, multiples of NONTEMPORAL_ALIGN
#: bytes; another runtime test, else the ordinary stores).  Smaller outputs stay in
#: cache for the reader: streaming them to DRAM would cost more than the saved read.
#: Ordering: NT stores are weakly ordered, but they are drained by any serialising
#: event before another thread can observe h: the OpenMP barrier closing the parallel
#: region and the thread-pool join (both locked read-modify-writes, which order
#: earlier NT stores on x86), and the return to the caller on the same thread
#: (program order holds for the storing thread itself).  No explicit sfence needed.
NONTEMPORAL_MIN_BYTES = 8 << 20
#: Row alignment for the NT stores: a cache line.  A tile's row segment is T steps, 64
#: bytes; from a line boundary its two 32-byte NT stores fill one whole line, from a
#: 32-byte one they fill halves of two, and the write-combining buffers then write
#: partial lines: measured here, one core, 1024x4096 f32 with h 32 bytes past a line,
#: 20.9 ms against 3.0 ms (i32 21.2 vs 3.1, f64 40.1 vs 5.3); rows of 4104 f32, every
#: other one off a line, 4.1 ms against 2.9 for 4112.
NONTEMPORAL_ALIGN = 64


#: Integer tiles carry their state two steps at a time (see `_block_steps`): the
#: multiply-add chain of a row group is the tiles' critical path where the multiply is
#: slow (i32 vpmulld: 10 cycles, against 4 for a float multiply), and pairing halves
#: its length for two more multiplies and an add per pair, off the chain.
PAIRED_INT_STEPS = True


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
    nt_ok: SSAValue | None = None  # i1: h large and line-aligned rows (NT stores allowed)
    nontemporal: bool = False  # this copy of the body stores h non-temporally
    prefetch_clamp: bool = True  # clamp prefetch addresses into the row (False: the loop range keeps them in)
    chains: int = 1  # independent groups of G rows in one tile (scans of full groups only)

    @property
    def Q(self) -> int:
        return self.T // self.G

    @property
    def lanes(self) -> int:
        """Rows of the tile: `chains` groups of G."""
        return self.chains * self.G

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


def _opaque(b: Builder, v: SSAValue) -> SSAValue:
    """v through `llvm.freeze` (the same value: v is never poison here), which LLVM's
    reassociation cannot see through: else it factors a1 out of (a1*a0)*h + (a1*b0 + b1)
    and reuses a0*h + b0, which puts both steps back on the chain."""
    from scanweaver.rewrites.exp_polynomial import generic_op_class

    cls = generic_op_class("llvm.freeze", ())
    return b.insert(cls.create(operands=[v], result_types=[v.type])).results[0]


def _block_steps(
    b: Builder, a_t: list[SSAValue], b_t: list[SSAValue], h: SSAValue, steps: list[int], integer: bool
) -> tuple[SSAValue, list[SSAValue]]:
    """The steps of one sub-tile (columns `steps`, in time order) from state h: the last
    state and the state after every column.

    Integers (PAIRED_INT_STEPS): the carried state takes two steps at once,
    h1 = (a1*a0)*h + (a1*b0 + b1), and h0 = a0*h + b0 branches off it; wrap-around
    integer arithmetic is a ring, so these are the loop's values exactly.
    """
    states: list[SSAValue] = [h] * len(a_t)
    if not (integer and PAIRED_INT_STEPS):
        for j in steps:
            h = _step(b, a_t[j], h, b_t[j])
            states[j] = h
        return h, states
    for j0, j1 in zip(steps[::2], steps[1::2]):
        a2 = _opaque(b, _mul(b, a_t[j1], a_t[j0]))
        b2 = _step(b, a_t[j1], b_t[j0], b_t[j1])
        states[j0] = _step(b, a_t[j0], h, b_t[j0])
        h = _step(b, a2, h, b2)
        states[j1] = h
    return h, states


def _tile_rows(bb: _B, tl: _Tiles) -> tuple[list[SSAValue], list[SSAValue | None]]:
    """Row index and (for a partial group) row validity of each lane."""
    rows, valid = [], []
    for g in range(tl.lanes):
        r = bb.add(tl.c0, bb.idx(g)) if g else tl.c0
        if tl.partial:
            valid.append(bb.cmp(r, tl.C, "slt"))
            r = bb.min(r, bb.sub(tl.C, bb.idx(1)))
        else:
            valid.append(None)
        rows.append(r)
    return rows, valid


def _lane_paired_columns(b: Builder, tl: _Tiles, ref: SSAValue, rows, cols, q: int, p: int) -> list[SSAValue]:
    """The G columns of sub-tile q of chain p (one per time step, lane g = row p*G + g)
    of the full blocks at `cols`, transposed with half-vector loads paired across the
    two 128-bit lanes (`load_lane_pairs`) and in-lane shuffles only.

    The transpose of a whole tile of rows (`transpose_rows`) spends a third of its
    shuffles crossing lanes, all on port 5, the port the steps' adds and the other
    shuffles also need.  Same values, same columns: the same bits."""
    bb = _B(b)
    G, half = tl.G, tl.G // 2
    columns: list[SSAValue] = []
    for part in range(2):  # steps q*G .. +half, then the next half
        step0 = q * G + part * half
        pairs = []
        for i in range(half):
            lo, hi = p * G + i, p * G + i + half
            at = [[*tl.outer, rows[g], bb.add(cols[g], bb.idx(step0)) if step0 else cols[g]] for g in (lo, hi)]
            pairs.append(load_lane_pairs(b, ref, at[0], at[1], tl.vt))
        columns += transpose_lane_tiles(b, pairs, tl.vt)
    return columns


def _tile_body(
    b: Builder, tl: _Tiles, k: SSAValue, hs: list[SSAValue], masked: bool, rows, row_valid, shifts
) -> list[SSAValue]:
    """One iteration k: lane g does time block m = k - g*skew of its row.

    `hs` is [h] for a scan, [A, B] for an aggregate (A = product of a, B = the scan
    from 0): an aggregate stores nothing.  A scan of `chains` groups carries one h per
    group: independent multiply-add chains that the core overlaps.
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
    for g in range(tl.lanes):
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
        if masked:  # rows loaded under masks (the unmasked loop: `_lane_paired_columns`)
            n = bb.select(valid, bb.min(bb.sub(tl.L, col), bb.idx(T)), zero_i)
            for q in range(Q):
                index = [*tl.outer, rows[g], bb.add(col, bb.idx(q * G)) if q else col]
                nq = bb.min(bb.max(bb.sub(n, bb.idx(q * G)) if q else n, zero_i), bb.idx(G))
                mq = bb.ins(vector.CreateMaskOp([nq], mask_t))
                row_masks.append(mq)
                a_rows[q].append(bb.ins(vector.MaskedLoadOp(op.a, index, mq, ones_v)))
                b_rows[q].append(bb.ins(vector.MaskedLoadOp(op.b, index, mq, negz_v)))
        masks.append(row_masks)
        if tl.prefetch and not masked:
            # Software prefetch of this row `prefetch` blocks ahead (clamped into the row
            # unless the loop range keeps it there: prefetch_clamp).
            ahead = bb.sub(col, bb.idx(tl.prefetch * T)) if tl.reverse else bb.add(col, bb.idx(tl.prefetch * T))
            if tl.prefetch_clamp:
                ahead = bb.max(bb.min(ahead, bb.sub(tl.L, bb.idx(T))), zero_i)
            for ref in (op.a, op.b):
                _prefetch(b, ref, [*tl.outer, rows[g], ahead])
            if tl.prefetch_h and not tl.aggregate:
                _prefetch(b, op.h, [*tl.outer, rows[g], ahead], write=True)

    def columns(ref: SSAValue, row_vs: list[list[SSAValue]], q: int, p: int) -> list[SSAValue]:
        if masked:
            return transpose_rows(b, row_vs[q][p * G : (p + 1) * G], vt)
        return _lane_paired_columns(b, tl, ref, rows, cols, q, p)

    # Time steps: sub-tile q holds steps q*G .. q*G+G-1 of the block, one per column.
    order = range(Q - 1, -1, -1) if tl.reverse else range(Q)
    h_cols: dict[int, list[SSAValue]] = {}  # per q: the h vector of each lane's row
    for q in order:
        if tl.aggregate:
            a_t, b_t = columns(op.a, a_rows, q, 0), columns(op.b, b_rows, q, 0)
            steps = range(G - 1, -1, -1) if tl.reverse else range(G)
            hs = _aggregate_block(b, tl.agg_mode, [a_t[j] for j in steps], [b_t[j] for j in steps], hs)
            continue
        h_cols[q] = []
        for p in range(tl.chains):
            a_t, b_t = columns(op.a, a_rows, q, p), columns(op.b, b_rows, q, p)
            steps = list(range(G - 1, -1, -1) if tl.reverse else range(G))
            hs[p], states = _block_steps(b, a_t, b_t, hs[p], steps, isinstance(el, IntegerType))
            h_cols[q] += transpose_rows(b, states, vt)
    if tl.aggregate:
        return hs
    # Store row by row, both halves of a row's cache line together.
    for g in range(tl.lanes):
        for q in range(Q):
            cq = bb.add(cols[g], bb.idx(q * G)) if q else cols[g]
            index = [*tl.outer, rows[g], cq]
            if masked:
                b.insert(vector.MaskedStoreOp(op.h, index, masks[g][q], h_cols[q][g]))
            elif tl.nontemporal:
                st = b.insert(vector.StoreOp(h_cols[q][g], op.h, index, BoolAttr.from_bool(True)))
                # Needed for LLVM to emit vmovntps (it is only legal aligned); the
                # runtime test nt_ok guarantees it: rows are line aligned and the
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
    assert tl.chains == 1 or not (tl.partial or tl.aggregate), "several chains: full scan groups only"
    zero_v = bb.splat_const(0, vt)
    starts = [bb.add(tl.c0, bb.idx(p * G)) if p else tl.c0 for p in range(tl.chains)]  # each chain's first row
    if op.init is not None and not tl.aggregate:
        if tl.partial:
            h0s = [bb.ins(vector.MaskedLoadOp(op.init, [*tl.outer, tl.c0], group_mask, zero_v))]
        else:
            h0s = [bb.ins(vector.LoadOp(op.init, [*tl.outer, c], vt)) for c in starts]
    else:
        h0s = [zero_v] * tl.chains
    shifts = [bb.mul(bb.idx(g), tl.skew) if g > 1 else tl.skew for g in range(tl.lanes)]
    span = shifts[tl.lanes - 1]
    total = bb.add(tl.NBt, span)
    one = bb.idx(1)

    steady_bounds: dict[str, SSAValue] = {}  # m_hi: the lanes' first block past the full ones

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
            if pf:
                # Iterations k < m_hi - pf prefetch full blocks of every lane's row (lane 0
                # is the furthest ahead), so they need no clamping of the address; the
                # last pf iterations only read what earlier ones prefetched.
                ibb = _B(ib)
                mid = ibb.max(lo, ibb.min(hi, ibb.sub(steady_bounds["m_hi"], ibb.idx(pf))))
                out = run(lo, mid, hs, False, ib, replace(tiles, prefetch=pf, prefetch_clamp=False))
                out = run(mid, hi, out, False, ib, replace(tiles, prefetch=0))
            else:
                out = run(lo, hi, hs, False, ib, replace(tiles, prefetch=0))
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

    if tl.aggregate:
        h0s = _aggregate_init(bb, tl.agg_mode, vt)
    if tl.partial:
        hs = run(bb.idx(0), total, h0s, True)
    else:
        nbf = bb.ins(arith.DivUIOp(tl.L, bb.idx(tl.T)))  # full blocks
        # Lanes' block sequence numbers m that are full blocks: [m_lo, m_hi).
        m_lo = bb.sub(tl.NBt, nbf) if tl.reverse else bb.idx(0)
        m_hi = tl.NBt if tl.reverse else nbf
        steady_bounds["m_hi"] = m_hi
        first = bb.min(bb.add(m_lo, span), total)
        steady_end = bb.max(first, m_hi)
        hs = run(bb.idx(0), first, h0s, True)
        hs = steady(first, steady_end, hs)
        hs = run(steady_end, total, hs, True)
    if tl.aggregate:
        stores = list(zip(op.aggregate_outputs(), hs, [tl.c0] * len(hs)))
    else:
        stores = list(zip([op.final] * tl.chains, hs, starts))
    for out, h, c in stores:
        if out is None:
            continue
        index = [*tl.outer, c]
        if tl.partial:
            b.insert(vector.MaskedStoreOp(out, index, group_mask, h))
        else:
            b.insert(vector.StoreOp(h, out, index))


def _nontemporal_ok(bb: _B, h: SSAValue, sizes: Sequence[SSAValue], el_bytes: int,
                    min_bytes: int = NONTEMPORAL_MIN_BYTES) -> SSAValue:
    """i1: h holds at least `min_bytes` and every row starts NONTEMPORAL_ALIGN-byte aligned."""
    meta = bb.b.insert(memref.ExtractStridedMetaDataOp(h))
    ptr = bb.ins(memref.ExtractAlignedPointerAsIndexOp.get(h))
    start = bb.add(ptr, bb.mul(meta.offset, bb.idx(el_bytes)))
    line = NONTEMPORAL_ALIGN // el_bytes  # elements
    rem = bb.ins(arith.RemUIOp(start, bb.idx(NONTEMPORAL_ALIGN)))
    ok = bb.cmp(rem, bb.idx(0), "eq")
    for stride in list(meta.strides)[:-1]:
        ok = bb.and_(ok, bb.cmp(bb.ins(arith.RemUIOp(stride, bb.idx(line))), bb.idx(0), "eq"))
    total = sizes[0]
    for s_ in sizes[1:]:
        total = bb.mul(total, s_)
    big = bb.cmp(total, bb.idx(min_bytes // el_bytes), "sge")
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
    chains: int | None = None,
    nontemporal_min_bytes: int = NONTEMPORAL_MIN_BYTES,
) -> None:
    """Channels (dim rank-2) in groups of G lanes, time (dim rank-1) in tiles of T = 2G.

    chains: groups of G rows scanned together in one tile, each its own multiply-add
    chain (default: SCAN_CHAINS by element size; aggregates 1).  Each row keeps its
    own sequential order of operations, so any number gives the same bits.

    nontemporal: the steady loop stores h with streaming stores when h is large and
    its rows line aligned (runtime tests, see NONTEMPORAL_MIN_BYTES, NONTEMPORAL_ALIGN);
    nontemporal_min_bytes: that size threshold (the chunk-block rescan: 0).

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
    chains = 1 if aggregate else (SCAN_CHAINS.get(bits, 1) if chains is None else chains)
    bb = _B(b)
    sizes = dim_sizes(b, op.h)
    r = len(sizes)
    C, L = sizes[r - 2], sizes[r - 1]
    nbt = bb.ins(arith.DivUIOp(bb.add(L, bb.idx(T - 1)), bb.idx(T)))
    full_c = bb.mul(bb.ins(arith.DivUIOp(C, bb.idx(G))), bb.idx(G))
    # Skew only rows long enough for the masked edges to be a small part of the work.
    long_rows = bb.cmp(nbt, bb.idx(LONG_ROW_BLOCKS), "sge")
    full_chained = bb.mul(bb.ins(arith.DivUIOp(C, bb.idx(chains * G))), bb.idx(chains * G))
    medium_rows = bb.cmp(nbt, bb.idx(MEDIUM_ROW_BLOCKS), "sge")
    # Several chains: no skew for medium rows (the masked edges grow with the lanes).
    medium_skew = bb.idx(min(skew, 1) if chains == 1 else 0)
    skew_v = bb.select(long_rows, bb.idx(skew), bb.select(medium_rows, medium_skew, bb.idx(0)))
    prefetch_rows = bb.cmp(nbt, bb.idx(PREFETCH_MIN_BLOCKS), "sge")
    nt_ok = (_nontemporal_ok(bb, op.h, sizes, bits // 8, nontemporal_min_bytes)
             if nontemporal and not aggregate else None)

    def per_outer(ob: Builder, outer: Sequence[SSAValue]) -> None:
        obb = _B(ob)

        def full_groups(n_chains: int):
            def group(gb: Builder, c0: SSAValue, _carried):
                _tile_group(
                    gb,
                    _Tiles(
                        op, list(outer), c0, C, L, nbt, G, T, skew_v, vt, False, aggregate, agg_mode, prefetch,
                        prefetch_h, prefetch_rows, nt_ok, chains=n_chains,
                    ),
                )
                return []

            return group

        channel_groups_loop(ob, obb.idx(0), full_chained, obb.idx(chains * G), full_groups(chains), parallel)
        if chains > 1:  # the full groups left over (all of them for short rows): one chain each
            channel_groups_loop(ob, full_chained, full_c, obb.idx(G), full_groups(1), parallel)
        # The partial group, if any: a loop of 0 or 1 trip.
        def partial(gb: Builder, c0: SSAValue, _carried):
            _tile_group(gb, _Tiles(op, list(outer), c0, C, L, nbt, G, T, skew_v, vt, True, aggregate, agg_mode))
            return []

        for_loop(ob, full_c, C, obb.idx(G), [], partial)

    loop_nest(b, sizes[: r - 2], per_outer)
