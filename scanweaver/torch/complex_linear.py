"""`linear_scan` on complex tensors (complex64 / complex128), differentiable with
PyTorch's complex autograd convention (conjugate Wirtinger: for w = f(z) holomorphic,
grad_z = grad_w * conj(f'(z))).

  scanweaver::complex_linear_scan_fwd   the compiled complex scan.affine kernel
  scanweaver::complex_linear_scan_bwd   its VJP: one compiled reverse complex scan

For h_t = a_t h_{t-1} + b_t (t = 0..L-1, h_{-1} = h0) with cotangent g of h:

    lam_t   = g_t + conj(a_{t+1}) lam_{t+1}       (lam_{L-1} = g_{L-1}; a reverse scan)
    grad b_t = lam_t
    grad a_t = lam_t * conj(h_{t-1})
    grad h0  = conj(a_0) * lam_0

`reverse=True` is the same with time flipped.  Both ops take (channels, L) tensors.
"""

from __future__ import annotations

import numpy as np
import torch

from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.torch import _checks

_COMPLEX = (torch.complex64, torch.complex128)


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().contiguous().numpy()


def _scan(a: np.ndarray, b: np.ndarray, h0: np.ndarray, reverse: bool) -> np.ndarray:
    from scanweaver.runtime.cpu_complex import complex_scan_cpu

    return complex_scan_cpu(a, b, h0, 1, reverse)[0]


@torch.library.custom_op("scanweaver::complex_linear_scan_fwd", mutates_args=())
def complex_linear_scan_fwd(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, reverse: bool) -> torch.Tensor:
    """a, b: (C, L) complex; h0: (C,).  Returns h (C, L)."""
    if a.device.type == "cuda":
        raise BackendUnavailableError("complex linear_scan on CUDA tensors is not available (CPU only)")
    return torch.from_numpy(_scan(_np(a), _np(b), _np(h0), bool(reverse)))


@complex_linear_scan_fwd.register_fake
def _(a, b, h0, reverse):
    return torch.empty_like(a)


@torch.library.custom_op("scanweaver::complex_linear_scan_bwd", mutates_args=())
def complex_linear_scan_bwd(
    a: torch.Tensor, h: torch.Tensor, h0: torch.Tensor, reverse: bool, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad a, grad b, grad h0) from the cotangent g of h (h: the forward's output)."""
    av, hv, h0v, gv = _np(a), _np(h), _np(h0), _np(g)
    if reverse:  # time flipped: the same rules on the flipped arrays
        av, hv, gv = av[:, ::-1], hv[:, ::-1], gv[:, ::-1]
    shifted = np.zeros_like(av)
    shifted[:, :-1] = np.conj(av[:, 1:])  # lam_t gets conj(a_{t+1}) lam_{t+1}
    lam = _scan(np.ascontiguousarray(shifted), np.ascontiguousarray(gv), None, True)
    prev = np.concatenate([h0v[:, None], hv[:, :-1]], axis=1)  # h_{t-1}
    da = lam * np.conj(prev)
    dh0 = np.conj(av[:, 0]) * lam[:, 0] if av.shape[1] else np.zeros_like(h0v)
    db = lam
    if reverse:
        da, db = da[:, ::-1], db[:, ::-1]
    return (torch.from_numpy(np.ascontiguousarray(da)), torch.from_numpy(np.ascontiguousarray(db)),
            torch.from_numpy(np.ascontiguousarray(dh0)))


@complex_linear_scan_bwd.register_fake
def _(a, h, h0, reverse, g):
    return torch.empty_like(a), torch.empty_like(a), torch.empty_like(h0)


def _setup_context(ctx, inputs, output):
    a, _b, h0, reverse = inputs
    ctx.save_for_backward(a, output, h0)
    ctx.reverse = reverse


def _backward(ctx, g):
    a, h, h0 = ctx.saved_tensors
    da, db, dh0 = torch.ops.scanweaver.complex_linear_scan_bwd(a, h, h0, ctx.reverse, g.contiguous())
    need = ctx.needs_input_grad
    return (da if need[0] else None, db if need[1] else None, dh0 if need[2] else None, None)


complex_linear_scan_fwd.register_autograd(_backward, setup_context=_setup_context)


def complex_linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None, reverse: bool, dim: int):
    """`linear_scan` for complex tensors: a real a or b is promoted to the other's complex
    dtype (torch's rules, as numpy's), h0 may be real or complex."""
    a, b = _checks.dense_tensor("a", a), _checks.dense_tensor("b", b)
    h0 = _checks.dense_tensor("h0", h0, optional=True)
    _checks.same_device({"a": a, "b": b, "h0": h0})
    for name, x in (("a", a), ("b", b), ("h0", h0)):
        if x is not None and not (x.is_complex() or x.is_floating_point()):
            raise ScanWeaverTypeError(f"argument '{name}' has dtype {x.dtype}; a complex linear_scan takes "
                                      "complex64, complex128 or real floating-point tensors")
    dtype = torch.promote_types(a.dtype, b.dtype)
    if dtype not in _COMPLEX:
        raise ScanWeaverTypeError(f"arguments 'a' ({a.dtype}) and 'b' ({b.dtype}) give {dtype}, not complex")
    a, b = a.to(dtype), b.to(dtype)
    if b.shape != a.shape:
        raise ScanWeaverValueError(f"argument 'b' has shape {tuple(b.shape)}; expected {tuple(a.shape)} (the shape of 'a')")
    dim = _checks.scan_dim(dim, a.dim())
    reverse = _checks.flag("reverse", reverse)
    channels = a.shape[:dim] + a.shape[dim + 1:]
    L = a.shape[dim]
    if h0 is not None:
        if tuple(h0.shape) != tuple(channels):
            raise ScanWeaverValueError(f"argument 'h0' has shape {tuple(h0.shape)}; expected {tuple(channels)} "
                                       f"('a' without dim {dim})")
        if torch.promote_types(h0.dtype, dtype) != dtype:
            raise ScanWeaverTypeError(f"argument 'h0' has dtype {h0.dtype}, which does not fit {dtype} without loss")
        h0 = h0.to(dtype)
    a2, b2 = _checks.rows(a, dim), _checks.rows(b, dim)
    h02 = h0.reshape(-1) if h0 is not None else a.new_zeros(a2.shape[0])
    h = torch.ops.scanweaver.complex_linear_scan_fwd(a2, b2, h02, reverse)
    return h.reshape(*channels, L).movedim(-1, dim)
