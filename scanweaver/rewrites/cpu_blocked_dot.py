"""The readout of a time-blocked recurrence reduced a block of steps at a time.

A selective scan's emit region reads the state out as a dot product, `y = sum_n S[n] *
C[i, n]` (an `scf.for` reduction over the state), then finishes the step's output with
scalar ops and stores it at `out[..., i]`.  The vectoriser turns the reduction into one
`vector.reduction` per step: on x86 four shuffle-and-add levels and a scalar tail each
step (about a fifth of a step's instructions at N = 16).  For a recurrence marked
`BLOCKED_DOT_MARK` whose state has TIME_BLOCK lanes, the time-blocked loop instead keeps
the TIME_BLOCK per-step product vectors and reduces them together (`TreeSums`: 15 vector
adds and 30 shuffles for 16 sums), then runs the ops after the reduction and the store
vectorised over the block's steps.  `TreeSums` adds in the order of the per-step
reduction (lane l with l + N/2, then l + N/4, ...; the start value last), so the blocked
steps give the bits of the remainder steps, which keep the per-step reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import arith, memref, scf
from xdsl.dialects.builtin import Float32Type, VectorType
from xdsl.ir import Operation, SSAValue
from xdsl.traits import IsTerminator, is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.rewrites.cpu_vector_builders import _B, _identity_layout, _shuffle

#: Unit attribute on a scan.recurrence whose emit's dot product may be reduced a time
#: block at a time (set by the selective scan's CPU driver kernel).
BLOCKED_DOT_MARK = "scanweaver.blocked_dot"


@dataclass
class DotPlan:
    """The emit region's reduction over the state, the ops after it and the store."""

    loop: scf.ForOp
    post: list[Operation]
    store: memref.StoreOp


def dot_plan(op: scan.RecurrenceOp, lanes: int, block: int, hoisted: set[Operation],
             is_state_loop) -> DotPlan | None:
    """The plan for `op` (marked, f32, `lanes` == `block`, emit = hoisted ops, one f32
    add-reduction over the state, pure scalar ops, one store at the step), else None."""
    if BLOCKED_DOT_MARK not in op.attributes or lanes != block or not isinstance(op.state_type.element_type, Float32Type):
        return None
    time_arg = op.emit.block.args[0]
    inside = {v for o in op.walk() if o is not op for v in o.results}
    for region in op.regions:
        inside.update(region.block.args)
        for o in region.walk():
            for r in o.regions:
                for blk in r.blocks:
                    inside.update(blk.args)
    loop, post, store = None, [], None
    for o in op.emit.block.ops:
        if o.has_trait(IsTerminator) or o in hoisted:
            continue
        if store is not None:
            return None  # something after the store
        if loop is None:
            if not (isinstance(o, scf.ForOp) and is_state_loop(o) and len(o.results) == 1 and _is_add_reduction(o)):
                return None
            loop = o
        elif isinstance(o, memref.StoreOp):
            store = o
        elif o.regions or o.dialect_name() not in ("arith", "math") or not is_side_effect_free(o) \
                or any(isinstance(r.type, VectorType) or not isinstance(r.type, Float32Type) for r in o.results):
            return None
        else:
            post.append(o)
    if loop is None or store is None:
        return None
    made = {loop.results[0], *(r for o in post for r in o.results)}
    hoisted_values = {r for o in hoisted for r in o.results}
    for o in post:
        if any(v in inside and v not in made and v not in hoisted_values for v in o.operands):
            return None  # a per-step value the blocked form does not have
    indices = list(store.indices)
    if store.value not in made or store.memref in inside or not _identity_layout(store.memref.type) \
            or not indices or indices[-1] is not time_arg or any(v in inside for v in indices[:-1]):
        return None
    if any(isinstance(o, memref.LoadOp) and o.memref is store.memref for o in op.walk()):
        return None  # the output is read back: its stores must stay in step order
    return DotPlan(loop, post, store)


def _is_add_reduction(loop: scf.ForOp) -> bool:
    block = loop.body.block
    acc, yielded = block.args[1], block.last_op.operands[0]  # type: ignore[union-attr]
    owner = yielded.owner
    return isinstance(owner, arith.AddfOp) and acc in owner.operands and len(list(acc.uses)) == 1


class TreeSums:
    """Per-step product vectors (T lanes, T of them) summed lane-wise per vector, in the
    halving-tree order of the per-step `vector.reduction`, the T sums in one vector<T>.

    Level by level: two partials holding g lanes per step combine as shuffle(lo halves)
    + shuffle(hi halves), lane l with l + g/2.  (Combining as soon as two partials exist
    keeps fewer live but made LLVM's code longer, 996 against 927 instructions per block
    at N = 16, with no measurable difference.)
    """

    def __init__(self, lanes: int):
        assert lanes & (lanes - 1) == 0
        self.n = lanes
        self.products: list[SSAValue] = []

    def push(self, v: SSAValue) -> None:
        self.products.append(v)

    def _combine(self, bb: _B, left, right):
        (x, sx, g), (y, sy, _) = left, right
        n, half, vt = self.n, g // 2, x.type
        lo = [base + lane for k in range(len(sx)) for base in (k * g, n + k * g) for lane in range(half)]
        hi = [m + half for m in lo]
        s = bb.ins(arith.AddfOp(_shuffle(bb, x, y, lo, vt), _shuffle(bb, x, y, hi, vt)))
        return s, [step for k in range(len(sx)) for step in (sx[k], sy[k])], half

    def result(self, bb: _B, start: SSAValue) -> SSAValue:
        """vector<T>: lane j = (sum of the lanes of step j's vector) + start."""
        assert len(self.products) == self.n
        items = [(v, [j], self.n) for j, v in enumerate(self.products)]  # (vector, its steps by group, lanes per step)
        while len(items) > 1:
            items = [self._combine(bb, left, right) for left, right in zip(items[0::2], items[1::2])]
        ((sums, order, _),) = items
        vt = sums.type
        assert isinstance(vt, VectorType)
        in_steps = _shuffle(bb, sums, sums, [order.index(j) for j in range(self.n)], vt)
        return bb.ins(arith.AddfOp(in_steps, bb.splat(start, vt)))


__all__ = ["BLOCKED_DOT_MARK", "DotPlan", "TreeSums", "dot_plan"]
