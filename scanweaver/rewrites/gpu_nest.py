"""The loop-nest skeleton shared by the fused recurrence kernels of `scan-to-gpu`.

`recurrence_gpu.py` (scan.recurrence) and `linear_gpu.py` (scan.linear_recurrence)
build one kernel per loop nest around the recurrence; this module holds what they
share: matching the nest (`match_recurrence`: channel loops, prologue/epilogue, which
emit stores are one element per step or step-invariant, what may be taken into the
kernel; see recurrence_gpu.py's "What matches"), the one-trip loop around a recurrence
without channel loops (`wrap_depth0` / `unwrap_depth0`), splitting the regions by what
their values depend on (`split_by_dependence`, hoisting), the kernel's entry and exit
(`begin_nest_kernel`: thread/block ids, channel indices, cloned prologue, private state;
`finish_nest_kernel`: final state and epilogue), and the host side
(`launch_nest_kernel`: `gpu.launch_func` from the launch description's grid formula).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import arith, func, gpu, memref, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FunctionType,
    IndexType,
    IntegerType,
    MemRefType,
    SymbolRefAttr,
    UnitAttr,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.affine_to_pairs import Emitter
from scanweaver.rewrites.gpu_fission import holds_scan_op, split_refusal
from scanweaver.rewrites.gpu_kernel import (
    Unsupported,
    check_closed,
    const_int,
    defined_inside,
    block_id,
    free_values,
    shape_entries,
    thread_id,
)
from scanweaver.rewrites.launch import KernelLaunch

#: Largest state (elements per channel) kept in registers.
MAX_STATE = 64


def is_scalar_type(t: Attribute) -> bool:
    return isinstance(t, (IndexType, IntegerType, Float16Type, BFloat16Type, Float32Type, Float64Type))


def _accesses(ops: Iterable[Operation]) -> list[tuple[Operation, SSAValue, Sequence[SSAValue], bool]]:
    out = []
    for top in ops:
        for o in top.walk():
            if isinstance(o, memref.LoadOp):
                out.append((o, o.memref, o.indices, False))
            elif isinstance(o, memref.StoreOp):
                out.append((o, o.memref, o.indices, True))
    return out


def _allocas(ops: Iterable[Operation]) -> set[SSAValue]:
    return {o.memref for top in ops for o in top.walk() if isinstance(o, memref.AllocaOp)}


def _check_ops(ops: Iterable[Operation], where: str, *, stores: bool, allocas: bool) -> None:
    """Only ops the kernel can clone: pure scalar ops, loads, stores, allocas, scf."""
    for top in ops:
        for o in top.walk():
            if isinstance(o, (scf.ForOp, scf.IfOp)):
                if any(isinstance(r.type, MemRefType) for r in o.results):
                    raise Unsupported(f"{where}: '{o.name}' yields a memref")
                continue
            if isinstance(o, (scf.YieldOp, memref.LoadOp, memref.DimOp, scan.YieldOp)):
                continue
            if isinstance(o, memref.StoreOp):
                if stores:
                    continue
                raise Unsupported(f"{where}: writes memory")
            if isinstance(o, memref.AllocaOp):
                if allocas and not o.dynamic_sizes and not o.symbol_operands:
                    continue
                raise Unsupported(f"{where}: unsupported memref.alloca")
            if o.regions or not is_side_effect_free(o):
                raise Unsupported(f"{where}: '{o.name}' is not supported in a kernel")
            if any(isinstance(v.type, MemRefType) for v in (*o.operands, *o.results)):
                raise Unsupported(f"{where}: '{o.name}' makes a view of a memref")


def _name_of(v: SSAValue) -> str:
    return f"%{v.name_hint}" if v.name_hint else "a memref"


# ---------------------------------------------------------------------------
# Emit stores: which step writes what
# ---------------------------------------------------------------------------

_Lin = tuple[int, int, frozenset]  # (coefficient of t, constant, {(opaque value, coeff)})


class _EmitStores:
    """Classifies emit stores: one element per step (injective in the step index `t`),
    or step-invariant (every step writes the same elements: only the last step needs to).

    `fixed` values are the same in every step: defined outside emit, or pure ops of
    fixed values. Injective forms are `k * t + (fixed terms)`, k != 0; an emit loop
    variable is not fixed (`y[t + c]` in a loop over c overlaps between steps).
    Step-invariant stores must run unconditionally in each step (nested only in
    `scf.for` loops with fixed bounds) at indices built from fixed values and those
    loops' variables.
    """

    def __init__(self, emit: Block):
        self.emit = emit
        self.t = emit.args[0]
        inside = defined_inside(list(emit.ops)) | set(emit.args)
        self.fixed: set[SSAValue] = set()
        for o in emit.walk():
            if (
                not o.regions
                and is_side_effect_free(o)
                and all(v in self.fixed or v not in inside for v in o.operands)
            ):
                self.fixed.update(o.results)
        self.inside = inside

    def is_fixed(self, v: SSAValue) -> bool:
        return v not in self.inside or v in self.fixed

    def lin(self, v: SSAValue) -> _Lin | None:
        if v == self.t:
            return (1, 0, frozenset())
        c = const_int(v)
        if c is not None:
            return (0, c, frozenset())
        if self.is_fixed(v):
            return (0, 0, frozenset({(v, 1)}))
        op = v.owner
        if isinstance(op, (arith.AddiOp, arith.SubiOp)):
            x, y = self.lin(op.lhs), self.lin(op.rhs)
            if x is None or y is None:
                return None
            sign = 1 if isinstance(op, arith.AddiOp) else -1
            terms: dict[SSAValue, int] = dict(x[2])
            for k, cf in y[2]:
                terms[k] = terms.get(k, 0) + sign * cf
            return (x[0] + sign * y[0], x[1] + sign * y[1], frozenset((k, cf) for k, cf in terms.items() if cf))
        if isinstance(op, arith.MuliOp):
            for a, b in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
                c = const_int(b)
                x = self.lin(a)
                if c is not None and x is not None:
                    return (x[0] * c, x[1] * c, frozenset((k, cf * c) for k, cf in x[2]))
        return None

    def kind(self, store: memref.StoreOp) -> tuple | None:
        """("inj", dim, form) | ("last",) | None (not provably safe)."""
        for p, ix in enumerate(store.indices):
            f = self.lin(ix)
            if f is not None and f[0] != 0:
                return ("inj", p, f)
        loop_vars: set[SSAValue] = set()
        op: Operation | None = store.parent_op()
        while op is not None and op is not self.emit.parent_op():
            if not isinstance(op, scf.ForOp) or not all(self.is_fixed(v) for v in (op.lb, op.ub, op.step)):
                return None  # conditional, or a loop whose trip count depends on the step
            loop_vars.add(op.body.block.args[0])
            op = op.parent_op()

        def invariant(v: SSAValue) -> bool:
            if self.is_fixed(v) or v in loop_vars:
                return True
            o = v.owner
            return (
                isinstance(o, Operation)
                and not o.regions
                and is_side_effect_free(o)
                and all(invariant(x) for x in o.operands)
            )

        if all(invariant(ix) for ix in store.indices):
            return ("last",)
        return None


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------


@dataclass
class Nest:
    fn: func.FuncOp
    rec: scan.LoopRecurrence  # scan.recurrence, or scan.linear_recurrence (linear_gpu.py)
    loops: list[scf.ForOp]
    outer_pre: list[list[Operation]]
    prologue: list[Operation]
    epilogue: list[Operation]
    state_arg: BlockArgument | None  # depth 0: the function argument holding the state
    trips: list[int | tuple[BlockArgument, int]]  # static trip, or (argument, dim)
    last_stores: set[Operation]
    kernel_args: list[BlockArgument] = field(default_factory=list)
    stored_args: set[SSAValue] = field(default_factory=set)
    loaded_args: set[SSAValue] = field(default_factory=set)
    outside_loads: list[Operation] = field(default_factory=list)  # host loads cloned into the kernel

    @property
    def root(self) -> Operation:
        return self.loops[0] if self.loops else self.rec


def _check_nothing_written_between(first: Operation, last: Operation) -> None:
    block = first.parent_block()
    assert block is not None
    ops = list(block.ops)
    for o in ops[ops.index(first) + 1 : ops.index(last)]:
        if not (is_side_effect_free(o) or isinstance(o, memref.LoadOp)):
            raise Unsupported(f"'{o.name}' between a load the nest needs and the nest may write memory")


def _reads_own_element(load: Operation, ref: SSAValue, idx: Sequence[SSAValue], accesses, kinds: set) -> bool:
    """`y[i] += ...` in emit: the load reads exactly the element that every store to
    `ref` in the same block writes, and those stores write one element per step (so no
    step reads what another step writes)."""
    if kinds == {("last",)}:
        return False
    stores = [(o, i) for o, r, i, st in accesses if st and r == ref]
    return all(
        o.parent_block() is load.parent_block() and tuple(i) == tuple(idx) for o, i in stores
    )


def _arg_dim(v: SSAValue, fn_args: set[SSAValue]) -> tuple[BlockArgument, int] | None:
    op = v.owner
    if isinstance(op, memref.DimOp) and op.source in fn_args:
        d = const_int(op.index)
        if d is not None:
            return op.source, d  # type: ignore[return-value]
    return None


def _trip(loop: scf.ForOp, fn_args: set[SSAValue]) -> int | tuple[BlockArgument, int]:
    if not isinstance(loop.lb.type, IndexType):
        raise Unsupported("channel loops must iterate over index values")
    lb, ub, st = const_int(loop.lb), const_int(loop.ub), const_int(loop.step)
    if st is not None and st <= 0:
        raise Unsupported("channel loop step must be positive")
    if lb is not None and ub is not None and st is not None:
        return max(0, -(-(ub - lb) // st))
    d = _arg_dim(loop.ub, fn_args)
    if lb == 0 and st == 1 and d is not None:
        return d
    raise Unsupported("channel loop bounds must be constants, or 0 to memref.dim(%arg, c) step 1")


def _channel_loops(rec: scan.LoopRecurrence) -> tuple[list[scf.ForOp], func.FuncOp]:
    """The scf.for channel loops around `rec`, outermost first, and the function."""
    loops: list[scf.ForOp] = []
    cur: Operation = rec
    while True:
        parent = cur.parent_op()
        if isinstance(parent, scf.ForOp):
            if parent.iter_args or parent.results:
                raise Unsupported("an enclosing scf.for carries values")
            loops.append(parent)
            cur = parent
            continue
        if isinstance(parent, func.FuncOp):
            break
        raise Unsupported(f"nested in '{parent.name if parent else '?'}', not in scf.for channel loops")
    loops.reverse()
    return loops, parent


def _check_state_type(rec: scan.LoopRecurrence) -> None:
    state_t = rec.state_type
    if not state_t.has_static_shape():
        raise Unsupported("the state must have a static shape")
    if math.prod(state_t.get_shape()) > MAX_STATE:
        raise Unsupported(f"the state has more than {MAX_STATE} elements")
    if not isinstance(rec.lb.type, IndexType):
        raise Unsupported("the recurrence must step over index values")


def _split_loop_bodies(
    loops: list[scf.ForOp], rec: scan.LoopRecurrence
) -> tuple[list[list[Operation]], list[Operation], list[Operation]]:
    """(ops before each inner channel loop, prologue, epilogue) of the recurrence.
    Ops between channel loops are replayed per thread, so they must be pure scalars."""
    outer_pre: list[list[Operation]] = []
    prologue: list[Operation] = []
    epilogue: list[Operation] = []
    for i, loop in enumerate(loops):
        child = loops[i + 1] if i + 1 < len(loops) else rec
        ops = list(loop.body.block.ops)
        k = ops.index(child)
        pre, post = ops[:k], ops[k + 1 :]
        if i + 1 < len(loops):
            for o in pre:
                if (
                    o.regions
                    or not (is_side_effect_free(o) or isinstance(o, memref.LoadOp))
                    or any(isinstance(r.type, MemRefType) for r in o.results)
                ):
                    raise Unsupported(f"'{o.name}' between channel loops")
            _check_one_scan_op(loop, post)
            if len(post) != 1:
                raise Unsupported("ops after an inner channel loop")
            outer_pre.append(pre)
        else:
            _check_one_scan_op(loop, pre + post)
            prologue, epilogue = pre, post[:-1]
    return outer_pre, prologue, epilogue


def _check_one_scan_op(loop: scf.ForOp, others: list[Operation]) -> None:
    """A channel loop left holding another scan op beside the recurrence's (fission,
    `gpu_fission.py`, could not split it): say why."""
    if any(holds_scan_op(o) for o in others):
        raise Unsupported(
            "its channel loop also runs another scan op and cannot be split into one nest per scan op: "
            + split_refusal(loop)
        )


def _state_arg(
    rec: scan.LoopRecurrence, loops: list[scf.ForOp], prologue: list[Operation], fn_args: set[SSAValue]
) -> BlockArgument | None:
    """Depth 0: the function argument holding the state; else None (a per-channel alloca)."""
    if loops:
        owner = rec.state.owner
        if not (isinstance(owner, memref.AllocaOp) and any(owner is o for o in prologue)):
            raise Unsupported("the state is not a memref.alloca of the innermost channel loop body")
        return None
    if rec.state not in fn_args:
        raise Unsupported("outside channel loops the state must be a function argument")
    return rec.state  # type: ignore[return-value]


def _check_steps_parallel(
    rec: scan.LoopRecurrence, prologue: list[Operation], epilogue: list[Operation]
) -> set[Operation]:
    """Steps run in parallel: coeffs and emit may not carry anything between steps
    through memory. Returns emit's stores that only the last step must do."""
    coeffs_ops = list(rec.coeffs.block.ops)[:-1]
    emit_ops = list(rec.emit.block.ops)[:-1]
    _check_ops(prologue, "before the recurrence", stores=True, allocas=True)
    _check_ops(epilogue, "after the recurrence", stores=True, allocas=True)
    _check_ops(coeffs_ops, "coeffs", stores=False, allocas=False)
    _check_ops(emit_ops, "emit", stores=True, allocas=True)

    pro_allocas = _allocas(prologue)
    for _, ref, _, is_store in _accesses(prologue):
        if is_store and ref not in pro_allocas:
            raise Unsupported(
                f"the prologue writes {_name_of(ref)} (not one of its allocas) and that store cannot move "
                "after the recurrence: something after it reads that memref, or emit may write the same element"
            )
    return _check_emit_memory(rec, emit_ops, coeffs_ops, pro_allocas)


