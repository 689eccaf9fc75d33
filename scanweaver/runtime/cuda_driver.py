"""CUDA driver bindings behind one small interface (`CudaDriver`).

A CUDA user has one of three Python bindings to the driver, and ScanWeaver launches
through whichever is present:

* ``"cuda-python"``: `cuda.bindings.driver` from NVIDIA's cuda-python.  The primary
  context of device 0 (the one PyTorch, CuPy and numba use), `cuModuleLoadData`,
  `cuLaunchKernel`, `cuMemAlloc`/`cuMemcpy*`, streams and events, all direct.
* ``"numba-cuda"``: `numba.cuda` from the separate numba-cuda package
  (`numba.cuda.implementation == "NVIDIA"`).  Its context, device memory, streams
  and events; modules and launches go through `cuda.bindings.driver` (which numba-cuda
  itself is built on) because numba-cuda's internal module and launch helpers change
  between its releases.
* ``"numba"``: numba's built-in driver (`numba.cuda.implementation == "Built-in"`):
  `ctx.create_module_ptx`, `numba.cuda.cudadrv.driver.launch_kernel`, its device
  arrays and events.

`open_driver()` takes `$SCANWEAVER_CUDA_DRIVER` when set, else the first binding of
`DRIVER_ORDER` that starts.  Each binding receives its modules as constructor
arguments, so tests pass fakes and check the exact values handed to the driver.

Kernel parameters arrive as a list of ctypes scalars (see `cuda.kernel_params`); every
binding passes them as CUDA's `void **kernelParams`: an array of pointers, one to each
value (`param_pointer_array`).
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scanweaver.errors import BackendUnavailableError, ScanWeaverError, ScanWeaverTypeError, ScanWeaverValueError

DRIVER_ORDER = ("cuda-python", "numba-cuda", "numba")


class CudaDriverError(ScanWeaverError):
    """A CUDA driver call failed (bad launch, out of memory, ...)."""


def param_pointer_array(values: Sequence[Any]) -> ctypes.Array:
    """CUDA's `void **kernelParams`: one pointer to each ctypes value (kept alive by
    the caller, who holds `values`)."""
    return (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])


def stream_handle(stream: Any) -> int:
    """The raw `CUstream` of a stream given as 0/None, an int, a numba stream
    (`.handle`), a torch stream (`.cuda_stream`) or a `__cuda_stream__` object."""
    if stream is None or (isinstance(stream, int) and not isinstance(stream, bool) and stream == 0):
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        if stream < 0:
            raise ScanWeaverValueError(f"stream handle {stream} is negative; a CUstream is an address")
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    handle = getattr(stream, "handle", None)
    if handle is not None:
        return int(getattr(handle, "value", handle) or 0)
    raise ScanWeaverTypeError(f"cannot use {type(stream).__name__} as a CUDA stream")


@dataclass
class DeviceBuffer:
    """Device memory of `nbytes` at `ptr`; `owner` keeps the binding's object alive."""

    ptr: int
    nbytes: int
    owner: Any = None
    _free: Callable[[], None] | None = field(default=None, repr=False)

    def __del__(self) -> None:
        if self._free is not None:
            try:
                self._free()
            except Exception:  # noqa: BLE001 - never raise from a finaliser
                pass
            self._free = None


class DeviceArray:
    """A device buffer seen as an array (`__cuda_array_interface__`, C order)."""

    def __init__(self, buffer: DeviceBuffer, shape: tuple[int, ...], dtype: np.dtype):
        self.buffer, self.shape, self.dtype = buffer, tuple(shape), np.dtype(dtype)
        self.__cuda_array_interface__ = {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (buffer.ptr, False),
            "strides": None,
            "version": 3,
        }


