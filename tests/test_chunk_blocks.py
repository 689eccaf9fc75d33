"""The cache-blocked time-chunked scan (runtime/cpu_chunk_blocks.py): f32 rows split
across threads (forward and reverse).  Small blocks are forced
(`CHUNKED_TEST_MIN_CHUNK`) so that short rows cross many blocks and sub-chunks;
results are checked against the README Numerics bound (the `numerics` bench's check),
finite where the loop is finite, the first sub-chunk and the final state exact."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.bench import numerics
from scanweaver.runtime import cpu_chunk_blocks, cpu_chunked
from scanweaver.runtime.cpu_scan import _affine_kernel, affine_scan_cpu

MIN_CHUNK = 32  # sub-chunks of 32 steps: blocks of 256


@pytest.fixture
def small_chunks():
    old = cpu_chunked.CHUNKED_TEST_MIN_CHUNK
    cpu_chunked.CHUNKED_TEST_MIN_CHUNK = MIN_CHUNK
    yield
    cpu_chunked.CHUNKED_TEST_MIN_CHUNK = old


def _kernels():
    return (cpu_chunk_blocks.block_aggregate_kernel(False), _affine_kernel("f32", 3, True, False, False),
            _affine_kernel("f32", 2, True, True, False))


def _rows(kinds, L, seed, reverse=False):
    rng = np.random.default_rng(seed)
    cols = [numerics._row(rng, k, L, np.dtype(np.float32), reverse) for k in kinds]
    return (np.stack([c[0] for c in cols]), np.stack([c[1] for c in cols]),
            np.array([c[2] for c in cols], np.float32))


def _check(h, a, b, h0, kinds, reverse=False):
    batch = numerics.Batch(np.dtype(np.float32), reverse, list(kinds), a, b, h0, None)
    ref, mag = numerics.reference(batch)
    seq = numerics.run_sequential(batch)
    res = numerics.check_rows(h, seq, ref, mag, batch.dtype)
    assert res["pass"].all(), (res["err_par"], res["err_seq"], res["nonfinite"])
    return seq


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("C, L", [(2, 256 * 7), (3, 256 * 5 + 37), (5, 100)])
def test_rows_on_threads_within_the_bound(small_chunks, C, L, reverse):
    kinds = [numerics.KINDS[i % len(numerics.KINDS)] for i in range(C * 3)]
    a, b, h0 = _rows(kinds, L, seed=C, reverse=reverse)
    h, last = affine_scan_cpu(a, b, h0, reverse, True, variant="chunked", threads=2)
    seq = _check(h, a, b, h0, kinds, reverse)
    # The steps past the last full block (first when reversed) and the first sub-chunk
    # in scan order start from h0 by the loop's own steps; the last state is h's.
    if reverse:
        exact = L % 256 + MIN_CHUNK
        np.testing.assert_array_equal(h[:, -exact:], seq[:, -exact:])
        np.testing.assert_array_equal(last, h[:, 0])
    else:
        np.testing.assert_array_equal(h[:, :MIN_CHUNK], seq[:, :MIN_CHUNK])
        np.testing.assert_array_equal(last, h[:, -1])
    if L < 256:  # no full block: the sequential kernel only
        np.testing.assert_array_equal(h, seq)


def test_rows_match_the_driver_called_directly(small_chunks):
    # affine_scan_cpu's chunked f32 rows go through chunk_blocks_scan (same bits).
    a, b, h0 = _rows(["mixed"] * 4, 256 * 9, seed=11)
    h = np.empty_like(a)
    cpu_chunk_blocks.chunk_blocks_scan(a, b, h0, h, None, 2, _kernels(), MIN_CHUNK)
    np.testing.assert_array_equal(h, affine_scan_cpu(a, b, h0, variant="chunked", threads=2))
    assert not np.array_equal(h, affine_scan_cpu(a, b, h0, variant="single"))  # reassociated


def test_rows_nonfinite_blocks_run_sequentially(small_chunks):
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.0, (3, 4096)).astype(np.float32)
    b = rng.standard_normal((3, 4096)).astype(np.float32)
    a[0, 1000], b[1, 2000], a[2, 3000] = np.inf, np.nan, 0.0
    b[2, 2999] = np.inf  # inf, then a reset: 0 * inf = NaN in the loop too
    h = affine_scan_cpu(a, b, variant="chunked", threads=2)
    seq = affine_scan_cpu(a, b, variant="single")
    np.testing.assert_array_equal(np.isnan(h), np.isnan(seq))
    np.testing.assert_array_equal(np.isinf(h), np.isinf(seq))
    # Combines that overflow f64 (B over a sub-chunk of a = 1e30): that block runs the
    # loop's steps (inf from the second step, then NaN after a = 0, as the loop does).
    g = np.full((2, 256 * 6), 0.9, np.float32)
    z = np.ones_like(g)
    g[:, 600:700] = 1e30
    g[:, 900] = 0.0
    hg, sg = affine_scan_cpu(g, z, variant="chunked", threads=2), affine_scan_cpu(g, z, variant="single")
    np.testing.assert_array_equal(np.isinf(hg), np.isinf(sg))
    np.testing.assert_array_equal(np.isnan(hg), np.isnan(sg))
    assert np.isinf(hg[:, 601:900]).all() and np.isfinite(hg[:, :600]).all()


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("offset", [0, 8])  # h on a cache line (streaming stores) or 32 bytes off it
def test_block_rescan_kernel_same_bits_as_the_tiles(reverse, offset):
    # The chunk blocks' rescan (streaming stores whatever the size) against the rank-3
    # scan.affine kernel from starts: the same arithmetic, so the same bits.
    from scanweaver.runtime.cpu_variants import aligned_empty

    rng = np.random.default_rng(21 + offset)
    R, S, Lc = 2, 8, 16 * 37
    a = rng.uniform(0.5, 1.1, (R, S, Lc)).astype(np.float32)
    b = rng.standard_normal((R, S, Lc)).astype(np.float32)
    starts = rng.standard_normal((R, S)).astype(np.float32)
    raw = aligned_empty((R * S * Lc + offset,), np.float32, reuse=False)
    h = raw[offset:].reshape(R, S, Lc)
    cpu_chunk_blocks.block_scan_kernel(reverse)(a, b, starts, h)
    ref = np.empty_like(h)
    _affine_kernel("f32", 3, True, False, reverse)(a, b, starts, ref)
    np.testing.assert_array_equal(h, ref)
    seq = np.empty((R * S, Lc), np.float32)
    _affine_kernel("f32", 2, True, True, reverse)(a.reshape(R * S, Lc), b.reshape(R * S, Lc), starts.ravel(),
                                                  seq, np.empty(R * S, np.float32))
    np.testing.assert_array_equal(h.reshape(R * S, Lc), seq)
