"""The associative raise's host copies around a `scan.scan`, recognised for the GPU.

`raise_assoc.py` raises `h = op(h, x[t])` (a running max / min / and / or / xor, a
tuple such as the online log-sum-exp's (m, s)) to, per operand j of k,

    X_j = alloc(n + 1); P_j = alloc(n + 1)
    X_j[0] = h0_j
    for t < n: X_j[t + 1] = map(x[t])_j         (producer: a copy, or pure ops: (x, 1.0))
    scan.scan ins(X..) outs(P..) axis 0 { op }
    for t < n: y[t] = P_j[t + 1]                (consumer: a copy; none for some or all j)
    r_j = P_j[n]; dealloc X.., P..              (after gpu-results-to-args: result_j[] = r_j)

The CUDA runtime runs no host loops and allocates no temporaries.  By associativity
P[t + 1] = h0 (+) inclusive_scan(map(x))[t] and P[n] is the last of them (h0 when
n == 0), so the whole group is one scan of map(x) into the y's, *seeded* with h0
(combined on the left of every prefix, the loop's order), that also writes its last
values to the results.  `match_seeded` recognises exactly that group and nothing wider
(a result the host uses, a consumer that computes, a producer with side effects or
values from outside other than those `_outside_value` allows keep the refusal);
values the producer uses from above it (constants, dims, pure arith, scalar function
arguments, loads before it from memrefs the kernel does not write) are cloned into the
kernel, the function arguments they start from passed as kernel arguments
(`captures`); `scan_gpu.py` (one block)
or `scan_time_blocks.py` (the seed in every chunk's carry) emits the seeded kernels,
cloning `map` into the kernel's load, and `erase_host_copies` removes the group's host
ops.  State kept in memory (the promote reshape's `h0 = m[i]` before and `m[i] = r`
after, both perhaps under its guard `if 0 < n`) is matched too (`seed_at`, `final_at`):
the kernel loads m[i] itself before its first barrier and the thread of the last step
stores r to it (nothing for n == 0, nor where a dynamic size leaves m[i] out of
bounds); m may have no other use but `memref.dim`.  In time blocks
(`scan_time_blocks.py`) the chunk kernel reads m[i] (chunk 0 scans from it) and only
the carry kernel, a later launch, writes it.

Per channel (`m[c] = op(m[c], x[c, t])`, either loop order: the promote reshape puts
the channel loop outside) the group is the whole body of a host loop
`for c = 0 to C step 1`, C a constant or `memref.dim` of an argument, or of the
innermost loop of a perfect nest of such loops (`m[b, c]` over `x[b, c, t]`, any
depth; `channel_loops`, `channel_trips`, outermost first).  Like the scan kernels'
channels (one block per channel, `blelloch_gpu.channel_indices`) and the loop nests'
(`gpu_nest.py`: the grid is the product of the channel loops' trip counts, the block
id delinearised row-major over them, `covers_dims` checks the arrays they index), the
nest becomes the grid: the kernel maps (b, c) to its block id delinearised over the
trip counts (innermost fastest; `scan_gpu.channel_values`, in `argmap`), so the seed
load m[b, c], the producer's loads x[b, c, t] (the channel variables in nest order, t
at any one place: `time_axis`), the consumers' stores y[b, c, t] and the final store
m[b, c] all index by them; the launch (guarded by B * C > 0) replaces the nest, and
checks that every array indexed by a channel variable covers that loop's count
(`channel_covers`; a constant count needs static sizes of at least it).  A product of
constant counts over 2^31 - 1 (gridDim.x's limit) is refused; a dynamic one the CUDA
runtime checks at launch.  Channels are independent: every array the group writes is
indexed by every channel variable, nothing else in the innermost loop has effects
(`_body_is_the_group`) and the outer loops hold only the next one and pure ops
(`_only_the_loop`).  Imperfect nests, other bounds and steps, and a constant count
over a dynamic size keep the refusal, the reason named (`why`); time blocks keep one
block per channel for this form.

The seeded form exists only inside the GPU lowering (no new op or operand), so
the interpreter, scan-to-loops and the CPU lowering are untouched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects.builtin import Float32Type, Float64Type, IndexType, IntegerType, MemRefType
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.rewriter import Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.rewrites.gpu_kernel import const_int


@dataclass
class SeededScan:
    """`dsts[j] = (seeds (+) inclusive_scan(map(srcs)))_j` and `finals[j][] = last_j`.

    `map` is the producer's body: pure ops from `srcs[..][t]` to the element tuple
    (`elements`), cloned into the kernel's load by `clone_elements`.  A `dsts[j]` or
    `finals[j]` of None is not written (the log-sum-exp pair has no output array)."""

    srcs: list[SSAValue]  # 1-D memref function arguments the producer reads at [t]
    producer: scf.ForOp  # for t < n { ...; X_j[t + 1] = elements[j] }
    elements: list[SSAValue]  # per operand, the value the producer stores (in or above its body)
    dsts: list[SSAValue | None]  # per operand, a 1-D memref function argument, written
    seeds: list[SSAValue]  # per operand, a scalar function argument or an arith.constant
    finals: list[SSAValue | None]  # per operand, a rank-0 memref function argument (a result)
    host_ops: list[Operation]  # the copies, allocs, stores and loads to erase
    #: function arguments the producer's values from above it start from (scalars of
    #: kernel types, memrefs read by `memref.dim` / a load before the group): kernel arguments
    captures: list[SSAValue] = field(default_factory=list)
    outside_loads: list[memref.LoadOp] = field(default_factory=list)  # read again in the kernel
    #: per operand, None (a rank-0 result) or the element of `finals[j]` the last value
    #: is stored to: state kept in memory (`m[i] = P_j[n]`), left as it was for n == 0
    final_at: list[tuple[int, ...] | None] = field(default_factory=list)
    #: per operand, None or the element of a memref argument the seed is loaded from
    #: (`seeds[j]` is then that host load; the kernel loads it itself)
    seed_at: list[tuple[int, ...] | None] = field(default_factory=list)
    #: per operand, for a seed loaded under the guard `0 < n`: the constant it takes
    #: otherwise (the kernel loads only when n > 0 and the element is in bounds)
    seed_else: list[SSAValue | None] = field(default_factory=list)
    seed_memref: list[SSAValue | None] = field(default_factory=list)  # the memref of seed_at
    #: per channel (`m[c]`, `m[b, c]`): the perfect nest of host loops `for c = 0 to C
    #: step 1` around the group, outermost first, their trip counts (an int, or (memref
    #: argument, dim)) and the dimension of the arrays that is time (the others are the
    #: channel variables, in nest order); in `seed_at` / `final_at` they stand for themselves
    channel_loops: list[scf.ForOp] = field(default_factory=list)
    channel_trips: list[int | tuple[SSAValue, int]] = field(default_factory=list)
    time_axis: int = 0
    #: (array, dim, loop number) triples a channel variable indexes, other than its trip's
    #: own: each size must be at least that loop's trip count (the launch checks the dynamic ones)
    channel_covers: list[tuple[SSAValue, int, int]] = field(default_factory=list)

    @property
    def channel_loop(self) -> scf.ForOp | None:
        """The outermost host channel loop (the launch replaces it), or None."""
        return self.channel_loops[0] if self.channel_loops else None

    @property
    def channels(self) -> list[SSAValue]:
        """The host channel loops' induction variables, outermost first (in the kernel,
        the block id delinearised over their trip counts)."""
        return [loop.body.block.args[0] for loop in self.channel_loops]

    @property
    def ref(self) -> SSAValue:
        """The array whose length is the scan's (the launch checks the others equal)."""
        return next((d for d in self.dsts if d is not None), self.srcs[0])

    def clone_elements(self, e, t: SSAValue, argmap: dict[SSAValue, SSAValue]) -> list[SSAValue]:
        """The element tuple of step `t`, emitted at `e` (an `Emitter`) from the kernel's
        copies (`argmap`) of `srcs`: the producer's body, its stores left out."""
        body = self.producer.body.block
        m: dict[SSAValue, SSAValue] = {body.args[0]: t, **{s: argmap[s] for s in self.srcs}}

        def outside(v: SSAValue) -> SSAValue:
            """A value from above the loop (checked by the match): a capture's kernel
            argument, or its defining op cloned after its own operands."""
            if v not in m:
                if v in argmap:
                    m[v] = argmap[v]
                else:
                    o = v.owner
                    assert isinstance(o, Operation), v
                    for x in o.operands:
                        outside(x)
                    c = e.op(o.clone(value_mapper=m))
                    m.update(zip(o.results, c.results))
            return m[v]

        for o in body.ops:
            if isinstance(o, memref.StoreOp | scf.YieldOp):
                continue
            for v in o.operands:
                outside(v)
            e.op(o.clone(value_mapper=m))
        return [outside(v) for v in self.elements]


