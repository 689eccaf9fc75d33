"""Loop reshapes that bring a recurrence into a form `raise_analysis` takes, tried by
`scanweaver-raise` only on loops the analysis refused (see `raise_affine.py`).

Each reshape inserts a rewritten copy of the loop nest before the original and returns
it (`Reshaped`); the caller analyses the new time loop and erases either the copy
(still refused: `undo`) or the original (raised).  A reshape preserves what every
memory location holds afterwards, under the raise's assumption that distinct memref
SSA values do not alias.

- `interchange_channel_loop`: `for t { for c { B } }` -> `for c { for t { B } }`, for
  a multi-lag recurrence written time-outer / channel-inner
  (`y[t, c] = a1[c]*y[t-1, c] + a2[c]*y[t-2, c] + x[t, c]`): scan.linear_recurrence
  has no channel dimension, but with the channel loop outside each channel is one
  series.  Legal when every memref the channel body writes is indexed by the channel
  index, at one position, in every access inside the time loop: distinct channels then
  touch distinct elements, so no dependence crosses channels and the order of the
  (t, c) iterations within one channel is unchanged.
- `promote_memory_state`: state kept at several fixed memref locations (scipy's `zi`,
  a transposed direct form II filter `z[0], z[1]`), or at one location whose previous
  value escapes the update, becomes `iter_args`: loaded before the loop, carried, and
  stored back after it.  The iter_args analysis then treats an escaping output as an
  extra state component.  Indices that are not constants inside a static shape
  (`z[c, 0]` in a channel loop) are guarded: the hoisted loads and the final stores
  run only when the loop runs.  With the state per channel and the time loop outside,
  the loops are interchanged first (`interchange_then_promote`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.dialects import arith, memref, scf
from xdsl.dialects.builtin import IndexType, IntegerAttr, MemRefType
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.rewrites.loop_utils import const_scalar, inside


def _index_const(v: SSAValue) -> int | None:
    op = v.owner
    if isinstance(op, arith.ConstantOp) and isinstance(op.value.type, IndexType):  # type: ignore[union-attr]
        return op.value.value.data  # type: ignore[union-attr]
    return None


# ---------------------------------------------------------------------------
# Interchange: for t { for c { B } }  ->  for c { for t { B } }
# ---------------------------------------------------------------------------


def _single_channel_loop(loop: scf.ForOp) -> scf.ForOp | None:
    """The one scf.for in the time-loop body, when everything else there is a pure op
    without regions or a load, and the channel loop carries nothing and has invariant
    bounds."""
    chans = [op for op in loop.body.block.ops if isinstance(op, scf.ForOp)]
    if loop.iter_args or len(chans) != 1:
        return None
    chan = chans[0]
    if chan.iter_args or any(inside(v, loop) for v in (chan.lb, chan.ub, chan.step)):
        return None
    for op in loop.body.block.ops:
        if op is chan or isinstance(op, scf.YieldOp | memref.LoadOp):
            continue
        if op.regions or not is_side_effect_free(op):
            return None
    return chan


def _channels_are_independent(loop: scf.ForOp, chan: scf.ForOp) -> bool:
    """Every memref the channel body writes is accessed in the time loop only by loads
    and stores inside the channel loop, all indexed by the channel index at one
    position (so a load outside the channel loop reads memory the nest never writes)."""
    civ = chan.body.block.args[0]
    written: dict[SSAValue, int | None] = {}
    for op in chan.body.walk():
        if isinstance(op, memref.StoreOp):
            written[op.memref] = None
        elif isinstance(op, memref.LoadOp | scf.ForOp | scf.IfOp | scf.YieldOp):
            continue
        elif op.regions or not is_side_effect_free(op):
            return False
    for m in written:
        if inside(m, loop):
            return False
        for use in m.uses:
            op = use.operation
            if not loop.is_ancestor(op):
                continue
            if not isinstance(op, memref.LoadOp | memref.StoreOp) or not chan.is_ancestor(op):
                return False
            pos = [k for k, x in enumerate(op.indices) if x is civ]
            if len(pos) != 1 or written[m] not in (None, pos[0]):
                return False
            written[m] = pos[0]
    return True


def interchange_channel_loop(loop: scf.ForOp) -> Reshaped | None:
    """Insert `for c { for t { ... } }` before `loop` and return its time loop, or None
    when the nest is not a perfect time/channel nest whose channels are independent."""
    chan = _single_channel_loop(loop)
    if chan is None or not _channels_are_independent(loop, chan):
        return None
    index = IndexType()
    mapper: dict[SSAValue, SSAValue] = {}
    time_body = Block(arg_types=[index])
    mapper[loop.body.block.args[0]] = time_body.args[0]
    chan_body = Block(arg_types=[index])
    mapper[chan.body.block.args[0]] = chan_body.args[0]
    for old, new in mapper.items():
        new.name_hint = old.name_hint
    for op in loop.body.block.ops:
        if op is not chan and not isinstance(op, scf.YieldOp):
            time_body.add_op(op.clone(mapper))
    for op in chan.body.block.ops:
        if not isinstance(op, scf.YieldOp):
            time_body.add_op(op.clone(mapper))
    time_body.add_op(scf.YieldOp())
    new_time = scf.ForOp(loop.lb, loop.ub, loop.step, [], Region(time_body))
    chan_body.add_ops([new_time, scf.YieldOp()])
    new_chan = scf.ForOp(chan.lb, chan.ub, chan.step, [], Region(chan_body))
    Rewriter.insert_op(new_chan, InsertPoint.before(loop))
    return Reshaped(new_time, [new_chan])


# ---------------------------------------------------------------------------
# Promotion: state at fixed memref locations -> iter_args
# ---------------------------------------------------------------------------


def _location_key(m: SSAValue, indices) -> tuple:
    return (m, tuple(_index_const(x) if _index_const(x) is not None else x for x in indices))


def _provably_in_bounds(m: SSAValue, key: tuple) -> bool:
    """Constant indices inside a static shape."""
    t = m.type
    if not isinstance(t, MemRefType):
        return False
    shape = t.get_shape()
    return all(
        isinstance(i, int) and 0 <= i < d for i, d in zip(key[1], shape, strict=True)
    )


def _provably_distinct(k1: tuple, k2: tuple) -> bool:
    """Two locations of one memref that differ in a constant index (`z[c, 0]`, `z[c, 1]`)."""
    return any(
        isinstance(i, int) and isinstance(j, int) and i != j
        for i, j in zip(k1[1], k2[1], strict=True)
    )


def _promotable_locations(loop: scf.ForOp) -> list[tuple] | None:
    """The memref locations stored in the time-loop body (its own block) at
    loop-invariant indices, when they are pairwise distinct and each memref touched
    there is touched only at those locations, in that block, by loads and stores;
    None otherwise."""
    body = loop.body.block
    keys: list[tuple] = []
    for op in body.ops:
        if (
            isinstance(op, memref.StoreOp)
            and not inside(op.memref, loop)
            and all(not inside(x, loop) or _index_const(x) is not None for x in op.indices)
        ):
            key = _location_key(op.memref, op.indices)
            if key not in keys:
                keys.append(key)
    # a location only stored (an output such as y[c] rewritten every step) is not state:
    # promoting it would make its value an iter_arg that the update does not need
    loaded = {_location_key(op.memref, op.indices) for op in body.ops if isinstance(op, memref.LoadOp)}
    keys = [k for k in keys if k in loaded]
    if not keys:
        return None
    for k1 in keys:
        for k2 in keys:
            if k1 is not k2 and k1[0] is k2[0] and not _provably_distinct(k1, k2):
                return None  # z[%k], z[%k1]: may be one element
    for m in {k[0] for k in keys}:
        for use in m.uses:
            op = use.operation
            if not loop.is_ancestor(op):
                continue
            if not isinstance(op, memref.LoadOp | memref.StoreOp) or op.parent_block() is not body:
                return None
            if _location_key(m, op.indices) not in keys:
                return None
    return keys


class _Guard:
    """`scf.if lb < ub` around the hoisted loads and the final stores, when an index
    is not provably in bounds: the loop reads them only when it runs, and so must the
    reshaped code (no access outside an array the loop would not make)."""

    def __init__(self, loop: scf.ForOp, needed: bool, at: InsertPoint, inserted: list[Operation]):
        self.cond: SSAValue | None = None
        if needed:
            cmp = arith.CmpiOp(loop.lb, loop.ub, "slt")
            Rewriter.insert_op(cmp, at)
            inserted.append(cmp)
            self.cond = cmp.result

    def load(self, m: SSAValue, idx: list[SSAValue], at: InsertPoint, inserted: list[Operation]) -> SSAValue:
        if self.cond is None:
            ld = memref.LoadOp.get(m, idx)
            Rewriter.insert_op(ld, at)
            inserted.append(ld)
            return ld.res
        el = m.type.element_type  # type: ignore[attr-defined]
        then = Block()
        ld = memref.LoadOp.get(m, idx)
        then.add_ops([ld, scf.YieldOp(ld.res)])
        other = Block()
        zero = const_scalar(Builder(InsertPoint.at_end(other)), 0, el)
        other.add_op(scf.YieldOp(zero))
        op = scf.IfOp(self.cond, [el], Region(then), Region(other))
        Rewriter.insert_op(op, at)
        inserted.append(op)
        return op.results[0]

    def store(self, v: SSAValue, m: SSAValue, idx: list[SSAValue], at: InsertPoint, inserted: list[Operation]) -> None:
        st = memref.StoreOp.get(v, m, idx)
        if self.cond is None:
            Rewriter.insert_op(st, at)
            inserted.append(st)
            return
        op = scf.IfOp(self.cond, [], Region(Block([st, scf.YieldOp()])))
        Rewriter.insert_op(op, at)
        inserted.append(op)


def promote_memory_state(loop: scf.ForOp) -> Reshaped | None:
    """Insert before `loop` the same loop with its memory state carried as iter_args
    (loads before it, stores of the results after it) and return it; None when the
    state locations are not all fixed, distinct and touched only in the loop's block."""
    if loop.iter_args:
        return None
    keys = _promotable_locations(loop)
    if keys is None:
        return None
    at = InsertPoint.before(loop)
    inserted: list[Operation] = []
    guard = _Guard(loop, not all(_provably_in_bounds(k[0], k) for k in keys), at, inserted)
    inits = []
    index_of: dict[tuple, list[SSAValue]] = {}
    for op in loop.body.block.ops:
        if isinstance(op, memref.StoreOp):
            index_of.setdefault(_location_key(op.memref, op.indices), list(op.indices))
    for key in keys:
        m = key[0]
        idx = [_hoisted_index(v, loop, at, inserted) for v in index_of[key]]
        inits.append(guard.load(m, idx, at, inserted))
    el_types = [v.type for v in inits]
    body = Block(arg_types=[IndexType(), *el_types])
    mapper: dict[SSAValue, SSAValue] = {loop.body.block.args[0]: body.args[0]}
    body.args[0].name_hint = loop.body.block.args[0].name_hint
    current = {key: body.args[1 + k] for k, key in enumerate(keys)}
    for op in loop.body.block.ops:  # the carried values keep the names of their loads
        if isinstance(op, memref.LoadOp) and (key := _location_key(op.memref, op.indices)) in current:
            current[key].name_hint = current[key].name_hint or op.res.name_hint
    for op in loop.body.block.ops:
        if isinstance(op, scf.YieldOp):
            continue
        if isinstance(op, memref.LoadOp | memref.StoreOp) and not inside(op.memref, loop):
            key = _location_key(op.memref, op.indices)
            if key in current:
                if isinstance(op, memref.LoadOp):
                    mapper[op.res] = current[key]
                else:
                    current[key] = mapper.get(op.value, op.value)
                continue
        body.add_op(op.clone(mapper))
    body.add_op(scf.YieldOp(*[current[k] for k in keys]))
    new = scf.ForOp(loop.lb, loop.ub, loop.step, inits, Region(body))
    Rewriter.insert_op(new, at)
    inserted.append(new)
    for key, res in reversed(list(zip(keys, new.results))):
        idx = [_hoisted_index(v, loop, InsertPoint.before(new), inserted) for v in index_of[key]]
        guard.store(res, key[0], idx, InsertPoint.after(new), inserted)
    return Reshaped(new, inserted)