def _check_emit_memory(
    rec: scan.LoopRecurrence, emit_ops: list[Operation], coeffs_ops: list[Operation], pro_allocas: set[SSAValue]
) -> set[Operation]:
    """Emit stores one element per step (or step-invariant, kept for the last step) and
    reads nothing another step writes; coeffs reads neither emit's outputs nor the state."""
    if rec.state in free_values(emit_ops):
        raise Unsupported("emit uses the state buffer directly instead of its block argument")
    s_e = rec.emit.block.args[1]
    emit_local = _allocas(emit_ops)
    emit_acc = _accesses(emit_ops)
    classify = _EmitStores(rec.emit.block)
    kinds: dict[SSAValue, set] = {}
    last_stores: set[Operation] = set()
    for o, ref, _, is_store in emit_acc:
        if not is_store or ref in emit_local:
            continue
        if ref == s_e or ref == rec.state:
            raise Unsupported("emit writes the state")
        if ref in pro_allocas:
            raise Unsupported("emit writes a buffer of the prologue (state carried through memory)")
        kind = classify.kind(o)  # type: ignore[arg-type]
        if kind is None:
            raise Unsupported(f"emit store to {_name_of(ref)} is neither one element per step nor step-invariant")
        kinds.setdefault(ref, set()).add(kind)
        if kind == ("last",):
            last_stores.add(o)
    for ref, ks in kinds.items():
        if len(ks) > 1:
            raise Unsupported(f"emit stores to {_name_of(ref)} at different per-step positions")
    emit_written = set(kinds)
    for o, ref, idx, is_store in emit_acc:
        if not is_store and ref in emit_written and not _reads_own_element(o, ref, idx, emit_acc, kinds[ref]):
            raise Unsupported(f"emit reads {_name_of(ref)}, which it writes (a dependence between steps)")
    for _, ref, _, _ in _accesses(coeffs_ops):
        if ref in emit_written:
            raise Unsupported(f"coeffs reads {_name_of(ref)}, which emit writes")
        if ref == rec.state:
            raise Unsupported("coeffs reads the state")
    return last_stores


