"""`selective_scan_fn` with complex A: Mamba's complex selective scan as a PyTorch operator.

Meaning (mamba_ssm's `selective_scan_ref` with wtype complex; numpy level in
runtime/cpu_selective_complex.py): A (D, N) complex64/complex128; B and C constant
(D, N) complex or real, or input-dependent real with (re, im) pairs on a last axis of
2L (Mamba's layout), or input-dependent complex with length L; y = 2 Re(C h);
the state, last_state and all the math take A's complex dtype; out is real in u's dtype.

  scanweaver::complex_selective_scan_fwd   the compiled fused complex scan.recurrence
  scanweaver::complex_selective_scan_bwd   gradients, PyTorch's complex autograd convention
                                           (grad of a real loss w.r.t. z = dL/dRe z + i dL/dIm z)

Backward: `@selective_scan_complex_vjp` (workloads/selective_complex_vjp.py), compiled
`scan.recurrence`s per (batch, channel): a forward pass keeping the state every CHUNK
steps, then per chunk (last first) a recompute of its states into a stack buffer and the
adjoint recurrence running backwards, lam_t = conj(a_{t+1}) lam_{t+1} + 2 dy_t conj(C_t)
with a_t = exp(dt_t A), whose consumer writes the step's gradients.  Memory: the inputs,
the gradients and (batch, D, L / CHUNK, N) checkpoints; nothing of size (batch, D, L, N).
Channel ranges run on threads; dB / dC of input-dependent B, C sum over private buffers.
"""

from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch

from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cpu_scan import num_threads, parallel_for, split_range
from scanweaver.torch import _checks
from scanweaver.workloads.selective_complex_vjp import ComplexSelectiveVjpSpec, selective_scan_complex_vjp

MAX_STATE = 64
#: Steps between state checkpoints in the backward (L / CHUNK states per channel kept).
CHUNK = 64

_REAL = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_COMPLEX = (torch.complex64, torch.complex128)


def _dtypes(A: torch.Tensor) -> tuple[np.dtype, np.dtype, torch.dtype]:
    """(complex numpy dtype, real numpy dtype, real torch dtype) of the math: A's."""
    if A.dtype == torch.complex128:
        return np.dtype(np.complex128), np.dtype(np.float64), torch.float64
    return np.dtype(np.complex64), np.dtype(np.float32), torch.float32


