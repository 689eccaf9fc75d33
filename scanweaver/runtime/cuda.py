"""CUDA runtime: load PTX/cubin and launch kernels through a driver binding.

The binding (cuda-python, numba-cuda or numba's built-in driver) comes from
`runtime/cuda_driver.py`; this module only needs its small `CudaDriver` interface and
imports nothing but numpy and the standard library, so deployed artifacts
(`scanweaver.load`) run without the compiler.

Kernel parameters follow MLIR's memref-descriptor ABI (see `runtime/cuda_launch.py`):
each memref argument is `(ptr allocated, ptr aligned, i64 offset, i64 sizes[rank],
i64 strides[rank])`, strides in elements; a scalar argument is one value of its type.
Arrays are numpy arrays (copied to the device and back) or anything with
`__cuda_array_interface__` (used in place).  The generated code indexes memrefs as
C-contiguous (identity layout), so device arrays must be C-contiguous; overlapping
arrays are refused like on the CPU.  A device array may start anywhere its elements
may (a view such as `d[:, 1:]` of a contiguous row, or `d[1:]`): every kernel tests its
bases before its 16-byte vector accesses and takes the scalar path when one is off a
`DEVICE_ALIGNMENT` boundary (`rewrites/gpu_aligned_bases.py`).  Only a base that is
not a whole number of elements past an element boundary is refused (no scalar access
could read it).  Host arrays are copied into fresh device allocations (256-byte
aligned by the CUDA allocator), which take the vector paths.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.contract_check import check_contract
from scanweaver.runtime.cuda_launch import SHARED_PER_BLOCK_LIMIT, KernelLaunch

# ----------------------------------------------------------------------- availability


def driver_implementation() -> str:
    """The driver binding launches go through, or why none can start."""
    from scanweaver.runtime.cuda_driver import open_driver

    try:
        return open_driver().name
    except BackendUnavailableError as e:
        return str(e)


@cache
def why_no_cuda() -> str | None:
    """None when CUDA is usable, else one sentence saying why not."""
    from scanweaver.runtime import cuda_driver

    if cuda_driver.requested_driver() is None:  # an explicit binding is always tried
        missing = cuda_driver.driver_library_missing()
        if missing is not None:
            return missing
    return cuda_driver.why_no_driver()


def cuda_available() -> bool:
    return why_no_cuda() is None


def require_cuda() -> None:
    reason = why_no_cuda()
    if reason is not None:
        raise BackendUnavailableError(f"CUDA is not available: {reason}")


def current_driver():
    from scanweaver.runtime.cuda_driver import open_driver

    try:
        return open_driver()
    except BackendUnavailableError as e:
        raise BackendUnavailableError(f"CUDA is not available: {e}") from None


def device_chip(driver=None) -> str:
    major, minor = (driver or current_driver()).compute_capability()
    return f"sm_{major}{minor}"


# -------------------------------------------------------------------- kernel parameters


@dataclass(frozen=True)
class DeviceView:
    """What a kernel needs of one array: its device address, shape and strides."""

    pointer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    itemsize: int
    kind: str = "f"  # numpy dtype kind: f, i, u
    readonly: bool = False  # the interface's data flag: the kernels must not write it

    @staticmethod
    def from_interface(obj: Any, what: str) -> DeviceView:
        iface = obj.__cuda_array_interface__
        try:
            dtype = np.dtype(iface["typestr"])
        except (TypeError, ValueError, KeyError):
            raise ScanWeaverTypeError(f"{what}: its __cuda_array_interface__ has no valid typestr") from None
        check_byte_order(what, dtype)
        shape = tuple(int(s) for s in iface["shape"])
        byte_strides = iface.get("strides")
        if byte_strides is None:  # C-contiguous
            byte_strides = tuple(
                math.prod(shape[i + 1 :]) * dtype.itemsize  # Python ints: no int64 wrap
                for i in range(len(shape))
            )
        if any(s % dtype.itemsize for s in byte_strides):
            raise ScanWeaverValueError(f"{what}: strides {byte_strides} are not whole elements")
        pointer, readonly = iface["data"]
        check_interface(what, shape, byte_strides, pointer, iface.get("mask"))
        return DeviceView(
            int(pointer or 0),
            shape,
            tuple(s // dtype.itemsize for s in byte_strides),
            dtype.itemsize,
            dtype.kind,
            bool(readonly),
        )

    def is_c_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True

    def byte_extent(self) -> tuple[int, int]:
        """[first, last + 1) byte addresses the array covers (empty: (p, p))."""
        if 0 in self.shape:
            return self.pointer, self.pointer
        lo = sum(min(0, (d - 1) * s) for d, s in zip(self.shape, self.strides))
        hi = sum(max(0, (d - 1) * s) for d, s in zip(self.shape, self.strides))
        return self.pointer + lo * self.itemsize, self.pointer + (hi + 1) * self.itemsize


#: The widest access the kernels make (`vector.load/store` of 16 bytes:
#: `rewrites/blelloch_gpu.py`); a base off this boundary runs the scalar path.
DEVICE_ALIGNMENT = 16


def check_alignment(what: str, view: DeviceView) -> None:
    """Refuse a non-empty device array whose base is not aligned to its element size
    (no load of an element could be; an empty array is never read or written).  Bases
    off a `DEVICE_ALIGNMENT` boundary are fine: the kernels test them."""
    need = view.itemsize
    off = view.pointer % need if need > 1 else 0
    if off and 0 not in view.shape:
        raise ScanWeaverValueError(
            f"{what}: device address 0x{view.pointer:x} is {off} bytes past a "
            f"{need}-byte boundary (address % {need} = {off}), inside an element: "
            "pass an array whose data starts on an element boundary"
        )


def check_interface(what: str, shape: tuple[int, ...], byte_strides: Sequence[int], pointer: Any, mask: Any) -> None:
    """What `__cuda_array_interface__` may say that no kernel could honour: negative
    sizes (a grid formula over them would wrap), strides that do not match the rank
    (the descriptor would be short), no data behind a non-empty array, or a mask."""
    if any(s < 0 or s >= 2**63 for s in shape):  # the descriptor holds i64 sizes: no wrap
        raise ScanWeaverValueError(f"{what}: its __cuda_array_interface__ has sizes {shape} outside 0..2^63-1")
    if any(abs(s) >= 2**63 for s in byte_strides) or not 0 <= int(pointer or 0) < 2**64:
        raise ScanWeaverValueError(f"{what}: its __cuda_array_interface__ has strides or an address beyond 64 bits")
    if len(byte_strides) != len(shape):
        raise ScanWeaverValueError(
            f"{what}: its __cuda_array_interface__ has {len(byte_strides)} strides for {len(shape)} dimensions"
        )
    if not pointer and 0 not in shape:
        raise ScanWeaverValueError(f"{what}: its __cuda_array_interface__ has no data pointer")
    if mask is not None:
        raise ScanWeaverTypeError(f"{what}: masked device arrays are not supported (its interface has a mask)")


def check_byte_order(what: str, dtype: np.dtype) -> None:
    """The GPU reads little-endian elements: a big-endian array would be read as other
    numbers, silently (the CPU path refuses such dtypes too)."""
    if not dtype.isnative and dtype.byteorder != "|":
        raise ScanWeaverTypeError(
            f"{what} has {dtype.name} elements in non-native byte order ('{dtype.str}'): "
            "convert it with arr.astype(arr.dtype.newbyteorder('='))"
        )


# MLIR element type -> (numpy kinds accepted, item size); bf16 arrives as 2-byte items.
MEMREF_ELEMENTS = {
    "f16": ("f", 2), "bf16": ("fuV", 2), "f32": ("f", 4), "f64": ("f", 8),
    "i1": ("bui", 1), "i8": ("iu", 1), "i16": ("iu", 2), "i32": ("iu", 4), "i64": ("iu", 8),
    "index": ("iu", 8),
    # complex: interleaved (re, im) pairs, numpy's (and numba's, torch's) layout; the
    # descriptor's sizes and strides count complex elements
    "complex<f32>": ("c", 8), "complex<f64>": ("c", 16),
}

# MLIR scalar type -> ctypes type of its kernel parameter
SCALAR_CTYPES = {
    "f32": ctypes.c_float, "f64": ctypes.c_double,
    "i1": ctypes.c_bool, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
    "i64": ctypes.c_int64, "index": ctypes.c_int64,
}


def scalar_param(launch: KernelLaunch, name: str, dtype: str, value: Any) -> Any:
    ctype = SCALAR_CTYPES.get(dtype)
    if ctype is None:
        raise ScanWeaverTypeError(f"kernel {launch.kernel_name}: scalar argument '{name}' of type {dtype} is not supported")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (np.generic,)):
        value = value.item()
    if dtype.startswith("f"):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ScanWeaverTypeError(f"kernel {launch.kernel_name}: argument '{name}' must be a {dtype} number, got {type(value).__name__}")
        try:
            number = float(value)
        except OverflowError:  # an int too big for a double
            number = math.inf
        if math.isinf(ctype(number).value) and not (isinstance(value, float) and math.isinf(value)):
            # a finite number too large for the type (1e300 as an f32) would become inf
            raise ScanWeaverValueError(f"kernel {launch.kernel_name}: argument '{name}' = {value} does not fit in {dtype}")
        return ctype(number)
    if not isinstance(value, (int, bool)):
        raise ScanWeaverTypeError(f"kernel {launch.kernel_name}: argument '{name}' must be an integer ({dtype}), got {type(value).__name__}")
    bits = {"i1": 1, "i8": 8, "i16": 16, "i32": 32}.get(dtype, 64)
    if dtype != "i1" and not -(1 << (bits - 1)) <= int(value) < (1 << bits):
        raise ScanWeaverValueError(f"kernel {launch.kernel_name}: argument '{name}' = {value} does not fit in {dtype}")
    return ctype(int(value))


def kernel_params(launch: KernelLaunch, views: Sequence[Any]) -> list[Any]:
    """The ctypes values for a launch, in MLIR's expanded-descriptor order.

    `views[i]` is a `DeviceView` for memref arguments and a number for scalar ones.
    Checked here: element type, rank and static sizes, C-contiguous strides (the
    kernels index with the identity layout: any other innermost or outer stride would
    read the wrong elements)."""
    if len(views) != len(launch.args):
        raise ScanWeaverTypeError(
            f"kernel {launch.kernel_name} takes {len(launch.args)} arguments, got {len(views)}"
        )
    params: list[Any] = []
    for (name, kind, dtype, shape), view in zip(launch.args, views):
        if kind == "scalar":
            params.append(scalar_param(launch, name, dtype, view))
            continue
        kinds, size = MEMREF_ELEMENTS.get(dtype, ("", 0))
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
        if not view.is_c_contiguous():
            raise ScanWeaverValueError(
                f"kernel {launch.kernel_name}: argument '{name}' has element strides {view.strides} "
                f"for shape {view.shape}; GPU kernels need C-contiguous arrays (innermost stride 1)"
            )
        check_alignment(f"kernel {launch.kernel_name}: argument '{name}'", view)
        # The interface's data pointer already includes any view offset: pass it as
        # the aligned pointer with offset 0, which is what the kernels assume (they
        # test its 16-byte alignment themselves before any vector access).
        params += [ctypes.c_void_p(view.pointer), ctypes.c_void_p(view.pointer), ctypes.c_int64(0)]
        params += [ctypes.c_int64(s) for s in view.shape]
        params += [ctypes.c_int64(s) for s in view.strides]
    return params


def check_no_overlap(what: str, views: dict[int, DeviceView]) -> None:
    """Refuse distinct arguments whose device memory overlaps (the raise assumes
    distinct memrefs do not alias, as the CPU path checks for host arrays)."""
    # sorted by start, any overlap shows between neighbours (empty arrays never overlap)
    spans = sorted((v.byte_extent(), pos) for pos, v in views.items() if 0 not in v.shape)
    for ((_, hi1), i), ((lo2, _), j) in zip(spans, spans[1:]):
        if lo2 < hi1:
            i, j = sorted((i, j))
            raise ScanWeaverValueError(
                f"{what}: arguments #{i} and #{j} overlap in device memory; ScanWeaver assumes "
                "distinct memref arguments do not alias"
            )


def check_shared_memory(desc: KernelLaunch) -> None:
    total = desc.shared_bytes + desc.dynamic_shared_bytes
    if total > SHARED_PER_BLOCK_LIMIT:
        raise ScanWeaverValueError(
            f"kernel {desc.kernel_name} needs {total} bytes of shared memory per block "
            f"({desc.shared_bytes} static + {desc.dynamic_shared_bytes} dynamic), over the "
            f"{SHARED_PER_BLOCK_LIMIT} bytes a block may use without opting in"
        )


# --------------------------------------------------------------------------- launching


def driver_call(driver: Any, what: str, call: Any, *args: Any) -> Any:
    """`call(*args)` of a driver binding; what the binding raises of its own (numba's
    CudaAPIError, a LinkerError, ...) becomes one `CudaDriverError` naming the step."""
    from scanweaver.errors import ScanWeaverError
    from scanweaver.runtime.cuda_driver import CudaDriverError

    try:
        return call(*args)
    except ScanWeaverError:
        raise
    except Exception as e:  # noqa: BLE001 - any binding's own error class
        raise CudaDriverError(f"{what} failed in the {driver.name} binding: {type(e).__name__}: {e}") from e


class CudaModule:
    """PTX (or a cubin) loaded into the current CUDA context of a driver binding."""

    def __init__(self, image: str | bytes, driver=None):
        self.driver = driver or current_driver()
        self._module = driver_call(self.driver, "loading the module", self.driver.load_module, image)
        self._functions: dict[str, Any] = {}

    def function(self, name: str):
        if name not in self._functions:
            self._functions[name] = driver_call(
                self.driver, f"finding kernel {name}", self.driver.get_function, self._module, name
            )
        return self._functions[name]


def prepare_launch(desc: KernelLaunch, arrays: Sequence[Any]) -> tuple[tuple[int, int, int], list[Any]]:
    """The grid and kernel parameters of one launch on device arrays (objects with
    `__cuda_array_interface__`) and scalars, every argument checked; launches nothing."""
    views: list[Any] = []
    for x, (name, kind, _, _) in zip(arrays, desc.args):
        if kind == "scalar":
            views.append(x)
        else:
            views.append(DeviceView.from_interface(x, f"argument '{name}' of {desc.kernel_name}"))
    shapes = {a[0]: v.shape for a, v in zip(desc.args, views) if isinstance(v, DeviceView)}
    desc.check_shapes(shapes)
    grid = desc.resolve_grid(shapes)
    if grid[0] > 2**31 - 1 or max(grid[1:]) > 65535:  # CUDA's gridDim limits (dynamic grids, e.g. a channel nest)
        raise ScanWeaverValueError(f"kernel {desc.kernel_name}: a grid of {grid} blocks is over CUDA's limits "
                                   f"(2^31 - 1, 65535, 65535) for shapes {shapes}")
    check_shared_memory(desc)
    return grid, kernel_params(desc, views)


def issue_launch(module: CudaModule, desc: KernelLaunch, prepared: tuple[tuple[int, int, int], list[Any]],
                 stream: Any = 0) -> None:
    """Hand a prepared launch to the driver (an empty grid launches nothing: a
    zero-sized grid is a CUDA error, and there is no work)."""
    from scanweaver.runtime.cuda_driver import stream_handle

    grid, params = prepared
    if 0 in grid:
        return
    driver = module.driver
    driver_call(
        driver, f"launching {desc.kernel_name}", driver.launch,
        module.function(desc.kernel_name), grid, desc.block, desc.dynamic_shared_bytes, stream_handle(stream), params,
    )


def launch(module: CudaModule, desc: KernelLaunch, arrays: Sequence[Any], stream: Any = 0) -> None:
    """Launch one kernel on device arrays (objects with `__cuda_array_interface__`) and
    scalars (for its scalar arguments)."""
    issue_launch(module, desc, prepare_launch(desc, arrays), stream)


def launch_arguments(driver, desc: KernelLaunch, device: Sequence[Any], scratch: dict[int, Any]) -> list[Any]:
    """The arrays of one launch: host function arguments (`device`), and scratch buffers
    (`host_args` -2 - j), allocated in `scratch` the first time a launch names them with
    the shape its description gives over its other arguments."""
    out: list[Any] = [device[i] if i >= 0 else scratch.get(-2 - i) for i in desc.host_args]
    missing = [k for k, i in enumerate(desc.host_args) if i <= -2 and out[k] is None]
    if missing:
        shapes = {
            a[0]: tuple(x.__cuda_array_interface__["shape"])
            for a, x in zip(desc.args, out)
            if x is not None and hasattr(x, "__cuda_array_interface__")
        }
        for k in missing:
            name, _, dtype, _ = desc.args[k]
            shape = desc.scratch_shape(name, shapes)
            buf = driver_call(driver, f"allocating scratch '{name}' of shape {shape}", driver.empty,
                              shape, _NUMPY_DTYPE.get(dtype, dtype))
            scratch[-2 - desc.host_args[k]] = out[k] = buf
    return out


#: MLIR element type names of scratch buffers -> numpy dtypes
_NUMPY_DTYPE = {
    "f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64", "i16": "int16", "i8": "int8",
    "complex<f32>": "complex64", "complex<f64>": "complex128",
}


def scalar_positions(launches: Sequence[KernelLaunch]) -> set[int]:
    return {
        host
        for desc in launches
        for (_, kind, _, _), host in zip(desc.args, desc.host_args)
        if kind == "scalar" and host >= 0
    }


class DeviceArguments:
    """Host arguments staged on the device for a call; `outputs` (positions) copied back.

    Device arrays (`__cuda_array_interface__`) pass through untouched, without copies;
    positions in `scalars` pass through as numbers.
    """

    def __init__(self, driver, arrays: Sequence[Any], outputs: set[int], scalars: set[int] = frozenset()):  # type: ignore[assignment]
        self._driver = driver
        self._host: list[tuple[np.ndarray, Any]] = []
        self.device: list[Any] = []
        for i, x in enumerate(arrays):
            if i in scalars or hasattr(x, "__cuda_array_interface__"):
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
            if host.dtype.kind not in "biufcV":
                raise ScanWeaverTypeError(f"argument #{i} must be an array of numbers, got {type(x).__name__} of {host.dtype}")
            if i in outputs and not host.flags.writeable:
                raise ScanWeaverValueError(f"argument #{i} is written by the kernel but is read-only")
            dev = driver_call(driver, f"copying argument #{i} to the device", driver.to_device, host)
            if i in outputs:
                self._host.append((host, dev))
            self.device.append(dev)

    def copy_back(self) -> None:
        for host, dev in self._host:
            host[...] = driver_call(self._driver, "copying an output back", self._driver.to_host, dev)


def output_positions(launches: Sequence[KernelLaunch]) -> set[int]:
    """Host-argument positions that some kernel writes (copied back after a call)."""
    return {
        host
        for desc in launches
        for (_, kind, _, _), host in zip(desc.args, desc.host_args)
        if kind in ("out", "inout") and host >= 0
    }


def call_options(name: str, options: dict[str, Any]) -> Any:
    """The stream of a call's keyword options (`stream=` is the only one: arguments
    are positional, in the order of the function's IR signature)."""
    stream = options.pop("stream", 0)
    if options:
        raise ScanWeaverTypeError(
            f"@{name} takes its arguments by position, in the order of its signature; "
            f"got keyword argument(s) {', '.join(sorted(options))} (only stream= is a keyword)"
        )
    return stream


