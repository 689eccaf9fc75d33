"""The differentiable collectives of the sequence-parallel scans (gloo and NCCL).

`torch.distributed.nn`'s all-gather differentiates through reduce-scatter, which gloo
lacks; this one differentiates through one all-reduce, which every backend has.
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from scanweaver.errors import ScanWeaverError


_recorded: list[dict] | None = None


@contextlib.contextmanager
def record_collectives():
    """Collect (what, bytes received, seconds) of every collective run inside the block
    (the benchmark's communication figures)."""
    global _recorded
    outer, _recorded = _recorded, []
    try:
        yield _recorded
    finally:
        _recorded = outer


def require_group(group) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise ScanWeaverError(
            "scanweaver.distributed needs an initialised process group: call "
            "torch.distributed.init_process_group(...) on every rank first"
        )


def all_gather(x: torch.Tensor, group, what: str) -> torch.Tensor:
    """(world, *x.shape): every rank's `x`, differentiable.  Every rank must call it, and
    every rank that calls it must run its backward (see `depend_on`)."""
    return _AllGather.apply(x.contiguous(), group, what)


def all_reduce_sum(x: torch.Tensor, group, what: str) -> torch.Tensor:
    out = x.detach().clone().contiguous()
    run_collective(lambda: dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group), group, what,
                   out.numel() * out.element_size())
    return out


def depend_on(out: torch.Tensor, gathered: torch.Tensor) -> torch.Tensor:
    """`out` unchanged, but with `gathered` in its autograd graph.

    A rank whose outputs do not depend on the gathered carries (rank 0: its carry-in is
    zero) must still run the gather's backward all-reduce, or the other ranks would wait
    for it forever."""
    if not (torch.is_grad_enabled() and gathered.requires_grad):
        return out
    return _DependOn.apply(out, gathered)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, what):
        world = dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(world)]
        run_collective(lambda: dist.all_gather(parts, x, group=group), group, what,
                       world * x.numel() * x.element_size())
        ctx.group, ctx.what = group, what
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        # Rank r's block went to every rank: its gradient is the sum of theirs.
        total = all_reduce_sum(grad, ctx.group, f"gradients of {ctx.what}")
        return total[dist.get_rank(ctx.group)], None, None


class _DependOn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, gathered):
        ctx.shape, ctx.dtype, ctx.device = gathered.shape, gathered.dtype, gathered.device
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.zeros(ctx.shape, dtype=ctx.dtype, device=ctx.device)


def run_collective(collective, group, what: str, nbytes: int = 0) -> None:
    """Run one collective; a failure becomes one error naming it, the rank and the group
    size.  `nbytes`: the bytes this rank receives (recorded for the benchmark)."""
    start = time.perf_counter()
    try:
        collective()
    except Exception as e:  # noqa: BLE001 - any backend failure ends the call on this rank
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        raise ScanWeaverError(
            f"scanweaver.distributed: the collective for {what} failed on rank {rank} of "
            f"{world} (a peer rank failed, left, or timed out): {e}"
        ) from None
    if _recorded is not None:
        _recorded.append({"what": what, "bytes": nbytes, "seconds": time.perf_counter() - start})
