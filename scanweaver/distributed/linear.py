"""`scanweaver.distributed.linear_scan`: an affine scan whose time axis is split across ranks.

Forward, on every rank: (1) scan the local chunk from a zero state, keeping only its
final state; (2) one all-gather of the per-channel chunk aggregates (`carries.py`);
(3) fold them into this rank's carry-in and rescan the chunk from it.  The rescan is the
sequential loop started from the carry, so within a chunk the association is the
single-process one; only the carry itself is formed from aggregates (in float64).

Backward is the same pattern with carries flowing the other way: the adjoint
`lambda_t = g_t + a_{t+1} lambda_{t+1}` is an affine scan in the opposite direction
whose coefficients are `a` shifted by one step (the step across a rank boundary takes
the neighbour's first `a`, which travelled in the forward all-gather).  Then
`db = lambda`, `da_t = lambda_t h_{t-1}` and `dh0 = a_first lambda_first`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from scanweaver.distributed import carries
from scanweaver.distributed.collectives import all_reduce_sum, require_group
from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError

_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


def linear_scan(a, b, h0=None, reverse=False, dim=-1, group=None, return_final_state=False):
    """Sequence-parallel ``h[t] = a[t] * h[t-1] + b[t]`` along ``dim``.

    Each rank passes its own contiguous chunk of the time axis (chunks in rank order,
    any lengths, empty allowed; every other dimension the same on all ranks) and gets
    its chunk of ``h``.  ``h0`` (shape of ``a`` without ``dim``) is read on the rank
    where the scan starts: rank 0, or the last rank with ``reverse=True``.  With
    ``return_final_state=True`` every rank also gets the state after the whole sequence.
    Differentiable in ``a``, ``b`` and ``h0``; every rank of ``group`` must take part in
    every call and in the backward pass.
    """
    require_group(group)
    a, b, h0 = _checked(a, b, h0, dim)
    dim = dim % a.dim()
    channel_shape = a.shape[:dim] + a.shape[dim + 1:]
    channels = int(np.prod(channel_shape, dtype=np.int64))
    to_2d = lambda x: x.movedim(dim, -1).reshape(channels, x.shape[dim]).contiguous()  # noqa: E731
    h0_1d = None if h0 is None else h0.reshape(-1).contiguous()
    h, final = _DistributedLinearScan.apply(to_2d(a), to_2d(b), h0_1d, bool(reverse), group)
    h = h.reshape(*channel_shape, a.shape[dim]).movedim(-1, dim)
    if return_final_state:
        return h, final.reshape(channel_shape)
    return h


class _DistributedLinearScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, h0, reverse, group):
        h, carry_in, found = scan_across_ranks(a, b, h0, reverse, group, "linear_scan carries")
        ctx.save_for_backward(a, h, torch.from_numpy(carry_in))
        ctx.reverse, ctx.group, ctx.found = reverse, group, found
        ctx.h0_given = h0 is not None
        return h, torch.from_numpy(found.final)

    @staticmethod
    def backward(ctx, g_h, g_final):
        a, h, carry_in = ctx.saved_tensors
        reverse, group, found = ctx.reverse, ctx.group, ctx.found
        g_h = torch.zeros_like(h) if g_h is None else g_h.contiguous()
        g_final = torch.zeros_like(carry_in) if g_final is None else g_final
        # The final state is replicated on every rank: its cotangent is the sum of theirs.
        g_final = all_reduce_sum(g_final, group, "the final-state cotangent")
        shifted = _shifted_coefficients(a, found, reverse, group)
        # Every rank holds the same summed g_final; the adjoint's start rank reads it.
        lam, _, adjoint = scan_across_ranks(
            shifted, g_h, g_final, not reverse, group, "linear_scan adjoint carries"
        )
        db = lam
        prev = _previous_states(h, carry_in, reverse)
        da = lam * prev
        dh0 = None
        if ctx.h0_given:
            start = _start_rank(found.nonempty, reverse)
            if start is None:  # no rank holds a step: h_final = h0
                dh0 = g_final
            else:
                edge = found.last_a[start] if reverse else found.first_a[start]
                edge = torch.from_numpy(np.asarray(edge, dtype=adjoint.final.dtype))
                dh0 = edge * torch.from_numpy(adjoint.final)
            if dist.get_rank(group) != (dist.get_world_size(group) - 1 if reverse else 0):
                dh0 = torch.zeros_like(dh0)  # h0 is read on the start rank only
        return da, db, dh0, None, None


def scan_across_ranks(a, b, h0, reverse, group, what):
    """(h, carry_in, RankCarries) of the chunked scan; `a`, `b` are (channels, L)."""
    a_np, b_np = a.detach().numpy(), b.detach().numpy()
    h0_np = None if h0 is None else h0.detach().numpy()
    zero_start_final = _local_final(a_np, b_np, reverse)
    rank = dist.get_rank(group)
    start = dist.get_world_size(group) - 1 if reverse else 0
    block = carries.chunk_aggregate(a_np, zero_start_final, h0_np if rank == start else None)
    gathered = carries.gather_aggregates(block, group, what)
    found = carries.fold_carries(gathered, rank, reverse, a_np.dtype)
    h = _local_scan(a_np, b_np, found.carry_in, reverse)
    return torch.from_numpy(h), found.carry_in, found


def _local_final(a: np.ndarray, b: np.ndarray, reverse: bool) -> np.ndarray:
    """The chunk's final state from a zero start.  An explicit zero `h0` means the
    same as none (the sequential loop starts from 0) and reuses the rescan's kernel."""
    zero = np.zeros(a.shape[0], dtype=a.dtype)
    if a.shape[1] == 0:
        return zero
    import scanweaver

    _, final = scanweaver.linear_scan(
        a, b, zero, reverse=reverse, backend="cpu", return_final_state=True
    )
    return final


