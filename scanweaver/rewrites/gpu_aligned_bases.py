"""Misaligned bases take the scalar path: the 16-byte vector accesses of every kernel
are guarded by one test of its arguments' base addresses.

The kernel builders (`blelloch_gpu.py` "Global memory", `scan_gpu.py`,
`scan_time_blocks.py`, `affine_time_blocks.py`, `recurrence_vector_io.py`) emit each
16-byte `vector.load` / `vector.store` of global memory (`alignment = 16`) in the
then-branch of an `scf.if` whose else-branch is the guarded scalar path of the same
elements; the condition (a full tile whose runs start on vector boundaries) counts
offsets from the base the runtime passes. A device view such as `x[:, 1:]` starts off
a 16-byte boundary, so `guard_vector_paths` adds to every such condition, once per
kernel at its entry, the test that the aligned pointers of all the memref arguments
the kernel accesses by vectors are 16-byte aligned (`(p0 | p1 | ...) & 15 == 0`,
block-uniform, so no divergence). A misaligned base then runs the scalar path, which
touches exactly the elements the vector path would (no access outside the arrays).

A vector access of a kernel argument that does not sit in such a branch is a builder
bug: `guard_vector_paths` raises instead of emitting a kernel that could fault.
Shared memory and private buffers are aligned by their declaration and left alone.
"""

from __future__ import annotations

from xdsl.dialects import arith, gpu, memref, scf, vector
from xdsl.dialects.builtin import IndexType, IntegerAttr, ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from scanweaver.errors import ScanWeaverError

#: the widest global access of the kernels, in bytes
VECTOR_BYTES = 16


def _vector_branch(op: Operation) -> scf.IfOp:
    """The `scf.if` whose then-branch holds `op` directly or in nested loops, with a
    non-empty else-branch (the scalar twin)."""
    child: Operation = op
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, gpu.FuncOp):
        if isinstance(parent, scf.IfOp):
            region = child.parent_region()
            if region is parent.true_region and parent.false_region.blocks and any(
                not isinstance(o, scf.YieldOp) for o in parent.false_region.block.ops
            ):
                return parent
            break
        child, parent = parent, parent.parent_op()
    raise ScanWeaverError(
        f"gpu kernel: a 16-byte {op.name} of a kernel argument is not in the vector branch of an "
        "scf.if with a scalar else-branch; a misaligned base could not take the scalar path"
    )


def _global_vector_accesses(kernel: gpu.FuncOp) -> list[tuple[Operation, SSAValue]]:
    args = set(kernel.body.block.args)
    out = []
    for op in kernel.walk():
        if isinstance(op, (vector.LoadOp, vector.StoreOp)) and "alignment" in op.attributes:
            if op.base in args:
                out.append((op, op.base))
    return out


def _emit_bases_aligned(block: Block, refs: list[SSAValue]) -> SSAValue:
    """At the top of the kernel: i1, every ref's aligned pointer is 16-byte aligned."""
    ops: list[Operation] = []
    acc: SSAValue | None = None
    for r in refs:
        p = memref.ExtractAlignedPointerAsIndexOp.get(r)
        ops.append(p)
        acc = p.aligned_pointer if acc is None else _push(ops, arith.OrIOp(acc, p.aligned_pointer))
    mask = _push(ops, arith.ConstantOp(IntegerAttr(VECTOR_BYTES - 1, IndexType())))
    zero = _push(ops, arith.ConstantOp(IntegerAttr(0, IndexType())))
    low = _push(ops, arith.AndIOp(acc, mask))
    ok = _push(ops, arith.CmpiOp(low, zero, "eq"))
    Rewriter.insert_op(ops, InsertPoint.at_start(block))
    ok.name_hint = "bases_aligned"
    return ok


def _push(ops: list[Operation], op: Operation) -> SSAValue:
    ops.append(op)
    return op.results[0]


def guard_kernel(kernel: gpu.FuncOp) -> int:
    """Guard `kernel`'s vector branches; returns how many `scf.if` conditions changed."""
    accesses = _global_vector_accesses(kernel)
    if not accesses:
        return 0
    branches: list[scf.IfOp] = []
    for op, _ in accesses:
        b = _vector_branch(op)
        if b not in branches:
            branches.append(b)
    arg_order = list(kernel.body.block.args)
    refs = sorted({r for _, r in accesses}, key=arg_order.index)
    ok = _emit_bases_aligned(kernel.body.block, refs)
    for b in branches:
        both = arith.AndIOp(b.cond, ok)
        Rewriter.insert_op(both, InsertPoint.before(b))
        b.operands[0] = both.result
    return len(branches)


def guard_vector_paths(top: ModuleOp) -> None:
    """Guard the vector branches of every kernel in `top` (module doc)."""
    for op in top.walk():
        if isinstance(op, gpu.FuncOp) and op.body.blocks:
            guard_kernel(op)


__all__ = ["VECTOR_BYTES", "guard_kernel", "guard_vector_paths"]