def _strip(v: SSAValue) -> SSAValue:
    """`v` with identity index arithmetic removed: x + 0, 0 + x, x * 1, 1 * x, x - 0,
    ceildiv(x, 1) and max(x, 0) (this last one only where x is a `memref.dim`, >= 0)."""
    while True:
        o = v.owner
        if isinstance(o, arith.AddiOp | arith.MuliOp):
            unit = 0 if isinstance(o, arith.AddiOp) else 1
            if const_int(o.lhs) == unit:
                v = o.rhs
                continue
            if const_int(o.rhs) == unit:
                v = o.lhs
                continue
        if isinstance(o, arith.SubiOp | arith.CeilDivUIOp) and const_int(o.rhs) == (
            0 if isinstance(o, arith.SubiOp) else 1
        ):
            v = o.lhs
            continue
        if isinstance(o, arith.MaxSIOp) and const_int(o.rhs) == 0 and _nonnegative(_strip(o.lhs)):
            v = o.lhs
            continue
        return v


def _nonnegative(v: SSAValue) -> bool:
    c = const_int(v)
    return isinstance(v.owner, memref.DimOp) or (c is not None and c >= 0)


def _is_plus_one(v: SSAValue, x: SSAValue) -> bool:
    o = v.owner
    return isinstance(o, arith.AddiOp) and (
        (_strip(o.lhs) is x and const_int(o.rhs) == 1) or (_strip(o.rhs) is x and const_int(o.lhs) == 1)
    )


