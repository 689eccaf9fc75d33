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
the sequential loop on (re, im) pairs (scan-complex-to-real).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cpu_scan import kernel, num_threads, parallel_for, split_range


@dataclass(frozen=True)
class ComplexSelectiveSpec:
    """Compile-time shape of one complex selective-scan kernel."""

    n: int
    real: str  # "f32" | "f64": the element type of the complex state
    b_kind: str  # "const" | "shared" | "grouped" (time before the state index)
    c_kind: str
    has_d: bool
    has_z: bool
    has_bias: bool
    softplus: bool
    has_h0: bool
    has_last: bool


def _bc_type(kind: str, n: int, c: str) -> str:
    return {"const": f"memref<?x{n}x{c}>", "shared": f"memref<?x?x{n}x{c}>", "grouped": f"memref<?x?x?x{n}x{c}>"}[kind]


def _bc_index(kind: str, name: str, i: str, n: str) -> str:
    return {"const": f"{name}[%d, {n}]", "shared": f"{name}[%b, {i}, {n}]", "grouped": f"{name}[%b, %g{name[1:]}, {i}, {n}]"}[kind]


@functools.lru_cache(maxsize=None)
def complex_selective_ir(spec: ComplexSelectiveSpec) -> str:
    """IR text of `func.func @selective_scan_complex` (argument order as in
    `selective_scan_ir`: u, delta, A, B, C, [D], [z], [bias], [h0], out, [last],
    d_begin, d_end); A, B, C, h0 and last are complex memrefs."""
    N, f = spec.n, spec.real
    c = f"complex<{f}>"
    m3 = f"memref<?x?x?x{f}>"
    args = [f"%u: {m3}", f"%delta: {m3}", f"%A: memref<?x{N}x{c}>", f"%B: {_bc_type(spec.b_kind, N, c)}",
            f"%C: {_bc_type(spec.c_kind, N, c)}"]
    args += [f"%Dskip: memref<?x{f}>"] if spec.has_d else []
    args += [f"%z: {m3}"] if spec.has_z else []
    args += [f"%bias: memref<?x{f}>"] if spec.has_bias else []
    args += [f"%h0: memref<?x?x{N}x{c}>"] if spec.has_h0 else []
    args += [f"%out: {m3}"]
    args += [f"%last: memref<?x?x{N}x{c}>"] if spec.has_last else []
    args += ["%d_begin: index", "%d_end: index"]
    st = f"memref<{N}x{c}>"
    L: list[str] = []
    e = L.append
    e(f"func.func @selective_scan_complex({', '.join(args)}) {{")
    e("  %c0 = arith.constant 0 : index")
    e("  %c1 = arith.constant 1 : index")
    e("  %c2 = arith.constant 2 : index")
    e(f"  %cN = arith.constant {N} : index")
    e(f"  %zero = arith.constant 0.0 : {f}")
    e(f"  %one = arith.constant 1.0 : {f}")
    e(f"  %two = arith.constant 2.0 : {f}")
    e(f"  %twenty = arith.constant 20.0 : {f}")
    e(f"  %czero = complex.constant [0.0 : {f}, 0.0 : {f}] : {c}")
    e(f"  %batch = memref.dim %u, %c0 : {m3}")
    e(f"  %Dn = memref.dim %u, %c1 : {m3}")
    e(f"  %len = memref.dim %u, %c2 : {m3}")
    for name, kind in (("%B", spec.b_kind), ("%C", spec.c_kind)):
        if kind == "grouped":
            e(f"  %ng{name[1:]} = memref.dim {name}, %c1 : {_bc_type(kind, N, c)}")
            e(f"  %per{name[1:]} = arith.divui %Dn, %ng{name[1:]} : index")
    e(f"  %S = memref.alloca() : {st}")
    e("  scf.for %b = %c0 to %batch step %c1 {")
    e("    scf.for %d = %d_begin to %d_end step %c1 {")
    for name, kind in (("%B", spec.b_kind), ("%C", spec.c_kind)):
        if kind == "grouped":
            e(f"      %g{name[1:]} = arith.divui %d, %per{name[1:]} : index")
    e("      scf.for %n = %c0 to %cN step %c1 {")
    if spec.has_h0:
        e(f"        %v = memref.load %h0[%b, %d, %n] : memref<?x?x{N}x{c}>")
        e(f"        memref.store %v, %S[%n] : {st}")
    else:
        e(f"        memref.store %czero, %S[%n] : {st}")
    e("      }")
    if spec.has_bias:
        e(f"      %bd = memref.load %bias[%d] : memref<?x{f}>")
    if spec.has_d:
        e(f"      %dd = memref.load %Dskip[%d] : memref<?x{f}>")
    e(f"      scan.recurrence %c0 to %len step %c1 state(%S : {st}) coeffs {{")
    e("      ^bb0(%i: index, %k: index):")
    e(f"        %dl = memref.load %delta[%b, %d, %i] : {m3}")
    dt = "%dl"
    if spec.has_bias:
        e(f"        %dlb = arith.addf %dl, %bd : {f}")
        dt = "%dlb"
    if spec.softplus:  # softplus(x) = log1p(exp(x)), = x for x > 20
        e(f"        %ex = math.exp {dt} : {f}")
        e(f"        %lp = math.log1p %ex : {f}")
        e(f"        %big = arith.cmpf ogt, {dt}, %twenty : {f}")
        e(f"        %sp = arith.select %big, {dt}, %lp : {f}")
        dt = "%sp"
    # exp(dt * A): a real times a complex scales both parts
    e(f"        %ak = memref.load %A[%d, %k] : memref<?x{N}x{c}>")
    e(f"        %akr = complex.re %ak : {c}")
    e(f"        %aki = complex.im %ak : {c}")
    e(f"        %dar = arith.mulf {dt}, %akr : {f}")
    e(f"        %dai = arith.mulf {dt}, %aki : {f}")
    e(f"        %da = complex.create %dar, %dai : {c}")
    e(f"        %a = complex.exp %da : {c}")
    # dt * u * B
    e(f"        %bk = memref.load {_bc_index(spec.b_kind, '%B', '%i', '%k')} : {_bc_type(spec.b_kind, N, c)}")
    e(f"        %uu = memref.load %u[%b, %d, %i] : {m3}")
    e(f"        %dtu = arith.mulf {dt}, %uu : {f}")
    e(f"        %bkr = complex.re %bk : {c}")
    e(f"        %bki = complex.im %bk : {c}")
    e(f"        %xr = arith.mulf %bkr, %dtu : {f}")
    e(f"        %xi = arith.mulf %bki, %dtu : {f}")
    e(f"        %x = complex.create %xr, %xi : {c}")
    e(f"        scan.yield %a, %x : {c}, {c}")
    e("      } emit {")
    e(f"      ^bb0(%i: index, %s: {st}):")
    # y = 2 Re(sum_n h_n C_n) = 2 sum_n (h.re C.re - h.im C.im)
    e(f"        %y1 = scf.for %n = %c0 to %cN step %c1 iter_args(%acc = %zero) -> ({f}) {{")
    e(f"          %hv = memref.load %s[%n] : {st}")
    e(f"          %cv = memref.load {_bc_index(spec.c_kind, '%C', '%i', '%n')} : {_bc_type(spec.c_kind, N, c)}")
    e(f"          %hr = complex.re %hv : {c}")
    e(f"          %hi = complex.im %hv : {c}")
    e(f"          %cr = complex.re %cv : {c}")
    e(f"          %ci = complex.im %cv : {c}")
    e(f"          %p1 = arith.mulf %hr, %cr : {f}")
    e(f"          %p2 = arith.mulf %hi, %ci : {f}")
    e(f"          %pr = arith.subf %p1, %p2 : {f}")
    e(f"          %acc2 = arith.addf %acc, %pr : {f}")
    e(f"          scf.yield %acc2 : {f}")
    e("        }")
    e(f"        %y = arith.mulf %y1, %two : {f}")
    y = "%y"
    if spec.has_d:
        e(f"        %uu = memref.load %u[%b, %d, %i] : {m3}")
        e(f"        %du = arith.mulf %dd, %uu : {f}")
        e(f"        %yd = arith.addf %y, %du : {f}")
        y = "%yd"
    if spec.has_z:
        e(f"        %zz = memref.load %z[%b, %d, %i] : {m3}")
        e(f"        %nz = arith.negf %zz : {f}")
        e(f"        %ez = math.exp %nz : {f}")
        e(f"        %den = arith.addf %one, %ez : {f}")
        e(f"        %sz = arith.divf %zz, %den : {f}")
        e(f"        %yz = arith.mulf {y}, %sz : {f}")
        y = "%yz"
    e(f"        memref.store {y}, %out[%b, %d, %i] : {m3}")
    e("        scan.yield")
    e("      }")
    if spec.has_last:
        e("      scf.for %n = %c0 to %cN step %c1 {")
        e(f"        %v = memref.load %S[%n] : {st}")
        e(f"        memref.store %v, %last[%b, %d, %n] : memref<?x?x{N}x{c}>")
        e("      }")
    e("    }")
    e("  }")
    e("  func.return")
    e("}")
    return "\n".join(L) + "\n"


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
    A = np.asarray(A)
    if A.dtype not in (np.complex64, np.complex128):
        raise ScanWeaverTypeError(f"argument 'A' has dtype {A.dtype}; expected complex64 or complex128")
    cdt = A.dtype
    rdt = np.dtype(np.float32 if cdt == np.complex64 else np.float64)
    u_in = np.asarray(u)
    if u_in.ndim != 3:
        raise ScanWeaverValueError(f"argument 'u' must have shape (batch, D, L), got {u_in.shape}")
    batch, Dn, L = u_in.shape
    out_dtype = u_in.dtype if u_in.dtype.kind == "f" else rdt
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
    arg_spec: list[int | str] = [3, 3, 2, Bk.ndim, Ck.ndim] + [1] * (Dk is not None) + [3] * (zk is not None)
    arg_spec += [1] * (bias is not None) + [3] * (h0k is not None) + [3] + [3] * bool(return_last_state)
    arg_spec += ["index", "index"]
    k = kernel(complex_selective_ir(spec), "selective_scan_complex", arg_spec)
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
