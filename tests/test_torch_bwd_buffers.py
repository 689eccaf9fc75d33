"""The selective scan's CPU backward op and its gradient buffers (torch/selective.py
`_zeros`, `_grad_buffer`).

The compiled VJP accumulates into every gradient buffer it is given (it reads before it
writes), so the buffers must start zero: small ones come from `_zeros` (np.zeros: calloc,
no memset pass over fresh pages) instead of np.zeros_like; large ones
(GRAD_REUSE_MIN_BYTES) are reused once the caller drops them and zeroed by the tasks,
each over its own channels.  These tests pin those facts."""

import ctypes

import numpy as np
import pytest
import torch

import scanweaver.torch  # noqa: F401 - registers the scanweaver:: ops
from scanweaver.torch import selective

NAMES = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias", "dinitial_state")


def _case(seed=0, b=2, D=8, N=4, L=64, kind="shared", h0=False):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    u, delta, z = r(b, D, L), r(b, D, L), r(b, D, L)
    A = -torch.rand(D, N, generator=g)
    bc = {"shared": (b, N, L), "const": (D, N), "grouped": (b, 2, N, L)}[kind]
    args = (u, delta, A, r(*bc), r(*bc), r(D), z, r(D), True)
    state = r(b, D, N) if h0 else None
    _, last = torch.ops.scanweaver.selective_scan_fwd(*args, state)
    return (*args, state), r(b, D, L), r(*last.shape)


def _bwd(args, dout, dlast):
    *primal, state = args if len(args) == 10 else (*args, None)
    return [t.clone() for t in torch.ops.scanweaver.selective_scan_bwd(*primal, dout, dlast, state)]


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


@pytest.mark.parametrize("k", range(8))
def test_every_gradient_buffer_is_read_so_it_must_start_zero(monkeypatch, k):
    """A NaN-filled k-th buffer poisons its gradient: np.empty would be wrong for it.
    (If this fails, the VJP now writes that buffer before reading it, and `_zeros` may
    hand it np.empty.)  One task at this size: du, ddelta, dA, dD, dz, ddelta_bias, dB,
    dC, in that order."""
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


# ---- large buffers: reused when dropped, zeroed by the tasks (GRAD_REUSE_MIN_BYTES)


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("kind,h0", [("shared", False), ("const", True), ("grouped", True)])
def test_reused_buffers_are_zeroed_by_the_tasks(monkeypatch, threads, kind, h0):
    """Every buffer from the cache (threshold 0), poisoned with NaN after a call and
    dropped, gives the same bits as fresh np.zeros buffers: each task zeroes its part.
    Large enough (b*D*L*N >= 2^16, D = 2 * GRAD_TASK_CHANNELS) for two tasks."""
    monkeypatch.setenv("SCANWEAVER_NUM_THREADS", threads)
    args, dout, dlast = _case(3, b=2, D=2 * selective.GRAD_TASK_CHANNELS, N=4, L=140, kind=kind, h0=h0)
    monkeypatch.setattr(selective, "GRAD_REUSE_MIN_BYTES", 1 << 62)  # every buffer np.zeros
    ref = _bwd(args, dout, dlast)
    monkeypatch.setattr(selective, "GRAD_REUSE_MIN_BYTES", 0)  # every buffer from the cache
    for _ in range(3):
        *primal, state = args
        for t in torch.ops.scanweaver.selective_scan_bwd(*primal, dout, dlast, state):
            t.fill_(float("nan"))  # the cache's buffers, dropped at the end of the loop body
        got = _bwd(args, dout, dlast)
        for name, x, y in zip(NAMES, got, ref):
            assert torch.equal(x, y), name


def test_large_buffers_are_reused_only_once_dropped():
    args, dout, dlast = _case(4, b=1, D=16, N=4, L=2048)  # du: 128 KiB
    *primal, state = args
    held = torch.ops.scanweaver.selective_scan_bwd(*primal, dout, dlast, state)
    again = torch.ops.scanweaver.selective_scan_bwd(*primal, dout, dlast, state)
    assert held[0].data_ptr() != again[0].data_ptr()
    ptr = again[0].data_ptr()
    del again
    assert torch.ops.scanweaver.selective_scan_bwd(*primal, dout, dlast, state)[0].data_ptr() == ptr


def test_zero_spans_cover_a_tasks_channels(monkeypatch):
    monkeypatch.setattr(selective, "GRAD_REUSE_MIN_BYTES", 0)
    buf = np.ones((2, 6, 5), np.float32)
    for ptr, size in selective._zero_spans(buf, 2, 4, False):
        ctypes.memset(ptr, 0, size)
    expect = np.ones_like(buf)
    expect[:, 2:4] = 0
    np.testing.assert_array_equal(buf, expect)
    rows = np.ones((6, 3), np.float32)
    for ptr, size in selective._zero_spans(rows, 1, 5, False):
        ctypes.memset(ptr, 0, size)
    assert rows[1:5].sum() == 0 and rows[0].all() and rows[5].all()


def test_sum_in_order_is_the_sequential_sum():
    rng = np.random.default_rng(0)
    bufs = [rng.standard_normal((2, 37, 4)).astype(np.float32) * 10.0 ** k for k in range(5)]
    total = selective._sum_in_order(bufs)
    np.testing.assert_array_equal(total, sum(bufs[1:], bufs[0]))
    assert all(total is not b for b in bufs)


@pytest.mark.parametrize("kind", ["shared", "grouped"])
def test_gradients_do_not_depend_on_the_thread_count(kind, monkeypatch):
    """dB / dC of input-dependent B, C are summed per task, then over the tasks: the
    task split is the shape's (GRAD_TASK_CHANNELS), so 1, 2 or 3 threads give one set of
    bits.  (With a split by thread count, dB / dC differed between 1 and 2 threads.)"""
    args, dout, dlast = _case(seed=5, b=1, D=2 * selective.GRAD_TASK_CHANNELS, N=16, L=64, kind=kind)
    got = []
    for threads in ("1", "2", "3"):
        monkeypatch.setenv("SCANWEAVER_NUM_THREADS", threads)
        got.append(_bwd(args, dout, dlast))
    assert len(selective._grad_tasks(2 * selective.GRAD_TASK_CHANNELS, 1 << 20)[1]) == 2
    for other in got[1:]:
        for name, a, b in zip(NAMES, got[0], other):
            assert torch.equal(a, b), name
