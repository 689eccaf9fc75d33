"""GPU drivers behind `linear_scan(..., backend="cuda")` and `selective_scan`.

Both go through the compiler like any user program: IR (a `scan.affine` op, or the
GPU form of the selective-scan builder, `workloads/selective.py`) →
`scanweaver-lower{target=gpu}` → PTX → a driver binding.  Kernels have dynamic sizes,
so one build serves every size (the selective scan: one per N, B/C layouts and
options); builds are cached in-process here and on disk by the compiler.

Inputs may be numpy arrays (copied in and out) or device arrays exposing
`__cuda_array_interface__` (torch, cupy, numba): those are used in place, with
outputs allocated on the device and returned as the same library's type when it
is torch, else as ScanWeaver `DeviceArray`s (`__cuda_array_interface__`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cuda_launch import prefer_time_blocks
from scanweaver.workloads.scans import MLIR_ELEMENT, affine_scan_ir
from scanweaver.workloads.specs import SelectiveScanSpec


#: the time chunk of `scan-to-gpu`'s defaults (block 128 x 4 items x 16 tiles)
DEFAULT_TIME_CHUNK = 128 * 4 * 16


class _Reshaped:
    """A C-contiguous device array seen with another shape (no copy)."""

    def __init__(self, base: Any, shape: tuple[int, ...]):
        iface = dict(base.__cuda_array_interface__)
        iface["shape"], iface["strides"] = tuple(shape), None
        self.__cuda_array_interface__ = iface
        self._base = base  # keep the memory alive


def _is_c_contiguous(iface: dict) -> bool:
    strides = iface.get("strides")
    if strides is None:
        return True
    itemsize = np.dtype(iface["typestr"]).itemsize
    expected, acc = [], itemsize
    for d in reversed(iface["shape"]):
        expected.append(acc)
        acc *= d
    return tuple(strides) == tuple(reversed(expected))


@cache
def _program(ir_text: str, chip: str):
    from scanweaver.runtime.cuda import CudaModule
    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    artifacts = build_cuda_artifacts(ir_text, chip)
    return CudaModule(artifacts.ptx), artifacts


def _run(ir_text: str, name: str, arrays: list[Any]) -> None:
    from scanweaver.runtime.cuda import CudaFunction, device_chip

    module, artifacts = _program(ir_text, device_chip())
    CudaFunction(module, name, artifacts.launches[name], artifacts.arg_counts[name])(*arrays)


def _device_like(template: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    from scanweaver.runtime.cuda import current_driver

    if type(template).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype.name), device=template.device)
    return current_driver().empty(shape, dtype)


def linear_scan_cuda(a, b, h0, axis, reverse, return_final_state):
    on_device = hasattr(a, "__cuda_array_interface__")
    if not on_device:
        from scanweaver.runtime.validation import SCAN_TYPES
        from scanweaver.runtime.validation import host_array as _host_array

        types = (*SCAN_TYPES, np.complex64, np.complex128)  # complex: the fused (re, im) kernel
        a, b = np.asarray(_host_array("a", a, types)), np.asarray(_host_array("b", b, types))
    iface_a = a.__cuda_array_interface__ if on_device else None
    shape = tuple(iface_a["shape"]) if on_device else a.shape
    dtype = np.dtype(iface_a["typestr"]) if on_device else a.dtype
    if dtype not in MLIR_ELEMENT:
        raise ScanWeaverTypeError(f"argument 'a' has dtype {dtype}; not supported on the GPU")
    ndim = len(shape)
    if ndim == 0 or not -ndim <= axis < ndim:
        raise ScanWeaverValueError(f"axis {axis} is out of range for {ndim}-dimensional inputs")
    axis %= ndim
    state = np.dtype(np.float32) if dtype == np.float16 else dtype
    length = shape[axis]
    channels = int(np.prod(shape[:axis] + shape[axis + 1 :], dtype=np.int64))
    if on_device:
        for name, x in (("b", b), ("h0", h0)):
            if x is None:
                continue
            iface = x.__cuda_array_interface__
            want = shape if name == "b" else shape[:-1]
            want_dtype = dtype if name == "b" else state
            if tuple(iface["shape"]) != tuple(want) or np.dtype(iface["typestr"]) != want_dtype:
                raise ScanWeaverValueError(
                    f"argument '{name}' is a {np.dtype(iface['typestr'])} GPU array of shape "
                    f"{tuple(iface['shape'])}; expected {want_dtype} and shape {tuple(want)}"
                )
        if axis != ndim - 1 or not all(
            _is_c_contiguous(x.__cuda_array_interface__) for x in (a, b)
        ):
            raise ScanWeaverValueError(
                "GPU arrays must be C-contiguous and scanned along their last axis "
                "(axis=-1); make them contiguous or move the axis first"
            )
        a2, b2 = _Reshaped(a, (channels, length)), _Reshaped(b, (channels, length))
        h = _device_like(a, shape, state)
        final = _device_like(a, shape[:-1], state)
        h2, f2 = _Reshaped(h, (channels, length)), _Reshaped(final, (channels,))
    else:
        a2 = np.ascontiguousarray(np.moveaxis(a, axis, -1)).reshape(channels, length)
        b2 = np.ascontiguousarray(np.moveaxis(b, axis, -1)).reshape(channels, length)
        h2 = np.empty((channels, length), state)
        f2 = np.empty(channels, state)
    args = [a2, b2]
    if h0 is not None:
        h0_2d = h0 if hasattr(h0, "__cuda_array_interface__") else np.ascontiguousarray(h0, dtype=state)
        args.append(_Reshaped(h0_2d, (channels,)) if on_device else h0_2d.reshape(channels))
    args += [h2, f2]
    ir = affine_scan_ir(
        ("?", "?"), 1, MLIR_ELEMENT[dtype], MLIR_ELEMENT[state],
        init=h0 is not None, final=True, reverse=reverse,
    )
    # (complex scans run one block per channel: their kernel has no time blocks)
    if dtype.kind != "c" and prefer_time_blocks(channels, length, DEFAULT_TIME_CHUNK):
        # few channels, long rows: several blocks per channel, in time (one more build)
        from scanweaver.rewrites.affine_time_blocks import ask_time_blocks

        ir = ask_time_blocks(ir)
    _run(ir, "f", args)
    if on_device:
        return (h, final) if return_final_state else h
    channel_shape = shape[:axis] + shape[axis + 1 :]
    out = np.moveaxis(h2.reshape(channel_shape + (length,)), -1, axis)
    return (out, f2.reshape(channel_shape)) if return_final_state else out


#: B/C rank -> their kind in the selective kernel (`workloads/selective.py`)
_BC_KIND = {2: "const", 3: "shared", 4: "grouped"}


def selective_spec(
    shapes: dict[str, tuple[int, ...]], delta_softplus: bool, return_last_state: bool
) -> SelectiveScanSpec:
    """The compile-time options of the GPU selective scan for these argument shapes:
    the state size N, the B/C kinds and the optional arguments, never (batch, D, L)
    (one build serves every size).  One clear error for shapes the kernel cannot take."""
    u = shapes["u"]
    if len(u) != 3:
        raise ScanWeaverValueError(f"argument 'u' has shape {u}; expected (batch, D, L)")
    batch, dim, length = u
    a = shapes["A"]
    if len(a) != 2 or a[0] != dim or not 0 < a[1] <= 64:
        raise ScanWeaverValueError(f"argument 'A' has shape {a}; expected (D, N) with D = {dim} and 1 <= N <= 64")
    n = a[1]
    kinds = {}
    for name in ("B", "C"):
        shape = shapes[name]
        kind = _BC_KIND.get(len(shape))
        want = {"const": (dim, n), "shared": (batch, n, length), "grouped": None}.get(kind)
        if kind == "grouped":
            g = shape[1]
            ok = shape[0] == batch and shape[2:] == (n, length) and 0 < g and dim % g == 0
        else:
            ok = kind is not None and shape == want
        if not ok:
            raise ScanWeaverValueError(
                f"argument '{name}' has shape {shape}; expected (D, N) = {(dim, n)}, (batch, N, L) = "
                f"{(batch, n, length)} or (batch, G, N, L) with G dividing D = {dim}"
            )
        kinds[name] = kind
    for name, want in (("delta", u), ("z", u), ("D", (dim,)), ("delta_bias", (dim,)), ("h0", (batch, dim, n))):
        if name in shapes and shapes[name] != want:
            raise ScanWeaverValueError(f"argument '{name}' has shape {shapes[name]}; expected {want}")
    return SelectiveScanSpec(
        n, kinds["B"], kinds["C"], "D" in shapes, "z" in shapes, "delta_bias" in shapes,
        bool(delta_softplus), "h0" in shapes, bool(return_last_state),
    )


#: Above this state size the GPU selective scan is built for the call's (batch, D, L):
#: with dynamic sizes the index arithmetic of its arguments takes registers that a
#: 64-element state needs (ptxas: 144-156 bytes of spill stores at N = 64 with every
#: option, 0 with static sizes; 0 either way up to N = 32).
DYNAMIC_SIZES_MAX_N = 32


def selective_scan_ir(shapes: dict[str, tuple[int, ...]], options: dict[str, bool]) -> str:
    """The GPU selective scan's IR for arguments of these shapes: only N, the B/C kinds
    and which optional arguments are present matter (the kernel has dynamic sizes),
    and (batch, D, L) too above `DYNAMIC_SIZES_MAX_N`."""
    from scanweaver.runtime.kernel_ir import kernel_ir

    spec = selective_spec(shapes, options["delta_softplus"], options["return_last_state"])
    if spec.n > DYNAMIC_SIZES_MAX_N:
        return kernel_ir("selective_gpu", spec=spec, sizes=list(shapes["u"])).text
    return kernel_ir("selective_gpu", spec=spec).text


def selective_scan_cuda(
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state
):
    """The selective scan from `workloads/selective.py`'s GPU form: one build per (N,
    B/C kinds, options) serves every (batch, D, L) up to N = 32 (above, one per size:
    `DYNAMIC_SIZES_MAX_N`); the grid is one block per (batch, channel), computed at
    launch from the arguments' sizes."""
    named = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z,
             "delta_bias": delta_bias, "h0": initial_state}
    arrays = {k: v for k, v in named.items() if v is not None}
    on_device = hasattr(u, "__cuda_array_interface__")
    if not on_device:
        arrays = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in arrays.items()}
    shapes = {k: tuple(v.__cuda_array_interface__["shape"]) if on_device else v.shape for k, v in arrays.items()}
    ir = selective_scan_ir(
        shapes, {"delta_softplus": delta_softplus, "return_last_state": return_last_state}
    )
    batch, dim, length = shapes["u"]
    n = shapes["A"][1]
    if prefer_time_blocks(batch * dim, length, DEFAULT_TIME_CHUNK):
        # few (batch, channel) pairs, long rows: the recurrence in time across blocks
        # (recurrence_time_blocks.py; one more build)
        from scanweaver.rewrites.affine_time_blocks import ask_time_blocks

        ir = ask_time_blocks(ir)
    if on_device:
        out = _device_like(u, (batch, dim, length), np.dtype(np.float32))
        last = _device_like(u, (batch, dim, n), np.dtype(np.float32))
    else:
        out = np.empty((batch, dim, length), np.float32)
        last = np.empty((batch, dim, n), np.float32)
    _run(ir, "selective_scan", [*arrays.values(), out] + ([last] if return_last_state else []))
    if not on_device:
        out = out.astype(np.asarray(u).dtype, copy=False)
    return (out, last) if return_last_state else out


