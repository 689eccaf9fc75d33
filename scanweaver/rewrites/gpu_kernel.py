"""What every GPU lowering of `scan-to-gpu` builds kernels from (no lowering of its own).

The kernel families (`blelloch_gpu.py`: scan.affine and the sweep helpers it shares;
`recurrence_gpu.py`: scan.recurrence nests; `linear_gpu.py`: scan.linear_recurrence;
`scan_gpu.py`: generic scan.scan) import these instead of each other's private names:

* `Unsupported`: why an op is left for the sequential lowering (the refusal reason);
* IR queries: `const_int`, `defined_inside`, `free_values`;
* kernel skeleton checks and names: `check_closed`, `kernel_name`;
* shared-memory layout: `shared_layout_bytes` (each array `SHARED_ALIGN`-aligned, the
  figure the launch description carries and a test compares with ptxas).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from xdsl.dialects import arith, func, gpu, memref, scf
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, IntegerType, MemRefType, ModuleOp, StringAttr
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.pattern_rewriter import PatternRewriter, PatternRewriteWalker, RewritePattern, op_type_rewrite_pattern
from xdsl.transforms.scf_for_loop_unroll import UnrollLoopPattern

from scanweaver.errors import CannotLower
from scanweaver.rewrites import blelloch_gpu as bg

SHARED_ALIGN = 16


#: Why a scan op is left for the sequential lowering (one sentence, no prefix): the
#: package's one "cannot lower" exception.
Unsupported = CannotLower


def const_int(v: SSAValue) -> int | None:
    op = v.owner
    if isinstance(op, arith.ConstantOp) and isinstance(op.value, IntegerAttr):
        return op.value.value.data
    return None


def defined_inside(ops: Iterable[Operation]) -> set[SSAValue]:
    inside: set[SSAValue] = set()
    for top in ops:
        for o in top.walk():
            inside.update(o.results)
            for r in o.regions:
                for b in r.blocks:
                    inside.update(b.args)
    return inside


def free_values(ops: Sequence[Operation]) -> list[SSAValue]:
    """Values used by `ops` (nested regions included) but defined elsewhere, in order."""
    inside = defined_inside(ops)
    seen: dict[SSAValue, None] = {}
    for top in ops:
        for o in top.walk():
            for v in o.operands:
                if v not in inside:
                    seen.setdefault(v, None)
    return list(seen)


# The kernel-entry helpers of blelloch_gpu.py, under the names the other kernels use.
def thread_id(e) -> SSAValue:
    """`gpu.thread_id x` as an index."""
    return bg._thread_id(e)


def block_id(e) -> SSAValue:
    """`gpu.block_id x` as an index."""
    return bg._block_id(e)


def shape_entries(t: MemRefType) -> tuple[int | str, ...]:
    """A memref's shape for a launch description (`"?"` for dynamic sizes)."""
    return bg._shape_entries(t)


def check_closed(kfunc: gpu.FuncOp) -> None:
    """A built kernel uses nothing from outside itself (a builder bug otherwise)."""
    inside = defined_inside([kfunc])
    for o in kfunc.walk():
        for v in o.operands:
            if v not in inside:
                raise AssertionError(f"kernel {kfunc.sym_name.data}: '{o.name}' uses a value from outside the kernel")


def kernel_name(top: ModuleOp, base: str) -> str:
    """A kernel name not yet used in the module's kernel module."""
    for op in top.ops:
        if isinstance(op, gpu.ModuleOp) and op.sym_name.data == bg.KERNEL_MODULE:
            return bg._unique_name(op, base)
    return f"{base}_0"


def note_on_function(fn: func.FuncOp, line: str) -> None:
    """Add `line` to the function's `scanweaver.gpu_refused` list (what stops it from
    running on the GPU; `scanweaver compile` and the CUDA runtime print it)."""
    old = fn.attributes.get(bg.REFUSED_ATTR)
    lines = [*(old.data if isinstance(old, ArrayAttr) else ()), StringAttr(line)]
    fn.attributes[bg.REFUSED_ATTR] = ArrayAttr(lines)


