"""Read-only kernel inputs become `ld.global.nc` (`toolchain/readonly_params.py`): which
arguments are marked, that a launch binding an input to written memory is not, the
two-stage GPU pipeline (same PTX as upstream's one pass when nothing is marked), and the
PTX of the kernels."""

from __future__ import annotations

import re

import pytest
from xdsl.context import Context
from xdsl.dialects import gpu

from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import print_generic
from scanweaver.toolchain.mlir import (
    GPU_PIPELINE,
    GPU_PIPELINE_STAGES,
    extract_gpu_binaries,
    gpu_to_ptx,
    mlir_opt,
)
from scanweaver.toolchain.readonly_params import (
    add_noalias_to_readonly_params,
    mark_readonly_args,
    readonly_memref_args,
)
from scanweaver.workloads.scans import affine_scan_ir

KERNEL = """
module attributes {gpu.container_module} {
  func.func @f(%a: memref<?xf32>, %h: memref<?xf32>, %n: index) {
    %c1 = arith.constant 1 : index
    %c32 = arith.constant 32 : index
    gpu.launch_func @kernels::@copy blocks in (%c1, %c1, %c1) threads in (%c32, %c1, %c1)
        args(%a : memref<?xf32>, %h : memref<?xf32>, %n : index)
    func.return
  }
  gpu.module @kernels {
    gpu.func @copy(%a: memref<?xf32>, %h: memref<?xf32>, %n: index) kernel {
      %t = gpu.thread_id x
      %inside = arith.cmpi ult, %t, %n : index
      scf.if %inside {
        %x = memref.load %a[%t] : memref<?xf32>
        %y = memref.load %h[%t] : memref<?xf32>
        %s = arith.addf %x, %y : f32
        memref.store %s, %h[%t] : memref<?xf32>
      }
      gpu.return
    }
  }
}
"""


def _parse(text: str):
    """Upstream's generic form of `text` (xDSL parses gpu ops in generic form only)."""
    return parse_ir(mlir_opt(text, ["--mlir-print-op-generic"]))


def _kernel(module, name="copy") -> gpu.FuncOp:
    return next(op for op in module.walk() if isinstance(op, gpu.FuncOp) and op.sym_name.data == name)


def _loads(ptx: str) -> set[str]:
    return set(re.findall(r"\bld\.global[.\w]*", ptx))


def test_only_arrays_the_kernel_never_writes_are_read_only():
    module = _parse(KERNEL)
    assert readonly_memref_args(_kernel(module)) == [0]  # h is read and written; n is no memref
    mark_readonly_args(module)
    attrs = _kernel(module).properties["arg_attrs"].data
    assert ["llvm.readonly" in d.data for d in attrs] == [True, False, False]


def test_an_input_bound_to_written_memory_is_not_marked():
    # the same host array as the kernel's read-only a and its written h: no promise
    module = _parse(KERNEL.replace("args(%a :", "args(%h :"))
    mark_readonly_args(module)
    assert "arg_attrs" not in _kernel(module).properties
    # nor through a view of it
    module = _parse(KERNEL.replace(
        "    gpu.launch_func", "    %v = memref.cast %h : memref<?xf32> to memref<?xf32>\n    gpu.launch_func"
    ).replace("args(%a :", "args(%v :"))
    mark_readonly_args(module)
    assert "arg_attrs" not in _kernel(module).properties


def test_noalias_goes_next_to_readonly_kernel_pointers_only():
    text = (
        "    llvm.func @k(%arg0: !llvm.ptr {llvm.readonly}, %arg1: !llvm.ptr {llvm.readonly}, %arg2: i64, "
        "%arg3: !llvm.ptr) attributes {gpu.kernel, nvvm.kernel} {\n"
        "    llvm.func @helper(%arg0: !llvm.ptr {llvm.readonly}) {\n"
    )
    out = add_noalias_to_readonly_params(text)
    first, second = out.splitlines()
    assert first.count("{llvm.noalias, llvm.readonly}") == 2 and "%arg3: !llvm.ptr)" in first
    assert second == text.splitlines()[1]  # not a kernel: unchanged


def test_the_stages_are_upstreams_pipeline():
    """Our two stages run the passes of `gpu-lower-to-nvvm-pipeline`, in its order."""
    import subprocess

    from scanweaver.toolchain.tools import find_tool

    done = subprocess.run([str(find_tool("mlir-opt")), GPU_PIPELINE("sm_90"), "--dump-pass-pipeline"],
                          input="module {}", capture_output=True, text=True, check=True)
    dumped = done.stderr + done.stdout
    upstream = re.findall(r"^\s*([a-z][\w.-]*)(?:\{|,|$|\()", dumped.split("builtin.module(", 1)[1], re.M)
    upstream = [p for p in upstream if p != "gpu.module"]
    ours = []
    for stage in GPU_PIPELINE_STAGES("sm_90"):
        body = stage.split("builtin.module(", 1)[1][:-1]
        body = re.sub(r"\{[^}]*\}", "", body).replace("gpu.module(", "").replace(")", "")
        ours += body.split(",")
    assert ours == upstream


def test_two_stages_give_upstreams_ptx_when_nothing_is_read_only():
    module = parse_ir(affine_scan_ir((4, 1000), 1, "f32", "f32", init=True, final=True))
    ScanToGpu().apply(Context(), module)
    text = print_generic(module)  # unmarked
    one = extract_gpu_binaries(mlir_opt(text, [GPU_PIPELINE("sm_80")]))
    assert gpu_to_ptx(text, "sm_80") == one


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_read_only_inputs_load_through_the_nc_path(chip):
    from scanweaver.toolchain.gpu_export import export_gpu

    module = parse_ir(affine_scan_ir((4, 4096), 1, "f32", "f32", init=True, final=True))
    ScanToGpu().apply(Context(), module)
    out = export_gpu(module, chip=chip)
    (ptx,) = out["ptx"].values()
    loads = _loads(ptx)
    assert "ld.global.nc.v4.b32" in loads  # a and b, 16 bytes at a time
    assert all(".nc" in ld for ld in loads), loads  # init included: no kernel input is written
    assert "arg_attrs" not in _kernel(module, "scan_affine_0").properties  # the caller's module is untouched


def test_an_array_the_kernel_reads_and_writes_keeps_the_coherent_path():
    module = _parse(KERNEL)
    mark_readonly_args(module)
    (ptx,) = gpu_to_ptx(print_generic(module), "sm_90").values()
    assert _loads(ptx) == {"ld.global.nc.b32", "ld.global.b32"}  # a by .nc, h (written) not
