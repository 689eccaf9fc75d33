"""Mamba's selective scan with complex A on the CPU: one compiled complex scan.recurrence.

Meaning (mamba_ssm's `selective_scan_ref` with a complex weight type):

    dt = softplus(delta + delta_bias)                      (each if asked; real)
    h[b,d,n] = exp(dt * A[d,n]) * h + dt * u[b,d,t] * B[.,n,t]     (complex state)
    y[b,d,t] = 2 * Re(sum_n h[b,d,n] * C[.,n,t])
    out = (y + D*u) * silu(z)                              (each if given; real)

A: (D, N) complex.  B, C constant: (D, N), complex or real.  B, C input-dependent
(shared (batch, N, L') or grouped (batch, G, N, L')): real with L' = 2L, the last axis
holding (re, im) pairs of the complex value at each step (Mamba's layout: its
projections write 2N reals per step), or complex with L' = L.  The state and its math
are complex64 for complex64 A and complex128 for complex128 A (the state takes A's
dtype, as in the reference); out is real in u's dtype; last_state (batch, D, N) is
complex.  Like the real kernel, nothing of shape (batch, D, L, N) is built: exp(dt*A)
and dt*B*u come from registers (the `coeffs` producer), Re(C.h) is reduced per step
(the `emit` consumer).  The kernel runs channel ranges on threads; each recurrence is
the sequential loop on (re, im) pairs (scan-complex-to-real).  The kernel is built by
`workloads/selective_complex.py` (through `kernel_ir`), its argument list read from the
built signature.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cpu_scan import kernel, num_threads, parallel_for, split_range
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.workloads.specs import ComplexSelectiveSpec


def _weight(x: Any, name: str, batch: int, D: int, N: int, L: int, cdt: np.dtype) -> tuple[str, np.ndarray]:
    """B or C as a complex array in the kernel's layout (time before the state index)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "fc":
        raise ScanWeaverTypeError(f"argument '{name}' has dtype {arr.dtype}; expected a real or complex float array")
    if arr.ndim == 2:
        if arr.shape != (D, N):
            raise ScanWeaverValueError(f"argument '{name}' (constant) must have shape (D, N) = {(D, N)}, got {arr.shape}")
        return "const", np.ascontiguousarray(arr, dtype=cdt)
    if arr.ndim not in (3, 4):
        raise ScanWeaverValueError(f"argument '{name}' must be (D, N), (batch, N, 2L) or (batch, G, N, 2L), got {arr.shape}")
    if arr.dtype.kind == "f":  # Mamba's layout: (re, im) pairs along the last axis
        if arr.shape[-1] != 2 * L:
            raise ScanWeaverValueError(
                f"argument '{name}' is real and input-dependent with complex A: its last axis must "
                f"hold (re, im) pairs, length 2L = {2 * L}, got shape {arr.shape}"
            )
        real = np.ascontiguousarray(arr, dtype=np.float32 if cdt == np.complex64 else np.float64)
        arr = real.view(cdt)  # (..., L) complex, zero copy
    elif arr.shape[-1] != L:
        raise ScanWeaverValueError(f"argument '{name}' is complex: its last axis must have length L = {L}, got {arr.shape}")
    if arr.ndim == 3:
        if arr.shape[:2] != (batch, N):
            raise ScanWeaverValueError(f"argument '{name}' (shared) must be (batch, N, .) = ({batch}, {N}, .), got {arr.shape}")
        return "shared", np.ascontiguousarray(np.swapaxes(arr, 1, 2), dtype=cdt)
    G = arr.shape[1]
    if arr.shape[0] != batch or arr.shape[2] != N or G == 0 or D % G:
        raise ScanWeaverValueError(
            f"argument '{name}' (grouped) must be (batch, G, N, .) with G dividing D = {D}, got {arr.shape}"
        )
    return "grouped", np.ascontiguousarray(np.swapaxes(arr, 2, 3), dtype=cdt)


