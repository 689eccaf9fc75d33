"""`scan-to-gpu`: affine recurrences as work-efficient Blelloch scans in GPU kernels.

Every `scan.affine` becomes a `gpu.func` kernel in the `gpu.module @scanweaver_kernels`
plus a `gpu.launch_func` in its place; the top module gets `gpu.container_module`.

Options (`xdsl-opt -p 'scan-to-gpu{block-size=128 items-per-thread=4}'`):
  block_size        threads per block (power of two, 1..1024; default 128)
  items_per_thread  consecutive elements each thread owns per tile (default 4)
  time_blocks       auto | always | never: several blocks per channel, in time, for
                    `scan.affine` and generic `scan.scan` (see "Few long channels")
  chunk_tiles       tiles per time chunk of those (default 16: 8192 steps)
  diagnose          say on stderr why each scan op left for the sequential
                    lowering was not lowered (always noted on its function as the
                    `scanweaver.gpu_refused` attribute)

Kernel design
-------------
* Grid: one block per channel (all dimensions except the scan axis, linearised
  row-major, delinearised with divui/remui in the kernel) on blockIdx.x, which allows
  2^31 - 1 channels (blockIdx.y would stop at 65535).
* Tile: T = block_size * items_per_thread consecutive time steps. Thread `tid` owns
  steps [tid * ipt, (tid + 1) * ipt) of the tile. It loads its (a, b) pairs into
  registers (f16/bf16 widened with extf; steps past the end become the identity
  pair (1, 0)) and folds them sequentially into one aggregate pair.
* The per-thread aggregates go to shared memory (`memref.global` in address space 3)
  and an exclusive Blelloch scan runs over them: the up-sweep (log2(block_size)
  levels, each after a `gpu.barrier`) builds subtree aggregates in place; thread 0
  then puts the running state into the root slot as the pair (1, carry), and the
  down-sweep (log2(block_size) levels) pushes prefixes down. Only the b components
  are needed on the way down: a node's new b is `a_left * b_parent + b_left`, where
  `a_left` is still the untouched up-sweep aggregate of the left subtree, so the
  down-sweep neither reads nor writes prefix a's (half the shared traffic). After
  it, slot `tid` holds the state just before the thread's first step, with the
  carry already applied.
* In-tile scan with warp shuffles (state types `gpu.shuffle` moves: f32, f64, i32,
  i64; the shared-memory sweep above stays for the others): the per-thread aggregates
  are scanned inside each warp by Kogge-Stone (`gpu.shuffle up` by 1, 2, 4, 8, 16,
  combining where `valid`), the exclusive prefix is one more `shuffle up` by 1; the
  last lane of each warp posts the warp total to shared memory, one barrier, and every
  thread folds the totals of the warps before its own onto the carry (block_size / 32
  steps; 4 at the default 128). The next carry is the last thread's state through the
  one-slot buffer and a second barrier: 2 barriers per tile instead of 2 log2(bs) + 2,
  none in a block of one warp (the carry then moves by `shuffle idx`). The overflow
  verdict: a lane whose inclusive aggregate is not finite sets the warp's flag (xor
  butterfly of shuffles), a flagged warp posts a NaN total, and every thread checks
  all totals, so the verdict is block-uniform; each intermediate Kogge-Stone value
  is an ingredient of its lane's inclusive aggregate and Inf/NaN are absorbing, so a
  finite verdict means every aggregate the tile used was finite. Flagged tiles take
  `sequential_entry_states` as before.
* Global memory: where the scan axis is the innermost (contiguous) one, inputs are of
  the state type (f32, f64) and a thread's run of `items_per_thread` steps is whole
  16-byte vectors, a full tile (wholly before the end, row length and tile start
  multiples of the vector) reads each thread's run with `vector.load` of
  vector<4xf32> / vector<2xf64> carrying `alignment = 16` (upstream then emits
  `ld.global.v4` / `.v2`; without it LLVM splits the access) and writes h with
  `vector.store`, unguarded; other tiles take the guarded scalar path. With 4 f32
  items per thread (the default) a warp's loads cover 512 contiguous bytes, fully
  coalesced without a staging pass through shared memory. The row and tile tests count
  from the base the runtime passes, so every vector branch also requires the bases of
  the arrays it moves by vectors to be 16-byte aligned (one test per kernel, added last
  by `gpu_aligned_bases.py`): a device view off a 16-byte boundary takes the scalar
  path. Inputs no kernel writes
  are read through the read-only path (`ld.global.nc`: `toolchain/readonly_params.py`
  marks them at export).
* Prefetch (warp-shuffle tiles of the time-block kernels, `prefetch=True`): the loop
  carries the next tile's pairs; each tile issues the loads of tile k + 1 before its
  own scan and barriers, so their latency overlaps the scan (2 * items_per_thread more
  registers; tile 0 is loaded before the loop, and the load of the tile past the last
  is all guarded identity: no access). Not in the one-block-per-channel kernel: there
  the 10 more registers (30 -> 40 for f32) would cut the resident warps from 64 to 48
  per SM, and with thousands of channels the other warps hide the latency (unmeasured:
  no GPU run yet). The generic `scan.scan` kernels (`scan_gpu.py`) and the
  `scan.linear_recurrence` kernel (`linear_gpu.py`) prefetch the same way, also with
  one block per channel, where the kernel table shows no occupancy cost.
* Each thread then replays its registers sequentially, `h = a * h + b`, storing each
  in-range h. Identity padding keeps h unchanged past the end, so the last thread's
  final h is the tile's last state: it writes it to a one-slot shared buffer, a
  barrier later every thread reads it as the next tile's carry.
* Long sequences: chained chunks. The block of a channel loops over all tiles of
  its sequence, carrying the running state in a register (`scf.for` iter_args).
  One kernel, deterministic, no extra global memory nor inter-block synchronisation,
  and the input is read exactly once (12 bytes per f32 element); parallelism comes
  from the channels (batch * D is in the thousands for Mamba-like workloads). Any
  length works (index arithmetic is 64-bit).
* Few long channels: parallel in time across blocks (`affine_time_blocks.py`,
  reduce-then-scan in three launches; generic `scan.scan`: `scan_time_blocks.py`),
  chosen by `time_blocks` (default "auto": static shapes with fewer than 2 x 132
  channels and rows of at least two chunks of `chunk_tiles` tiles, or the op's
  `scanweaver.gpu_strategy = "time_blocks"` attribute, which `linear_scan` on the GPU
  sets from the sizes it is called with).
* `init` seeds the carry (0 without it); `final` is written by thread 0 after the
  last tile (= init when the length is 0). `reverse` maps time step t to position
  L - 1 - t. Float math is f32/f64 (unfused mul then add); i32/i64 use muli/addi,
  which wrap exactly like the reference, so integer results are bit for bit.
* Numerics (README, "Numerics"): float tiles of more than one thread are guarded.
  Overflow guard: Inf and NaN are absorbing under the pair combine, so thread 0 checks
  only the tile's root aggregate between the sweeps and stores the verdict in the
  root's `a` slot (the b-only down-sweep never reads it); every thread reads it after
  the down-sweep's first barrier. A tile whose root is not finite (a product of `a`
  over a subtree overflowed, or Inf/NaN inputs) takes its entering states in the
  loop's own order instead: thread after thread, one barrier each
  (`sequential_entry_states`), so it is bit-identical to the loop and never forms a
  product like `inf * 0` that the loop does not. Underflow poison (`GuardedPairArith`,
  this kernel only): a product of non-zero `a`s below the smallest normal, or an
  `a2 * b1` rounded among the subnormals, becomes NaN, so such a tile takes the same
  fallback instead of losing the state's share (or adding subnormal roundings).
  Integer scans are not guarded (wrap-around is exact in any association).
* Launch: grid (channels, 1, 1), block (block_size, 1, 1), static shared memory
  (2 * slots + 1) * sizeof(state), slots = `tile_slots`: block_size / 32 warp totals
  (0 in one warp) with shuffles, block_size for the sweep. A `scanweaver.launch` attribute on the kernel
  (see `launch.py`) describes it for runtimes.

`scan.recurrence` (the fused producer/consumer form raised from loops, e.g. the Mamba
selective scan) is lowered by `recurrence_gpu.py` (called from this pass): its whole
channel loop nest becomes one kernel, one block per channel iteration, the coeffs
region cloned per (item, state element) into registers, N-component Blelloch sweeps
sharing the helpers below, and the emit region run per step on a private state;
see that module. Nests it cannot prove parallel are left unchanged.

`scan.linear_recurrence` (K x K matrix-valued, e.g. a 2nd-order IIR filter) is lowered
by `linear_gpu.py`, generic `scan.scan` combines (k operands, associative combine
region, no identity) by `scan_gpu.py`; both reuse this kernel architecture and the
sweep helpers below. Ops they cannot handle are left untouched for the sequential
lowering.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from xdsl.dialects import arith, func, gpu, math, memref, vector
from xdsl.dialects import complex as complex_dialect
from xdsl.dialects.builtin import (
    ComplexType,
    DYNAMIC_INDEX,
    ArrayAttr,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FunctionType,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    NoneAttr,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    VectorType,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from scanweaver.dialects import scan
from scanweaver.dialects.gpu_shuffle import ShuffleOp
from scanweaver.errors import ScanWeaverError
from scanweaver.rewrites.affine_to_pairs import Emitter, PairArith
from scanweaver.rewrites.launch import KernelLaunch
from scanweaver.runtime.cuda_launch import grid_terms

KERNEL_MODULE = "scanweaver_kernels"
SHARED_SPACE = IntegerAttr(3, i64)


def type_name(t: Attribute) -> str:
    if isinstance(t, Float32Type):
        return "f32"
    if isinstance(t, Float64Type):
        return "f64"
    if isinstance(t, Float16Type):
        return "f16"
    if isinstance(t, BFloat16Type):
        return "bf16"
    if isinstance(t, IntegerType):
        return f"i{t.width.data}"
    if isinstance(t, IndexType):
        return "index"
    return str(t)


def byte_size(t: Attribute) -> int:
    if isinstance(t, ComplexType):  # (re, im)
        return 2 * byte_size(t.element_type)
    if isinstance(t, (Float64Type,)):
        return 8
    if isinstance(t, (Float16Type, BFloat16Type)):
        return 2
    if isinstance(t, IntegerType):
        return max(1, t.width.data // 8)
    return 4


def _thread_id(e: Emitter) -> SSAValue:
    return e.val(gpu.ThreadIdOp(gpu.DimensionAttr(gpu.DimensionEnum.X)))


def _block_id(e: Emitter) -> SSAValue:
    return e.val(gpu.BlockIdOp(gpu.DimensionAttr(gpu.DimensionEnum.X)))


def get_kernel_module(top: ModuleOp) -> gpu.ModuleOp:
    """The `gpu.module @scanweaver_kernels` of `top`, created on first use."""
    for op in top.ops:
        if isinstance(op, gpu.ModuleOp) and op.sym_name.data == KERNEL_MODULE:
            return op
    mod = gpu.ModuleOp(StringAttr(KERNEL_MODULE), Region(Block()))  # type: ignore[arg-type]
    top.body.block.add_op(mod)
    top.attributes["gpu.container_module"] = UnitAttr()
    return mod


def _unique_name(kmod: gpu.ModuleOp, base: str) -> str:
    """`base_i` for the first i that names no symbol of `kmod` and prefixes none: the
    time blocks name their kernels `base_i_reduce`, `base_i_carries`, ... with no
    symbol `base_i` itself, so a second op's kernels would otherwise take the same
    names."""
    taken = {
        op.sym_name.data
        for op in kmod.body.block.ops
        if isinstance(op, (gpu.FuncOp, memref.GlobalOp))
    }
    i = 0
    while any(t == f"{base}_{i}" or t.startswith(f"{base}_{i}_") for t in taken):
        i += 1
    return f"{base}_{i}"


def shared_global(kmod: gpu.ModuleOp, name: str, el: Attribute, size: int) -> MemRefType:
    t = MemRefType(el, [size], memory_space=SHARED_SPACE)
    g = memref.GlobalOp.get(StringAttr(name), t, UnitAttr(), StringAttr("private"))
    g.properties["alignment"] = IntegerAttr(16, i64)
    kmod.body.block.add_op(g)
    return t


def _shape_entries(t: MemRefType) -> tuple[int | str, ...]:
    return tuple("?" if d == DYNAMIC_INDEX else d for d in t.get_shape())


# (s_a, s_b, base): the pair arrays of one scanned component live at
# s_a[base : base + block_size], s_b[base : base + block_size] (shared memory).
SweepSlots = Sequence[tuple[SSAValue, SSAValue, int]]


#: Emits one node of a sweep level: (emitter, node slot i, its left child's slot
#: i - d, d). Runs in the threads `tid < bs / (2 d)`, node i = (tid + 1) * 2d - 1.
SweepNode = Callable[[Emitter, SSAValue, SSAValue, int], None]


def blelloch_levels(
    le: Emitter,
    tid: SSAValue,
    bs: int,
    node: SweepNode,
    *,
    down: bool,
    after_first_barrier: Callable[[Emitter], None] | None = None,
) -> None:
    """The level structure of a Blelloch sweep over `bs` slots, generic in the node.

    Up (`down=False`): d = 1, 2, ..., bs/2; down: d = bs/2, ..., 1 and a final
    `gpu.barrier`. Every level starts with a `gpu.barrier`; its active threads
    (`tid < bs / (2 d)`) each emit `node(ie, i, i - d, d)` for i = (tid + 1) * 2d - 1.
    `after_first_barrier(le)` runs in every thread right after the first barrier.
    """
    levels = []
    d = 1
    while d < bs:
        levels.append(d)
        d *= 2
    for n, d in enumerate(reversed(levels) if down else levels):
        le.op(gpu.BarrierOp())
        if n == 0 and after_first_barrier is not None:
            after_first_barrier(le)
        active = le.cmp("ult", tid, le.index(bs // (2 * d)))

        def body(ie: Emitter, d: int = d) -> None:
            i = ie.sub(ie.mul(ie.add(tid, ie.index(1)), ie.index(2 * d)), ie.index(1))
            node(ie, i, ie.sub(i, ie.index(d)), d)

        le.if_(active, [], body)
    if down:
        le.op(gpu.BarrierOp())


def blelloch_up_sweep(le: Emitter, pairs: PairArith, tid: SSAValue, bs: int, slots: SweepSlots) -> None:
    """In-place up-sweep over `bs` per-thread aggregates for every component in `slots`.

    log2(bs) levels, each after a `gpu.barrier`; the active threads of a level do one
    combine per component. Afterwards slot bs-1 of a component holds its block total.
    """

    def up(ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
        for s_a, s_b, base in slots:
            ii = ie.add(i, ie.index(base)) if base else i
            li = ie.add(left, ie.index(base)) if base else left
            a, b = pairs.combine(
                ie,
                (ie.load(s_a, [li]), ie.load(s_b, [li])),
                (ie.load(s_a, [ii]), ie.load(s_b, [ii])),
            )
            ie.store(a, s_a, [ii])
            ie.store(b, s_b, [ii])

    blelloch_levels(le, tid, bs, up, down=False)


def blelloch_down_sweep(
    le: Emitter,
    pairs: PairArith,
    tid: SSAValue,
    bs: int,
    slots: SweepSlots,
    after_first_barrier: Callable[[Emitter], None] | None = None,
) -> None:
    """Down-sweep on the b components (module doc), ending with a `gpu.barrier`.

    The caller seeds slot bs-1 of each component's b array with the carried state
    between the two sweeps; afterwards slot `tid` holds the state just before thread
    `tid`'s first step. `after_first_barrier` as in `blelloch_levels`.
    """

    def down(ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
        for s_a, s_b, base in slots:
            ii = ie.add(i, ie.index(base)) if base else i
            li = ie.add(left, ie.index(base)) if base else left
            b_parent = ie.load(s_b, [ii])
            b_left = ie.load(s_b, [li])
            a_left = ie.load(s_a, [li])
            ie.store(b_parent, s_b, [li])
            ie.store(pairs.apply(ie, a_left, b_parent, b_left), s_b, [ii])

    blelloch_levels(le, tid, bs, down, down=True, after_first_barrier=after_first_barrier)


# -- warp-shuffle scans (module doc, "In-tile scan") ----------------------------------------

WARP = 32

#: A combine of two lists of values (first, then second) -> the combined list.
ListCombine = Callable[[Emitter, Sequence[SSAValue], Sequence[SSAValue]], Sequence[SSAValue]]


def shuffles(t: Attribute) -> bool:
    """`gpu.shuffle` moves this state type: 32- and 64-bit floats and integers (upstream
    lowers 64-bit values as two 32-bit shuffles)."""
    if isinstance(t, (Float32Type, Float64Type)):
        return True
    return isinstance(t, IntegerType) and t.width.data in (32, 64)


def shuffle(e: Emitter, mode: str, v: SSAValue, offset: int, width: int) -> tuple[SSAValue, SSAValue]:
    """`gpu.shuffle mode v, offset, width`: (value, valid)."""
    op = e.op(ShuffleOp(mode, v, e.const(offset, i32), e.const(width, i32)))
    return op.results[0], op.results[1]


def warp_inclusive_scan(e: Emitter, combine: ListCombine, values: Sequence[SSAValue], width: int) -> list[SSAValue]:
    """Kogge-Stone over the lanes of each segment of `width` lanes: log2(width) steps of
    `gpu.shuffle up` by 1, 2, 4, ...; afterwards lane l holds the combine of the values
    of lanes seg..l in order (lanes whose source is outside the segment keep theirs)."""
    out = list(values)
    d = 1
    while d < width:
        got = [shuffle(e, "up", v, d, width) for v in out]
        merged = combine(e, [g[0] for g in got], out)
        valid = got[0][1]
        out = [e.val(arith.SelectOp(valid, m, v)) for m, v in zip(merged, out)]
        d *= 2
    return out


def warp_exclusive(e: Emitter, inclusive: Sequence[SSAValue], width: int) -> tuple[list[SSAValue], SSAValue]:
    """The previous lane's inclusive values (`gpu.shuffle up` by 1) and `valid`
    (false in lane 0 of a segment, whose exclusive prefix is empty)."""
    got = [shuffle(e, "up", v, 1, width) for v in inclusive]
    return [g[0] for g in got], got[0][1]


def warp_any(e: Emitter, flag: SSAValue, width: int) -> SSAValue:
    """i1 in every lane: `flag` holds in some lane of its segment (xor butterfly)."""
    one, zero = e.const(1, i32), e.const(0, i32)
    f = e.val(arith.SelectOp(flag, one, zero))
    d = 1
    while d < width:
        g, _ = shuffle(e, "xor", f, d, width)
        f = e.val(arith.OrIOp(f, g))
        d *= 2
    return e.val(arith.CmpiOp(f, zero, "ne"))


def pair_list_combine(pairs: PairArith) -> ListCombine:
    """`pairs.combine` on [a, b] lists."""

    def combine(e: Emitter, first: Sequence[SSAValue], second: Sequence[SSAValue]) -> list[SSAValue]:
        return list(pairs.combine(e, (first[0], first[1]), (second[0], second[1])))

    return combine


def tile_slots(state_t: Attribute, bs: int) -> int:
    """Slots of each of the sA / sB shared arrays the chained tiles use: the warp totals
    (none in a block of one warp) with shuffles, one per thread for the sweep."""
    if shuffles(state_t):
        return bs // WARP if bs > WARP else 0
    return bs


def tile_shared_bytes(el: Attribute, slots: int, carry_slot: bool | None = None, bs: int = 0) -> int:
    """Static shared bytes of the sA, sB (`slots` each; LLVM drops them at 0) and sC
    globals, laid out as the PTX has them (each 16-byte aligned). By default (`bs`
    given) sC counts where the chained tiles use it: the sweep, the carry of several
    warps, the overflow fallback."""
    from scanweaver.rewrites.gpu_kernel import shared_layout_bytes

    if carry_slot is None:
        carry_slot = not shuffles(el) or bs > WARP or needs_overflow_guard(el, bs)
    size = byte_size(el)
    sizes = [slots * size, slots * size] if slots else []
    return shared_layout_bytes(sizes + ([size] if carry_slot else []))


def lane_and_warp(e: Emitter, tid: SSAValue) -> tuple[SSAValue, SSAValue]:
    return e.remu(tid, e.index(WARP)), e.divu(tid, e.index(WARP))


# -- the overflow guard (module doc, "Numerics") -------------------------------------------


def needs_overflow_guard(state_t: Attribute, bs: int) -> bool:
    """Float tiles of more than one thread reassociate; integers wrap exactly."""
    return bs > 1 and not isinstance(state_t, (IntegerType, IndexType))


class GuardedPairArith(PairArith):
    """The pair combine of the GPU tree sweeps: `PairArith` plus an underflow poison.

    A product a1 * a2 of non-zero factors below the smallest normal number has lost
    relative precision (or become 0) where the loop, multiplying the state step by
    step, may not: such an `a` aggregate becomes NaN; likewise a product a2 * b1
    rounded among the subnormals. NaN is absorbing, so the tile's root is then not
    finite and the tile takes the sequential fallback. Every value that is not poisoned
    is exactly `PairArith.combine`'s."""

    def combine(
        self, e: Emitter, first: tuple[SSAValue, SSAValue], second: tuple[SSAValue, SSAValue]
    ) -> tuple[SSAValue, SSAValue]:
        (a1, b1), (a2, b2) = first, second
        if self.is_int:
            return super().combine(e, first, second)
        a = poison_underflow(e, self.mul(e, a1, a2), a1, a2)
        # a2 * b1 rounded among the subnormals: the loop rounds its own subnormal states
        # step by step, the tree would add its own roundings on top
        p = poison_underflow(e, self.mul(e, a2, b1), a2, b1)
        return a, self.add(e, p, b2)


