"""`scanweaver.compile(text, target="cuda")`: user IR → PTX kernels → callable functions.

Building (lowering, PTX, launch descriptions) needs no GPU and is cached on disk;
only loading and launching do.  A host function may hold nothing but kernel
launches and index arithmetic: its launches replay in IR order from the launch
descriptions, so no host code is compiled or interpreted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import arith, func, gpu, memref, scf
from xdsl.dialects.builtin import ModuleOp

from scanweaver.errors import ScanWeaverValueError
from scanweaver.rewrites.gpu_results import returned_scalars
from scanweaver.rewrites.launch import KernelLaunch, launch_descriptions
from scanweaver.runtime.cuda import CudaFunction
from scanweaver.runtime.cuda_results import with_results

# Ops allowed in a host function: they only compute launch sizes, or skip a launch
# whose grid is empty (`launch` skips those itself).
_HOST_OPS = (
    gpu.LaunchFuncOp,
    scf.IfOp,
    scf.YieldOp,
    arith.CmpiOp,
    arith.ConstantOp,
    arith.MuliOp,
    arith.AddiOp,
    arith.SubiOp,
    arith.DivUIOp,
    arith.CeilDivUIOp,
    arith.MaxUIOp,
    # sizes of channel-program scratch (`gpu_channel_program.py`)
    arith.MinSIOp,
    arith.MaxSIOp,
    arith.MinUIOp,
    arith.DivSIOp,
    memref.DimOp,
    # scratch of multi-block scans: the runtime allocates it per call (`host_args` < -1)
    memref.AllocOp,
    memref.DeallocOp,
    func.ReturnOp,
)


@dataclass
class CudaArtifacts:
    ptx: str
    chip: str
    launches: dict[str, list[KernelLaunch]]  # host function -> launches in order
    arg_counts: dict[str, int]
    stages: list[Any]
    ptxas: dict[str, dict[str, int]]
    warnings: list[str] = field(default_factory=list)
    # host function -> types of the scalars it returns through its last arguments
    # (`gpu-results-to-args`; `runtime/cuda_results.py` hides those arguments again)
    results: dict[str, list[str]] = field(default_factory=dict)


def device_chip() -> str:
    from scanweaver.runtime.cuda import device_chip as chip

    return chip()


def _host_launches(module: ModuleOp) -> tuple[dict[str, list[KernelLaunch]], dict[str, int]]:
    by_kernel = {d.kernel_name: d for d in launch_descriptions(module)}
    launches: dict[str, list[KernelLaunch]] = {}
    counts: dict[str, int] = {}
    for fn in module.ops:
        if not isinstance(fn, func.FuncOp) or fn.is_declaration:
            continue
        name = fn.sym_name.data
        counts[name] = len(fn.function_type.inputs.data)
        seq = []
        for op in fn.body.walk():
            if op is fn:
                continue
            if isinstance(op, scf.IfOp) and not _is_empty_grid_guard(op):
                raise ScanWeaverValueError(
                    f"function @{name} chooses kernels at run time (scf.if); the CUDA runtime "
                    "only replays unconditional launches" + _why_not_lowered(fn)
                )
            if not isinstance(op, _HOST_OPS):
                raise ScanWeaverValueError(
                    f"function @{name} needs host-side work that the CUDA runtime cannot run "
                    f"('{op.name}'); only scan kernels and their launches are supported" + _why_not_lowered(fn)
                )
            if isinstance(op, gpu.LaunchFuncOp):
                kernel = op.kernel.nested_references.data[-1].data
                if kernel not in by_kernel:
                    raise ScanWeaverValueError(f"kernel {kernel} has no launch description")
                seq.append(by_kernel[kernel])
        launches[name] = seq
    return launches, counts


def _why_not_lowered(fn: func.FuncOp) -> str:
    """The GPU lowering's reasons for the scan ops it left in `fn` (see scan-to-gpu)."""
    from scanweaver.rewrites.blelloch_gpu import refusals

    reasons = refusals(fn)
    if reasons:
        return "; the GPU lowering left " + "; ".join(reasons)
    return (
        "; no scan op was left there, so the raise did not turn that loop into a recurrence "
        "(xdsl-opt -p 'scanweaver-raise{diagnose=true}' says why)"
    )


