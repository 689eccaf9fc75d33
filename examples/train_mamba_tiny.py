"""Train a tiny Mamba-style model on the CPU with ScanWeaver's selective_scan_fn.

The model: token embedding, a few blocks of (RMS norm, in-projection to x and z, causal
depthwise conv over time, SiLU, projections to dt / B / C, selective scan with D, z
gating, delta_bias and softplus, out-projection, residual), then a linear head.  The
task: delayed copy, predict the token seen DELAY steps earlier (the state must carry it).

It trains twice from the same initial weights and the same batches: once with
`scanweaver.torch.selective_scan_fn` (compiled forward, compiled VJP backward) and once
with the plain PyTorch loop-over-time reference and autograd, prints both loss curves and
the time per step of each, and saves a plot when matplotlib is installed.

    python examples/train_mamba_tiny.py [--steps 300] [--plot loss.png]
"""

from __future__ import annotations

import argparse
import copy
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from scanweaver.torch import selective_scan_fn, selective_scan_ref


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MambaBlock(nn.Module):
    def __init__(self, d_model: int, d_state: int = 8, expand: int = 2, d_conv: int = 4, scan=selective_scan_fn):
        super().__init__()
        d_inner = expand * d_model
        self.dt_rank = max(1, math.ceil(d_model / 16))
        self.d_state, self.scan = d_state, scan
        self.norm = RMSNorm(d_model)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner)
        with torch.no_grad():  # dt in [1e-3, 1e-1] at the start, as Mamba initialises it
            dt = torch.exp(torch.rand(d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(d_inner, 1))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, h):  # h: (batch, L, d_model)
        L = h.shape[1]
        x, z = self.in_proj(self.norm(h)).chunk(2, dim=-1)
        x = F.silu(self.conv(x.transpose(1, 2))[..., :L])  # causal: drop the right padding
        dt, B, C = self.x_proj(x.transpose(1, 2)).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = (dt @ self.dt_proj.weight.t()).transpose(1, 2)  # (batch, d_inner, L)
        y = self.scan(x, delta.contiguous(), -torch.exp(self.A_log), B.transpose(1, 2).contiguous(),
                      C.transpose(1, 2).contiguous(), D=self.D, z=z.transpose(1, 2).contiguous(),
                      delta_bias=self.dt_proj.bias, delta_softplus=True)
        return h + self.out_proj(y.transpose(1, 2))


class TinyMamba(nn.Module):
    def __init__(self, vocab: int, d_model: int, layers: int, d_state: int, scan=selective_scan_fn):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.ModuleList(MambaBlock(d_model, d_state, scan=scan) for _ in range(layers))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))

    def use_scan(self, scan) -> None:
        for block in self.blocks:
            block.scan = scan


def delayed_copy_batch(gen: torch.Generator, batch: int, length: int, vocab: int, delay: int):
    tokens = torch.randint(1, vocab, (batch, length), generator=gen)
    target = torch.zeros_like(tokens)  # 0: "nothing to copy yet"
    target[:, delay:] = tokens[:, :-delay]
    return tokens, target


def train(model: nn.Module, steps: int, batch: int, length: int, vocab: int, delay: int, seed: int, lr: float):
    """Returns (losses, seconds per step)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, times = [], []
    for _ in range(steps):
        tokens, target = delayed_copy_batch(gen, batch, length, vocab, delay)
        start = time.perf_counter()
        loss = F.cross_entropy(model(tokens).reshape(-1, vocab), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return losses, sum(times[1:]) / max(1, len(times) - 1)  # the first step compiles


def compare(steps=300, batch=16, length=32, vocab=12, d_model=16, layers=2, d_state=8, delay=3, seed=0,
            lr=3e-3, plot=None, log=print):
    torch.manual_seed(seed)
    model = TinyMamba(vocab, d_model, layers, d_state, scan=selective_scan_fn)
    reference = copy.deepcopy(model)
    reference.use_scan(selective_scan_ref)
    ours, t_ours = train(model, steps, batch, length, vocab, delay, seed, lr)
    ref, t_ref = train(reference, steps, batch, length, vocab, delay, seed, lr)
    log(f"{'step':>5} {'scanweaver':>12} {'reference':>12} {'|diff|':>10}")
    for i in range(steps):
        if i < 20 or i % 25 == 0 or i == steps - 1:
            log(f"{i:5d} {ours[i]:12.6f} {ref[i]:12.6f} {abs(ours[i] - ref[i]):10.2e}")
    first = min(20, steps)
    log(f"max |diff| over the first {first} steps: {max(abs(a - b) for a, b in zip(ours[:first], ref[:first])):.2e}")
    log(f"time per step: scanweaver {t_ours * 1e3:.1f} ms, PyTorch reference {t_ref * 1e3:.1f} ms "
        f"(batch {batch}, length {length}, {layers} blocks, d_inner {2 * d_model}, N {d_state})")
    if plot:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            log("matplotlib is not installed: no plot")
        else:
            fig, ax = plt.subplots(figsize=(6, 4))
            ax.plot(ours, label="scanweaver.torch.selective_scan_fn")
            ax.plot(ref, "--", label="PyTorch reference (autograd)")
            ax.set_xlabel("step")
            ax.set_ylabel("cross-entropy")
            ax.set_title(f"tiny Mamba, delayed copy (delay {delay})")
            ax.legend()
            fig.tight_layout()
            fig.savefig(plot)
            log(f"plot saved to {plot}")
    return ours, ref, t_ours, t_ref


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default="train_mamba_tiny.png")
    a = p.parse_args()
    compare(steps=a.steps, batch=a.batch, length=a.length, layers=a.layers, seed=a.seed, plot=a.plot)


if __name__ == "__main__":
    main()
