"""`linear_scan`: h[t] = a[t] * h[t-1] + b[t] along one dimension, as a PyTorch operator.

  scanweaver::linear_scan_fwd   the compiled scan.affine kernel (CPU JIT; GPU kernels on CUDA)
  scanweaver::linear_scan_bwd   its compiled VJP (`scanweaver-grad`: a reverse scan.affine;
                                on CUDA tensors the GPU form, `runtime/cuda_vjp.py`)

Both take (channels, L) tensors; `linear_scan` moves `dim` last and flattens the others.
"""

from __future__ import annotations

import numpy as np
import torch

from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cpu_scan import num_threads, parallel_for, split_range
from scanweaver.torch import _checks
from scanweaver.torch import _kernels

_EL = {torch.float32: "f32", torch.float64: "f64"}


def _require_cuda(what: str) -> None:
    from scanweaver.runtime.cuda import cuda_available, why_no_cuda

    if not cuda_available():
        raise BackendUnavailableError(f"linear_scan {what} on CUDA tensors: the CUDA runtime is not usable here: "
                                      f"{why_no_cuda()}")


def _forward_cuda(a, b, h0, reverse):
    """The GPU scan.affine kernels (`runtime/cuda_scan.py`), on the tensors in place."""
    _require_cuda("forward")
    from scanweaver.runtime.cuda_scan import linear_scan_cuda

    a, b, h0 = (_checks.device_aligned(x.contiguous()) for x in (a, b, h0))
    with torch.cuda.device(a.device):
        return linear_scan_cuda(a, b, h0, -1, bool(reverse), False)


def _backward_cuda(a, b, h0, reverse, dh):
    """The compiled VJP on the GPU (`runtime/cuda_vjp.py`): the recomputing and the
    reverse scan.affine run the forward's parallel-in-time kernels, the loops between
    them one thread per element / per row."""
    _require_cuda("backward")
    from scanweaver.runtime.cuda_vjp import linear_scan_vjp_cuda

    a, b, h0 = (_checks.device_aligned(x.contiguous()) for x in (a, b, h0))
    da, db, dh0 = torch.zeros_like(a), torch.zeros_like(b), torch.zeros_like(h0)
    arrays = [a, b, h0, torch.empty_like(a), da, db, dh0, dh.detach().contiguous().clone()]  # dh: consumed
    with torch.cuda.device(a.device):
        linear_scan_vjp_cuda(arrays, _EL[a.dtype], bool(reverse))
    return da, db, dh0


def _rows(C: int, L: int) -> list[tuple[int, int]]:
    threads = num_threads() if C * L >= (1 << 16) else 1
    return split_range(C, min(C, threads * 4))


@torch.library.custom_op("scanweaver::linear_scan_fwd", mutates_args=())
def linear_scan_fwd(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, reverse: bool) -> torch.Tensor:
    """a, b: (C, L); h0: (C,).  Returns h (C, L)."""
    if a.device.type == "cuda":
        return _forward_cuda(a, b, h0, reverse)
    el = _EL[a.dtype]
    k = _kernels.affine_forward(el, bool(reverse))
    dt = np.dtype(np.float64 if el == "f64" else np.float32)
    av, bv, hv = (_checks.view(x, dt) for x in (a, b, h0))
    h = np.empty(av.shape, dt)
    parallel_for([k.bind(av[lo:hi], bv[lo:hi], hv[lo:hi], h[lo:hi]) for lo, hi in _rows(*av.shape)])
    return torch.from_numpy(h)


@linear_scan_fwd.register_fake
def _(a, b, h0, reverse):
    return torch.empty_like(a)


