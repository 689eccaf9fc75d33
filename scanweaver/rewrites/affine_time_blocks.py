"""`scan.affine` parallel in time across blocks: reduce-then-scan in three launches.

One block per channel (`blelloch_gpu`) leaves a few long channels on a few SMs. Here the
time axis of every channel is cut into chunks of `chunk = block_size * items_per_thread
* chunk_tiles` steps, and the grid runs one block per (channel, chunk):

1. `<name>_reduce`, grid channels x chunks: each block folds its chunk tile by tile
   (per-thread folds of 16-byte loads in full tiles, then warp-shuffle scans and the
   warp totals through shared memory, one barrier per tile; the block's up-sweep for
   state types shuffles cannot move) into the chunk aggregate
   `(A, B) = (prod a, scan of the chunk from 0)`, written to scratch `agg_a/agg_b`.
2. `<name>_carries`, grid channels: the one-block-per-channel kernel of `blelloch_gpu`
   run on the aggregates (with `init`): `carries[c, k]` is the state after chunk k, and
   `chan_final[c]` the state after the last chunk.
3. `<name>_chunks`, grid channels x chunks: each block scans its chunk with the chained
   tile loop of `blelloch_gpu` from its carry (`init` for chunk 0, `carries[c, k-1]`
   after), writing `h`; the last chunk's block writes `final`, equal to `h[L-1]`.

Blocks of one launch never read what another block of that launch writes (launches are
ordered by the stream), so any block order is correct: the simulator checks it with
permuted block orders and a cross-block global-memory race check.

Numerics. Float aggregates and carries are computed in f64 (f32 and f16/bf16 inputs
are widened), without the underflow poison: a chunk product of `a` that underflows
f64 drops a share of the carry below 2.2e-308 * |carry|, far below an f32 ulp of any
state (f64 states: the same absolute bound the fused kernels accept). Each chunk then
runs the loop's arithmetic in the state type from its carry (rounded once to the state
type), with the per-tile overflow guard and underflow poison of the one-block kernel.
Where `chan_final` is not finite (Inf/NaN inputs, or an aggregate overflowed f64) the
channel is redone by the block of its first chunk alone, tiles chained from `init`,
exactly as the one-block kernel does, so the result never holds a NaN/Inf the
one-block kernel would not; the other blocks of that channel do nothing. Integer
scans wrap exactly in any association: bit for bit, no flag.

Cost: inputs are read twice (steps 1 and 3): 20 bytes per f32 element instead of 12,
for one block per channel; the pass chooses it only for few channels and long rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dataclasses import replace

from xdsl.dialects import arith, gpu, memref
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    FunctionType,
    IntegerType,
    MemRefType,
    SymbolRefAttr,
    UnitAttr,
    f64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.affine_to_pairs import Emitter, PairArith
from scanweaver.rewrites.launch import KernelLaunch
from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR, prefer_time_blocks

#: 1 + the largest scratch index a host function's launches already use
_SCRATCH_BASE_ATTR = "scanweaver.scratch_count"


def wants_time_blocks(op: scan.AffineOp, chunk: int) -> bool:
    """The `scanweaver.gpu_strategy` attribute's choice, else the static sizes' (few
    channels, rows of at least two chunks); dynamic sizes stay one block per channel."""
    choice = op.attributes.get(TIME_BLOCKS_ATTR)
    if choice is not None:
        return getattr(choice, "data", "") == "time_blocks"
    h_t = op.h.type
    assert isinstance(h_t, MemRefType)
    return static_prefers_time_blocks(h_t.get_shape(), op.axis_value, chunk)


def static_prefers_time_blocks(shape: Sequence[int], axis: int, chunk: int) -> bool:
    """`prefer_time_blocks` for a static shape scanned along `axis` (False when dynamic:
    the sizes are only known at the call)."""
    if any(d == DYNAMIC_INDEX for d in shape):
        return False
    channels = 1
    for i, d in enumerate(shape):
        if i != axis:
            channels *= d
    return prefer_time_blocks(channels, shape[axis], chunk)


def ask_time_blocks(ir_text: str, strategy: str = "time_blocks") -> str:
    """`ir_text` with every `scan.affine`, `scan.scan` and `scan.recurrence` marked for
    the time blocks (the `scanweaver.gpu_strategy` attribute; drivers that know the sizes
    use it; `recurrence_time_blocks.py` takes the recurrences); `strategy="lookback"`
    marks the `scan.affine`s for the single-pass look-back (`affine_lookback.py`)."""
    from xdsl.dialects.builtin import StringAttr

    from scanweaver.ir import parse_ir, print_ir

    if strategy not in ("time_blocks", "lookback"):
        raise ValueError(f"strategy must be 'time_blocks' or 'lookback', got {strategy!r}")
    kinds = (scan.AffineOp,) if strategy == "lookback" else (scan.AffineOp, scan.ScanOp, scan.RecurrenceOp)
    module = parse_ir(ir_text)
    for o in module.walk():
        if isinstance(o, kinds):
            o.attributes[TIME_BLOCKS_ATTR] = StringAttr(strategy)
    return print_ir(module)


def _agg_type(state_t: Attribute) -> Attribute:
    """Aggregates and carries: f64 for float states, the state type for integers."""
    return state_t if isinstance(state_t, IntegerType) else f64


def _to(e: Emitter, v: SSAValue, t: Attribute) -> SSAValue:
    """Float conversion between input, aggregate and state types (no-op when equal)."""
    if v.type == t:
        return v
    wider = t.bitwidth > v.type.bitwidth  # type: ignore[attr-defined]
    return e.val(arith.ExtFOp(v, t) if wider else arith.TruncFOp(v, t))


def chunk_of_block(e: Emitter, length: SSAValue, chunk: int) -> tuple[SSAValue, SSAValue, SSAValue]:
    """(linear channel, chunk index k, chunk count) of this block; chunks =
    max(1, ceil(length / chunk)), the same as the grid's `cdiv` term."""
    n = e.divu(e.add(e.val(arith.MaxUIOp(length, e.index(1))), e.index(chunk - 1)), e.index(chunk))
    bid = bg._block_id(e)
    return e.divu(bid, n), e.remu(bid, n), n