def _dim_of(v: SSAValue, axis: int) -> SSAValue | None:
    o = _strip(v).owner
    if isinstance(o, memref.DimOp) and const_int(o.index) == axis:
        return o.source
    return None


def _func_arg(v: SSAValue, fn: func.FuncOp, rank: int | None) -> bool:
    if not (isinstance(v, BlockArgument) and v.owner is fn.body.block):
        return False
    return rank is None or (isinstance(v.type, MemRefType) and v.type.get_num_dims() == rank)


def _is_kernel_scalar(t) -> bool:
    """A type the CUDA runtime passes as a scalar kernel parameter (not f16/bf16/i1)."""
    if isinstance(t, IntegerType):
        return t.width.data in (8, 16, 32, 64)
    return isinstance(t, Float32Type | Float64Type | IndexType)


def _counted(loop: Operation | None, n: SSAValue) -> bool:
    """`for j = 0 to n step 1` without iter_args."""
    return (
        isinstance(loop, scf.ForOp) and not loop.iter_args and loop.ub is n
        and const_int(loop.lb) == 0 and const_int(loop.step) == 1
    )


def _copy_loop(loop: Operation | None, n: SSAValue) -> tuple[memref.LoadOp, memref.StoreOp] | None:
    """`for j = 0 to n step 1 { v = load A[..]; store v, B[..] }` plus pure index
    arithmetic: its (load, store), or None."""
    if not _counted(loop, n):
        return None
    loads = [o for o in loop.body.block.ops if isinstance(o, memref.LoadOp)]  # type: ignore[union-attr]
    stores = [o for o in loop.body.block.ops if isinstance(o, memref.StoreOp)]  # type: ignore[union-attr]
    pure = (arith.ConstantOp, arith.AddiOp, arith.MuliOp, scf.YieldOp)
    if len(loads) != 1 or len(stores) != 1 or stores[0].value is not loads[0].res:
        return None
    if any(not isinstance(o, pure) for o in loop.body.block.ops if o not in (loads[0], stores[0])):  # type: ignore[union-attr]
        return None
    if len(loads[0].indices) != 1 or len(stores[0].indices) not in (1, 2):  # y[t], or y[c, t] / y[t, c]
        return None
    return loads[0], stores[0]


def _outside_value(
    v: SSAValue, fn: func.FuncOp, captures: list[SSAValue], loads: list[memref.LoadOp], channels: Sequence[SSAValue] = ()
) -> bool:
    """Whether the kernel can rebuild `v`, a value from above the producer: a constant,
    a scalar function argument of a kernel type (`captures`), `memref.dim` of a memref
    argument, pure arith of such values, or a load of a memref argument in the
    function's body (`loads`; `match_seeded` checks that nothing writes it), or the
    channel loops' variables `channels` (from the kernel's block id)."""
    if any(v is c for c in channels):
        return True
    if _func_arg(v, fn, None):
        if not (isinstance(v.type, MemRefType) or _is_kernel_scalar(v.type)):
            return False
        if v not in captures:
            captures.append(v)
        return True
    o = v.owner
    if not isinstance(o, Operation) or o.regions:
        return False
    if isinstance(o, arith.ConstantOp):
        return True
    if isinstance(o, memref.DimOp | memref.LoadOp):
        if not _func_arg(o.operands[0], fn, None) or o.parent_block() is not fn.body.block:
            return False
        if isinstance(o, memref.LoadOp) and o not in loads:
            loads.append(o)
    elif not (o.dialect_name() == "arith" and is_side_effect_free(o)):
        return False
    return all(_outside_value(x, fn, captures, loads, channels) for x in o.operands)


