"""Complex recurrences and the GPU target (no GPU needed: PTX is built here and
checked with ptxas when the CUDA toolkit is installed; kernels run in the thread-block
simulator).

* One complex value per channel (`lru_iter_arg_loops`: the state an iter_arg) becomes
  the fused 2x2 linear-recurrence kernel on (re, im) (`scan-complex-to-pairs`); the
  (re, im) pair form written by hand (`lru_pair_loops`) keeps that form on the GPU.
  PTX for sm_80 and sm_90: no spills, no stack frame; simulated against the interpreter.
* Complex scans without a kernel (a complex scan.scan, a dynamic or large
  memref<N x complex> state) become sequential host loops (`scan-complex-to-host-loops`)
  instead of failing.  Complex scan.affine: tests/test_complex_gpu_affine.py; several
  complex values per state (the LRU): tests/test_complex_gpu_state.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.complex_to_real import ComplexToReal
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.raise_complex_pairs import ComplexToPairs
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.workloads.lru import lru_iter_arg_loops, lru_pair_loops

RNG = np.random.default_rng(90)


def gpu_lowered(text: str, block_size: int, items_per_thread: int):
    module = parse_ir(text)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ComplexToPairs().apply(ctx, module)
    ScanToGpu(block_size=block_size, items_per_thread=items_per_thread).apply(ctx, module)
    ComplexToReal().apply(ctx, module)
    module.verify()
    return module


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("form", ["iter_arg", "pair"])
def test_complex_kernels_ptxas(chip, form):
    build = lru_iter_arg_loops if form == "iter_arg" else lru_pair_loops
    module = gpu_lowered(print_ir(build(64, 4096)), 128, 4)
    out = export_gpu(module, chip)
    (ptx,) = out["ptx"].values()
    (desc,) = out["launches"]
    assert f".target {chip}" in ptx and f".entry {desc.kernel_name}(" in ptx
    assert "bar.sync" in ptx and ".shared" in ptx
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    info = out["ptxas"][desc.kernel_name]
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, out["warnings"]
    assert info["stack_bytes"] == 0 and info["registers"] <= 255
    assert info["shared_bytes"] == desc.shared_bytes


@pytest.mark.parametrize("dtype,el,tol", [(np.complex64, "f32", 2e-6), (np.complex128, "f64", 1e-13)])
def test_complex_kernel_in_simulator_matches_interpreter(dtype, el, tol):
    C, L = 3, 21  # several tiles of 4 threads x 2 items, a partial last tile
    text = print_ir(lru_iter_arg_loops(C, L, el))
    module = gpu_lowered(text, 4, 2)
    assert "gpu.func" in print_ir(module)
    lam = ((RNG.standard_normal(C) + 1j * RNG.standard_normal(C)) * 0.6).astype(dtype)
    b = (RNG.standard_normal((C, L)) + 1j * RNG.standard_normal((C, L))).astype(dtype)
    ref = [lam, b, np.zeros((C, L), dtype), np.zeros(C, dtype)]
    got = [x.copy() for x in ref]
    run_function(parse_ir(text), "lru_iter", *ref)
    simulate_launch(module, "lru_iter", *got)
    np.testing.assert_allclose(got[2], ref[2], rtol=tol, atol=tol)
    np.testing.assert_allclose(got[3], ref[3], rtol=tol, atol=tol)


COMPLEX_CUMSUM = """
func.func @f(%x: memref<2x6xcomplex<f32>>, %y: memref<2x6xcomplex<f32>>) {
  scan.scan ins(%x : memref<2x6xcomplex<f32>>) outs(%y : memref<2x6xcomplex<f32>>) axis 1 {
  ^bb0(%p: complex<f32>, %q: complex<f32>):
    %s = complex.add %p, %q : complex<f32>
    scan.yield %s : complex<f32>
  }
  func.return
}
"""


def test_complex_without_kernel_becomes_host_loops():
    """A complex scan.scan has no GPU kernel: sequential host loops, the same bits."""
    final = compiler.lower(COMPLEX_CUMSUM, "gpu").stages[-1].ir
    assert "gpu.func" not in final and "scan." not in final
    x = (RNG.standard_normal((2, 6)) + 1j * RNG.standard_normal((2, 6))).astype(np.complex64)
    outs = []
    for form in (COMPLEX_CUMSUM, final):
        y = np.zeros((2, 6), np.complex64)
        run_function(form, "f", x.copy(), y)
        outs.append(y)
    assert outs[0].tobytes() == outs[1].tobytes()
    np.testing.assert_allclose(outs[0], np.cumsum(x, axis=1), rtol=1e-6)


def test_parallel_kernel_finite_where_the_loop_is():
    """|lam| = 1e6 with b = 0 until the last step: the loop's state stays 0, while tile
    products of lam overflow (inf * 0 = NaN); the kernel's overflow guard keeps the
    sequential result."""
    C, L = 2, 40
    text = print_ir(lru_iter_arg_loops(C, L))
    module = gpu_lowered(text, 4, 2)
    lam = np.array([1e6 + 0j, 3e5 + 2e5j], np.complex64)
    b = np.zeros((C, L), np.complex64)
    b[:, -1] = 1 + 1j
    ref = [lam, b, np.zeros((C, L), np.complex64), np.zeros(C, np.complex64)]
    got = [x.copy() for x in ref]
    run_function(parse_ir(text), "lru_iter", *ref)
    simulate_launch(module, "lru_iter", *got)
    assert np.isfinite(ref[2]).all() and np.isfinite(got[2]).all()
    np.testing.assert_array_equal(got[2], ref[2])