def unproven_accesses(fn: func.FuncOp, ops: Iterable[Operation]) -> list[tuple[Operation, SSAValue]]:
    """(access, memref argument of `fn`) in `ops` that `fn`'s shape contract does not
    follow: nothing checks them before a launch, and the device checks nothing."""
    from scanweaver.runtime.shape_contract import derive_contract

    unchecked = set(derive_contract(fn).unchecked_ops)
    args = set(fn.body.block.args)
    out = []
    for top in ops:
        for o in top.walk():
            ref = _state_of_view(getattr(o, "memref", None)) if o in unchecked else None
            if ref in args:
                out.append((o, ref))
    return out


def _state_of_view(ref: SSAValue | None) -> SSAValue | None:
    """emit's memref block argument is its recurrence's state: the state itself."""
    from scanweaver.dialects import scan

    owner = ref.owner.parent_op() if isinstance(ref, BlockArgument) else None
    if isinstance(owner, scan.LoopRecurrence) and ref.owner is owner.emit.block and ref.index == 1:
        return owner.state
    return ref


def unproven_refusal(o: Operation, ref: SSAValue) -> Unsupported:
    """The refusal of an access that nothing proves in bounds (see `unproven_accesses`)."""
    from scanweaver.runtime.shape_contract import op_text

    name = f"%{ref.name_hint}" if ref.name_hint else "a memref"
    return Unsupported(f"'{op_text(o)}' may access {name} out of bounds: the shape contract does not follow "
                       "its index, so nothing checks it before the launch")


def refuse_i1_memrefs(values: Iterable[SSAValue]) -> None:
    """MLIR's memref-to-LLVM lowering cannot load sub-byte elements (mlir-opt asserts);
    the CPU path widens bool arrays to bytes (`widen-i1-memrefs`), the kernels do not."""
    for v in values:
        t = v.type
        if isinstance(t, MemRefType) and isinstance(t.element_type, IntegerType) and t.element_type.width.data == 1:
            name = f"%{v.name_hint}" if v.name_hint else "an argument"
            raise Unsupported(f"{name} is a memref of i1 (bool), which GPU kernels cannot load; pass it as i8 or i32")


def unroll_loops_over(kfunc: gpu.FuncOp, buf: SSAValue, max_trip: int) -> None:
    """Fully unroll the constant-bound `scf.for` loops of `kfunc` that load from `buf`
    (a private state buffer): with constant indices LLVM keeps the buffer in registers.
    LLVM's own full unroll stops near 32 trips, leaving a 64-element state in local
    memory (the stack frame ptxas reports)."""

    class Unroll(RewritePattern):
        @op_type_rewrite_pattern
        def match_and_rewrite(self, op: scf.ForOp, rewriter: PatternRewriter) -> None:
            lb, ub, st = const_int(op.lb), const_int(op.ub), const_int(op.step)
            if lb is None or ub is None or st is None or st <= 0 or (ub - lb) // st > max_trip:
                return
            if not any(isinstance(o, memref.LoadOp) and o.memref == buf for o in op.walk()):
                return
            UnrollLoopPattern().match_and_rewrite(op, rewriter)

    PatternRewriteWalker(Unroll(), apply_recursively=True).rewrite_region(kfunc.body)


#: Name suffix of the shared arrays that hold a block's copy of values its threads read
#: again at every use (`recurrence_gpu._hoist_elements_to_shared`): the loads from them
#: are made `volatile` in the kernels' LLVM IR (`toolchain/shared_reloads.py`).
RELOADED_SHARED_SUFFIX = "_sE"


def _round_up(x: int, align: int) -> int:
    return -(-x // align) * align


def shared_layout_bytes(sizes: Sequence[int]) -> int:
    """Bytes of static shared memory for globals of `sizes`, each `SHARED_ALIGN`-aligned."""
    total = 0
    for size in sizes:
        total = _round_up(total, SHARED_ALIGN) + size
    return total


__all__ = [
    "RELOADED_SHARED_SUFFIX",
    "SHARED_ALIGN",
    "Unsupported",
    "block_id",
    "check_closed",
    "const_int",
    "defined_inside",
    "free_values",
    "kernel_name",
    "note_on_function",
    "refuse_i1_memrefs",
    "shape_entries",
    "shared_layout_bytes",
    "thread_id",
    "unroll_loops_over",
]
