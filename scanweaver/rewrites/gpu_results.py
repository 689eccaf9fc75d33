"""`gpu-results-to-args`: scalar function results become one-element output memrefs.

GPU kernels write only memref arguments, and the CUDA runtime replays launches: it
cannot return a value a kernel computed.  So, for the GPU, a function returning
scalars (the final state of a recurrence, `-> f32`) gets one rank-0 memref argument
per result, appended after its own arguments, and stores each result there instead of
returning it:

    func.func @f(%a: memref<?xf32>) -> f32 { ...; func.return %h }
    ==>
    func.func @f(%a: memref<?xf32>, %result0: memref<f32>) { ...; memref.store %h, %result0[]; func.return }

The function is marked `scanweaver.returned_scalars = ["f32"]`: the runtime allocates
those arguments on the device for each call, and returns what the kernels wrote
there (`runtime/cuda_results.py`).  The GPU lowering then sees a final state stored
to an argument, which it lowers.  Functions with memref results, declarations and
functions another function calls are left alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func, memref
from xdsl.dialects.builtin import (
    AnyFloat,
    ArrayAttr,
    FunctionType,
    IndexType,
    IntegerType,
    MemRefType,
    ModuleOp,
    StringAttr,
)
from xdsl.ir import Attribute
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

RETURNED_ATTR = "scanweaver.returned_scalars"


def _is_scalar(t: Attribute) -> bool:
    return isinstance(t, IntegerType | IndexType | AnyFloat)


def _called_names(module: ModuleOp) -> set[str]:
    return {op.callee.string_value() for op in module.walk() if isinstance(op, func.CallOp)}


def results_to_arguments(fn: func.FuncOp) -> list[str]:
    """Rewrite `fn` as above; returns its result types' names ([] when left alone)."""
    results = list(fn.function_type.outputs.data)
    if not results or fn.is_declaration or not all(_is_scalar(t) for t in results):
        return []
    block = fn.body.block
    first = len(block.args)
    outs = [block.insert_arg(MemRefType(t, []), first + i) for i, t in enumerate(results)]
    for i, out in enumerate(outs):
        out.name_hint = f"result{i}"
    for ret in [op for op in fn.body.walk() if isinstance(op, func.ReturnOp)]:
        for value, out in zip(ret.arguments, outs):
            Rewriter.insert_op(memref.StoreOp.get(value, out, []), InsertPoint.before(ret))
        Rewriter.replace_op(ret, func.ReturnOp())
    inputs = [*fn.function_type.inputs.data, *(o.type for o in outs)]
    fn.function_type = FunctionType.from_lists(inputs, [])
    names = [str(t) for t in results]
    fn.attributes[RETURNED_ATTR] = ArrayAttr([StringAttr(n) for n in names])
    return names


@dataclass(frozen=True)
class ResultsToArguments(ModulePass):
    """Scalar results of functions as rank-0 memref output arguments (see module doc)."""

    name = "gpu-results-to-args"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        called = _called_names(op)
        for fn in [o for o in op.ops if isinstance(o, func.FuncOp)]:
            if fn.sym_name.data not in called:
                results_to_arguments(fn)


def returned_scalars(fn: func.FuncOp) -> list[str]:
    """The result types `gpu-results-to-args` moved into arguments of `fn`."""
    attr = fn.attributes.get(RETURNED_ATTR)
    return [a.data for a in attr.data] if isinstance(attr, ArrayAttr) else []  # type: ignore[union-attr]


__all__ = ["RETURNED_ATTR", "ResultsToArguments", "results_to_arguments", "returned_scalars"]
