"""16-byte vector loads and stores of the per-step operands of the `scan.recurrence` kernels.

The fused kernel (`recurrence_gpu.py`) clones the `coeffs` and `emit` regions per step,
so each step loads its operands (Mamba: u, delta, z) and stores its output with 32-bit
accesses. A thread owns `items_per_thread` consecutive steps, so where such an access
reads or writes consecutive elements of the innermost axis, its run is whole 16-byte
vectors. This module finds those accesses and emits them per tile:

* Step loads: a top-level `memref.load` of `coeffs` or `emit` (not inside an emit loop)
  of a kernel argument with the identity layout, element type f32, f64, i32 or i64,
  whose last index is the step's loop index and whose other indices do not vary with
  the step, of a memref the nest never writes. Each region has its own runs (u in Mamba
  is read by both): the coeffs' before the tile's items, the emit's just before the
  replay (so they are not live across the scan). A full tile (block-uniform:
  wholly before the end, the loop index of its first step and every such row length
  multiples of the vector) reads each thread's run by `vector.load` (alignment 16); other
  tiles load the run element by element, guarded per step (0 past the end); the cloned
  load of step j of the thread then takes the value of item j. The step loop has step 1.
* Step stores: a top-level `memref.store` of `emit`, unconditional, of such a memref the
  nest never reads and stores nowhere else, not a last-step-only store: the replay yields
  the stored value of each item, and after the items a full tile writes the run by
  `vector.store`, other tiles store element by element where the step is in range.

A full tile reads and writes exactly the elements its steps' scalar accesses would
(every step of it is in range); different memrefs are assumed not to overlap, as the
nest matcher does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.dialects import arith, memref, vector
from xdsl.dialects.builtin import IntegerAttr, MemRefType, NoneAttr, VectorType, i64
from xdsl.ir import Attribute, BlockArgument, Operation, SSAValue

from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.affine_to_pairs import Emitter
from scanweaver.rewrites.gpu_kernel import const_int
from scanweaver.rewrites.gpu_nest import Nest


@dataclass
class StepRun:
    """One memref row read (or written) at the step index: `ref[*others, i]`."""

    ref: SSAValue  # the function's memref argument
    others: tuple[SSAValue, ...]  # the indices before the step's, step-invariant
    el: Attribute
    vec: int  # elements per 16-byte vector
    ops: list[Operation] = field(default_factory=list)  # its loads (or its one store)


def _vector_elements(ref: SSAValue, nest: Nest, ipt: int) -> int:
    t = ref.type
    if not (isinstance(ref, BlockArgument) and ref in nest.kernel_args and isinstance(t, MemRefType)):
        return 0
    if not isinstance(t.layout, NoneAttr) or t.get_num_dims() < 1 or not bg.shuffles(t.element_type):
        return 0
    vec = 16 // bg.byte_size(t.element_type)
    return vec if ipt % vec == 0 else 0


def _step_access(op: Operation, ref: SSAValue, idx: Sequence[SSAValue], t: SSAValue, inside: set[SSAValue],
                 nest: Nest, ipt: int) -> StepRun | None:
    """`op` accesses `ref[*others, t]` with step-invariant others: its run, else None."""
    if not idx or idx[-1] is not t or any(v is t or v in inside for v in idx[:-1]):
        return None
    vec = _vector_elements(ref, nest, ipt)
    if not vec:
        return None
    return StepRun(ref, tuple(idx[:-1]), ref.type.element_type, vec, [op])  # type: ignore[attr-defined]


def _defined(ops: Sequence[Operation]) -> set[SSAValue]:
    return {r for op in ops for r in op.results}


def find_step_runs(
    nest: Nest, coeffs_step: Sequence[Operation], coeffs_both: Sequence[Operation],
    emit_step: Sequence[Operation], t_c: SSAValue, t_e: SSAValue, ipt: int,
) -> tuple[list[StepRun], list[StepRun], list[StepRun]]:
    """The step loads of coeffs, of emit, and the step stores (module doc) of a matched
    nest; none when its loop step is not 1."""
    if const_int(nest.rec.step) != 1:
        return [], [], []
    inside_c = _defined(list(coeffs_step) + list(coeffs_both)) | {t_c}
    inside_e = _defined(emit_step) | {t_e}
    per_region: list[list[StepRun]] = []
    for ops, t, inside in ((coeffs_step, t_c, inside_c), (emit_step, t_e, inside_e)):
        loads: dict[tuple, StepRun] = {}
        per_region.append(list(loads.values()))
        for op in ops:
            if isinstance(op, memref.LoadOp) and op.memref not in nest.stored_args:
                run = _step_access(op, op.memref, list(op.indices), t, inside, nest, ipt)
                if run is not None:
                    key = (run.ref, run.others)
                    if key in loads:
                        loads[key].ops.append(op)
                    else:
                        loads[key] = run
        per_region[-1] = list(loads.values())
    stores: list[StepRun] = []
    emit_stores = [op for op in nest.rec.emit.block.walk() if isinstance(op, memref.StoreOp)]
    for op in emit_step:
        if not isinstance(op, memref.StoreOp) or op in nest.last_stores or op.memref in nest.loaded_args:
            continue
        if sum(o.memref is op.memref for o in emit_stores) != 1:
            continue
        run = _step_access(op, op.memref, list(op.indices), t_e, inside_e, nest, ipt)
        if run is not None:
            stores.append(run)
    return per_region[0], per_region[1], stores


def full_tile(le: Emitter, runs: Sequence[StepRun], vmap: dict[SSAValue, SSAValue], t0: SSAValue, p0: SSAValue,
              tile: int, t_end: SSAValue) -> SSAValue:
    """i1, block-uniform: the tile of steps [t0, t0 + tile) lies before `t_end`, its
    first loop index `p0` and every run's row length are multiples of the vector."""
    ok = le.cmp("ule", le.add(t0, le.index(tile)), t_end)
    vec = max(r.vec for r in runs)
    ok = le.val(arith.AndIOp(ok, le.cmp("eq", le.remu(p0, le.index(vec)), le.index(0))))
    seen: set[tuple[SSAValue, int]] = set()
    for r in runs:
        if (r.ref, r.vec) in seen:
            continue
        seen.add((r.ref, r.vec))
        ref = vmap[r.ref]
        row = le.dim(ref, r.ref.type.get_num_dims() - 1)  # type: ignore[attr-defined]
        ok = le.val(arith.AndIOp(ok, le.cmp("eq", le.remu(row, le.index(r.vec)), le.index(0))))
    return ok