def _is_empty_grid_guard(op: scf.IfOp) -> bool:
    """`scf.if (n > 0) { launches }` with no else: `launch` skips empty grids itself."""
    cond = op.cond.owner
    if not isinstance(cond, arith.CmpiOp) or cond.predicate.value.data not in (4, 8):  # sgt, ugt
        return False
    zero = cond.rhs.owner
    if not (isinstance(zero, arith.ConstantOp) and getattr(zero.value, "value", None) is not None
            and zero.value.value.data == 0):
        return False
    return not op.false_region.blocks or all(
        isinstance(o, scf.YieldOp) for o in op.false_region.block.ops
    )


def _parse_ptx_entry(payload: bytes) -> tuple[str, dict[str, dict[str, int]], list[str]]:
    """A `ptx` cache entry; TypeError/ValueError/KeyError when malformed."""
    data = json.loads(payload)
    ptx, ptxas, warnings = data["ptx"], data["ptxas"], data.get("warnings", [])
    if not isinstance(ptx, str) or not isinstance(ptxas, dict) or not all(
        isinstance(k, str) and isinstance(f, dict) and all(isinstance(v, int) for v in f.values())
        for k, f in ptxas.items()
    ) or not (isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)):
        raise TypeError("malformed ptx entry")
    return ptx, ptxas, warnings


def build_cuda_artifacts(mlir_text: str, chip: str = "sm_90") -> CudaArtifacts:
    """Lower for the GPU and produce PTX + launch plans (no GPU needed; PTX is cached)."""
    from scanweaver import compiler
    from scanweaver.toolchain.mlir import check_chip

    check_chip(chip)
    lowered = compiler.lower(mlir_text, "gpu")
    return artifacts_from_module(lowered.module, lowered.stages, chip)


def artifacts_from_module(module: ModuleOp, stages: list[Any], chip: str = "sm_90") -> CudaArtifacts:
    """PTX + launch plans for a module already lowered for the GPU."""
    from scanweaver.toolchain import cache
    from scanweaver.toolchain.gpu_export import export_gpu, print_generic
    from scanweaver.toolchain.mlir import check_chip

    check_chip(chip)
    launches, counts = _host_launches(module)
    key = cache.cache_key("ptx", print_generic(module), chip=chip)

    def build() -> bytes:
        exported = export_gpu(module, chip=chip)
        if len(exported["ptx"]) != 1:
            raise ScanWeaverValueError(f"expected one gpu.module, found {len(exported['ptx'])}")
        return json.dumps(
            {"ptx": next(iter(exported["ptx"].values())), "ptxas": exported["ptxas"], "warnings": exported.get("warnings", [])}
        ).encode()

    if not any(launches.values()):
        raise ScanWeaverValueError(
            "the module has no recurrence or scan to run on the GPU (the raise found no affine "
            "recurrence in its loops)"
        )
    (ptx, ptxas, warnings), _ = cache.cached(key, build, parse=_parse_ptx_entry)
    results = {fn.sym_name.data: returned_scalars(fn) for fn in module.ops if isinstance(fn, func.FuncOp)}
    return CudaArtifacts(ptx, chip, launches, counts, stages, ptxas, warnings,
                         {name: r for name, r in results.items() if r and name in launches})


def compile_cuda_program(mlir_text: str):
    """Compile for the GPU of this machine and return a `Program` of callables."""
    from scanweaver.runtime.program import Program
    from scanweaver.runtime.cuda import CudaModule, require_cuda

    require_cuda()
    from scanweaver.ir import parse_ir
    from scanweaver.runtime.shape_contract import derive_contracts

    artifacts = build_cuda_artifacts(mlir_text, device_chip())
    module = CudaModule(artifacts.ptx)
    contracts = derive_contracts(parse_ir(mlir_text))
    functions = {
        name: with_results(
            CudaFunction(module, name, seq, artifacts.arg_counts[name],
                         contracts[name].to_data() if name in contracts else None),
            name, artifacts.results.get(name, []), artifacts.arg_counts[name],
        )
        for name, seq in artifacts.launches.items()
    }
    return Program(functions, artifacts.stages, artifacts.ptx)