def _indexes(indices, iv: SSAValue, channels: Sequence[SSAValue]) -> int | None:
    """The position of `iv` among `indices`: [t] or, per channel, the channel variables
    in nest order with t anywhere among them ([c, t] / [t, c], [b, c, t], ...); or None."""
    idx = [_strip(i) for i in indices]
    pos = [p for p, x in enumerate(idx) if x is iv]
    if len(idx) != len(channels) + 1 or len(pos) != 1:
        return None
    rest = idx[: pos[0]] + idx[pos[0] + 1 :]
    return pos[0] if all(x is c for x, c in zip(rest, channels)) else None


def _producer(loop: Operation | None, n: SSAValue, xs: list[SSAValue], fn: func.FuncOp, channels: Sequence[SSAValue]):
    """`for t < n { pure ops on loads srcs[t]; X_j[t + 1] = v_j }` (per channel: loads
    srcs[c, t], or all srcs[t, c]), one store per X_j: (srcs, [v_j], stores, captures,
    outside loads, the time position) or None.  Values from above the loop must be ones
    `_outside_value` allows."""
    if not _counted(loop, n):
        return None
    assert isinstance(loop, scf.ForOp)
    body = loop.body.block
    iv = body.args[0]
    srcs: list[SSAValue] = []
    captures: list[SSAValue] = []
    loads: list[memref.LoadOp] = []
    stores: dict[SSAValue, memref.StoreOp] = {}
    axes: set[int | None] = set()
    for o in body.ops:
        if isinstance(o, scf.YieldOp):
            continue
        if isinstance(o, memref.StoreOp):
            if o.memref not in xs or o.memref in stores or len(o.indices) != 1 or not _is_plus_one(o.indices[0], iv):
                return None
            stores[o.memref] = o
            operands = [o.value]
        elif isinstance(o, memref.LoadOp):
            axes.add(_indexes(o.indices, iv, channels))
            if not _func_arg(o.memref, fn, 1 + len(channels)) or len(axes) != 1 or None in axes:
                return None
            if o.memref not in srcs:
                srcs.append(o.memref)
            operands = list(o.indices)
        elif o.regions or not is_side_effect_free(o) or any(isinstance(v.type, MemRefType) for v in o.operands):
            return None
        else:
            operands = list(o.operands)
        for v in operands:  # defined in the body, or rebuilt in the kernel from above it
            inside = v is iv or isinstance(v.owner, Operation) and v.owner.parent_block() is body
            if not (inside or _outside_value(v, fn, captures, loads, channels)):
                return None
    if len(stores) != len(xs) or not srcs:
        return None
    return srcs, [stores[x].value for x in xs], list(stores.values()), captures, loads, axes.pop()


def _state_element(
    o: Operation | None, fn: func.FuncOp, block: Block, guarded: bool = False, channels: Sequence[SSAValue] = ()
) -> tuple[int | SSAValue, ...] | None:
    """State kept in memory: `o` a load or store of `m[i..]` in `block`, `m` a memref
    argument, the indices constants in its static bounds (so the kernel's access cannot
    leave the array; a dynamic size, allowed only `guarded`, the kernel checks), and per
    channel each channel variable once (their bounds `match_seeded` checks): the indices, or None."""
    if not isinstance(o, memref.LoadOp | memref.StoreOp) or o.parent_block() is not block:
        return None
    t = o.memref.type
    if not _func_arg(o.memref, fn, None) or not isinstance(t, MemRefType) or not o.indices:
        return None
    if isinstance(o, memref.LoadOp) and not _is_kernel_scalar(o.res.type):
        return None
    at = [_strip(i) if any(_strip(i) is c for c in channels) else const_int(i) for i in o.indices]
    if any(sum(i is c for i in at) != 1 for c in channels):
        return None
    shape = t.get_shape()
    for i, d in zip(at, shape):
        if isinstance(i, SSAValue):
            continue
        if i is None or i < 0 or (d < 0 and not guarded) or (d >= 0 and i >= d):
            return None
    return tuple(at)  # type: ignore[arg-type]


def _runs_guard(cond: SSAValue, n: SSAValue) -> bool:
    """`cond` is `0 < n` (the promote reshape's guard: the loop runs at least once)."""
    o = cond.owner
    return (
        isinstance(o, arith.CmpiOp) and o.predicate.value.data in (2, 6)  # slt, ult
        and const_int(o.lhs) == 0 and _strip(o.rhs) is _strip(n)
    )