class CudaDriver:
    """What ScanWeaver needs of a CUDA driver binding."""

    name = "?"

    def compute_capability(self) -> tuple[int, int]:
        raise NotImplementedError

    def load_module(self, image: str | bytes) -> Any:
        """Load PTX (str) or a cubin (bytes) into the current context."""
        raise NotImplementedError

    def get_function(self, module: Any, name: str) -> Any:
        raise NotImplementedError

    def launch(
        self,
        function: Any,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        dynamic_shared_bytes: int,
        stream: int,
        params: Sequence[Any],
    ) -> None:
        raise NotImplementedError

    def alloc(self, nbytes: int) -> DeviceBuffer:
        raise NotImplementedError

    def upload(self, buffer: DeviceBuffer, host: np.ndarray) -> None:
        raise NotImplementedError

    def download(self, host: np.ndarray, buffer: DeviceBuffer) -> None:
        raise NotImplementedError

    def copy_device(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int) -> None:
        """Device-to-device copy of `nbytes` (the bandwidth baseline of the GPU check)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        raise NotImplementedError

    def create_stream(self) -> Any:
        raise NotImplementedError

    def create_event(self) -> Any:
        raise NotImplementedError

    def record_event(self, event: Any, stream: int = 0) -> None:
        raise NotImplementedError

    def elapsed_ms(self, start: Any, stop: Any) -> float:
        """Milliseconds between two recorded events (waits for `stop`)."""
        raise NotImplementedError

    # -- helpers shared by every binding ------------------------------------------------
    def to_device(self, host: np.ndarray) -> DeviceArray:
        host = np.require(host, requirements="C")  # keeps a 0-d array 0-d (ascontiguousarray would not)
        buf = self.alloc(max(host.nbytes, 1))
        if host.nbytes:
            self.upload(buf, host)
        return DeviceArray(buf, host.shape, host.dtype)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> DeviceArray:
        dtype = np.dtype(dtype)
        # Python ints: an int64 product wraps for huge shapes, and a 1-byte buffer
        # would then stand for an array of 2^63 elements
        nbytes = math.prod(int(s) for s in shape) * dtype.itemsize
        if any(int(s) < 0 for s in shape):
            raise ScanWeaverValueError(f"cannot allocate a device array of negative shape {tuple(shape)}")
        return DeviceArray(self.alloc(max(nbytes, 1)), shape, dtype)

    def to_host(self, arr: DeviceArray) -> np.ndarray:
        out = np.empty(arr.shape, arr.dtype)
        if out.nbytes:
            self.download(out, arr.buffer)
        return out


def _as_bytes_view(host: np.ndarray) -> np.ndarray:
    if not host.flags.c_contiguous:
        raise ScanWeaverError("internal: host staging buffers must be C-contiguous")
    return host.reshape(-1).view(np.uint8)


# ------------------------------------------------------------------------ cuda-python


class CudaPythonDriver(CudaDriver):
    """`cuda.bindings.driver`: every call returns `(CUresult, values...)`."""

    name = "cuda-python"

    def __init__(self, drv: Any = None, device: int = 0):
        if drv is None:
            from cuda.bindings import driver as drv  # type: ignore[no-redef]
        self._drv = drv
        self._call("cuInit", 0)
        self._device = self._call("cuDeviceGet", device)
        self._context = self._call("cuDevicePrimaryCtxRetain", self._device)
        self._call("cuCtxSetCurrent", self._context)
        self._thread = threading.get_ident()

    def _call(self, fname: str, *args: Any) -> Any:
        return checked_call(self._drv, fname, *args)

    def compute_capability(self) -> tuple[int, int]:
        attr = self._drv.CUdevice_attribute
        major = self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._device)
        minor = self._call("cuDeviceGetAttribute", attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._device)
        return int(major), int(minor)

    def load_module(self, image: str | bytes) -> Any:
        data = image.encode() if isinstance(image, str) else bytes(image)
        buf = ctypes.create_string_buffer(data)  # NUL-terminated, as PTX must be
        module = self._call("cuModuleLoadData", ctypes.addressof(buf))
        return module

    def get_function(self, module: Any, name: str) -> Any:
        return self._call("cuModuleGetFunction", module, name.encode())

    def launch(self, function, grid, block, dynamic_shared_bytes, stream, params) -> None:
        ptrs = param_pointer_array(params)
        if threading.get_ident() != self._thread:  # the context is current per thread
            self._call("cuCtxSetCurrent", self._context)
            self._thread = threading.get_ident()
        self._call(
            "cuLaunchKernel", function, *grid, *block, dynamic_shared_bytes, stream, ctypes.addressof(ptrs), 0
        )

    def alloc(self, nbytes: int) -> DeviceBuffer:
        dptr = self._call("cuMemAlloc", nbytes)
        drv = self._drv
        return DeviceBuffer(int(dptr), nbytes, dptr, lambda: drv.cuMemFree(dptr))

    def upload(self, buffer: DeviceBuffer, host: np.ndarray) -> None:
        view = _as_bytes_view(host)
        self._call("cuMemcpyHtoD", buffer.ptr, view.ctypes.data, view.nbytes)

    def download(self, host: np.ndarray, buffer: DeviceBuffer) -> None:
        view = _as_bytes_view(host)
        self._call("cuMemcpyDtoH", view.ctypes.data, buffer.ptr, view.nbytes)

    def copy_device(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int) -> None:
        self._call("cuMemcpyDtoD", dst.ptr, src.ptr, nbytes)

    def synchronize(self) -> None:
        self._call("cuCtxSynchronize")

    def create_stream(self) -> Any:
        return self._call("cuStreamCreate", 0)

    def create_event(self) -> Any:
        return self._call("cuEventCreate", 0)

    def record_event(self, event: Any, stream: int = 0) -> None:
        self._call("cuEventRecord", event, stream)

    def elapsed_ms(self, start: Any, stop: Any) -> float:
        self._call("cuEventSynchronize", stop)
        fname = "cuEventElapsedTime" if hasattr(self._drv, "cuEventElapsedTime") else "cuEventElapsedTime_v2"
        return float(self._call(fname, start, stop))


# ------------------------------------------------------------------ numba's memory layer


class _NumbaMemory:
    """Device memory, streams and events through `numba.cuda`'s public API (the same
    in numba's built-in driver and in numba-cuda)."""

    _cuda: Any

    def alloc(self, nbytes: int) -> DeviceBuffer:
        arr = self._cuda.device_array(nbytes, dtype=np.uint8)
        return DeviceBuffer(int(arr.__cuda_array_interface__["data"][0]), nbytes, arr)

    def upload(self, buffer: DeviceBuffer, host: np.ndarray) -> None:
        view = _as_bytes_view(host)
        buffer.owner[: view.nbytes].copy_to_device(view)

    def download(self, host: np.ndarray, buffer: DeviceBuffer) -> None:
        view = _as_bytes_view(host)
        buffer.owner[: view.nbytes].copy_to_host(view)

    def copy_device(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int) -> None:
        dst.owner[:nbytes].copy_to_device(src.owner[:nbytes])

    def synchronize(self) -> None:
        self._cuda.synchronize()

    def create_stream(self) -> Any:
        s = self._cuda.stream()
        self.__dict__.setdefault("_stream_objects", {})[stream_handle(s)] = s
        return s

    def create_event(self) -> Any:
        return self._cuda.event()

    def record_event(self, event: Any, stream: int = 0) -> None:
        # numba's Event.record wants its own Stream object (or 0), not a raw handle
        event.record(self.__dict__.get("_stream_objects", {}).get(stream, 0) if stream else 0)

    def elapsed_ms(self, start: Any, stop: Any) -> float:
        stop.synchronize()
        return float(self._cuda.event_elapsed_time(start, stop))

    def compute_capability(self) -> tuple[int, int]:
        major, minor = self._cuda.get_current_device().compute_capability
        return int(major), int(minor)