def poison_underflow(e: Emitter, p: SSAValue, x: SSAValue, y: SSAValue) -> SSAValue:
    """p = x * y, or NaN where |p| < the smallest normal and x, y are both non-zero."""
    t = p.type
    tiny = 2.2250738585072014e-308 if isinstance(t, Float64Type) else 1.1754943508222875e-38
    zero = e.const(0.0, t)
    small = e.val(arith.CmpfOp(e.val(math.AbsFOp(p)), e.const(tiny, t), "olt"))
    nz = e.val(arith.AndIOp(e.val(arith.CmpfOp(x, zero, "une")), e.val(arith.CmpfOp(y, zero, "une"))))
    lost = e.val(arith.AndIOp(small, nz))
    return e.val(arith.SelectOp(lost, e.const(float("nan"), t), p))


def _real_parts(e: Emitter, values: Sequence[SSAValue]) -> list[SSAValue]:
    """Real values as they are; a complex value as its re and im parts."""
    out: list[SSAValue] = []
    for v in values:
        if isinstance(v.type, ComplexType):
            out += [e.val(complex_dialect.ReOp(v)), e.val(complex_dialect.ImOp(v))]
        else:
            out.append(v)
    return out


def any_not_finite(e: Emitter, values: Sequence[SSAValue]) -> SSAValue:
    """i1: some value is +-inf or NaN (x - x is 0 exactly for every finite x)."""
    bad: SSAValue | None = None
    for v in _real_parts(e, values):
        zero = e.const(0.0, v.type)
        c = e.val(arith.CmpfOp(e.val(arith.SubfOp(v, v)), zero, "une"))
        bad = c if bad is None else e.val(arith.OrIOp(bad, c))
    assert bad is not None
    return bad


