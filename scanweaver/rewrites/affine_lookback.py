"""`scan.affine` parallel in time in one pass: decoupled look-back (as CUB's single-pass scan).

Opt-in (`scan-to-gpu{time-blocks=lookback}`) alternative to the reduce-then-scan of
`affine_time_blocks.py`, which reads the inputs twice. Two launches:

1. `<name>_reset`, grid channels: zeroes the scratch status words (the ticket counter
   and one flag per chunk), which the runtime allocates uninitialised for each call.
2. `<name>_lookback`, grid channels x chunks of `chunk = block_size * items_per_thread`
   steps (one tile). Each block:
   * takes a ticket (`memref.atomic_rmw addi` on the counter, by thread 0) and works on
     chunk `ticket mod chunks` of channel `ticket div chunks`: a block only ever waits
     on chunks whose tickets were taken before its own, by blocks that already run, so
     the protocol needs no co-residency of blocks (forward progress on any GPU);
   * loads its tile once and folds it into the chunk aggregate `(A, B)` (warp-shuffle
     scans, f64 for float states); lane 0 stores it, then raises the chunk's flag to
     AGGREGATE: a release fence (`llvm.fence acq_rel`, `fence.acq_rel.gpu`), then
     `memref.atomic_rmw assign` (a relaxed `atom` in the PTX: the fence orders it);
   * look-back, by one warp (`_LookBack`): lane l reads the flag of chunk q-32+l
     (`atomic_rmw ori 0`, then an acquire fence before reading what it publishes); the
     window is read again while any flag is INVALID; else the lanes after the latest
     INCLUSIVE chunk (or `init`, before chunk 0) fold their aggregates onto its state by
     a warp scan, or, with none, onto the suffix aggregate and the window moves back;
   * scans its tile from that carry with the chained-tile code of the one-block kernel
     (state type, its overflow guard and underflow poison) on the registers it loaded,
     writes `h`, and thread 0 publishes the tile's last state as the chunk's INCLUSIVE
     prefix (value, fence, flag); the last chunk's block writes `final`.

Numerics (the bar of `affine_time_blocks.py`). Aggregates and the carry are f64 for
float states. The INCLUSIVE value is the exact state the chunk ended with, not an
aggregate product. Where the carry composed from aggregates is not finite (Inf/NaN
inputs, an f64 overflow), the block instead waits for its predecessor's INCLUSIVE state
and starts from it, which is what the one-block kernel carries between tiles: so the
result never holds a NaN/Inf the one-block kernel would not. Integer states wrap
exactly in any association: bit for bit, no fallback.

Cost: inputs read once and `h` written once (12 bytes per f32 element) plus a few status
words per chunk. State types `gpu.shuffle` cannot move take the reduce-then-scan.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import arith, gpu, memref, scf
from xdsl.dialects.builtin import IntegerAttr, IntegerType, MemRefType, i32, i64
from xdsl.ir import Attribute, Block, SSAValue
from xdsl.rewriter import Rewriter

from scanweaver.dialects import scan
from scanweaver.dialects.llvm_fence import FenceOp
from scanweaver.rewrites import affine_time_blocks as atb
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.affine_to_pairs import Emitter, PairArith
from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR

#: chunk status words
AGGREGATE, INCLUSIVE = 1, 2
#: arith::AtomicRMWKind numbers of memref.atomic_rmw
_ADDI, _ASSIGN, _ORI = 1, 3, 14


def _atomic(e: Emitter, kind: int, value: SSAValue, ref: SSAValue, idx: Sequence[SSAValue]) -> SSAValue:
    return e.val(memref.AtomicRMWOp.build(
        operands=[value, ref, list(idx)], result_types=[value.type], properties={"kind": IntegerAttr(kind, i64)}
    ))


def _while(e: Emitter, inits: Sequence[SSAValue], cond, body) -> Sequence[SSAValue]:
    """scf.while: `cond(e, values) -> i1` runs first each iteration; `body(e, values)`
    returns the next values."""
    types = [v.type for v in inits]
    before, after = Block(arg_types=types), Block(arg_types=types)
    be = e.child(before)
    be.op(scf.ConditionOp(cond(be, list(before.args)), *before.args))
    ae = e.child(after)
    ae.op(scf.YieldOp(*body(ae, list(after.args))))
    return e.op(scf.WhileOp(list(inits), types, [before], [after])).results


def _poll(e: Emitter, flags: SSAValue, idx: Sequence[SSAValue]) -> SSAValue:
    """The flag at `idx` (an atomic or of 0), then an acquire fence: loads after it see
    what the flag's writer stored before its release fence."""
    flag = _atomic(e, _ORI, e.const(0, i32), flags, idx)
    e.op(FenceOp())
    return flag


