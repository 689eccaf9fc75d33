"""Launch descriptions in the IR: the `scanweaver.launch` attribute on generated kernels.

The GPU lowering attaches one `scanweaver.launch` dictionary attribute to every kernel
`gpu.func` it creates; `launch_descriptions(module)` reads them back as `KernelLaunch`
values.  The attribute survives printing and upstream `mlir-opt`, so a runtime can read
it from the IR it compiles.  `KernelLaunch` itself (conventions, ABI, grid formulas)
is plain data in `scanweaver/runtime/cuda_launch.py`, importable without xDSL.
"""

from __future__ import annotations

from typing import Any

from xdsl.dialects import gpu
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
    i64,
)
from xdsl.ir import Attribute, Operation

from scanweaver.errors import ScanWeaverError
from scanweaver.runtime.cuda_launch import ArgDesc, KernelLaunch, ShapeEntry

LAUNCH_ATTR = "scanweaver.launch"


def launch_to_attr(desc: KernelLaunch) -> DictionaryAttr:
    def entry(v: ShapeEntry) -> Attribute:
        return IntegerAttr(v, i64) if isinstance(v, int) else StringAttr(v)

    return DictionaryAttr(
        {
            "kernel_name": StringAttr(desc.kernel_name),
            "module_name": StringAttr(desc.module_name),
            "func_name": StringAttr(desc.func_name),
            "grid": ArrayAttr([entry(g) for g in desc.grid]),
            "block": ArrayAttr([IntegerAttr(b, i64) for b in desc.block]),
            "shared_bytes": IntegerAttr(desc.shared_bytes, i64),
            "args": ArrayAttr(
                [
                    ArrayAttr(
                        [
                            StringAttr(name),
                            StringAttr(kind),
                            StringAttr(dtype),
                            ArrayAttr([entry(d) for d in shape]),
                        ]
                    )
                    for name, kind, dtype, shape in desc.args
                ]
            ),
            "host_args": ArrayAttr([IntegerAttr(i, i64) for i in desc.host_args]),
            "abi": StringAttr(desc.abi),
            "notes": StringAttr(desc.notes),
            # added later: after the older fields, so their printed order stays
            "dynamic_shared_bytes": IntegerAttr(desc.dynamic_shared_bytes, i64),
            "equal_dims": ArrayAttr(
                [
                    ArrayAttr([StringAttr(a), IntegerAttr(i, i64), StringAttr(b), IntegerAttr(j, i64)])
                    for a, i, b, j in desc.equal_dims
                ]
            ),
            "covers_dims": ArrayAttr(
                [
                    ArrayAttr([StringAttr(a), IntegerAttr(i, i64), StringAttr(b), IntegerAttr(j, i64)])
                    for a, i, b, j in desc.covers_dims
                ]
            ),
            "scratch": ArrayAttr(
                [ArrayAttr([StringAttr(n), ArrayAttr([entry(x) for x in shape])]) for n, shape in desc.scratch]
            ),
        }
    )


def launch_from_attr(attr: DictionaryAttr) -> KernelLaunch:
    d = attr.data

    def val(a: Attribute) -> Any:
        if isinstance(a, IntegerAttr):
            return a.value.data
        if isinstance(a, StringAttr):
            return a.data
        if isinstance(a, ArrayAttr):
            return tuple(val(x) for x in a.data)
        raise ScanWeaverError(f"unexpected attribute {a} in {LAUNCH_ATTR}")

    args: list[ArgDesc] = [(n, k, t, tuple(s)) for n, k, t, s in val(d["args"])]
    return KernelLaunch(
        kernel_name=val(d["kernel_name"]),
        module_name=val(d["module_name"]),
        func_name=val(d["func_name"]) if "func_name" in d else "",
        grid=val(d["grid"]),
        block=val(d["block"]),
        shared_bytes=val(d["shared_bytes"]),
        dynamic_shared_bytes=val(d["dynamic_shared_bytes"]) if "dynamic_shared_bytes" in d else 0,
        args=args,
        host_args=val(d["host_args"]) if "host_args" in d else (),
        abi=val(d["abi"]) if "abi" in d else "memref-descriptor",
        equal_dims=val(d["equal_dims"]) if "equal_dims" in d else (),
        covers_dims=val(d["covers_dims"]) if "covers_dims" in d else (),
        scratch=val(d["scratch"]) if "scratch" in d else (),
        notes=val(d["notes"]) if "notes" in d else "",
    )


def launch_descriptions(module: Operation) -> list[KernelLaunch]:
    """Every `scanweaver.launch` description in `module`, in IR order."""
    out = []
    for op in module.walk():
        if isinstance(op, gpu.FuncOp) and LAUNCH_ATTR in op.attributes:
            attr = op.attributes[LAUNCH_ATTR]
            assert isinstance(attr, DictionaryAttr)
            out.append(launch_from_attr(attr))
    return out


__all__ = ["KernelLaunch", "LAUNCH_ATTR", "launch_descriptions", "launch_from_attr", "launch_to_attr"]