def flag_tile_root(e: Emitter, roots: Sequence[SSAValue], flag_ref: SSAValue, flag_slot: int,
                   already: SSAValue | None = None) -> SSAValue:
    """In thread 0 between the sweeps: store 1 (else 0) into `flag_ref[flag_slot]` (the
    root's `a` slot, which the b-only down-sweep never reads) when some root aggregate
    value is not finite, or `already`; returns the i1. Inf and NaN are absorbing under
    the pair combine, so a finite root means every subtree aggregate of the tile is
    finite."""
    bad = any_not_finite(e, roots)
    if already is not None:
        bad = e.val(arith.OrIOp(bad, already))
    el = roots[0].type
    real = el.element_type if isinstance(el, ComplexType) else el
    flag = e.val(arith.SelectOp(bad, e.const(1.0, real), e.const(0.0, real)))
    if isinstance(el, ComplexType):  # the flag as flag + 0i
        flag = e.val(complex_dialect.CreateOp(flag, e.const(0.0, real), el))
    e.store(flag, flag_ref, [e.index(flag_slot)])
    return bad


def read_tile_flag(e: Emitter, flag_ref: SSAValue, flag_slot: int) -> SSAValue:
    """i1 in every thread: `flag_tile_root` said 1 (read after the down-sweep's first
    barrier, before any thread can write that slot again)."""
    (v, *_) = _real_parts(e, [e.load(flag_ref, [e.index(flag_slot)])])  # complex: 1 + 0i
    return e.val(arith.CmpfOp(v, e.const(1.0, v.type), "oeq"))