@torch.library.custom_op("scanweaver::linear_scan_bwd", mutates_args=())
def linear_scan_bwd(
    a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, reverse: bool, dh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da, db, dh0) from the cotangent dh of h."""
    if a.device.type == "cuda":
        return _backward_cuda(a, b, h0, reverse, dh)
    el = _EL[a.dtype]
    k = _kernels.affine_vjp(el, bool(reverse))
    dt = np.dtype(np.float64 if el == "f64" else np.float32)
    av, bv, hv = (_checks.view(x, dt) for x in (a, b, h0))
    g = _checks.view(dh, dt).copy()  # consumed by the VJP
    h = np.empty(av.shape, dt)  # the VJP recomputes h here
    da, db, dh0 = np.zeros_like(av), np.zeros_like(bv), np.zeros_like(hv)
    tasks = [k.bind(av[lo:hi], bv[lo:hi], hv[lo:hi], h[lo:hi], da[lo:hi], db[lo:hi], dh0[lo:hi], g[lo:hi])
             for lo, hi in _rows(*av.shape)]
    parallel_for(tasks)
    return torch.from_numpy(da), torch.from_numpy(db), torch.from_numpy(dh0)


@linear_scan_bwd.register_fake
def _(a, b, h0, reverse, dh):
    return torch.empty_like(a), torch.empty_like(b), torch.empty_like(h0)


def _setup_context(ctx, inputs, output):
    a, b, h0, reverse = inputs
    ctx.save_for_backward(a, b, h0)
    ctx.reverse = reverse


def _backward(ctx, dh):
    a, b, h0 = ctx.saved_tensors
    da, db, dh0 = torch.ops.scanweaver.linear_scan_bwd(a, b, h0, ctx.reverse, dh.contiguous())
    need = ctx.needs_input_grad
    return (da if need[0] else None, db if need[1] else None, dh0 if need[2] else None, None)


linear_scan_fwd.register_autograd(_backward, setup_context=_setup_context)


def linear_scan(a, b, h0=None, reverse=False, dim=-1):
    """h[t] = a[t] * h[t-1] + b[t] along `dim` (h[-1] = h0, zeros when None), differentiable.

    a, b: tensors of one shape and dtype (float32 or float64); h0: the shape of `a`
    without `dim`.  reverse: t runs from the end of `dim` (h[t] = a[t] * h[t+1] + b[t]).
    Returns h, of a's shape and dtype.  Complex a or b (complex64/complex128, a real
    one promoted): torch/complex_linear.py, gradients in PyTorch's Wirtinger convention.
    """
    if any(isinstance(x, torch.Tensor) and x.is_complex() for x in (a, b, h0)):
        from scanweaver.torch.complex_linear import complex_linear_scan

        return complex_linear_scan(a, b, h0, reverse, dim)
    a, b = _checks.tensor("a", a), _checks.tensor("b", b)
    h0 = _checks.tensor("h0", h0, optional=True)
    _checks.same_device({"a": a, "b": b, "h0": h0})
    for name, x in (("a", a), ("b", b), ("h0", h0)):
        if x is not None and x.dtype not in _EL:
            raise ScanWeaverTypeError(f"argument '{name}' has dtype {x.dtype}; linear_scan takes float32 or float64")
    if b.dtype != a.dtype or (h0 is not None and h0.dtype != a.dtype):
        raise ScanWeaverTypeError(
            f"arguments 'a' ({a.dtype}), 'b' ({b.dtype})"
            + (f" and 'h0' ({h0.dtype})" if h0 is not None else "") + " must have one dtype")
    _checks.shape("b", b, a.shape, "the shape of 'a'")
    dim = _checks.scan_dim(dim, a.dim())
    reverse = _checks.flag("reverse", reverse)
    channels = a.shape[:dim] + a.shape[dim + 1:]
    _checks.shape("h0", h0, channels, f"'a' without dim {dim}")
    L = a.shape[dim]
    a2, b2 = _checks.rows(a, dim), _checks.rows(b, dim)
    h02 = h0.reshape(-1) if h0 is not None else a.new_zeros(a2.shape[0])
    h = torch.ops.scanweaver.linear_scan_fwd(a2, b2, h02, reverse)
    return h.reshape(*channels, L).movedim(-1, dim)
