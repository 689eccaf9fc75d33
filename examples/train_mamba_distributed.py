"""The tiny Mamba of train_mamba_tiny.py trained with its sequence split across ranks.

Every rank holds one contiguous chunk of each training sequence (context parallelism).
Per-token layers run locally; the causal depthwise conv takes its left halo (the last
d_conv - 1 steps before the chunk) from the ranks before it, and the selective scan runs
through `scanweaver.distributed.selective_scan_fn`, whose only communication is the
per-(batch, channel, state) chunk carries.  Gradients of the replicated weights are
summed over ranks (what DistributedDataParallel does).  Each step is checked against the
same model run on the whole sequence in one process (with the plain PyTorch reference
scan and autograd): losses and gradients must match.

    torchrun --nproc-per-node 2 examples/train_mamba_distributed.py [--steps 20]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import scanweaver.distributed as sd
from scanweaver.distributed.collectives import all_gather, depend_on

_HERE = os.path.dirname(os.path.abspath(__file__))


def _tiny():
    """train_mamba_tiny.py, the single-process model and task (loaded by path)."""
    spec = importlib.util.spec_from_file_location("train_mamba_tiny", os.path.join(_HERE, "train_mamba_tiny.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("train_mamba_tiny", module)
    spec.loader.exec_module(module)
    return module


def chunk_bounds(length: int, rank: int, world: int) -> tuple[int, int]:
    base, extra = divmod(length, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (rank < extra)


def left_halo(x: torch.Tensor, width: int, group=None) -> torch.Tensor:
    """The `width` steps of the global sequence just before this rank's chunk of `x`
    (batch, C, L_r), zeros before the sequence start; differentiable."""
    batch, channels, length = x.shape
    tail = x[..., max(0, length - width):]
    padded = F.pad(tail, (width - tail.shape[-1], 0))
    counts = torch.tensor([min(length, width)], dtype=x.dtype)
    tails = all_gather(padded, group, "conv halos")
    lengths = all_gather(counts, group, "conv halo lengths").detach().long().flatten().tolist()
    rank = dist.get_rank(group)
    pieces = [tails[r][..., width - lengths[r]:] for r in range(rank)]
    before = torch.cat([x.new_zeros(batch, channels, width), *pieces], dim=-1)
    # rank 0 reads no halo but must still run the gather's backward all-reduce
    return depend_on(before[..., -width:], tails)


def sharded_block_forward(block, h, group=None):
    """MambaBlock.forward on this rank's chunk of the sequence."""
    L = h.shape[1]
    x, z = block.in_proj(block.norm(h)).chunk(2, dim=-1)
    x = x.transpose(1, 2)
    k = block.conv.kernel_size[0]
    with_halo = torch.cat([left_halo(x, k - 1, group), x], dim=-1)
    x = F.silu(F.conv1d(with_halo, block.conv.weight, block.conv.bias, groups=block.conv.groups))
    dt, B, C = block.x_proj(x.transpose(1, 2)).split([block.dt_rank, block.d_state, block.d_state], dim=-1)
    delta = (dt @ block.dt_proj.weight.t()).transpose(1, 2)
    y = sd.selective_scan_fn(x.contiguous(), delta.contiguous(), -torch.exp(block.A_log),
                             B.transpose(1, 2).contiguous(), C.transpose(1, 2).contiguous(),
                             D=block.D, z=z.transpose(1, 2).contiguous(), delta_bias=block.dt_proj.bias,
                             delta_softplus=True, group=group)
    return h + block.out_proj(y.transpose(1, 2))


def sharded_loss(model, tokens, target, total_tokens, group=None):
    """This rank's share of the global mean cross-entropy (the shares add up to it)."""
    h = model.embed(tokens)
    for block in model.blocks:
        h = sharded_block_forward(block, h, group)
    logits = model.head(model.norm(h))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="sum") / total_tokens


def sum_gradients(model, group=None) -> None:
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, group=group)


def compare(steps=20, batch=4, length=24, vocab=12, d_model=16, layers=2, d_state=8, delay=3, seed=0,
            lr=3e-3, group=None, log=print):
    """Train `steps` steps split across the ranks and in one process from the same
    weights and batches; returns (max loss difference, max relative gradient difference)."""
    tiny = _tiny()
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    lo, hi = chunk_bounds(length, rank, world)
    torch.manual_seed(seed)
    sharded = tiny.TinyMamba(vocab, d_model, layers, d_state)
    single = copy.deepcopy(sharded)
    single.use_scan(tiny.selective_scan_ref)  # the whole sequence, plain PyTorch + autograd
    opt_sharded = torch.optim.Adam(sharded.parameters(), lr=lr)
    opt_single = torch.optim.Adam(single.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    worst_loss = worst_grad = 0.0
    for step in range(steps):
        tokens, target = tiny.delayed_copy_batch(gen, batch, length, vocab, delay)
        loss_single = F.cross_entropy(single(tokens).reshape(-1, vocab), target.reshape(-1))
        opt_single.zero_grad()
        loss_single.backward()

        share = sharded_loss(sharded, tokens[:, lo:hi], target[:, lo:hi], batch * length, group)
        opt_sharded.zero_grad()
        share.backward()
        sum_gradients(sharded, group)
        loss_sharded = share.detach().clone()
        dist.all_reduce(loss_sharded, group=group)

        diff = abs(loss_sharded.item() - loss_single.item())
        grad_diff = max(
            float((p.grad - q.grad).abs().max() / q.grad.abs().max().clamp_min(1e-30))
            for p, q in zip(sharded.parameters(), single.parameters())
        )
        worst_loss, worst_grad = max(worst_loss, diff), max(worst_grad, grad_diff)
        if rank == 0:
            log(f"step {step:3d}  loss split over {world} ranks {loss_sharded.item():.6f}  "
                f"one process {loss_single.item():.6f}  |diff| {diff:.1e}  max rel grad diff {grad_diff:.1e}")
        opt_sharded.step()
        opt_single.step()
    if rank == 0:
        log(f"max |loss diff| {worst_loss:.2e}, max relative gradient difference {worst_grad:.2e} "
            f"over {steps} steps")
    return worst_loss, worst_grad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--length", type=int, default=24)
    a = p.parse_args()
    dist.init_process_group("gloo")  # torchrun sets the rendezvous environment
    try:
        loss_diff, grad_diff = compare(steps=a.steps, length=a.length)
        ok = loss_diff <= 1e-5 and grad_diff <= 1e-4
        if dist.get_rank() == 0:
            print("losses and gradients match the single-process run" if ok else "MISMATCH")
    finally:
        dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
