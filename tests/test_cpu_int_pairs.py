"""Integer tiles carry their state two steps at a time (`cpu_affine_tiles._block_steps`,
PAIRED_INT_STEPS): bit for bit the sequential wrap-around loop, on full-range values
(every product overflows), with h0 and the final state, forward and reverse, the
masked edges, a time remainder, a partial channel group, long (skewed) and medium
rows, in every variant that runs the tiles."""

import numpy as np
import pytest

from scanweaver.rewrites import cpu_affine_tiles
from scanweaver.runtime import cpu_scan


def _loop(a, b, h0, reverse):
    """The sequential loop in the element type (numpy wraps integer overflow)."""
    h = np.empty_like(a)
    s = h0.copy()
    with np.errstate(over="ignore"):
        for t in range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1]):
            s = a[:, t] * s + b[:, t]
            h[:, t] = s
    return h, s


def _draw(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


def test_integer_tiles_are_paired():
    assert cpu_affine_tiles.PAIRED_INT_STEPS


@pytest.mark.parametrize("dtype,reverse", [(np.int32, False), (np.int32, True)])  # int64: test_cpu_tile_chains
def test_paired_integer_tiles_bit_exact(dtype, reverse):
    rng = np.random.default_rng(41)
    T = 2 * (32 // np.dtype(dtype).itemsize)  # steps per tile
    long_l = cpu_affine_tiles.LONG_ROW_BLOCKS * T + 5  # skewed, with a time remainder
    medium_l = (cpu_affine_tiles.MEDIUM_ROW_BLOCKS + 3) * T + 1
    for C, L in ((19, long_l), (16, medium_l), (9, 37)):
        a, b, h0 = _draw(rng, (C, L), dtype), _draw(rng, (C, L), dtype), _draw(rng, (C,), dtype)
        want_h, want_f = _loop(a, b, h0, reverse)
        for variant in ("single", "channels", "openmp"):
            if variant == "openmp" and not cpu_scan.openmp_available():
                continue
            h, f = cpu_scan.affine_scan_cpu(a, b, h0, reverse, True, variant=variant, threads=2)
            np.testing.assert_array_equal(h, want_h, err_msg=f"{C}x{L} {variant}")
            np.testing.assert_array_equal(f, want_f, err_msg=f"{C}x{L} {variant}")


def test_paired_steps_match_small_values():
    """Small values (no overflow), where a wrong pairing shows as a plainly wrong number."""
    rng = np.random.default_rng(42)
    a = rng.integers(-2, 3, (8, 4 * 16 + 3)).astype(np.int32)
    b = rng.integers(-3, 4, a.shape).astype(np.int32)
    h = cpu_scan.affine_scan_cpu(a, b, variant="single")
    want, _ = _loop(a, b, np.zeros(8, np.int32), False)
    np.testing.assert_array_equal(h, want)
