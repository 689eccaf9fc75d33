"""Several complex values per state (the LRU's `memref<N x complex>`, Re(C h) readout
as the emit) on the GPU target: the diagonal `scan.recurrence` kernel with complex
pairs (`complex.mul`/`complex.add` in the tree sweeps, complex shared memory, the
overflow guard on (re, im)), made real by `scan-complex-to-real`.

Checked in the thread-block simulator against the interpreter (lengths 0, 1 and 2^k +- 1
around the tile of 4 threads x 2 items, f32 and f64), through the whole `gpu` pipeline,
on overflowing products, and with ptxas for sm_80 / sm_90 (when installed).
"""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.complex_affine_loops import ComplexScansToLoops
from scanweaver.rewrites.complex_to_real import ComplexToReal
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.raise_complex_pairs import ComplexToPairs
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.workloads.lru import lru_loops

RNG = np.random.default_rng(171)
DT = {"f32": (np.float32, np.complex64), "f64": (np.float64, np.complex128)}


def gpu_lowered(text: str, block_size=4, items_per_thread=2, time_blocks="auto"):
    module = parse_ir(text)
    ctx = make_context()
    for stage in (RaiseRecurrences(), ComplexToPairs(), ComplexScansToLoops(),
                  ScanToGpu(block_size=block_size, items_per_thread=items_per_thread, time_blocks=time_blocks),
                  ComplexToReal()):
        stage.apply(ctx, module)
    module.verify()
    return module


def lru_args(L, N, H, el, lam_scale=0.6):
    rdt, cdt = DT[el]

    def c(*shape):
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(cdt)

    lam = (c(N) * lam_scale).astype(cdt)
    return [lam, RNG.random(N).astype(rdt), c(L, N), c(H, N), RNG.standard_normal(H).astype(rdt),
            RNG.standard_normal((L, H)).astype(rdt), c(N), np.full((L, H), np.nan, rdt)]


def run_both(text, module, args):
    ref, got = [x.copy() for x in args], [x.copy() for x in args]
    run_function(text, "lru", *ref)
    simulate_launch(module, "lru", *got)
    return ref, got


def no_scan_ops(module) -> bool:
    return not any(o.dialect_name() == "scan" for o in module.walk())


@pytest.mark.parametrize("el,tol", [("f32", 2e-5), ("f64", 1e-12)])
@pytest.mark.parametrize("L", [0, 1, 7, 9, 17])
def test_lru_kernel_in_simulator_matches_interpreter(L, el, tol):
    N, H = 4, 3
    text = print_ir(lru_loops(L, N, H, el))
    module = gpu_lowered(text)
    assert "gpu.func" in print_ir(module) and no_scan_ops(module)
    ref, got = run_both(text, module, lru_args(L, N, H, el))
    np.testing.assert_allclose(got[6], ref[6], rtol=tol, atol=tol)  # last state (h in/out)
    np.testing.assert_allclose(got[7], ref[7], rtol=tol, atol=tol * 10)  # y = Re(C h) + D x
    if L <= 1:  # nothing reassociated: the loop's bits
        assert got[6].tobytes() == ref[6].tobytes() and got[7].tobytes() == ref[7].tobytes()


def test_lru_through_the_gpu_pipeline():
    L, N, H = 5, 3, 2
    text = print_ir(lru_loops(L, N, H))
    final = compiler.lower(text, "gpu").stages[-1].ir
    module = parse_ir(final)
    assert "gpu.func" in final and no_scan_ops(module) and "complex.mul" not in final
    ref, got = run_both(text, module, lru_args(L, N, H, "f32"))
    np.testing.assert_allclose(got[6], ref[6], rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(got[7], ref[7], rtol=2e-5, atol=2e-5)


def test_lru_kernel_finite_where_the_loop_is():
    """|lam| = 1e6 with no input until the last step: the loop's state stays 0 while tile
    products of lam overflow; the guard takes those tiles in the loop's order."""
    L, N, H = 40, 2, 2
    text = print_ir(lru_loops(L, N, H))
    module = gpu_lowered(text)
    args = lru_args(L, N, H, "f32")
    args[0] = np.array([1e6 + 0j, 3e5 + 2e5j], np.complex64)
    args[2][:-1] = 0
    args[6][:] = 0
    ref, got = run_both(text, module, args)
    assert np.isfinite(ref[7]).all() and np.isfinite(got[7]).all()
    np.testing.assert_array_equal(got[6], ref[6])
    np.testing.assert_array_equal(got[7], ref[7])


def test_large_complex_state_stays_host_loops():
    """More than MAX_COMPLEX_STATE = 16 complex values: sequential host loops."""
    text = print_ir(lru_loops(3, 17, 1))
    final = compiler.lower(text, "gpu").stages[-1].ir
    assert "gpu.func" not in final and no_scan_ops(parse_ir(final))


@pytest.mark.parametrize("el", ["f32", "f64"])
def test_lru_kernel_ptxas(el):
    """The largest complex state taken, N = 16 (f64: one item per thread, see state_words)."""
    # the fused kernel (f64: 4096 steps are two 2048-step chunks, time blocks by default)
    module = gpu_lowered(print_ir(lru_loops(4096, 16, 4, el)), 128, 4, time_blocks="never")
    for chip in ("sm_80", "sm_90"):
        out = export_gpu(module, chip)
        (ptx,) = out["ptx"].values()
        (desc,) = out["launches"]
        assert f".target {chip}" in ptx and f".entry {desc.kernel_name}(" in ptx and "bar.sync" in ptx
        if not ptxas_available():
            pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
        info = out["ptxas"][desc.kernel_name]
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (chip, info, out["warnings"])
        assert info["stack_bytes"] == 0 and info["registers"] <= 255, (chip, info)
        assert info["shared_bytes"] == desc.shared_bytes


def test_compile_cuda_runs_the_lru_through_the_runtime(monkeypatch):
    """`scanweaver.compile(lru, target="cuda")` takes complex arguments: the CUDA runtime
    packs them (interleaved pairs, descriptors in complex elements) for a driver whose
    launches run the kernel in the thread-block simulator."""
    import scanweaver as sw
    from scanweaver.runtime import cuda, cuda_program
    from tests.test_gpu_time_blocks import SimulatorDriver

    L, N, H = 6, 2, 2
    text = print_ir(lru_loops(L, N, H))
    driver = SimulatorDriver(compiler.lower(text, "gpu").module)
    monkeypatch.setattr(cuda, "require_cuda", lambda: None)
    monkeypatch.setattr(cuda, "current_driver", lambda: driver)
    monkeypatch.setattr(cuda_program, "device_chip", lambda: "sm_90")
    program = sw.compile(text, target="cuda")
    args = lru_args(L, N, H, "f32")
    ref, got = [x.copy() for x in args], [x.copy() for x in args]
    run_function(text, "lru", *ref)
    program.lru(*got)
    assert [name for name, _ in driver.launches] == ["scan_recurrence_0"]
    np.testing.assert_allclose(got[6], ref[6], rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(got[7], ref[7], rtol=2e-5, atol=2e-5)
