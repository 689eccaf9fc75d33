"""ScanWeaver's Python API: `linear_scan`, `selective_scan` and `compile`.

Inputs are validated here, once, with messages that name the argument; the backends
below receive well-formed arrays.  `backend="auto"` runs on the GPU when one is usable
and the inputs allow it, else on the CPU; `backend="cuda"` without a GPU is an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import functools
import operator

import numpy as np

from scanweaver.errors import (
    BackendUnavailableError,
    ScanWeaverTypeError,
    ScanWeaverValueError,
)
from scanweaver.runtime.program import NoSuchFunctionError, Program
from scanweaver.runtime.validation import FLOAT_TYPES as _FLOAT_TYPES
from scanweaver.runtime.validation import check_shape as _check_shape
from scanweaver.runtime.validation import host_array as _host_array
from scanweaver.runtime.validation import SCAN_TYPES as _REAL_SCAN_TYPES

_COMPLEX_TYPES = (np.complex64, np.complex128)
_SCAN_TYPES = (*_REAL_SCAN_TYPES, *_COMPLEX_TYPES)
BACKENDS = ("auto", "cpu", "cuda")


# ----------------------------------------------------------------------------- helpers


def _is_cuda_array(x: Any) -> bool:
    return hasattr(x, "__cuda_array_interface__")


def _is_complex(x: Any) -> bool:
    """Whether an argument holds complex numbers (host or GPU array, or a Python value)."""
    if _is_cuda_array(x):
        return x.__cuda_array_interface__["typestr"][1:2] == "c"
    try:  # a dtype numpy does not know (a torch tensor's): the array numpy makes of x
        return np.dtype(x.dtype).kind == "c"
    except (AttributeError, TypeError):
        pass
    try:
        return np.asarray(x).dtype.kind == "c"
    except Exception:  # noqa: BLE001 - the argument checks name the problem later
        return False


def _cuda_usable() -> bool:
    from scanweaver.runtime import cuda_driver

    if cuda_driver.requested_driver() is None and cuda_driver.driver_library_missing() is not None:
        return False  # no NVIDIA driver library: the GPU runtime is not even imported
    from scanweaver.runtime.cuda import cuda_available

    return cuda_available()


def _pick_backend(backend: str, arrays: list[Any], gpu_limit: str | None = None) -> str:
    """The backend to run on.  `gpu_limit`: why the GPU kernel cannot take these inputs
    (then "auto" stays on the CPU and "cuda" is an error), or None."""
    if not isinstance(backend, str):
        raise ScanWeaverTypeError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        )
    if backend not in BACKENDS:
        raise ScanWeaverValueError(
            f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}"
        )
    given = [x for x in arrays if x is not None]
    on_device = any(_is_cuda_array(x) for x in given)
    if on_device and not all(_is_cuda_array(x) for x in given):
        raise ScanWeaverValueError(
            "some array arguments are GPU arrays and others host arrays; pass all of them "
            "on the same device"
        )
    if gpu_limit is not None and (backend == "cuda" or on_device):
        raise ScanWeaverValueError(f"the GPU kernel does not support this call: {gpu_limit}; use backend='cpu'")
    if backend == "cpu":
        if on_device:
            raise ScanWeaverValueError(
                "backend='cpu' was asked for, but the inputs are GPU arrays; copy them "
                "to the host or use backend='cuda'"
            )
        return "cpu"
    if backend == "cuda" or on_device:
        if not _cuda_usable():
            from scanweaver.runtime.cuda import why_no_cuda

            raise BackendUnavailableError(f"backend='cuda' is not available: {why_no_cuda()}")
        return "cuda"
    return "cuda" if gpu_limit is None and _cuda_usable() else "cpu"


_CUDA_USABLE: list[bool] = []  # computed once, on the first call that asks


def _host_only(backend: Any) -> bool:
    """Whether host arrays run on the CPU with this backend ('cpu', or 'auto' without a GPU)."""
    if type(backend) is not str or backend not in ("auto", "cpu"):
        return False
    if backend == "cpu":
        return True
    if not _CUDA_USABLE:
        _CUDA_USABLE.append(_cuda_usable())
        if not _CUDA_USABLE[0]:
            _HOST_BACKENDS.add("auto")
    return not _CUDA_USABLE[0]


#: Backends known to run host arrays on the CPU (a set lookup on the tiny-call path).
_HOST_BACKENDS = {"cpu"}


@functools.cache
def _small_affine_scan() -> Callable[..., Any]:
    from scanweaver.runtime.cpu_scan import small_affine_scan

    return small_affine_scan


def _check_flag(name: str, value: Any) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise ScanWeaverTypeError(f"{name} must be True or False, got {value!r}")


def _refuse_huge_integers(arr: np.ndarray, typed: bool, state: np.dtype) -> None:
    """Python integers past 64 bits (numpy makes them an object array) are numbers, just
    too large for any state dtype: a value error, like a smaller overflow."""
    if not typed and arr.dtype == object and all(isinstance(v, int) for v in arr.flat):
        raise ScanWeaverValueError(f"argument 'h0' has values that do not fit the state dtype {state.name}")


def _initial_state(h0: Any, state: np.dtype, channel_shape: tuple[int, ...], axis: int) -> np.ndarray:
    """`h0` as a `state` array of `channel_shape`; a 0-d value stands for every channel.

    Arrays keep numpy's rule (a dtype that casts to the state without loss).  Lists and
    Python numbers have no dtype of their own: they are converted to the state dtype,
    as numpy does with Python scalars, unless a value does not fit.
    """
    arr = _host_array("h0", h0, allowed=None)
    typed = isinstance(h0, (np.ndarray, np.generic)) or hasattr(h0, "dtype")
    _refuse_huge_integers(arr, typed, state)
    if arr.dtype.kind not in "biuf":
        raise ScanWeaverTypeError(
            f"argument 'h0' has dtype {arr.dtype}; expected numbers for the state dtype {state.name}"
        )
    if typed:
        if not np.can_cast(arr.dtype, state, "same_kind") or arr.dtype.itemsize > state.itemsize:
            raise ScanWeaverTypeError(
                f"argument 'h0' has dtype {arr.dtype}, which does not fit the state "
                f"dtype {state.name} without loss"
            )
        converted = arr.astype(state)
    else:
        # (an empty list has numpy's default float64 dtype but no value that could not fit)
        if arr.size and not np.can_cast(arr.dtype, state, "same_kind"):
            what = "floating-point" if arr.dtype.kind == "f" else arr.dtype.name
            raise ScanWeaverTypeError(
                f"argument 'h0' holds {what} values, which do not fit the state dtype {state.name}"
            )
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # checked just below
                converted = np.asarray(h0, dtype=state)
        except OverflowError:
            converted = None
        if converted is None or not np.array_equal(np.isfinite(converted), np.isfinite(arr)) or (
            state.kind in "iu" and not np.array_equal(converted, arr)
        ):
            raise ScanWeaverValueError(f"argument 'h0' has values that do not fit the state dtype {state.name}")
    if converted.ndim == 0:
        return np.full(channel_shape, converted, dtype=state)
    _check_shape("h0", converted, channel_shape, f"'a' without axis {axis}, or a single value")
    return converted


# ------------------------------------------------------------------------- linear_scan


def linear_scan(
    a: Any,
    b: Any,
    h0: Any = None,
    axis: int = -1,
    reverse: bool = False,
    backend: str = "auto",
    return_final_state: bool = False,
):
    """Per-channel affine recurrence ``h[t] = a[t] * h[t-1] + b[t]`` along ``axis``.

    a, b: arrays of the same shape and dtype (float16, float32, float64, int32, int64,
      complex64, complex128); every dimension other than ``axis`` is an independent
      channel.  Complex: a real floating-point a or b is promoted to the other's complex
      type by numpy's rules (float64 with complex64 gives complex128); h0 may be real
      or complex.  Complex host arrays run on the CPU unless ``backend="cuda"`` (one
      GPU block per channel, the fused (re, im) kernel); complex GPU arrays on the GPU.
    h0: optional initial state, shape of ``a`` without ``axis`` (zero when absent).
    reverse: walk the axis from its end (``h[t] = a[t] * h[t+1] + b[t]``).
    h0 may be a list or a single value for every channel; values that the state dtype
    cannot hold exactly (an integer overflow, a float for an integer state) are refused.
    Returns h (same shape; float16 inputs accumulate and return float32; integers wrap
    around like C), and with ``return_final_state=True`` also the last state.
    NaN and Inf propagate exactly as in the sequential loop.
    """
    if (type(a) is np.ndarray and type(b) is np.ndarray and h0 is None and type(axis) is int
            and type(reverse) is bool and type(return_final_state) is bool
            and (axis == -1 or axis == a.ndim - 1)
            and (type(backend) is str and backend in _HOST_BACKENDS or _host_only(backend))):
        # Small 2-D host arrays with the defaults: one compiled call (runtime/cpu_scan.py).
        done = _small_affine_scan()(a, b, reverse, return_final_state)
        if done is not None:
            return done
    try:
        axis = operator.index(axis)
    except TypeError:
        raise ScanWeaverTypeError(f"axis must be an integer, got {axis!r}") from None
    _check_flag("reverse", reverse)
    _check_flag("return_final_state", return_final_state)
    reverse, return_final_state = bool(reverse), bool(return_final_state)  # numpy bools key no kernel cache
    if backend == "auto" and any(map(_is_complex, (a, b))) and not any(map(_is_cuda_array, (a, b, h0))):
        # complex host arrays stay on the CPU unless backend="cuda" asks: the GPU's
        # complex kernel runs one block per channel (no time blocks)
        backend = "cpu"
    chosen = _pick_backend(backend, [a, b, h0])
    if chosen == "cuda" and _is_cuda_array(a):
        from scanweaver.runtime.cuda_scan import linear_scan_cuda

        return linear_scan_cuda(a, b, h0, axis, reverse, return_final_state)
    a_arr, b_arr, axis = _scan_operands(a, b, axis)
    state_dtype = np.float32 if a_arr.dtype == np.float16 else a_arr.dtype
    channel_shape = a_arr.shape[:axis] + a_arr.shape[axis + 1 :]
    h0_2d = None
    if h0 is not None:
        init = _complex_initial_state if np.dtype(state_dtype).kind == "c" else _initial_state
        h0_arr = init(h0, np.dtype(state_dtype), channel_shape, axis)
        h0_2d = np.ascontiguousarray(h0_arr).reshape(-1)
        h0 = h0_arr
    if chosen == "cuda":
        from scanweaver.runtime.cuda_scan import linear_scan_cuda

        return linear_scan_cuda(a_arr, b_arr, h0, axis, reverse, return_final_state)

    if np.dtype(state_dtype).kind == "c":  # (outer, L, inner) views, no transposes
        from scanweaver.runtime.cpu_complex import complex_scan_cpu

        h, final = complex_scan_cpu(a_arr, b_arr, h0, axis, reverse)
        return (h, final) if return_final_state else h

    h, final = _real_scan_cpu(a_arr, b_arr, h0_2d, axis, reverse, state_dtype, channel_shape)
    return (h, final) if return_final_state else h


def _scan_operands(a: Any, b: Any, axis: int) -> tuple[np.ndarray, np.ndarray, int]:
    """`linear_scan`'s a and b as host arrays of one dtype and shape, and the axis made non-negative."""
    a_arr, b_arr = _host_array("a", a, _SCAN_TYPES), _host_array("b", b, _SCAN_TYPES)
    if a_arr.dtype.kind == "c" or b_arr.dtype.kind == "c":
        a_arr, b_arr = _promote_complex(a_arr, b_arr)
    if a_arr.dtype != b_arr.dtype:
        raise ScanWeaverTypeError(
            f"arguments 'a' ({a_arr.dtype}) and 'b' ({b_arr.dtype}) must have the same dtype"
        )
    _check_shape("b", b_arr, a_arr.shape, "the shape of 'a'")
    if a_arr.ndim == 0:
        raise ScanWeaverValueError("arguments 'a' and 'b' must have at least one dimension")
    if not -a_arr.ndim <= axis < a_arr.ndim:
        raise ScanWeaverValueError(
            f"axis {axis} is out of range for {a_arr.ndim}-dimensional inputs"
        )
    return a_arr, b_arr, axis % a_arr.ndim


