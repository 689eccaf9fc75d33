"""Builder of a generic `scan.scan` that adds: an inclusive cumulative sum.

    sum_scan(shape, axis, element, name=)
        func.func @name(%x0, %y0) { scan.scan ins(%x0) outs(%y0) axis ... { addi | addf } }

It goes through the associative-scan lowering (not the affine one), which is what
`bench/gpu_kernels.py` measures with it.  It imports only xDSL, the scan dialect and
`loops.element_type`, so that tool can load this file by path into the source of an
older revision it measures (one from before this builder).
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith, func
from xdsl.dialects.builtin import DYNAMIC_INDEX, IntegerType, MemRefType, ModuleOp
from xdsl.ir import Block, Region

from scanweaver.dialects import scan
from scanweaver.workloads.loops import element_type


def sum_scan(shape: Sequence[int | str], axis: int, element: str, *, name: str = "f") -> ModuleOp:
    """`func.func @name(x0, y0)`: y0 = the inclusive sum of x0 along `axis` ("?" is a
    dynamic dimension), arith.addi on integers, arith.addf on floats."""
    el = element_type(element)
    t = MemRefType(el, [DYNAMIC_INDEX if d in ("?", None) else int(d) for d in shape])
    block = Block(arg_types=[t, t])
    x0, y0 = block.args
    x0.name_hint, y0.name_hint = "x0", "y0"
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


__all__ = ["sum_scan"]