class CudaFunction:
    """One host function of a program: its kernel launches replayed in order."""

    def __init__(self, module: CudaModule, name: str, launches: list[KernelLaunch], arg_count: int,
                 contract: dict[str, Any] | None = None):
        self._module, self._name = module, name
        self._launches, self._arg_count = launches, arg_count
        # the shape contract derived from the function's IR (`contract_check`), or None
        self._contract = contract
        self._outputs = output_positions(launches)
        self._scalars = scalar_positions(launches)
        for desc in launches:
            check_shared_memory(desc)

    def check_arguments(self, arrays: Sequence[Any]) -> None:
        if len(arrays) != self._arg_count:
            raise ScanWeaverTypeError(f"@{self._name} takes {self._arg_count} arguments, got {len(arrays)}")
        for i, x in enumerate(arrays):
            if i in self._scalars:
                continue
            if not hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
                raise ScanWeaverTypeError(
                    f"@{self._name}: argument #{i} must be a numpy or device array, got {type(x).__name__}"
                )
        host = [(i, x) for i, x in enumerate(arrays) if isinstance(x, np.ndarray)]
        for i, x in host:
            check_byte_order(f"@{self._name}: argument #{i}", x.dtype)
        for k, (i, x) in enumerate(host):
            for j, y in host[k + 1 :]:
                if np.may_share_memory(x, y):
                    raise ScanWeaverValueError(
                        f"@{self._name}: arguments #{i} and #{j} overlap in memory; ScanWeaver "
                        "assumes distinct memref arguments do not alias"
                    )
        on_device = {
            i: DeviceView.from_interface(x, f"argument #{i} of @{self._name}")
            for i, x in enumerate(arrays)
            if i not in self._scalars and hasattr(x, "__cuda_array_interface__")
        }
        check_no_overlap(f"@{self._name}", on_device)
        for i, view in on_device.items():  # before any launch: none runs on a bad array
            check_alignment(f"@{self._name}: argument #{i}", view)
            if view.readonly and i in self._outputs:
                raise ScanWeaverValueError(
                    f"@{self._name}: argument #{i} is written by the kernel but its device array is read-only"
                )
        if self._contract is not None:  # every access of the IR within its array
            check_contract(self._contract, arrays)

    def __call__(self, *arrays: Any, **options: Any) -> None:
        stream = call_options(self._name, options)
        self.check_arguments(arrays)
        driver = self._module.driver
        staged = DeviceArguments(driver, arrays, self._outputs, self._scalars)
        scratch: dict[int, Any] = {}
        # Every launch is checked before the first runs: a bad argument of a later
        # kernel must not leave device outputs half-written by an earlier one.
        prepared = [
            (desc, prepare_launch(desc, launch_arguments(driver, desc, staged.device, scratch)))
            for desc in self._launches
        ]
        for desc, ready in prepared:
            issue_launch(self._module, desc, ready, stream)
        driver_call(driver, f"running @{self._name}", driver.synchronize)  # kernel faults surface here
        staged.copy_back()


def time_kernel(run, repeats: int = 20, driver=None) -> list[float]:
    """Milliseconds per call of `run()`, measured with CUDA events (after one warm-up)."""
    driver = driver or current_driver()
    run()
    times = []
    for _ in range(repeats):
        start, stop = driver.create_event(), driver.create_event()
        driver.record_event(start)
        run()
        driver.record_event(stop)
        times.append(driver.elapsed_ms(start, stop))
    return times


__all__ = [
    "CudaFunction",
    "CudaModule",
    "DEVICE_ALIGNMENT",
    "DeviceArguments",
    "DeviceView",
    "MEMREF_ELEMENTS",
    "SCALAR_CTYPES",
    "check_alignment",
    "check_byte_order",
    "check_interface",
    "check_no_overlap",
    "check_shared_memory",
    "cuda_available",
    "current_driver",
    "driver_call",
    "device_chip",
    "driver_implementation",
    "kernel_params",
    "call_options",
    "issue_launch",
    "launch",
    "launch_arguments",
    "output_positions",
    "prepare_launch",
    "require_cuda",
    "time_kernel",
    "why_no_cuda",
]