class NumbaDriver(_NumbaMemory, CudaDriver):
    """numba's built-in driver (numba <= 0.60-era `numba.cuda`, implementation 'Built-in')."""

    name = "numba"

    def __init__(self, cuda: Any = None, launch_kernel: Callable[..., None] | None = None):
        if cuda is None:
            from numba import cuda  # type: ignore[no-redef]
        if launch_kernel is None:
            from numba.cuda.cudadrv.driver import launch_kernel  # type: ignore[no-redef]
        impl = getattr(cuda, "implementation", "Built-in")
        if impl != "Built-in":
            raise BackendUnavailableError(f"numba.cuda is the '{impl}' implementation, not numba's built-in one")
        self._cuda, self._launch_kernel = cuda, launch_kernel
        self._ctx = cuda.current_context()

    def load_module(self, image: str | bytes) -> Any:
        if isinstance(image, str):
            return self._ctx.create_module_ptx(image.encode())
        return self._ctx.create_module_image(bytes(image))

    def get_function(self, module: Any, name: str) -> Any:
        return module.get_function(name)

    def launch(self, function, grid, block, dynamic_shared_bytes, stream, params) -> None:
        # launch_kernel builds the pointer array itself from the ctypes values
        self._launch_kernel(function.handle, *grid, *block, dynamic_shared_bytes, stream, list(params))