def grid_product(entries: Sequence[int | str]) -> int | str:
    """A launch-description entry multiplying shape entries: an int when all are static,
    else a product formula ("1" for none)."""
    if all(isinstance(t, int) for t in entries):
        return math.prod(entries)  # type: ignore[arg-type]
    return "*".join(str(t) for t in entries if t != 1) or "1"


def _host_chunks(host: Emitter, length: SSAValue, chunk: int) -> SSAValue:
    return host.divu(host.add(host.val(arith.MaxUIOp(length, host.index(1))), host.index(chunk - 1)), host.index(chunk))


def tile_shared(kmod: gpu.ModuleOp, kname: str, el: Attribute, slots: int) -> tuple[MemRefType, MemRefType, MemRefType]:
    """The sA, sB (`slots` each) and sC shared globals of kernel `kname`'s chained tiles."""
    return (bg.shared_global(kmod, f"{kname}_sA", el, max(slots, 1)),
            bg.shared_global(kmod, f"{kname}_sB", el, max(slots, 1)),
            bg.shared_global(kmod, f"{kname}_sC", el, 1))


def _new_kernel(kmod: gpu.ModuleOp, name: str, names: Sequence[str], types: Sequence[Attribute]):
    kfunc = gpu.FuncOp(name, FunctionType.from_lists(list(types), []), kernel=True)
    kfunc.attributes["gpu.kernel"] = UnitAttr()
    args = dict(zip(names, kfunc.body.block.args))
    for n, a in args.items():
        a.name_hint = n
    return kfunc, args, Emitter(kfunc.body.block)