def _local_scan(a: np.ndarray, b: np.ndarray, h0: np.ndarray, reverse: bool) -> np.ndarray:
    if a.shape[1] == 0:
        return np.zeros_like(a)
    import scanweaver

    return scanweaver.linear_scan(a, b, h0, reverse=reverse, backend="cpu")


def _shifted_coefficients(a, found, reverse, group):
    """The adjoint's coefficients: a[t+1] (forward) or a[t-1] (reverse), taking the
    neighbour's edge `a` across a rank boundary and 1 past the end of the sequence."""
    rank = dist.get_rank(group)
    world = found.nonempty.shape[0]
    shifted = torch.ones_like(a)
    if a.shape[1] == 0:
        return shifted
    if reverse:
        shifted[:, 1:] = a[:, :-1]
        left = [r for r in range(rank - 1, -1, -1) if found.nonempty[r]]
        if left:
            shifted[:, 0] = torch.from_numpy(found.last_a[left[0]].astype(a.numpy().dtype))
    else:
        shifted[:, :-1] = a[:, 1:]
        right = [r for r in range(rank + 1, world) if found.nonempty[r]]
        if right:
            shifted[:, -1] = torch.from_numpy(found.first_a[right[0]].astype(a.numpy().dtype))
    return shifted


def _previous_states(h, carry_in, reverse):
    """h[t-1] for every local t (h[t+1] for reverse), the carry-in at the chunk edge."""
    prev = torch.empty_like(h)
    if h.shape[1] == 0:
        return prev
    if reverse:
        prev[:, :-1] = h[:, 1:]
        prev[:, -1] = carry_in
    else:
        prev[:, 1:] = h[:, :-1]
        prev[:, 0] = carry_in
    return prev


def _start_rank(nonempty: np.ndarray, reverse: bool):
    ranks = np.flatnonzero(nonempty)
    if ranks.size == 0:
        return None
    return int(ranks[-1] if reverse else ranks[0])


def _checked(a, b, h0, dim):
    for name, x in (("a", a), ("b", b)):
        if not isinstance(x, torch.Tensor):
            raise ScanWeaverTypeError(f"argument '{name}' must be a torch.Tensor, got {type(x).__name__}")
    if a.dtype not in _DTYPES:
        raise ScanWeaverTypeError(
            f"argument 'a' has dtype {a.dtype}; expected one of "
            f"{', '.join(str(t) for t in _DTYPES)}"
        )
    if b.dtype != a.dtype:
        raise ScanWeaverTypeError(f"arguments 'a' ({a.dtype}) and 'b' ({b.dtype}) must have the same dtype")
    if b.shape != a.shape:
        raise ScanWeaverValueError(f"argument 'b' has shape {tuple(b.shape)}; expected {tuple(a.shape)} (the shape of 'a')")
    if a.dim() == 0:
        raise ScanWeaverValueError("arguments 'a' and 'b' must have at least one dimension")
    if not isinstance(dim, int) or not -a.dim() <= dim < a.dim():
        raise ScanWeaverValueError(f"dim {dim!r} is out of range for {a.dim()}-dimensional inputs")
    if a.device.type != "cpu" or b.device.type != "cpu":
        raise ScanWeaverValueError(
            "scanweaver.distributed runs CPU tensors (gloo) for now; got "
            f"'a' on {a.device} and 'b' on {b.device}"
        )
    if h0 is not None:
        if not isinstance(h0, torch.Tensor):
            h0 = torch.as_tensor(h0, dtype=a.dtype)
        want = a.shape[: dim % a.dim()] + a.shape[dim % a.dim() + 1:]
        if h0.shape != want:
            raise ScanWeaverValueError(
                f"argument 'h0' has shape {tuple(h0.shape)}; expected {tuple(want)} ('a' without dim {dim})"
            )
        if h0.dtype != a.dtype:
            raise ScanWeaverTypeError(f"argument 'h0' has dtype {h0.dtype}; expected {a.dtype} like 'a'")
        if h0.device != a.device:
            raise ScanWeaverValueError(f"argument 'h0' is on {h0.device}, 'a' on {a.device}")
    if (a.requires_grad or b.requires_grad or (h0 is not None and h0.requires_grad)) and not a.is_floating_point():
        raise ScanWeaverTypeError("gradients need floating-point 'a', 'b' and 'h0'")
    return a, b, h0
