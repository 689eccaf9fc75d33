"""`build_cpu` skips xDSL's canonicalize and cse and has mlir-opt run MLIR's first
(`stages_for(cleanup=False)`, `lower_to_llvm_ir(cleanup=True)`): the machine code of
the drivers' kernels is the one of the full xDSL pipeline, byte for byte."""

import pytest

from scanweaver.compiler import cpu_llvm_ir, lower
from scanweaver.rewrites.pipeline import stages_for
from scanweaver.runtime.cpu import host_target_machine, optimized_module
from scanweaver.runtime.cpu_scan import _affine_options
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.toolchain.mlir import CPU_CLEANUP_FLAGS
from scanweaver.workloads.specs import SelectiveScanSpec


def _machine_code(llvm_ir: str) -> bytes:
    tm = host_target_machine(3, shared_object=True)
    return tm.emit_object(optimized_module(llvm_ir, tm, 3))


def _both(text: str, openmp: bool = False) -> tuple[str, str]:
    full = cpu_llvm_ir(lower(text, "cpu", keep_stages=False, openmp=openmp).module, openmp=openmp)[0]
    lean = lower(text, "cpu", keep_stages=False, openmp=openmp, verify=False, cleanup=False).module
    return full, cpu_llvm_ir(lean, openmp=openmp, cleanup=True)[0]


def test_cleanup_false_drops_only_the_final_canonicalize_and_cse():
    full = [s.name for s in stages_for("cpu")]
    assert [s.name for s in stages_for("cpu", cleanup=False)] == full[:-2]
    assert full[-2:] == ["canonicalize", "cse"]
    assert CPU_CLEANUP_FLAGS == ["--canonicalize", "--cse"]


CASES = [
    ("affine f64, final state", lambda: kernel_ir("affine", **_affine_options("f64", 2, False, True, False)).text, False),
    ("affine i64, h0, reverse, OpenMP", lambda: kernel_ir("affine", **_affine_options("i64", 2, True, False, True)).text, True),
    ("affine complex64", lambda: kernel_ir("affine", **_affine_options("complex<f32>", 2, False, False, False)).text, False),
    ("selective, D, z, bias, softplus", lambda: kernel_ir(
        "selective", spec=SelectiveScanSpec(8, "shared", "shared", True, True, True, True, False, False)).text, False),
]


@pytest.mark.parametrize("name,text,openmp", CASES, ids=[c[0] for c in CASES])
def test_mlir_cleanup_gives_the_same_machine_code(name, text, openmp):
    full, lean = _both(text(), openmp)
    assert full == lean or _machine_code(full) == _machine_code(lean), name