def sequential_entry_states(
    le: Emitter,
    tid: SSAValue,
    bs: int,
    types: Sequence[Attribute],
    load_state: Callable[[Emitter, SSAValue], Sequence[SSAValue]],
    replay: Callable[[Emitter, Sequence[SSAValue]], Sequence[SSAValue]],
    store_state: Callable[[Emitter, Sequence[SSAValue]], None],
    keep_in: tuple[Callable[[Emitter, Sequence[SSAValue]], None], Callable[[Emitter], Sequence[SSAValue]]] | None = None,
) -> list[SSAValue]:
    """The tile's entering states in the sequential loop's own order (the fallback of a
    tile whose aggregates left the exponent range): for j = 0 .. bs-1, after a barrier,
    thread j reads the running state (`load_state(ie, j)`), replays its own steps on it
    (`replay`) and writes the result back (`store_state`). Returns, in every thread, the
    state it read in its turn. bs barriers: only for flagged tiles. With `keep_in =
    (save, restore)` that state goes through the thread's own slots of shared memory
    (`save` at its turn, `restore` after the loop) instead of loop-carried registers."""
    carried = [] if keep_in else list(types)

    def turn(ie: Emitter, j: SSAValue, mine: Sequence[SSAValue]) -> list[SSAValue]:
        ie.op(gpu.BarrierOp())

        def mine_now(te: Emitter) -> list[SSAValue]:
            h_in = list(load_state(te, j))
            if keep_in:
                keep_in[0](te, h_in)
            store_state(te, replay(te, h_in))
            return [] if keep_in else h_in

        return list(ie.if_(ie.cmp("eq", tid, j), carried, mine_now, (lambda te: list(mine)) if carried else None))

    init = [le.const(0, t) for t in carried]
    out = list(le.for_(le.index(0), le.index(bs), le.index(1), init, turn))
    return list(keep_in[1](le)) if keep_in else out


def channel_indices(e: Emitter, ref: SSAValue, axis: int, bid: SSAValue) -> list[SSAValue]:
    """The channel of block `bid`: its index along every dimension of `ref` but `axis`
    (row-major delinearisation with divui/remui)."""
    rank = ref.type.get_num_dims()  # type: ignore[attr-defined]
    channel_dims = [i for i in range(rank) if i != axis]
    rest = bid
    channel: list[SSAValue] = [bid] * len(channel_dims)
    for pos in range(len(channel_dims) - 1, -1, -1):
        if pos == 0:
            channel[pos] = rest
        else:
            size = e.dim(ref, channel_dims[pos])
            channel[pos] = e.remu(rest, size)
            rest = e.divu(rest, size)
    return channel


def loop_trip_value(e: Emitter, size: SSAValue, lb: int, step: int) -> SSAValue:
    """max(0, ceil((size - lb) / step)) in index arithmetic (`span` in launch sizes):
    the signed max keeps a size below `lb` from wrapping to a huge unsigned count."""
    span = e.val(arith.MaxSIOp(e.sub(size, e.index(lb)), e.index(0))) if lb else size
    return span if step == 1 else e.val(arith.CeilDivUIOp(span, e.index(step)))


def emit_grid_size(host: Emitter, expr: int | str, values: dict[str, SSAValue]) -> SSAValue:
    """The host IR value of one launch-description grid entry, built from the same
    terms the runtime evaluates (`grid_terms`): one formula for the IR's
    `gpu.launch_func` and for `KernelLaunch.resolve_grid`."""
    acc: SSAValue | None = None
    for term in grid_terms(expr):
        if isinstance(term, int):
            v = host.index(term)
        else:
            v = host.dim(values[term[0]], term[1])
            if len(term) == 3:  # cdiv(size, n), at least 1
                n = term[2]  # type: ignore[misc]
                v = host.divu(host.add(host.val(arith.MaxUIOp(v, host.index(1))), host.index(n - 1)), host.index(n))
            elif len(term) == 4:  # span(size, lb, step): a loop's trip count, 0 when size <= lb
                v = loop_trip_value(host, v, term[2], term[3])  # type: ignore[misc]
        acc = v if acc is None else host.mul(acc, v)
    assert acc is not None
    return acc