def _raise_flag(e: Emitter, status: int, flags: SSAValue, idx: Sequence[SSAValue]) -> None:
    """A release fence (the stores before it become visible first), then the flag."""
    e.op(FenceOp())
    _atomic(e, _ASSIGN, e.const(status, i32), flags, idx)


def _warp_max(e: Emitter, v: SSAValue, width: int) -> SSAValue:
    """i32 maximum over the lanes of each segment of `width` (xor butterfly)."""
    d = 1
    while d < width:
        got, _ = bg.shuffle(e, "xor", v, d, width)
        v = e.val(arith.MaxSIOp(v, got))
        d *= 2
    return v


class _LookBack:
    """The warp of threads 0..width-1: publish the chunk's aggregate, then walk the
    predecessors' status words `width` chunks at a time (module doc)."""

    def __init__(self, args: dict[str, SSAValue], channel: list[SSAValue], k: SSAValue, init: SSAValue,
                 pairs: PairArith, lane: SSAValue, width: int):
        self.args, self.channel, self.k, self.init, self.pairs = args, channel, k, init, pairs
        self.lane, self.width = lane, width
        self.agg_t = pairs.state_type

    def emit(self, e: Emitter, agg: tuple[SSAValue, SSAValue]) -> SSAValue:
        """The carry entering chunk k (every lane), the aggregate published by lane 0."""
        args, k = self.args, self.k
        at_k = [*self.channel, k]

        def publish(ie: Emitter) -> None:
            ie.store(agg[0], args["agg_a"], at_k)
            ie.store(agg[1], args["agg_b"], at_k)
            _raise_flag(ie, AGGREGATE, args["flags"], at_k)

        e.if_(e.cmp("eq", self.lane, e.index(0)), [], publish)
        one, zero = self.pairs.identity(e)
        no = e.const(0, IntegerType(1))
        *_, carry, _ = _while(e, [k, one, zero, zero, no],
                              lambda ce, v: ce.val(arith.XOrIOp(v[4], ce.const(1, IntegerType(1)))), self._window)
        return carry

    def _window(self, e: Emitter, vals: list[SSAValue]) -> list[SSAValue]:
        """One look at chunks q-width .. q-1 (lane l: chunk q-width+l; the chunk before
        0 is `init`, inclusive): again while any is INVALID, else fold them."""
        q = vals[0]
        pos = e.add(q, self.lane)
        has_chunk = e.cmp("uge", pos, e.index(self.width))
        j = e.sub(pos, e.index(self.width))
        at_j = [*self.channel, j]
        flag = e.if_(has_chunk, [i32], lambda ie: [_poll(ie, self.args["flags"], at_j)],
                     lambda ie: [ie.const(INCLUSIVE, i32)])[0]
        waiting = bg.warp_any(e, e.cmp("eq", flag, e.const(0, i32)), self.width)
        types = [v.type for v in vals]
        return list(e.if_(waiting, types, lambda ie: vals, lambda ie: self._fold(ie, vals, flag, has_chunk, at_j)))

    def _fold(self, e: Emitter, vals: list[SSAValue], flag: SSAValue, has_chunk: SSAValue,
              at_j: list[SSAValue]) -> list[SSAValue]:
        """Lanes before the latest INCLUSIVE one are identity, it is (0, its state),
        later lanes their aggregates; their composition in lane (time) order is the
        window's: its b is the state after the window when an INCLUSIVE lane exists."""
        q, sa, sb, carry, _ = vals
        args, pairs, agg_t, width = self.args, self.pairs, self.agg_t, self.width
        lane32 = e.val(arith.IndexCastOp(self.lane, i32))
        minus1 = e.const(-1, i32)
        inclusive = e.cmp("eq", flag, e.const(INCLUSIVE, i32))
        latest = _warp_max(e, e.val(arith.SelectOp(inclusive, lane32, minus1)), width)

        def state(ie: Emitter) -> list[SSAValue]:
            s = ie.if_(has_chunk, [agg_t], lambda je: [je.load(args["incl"], at_j)], lambda je: [self.init])[0]
            return [pairs.zero(ie), s]

        def aggregate_or_identity(ie: Emitter) -> list[SSAValue]:
            later = ie.cmp("sgt", lane32, latest)
            return list(ie.if_(later, [agg_t, agg_t],
                               lambda je: [je.load(args["agg_a"], at_j), je.load(args["agg_b"], at_j)],
                               lambda je: list(pairs.identity(je))))

        pair = e.if_(e.cmp("eq", lane32, latest), [agg_t, agg_t], state, aggregate_or_identity)
        scanned = bg.warp_inclusive_scan(e, bg.pair_list_combine(pairs), list(pair), width)
        wa, wb = (bg.shuffle(e, "idx", v, width - 1, width)[0] for v in scanned)
        found = e.cmp("sge", latest, e.const(0, i32))
        done = [q, sa, sb, pairs.apply(e, sa, wb, sb), e.const(1, IntegerType(1))]
        further = [e.sub(q, e.index(width)), *pairs.combine(e, (wa, wb), (sa, sb)), carry, e.const(0, IntegerType(1))]
        return [e.val(arith.SelectOp(found, x, y)) for x, y in zip(done, further)]


