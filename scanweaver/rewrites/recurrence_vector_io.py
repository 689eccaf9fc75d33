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

* Element loads (`find_element_runs`, Mamba's B and C): a load of a per-element
  operand `ref[*others, i]` where some of the other indices are the state's element
  index -- the block arguments of `coeffs` (B, in the part of coeffs that varies with
  step and element), or the induction variable of a constant-bound `scf.for` at the top
  of `emit` without stores or nested regions (C, in the emit's dot product over the
  state) -- and the rest step-invariant. Each element (each iteration of that loop)
  is a run of its own (`StepRun.elem`, the element variables substituted by constants
  in `StepRun.subst`); the kernel clones that emit loop unrolled (`unrolled_emit_loop`)
  so that each iteration takes its preloaded value. Per item, the values are keyed by
  `(op, elem)` instead of the op. Where no vector divides the items (one or two per
  thread), B's runs have width 1: a full tile loads them element by element, unguarded,
  for the kernel's shared stage only (recurrence_gpu `_stage_element_loads`).

A full tile reads and writes exactly the elements its steps' scalar accesses would
(every step of it is in range); different memrefs are assumed not to overlap, as the
nest matcher does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import arith, memref, scf, vector
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
    elem: int | None = None  # element runs: the element (or emit loop iteration) it reads
    subst: tuple[tuple[SSAValue, int], ...] = ()  # element variables -> their constants here

    def key(self, op: Operation) -> object:
        """The key of `op`'s value in an item's preloaded values."""
        return op if self.elem is None else (op, self.elem)

    def indices(self, ie: Emitter, vmap: dict[SSAValue, SSAValue], i: SSAValue) -> list[SSAValue]:
        subst = dict(self.subst)
        return [ie.index(subst[v]) if v in subst else vmap[v] for v in self.others] + [i]


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


def _element_run_loads(ops: Sequence[Operation], t: SSAValue, elem_vars: Sequence[SSAValue],
                       inside: set[SSAValue], nest: Nest, ipt: int,
                       scalar: bool = False) -> list[tuple[memref.LoadOp, int]]:
    """The loads of `ops` reading `ref[*others, t]` with some of `others` in `elem_vars`
    and the rest step-invariant (not in `inside`), with their vector widths; with
    `scalar`, also those whose vector does not divide the items (width 1: element by
    element, unguarded in a full tile)."""
    found = []
    for op in ops:
        if not isinstance(op, memref.LoadOp) or op.memref in nest.stored_args:
            continue
        idx = list(op.indices)
        if not idx or idx[-1] is not t or not any(v in elem_vars for v in idx[:-1]):
            continue
        if any(v is t or (v in inside and v not in elem_vars) for v in idx[:-1]):
            continue
        vec = _vector_elements(op.memref, nest, ipt)
        if not vec and scalar and _vector_elements(op.memref, nest, 16 // bg.byte_size(op.memref.type.element_type)):
            vec = 1
        if vec:
            found.append((op, vec))
    return found


def _unrollable_loop(op: Operation) -> range | None:
    """The iterations of a constant-bound `scf.for` whose body has neither stores nor
    regions (the emit's dot product over the state), else None."""
    if not isinstance(op, scf.ForOp):
        return None
    lb, ub, st = const_int(op.lb), const_int(op.ub), const_int(op.step)
    if lb is None or ub is None or st is None or st <= 0 or (ub - lb) // st > MAX_UNROLLED_TRIPS:
        return None
    if any(o.regions or isinstance(o, memref.StoreOp) for o in op.body.block.ops):
        return None
    return range(lb, ub, st)


#: emit loops of at most this many iterations are unrolled for their element loads
MAX_UNROLLED_TRIPS = 64


def find_element_runs(
    nest: Nest, coeffs_step: Sequence[Operation], coeffs_both: Sequence[Operation], emit_step: Sequence[Operation],
    t_c: SSAValue, k_c: Sequence[SSAValue], elements: Sequence[Sequence[int]], t_e: SSAValue, ipt: int,
    emit: bool = True,
) -> tuple[list[StepRun], list[StepRun], set[Operation]]:
    """The element loads (module doc) of coeffs (per element: `elements[n]` is element
    n's index; runs of width 1 where the vector does not divide the items: these are
    only staged) and, with `emit`, of emit, and the emit loops to unroll for them; none
    when the loop step is not 1."""
    if const_int(nest.rec.step) != 1:
        return [], [], set()
    inside_c = _defined(list(coeffs_step) + list(coeffs_both)) | {t_c}
    coeffs_runs: list[StepRun] = []
    loads = _element_run_loads(coeffs_both, t_c, k_c, inside_c, nest, ipt, scalar=True)
    for n, elem in enumerate(elements):
        runs: dict[tuple, StepRun] = {}
        subst = tuple(zip(k_c, elem))
        for op, vec in loads:
            key = (op.memref, tuple(dict(subst).get(v, v) for v in op.indices[:-1]))
            if key in runs:
                runs[key].ops.append(op)
            else:
                runs[key] = StepRun(op.memref, tuple(op.indices[:-1]), op.memref.type.element_type, vec, [op],
                                    n, subst)
        coeffs_runs += runs.values()
    inside_e = _defined(emit_step) | {t_e}
    emit_runs: list[StepRun] = []
    loops: set[Operation] = set()
    for loop in emit_step if emit else ():
        its = _unrollable_loop(loop)
        if its is None:
            continue
        body = list(loop.body.block.ops)  # type: ignore[attr-defined]
        iv = loop.body.block.args[0]  # type: ignore[attr-defined]
        found = _element_run_loads(body, t_e, [iv], inside_e | _defined(body), nest, ipt)
        if not found:
            continue
        loops.add(loop)
        for c in its:
            emit_runs += [StepRun(op.memref, tuple(op.indices[:-1]), op.memref.type.element_type, vec, [op], c,
                                  ((iv, c),)) for op, vec in found]
    return coeffs_runs, emit_runs, loops


def unrolled_emit_loop(ie: Emitter, loop: scf.ForOp, m: dict[SSAValue, SSAValue], pre: dict) -> None:
    """Clone `loop` (an `_unrollable_loop`) unrolled, the loads with preloaded values
    (keyed `(op, iteration)`) taking them; its results go into `m`."""
    block = loop.body.block
    carried = [m.get(v, v) for v in loop.iter_args]
    for c in _unrollable_loop(loop) or ():
        mm = {**m, block.args[0]: ie.index(c), **dict(zip(block.args[1:], carried))}
        for op in block.ops:
            if isinstance(op, scf.YieldOp):
                carried = [mm.get(v, v) for v in op.operands]
            elif (op, c) in pre:
                mm[op.results[0]] = pre[(op, c)]
            else:
                ie.op(op.clone(value_mapper=mm))
    m.update(zip(loop.results, carried))


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
              p_start: SSAValue, steps: Sequence[tuple[SSAValue, SSAValue]], ipt: int,
              sink: Callable[[Emitter, int, int, SSAValue], None] | None = None) -> list[dict]:
    """Per item j of the thread: {load op (`StepRun.key`): its value at step j}. `p_start`:
    the loop index of the thread's first step; `steps`: (loop index, in range) of each item.
    With `sink`, each value is handed to `sink(emitter, run, item, value)` inside the branch
    that loads it instead (none flows out: the whole tile's values are not live at once).

    No lane of a 16-byte vector is taken out next to its load: LLVM's VectorCombine
    (`scalarizeLoadExtract`) would split a load whose users are all such extracts into
    scalar loads without its `!invariant.load` mark, and the vector NVPTX rebuilds from
    them may lose `ld.global.nc` (`toolchain/readonly_params.mark_readonly_loads_invariant`).
    With `sink`, each lane is extracted just before its own store, so another lane's store
    lies between the load and the later extracts; otherwise the vectors leave the branch
    whole (the scalar branch packs its elements alike) and are taken apart after it."""
    # per run: its values in the branches' results, `ipt // vec` vectors or `ipt` elements
    types = [] if sink is not None else [t for r in runs for t in [_value_type(r)] * (ipt // r.vec)]

    def drain(ie: Emitter, out: list[SSAValue]) -> list[SSAValue]:
        if sink is None:
            return out
        elements = _lanes(ie, out)  # each lane extracted just before its store
        for c in range(len(runs)):
            for j in range(ipt):
                sink(ie, c, j, next(elements))
        return []

    def vector_loads(ie: Emitter) -> list[SSAValue]:
        out: list[SSAValue] = []
        for r in runs:
            ref = vmap[r.ref]
            if r.vec == 1:  # a run staged element by element (no vector divides the items)
                out += [ie.load(ref, r.indices(ie, vmap, i)) for i, _ in steps]
                continue
            for c in range(ipt // r.vec):
                i = ie.add(p_start, ie.index(c * r.vec)) if c else p_start
                op = vector.LoadOp(ref, r.indices(ie, vmap, i), _value_type(r))
                op.attributes["alignment"] = IntegerAttr(16, i64)
                out.append(ie.op(op).results[0])
        return drain(ie, out)

    def scalar_loads(ie: Emitter) -> list[SSAValue]:
        out: list[SSAValue] = []
        for r in runs:
            ref = vmap[r.ref]
            elems = []
            for i, inside in steps:
                (v,) = ie.if_(inside, [r.el], lambda x, i=i, ref=ref, r=r: [x.load(ref, r.indices(x, vmap, i))],
                              lambda x, r=r: [x.const(0, r.el)])
                elems.append(v)
            if sink is None and r.vec > 1:  # the vector branch's types
                elems = [_packed(ie, elems[c : c + r.vec]) for c in range(0, ipt, r.vec)]
            out += elems
        return drain(ie, out)

    vals = list(le.if_(full, types, vector_loads, scalar_loads))
    if sink is not None:
        return [{} for _ in range(ipt)]
    flat = list(_lanes(le, vals))
    per_item: list[dict] = [{} for _ in range(ipt)]
    for n, r in enumerate(runs):
        for j in range(ipt):
            for op in r.ops:
                per_item[j][r.key(op)] = flat[n * ipt + j]
    return per_item


def _value_type(r: StepRun) -> Attribute:
    """What one load of run `r` in a full tile yields: a 16-byte vector, or an element."""
    return VectorType(r.el, [r.vec]) if r.vec > 1 else r.el


def _lanes(ie: Emitter, values: Sequence[SSAValue]) -> Iterator[SSAValue]:
    """The elements of `values` in order, a vector's lanes each extracted when asked for."""
    for v in values:
        if not isinstance(v.type, VectorType):
            yield v
            continue
        for lane in range(v.type.get_shape()[0]):
            yield ie.val(vector.ExtractOp(v, [lane], v.type.element_type))


def _packed(ie: Emitter, elems: Sequence[SSAValue]) -> SSAValue:
    """One vector of `elems` (lane i = elems[i])."""
    vt = VectorType(elems[0].type, [len(elems)])
    v = ie.val(vector.BroadcastOp(elems[0], vt))
    for lane in range(1, len(elems)):
        v = ie.val(vector.InsertOp(elems[lane], v, [lane], vt))
    return v


def store_runs(le: Emitter, runs: Sequence[StepRun], vmap: dict[SSAValue, SSAValue], full: SSAValue,
               p_start: SSAValue, steps: Sequence[tuple[SSAValue, SSAValue]], values: Sequence[Sequence[SSAValue]],
               ipt: int) -> None:
    """Write each store run's values (`values[run][item]`): vectors in a full tile,
    elements of in-range steps otherwise."""

    def vector_stores(ie: Emitter) -> None:
        for r, vals in zip(runs, values):
            ref, others = vmap[r.ref], [vmap[v] for v in r.others]
            for c in range(ipt // r.vec):
                v = _packed(ie, vals[c * r.vec : (c + 1) * r.vec])
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