def launch_over_channels(
    op: Operation, ref: SSAValue, ref_name: str, axis: int, name: str, operands: Sequence[SSAValue], bs: int
) -> tuple[int | str, tuple[int, ...], str]:
    """Insert, before `op`, the launch of kernel `name`: one block of `bs` threads per
    channel of `ref` (all dimensions but `axis`), guarded by `channels > 0` when they
    are dynamic. Returns the launch description's grid entry (an int, or a product
    over `ref_name.shape[i]`), `host_args` for `operands` and the host function name."""
    ref_t = ref.type
    assert isinstance(ref_t, MemRefType)
    rank = ref_t.get_num_dims()
    channel_dims = [i for i in range(rank) if i != axis]
    shape = ref_t.get_shape()
    static_channels = all(shape[i] != DYNAMIC_INDEX for i in channel_dims)
    if static_channels:
        grid0: int | str = 1
        for i in channel_dims:
            grid0 *= shape[i]
    else:
        grid0 = "*".join(
            str(shape[i]) if shape[i] != DYNAMIC_INDEX else f"{ref_name}.shape[{i}]" for i in channel_dims
        )
    host = Emitter(InsertPoint.before(op))
    nch = emit_grid_size(host, grid0, {ref_name: ref})
    one = host.index(1)
    threads = host.index(bs)
    kernel_ref = SymbolRefAttr(KERNEL_MODULE, [name])

    def launch(le: Emitter) -> None:
        le.op(gpu.LaunchFuncOp(kernel_ref, [nch, one, one], [threads, one, one], kernelOperands=list(operands)))

    if static_channels:
        launch(host)
    else:
        host.if_(host.cmp("sgt", nch, host.index(0)), [], launch)

    parent_func = op.parent_op()
    while parent_func is not None and not isinstance(parent_func, func.FuncOp):
        parent_func = parent_func.parent_op()
    host_args = []
    for v in operands:
        pos = -1
        if parent_func is not None and v.owner is parent_func.body.block:  # type: ignore[attr-defined]
            pos = v.index  # type: ignore[attr-defined]
        host_args.append(pos)
    return grid0, tuple(host_args), parent_func.sym_name.data if parent_func is not None else ""


#: Function attribute listing the scan ops the GPU lowering left (and why); the
#: runtime and `scanweaver compile` name them when a function cannot run on the GPU.
REFUSED_ATTR = "scanweaver.gpu_refused"


def record_refusals(refused: dict[Operation, str], diagnose: bool = False) -> None:
    """Note on each op's function why the op stays for the sequential lowering; with
    `diagnose`, also one line each on stderr."""
    for scan_op, why in refused.items():
        fn = scan_op.parent_op()
        while fn is not None and not isinstance(fn, func.FuncOp):
            fn = fn.parent_op()
        if fn is None:
            continue
        line = f"{scan_op.name}: {why}"
        old = fn.attributes.get(REFUSED_ATTR)
        fn.attributes[REFUSED_ATTR] = ArrayAttr([*(old.data if isinstance(old, ArrayAttr) else ()), StringAttr(line)])
        if diagnose:
            print(f"@{fn.sym_name.data}: scan-to-gpu: not lowered for the GPU: {line}", file=sys.stderr)


def refusals(fn: func.FuncOp) -> list[str]:
    """What `record_refusals` noted on `fn`."""
    attr = fn.attributes.get(REFUSED_ATTR)
    return [a.data for a in attr.data] if isinstance(attr, ArrayAttr) else []  # type: ignore[union-attr]


def lower_affine(op: scan.AffineOp, kmod: gpu.ModuleOp, bs: int, ipt: int) -> None:
    """One `scan.affine` as one kernel: one block per channel, chained tiles (the
    module docstring's design), and its launch in the op's place."""
    h_t = op.h.type
    assert isinstance(h_t, MemRefType)
    state_t = h_t.element_type
    in_t = op.a.type.element_type  # type: ignore[attr-defined]
    if not isinstance(state_t, (Float32Type, Float64Type, IntegerType)):
        raise ScanWeaverError(f"scan-to-gpu: unsupported state type {state_t}")
    axis, rank = op.axis_value, h_t.get_num_dims()

    name = _unique_name(kmod, "scan_affine")
    names = ["a", "b"] + (["init"] if op.init else []) + ["h"] + (["final"] if op.final else [])
    kinds = ["in", "in"] + (["in"] if op.init else []) + ["out"] + (["out"] if op.final else [])
    operands = [op.a, op.b] + ([op.init] if op.init else []) + [op.h] + ([op.final] if op.final else [])
    types = [v.type for v in operands]

    slots = tile_slots(state_t, bs)  # unused arrays (slots 0) are dropped by LLVM
    sa_t = shared_global(kmod, f"{name}_sA", state_t, max(slots, 1))
    sb_t = shared_global(kmod, f"{name}_sB", state_t, max(slots, 1))
    sc_t = shared_global(kmod, f"{name}_sC", state_t, 1)

    kfunc = gpu.FuncOp(name, FunctionType.from_lists(types, []), kernel=True)
    kfunc.attributes["gpu.kernel"] = UnitAttr()
    body = kfunc.body.block
    args = dict(zip(names, body.args))
    for n, a in args.items():
        a.name_hint = n
    e = Emitter(body)
    _emit_affine_kernel(e, args, name, axis, rank, state_t, (sa_t, sb_t, sc_t), op.is_reverse, bs, ipt)
    e.op(gpu.ReturnOp([]))
    kmod.body.block.add_op(kfunc)

    # -- host side and launch description ----------------------------------------------------
    grid0, host_args, func_name = launch_over_channels(op, op.h, "h", axis, name, operands, bs)
    desc = KernelLaunch(
        kernel_name=name,
        module_name=KERNEL_MODULE,
        func_name=func_name,
        grid=(grid0, 1, 1),
        block=(bs, 1, 1),
        shared_bytes=tile_shared_bytes(state_t, slots, bs=bs),
        args=[
            (n, k, type_name(t.element_type), _shape_entries(t))  # type: ignore[attr-defined]
            for n, k, t in zip(names, kinds, types)
        ],
        host_args=host_args,
        equal_dims=tuple(
            [(n, i, "h", i) for n in ("a", "b") for i in range(rank)]
            + [
                (n, j, "h", i)
                for n in names if n in ("init", "final")
                for j, i in enumerate(d for d in range(rank) if d != axis)
            ]
        ),
        notes=(
            f"scan.affine axis {axis}{' reverse' if op.is_reverse else ''}; "
            f"{in_t} inputs, {state_t} state; block_size={bs} items_per_thread={ipt}; "
            "one block per channel, chained tiles"
        ),
    )
    kfunc.attributes["scanweaver.launch"] = desc.to_attr()
    Rewriter.erase_op(op)

def _emit_affine_kernel(
    e: Emitter,
    args: dict[str, SSAValue],
    name: str,
    axis: int,
    rank: int,
    state_t: Attribute,
    shared: tuple[MemRefType, MemRefType, MemRefType],
    reverse: bool,
    bs: int,
    ipt: int,
) -> None:
    """One block per channel: every tile of the channel in turn, from `init`."""
    pairs = GuardedPairArith(state_t) if needs_overflow_guard(state_t, bs) else PairArith(state_t)
    h_ref, init_ref, final_ref = args["h"], args.get("init"), args.get("final")
    tid = _thread_id(e)
    bid = _block_id(e)
    zero = e.index(0)
    length = e.dim(h_ref, axis)
    channel = channel_indices(e, h_ref, axis, bid)

    def carry0(ie: Emitter) -> SSAValue:
        return ie.load(init_ref, channel) if init_ref is not None else pairs.zero(ie)

    carry = emit_chained_tiles(
        e, pairs, args, name, channel, axis, shared, reverse, bs, ipt,
        zero, length, carry0, tid=tid, length=length,
    )
    if final_ref is not None:
        fin = final_ref

        def write_final(ie: Emitter) -> None:
            ie.store(carry, fin, channel)

        e.if_(e.cmp("eq", tid, zero), [], write_final)



