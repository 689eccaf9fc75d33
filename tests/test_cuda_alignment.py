"""Device arrays may start anywhere an element may: the kernels test their bases before
their 16-byte vector accesses and run a view off a 16-byte boundary on the scalar path
(`rewrites/gpu_aligned_bases.py`; simulated in tests/test_gpu_misaligned_views.py).
The runtime passes such views in place and refuses only a base inside an element,
before any launch; host arrays are staged into aligned buffers; the torch CUDA ops pass
views without copying.  No GPU needed: the fake cuda-python binding of
`tests/cuda_fakes.py`."""

from __future__ import annotations

import ctypes
import re
import struct

import numpy as np
import pytest

from scanweaver.errors import ScanWeaverValueError
from scanweaver.runtime import cuda_driver
from scanweaver.runtime.cuda import DEVICE_ALIGNMENT, CudaFunction, CudaModule, launch
from scanweaver.runtime.cuda_driver import CudaPythonDriver
from scanweaver.runtime.cuda_launch import KernelLaunch
from tests.cuda_fakes import fake_cuda_bindings_driver


def _desc(name: str, host_args: tuple[int, ...]) -> KernelLaunch:
    """a: in, gamma: scalar, h: out, all (?, ?) f32 (like test_cuda_drivers.DESC)."""
    return KernelLaunch(
        kernel_name=name, module_name="scanweaver_kernels", grid=("h.shape[0]", 1, 1), block=(128, 1, 1),
        shared_bytes=0,
        args=[("a", "in", "f32", ("?", "?")), ("gamma", "scalar", "f32", ()), ("h", "out", "f32", ("?", "?"))],
        func_name="f", host_args=host_args,
    )


SIZES = [8] * 7 + [4] + [8] * 7  # two rank-2 descriptors around one f32


class _Dev:
    """A device array over host memory (the fake driver's device memory is host memory)."""

    def __init__(self, shape, ptr):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": "<f4", "data": (ptr, False), "strides": None, "version": 3,
        }


def _copy_a_to_h(param_bytes):
    """The fake kernel: h = a + gamma, through both aligned pointers and h's sizes."""
    pa, ph, rows, cols = (struct.unpack("<q", param_bytes[i])[0] for i in (1, 9, 11, 12))
    (gamma,) = struct.unpack("<f", param_bytes[7])
    n = rows * cols
    src = np.ctypeslib.as_array((ctypes.c_float * n).from_address(pa))
    np.ctypeslib.as_array((ctypes.c_float * n).from_address(ph))[:] = src + gamma


@pytest.fixture(autouse=True)
def _fresh_drivers():
    cuda_driver.reset_drivers()
    yield
    cuda_driver.reset_drivers()


@pytest.fixture
def memory():
    """A 1 KiB float32 buffer whose base is 256-byte aligned (like cuMemAlloc's)."""
    raw = np.zeros(1024 + 64, np.float32)
    skip = (-raw.ctypes.data % 256) // 4
    buf = raw[skip : skip + 1024]
    assert buf.ctypes.data % 256 == 0
    return buf


def _function(drv, launches, arg_count, kind=CudaFunction):
    return kind(CudaModule("ptx", driver=CudaPythonDriver(drv)), "f", launches, arg_count)


def _program_function(module, name, launches, arg_count):
    """The host functions of `scanweaver.compile(..., target="cuda")`: with a shape
    contract (here one with no accesses)."""
    contract = {"name": name, "arg_names": [f"x{i}" for i in range(arg_count)], "same_shape": [],
                "accesses": [], "unchecked": []}
    return CudaFunction(module, name, launches, arg_count, contract)


@pytest.mark.parametrize("kind", [CudaFunction, _program_function])
def test_views_off_16_byte_boundaries_run_in_place(memory, kind):
    drv = fake_cuda_bindings_driver(SIZES, kernel=_copy_a_to_h)
    fn = _function(drv, [_desc("k0", (0, 1, 2))], 3, kind)
    memory[:] = np.arange(memory.size, dtype=np.float32)
    base = memory.ctypes.data
    for k, offset in enumerate((4, 8, 12)):
        fn(_Dev((2, 8), base + offset), 0.5, _Dev((2, 8), base + 512 + offset))
        run = drv.launches[k]
        # the view's own address reaches the kernel (no copy, no staging)
        assert struct.unpack("<q", run.param_bytes[1])[0] == base + offset
        assert struct.unpack("<q", run.param_bytes[9])[0] == base + 512 + offset
        first = offset // 4
        np.testing.assert_array_equal(memory[128 + first : 128 + first + 16],
                                      np.arange(first, first + 16, dtype=np.float32) + 0.5)
    assert not [c for c in drv.calls if c[0] in ("cuMemAlloc", "cuMemcpyHtoD")]


