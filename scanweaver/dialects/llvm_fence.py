"""`llvm.fence`, which xDSL 0.74's llvm dialect lacks, in upstream MLIR's generic form.

    "llvm.fence"() <{ordering = 6 : i64, syncscope = "device"}> : () -> ()

is `fence syncscope("device") acq_rel`, which the NVPTX backend emits as
`fence.acq_rel.gpu`. Multi-block GPU protocols need it: upstream lowers
`memref.atomic_rmw` to an acq_rel `llvm.atomicrmw`, but NVPTX (LLVM 22) emits that as a
relaxed `atom`, so the ordering between a value and its flag comes from this fence (a
release fence before the flag's atomic write, an acquire fence after its atomic read).

`LLVM_WITH_FENCE` is xDSL's llvm dialect plus this op: what `scanweaver.ir.make_context`
loads for "llvm".
"""

from __future__ import annotations

from xdsl.dialects import llvm
from xdsl.dialects.builtin import IntegerAttr, StringAttr, i64
from xdsl.ir import Dialect
from xdsl.irdl import IRDLOperation, irdl_op_definition, opt_prop_def, prop_def

#: LLVM AtomicOrdering numbers (the `ordering` property)
ACQ_REL = 6


@irdl_op_definition
class FenceOp(IRDLOperation):
    name = "llvm.fence"

    ordering = prop_def(IntegerAttr)
    syncscope = opt_prop_def(StringAttr)

    def __init__(self, ordering: int = ACQ_REL, syncscope: str | None = "device"):
        props = {"ordering": IntegerAttr(ordering, i64)}
        if syncscope is not None:
            props["syncscope"] = StringAttr(syncscope)
        super().__init__(properties=props)


LLVM_WITH_FENCE = Dialect("llvm", [*llvm.LLVM.operations, FenceOp], [*llvm.LLVM.attributes])

__all__ = ["ACQ_REL", "FenceOp", "LLVM_WITH_FENCE"]
