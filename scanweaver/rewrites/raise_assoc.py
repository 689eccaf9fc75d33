"""Raise associative, non-affine `iter_args` recurrences to the generic `scan.scan`.

Two shapes are recognised (anything else stays refused with the affine reason):

1. One carried value updated by one associative op with a state-independent
   operand: `h' = op(h, e)` or `op(e, h)` with op one of arith.maximumf / minimumf
   (exact under any association, NaN and signed zeros included), maxsi / minsi /
   maxui / minui, andi / ori / xori (integers: exact).  `h * h`, `exp(h)`, ... do
   not match.  maxnumf / minnumf are refused: llvm.maxnum may return either zero of
   `max(-0, +0)`, so a reassociated scan could differ from the loop.
2. The online log-sum-exp pair (the softmax normaliser):
   `m' = maximumf(m, x)`, `s' = s * exp(m - m') + exp(x - m')`.  Its combine
   `(m1, s1) . (m2, s2) = (M, s1*exp(m1 - M) + s2*exp(m2 - M))`, `M = max(m1, m2)`
   sums floats, so it is raised only with `reassociate=true` (a parallel lowering
   changes the rounding of the sum; the sequential fold is bit-identical).

The loop becomes, with n the trip count:

    X[0] = init; for j < n: X[j+1] = element(t_j)      (producer: the state-independent
                                                          slice of the body, cloned)
    scan.scan ins(X) outs(P) axis 0 { combine }          (P[j+1] = the state after step j)
    for j < n: body(t_j) with the new state = P[j+1]     (consumer: the body, cloned)
    result = P[n]

X and P are `memref.alloc`ed (n+1 elements each) and freed after.  scan.scan's
sequential meaning is a left fold from X[0], which is exactly the loop's order, so the
raised IR matches the loop bit for bit; a parallel lowering may reassociate (exact for
shape 1, within rounding for shape 2).

State kept in memory (`m[0]`, or `m[c]` per channel: the channel loop outside, or
inside and then interchanged) is first carried as iter_args by the promote reshape
(`raise_reshape.py`, the same safety rules as for affine forms: fixed, distinct,
loaded locations; guarded hoisted loads and final stores), then analysed as above
(`analyze_associative_in_memory`).  Sums and products in memory are affine and take
the affine raise.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.dialects import arith, memref, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import DYNAMIC_INDEX, FloatAttr, IndexType, IntegerAttr
from xdsl.ir import Block, BlockArgument, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.dialects.scan import is_supported_state_type
from scanweaver.rewrites.loop_utils import clone_in_loop, inside as _inside
from scanweaver.rewrites.loop_utils import dce_block as _dce
from scanweaver.rewrites.raise_reshape import (
    Reshaped,
    interchange_then_promote,
    promote_memory_state,
)

#: Associative ops that are exact under any association (floats only the IEEE
#: maximum/minimum, which order -0 < +0 and propagate NaN).
EXACT_ASSOCIATIVE = (
    arith.MaximumfOp,
    arith.MinimumfOp,
    arith.MaxSIOp,
    arith.MinSIOp,
    arith.MaxUIOp,
    arith.MinUIOp,
    arith.AndIOp,
    arith.OrIOp,
    arith.XOrIOp,
)


@dataclass
class AssocPlan:
    loop: scf.ForOp
    kind: str  # "single" or "logsumexp"
    combine_op: Operation | None = None  # single: the update op
    state_first: bool = True  # single: the state is the op's first operand
    element: list[SSAValue] | None = None  # state-independent element per value

    @property
    def description(self) -> str:
        if self.kind == "logsumexp":
            return "scan.scan (the online log-sum-exp pair, reassociated)"
        assert self.combine_op is not None
        return f"scan.scan (associative {self.combine_op.name})"


class NotAssociative(Exception):
    """Why a loop is not an associative recurrence (a reason worth reporting), or
    empty when it is simply not of a recognised shape."""


def _depends_on(v: SSAValue, sources: set[SSAValue], loop: scf.ForOp) -> bool:
    seen: set[SSAValue] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        if x in sources:
            return True
        if x in seen or not _inside(x, loop):
            continue
        seen.add(x)
        if isinstance(x.owner, Operation):
            todo.extend(x.owner.operands)
    return False


def _uses_only(v: SSAValue, allowed: set[Operation]) -> bool:
    return all(u.operation in allowed for u in v.uses)


def analyze_associative(loop: scf.ForOp, reassociate: bool) -> AssocPlan:
    """The associative plan for `loop`, or NotAssociative (with a reason or empty)."""
    body = loop.body.block
    args = list(body.args[1:])
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    if not all(is_supported_state_type(a.type) for a in args):
        raise NotAssociative("")
    for op in body.walk():
        if not is_side_effect_free(op) and not isinstance(
            op, memref.LoadOp | memref.StoreOp | scf.ForOp | scf.IfOp | scf.YieldOp
        ):
            raise NotAssociative("")
    written = {op.memref for op in body.walk() if isinstance(op, memref.StoreOp)}
    if len(args) == 1:
        return _single(loop, args[0], yield_op.operands[0], written)
    if len(args) == 2:
        return _logsumexp(loop, args, list(yield_op.operands), written, reassociate)
    raise NotAssociative("")


#: Reshapes that carry memory state as iter_args, tried in order, and how the report
#: says it (the same words as the affine reshapes in raise_affine.py).
_PROMOTIONS = (
    (promote_memory_state, "after carrying the state in memory as iter_args"),
    (interchange_then_promote,
     "after moving the channel loop outside the time loop and carrying the state in "
     "memory as iter_args"),
)


def analyze_associative_in_memory(
    loop: scf.ForOp, reassociate: bool
) -> tuple[AssocPlan, Reshaped, str]:
    """For a loop without iter_args whose state in memory is updated by a non-affine
    op: the promoted copy (inserted before `loop`), its associative plan and how it was
    reshaped.  NotAssociative otherwise, with the promoted form's reason when it has
    one; the IR is then unchanged (the copy is undone)."""
    if loop.iter_args:
        raise NotAssociative("")
    for reshape, how in _PROMOTIONS:
        done = reshape(loop)
        if done is None:
            continue
        try:
            plan = analyze_associative(done.loop, reassociate)
        except NotAssociative as e:
            done.undo()
            raise NotAssociative(f"{e} ({how})" if str(e) else "") from None
        return plan, done, how
    raise NotAssociative("")


def _state_free_element(e: SSAValue, loop: scf.ForOp, sources: set[SSAValue], written) -> None:
    """`e` must not depend on the state nor read memory the loop writes."""
    if _depends_on(e, sources, loop):
        raise NotAssociative("")
    todo, seen = [e], set()
    while todo:
        x = todo.pop()
        if x in seen or not _inside(x, loop):
            continue
        seen.add(x)
        op = x.owner
        if isinstance(op, Block) or isinstance(x, BlockArgument):
            if x is not loop.body.block.args[0]:
                raise NotAssociative("")
            continue
        if op.parent_block() is not loop.body.block:
            raise NotAssociative("")
        if isinstance(op, memref.LoadOp) and op.memref in written:
            raise NotAssociative(
                "an associative update reads an element from a memref that the loop writes"
            )
        if op.regions:
            raise NotAssociative("")
        todo.extend(op.operands)


def _single(loop: scf.ForOp, h: SSAValue, v: SSAValue, written) -> AssocPlan:
    op = v.owner
    if isinstance(op, arith.MaxnumfOp | arith.MinnumfOp):
        raise NotAssociative(
            f"{op.name} is associative but not exactly (llvm.maxnum/minnum may return "
            "either zero for -0 and +0); use arith.maximumf / arith.minimumf"
        )
    if not isinstance(op, EXACT_ASSOCIATIVE) or op.parent_block() is not loop.body.block:
        raise NotAssociative("")
    lhs, rhs = op.operands
    if lhs is h and rhs is not h:
        first, e = True, rhs
    elif rhs is h and lhs is not h:
        first, e = False, lhs
    else:
        raise NotAssociative("")
    if not _uses_only(h, {op}):
        raise NotAssociative("")
    _state_free_element(e, loop, {h}, written)
    return AssocPlan(loop, "single", op, first, [e])


def _match(v: SSAValue, op_type, *want) -> Operation | None:
    """v's defining op if it is `op_type` with operands matching `want` in some order
    (a `None` in want matches anything)."""
    op = v.owner
    if not isinstance(op, op_type):
        return None
    ops = list(op.operands)
    for order in (ops, ops[::-1]) if len(ops) == 2 else (ops,):
        if all(w is None or w is o for w, o in zip(want, order)):
            return op
    return None


def _logsumexp(loop, args, new, written, reassociate: bool) -> AssocPlan:
    m, s = args
    mn, sn = new
    mx = _match(mn, arith.MaximumfOp, m, None)
    if mx is None:
        raise NotAssociative("")
    x = mx.operands[1] if mx.operands[0] is m else mx.operands[0]
    add = _match(sn, arith.AddfOp)
    if add is None:
        raise NotAssociative("")
    parts = list(add.operands)
    for scaled, fresh in (parts, parts[::-1]):
        mul = _match(scaled, arith.MulfOp, s, None)
        if mul is None:
            continue
        e1 = mul.operands[1] if mul.operands[0] is s else mul.operands[0]
        ok1 = isinstance(e1.owner, mathd.ExpOp) and _match(e1.owner.operand, arith.SubfOp) is not None
        ok2 = isinstance(fresh.owner, mathd.ExpOp) and _match(fresh.owner.operand, arith.SubfOp) is not None
        if not (ok1 and ok2):
            continue
        d1, d2 = e1.owner.operand.owner, fresh.owner.operand.owner
        if list(d1.operands) == [m, mn] and list(d2.operands) == [x, mn]:
            break
    else:
        raise NotAssociative("")
    inner = {mx, add, mul, e1.owner, fresh.owner, d1, d2}
    if not _uses_only(m, {mx, d1}) or not _uses_only(s, {mul}):
        raise NotAssociative("")
    for v in (e1, fresh, d1.results[0], d2.results[0], scaled):
        if not _uses_only(v, inner):
            raise NotAssociative("")
    _state_free_element(x, loop, {m, s}, written)
    if not reassociate:
        raise NotAssociative(
            "an online log-sum-exp pair is associative, but its combine sums floats: "
            "raised to scan.scan only with reassociate=true (see the README's numerics)"
        )
    return AssocPlan(loop, "logsumexp", element=[x])


# ---------------------------------------------------------------------------
# Rewrite
# ---------------------------------------------------------------------------


def _index(b: Builder, v: int) -> SSAValue:
    return b.insert(arith.ConstantOp(IntegerAttr(v, IndexType()))).result


def _trip_count(b: Builder, loop: scf.ForOp) -> SSAValue:
    """max(0, ceil((ub - lb) / step)) (scf.for steps are positive)."""
    span = b.insert(arith.SubiOp(loop.ub, loop.lb)).result
    zero = _index(b, 0)
    span = b.insert(arith.MaxSIOp(span, zero)).result
    return b.insert(arith.CeilDivUIOp(span, loop.step)).result


def _time_of(b: Builder, loop: scf.ForOp, j: SSAValue) -> SSAValue:
    scaled = b.insert(arith.MuliOp(j, loop.step)).result
    return b.insert(arith.AddiOp(loop.lb, scaled)).result


def _combine_region(plan: AssocPlan, types) -> Region:
    block = Block(arg_types=[*types, *types])
    b = Builder(InsertPoint.at_end(block))
    if plan.kind == "single":
        acc, cur = block.args
        op = plan.combine_op
        assert op is not None
        operands = (acc, cur) if plan.state_first else (cur, acc)
        r = b.insert(op.clone(value_mapper=dict(zip(op.operands, operands)))).results[0]
        b.insert(scan.YieldOp(r))
    else:
        m1, s1, m2, s2 = block.args
        big = b.insert(arith.MaximumfOp(m1, m2)).result
        e1 = b.insert(mathd.ExpOp(b.insert(arith.SubfOp(m1, big)).result)).result
        e2 = b.insert(mathd.ExpOp(b.insert(arith.SubfOp(m2, big)).result)).result
        t1 = b.insert(arith.MulfOp(s1, e1)).result
        t2 = b.insert(arith.MulfOp(s2, e2)).result
        b.insert(scan.YieldOp(big, b.insert(arith.AddfOp(t1, t2)).result))
    return Region(block)


def raise_associative(plan: AssocPlan) -> Operation:
    """Replace the loop by producer loop + scan.scan + consumer loop; returns the scan."""
    loop = plan.loop
    body = loop.body.block
    args = list(body.args[1:])
    types = [a.type for a in args]
    b = Builder(InsertPoint.before(loop))
    n = _trip_count(b, loop)
    one = _index(b, 1)
    zero = _index(b, 0)
    n1 = b.insert(arith.AddiOp(n, one)).result
    ins = [
        b.insert(memref.AllocOp.get(t, shape=[DYNAMIC_INDEX], dynamic_sizes=[n1])).memref
        for t in types
    ]
    outs = [
        b.insert(memref.AllocOp.get(t, shape=[DYNAMIC_INDEX], dynamic_sizes=[n1])).memref
        for t in types
    ]
    for init, x in zip(loop.iter_args, ins):
        b.insert(memref.StoreOp.get(init, x, [zero]))

    # Producer: X[j+1] = element(t_j).
    pblock = Block(arg_types=[IndexType()])
    pb = Builder(InsertPoint.at_end(pblock))
    j = pblock.args[0]
    mapper: dict[SSAValue, SSAValue] = {body.args[0]: _time_of(pb, loop, j)}
    j1 = pb.insert(arith.AddiOp(j, _index(pb, 1))).result
    elements = [clone_in_loop(e, mapper, pb, loop) for e in plan.element or []]
    if plan.kind == "logsumexp":
        elements.append(
            pb.insert(arith.ConstantOp(FloatAttr(1.0, types[1]))).result  # type: ignore[arg-type]
        )
    for v, x in zip(elements, ins):
        pb.insert(memref.StoreOp.get(v, x, [j1]))
    pb.insert(scf.YieldOp())
    b.insert(scf.ForOp(zero, n, one, [], Region(pblock)))

    rec = b.insert(scan.ScanOp(ins, outs, 0, _combine_region(plan, types)))

    # Consumer: the body with the new state read from P[j+1].
    cblock = Block(arg_types=[IndexType()])
    cb = Builder(InsertPoint.at_end(cblock))
    j = cblock.args[0]
    cmap: dict[SSAValue, SSAValue] = {body.args[0]: _time_of(cb, loop, j)}
    j1 = cb.insert(arith.AddiOp(j, _index(cb, 1))).result
    for a, p in zip(args, outs):
        cmap[a] = cb.insert(memref.LoadOp.get(p, [j])).res  # the previous state
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    new_loads = [cb.insert(memref.LoadOp.get(p, [j1])).res for p in outs]
    for op in body.ops:
        if op is not yield_op:
            cb.insert(op.clone(value_mapper=cmap))
    for v, ld in zip(yield_op.operands, new_loads):
        if v in cmap and cmap[v] is not ld and _inside(v, loop):
            cmap[v].replace_all_uses_with(ld)
    cb.insert(scf.YieldOp())
    _dce(cblock)
    if any(op for op in cblock.ops if not isinstance(op, scf.YieldOp)) and _has_effects(cblock):
        b.insert(scf.ForOp(zero, n, one, [], Region(cblock)))
    after = Builder(InsertPoint.before(loop))
    for r, p in zip(loop.results, outs):
        r.replace_all_uses_with(after.insert(memref.LoadOp.get(p, [n])).res)
    for x in ins + outs:
        after.insert(memref.DeallocOp.get(x))
    loop.detach()
    loop.erase()
    return rec


def _has_effects(block: Block) -> bool:
    return any(isinstance(op, memref.StoreOp) for op in block.walk())


