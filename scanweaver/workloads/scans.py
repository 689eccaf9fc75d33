"""IR text for single scan ops, as the runtime drivers and tests build them.

Shapes may be `?` (dynamic): one compiled kernel then serves every size.
"""

from __future__ import annotations

from collections.abc import Sequence

from scanweaver.dtypes import MLIR_ELEMENT  # re-exported: numpy dtype -> MLIR element type


def memref_type(shape: Sequence[int | str], element: str) -> str:
    return "memref<" + "".join(f"{d}x" for d in shape) + element + ">"


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
    """`func.func @name(a, b, [init], h, [final])` holding one scan.affine."""
    channels = [d for i, d in enumerate(shape) if i != axis]
    t_in, t_h, t_c = (
        memref_type(shape, in_el),
        memref_type(shape, state_el),
        memref_type(channels, state_el),
    )
    args, ins, outs = [f"%a: {t_in}", f"%b: {t_in}"], [t_in, t_in], [t_h]
    op = "scan.affine %a, %b"
    if init:
        args.append(f"%h0: {t_c}")
        ins.append(t_c)
        op += " init %h0"
    args.append(f"%h: {t_h}")
    op += " into %h"
    if final:
        args.append(f"%hT: {t_c}")
        outs.append(t_c)
        op += " final %hT"
    op += f" axis {axis}" + (" reverse" if reverse else "")
    return (
        f"func.func @{name}({', '.join(args)}) {{\n"
        f"  {op} : {', '.join(ins)} -> {', '.join(outs)}\n"
        "  func.return\n}\n"
    )
