"""The selective scan's CPU backward op and its gradient buffers (torch/selective.py `_zeros`).

The compiled VJP accumulates into every gradient buffer it is given (it reads before it
writes), so the buffers must start zero: `_zeros` takes them from np.zeros (calloc, no
memset pass over fresh pages) instead of np.zeros_like; these tests pin both facts."""

import numpy as np
import pytest
import torch

import scanweaver.torch  # noqa: F401 - registers the scanweaver:: ops
from scanweaver.torch import selective

NAMES = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dinitial_state")


def _case(seed=0, b=2, D=8, N=4, L=64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    u, delta, z = r(b, D, L), r(b, D, L), r(b, D, L)
    A = -torch.rand(D, N, generator=g)
    args = (u, delta, A, r(b, N, L), r(b, N, L), r(D), z, r(D), True)
    _, last = torch.ops.scanweaver.selective_scan_fwd(*args)
    return args, r(b, D, L), r(*last.shape)


def _bwd(args, dout, dlast):
    return [t.clone() for t in torch.ops.scanweaver.selective_scan_bwd(*args, dout, dlast)]


def test_gradients_same_bits_as_zeros_like_buffers(monkeypatch):
    args, dout, dlast = _case()
    new = _bwd(args, dout, dlast)
    monkeypatch.setattr(selective, "_zeros", np.zeros_like)
    old = _bwd(args, dout, dlast)
    for name, x, y in zip(NAMES, new, old):
        assert torch.equal(x, y), name


def test_zeros_are_zero_after_the_heap_held_nan():
    like = np.empty((2, 64, 4096), np.float32)
    for _ in range(3):
        junk = np.full(like.shape, np.nan, np.float32)
        del junk
        buf = selective._zeros(like)
        assert buf.shape == like.shape and buf.dtype == like.dtype
        assert not buf.any()


@pytest.mark.parametrize("k", range(9))
def test_every_gradient_buffer_is_read_so_it_must_start_zero(monkeypatch, k):
    """A NaN-filled k-th buffer poisons its gradient: np.empty would be wrong for it.
    (If this fails, the VJP now writes that buffer before reading it, and `_zeros` may
    hand it np.empty.)"""
    args, dout, dlast = _case()
    ref = _bwd(args, dout, dlast)
    orig, count = selective._zeros, [0]

    def nan_kth(like):
        count[0] += 1
        return np.full(like.shape, np.nan, like.dtype) if count[0] - 1 == k else orig(like)

    monkeypatch.setattr(selective, "_zeros", nan_kth)
    out = _bwd(args, dout, dlast)
    assert count[0] > k, f"the op allocated only {count[0]} gradient buffers"
    changed = [n for n, x, y in zip(NAMES, out, ref) if not torch.equal(x, y)]
    assert len(changed) == 1 and torch.isnan(out[NAMES.index(changed[0])]).any(), (k, changed)
