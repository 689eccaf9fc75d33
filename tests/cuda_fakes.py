"""Fake CUDA driver bindings for tests on machines without a GPU.

Device memory is host memory (numpy buffers), so device pointers are real addresses
and copies are real copies; launches are recorded with the exact bytes each kernel
parameter pointer points at.
"""

from __future__ import annotations

import ctypes
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Launch:
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int
    stream: int
    param_bytes: list[bytes] = field(default_factory=list)


def read_params(params_address: int, sizes: list[int]) -> list[bytes]:
    """The bytes behind a `void **kernelParams` array of len(sizes) pointers."""
    ptrs = (ctypes.c_void_p * len(sizes)).from_address(params_address)
    return [ctypes.string_at(p, n) for p, n in zip(ptrs, sizes)]


def param_sizes_of(launch_json_kernels: list[dict]) -> dict[str, list[int]]:
    """Kernel name -> bytes of each kernel parameter, from launch.json kernel entries."""
    from scanweaver.runtime.cuda_launch import KernelLaunch

    return {k["kernel"]: KernelLaunch.from_json(k).param_sizes() for k in launch_json_kernels}


class HostMemory:
    """cuMemAlloc-like allocations in host memory, kept alive by address."""

    def __init__(self) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.freed: list[int] = []

    def alloc(self, n: int) -> int:
        buf = np.zeros(n, np.uint8)
        addr = buf.ctypes.data
        self.buffers[addr] = buf
        return addr


class Enum(int):
    """Stands in for cuda.bindings' IntEnum values."""

    @property
    def value(self) -> int:  # noqa: D401
        return int(self)

    @property
    def name(self) -> str:
        return "CUDA_SUCCESS" if self == 0 else f"CUDA_ERROR_{int(self)}"


OK = Enum(0)


def fake_cuda_bindings_driver(param_sizes: list[int], cc=(9, 0), fail: dict[str, int] | None = None, kernel=None):
    """A module object with the `cuda.bindings.driver` calls ScanWeaver makes.

    `param_sizes` says how many bytes each kernel parameter has (the fake reads them
    at launch): a list, or `sizes(image, kernel name)`; `fail` maps a call name to an error code it returns; `kernel(bytes
    of each parameter)` runs at each launch, standing in for the GPU."""
    mem = HostMemory()
    calls: list[tuple] = []
    launches: list[Launch] = []
    fail = fail or {}
    m = types.ModuleType("cuda.bindings.driver")

    def api(name, result=None):
        def call(*args):
            calls.append((name, *args))
            if name in fail:
                return (Enum(fail[name]),) + ((None,) if result is not None else ())
            value = result(*args) if callable(result) else result
            return (OK,) if value is None else (OK, value)

        setattr(m, name, call)

    api("cuInit")
    api("cuDeviceGet", lambda i: 100 + i)
    api("cuDevicePrimaryCtxRetain", lambda dev: "ctx")
    api("cuCtxSetCurrent")
    m.CUdevice_attribute = types.SimpleNamespace(
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major", CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor"
    )
    api("cuDeviceGetAttribute", lambda attr, dev: cc[0] if attr == "major" else cc[1])
    m.images = []
    api("cuModuleLoadData", lambda addr: m.images.append(ctypes.string_at(addr)) or ("module", len(m.images) - 1))
    api("cuModuleGetFunction", lambda mod, name: ("fn", mod, name))

    def launch(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        if callable(param_sizes):  # (image bytes, kernel name) -> sizes
            sizes = param_sizes(m.images[f[1][1]], f[2].decode())
        else:
            sizes = param_sizes
        launches.append(Launch(f, (gx, gy, gz), (bx, by, bz), shmem, stream, read_params(params, sizes)))
        if kernel is not None:  # kernel(param bytes) or kernel(param bytes, image, kernel name)
            if kernel.__code__.co_argcount == 1:
                kernel(launches[-1].param_bytes)
            else:
                kernel(launches[-1].param_bytes, m.images[f[1][1]], f[2].decode())

    api("cuLaunchKernel", launch)
    api("cuMemAlloc", mem.alloc)
    api("cuMemFree", lambda p: mem.freed.append(p))
    api("cuMemcpyHtoD", lambda dst, src, n: ctypes.memmove(dst, src, n) and None)
    api("cuMemcpyDtoH", lambda dst, src, n: ctypes.memmove(dst, src, n) and None)
    api("cuMemcpyDtoD", lambda dst, src, n: ctypes.memmove(dst, src, n) and None)
    api("cuCtxSynchronize")
    api("cuStreamCreate", lambda flags: 0xABC)
    api("cuEventCreate", lambda flags: object())
    api("cuEventRecord")
    api("cuEventSynchronize")
    api("cuEventElapsedTime", lambda a, b: 1.5)
    m.calls, m.launches, m.memory = calls, launches, mem
    return m


class FakeNumbaDeviceArray:
    def __init__(self, buf: np.ndarray):
        self._buf = buf
        self.__cuda_array_interface__ = {
            "shape": buf.shape, "typestr": buf.dtype.str, "data": (buf.ctypes.data, False),
            "strides": None, "version": 3,
        }

    def __getitem__(self, s):
        return FakeNumbaDeviceArray(self._buf[s])

    def copy_to_device(self, host):
        self._buf[...] = host

    def copy_to_host(self, host):
        host[...] = self._buf


def fake_numba_cuda(implementation: str):
    """A `numba.cuda` stand-in: context, device arrays, events, streams."""
    cuda = types.SimpleNamespace(implementation=implementation)
    cuda.log = []

    class Module:
        def __init__(self, image):
            self.image = image

        def get_function(self, name):
            return types.SimpleNamespace(handle=("numba-fn", name))

    class Ctx:
        def create_module_ptx(self, ptx):
            cuda.log.append(("ptx", ptx))
            return Module(ptx)

        def create_module_image(self, image):
            cuda.log.append(("image", image))
            return Module(image)

    cuda.current_context = lambda: Ctx()
    cuda.device_array = lambda n, dtype: FakeNumbaDeviceArray(np.zeros(n, dtype))
    cuda.synchronize = lambda: cuda.log.append(("sync",))

    class Event:
        def record(self, stream=0):
            cuda.log.append(("record", stream))

        def synchronize(self):
            pass

    cuda.event = Event
    cuda.event_elapsed_time = lambda a, b: 2.0
    cuda.stream = lambda: types.SimpleNamespace(handle=ctypes.c_void_p(0xBEEF))
    cuda.get_current_device = lambda: types.SimpleNamespace(compute_capability=(8, 0))
    return cuda


def fake_launch_kernel(param_sizes: list[int], launches: list[Launch]):
    """numba.cuda.cudadrv.driver.launch_kernel: builds the pointer array itself."""

    def launch_kernel(handle, gx, gy, gz, bx, by, bz, shmem, stream, args, cooperative=False):
        ptrs = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        launches.append(
            Launch(handle, (gx, gy, gz), (bx, by, bz), shmem, stream, read_params(ctypes.addressof(ptrs), param_sizes))
        )

    return launch_kernel
