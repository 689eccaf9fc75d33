"""The lane-wise sub-chunk aggregates of the cache-blocked chunked scan
(runtime/cpu_lane_aggregates.py) against the tiles' chunk-aggregate kernel: the same
(A * 2^E, B) per (row, sub-chunk) up to f64 rounding in another association, forward
and reverse, with the steps past the last group of eight, strided rows, products far
outside the f64 range, and the same lanes non-finite where the inputs hold Inf/NaN."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from scanweaver.runtime.cpu_lane_aggregates import LANES, lane_aggregate_kernel
from scanweaver.runtime.cpu_scan import _aggregate_kernel


def _aggregates(kernel, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    R = a.shape[0]
    A, E, B = np.empty((R, LANES)), np.empty((R, LANES), np.int64), np.empty((R, LANES))
    kernel(a, b, A, E, B)
    return A, E, B


def _log2_product(A: np.ndarray, E: np.ndarray) -> np.ndarray:
    """log2 |A * 2^E| without forming A * 2^E (it may leave the f64 range)."""
    with np.errstate(divide="ignore"):
        return np.log2(np.abs(A)) + E


def _both(a, b, reverse):
    return _aggregates(_aggregate_kernel("f32", reverse), a, b), _aggregates(lane_aggregate_kernel(reverse), a, b)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("R, Lc", [(1, 8192), (3, 37), (2, 64), (2, 5), (1, 3)])
def test_same_aggregates_as_the_tiles(R, Lc, reverse):
    rng = np.random.default_rng(R * 1000 + Lc)
    a = rng.uniform(-1.2, 1.2, (R, LANES, Lc)).astype(np.float32)
    b = rng.standard_normal((R, LANES, Lc)).astype(np.float32)
    (A0, E0, B0), (A1, E1, B1) = _both(a, b, reverse)
    # The magnitude B is computed against: the same scan over |a|, |b| (no cancellation).
    _, _, M = _aggregates(_aggregate_kernel("f32", reverse), np.abs(a), np.abs(b))
    assert np.all(np.abs(B1 - B0) <= 1e-12 * M)
    np.testing.assert_array_equal(np.sign(A1), np.sign(A0))
    live = A0 != 0
    np.testing.assert_allclose(_log2_product(A1, E1)[live], _log2_product(A0, E0)[live], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(A1 == 0, A0 == 0)


@pytest.mark.parametrize("reverse", [False, True])
def test_strided_rows_and_extreme_products(reverse):
    # Rows of a longer array (row stride past the block) whose products of a leave the
    # f64 range by far (1e30 and 1e-30 runs, denormal f32, a zero in one sub-chunk).
    rng = np.random.default_rng(5)
    R, Lc, L = 3, 96, 1000
    big_a = rng.choice(np.float32([1e30, -1e30, 1e-30, 3e-39, 0.7]), size=(R, L)).astype(np.float32)
    big_a[1, 5 * Lc + 17] = 0.0
    big_b = rng.standard_normal((R, L)).astype(np.float32)
    a, b = (as_strided(x, shape=(R, LANES, Lc), strides=(L * 4, Lc * 4, 4)) for x in (big_a, big_b))
    (A0, E0, B0), (A1, E1, B1) = _both(a, b, reverse)
    assert np.array_equal(A1 == 0, A0 == 0) and (A0 == 0).sum() == 1
    live = A0 != 0
    assert np.abs(E0[live]).max() > 2000  # far outside f64: only the exponents hold it
    np.testing.assert_allclose(_log2_product(A1, E1)[live], _log2_product(A0, E0)[live], rtol=0, atol=1e-9)
    np.testing.assert_array_equal(np.isfinite(B1), np.isfinite(B0))


@pytest.mark.parametrize("reverse", [False, True])
def test_nonfinite_inputs_give_nonfinite_lanes(reverse):
    # The driver scans a block sequentially when a combine is not finite: the lanes
    # holding Inf/NaN (or whose B overflows) must not come out finite.
    rng = np.random.default_rng(9)
    R, Lc = 2, 45
    a = rng.uniform(0.5, 1.0, (R, LANES, Lc)).astype(np.float32)
    b = rng.standard_normal((R, LANES, Lc)).astype(np.float32)
    a[0, 1, 3], b[0, 4, 44], a[1, 2, 40], b[1, 7, 0] = np.inf, np.nan, np.nan, -np.inf
    a[1, 5, 10:20] = 3e38  # B overflows f64
    results = _both(a, b, reverse)
    bad = [~(np.isfinite(A) & np.isfinite(B)) for A, _, B in results]
    np.testing.assert_array_equal(bad[1], bad[0])
    assert bad[1].sum() == 5


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("L, lanes_used", [(32 * 40 + 13, True), (20 * 40, False)])
def test_single_row_chunks_take_the_lane_kernel(monkeypatch, reverse, L, lanes_used):
    # One f32 row on two threads: the two-pass chunks (not the blocked form), whose
    # aggregates go to the lane kernel where every thread's part of the chunks is a
    # whole number of lane vectors (32 chunks: two parts of 16), else to the tiles' (20).
    from scanweaver.bench import numerics
    from scanweaver.runtime import cpu_chunked, cpu_lane_aggregates
    from scanweaver.runtime.cpu_scan import affine_scan_cpu

    monkeypatch.setattr(cpu_chunked, "CHUNKED_TEST_MIN_CHUNK", 40)
    used = []
    real = cpu_lane_aggregates.lane_aggregate_kernel
    monkeypatch.setattr(cpu_lane_aggregates, "lane_aggregate_kernel", lambda rev: used.append(rev) or real(rev))
    rng = np.random.default_rng(L)
    kinds = ["mixed"]
    a, b, h0 = (np.stack([x]) if i < 2 else np.float32([x])
                for i, x in enumerate(numerics._row(rng, kinds[0], L, np.dtype(np.float32), reverse)))
    h, last = affine_scan_cpu(a, b, h0, reverse, True, variant="chunked", threads=2)
    assert used == ([reverse] if lanes_used else [])
    batch = numerics.Batch(np.dtype(np.float32), reverse, kinds, a, b, h0, None)
    ref, mag = numerics.reference(batch)
    seq = numerics.run_sequential(batch)
    res = numerics.check_rows(h, seq, ref, mag, batch.dtype)
    assert res["pass"].all(), (res["err_par"], res["err_seq"])
    assert not np.array_equal(h, seq)  # chunked: reassociated
    np.testing.assert_array_equal(last[0], h[0, 0] if reverse else h[0, -1])