def _is_zero(v: SSAValue) -> bool:
    op = v.owner
    return isinstance(op, arith.ConstantOp) and getattr(op.value, "value", None) is not None and op.value.value.data == 0


def emit_chained_tiles(
    e: Emitter,
    pairs: PairArith,
    args: dict[str, SSAValue],
    name: str,
    channel: Sequence[SSAValue],
    axis: int,
    shared: tuple[MemRefType, MemRefType, MemRefType],
    reverse: bool,
    bs: int,
    ipt: int,
    t_begin: SSAValue,
    t_end: SSAValue,
    carry0: SSAValue | Callable[[Emitter], SSAValue] | None,
    tid: SSAValue | None = None,
    length: SSAValue | None = None,
    prefetch: bool = False,
    entry: Callable[[Emitter, list[SSAValue]], SSAValue] | None = None,
) -> SSAValue:
    """The tiles of logical time steps [t_begin, t_end) of one channel, one after the
    other, entering with the state `carry0` (or what `carry0(e)` emits, after the shared
    buffers); returns (in every thread) the state after the last step. Stores h[t] for
    every step; block-uniform control flow only. `tid` and `length` (the scan axis size)
    are reused when given. `prefetch`: warp-shuffle tiles load the next tile's pairs
    first (module doc, "Prefetch"). `entry` (with `prefetch`, carry0 None): emits the
    entering state from tile 0's pairs (flat [a_0, b_0, ...], state type), so a caller
    that needs them first (the look-back's chunk aggregate) reads its inputs once."""
    tiles = _ChainedTiles(e, pairs, args, name, channel, axis, shared, reverse, bs, ipt, t_end, tid, length)
    tiles.prefetch = prefetch
    return tiles.emit(e, t_begin, carry0, entry)


