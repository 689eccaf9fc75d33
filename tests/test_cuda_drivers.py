"""Each CUDA driver binding, with a fake driver: the exact values handed to the driver."""

from __future__ import annotations

import ctypes
import struct
import sys
import types

import numpy as np
import pytest

from scanweaver.errors import BackendUnavailableError, ScanWeaverValueError
from scanweaver.runtime import cuda_driver
from scanweaver.runtime.cuda import CudaFunction, CudaModule, DeviceView, kernel_params
from scanweaver.runtime.cuda_driver import CudaPythonDriver, NumbaCudaDriver, NumbaDriver, open_driver
from scanweaver.runtime.cuda_launch import KernelLaunch
from tests.cuda_fakes import fake_cuda_bindings_driver, fake_launch_kernel, fake_numba_cuda

# A kernel like scan-to-gpu's affine scan with a scalar parameter: a, b: in, h: out
DESC = KernelLaunch(
    kernel_name="k0",
    module_name="scanweaver_kernels",
    grid=("h.shape[0]", 1, 1),
    block=(128, 1, 1),
    shared_bytes=1028,
    args=[("a", "in", "f32", ("?", "?")), ("gamma", "scalar", "f32", ()), ("h", "out", "f32", ("?", "?"))],
    func_name="f",
    host_args=(0, 1, 2),
)
SIZES = [8] * 7 + [4] + [8] * 7  # two rank-2 descriptors around one f32


def expected_bytes(ptr_a: int, ptr_h: int, shape: tuple[int, int], gamma: float) -> list[bytes]:
    def desc(ptr):
        q = lambda v: struct.pack("<q", v)  # noqa: E731
        return [q(ptr), q(ptr), q(0), q(shape[0]), q(shape[1]), q(shape[1]), q(1)]

    return desc(ptr_a) + [struct.pack("<f", gamma)] + desc(ptr_h)


@pytest.fixture(autouse=True)
def _fresh_drivers():
    cuda_driver.reset_drivers()
    yield
    cuda_driver.reset_drivers()


def _run_through(driver, arrays):
    module = CudaModule(".version 8.0\n.target sm_90\n", driver=driver)
    CudaFunction(module, "f", [DESC], 3)(*arrays)
    return module


def _fill_h_with_sevens(param_bytes):
    """The fake kernel: h[...] = 7 through h's aligned pointer and sizes."""
    ptr, rows, cols = (struct.unpack("<q", param_bytes[i])[0] for i in (9, 11, 12))
    (ctypes.c_float * (rows * cols)).from_address(ptr)[:] = [7.0] * (rows * cols)


def test_cuda_python_binding_packs_descriptors_and_scalars():
    drv = fake_cuda_bindings_driver(SIZES, kernel=_fill_h_with_sevens)
    driver = CudaPythonDriver(drv)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    h = np.full((3, 4), np.nan, np.float32)
    _run_through(driver, [a, 0.5, h])
    (launch,) = drv.launches
    assert launch.grid == (3, 1, 1) and launch.block == (128, 1, 1)
    assert launch.dynamic_shared == 0  # static shared memory is not asked for twice
    assert launch.stream == 0
    assert launch.function == ("fn", ("module", 0), b"k0")
    # the device pointers are the two allocations, in argument order
    allocs = [c[1] for c in drv.calls if c[0] == "cuMemAlloc"]
    assert allocs == [48, 48]
    ptrs = list(drv.memory.buffers)
    assert launch.param_bytes == expected_bytes(ptrs[0], ptrs[1], (3, 4), 0.5)
    # PTX handed over NUL-terminated; context: primary context of device 0 made current
    assert drv.images == [b".version 8.0\n.target sm_90\n"]
    names = [c[0] for c in drv.calls]
    assert names[:4] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]
    assert names.index("cuCtxSynchronize") < names.index("cuMemcpyDtoH")
    # h was copied back after the launch, a was left alone
    assert np.all(h == 7) and a[2, 3] == 11


def test_cuda_python_binding_device_arrays_in_place_and_errors():
    drv = fake_cuda_bindings_driver(SIZES, fail={"cuLaunchKernel": 701})
    driver = CudaPythonDriver(drv)
    a, h = driver.to_device(np.ones((2, 5), np.float32)), driver.empty((2, 5), np.float32)
    from scanweaver.runtime.cuda_driver import CudaDriverError

    with pytest.raises(CudaDriverError, match="cuLaunchKernel failed: CUDA_ERROR_701"):
        _run_through(driver, [a, 2.0, h])
    assert not [c for c in drv.calls if c[0] in ("cuMemcpyDtoH",)]  # nothing copied for device arrays
    assert driver.compute_capability() == (9, 0)
    ev0, ev1 = driver.create_event(), driver.create_event()
    driver.record_event(ev0, 0xABC)
    assert ("cuEventRecord", ev0, 0xABC) in drv.calls
    assert driver.elapsed_ms(ev0, ev1) == 1.5


