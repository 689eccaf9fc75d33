"""`scan.recurrence` parallel in time across blocks: reduce-then-scan in three launches.

The fused kernel of `recurrence_gpu.py` runs one block per channel iteration, so an
EMA with an emit or a one-channel selective scan over 2^26 steps runs on one SM. Here
the steps [0, trip) of every channel are cut into chunks of `chunk = block_size *
items_per_thread * chunk_tiles` steps (the choice rule of `affine_time_blocks`: few
static channels and a static length of at least two chunks, the op's
`scanweaver.gpu_strategy` attribute, or `time-blocks=always`), and the nest becomes:

1. `<name>_reduce`, grid channels x chunks: every thread runs the nest's set-up (channel
   variables from the block id, the cloned ops before the inner loop and the prologue),
   then the block folds the coefficients its chunk's steps produce (the cloned `coeffs`
   region, split and hoisted as in the fused kernel) into N chunk aggregates
   `(A_n, B_n)`: per-thread folds of its items, the block's up-sweep per tile and
   component group, thread 0 folding the roots into running aggregates in shared
   memory; written to scratch `tb_agg_a/tb_agg_b[r, k]`, r = channel * N + n. The
   block of chunk 0 also writes the initial state (after the prologue) to
   `tb_init[r]`. Beyond 16 registers of state it takes half the items per thread and
   produces one component group's pairs at a time (registers: see `reduce_items` and
   `REDUCE_ALL_PAIRS_WORDS`).
2. `<name>_carries`, grid channels x N: the one-block-per-channel affine kernel of
   `blelloch_gpu` over the aggregates from `tb_init`: `tb_carries[r, k]` is element n
   of the state after chunk k, `tb_final[r]` after the last chunk.
3. `<name>_chunks`, grid channels x chunks: the fused kernel of `recurrence_gpu.py`
   over this block's chunk only, its carry the true entry state of the chunk
   (`tb_init` for chunk 0, `tb_carries[.., k-1]` after): the emit runs on the state of
   every step exactly once, by the block owning the step (beyond 16 registers of
   state with half the fused kernel's items per thread: `chunk_items`). The block of
   the last chunk runs the epilogue (final state, `return_last_state`) and the
   step-invariant emit stores (only the loop's last step performs them, as in the
   fused kernel).

Blocks of one launch never read what another block of it writes: the prologue, the
ops before the inner loop and the epilogue may not read a memref the nest writes
(checked; else the fused kernel is kept), and the initial state is read only by
launch 1. The simulator checks this with permuted block orders and its cross-block
global-memory race check.

Numerics (as `affine_time_blocks`). Each thread folds its few steps in the state type,
as the fused kernel does (a product of that many coefficients that underflows drops a
share below the smallest normal times |state|, the fused kernels' contract); the block
sweeps, chunk aggregates and carries of float states are in f64 (an f64 underflow of a
chunk product drops a share of the carry below 2.2e-308 relative); each chunk then runs
the loop's arithmetic in the state type from its carry (rounded once), with the fused
kernel's per-tile overflow guard. Where some
element of a channel's `tb_final` is not finite (Inf/NaN inputs, or an aggregate
overflowed f64: a non-finite aggregate or carry always reaches the last carry), the
channel is redone by the block of its first chunk alone, tiles chained from the
initial state exactly as the fused kernel does; the other blocks of that channel do
nothing. Integer states wrap exactly in any association: bit for bit, no redo.
Complex states (complex<f32>, complex<f64>) the same way in complex<f64> (the carries
kernel without the real-only underflow poison; its overflow flag and the redo check
both parts), before `scan-complex-to-real` makes the arithmetic real.

Cost: the producer runs twice (launches 1 and 3), the consumer once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from xdsl.dialects import arith, gpu, memref
from xdsl.dialects import complex as cx
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    Float16Type,
    Float32Type,
    Float64Type,
    BFloat16Type,
    ComplexType,
    FunctionType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    SymbolRefAttr,
    UnitAttr,
    f64,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites import affine_time_blocks as atb
from scanweaver.rewrites.affine_time_blocks import _SCRATCH_BASE_ATTR, _new_kernel
from scanweaver.rewrites.affine_to_pairs import Emitter, PairArith
from scanweaver.rewrites.gpu_kernel import (
    Unsupported,
    block_id,
    const_int,
    kernel_name,
    shape_entries,
    shared_layout_bytes,
    thread_id,
)
from scanweaver.rewrites.gpu_nest import (
    Nest,
    NestKernel,
    _arg_dim,
    _capture_outside_values,
    _channel_variables,
    _covered_sizes,
    _state_buffer,
    _trip_and_step_index,
    arg_name,
    trip_formula,
)
from scanweaver.rewrites.launch import KernelLaunch
from scanweaver.rewrites.recurrence_gpu import (
    STAGE_MAX_ELEMENTS,
    SWEEP_SHARED_BUDGET,
    UNROLL_BY_LLVM,
    _KernelGen,
    register_words,
)
from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR, loop_trip, prefer_time_blocks

#: scratch arguments of the kernels, in host-function scratch order
SCRATCH = ("tb_agg_a", "tb_agg_b", "tb_init", "tb_carries", "tb_final")

_REAL_OR_INT = (Float16Type, BFloat16Type, Float32Type, Float64Type, IntegerType)


def _agg_type(state_t: Attribute) -> Attribute:
    """Aggregates and carries: f64 (complex<f64>) for float (complex) states, the state
    type for integers."""
    if isinstance(state_t, ComplexType):
        return ComplexType(f64)
    return atb._agg_type(state_t)


def _to(e: Emitter, v: SSAValue, t: Attribute) -> SSAValue:
    """Conversion between state and aggregate types (complex: part by part)."""
    if v.type == t:
        return v
    if isinstance(t, ComplexType):
        re, im = e.val(cx.ReOp(v)), e.val(cx.ImOp(v))
        part = t.element_type
        return e.val(cx.CreateOp(atb._to(e, re, part), atb._to(e, im, part), t))
    return atb._to(e, v, t)


# ---------------------------------------------------------------------------
# When
# ---------------------------------------------------------------------------


def length_term(nest: Nest) -> int | tuple[SSAValue, int] | None:
    """The recurrence's trip count as the host sees it: an int (constant bounds), a
    (function argument, dim) for `0 to memref.dim(%arg, d) step 1`, or None."""
    rec = nest.rec
    lb, ub, st = const_int(rec.lb), const_int(rec.ub), const_int(rec.step)
    if lb is not None and ub is not None and st is not None and st > 0:
        return max(0, -(-(ub - lb) // st))
    d = _arg_dim(rec.ub, set(nest.fn.body.block.args))
    if lb == 0 and st == 1 and d is not None:
        return d
    return None


def init_only_ops(nest: Nest) -> set[Operation]:
    """Prologue loads whose value only fills the state alloca (`h = g[c]` before the
    loop), and those stores: launch 3 takes the entry state from scratch instead, so it
    leaves them out and may let the emit write that memref (the write-through
    `g[c] = state` of the discounted return)."""
    out: set[Operation] = set()
    state = nest.rec.state
    for op in nest.prologue:
        if isinstance(op, memref.LoadOp) and op.results[0].uses:
            users = [u.operation for u in op.results[0].uses]
            if all(isinstance(u, memref.StoreOp) and u.memref is state and u.value is op.results[0] for u in users):
                out.add(op)
                out.update(users)
    return out


#: The most f64 values in a state the time blocks take: their chunk kernel holds the
#: carry and the redo flag beside the fused kernel's values (ptxas sm_90, selective scan
#: N = 16 f64, constant B/C: 56 spill bytes at one item per thread, with or without
#: staging, vectors or shuffles); larger f64 states take one block per channel.
TIME_BLOCKS_MAX_F64_STATE = 8


def why_not_time_blocks(nest: Nest) -> str | None:
    """Why this nest cannot take the time blocks (None: it can)."""
    el = nest.rec.state_type.element_type
    if isinstance(el, ComplexType) and isinstance(el.element_type, (Float32Type, Float64Type)):
        pass  # complex<f32> / complex<f64>: aggregates in complex<f64>
    elif not isinstance(el, _REAL_OR_INT):
        return "time blocks take real, integer and complex<f32/f64> states only"
    if isinstance(el, Float64Type) and math.prod(nest.rec.state_type.get_shape()) > TIME_BLOCKS_MAX_F64_STATE:
        return f"time blocks take at most {TIME_BLOCKS_MAX_F64_STATE} f64 state values (the chunk kernel spills beyond)"
    if length_term(nest) is None:
        return "time blocks need constant bounds or 0 to memref.dim(%arg, d) step 1"
    fn_args = set(nest.fn.body.block.args)  # the nest's own allocas are per block
    written = {a for a in nest.stored_args if a in fn_args} | ({nest.state_arg} if nest.state_arg else set())
    skipped = init_only_ops(nest)
    for ops in [*nest.outer_pre, nest.prologue, nest.epilogue]:
        for top in ops:
            for o in top.walk():
                if isinstance(o, memref.LoadOp) and o.memref in written and o not in skipped:
                    return "time blocks: the set-up or epilogue reads a memref the nest writes"
    return None


def wants_time_blocks(nest: Nest, chunk: int, mode: str) -> bool:
    """`mode` "never" / "always" / "auto" (the op's attribute, else the static sizes')."""
    if mode == "never" or why_not_time_blocks(nest) is not None:
        return False
    if mode == "always":
        return True
    choice = nest.rec.attributes.get(TIME_BLOCKS_ATTR)
    if choice is not None:
        return getattr(choice, "data", "") == "time_blocks"
    length = _static_size(length_term(nest))
    trips = [_static_size(t) for t in nest.trips]
    if length is None or None in trips:
        return False  # sizes known only at the call
    return prefer_time_blocks(math.prod(trips), length, chunk)  # type: ignore[arg-type]


def _static_size(term) -> int | None:
    """A trip count (an int, or `gpu_nest.Trip` over a size) when it is static."""
    if isinstance(term, int) or term is None:
        return term
    size = term[0].type.get_shape()[term[1]]  # type: ignore[attr-defined]
    if size == DYNAMIC_INDEX:
        return None
    return size if len(term) == 2 else loop_trip(size, term[2], term[3])


# ---------------------------------------------------------------------------
# Kernel start: the fused kernel's, over (channel, chunk) blocks
# ---------------------------------------------------------------------------


class _Chunked:
    """The common start of launches 1 and 3: kernel arguments (the nest's, then
    scratch), the block's channel and chunk, the nest's set-up (`begin_nest_kernel`
    with the channel taken from the block id divided by the chunk count)."""

    def __init__(self, nest: Nest, name: str, el: Attribute, shape: Sequence[int], length,
                 chunk: int, extra: Sequence[tuple[str, Attribute]], skip: set[Operation] = frozenset()):
        types = [a.type for a in nest.kernel_args] + [t for _, t in extra]
        kfunc = gpu.FuncOp(name, FunctionType.from_lists(types, []), kernel=True)
        kfunc.attributes["gpu.kernel"] = UnitAttr()
        vmap: dict[SSAValue, SSAValue] = {}
        args = kfunc.body.block.args
        for fa, ka in zip(nest.kernel_args, args):
            ka.name_hint = arg_name(nest, fa)
            vmap[fa] = ka
        self.x: dict[str, SSAValue] = {}
        for (n, _), ka in zip(extra, args[len(nest.kernel_args):]):
            ka.name_hint = n
            self.x[n] = ka
        e = Emitter(kfunc.body.block)
        tid, bid = thread_id(e), block_id(e)
        steps = e.index(length) if isinstance(length, int) else e.dim(vmap[length[0]], length[1])
        self.nch = e.divu(e.add(e.val(arith.MaxUIOp(steps, e.index(1))), e.index(chunk - 1)), e.index(chunk))
        self.c_lin, self.kc = e.divu(bid, self.nch), e.remu(bid, self.nch)
        _capture_outside_values(e, nest, vmap)
        _channel_variables(e, nest, vmap, self.c_lin)
        for pre in nest.outer_pre:
            for op in pre:
                e.op(op.clone(value_mapper=vmap))
        for op in nest.prologue:
            if op not in skip:
                e.op(op.clone(value_mapper=vmap))
        priv, state_src = _state_buffer(e, nest, vmap, el, shape)
        trip, step_index = _trip_and_step_index(e, nest.rec, vmap)
        self.k = NestKernel(nest, kfunc, e, vmap, tid, priv, state_src, trip, step_index)
        n = math.prod(shape)
        self.rows = [e.add(e.mul(self.c_lin, e.index(n)), e.index(i)) if n > 1 else self.c_lin for i in range(n)]
        chunk_begin = e.mul(self.kc, e.index(chunk))
        self.chunk_begin = chunk_begin
        self.chunk_end = e.val(arith.MinUIOp(trip, e.add(chunk_begin, e.index(chunk))))


class _ReduceGen(_KernelGen):
    """Launch 1: the chunk aggregates of every state element (module doc)."""

    # B by 16-byte vectors in full tiles, used directly (kept pairs, no replay): ptxas
    # sm_90, one channel of 2^20 steps, N = 8: 102 to 106 registers, N = 16: 164 to 168,
    # the same resident blocks; C's runs are dropped (`build`: no emit here)
    element_runs = True

    def __init__(self, nest: Nest, name: str, bs: int, ipt: int, length, chunk: int, scratch_types):
        super().__init__(nest, name, bs, ipt, keep_pairs=True)  # no replay: no step values kept
        self.length, self.chunk, self.scratch_types = length, chunk, scratch_types
        self.agg_t = _agg_type(self.el)
        self.agg_pairs = PairArith(self.agg_t)
        size = bg.byte_size(self.agg_t)
        self.group = max(1, min(self.n, SWEEP_SHARED_BUDGET // (2 * bs * size)))
        # beyond 16 registers of state: one group at a time (`_group_folds`), by the sweep
        self.by_group = self.words > REDUCE_ALL_PAIRS_WORDS
        self.warp = self.warp and not self.by_group
        if self.warp:  # the warp totals only (`_warp_reduce`)
            self.sweep_rows = self.nw * self.n
            sizes = [self.sweep_rows * size] * 2 if self.sweep_rows else []
            self.shared_bytes = shared_layout_bytes(sizes + [2 * self.n * size])
        else:
            self.sweep_rows = self.group * bs
            self.shared_bytes = (2 * self.group * bs + 2 * self.n) * size

    def _shared_arrays(self) -> None:
        rows = MemRefType(self.agg_t, [self.sweep_rows], memory_space=bg.SHARED_SPACE)
        self.s_a = self.e.val(memref.GetGlobalOp(f"{self.name}_sA", rows))
        self.s_b = self.e.val(memref.GetGlobalOp(f"{self.name}_sB", rows))
        run = MemRefType(self.agg_t, [2 * self.n], memory_space=bg.SHARED_SPACE)
        self.s_run = self.e.val(memref.GetGlobalOp(f"{self.name}_sR", run))

    def build(self) -> gpu.FuncOp:
        names = ("tb_agg_a", "tb_agg_b", "tb_init")
        ch = _Chunked(self.nest, self.name, self.el, self.shape, self.length, self.chunk,
                      [(n, self.scratch_types[n]) for n in names])
        self._start(ch.k)
        e, n, agg_t = self.e, self.n, self.agg_t
        first_thread = e.cmp("eq", self.tid, self.zero)

        def start(ie: Emitter) -> None:
            """Thread 0: the running aggregates (only it touches them), the initial state."""
            one, zero = self.agg_pairs.identity(ie)
            for i in range(n):
                ie.store(one, self.s_run, [ie.index(i)])
                ie.store(zero, self.s_run, [ie.index(n + i)])

            def write_init(je: Emitter) -> None:
                for i in range(n):
                    v = je.load(self.state_src, self.elem_index(je, i))
                    je.store(_to(je, v, agg_t), ch.x["tb_init"], [ch.rows[i]])

            ie.if_(ie.cmp("eq", ch.kc, self.zero), [], write_init)

        e.if_(first_thread, [], start)
        self._prepare()
        self.store_runs = []  # no replay here: only the step loads
        self.emit_runs = [r for r in self.emit_runs if r.elem is None]  # C: read by the emit only
        self.t_begin, self.t_end = ch.chunk_begin, ch.chunk_end
        self.tile = e.index(self.bs * self.ipt)
        span = e.sub(ch.chunk_end, ch.chunk_begin)
        ntiles = e.divu(e.add(span, e.index(self.bs * self.ipt - 1)), self.tile)
        self.thread_base = e.add(ch.chunk_begin, e.mul(self.tid, e.index(self.ipt)))
        e.for_(self.zero, ntiles, self.one, [], self._reduce_tile)

        def write(ie: Emitter) -> None:
            for i in range(n):
                ie.store(ie.load(self.s_run, [ie.index(i)]), ch.x["tb_agg_a"], [ch.rows[i], ch.kc])
                ie.store(ie.load(self.s_run, [ie.index(n + i)]), ch.x["tb_agg_b"], [ch.rows[i], ch.kc])

        e.if_(first_thread, [], write)
        e.op(gpu.ReturnOp([]))
        return ch.k.kfunc

    def _reduce_tile(self, le: Emitter, tl: SSAValue, _: Sequence[SSAValue]) -> None:
        """One tile: this thread's steps folded in the state type (as in the fused
        kernel: a few steps, within its numerics contract), the block's up-sweep in the
        aggregate type per component group, the roots folded into the running
        aggregates by thread 0 (in shared memory: 4 N fewer registers per thread)."""
        n, agg_t, ap, bs, tid = self.n, self.agg_t, self.agg_pairs, self.bs, self.tid
        # beyond 32 registers of state: one group at a time; else all pairs at once, the
        # step-only work done once
        by_group = self.by_group
        if not by_group:
            _, agg_a, agg_b = self._produce_items(le, tl)
            if self.warp:
                self._warp_reduce(le, agg_a, agg_b)
                return
        for g0 in range(0, n, self.group):
            comps = list(range(g0, min(n, g0 + self.group)))
            if by_group:
                agg_a, agg_b = self._group_folds(le, tl, comps)
            slots = []
            for c, i in enumerate(comps):
                slot = le.add(tid, le.index(c * bs)) if c else tid
                le.store(_to(le, agg_a[i], agg_t), self.s_a, [slot])
                le.store(_to(le, agg_b[i], agg_t), self.s_b, [slot])
                slots.append((self.s_a, self.s_b, c * bs))
            bg.blelloch_up_sweep(le, ap, tid, bs, slots)
            le.op(gpu.BarrierOp())

            def fold_roots(ie: Emitter, comps: list[int] = comps) -> None:
                for c, i in enumerate(comps):
                    root = (ie.load(self.s_a, [ie.index(c * bs + bs - 1)]), ie.load(self.s_b, [ie.index(c * bs + bs - 1)]))
                    run = (ie.load(self.s_run, [ie.index(i)]), ie.load(self.s_run, [ie.index(n + i)]))
                    new = ap.combine(ie, run, root)
                    ie.store(new[0], self.s_run, [ie.index(i)])
                    ie.store(new[1], self.s_run, [ie.index(n + i)])

            le.if_(le.cmp("eq", tid, self.zero), [], fold_roots)
            le.op(gpu.BarrierOp())  # the roots were read before the slots are reused


    def _warp_reduce(self, le: Emitter, agg_a: list[SSAValue], agg_b: list[SSAValue]) -> None:
        """The tile's N aggregates by warp shuffles (`recurrence_gpu`, "Scan with warp
        shuffles"): Kogge-Stone in the aggregate type, so the last lane of each warp holds
        its warp's totals in order; thread 0 folds them, warp after warp, into the running
        aggregates. 2 barriers per tile; none in a block of one warp (the totals move to
        lane 0 by `shuffle idx`)."""
        n, agg_t, ap, tid, width = self.n, self.agg_t, self.agg_pairs, self.tid, min(self.bs, bg.WARP)
        combine = bg.pair_list_combine(ap)
        tot = [bg.warp_inclusive_scan(le, combine, [_to(le, agg_a[i], agg_t), _to(le, agg_b[i], agg_t)], width)
               for i in range(n)]
        nw = self.bs // bg.WARP if self.bs > bg.WARP else 0
        if not nw:
            tot = [[bg.shuffle(le, "idx", v, width - 1, width)[0] for v in pair] for pair in tot]
        else:
            lane, warp_id = bg.lane_and_warp(le, tid)

            def post(ie: Emitter) -> None:
                for i in range(n):
                    slot = ie.add(warp_id, ie.index(i * nw)) if i else warp_id
                    ie.store(tot[i][0], self.s_a, [slot])
                    ie.store(tot[i][1], self.s_b, [slot])

            le.if_(le.cmp("eq", lane, le.index(bg.WARP - 1)), [], post)
            le.op(gpu.BarrierOp())

        def fold(ie: Emitter) -> None:
            for i in range(n):
                run = (ie.load(self.s_run, [ie.index(i)]), ie.load(self.s_run, [ie.index(n + i)]))
                for w in range(max(1, nw)):
                    if nw:
                        part = (ie.load(self.s_a, [ie.index(i * nw + w)]), ie.load(self.s_b, [ie.index(i * nw + w)]))
                    else:
                        part = (tot[i][0], tot[i][1])
                    run = ap.combine(ie, run, part)
                ie.store(run[0], self.s_run, [ie.index(i)])
                ie.store(run[1], self.s_run, [ie.index(n + i)])

        le.if_(le.cmp("eq", tid, self.zero), [], fold)
        if nw:
            le.op(gpu.BarrierOp())  # the totals were read before the next tile posts

    def _group_folds(self, le: Emitter, tl: SSAValue, comps: list[int]) -> tuple[dict, dict]:
        """This thread's folded pairs of the elements `comps` only (large states: the
        step-only ops run once per group, so that only one group's pairs are live)."""
        pairs, el = self.pairs, self.el
        start = le.add(le.mul(tl, self.tile), self.thread_base)
        agg_a: dict[int, SSAValue] = {}
        agg_b: dict[int, SSAValue] = {}
        for j in range(self.ipt):
            k = le.add(start, le.index(j)) if j else start

            def produce(ie: Emitter, k: SSAValue = k) -> list[SSAValue]:
                m = {**self.base, self.t_c: self.step_index(ie, k)}
                for op in self.cs.per_step:
                    ie.op(op.clone(value_mapper=m))
                a_s, b_s = [], []
                for i in comps:
                    mn = self._elem_map(ie, m, i)
                    for op in self.cs.per_both:
                        ie.op(op.clone(value_mapper=mn))
                    a_s.append(pairs.widen(ie, mn[self.y_a]))
                    b_s.append(pairs.widen(ie, mn[self.y_b]))
                return a_s + b_s

            def pad(ie: Emitter) -> list[SSAValue]:
                one, zero = pairs.identity(ie)
                return [one] * len(comps) + [zero] * len(comps)

            res = list(le.if_(le.cmp("ult", k, self.t_end), [el] * (2 * len(comps)), produce, pad))
            for c, i in enumerate(comps):
                item = (res[c], res[len(comps) + c])
                if j == 0:
                    agg_a[i], agg_b[i] = item
                else:
                    agg_a[i], agg_b[i] = pairs.combine(le, (agg_a[i], agg_b[i]), item)
        return agg_a, agg_b