@pytest.mark.parametrize("kind", [CudaFunction, _program_function])
def test_bases_inside_an_element_are_refused_before_any_launch(memory, kind):
    drv = fake_cuda_bindings_driver(SIZES, kernel=_copy_a_to_h)
    # two launches; the second reads argument #3, which only it uses
    fn = _function(drv, [_desc("k0", (0, 1, 2)), _desc("k1", (3, 1, 2))], 4, kind)
    base = memory.ctypes.data
    a, h = _Dev((2, 8), base), _Dev((2, 8), base + 256)
    for offset in (1, 2, 6):
        late = _Dev((2, 8), base + 512 + offset)
        with pytest.raises(ScanWeaverValueError, match=(
            rf"@f: argument #3: device address 0x{base + 512 + offset:x} is {offset % 4} bytes past a 4-byte "
            rf"boundary \(address % 4 = {offset % 4}\), inside an element"
        )):
            fn(a, 1.0, h, late)
    with pytest.raises(ScanWeaverValueError, match=r"@f: argument #2: .* is 2 bytes past"):
        fn(a, 1.0, _Dev((2, 8), base + 256 + 2), _Dev((2, 8), base + 512))  # an output too
    assert not drv.launches  # nothing ran, not even the first kernel
    assert not [c for c in drv.calls if c[0] in ("cuMemAlloc", "cuMemcpyHtoD")]


def test_aligned_device_views_run(memory):
    drv = fake_cuda_bindings_driver(SIZES, kernel=_copy_a_to_h)
    fn = _function(drv, [_desc("k0", (0, 1, 2))], 3)
    memory[:] = np.arange(memory.size, dtype=np.float32)
    base = memory.ctypes.data
    # views 16 bytes (4 elements) into the buffer: aligned, so accepted in place
    fn(_Dev((2, 8), base + 16), 0.5, _Dev((2, 8), base + 256 + 16))
    (run,) = drv.launches
    assert struct.unpack("<q", run.param_bytes[1])[0] == base + 16
    np.testing.assert_array_equal(memory[68:84], np.arange(4, 20, dtype=np.float32) + 0.5)
    # an empty misaligned view is never touched: accepted (and the empty grid launches nothing)
    fn(_Dev((0, 8), base + 4), 0.5, _Dev((0, 8), base + 256 + 4))
    assert len(drv.launches) == 1


def test_single_launch_refuses_a_base_inside_an_element(memory):
    drv = fake_cuda_bindings_driver(SIZES, kernel=_copy_a_to_h)
    module = CudaModule("ptx", driver=CudaPythonDriver(drv))
    base = memory.ctypes.data
    with pytest.raises(ScanWeaverValueError, match=r"kernel k0: argument 'h': device address .* 3 bytes past"):
        launch(module, _desc("k0", (0, 1, 2)), [_Dev((2, 8), base), 1.0, _Dev((2, 8), base + 259)])
    assert not drv.launches
    launch(module, _desc("k0", (0, 1, 2)), [_Dev((2, 8), base + 4), 1.0, _Dev((2, 8), base + 264)])
    assert len(drv.launches) == 1


def test_misaligned_host_arrays_are_staged_into_aligned_buffers():
    drv = fake_cuda_bindings_driver(SIZES, kernel=_copy_a_to_h)
    fn = _function(drv, [_desc("k0", (0, 1, 2))], 3)
    flat_a, flat_h = np.arange(17, dtype=np.float32), np.zeros(17, np.float32)
    a, h = flat_a[1:].reshape(2, 8), flat_h[1:].reshape(2, 8)  # views 4 bytes in
    assert a.ctypes.data % 16 and h.ctypes.data % 16
    fn(a, 2.0, h)
    (run,) = drv.launches
    pa, ph = (struct.unpack("<q", run.param_bytes[i])[0] for i in (1, 9))
    assert pa % DEVICE_ALIGNMENT == 0 and ph % DEVICE_ALIGNMENT == 0
    np.testing.assert_array_equal(h, a + 2.0)  # copied back into the misaligned host view
    assert flat_h[0] == 0