def _exact_fallback(e: Emitter, args: dict[str, SSAValue], channel: list[SSAValue], k: SSAValue,
                    carry: SSAValue) -> SSAValue:
    """A float carry composed from aggregates that is not finite: the predecessor's
    exact last state instead, once it is published (chunk 0 keeps `init`)."""
    if isinstance(carry.type, IntegerType):
        return carry

    def exact_predecessor(ie: Emitter) -> list[SSAValue]:
        at_prev = [*channel, ie.sub(k, ie.index(1))]
        _while(ie, [], lambda ce, v: ce.cmp("ne", _poll(ce, args["flags"], at_prev), ce.const(INCLUSIVE, i32)),
               lambda be, v: [])
        return [ie.load(args["incl"], at_prev)]

    fallback = e.val(arith.AndIOp(bg.any_not_finite(e, [carry]), e.cmp("ne", k, e.index(0))))
    return e.if_(fallback, [carry.type], exact_predecessor, lambda ie: [carry])[0]


class _AffineLookback(atb._AffineTimeBlocks):
    """The reset and look-back launches replacing one `scan.affine` (module doc)."""

    def __init__(self, op: scan.AffineOp, kmod: gpu.ModuleOp, bs: int, ipt: int):
        super().__init__(op, kmod, bs, ipt, 1)
        self.base = bg._unique_name(kmod, "scan_affine_lb")

    def lower(self) -> None:
        self._scratch_buffers()
        self._number_scratch()
        kernels = (self._reset_kernel(), self._lookback_kernel())
        self._launch(kernels)
        Rewriter.erase_op(self.op)

    def _scratch_buffers(self) -> None:
        """Counter (1), then flags, aggregates a and b, inclusive states (channels x chunks)."""
        super()._scratch_buffers()
        host, agg_mt = self.host, self.agg_a.type
        assert isinstance(agg_mt, MemRefType)
        for buf in (self.carries, self.chan_final):  # the reduce-then-scan's, unused here
            Rewriter.erase_op(buf.owner)  # type: ignore[arg-type]
        sizes = list(self.agg_a.owner.operands)  # type: ignore[union-attr]
        self.counter = host.val(memref.AllocOp([], [], MemRefType(i32, [1])))
        self.flags = host.val(memref.AllocOp(sizes, [], MemRefType(i32, agg_mt.get_shape())))
        self.incl = host.val(memref.AllocOp(sizes, [], agg_mt))
        self.scratch = [self.counter, self.flags, self.agg_a, self.agg_b, self.incl]

    def _reset_kernel(self) -> gpu.FuncOp:
        """Kernel 1: zero the counter and this channel's flags."""
        kmod, bs, rank = self.kmod, self.bs, self.rank
        name = f"{self.base}_reset"
        names, values = ["a", "counter", "flags"], [self.op.a, self.counter, self.flags]
        kf, args, e = atb._new_kernel(kmod, name, names, [v.type for v in values])
        tid, bid = bg._thread_id(e), bg._block_id(e)
        zero = e.const(0, i32)
        n = atb._host_chunks(e, e.dim(args["a"], self.axis), self.chunk)
        channel = bg.channel_indices(e, args["flags"], rank - 1, bid)
        e.for_(tid, n, e.index(bs), [], lambda le, i, _: le.store(zero, args["flags"], [*channel, i]))
        first = e.val(arith.AndIOp(e.cmp("eq", tid, e.index(0)), e.cmp("eq", bid, e.index(0))))
        e.if_(first, [], lambda ie: ie.store(zero, args["counter"], [ie.index(0)]))
        e.op(gpu.ReturnOp([]))
        flag_entries = tuple([self.entry("a", i) for i in self.channel_dims] + [self.chunk_count("a")])
        grid = self.grid("a", False)
        return self.describe(kf, grid, {"a": self.op.a}, names, ["in", "out", "out"], values, 0,
                             "scan.affine look-back 1/2: zero the ticket counter and chunk flags",
                             scratch=(("counter", (1,)), ("flags", flag_entries)))

    def _lookback_kernel(self) -> gpu.FuncOp:
        """Kernel 2: one chunk per block, in ticket order (module doc)."""
        op, kmod, bs, state_t, agg_t = self.op, self.kmod, self.bs, self.state_t, self.agg_t
        name = f"{self.base}_lookback"
        slots = bg.tile_slots(state_t, bs)
        tiles_shared = atb.tile_shared(kmod, name, state_t, slots)
        agg_slots = max(bg.tile_slots(agg_t, bs), 1)
        sh_agg = bg.shared_global(kmod, f"{name}_gA", agg_t, agg_slots)
        bg.shared_global(kmod, f"{name}_gB", agg_t, agg_slots)
        sh_ticket = bg.shared_global(kmod, f"{name}_ticket", i32, 1)
        sh_carry = bg.shared_global(kmod, f"{name}_carry", state_t, 1)
        init, final = ([op.init] if op.init else []), ([op.final] if op.final else [])
        names = ["a", "b"] + (["init"] if init else []) + ["h"] + (["final"] if final else []) + [
            "counter", "flags", "agg_a", "agg_b", "incl"]
        values = [op.a, op.b] + init + [op.h] + final + self.scratch
        kinds = ["in", "in"] + (["in"] if init else []) + ["out"] + (["out"] if final else []) + [
            "inout", "inout", "inout", "inout", "inout"]  # status words: written, then read by later blocks
        kf, args, e = atb._new_kernel(kmod, name, names, [v.type for v in values])
        shared = {"tiles": tiles_shared, "agg": sh_agg, "ticket": sh_ticket, "carry": sh_carry}
        _emit_lookback(e, args, name, self, shared)
        e.op(gpu.ReturnOp([]))
        grid = self.grid("h", True)
        return self.describe(kf, grid, {"h": op.h}, names, kinds, values, _shared_bytes(state_t, agg_t, bs),
                             (f"scan.affine look-back 2/2: axis {self.axis}{' reverse' if self.reverse else ''}; "
                              f"{state_t} state, {agg_t} aggregates; block_size={bs} items_per_thread={self.ipt} "
                              f"chunk={self.chunk}"),
                             equal_dims=self.equal_to_h(names),
                             scratch=tuple((n, tuple(self.agg_shape_entries())) for n in ("agg_a", "agg_b", "incl")))

    def agg_shape_entries(self) -> list[int | str]:
        return [self.entry("h", i) for i in self.channel_dims] + [self.chunk_count("h")]