def _seed_state(seed: SSAValue, fn: func.FuncOp, block: Block, n: SSAValue, channels: Sequence[SSAValue]):
    """A seed read from state kept in memory: `m[i]` loaded in `block`, or under the
    guard `scf.if 0 < n { m[i] } else { constant }`: (the host op to erase, the load,
    its indices, the else constant or None), or None."""
    o = seed.owner
    if isinstance(o, memref.LoadOp):
        at = _state_element(o, fn, block, channels=channels)
        return None if at is None else (o, o, at, None)
    if not (isinstance(o, scf.IfOp) and o.parent_block() is block and len(o.results) == 1 and _runs_guard(o.cond, n)):
        return None
    then_ops, else_ops = list(o.true_region.block.ops), list(o.false_region.block.ops) if o.false_region.blocks else []
    if len(then_ops) != 2 or not isinstance(then_ops[1], scf.YieldOp) or then_ops[1].operands[0] is not then_ops[0].results[0]:
        return None
    at = _state_element(then_ops[0], fn, o.true_region.block, guarded=True, channels=channels)
    if at is None or not else_ops or not isinstance(else_ops[-1], scf.YieldOp):
        return None
    other = else_ops[-1].operands[0]
    if not isinstance(other.owner, arith.ConstantOp) or any(x is not other.owner for x in else_ops[:-1]):
        return None
    return o, then_ops[0], at, other


def _final_state(st: memref.StoreOp, fn: func.FuncOp, block: Block, n: SSAValue, channels: Sequence[SSAValue]):
    """The last value stored to state kept in memory: `m[i] = r` in `block`, or under
    the guard `scf.if 0 < n { m[i] = r }`: (the host op to erase, its indices), or None."""
    if st.parent_block() is block:
        at = _state_element(st, fn, block, channels=channels)
        return None if at is None else (st, at)
    g = st.parent_op()
    if not (isinstance(g, scf.IfOp) and g.parent_block() is block and not g.results and _runs_guard(g.cond, n)):
        return None
    ops = list(g.true_region.block.ops)
    if len(ops) != 2 or ops[0] is not st or (g.false_region.blocks and len(list(g.false_region.block.ops)) > 1):
        return None
    at = _state_element(st, fn, g.true_region.block, guarded=True, channels=channels)
    return None if at is None else (g, at)


def _state_stays_private(
    seed_ops: list[Operation], accesses: list[Operation], op: scan.ScanOp, group: set[Operation]
) -> bool:
    """The memrefs of state kept in memory are used only by the seeds' loads and the final
    stores (`accesses`: the kernel reads them at its start and writes them at its end:
    nothing else may see them in between), and nothing between a seed's host op and `op`
    writes memory."""
    state = {o.memref for o in accesses}  # type: ignore[attr-defined]
    if any(u.operation not in accesses and not isinstance(u.operation, memref.DimOp) for m in state for u in m.uses):
        return False
    block = op.parent_block()
    assert block is not None
    ops = list(block.ops)
    for s in seed_ops:
        for o in ops[ops.index(s) + 1 : ops.index(op)]:  # the other seeds only read
            if o not in group and o not in seed_ops and not (is_side_effect_free(o) or isinstance(o, memref.LoadOp)):
                return False
    return True


def _loads_stay_valid(loads: list[memref.LoadOp], op: Operation, group: set[Operation], written: set[SSAValue]) -> bool:
    """The producer's loads from above it read the same in the kernel (which runs where
    `op` is): the kernel writes none of their memrefs, and nothing between a load and
    `op` but the group's own ops (which write only its temporaries) writes memory."""
    block = op.parent_block()
    assert block is not None
    ops = list(block.ops)
    for ld in loads:
        if ld.memref in written:
            return False
        for o in ops[ops.index(ld) + 1 : ops.index(op)]:
            if o not in group and not (is_side_effect_free(o) or isinstance(o, memref.LoadOp)):
                return False
    return True


