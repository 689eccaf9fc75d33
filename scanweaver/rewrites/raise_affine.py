"""`scanweaver-raise`: find affine recurrences in `scf.for` loops, rewrite them as scans.

Which loops qualify, and the plan for each (state shape, symbolic forms, or the reason
to refuse), is decided in `raise_analysis.py`; this file builds the scan ops from the
plans and holds the pass.

The raised op gets:
* `coeffs`: the state-independent slice of the body that the coefficients need, cloned
  (time index -> region argument 0, channel index -> argument 1), then arith ops
  building (a, b) from the symbolic forms;
* `emit`: the whole body cloned, with the new state replaced by a load of the state
  memref, the state store dropped (or made write-through), then dead code removed.

Loops nested inside a scan op are left alone.
With `diagnose=true`, each loop that carries state gets one line on stderr:
`<loc>: scanweaver-raise: loop raised to <op> (<shape>)` or
`<loc>: scanweaver-raise: loop not raised: <reason>`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    FileLineColLoc,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
)
from xdsl.ir import Block, Operation, OpResult, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan
from scanweaver.dialects.scan import LinearRecurrenceOp
from scanweaver.rewrites.affine_form import Materializer
from scanweaver.rewrites.loop_utils import clone_in_loop as _clone_index
from scanweaver.rewrites.loop_utils import const_scalar, loop_nest
from scanweaver.rewrites.loop_utils import dce_block as _dce
from scanweaver.rewrites.loop_utils import inside as _inside
from scanweaver.rewrites.raise_analysis import (
    RaiseDecision,
    RaisePlan,
    analyze_loop,
    const_index_value,
)
from scanweaver.rewrites.raise_split import split_carried_values
from scanweaver.rewrites.raise_reshape import (
    interchange_channel_loop,
    interchange_then_promote,
    promote_memory_state,
)

# ---------------------------------------------------------------------------
# Rewrite
# ---------------------------------------------------------------------------


def _index(b: Builder, v: int) -> SSAValue:
    return b.insert(arith.ConstantOp(IntegerAttr(v, IndexType()))).result


def raise_loop(plan: RaisePlan) -> Operation:
    """Replace the analysed loop by its scan op; returns the new op."""
    loop = plan.loop
    el = plan.element_type
    k = len(plan.forms)
    before = Builder(InsertPoint.before(loop))
    if plan.kind in ("scalar", "linear"):
        shape: list[int] = [] if plan.kind == "scalar" else [k]
        state = before.insert(memref.AllocaOp.get(el, shape=shape)).memref
        for j, init in enumerate(loop.iter_args):
            idx = [] if plan.kind == "scalar" else [_index(before, j)]
            before.insert(memref.StoreOp.get(init, state, idx))
        for j in range(len(loop.iter_args), k):  # escaping values: set every step
            zero = const_scalar(before, 0, el)
            before.insert(memref.StoreOp.get(zero, state, [_index(before, j)]))
    else:
        assert plan.store is not None
        m = plan.store.memref
        if plan.direct:
            state = m
        elif plan.time_pos is not None:
            state = _state_alloca(before, plan)
            _shifted_copy_in(before, plan, m, state)
        elif plan.kind == "memref":
            state = before.insert(memref.AllocaOp.get(el, shape=[])).memref
            v = before.insert(memref.LoadOp.get(m, list(plan.store.indices))).res
            before.insert(memref.StoreOp.get(v, state, []))
        else:
            state = _state_alloca(before, plan)
            _copy_in(before, plan, m, state)
    coeffs = _build_coeffs(plan)
    emit = _build_emit(plan, state)
    op_type = LinearRecurrenceOp if plan.is_linear else scan.RecurrenceOp
    rec = before.insert(op_type(loop.lb, loop.ub, loop.step, state, coeffs, emit))
    if loop.res:
        after = Builder(InsertPoint.after(rec))
        for j, r in enumerate(loop.res):
            idx = [] if plan.kind == "scalar" else [_index(after, j)]
            r.replace_all_uses_with(after.insert(memref.LoadOp.get(state, idx)).res)
    loop.detach()
    loop.erase()
    return rec


def _state_alloca(b: Builder, plan: RaisePlan) -> SSAValue:
    """A temporary state: rank 0, or the channel shape (dynamic when the count is)."""
    el = plan.element_type
    if plan.kind == "memref":
        shape = [plan.order] if plan.is_linear else []
        return b.insert(memref.AllocaOp.get(el, shape=shape)).memref
    counts = [const_index_value(c.ub) for c in plan.chan_order]
    shape = [DYNAMIC_INDEX if n is None else n for n in counts]
    dynamic = [c.ub for c, n in zip(plan.chan_order, counts) if n is None]
    return b.insert(memref.AllocaOp.get(el, shape=shape, dynamic_sizes=dynamic)).memref


def _channel_count(b: Builder, plan: RaisePlan) -> SSAValue:
    if plan.channels:
        return _index(b, plan.channels)
    assert plan.chan_ub is not None
    return plan.chan_ub


def _copy_in(b: Builder, plan: RaisePlan, m: SSAValue, state: SSAValue) -> None:
    """state[n...] <- m[the store's indices, channel indices replaced by n...]."""
    assert plan.store is not None and plan.chan_loop is not None
    ivs = [c.body.block.args[0] for c in plan.chan_order]
    counts = [
        _index(b, n) if (n := const_index_value(c.ub)) is not None else c.ub
        for c in plan.chan_order
    ]

    def body(inner: Builder, ns) -> None:
        by_iv = dict(zip(ivs, ns))
        idx = [by_iv.get(x, x) for x in plan.store.indices]
        v = inner.insert(memref.LoadOp.get(m, idx)).res
        inner.insert(memref.StoreOp.get(v, state, list(ns)))

    loop_nest(b, counts, body)

def _multilag_copy_in(b: Builder, plan: RaisePlan, m: SSAValue, state: SSAValue) -> None:
    """state[j-1] <- m[.., t(lb) + j*d] (d = -step forwards): the element the loop
    reads j steps back at its first step, j = 1..K.

    The loop reads that element at step K - j (as lag K) or at step 0 (when it reads
    lag j), so it exists only if the loop runs that many steps; otherwise the state
    value is never used and starts at 0 (never garbage: 0 * NaN would leak into the
    companion rows)."""
    loop = plan.loop
    el = plan.element_type
    k = plan.order
    ld0, lag0 = plan.shift_loads[0], plan.lags[0]
    pos = plan.time_pos
    assert pos is not None
    stride = plan.lag_stride
    loaded = set(plan.lags)
    lb, ub, step = (const_index_value(v) for v in (loop.lb, loop.ub, loop.step))
    assert step is not None
    for j in range(1, k + 1):
        first_read = 0 if j in loaded else k - j  # the step that reads it first
        target, branch = b, None
        if lb is not None and ub is not None:
            if lb + first_read * step >= ub:
                v = const_scalar(b, 0, el)
                b.insert(memref.StoreOp.get(v, state, [_index(b, j - 1)]))
                continue
        else:
            start = loop.lb
            if first_read:
                off = _index(b, first_read * step)
                start = b.insert(arith.AddiOp(loop.lb, off)).result
            cond = b.insert(arith.CmpiOp(start, loop.ub, "slt")).result
            then, other = Block(), Block()
            branch = b.insert(scf.IfOp(cond, [el], Region(then), Region(other)))
            target = Builder(InsertPoint.at_end(then))
        mapper: dict[SSAValue, SSAValue] = {loop.body.block.args[0]: loop.lb}
        idx = [_clone_index(x, mapper, target, loop) for x in ld0.indices]
        if j != lag0:
            shift = _index(target, (j - lag0) * stride)
            idx[pos] = target.insert(arith.AddiOp(idx[pos], shift)).result
        v = target.insert(memref.LoadOp.get(m, idx)).res
        if branch is not None:
            target.insert(scf.YieldOp(v))
            other_b = Builder(InsertPoint.at_end(branch.false_region.block))
            other_b.insert(scf.YieldOp(const_scalar(other_b, 0, el)))
            v = branch.results[0]
        b.insert(memref.StoreOp.get(v, state, [_index(b, j - 1)]))


def _shifted_copy_in(b: Builder, plan: RaisePlan, m: SSAValue, state: SSAValue) -> None:
    """state <- m[.., t(lb) - step]: what the first step's state loads read.

    Guarded by `lb < ub` (the element may not exist when the loop runs no step);
    with constant bounds the guard is decided here."""
    loop = plan.loop
    if plan.is_linear:
        _multilag_copy_in(b, plan, m, state)
        return
    ld0 = plan.shift_loads[0]
    lb, ub = const_index_value(loop.lb), const_index_value(loop.ub)
    if lb is not None and ub is not None:
        if lb >= ub:
            return
        target = b
    else:
        cond = b.insert(arith.CmpiOp(loop.lb, loop.ub, "slt")).result
        then = Block()
        b.insert(scf.IfOp(cond, [], Region(then)))
        target = Builder(InsertPoint.at_end(then))
    mapper: dict[SSAValue, SSAValue] = {loop.body.block.args[0]: loop.lb}
    if plan.chan_loop is None:
        idx = [_clone_index(x, mapper, target, loop) for x in ld0.indices]
        v = target.insert(memref.LoadOp.get(m, idx)).res
        target.insert(memref.StoreOp.get(v, state, []))
    else:
        block = Block(arg_types=[IndexType()])
        n = block.args[0]
        mapper[plan.chan_loop.body.block.args[0]] = n
        inner = Builder(InsertPoint.at_end(block))
        idx = [_clone_index(x, mapper, inner, loop) for x in ld0.indices]
        v = inner.insert(memref.LoadOp.get(m, idx)).res
        inner.insert(memref.StoreOp.get(v, state, [n]))
        inner.insert(scf.YieldOp())
        zero, chans, one = _index(target, 0), _channel_count(target, plan), _index(target, 1)
        target.insert(scf.ForOp(zero, chans, one, [], Region(block)))
    if target is not b:
        target.insert(scf.YieldOp())


def _build_coeffs(plan: RaisePlan) -> Region:
    loop = plan.loop
    rank = len(plan.chan_order) if plan.kind == "vector" else 0
    block = Block(arg_types=[IndexType()] * (1 + rank))
    _copy_hint(loop, block.args[0])
    mapper: dict[SSAValue, SSAValue] = {loop.body.block.args[0]: block.args[0]}
    for chan, arg in zip(plan.chan_order, block.args[1:]):
        _copy_hint(chan, arg)
        mapper[chan.body.block.args[0]] = arg
    b = Builder(InsertPoint.at_end(block))

    def cloner(at: Builder, mapper: dict[SSAValue, SSAValue]):
        """Clones a leaf's state-independent slice at `at` (once per mapper)."""

        def leaf_value(v: SSAValue) -> SSAValue:
            if v in mapper:
                return mapper[v]
            if not _inside(v, loop):
                return v
            op = v.owner
            assert isinstance(op, Operation)
            for u in op.operands:
                leaf_value(u)
            at.insert(op.clone(value_mapper=mapper))
            return mapper[v]

        return leaf_value

    # Branches of masked updates clone into their own block, with their own mapper.
    mat = Materializer(
        b, plan.element_type, cloner(b, mapper), lambda at: cloner(at, dict(mapper))
    )
    k = len(plan.forms)
    if plan.is_linear:
        values = [mat.emit(plan.forms[j].coef(c)) for j in range(k) for c in range(k)]
        # (A -0.0 addend would not make the companion rows exact: their 0*s terms
        # already lose the sign of a zero; keep the plain 0.)
        values += [mat.emit(f.const) for f in plan.forms]
    else:
        values = [mat.emit(plan.forms[0].coef(0)), mat.emit_addend(plan.forms[0].const)]
    b.insert(scan.YieldOp(*values))
    return Region(block)


def _build_emit(plan: RaisePlan, state: SSAValue) -> Region:
    loop = plan.loop
    st = state.type
    assert isinstance(st, MemRefType)
    block = Block(arg_types=[IndexType(), st])
    i, s = block.args
    _copy_hint(loop, i)
    b = Builder(InsertPoint.at_end(block))
    mapper: dict[SSAValue, SSAValue] = {loop.body.block.args[0]: i}
    placeholders: list[SSAValue] = []
    if plan.kind in ("scalar", "linear"):
        for j, arg in enumerate(loop.body.block.args[1:]):
            idx = [] if plan.kind == "scalar" else [_index(b, j)]
            ld = b.insert(memref.LoadOp.get(s, idx)).res
            placeholders.append(ld)
            mapper[arg] = ld
    elif plan.direct:
        mapper[state] = s
    body_ops = [op for op in loop.body.block.ops if not isinstance(op, scf.YieldOp)]
    originals = [x for op in body_ops for x in op.walk()]
    clones = []
    for op in body_ops:
        c = op.clone(value_mapper=mapper)
        b.insert(c)
        clones.append(c)
    clone_of = dict(zip(originals, [x for c in clones for x in c.walk()]))
    if plan.kind in ("scalar", "linear"):
        # Escaping previous-state values first (while a placeholder still stands for
        # the previous state only): every cloned use reads their state component.
        after = Builder(InsertPoint.after(placeholders[-1].owner))
        for e, v in enumerate(plan.escapes):
            j = len(placeholders) + e
            ld = after.insert(memref.LoadOp.get(s, [_index(after, j)])).res
            mapper[v].replace_all_uses_with(ld)
            after = Builder(InsertPoint.after(ld.owner))
        yield_op = loop.body.block.last_op
        assert isinstance(yield_op, scf.YieldOp)
        for v, ld in zip(yield_op.arguments, placeholders):
            if isinstance(v, OpResult) and _inside(v, loop):
                mapper[v].replace_all_uses_with(ld)
    else:
        assert plan.store is not None
        store = clone_of[plan.store]
        assert isinstance(store, memref.StoreOp)
        idx: list[SSAValue] = []
        if plan.is_linear:
            # the newest element of the companion state
            idx = [_index(Builder(InsertPoint.before(store)), 0)]
        elif plan.chan_loop is not None:
            idx = [clone_of[c].body.block.args[0] for c in plan.chan_order]  # type: ignore[union-attr]
        ld = memref.LoadOp.get(s, idx)
        Builder(InsertPoint.before(store)).insert(ld)
        v = store.value
        cloned_ops = set(clone_of.values())
        if isinstance(v, OpResult) and v.owner in cloned_ops:
            v.replace_all_uses_with(ld.res)
        else:
            store.operands = (ld.res, *store.operands[1:])
        if plan.direct:
            store.detach()
            store.erase()
    b.insert(scan.YieldOp())
    _dce(block)
    return Region(block)


def _copy_hint(loop: scf.ForOp, arg: SSAValue) -> None:
    arg.name_hint = loop.body.block.args[0].name_hint


# ---------------------------------------------------------------------------
# Pass
# ---------------------------------------------------------------------------

_SCAN_OPS = (scan.RecurrenceOp, scan.ScanOp, LinearRecurrenceOp)


def _in_scan_op(op: Operation) -> bool:
    p = op.parent_op()
    while p is not None:
        if isinstance(p, _SCAN_OPS):
            return True
        p = p.parent_op()
    return False


def _labels(module: Operation) -> dict[Operation, str]:
    """A printable location per loop: its `loc(...)` if any, else @func:scf.for#k."""
    labels: dict[Operation, str] = {}
    for fn in module.walk():
        if not isinstance(fn, func.FuncOp):
            continue
        loops = [op for op in fn.walk() if isinstance(op, scf.ForOp)]
        for k, op in enumerate(loops):
            loc = op.location
            if isinstance(loc, FileLineColLoc):
                labels[op] = f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
            else:
                labels[op] = f"@{fn.sym_name.data}:scf.for#{k}"
    return labels


def describe(plan: RaisePlan) -> str:
    """What a plan raises to, in words (for diagnostics)."""
    if plan.kind == "scalar":
        return "scan.recurrence (one carried value)"
    if plan.kind == "linear":
        k = len(plan.loop.iter_args)
        extra = (
            f" and {len(plan.escapes)} escaping value(s) as extra state" if plan.escapes else ""
        )
        return f"scan.linear_recurrence ({k} coupled carried value(s){extra})"
    if plan.time_pos is not None and plan.is_linear:
        return f"scan.linear_recurrence (a {plan.order}-lag recurrence on its companion state)"
    if plan.time_pos is not None:
        where = "channel vector" if plan.kind == "vector" else "scalar"
        return f"scan.recurrence ({where} state at a shifted index)"
    if plan.kind == "memref":
        return "scan.recurrence (state at one memref location)"
    rank = len(plan.chan_order)
    dyn = any(const_index_value(c.ub) is None for c in plan.chan_order)
    return (
        f"scan.recurrence ({rank}-d channel state{', dynamic channel count' if dyn else ''}"
        f"{', the memref itself' if plan.direct else ', a temporary written through'})"
    )


#: Refusals a reshape of the loop (raise_reshape.py) may get past, and the reshape.
_RESHAPES = (
    ("multi-lag recurrence inside a channel loop", interchange_channel_loop,
     "after moving the channel loop outside the time loop"),
    ("several memref locations carry state", promote_memory_state,
     "after carrying the state in memory as iter_args"),
    ("several memref locations carry state", interchange_then_promote,
     "after moving the channel loop outside the time loop and carrying the state in "
     "memory as iter_args"),
    ("escapes the update", promote_memory_state,
     "after carrying the state in memory as iter_args"),
    ("escapes the update", interchange_then_promote,
     "after moving the channel loop outside the time loop and carrying the state in "
     "memory as iter_args"),
    ("carried values have different types", split_carried_values,
     "after splitting the loop into one loop per independent carried value"),
)


def _try_reshapes(
    loop: scf.ForOp, decision: RaiseDecision, labels: dict[Operation, str]
) -> tuple[RaiseDecision, str]:
    """Retry a refused loop in a reshaped form.  Raisable: the decision on the new loop
    (the original is erased) and how it was reshaped, to append to the report line.
    Refused too: the reshape is undone (the IR unchanged) and the reason is the one
    found on the reshaped form, which is more precise than the first one."""
    for needle, reshape, how in _RESHAPES:
        if needle not in decision.reason:
            continue
        done = reshape(loop)
        if done is None:
            continue
        new = analyze_loop(done.loop)
        if new.affine:
            for op in done.inserted:  # the new loops are reported as the original
                for inner in op.walk():
                    if isinstance(inner, scf.ForOp):
                        labels[inner] = labels.get(loop, "<unknown>")
            done.commit()
            loop.detach()
            loop.erase()
            return new, f", {how}"
        done.undo()
        return RaiseDecision(False, f"{new.reason} ({how})", kind=decision.kind), ""
    return decision, ""


def raise_recurrences(
    module: Operation, reassociate: bool = False, report: list[str] | None = None
) -> tuple[list[Operation], list[str]]:
    """Raise every affine loop in `module` (and associative `iter_args` loops to
    scan.scan, see raise_assoc.py); return the new ops and the diagnostics.

    `reassociate`: also raise associative recurrences whose combine sums or
    multiplies floats (the online log-sum-exp pair).  `report`, when given, gets one
    line per loop that carries state, raised or not, in program order."""
    from scanweaver.rewrites.raise_assoc import (
        NotAssociative,
        analyze_associative,
        analyze_associative_in_memory,
        raise_associative,
    )

    labels = _labels(module)
    tried: set[Operation] = set()
    raised: list[Operation] = []
    diags: list[str] = []
    while True:
        for op in module.walk():
            if isinstance(op, scf.ForOp) and op not in tried and not _in_scan_op(op):
                tried.add(op)
                decision = analyze_loop(op)
                label = labels.get(op, "<unknown>")
                how = ""
                if not decision.affine:
                    decision, how = _try_reshapes(op, decision, labels)
                if decision.affine:
                    assert decision.plan is not None
                    what = describe(decision.plan)
                    raised.append(raise_loop(decision.plan))
                    if report is not None:
                        report.append(f"{label}: scanweaver-raise: loop raised to {what}{how}")
                    break
                if decision.kind in ("scalar", "linear") and op.iter_args:
                    try:
                        assoc = analyze_associative(op, reassociate)
                    except NotAssociative as e:
                        if str(e):
                            decision = RaiseDecision(False, str(e), kind=decision.kind)
                    else:
                        what = assoc.description
                        raised.append(raise_associative(assoc))
                        if report is not None:
                            report.append(f"{label}: scanweaver-raise: loop raised to {what}")
                        break
                if "not affine" in decision.reason and not op.iter_args:
                    try:  # state in memory: promoted to iter_args, then as above
                        assoc, done, how = analyze_associative_in_memory(op, reassociate)
                    except NotAssociative as e:
                        if str(e):
                            decision = RaiseDecision(False, str(e), kind=decision.kind)
                    else:
                        for new in done.inserted:  # the new loops are reported as the original
                            for inner in new.walk():
                                if isinstance(inner, scf.ForOp):
                                    labels[inner] = label
                        op.detach()
                        op.erase()
                        what = assoc.description
                        raised.append(raise_associative(assoc))
                        if report is not None:
                            report.append(f"{label}: scanweaver-raise: loop raised to {what}, {how}")
                        break
                if decision.kind != "none":
                    line = f"{label}: scanweaver-raise: loop not raised: {decision.reason}"
                    diags.append(line)
                    if report is not None:
                        report.append(line)
        else:
            return raised, diags


@dataclass(frozen=True)
class RaiseRecurrences(ModulePass):
    """Rewrite affine `scf.for` recurrences into `scan.recurrence` /
    `scan.linear_recurrence`; with `diagnose`, say on stderr why a loop was not."""

    name = "scanweaver-raise"

    diagnose: bool = False
    reassociate: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        report: list[str] = []
        raise_recurrences(op, self.reassociate, report)
        if self.diagnose:
            for line in report:
                print(line, file=sys.stderr)