class NumbaCudaDriver(_NumbaMemory, CudaDriver):
    """numba-cuda (`numba.cuda.implementation == "NVIDIA"`): numba-cuda's context and
    memory; modules and launches through `cuda.bindings.driver` in that context."""

    name = "numba-cuda"

    def __init__(self, cuda: Any = None, drv: Any = None):
        if cuda is None:
            from numba import cuda  # type: ignore[no-redef]
        impl = getattr(cuda, "implementation", "?")
        if impl != "NVIDIA":
            raise BackendUnavailableError(f"numba.cuda is the '{impl}' implementation, not numba-cuda's")
        if drv is None:
            from cuda.bindings import driver as drv  # type: ignore[no-redef]
        self._cuda = cuda
        cuda.current_context()  # makes the primary context current on this thread
        self._drv = drv

    def load_module(self, image: str | bytes) -> Any:
        data = image.encode() if isinstance(image, str) else bytes(image)
        buf = ctypes.create_string_buffer(data)
        return checked_call(self._drv, "cuModuleLoadData", ctypes.addressof(buf))

    def get_function(self, module: Any, name: str) -> Any:
        return checked_call(self._drv, "cuModuleGetFunction", module, name.encode())

    def launch(self, function, grid, block, dynamic_shared_bytes, stream, params) -> None:
        ptrs = param_pointer_array(params)
        checked_call(self._drv, "cuLaunchKernel", function, *grid, *block, dynamic_shared_bytes, stream, ctypes.addressof(ptrs), 0)


def checked_call(drv: Any, fname: str, *args: Any) -> Any:
    """Call `drv.fname(*args)` of `cuda.bindings.driver`, which returns `(CUresult,
    values...)`; raise `CudaDriverError` unless the result is CUDA_SUCCESS (0)."""
    returned = getattr(drv, fname)(*args)
    err, values = returned[0], returned[1:]
    code = int(getattr(err, "value", err))
    if code != 0:
        raise CudaDriverError(f"CUDA driver call {fname} failed: {getattr(err, 'name', code)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


# -------------------------------------------------------------------------- choosing

_FACTORIES: dict[str, Callable[[], CudaDriver]] = {
    "cuda-python": CudaPythonDriver,
    "numba-cuda": NumbaCudaDriver,
    "numba": NumbaDriver,
}

_opened: dict[str, CudaDriver] = {}
_failures: dict[str, str] = {}


def _try(name: str) -> CudaDriver | None:
    if name in _opened:
        return _opened[name]
    if name in _failures:
        return None
    try:
        drv = _FACTORIES[name]()
    except Exception as e:  # noqa: BLE001 - any start-up failure is a reason, as text
        text = " ".join(str(e).split()) or type(e).__name__
        missing = isinstance(e, ModuleNotFoundError) and e.name
        _failures[name] = f"not installed (no module {e.name})" if missing else text  # type: ignore[union-attr]
        return None
    _opened[name] = drv
    return drv


def requested_driver() -> str | None:
    name = os.environ.get("SCANWEAVER_CUDA_DRIVER", "").strip()
    if name and name not in _FACTORIES:
        raise BackendUnavailableError(
            f"SCANWEAVER_CUDA_DRIVER={name!r} is not a driver binding (choose from {', '.join(DRIVER_ORDER)})"
        )
    return name or None


def open_driver(name: str | None = None) -> CudaDriver:
    """The driver binding to launch with: `name`, `$SCANWEAVER_CUDA_DRIVER`, or the
    first of `DRIVER_ORDER` that starts.  Raises `BackendUnavailableError` saying why
    each one failed."""
    wanted = name or requested_driver()
    for candidate in [wanted] if wanted else DRIVER_ORDER:
        drv = _try(candidate)
        if drv is not None:
            return drv
    tried = [wanted] if wanted else list(DRIVER_ORDER)
    raise BackendUnavailableError(
        "no CUDA driver binding could start: " + "; ".join(f"{n}: {_failures.get(n, '?')}" for n in tried)
    )


# The CUDA driver API library itself: every binding dlopens it.  Trying it first costs
# microseconds, while importing a binding (numba, cuda-python) to find it absent costs
# a large part of a second on every machine without a GPU.
_DRIVER_LIBRARIES = ("libcuda.so.1", "libcuda.so", "nvcuda.dll", "libcuda.dylib")


def driver_library_missing() -> str | None:
    """None when the NVIDIA driver library can be loaded, else why not."""
    for name in _DRIVER_LIBRARIES:
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return None
    return "the NVIDIA driver library (libcuda.so.1) is not installed, so no CUDA GPU can be used"


def why_no_driver() -> str | None:
    try:
        open_driver()
    except BackendUnavailableError as e:
        return str(e)
    return None


def reset_drivers() -> None:
    """Forget opened bindings and failures (tests use this around fakes)."""
    _opened.clear()
    _failures.clear()


__all__ = [
    "DRIVER_ORDER",
    "CudaDriver",
    "CudaDriverError",
    "CudaPythonDriver",
    "DeviceArray",
    "DeviceBuffer",
    "NumbaCudaDriver",
    "NumbaDriver",
    "open_driver",
    "param_pointer_array",
    "reset_drivers",
    "stream_handle",
    "why_no_driver",
]
