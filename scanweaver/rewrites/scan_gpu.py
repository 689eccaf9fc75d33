"""`scan-to-gpu` for generic `scan.scan`: a chained-tile Blelloch kernel per op.

`ScanToGpu` calls `lower_scans(module, block_size, items_per_thread)`; every
`scan.scan` that matches below becomes one `gpu.func` (kernel `scan_generic_<i>`)
plus a `gpu.launch_func` in its place. Anything else is left for the sequential
lowering (`scan-to-loops`).

What matches
------------
* k >= 1 operands of scalar element types (any mix of integers, index, f16, bf16,
  f32, f64), any rank, any axis, forward or `reverse`, static or dynamic sizes.
* The combine region: ops without memory effects (nested `scf.if`/`scf.for` of such
  ops included), cloned per combine; values it uses from outside must be constants
  or pure arith over constants / `memref.dim` (cloned into the kernel).
* Host placement: the op sits in a `func.func`, possibly inside `scf.for`/`scf.if`/
  `scf.while` (the launch goes where the op was), not inside another op's region.
Only associativity of the combine is assumed (the parallel order of combines
differs from the sequential one): no identity, no commutativity. Integer combines
(add, max, the affine pair combine on i32, ...) give the sequential result bit for
bit; float combines agree up to reassociation.

Kernel design (that of the `scan.affine` kernel, `blelloch_gpu.py`)
--------------------------------------------------------------------
* Grid: one block per channel (the dimensions other than `axis`, row-major on
  blockIdx.x); tile T = block_size * items_per_thread consecutive scan steps; thread
  `tid` owns steps [tid * ipt, (tid + 1) * ipt) of the tile; chained tiles in an
  `scf.for`, the running aggregate carried in a shared slot `c_j` per operand.
  `reverse` maps scan step t to position L - 1 - t.
* No identity is known, so "empty" aggregates are tracked exactly, without flags in
  memory: in a tile, the valid steps are a prefix (those < L), so whether a sweep node
  (a run of consecutive threads) holds any valid step follows from the index of its
  first thread, and whether a prefix is non-empty from (tile > 0 or its first thread
  > 0). Every combine is guarded by those index tests (`scf.if`), so the combine only
  ever sees real values (combine(empty, x) = x is implemented by not combining).
  Padding (steps >= L) loads nothing and holds zeros.
* Global memory: where every operand's array fits 16-byte vectors (f32/f64/i32/i64,
  identity layout, scan axis innermost, items_per_thread whole vectors: see
  `blelloch_gpu.vector_width`), a full tile (row length and tile start multiples of
  the vector) loads each thread's run with `vector.load` and stores the results with
  `vector.store` after the replay; other tiles (and seeded scans, which map their own
  loads) take the guarded scalar path.
* Prefetch (warp-shuffle tiles: every operand f32/f64/i32/i64; `PREFETCH_ONE_BLOCK`,
  `PREFETCH_TIME_BLOCKS`): the tile loop carries the next tile's k-tuples; tile 0's
  are loaded before the loop, and each tile issues the loads of tile k + 1 (vectors
  in a full tile, guarded scalars else) before its own scan and barriers, so their
  latency overlaps the scan (k * items_per_thread more registers). The tile after
  the last is all past the end: its guarded loads touch nothing. On in both
  kernels: `benchmarks/gpu/KERNELS.md` (generated) shows their registers and
  occupancy with it, against `main` without it (the cumsum cases).
* Phase 1: each thread loads its k-tuples (guarded), folds its valid ones
  left to right into one aggregate, stores it to shared `s_j[tid]` (one array per
  operand, `memref.global` in address space 3).
* Up-sweep (log2 bs levels, barrier each): node i = combine(left, right) if the right
  child holds a valid step, else a copy of left.
* Thread 0 seeds the root with the carry `c_j` (tiles after the first).
* Down-sweep: the full generic Blelloch step (no b-only shortcut, the combine is
  opaque): left child <- parent prefix; right child <- combine(parent prefix, left
  aggregate), or just the left aggregate when the parent prefix is empty (first tile,
  leftmost nodes). Combine operands keep scan order: left = earlier.
* Replay: from its exclusive prefix (empty for thread 0 of the first tile) each thread
  combines its valid items in order and stores each inclusive result; the last
  thread's final value is the next tile's carry (read by thread 0 at the next seed,
  after at least one barrier).
* Combines per tile and thread: (ipt - 1) fold + log2(bs) up + log2(bs) down + ipt
  replay. Barriers per tile: 2 log2(bs) + 1. Shared memory: (bs + 1) slots per
  operand (each array 16-byte aligned). In-place scans (an output that is also an
  input) are fine: every element is read in phase 1 and written in the replay by the
  same thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

from xdsl.dialects import arith, func, gpu, memref, scf, vector
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FunctionType,
    IndexType,
    IntegerType,
    MemRefType,
    ModuleOp,
    SymbolRefAttr,
    UnitAttr,
    VectorType,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.affine_to_pairs import Emitter
from scanweaver.rewrites.launch import KernelLaunch
from scanweaver.rewrites.scan_seed_gpu import SeededScan, erase_host_copies, match_seeded
from scanweaver.rewrites.gpu_kernel import (
    Unsupported,
    block_id,
    check_closed,
    free_values,
    kernel_name,
    note_on_function,
    refuse_i1_memrefs,
    shape_entries,
    shared_layout_bytes,
    thread_id,
)

_SCALARS = (IntegerType, IndexType, Float16Type, BFloat16Type, Float32Type, Float64Type)
#: Prefetch of the next tile (module doc, "Prefetch") in the warp-shuffle tiles of the
#: one-block-per-channel kernel and of the time-block chunk kernel (`scan_time_blocks.py`)
PREFETCH_ONE_BLOCK = True
PREFETCH_TIME_BLOCKS = True
#: Ops a `scan.scan` may be nested in on the host (the launch replaces it in place).
_HOST_PARENTS = (scf.ForOp, scf.IfOp, scf.WhileOp)
class Combine:
    """The combine region of a `scan.scan`, cloned on demand into kernel code."""

    def __init__(self, op: scan.ScanOp):
        block = op.combine.block
        self.block = block
        self.ops = list(block.ops)[:-1]
        last = block.last_op
        assert isinstance(last, scan.YieldOp)
        self.results = list(last.arguments)
        for o in self.ops:
            for inner in o.walk():
                if any(isinstance(v.type, MemRefType) for v in (*inner.operands, *inner.results)):
                    raise Unsupported(f"combine: '{inner.name}' works on memrefs")
            if not is_side_effect_free(o):
                raise Unsupported(f"combine: '{o.name}' has side effects")
        own = set(block.args)
        self.free = [v for v in free_values([*self.ops, last]) if v not in own]
        self._check_capturable(self.free, set())
        self.captured: dict[SSAValue, SSAValue] = {}

    @staticmethod
    def _check_capturable(values: Sequence[SSAValue], seen: set[SSAValue]) -> None:
        """Outside values must be constants or pure ops on them (cloned into the kernel)."""
        for v in values:
            if v in seen:
                continue
            seen.add(v)
            op = v.owner
            if not isinstance(op, Operation):
                raise Unsupported("combine uses a block argument from outside its region")
            if (
                op.regions
                or not is_side_effect_free(op)
                or isinstance(op, memref.DimOp)
                or any(isinstance(r.type, MemRefType) for r in op.results)
            ):
                raise Unsupported(f"combine uses a value defined by '{op.name}' outside it")
            Combine._check_capturable(list(op.operands), seen)

    def capture(self, e: Emitter) -> None:
        """Clone the outside values the combine uses at `e` (the kernel entry)."""

        def clone(v: SSAValue) -> None:
            if v in self.captured:
                return
            op = v.owner
            assert isinstance(op, Operation)
            for o in op.operands:
                clone(o)
            e.op(op.clone(value_mapper=self.captured))

        for v in self.free:
            clone(v)

    def __call__(self, e: Emitter, left: Sequence[SSAValue], right: Sequence[SSAValue]) -> list[SSAValue]:
        """combine(left, right): `left` is the earlier part in scan order."""
        m = dict(self.captured)
        m.update(zip(self.block.args, [*left, *right]))
        for o in self.ops:
            e.op(o.clone(value_mapper=m))
        return [m.get(v, v) for v in self.results]


def match_scan(op: scan.ScanOp) -> Combine:
    """The cloneable combine of `op` if the kernel applies, else `Unsupported(reason)`."""
    for v in (*op.inputs, *op.outputs):
        el = v.type.element_type  # type: ignore[attr-defined]
        if not isinstance(el, _SCALARS):
            raise Unsupported(f"element type {el} is not a scalar")
    parent = op.parent_op()
    while not isinstance(parent, func.FuncOp):
        if not isinstance(parent, _HOST_PARENTS):
            raise Unsupported(f"nested in '{parent.name if parent else '?'}', not in host code")
        parent = parent.parent_op()
    return Combine(op)


def _or(e: Emitter, x: SSAValue, y: SSAValue) -> SSAValue:
    return e.val(arith.OrIOp(x, y))


def _and(e: Emitter, x: SSAValue, y: SSAValue) -> SSAValue:
    return e.val(arith.AndIOp(x, y))


@dataclass
class _TileSteps:
    """The steps of one chained tile, as methods over the values every tile shares.

    Built once per kernel by `_emit_kernel`; each step emits into the tile loop body
    `le` in the order of the module docstring (fold, up-sweep, seed, down-sweep,
    replay, publish). The step comments there say why each guard is needed."""

    combine: Combine
    ins: list[SSAValue]
    outs: list[SSAValue]
    types: list[Attribute]
    s_arr: list[SSAValue]  # shared sweep arrays s_j[bs]
    c_arr: list[SSAValue]  # shared carry slots c_j[1]
    tid: SSAValue
    zero: SSAValue
    channel: Sequence[SSAValue]
    axis: int
    reverse: bool
    bs: int
    ipt: int
    t_end: SSAValue
    last_t: SSAValue
    #: seeded (`scan_seed_gpu.py`): the element tuple of a physical step, and
    #: (step, arrays (None: not written), index): where the inclusive value of that step goes
    load_fn: Callable[[Emitter, SSAValue], list[SSAValue]] | None = None
    ends: Sequence[tuple[SSAValue, Sequence[SSAValue | None], Sequence[SSAValue]]] = ()

    def at(self, t_phys: SSAValue) -> list[SSAValue]:
        return [*self.channel[: self.axis], t_phys, *self.channel[self.axis :]]

    def phys(self, le: Emitter, t: SSAValue) -> SSAValue:
        return le.sub(self.last_t, t) if self.reverse else t

    def load_slot(self, ie: Emitter, slot: SSAValue) -> list[SSAValue]:
        return [ie.load(s, [slot]) for s in self.s_arr]

    def store_slot(self, ie: Emitter, vals: Sequence[SSAValue], slot: SSAValue) -> None:
        for v, s in zip(vals, self.s_arr):
            ie.store(v, s, [slot])

    def holds_valid(self, ie: Emitter, tile_start: SSAValue, first_thread: SSAValue) -> SSAValue:
        """Whether the run of threads starting at `first_thread` holds a step < L."""
        return ie.cmp("ult", ie.add(ie.mul(first_thread, ie.index(self.ipt)), tile_start), self.t_end)

    def load_items(
        self, le: Emitter, start: SSAValue, full: SSAValue | None = None
    ) -> list[tuple[SSAValue, SSAValue, Sequence[SSAValue]]]:
        """1a. this thread's (step, inside, tuple) items; zeros past the end. With `full`
        (`full_tile`), the run comes by 16-byte vector loads in full tiles."""
        if full is None:
            return self._guarded_items(le, start)
        k, ipt = len(self.types), self.ipt

        def vector_loads(ie: Emitter) -> list[SSAValue]:
            runs = [bg.load_run(ie, x, self._run_chunks(ie, start, x), el) for x, el in zip(self.ins, self.types)]
            return [runs[i][j] for j in range(ipt) for i in range(k)]

        def scalar_loads(ie: Emitter) -> list[SSAValue]:
            return [v for _, _, vals in self._guarded_items(ie, start) for v in vals]

        flat = le.if_(full, list(self.types) * ipt, vector_loads, scalar_loads)
        items = []
        for j in range(ipt):
            t = le.add(start, le.index(j)) if j else start
            items.append((t, le.cmp("ult", t, self.t_end), flat[j * k : (j + 1) * k]))
        return items

    def items_of(
        self, le: Emitter, start: SSAValue, flat: Sequence[SSAValue]
    ) -> list[tuple[SSAValue, SSAValue, Sequence[SSAValue]]]:
        """`load_items`' items from elements loaded before (prefetch: `flat`, item-major)."""
        k = len(self.types)
        items = []
        for j in range(self.ipt):
            t = le.add(start, le.index(j)) if j else start
            items.append((t, le.cmp("ult", t, self.t_end), list(flat[j * k : (j + 1) * k])))
        return items

    def _guarded_items(self, le: Emitter, start: SSAValue) -> list[tuple[SSAValue, SSAValue, Sequence[SSAValue]]]:
        types = self.types
        items: list[tuple[SSAValue, SSAValue, Sequence[SSAValue]]] = []
        for j in range(self.ipt):
            t = le.add(start, le.index(j)) if j else start
            inside = le.cmp("ult", t, self.t_end)

            def load(ie: Emitter, t: SSAValue = t) -> list[SSAValue]:
                if self.load_fn is not None:
                    return self.load_fn(ie, self.phys(ie, t))
                idx = self.at(self.phys(ie, t))
                return [ie.load(x, idx) for x in self.ins]

            vals = le.if_(inside, types, load, lambda ie: [ie.const(0, ty) for ty in types])
            items.append((t, inside, vals))
        return items

    # -- 16-byte accesses of full tiles (blelloch_gpu's module doc, "Global memory") -------

    def _vector_width(self, ref: SSAValue, el: Attribute) -> int:
        return bg.vector_width(el, self.ipt, self.axis, [ref])

    def full_tile(self, le: Emitter, tile_start: SSAValue) -> SSAValue | None:
        """i1: this tile is full and its runs are 16-byte aligned (then every element is
        loaded and stored by vectors); None where the kernel keeps scalar accesses: a
        seeded scan's own loads, or any array whose layout or type the vectors do not fit."""
        if self.load_fn is not None:
            return None
        refs = [*zip(self.ins, self.types), *((y, el) for y, el in zip(self.outs, self.types) if y is not None)]
        widths = [self._vector_width(r, el) for r, el in refs]
        if not widths or not all(widths):
            return None
        return bg.full_aligned_tile(le, tile_start, self.bs * self.ipt, self.t_end, le.dim(refs[0][0], self.axis),
                                    max(widths))

    def _run_chunks(self, le: Emitter, start: SSAValue, ref: SSAValue) -> list[tuple[list[SSAValue], list[int]]]:
        el = ref.type.element_type  # type: ignore[attr-defined]
        return bg.run_vectors(le, self.channel, self.axis, start, self.ipt, self._vector_width(ref, el),
                              self.last_t if self.reverse else None)

    def _store_results(
        self, le: Emitter, items: Sequence[tuple[SSAValue, SSAValue, Sequence[SSAValue]]],
        news: Sequence[Sequence[SSAValue]], start: SSAValue, full: SSAValue,
    ) -> None:
        """The replay's inclusive values `news` (one tuple per item) to the outputs: by
        16-byte vectors in a full tile, else each valid item on its own."""

        def vector_stores(ie: Emitter) -> None:
            for i, y in enumerate(self.outs):
                if y is None:
                    continue
                el = self.types[i]
                vt = VectorType(el, [self._vector_width(y, el)])
                for idx, lanes in self._run_chunks(ie, start, y):
                    v = ie.val(vector.BroadcastOp(news[lanes[0]][i], vt))
                    for pos, item in enumerate(lanes[1:], 1):
                        v = ie.val(vector.InsertOp(news[item][i], v, [pos], vt))
                    bg.store_aligned(ie, v, y, idx)

        def scalar_stores(ie: Emitter) -> None:
            for (t, inside, _), new in zip(items, news):

                def store(je: Emitter, t: SSAValue = t, new: Sequence[SSAValue] = new) -> None:
                    store_all(je, new, self.outs, self.at(self.phys(je, t)))

                ie.if_(inside, [], store)

        le.if_(full, [], vector_stores, scalar_stores)

    def fold(self, le: Emitter, items: Sequence[tuple[SSAValue, SSAValue, Sequence[SSAValue]]]) -> None:
        """1b. fold the valid items left to right and store the aggregate to s_j[tid]."""
        self.store_slot(le, self.fold_registers(le, items), self.tid)

    def up_sweep(self, le: Emitter, tile_start: SSAValue) -> None:
        """2. combine with the right child only where it holds a valid step."""
        types = self.types

        def up(ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
            right_valid = self.holds_valid(ie, tile_start, ie.sub(i, ie.index(d - 1)) if d > 1 else i)
            lv = self.load_slot(ie, left)
            res = ie.if_(right_valid, types, lambda je: self.combine(je, lv, self.load_slot(je, i)), lambda je: lv)
            self.store_slot(ie, res, i)

        bg.blelloch_levels(le, self.tid, self.bs, up, down=False)

    def seed(self, le: Emitter, has_carry: SSAValue) -> None:
        """3. thread 0 seeds the root with the running aggregate (tiles after the first)."""

        def seed(ie: Emitter) -> None:
            self.store_slot(ie, [ie.load(c, [ie.index(0)]) for c in self.c_arr], ie.index(self.bs - 1))

        le.if_(_and(le, le.cmp("eq", self.tid, self.zero), has_carry), [], seed)

    def down_sweep(self, le: Emitter, tile_start: SSAValue, has_carry: SSAValue) -> None:
        """4. generic down-sweep; a prefix is empty only in the first tile, leftmost nodes."""
        types = self.types

        def down(ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
            first = ie.sub(i, ie.index(2 * d - 1))  # first thread of the parent node
            parent = self.load_slot(ie, i)
            left_agg = self.load_slot(ie, left)
            self.store_slot(ie, parent, left)
            both = _and(
                ie, _or(ie, has_carry, ie.cmp("ugt", first, self.zero)), self.holds_valid(ie, tile_start, first)
            )
            res = ie.if_(both, types, lambda je: self.combine(je, parent, left_agg), lambda je: left_agg)
            self.store_slot(ie, res, i)

        bg.blelloch_levels(le, self.tid, self.bs, down, down=True)

    def replay(
        self, le: Emitter, items: Sequence[tuple[SSAValue, SSAValue, Sequence[SSAValue]]], has_carry: SSAValue,
        start: SSAValue | None = None, full: SSAValue | None = None,
    ) -> Sequence[SSAValue]:
        """5. replay from the exclusive prefix; store every valid inclusive result.
        Returns this thread's last inclusive value."""
        acc: Sequence[SSAValue] = self.load_slot(le, self.tid)
        prefix_valid = _or(le, has_carry, le.cmp("ugt", self.tid, self.zero))
        return self.replay_from(le, items, acc, prefix_valid, start, full)

    def replay_from(
        self, le: Emitter, items: Sequence[tuple[SSAValue, SSAValue, Sequence[SSAValue]]],
        acc: Sequence[SSAValue], prefix_valid: SSAValue,
        start: SSAValue | None = None, full: SSAValue | None = None,
    ) -> Sequence[SSAValue]:
        """`replay` from the exclusive prefix `acc` (empty where not `prefix_valid`).
        With `full` (and the run's first step `start`) the outputs are stored after the
        replay, by vectors in full tiles (`_store_results`)."""
        types = self.types
        news: list[Sequence[SSAValue]] = []
        for j, (t, inside, vals) in enumerate(items):

            def step(ie: Emitter, j=j, t=t, vals=vals, acc=acc) -> list[SSAValue]:
                if j == 0:
                    new = ie.if_(prefix_valid, types, lambda je: self.combine(je, acc, vals), lambda je: vals)
                else:
                    new = self.combine(ie, acc, vals)
                if full is None:
                    store_all(ie, new, self.outs, self.at(self.phys(ie, t)))
                for at, targets, where in self.ends:  # the results, a chunk's aggregate
                    ie.if_(ie.cmp("eq", t, at), [],
                           lambda je, new=new, targets=targets, where=where: store_all(je, new, targets, where))
                return list(new)

            acc = le.if_(inside, types, step, lambda ie, acc=acc: acc)
            news.append(acc)
        if full is not None:
            assert start is not None
            self._store_results(le, items, news, start, full)
        return acc

    # -- the warp-shuffle tile (module doc of blelloch_gpu, "In-tile scan") ----------------

    def warp_prefix(
        self, le: Emitter, items: Sequence[tuple[SSAValue, SSAValue, Sequence[SSAValue]]], has_carry: SSAValue
    ) -> tuple[list[SSAValue], SSAValue]:
        """This thread's exclusive prefix (carry and every earlier valid step of the tile)
        and whether it is non-empty, from warp shuffles and one barrier: each warp's last
        lane posts its total to s_j[warp]; every thread folds the totals of the warps
        before its own after the carry. Valid steps are a prefix of the tile, so a lane
        holding one only ever receives (and a warp after it only reads) complete parts."""
        types, bs = self.types, self.bs
        width = min(bs, bg.WARP)
        lane, warp = bg.lane_and_warp(le, self.tid)
        agg = self.fold_registers(le, items)
        mine = items[0][1]  # the thread holds a valid step

        def combine_valid(e: Emitter, earlier: Sequence[SSAValue], later: Sequence[SSAValue]) -> list[SSAValue]:
            return list(e.if_(mine, types, lambda ie: self.combine(ie, earlier, later), lambda ie: list(later)))

        inc = bg.warp_inclusive_scan(le, combine_valid, agg, width)
        ex, has_prev = bg.warp_exclusive(le, inc, width)
        nw = bs // bg.WARP
        if nw > 1:
            le.if_(le.cmp("eq", lane, le.index(bg.WARP - 1)), [], lambda ie: self.store_slot(ie, inc, warp))
        le.op(gpu.BarrierOp())  # the totals and the previous tile's carry are posted
        carry = [le.load(c, [le.index(0)]) for c in self.c_arr]
        # the warp's prefix: carry (if any), then the totals of the warps before it
        p, pv = list(carry), has_carry
        for v in range(nw - 1):
            before = le.cmp("ult", le.index(v), warp)
            tot = self.load_slot(le, le.index(v))

            def add_total(ie: Emitter, p=p, pv=pv, tot=tot) -> list[SSAValue]:
                return list(ie.if_(pv, types, lambda je: self.combine(je, p, tot), lambda je: list(tot)))

            p = list(le.if_(before, types, add_total, lambda ie, p=p: list(p)))
            pv = _or(le, pv, before)

        def with_lane(ie: Emitter) -> list[SSAValue]:
            return list(ie.if_(pv, types, lambda je: self.combine(je, p, ex), lambda je: list(ex)))

        acc = list(le.if_(has_prev, types, with_lane, lambda ie: list(p)))
        return acc, _or(le, pv, has_prev)

    def fold_registers(self, le: Emitter, items: Sequence[tuple[SSAValue, SSAValue, Sequence[SSAValue]]]) -> list[SSAValue]:
        """The valid items folded left to right (the first item's zeros when none is)."""
        agg: Sequence[SSAValue] = items[0][2]
        for _, inside, vals in items[1:]:
            agg = le.if_(
                inside,
                self.types,
                lambda ie, agg=agg, vals=vals: self.combine(ie, agg, vals),
                lambda ie, agg=agg: agg,
            )
        return list(agg)

    def publish(self, le: Emitter, acc: Sequence[SSAValue]) -> None:
        """6. the last thread's inclusive value is the next tile's carry."""

        def publish(ie: Emitter) -> None:
            for v, c in zip(acc, self.c_arr):
                ie.store(v, c, [ie.index(0)])

        le.if_(le.cmp("eq", self.tid, le.index(self.bs - 1)), [], publish)


def store_all(e: Emitter, vals: Sequence[SSAValue], targets: Sequence[SSAValue | None], idx: Sequence[SSAValue]) -> None:
    for v, a in zip(vals, targets):
        if a is not None:
            e.store(v, a, list(idx))


def _chunk_range(
    e: Emitter, length: SSAValue, chunk: int
) -> tuple[SSAValue, SSAValue, SSAValue, SSAValue]:
    """Time blocks: (channel block id, chunk k, first step, end step) of this block."""
    from scanweaver.rewrites.affine_time_blocks import chunk_of_block

    bid, k_chunk, _ = chunk_of_block(e, length, chunk)
    t_begin = e.mul(k_chunk, e.index(chunk))
    t_end = e.val(arith.MinUIOp(length, e.add(t_begin, e.index(chunk))))
    return bid, k_chunk, t_begin, t_end


def _store_chunk_aggregate(
    e: Emitter, steps: _TileSteps, aggs: Sequence[SSAValue], k_chunk: SSAValue
) -> None:
    """Time blocks: the last tile's carry (published by the last thread) is the chunk's
    aggregate; thread 0 stores it after a barrier."""
    e.op(gpu.BarrierOp())

    def store_aggregate(ie: Emitter) -> None:
        for c, g in zip(steps.c_arr, aggs):
            ie.store(ie.load(c, [ie.index(0)]), g, [*steps.channel, k_chunk])

    e.if_(e.cmp("eq", steps.tid, steps.zero), [], store_aggregate)


def _emit_kernel(
    e: Emitter,
    op: scan.ScanOp,
    combine: Combine,
    ins: list[SSAValue],
    outs: list[SSAValue],
    shared: list[tuple[SSAValue, SSAValue]],
    bs: int,
    ipt: int,
    chunk: int = 0,
    aggs: Sequence[SSAValue] = (),
    seeds: Sequence[SSAValue] | None = None,
    finals: Sequence[SSAValue | None] = (),
    load_fn: Callable[[Emitter, SSAValue], list[SSAValue]] | None = None,
    final_at: Sequence[Sequence[SSAValue] | None] = (),
    axis: int | None = None, channel: Sequence[SSAValue] | None = None,
    prefetch: bool | None = None,
) -> None:
    """`chunk` > 0 (time blocks, `scan_time_blocks.py`): block = (channel, chunk k) and
    the tiles scan steps [k * chunk, (k + 1) * chunk) only, as if the scan started there;
    thread 0 then stores the chunk's aggregate into `aggs[j][channel.., k]`.
    `seeds` (one channel: `scan_seed_gpu.py`) are the carry of the first tile, combined
    on the left of every prefix; `load_fn` gives a step's elements (instead of loading
    `ins`); `outs` of None are not written; the thread of step L - 1 writes its values
    to the rank-0 `finals` (thread 0 the seeds, for an empty axis).  With `chunk` and
    `load_fn`, the thread of a chunk's last step stores the chunk's aggregate (exact
    also for a partial last tile, which the seeded carry kernel needs).  `final_at[j]`
    (state kept in memory) stores final j to that element instead of a rank-0 result, and
    not for an empty axis (the state stays as it was).  `axis` / `channel` replace the
    op's time axis / `ref`'s delinearised channel (a seeded scan over host channel loops).
    `prefetch` (warp-shuffle tiles; default `PREFETCH_TIME_BLOCKS` with `chunk`, else
    `PREFETCH_ONE_BLOCK`): the loop carries the next tile's elements (module doc)."""
    axis = op.axis_value if axis is None else axis
    tid = thread_id(e)
    bid = block_id(e)
    combine.capture(e)
    zero, one = e.index(0), e.index(1)
    ref = next((o for o in outs if o is not None), ins[0])
    length = e.dim(ref, axis)
    t_begin, t_end = zero, length
    if chunk:
        bid, k_chunk, t_begin, t_end = _chunk_range(e, length, chunk)
    channel = bg.channel_indices(e, ref, axis, bid) if channel is None else list(channel)
    tile = e.index(bs * ipt)
    ntiles = e.divu(e.add(e.sub(t_end, t_begin) if chunk else length, e.index(bs * ipt - 1)), tile)
    thread_base = e.mul(tid, e.index(ipt))
    types = [v.type.element_type for v in op.inputs]  # type: ignore[attr-defined]
    steps = _TileSteps(
        combine, ins, outs, types, [s for s, _ in shared], [c for _, c in shared], tid, zero,
        channel, axis, op.is_reverse, bs, ipt, t_end, e.sub(length, one), load_fn,
    )
    steps.ends, rank0 = _end_stores(e, steps, finals, final_at, length)
    if chunk and aggs and load_fn is not None:
        steps.ends.append((e.sub(t_end, one), list(aggs), [*channel, k_chunk]))

    if seeds is not None:
        _store_seeds(e, steps, seeds, rank0, length, tid, zero)

    warp = all(bg.shuffles(t) for t in steps.types)
    default_prefetch = PREFETCH_TIME_BLOCKS if chunk else PREFETCH_ONE_BLOCK
    prefetch = warp and (default_prefetch if prefetch is None else prefetch)

    def tile_range(le: Emitter, kt: SSAValue) -> tuple[SSAValue, SSAValue]:
        """(first step of tile kt, this thread's first step in it)."""
        tile_start = le.add(t_begin, le.mul(kt, tile)) if chunk else le.mul(kt, tile)
        return tile_start, le.add(tile_start, thread_base)

    def tile_values(le: Emitter, kt: SSAValue) -> list[SSAValue]:
        """Tile kt's elements of this thread, flat (item-major): vectors in a full tile,
        guarded scalars else (zeros past the end: the tile after the last loads nothing)."""
        tile_start, start = tile_range(le, kt)
        return [v for _, _, vals in steps.load_items(le, start, steps.full_tile(le, tile_start)) for v in vals]

    def tile_body(le: Emitter, kt: SSAValue, carried: Sequence[SSAValue]) -> list[SSAValue]:
        tile_start, start = tile_range(le, kt)
        has_carry = _has_carry(le, kt, zero, seeds is not None, k_chunk if chunk else None)
        nxt: list[SSAValue] = []
        if prefetch:  # tile kt + 1's loads first: their latency overlaps this tile's scan
            nxt = tile_values(le, le.add(kt, one))
        full = steps.full_tile(le, tile_start)
        if prefetch:
            items = steps.items_of(le, start, carried)
        else:
            items = steps.load_items(le, start, full)
        if warp:
            acc, prefix_valid = steps.warp_prefix(le, items, has_carry)
            last = steps.replay_from(le, items, acc, prefix_valid, start, full)
            le.op(gpu.BarrierOp())  # every thread read the totals and the carry
            steps.publish(le, last)
            return nxt
        steps.fold(le, items)
        steps.up_sweep(le, tile_start)
        steps.seed(le, has_carry)
        steps.down_sweep(le, tile_start, has_carry)
        steps.publish(le, steps.replay(le, items, has_carry, start, full))
        return []

    e.for_(zero, ntiles, one, tile_values(e, zero) if prefetch else [], tile_body)
    if chunk and aggs and load_fn is None:
        _store_chunk_aggregate(e, steps, aggs, k_chunk)


def _store_seeds(
    e: Emitter, steps: "_TileSteps", seeds: Sequence[SSAValue], rank0: Sequence[SSAValue | None],
    length: SSAValue, tid: SSAValue, zero: SSAValue,
) -> None:
    """The seeds are the carry before the first tile: thread 0 stores them where the seed
    step reads them back (and, for an empty axis, they are the results)."""

    def init(ie: Emitter) -> None:
        for v, c in zip(seeds, steps.c_arr):
            ie.store(v, c, [ie.index(0)])
        if any(f is not None for f in rank0):
            ie.if_(ie.cmp("eq", length, zero), [], lambda je: store_all(je, seeds, rank0, []))

    e.if_(e.cmp("eq", tid, zero), [], init)
    e.op(gpu.BarrierOp())


def _has_carry(le: Emitter, kt: SSAValue, zero: SSAValue, seeded: bool, k_chunk: SSAValue | None) -> SSAValue:
    """Whether tile `kt` starts from a carry: after the first tile; seeded, every tile
    (in time blocks, `k_chunk`: only chunk 0 starts from the seeds, state in memory)."""
    if not seeded:
        return le.cmp("ugt", kt, zero)
    if k_chunk is None:
        return le.const(1, IntegerType(1))
    return _or(le, le.cmp("ugt", kt, zero), le.cmp("eq", k_chunk, zero))


def _end_stores(e: Emitter, steps: "_TileSteps", finals, final_at, length: SSAValue) -> tuple[list, list]:
    """(step, targets, indices) of the values a step's thread stores at the end: the
    rank-0 `finals` at step L - 1, and each final kept in a state memref element
    (`final_at`) at that step when the element is in bounds; and the rank-0 targets."""
    ends: list = []
    at = list(final_at) or [None] * len(finals)
    rank0 = [f if a is None else None for f, a in zip(finals, at)]
    if any(f is not None for f in rank0):
        ends.append((steps.last_t, rank0, []))
    for j, (f, a) in enumerate(zip(finals, at)):
        if f is not None and a is not None:  # one element of a state memref
            inb = in_bounds(e, f, a)  # out of its bounds: at no step (t < L)
            when = steps.last_t if inb is None else e.val(arith.SelectOp(inb, steps.last_t, length))
            ends.append((when, [f if i == j else None for i in range(len(finals))], list(a)))
    return ends, rank0


def seeded_kernel_values(
    seeded: SeededScan, e: Emitter, argmap: dict[SSAValue, SSAValue]
) -> tuple[list[SSAValue], list[SSAValue | None], Callable[[Emitter, SSAValue], list[SSAValue]]]:
    """A seeded scan's seeds (constants cloned at `e`), finals and element map in a kernel
    whose arguments are `argmap`."""
    k = len(seeded.seeds)
    seeds = []
    for v, at, other, m in zip(seeded.seeds, seeded.seed_at or [None] * k, seeded.seed_else or [None] * k,
                               seeded.seed_memref or [None] * k):
        if at is None:
            seeds.append(e.val(v.owner.clone()) if isinstance(v.owner, arith.ConstantOp) else argmap[v])
            continue
        # state kept in memory: every thread reads m[i] before the barrier after the
        # seeding (the last value is stored to it only after that barrier)
        mem, idx = argmap[m], kernel_indices(e, at, argmap)
        if other is None:
            seeds.append(e.load(mem, idx))
            continue
        # under the guard 0 < n (and, in the kernel, m[i] in bounds): else the constant
        runs = e.cmp("ugt", e.dim(argmap[seeded.ref], seeded.time_axis), e.index(0))
        inb = in_bounds(e, mem, idx)
        cond = runs if inb is None else _and(e, runs, inb)
        seeds.extend(e.if_(cond, [v.type], lambda je, mem=mem, idx=idx: [je.load(mem, idx)],
                           lambda je, other=other: [je.val(other.owner.clone())]))  # type: ignore[union-attr]
    finals = [argmap[v] if v is not None else None for v in seeded.finals]
    return seeds, finals, lambda ie, t: seeded.clone_elements(ie, t, argmap)


def in_bounds(e: Emitter, mem: SSAValue, idx: Sequence[SSAValue]) -> SSAValue | None:
    """`idx` inside `mem`'s dynamic sizes (constant indices, in the static ones by the
    match), or None when every size is static."""
    t = mem.type
    assert isinstance(t, MemRefType)
    cond = None
    for d, (size, i) in enumerate(zip(t.get_shape(), idx)):
        if size < 0:
            c = e.cmp("ult", i, e.dim(mem, d))
            cond = c if cond is None else _and(e, cond, c)
    return cond


def kernel_indices(e: Emitter, at: Sequence[int | SSAValue], argmap: dict[SSAValue, SSAValue]) -> list[SSAValue]:
    """A state element's indices in the kernel: constants, and the host channel variable
    mapped to the block's channel (`argmap`)."""
    return [argmap[i] if isinstance(i, SSAValue) else e.index(i) for i in at]


def final_indices(
    seeded: SeededScan | None, e: Emitter, argmap: dict[SSAValue, SSAValue] | None = None
) -> list[list[SSAValue] | None]:
    """Per operand, None (a rank-0 result) or the kernel's indices of the memory element
    its last value is stored to."""
    if seeded is None or not seeded.final_at:
        return []
    return [None if at is None else kernel_indices(e, at, argmap or {}) for at in seeded.final_at]


def _kernel_operands(
    ins_h: list[SSAValue], outs_h: list[SSAValue | None], seeded: SeededScan | None
) -> tuple[list[SSAValue], list[str], list[str]]:
    """The kernel's arguments: distinct memrefs, inputs first (an output that is also an
    input is passed once, "inout"; an operand without an array has none), then the seeds
    passed as scalars (a constant seed is cloned into the kernel instead) and the results."""
    operands: list[SSAValue] = []
    names: list[str] = []
    kinds: list[str] = []
    for j, v in enumerate(ins_h):
        if v not in operands:
            operands.append(v)
            names.append(f"x{j}")
            kinds.append("in")
    for j, v in enumerate(outs_h):
        if v is None:
            continue
        if v in operands:
            kinds[operands.index(v)] = "inout" if kinds[operands.index(v)] == "in" else "out"
        else:
            operands.append(v)
            names.append(f"y{j}")
            kinds.append("out")
    if seeded:
        add_seeds_and_finals(seeded, operands, names, kinds)
        add_captures(seeded, operands, names, kinds)
    return operands, names, kinds


def add_seeds_and_finals(seeded: SeededScan, operands: list[SSAValue], names: list[str], kinds: list[str]) -> None:
    """The seeds as scalars (a constant is cloned into the kernel instead; state kept in
    memory passes its memref, read), then the results (a state memref read and written:
    "inout")."""
    seed_at = seeded.seed_at or [None] * len(seeded.seeds)
    for j, (v, at) in enumerate(zip(seeded.seeds, seed_at)):
        if at is not None:
            m = seeded.seed_memref[j]
            if m not in operands:
                operands.append(m)
                names.append(f"init{j}")
                kinds.append("in")
        elif not isinstance(v.owner, arith.ConstantOp):
            operands.append(v)
            names.append(f"init{j}")
            kinds.append("scalar")
    for j, v in enumerate(seeded.finals):
        if v is None:
            continue
        if v in operands:
            kinds[operands.index(v)] = "inout"
        else:
            operands.append(v)
            names.append(f"final{j}")
            kinds.append("out")


def add_captures(seeded: SeededScan, operands: list[SSAValue], names: list[str], kinds: list[str]) -> None:
    """The function arguments the seeded producer's values from above it start from
    (`SeededScan.captures`), as kernel arguments after the others: scalars as
    parameters, memrefs read only (for a `memref.dim` or a load)."""
    for j, v in enumerate(seeded.captures):
        if v not in operands:
            operands.append(v)
            names.append(f"p{j}")
            kinds.append("in" if isinstance(v.type, MemRefType) else "scalar")


def lower_scan(
    op: scan.ScanOp, top: ModuleOp, block_size: int, items_per_thread: int, seeded: SeededScan | None = None
) -> None:
    """Lower one `scan.scan` to a kernel and its launch, or raise `Unsupported`.
    With `seeded` (`scan_seed_gpu.py`) the kernel scans the producer's map of
    `seeded.srcs` into `seeded.dsts` from the seeds instead of the op's temporaries, and
    writes `seeded.finals`."""
    combine = match_scan(op)
    ins_h = list(seeded.srcs) if seeded else list(op.inputs)
    outs_h = list(seeded.dsts) if seeded else list(op.outputs)
    refuse_i1_memrefs([v for v in (*ins_h, *outs_h) if v is not None])
    bs, ipt = block_size, items_per_thread
    name = kernel_name(top, "scan_generic")
    k = len(op.inputs)
    types: list[Attribute] = [v.type.element_type for v in op.inputs]  # type: ignore[attr-defined]

    operands, names, kinds = _kernel_operands(ins_h, outs_h, seeded)
    arg_types = [v.type for v in operands]

    kfunc = gpu.FuncOp(name, FunctionType.from_lists(arg_types, []), kernel=True)
    kfunc.attributes["gpu.kernel"] = UnitAttr()
    body = kfunc.body.block
    for a, n in zip(body.args, names):
        a.name_hint = n
    argmap = dict(zip(operands, body.args))
    e = Emitter(body)
    shared: list[tuple[SSAValue, SSAValue]] = []
    for j, el in enumerate(types):
        s_t = MemRefType(el, [bs], memory_space=bg.SHARED_SPACE)
        c_t = MemRefType(el, [1], memory_space=bg.SHARED_SPACE)
        shared.append(
            (e.val(memref.GetGlobalOp(f"{name}_s{j}", s_t)), e.val(memref.GetGlobalOp(f"{name}_c{j}", c_t)))
        )
    seeds_k, finals_k, load_fn = None, (), None
    if seeded:
        if seeded.channel_loops:  # the host channel loops' variables come from the block id
            argmap.update(zip(seeded.channels, channel_values(e, seeded, argmap)))
        seeds_k, finals_k, load_fn = seeded_kernel_values(seeded, e, argmap)
    _emit_kernel(
        e, op, combine, [argmap[v] for v in ins_h], [argmap.get(v) for v in outs_h], shared, bs, ipt,
        seeds=seeds_k, finals=finals_k, load_fn=load_fn, final_at=final_indices(seeded, e, argmap),
        axis=seeded.time_axis if seeded else None,
        channel=[argmap[c] for c in seeded.channels] if seeded and seeded.channel_loops else None,
    )
    e.op(gpu.ReturnOp([]))
    check_closed(kfunc)

    # -- commit ------------------------------------------------------------------------------
    kmod = bg.get_kernel_module(top)
    for j, el in enumerate(types):
        bg.shared_global(kmod, f"{name}_s{j}", el, bs)
    for j, el in enumerate(types):
        bg.shared_global(kmod, f"{name}_c{j}", el, 1)
    kmod.body.block.add_op(kfunc)
    ref = seeded.ref if seeded else outs_h[0]
    ref_name = names[operands.index(ref)]
    if seeded is not None and seeded.channel_loop is not None:
        grid0, host_args, func_name = launch_over_channel_loop(seeded, name, operands, names, bs)
    else:
        grid0, host_args, func_name = bg.launch_over_channels(op, ref, ref_name, op.axis_value, name, operands, bs)
    covers = tuple((names[operands.index(a)], d, names[operands.index(seeded.channel_trips[j][0])],  # type: ignore[index]
                    seeded.channel_trips[j][1]) for a, d, j in seeded.channel_covers) if seeded else ()  # type: ignore[index]
    scanned = {names[operands.index(v)] for v in (*ins_h, *outs_h) if v is not None}
    sizes = [bs * bg.byte_size(t) for t in types] + [bg.byte_size(t) for t in types]
    desc = KernelLaunch(
        kernel_name=name,
        module_name=bg.KERNEL_MODULE,
        func_name=func_name,
        grid=(grid0, 1, 1),
        block=(bs, 1, 1),
        shared_bytes=shared_layout_bytes(sizes),
        args=[
            (n, kd, bg.type_name(t.element_type), shape_entries(t))  # type: ignore[attr-defined]
            if kd != "scalar"
            else (n, kd, bg.type_name(t), ())
            for n, kd, t in zip(names, kinds, arg_types)
        ],
        host_args=host_args,
        equal_dims=tuple(
            (n, i, ref_name, i) for n in names if n != ref_name and n in scanned
            for i in range(ref.type.get_num_dims())  # type: ignore[attr-defined]
        ),
        covers_dims=covers,
        notes=(
            f"scan.scan of {k} operand(s) ({', '.join(bg.type_name(t) for t in types)}) axis "
            f"{op.axis_value}{' reverse' if op.is_reverse else ''}; generic combine, no identity; "
            f"block_size={bs} items_per_thread={ipt}; one block per channel, chained tiles"
            + (
                "; seeded with the associative raise's initial value, its host copies folded in"
                + (", last values to the results" if any(f is not None for f in seeded.finals) else "")
                + ("; the host channel loop is the grid" if seeded.channel_loop is not None else "")
                if seeded
                else ""
            )
        ),
    )
    kfunc.attributes["scanweaver.launch"] = desc.to_attr()
    Rewriter.erase_op(op)


def channel_values(e: Emitter, seeded: SeededScan, argmap: dict[SSAValue, SSAValue]) -> list[SSAValue]:
    """The host channel loops' variables of this block: its id delinearised row-major
    over their trip counts (innermost fastest, as the loop nests' kernels do)."""
    trips = seeded.channel_trips
    rest = block_id(e)
    out: list[SSAValue] = [rest] * len(trips)
    for j in range(len(trips) - 1, 0, -1):  # the outermost count bounds only the grid
        t = trips[j]
        size = e.index(t) if isinstance(t, int) else e.dim(argmap[t[0]], t[1])
        out[j] = e.remu(rest, size)
        rest = e.divu(rest, size)
    out[0] = rest
    return out


def launch_over_channel_loop(
    seeded: SeededScan, name: str, operands: list[SSAValue], names: list[str], bs: int
) -> tuple[int | str, tuple[int, ...], str]:
    """Per channel: the launch of kernel `name` before the host channel loops, one block
    per iteration of the nest (the grid's formula, the product of the trip counts, that
    of the loop nests' kernels, `gpu_nest.py`), guarded by `product > 0` for dynamic
    counts.  Returns (grid entry, host_args, function)."""
    loop, trips = seeded.channel_loop, seeded.channel_trips
    assert loop is not None
    if all(isinstance(t, int) for t in trips):
        grid0: int | str = math.prod(trips)  # type: ignore[arg-type]
    else:
        grid0 = "*".join(str(t) if isinstance(t, int) else f"{names[operands.index(t[0])]}.shape[{t[1]}]"
                         for t in trips)
    host = Emitter(InsertPoint.before(loop))
    nch = bg.emit_grid_size(host, grid0, dict(zip(names, operands)))
    one = host.index(1)

    def launch(le: Emitter) -> None:
        le.op(gpu.LaunchFuncOp(SymbolRefAttr(bg.KERNEL_MODULE, [name]), [nch, one, one],
                               [le.index(bs), one, one], kernelOperands=list(operands)))

    if isinstance(grid0, int):
        launch(host)
    else:
        host.if_(host.cmp("sgt", nch, host.index(0)), [], launch)
    fn = loop.parent_op()
    assert isinstance(fn, func.FuncOp)
    host_args = tuple(v.index if v.owner is fn.body.block else -1 for v in operands)  # type: ignore[attr-defined]
    return grid0, host_args, fn.sym_name.data


def lower_scans(
    top: ModuleOp, block_size: int, items_per_thread: int, scratch: Container[SSAValue] = ()
) -> dict[scan.ScanOp, str]:
    """Lower every matching `scan.scan`; returns why the others were left alone.
    `scratch`: buffers the runtime allocates (time blocks' aggregates), not host temporaries."""
    skipped: dict[scan.ScanOp, str] = {}
    for op in [o for o in top.walk() if isinstance(o, scan.ScanOp)]:
        why_not: list[str] = []
        seeded = match_seeded(op, why_not)
        temporaries = seeded is None and any(
            isinstance(v.owner, (memref.AllocOp, memref.AllocaOp)) and v not in scratch for v in (*op.inputs, *op.outputs)
        )
        fn = op.parent_op()
        while fn is not None and not isinstance(fn, func.FuncOp):
            fn = fn.parent_op()
        try:
            lower_scan(op, top, block_size, items_per_thread, seeded)
        except Unsupported as why:
            skipped[op] = str(why)
            continue
        if seeded is not None:
            erase_host_copies(seeded)
        if temporaries and fn is not None:
            # The kernel runs (the simulator shows it), but its operands live in host
            # temporaries that host loops fill and read (the associative raise's copies):
            # say so, or the CUDA runtime's refusal of those loops would name no reason.
            note_on_function(
                fn,
                "scan.scan: lowered to a kernel, but its operands are temporaries "
                "(memref.alloc) that host loops fill and read, and the CUDA runtime runs no "
                "host loops and allocates no temporaries"
                + "".join(f"; not folded into one seeded kernel: {w}" for w in why_not),
            )
    return skipped


__all__ = ["lower_scan", "lower_scans", "match_scan"]