def _channel_trips(loops: list[scf.ForOp], fn_args: set[SSAValue]) -> list[int | tuple[BlockArgument, int]]:
    trips = [_trip(loop, fn_args) for loop in loops]
    if all(isinstance(t, int) for t in trips) and math.prod(trips) > 2**31 - 1:  # type: ignore[arg-type]
        raise Unsupported("more than 2^31 - 1 channel iterations (the blockIdx.x limit)")
    return trips


def _check_channels_disjoint(
    loops: list[scf.ForOp], trips: Sequence[int | tuple[BlockArgument, int]], fn_args: set[SSAValue]
) -> None:
    """Channels run in parallel: every written argument is indexed, at some dimension, by
    each channel variable (of a loop with more than one iteration)."""
    ivs = [loop.body.block.args[0] for loop in loops]
    private = _allocas([loops[-1]])
    by_ref: dict[SSAValue, list[tuple[Sequence[SSAValue], bool]]] = {}
    for _, ref, idx, is_store in _accesses([loops[0]]):
        by_ref.setdefault(ref, []).append((idx, is_store))
    for ref, lst in by_ref.items():
        if ref in private or not any(st for _, st in lst):
            continue
        if ref not in fn_args:
            raise Unsupported(f"the nest writes {_name_of(ref)}, which is not a function argument")
        common: set[tuple[int, int]] | None = None
        for idx, _ in lst:
            here = {(j, p) for p, x in enumerate(idx) for j, iv in enumerate(ivs) if x == iv}
            common = here if common is None else common & here
        assert common is not None
        for j, iv in enumerate(ivs):
            if trips[j] == 1:
                continue  # a one-iteration loop cannot overlap with itself
            if not any(c[0] == j for c in common):
                raise Unsupported(
                    f"{_name_of(ref)} is written, but not always indexed by the channel "
                    f"variable %{iv.name_hint or j} at one dimension: channels may overlap"
                )


