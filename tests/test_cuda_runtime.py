"""The CUDA runtime up to the driver (no GPU needed), and on a GPU when there is one."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from scanweaver.errors import BackendUnavailableError, ScanWeaverError
from scanweaver.runtime.cuda import DeviceView, cuda_available, kernel_params, why_no_cuda
from scanweaver.runtime.cuda_program import build_cuda_artifacts
from scanweaver.runtime.cuda_scan import _is_c_contiguous, _Reshaped
from scanweaver.workloads.scans import affine_scan_ir

needs_gpu = pytest.mark.skipif(not cuda_available(), reason=f"no usable GPU: {why_no_cuda()}")


class FakeDeviceArray:
    """Stands in for a device array: only the interface matters to the launcher."""

    def __init__(self, shape, dtype=np.float32, pointer=0x7000_0000, strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "data": (pointer, False),
            "strides": strides,
            "version": 3,
        }


def test_artifacts_build_without_a_gpu():
    ir = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True, reverse=True)
    art = build_cuda_artifacts(ir, "sm_90")
    assert ".entry scan_affine_0" in art.ptx and ".target sm_90" in art.ptx
    (desc,) = art.launches["f"]
    assert desc.host_args == (0, 1, 2, 3, 4) and art.arg_counts["f"] == 5
    assert [a[1] for a in desc.args] == ["in", "in", "in", "out", "out"]


def test_kernel_params_follow_the_memref_descriptor_abi():
    ir = affine_scan_ir(("?", "?"), 1, "f32", "f32", final=True)
    (desc,) = build_cuda_artifacts(ir, "sm_90").launches["f"]
    views = [
        DeviceView.from_interface(FakeDeviceArray((3, 10), pointer=0x1000 * (i + 1)), f"arg {i}")
        for i in range(3)
    ] + [DeviceView.from_interface(FakeDeviceArray((3,), pointer=0x9000), "final")]
    params = kernel_params(desc, views)
    assert len(params) == desc.param_count() == 3 * 7 + 5
    # a: allocated, aligned, offset, sizes (3, 10), strides (10, 1)
    values = [p.value for p in params[:7]]
    assert values == [0x1000, 0x1000, 0, 3, 10, 10, 1]
    assert isinstance(params[2], ctypes.c_int64)
    assert desc.resolve_grid({a[0]: v.shape for a, v in zip(desc.args, views)}) == (3, 1, 1)


def test_kernel_params_reject_wrong_shapes_and_strides():
    ir = affine_scan_ir((4, "?"), 1, "f32", "f32")
    (desc,) = build_cuda_artifacts(ir, "sm_90").launches["f"]
    views = [DeviceView.from_interface(FakeDeviceArray((5, 8)), "x")] * 3
    with pytest.raises(ScanWeaverError, match="argument 'a' has shape \\(5, 8\\), expected \\(4, '\\?'\\)"):
        kernel_params(desc, views)
    with pytest.raises(ScanWeaverError, match="not whole elements"):
        DeviceView.from_interface(FakeDeviceArray((4, 8), strides=(34, 4)), "x")


def test_strided_interface_and_reshaping():
    view = DeviceView.from_interface(FakeDeviceArray((4, 8), strides=(64, 4)), "x")
    assert view.strides == (16, 1)
    base = FakeDeviceArray((2, 3, 8))
    assert _is_c_contiguous(base.__cuda_array_interface__)
    assert not _is_c_contiguous(FakeDeviceArray((4, 8), strides=(64, 4)).__cuda_array_interface__)
    flat = _Reshaped(base, (6, 8))
    assert flat.__cuda_array_interface__["shape"] == (6, 8)
    assert flat.__cuda_array_interface__["data"] == base.__cuda_array_interface__["data"]


@pytest.mark.skipif(cuda_available(), reason="this machine has a GPU")
def test_cuda_backend_without_gpu_is_one_clear_error():
    import scanweaver

    a = np.ones((2, 8), np.float32)
    with pytest.raises(BackendUnavailableError, match="backend='cuda' is not available: "):
        scanweaver.linear_scan(a, a, backend="cuda")
    with pytest.raises(BackendUnavailableError, match="CUDA is not available"):
        scanweaver.compile(affine_scan_ir((2, 8), 1, "f32", "f32"), target="cuda")


@needs_gpu
@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_on_gpu_matches_cpu(reverse):
    import scanweaver

    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 1, (64, 3000)).astype(np.float32)
    b = rng.standard_normal((64, 3000)).astype(np.float32)
    h0 = rng.standard_normal(64).astype(np.float32)
    got, last = scanweaver.linear_scan(a, b, h0, reverse=reverse, backend="cuda", return_final_state=True)
    want, want_last = scanweaver.linear_scan(a, b, h0, reverse=reverse, backend="cpu", return_final_state=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(last, want_last, rtol=1e-4, atol=1e-5)


@needs_gpu
def test_compile_program_runs_on_gpu():
    import scanweaver

    prog = scanweaver.compile(affine_scan_ir(("?", "?"), 1, "i32", "i32"), target="cuda")
    rng = np.random.default_rng(1)
    a = rng.integers(-5, 5, (8, 1000), dtype=np.int32)
    b = rng.integers(-5, 5, (8, 1000), dtype=np.int32)
    h = np.zeros_like(a)
    prog.f(a, b, h)
    h_cpu = np.zeros_like(a)
    scanweaver.compile(affine_scan_ir(("?", "?"), 1, "i32", "i32"), target="cpu").f(a, b, h_cpu)
    np.testing.assert_array_equal(h, h_cpu)


@pytest.mark.parametrize("return_last_state", [False, True])
def test_selective_scan_gpu_build_maps_every_argument(return_last_state):
    """The selective scan's GPU build is one kernel whose launch uses every host argument,
    with its grid computed from the sizes (one build for every (batch, D, L))."""
    from scanweaver.runtime.cuda_scan import selective_scan_ir

    shapes = {"u": (2, 8, 64), "delta": (2, 8, 64), "A": (8, 16), "B": (2, 16, 64),
              "C": (2, 16, 64), "D": (8,), "z": (2, 8, 64), "delta_bias": (8,)}
    ir = selective_scan_ir(shapes, {"delta_softplus": True, "return_last_state": return_last_state})
    art = build_cuda_artifacts(ir, "sm_90")
    (desc,) = art.launches["selective_scan"]
    n_args = len(shapes) + 1 + return_last_state
    assert art.arg_counts["selective_scan"] == n_args
    assert sorted(desc.host_args) == list(range(n_args))
    assert desc.grid == ("u.shape[0]*u.shape[1]", 1, 1)
    assert desc.resolve_grid({"u": (2, 8, 64)}) == (16, 1, 1)  # one block per (batch, channel)
    assert desc.resolve_grid({"u": (3, 5, 7)}) == (15, 1, 1)
    assert art.ptxas and all(f["spill_stores"] == 0 for f in art.ptxas.values())


@needs_gpu
def test_selective_scan_on_gpu_matches_reference():
    import scanweaver
    from scanweaver.workloads.reference import selective_scan_reference

    rng = np.random.default_rng(2)
    u = rng.standard_normal((2, 32, 300)).astype(np.float32)
    delta = (0.5 * rng.standard_normal((2, 32, 300))).astype(np.float32)
    A = -np.exp(rng.standard_normal((32, 16))).astype(np.float32)
    B = rng.standard_normal((2, 16, 300)).astype(np.float32)
    C = rng.standard_normal((2, 16, 300)).astype(np.float32)
    D = rng.standard_normal(32).astype(np.float32)
    z = rng.standard_normal((2, 32, 300)).astype(np.float32)
    out, last = scanweaver.selective_scan(u, delta, A, B, C, D=D, z=z, delta_softplus=True,
                                          return_last_state=True, backend="cuda")
    want, want_last = selective_scan_reference(u, delta, A, B, C, D=D, z=z, delta_softplus=True,
                                               return_last_state=True)
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(last, want_last, rtol=1e-3, atol=1e-3)


def test_runtime_rejects_kernels_chosen_at_run_time():
    """A host-side scf.if around scans cannot be replayed from launch descriptions."""
    ir = """