class _ChunkGen(_KernelGen):
    """Launch 3: the fused kernel over one chunk from its true entry state."""

    # B staged up to N = 32 only: at N = 64 the stage costs this kernel 168 to 254
    # registers on sm_90 (ptxas; 168 on sm_80, and in the fused kernel on both)
    stage_max_shared_copy = STAGE_MAX_ELEMENTS
    # ... and from N = 8 only: below, the stage costs this kernel registers (ptxas, 128 x 4,
    # sm_80 / sm_90: N = 4 70 / 64 to 71 / 70, N = 5 and 6 56-64 to 128 on sm_80)
    stage_min = 8

    def __init__(self, nest: Nest, name: str, bs: int, ipt: int, keep_pairs, length, chunk: int, scratch_types):
        super().__init__(nest, name, bs, ipt, keep_pairs)
        self.length, self.chunk, self.scratch_types = length, chunk, scratch_types
        self.agg_t = _agg_type(self.el)

    def build(self) -> gpu.FuncOp:
        names = ("tb_init", "tb_carries", "tb_final")
        ch = self.ch = _Chunked(self.nest, self.name, self.el, self.shape, self.length, self.chunk,
                                [(n, self.scratch_types[n]) for n in names], init_only_ops(self.nest))
        self._start(ch.k)
        e, n, agg_t, el = self.e, self.n, self.agg_t, self.el
        first = e.cmp("eq", ch.kc, self.zero)
        if isinstance(el, IntegerType):
            redo = e.const(0, IntegerType(1))
        else:
            redo = bg.any_not_finite(e, [e.load(ch.x["tb_final"], [r]) for r in ch.rows])
        from_init = e.val(arith.OrIOp(redo, first))

        def init_carry(ie: Emitter) -> None:
            for i in range(n):
                r = ch.rows[i]
                (v,) = ie.if_(
                    from_init, [agg_t], lambda x, r=r: [x.load(ch.x["tb_init"], [r])],
                    lambda x, r=r: [x.load(ch.x["tb_carries"], [r, x.sub(ch.kc, x.index(1))])],
                )
                ie.store(_to(ie, v, el), self.s_c, [ie.index(i)])

        e.if_(e.cmp("eq", self.tid, self.zero), [], init_carry)
        self._prepare()
        # a redone channel: chunk 0's block takes every step, the others none
        idle = e.val(arith.AndIOp(redo, e.val(arith.XOrIOp(first, e.const(1, IntegerType(1))))))
        t_begin = e.val(arith.SelectOp(redo, self.zero, ch.chunk_begin))
        t_end = e.val(arith.SelectOp(redo, e.val(arith.SelectOp(idle, self.zero, self.trip)), ch.chunk_end))
        self._tiles(t_begin, t_end)
        writes = e.val(arith.SelectOp(redo, first, e.cmp("eq", ch.kc, e.sub(ch.nch, self.one))))
        self._finish(writes)
        return ch.k.kfunc

    def _finish(self, writes: SSAValue) -> None:
        """`finish_nest_kernel` for the block that ends the channel only."""
        k, e, nest = self.ch.k, self.e, self.nest
        if nest.state_arg is not None or nest.epilogue:
            e.op(gpu.BarrierOp())

            def finish(ie: Emitter) -> None:
                dest = k.state_src if nest.state_arg is not None else k.priv
                for j in range(self.n):
                    ie.store(ie.load(self.s_c, [ie.index(j)]), dest, self.elem_index(ie, j))
                m = dict(k.vmap)
                for op in nest.epilogue:
                    ie.op(op.clone(value_mapper=m))

            e.if_(e.val(arith.AndIOp(writes, e.cmp("eq", self.tid, self.zero))), [], finish)
        e.op(gpu.ReturnOp([]))