def _collect_outside_values(nest: Nest, fn_args: set[SSAValue]) -> None:
    """Fill `nest.kernel_args` and `nest.outside_loads` from the values the nest uses
    from outside: arguments pass to the kernel, pure scalar ops and loads are cloned."""
    args: set[BlockArgument] = set()
    work = list(free_values([nest.root]))
    seen: set[SSAValue] = set()
    while work:
        v = work.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in fn_args:
            if not isinstance(v.type, (MemRefType, IntegerType, IndexType, Float32Type, Float64Type)):
                raise Unsupported(f"the nest uses a function argument of type {v.type} (kernels take memrefs, "
                                  "integers, index, f32 and f64)")
            args.add(v)  # type: ignore[arg-type]  # scalars become kernel parameters
            continue
        op = v.owner
        if isinstance(op, Operation) and not op.regions and (
            isinstance(op, (arith.ConstantOp, memref.DimOp))
            or (op.dialect_name() == "arith" and is_side_effect_free(op))
        ):
            work.extend(op.operands)
            continue
        if isinstance(op, memref.LoadOp) and op.memref in fn_args and op.parent_block() is nest.root.parent_block():
            # a scalar read before the nest (`%alpha = memref.load %p[%c0]`): every thread
            # reads it again in the kernel, if nothing in between writes memory
            _check_nothing_written_between(op, nest.root)
            nest.outside_loads.append(op)
            work.extend(op.operands)
            continue
        raise Unsupported(f"the nest uses a value defined by '{getattr(op, 'name', '?')}' outside it")
    nest.kernel_args = sorted(args, key=lambda a: a.index)


def _note_memory_roles(nest: Nest) -> None:
    """Fill `nest.stored_args` / `nest.loaded_args` (which arguments the kernel writes / reads)."""
    for _, ref, _, is_store in _accesses([nest.root]):
        (nest.stored_args if is_store else nest.loaded_args).add(ref)
    for load in nest.outside_loads:
        if load.memref in nest.stored_args:  # type: ignore[attr-defined]
            raise Unsupported(f"the nest writes {_name_of(load.memref)}, which is read before it")  # type: ignore[attr-defined]
        nest.loaded_args.add(load.memref)  # type: ignore[attr-defined]
    if nest.state_arg is not None:
        nest.stored_args.add(nest.state_arg)
        nest.loaded_args.add(nest.state_arg)


def _misses_every_step(st: memref.StoreOp, es: memref.StoreOp, rec: scan.LoopRecurrence, emit: _EmitStores) -> bool:
    """Whether emit's store `es` provably never writes the element that `st` (before the
    recurrence) writes: at the dimension where `es` moves with the step index `t`
    (`k * t + c + terms`), `st`'s index is `c0 + terms` and `k * t == c0 - c` has no
    solution among the loop's indices (below a constant lower bound, off the step
    grid, or at or past a constant upper bound)."""
    kind = emit.kind(es)
    if kind is None or kind[0] != "inj" or es.memref != st.memref:
        return False
    _, p, (k, c, terms) = kind
    mine = emit.lin(st.indices[p])
    if mine is None or mine[0] != 0 or mine[2] != terms:
        return False
    d = mine[1] - c
    if d % k:
        return True
    t = d // k
    lb, ub, step = const_int(rec.lb), const_int(rec.ub), const_int(rec.step)
    return (
        (lb is not None and t < lb)
        or (ub is not None and t >= ub)
        or (lb is not None and step is not None and (t - lb) % step != 0)
    )


def _defer_prologue_stores(loops: list[scf.ForOp], rec: scan.LoopRecurrence) -> None:
    """`y[c, 0] = h0` before a time loop from 1 (the first element set before the loop):
    a store of the innermost channel body before `rec` to a memref that is not one of
    its allocas moves to just after `rec` when nothing after it in the body reads that
    memref and each of emit's stores to it provably misses its element.  Sequential
    semantics is unchanged (nothing in between observes or overwrites the element),
    and the kernel then runs the store with the epilogue (thread 0, after the sweeps)
    instead of in every thread before them.  Other stores stay (the prologue check
    names them)."""
    if not loops:
        return
    body = list(loops[-1].body.block.ops)
    pro = body[: body.index(rec)]
    local = _allocas(pro)
    emit = _EmitStores(rec.emit.block)
    emit_stores = [o for o in rec.emit.block.walk() if isinstance(o, memref.StoreOp)]
    movable = []
    for i, st in enumerate(pro):
        if not isinstance(st, memref.StoreOp) or st.memref in local:
            continue
        later = _accesses([*pro[i + 1 :], rec])
        if any(ref == st.memref and not is_store for _, ref, _, is_store in later):
            continue
        if all(_misses_every_step(st, es, rec, emit) for es in emit_stores if es.memref == st.memref):
            movable.append(st)
    # a memref's stores move all together or not at all (their order is kept)
    staying = {ref for o, ref, _, is_store in _accesses(pro) if is_store and o not in movable}
    after: Operation = rec
    for st in movable:
        if st.memref in staying:
            continue
        st.detach()
        Rewriter.insert_op(st, InsertPoint.after(after))
        after = st


def match_recurrence(rec: scan.LoopRecurrence) -> Nest:
    """The loop nest of `rec` if the kernel design applies, else `Unsupported(reason)`.
    The checks run in a fixed order, so the first reason given stays the same.
    Stores that set elements before the recurrence may move after it first
    (`_defer_prologue_stores`: the same result)."""
    loops, fn = _channel_loops(rec)
    _defer_prologue_stores(loops, rec)
    fn_args: set[SSAValue] = set(fn.body.block.args)
    _check_state_type(rec)
    outer_pre, prologue, epilogue = _split_loop_bodies(loops, rec)
    state_arg = _state_arg(rec, loops, prologue, fn_args)
    last_stores = _check_steps_parallel(rec, prologue, epilogue)
    trips = _channel_trips(loops, fn_args)
    if loops:
        _check_channels_disjoint(loops, trips, fn_args)
    nest = Nest(fn, rec, loops, outer_pre, prologue, epilogue, state_arg, trips, last_stores)
    _collect_outside_values(nest, fn_args)
    _note_memory_roles(nest)
    return nest


# ---------------------------------------------------------------------------
# Depth 0: a one-iteration channel loop around the recurrence
# ---------------------------------------------------------------------------