def test_numba_builtin_binding_packs_the_same_values():
    launches = []
    cuda = fake_numba_cuda("Built-in")
    driver = NumbaDriver(cuda, fake_launch_kernel(SIZES, launches))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    h = np.zeros((3, 4), np.float32)
    _run_through(driver, [a, -1.25, h])
    (launch,) = launches
    assert launch.function == ("numba-fn", "k0")
    assert (launch.grid, launch.block, launch.dynamic_shared, launch.stream) == ((3, 1, 1), (128, 1, 1), 0, 0)
    pa, ph = (int(bytes_[:8][::-1].hex(), 16) for bytes_ in (launch.param_bytes[0], launch.param_bytes[8]))
    assert launch.param_bytes == expected_bytes(pa, ph, (3, 4), -1.25)
    assert pa != ph
    assert cuda.log[0] == ("ptx", b".version 8.0\n.target sm_90\n")  # numba wants bytes
    with pytest.raises(BackendUnavailableError, match="'NVIDIA' implementation"):
        NumbaDriver(fake_numba_cuda("NVIDIA"), fake_launch_kernel(SIZES, []))


def test_numba_cuda_binding_uses_its_memory_and_cuda_bindings_launch():
    drv = fake_cuda_bindings_driver(SIZES)
    cuda = fake_numba_cuda("NVIDIA")
    driver = NumbaCudaDriver(cuda, drv)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    h = np.zeros((2, 4), np.float32)
    _run_through(driver, [a, 3.0, h])
    (launch,) = drv.launches
    assert not [c for c in drv.calls if c[0] in ("cuMemAlloc", "cuInit")]  # numba-cuda owns memory/context
    pa = int(launch.param_bytes[0][::-1].hex(), 16)
    ph = int(launch.param_bytes[8][::-1].hex(), 16)
    assert launch.param_bytes == expected_bytes(pa, ph, (2, 4), 3.0)
    assert launch.dynamic_shared == 0
    assert ("sync",) in cuda.log
    with pytest.raises(BackendUnavailableError, match="'Built-in' implementation"):
        NumbaCudaDriver(fake_numba_cuda("Built-in"), drv)
    stream = driver.create_stream()
    ev = driver.create_event()
    driver.record_event(ev, cuda_driver.stream_handle(stream))
    assert cuda.log[-1] == ("record", stream)


def test_open_driver_finds_cuda_python_through_sys_modules(monkeypatch):
    drv = fake_cuda_bindings_driver(SIZES)
    pkg, sub = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
    pkg.bindings, sub.driver = sub, drv
    monkeypatch.setitem(sys.modules, "cuda", pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings", sub)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", drv)
    monkeypatch.delenv("SCANWEAVER_CUDA_DRIVER", raising=False)
    assert open_driver().name == "cuda-python"
    monkeypatch.setenv("SCANWEAVER_CUDA_DRIVER", "nonsense")
    with pytest.raises(BackendUnavailableError, match="not a driver binding"):
        open_driver()


def test_no_binding_is_one_sentence_per_candidate(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)  # import cuda fails
    monkeypatch.setenv("SCANWEAVER_CUDA_DRIVER", "cuda-python")
    with pytest.raises(BackendUnavailableError, match=r"cuda-python: not installed \(no module cuda"):
        open_driver()


def test_streams_of_other_libraries():
    assert cuda_driver.stream_handle(None) == 0
    assert cuda_driver.stream_handle(types.SimpleNamespace(cuda_stream=77)) == 77  # torch
    assert cuda_driver.stream_handle(types.SimpleNamespace(handle=types.SimpleNamespace(value=5))) == 5  # numba


class _Dev:
    def __init__(self, shape, ptr, dtype=np.float32, strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": np.dtype(dtype).str, "data": (ptr, False), "strides": strides, "version": 3,
        }


def test_device_arrays_strided_or_overlapping_are_refused():
    drv = fake_cuda_bindings_driver(SIZES)
    driver = CudaPythonDriver(drv)
    module = CudaModule("ptx", driver=driver)
    fn = CudaFunction(module, "f", [DESC], 3)
    with pytest.raises(ScanWeaverValueError, match="arguments #0 and #2 overlap in device memory"):
        fn(_Dev((2, 4), 0x1000), 1.0, _Dev((2, 4), 0x1010))
    fn(_Dev((2, 4), 0x1000), 1.0, _Dev((2, 4), 0x1020))  # adjacent, not overlapping
    with pytest.raises(ScanWeaverValueError, match=r"element strides \(8, 2\).*innermost stride 1"):
        fn(_Dev((2, 4), 0x1000, strides=(32, 8)), 1.0, _Dev((2, 4), 0x9000))
    with pytest.raises(ScanWeaverValueError, match=r"element strides \(1, 2\)"):
        fn(_Dev((2, 4), 0x1000, strides=(4, 8)), 1.0, _Dev((2, 4), 0x9000))
    view = DeviceView.from_interface(_Dev((2, 4), 0x1000), "x")
    with pytest.raises(Exception, match="argument 'gamma' must be a f32 number"):
        kernel_params(DESC, [view, "x", view])