class _ChainedTiles:
    """The steps of `emit_chained_tiles`. Each step emits where the previous one
    stopped, so the order of the calls is the order of the IR."""

    def __init__(
        self,
        e: Emitter,
        pairs: PairArith,
        args: dict[str, SSAValue],
        name: str,
        channel: Sequence[SSAValue],
        axis: int,
        shared: tuple[MemRefType, MemRefType, MemRefType],
        reverse: bool,
        bs: int,
        ipt: int,
        t_end: SSAValue,
        tid: SSAValue | None,
        length: SSAValue | None,
    ) -> None:
        self.pairs, self.channel, self.axis, self.reverse, self.bs, self.ipt = pairs, channel, axis, reverse, bs, ipt
        self.a_ref, self.b_ref, self.h_ref = args["a"], args["b"], args["h"]
        self.t_end = t_end
        self.tid = tid if tid is not None else _thread_id(e)
        self.one = e.index(1)
        self.length = length if length is not None else e.dim(self.h_ref, axis)
        self.s_a = e.val(memref.GetGlobalOp(f"{name}_sA", shared[0]))
        self.s_b = e.val(memref.GetGlobalOp(f"{name}_sB", shared[1]))
        self.s_c = e.val(memref.GetGlobalOp(f"{name}_sC", shared[2]))
        self.prefetch = False

    def emit(
        self, e: Emitter, t_begin: SSAValue, carry0: SSAValue | Callable[[Emitter], SSAValue] | None,
        entry: Callable[[Emitter, list[SSAValue]], SSAValue] | None = None,
    ) -> SSAValue:
        """The tile loop from `carry0` (or `entry`); returns the state after the last step."""
        if callable(carry0):
            carry0 = carry0(e)
        self.state_t = carry0.type if carry0 is not None else self.pairs.state_type
        self.t_begin = t_begin
        bs, ipt = self.bs, self.ipt
        self.tile = e.index(bs * ipt)
        span = self.t_end if _is_zero(t_begin) else e.sub(self.t_end, t_begin)
        ntiles = e.divu(e.add(span, e.index(bs * ipt - 1)), self.tile)
        self.thread_base = e.mul(self.tid, e.index(ipt))
        if not _is_zero(t_begin):
            self.thread_base = e.add(t_begin, self.thread_base)
        self.last_t = e.sub(self.length, self.one)
        self.guard = needs_overflow_guard(self.state_t, bs)
        self.warp = shuffles(self.state_t)
        body = self._tile_body
        if self.warp:
            self.width = min(bs, WARP)
            self.lane, self.warp_id = lane_and_warp(e, self.tid)
            # prefetch: tile 0's pairs before the loop, tile k+1's at the top of tile k
            first = self._tile_values(e, e.index(0)) if self.prefetch else []
            if entry is not None:
                assert self.prefetch and carry0 is None
                carry0 = entry(e, first)
            assert carry0 is not None
            carry, *_ = e.for_(e.index(0), ntiles, self.one, [carry0, *first], self._warp_tile_body)
            return carry
        assert carry0 is not None and entry is None
        (carry,) = e.for_(e.index(0), ntiles, self.one, [carry0], body)
        return carry

    def at(self, t_phys: SSAValue) -> list[SSAValue]:
        """The element index of physical time step t_phys in this channel."""
        return [*self.channel[: self.axis], t_phys, *self.channel[self.axis :]]

    def phys(self, le: Emitter, t: SSAValue) -> SSAValue:
        """Physical time step of logical step t (reverse scans run from the end)."""
        return le.sub(self.last_t, t) if self.reverse else t

    def _tile_body(self, le: Emitter, k: SSAValue, carried: Sequence[SSAValue]) -> list[SSAValue]:
        (carry,) = carried
        start = le.add(le.mul(k, self.tile), self.thread_base)
        items = self._fold_items(le, start)
        # 2. up-sweep over the block's aggregates.
        blelloch_up_sweep(le, self.pairs, self.tid, self.bs, [(self.s_a, self.s_b, 0)])
        le.if_(le.cmp("eq", self.tid, le.index(0)), [], lambda ie: self._seed(ie, carry))
        flag = self._down_sweep(le)
        h = self._entry_state(le, items, carry, flag)
        h = self._replay(le, items, h)
        self._publish(le, h)
        return [le.load(self.s_c, [le.index(0)])]

    def _tile_values(self, le: Emitter, k: SSAValue) -> list[SSAValue]:
        """Tile k's (a, b) pairs of this thread, flat [a_0, b_0, a_1, ...]: 16-byte
        vectors in a full tile, else guarded scalars (identity past the end, so a tile
        at or past the last one reads nothing)."""
        start = le.add(le.mul(k, self.tile), self.thread_base)
        full = self._full_tile(le, k)
        items = self._load_items(le, start) if full is None else self._load_items_vector(le, start, full)
        return [v for a_j, b_j, _, _ in items for v in (a_j, b_j)]

    def _warp_tile_body(self, le: Emitter, k: SSAValue, carried: Sequence[SSAValue]) -> list[SSAValue]:
        """The tile with warp-shuffle scans (module doc, "In-tile scan"): 2 barriers,
        none when the block is one warp. With `prefetch` its pairs were loaded by the
        previous tile (or before the loop) and the next tile's loads are issued first, so
        that their latency overlaps this tile's scan (module doc, "Prefetch")."""
        carry, *vals = carried
        pairs, width = self.pairs, self.width
        start = le.add(le.mul(k, self.tile), self.thread_base)
        if not self.prefetch:
            vals = self._tile_values(le, k)
        nxt = self._tile_values(le, le.add(k, self.one)) if self.prefetch else []
        full = self._full_tile(le, k)
        items = []
        for j in range(self.ipt):
            t = le.add(start, le.index(j)) if j else start
            items.append((vals[2 * j], vals[2 * j + 1], t, le.cmp("ult", t, self.t_end)))
        agg = [items[0][0], items[0][1]]
        for a_j, b_j, _, _ in items[1:]:
            agg = list(pairs.combine(le, (agg[0], agg[1]), (a_j, b_j)))
        inc = warp_inclusive_scan(le, pair_list_combine(pairs), agg, width)
        (ex_a, ex_b), has_prev = warp_exclusive(le, inc, width)
        bad = warp_any(le, any_not_finite(le, inc), width) if self.guard else None
        h_warp, bad = self._warp_entry(le, inc, carry, bad)

        def tree(ie: Emitter) -> list[SSAValue]:
            return [ie.val(arith.SelectOp(has_prev, pairs.apply(ie, ex_a, h_warp, ex_b), h_warp))]

        h = self._entry_state(le, items, carry, [bad] if bad is not None else [], tree)
        h = self._replay(le, items, h) if full is None else self._replay_vector(le, items, h, start, full)
        if self.bs <= WARP:  # the last lane's state, without shared memory
            last, _ = shuffle(le, "idx", h, width - 1, width)
            return [last, *nxt]
        self._publish(le, h)
        return [le.load(self.s_c, [le.index(0)]), *nxt]

    def _warp_entry(
        self, le: Emitter, inc: Sequence[SSAValue], carry: SSAValue, bad: SSAValue | None
    ) -> tuple[SSAValue, SSAValue | None]:
        """The state entering this thread's warp, and the tile's verdict (block-uniform):
        the last lane of each warp posts its warp total (a NaN `a` when the warp saw a
        non-finite aggregate), a barrier, then every thread folds the totals of the
        warps before its own onto the carry and checks all of them."""
        nw = self.bs // WARP
        if nw <= 1:
            return carry, bad
        pairs, t = self.pairs, self.state_t
        warp_id = self.warp_id

        def post(ie: Emitter) -> None:
            a = inc[0] if bad is None else ie.val(arith.SelectOp(bad, ie.const(float("nan"), t), inc[0]))
            ie.store(a, self.s_a, [warp_id])
            ie.store(inc[1], self.s_b, [warp_id])

        le.if_(le.cmp("eq", self.lane, le.index(WARP - 1)), [], post)
        le.op(gpu.BarrierOp())
        h = carry
        verdict = None
        for v in range(nw):
            ta, tb = le.load(self.s_a, [le.index(v)]), le.load(self.s_b, [le.index(v)])
            if bad is not None:
                c = any_not_finite(le, [ta, tb])
                verdict = c if verdict is None else le.val(arith.OrIOp(verdict, c))
            if v < nw - 1:
                before = le.cmp("ult", le.index(v), warp_id)
                h = le.val(arith.SelectOp(before, pairs.apply(le, ta, h, tb), h))
        return h, verdict

    # -- 16-byte loads and stores of full tiles (module doc, "Global memory") -----------------

    def _vector_width(self) -> int:
        return vector_width(self.state_t, self.ipt, self.axis, (self.a_ref, self.b_ref, self.h_ref))

    def _full_tile(self, le: Emitter, k: SSAValue) -> SSAValue | None:
        vec = self._vector_width()
        if not vec:
            return None
        t0 = le.mul(k, self.tile)
        if not _is_zero(self.t_begin):
            t0 = le.add(self.t_begin, t0)
        return full_aligned_tile(le, t0, self.bs * self.ipt, self.t_end, self.length, vec)

    def _run_chunks(self, le: Emitter, start: SSAValue) -> list[tuple[list[SSAValue], list[int]]]:
        return run_vectors(le, self.channel, self.axis, start, self.ipt, self._vector_width(),
                           self.last_t if self.reverse else None)

    def _load_items_vector(
        self, le: Emitter, start: SSAValue, full: SSAValue
    ) -> list[tuple[SSAValue, SSAValue, SSAValue, SSAValue]]:
        """`_load_items`, with 16-byte vector loads in full tiles (no per-item guard)."""
        state_t, ipt = self.state_t, self.ipt

        def vector_loads(ie: Emitter) -> list[SSAValue]:
            chunks = self._run_chunks(ie, start)
            a, b = (load_run(ie, ref, chunks, state_t) for ref in (self.a_ref, self.b_ref))
            return [v for pair in zip(a, b) for v in pair]

        def scalar_loads(ie: Emitter) -> list[SSAValue]:
            return [v for a_j, b_j, _, _ in self._load_items(ie, start) for v in (a_j, b_j)]

        vals = le.if_(full, [state_t] * (2 * ipt), vector_loads, scalar_loads)
        items = []
        for j in range(ipt):
            t = le.add(start, le.index(j)) if j else start
            items.append((vals[2 * j], vals[2 * j + 1], t, le.cmp("ult", t, self.t_end)))
        return items

    def _replay_vector(self, le: Emitter, items: list, h: SSAValue, start: SSAValue, full: SSAValue) -> SSAValue:
        """`_replay`, with 16-byte vector stores in full tiles."""
        hs = []
        for a_j, b_j, _, _ in items:
            h = self.pairs.apply(le, a_j, h, b_j)
            hs.append(h)
        vt = VectorType(self.state_t, [self._vector_width()])

        def vector_stores(ie: Emitter) -> None:
            for idx, lanes in self._run_chunks(ie, start):
                v = ie.val(vector.BroadcastOp(hs[lanes[0]], vt))
                for i, item in enumerate(lanes[1:], 1):
                    v = ie.val(vector.InsertOp(hs[item], v, [i], vt))
                _aligned(ie, vector.StoreOp(v, self.h_ref, idx))

        def scalar_stores(ie: Emitter) -> None:
            for (_, _, t, inside), h_j in zip(items, hs):
                ie.if_(inside, [], lambda je, h_j=h_j, t=t: je.store(h_j, self.h_ref, self.at(self.phys(je, t))))

        le.if_(full, [], vector_stores, scalar_stores)
        return h

    def _load_items(self, le: Emitter, start: SSAValue) -> list[tuple[SSAValue, SSAValue, SSAValue, SSAValue]]:
        """This thread's pairs in registers, identity past the end: (a, b, t, inside)."""
        pairs, state_t = self.pairs, self.state_t
        items: list[tuple[SSAValue, SSAValue, SSAValue, SSAValue]] = []
        for j in range(self.ipt):
            t = le.add(start, le.index(j)) if j else start
            inside = le.cmp("ult", t, self.t_end)

            def load(ie: Emitter, t: SSAValue = t) -> list[SSAValue]:
                idx = self.at(self.phys(ie, t))
                return [
                    pairs.widen(ie, ie.load(self.a_ref, idx)),
                    pairs.widen(ie, ie.load(self.b_ref, idx)),
                ]

            a_j, b_j = le.if_(inside, [state_t, state_t], load, lambda ie: list(pairs.identity(ie)))
            items.append((a_j, b_j, t, inside))
        return items

    def _fold_items(self, le: Emitter, start: SSAValue) -> list[tuple[SSAValue, SSAValue, SSAValue, SSAValue]]:
        """1. Registers: this thread's pairs, identity past the end; the sequential fold
        goes to shared memory. Returns (a, b, t, inside) per item."""
        items = self._load_items(le, start)
        pairs = self.pairs
        agg = (items[0][0], items[0][1])
        for a_j, b_j, _, _ in items[1:]:
            agg = pairs.combine(le, agg, (a_j, b_j))
        le.store(agg[0], self.s_a, [self.tid])
        le.store(agg[1], self.s_b, [self.tid])
        return items

    def _seed(self, ie: Emitter, carry: SSAValue) -> None:
        """3. Seed the root with the running state: pair (1, carry); a is unused below,
        so its slot carries the overflow flag (root aggregate not finite)."""
        bs = self.bs
        if self.guard:
            root = [ie.load(self.s_a, [ie.index(bs - 1)]), ie.load(self.s_b, [ie.index(bs - 1)])]
            flag_tile_root(ie, root, self.s_a, bs - 1)
        ie.store(carry, self.s_b, [ie.index(bs - 1)])

    def _down_sweep(self, le: Emitter) -> list[SSAValue]:
        """4. Down-sweep on b only (see module doc), then a barrier; returns the tile's
        overflow flag when guarded."""
        flag: list[SSAValue] = []
        blelloch_down_sweep(
            le, self.pairs, self.tid, self.bs, [(self.s_a, self.s_b, 0)],
            after_first_barrier=(lambda ie: flag.append(read_tile_flag(ie, self.s_a, self.bs - 1)))
            if self.guard else None,
        )
        return flag

    def _entry_state(
        self, le: Emitter, items: list, carry: SSAValue, flag: list[SSAValue],
        tree: Callable[[Emitter], list[SSAValue]] | None = None,
    ) -> SSAValue:
        """5a. The thread's exclusive prefix (`tree`, default: the down-sweep's slot); a
        flagged tile takes its entering states from the loop's own order instead."""
        if tree is None:
            def tree(ie: Emitter) -> list[SSAValue]:
                return [ie.load(self.s_b, [self.tid])]
        if not self.guard:
            return tree(le)[0]
        pairs, state_t, s_c = self.pairs, self.state_t, self.s_c

        def load_state(ie: Emitter, j: SSAValue) -> list[SSAValue]:
            first = ie.cmp("eq", j, ie.index(0))
            return list(ie.if_(first, [state_t], lambda x: [carry], lambda x: [x.load(s_c, [x.index(0)])]))

        def replay_own(ie: Emitter, h: Sequence[SSAValue]) -> list[SSAValue]:
            (x,) = h
            for a_j, b_j, _, _ in items:
                x = pairs.apply(ie, a_j, x, b_j)
            return [x]

        def exact(ie: Emitter) -> list[SSAValue]:
            return sequential_entry_states(
                ie, self.tid, self.bs, [state_t], load_state, replay_own, lambda x, h: x.store(h[0], s_c, [x.index(0)])
            )

        (h,) = le.if_(flag[0], [state_t], exact, tree)
        return h

    def _replay(self, le: Emitter, items: list, h: SSAValue) -> SSAValue:
        """5b. Replay the registers from the entering state; store in-range states."""
        for a_j, b_j, t, inside in items:
            h = self.pairs.apply(le, a_j, h, b_j)

            def store(ie: Emitter, h: SSAValue = h, t: SSAValue = t) -> None:
                ie.store(h, self.h_ref, self.at(self.phys(ie, t)))

            le.if_(inside, [], store)
        return h

    def _publish(self, le: Emitter, h: SSAValue) -> None:
        """6. Broadcast the tile's last state as the next carry (barrier included)."""

        def publish(ie: Emitter) -> None:
            ie.store(h, self.s_c, [ie.index(0)])

        le.if_(le.cmp("eq", self.tid, le.index(self.bs - 1)), [], publish)
        le.op(gpu.BarrierOp())