def _real_scan_cpu(a_arr, b_arr, h0_2d, axis, reverse, state_dtype, channel_shape):
    """The real-valued CPU scan: the kernels scan the last axis of C-contiguous (channels, L) arrays."""
    channels = int(np.prod(channel_shape, dtype=np.int64))

    def to_2d(x: np.ndarray) -> np.ndarray:
        moved = np.moveaxis(x, axis, -1)
        try:  # a view where the channel dims merge (no copy: the scan stages segments)
            return moved.reshape(channels, x.shape[axis], copy=False)
        except ValueError:
            return np.ascontiguousarray(moved).reshape(channels, x.shape[axis])

    from scanweaver.runtime.cpu_scan import affine_scan_staged

    length = a_arr.shape[axis]
    h_2d, final = affine_scan_staged(to_2d(a_arr), to_2d(b_arr), h0_2d, reverse, state_dtype)
    h = np.moveaxis(h_2d.reshape(channel_shape + (length,)), -1, axis)
    return h, final.reshape(channel_shape)


def _promote_complex(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A complex recurrence: a real float operand joins the complex one, by numpy's
    promotion (float32 + complex64 -> complex64, float64 + complex64 -> complex128),
    as `a * h + b` would in numpy.  Integer operands are refused: no complex integers."""
    for name, x in (("a", a), ("b", b)):
        if x.dtype.kind not in "fc":
            raise ScanWeaverTypeError(
                f"argument '{name}' has dtype {x.dtype}; a complex scan takes complex64, "
                "complex128 or real floating-point a and b"
            )
    target = np.result_type(a.dtype, b.dtype)
    return a.astype(target, copy=False), b.astype(target, copy=False)


def _complex_initial_state(h0: Any, state: np.dtype, channel_shape: tuple[int, ...], axis: int) -> np.ndarray:
    """`h0` for a complex state: numbers (real or complex) the state holds without loss;
    Python numbers and lists are converted, arrays must cast safely (float64 does not
    fit complex64)."""
    arr = _host_array("h0", h0, allowed=None)
    typed = isinstance(h0, (np.ndarray, np.generic)) or hasattr(h0, "dtype")
    _refuse_huge_integers(arr, typed, state)
    if arr.dtype.kind not in "biufc":
        raise ScanWeaverTypeError(f"argument 'h0' has dtype {arr.dtype}; expected numbers for the state dtype {state.name}")
    if typed and not np.can_cast(arr.dtype, state, "safe"):
        raise ScanWeaverTypeError(
            f"argument 'h0' has dtype {arr.dtype}, which does not fit the state dtype {state.name} without loss"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        converted = arr.astype(state)
    if not typed and not np.array_equal(np.isfinite(converted), np.isfinite(arr)):
        raise ScanWeaverValueError(f"argument 'h0' has values that do not fit the state dtype {state.name}")
    if converted.ndim == 0:
        return np.full(channel_shape, converted, dtype=state)
    _check_shape("h0", converted, channel_shape, f"'a' without axis {axis}, or a single value")
    return converted


# ---------------------------------------------------------------------- selective_scan


def _check_selective_inputs(u, delta, A, B, C, D, z, delta_bias, h0):
    u = _host_array("u", u, _FLOAT_TYPES)
    if u.ndim != 3:
        raise ScanWeaverValueError(f"argument 'u' must have shape (batch, D, L), got {u.shape}")
    batch, dim, length = u.shape
    delta = _host_array("delta", delta, _FLOAT_TYPES)
    _check_shape("delta", delta, u.shape, "(batch, D, L) like 'u'")
    A = _host_array("A", A, _FLOAT_TYPES)
    if A.ndim != 2 or A.shape[0] != dim:
        raise ScanWeaverValueError(f"argument 'A' must have shape (D, N) = ({dim}, N), got {A.shape}")
    n = A.shape[1]
    shapes = {
        "constant": (dim, n),
        "shared": (batch, n, length),
    }
    forms = {}
    for name, x in (("B", B), ("C", C)):
        x = _host_array(name, x, _FLOAT_TYPES)
        if x.ndim == 4:
            if x.shape[0] != batch or x.shape[2:] != (n, length) or not x.shape[1] or dim % x.shape[1]:
                raise ScanWeaverValueError(
                    f"argument '{name}' (grouped) must have shape (batch, G, N, L) = "
                    f"({batch}, G, {n}, {length}) with G dividing D={dim}, got {x.shape}"
                )
        elif tuple(x.shape) not in shapes.values():
            raise ScanWeaverValueError(
                f"argument '{name}' must have shape (D, N) = {shapes['constant']}, "
                f"(batch, N, L) = {shapes['shared']} or (batch, G, N, L), got {x.shape}"
            )
        forms[name] = x
    extras = {}
    for name, x, shape, meaning in (
        ("D", D, (dim,), "(D,)"),
        ("z", z, u.shape, "(batch, D, L) like 'u'"),
        ("delta_bias", delta_bias, (dim,), "(D,)"),
        ("initial_state", h0, (batch, dim, n), "(batch, D, N)"),
    ):
        if x is None:
            extras[name] = None
            continue
        x = _host_array(name, x, _FLOAT_TYPES)
        _check_shape(name, x, shape, meaning)
        extras[name] = x
    return u, delta, A, forms["B"], forms["C"], extras


def selective_scan(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    initial_state: Any = None,
    backend: str = "auto",
):
    """Mamba's selective scan forward, with the meaning of ``selective_scan_fn``.

    u, delta, z: (batch, D, L); A: (D, N); B, C: (D, N) constant, (batch, N, L) shared,
    or (batch, G, N, L) grouped (channel d uses group d // (D/G)); D, delta_bias: (D,).
    ``initial_state`` (batch, D, N) is an extension: the state before t = 0.
    Complex A (complex64/complex128, as Mamba's complex weight type): the state is
    complex, input-dependent B/C are real with (re, im) pairs along a last axis of 2L
    (or complex with L), constant B/C complex or real, and y = 2 Re(C h) as in
    mamba_ssm's reference; last_state is complex.  On the CPU, or with backend="cuda"
    the GPU kernel (host arrays; N <= 8 for complex64 A, N <= 4 for complex128).
    All internal math is float32, whatever the input dtype; the output has u's dtype.
    Returns out, or (out, last_state) with ``return_last_state=True``.
    """
    _check_flag("delta_softplus", delta_softplus)
    _check_flag("return_last_state", return_last_state)
    if _is_complex(A):
        return _selective_scan_complex(
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state, backend
        )
    # the GPU kernel takes every B/C layout (each its own) and initial_state, like the CPU
    chosen = _pick_backend(backend, [u, delta, A, B, C, D, z, delta_bias, initial_state])
    if chosen == "cuda" and _is_cuda_array(u):
        from scanweaver.runtime.cuda_scan import selective_scan_cuda

        return selective_scan_cuda(
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state
        )
    u_, delta_, A_, B_, C_, ex = _check_selective_inputs(
        u, delta, A, B, C, D, z, delta_bias, initial_state
    )
    if chosen == "cuda":
        from scanweaver.runtime.cuda_scan import selective_scan_cuda

        return selective_scan_cuda(
            u_, delta_, A_, B_, C_, ex["D"], ex["z"], ex["delta_bias"], delta_softplus,
            return_last_state, ex["initial_state"],
        )
    from scanweaver.runtime.cpu_scan import selective_scan_cpu

    return selective_scan_cpu(
        u_,
        delta_,
        A_,
        B_,
        C_,
        D=ex["D"],
        z=ex["z"],
        delta_bias=ex["delta_bias"],
        delta_softplus=delta_softplus,
        return_last_state=return_last_state,
        h0=ex["initial_state"],
    )


def _selective_scan_complex(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                            initial_state, backend):
    """Complex A (S4D/LRU-style diagonal complex state): mamba_ssm's meaning; on the GPU
    only when asked (backend="cuda", host arrays): "auto" keeps it on the CPU."""
    given = [u, delta, A, B, C, D, z, delta_bias, initial_state]
    if backend == "cuda":
        _pick_backend(backend, given)
        from scanweaver.runtime.cuda_scan import selective_scan_complex_cuda

        return selective_scan_complex_cuda(
            u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, initial_state
        )
    _pick_backend(backend, given, gpu_limit="complex A takes host arrays only (backend='cuda' runs them on the GPU)")
    from scanweaver.runtime.cpu_selective_complex import selective_scan_complex_cpu

    return selective_scan_complex_cpu(
        u, delta, A, B, C, D=D, z=z, delta_bias=delta_bias, delta_softplus=delta_softplus,
        return_last_state=return_last_state, h0=initial_state,
    )


# ----------------------------------------------------------------------------- compile


def _without_aliasing(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """Refuse overlapping array arguments: the raise pass assumes memrefs do not alias."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise ScanWeaverTypeError(f"@{name} takes its arguments by position, got keyword {next(iter(kwargs))!r}")
        arrays = [(i, a) for i, a in enumerate(args) if isinstance(a, np.ndarray)]
        for k, (i, x) in enumerate(arrays):
            for j, y in arrays[k + 1 :]:
                if np.may_share_memory(x, y):
                    raise ScanWeaverValueError(
                        f"@{name}: arguments #{i} and #{j} overlap in memory; ScanWeaver "
                        "assumes distinct memref arguments do not alias"
                    )
        return fn(*args)

    call.__name__, call.__doc__ = name, fn.__doc__
    return call


def _check_signatures(module: Any) -> None:
    """Argument and result types the CPU calling layer takes, before any build (a tensor
    argument otherwise fails in mlir-translate, as a tool failure)."""
    from scanweaver.compiler import public_functions
    from scanweaver.runtime.cpu import parse_type

    for name, fn in public_functions(module).items():
        for t in (*fn.function_type.inputs.data, *fn.function_type.outputs.data):
            try:
                parse_type(str(t))
            except ScanWeaverTypeError as e:
                raise ScanWeaverTypeError(f"@{name}: {e}") from None


def compile(mlir_text: str, target: str = "cpu") -> Program:  # noqa: A001 - public API name
    """Compile user IR (loops or scan ops) through raise → lower → build.

    target="cpu": LLVM JIT on this machine; target="cuda": PTX kernels launched through
    a CUDA driver binding (cuda-python, numba-cuda or numba; needs a GPU).  Memref arguments must not overlap in memory
    (the raise pass assumes distinct memrefs do not alias; overlapping numpy arrays are
    refused) and must be writeable.
    """
    from scanweaver import compiler
    from scanweaver.runtime.cpu import CpuProgram

    compiler.check_target(target)
    if not isinstance(mlir_text, str):
        raise ScanWeaverTypeError(f"compile() takes MLIR text (a str), got {type(mlir_text).__name__}")
    if target == "cuda":
        from scanweaver.runtime.cuda_program import compile_cuda_program

        return compile_cuda_program(mlir_text)
    from scanweaver.ir import parse_ir
    from scanweaver.runtime.shape_contract import derive_contracts

    module = parse_ir(mlir_text)
    _check_signatures(module)
    contracts = derive_contracts(module)  # shapes each function's accesses rely on
    # Accesses the contract cannot follow: upstream runtime bounds checks on this build.
    build = compiler.build_cpu(mlir_text, bounds_checks=any(c.unchecked for c in contracts.values()))
    jit = CpuProgram(build.llvm_ir)
    functions = {
        name: _without_aliasing(name, jit.get(name, args, results, contract=contracts.get(name)))
        for name, (args, results) in build.signatures.items()
    }
    return Program(
        functions,
        lambda: compiler.lower(mlir_text, "cpu").stages,
        build.llvm_ir,
        cache_hit=build.cache_hit,
    )


def load(path: str, driver: Any = None) -> Program:
    """A GPU program built by `scanweaver compile FILE --target ptx|cubin -o OUT`, from
    OUT (or OUT.launch.json): needs numpy and a CUDA driver binding, not the compiler.
    `driver`: a binding's name ("cuda-python", "numba-cuda", "numba"), an opened
    `CudaDriver`, or None for the first binding that starts."""
    from scanweaver.runtime.cuda_artifact import load as load_artifact

    return load_artifact(path, driver)