def _capturable(v: SSAValue, fn_args: set[SSAValue]) -> bool:
    """Whether the kernel builder can clone `v` (constants, dims, pure arith)."""
    if v in fn_args:
        return isinstance(v.type, (MemRefType, IntegerType, IndexType, Float32Type, Float64Type))
    op = v.owner
    if not isinstance(op, Operation) or op.regions:
        return False
    if isinstance(op, (arith.ConstantOp, memref.DimOp)) or (
        op.dialect_name() == "arith" and is_side_effect_free(op)
    ):
        return all(_capturable(x, fn_args) for x in op.operands)
    return False


def _reads_only(op: Operation) -> bool:
    """Pure ops and loads, possibly in `scf.if` (the guarded initial loads of a multi-lag
    state, `t - j < n ? y[t - j] : 0`): safe to move into the kernel's prologue."""
    for o in op.walk():
        if isinstance(o, (scf.IfOp, scf.YieldOp)):
            continue
        if o.regions or not (is_side_effect_free(o) or isinstance(o, memref.LoadOp)):
            return False
    return True


def _reaches_return(v: SSAValue) -> bool:
    """Whether `v` flows (through pure ops) into `func.return`."""
    work, seen = [v], set()
    while work:
        x = work.pop()
        if x in seen:
            continue
        seen.add(x)
        for u in x.uses:
            if isinstance(u.operation, func.ReturnOp):
                return True
            if is_side_effect_free(u.operation):
                work.extend(u.operation.results)
    return False


def wrap_depth0(rec: scan.LoopRecurrence) -> scf.ForOp | None:
    """Move a depth-0 recurrence with an alloca state (no channel loop: one long
    sequence) into a one-trip `scf.for` together with the alloca, its initial stores,
    the loads (and pure ops) they need, and the final loads of the state with their
    stores to function arguments (all moved only across ops without memory writes):
    that loop is then an ordinary one-block nest.  None when the recurrence is not of
    that form (nothing changed); `unwrap_depth0` dissolves the loop again."""
    fn = rec.parent_op()
    block = rec.parent_block()
    alloca = rec.state.owner
    if not isinstance(fn, func.FuncOp) or block is None:
        return None
    if not isinstance(alloca, memref.AllocaOp) or alloca.parent_block() is not block:
        return None
    d0 = _Depth0(rec, block, set(fn.body.block.args))
    moved = d0.state_uses(alloca)
    d0.add_needed_ops(moved)
    d0.absorb_setup_stores(moved)
    d0.check_used_only_inside(moved)
    return d0.wrap(d0.span(moved), moved)


class _Depth0:
    """The steps of `wrap_depth0` over the function body `block` holding `rec`."""

    def __init__(self, rec: scan.LoopRecurrence, block: Block, fn_args: set[SSAValue]):
        self.rec, self.block, self.fn_args = rec, block, fn_args
        self.ops = list(block.ops)
        self.pos = {o: i for i, o in enumerate(self.ops)}
        self.r = self.pos[rec]

    def top(self, o: Operation) -> Operation:
        """The op of `block` that holds `o`."""
        while o.parent_block() is not self.block:
            o = o.parent_op()  # type: ignore[assignment]
        return o

    def state_uses(self, alloca: Operation) -> set[Operation]:
        """The alloca, the recurrence, the state's initial stores before it and its final
        loads after it with their stores to function arguments."""
        rec, pos, r = self.rec, self.pos, self.r
        moved: set[Operation] = {alloca, rec}
        for use in rec.state.uses:
            user = self.top(use.operation)
            if user is rec or user is alloca:
                continue
            if pos[user] < r and isinstance(user, memref.StoreOp) and user.memref == rec.state:
                moved.add(user)
            elif pos[user] > r and isinstance(user, memref.LoadOp) and user.memref == rec.state:
                moved.add(user)
                moved.update(self._final_stores(user))
            else:
                raise Unsupported(f"the state is used by '{user.name}' outside the recurrence")
        return moved

    def _final_stores(self, load: memref.LoadOp) -> list[Operation]:
        """The stores of a final state value, or of pure arith on it (`last[0] = 2 * h`),
        to function arguments (its only uses), with that arith."""
        found: list[Operation] = []
        work = [load.res]
        while work:
            v = work.pop()
            for u in v.uses:
                op = u.operation
                if op in found:
                    continue
                if isinstance(op, memref.StoreOp) and op.value == v and op.memref in self.fn_args:
                    pass
                elif op.dialect_name() == "arith" and not op.regions and is_side_effect_free(op):
                    work.extend(op.results)
                elif _reaches_return(load.res):
                    raise Unsupported(
                        "the function returns a final value of the state: GPU kernels only write "
                        "memref arguments (store it to one instead)"
                    )
                else:
                    raise Unsupported("a final value of the state is used other than stored to an argument")
                if op.parent_block() is not self.block:
                    raise Unsupported("a final value of the state is used inside another op")
                found.append(op)
        return found

    def add_needed_ops(self, moved: set[Operation]) -> None:
        """Values the moved ops need from the block: capturable ones stay, the rest
        (loads and pure ops on them) move along."""
        work = free_values(list(moved))
        while work:
            v = work.pop()
            op = v.owner
            after = isinstance(op, Operation) and op.parent_block() is self.block and self.pos[op] > self.r
            if _capturable(v, self.fn_args) and not after:
                continue
            if not isinstance(op, Operation) or op.parent_block() is not self.block:
                raise Unsupported("the recurrence uses a value it cannot take into a kernel")
            if op in moved:
                continue
            if not _reads_only(op):
                raise Unsupported(f"the recurrence needs '{op.name}' from the function body")
            moved.add(op)
            work.extend(free_values([op]))

    def absorb_setup_stores(self, moved: set[Operation]) -> None:
        """Stores before the recurrence of moved values to function arguments (`y[0] = h0`
        before a time loop from 1) move along, when nothing left between them and the
        recurrence reads that memref: in the one-trip loop they are prologue stores,
        which `_defer_prologue_stores` may then move after the recurrence."""
        for o in list(moved):
            for res in o.results:
                for u in res.uses:
                    st = u.operation
                    if (
                        st not in moved
                        and isinstance(st, memref.StoreOp)
                        and st.parent_block() is self.block
                        and st.memref in self.fn_args
                        and self.pos[st] < self.r
                        and not self._read_before_recurrence(st)
                    ):
                        moved.add(st)

    def _read_before_recurrence(self, st: memref.StoreOp) -> bool:
        between = self.ops[self.pos[st] + 1 : self.r]
        return any(ref == st.memref and not is_store for _, ref, _, is_store in _accesses(between))

    def check_used_only_inside(self, moved: set[Operation]) -> None:
        """Nothing left behind may use what moves."""
        for o in moved:
            for res in o.results:
                if any(self.top(u.operation) not in moved for u in res.uses):
                    raise Unsupported(f"'{o.name}' is also used outside the recurrence")

    def span(self, moved: set[Operation]) -> list[Operation]:
        """The ops from the first moved one to the last.  Moving keeps the order of the
        moved ops; what they move across must not care: no writes before the
        recurrence, nothing but pure ops after it."""
        pos, r = self.pos, self.r
        span = [self.ops[i] for i in range(min(pos[o] for o in moved), max(pos[o] for o in moved) + 1)]
        for o in span:
            if o in moved:
                continue
            if pos[o] < r and not (is_side_effect_free(o) or isinstance(o, memref.LoadOp)):
                raise Unsupported(f"'{o.name}' between the recurrence's setup and the recurrence writes memory")
            if pos[o] > r and not is_side_effect_free(o):
                raise Unsupported(f"'{o.name}' between the recurrence and its final stores touches memory")
        return span

    def wrap(self, span: list[Operation], moved: set[Operation]) -> scf.ForOp:
        """The moved ops of `span`, in order, into a one-trip `scf.for`."""
        e = Emitter(InsertPoint.before(self.rec))
        zero, one = e.index(0), e.index(1)
        body = Block(arg_types=[zero.type])
        for o in span:
            if o in moved:
                o.detach()
                body.add_op(o)
        body.add_op(scf.YieldOp())
        loop = scf.ForOp(zero, one, one, [], body)
        # `e`'s constants went before the original position of `rec`, which now is gone
        # from the block: put the loop right after the last op left of the span.
        Rewriter.insert_op(loop, InsertPoint.after(one.owner))  # type: ignore[arg-type]
        return loop