def _consumers(op: scan.ScanOp, n: SSAValue, ps: list[SSAValue], fn: func.FuncOp, channels: Sequence[SSAValue], axis: int):
    """After the scan, copy loops y[t] = P_j[t + 1] (at most one per operand; per
    channel y[c, t] or y[t, c], time at the sources' `axis`): (dsts, the loops, their
    loads) or None."""
    dsts: list[SSAValue | None] = [None] * len(ps)
    consumers: list[Operation] = []
    c_loads: list[memref.LoadOp] = []
    nxt = op.next_op
    while (cons := _copy_loop(nxt, n)) is not None:
        c_load, c_store = cons
        iv_c = nxt.body.block.args[0]  # type: ignore[union-attr]
        if c_load.memref not in ps or dsts[ps.index(c_load.memref)] is not None:
            return None
        if not _is_plus_one(c_load.indices[0], iv_c) or _indexes(c_store.indices, iv_c, channels) != axis:
            return None
        if not _func_arg(c_store.memref, fn, 1 + len(channels)) or c_store.memref in dsts:  # a dst that is a src: in place, fine
            return None
        dsts[ps.index(c_load.memref)] = c_store.memref
        consumers.append(nxt)  # type: ignore[arg-type]
        c_loads.append(c_load)
        nxt = nxt.next_op  # type: ignore[union-attr]
    return dsts, consumers, c_loads


#: gridDim.x's limit: the product of the channel loops' trip counts must stay below it
MAX_BLOCKS = 2**31 - 1


def _channel_loops(
    op: scan.ScanOp, why: list[str]
) -> tuple[list[scf.ForOp], func.FuncOp | None, list[int | tuple[SSAValue, int]]]:
    """The group's host loops over channels, outermost first: `op` in a perfect nest of
    `for c = 0 to C step 1` (C a constant or `memref.dim` of a memref argument, the
    constant counts' product in [1, MAX_BLOCKS]) in the function's body, or directly in
    the body (no loop, one channel): (loops, function, trip counts); the function None
    (and the reason in `why`) for anything else."""
    loops: list[scf.ForOp] = []
    trips: list[int | tuple[SSAValue, int]] = []
    parent = op.parent_op()
    while isinstance(parent, scf.ForOp):
        if loops and not _only_the_loop(parent, loops[-1]):
            why.append("the channel loops must be perfectly nested (a loop's body holds only the next loop)")
            return [], None, []
        loops.append(parent)
        parent = parent.parent_op()
    if not isinstance(parent, func.FuncOp):
        why.append("the host loops over channels must be directly in the function")
        return [], None, []
    loops.reverse()
    fn = parent
    for loop in loops:
        if loop.iter_args or loop.results:
            why.append("a host loop over channels carries values")
            return [], None, []
        trip = const_int(loop.ub)
        d = loop.ub.owner
        if not (const_int(loop.lb) == 0 and const_int(loop.step) == 1 and isinstance(loop.lb.type, IndexType)):
            trip = d = None
        if trip is not None and trip > 0:
            trips.append(trip)
        elif isinstance(d, memref.DimOp) and _func_arg(d.source, fn, None) and const_int(d.index) is not None:
            trips.append((d.source, const_int(d.index)))  # type: ignore[arg-type]
        else:
            why.append("the channel loop must run from 0 step 1 to a constant >= 1 or the memref.dim of an argument")
            return [], None, []
    static = [t for t in trips if isinstance(t, int)]
    if math.prod(static) > MAX_BLOCKS:  # (dynamic counts: the launch checks the grid)
        why.append("the channel loops' constant trip counts multiply to more than 2^31 - 1 blocks")
        return [], None, []
    return loops, fn, trips


def _only_the_loop(outer: scf.ForOp, inner: scf.ForOp) -> bool:
    """`outer`'s body is `inner` and pure ops without regions (index arithmetic)."""
    return all(o is inner or isinstance(o, scf.YieldOp) or (is_side_effect_free(o) and not o.regions)
               for o in outer.body.block.ops)


def _channel_covers(
    trips: list[int | tuple[SSAValue, int]], indexed: list[tuple[SSAValue, int, int]]
) -> list[tuple[SSAValue, int, int]] | None:
    """The (array, dim, loop) triples indexed by a channel variable that the launch must
    check to be at least that loop's trip count; None where that cannot be (a constant
    count over a dynamic or shorter size: nothing would check it)."""
    out: list[tuple[SSAValue, int, int]] = []
    for a, d, j in dict.fromkeys(indexed):
        size = a.type.get_shape()[d]  # type: ignore[attr-defined]
        trip = trips[j]
        if isinstance(trip, int):
            if size < trip:  # dynamic (-1) or too short
                return None
        elif (a, d) != trip:
            out.append((a, d, j))
    return out


def _body_is_the_group(loop: scf.ForOp, op: scan.ScanOp, host_ops: list[Operation]) -> bool:
    """Per channel, the loop's body holds only the group and pure ops (index arithmetic,
    the guard): with the group erased, the loop does nothing and goes too."""
    group = set(host_ops) | {op}
    return all(o in group or isinstance(o, scf.YieldOp) or (is_side_effect_free(o) and not o.regions)
               for o in loop.body.block.ops)


