"""The wide (f32 rows) chunk aggregates multiply four steps of `a` before splitting off
the exponent (`cpu_aggregate_arith.WIDE_GROUP_STEPS`): with extreme f32 values (the
largest, denormals, zeros) A * 2^E stays the exact product to f64 rounding and B is
the f64 scan from 0, bit for bit."""

from fractions import Fraction

import numpy as np
import pytest

from scanweaver.runtime import cpu_scan

EXTREMES = np.array([3.4e38, 1.4e-45, 1e-40, 1e30, 1e-30, 0.5, 2.0, -3.0, 0.75], np.float32)


def _aggregate(a: np.ndarray, b: np.ndarray, reverse: bool):
    k = cpu_scan._aggregate_kernel("f32", reverse)
    C, K, _ = a.shape
    A, E, B = np.empty((C, K)), np.empty((C, K), np.int64), np.empty((C, K))
    k(a, b, A, E, B)
    return A, E, B


@pytest.mark.parametrize("reverse", [False, True])
def test_extreme_products_exact_to_rounding(reverse):
    rng = np.random.default_rng(21)
    C, K, Lc = 3, 9, 67  # partial lane groups, a tail shorter than a group of four
    a = rng.choice(EXTREMES, (C, K, Lc))
    a[0, 0, :8] = [3.4e38] * 4 + [1.4e-45] * 4  # whole groups at both ends of the range
    a[1, 2, -12:] = [1.4e-45] * 6 + [3.4e38] * 6
    b = rng.uniform(-1, 1, (C, K, Lc)).astype(np.float32)
    A, E, B = _aggregate(a, b, reverse)
    for c in range(C):
        for k in range(K):
            steps = range(Lc - 1, -1, -1) if reverse else range(Lc)
            exact, bh = Fraction(1), 0.0
            for t in steps:
                exact *= Fraction(float(a[c, k, t]))
                bh = float(a[c, k, t]) * bh + float(b[c, k, t])  # f64, unfused: the kernel's chain
            assert B[c, k] == bh
            got = Fraction(float(A[c, k])) * Fraction(2) ** int(E[c, k])
            assert abs(got - exact) <= abs(exact) * Lc / 2**52  # Lc roundings at most, in Fractions


def test_zero_and_nonfinite_steps():
    a = np.full((1, 1, 12), 2.0, np.float32)
    b = np.ones((1, 1, 12), np.float32)
    a[0, 0, 5] = 0.0
    A, E, _ = _aggregate(a, b, False)
    assert A[0, 0] == 0.0
    a[0, 0, 5] = np.inf
    A, _, _ = _aggregate(a, b, False)
    assert not np.isfinite(A[0, 0])  # the runtime then scans the chunk sequentially