def _emit_reduce(
    e: Emitter, args: dict[str, SSAValue], name: str, axis: int, state_t: Attribute, reverse: bool,
    bs: int, ipt: int, chunk: int, shared: MemRefType,
) -> None:
    """Kernel 1: the aggregate (A, B) of this block's chunk into agg_a/agg_b[c.., k]."""
    agg_t = _agg_type(state_t)
    pairs = PairArith(agg_t)
    a_ref, b_ref = args["a"], args["b"]
    tid = bg._thread_id(e)
    length = e.dim(a_ref, axis)
    c_lin, k, _ = chunk_of_block(e, length, chunk)
    channel = bg.channel_indices(e, a_ref, axis, c_lin)
    s_a = e.val(memref.GetGlobalOp(f"{name}_sA", shared))
    s_b = e.val(memref.GetGlobalOp(f"{name}_sB", shared))
    t_begin = e.mul(k, e.index(chunk))
    t_end = e.val(arith.MinUIOp(length, e.add(t_begin, e.index(chunk))))
    tile = bs * ipt
    ntiles = e.divu(e.add(e.sub(t_end, t_begin), e.index(tile - 1)), e.index(tile))
    base = e.add(t_begin, e.mul(tid, e.index(ipt)))
    last_t = e.sub(length, e.index(1))

    in_el = a_ref.type.element_type  # type: ignore[attr-defined]
    vec = bg.vector_width(in_el, ipt, axis, (a_ref, b_ref))

    def scalar_items(le: Emitter, start: SSAValue) -> list[SSAValue]:
        vals: list[SSAValue] = []
        for i in range(ipt):
            t = le.add(start, le.index(i)) if i else start

            def load(ie: Emitter, t: SSAValue = t) -> list[SSAValue]:
                p = ie.sub(last_t, t) if reverse else t
                idx = [*channel[:axis], p, *channel[axis:]]
                return [_to(ie, ie.load(a_ref, idx), agg_t), _to(ie, ie.load(b_ref, idx), agg_t)]

            vals += le.if_(le.cmp("ult", t, t_end), [agg_t, agg_t], load, lambda ie: list(pairs.identity(ie)))
        return vals

    def vector_items(le: Emitter, start: SSAValue) -> list[SSAValue]:
        """Full tiles: 16-byte loads of each thread's run (`blelloch_gpu`, "Global memory")."""
        chunks = bg.run_vectors(le, channel, axis, start, ipt, vec, last_t if reverse else None)
        a, b = (bg.load_run(le, ref, chunks, in_el) for ref in (a_ref, b_ref))
        return [_to(le, v, agg_t) for pair in zip(a, b) for v in pair]

    def tile_body(le: Emitter, j: SSAValue, carried: Sequence[SSAValue]) -> list[SSAValue]:
        start = le.add(le.mul(j, le.index(tile)), base)
        if vec:
            full = bg.full_aligned_tile(le, le.add(t_begin, le.mul(j, le.index(tile))), tile, t_end, length, vec)
            vals = le.if_(full, [agg_t] * (2 * ipt), lambda ie: vector_items(ie, start),
                          lambda ie: scalar_items(ie, start))
        else:
            vals = scalar_items(le, start)
        agg: tuple[SSAValue, SSAValue] | None = None
        for i in range(ipt):
            item = (vals[2 * i], vals[2 * i + 1])
            agg = item if agg is None else pairs.combine(le, agg, item)
        assert agg is not None
        root = _warp_tile_total(le, pairs, tid, j, agg, s_a, s_b, bs) if bg.shuffles(agg_t) else None
        if root is None:
            le.store(agg[0], s_a, [tid])
            le.store(agg[1], s_b, [tid])
            bg.blelloch_up_sweep(le, pairs, tid, bs, [(s_a, s_b, 0)])
            le.op(gpu.BarrierOp())
            root = (le.load(s_a, [le.index(bs - 1)]), le.load(s_b, [le.index(bs - 1)]))
            # every thread read the root before the next tile's stores into the slots
            le.op(gpu.BarrierOp())
        return list(pairs.combine(le, (carried[0], carried[1]), root))

    total = e.for_(e.index(0), ntiles, e.index(1), list(pairs.identity(e)), tile_body)

    def write(ie: Emitter) -> None:
        ie.store(total[0], args["agg_a"], [*channel, k])
        ie.store(total[1], args["agg_b"], [*channel, k])

    e.if_(e.cmp("eq", tid, e.index(0)), [], write)


def _warp_tile_total(
    le: Emitter, pairs: PairArith, tid: SSAValue, j: SSAValue, agg: tuple[SSAValue, SSAValue],
    s_a: SSAValue, s_b: SSAValue, bs: int,
) -> tuple[SSAValue, SSAValue]:
    """The tile's aggregate in every thread: warp-shuffle scans, then the warp totals
    through shared memory, folded in order by every thread. One barrier per tile (none
    in one warp): the totals of tile j go to slots (j mod 2) * warps + warp, so the next
    tile's writes never meet this tile's reads."""
    width = min(bs, bg.WARP)
    inc = bg.warp_inclusive_scan(le, bg.pair_list_combine(pairs), list(agg), width)
    nw = bs // bg.WARP
    if nw <= 1:
        a, _ = bg.shuffle(le, "idx", inc[0], width - 1, width)
        b, _ = bg.shuffle(le, "idx", inc[1], width - 1, width)
        return a, b
    lane, warp = bg.lane_and_warp(le, tid)
    base = le.mul(le.remu(j, le.index(2)), le.index(nw))

    def post(ie: Emitter) -> None:
        ie.store(inc[0], s_a, [ie.add(base, warp)])
        ie.store(inc[1], s_b, [ie.add(base, warp)])

    le.if_(le.cmp("eq", lane, le.index(bg.WARP - 1)), [], post)
    le.op(gpu.BarrierOp())
    total: tuple[SSAValue, SSAValue] | None = None
    for v in range(nw):
        slot = [le.add(base, le.index(v))]
        t = (le.load(s_a, slot), le.load(s_b, slot))
        total = t if total is None else pairs.combine(le, total, t)
    assert total is not None
    return total