def complex_selective_types(A: Any, u: Any) -> tuple[np.ndarray, np.ndarray, np.dtype, np.dtype]:
    """A as a complex array, u as a (batch, D, L) array, the real dtype of the math and
    the output's dtype (u's when it is floating point)."""
    A = np.asarray(A)
    if A.dtype not in (np.complex64, np.complex128):
        raise ScanWeaverTypeError(f"argument 'A' has dtype {A.dtype}; expected complex64 or complex128")
    rdt = np.dtype(np.float32 if A.dtype == np.complex64 else np.float64)
    u_in = np.asarray(u)
    if u_in.ndim != 3:
        raise ScanWeaverValueError(f"argument 'u' must have shape (batch, D, L), got {u_in.shape}")
    return A, u_in, rdt, (u_in.dtype if u_in.dtype.kind == "f" else rdt)


def _real(x: Any, name: str, shape: tuple[int, ...], rdt: np.dtype) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind != "f":
        raise ScanWeaverTypeError(f"argument '{name}' has dtype {arr.dtype}; expected a real floating-point array")
    if arr.shape != shape:
        raise ScanWeaverValueError(f"argument '{name}' must have shape {shape}, got {arr.shape}")
    return np.ascontiguousarray(arr, dtype=rdt)


def selective_scan_complex_cpu(
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
    h0: Any = None,
    threads: int | None = None,
):
    """The selective scan with complex A (module docstring); out in u's dtype."""
    A, u_in, rdt, out_dtype = complex_selective_types(A, u)
    cdt = A.dtype
    batch, Dn, L = u_in.shape
    uk = _real(u_in, "u", (batch, Dn, L), rdt)
    dk = _real(delta, "delta", (batch, Dn, L), rdt)
    if A.ndim != 2 or A.shape[0] != Dn:
        raise ScanWeaverValueError(f"argument 'A' must have shape (D, N) = ({Dn}, N), got {A.shape}")
    N = A.shape[1]
    if not 0 < N <= 64:
        raise ScanWeaverValueError(f"argument 'A': state size N = {N} not supported (1..64)")
    b_kind, Bk = _weight(B, "B", batch, Dn, N, L, cdt)
    c_kind, Ck = _weight(C, "C", batch, Dn, N, L, cdt)
    Dk = None if D is None else _real(D, "D", (Dn,), rdt)
    zk = None if z is None else _real(z, "z", (batch, Dn, L), rdt)
    bias = None if delta_bias is None else _real(delta_bias, "delta_bias", (Dn,), rdt)
    h0k = None
    if h0 is not None:
        h0a = np.asarray(h0)
        if h0a.dtype.kind not in "fc" or h0a.shape != (batch, Dn, N):
            raise ScanWeaverValueError(
                f"argument 'initial_state' must be a (batch, D, N) = {(batch, Dn, N)} float or complex array, "
                f"got {h0a.shape} {h0a.dtype}"
            )
        h0k = np.ascontiguousarray(h0a, dtype=cdt)
    spec = ComplexSelectiveSpec(N, "f32" if cdt == np.complex64 else "f64", b_kind, c_kind, Dk is not None,
                                zk is not None, bias is not None, bool(delta_softplus), h0k is not None,
                                bool(return_last_state))
    ir = kernel_ir("selective_complex", spec=spec)  # built by workloads/selective_complex.py
    k = kernel(ir.text, ir.name, ir.args)
    out = np.empty((batch, Dn, L), rdt)
    last = np.empty((batch, Dn, N), cdt) if return_last_state else None
    arrays = [uk, dk, np.ascontiguousarray(A), Bk, Ck] + [x for x in (Dk, zk, bias, h0k) if x is not None] + [out]
    arrays += [last] if last is not None else []
    threads = num_threads() if threads is None else max(1, threads)
    if batch * Dn * L * N < (1 << 15):
        threads = 1
    parts = split_range(Dn, min(Dn, 4 * threads) if threads > 1 else 1)
    parallel_for([k.bind(*arrays, lo, hi) for lo, hi in parts], threads=threads)
    result = out.astype(out_dtype, copy=False)
    return (result, last) if return_last_state else result
