"""IR text for single scan ops, printed from the builders (`affine.py`, `sum_scan`
here), as tests and tools that want text take it.

Shapes may be `?` (dynamic): one compiled kernel then serves every size.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import IntegerType, ModuleOp
from xdsl.ir import Block, Region

from scanweaver.dialects import scan
from scanweaver.dtypes import MLIR_ELEMENT  # re-exported: numpy dtype -> MLIR element type
from scanweaver.workloads.affine import affine_scan, memref_of


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


def sum_scan(shape: Sequence[int | str], axis: int, element: str, *, name: str = "f") -> ModuleOp:
    """`func.func @name(x0, y0)` holding one generic `scan.scan` of x0 along `axis` into
    y0 whose combine region adds (arith.addi on integers, arith.addf on floats): an
    inclusive cumulative sum that goes through the associative-scan lowering."""
    t = memref_of(shape, element)
    block = Block(arg_types=[t, t])
    x0, y0 = block.args
    x0.name_hint, y0.name_hint = "x0", "y0"
    el = t.element_type
    combine = Block(arg_types=[el, el])
    a0, b0 = combine.args
    a0.name_hint, b0.name_hint = "a0", "b0"
    with ImplicitBuilder(combine):
        add = arith.AddiOp(a0, b0) if isinstance(el, IntegerType) else arith.AddfOp(a0, b0)
        add.result.name_hint = "r"
        scan.YieldOp(add.result)
    with ImplicitBuilder(block):
        scan.ScanOp([x0], [y0], axis, Region(combine))
        func.ReturnOp()
    return ModuleOp([func.FuncOp(name, ([t, t], []), Region(block))])


def sum_scan_ir(shape: Sequence[int | str], axis: int, element: str, *, name: str = "f") -> str:
    """`sum_scan` printed."""
    from scanweaver.ir import print_ir

    return print_ir(sum_scan(shape, axis, element, name=name))


__all__ = ["MLIR_ELEMENT", "affine_scan_ir", "memref_type", "sum_scan", "sum_scan_ir"]
