"""Launch descriptions: what a runtime needs to launch a generated kernel, without MLIR.

The GPU lowering attaches one `scanweaver.launch` dictionary attribute to every kernel
`gpu.func` it creates; `launch_descriptions(module)` reads them back as `KernelLaunch`
values.  The attribute survives printing and upstream `mlir-opt`, so a runtime can read
it from the IR it compiles.

Conventions
-----------
* `grid` entries are ints, or for dynamic shapes a product expression over kernel
  argument sizes such as `"h.shape[0]*h.shape[2]"` (`resolve_grid` evaluates it).
* `args` are in kernel-parameter order: `(name, kind, dtype, shape)`; kind is `"in"`,
  `"out"` or `"inout"`; dtype a MLIR element type name (`f32`, `bf16`, `i32`, ...);
  shape a tuple of ints, `"?"` for a dynamic size.
* `host_args[i]` is the position of kernel argument i among the host function's
  arguments (`-1` when it is not a function argument).
* ABI: upstream MLIR passes every memref argument as an expanded descriptor
  `(ptr allocated, ptr aligned, i64 offset, i64 sizes[rank], i64 strides[rank])`,
  i.e. `3 + 2 * rank` kernel parameters per memref (`abi = "memref-descriptor"`).
* `shared_bytes` is the static shared memory the kernel declares; dynamic shared
  memory is always 0.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
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

LAUNCH_ATTR = "scanweaver.launch"

ShapeEntry = int | str
ArgDesc = tuple[str, str, str, tuple[ShapeEntry, ...]]


@dataclass(frozen=True)
class KernelLaunch:
    kernel_name: str
    module_name: str
    grid: tuple[ShapeEntry, ShapeEntry, ShapeEntry]
    block: tuple[int, int, int]
    shared_bytes: int
    args: list[ArgDesc] = field(default_factory=list)
    func_name: str = ""
    host_args: tuple[int, ...] = ()
    abi: str = "memref-descriptor"
    notes: str = ""

    # -- runtime helpers ------------------------------------------------------------
    def arg_shapes(self, arrays: list[Any]) -> dict[str, tuple[int, ...]]:
        return {name: tuple(arr.shape) for (name, *_), arr in zip(self.args, arrays)}

    def resolve_grid(self, shapes: dict[str, tuple[int, ...]]) -> tuple[int, int, int]:
        """Evaluate the grid for concrete argument shapes (name -> shape)."""
        return tuple(_eval_product(g, shapes) for g in self.grid)  # type: ignore[return-value]

    def param_count(self) -> int:
        """Number of kernel parameters after MLIR's memref-descriptor expansion."""
        return sum(3 + 2 * len(shape) for (_, _, _, shape) in self.args)

    # -- attribute encoding -----------------------------------------------------------
    def to_attr(self) -> DictionaryAttr:
        def entry(v: ShapeEntry) -> Attribute:
            return IntegerAttr(v, i64) if isinstance(v, int) else StringAttr(v)

        return DictionaryAttr(
            {
                "kernel_name": StringAttr(self.kernel_name),
                "module_name": StringAttr(self.module_name),
                "func_name": StringAttr(self.func_name),
                "grid": ArrayAttr([entry(g) for g in self.grid]),
                "block": ArrayAttr([IntegerAttr(b, i64) for b in self.block]),
                "shared_bytes": IntegerAttr(self.shared_bytes, i64),
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
                        for name, kind, dtype, shape in self.args
                    ]
                ),
                "host_args": ArrayAttr([IntegerAttr(i, i64) for i in self.host_args]),
                "abi": StringAttr(self.abi),
                "notes": StringAttr(self.notes),
            }
        )

    @staticmethod
    def from_attr(attr: DictionaryAttr) -> KernelLaunch:
        d = attr.data

        def val(a: Attribute) -> Any:
            if isinstance(a, IntegerAttr):
                return a.value.data
            if isinstance(a, StringAttr):
                return a.data
            if isinstance(a, ArrayAttr):
                return tuple(val(x) for x in a.data)
            raise ScanWeaverError(f"unexpected attribute {a} in {LAUNCH_ATTR}")

        return KernelLaunch(
            kernel_name=val(d["kernel_name"]),
            module_name=val(d["module_name"]),
            func_name=val(d["func_name"]) if "func_name" in d else "",
            grid=val(d["grid"]),
            block=val(d["block"]),
            shared_bytes=val(d["shared_bytes"]),
            args=[(n, k, t, tuple(s)) for n, k, t, s in val(d["args"])],
            host_args=val(d["host_args"]) if "host_args" in d else (),
            abi=val(d["abi"]) if "abi" in d else "memref-descriptor",
            notes=val(d["notes"]) if "notes" in d else "",
        )


_DIM = re.compile(r"^(\w+)\.shape\[(\d+)\]$")


def _eval_product(expr: ShapeEntry, shapes: dict[str, tuple[int, ...]]) -> int:
    if isinstance(expr, int):
        return expr
    factors = []
    for term in expr.split("*"):
        term = term.strip()
        if term.isdigit():
            factors.append(int(term))
            continue
        m = _DIM.match(term)
        if not m or m.group(1) not in shapes:
            raise ScanWeaverError(f"cannot evaluate launch size term {term!r} of {expr!r}")
        factors.append(shapes[m.group(1)][int(m.group(2))])
    return math.prod(factors)


def launch_descriptions(module: Operation) -> list[KernelLaunch]:
    """Every `scanweaver.launch` description in `module`, in IR order."""
    out = []
    for op in module.walk():
        if isinstance(op, gpu.FuncOp) and LAUNCH_ATTR in op.attributes:
            attr = op.attributes[LAUNCH_ATTR]
            assert isinstance(attr, DictionaryAttr)
            out.append(KernelLaunch.from_attr(attr))
    return out


__all__ = ["KernelLaunch", "LAUNCH_ATTR", "launch_descriptions"]