#: the largest complex state the GPU selective scan takes, per part type: the kernel
#: lowers up to 16 complex values, but beyond these ptxas spills (sm_80, every option:
#: complex<f32> N = 16 and complex<f64> N = 8 spill hundreds of bytes, even at static
#: sizes); larger states run on the CPU
COMPLEX_MAX_N = {"f32": 8, "f64": 4}


def _complex_weight_gpu(x: Any, name: str, batch: int, dim: int, n: int, length: int, cdt: np.dtype):
    """(kind, array) of B or C for the complex GPU kernel, in the caller's layout (state
    index before time): constant (D, N) complex or real; input-dependent real (re, im)
    pairs on a last axis of 2L, seen as complex (no copy), or complex with L."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fc":
        raise ScanWeaverTypeError(f"argument '{name}' has dtype {arr.dtype}; expected a real or complex float array")
    kind = _BC_KIND.get(arr.ndim)
    if kind == "const":
        if arr.shape != (dim, n):
            raise ScanWeaverValueError(
                f"argument '{name}' (constant) must have shape (D, N) = {(dim, n)}, got {arr.shape}"
            )
        return kind, np.ascontiguousarray(arr, dtype=cdt)
    if kind is None:
        raise ScanWeaverValueError(
            f"argument '{name}' must be (D, N), (batch, N, 2L) or (batch, G, N, 2L), got {arr.shape}"
        )
    if arr.dtype.kind == "f":  # Mamba's layout: (re, im) pairs along the last axis
        if arr.shape[-1] != 2 * length:
            raise ScanWeaverValueError(
                f"argument '{name}' is real and input-dependent with complex A: its last axis must "
                f"hold (re, im) pairs, length 2L = {2 * length}, got shape {arr.shape}"
            )
        arr = np.ascontiguousarray(arr, dtype=np.float32 if cdt == np.complex64 else np.float64).view(cdt)
    elif arr.shape[-1] != length:
        raise ScanWeaverValueError(
            f"argument '{name}' is complex: its last axis must have length L = {length}, got {arr.shape}"
        )
    groups = arr.shape[1] if kind == "grouped" else 1
    want = (batch, n) if kind == "shared" else (batch, groups, n)
    if arr.shape[:-1] != want or groups == 0 or dim % groups:
        raise ScanWeaverValueError(
            f"argument '{name}' ({kind}) must be (batch, N, .) = ({batch}, {n}, .) or (batch, G, N, .) "
            f"with G dividing D = {dim}, got {arr.shape}"
        )
    return kind, np.ascontiguousarray(arr, dtype=cdt)


def selective_scan_complex_ir(spec) -> str:
    """The complex GPU selective scan's IR: one build per spec for every (batch, D, L)."""
    from scanweaver.runtime.kernel_ir import kernel_ir

    return kernel_ir("selective_complex_gpu", spec=spec).text