def unwrap_depth0(loop: scf.ForOp) -> None:
    body = loop.body.block
    for o in list(body.ops)[:-1]:
        o.detach()
        Rewriter.insert_op(o, InsertPoint.before(loop))
    consts = [loop.lb.owner, loop.ub.owner]
    Rewriter.erase_op(loop)
    for c in consts:
        if isinstance(c, Operation) and not any(r.uses for r in c.results):
            Rewriter.erase_op(c)


# ---------------------------------------------------------------------------
# Kernel generation
# ---------------------------------------------------------------------------


@dataclass
class Split:
    """The ops of a region by what they vary with (see module doc, "Hoisting")."""

    consts: list[Operation]
    hoist: list[Operation]  # neither step nor element
    per_elem: list[Operation]  # element only (coeffs)
    per_step: list[Operation]  # step only (coeffs); everything varying (emit)
    per_both: list[Operation]  # step and element (coeffs)


def split_by_dependence(
    ops: Sequence[Operation], varying: dict[SSAValue, frozenset[str]], per_elem: bool = True
) -> Split:
    """Classify `ops`; with `per_elem=False` element-only ops stay in the step loop."""
    dep = dict(varying)
    out = Split([], [], [], [], [])
    for op in ops:
        if isinstance(op, arith.ConstantOp):
            out.consts.append(op)
            continue
        d: set[str] = set()
        for v in free_values([op]):
            d |= dep.get(v, frozenset())
        hoistable = (
            (per_elem or "n" not in d)
            and not op.regions
            and (is_side_effect_free(op) or isinstance(op, memref.LoadOp))
            and all(is_scalar_type(r.type) for r in op.results)
        )
        if not hoistable:
            d.add("t")
        for r in op.results:
            dep[r] = frozenset(d)
        if not d:
            out.hoist.append(op)
        elif d == {"n"}:
            out.per_elem.append(op)
        elif d == {"t"}:
            out.per_step.append(op)
        else:
            out.per_both.append(op)
    return out


def _used_by(v: SSAValue, among: set[Operation]) -> bool:
    """Whether some use of `v` is (nested inside) one of `among`."""
    for use in v.uses:
        top: Operation | None = use.operation
        while top is not None and top not in among:
            top = top.parent_op()
        if top is not None:
            return True
    return False


def needed_values(ops: Sequence[Operation], among: set[Operation]) -> list[SSAValue]:
    """Results of `ops` that some op of `among` uses."""
    return [r for op in ops for r in op.results if _used_by(r, among)]


@dataclass
class NestKernel:
    """The start of a kernel for a matched nest (`begin_nest_kernel`): what the
    recurrence-specific code needs to go on."""

    nest: Nest
    kfunc: gpu.FuncOp
    e: Emitter
    vmap: dict[SSAValue, SSAValue]  # nest values -> kernel values
    tid: SSAValue
    priv: SSAValue  # this thread's private state buffer
    state_src: SSAValue  # where the initial state is read (priv, or the state argument)
    trip: SSAValue  # number of steps of the recurrence
    step_index: Callable[[Emitter, SSAValue], SSAValue]  # step number k -> loop index


def begin_nest_kernel(nest: Nest, name: str, el: Attribute, shape: Sequence[int]) -> NestKernel:
    """A `gpu.func` taking the nest's memref arguments, started with what every
    thread runs first: values captured from outside the nest (constants, dims, pure
    arith), the channel loop variables from the block id (row-major over the trip
    counts), the cloned ops before the inner loops and the prologue, the private
    state buffer and the recurrence's trip count."""
    kfunc, vmap = _kernel_func(nest, name)
    e = Emitter(kfunc.body.block)
    tid = thread_id(e)
    bid = block_id(e)
    _capture_outside_values(e, nest, vmap)
    _channel_variables(e, nest, vmap, bid)
    for pre in nest.outer_pre:
        for op in pre:
            e.op(op.clone(value_mapper=vmap))
    for op in nest.prologue:
        e.op(op.clone(value_mapper=vmap))
    priv, state_src = _state_buffer(e, nest, vmap, el, shape)
    trip, step_index = _trip_and_step_index(e, nest.rec, vmap)
    return NestKernel(nest, kfunc, e, vmap, tid, priv, state_src, trip, step_index)