func.func @f(%p: i1, %a: memref<4x8xf32>, %h: memref<4x8xf32>) {
  scf.if %p {
    scan.affine %a, %a into %h axis 1 : memref<4x8xf32>, memref<4x8xf32> -> memref<4x8xf32>
  } else {
    scan.affine %a, %a into %h axis 1 reverse : memref<4x8xf32>, memref<4x8xf32> -> memref<4x8xf32>
  }
  func.return
}
"""
    with pytest.raises(ScanWeaverError, match=r"chooses kernels at run time \(scf.if\)"):
        build_cuda_artifacts(ir, "sm_90")


def test_kernel_params_check_element_types():
    ir = affine_scan_ir(("?", "?"), 1, "f32", "f32")
    (desc,) = build_cuda_artifacts(ir, "sm_90").launches["f"]
    views = [DeviceView.from_interface(FakeDeviceArray((2, 8), dtype=np.float64), "x")] * 3
    with pytest.raises(ScanWeaverError, match="argument 'a' must hold f32 elements"):
        kernel_params(desc, views)


def test_output_positions_are_the_written_arguments():
    from scanweaver.runtime.cuda import output_positions

    ir = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    art = build_cuda_artifacts(ir, "sm_90")
    assert output_positions(art.launches["f"]) == {3, 4}  # h and the final state
