"""Tiles of two multiply-add chains (64-bit rows, `cpu_affine_tiles.SCAN_CHAINS`): bit
for bit the sequential loop, with the chained groups, a full group left over, the
partial group, long (skewed) and medium (unskewed) rows, forward and reverse, every
variant that runs the tiles; f32 (one chain) unchanged."""

import numpy as np
import pytest

from scanweaver.rewrites import cpu_affine_tiles
from scanweaver.runtime import cpu_scan


def _loop(a, b, h0, reverse):
    """The sequential loop in the element type: separate multiply and add (numpy ufuncs)."""
    h = np.empty_like(a)
    s = h0.copy()
    for t in (range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])):
        s = a[:, t] * s + b[:, t]
        h[:, t] = s
    return h, s


def _inputs(rng, shape, dtype):
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        draw = lambda s: rng.integers(info.min, info.max, size=s, dtype=dtype, endpoint=True)  # noqa: E731
        return draw(shape), draw(shape), draw(shape[:1])
    return (rng.uniform(0.9, 1.0, shape), rng.standard_normal(shape), rng.standard_normal(shape[:1]))


def test_long_64_bit_rows_take_two_chains():
    assert cpu_affine_tiles.SCAN_CHAINS[64] == 2
    assert cpu_affine_tiles.SCAN_CHAINS.get(32, 1) == 1


@pytest.mark.parametrize("dtype,reverse", [(np.float64, True), (np.int64, False)])
def test_chained_tiles_bit_exact(dtype, reverse):
    rng = np.random.default_rng(31)
    T = 8  # f64/i64: 4 lanes, tiles of 8 steps
    long_l = cpu_affine_tiles.LONG_ROW_BLOCKS * T + 3  # chained, with a time remainder
    # 8k + 4 + 1 rows: chained groups, one full group left over, the partial group;
    # 16 rows: chained only; medium rows (MEDIUM_ROW_BLOCKS .. LONG_ROW_BLOCKS): no skew.
    medium_l = (cpu_affine_tiles.MEDIUM_ROW_BLOCKS + 5) * T + 1
    for C, L in ((13, long_l), (16, long_l), (13, medium_l)):
        a, b, h0 = _inputs(rng, (C, L), dtype)
        want_h, want_f = _loop(a, b, h0, reverse)
        for variant in ("single", "channels", "openmp"):
            if variant == "openmp" and not cpu_scan.openmp_available():
                continue
            h, f = cpu_scan.affine_scan_cpu(a, b, h0, reverse, True, variant=variant, threads=2)
            np.testing.assert_array_equal(h.view(np.uint8), want_h.view(np.uint8), err_msg=f"{C}x{L} {variant}")
            np.testing.assert_array_equal(f.view(np.uint8), want_f.view(np.uint8), err_msg=f"{C}x{L} {variant}")


def test_short_f32_rows_unchanged():
    """f32 keeps one chain and its medium-row skew."""
    rng = np.random.default_rng(32)
    a, b = rng.uniform(0.9, 1.0, (19, 300)).astype(np.float32), rng.standard_normal((19, 300)).astype(np.float32)
    h = cpu_scan.affine_scan_cpu(a, b, variant="single")
    want, _ = _loop(a, b, np.zeros(19, np.float32), False)
    np.testing.assert_array_equal(h, want)
