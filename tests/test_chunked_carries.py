"""Phase 2 of the chunked f32 scan (the carries chunk to chunk, runtime/cpu_chunked.py):
the Python-float path `_wide_carries_scalar` gives the bits of the numpy path
`_carries_if_finite`, and refuses (None) exactly where it does."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.runtime import cpu_chunked
from scanweaver.runtime.cpu_scan import affine_scan_cpu


def _aggregates(rng, C, K, kind):
    A = rng.uniform(0.5, 2.0, (C, K)) * rng.choice([-1.0, 1.0], (C, K))
    E = rng.integers(-60, 60, (C, K)).astype(np.int64)
    B = rng.standard_normal((C, K)) * 10.0 ** rng.integers(-30, 30, (C, K))
    if kind == "tiny":  # products that underflow f64 (ldexp to 0 or a denormal)
        E[:, ::3] = -1070
    elif kind == "huge":  # a carry that leaves f64's range (OverflowError in math.ldexp)
        E[0, K // 2] = 2000
    elif kind == "inf":
        B[-1, K - 1] = np.inf
    elif kind == "nan":
        A[C // 2, min(1, K - 1)] = np.nan
    elif kind == "f32_overflow":  # finite in f64, inf as an f32 start
        B[:, 0] = 1e300
        A[:, 1:] = 1e-300
    return [A, cpu_chunked._exponents(E), B]


@pytest.mark.parametrize("kind", ["plain", "tiny", "huge", "inf", "nan", "f32_overflow"])
@pytest.mark.parametrize("reverse", [False, True])
def test_scalar_carries_match_the_numpy_carries_bit_for_bit(kind, reverse):
    rng = np.random.default_rng(hash((kind, reverse)) % 2**32)
    for C, K in [(1, 1), (4, 16), (3, 7)]:
        agg = _aggregates(rng, C, K, kind)
        start = (rng.standard_normal(C) * 100).astype(np.float32)
        start[0] = -0.0
        order = range(K - 1, -1, -1) if reverse else range(K)
        ref_starts, starts = np.empty((C, K), np.float32), np.empty((C, K), np.float32)
        ref = cpu_chunked._carries_if_finite(start, agg, order, ref_starts, False)
        got = cpu_chunked._wide_carries_scalar(start, agg, order, starts)
        assert (ref is None) == (got is None), (kind, C, K)
        if kind in ("huge", "inf", "nan") and K > 1:  # (K = 1: the carry into chunk 0 is -0.0)
            assert got is None
        if ref is not None:
            assert got.dtype == np.float32 and ref.dtype == np.float32
            np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
            np.testing.assert_array_equal(starts.view(np.uint32), ref_starts.view(np.uint32))


@pytest.mark.parametrize("reverse", [False, True])
def test_chunked_scan_bits_do_not_depend_on_the_carry_path(reverse, monkeypatch):
    rng = np.random.default_rng(11)
    a = rng.uniform(0.9, 1.1, (4, 3 * 4096 + 37)).astype(np.float32)
    b = rng.standard_normal(a.shape).astype(np.float32)
    a[1, 5000:5100] = 40.0  # growth: a chunk whose combine overflows takes the fallback
    a[2, 7000] = np.inf
    monkeypatch.setattr(cpu_chunked, "CHUNKED_TEST_MIN_CHUNK", 64)
    h0 = rng.standard_normal(4).astype(np.float32)
    # One row at a time: fewer rows than threads take the two-pass chunks (the carries
    # under test), not the cache-blocked form of cpu_chunk_blocks.
    from scanweaver.runtime import cpu_chunk_blocks

    def not_this_path(*args, **kwargs):
        raise AssertionError("the blocked form has no chunk-to-chunk carries")

    monkeypatch.setattr(cpu_chunk_blocks, "chunk_blocks_scan", not_this_path)
    runs = []
    for pairs in (cpu_chunked.SCALAR_CARRY_MAX_PAIRS, 0):
        monkeypatch.setattr(cpu_chunked, "SCALAR_CARRY_MAX_PAIRS", pairs)
        rows = [affine_scan_cpu(a[r:r + 1], b[r:r + 1], h0[r:r + 1], reverse, True, variant="chunked", threads=2)
                for r in range(4)]
        h, last = np.concatenate([x[0] for x in rows]), np.concatenate([x[1] for x in rows])
        runs.append((h.view(np.uint32).copy(), last.view(np.uint32).copy()))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    # Rows 0 and 3 are finite and ordinary: the chunked result is close to the loop's.
    seq = affine_scan_cpu(a, b, h0, reverse, variant="single")
    # (atol: the rows reach magnitudes near 80, and the rounding error scales with them)
    np.testing.assert_allclose(runs[0][0].view(np.float32)[[0, 3]], seq[[0, 3]], rtol=1e-4, atol=1e-3)