# ---------------------------------------------------------------------------
# Host side: scratch, three launches, descriptions
# ---------------------------------------------------------------------------


class _RecurrenceTimeBlocks:
    def __init__(self, nest: Nest, top: ModuleOp, bs: int, ipt: int, chunk_tiles: int, keep_pairs):
        self.nest, self.top, self.bs, self.ipt, self.keep = nest, top, bs, ipt, keep_pairs
        self.chunk = bs * ipt * chunk_tiles
        st = nest.rec.state_type
        self.el, self.shape = st.element_type, tuple(st.get_shape())
        self.n = math.prod(self.shape)
        self.agg_t = _agg_type(self.el)
        self.length = length_term(nest)
        self.names = [arg_name(nest, a) for a in nest.kernel_args]
        self.by_arg = dict(zip(nest.kernel_args, self.names))
        self.kmod = bg.get_kernel_module(top)
        self.base = kernel_name(top, "scan_recurrence_tb")

    # -- sizes as launch formulas ----------------------------------------------------------
    def _term(self, t) -> int | str:
        return trip_formula(t, self.by_arg)

    def rows_formula(self) -> int | str:
        return atb.grid_product([self._term(t) for t in self.nest.trips] + [self.n])

    def chunks_formula(self) -> int | str:
        if isinstance(self.length, int):
            return max(1, -(-self.length // self.chunk))
        arg, d = self.length  # type: ignore[misc]
        return f"cdiv({self.by_arg[arg]}.shape[{d}],{self.chunk})"

    def channels_formula(self) -> int | str:
        return atb.grid_product([self._term(t) for t in self.nest.trips])

    def lower(self) -> None:
        nest = self.nest
        rows, chunks = self.rows_formula(), self.chunks_formula()
        r_static = rows if isinstance(rows, int) else DYNAMIC_INDEX
        k_static = chunks if isinstance(chunks, int) else DYNAMIC_INDEX
        types = {
            "tb_agg_a": MemRefType(self.agg_t, [r_static, k_static]),
            "tb_agg_b": MemRefType(self.agg_t, [r_static, k_static]),
            "tb_init": MemRefType(self.agg_t, [r_static]),
            "tb_carries": MemRefType(self.agg_t, [r_static, k_static]),
            "tb_final": MemRefType(self.agg_t, [r_static]),
        }
        # the kernels first (Unsupported leaves the IR as it was)
        n1, n3 = f"{self.base}_reduce", f"{self.base}_chunks"
        words = self.n * register_words(self.el)  # what the state costs in registers
        red = _ReduceGen(nest, n1, self.bs, reduce_items(words, self.ipt), self.length, self.chunk, types)
        k1 = red.build()
        chk = _ChunkGen(nest, n3, self.bs, chunk_items(words, self.ipt), self.keep, self.length, self.chunk, types)
        k3 = chk.build()
        if chk.words > UNROLL_BY_LLVM:
            from scanweaver.rewrites.gpu_kernel import unroll_loops_over
            from scanweaver.rewrites.gpu_nest import MAX_STATE

            unroll_loops_over(k3, chk.priv, MAX_STATE)
        n2 = f"{self.base}_carries"
        k2 = self._carries_kernel(n2, types)

        # -- commit: shared arrays, kernels, scratch, launches ---------------------------------
        kmod = self.kmod
        for name, t, size in ((n1, self.agg_t, red.sweep_rows), (n3, self.el, chk.sweep_rows)):
            bg.shared_global(kmod, f"{name}_sA", t, size)
            bg.shared_global(kmod, f"{name}_sB", t, size)
        bg.shared_global(kmod, f"{n1}_sR", self.agg_t, 2 * self.n)
        bg.shared_global(kmod, f"{n3}_sC", self.el, self.n)
        if chk.stage_rows:  # B staged for the replay (recurrence_gpu, `_stage_element_loads`)
            bg.shared_global(kmod, f"{n3}_sS", chk.stage_el, chk.stage_rows)
        for name, gen in ((n1, red), (n3, chk)):  # element-only values (`_hoist_elements_to_shared`)
            if gen.elem_el is not None:
                bg.shared_global(kmod, f"{name}_sE", gen.elem_el, gen.elem_rows)
        for kf in (k1, k2, k3):
            kmod.body.block.add_op(kf)

        host = Emitter(InsertPoint.before(nest.root))
        refs = dict(zip(self.names, nest.kernel_args))
        dyn = {f: bg.emit_grid_size(host, f, refs) for f in (rows, chunks) if not isinstance(f, int)}
        sizes2 = [dyn[f] for f in (rows, chunks) if f in dyn]
        scratch = {
            "tb_agg_a": host.val(memref.AllocOp(sizes2, [], types["tb_agg_a"])),
            "tb_agg_b": host.val(memref.AllocOp(sizes2, [], types["tb_agg_b"])),
            "tb_init": host.val(memref.AllocOp([dyn[rows]] if rows in dyn else [], [], types["tb_init"])),
            "tb_carries": host.val(memref.AllocOp(sizes2, [], types["tb_carries"])),
            "tb_final": host.val(memref.AllocOp([dyn[rows]] if rows in dyn else [], [], types["tb_final"])),
        }
        fn = nest.fn
        j0 = fn.attributes[_SCRATCH_BASE_ATTR].value.data if _SCRATCH_BASE_ATTR in fn.attributes else 0  # type: ignore[attr-defined]
        fn.attributes[_SCRATCH_BASE_ATTR] = IntegerAttr(j0 + len(SCRATCH), i64)
        pos = {s: -2 - j0 - j for j, s in enumerate(SCRATCH)}

        nest_args = list(nest.kernel_args)
        v1 = nest_args + [scratch[s] for s in ("tb_agg_a", "tb_agg_b", "tb_init")]
        v2 = [scratch[s] for s in ("tb_agg_a", "tb_agg_b", "tb_init", "tb_carries", "tb_final")]
        v3 = nest_args + [scratch[s] for s in ("tb_init", "tb_carries", "tb_final")]
        g13 = atb.grid_product([self._term(t) for t in nest.trips] + [chunks])
        g2 = rows if isinstance(rows, int) else "a.shape[0]"
        launches = [(n1, g13, refs, v1), (n2, g2, {"a": scratch["tb_agg_a"]}, v2), (n3, g13, refs, v3)]

        def launch_all(le: Emitter) -> None:
            one = le.index(1)
            for kname, g, grefs, values in launches:
                size = bg.emit_grid_size(le, g, grefs)
                le.op(gpu.LaunchFuncOp(SymbolRefAttr(bg.KERNEL_MODULE, [kname]), [size, one, one],
                                       [le.index(self.bs), one, one], kernelOperands=list(values)))

        channels = self.channels_formula()
        if isinstance(channels, int):
            if channels > 0:
                launch_all(host)
        else:
            nch = bg.emit_grid_size(host, channels, refs)
            host.if_(host.cmp("sgt", nch, host.index(0)), [], launch_all)
        for s in SCRATCH:
            host.op(memref.DeallocOp.get(scratch[s]))

        self._describe(k1, k2, k3, g13, g2, rows, chunks, pos, red, chk)
        Rewriter.erase_op(nest.root)
        for load in nest.outside_loads:
            if not load.results[0].uses:
                Rewriter.erase_op(load)

    def _carries_kernel(self, name: str, types: dict[str, MemRefType]) -> gpu.FuncOp:
        """Launch 2: one block per (channel, element) row over the chunk aggregates."""
        kmod, bs, agg_t = self.kmod, self.bs, self.agg_t
        sh = (bg.shared_global(kmod, f"{name}_sA", agg_t, bs), bg.shared_global(kmod, f"{name}_sB", agg_t, bs),
              bg.shared_global(kmod, f"{name}_sC", agg_t, 1))
        names = ["a", "b", "init", "h", "final"]
        kf, a, e = _new_kernel(kmod, name, names, [types[s] for s in ("tb_agg_a", "tb_agg_b", "tb_init", "tb_carries", "tb_final")])
        # the underflow poison is real-only; complex tiles keep the overflow flag
        guarded = bg.needs_overflow_guard(agg_t, bs) and not isinstance(agg_t, ComplexType)
        pairs = bg.GuardedPairArith(agg_t) if guarded else PairArith(agg_t)
        channel = bg.channel_indices(e, a["h"], 1, block_id(e))
        carry0 = e.load(a["init"], channel)
        carry = bg.emit_chained_tiles(e, pairs, a, name, channel, 1, sh, False, bs, self.ipt, e.index(0),
                                      e.dim(a["h"], 1), carry0)
        e.if_(e.cmp("eq", thread_id(e), e.index(0)), [], lambda ie: ie.store(carry, a["final"], channel))
        e.op(gpu.ReturnOp([]))
        return kf

    def _describe(self, k1, k2, k3, g13, g2, rows, chunks, pos, red, chk) -> None:
        nest, fn_name, names = self.nest, self.nest.fn.sym_name.data, self.names

        def nest_desc(a, kind: str):
            n = self.by_arg[a]
            if isinstance(a.type, MemRefType):
                return (n, kind, bg.type_name(a.type.element_type), shape_entries(a.type))
            return (n, "scalar", bg.type_name(a.type), ())

        def kind3(a) -> str:
            w, r = a in nest.stored_args, a in nest.loaded_args
            if a is nest.state_arg:
                w = True
            return "inout" if w and r else "out" if w else "in"

        agg = bg.type_name(self.agg_t)
        rc = (rows, chunks)  # scratch shape entries over the nest's arguments
        host = tuple(a.index for a in nest.kernel_args)
        covers = _covered_sizes(nest, dict(zip(nest.kernel_args, names)))
        scr = lambda s, shape: (s, "out", agg, shape)  # noqa: E731
        dyn2 = tuple(x if isinstance(x, int) else "?" for x in rc)
        descs = {
            k1: KernelLaunch(
                kernel_name=k1.sym_name.data, module_name=bg.KERNEL_MODULE, func_name=fn_name, grid=(g13, 1, 1),
                block=(self.bs, 1, 1), shared_bytes=red.shared_bytes,
                args=[nest_desc(a, "in") for a in nest.kernel_args]
                + [scr("tb_agg_a", dyn2), scr("tb_agg_b", dyn2), scr("tb_init", dyn2[:1])],
                host_args=host + (pos["tb_agg_a"], pos["tb_agg_b"], pos["tb_init"]),
                covers_dims=covers,
                scratch=(("tb_agg_a", rc), ("tb_agg_b", rc), ("tb_init", rc[:1])),
                notes=f"scan.recurrence time blocks 1/3: {self.n} aggregates per {self.chunk}-step chunk ({agg})",
            ),
            k2: KernelLaunch(
                kernel_name=k2.sym_name.data, module_name=bg.KERNEL_MODULE, func_name=fn_name, grid=(g2, 1, 1),
                block=(self.bs, 1, 1), shared_bytes=(2 * self.bs + 1) * bg.byte_size(self.agg_t),
                args=[(n, k, agg, s) for n, k, s in (("a", "in", dyn2), ("b", "in", dyn2), ("init", "in", dyn2[:1]),
                                                      ("h", "out", dyn2), ("final", "out", dyn2[:1]))],
                host_args=tuple(pos[s] for s in ("tb_agg_a", "tb_agg_b", "tb_init", "tb_carries", "tb_final")),
                scratch=(("h", _over_a(rc)), ("final", _over_a(rc)[:1])),
                notes=f"scan.recurrence time blocks 2/3: carries between chunks ({agg}), one block per state element",
            ),
            k3: KernelLaunch(
                kernel_name=k3.sym_name.data, module_name=bg.KERNEL_MODULE, func_name=fn_name, grid=(g13, 1, 1),
                block=(self.bs, 1, 1), shared_bytes=chk.shared_bytes,
                args=[nest_desc(a, kind3(a)) for a in nest.kernel_args]
                + [("tb_init", "in", agg, dyn2[:1]), ("tb_carries", "in", agg, dyn2), ("tb_final", "in", agg, dyn2[:1])],
                host_args=host + (pos["tb_init"], pos["tb_carries"], pos["tb_final"]),
                covers_dims=covers,
                notes=(f"scan.recurrence time blocks 3/3: state {'x'.join(map(str, self.shape)) or 'scalar'} "
                       f"{self.el}; block_size={self.bs} items_per_thread={self.ipt} chunk={self.chunk}; fused "
                       f"coeffs/emit from each chunk's entry state, {'kept' if chk.keep else 'recomputed'} pairs"),
            ),
        }
        for kf, d in descs.items():
            kf.attributes["scanweaver.launch"] = d.to_attr()


#: launch 1 folds every element's pairs at once up to this many 32-bit words of state,
#: beyond it one component group at a time (ptxas, selective scan N = 32, 2^26 steps,
#: dynamic sizes: all at once spills 44 bytes on sm_80 and 52 on sm_90, by group none)
REDUCE_ALL_PAIRS_WORDS = 16


def chunk_items(words: int, ipt: int) -> int:
    """Items per thread of launch 3: for a state of more than 16 registers half the
    fused kernel's. The chunk kernel holds the carry and the redo flag on top of the
    fused kernel's values (ptxas sm_80, selective scan N = 32, dynamic sizes: 4 items
    spill 48 bytes, 2 none); its chunk is still `chunk` steps, in more tiles."""
    return reduce_items(words, ipt)


def reduce_items(words: int, ipt: int) -> int:
    """Items per thread of launch 1 (its tile need not be the chunk kernel's): for a
    state of more than 16 registers (32-bit words) half the fused kernel's, so its pairs
    and folds stay in registers (ptxas, selective scan N = 32, dynamic sizes: 4 items
    spill 32 bytes, 2 none)."""
    return ipt if words <= 16 else max(1, ipt // 2)


def _over_a(rc) -> tuple[int | str, ...]:
    """Scratch shape entries of the carries kernel: over its argument `a` (the aggregates)."""
    return tuple(x if isinstance(x, int) else f"a.shape[{i}]" for i, x in enumerate(rc))


def lower_recurrence_time_blocks(nest: Nest, top: ModuleOp, bs: int, ipt: int, chunk_tiles: int, keep_pairs=None) -> None:
    """Replace the matched nest by the three launches of the module doc."""
    why = why_not_time_blocks(nest)
    if why is not None:
        raise Unsupported(why)
    _RecurrenceTimeBlocks(nest, top, bs, ipt, chunk_tiles, keep_pairs).lower()


__all__ = ["length_term", "lower_recurrence_time_blocks", "wants_time_blocks", "why_not_time_blocks"]
