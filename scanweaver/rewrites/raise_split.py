"""Split a loop whose carried values have different types into one loop per
independent group of carried values, a reshape `scanweaver-raise` tries on loops the
analysis refused with "carried values have different types" (see `raise_affine.py`).

A scan op carries one state type, so `iter_args(%h: f32, %cnt: i32)` cannot become one
scan op.  When the values do not depend on each other (an f32 EMA beside an i32 step
counter), the loop is the same as one loop per group run one after the other:

    for t iter_args(h, cnt) { x = a[t]; h' = k*h + x; cnt' = cnt + 1; y[t] = h'; n[t] = cnt' }
 -> for t iter_args(h)   { x = a[t]; h' = k*h + x; y[t] = h' }
    for t iter_args(cnt) { cnt' = cnt + 1; n[t] = cnt' }

Legal when each part keeps its own ops in their order and no memory dependence
crosses parts: every side-effecting op depends on the carried values of at most one
group (a store of a value built from both stays unsplit), and a memref that one part
writes is not accessed by any other part (loads that only read are cloned into every
part that needs them).  The body must be straight-line: loads, stores and pure ops
without regions.
"""

from __future__ import annotations

from xdsl.dialects import memref, scf
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.rewrites.loop_utils import inside
from scanweaver.rewrites.raise_analysis import analyze_loop
from scanweaver.rewrites.raise_reshape import Reshaped


def _straight_line(loop: scf.ForOp) -> bool:
    return all(
        isinstance(op, memref.LoadOp | memref.StoreOp | scf.YieldOp) or (not op.regions and is_side_effect_free(op))
        for op in loop.body.block.ops
    )


def _carried_groups(loop: scf.ForOp) -> tuple[list[int], dict[Operation, set[int]]]:
    """(group of each carried value, the carried values each body op depends on): two
    carried values are in one group when either's update reads the other."""
    body = loop.body.block
    carried = {arg: k for k, arg in enumerate(body.args[1:])}
    deps: dict[Operation, set[int]] = {}
    for op in body.ops:
        deps[op] = {carried[v] for v in op.operands if v in carried}
        for v in op.operands:
            if isinstance(v.owner, Operation) and v.owner in deps:
                deps[op] |= deps[v.owner]
    group = list(range(len(carried)))

    def find(k: int) -> int:
        while group[k] != k:
            k = group[k]
        return k

    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    for k, v in enumerate(yield_op.arguments):
        reads = {k} | ({carried[v]} if v in carried else deps.get(v.owner, set()))  # type: ignore[arg-type]
        for j in reads:
            group[find(j)] = find(k)
    return [find(k) for k in range(len(carried))], deps


def _part_ops(loop: scf.ForOp, keep: list[Operation]) -> set[Operation]:
    """`keep` and every body op they use, transitively."""
    needed: set[Operation] = set()
    work = list(keep)
    while work:
        op = work.pop()
        if op in needed:
            continue
        needed.add(op)
        work.extend(v.owner for v in op.operands if isinstance(v.owner, Operation) and inside(v, loop))
    return needed


def _parts(loop: scf.ForOp) -> list[tuple[list[int], set[Operation]]] | None:
    """Per group of carried values (in order): the values, and the body ops its loop
    keeps; None when the loop cannot be split legally."""
    group, deps = _carried_groups(loop)
    roots = sorted(set(group))
    if len(roots) < 2:
        return None
    body = loop.body.block
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    effects: dict[int, list[Operation]] = {r: [] for r in roots}
    for op in body.ops:
        if isinstance(op, memref.StoreOp):
            owners = {group[k] for k in deps[op]}
            if len(owners) > 1:
                return None  # a store of a value built from two groups
            effects[owners.pop() if owners else roots[0]].append(op)
    parts = []
    for r in roots:
        values = [k for k in range(len(group)) if group[k] == r]
        keep = effects[r] + [v.owner for k in values if isinstance((v := yield_op.arguments[k]).owner, Operation)
                             and inside(v, loop)]
        parts.append((values, _part_ops(loop, keep)))
    written = [{op.memref for op in ops if isinstance(op, memref.StoreOp)} for _, ops in parts]
    for i, (_, ops) in enumerate(parts):
        accessed = {op.memref for op in ops if isinstance(op, memref.LoadOp | memref.StoreOp)}
        if any(accessed & w for j, w in enumerate(written) if j != i):
            return None  # a memory dependence between parts
    return parts


def split_carried_values(loop: scf.ForOp) -> Reshaped | None:
    """One loop per independent group of `loop`'s carried values, inserted before it;
    `Reshaped.loop` is the first, and `commit` points the original results at the new
    loops' (the caller erases the original).  None when the split is not legal."""
    if not loop.iter_args or not _straight_line(loop):
        return None
    parts = _parts(loop)
    if parts is None:
        return None
    body = loop.body.block
    new_loops: list[scf.ForOp] = []
    results: dict[int, SSAValue] = {}
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    for values, ops in parts:
        new_body = Block(arg_types=[body.args[0].type, *(body.args[1 + k].type for k in values)])
        mapper: dict[SSAValue, SSAValue] = dict(zip([body.args[0], *(body.args[1 + k] for k in values)],
                                                    new_body.args))
        for old, new in zip([body.args[0], *(body.args[1 + k] for k in values)], new_body.args):
            new.name_hint = old.name_hint
        for op in body.ops:
            if op in ops:
                new_body.add_op(op.clone(value_mapper=mapper))
        new_body.add_op(scf.YieldOp(*[mapper.get(yield_op.operands[k], yield_op.operands[k]) for k in values]))
        part = scf.ForOp(loop.lb, loop.ub, loop.step, [loop.iter_args[k] for k in values], Region(new_body))
        Rewriter.insert_op(part, InsertPoint.before(loop))
        for j, k in enumerate(values):
            results[k] = part.results[j]
            part.results[j].name_hint = loop.results[k].name_hint
        new_loops.append(part)

    def commit() -> None:
        for k, res in enumerate(loop.results):
            res.replace_all_uses_with(results[k])

    # the caller raises the loop it is given and then finds the others on its own: give
    # it one the analysis takes, so that a part left as a loop (a plain reduction such
    # as a final count) does not keep the others from being raised
    first = next((p for p in new_loops if analyze_loop(p).affine), new_loops[0])
    return Reshaped(first, list(new_loops), commit)


__all__ = ["split_carried_values"]