def _kernel_func(nest: Nest, name: str) -> tuple[gpu.FuncOp, dict[SSAValue, SSAValue]]:
    """The empty kernel over the nest's arguments, and the map from them to its own."""
    types = [a.type for a in nest.kernel_args]
    kfunc = gpu.FuncOp(name, FunctionType.from_lists(types, []), kernel=True)
    kfunc.attributes["gpu.kernel"] = UnitAttr()
    vmap: dict[SSAValue, SSAValue] = {}
    for fa, ka in zip(nest.kernel_args, kfunc.body.block.args):
        ka.name_hint = arg_name(nest, fa)
        vmap[fa] = ka
    return kfunc, vmap


def _capture_outside_values(e: Emitter, nest: Nest, vmap: dict[SSAValue, SSAValue]) -> None:
    """Clone the values the nest uses from outside it (constants, dims, pure arith)."""

    def capture(v: SSAValue) -> None:
        if v in vmap:
            return
        op = v.owner
        assert isinstance(op, Operation), v
        for o in op.operands:
            capture(o)
        e.op(op.clone(value_mapper=vmap))

    for v in free_values([nest.root]):
        capture(v)


def _channel_variables(e: Emitter, nest: Nest, vmap: dict[SSAValue, SSAValue], bid: SSAValue) -> None:
    """Map each channel loop's induction variable to its value for this block: the
    block id delinearised row-major over the trip counts, then scaled and offset."""
    trips: list[SSAValue] = [
        e.index(t) if isinstance(t, int) else e.dim(vmap[t[0]], t[1]) for t in nest.trips
    ]
    rest = bid
    ks: list[SSAValue] = [bid] * len(trips)
    for i in range(len(trips) - 1, -1, -1):
        if i == 0:
            ks[i] = rest
        else:
            ks[i] = e.remu(rest, trips[i])
            rest = e.divu(rest, trips[i])
    for loop, k in zip(nest.loops, ks):
        lb, st = const_int(loop.lb), const_int(loop.step)
        assert lb is not None and st is not None
        iv = k if st == 1 else e.mul(k, e.index(st))
        iv = iv if lb == 0 else e.add(iv, e.index(lb))
        vmap[loop.body.block.args[0]] = iv


def _state_buffer(
    e: Emitter, nest: Nest, vmap: dict[SSAValue, SSAValue], el: Attribute, shape: Sequence[int]
) -> tuple[SSAValue, SSAValue]:
    """(this thread's private state buffer, where the initial state is read)."""
    if nest.state_arg is None:
        priv = vmap[nest.rec.state]
        return priv, priv
    priv = e.val(memref.AllocaOp.get(el, shape=list(shape)))
    return priv, vmap[nest.state_arg]


def _trip_and_step_index(
    e: Emitter, rec: scan.LoopRecurrence, vmap: dict[SSAValue, SSAValue]
) -> tuple[SSAValue, Callable[[Emitter, SSAValue], SSAValue]]:
    """The recurrence's number of steps, and step number k -> its loop index."""
    lb_v, ub_v, step_v = vmap[rec.lb], vmap[rec.ub], vmap[rec.step]
    lb_c, step_c, ub_c = const_int(rec.lb), const_int(rec.step), const_int(rec.ub)
    ub_nonneg = (ub_c is not None and ub_c >= 0) or isinstance(rec.ub.owner, memref.DimOp)
    zero, one = e.index(0), e.index(1)
    if lb_c == 0 and step_c == 1 and ub_nonneg:
        trip = ub_v
    else:
        diff = e.sub(ub_v, lb_v)
        q = e.divu(e.add(diff, e.sub(step_v, one)), step_v)
        trip = e.val(arith.SelectOp(e.cmp("sgt", diff, zero), q, zero))

    def step_index(le: Emitter, k: SSAValue) -> SSAValue:
        if lb_c == 0 and step_c == 1:
            return k
        i = k if step_c == 1 else le.mul(k, step_v)
        return i if lb_c == 0 else le.add(i, lb_v)

    return trip, step_index


def finish_nest_kernel(
    k: NestKernel, n: int, s_c: SSAValue, elem_index: Callable[[Emitter, int], list[SSAValue]]
) -> None:
    """After the last tile: a barrier, then thread 0 copies the final state (`n`
    elements in the shared carry `s_c`) into the state buffer (the state argument at
    depth 0) and runs the cloned epilogue; then `gpu.return`."""
    nest, e = k.nest, k.e
    if nest.state_arg is not None or nest.epilogue:
        e.op(gpu.BarrierOp())

        def finish(ie: Emitter) -> None:
            dest = k.state_src if nest.state_arg is not None else k.priv
            for j in range(n):
                ie.store(ie.load(s_c, [ie.index(j)]), dest, elem_index(ie, j))
            m = dict(k.vmap)
            for op in nest.epilogue:
                ie.op(op.clone(value_mapper=m))

        e.if_(e.cmp("eq", k.tid, e.index(0)), [], finish)
    e.op(gpu.ReturnOp([]))
    check_closed(k.kfunc)


def arg_name(nest: Nest, a: BlockArgument) -> str:
    """The kernel argument name of function argument `a` (its name, made unique)."""
    base = a.name_hint or f"arg{a.index}"
    names = [x.name_hint or f"arg{x.index}" for x in nest.kernel_args]
    return base if names.count(base) == 1 else f"{base}_{a.index}"


def guard_last_stores(orig: Operation, new: Operation, last_stores: set[Operation], cond: SSAValue) -> None:
    """Wrap the clones of step-invariant emit stores in `scf.if (last step)`."""
    for o, c in zip(orig.walk(), new.walk()):
        if o in last_stores:
            block = Block()
            if_op = scf.IfOp(cond, [], Region(block))
            Rewriter.insert_op(if_op, InsertPoint.before(c))
            c.detach()
            block.add_op(c)
            block.add_op(scf.YieldOp())


