"""`scanweaver.distributed.selective_scan_fn`: Mamba's selective scan with the time axis
split across ranks.

Per rank: (1) the local selective scan from a zero state (`scanweaver.torch`, its
compiler-derived backward included), returning `y0 = C . h0_t` and the chunk's final
state `B_r`; (2) one differentiable all-gather of `(A_r, B_r)`, `A_r = prod_t exp(dt_t A)
= exp(A * sum_t dt_t)` per (batch, D, N); (3) the carry-in `c = fold(A, B)` over the
ranks before this one, and since the consumer is linear in `h`, the output correction
`y = y0 + sum_n C[n, t] * exp(A[d, n] * cumsum(dt)[t]) * c[n]`, computed one state
index at a time under activation checkpointing (memory O(batch x D x L), never
x N); (4) `D` skip and `z` gating on the corrected `y`.  Autograd differentiates all of
it; the collectives' backward is one all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from scanweaver.distributed.collectives import all_gather, depend_on, require_group
from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError


def selective_scan_fn(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False, group=None,
):
    """`scanweaver.torch.selective_scan_fn` on this rank's time chunk of a sequence split
    across the ranks of `group` (in rank order; any chunk lengths, empty allowed).

    u, delta, z and time-varying B, C hold this rank's chunk `(batch, ..., L_r)`;
    A, D, delta_bias and constant B, C are the same on every rank.  With
    `return_last_state`, every rank also gets the state after the whole sequence.
    Every rank of `group` must make the same calls, forward and backward.
    """
    import torch.distributed as dist

    from scanweaver.torch import selective_scan_fn as local_scan

    require_group(group)
    _check_chunk(u, delta, A, B, C)
    math_dtype = torch.float64 if u.dtype == torch.float64 else torch.float32
    batch, channels, length = u.shape
    n_state = A.shape[1]
    if length:
        # D and z act on the corrected y: leave them out of the local scan.
        y0, b_r = local_scan(
            u.to(math_dtype), delta.to(math_dtype), A, B, C, None, None, delta_bias,
            delta_softplus, return_last_state=True,
        )
        y0, b_r = y0.to(math_dtype), b_r.to(math_dtype)
    else:
        y0 = u.new_zeros((batch, channels, 0), dtype=math_dtype)
        b_r = u.new_zeros((batch, channels, n_state), dtype=math_dtype)
    dt = _discretised_step(delta, delta_bias, delta_softplus, math_dtype)
    elapsed = torch.cumsum(dt, dim=-1)  # (batch, D, L)
    total = elapsed[..., -1] if length else dt.new_zeros((batch, channels))
    a_r = torch.exp(A.to(math_dtype)[None] * total[..., None])  # (batch, D, N)
    gathered = all_gather(torch.stack([a_r, b_r]), group, "selective_scan carries")
    rank = dist.get_rank(group)
    carry = torch.zeros_like(b_r)
    for r in range(rank):
        carry = gathered[r, 0] * carry + gathered[r, 1]
    y = y0
    if length and rank > 0:
        y = y0 + _carry_correction(C, A.to(math_dtype), elapsed, carry, channels)
    out = y
    if D is not None:
        out = out + D.to(math_dtype)[None, :, None] * u.to(math_dtype)
    if z is not None:
        out = out * F.silu(z.to(math_dtype))
    out = depend_on(out, gathered).to(u.dtype)
    if not return_last_state:
        return out
    final = carry
    for r in range(rank, dist.get_world_size(group)):
        final = gathered[r, 0] * final + gathered[r, 1]
    return out, final


def _discretised_step(delta, delta_bias, delta_softplus, dtype):
    dt = delta.to(dtype)
    if delta_bias is not None:
        dt = dt + delta_bias.to(dtype)[None, :, None]
    if delta_softplus:
        dt = F.softplus(dt, beta=1.0, threshold=20.0)  # log1p(exp(x)), x above 20
    return dt


def _carry_correction(C, A, elapsed, carry, channels):
    """sum_n C[., n, t] * exp(A[d, n] * elapsed[b, d, t]) * carry[b, d, n]."""
    corr = torch.zeros_like(elapsed)
    for n in range(A.shape[1]):
        c_n = _c_at_state(C, n, channels).to(elapsed.dtype)
        corr = corr + checkpoint(_correction_term, c_n, A[:, n], elapsed, carry[..., n],
                                 use_reentrant=False)
    return corr


def _correction_term(c_n, a_n, elapsed, carry_n):
    return c_n * torch.exp(a_n[None, :, None] * elapsed) * carry_n[..., None]


def _c_at_state(C, n, channels):
    """C's values at state index n, broadcastable to (batch, D, L)."""
    if C.dim() == 2:  # (D, N)
        return C[:, n][None, :, None]
    if C.dim() == 3:  # (batch, N, L), shared by every channel
        return C[:, n, :][:, None, :]
    groups = C.shape[1]  # (batch, G, N, L): channel d reads group d // (D / G)
    return C[:, :, n, :].repeat_interleave(channels // groups, dim=1)


def _check_chunk(u, delta, A, B, C):
    for name, x in (("u", u), ("delta", delta), ("A", A), ("B", B), ("C", C)):
        if not isinstance(x, torch.Tensor):
            raise ScanWeaverTypeError(f"argument '{name}' must be a torch.Tensor, got {type(x).__name__}")
    if u.dim() != 3:
        raise ScanWeaverValueError(f"argument 'u' must have shape (batch, D, L), got {tuple(u.shape)}")
    if delta.shape != u.shape:
        raise ScanWeaverValueError(f"argument 'delta' has shape {tuple(delta.shape)}; expected {tuple(u.shape)} like 'u'")
    if A.dim() != 2 or A.shape[0] != u.shape[1]:
        raise ScanWeaverValueError(f"argument 'A' must have shape (D, N) = ({u.shape[1]}, N), got {tuple(A.shape)}")
    if A.is_complex():
        raise ScanWeaverTypeError("argument 'A': complex A is not supported by scanweaver.distributed")
    for name, x in (("B", B), ("C", C)):
        if x.dim() >= 3 and x.shape[-1] != u.shape[-1]:
            raise ScanWeaverValueError(
                f"argument '{name}' has {x.shape[-1]} steps; expected this rank's chunk length "
                f"{u.shape[-1]} like 'u'"
            )
