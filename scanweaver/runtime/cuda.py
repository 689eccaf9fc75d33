"""CUDA runtime: load PTX/cubin and launch kernels through numba's CUDA driver.

ScanWeaver depends on numba's built-in driver (`numba.cuda.implementation ==
"Built-in"`): the separate `numba-cuda` package replaces `numba.cuda` with a different
driver binding, which `driver_implementation()` reports so a failure names the cause.

Kernel parameters follow MLIR's memref-descriptor ABI (see `rewrites/launch.py`):
each memref argument is `(ptr allocated, ptr aligned, i64 offset, i64 sizes[rank],
i64 strides[rank])`, strides in elements.  Arrays are numpy arrays (copied to the
device and back) or anything with `__cuda_array_interface__` (used in place).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.rewrites.launch import KernelLaunch

# ----------------------------------------------------------------------- availability


def driver_implementation() -> str:
    try:
        from numba import cuda
    except Exception as e:  # noqa: BLE001 - report any import problem as text
        return f"numba.cuda cannot be imported ({e})"
    return str(getattr(cuda, "implementation", "unknown"))


@cache
def why_no_cuda() -> str | None:
    """None when CUDA is usable, else one sentence saying why not."""
    impl = driver_implementation()
    if impl != "Built-in":
        return (
            f"numba's CUDA driver implementation is '{impl}', expected numba's built-in "
            "driver (is the separate numba-cuda package installed?)"
        )
    from numba import cuda

    try:
        if not cuda.is_available():
            return "no CUDA GPU or driver was found on this machine (numba.cuda.is_available() is False)"
    except Exception as e:  # noqa: BLE001
        return f"the CUDA driver failed to initialise: {e}"
    return None


def cuda_available() -> bool:
    return why_no_cuda() is None


def require_cuda() -> None:
    reason = why_no_cuda()
    if reason is not None:
        raise BackendUnavailableError(f"CUDA is not available: {reason}")


# -------------------------------------------------------------------- kernel parameters


@dataclass(frozen=True)
class DeviceView:
    """What a kernel needs of one array: its device address, shape and strides."""

    pointer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    itemsize: int
    kind: str = "f"  # numpy dtype kind: f, i, u

    @staticmethod
    def from_interface(obj: Any, what: str) -> DeviceView:
        iface = obj.__cuda_array_interface__
        dtype = np.dtype(iface["typestr"])
        shape = tuple(int(s) for s in iface["shape"])
        byte_strides = iface.get("strides")
        if byte_strides is None:  # C-contiguous
            byte_strides = tuple(
                int(np.prod(shape[i + 1 :], dtype=np.int64)) * dtype.itemsize
                for i in range(len(shape))
            )
        if any(s % dtype.itemsize for s in byte_strides):
            raise ScanWeaverValueError(f"{what}: strides {byte_strides} are not whole elements")
        return DeviceView(
            int(iface["data"][0]),
            shape,
            tuple(s // dtype.itemsize for s in byte_strides),
            dtype.itemsize,
            dtype.kind,
        )


# MLIR element type -> (numpy kinds accepted, item size); bf16 arrives as 2-byte items.
_ELEMENT = {
    "f16": ("f", 2), "bf16": ("fuV", 2), "f32": ("f", 4), "f64": ("f", 8),
    "i32": ("i", 4), "i64": ("i", 8),
}


def kernel_params(launch: KernelLaunch, views: Sequence[DeviceView]) -> list[Any]:
    """The ctypes values for `launch_kernel`, in MLIR's expanded-descriptor order."""
    if len(views) != len(launch.args):
        raise ScanWeaverTypeError(
            f"kernel {launch.kernel_name} takes {len(launch.args)} arrays, got {len(views)}"
        )
    params: list[Any] = []
    for (name, _kind, dtype, shape), view in zip(launch.args, views):
        kinds, size = _ELEMENT.get(dtype, ("", 0))
        if view.kind not in kinds or view.itemsize != size:
            raise ScanWeaverTypeError(
                f"kernel {launch.kernel_name}: argument '{name}' must hold {dtype} elements, "
                f"got items of kind '{view.kind}' and {view.itemsize} bytes"
            )
        if len(view.shape) != len(shape) or any(
            isinstance(d, int) and d != s for d, s in zip(shape, view.shape)
        ):
            raise ScanWeaverValueError(
                f"kernel {launch.kernel_name}: argument '{name}' has shape {view.shape}, "
                f"expected {tuple(shape)}"
            )
        params += [ctypes.c_void_p(view.pointer), ctypes.c_void_p(view.pointer), ctypes.c_int64(0)]
        params += [ctypes.c_int64(s) for s in view.shape]
        params += [ctypes.c_int64(s) for s in view.strides]
    return params


