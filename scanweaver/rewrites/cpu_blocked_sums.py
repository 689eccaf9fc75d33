"""An emit's stored sums over the state reduced a time block of steps at a time.

The VJP's adjoint scan (`rewrites/grad.py`, fused) ends each step's emit with sums over
the state index (`sum_n lam[n] * ...`, one `scf.for` with add-reductions in iter_args)
whose results are only stored, one element per step, into a chunk buffer at the step's
index or at `c - step` (the reverse's numbering).  The vectoriser reduces each sum per
step (`vector.reduction`: at N = 16 four shuffle-and-add levels, then the start value:
two sums were 18 of the adjoint loop's ~40 instructions a step).  With this plan the
recurrence runs TIME_BLOCK steps per iteration, keeps each sum's per-step product vectors
and reduces them together (`cpu_blocked_dot.TreeSums`, in the per-step reduction's
order: the same bits), then stores the block's sums as one vector (reversed for
`c - step`).  Remainder steps keep the per-step reduction.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import arith, memref, scf
from xdsl.dialects.builtin import Float32Type
from xdsl.ir import Operation, SSAValue
from xdsl.traits import IsTerminator

from scanweaver.dialects import scan
from scanweaver.rewrites.cpu_vector_builders import _identity_layout


@dataclass
class SumsPlan:
    """The emit's reduction loop and, per iter_arg, the store of its result; `reverse`:
    the stores' last index is `c - step` (else the step)."""

    loop: scf.ForOp
    stores: list[memref.StoreOp]
    reverse: bool


def _inside_values(op: scan.RecurrenceOp) -> set[SSAValue]:
    inside = {v for o in op.walk() if o is not op for v in o.results}
    for o in op.walk():
        for r in o.regions:
            for blk in r.blocks:
                inside.update(blk.args)
    return inside


def _time_free(v: SSAValue, op: scan.RecurrenceOp, inside: set[SSAValue]) -> bool:
    """v is the same at every step: defined outside the op, or a pure arith op at the
    emit's top level on such values."""
    if v not in inside:
        return True
    owner = v.owner
    if not isinstance(owner, Operation) or owner.parent_block() is not op.emit.block \
            or owner.dialect_name() != "arith" or owner.regions:
        return False
    return all(_time_free(w, op, inside) for w in owner.operands)


def _step_index(v: SSAValue, op: scan.RecurrenceOp, inside: set[SSAValue]) -> bool | None:
    """False: v is the emit's step; True: `c - step` with c the same at every step; else None."""
    time_arg = op.emit.block.args[0]
    if v is time_arg:
        return False
    owner = v.owner
    if isinstance(owner, arith.SubiOp) and owner.rhs is time_arg and _time_free(owner.lhs, op, inside):
        return True
    return None


def _add_reductions(loop: scf.ForOp) -> bool:
    block = loop.body.block
    yielded = list(block.last_op.operands)  # type: ignore[union-attr]
    for acc, out in zip(block.args[1:], yielded):
        owner = out.owner
        if not (isinstance(owner, arith.AddfOp) and acc in owner.operands and len(list(acc.uses)) == 1) \
                or owner.lhs is owner.rhs:
            return False
    return True


def sums_plan(op: scan.RecurrenceOp, lanes: int, block: int, reassoc: bool, is_state_loop) -> SumsPlan | None:
    """The plan for `op` (f32, `lanes` == `block`, reassociated reductions, the emit's last
    ops one add-reduction loop over the state and one store per result, into memrefs the
    op does not otherwise touch), else None."""
    if not reassoc or lanes != block or not isinstance(op.state_type.element_type, Float32Type):
        return None
    ops = [o for o in op.emit.block.ops if not o.has_trait(IsTerminator)]
    loops = [k for k, o in enumerate(ops) if isinstance(o, scf.ForOp) and o.results]
    if len(loops) != 1:
        return None
    loop = ops[loops[0]]
    assert isinstance(loop, scf.ForOp)
    stores = ops[loops[0] + 1:]
    if not is_state_loop(loop) or not _add_reductions(loop) or len(stores) != len(loop.results):
        return None
    inside = _inside_values(op)
    by_result, reverse = [], set()
    for r in loop.results:
        uses = list(r.uses)
        if len(uses) != 1 or not isinstance(uses[0].operation, memref.StoreOp) or uses[0].index != 0:
            return None
        store = uses[0].operation
        if store not in stores or not isinstance(r.type, Float32Type):
            return None
        indices = list(store.indices)
        direction = _step_index(indices[-1], op, inside) if indices else None
        if direction is None or store.memref in inside or not _identity_layout(store.memref.type) \
                or any(not _time_free(v, op, inside) for v in indices[:-1]):
            return None
        reverse.add(direction)
        by_result.append(store)
    targets = [s.memref for s in by_result]
    if len(reverse) != 1 or len(set(targets)) != len(targets):
        return None
    for o in op.walk():
        if isinstance(o, memref.LoadOp | memref.StoreOp) and o.memref in targets and o not in by_result:
            return None  # the sums' buffers are read or written elsewhere: keep the step order
    return SumsPlan(loop, by_result, reverse.pop())


__all__ = ["SumsPlan", "sums_plan"]
