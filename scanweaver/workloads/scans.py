"""IR text for single scan ops, printed from the builders (`affine.py`,
`sum_scan.py`), as tests and tools that want text take it.

Shapes may be `?` (dynamic): one compiled kernel then serves every size.
"""

from __future__ import annotations

from collections.abc import Sequence

from scanweaver.dtypes import MLIR_ELEMENT  # re-exported: numpy dtype -> MLIR element type
from scanweaver.workloads.affine import affine_scan, memref_of
from scanweaver.workloads.sum_scan import sum_scan


def memref_type(shape: Sequence[int | str], element: str) -> str:
    """`memref<...>` type text (for tests that write IR by hand)."""
    return str(memref_of(shape, element))


def affine_scan_ir(
    shape: Sequence[int | str],
    axis: int,
    in_el: str,
    state_el: str,
    *,
    init: bool = False,
    final: bool = False,
    reverse: bool = False,
    name: str = "f",
) -> str:
    """`func.func @name(a, b, [init], h, [final])` holding one scan.affine, as text."""
    from scanweaver.ir import print_ir

    return print_ir(
        affine_scan(shape, axis, in_el, state_el, init=init, final=final, reverse=reverse, name=name)
    )


def sum_scan_ir(shape: Sequence[int | str], axis: int, element: str, *, name: str = "f") -> str:
    """`sum_scan` printed."""
    from scanweaver.ir import print_ir

    return print_ir(sum_scan(shape, axis, element, name=name))


__all__ = ["MLIR_ELEMENT", "affine_scan_ir", "memref_type", "sum_scan", "sum_scan_ir"]