# --------------------------------------------------------------------------- launching


class CudaModule:
    """PTX (or a cubin) loaded into the current CUDA context."""

    def __init__(self, image: str | bytes):
        require_cuda()
        from numba import cuda

        ctx = cuda.current_context()
        if isinstance(image, str):
            self._module = ctx.create_module_ptx(image)
        else:
            self._module = ctx.create_module_image(image)

    def function(self, name: str):
        return self._module.get_function(name)


def launch(module: CudaModule, desc: KernelLaunch, arrays: Sequence[Any], stream: Any = 0) -> None:
    """Launch one kernel on device arrays (objects with `__cuda_array_interface__`)."""
    from numba.cuda.cudadrv.driver import launch_kernel

    views = [
        DeviceView.from_interface(x, f"argument '{a[0]}' of {desc.kernel_name}")
        for x, a in zip(arrays, desc.args)
    ]
    grid = desc.resolve_grid({a[0]: v.shape for a, v in zip(desc.args, views)})
    if 0 in grid:
        return  # nothing to do for empty inputs; a zero-sized grid is a CUDA error
    fn = module.function(desc.kernel_name)
    handle = stream.handle if hasattr(stream, "handle") else stream
    launch_kernel(fn.handle, *grid, *desc.block, desc.shared_bytes, handle, kernel_params(desc, views))


class DeviceArguments:
    """Numpy arrays staged on the device for a call; `outputs` (positions) copied back.

    Device arrays (`__cuda_array_interface__`) pass through untouched, without copies.
    """

    def __init__(self, arrays: Sequence[Any], outputs: set[int]):
        from numba import cuda

        self._host: list[tuple[np.ndarray, Any]] = []
        self.device: list[Any] = []
        for i, x in enumerate(arrays):
            if hasattr(x, "__cuda_array_interface__"):
                self.device.append(x)
                continue
            if i in outputs and not isinstance(x, np.ndarray):
                # A copy of a list would receive the results and be thrown away.
                raise ScanWeaverTypeError(
                    f"argument #{i} is written by the kernel: pass a numpy or device array, "
                    f"not {type(x).__name__}"
                )
            try:
                host = np.asarray(x)
            except Exception as e:  # noqa: BLE001 - a ragged list or an odd object
                raise ScanWeaverValueError(f"argument #{i} is not an array: {e}") from None
            if host.dtype.kind not in "biufV":
                raise ScanWeaverTypeError(f"argument #{i} must be an array of numbers, got {type(x).__name__} of {host.dtype}")
            if i in outputs and not host.flags.writeable:
                raise ScanWeaverValueError(f"argument #{i} is written by the kernel but is read-only")
            dev = cuda.to_device(np.ascontiguousarray(host))
            if i in outputs:
                self._host.append((host, dev))
            self.device.append(dev)

    def copy_back(self) -> None:
        for host, dev in self._host:
            host[...] = dev.copy_to_host()


def output_positions(launches: Sequence[KernelLaunch]) -> set[int]:
    """Host-argument positions that some kernel writes (copied back after a call)."""
    return {
        host
        for desc in launches
        for (_, kind, _, _), host in zip(desc.args, desc.host_args)
        if kind in ("out", "inout") and host >= 0
    }


def time_kernel(run, repeats: int = 20) -> list[float]:
    """Milliseconds per call of `run()`, measured with CUDA events (after one warm-up)."""
    from numba import cuda

    run()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return times


__all__ = [
    "CudaModule",
    "DeviceArguments",
    "DeviceView",
    "cuda_available",
    "driver_implementation",
    "kernel_params",
    "launch",
    "output_positions",
    "require_cuda",
    "time_kernel",
    "why_no_cuda",
]