def vector_width(el: Attribute, ipt: int, axis: int, refs: Sequence[SSAValue]) -> int:
    """Elements per 16-byte access of a thread's run of `ipt` steps of `refs`, or 0
    where the kernel keeps scalar accesses: the scan axis must be the innermost
    (contiguous) one, every ref of element type `el` (f32, f64, i32, i64) with the identity
    layout, and the run whole 16-byte vectors."""
    if not shuffles(el):  # f32, f64, i32, i64
        return 0
    for r in refs:
        t = r.type
        if not isinstance(t, MemRefType) or t.element_type != el or not isinstance(t.layout, NoneAttr):
            return 0  # f16/bf16 inputs, strided layouts
        if axis != t.get_num_dims() - 1:
            return 0
    vec = 16 // byte_size(el)
    return vec if ipt % vec == 0 else 0


def full_aligned_tile(
    le: Emitter, t0: SSAValue, tile: int, t_end: SSAValue, length: SSAValue, vec: int
) -> SSAValue:
    """i1, block-uniform: the tile of logical steps [t0, t0 + tile) lies wholly before
    `t_end` and every thread's run starts on a 16-byte boundary (rows a multiple of the
    vector long, tile starts multiples of it)."""
    inside = le.cmp("ule", le.add(t0, le.index(tile)), t_end)
    rows_aligned = le.cmp("eq", le.remu(length, le.index(vec)), le.index(0))
    starts_aligned = le.cmp("eq", le.remu(t0, le.index(vec)), le.index(0))
    return le.val(arith.AndIOp(inside, le.val(arith.AndIOp(rows_aligned, starts_aligned))))


def run_vectors(
    le: Emitter, channel: Sequence[SSAValue], axis: int, start: SSAValue, ipt: int, vec: int,
    reverse_last: SSAValue | None,
) -> list[tuple[list[SSAValue], list[int]]]:
    """A thread's run of `ipt` logical steps from `start` as 16-byte vectors: (element
    index of the vector, the item number of each of its lanes). Reverse scans
    (`reverse_last` = L - 1) read the run from its physical end."""
    out = []
    for c in range(ipt // vec):
        if reverse_last is not None:  # items c*vec .. c*vec+vec-1 sit at descending positions
            first = le.sub(le.sub(reverse_last, start), le.index(c * vec + vec - 1))
            lanes = [c * vec + vec - 1 - i for i in range(vec)]
        else:
            first = le.add(start, le.index(c * vec)) if c else start
            lanes = [c * vec + i for i in range(vec)]
        out.append(([*channel[:axis], first, *channel[axis:]], lanes))
    return out


def load_run(le: Emitter, ref: SSAValue, chunks: list[tuple[list[SSAValue], list[int]]], el: Attribute) -> list[SSAValue]:
    """The run's `ipt` elements of `ref`, in item order, by 16-byte vector loads."""
    vec = len(chunks[0][1])
    vals: list[SSAValue | None] = [None] * (vec * len(chunks))
    for idx, lanes in chunks:
        v = _aligned(le, vector.LoadOp(ref, idx, VectorType(el, [vec])))
        for i, item in enumerate(lanes):
            vals[item] = le.val(vector.ExtractOp(v, [i], el))
    return vals  # type: ignore[return-value]


def store_aligned(e: Emitter, v: SSAValue, ref: SSAValue, idx: Sequence[SSAValue]) -> None:
    """A 16-byte `vector.store` of `v` at `ref[idx]` (the caller checked the alignment)."""
    _aligned(e, vector.StoreOp(v, ref, list(idx)))


def _aligned(e: Emitter, op: Operation) -> SSAValue | None:
    """Emit a vector.load / vector.store promising 16-byte alignment (upstream's
    `alignment` property: without it LLVM splits the access into scalars)."""
    op.attributes["alignment"] = IntegerAttr(16, i64)  # upstream reads it from the generic attr-dict
    e.op(op)
    return op.results[0] if op.results else None


def __getattr__(name: str):
    """`ScanToGpu` moved to `scan_to_gpu.py`; the old import path still works (lazily:
    that module imports this one)."""
    if name == "ScanToGpu":
        from scanweaver.rewrites.scan_to_gpu import ScanToGpu

        return ScanToGpu
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