def match_seeded(op: scan.ScanOp, why: list[str] | None = None) -> SeededScan | None:
    """The seeded scan the group around `op` computes (module doc), or None; where a
    host channel loop is what keeps it from matching, the reason is added to `why`."""
    why = [] if why is None else why
    k = len(op.inputs)
    if len(op.outputs) != k or op.axis_value != 0 or op.is_reverse:
        return None
    xs, ps = list(op.inputs), list(op.outputs)
    if len(set(xs) | set(ps)) != 2 * k:
        return None
    block = op.parent_block()
    loops, fn, trips = _channel_loops(op, why)
    if fn is None or not isinstance(block, Block):
        return None
    channels = [loop.body.block.args[0] for loop in loops]
    allocs = [v.owner for v in (*xs, *ps)]
    if not all(isinstance(a, memref.AllocOp) and a.parent_block() is block and len(a.dynamic_sizes) == 1 for a in allocs):
        return None
    if xs[0].type.get_num_dims() != 1:  # type: ignore[attr-defined]
        return None
    m = allocs[0].dynamic_sizes[0]  # type: ignore[union-attr]
    if any(a.dynamic_sizes[0] is not m for a in allocs) or not isinstance(m.owner, arith.AddiOp):  # type: ignore[union-attr]
        return None
    n = m.owner.lhs if const_int(m.owner.rhs) == 1 else m.owner.rhs if const_int(m.owner.lhs) == 1 else None
    if n is None or any(_depends_on(n, c) for c in channels):
        return None
    # X_j[0] = seed_j (k stores, then the producer); X_j[t + 1] = map(srcs[t])_j
    producer = op.prev_op
    prod = _producer(producer, n, xs, fn, channels)
    if prod is None:
        return None
    srcs, elements, p_stores, captures, outside_loads, axis = prod
    inits: dict[SSAValue, memref.StoreOp] = {}
    o = producer.prev_op  # type: ignore[union-attr]
    while isinstance(o, memref.StoreOp) and o.memref in xs and o.memref not in inits and len(inits) < k:
        inits[o.memref] = o
        o = o.prev_op
    if len(inits) != k or any(len(s.indices) != 1 or const_int(s.indices[0]) != 0 for s in inits.values()):
        return None
    seeds = [inits[x].value for x in xs]
    states = [_seed_state(seed, fn, block, n, channels) for seed in seeds]
    for seed, state in zip(seeds, states):
        if not (_func_arg(seed, fn, None) and _is_kernel_scalar(seed.type) or isinstance(seed.owner, arith.ConstantOp)
                or state is not None):
            return None
    cons = _consumers(op, n, ps, fn, channels, axis)
    if cons is None:
        return None
    dsts, consumers, c_loads = cons
    # n is the length of a source or destination (the launch checks that all are
    # equal), or a constant equal to all their static lengths
    arrays = [*srcs, *(d for d in dsts if d is not None)]
    length = const_int(_strip(n))
    if length is not None:
        if any(v.type.get_shape()[axis] != length for v in arrays):  # type: ignore[attr-defined]
            return None
    elif _dim_of(n, axis) not in arrays:
        return None
    host_ops: list[Operation] = [*inits.values(), producer, *consumers]  # type: ignore[list-item]
    expected: set[Operation] = {*inits.values(), *p_stores, op, *c_loads}
    last = _last_values(ps, c_loads, fn, block, n, host_ops, expected, channels)
    if last is None:
        return None
    finals, final_at, final_stores = last
    # every use of the temporaries is one of the group's
    deallocs = [u.operation for v in (*xs, *ps) for u in v.uses if isinstance(u.operation, memref.DeallocOp)]
    expected.update(deallocs)
    if {u.operation for v in (*xs, *ps) for u in v.uses} != expected:
        return None
    if all(d is None for d in dsts) and all(f is None for f in finals):
        return None  # nothing observable: leave it to the sequential lowering
    written = {v for v in (*dsts, *finals) if v is not None}
    # (per channel, checked up to the loop: its body holds only the group, `_fold_channel_loops`)
    if not _loads_stay_valid(outside_loads, loops[0] if loops else op, {*inits.values(), producer, *allocs}, written):  # type: ignore[arg-type]
        return None
    seed_ops = list(dict.fromkeys(st[0] for st in states if st is not None))
    accesses = [*(st[1] for st in states if st is not None), *final_stores]
    if not _state_stays_private(seed_ops, accesses, op, {*inits.values(), producer, *allocs}):  # type: ignore[arg-type]
        return None
    host_ops += [o for o in seed_ops if all(u.operation in host_ops for r in o.results for u in r.uses)]
    host_ops += [*deallocs, *allocs]  # type: ignore[list-item]
    covers: list[tuple[SSAValue, int, int]] | None = []
    if loops:
        covers = _fold_channel_loops(loops, trips, op, arrays, accesses, axis, host_ops, captures, why)
        if covers is None:
            return None
    return SeededScan(srcs, producer, elements, dsts, seeds, finals, host_ops,  # type: ignore[arg-type]
                      captures, outside_loads, final_at, [None if st is None else st[2] for st in states],
                      [None if st is None else st[3] for st in states],
                      [None if st is None else st[1].memref for st in states],  # type: ignore[union-attr]
                      loops, trips, axis, covers or [])


