"""Small IR-building helpers shared by the lowerings: constants, dims, loop nests.

Each helper inserts at a `Builder`'s insertion point and returns SSA values, so that
lowerings read as the loops they produce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from xdsl.builder import Builder
from xdsl.dialects import arith, memref, scf
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    ComplexType,
    Float16Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter


def const_index(b: Builder, value: int) -> SSAValue:
    return b.insert(arith.ConstantOp(IntegerAttr(value, IndexType()))).result


def const_scalar(b: Builder, value: float | int, t: Attribute) -> SSAValue:
    if isinstance(t, ComplexType):  # value + 0i
        from xdsl.dialects import complex as complex_d  # (here: its import is 40 ms of a real kernel's cold build)

        return b.insert(complex_d.ConstantOp.from_floats((float(value), 0.0), t.element_type)).complex
    attr = IntegerAttr(int(value), t) if isinstance(t, IntegerType) else FloatAttr(value, t)
    return b.insert(arith.ConstantOp(attr)).result


def dim_sizes(b: Builder, ref: SSAValue) -> list[SSAValue]:
    """One index value per dimension: a constant when static, memref.dim otherwise."""
    t = ref.type
    assert isinstance(t, MemRefType)
    sizes = []
    for i, d in enumerate(t.get_shape()):
        if d == DYNAMIC_INDEX:
            sizes.append(b.insert(memref.DimOp(ref, const_index(b, i))).result)
        else:
            sizes.append(const_index(b, d))
    return sizes


def mul_add(b: Builder, a: SSAValue, h: SSAValue, x: SSAValue) -> SSAValue:
    """a*h + x as separate multiply and add (integer ops wrap, float ops round each)."""
    if isinstance(a.type, IntegerType):
        return b.insert(arith.AddiOp(b.insert(arith.MuliOp(a, h)).result, x)).result
    if isinstance(a.type, ComplexType):
        from xdsl.dialects import complex as complex_d

        return b.insert(complex_d.AddOp(b.insert(complex_d.MulOp(a, h)).result, x)).result
    return b.insert(arith.AddfOp(b.insert(arith.MulfOp(a, h)).result, x)).result


def load_as(b: Builder, ref: SSAValue, indices: Sequence[SSAValue], t: Attribute) -> SSAValue:
    """Load an element and widen f16/bf16 to the state type `t`."""
    v = b.insert(memref.LoadOp.get(ref, indices)).res
    if isinstance(v.type, Float16Type | BFloat16Type) and v.type != t:
        v = b.insert(arith.ExtFOp(v, t)).result
    return v


def for_loop(
    b: Builder,
    lb: SSAValue,
    ub: SSAValue,
    step: SSAValue,
    iter_args: Sequence[SSAValue],
    body: Callable[[Builder, SSAValue, Sequence[SSAValue]], Sequence[SSAValue]],
) -> Sequence[SSAValue]:
    """Insert `scf.for`; `body(builder, iv, carried)` returns the values to yield."""
    block = Block(arg_types=[IndexType(), *(v.type for v in iter_args)])
    inner = Builder(InsertPoint.at_end(block))
    yielded = body(inner, block.args[0], block.args[1:])
    inner.insert(scf.YieldOp(*yielded))
    loop = b.insert(scf.ForOp(lb, ub, step, iter_args, Region(block)))
    return loop.results


def loop_nest(
    b: Builder,
    sizes: Sequence[SSAValue],
    body: Callable[[Builder, Sequence[SSAValue]], None],
) -> None:
    """Perfect nest of unit-step loops from 0 to each size; body gets the indices."""
    if not sizes:
        body(b, [])
        return
    zero, one = const_index(b, 0), const_index(b, 1)

    def level(builder: Builder, depth: int, outer: list[SSAValue]) -> None:
        def inner(ib: Builder, iv: SSAValue, _carried: Sequence[SSAValue]):
            if depth + 1 == len(sizes):
                body(ib, [*outer, iv])
            else:
                level(ib, depth + 1, [*outer, iv])
            return []

        for_loop(builder, zero, sizes[depth], one, [], inner)

    level(b, 0, [])


def inline_region_copy(
    b: Builder, region: Region, args: Sequence[SSAValue]
) -> list[SSAValue]:
    """Clone a single-block region at the builder, bind its args, return what it yields."""
    block = region.clone().block
    terminator = block.last_op
    assert terminator is not None
    yielded = [
        args[v.index] if isinstance(v, BlockArgument) and v.block is block else v
        for v in terminator.operands
    ]
    Rewriter.erase_op(terminator, safe_erase=False)
    Rewriter.inline_block(block, b.insertion_point, args)
    return yielded


def inside(value: SSAValue, op: Operation) -> bool:
    """Whether `value` is defined inside `op`'s regions."""
    owner = value.owner
    if isinstance(owner, Block):
        parent = owner.parent_op()
        return parent is not None and (parent is op or op.is_ancestor(parent))
    return op.is_ancestor(owner) and owner is not op


def clone_in_loop(v: SSAValue, mapper: dict[SSAValue, SSAValue], b: Builder, loop: Operation) -> SSAValue:
    """`v` (a value computed in `loop`) cloned at `b`, with its loop operands via `mapper`."""
    if v in mapper:
        return mapper[v]
    if not inside(v, loop):
        return v
    op = v.owner
    assert isinstance(op, Operation)
    for u in op.operands:
        clone_in_loop(u, mapper, b, loop)
    b.insert(op.clone(value_mapper=mapper))
    return mapper[v]


def dce_block(block: Block) -> None:
    """Erase ops in `block` whose results are unused and that have no effects, to a fixpoint."""
    from xdsl.transforms.dead_code_elimination import is_trivially_dead

    changed = True
    while changed:
        changed = False
        for op in list(block.walk(reverse=True)):
            if op.parent is not None and is_trivially_dead(op):
                op.detach()
                op.erase()
                changed = True