def _emit_chunks(
    e: Emitter, args: dict[str, SSAValue], name: str, axis: int, state_t: Attribute, reverse: bool,
    bs: int, ipt: int, chunk: int, shared: tuple[MemRefType, MemRefType, MemRefType],
) -> None:
    """Kernel 3: this block's chunk, tiles chained from its carry (module doc)."""
    pairs = bg.GuardedPairArith(state_t) if bg.needs_overflow_guard(state_t, bs) else PairArith(state_t)
    h_ref, init_ref, final_ref = args["h"], args.get("init"), args.get("final")
    tid = bg._thread_id(e)
    length = e.dim(h_ref, axis)
    c_lin, k, n = chunk_of_block(e, length, chunk)
    channel = bg.channel_indices(e, h_ref, axis, c_lin)
    init = e.load(init_ref, channel) if init_ref is not None else pairs.zero(e)
    first = e.cmp("eq", k, e.index(0))
    if isinstance(state_t, IntegerType):
        redo = e.const(0, IntegerType(1))
    else:
        redo = bg.any_not_finite(e, [e.load(args["chan_final"], channel)])

    def from_carries(ie: Emitter) -> list[SSAValue]:
        prev = ie.load(args["carries"], [*channel, ie.sub(k, ie.index(1))])
        return [prev if isinstance(state_t, IntegerType) else _to(ie, prev, state_t)]

    (carry0,) = e.if_(first, [state_t], lambda ie: [init], from_carries)
    # a redone channel: chunk 0's block takes every step, the others none
    chunk_begin = e.mul(k, e.index(chunk))
    chunk_end = e.val(arith.MinUIOp(length, e.add(chunk_begin, e.index(chunk))))
    idle = e.val(arith.AndIOp(redo, e.val(arith.XOrIOp(first, e.const(1, IntegerType(1))))))
    zero = e.index(0)
    t_begin = e.val(arith.SelectOp(redo, zero, chunk_begin))
    t_end = e.val(arith.SelectOp(redo, e.val(arith.SelectOp(idle, zero, length)), chunk_end))
    carry0 = e.val(arith.SelectOp(redo, init, carry0))
    carry = bg.emit_chained_tiles(
        e, pairs, args, name, channel, axis, shared, reverse, bs, ipt, t_begin, t_end, carry0, prefetch=True
    )
    if final_ref is not None:
        last = e.cmp("eq", k, e.sub(n, e.index(1)))
        writes = e.val(arith.SelectOp(redo, first, last))
        mine = e.val(arith.AndIOp(writes, e.cmp("eq", tid, zero)))
        fin = final_ref
        e.if_(mine, [], lambda ie: ie.store(carry, fin, channel))