def _shared_bytes(state_t: Attribute, agg_t: Attribute, bs: int) -> int:
    """The kernel's static shared memory in declaration order: the chained tiles' sA, sB
    (warp totals) and sC, the aggregate's warp totals gA, gB, the ticket and the carry
    (LLVM drops globals a kernel does not use: no warp totals in one warp)."""
    from scanweaver.rewrites.gpu_kernel import shared_layout_bytes

    size, agg_size = bg.byte_size(state_t), bg.byte_size(agg_t)
    slots, agg_slots = bg.tile_slots(state_t, bs), bg.tile_slots(agg_t, bs)
    sizes = [slots * size] * 2 if slots else []
    if bs > bg.WARP or bg.needs_overflow_guard(state_t, bs):
        sizes.append(size)
    sizes += [agg_slots * agg_size] * 2 if agg_slots else []
    return shared_layout_bytes([*sizes, 4, size])


def _emit_lookback(e: Emitter, args: dict[str, SSAValue], name: str, lb: _AffineLookback, shared: dict) -> None:
    state_t, agg_t, axis, bs, chunk = lb.state_t, lb.agg_t, lb.axis, lb.bs, lb.chunk
    pairs = bg.GuardedPairArith(state_t) if bg.needs_overflow_guard(state_t, bs) else PairArith(state_t)
    agg_pairs = PairArith(agg_t)
    tid = bg._thread_id(e)
    thread0 = e.cmp("eq", tid, e.index(0))
    s_ticket = e.val(memref.GetGlobalOp(f"{name}_ticket", shared["ticket"]))
    s_carry = e.val(memref.GetGlobalOp(f"{name}_carry", shared["carry"]))

    def take_ticket(ie: Emitter) -> None:
        ie.store(_atomic(ie, _ADDI, ie.const(1, i32), args["counter"], [ie.index(0)]), s_ticket, [ie.index(0)])

    e.if_(thread0, [], take_ticket)
    e.op(gpu.BarrierOp())
    ticket = e.val(arith.IndexCastOp(e.load(s_ticket, [e.index(0)]), e.index(0).type))
    length = e.dim(args["h"], axis)
    n = atb._host_chunks(e, length, chunk)
    c_lin, k = e.divu(ticket, n), e.remu(ticket, n)
    channel = bg.channel_indices(e, args["h"], axis, c_lin)
    t_begin = e.mul(k, e.index(chunk))
    t_end = e.val(arith.MinUIOp(length, e.add(t_begin, e.index(chunk))))
    s_ga = e.val(memref.GetGlobalOp(f"{name}_gA", shared["agg"]))
    s_gb = e.val(memref.GetGlobalOp(f"{name}_gB", shared["agg"]))

    def entry(le: Emitter, vals: list[SSAValue]) -> SSAValue:
        """The carry of this chunk, from its pairs (already in registers)."""
        wide = [atb._to(le, v, agg_t) for v in vals]
        agg = (wide[0], wide[1])
        for i in range(2, len(wide), 2):
            agg = agg_pairs.combine(le, agg, (wide[i], wide[i + 1]))
        total = atb._warp_tile_total(le, agg_pairs, tid, le.index(0), agg, s_ga, s_gb, bs)

        def look_back(ie: Emitter) -> None:
            init = ie.load(args["init"], channel) if "init" in args else pairs.zero(ie)  # one warp reads it
            walk = _LookBack(args, channel, k, atb._to(ie, init, agg_t), agg_pairs, tid, width)
            carry = walk.emit(ie, total)

            def broadcast(je: Emitter) -> None:
                exact = _exact_fallback(je, args, channel, k, carry)
                je.store(atb._to(je, exact, state_t), s_carry, [je.index(0)])

            ie.if_(ie.cmp("eq", tid, ie.index(0)), [], broadcast)

        width = min(bs, bg.WARP)
        le.if_(le.cmp("ult", tid, le.index(width)), [], look_back)
        le.op(gpu.BarrierOp())
        return le.load(s_carry, [le.index(0)])

    last = bg.emit_chained_tiles(e, pairs, args, name, channel, axis, shared["tiles"], lb.reverse, bs, lb.ipt,
                                 t_begin, t_end, None, tid=tid, length=length, prefetch=True, entry=entry)

    def publish(ie: Emitter) -> None:
        at_k = [*channel, k]
        ie.store(atb._to(ie, last, agg_t), args["incl"], at_k)
        _raise_flag(ie, INCLUSIVE, args["flags"], at_k)
        if "final" in args:
            is_last = ie.cmp("eq", k, ie.sub(n, ie.index(1)))
            ie.if_(is_last, [], lambda je: je.store(last, args["final"], channel))

    e.if_(thread0, [], publish)


def asks_lookback(op: scan.AffineOp) -> bool:
    """The op's `scanweaver.gpu_strategy` attribute asks for this strategy
    (`affine_time_blocks.ask_time_blocks(..., "lookback")`)."""
    choice = op.attributes.get(TIME_BLOCKS_ATTR)
    return getattr(choice, "data", "") == "lookback"


def lower_affine_lookback(op: scan.AffineOp, kmod: gpu.ModuleOp, bs: int, ipt: int) -> None:
    """Replace `op` by the two launches of the module doc; state types `gpu.shuffle`
    cannot move take the reduce-then-scan of `affine_time_blocks` instead."""
    h_t = op.h.type
    assert isinstance(h_t, MemRefType)
    if not bg.shuffles(h_t.element_type):
        atb.lower_affine_time_blocks(op, kmod, bs, ipt, 16)
        return
    _AffineLookback(op, kmod, bs, ipt).lower()


__all__ = ["AGGREGATE", "INCLUSIVE", "lower_affine_lookback"]
