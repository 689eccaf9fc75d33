"""Plain PyTorch references (loops over time): the oracles of the tests and the example."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _at_step(M: torch.Tensor, t: int, dim: int) -> torch.Tensor:
    """B or C at step t, as (batch or 1, D, N)."""
    if M.dim() == 2:
        return M.unsqueeze(0)
    if M.dim() == 3:
        return M[:, :, t].unsqueeze(1)
    return M[:, :, :, t].repeat_interleave(dim // M.shape[1], dim=1)


def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                       return_last_state=False, initial_state=None):
    """shared/DESIGN.md section 2 with torch ops, one step at a time (autograd-friendly)."""
    dtype_in = u.dtype
    ct = torch.float64 if u.dtype == torch.float64 else torch.float32
    u, delta, A, B, C = (x.to(ct) for x in (u, delta, A, B, C))
    dt = delta + delta_bias.to(ct)[None, :, None] if delta_bias is not None else delta
    if delta_softplus:
        dt = F.softplus(dt)
    batch, dim, L = u.shape
    h = u.new_zeros((batch, dim, A.shape[1])) if initial_state is None else initial_state.to(ct)
    ys = []
    for t in range(L):
        d = dt[:, :, t, None]
        h = torch.exp(d * A[None]) * h + d * _at_step(B, t, dim) * u[:, :, t, None]
        ys.append((h * _at_step(C, t, dim)).sum(-1))
    out = torch.stack(ys, dim=-1)
    if D is not None:
        out = out + D.to(ct)[None, :, None] * u
    if z is not None:
        out = out * F.silu(z.to(ct))
    out = out.to(dtype_in)
    return (out, h) if return_last_state else out


def linear_scan_ref(a, b, h0=None, reverse=False, dim=-1):
    a, b = a.movedim(dim, -1), b.movedim(dim, -1)
    h = torch.zeros_like(a[..., 0]) if h0 is None else h0
    steps = range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1])
    out = [None] * a.shape[-1]
    for t in steps:
        h = a[..., t] * h + b[..., t]
        out[t] = h
    return torch.stack(out, dim=-1).movedim(-1, dim)
