"""The numerics contract of the parallel (reassociating) scans (README, Numerics): the
time-chunked CPU scan and the GPU Blelloch kernels (in the thread-block simulator) are
never NaN/Inf where the sequential loop is finite, keep denormals, and have an error at
most twice the sequential loop's own (seeded subsets of `scanweaver.bench.numerics`)."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.bench import numerics
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.runtime import cpu_chunked
from scanweaver.runtime.cpu_scan import affine_scan_cpu
from scanweaver.workloads import loops


def _scan(a, b, variant, reverse=False):
    # h0 and the final state as in test_scan_to_cpu: the same compiled kernels.
    return affine_scan_cpu(a, b, np.zeros(len(a), a.dtype), reverse, True, variant=variant)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
def test_growth_overflowing_chunk_products_is_not_nan(dtype, reverse):
    # Issue 10 item 1: the product of a over a chunk overflows; the loop never forms it.
    L = 1 << 19
    a = np.full((1, L), 1.01, dtype)
    b = np.zeros_like(a)
    b[0, :100 if reverse else L - 100] = 0
    (b[0, :100] if reverse else b[0, -100:])[...] = 1
    h = _scan(a, b, "chunked", reverse)
    assert not np.isnan(h).any()
    last = h[0, 0] if reverse else h[0, -1]
    seq = _scan(a, b, "single", reverse)
    assert last == pytest.approx(170.4814, rel=1e-4)
    np.testing.assert_allclose(h, seq, rtol=1e-4 if dtype == np.float32 else 1e-12)


def test_denormal_steps_are_not_flushed():
    # Issue 10 item 2: a = 1, b = 1e-42 (f32 denormal) for 2^19 steps.
    a = np.ones((1, 1 << 19), np.float32)
    b = np.full_like(a, 1e-42)
    h = _scan(a, b, "chunked")
    ref = (1 << 19) * float(np.float32(1e-42))
    assert h[0, -1] == pytest.approx(ref, rel=1e-3)


def test_infinite_and_nan_inputs_propagate_like_the_loop():
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.0, (3, 4096)).astype(np.float32)
    b = rng.standard_normal((3, 4096)).astype(np.float32)
    a[0, 1000], b[1, 2000], a[2, 3000] = np.inf, np.nan, 0.0
    b[2, 2999] = np.inf  # inf, then a reset: 0 * inf = NaN in the loop too
    old = cpu_chunked.CHUNKED_TEST_MIN_CHUNK
    cpu_chunked.CHUNKED_TEST_MIN_CHUNK = 64
    try:
        h = _scan(a, b, "chunked")
    finally:
        cpu_chunked.CHUNKED_TEST_MIN_CHUNK = old
    seq = _scan(a, b, "single")
    np.testing.assert_array_equal(np.isnan(h), np.isnan(seq))
    np.testing.assert_array_equal(np.isinf(h), np.isinf(seq))


def test_alternating_growth_and_decay_f64_as_accurate_as_the_loop():
    # Issue 10 item 3: f64 rows alternating growth and decay were 10-40x less accurate.
    rng = np.random.default_rng(5)
    L = 1 << 15
    up = (np.arange(L) // 32) % 2 == 0
    a = np.where(up, 1.9, 0.5 / 1.9)[None, :].repeat(2, 0)
    b = rng.standard_normal((2, L))
    batch = numerics.Batch(np.dtype(np.float64), False, ["alternating"] * 2, a, b, np.zeros(2), None)
    ref, mag = numerics.reference(batch)
    res = numerics.check_rows(numerics.run_chunked(batch), numerics.run_sequential(batch), ref, mag, batch.dtype)
    assert res["pass"].all(), (res["err_par"], res["err_seq"])


def test_seeded_subset_of_the_numerics_run():
    """A few hundred cases of every kind, small chunks forced so short rows cross many
    chunk boundaries (the full 10,000-case run is benchmarks/numerics.md)."""
    batches = numerics.make_batches(336, seed=2026, long_rows=False)
    records = numerics.evaluate(batches, "cpu-chunked")
    assert len(records) >= 300
    assert {r["kind"] for r in records} == set(numerics.KINDS)
    assert {r["dtype"] for r in records} == {"float32", "float64"}
    bad = [r for r in records if not r["pass"]]
    assert not bad, bad[:3]
    # The check can fail: a variant that returns the sequential result plus noise fails it.
    b0 = batches[0]
    ref, mag = numerics.reference(b0)
    seq = numerics.run_sequential(b0)
    noisy = seq * (1 + 64 * np.finfo(b0.dtype).eps)
    assert not numerics.check_rows(noisy, seq, ref, mag, b0.dtype)["pass"].all()


# ------------------------------------------------------------------------------ GPU kernels


def _gpu_overflow_batches(dtype, reverse: bool) -> list[numerics.Batch]:
    """The overflow patterns of the GPU tree (tiles of 16 steps in `run_gpu_sim`): growth
    whose product over a few steps leaves the range, with b = 0 and h0 = 0 before the
    last steps (inf * 0 in the tree); decays whose product underflows while h0 is large
    (the loop keeps h0's share); a tiny nonzero h0 times such growth (inf * h)."""
    dt = np.dtype(dtype)
    f32 = dt == np.float32
    big, L = (1e15, 48) if f32 else (1e120, 48)
    rows_a, rows_b, h0 = [], [], []
    for g, last in [(big, 3), (-big, 2)]:
        b = np.zeros(L)
        (b[:last] if reverse else b[L - last:])[...] = 1.5
        rows_a.append(np.full(L, g)), rows_b.append(b), h0.append(0.0)
    up = (np.arange(L) // 4) % 2 == 0
    small = 1e-12 if f32 else 1e-90
    rows_a.append(np.where(up, small, 1 / small)[::-1] if reverse else np.where(up, small, 1 / small))
    rows_b.append(np.zeros(L))
    h0.append(1e30 if f32 else 1e300)
    with np.errstate(over="ignore"):
        first = numerics.Batch(dt, reverse, ["overflow"] * 2 + ["underflow"], np.array(rows_a, dt),
                               np.array(rows_b, dt), np.array(h0, dt), None)
        # h0 * a^12 stays finite, a^8 (a subtree) does not
        g, h = (1e5, 1e-30) if f32 else (1e50, 1e-300)
        tiny = numerics.Batch(dt, reverse, ["overflow"], np.full((1, 12), g, dt), np.zeros((1, 12), dt),
                              np.array([h], dt), None)
    return [first, tiny]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
def test_gpu_blelloch_overflow_patterns_meet_the_contract(dtype, reverse):
    for batch in _gpu_overflow_batches(dtype, reverse):
        ref, mag = numerics.reference(batch)
        seq = numerics.run_sequential(batch)
        assert np.isfinite(seq).all()  # the loop never forms the overflowing products
        par = numerics.run_gpu_sim(batch)
        res = numerics.check_rows(par, seq, ref, mag, batch.dtype)
        assert res["pass"].all(), (batch.kinds, res["err_par"], res["err_seq"], np.isfinite(par).all(axis=1))
        # flagged tiles take the loop's own order: bit for bit in these rows
        np.testing.assert_array_equal(par, seq)


def test_gpu_blelloch_seeded_subset_of_the_numerics_run():
    """48 cases of every kind in the thread-block simulator (the full GPU run is in
    benchmarks/numerics.md)."""
    batches = numerics.make_batches(48, seed=2027, rows=4, long_rows=False, max_length=64)
    records = numerics.evaluate(batches, "gpu-blelloch-sim")
    assert len(records) == 48 and {r["dtype"] for r in records} == {"float32", "float64"}
    bad = [r for r in records if not r["pass"]]
    assert not bad, bad[:3]


def _raise_and_lower(module):
    m = parse_ir(print_ir(module))
    ctx = make_context()
    RaiseRecurrences().apply(ctx, m)
    ScanToGpu(block_size=4, items_per_thread=2).apply(ctx, m)
    return m


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_fused_recurrence_and_linear_kernels_do_not_overflow_where_the_loop_does_not(dtype):
    """The fused kernels (`scan.recurrence`: the reset loop; `scan.linear_recurrence`:
    a 2nd-order filter) with products of a over a tile that overflow while the state is
    zero: the loop is finite, the tree alone would form inf * 0."""
    np_t = np.float32 if dtype == "f32" else np.float64
    big = 1e10 if dtype == "f32" else 1e80
    C, L = 3, 40
    a = np.full((L, C), big, np_t)
    x = np.zeros((L, C), np_t)
    x[-3:] = 1.5
    cases = [
        (loops.reset_loops(C, L, dtype), "reset", [x, a, np.zeros(L, np.int32), np.zeros(C, np_t), np.zeros((L, C), np_t)]),
        (loops.iir2_loops(C, L, dtype), "iir2",
         [np.ascontiguousarray(x.T), np.full(C, big, np_t), np.full(C, 0.5, np_t), np.zeros((C, L), np_t)]),
    ]
    for module, name, args in cases:
        ref = [v.copy() for v in args]
        got = [v.copy() for v in args]
        with np.errstate(all="ignore"):
            run_function(parse_ir(print_ir(module)), name, *ref)
            simulate_launch(_raise_and_lower(module), name, *got)
        assert np.isfinite(ref[-1]).all()
        np.testing.assert_array_equal(got[-1], ref[-1])  # the flagged tiles run in the loop's order
