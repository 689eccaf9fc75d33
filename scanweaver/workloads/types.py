"""Types and signatures shared by the workload builders."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, MemRefType
from xdsl.ir import Attribute

from scanweaver.workloads.loops import element_type

Dim = int | str | None


def memref_of(shape: Sequence[Dim], element: str | Attribute) -> MemRefType:
    """`memref<shape x element>`; "?" or None is a dynamic dimension."""
    el = element_type(element) if isinstance(element, str) else element
    return MemRefType(el, [DYNAMIC_INDEX if d in ("?", None) else int(d) for d in shape])


def kernel_arguments(fn: func.FuncOp) -> tuple[int | str, ...]:
    """Per argument of `fn`: its rank if a memref, else its type name ("index", ...):
    the argument list the CPU calling layer (`cpu_scan.Kernel`) expands."""
    return tuple(
        t.get_num_dims() if isinstance(t, MemRefType) else str(t) for t in fn.function_type.inputs.data
    )


__all__ = ["Dim", "kernel_arguments", "memref_of"]