def load_runs(le: Emitter, runs: Sequence[StepRun], vmap: dict[SSAValue, SSAValue], full: SSAValue,
              p_start: SSAValue, steps: Sequence[tuple[SSAValue, SSAValue]], ipt: int) -> list[dict[Operation, SSAValue]]:
    """Per item j of the thread: {load op: its value at step j}. `p_start`: the loop index
    of the thread's first step; `steps`: (loop index, in range) of each item."""
    types = [r.el for r in runs for _ in range(ipt)]

    def vector_loads(ie: Emitter) -> list[SSAValue]:
        out: list[SSAValue] = []
        for r in runs:
            ref, others = vmap[r.ref], [vmap[v] for v in r.others]
            vt = VectorType(r.el, [r.vec])
            for c in range(ipt // r.vec):
                i = ie.add(p_start, ie.index(c * r.vec)) if c else p_start
                op = vector.LoadOp(ref, [*others, i], vt)
                op.attributes["alignment"] = IntegerAttr(16, i64)
                v = ie.op(op).results[0]
                out += [ie.val(vector.ExtractOp(v, [lane], r.el)) for lane in range(r.vec)]
        return out

    def scalar_loads(ie: Emitter) -> list[SSAValue]:
        out: list[SSAValue] = []
        for r in runs:
            ref, others = vmap[r.ref], [vmap[v] for v in r.others]
            for i, inside in steps:
                (v,) = ie.if_(inside, [r.el], lambda x, i=i, ref=ref, others=others: [x.load(ref, [*others, i])],
                              lambda x, r=r: [x.const(0, r.el)])
                out.append(v)
        return out

    vals = list(le.if_(full, types, vector_loads, scalar_loads))
    per_item: list[dict[Operation, SSAValue]] = [{} for _ in range(ipt)]
    for n, r in enumerate(runs):
        for j in range(ipt):
            for op in r.ops:
                per_item[j][op] = vals[n * ipt + j]
    return per_item


def store_runs(le: Emitter, runs: Sequence[StepRun], vmap: dict[SSAValue, SSAValue], full: SSAValue,
               p_start: SSAValue, steps: Sequence[tuple[SSAValue, SSAValue]], values: Sequence[Sequence[SSAValue]],
               ipt: int) -> None:
    """Write each store run's values (`values[run][item]`): vectors in a full tile,
    elements of in-range steps otherwise."""

    def vector_stores(ie: Emitter) -> None:
        for r, vals in zip(runs, values):
            ref, others = vmap[r.ref], [vmap[v] for v in r.others]
            vt = VectorType(r.el, [r.vec])
            for c in range(ipt // r.vec):
                v = ie.val(vector.BroadcastOp(vals[c * r.vec], vt))
                for lane in range(1, r.vec):
                    v = ie.val(vector.InsertOp(vals[c * r.vec + lane], v, [lane], vt))
                i = ie.add(p_start, ie.index(c * r.vec)) if c else p_start
                op = vector.StoreOp(v, ref, [*others, i])
                op.attributes["alignment"] = IntegerAttr(16, i64)
                ie.op(op)

    def scalar_stores(ie: Emitter) -> None:
        for r, vals in zip(runs, values):
            ref, others = vmap[r.ref], [vmap[v] for v in r.others]
            for (i, inside), v in zip(steps, vals):
                ie.if_(inside, [], lambda x, i=i, v=v, ref=ref, others=others: x.store(v, ref, [*others, i]))

    le.if_(full, [], vector_stores, scalar_stores)