def _fold_channel_loops(
    loops, trips, op, arrays, accesses, axis, host_ops, captures, why
) -> list[tuple[SSAValue, int, int]] | None:
    """Per channel: whether the host loop nest can be the grid (else None, the reason in
    `why`), and the (array, dim, loop) sizes the launch must check.  Channels run at once,
    one block each: every array is indexed by every channel variable (the match of each
    access), so no channel reads what another writes; the trip counts bound them."""
    channels = [loop.body.block.args[0] for loop in loops]
    indexed: list[tuple[SSAValue, int, int]] = []
    for a in arrays:  # the channel variables in nest order, time at `axis`
        dims = [d for d in range(len(channels) + 1) if d != axis]
        indexed += [(a, d, j) for j, d in enumerate(dims)]
    for acc in accesses:
        idx = [_strip(i) for i in acc.indices]
        indexed += [(acc.memref, next(p for p, x in enumerate(idx) if x is c), j) for j, c in enumerate(channels)]
    covers = _channel_covers(trips, indexed)
    if covers is None:
        why.append("a constant channel count indexes an array whose size there is dynamic or smaller")
        return None
    if not _body_is_the_group(loops[-1], op, host_ops):
        why.append("the channel loop does more than the scan's group (the kernel replaces the whole loop)")
        return None
    for t in trips:
        if not isinstance(t, int) and t[0] not in captures:
            captures.append(t[0])  # the grid's size: passed for the launch description
    return covers


def _depends_on(v: SSAValue, x: SSAValue) -> bool:
    """Whether `v` is `x` or computed from it."""
    if v is x:
        return True
    o = v.owner
    return isinstance(o, Operation) and any(_depends_on(a, x) for a in o.operands)


def _last_values(ps, c_loads, fn, block, n, host_ops, expected, channels=()):
    """The last values P_j[n]: unused, or stored once to a rank-0 argument used by
    nothing else, or to the state in memory (`m[i]`, perhaps guarded); adds the ops it
    matched to `host_ops` / `expected`. Returns (finals, final_at, final_stores) or None."""
    k = len(ps)
    finals: list[SSAValue | None] = [None] * k
    final_at: list[tuple[int, ...] | None] = [None] * k
    final_stores: list[Operation] = []
    for j, p in enumerate(ps):
        last = [u.operation for u in p.uses if isinstance(u.operation, memref.LoadOp) and u.operation not in c_loads]
        if len(last) > 1:
            return None
        if not last:
            continue
        fl = last[0]
        if fl.parent_block() is not block or list(fl.indices) != [n]:
            return None
        expected.add(fl)
        r_uses = list(fl.res.uses)
        if r_uses:
            st = r_uses[0].operation
            if len(r_uses) != 1 or not isinstance(st, memref.StoreOp) or st.value is not fl.res:
                return None
            host_st: Operation = st
            if st.indices:  # the state in memory, m[i] = P_j[n] (perhaps guarded)
                fs = _final_state(st, fn, block, n, channels)
                if fs is None:
                    return None
                host_st, final_at[j] = fs
                final_stores.append(st)
            elif not _func_arg(st.memref, fn, 0) or len(list(st.memref.uses)) != 1:
                return None
            finals[j] = st.memref
            host_ops.append(host_st)
        host_ops.append(fl)
    return finals, final_at, final_stores


def erase_host_copies(seeded: SeededScan) -> None:
    """Remove the group's host ops once the seeded kernel's launch replaces the scan (per
    channel, the channel loop with them: the launch's grid runs it)."""
    for o in seeded.host_ops:
        Rewriter.erase_op(o)
    if seeded.channel_loop is not None:
        Rewriter.erase_op(seeded.channel_loop)
    for ld in seeded.outside_loads:  # the kernel reads them itself; the host keeps only launches
        if not ld.res.uses:
            Rewriter.erase_op(ld)


__all__ = ["SeededScan", "erase_host_copies", "match_seeded"]
