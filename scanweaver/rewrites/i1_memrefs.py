"""`widen-i1-memrefs`: store `memref<...xi1>` as bytes (i8) for MLIR's CPU lowering.

MLIR's memref-to-LLVM lowering cannot load or store sub-byte elements (mlir-opt
asserts).  numpy stores a bool array one byte per element, 0 or 1, which is exactly
an i8 memref; so on the CPU path every i1 memref (function arguments and allocations)
becomes an i8 memref, a load of it a load of i8 plus `arith.trunci` to i1, a store an
`arith.extui` to i8 plus a store.  The function keeps taking numpy bool arrays.
Any other use of such a memref (a view, a vector load, passing it to a call or a
loop) is refused with one clear error before the tool runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, func, memref
from xdsl.dialects.builtin import FunctionType, IntegerType, MemRefType, ModuleOp, i1, i8
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from scanweaver.errors import ScanWeaverTypeError


def _is_i1_memref(t) -> bool:
    return isinstance(t, MemRefType) and isinstance(t.element_type, IntegerType) and t.element_type.width.data == 1


def _as_i8(t: MemRefType) -> MemRefType:
    return MemRefType(i8, t.shape, t.layout, t.memory_space)


def _widen_uses(value: SSAValue, what: str) -> None:
    for use in list(value.uses):
        op = use.operation
        if isinstance(op, memref.LoadOp):
            rewriter = Rewriter()
            load = memref.LoadOp.get(value, list(op.indices))
            bit = arith.TruncIOp(load.res, i1)
            rewriter.replace_op(op, [load, bit], [bit.result])
        elif isinstance(op, memref.StoreOp) and op.memref is value and op.value is not value:
            byte = arith.ExtUIOp(op.value, i8)
            Rewriter.insert_op(byte, InsertPoint.before(op))
            Rewriter().replace_op(op, memref.StoreOp.get(byte.result, value, list(op.indices)))
        elif isinstance(op, memref.DimOp):
            continue
        else:
            raise ScanWeaverTypeError(
                f"{what} (memref of i1) is used by '{op.name}': the CPU path stores i1 memrefs as bytes and "
                "supports only memref.load, memref.store and memref.dim on them; use an i8 memref"
            )


@dataclass(frozen=True)
class WidenI1Memrefs(ModulePass):
    name = "widen-i1-memrefs"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for fn in [o for o in op.walk() if isinstance(o, func.FuncOp) and not o.is_declaration]:
            block = fn.body.blocks[0]
            widened = [a for a in block.args if _is_i1_memref(a.type)]
            for arg in widened:
                _retype(arg, _as_i8(arg.type))
            if widened:
                fn.function_type = FunctionType.from_lists([a.type for a in block.args], list(fn.function_type.outputs.data))
            for arg in widened:
                _widen_uses(arg, f"argument %{arg.name_hint or arg.index} of @{fn.sym_name.data}")
        for alloc in [o for o in op.walk() if isinstance(o, memref.AllocaOp | memref.AllocOp)]:
            if _is_i1_memref(alloc.memref.type):
                _retype(alloc.memref, _as_i8(alloc.memref.type))
                _widen_uses(alloc.memref, f"the result of '{alloc.name}'")


def _retype(value: SSAValue, new_type) -> None:
    value._type = new_type  # noqa: SLF001 - xDSL values are retyped in place by passes


def widen_i1_memrefs(module: ModuleOp) -> ModuleOp:
    """A copy of `module` with i1 memrefs stored as i8 (the original is left alone)."""
    if not any(_is_i1_memref(getattr(r, "type", None)) for o in module.walk() for r in (*o.results, *_block_args(o))):
        return module
    copy = module.clone()
    WidenI1Memrefs().apply(Context(), copy)
    copy.verify()
    return copy


def _block_args(op: Operation):
    for region in op.regions:
        for block in region.blocks:
            yield from block.args