class _AffineTimeBlocks:
    """The three launches replacing one `scan.affine` (module doc); the host code and
    the kernels share its layout and scratch buffers through the instance."""

    def __init__(self, op: scan.AffineOp, kmod: gpu.ModuleOp, bs: int, ipt: int, chunk_tiles: int):
        self.op, self.kmod, self.bs, self.ipt = op, kmod, bs, ipt
        self.chunk = bs * ipt * chunk_tiles
        h_t = op.h.type
        assert isinstance(h_t, MemRefType)
        self.state_t = h_t.element_type
        self.agg_t = _agg_type(self.state_t)
        self.axis, self.rank = op.axis_value, h_t.get_num_dims()
        self.shape = h_t.get_shape()
        self.channel_dims = [i for i in range(self.rank) if i != self.axis]
        self.base = bg._unique_name(kmod, "scan_affine_tb")
        self.reverse = op.is_reverse
        self.descs: list[tuple[str, int | str, dict[str, SSAValue], list[SSAValue], KernelLaunch]] = []

    def lower(self) -> None:
        self._scratch_buffers()
        self._number_scratch()
        kernels = (self._reduce_kernel(), self._carries_kernel(), self._chunks_kernel())
        self._launch(kernels)
        Rewriter.erase_op(self.op)

    # -- host: scratch buffers --------------------------------------------------------------
    def _scratch_buffers(self) -> None:
        """Aggregates a, b and the carries (channels x chunks), each channel's final state."""
        op, shape, axis, chunk = self.op, self.shape, self.axis, self.chunk
        host = self.host = Emitter(InsertPoint.before(op))
        length = host.dim(op.h, axis)
        self.n_static = -(-max(shape[axis], 1) // chunk) if shape[axis] != DYNAMIC_INDEX else DYNAMIC_INDEX
        self.agg_shape = agg_shape = [shape[i] for i in self.channel_dims] + [self.n_static]
        n_val = _host_chunks(host, length, chunk)
        dyn_sizes = [host.dim(op.h, i) for i in self.channel_dims if shape[i] == DYNAMIC_INDEX]
        if self.n_static == DYNAMIC_INDEX:
            dyn_sizes.append(n_val)
        agg_mt = MemRefType(self.agg_t, agg_shape)
        fin_mt = MemRefType(self.agg_t, agg_shape[:-1])

        def alloc(t: MemRefType, sizes: list[SSAValue]) -> SSAValue:
            return host.val(memref.AllocOp(sizes, [], t))

        self.agg_a, self.agg_b, self.carries = (alloc(agg_mt, dyn_sizes) for _ in range(3))
        self.chan_final = alloc(fin_mt, dyn_sizes[: len([d for d in agg_shape[:-1] if d == DYNAMIC_INDEX])])
        self.scratch = [self.agg_a, self.agg_b, self.carries, self.chan_final]  # in scratch-number order

    def _number_scratch(self) -> None:
        """The host function and its scratch numbering (-2 - j in host_args)."""
        fn = self.op.parent_op()
        while fn is not None and not hasattr(fn, "sym_name"):
            fn = fn.parent_op()
        self.fn = fn
        j0 = fn.attributes[_SCRATCH_BASE_ATTR].value.data if fn is not None and _SCRATCH_BASE_ATTR in fn.attributes else 0
        if fn is not None:
            from xdsl.dialects.builtin import IntegerAttr, i64

            fn.attributes[_SCRATCH_BASE_ATTR] = IntegerAttr(j0 + len(self.scratch), i64)
        self.scratch_pos = {buf: -2 - j0 - j for j, buf in enumerate(self.scratch)}

    # -- launch descriptions ------------------------------------------------------------------
    def host_args(self, values: Sequence[SSAValue]) -> tuple[int, ...]:
        out = []
        for v in values:
            if v in self.scratch_pos:
                out.append(self.scratch_pos[v])
            elif self.fn is not None and v.owner is self.fn.body.block:  # type: ignore[attr-defined]
                out.append(v.index)  # type: ignore[attr-defined]
            else:
                out.append(-1)
        return tuple(out)

    def entry(self, arg: str, i: int) -> int | str:
        return self.shape[i] if self.shape[i] != DYNAMIC_INDEX else f"{arg}.shape[{i}]"

    def chunk_count(self, arg: str) -> int | str:
        return self.n_static if self.n_static != DYNAMIC_INDEX else f"cdiv({arg}.shape[{self.axis}],{self.chunk})"

    def grid(self, arg: str, chunks: bool) -> int | str:
        terms = [self.entry(arg, i) for i in self.channel_dims]
        if chunks:
            terms.append(self.chunk_count(arg))
        return grid_product(terms)

    def describe(self, kfunc: gpu.FuncOp, grid: int | str, refs: dict[str, SSAValue], names: Sequence[str],
                 kinds: Sequence[str], values: Sequence[SSAValue], shared_bytes: int, notes: str,
                 **fields) -> gpu.FuncOp:
        """Add kernel `kfunc` to the kernel module and record its launch, in host order:
        its grid over `refs` and its description."""
        kname = kfunc.sym_name.data
        self.kmod.body.block.add_op(kfunc)
        self.descs.append((kname, grid, refs, list(values), KernelLaunch(
            kernel_name=kname, module_name=bg.KERNEL_MODULE, func_name="", grid=(grid, 1, 1), block=(self.bs, 1, 1),
            shared_bytes=shared_bytes, args=self.arg_desc(names, kinds, values), host_args=self.host_args(values),
            notes=notes, **fields,
        )))
        return kfunc

    def equal_to_h(self, names: Sequence[str]) -> tuple[tuple[str, int, str, int], ...]:
        """a, b have h's shape; init, final its channel dims."""
        return tuple([(n, i, "h", i) for n in ("a", "b") for i in range(self.rank)]
                     + [(n, j, "h", i) for n in names if n in ("init", "final") for j, i in enumerate(self.channel_dims)])

    @staticmethod
    def arg_desc(names, kinds, values):
        return [
            (n, k, bg.type_name(v.type.element_type), bg._shape_entries(v.type))  # type: ignore[attr-defined]
            for n, k, v in zip(names, kinds, values)
        ]

    # -- the kernels ----------------------------------------------------------------------------
    def _reduce_kernel(self) -> gpu.FuncOp:
        """Kernel 1: chunk aggregates."""
        op, kmod, bs, agg_t, chunk, rank = self.op, self.kmod, self.bs, self.agg_t, self.chunk, self.rank
        k1 = f"{self.base}_reduce"
        # warp totals, double-buffered (none in one warp), or one slot per thread for the sweep
        slots1 = 2 * bg.tile_slots(agg_t, bs) if bg.shuffles(agg_t) else bs
        sh1 = bg.shared_global(kmod, f"{k1}_sA", agg_t, max(slots1, 1))
        bg.shared_global(kmod, f"{k1}_sB", agg_t, max(slots1, 1))
        n1, v1 = ["a", "b", "agg_a", "agg_b"], [op.a, op.b, self.agg_a, self.agg_b]
        kf1, a1, e1 = _new_kernel(kmod, k1, n1, [v.type for v in v1])
        _emit_reduce(e1, a1, k1, self.axis, self.state_t, self.reverse, bs, self.ipt, chunk, sh1)
        e1.op(gpu.ReturnOp([]))
        agg_entries = tuple([self.entry("a", i) for i in self.channel_dims] + [self.chunk_count("a")])
        g1 = self.grid("a", True)
        equal_ab = [(n, i, "a", i) for n in ("b",) for i in range(rank)]
        return self.describe(kf1, g1, {"a": op.a}, n1, ["in", "in", "out", "out"], v1,
                             bg.tile_shared_bytes(agg_t, slots1, carry_slot=False),
                             f"scan.affine time blocks 1/3: aggregates of {chunk}-step chunks ({agg_t})",
                             equal_dims=tuple(equal_ab), scratch=(("agg_a", agg_entries), ("agg_b", agg_entries)))

    def _carries_kernel(self) -> gpu.FuncOp:
        """Kernel 2: carries, one block per channel over the aggregates."""
        op, kmod, bs, agg_t, rank = self.op, self.kmod, self.bs, self.agg_t, self.rank
        k2 = f"{self.base}_carries"
        slots2 = bg.tile_slots(agg_t, bs)
        sh2 = tile_shared(kmod, k2, agg_t, slots2)
        init_agg = None
        n2 = ["a", "b"] + (["init"] if op.init else []) + ["h", "final"]
        v2 = [self.agg_a, self.agg_b] + ([op.init] if op.init else []) + [self.carries, self.chan_final]
        kf2, a2, e2 = _new_kernel(kmod, k2, n2, [v.type for v in v2])
        if op.init is not None and not isinstance(self.state_t, IntegerType):
            # the kernel seeds its carry with init in the aggregate type
            init_agg = a2["init"]
        pairs2 = bg.GuardedPairArith(agg_t) if bg.needs_overflow_guard(agg_t, bs) else PairArith(agg_t)
        channel2 = bg.channel_indices(e2, a2["h"], rank - 1, bg._block_id(e2))
        carry0 = e2.load(a2["init"], channel2) if op.init is not None else pairs2.zero(e2)
        if init_agg is not None:
            carry0 = _to(e2, carry0, agg_t)
        carry = bg.emit_chained_tiles(
            e2, pairs2, a2, k2, channel2, rank - 1, sh2, False, bs, self.ipt, e2.index(0), e2.dim(a2["h"], rank - 1),
            carry0, prefetch=True,  # one block: latency-bound, the next tile's loads overlap the scan
        )
        e2.if_(e2.cmp("eq", bg._thread_id(e2), e2.index(0)), [], lambda ie: ie.store(carry, a2["final"], channel2))
        e2.op(gpu.ReturnOp([]))
        agg_shape = self.agg_shape
        carry_entries = tuple(f"a.shape[{i}]" if agg_shape[i] == DYNAMIC_INDEX else agg_shape[i] for i in range(rank))
        # one block per channel: the leading dims of this kernel's own `a` (the aggregates),
        # not `h.shape[i]` of the scan's channel dims, which name another array here
        g2 = grid_product(carry_entries[:-1])
        kinds2 = ["in", "in"] + (["in"] if op.init else []) + ["out", "out"]
        return self.describe(kf2, g2, {"a": self.agg_a}, n2, kinds2, v2, bg.tile_shared_bytes(agg_t, slots2, bs=bs),
                             f"scan.affine time blocks 2/3: carries between chunks ({agg_t}), one block per channel",
                             scratch=(("h", carry_entries), ("final", carry_entries[:-1])))

    def _chunks_kernel(self) -> gpu.FuncOp:
        """Kernel 3: the chunks from their carries."""
        op, kmod, bs, state_t = self.op, self.kmod, self.bs, self.state_t
        k3 = f"{self.base}_chunks"
        slots3 = bg.tile_slots(state_t, bs)
        sh3 = tile_shared(kmod, k3, state_t, slots3)
        init, final = ([op.init] if op.init else []), ([op.final] if op.final else [])
        n3 = ["a", "b"] + (["init"] if init else []) + ["carries", "chan_final", "h"] + (["final"] if final else [])
        v3 = [op.a, op.b] + init + [self.carries, self.chan_final, op.h] + final
        kinds3 = ["in", "in"] + (["in"] if init else []) + ["in", "in", "out"] + (["out"] if final else [])
        kf3, a3, e3 = _new_kernel(kmod, k3, n3, [v.type for v in v3])
        _emit_chunks(e3, a3, k3, self.axis, state_t, self.reverse, bs, self.ipt, self.chunk, sh3)
        e3.op(gpu.ReturnOp([]))
        g3 = self.grid("h", True)
        return self.describe(kf3, g3, {"h": op.h}, n3, kinds3, v3, bg.tile_shared_bytes(state_t, slots3, bs=bs),
                             (f"scan.affine time blocks 3/3: axis {self.axis}{' reverse' if self.reverse else ''}; "
                              f"{state_t} state; block_size={bs} items_per_thread={self.ipt} chunk={self.chunk}"),
                             equal_dims=self.equal_to_h(n3))

    # -- host: the launches, in order (all skipped together when there are no channels) ----------
    def _launch(self, kernels: Sequence[gpu.FuncOp]) -> None:
        host, op, bs, fn = self.host, self.op, self.bs, self.fn
        func_name = fn.sym_name.data if fn is not None else ""  # type: ignore[attr-defined]
        static_channels = all(self.shape[i] != DYNAMIC_INDEX for i in self.channel_dims)

        def launches(le: Emitter) -> None:
            for kname, g, refs, values, _ in self.descs:
                size = bg.emit_grid_size(le, g, refs)
                one = le.index(1)
                le.op(gpu.LaunchFuncOp(SymbolRefAttr(bg.KERNEL_MODULE, [kname]), [size, one, one],
                                       [le.index(bs), one, one], kernelOperands=list(values)))

        if static_channels:
            launches(host)
        else:
            nch = bg.emit_grid_size(host, self.grid("h", False), {"h": op.h})
            host.if_(host.cmp("sgt", nch, host.index(0)), [], launches)
        for buf in self.scratch:
            host.op(memref.DeallocOp.get(buf))
        for (_kname, _, _, _, desc), kf in zip(self.descs, kernels):
            kf.attributes["scanweaver.launch"] = replace(desc, func_name=func_name).to_attr()


def lower_affine_time_blocks(op: scan.AffineOp, kmod: gpu.ModuleOp, bs: int, ipt: int, chunk_tiles: int) -> None:
    """Replace `op` by the three launches of the module doc (kernels added to `kmod`)."""
    _AffineTimeBlocks(op, kmod, bs, ipt, chunk_tiles).lower()


__all__ = ["ask_time_blocks", "chunk_of_block", "grid_product", "lower_affine_time_blocks", "wants_time_blocks"]
