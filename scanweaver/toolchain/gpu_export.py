"""Export a module produced by `scan-to-gpu` to PTX through upstream MLIR, and check it
(the PTX, ptxas figures per kernel, and shared memory against the per-block limit).

    export_gpu(module, chip="sm_90") -> {
        "mlir": generic-form text handed to mlir-opt,
        "ptx": {gpu.module name: PTX text},
        "ptxas": {kernel name: {registers, spill_stores, spill_loads, shared_bytes,
                                stack_bytes}}  (empty when ptxas is not installed),
        "launches": [KernelLaunch, ...],
        "shared": {kernel name: {"static": bytes from the PTX, "dynamic": bytes the launch asks}},
        "warnings": [str, ...]   (spills, missing ptxas),
        "chip": chip, "features": PTX feature string used,
    }

xDSL prints `gpu.module`/`gpu.func` only in the generic form, which MLIR parses, so the
whole module is printed generically. Kernel inputs that no kernel writes are marked
read-only first, so they are read with `ld.global.nc` (`readonly_params`). The subprocess work (mlir-opt, ptxas, PTX
extraction from `gpu.binary`) is `scanweaver.toolchain.mlir`'s; this module only glues.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

from xdsl.dialects.builtin import ModuleOp
from xdsl.printer import Printer

from scanweaver.errors import ScanWeaverValueError, ToolNotFoundError
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.runtime.cuda_launch import SHARED_PER_BLOCK_LIMIT, KernelLaunch
from scanweaver.toolchain.ptx import static_shared_bytes
from scanweaver.toolchain.readonly_params import mark_readonly_args
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
    # the read-only kernel inputs are marked on a copy (the caller's module is left as it is)
    text = print_generic(mark_readonly_args(module.clone()))
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
    launches = launch_descriptions(module)
    shared = check_shared_memory(ptx, launches)
    return {
        "mlir": text,
        "ptx": ptx,
        "ptxas": info,
        "launches": launches,
        "shared": shared,
        "warnings": warnings,
        "chip": chip,
        "features": features,
    }


def check_shared_memory(ptx: dict[str, str], launches: list[KernelLaunch]) -> dict[str, dict[str, int]]:
    """Static shared bytes (read from the PTX) plus the dynamic bytes each launch asks
    for must fit one block's limit without opt-in, and the description must not claim
    less than the PTX declares; raises `ScanWeaverValueError` otherwise."""
    static: dict[str, int] = {}
    for text in ptx.values():
        static.update(static_shared_bytes(text))
    out = {}
    for desc in launches:
        s = static.get(desc.kernel_name, 0)
        total = s + desc.dynamic_shared_bytes
        if total > SHARED_PER_BLOCK_LIMIT:
            raise ScanWeaverValueError(
                f"kernel {desc.kernel_name} needs {total} bytes of shared memory per block ({s} static "
                f"+ {desc.dynamic_shared_bytes} dynamic), over the {SHARED_PER_BLOCK_LIMIT} bytes a "
                "block may use without opting in; use a smaller block-size"
            )
        if s > desc.shared_bytes:
            raise ScanWeaverValueError(
                f"kernel {desc.kernel_name}: its launch description says {desc.shared_bytes} bytes of "
                f"static shared memory but the PTX declares {s}"
            )
        out[desc.kernel_name] = {"static": s, "dynamic": desc.dynamic_shared_bytes}
    return out