def interchange_then_promote(loop: scf.ForOp) -> Reshaped | None:
    """Both reshapes: `for t { for c { z[c, 0] ... } }` (lfilter's zi per channel,
    written time-outer) -> `for c { for t (iter_args) }`."""
    outer = interchange_channel_loop(loop)
    if outer is None:
        return None
    inner = promote_memory_state(outer.loop)
    if inner is None:
        outer.undo()
        return None
    outer.loop.detach()  # replaced by the promoted loop, inside the new channel loop
    outer.loop.erase()
    return Reshaped(inner.loop, outer.inserted)


def _hoisted_index(v: SSAValue, loop: scf.ForOp, at: InsertPoint, inserted: list[Operation]) -> SSAValue:
    """A constant index defined inside the loop, recreated before it."""
    if not inside(v, loop):
        return v
    c = _index_const(v)
    assert c is not None
    op = arith.ConstantOp(IntegerAttr(c, IndexType()))
    Rewriter.insert_op(op, at)
    inserted.append(op)
    return op.result


@dataclass
class Reshaped:
    """A reshape's result: the new time loop, and every op inserted before the
    original (to erase them if the new loop is still not raised)."""

    loop: scf.ForOp
    inserted: list[Operation]
    # run before the original is erased: points its results' uses at the new loops'
    commit: Callable[[], None] = lambda: None

    def undo(self) -> None:
        for op in reversed(self.inserted):
            op.detach()
            op.erase()