def test_no_kernel_access_is_wider_than_the_checked_alignment():
    """The runtime checks DEVICE_ALIGNMENT bytes: the vector kernels' widest global
    access (f32 and f64 affine scans, 16-byte vector tiles) must fit in it."""
    from scanweaver.runtime.cuda_program import build_cuda_artifacts
    from scanweaver.workloads.scans import affine_scan_ir

    bits = {"b32": 32, "f32": 32, "b64": 64, "f64": 64, "u32": 32, "u64": 64, "s32": 32, "s64": 64}
    for el in ("f32", "f64"):
        ptx = build_cuda_artifacts(affine_scan_ir(("?", "?"), 1, el, el, final=True), "sm_90").ptx
        widths = [int(n) * bits[t] // 8 for n, t in re.findall(r"(?:ld|st)\.global(?:\.nc)?\.v(\d)\.(\w+)", ptx)]
        assert widths, f"{el}: expected vector accesses in the affine scan kernel"
        assert max(widths) == DEVICE_ALIGNMENT


# ------------------------------------------------------------------ torch CUDA wrappers


def _record(calls):
    def fake(*args):
        calls.append(args)
        return args[0]

    return fake


@pytest.fixture
def no_gpu_needed(monkeypatch):
    """The torch CUDA wrappers with the GPU calls replaced: what they hand over is seen."""
    torch = pytest.importorskip("torch")
    import contextlib

    from scanweaver.runtime import cuda_scan, cuda_vjp
    from scanweaver.torch import linear, selective

    calls: list[tuple] = []
    monkeypatch.setattr(linear, "_require_cuda", lambda what: None)
    monkeypatch.setattr(selective, "_require_cuda", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(cuda_scan, "linear_scan_cuda", _record(calls))
    monkeypatch.setattr(cuda_vjp, "linear_scan_vjp_cuda", _record(calls))
    monkeypatch.setattr(cuda_scan, "selective_scan_cuda", lambda *args: (_record(calls)(*args), args[0]))
    return torch, linear, selective, calls


def _misaligned(torch, shape):
    flat = torch.randn(1 + int(np.prod(shape)), dtype=torch.float32)
    x = flat[1:].view(shape)
    assert x.data_ptr() % DEVICE_ALIGNMENT == 4
    return x


def test_torch_cuda_ops_pass_views_off_16_byte_boundaries_without_copies(no_gpu_needed):
    torch, linear, selective, calls = no_gpu_needed
    a, b, h0 = _misaligned(torch, (2, 8)), _misaligned(torch, (2, 8)), _misaligned(torch, (2,))
    aligned_b = torch.randn(2, 8)
    linear._forward_cuda(a, aligned_b, h0, False)
    linear._backward_cuda(a, b, h0, False, torch.randn(2, 8))
    bwd = calls[1][0]  # the VJP's array list: a, b, h0, then buffers the wrapper allocated
    for sent, original in zip([*calls[0][:3], *bwd[:3]], [a, aligned_b, h0, a, b, h0]):
        assert sent.data_ptr() == original.data_ptr()  # the very view: no clone
    u, delta = _misaligned(torch, (1, 2, 8)), _misaligned(torch, (1, 2, 8))
    A, B, C = _misaligned(torch, (2, 4)), _misaligned(torch, (1, 4, 8)), _misaligned(torch, (1, 4, 8))
    selective._forward_cuda(u, delta, A, B, C, None, None, None, False)
    sent = [x for x in calls[2] if isinstance(x, torch.Tensor)]
    assert [x.data_ptr() for x in sent] == [x.data_ptr() for x in (u, delta, A, B, C)]


def test_torch_views_are_never_copied():
    """torch keeps every view on an element boundary (a byte view with a storage offset
    inside an element is refused by torch itself), so `device_aligned` hands it back."""
    torch = pytest.importorskip("torch")
    from scanweaver.torch import _checks

    with pytest.raises(RuntimeError):
        torch.zeros(66, dtype=torch.uint8)[2:].view(torch.float32)
    for shape in ((2, 8), (3,)):
        v = _misaligned(torch, shape)
        assert _checks.device_aligned(v) is v
