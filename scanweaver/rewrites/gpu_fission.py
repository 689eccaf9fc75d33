"""Loop fission before `scan-to-gpu`'s recurrence kernels: one scan op per channel nest.

A channel loop whose body runs two recurrences one after the other (two EMAs of the
same input written as two time loops in one `scf.for %c`) is split into two channel
loops over the same range, each holding one of them, so that each becomes an ordinary
nest for `recurrence_gpu.py` / `linear_gpu.py`; the outer channel loops of a 3-D
nest are split the same way afterwards.  The split runs the first part for every
channel before the second part starts, which keeps the result when:

* the second part needs no value of the first except ones it can compute again
  (constants, pure arith on values from outside the loop, loads from memrefs the loop
  never writes): those are cloned into it;
* the body touches memory only by loads and stores (no views, copies or calls), and
  no memref that one part writes is accessed by the other part except at elements of
  the same channel: every access of it in both parts is indexed by the channel
  variable at one common dimension (channel c's second part then sees exactly the
  writes of channel c's first part, as before).

A loop that fails these stays as it is (the nest lowering then names why).
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import memref, scf
from xdsl.dialects.builtin import MemRefType, ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.rewrites.gpu_kernel import defined_inside, free_values


def holds_scan_op(op: Operation) -> bool:
    return any(o.dialect_name() == "scan" and o.name != "scan.yield" for o in op.walk())


def _accesses(ops: Sequence[Operation]) -> dict[SSAValue, list[tuple[Sequence[SSAValue], bool]]]:
    """memref -> [(indices, is_store)] of every load and store in `ops`."""
    out: dict[SSAValue, list[tuple[Sequence[SSAValue], bool]]] = {}
    for top in ops:
        for o in top.walk():
            if isinstance(o, (memref.LoadOp, memref.StoreOp)):
                out.setdefault(o.memref, []).append((o.indices, isinstance(o, memref.StoreOp)))
    return out


def _same_channel_only(first: Sequence[Operation], second: Sequence[Operation], iv: SSAValue) -> bool:
    """Whether every memref shared by the parts, and written by one, is accessed only
    at the channel's own elements (indexed by `iv` at one common dimension)."""
    a, b = _accesses(first), _accesses(second)
    for ref in a.keys() & b.keys():
        both = a[ref] + b[ref]
        if not any(is_store for _, is_store in both):
            continue
        common = set.intersection(*({p for p, x in enumerate(idx) if x == iv} for idx, _ in both))
        if not common:
            return False
    return True


def _plain_memory(ops: Sequence[Operation]) -> bool:
    """Whether `ops` touch memory only by loads and stores of memrefs they do not make
    views of (so `_accesses` sees every element they touch)."""
    for top in ops:
        for o in top.walk():
            local = isinstance(o, (memref.AllocaOp, memref.AllocOp, memref.DeallocOp))  # a part's own buffers
            if any(isinstance(r.type, MemRefType) for r in o.results) and not local:
                return False
            if not (
                local
                or isinstance(o, (memref.LoadOp, memref.StoreOp, scf.ForOp, scf.IfOp, scf.YieldOp))
                or o.dialect_name() == "scan"
                or is_side_effect_free(o)
            ):
                return False
    return True


def _recomputable(v: SSAValue, inside: set[SSAValue], written: set[SSAValue]) -> bool:
    """Whether the second part can compute `v` (defined by the first) again itself."""
    if v not in inside:
        return True
    op = v.owner
    if not isinstance(op, Operation) or op.regions:
        return False
    pure = is_side_effect_free(op) or (isinstance(op, memref.LoadOp) and op.memref not in written)
    return pure and not isinstance(op, memref.AllocaOp) and all(_recomputable(x, inside, written) for x in op.operands)


def find_cut(loop: scf.ForOp) -> tuple[int | None, str]:
    """Where to split `loop`'s body: (the first position after its first scan-holding
    op that leaves a scan-holding op on both sides and passes the module doc's checks,
    ""), or (None, why no position does)."""
    ops = list(loop.body.block.ops)[:-1]
    holders = [i for i, o in enumerate(ops) if holds_scan_op(o)]
    if len(holders) < 2:
        return None, "it holds one scan op"
    if not _plain_memory(ops):
        return None, "an op touches memory other than by loads and stores"
    iv = loop.body.block.args[0]
    written = {ref for ref, acc in _accesses(ops).items() if any(st for _, st in acc)}
    why = ""
    for s in range(holders[0] + 1, holders[1] + 1):
        first, second = ops[:s], ops[s:]
        inside = defined_inside(first)
        if not all(_recomputable(v, inside, written) for v in free_values(second)):
            why = why or "the later scan op uses a value the earlier part computes (e.g. its final state)"
        elif not _same_channel_only(first, second, iv):
            why = "one part reads or writes another channel's elements of a memref the other part writes"
        else:
            return s, ""
    return None, why


def split_refusal(loop: scf.ForOp) -> str:
    """Why `loop`, holding several scan ops, stays one nest (for the refusal reason)."""
    return find_cut(loop)[1]


def _split(loop: scf.ForOp, s: int) -> scf.ForOp:
    """A new loop after `loop` over the same range running its body's ops from `s` on
    (with the values they need from before `s` computed again); those ops leave `loop`."""
    ops = list(loop.body.block.ops)[:-1]
    first, second = ops[:s], ops[s:]
    body = Block(arg_types=[loop.body.block.args[0].type])
    vmap: dict[SSAValue, SSAValue] = {loop.body.block.args[0]: body.args[0]}
    inside = defined_inside(first)
    needed: list[Operation] = []

    def need(v: SSAValue) -> None:
        op = v.owner
        if v in inside and v not in vmap and isinstance(op, Operation) and op not in needed:
            for x in op.operands:
                need(x)
            needed.append(op)

    for v in free_values(second):
        need(v)
    for op in [*needed, *second]:
        body.add_op(op.clone(value_mapper=vmap))
    body.add_op(scf.YieldOp())
    new = scf.ForOp(loop.lb, loop.ub, loop.step, [], body)
    Rewriter.insert_op(new, InsertPoint.after(loop))
    for op in reversed(second):
        Rewriter.erase_op(op)
    return new


def split_recurrence_nests(module: ModuleOp) -> None:
    """Split channel loops (no iter_args) holding more than one scan op, innermost
    first, until every such loop holds one (or cannot be split)."""
    work = [o for o in module.walk() if isinstance(o, scf.ForOp) and not o.iter_args]
    work.reverse()  # inner loops come after their outer ones in a walk
    while work:
        loop = work.pop(0)
        s, _ = find_cut(loop)
        if s is not None:
            work.insert(0, _split(loop, s))
            work.insert(1, loop)
            parent = loop.parent_op()
            if isinstance(parent, scf.ForOp) and not parent.iter_args and parent not in work:
                work.append(parent)


__all__ = ["find_cut", "holds_scan_op", "split_recurrence_nests", "split_refusal"]