def _covered_sizes(nest: Nest, names: dict[SSAValue, str]) -> tuple[tuple[str, int, str, int], ...]:
    """(arg, dim, other, dim'): wherever a loop running over `other.shape[dim']` (a
    channel loop, or the recurrence from 0 with any positive step) indexes `arg` at
    `dim` directly, or backwards (`other.shape[dim'] - 1 - i`), `arg` must be at least
    that large, or the kernel would read or write past it."""
    loops: dict[SSAValue, tuple[BlockArgument, int]] = {}
    for loop, trip in zip(nest.loops, nest.trips):
        if not isinstance(trip, int):
            loops[loop.body.block.args[0]] = trip
    rec = nest.rec
    bound = _arg_dim(rec.ub, set(names))
    step = const_int(rec.step)
    if bound is not None and const_int(rec.lb) == 0 and step is not None and step >= 1:
        for region in (rec.coeffs, rec.emit):  # the time index stays below the bound
            loops[region.block.args[0]] = bound
    out: set[tuple[str, int, str, int]] = set()
    for _, ref, idx, _ in _accesses([nest.root]):
        if ref not in names:
            continue
        for pos, x in enumerate(idx):
            covered = loops.get(x) or _backwards_index(x, loops, set(names))
            if covered is not None and (ref, pos) != covered:
                out.add((names[ref], pos, names[covered[0]], covered[1]))
    return tuple(sorted(out))


def _backwards_index(
    x: SSAValue, loops: dict[SSAValue, tuple[BlockArgument, int]], fn_args: set[SSAValue]
) -> tuple[BlockArgument, int] | None:
    """(other, dim) when `x` is `(other.shape[dim] - 1) - i` for a loop variable `i`
    running over that same size: a reversed time loop, with the index's range."""
    op = x.owner
    if not isinstance(op, arith.SubiOp) or op.rhs not in loops:
        return None
    last = op.lhs.owner
    if not (isinstance(last, arith.SubiOp) and const_int(last.rhs) == 1):
        return None
    return loops[op.rhs] if _arg_dim(last.lhs, fn_args) == loops[op.rhs] else None


def launch_nest_kernel(nest: Nest, kfunc: gpu.FuncOp, block_size: int, shared_bytes: int, notes: str) -> None:
    """Replace the nest by the launch of `kfunc` (one block per channel iteration) and
    attach its launch description."""
    name = kfunc.sym_name.data
    args = nest.kernel_args
    names = [arg_name(nest, a) for a in args]
    static = all(isinstance(t, int) for t in nest.trips)
    host = Emitter(InsertPoint.before(nest.root))
    if static:
        grid0: int | str = math.prod(nest.trips)  # type: ignore[arg-type]
    else:
        grid0 = "*".join(
            str(t) if isinstance(t, int) else f"{names[args.index(t[0])]}.shape[{t[1]}]" for t in nest.trips
        )
    # the host IR's grid comes from the description's formula (one formula for both)
    nblocks = bg.emit_grid_size(host, grid0, dict(zip(names, args))) if grid0 != 0 else None
    if nblocks is not None:
        one = host.index(1)
        host.op(
            gpu.LaunchFuncOp(
                SymbolRefAttr(bg.KERNEL_MODULE, [name]),
                [nblocks, one, one],
                [host.index(block_size), one, one],
                kernelOperands=list(args),
            )
        )

    def kind(a: SSAValue) -> str:
        w, r = a in nest.stored_args, a in nest.loaded_args
        return "inout" if w and r else "out" if w else "in"

    desc = KernelLaunch(
        kernel_name=name,
        module_name=bg.KERNEL_MODULE,
        func_name=nest.fn.sym_name.data,
        grid=(grid0, 1, 1),
        block=(block_size, 1, 1),
        shared_bytes=shared_bytes,
        args=[
            (n, kind(a), bg.type_name(a.type.element_type), shape_entries(a.type))  # type: ignore[attr-defined]
            if isinstance(a.type, MemRefType)
            else (n, "scalar", bg.type_name(a.type), ())
            for n, a in zip(names, args)
        ],
        host_args=tuple(a.index for a in args),
        covers_dims=_covered_sizes(nest, dict(zip(args, names))),
        notes=notes,
    )
    kfunc.attributes["scanweaver.launch"] = desc.to_attr()
    Rewriter.erase_op(nest.root)
    for load in nest.outside_loads:  # now read in the kernel; the host keeps only launches
        if not load.results[0].uses:
            Rewriter.erase_op(load)


# ---------------------------------------------------------------------------
# A state matrix of any size (gpu_state_matrix.py): depth 0, one block per column
# ---------------------------------------------------------------------------


def match_state_matrix_nest(rec: scan.LoopRecurrence, column_dim: int) -> Nest:
    """The depth-0 nest of `rec` for `gpu_state_matrix.py`: not in channel loops, the
    state a function argument of any shape (not held in registers, so no size limit),
    one block per index of its dimension `column_dim`; values from outside as for any
    nest.  Raises `Unsupported`."""
    loops, fn = _channel_loops(rec)
    if loops:
        raise Unsupported("a state matrix kernel takes a recurrence outside channel loops only")
    if not isinstance(rec.lb.type, IndexType):
        raise Unsupported("the recurrence must step over index values")
    fn_args: set[SSAValue] = set(fn.body.block.args)
    state = rec.state
    if state not in fn_args:
        raise Unsupported("a state matrix kernel needs the state to be a function argument")
    assert isinstance(state, BlockArgument)
    n = rec.state_type.get_shape()[column_dim]
    nest = Nest(fn, rec, [], [], [], [], state, [n if n >= 0 else (state, column_dim)], set())
    _collect_outside_values(nest, fn_args)
    _note_memory_roles(nest)
    return nest


def start_nest_kernel(nest: Nest, name: str) -> tuple[gpu.FuncOp, Emitter, dict[SSAValue, SSAValue]]:
    """An empty kernel over the nest's arguments with the values it captures from
    outside cloned in: (kernel, emitter at its start, nest value -> kernel value)."""
    kfunc, vmap = _kernel_func(nest, name)
    e = Emitter(kfunc.body.block)
    _capture_outside_values(e, nest, vmap)
    return kfunc, e, vmap


def trip_and_step_index(
    e: Emitter, rec: scan.LoopRecurrence, vmap: dict[SSAValue, SSAValue]
) -> tuple[SSAValue, Callable[[Emitter, SSAValue], SSAValue]]:
    """The recurrence's number of steps, and step number k -> its loop index."""
    return _trip_and_step_index(e, rec, vmap)


def emit_store_kind(emit: Block, store: memref.StoreOp) -> tuple | None:
    """How the emit store `store` writes across steps: ("inj", dim, form) one element per
    step, ("last",) the same elements every step, or None (see `_EmitStores`)."""
    return _EmitStores(emit).kind(store)