def selective_scan_complex_cuda(
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state
):
    """The selective scan with complex A (mamba_ssm's meaning, as on the CPU:
    `runtime/cpu_selective_complex.py`) from `workloads/selective_complex.py`'s GPU
    form: one block per (batch, channel), the state of N complex values in registers
    (`COMPLEX_MAX_N`).  Host arrays (copied in and out); out in u's dtype, last state
    complex."""
    from scanweaver.runtime.cpu_selective_complex import _real, complex_selective_types
    from scanweaver.workloads.specs import ComplexSelectiveSpec

    if any(hasattr(x, "__cuda_array_interface__") for x in (u, delta, A, B, C, D, z, delta_bias, initial_state)):
        raise ScanWeaverValueError("selective_scan with complex A takes host arrays on the GPU (no device arrays)")
    A, u_in, rdt, out_dtype = complex_selective_types(A, u)
    cdt = A.dtype
    batch, dim, length = u_in.shape
    real = "f32" if cdt == np.complex64 else "f64"
    if A.ndim != 2 or A.shape[0] != dim or not 0 < A.shape[1] <= COMPLEX_MAX_N[real]:
        raise ScanWeaverValueError(
            f"argument 'A' has shape {A.shape}; expected (D, N) with D = {dim} and 1 <= N <= "
            f"{COMPLEX_MAX_N[real]} on the GPU for {cdt} A (larger states spill registers: use backend='cpu')"
        )
    n = A.shape[1]
    arrays = {"u": _real(u_in, "u", (batch, dim, length), rdt),
              "delta": _real(delta, "delta", (batch, dim, length), rdt), "A": np.ascontiguousarray(A)}
    b_kind, arrays["B"] = _complex_weight_gpu(B, "B", batch, dim, n, length, cdt)
    c_kind, arrays["C"] = _complex_weight_gpu(C, "C", batch, dim, n, length, cdt)
    for name, x, shape in (("D", D, (dim,)), ("z", z, (batch, dim, length)), ("delta_bias", delta_bias, (dim,))):
        if x is not None:
            arrays[name] = _real(x, name, shape, rdt)
    if initial_state is not None:
        h0 = np.asarray(initial_state)
        if h0.dtype.kind not in "fc" or h0.shape != (batch, dim, n):
            raise ScanWeaverValueError(
                f"argument 'initial_state' must be a (batch, D, N) = {(batch, dim, n)} float or complex array, "
                f"got {h0.shape} {h0.dtype}"
            )
        arrays["h0"] = np.ascontiguousarray(h0, dtype=cdt)
    spec = ComplexSelectiveSpec(n, real, b_kind, c_kind, D is not None,
                                z is not None, delta_bias is not None, bool(delta_softplus),
                                initial_state is not None, bool(return_last_state))
    out = np.empty((batch, dim, length), rdt)
    last = np.empty((batch, dim, n), cdt)
    _run(selective_scan_complex_ir(spec), "selective_scan_complex",
         [*arrays.values(), out] + ([last] if return_last_state else []))
    result = out.astype(out_dtype, copy=False)
    return (result, last) if return_last_state else result