def _view(x: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    return x.detach().to(dtype).contiguous().numpy()


def _weight_view(x: torch.Tensor, cdt: np.dtype, rt: torch.dtype) -> np.ndarray:
    """B or C for the numpy kernel: complex in cdt, or real in the math's real dtype."""
    return _view(x, torch.complex128 if cdt == np.complex128 else torch.complex64) if x.is_complex() else _view(x, rt)


def _kind(x: torch.Tensor) -> str:
    return {2: "const", 3: "shared", 4: "grouped"}[x.dim()]


# ----------------------------------------------------------------------------- forward


@torch.library.custom_op("scanweaver::complex_selective_scan_fwd", mutates_args=())
def complex_selective_scan_fwd(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: Optional[torch.Tensor], z: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
    delta_softplus: bool, initial_state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in u's dtype, last state (batch, D, N) in A's dtype): the compiled kernel."""
    _validate(u, delta, A, B, C, D, z, delta_bias, initial_state)
    from scanweaver.runtime.cpu_selective_complex import selective_scan_complex_cpu

    cdt, rdt, rt = _dtypes(A)
    ct = torch.complex128 if cdt == np.complex128 else torch.complex64
    opt = lambda x, t: None if x is None else _view(x, t)  # noqa: E731
    out, last = selective_scan_complex_cpu(
        _view(u, rt), _view(delta, rt), _view(A, ct), _weight_view(B, cdt, rt), _weight_view(C, cdt, rt),
        opt(D, rt), opt(z, rt), opt(delta_bias, rt), bool(delta_softplus), True,
        None if initial_state is None else _weight_view(initial_state, cdt, rt),
    )
    return torch.from_numpy(out).to(u.dtype), torch.from_numpy(last)


@complex_selective_scan_fwd.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state=None):
    return u.new_empty(u.shape), u.new_empty((u.shape[0], u.shape[1], A.shape[1]), dtype=A.dtype)


# ---------------------------------------------------------------------------- backward


def _step_layout(x: torch.Tensor, cdt: np.dtype, rt: torch.dtype) -> np.ndarray:
    """B or C as complex cdt, time before the state index: (D, N), (batch, L, N) or
    (batch, G, L, N); real input-dependent (re, im) pairs become complex."""
    arr = _weight_view(x, cdt, rt)
    if arr.dtype.kind == "f" and arr.ndim > 2:
        arr = arr.view(cdt)  # (..., 2L) real pairs -> (..., L) complex, zero copy
    arr = arr.astype(cdt, copy=False)
    return np.ascontiguousarray(arr if arr.ndim == 2 else np.swapaxes(arr, -1, -2))


def _weight_grad(acc: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A step-layout complex gradient as the gradient of the tensor `like`."""
    g = acc if acc.ndim == 2 else np.swapaxes(acc, -1, -2)
    if not like.is_complex():
        # a real weight promoted to complex: its gradient is the real part; (re, im)
        # pairs get both parts, interleaved like the input
        g = np.ascontiguousarray(g).view(g.real.dtype) if like.dim() > 2 else g.real
    return torch.from_numpy(np.ascontiguousarray(g)).to(like.dtype)


@functools.lru_cache(maxsize=None)
def _vjp_kernel(spec: ComplexSelectiveVjpSpec):
    """The compiled `@selective_scan_complex_vjp` of `spec` (workloads/selective_complex_vjp.py)."""
    from xdsl.dialects import func

    from scanweaver.ir import print_ir
    from scanweaver.runtime.cpu_scan import kernel
    from scanweaver.workloads.types import kernel_arguments

    module = selective_scan_complex_vjp(spec)
    (fn,) = [op for op in module.body.block.ops if isinstance(op, func.FuncOp)]
    return kernel(print_ir(module), fn.sym_name.data, list(kernel_arguments(fn)))


def _backward_arrays(u, delta, A, B, C, D, z, bias, softplus, dout, dlast, h0, kinds):
    """All gradients as numpy arrays (step layout for B and C) from the compiled VJP,
    channel ranges on threads; D, bias and h0 are arrays (zeros when absent)."""
    batch, Dn, L = u.shape
    N = A.shape[1]
    spec = ComplexSelectiveVjpSpec(N, "f64" if A.dtype == np.complex128 else "f32", kinds[0], kinds[1],
                                   z is not None, bool(softplus), CHUNK)
    k = _vjp_kernel(spec)
    nch = -(-L // CHUNK)
    ckpt = np.empty((batch, Dn, nch, N), A.dtype)
    du, ddelta = np.empty_like(u), np.empty_like(u)
    dA, dD, dbias = np.zeros_like(A), np.zeros_like(D), np.zeros_like(bias)
    dz = np.empty_like(u) if z is not None else None
    dh0 = np.empty((batch, Dn, N), A.dtype)
    threads = num_threads() if batch * Dn * L * N >= (1 << 15) else 1
    # D = 0 still takes one (empty) task, whose zeroed dB / dC buffers the sums below need
    parts = split_range(Dn, min(Dn, 4 * threads) if threads > 1 else 1) or [(0, 0)]
    # dB / dC of shared or grouped B, C sum over channels: one private buffer per task
    private = [kind != "const" for kind in kinds]
    dBC = [[np.zeros_like(M) for _ in parts] if priv else [np.zeros_like(M)] * len(parts)
           for M, priv in zip((B, C), private)]
    tasks = []
    for p, (lo, hi) in enumerate(parts):
        arrays = [u, delta, A, B, C, D, *([z] if z is not None else []), bias, h0, dout, dlast, ckpt,
                  du, ddelta, dA, dBC[0][p], dBC[1][p], dD, *([dz] if z is not None else []), dbias, dh0]
        tasks.append(k.bind(*arrays, lo, hi))
    parallel_for(tasks, threads=threads)
    dB, dC = (sum(acc[1:], acc[0]) if priv else acc[0] for acc, priv in zip(dBC, private))
    return {"u": du, "delta": ddelta, "A": dA, "B": dB, "C": dC}, dD, dz, dbias, dh0


@torch.library.custom_op("scanweaver::complex_selective_scan_bwd", mutates_args=())
def complex_selective_scan_bwd(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: Optional[torch.Tensor], z: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
    delta_softplus: bool, dout: torch.Tensor, dlast: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor, torch.Tensor]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state) in the
    inputs' dtypes (complex ones in the Wirtinger convention); empty tensors for the
    optional inputs that are None."""
    _validate(u, delta, A, B, C, D, z, delta_bias, initial_state)
    _tensor("dout", dout, _REAL)
    _tensor("dlast", dlast, _REAL + _COMPLEX)
    for name, t, shape in (("dout", dout, u.shape), ("dlast", dlast, (*u.shape[:2], A.shape[1]))):
        if tuple(t.shape) != tuple(shape) or t.device.type != "cpu":
            raise ScanWeaverValueError(f"argument '{name}' has shape {tuple(t.shape)} on {t.device}; "
                                       f"expected {tuple(shape)} on the CPU")
    cdt, rdt, rt = _dtypes(A)
    ct = torch.complex128 if cdt == np.complex128 else torch.complex64
    opt = lambda x, t: None if x is None else _view(x, t)  # noqa: E731
    batch, Dn, L = u.shape
    zeros = lambda shape, dtype: np.zeros(shape, dtype)  # noqa: E731
    Dv = _view(D, rt) if D is not None else zeros(Dn, rdt)
    bias = _view(delta_bias, rt) if delta_bias is not None else zeros(Dn, rdt)
    h0 = _view(initial_state, ct) if initial_state is not None else zeros((batch, Dn, A.shape[1]), cdt)
    if L == 0:  # nothing ran: only the initial state has a gradient, dlast itself
        grads = {"u": _view(u, rt), "delta": _view(delta, rt), "A": zeros(A.shape, cdt),
                 "B": np.zeros_like(_step_layout(B, cdt, rt)), "C": np.zeros_like(_step_layout(C, cdt, rt))}
        dD, dz, dbias, dh0 = zeros(Dn, rdt), opt(z, rt), zeros(Dn, rdt), _view(dlast, ct)
    else:
        grads, dD, dz, dbias, dh0 = _backward_arrays(
            _view(u, rt), _view(delta, rt), _view(A, ct), _step_layout(B, cdt, rt), _step_layout(C, cdt, rt),
            Dv, opt(z, rt), bias, bool(delta_softplus), _view(dout, rt), _view(dlast, ct).copy(), h0,
            (_kind(B), _kind(C)),
        )

    def back(g, like):
        if like is None:
            return u.new_empty((0,))
        g = g if like.is_complex() else np.real(g)
        return torch.from_numpy(np.ascontiguousarray(g)).to(like.dtype)

    return (back(grads["u"], u), back(grads["delta"], delta), back(grads["A"], A), _weight_grad(grads["B"], B),
            _weight_grad(grads["C"], C), back(dD, D), back(dz, z), back(dbias, delta_bias), back(dh0, initial_state))


@complex_selective_scan_bwd.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, delta_softplus, dout, dlast, initial_state=None):
    return _checks.selective_backward_like(u, delta, A, B, C, D, z, delta_bias, initial_state)


complex_selective_scan_fwd.register_autograd(
    _checks.selective_backward(torch.ops.scanweaver.complex_selective_scan_bwd), setup_context=_checks.save_selective_inputs
)


# ------------------------------------------------------------------------ public entry


def _tensor(name: str, x, allowed: tuple, optional: bool = False) -> Optional[torch.Tensor]:
    if _checks.dense_tensor(name, x, optional) is None:
        return None
    if x.dtype not in allowed:
        names = ", ".join(str(t).replace("torch.", "") for t in allowed)
        raise ScanWeaverTypeError(f"argument '{name}' has dtype {x.dtype}; with complex A it must be one of {names}")
    return x


def _check_weight(name: str, x: torch.Tensor, batch: int, Dn: int, N: int, L: int) -> None:
    if x.dim() == 2:
        if tuple(x.shape) != (Dn, N):
            raise ScanWeaverValueError(f"argument '{name}' (constant) must have shape (D, N) = {(Dn, N)}, "
                                       f"got {tuple(x.shape)}")
        return
    steps, what = (L, "L") if x.is_complex() else (2 * L, "2L: (re, im) pairs")
    if x.dim() == 3:
        if tuple(x.shape) != (batch, N, steps):
            raise ScanWeaverValueError(f"argument '{name}' must have shape (batch, N, {what}) = "
                                       f"{(batch, N, steps)} with complex A, got {tuple(x.shape)}")
        return
    if x.dim() == 4 and x.shape[0] == batch and x.shape[1] > 0 and Dn % x.shape[1] == 0 \
            and tuple(x.shape[2:]) == (N, steps):
        return
    raise ScanWeaverValueError(f"argument '{name}' must have shape (D, N) = {(Dn, N)}, (batch, N, {what}) = "
                               f"{(batch, N, steps)} or (batch, G, N, {what}) with G dividing D = {Dn}, "
                               f"got {tuple(x.shape)}")


def _validate(u, delta, A, B, C, D, z, delta_bias, initial_state) -> None:
    """One error naming the argument; run by the entry and by both ops (the compiled
    kernels index B and C with u's sizes, so their shapes must agree)."""
    _tensor("u", u, _REAL)
    _tensor("delta", delta, _REAL)
    _tensor("A", A, _COMPLEX)
    _tensor("B", B, _REAL + _COMPLEX)
    _tensor("C", C, _REAL + _COMPLEX)
    _tensor("D", D, _REAL, optional=True)
    _tensor("z", z, _REAL, optional=True)
    _tensor("delta_bias", delta_bias, _REAL, optional=True)
    _tensor("initial_state", initial_state, _REAL + _COMPLEX, optional=True)
    named = {"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias,
             "initial_state": initial_state}
    for n, t in named.items():
        if t is not None and t.device.type != "cpu":
            raise BackendUnavailableError(f"selective_scan_fn with complex A runs on CPU tensors only; "
                                          f"argument '{n}' is on {t.device}")
    if u.dim() != 3:
        raise ScanWeaverValueError(f"argument 'u' must have shape (batch, D, L), got {tuple(u.shape)}")
    batch, Dn, L = u.shape
    want = {"delta": u.shape, "z": u.shape, "D": (Dn,), "delta_bias": (Dn,)}
    for n, shape in want.items():
        if named[n] is not None and tuple(named[n].shape) != tuple(shape):
            raise ScanWeaverValueError(f"argument '{n}' has shape {tuple(named[n].shape)}; expected {tuple(shape)}")
    if A.dim() != 2 or A.shape[0] != Dn:
        raise ScanWeaverValueError(f"argument 'A' must have shape (D, N) = ({Dn}, N), got {tuple(A.shape)}")
    N = A.shape[1]
    if not 1 <= N <= MAX_STATE:
        raise ScanWeaverValueError(f"argument 'A': state size N = {N} is not supported (1..{MAX_STATE})")
    _check_weight("B", B, batch, Dn, N, L)
    _check_weight("C", C, batch, Dn, N, L)
    if initial_state is not None and tuple(initial_state.shape) != (batch, Dn, N):
        raise ScanWeaverValueError(f"argument 'initial_state' has shape {tuple(initial_state.shape)}; "
                                   f"expected {(batch, Dn, N)} (batch, D, N)")


def complex_selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                              return_last_state=False, initial_state=None):
    """`selective_scan_fn` for complex A (module docstring); checks, then the custom op."""
    _validate(u, delta, A, B, C, D, z, delta_bias, initial_state)
    out, last = torch.ops.scanweaver.complex_selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias,
                                                                bool(delta_softplus), initial_state)
    return (out, last) if return_last_state else out
