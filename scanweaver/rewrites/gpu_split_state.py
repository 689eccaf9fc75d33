"""Before the GPU recurrence kernel: a diagonal state too large for registers becomes channels.

`scan.recurrence` updates every state element on its own (`state[k] = a * state[k] + b`
with `a, b = coeffs(i, *k)`), so a state of dynamic shape (`memref<?xf32>`: an EMA over
a dynamic number of series, time-outer / channel-inner loops) or of more than
`recurrence_gpu.MAX_STATE` elements is a set of independent scalar recurrences, one per
element.  The only thing that ties the elements together is the emit region; when it
reads the state element by element in one loop nest over the state's dimensions

    emit { ^bb0(%t, %s):  scf.for %c = 0 to dim(%s, 0) { %v = load %s[%c]; store %v, %y[%t, %c] } }

it splits too.  `split_state(rec)` then rewrites

    scan.recurrence lb to ub state(%S : memref<?xT>) coeffs {^(t, k): ...} emit {...}

into a loop over the elements, each with a rank-0 state (the form `recurrence_gpu.py`
makes one block per channel of):

    scf.for %c = 0 to dim(%S, 0) {
      %s = memref.alloca() : memref<T>
      %s[] = %S[%c]                                  (or the copy-in loop's body, see below)
      scan.recurrence lb to ub state(%s) coeffs {^(t): ... k := %c} emit {^(t, %s2): loop body, %c, %s2[]}
      %S[%c] = %s[]                                  (a function-argument state only)
    }

A state that is a `memref.alloca` of the recurrence's block (the raise's temporary for
a state slice of another memref) must be used only by the recurrence and by one copy-in
loop nest before it (`%tmp[c] = f(c)`, loops from 0 to the alloca's sizes); the nest's
body becomes each channel's initialisation.  Sequential meaning is unchanged: the
elements never interact; the emit runs per (step, element) in another order, which is
the same only where its writes are independent: the kernel lowering checks that (one
element per step, or step-invariant, indexed by the channel), and a split it refuses is
undone (`SplitState.undo`).  What does not have this shape raises `Unsupported` with the
reason, before anything is changed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith, memref, scf
from xdsl.dialects.builtin import IndexType, MemRefType
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.rewrites.gpu_kernel import Unsupported, const_int

__all__ = ["SplitState", "StateDims", "needs_split", "split_state"]


def needs_split(rec: scan.LoopRecurrence, max_state: int) -> bool:
    """A diagonal (`scan.recurrence`) state the register kernel cannot hold."""
    st = rec.state_type
    if not isinstance(rec, scan.RecurrenceOp) or st.get_num_dims() == 0:
        return False
    return not st.has_static_shape() or math.prod(st.get_shape()) > max_state


def _loop_nest(op: Operation, depth: int) -> list[scf.ForOp] | None:
    """`op` as a perfect nest of `depth` plain `scf.for` loops (0 to ?, step 1), outermost first."""
    loops: list[scf.ForOp] = []
    cur: Operation = op
    for level in range(depth):
        if not isinstance(cur, scf.ForOp) or cur.iter_args or const_int(cur.lb) != 0 or const_int(cur.step) != 1:
            return None
        loops.append(cur)
        if level + 1 < depth:
            inner = list(cur.body.block.ops)
            if len(inner) != 2 or not isinstance(inner[1], scf.YieldOp):
                return None
            cur = inner[0]
    return loops


class _Dims:
    """Whether a value is the size of dimension i of the state (a constant equal to it,
    `memref.dim` of the state operand or the emit's block argument, or the alloca's size)."""

    def __init__(self, rec: scan.RecurrenceOp):
        self.rec = rec
        self.refs = {rec.state, rec.emit.block.args[1]}
        self.created: list[Operation] = []  # by host_size, uses before definitions
        owner = rec.state.owner
        self.alloca_sizes: list[SSAValue | None] = []
        shape = rec.state_type.get_shape()
        dyn = list(owner.dynamic_sizes) if isinstance(owner, memref.AllocaOp) else []
        for n in shape:
            self.alloca_sizes.append(dyn.pop(0) if n < 0 and dyn else None)

    def size(self, v: SSAValue, i: int) -> bool:
        n = self.rec.state_type.get_shape()[i]
        if n >= 0 and const_int(v) == n:
            return True
        if self.alloca_sizes[i] is not None and v == self.alloca_sizes[i]:
            return True
        op = v.owner
        return isinstance(op, memref.DimOp) and op.source in self.refs and const_int(op.index) == i

    def host_size(self, e_point: InsertPoint, i: int) -> SSAValue:
        """The size of dimension i, made before the recurrence."""
        n = self.rec.state_type.get_shape()[i]
        if n >= 0:
            c = arith.ConstantOp.from_int_and_width(n, IndexType())
            Rewriter.insert_op(c, e_point)
            self.created.append(c)
            return c.result
        if self.alloca_sizes[i] is not None:
            return self.alloca_sizes[i]  # type: ignore[return-value]
        idx = arith.ConstantOp.from_int_and_width(i, IndexType())
        dim = memref.DimOp(self.rec.state, idx.result)
        Rewriter.insert_op([idx, dim], e_point)
        self.created += [dim, idx]
        return dim.result


#: the state-size test, also for the state matrix kernel (`gpu_state_matrix.py`)
StateDims = _Dims


def _element_loads(body: Block, ref: SSAValue, ivs: Sequence[SSAValue], where: str) -> list[memref.LoadOp]:
    """Every use of `ref` (but `memref.dim`) is `memref.load ref[ivs]` right in `body`; those loads."""
    loads = []
    for use in ref.uses:
        o = use.operation
        if isinstance(o, memref.DimOp):
            continue
        if not isinstance(o, memref.LoadOp) or list(o.indices) != list(ivs):
            raise Unsupported(f"{where} reads the state other than element by element in one loop nest over it")
        if o.parent_block() is not body:  # (under an scf.if, say: not taken apart here)
            raise Unsupported(f"{where} reads the state elsewhere than directly in its loop nest over the state")
        loads.append(o)
    return loads


def _copy_in(rec: scan.RecurrenceOp, dims: _Dims) -> tuple[list[scf.ForOp], memref.StoreOp] | None:
    """For an alloca state: the copy-in loop nest before `rec` and its store, else Unsupported."""
    alloca = rec.state.owner
    if not isinstance(alloca, memref.AllocaOp):
        return None
    block = rec.parent_block()
    if alloca.parent_block() is not block:
        raise Unsupported("the state is an alloca of another block than the recurrence's")
    rank = rec.state_type.get_num_dims()
    users = [u.operation for u in rec.state.uses if u.operation is not rec]
    stores = [o for o in users if isinstance(o, memref.StoreOp)]
    if len(stores) != 1 or len(users) != 1:
        raise Unsupported(
            "a state temporary of dynamic shape must be filled by one copy-in loop nest and used by nothing else"
        )
    (store,) = stores
    top: Operation = store
    while top.parent_block() is not block:
        top = top.parent_op()  # type: ignore[assignment]
    loops = _loop_nest(top, rank)
    if loops is None or store.parent_op() is not loops[-1]:
        raise Unsupported("the state temporary's copy-in is not a loop nest over the state from 0 step 1")
    ivs = [lp.body.block.args[0] for lp in loops]
    if list(store.indices) != ivs or not all(dims.size(lp.ub, i) for i, lp in enumerate(loops)):
        raise Unsupported("the state temporary's copy-in does not write each element once")
    src = store.value.owner
    if isinstance(src, memref.LoadOp) and src.memref == rec.state:
        raise Unsupported("the copy-in reads the state")
    body = loops[-1].body.block
    for o in body.walk():
        if o is store or isinstance(o, (memref.LoadOp, scf.YieldOp)):
            continue
        if o.regions or not is_side_effect_free(o):
            raise Unsupported(f"the state temporary's copy-in does '{o.name}'")
    # nothing between the copy-in and the recurrence may write memory
    ops = list(block.ops)
    for o in ops[ops.index(top) + 1 : ops.index(rec)]:
        if not is_side_effect_free(o) and not isinstance(o, memref.LoadOp):
            raise Unsupported(f"'{o.name}' between the state's copy-in and the recurrence writes memory")
    return loops, store


@dataclass
class SplitState:
    """A done split: `rec` the per-element recurrence; `undo()` restores the original
    (the split form is only known to keep the loop's meaning once the kernel lowering
    has proved the emit's writes independent, so a refused split is undone)."""

    rec: scan.RecurrenceOp
    outer: scf.ForOp
    detached: list[tuple[Operation, Operation | None]]  # (op, the op it stood before), in order
    created: list[Operation]

    def drop_unused(self) -> None:
        """After the kernel lowering took the split nest: its host sizes, if now unused."""
        for op in self.created:
            if not any(r.uses for r in op.results):
                Rewriter.erase_op(op)

    def undo(self) -> None:
        for op, before in reversed(self.detached):
            Rewriter.insert_op(op, InsertPoint.before(before if before is not None else self.outer))
        Rewriter.erase_op(self.outer)
        for op in self.created:
            Rewriter.erase_op(op)


def split_state(rec: scan.RecurrenceOp) -> SplitState:
    """Rewrite `rec` (see the module doc) and return the per-element recurrence, or raise
    `Unsupported` leaving the IR as it was."""
    st = rec.state_type
    rank, el = st.get_num_dims(), st.element_type
    dims = _Dims(rec)
    copy_in = _copy_in(rec, dims)
    nest_op, ivs, inner, loads = _emit_state_nest(rec, dims, rank)
    # -- build ------------------------------------------------------------------------------
    where = InsertPoint.before(copy_in[0][0] if copy_in else rec)
    sizes = [dims.host_size(where, i) for i in range(rank)]
    zero = arith.ConstantOp.from_int_and_width(0, IndexType())
    one = arith.ConstantOp.from_int_and_width(1, IndexType())
    Rewriter.insert_op([zero, one], where)
    outer, blocks, channel = _channel_loops(sizes, zero.result, one.result)
    body_of = blocks[-1]
    s = _private_state(body_of, rec, copy_in, channel, el)
    new_c = _split_coeffs(rec, channel)
    new_e = _split_emit(rec, nest_op, inner, ivs, loads, sizes, channel, MemRefType(el, []))
    new = scan.RecurrenceOp(rec.lb, rec.ub, rec.step, s, Region(new_c), Region(new_e))
    body_of.add_op(new)
    if copy_in is None:
        fin = memref.LoadOp.get(s, [])
        body_of.add_op(fin)
        body_of.add_op(memref.StoreOp.get(fin.res, rec.state, channel))
    for b in blocks:
        b.add_op(scf.YieldOp())
    Rewriter.insert_op(outer, InsertPoint.before(rec))
    detached = _detach_originals(rec, copy_in, outer)
    return SplitState(new, outer, detached, [*dims.created, one, zero])


def _emit_state_nest(
    rec: scan.RecurrenceOp, dims: _Dims, rank: int
) -> tuple[Operation, list[SSAValue], Block, list[memref.LoadOp]]:
    """The emit's one loop nest over the state (the other emit ops do not touch it):
    the nest, its induction variables, its innermost body and the state loads there."""
    eblock = rec.emit.block
    s_e = eblock.args[1]
    nest_ops = [o for o in eblock.ops if any(v == s_e for w in o.walk() for v in w.operands)]
    nest_ops = [o for o in nest_ops if not (isinstance(o, memref.DimOp) and o.source == s_e)]
    if len(nest_ops) != 1:
        raise Unsupported("emit reads the state outside one loop nest over it (elements combined)")
    loops = _loop_nest(nest_ops[0], rank)
    if loops is None or not all(dims.size(lp.ub, i) for i, lp in enumerate(loops)):
        raise Unsupported(
            "emit does not read the state in one loop nest from 0 to each state dimension step 1 "
            "(a state of dynamic shape or of more than 64 elements splits into channels only "
            "element by element)"
        )
    ivs = [lp.body.block.args[0] for lp in loops]
    inner = loops[-1].body.block
    loads = _element_loads(inner, s_e, ivs, "emit")
    return nest_ops[0], ivs, inner, loads


def _channel_loops(
    sizes: Sequence[SSAValue], zero: SSAValue, one: SSAValue
) -> tuple[scf.ForOp, list[Block], list[SSAValue]]:
    """One channel loop per state dimension (not yet terminated): the outer loop, the
    loops' bodies and their induction variables."""
    channel: list[SSAValue] = []
    blocks: list[Block] = []
    outer = None
    for i, size in enumerate(sizes):
        b = Block(arg_types=[IndexType()])
        b.args[0].name_hint = f"ch{i}"
        loop = scf.ForOp(zero, size, one, [], b)
        channel.append(b.args[0])
        if blocks:
            blocks[-1].add_op(loop)
        else:
            outer = loop
        blocks.append(b)
    assert outer is not None
    return outer, blocks, channel


def _private_state(
    body_of: Block, rec: scan.RecurrenceOp, copy_in, channel: list[SSAValue], el: Attribute
) -> SSAValue:
    """The channel's scalar state alloca, set from the copy-in loop's value or the state."""
    priv = memref.AllocaOp.get(el, shape=[])
    body_of.add_op(priv)
    s = priv.memref
    if copy_in is not None:
        c_loops, c_store = copy_in
        m = dict(zip([lp.body.block.args[0] for lp in c_loops], channel))
        for o in list(c_loops[-1].body.block.ops)[:-1]:
            if o is c_store:
                body_of.add_op(memref.StoreOp.get(m.get(o.value, o.value), s, []))
            else:
                body_of.add_op(o.clone(value_mapper=m))
    else:
        init = memref.LoadOp.get(rec.state, channel)
        body_of.add_op(init)
        body_of.add_op(memref.StoreOp.get(init.res, s, []))
    return s


def _split_coeffs(rec: scan.RecurrenceOp, channel: list[SSAValue]) -> Block:
    """coeffs: the step and the element index (now the channel)."""
    cblock = rec.coeffs.block
    new_c = Block(arg_types=[IndexType()])
    new_c.args[0].name_hint = cblock.args[0].name_hint
    cm: dict[SSAValue, SSAValue] = {cblock.args[0]: new_c.args[0], **dict(zip(cblock.args[1:], channel))}
    for o in cblock.ops:
        new_c.add_op(o.clone(value_mapper=cm))
    return new_c


def _split_emit(
    rec: scan.RecurrenceOp,
    nest_op: Operation,
    inner: Block,
    ivs: list[SSAValue],
    loads: list[memref.LoadOp],
    sizes: list[SSAValue],
    channel: list[SSAValue],
    scalar_t: MemRefType,
) -> Block:
    """emit: the ops around the nest, the nest's body at the channel, loads -> s2[]."""
    eblock = rec.emit.block
    s_e = eblock.args[1]
    new_e = Block(arg_types=[IndexType(), scalar_t])
    new_e.args[0].name_hint = eblock.args[0].name_hint
    em: dict[SSAValue, SSAValue] = {eblock.args[0]: new_e.args[0], s_e: new_e.args[1], **dict(zip(ivs, channel))}
    for o in eblock.ops:
        if isinstance(o, memref.DimOp) and o.source == s_e:
            em[o.results[0]] = sizes[const_int(o.index)]  # type: ignore[index]
            continue
        if o is not nest_op:
            new_e.add_op(o.clone(value_mapper=em))
            continue
        for x in list(inner.ops)[:-1]:
            if x in loads:
                ld = memref.LoadOp.get(new_e.args[1], [])
                new_e.add_op(ld)
                em[x.results[0]] = ld.res
                continue
            new_e.add_op(x.clone(value_mapper=em))
    return new_e


def _detach_originals(rec: scan.RecurrenceOp, copy_in, outer: scf.ForOp) -> list[tuple[Operation, Operation | None]]:
    """Keep the original ops aside (in block order, each with the op after it) for undo."""
    originals: list[Operation] = [rec]
    if copy_in is not None:
        alloca = rec.state.owner
        assert isinstance(alloca, Operation)
        originals = [alloca, copy_in[0][0], rec]
    moved = set(originals)
    detached = []
    for op in originals:
        nxt = op.next_op
        detached.append((op, None if nxt is None or nxt in moved or nxt is outer else nxt))
    for op in originals:
        op.detach()
    return detached
