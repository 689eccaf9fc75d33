"""Export a module produced by `scan-to-gpu` to PTX through upstream MLIR, and check it.

    export_gpu(module, chip="sm_90") -> {
        "mlir": generic-form text handed to mlir-opt,
        "ptx": {gpu.module name: PTX text},
        "ptxas": {kernel name: {registers, spill_stores, spill_loads, shared_bytes,
                                stack_bytes}}  (empty when ptxas is not installed),
        "launches": [KernelLaunch, ...],
        "warnings": [str, ...]   (spills, missing ptxas),
        "chip": chip, "features": PTX feature string used,
    }

xDSL prints `gpu.module`/`gpu.func` only in the generic form, which MLIR parses, so the
whole module is printed generically. The subprocess work (mlir-opt, ptxas, PTX
extraction from `gpu.binary`) is `scanweaver.toolchain.mlir`'s; this module only glues.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.printer import Printer

from scanweaver.errors import ToolNotFoundError
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.toolchain.mlir import default_ptx_features, gpu_to_ptx, ptxas_info
from scanweaver.toolchain.tools import find_tool

#: Lowest PTX ISA that this LLVM accepts for each chip (checked with mlir-opt 22):
#: sm_80 needs PTX 7.0, sm_90 needs 7.8. The default of `default_ptx_features`
#: (+ptx80) works for both and is what we use unless asked otherwise.
MIN_PTX_FEATURES = {"sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78", "sm_90": "+ptx78"}


def print_generic(module: ModuleOp) -> str:
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_op(module)
    return out.getvalue() + "\n"


def ptxas_available() -> bool:
    try:
        find_tool("ptxas")
    except ToolNotFoundError:
        return False
    return True


def export_gpu(
    module: ModuleOp,
    chip: str = "sm_90",
    features: str | None = None,
    ptxas_arch: str | None = None,
) -> dict[str, Any]:
    """Lower the module's gpu.modules to PTX for `chip`; run `ptxas -v` when available.

    `ptxas_arch` defaults to `chip` (PTX for sm_80 also assembles for sm_90).
    """
    features = features or default_ptx_features(chip)
    text = print_generic(module)
    ptx = gpu_to_ptx(text, chip, features)
    warnings: list[str] = []
    info: dict[str, dict[str, int]] = {}
    if ptxas_available():
        for source in ptx.values():
            info.update(ptxas_info(source, ptxas_arch or chip))
        for kernel, figures in info.items():
            if figures["spill_stores"] or figures["spill_loads"]:
                warnings.append(
                    f"kernel {kernel} spills on {ptxas_arch or chip}: "
                    f"{figures['spill_stores']} bytes stored, {figures['spill_loads']} bytes loaded "
                    f"({figures['registers']} registers)"
                )
    else:
        warnings.append("ptxas not found on PATH: register and spill figures not checked")
    return {
        "mlir": text,
        "ptx": ptx,
        "ptxas": info,
        "launches": launch_descriptions(module),
        "warnings": warnings,
        "chip": chip,
        "features": features,
    }