def test_mismatched_lengths_are_refused_before_launch():
    from scanweaver.runtime.cuda_program import build_cuda_artifacts
    from scanweaver.workloads.scans import affine_scan_ir

    art = build_cuda_artifacts(affine_scan_ir(("?", "?"), 1, "f32", "f32", final=True), "sm_90")
    (desc,) = art.launches["f"]
    assert ("b", 1, "h", 1) in desc.equal_dims and ("final", 0, "h", 0) in desc.equal_dims
    drv = fake_cuda_bindings_driver([8] * 26)
    fn = CudaFunction(CudaModule(art.ptx, driver=CudaPythonDriver(drv)), "f", art.launches["f"], 4)
    a, h = np.ones((3, 10), np.float32), np.zeros((3, 10), np.float32)
    with pytest.raises(ScanWeaverValueError, match=r"'b' has shape \(3, 9\) and 'h' has shape \(3, 10\); b.shape\[1\] must equal h.shape\[1\]"):
        fn(a, np.ones((3, 9), np.float32), h, np.zeros(3, np.float32))
    with pytest.raises(ScanWeaverValueError, match=r"final.shape\[0\] must equal h.shape\[0\]"):
        fn(a, a.copy(), h, np.zeros(4, np.float32))
    assert not drv.launches
    fn(a, a.copy(), h, np.zeros(3, np.float32))
    assert len(drv.launches) == 1 and drv.launches[0].grid == (3, 1, 1)


def test_arrays_smaller_than_the_loops_over_them_are_refused():
    """EMA with a scalar alpha: the loops run over x's sizes and index y with them."""
    from pathlib import Path

    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    text = (Path(__file__).parent / "gpu_loop_forms" / "ema_alpha.mlir").read_text()
    art = build_cuda_artifacts(text, "sm_90")
    (desc,) = art.launches["ema"]
    assert desc.covers_dims == (("y", 0, "x", 0), ("y", 1, "x", 1))
    assert [a[1] for a in desc.args] == ["in", "scalar", "out"]
    drv = fake_cuda_bindings_driver([8] * 7 + [4] + [8] * 7)
    fn = CudaFunction(CudaModule(art.ptx, driver=CudaPythonDriver(drv)), "ema", art.launches["ema"], 3)
    x = np.ones((3, 10), np.float32)
    with pytest.raises(ScanWeaverValueError, match=r"a loop over x.shape\[1\] indexes y.shape\[1\], which is smaller"):
        fn(x, 0.5, np.zeros((3, 9), np.float32))
    assert not drv.launches
    fn(x, 0.5, np.zeros((3, 12), np.float32))  # larger is fine: the loops never reach the rest
    (launch,) = drv.launches
    assert launch.grid == (3, 1, 1) and struct.unpack("<f", launch.param_bytes[7]) == (0.5,)


@pytest.mark.parametrize("form, name, covers", [
    # t = 0, 2, 4, ... < a.shape[1] indexes b and y: a time loop of step 2
    ("step2.mlir", "step2", {("b", 1, "a", 1), ("y", 1, "a", 1)}),
    # t = r.shape[1] - 1 - i for i < r.shape[1]: a reversed time loop (advantage estimation)
    ("more.mlir", "gae", {("v", 1, "r", 1), ("vn", 1, "r", 1), ("adv", 1, "r", 1)}),
])
def test_time_loops_of_other_steps_and_directions_check_the_arrays_they_index(form, name, covers):
    """Before, only a time index 0, 1, 2, ... gave a `covers_dims` relation: a shorter
    `b` (step 2) or `v` (reversed) passed the launch checks and the kernel read past
    it (a deployed artifact has no other check when built without its contract)."""
    from pathlib import Path

    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    text = (Path(__file__).parent / "gpu_loop_forms" / form).read_text()
    (desc,) = build_cuda_artifacts(text, "sm_90").launches[name]
    assert covers <= set(desc.covers_dims)
    shapes = {a[0]: (4, 5) for a in desc.args if a[1] != "scalar"}
    desc.check_shapes(shapes)
    other = sorted(covers)[0][0]
    with pytest.raises(ScanWeaverValueError, match=rf"'{other}' has shape \(4, 4\).*which is smaller"):
        desc.check_shapes({**shapes, other: (4, 4)})
