"""The tiled last-axis complex kernel (`workloads/complex_last_axis.py`, used by
`linear_scan` on complex data scanned along its last axis): bit for bit the interpreted
`scan.affine` program, for every tile remainder, direction, init, dtype and thread split."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.interp.run import run_function
from scanweaver.runtime.cpu_complex import TILE, complex_scan_cpu
from scanweaver.runtime.cpu_scan import affine_ir

RNG = np.random.default_rng(44)


def _c(*shape, dtype, scale=1.0):
    return ((RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)) * scale).astype(dtype)


def _interpreted(a, b, h0, reverse):
    el = "complex<f32>" if a.dtype == np.complex64 else "complex<f64>"
    h, final = np.zeros_like(a), np.zeros(a.shape[0], a.dtype)
    args = [a, b] + ([h0] if h0 is not None else []) + [h, final]
    run_function(affine_ir(el, 2, h0 is not None, True, reverse), "affine", *args)
    return h, final


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("reverse,init", [(False, True), (True, False)])
def test_bit_identical_to_interpreter(dtype, reverse, init):
    C, L = 2 * TILE + 3, 13  # two whole tiles and a remainder
    a, b = _c(C, L, dtype=dtype, scale=0.9), _c(C, L, dtype=dtype)
    h0 = _c(C, dtype=dtype) if init else None
    h, final = complex_scan_cpu(a, b, h0, 1, reverse, threads=1)
    ref_h, ref_final = _interpreted(a, b, h0, reverse)
    assert h.tobytes() == ref_h.tobytes() and final.tobytes() == ref_final.tobytes()


def test_thread_split_gives_the_same_bits():
    C, L = 4 * TILE + 1, 9000  # above the threading threshold
    a, b, h0 = _c(C, L, dtype=np.complex64, scale=0.7), _c(C, L, dtype=np.complex64), _c(C, dtype=np.complex64)
    one = complex_scan_cpu(a, b, h0, 1, False, threads=1)
    two = complex_scan_cpu(a, b, h0, 1, False, threads=2)
    assert one[0].tobytes() == two[0].tobytes() and one[1].tobytes() == two[1].tobytes()
    # a loop over time in complex128 agrees to float32 rounding
    ref = np.empty((C, L), np.complex128)
    state = h0.astype(np.complex128)
    for t in range(L):
        state = a[:, t] * state + b[:, t]
        ref[:, t] = state
    np.testing.assert_allclose(one[0], ref, rtol=1e-3, atol=1e-3)


def test_empty_axis_and_fewer_channels_than_a_tile():
    a = np.zeros((3, 0), np.complex64)
    h0 = _c(3, dtype=np.complex64)
    h, final = complex_scan_cpu(a, a.copy(), h0, 1, False)
    assert h.shape == (3, 0) and final.tobytes() == h0.tobytes()
    _, zero = complex_scan_cpu(a, a.copy(), None, 1, True)
    assert not zero.any()
    a1, b1 = _c(1, 5, dtype=np.complex128, scale=0.5), _c(1, 5, dtype=np.complex128)
    h1, _ = complex_scan_cpu(a1, b1, None, 1, False)
    assert h1.tobytes() == _interpreted(a1, b1, None, False)[0].tobytes()
