"""Complex recurrences on the CPU: `linear_scan` and `selective_scan` with complex
inputs, through compiled kernels, against complex128 numpy references (and the
interpreter, bit for bit, where the association is the same)."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver as sw
from scanweaver import api
from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.interp.run import run_function
from scanweaver.runtime.cpu_scan import affine_ir, affine_scan_cpu

RNG = np.random.default_rng(1717)


def crandn(*shape, dtype=np.complex64, scale=1.0):
    return ((RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)) * scale).astype(dtype)


def scan_reference(a, b, axis, h0=None, reverse=False):
    a, b = (np.moveaxis(np.asarray(x).astype(np.complex128), axis, -1) for x in (a, b))
    state = np.zeros(a.shape[:-1], np.complex128) if h0 is None else np.broadcast_to(h0, a.shape[:-1]).astype(np.complex128)
    h = np.zeros(a.shape, np.complex128)
    for t in range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1]):
        state = a[..., t] * state + b[..., t]
        h[..., t] = state
    return np.moveaxis(h, -1, axis), state


@pytest.mark.parametrize("dtype,tol", [(np.complex64, 2e-5), (np.complex128, 1e-12)])
@pytest.mark.parametrize("axis,reverse,with_h0", [(-1, False, True), (1, True, True), (0, False, False)])
def test_linear_scan_complex_golden(dtype, tol, axis, reverse, with_h0):
    shape = (5, 33, 3)
    a, b = crandn(*shape, dtype=dtype, scale=0.7), crandn(*shape, dtype=dtype)
    ch = tuple(d for i, d in enumerate(shape) if i != axis % 3)
    h0 = crandn(*ch, dtype=dtype) if with_h0 else None
    h, final = sw.linear_scan(a, b, h0=h0, axis=axis, reverse=reverse, backend="cpu", return_final_state=True)
    ref, ref_final = scan_reference(a, b, axis % 3, h0, reverse)
    assert h.dtype == dtype and final.dtype == dtype and h.shape == shape and final.shape == ch
    np.testing.assert_allclose(h, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(final, ref_final, rtol=tol, atol=tol)


@pytest.mark.parametrize("variant", ["single", "channels"])
def test_compiled_kernel_bit_identical_to_interpreter(variant):
    """The kernel is the loop on (re, im) pairs, op for op the interpreter's arithmetic."""
    C, L = 9, 41
    a, b, h0 = crandn(C, L, scale=0.9), crandn(C, L), crandn(C)
    h, final = affine_scan_cpu(a, b, h0, return_final=True, variant=variant, threads=2)
    h2, final2 = np.zeros((C, L), np.complex64), np.zeros(C, np.complex64)
    run_function(affine_ir("complex<f32>", 2, True, True, False), "affine", a, b, h0, h2, final2)
    assert h.tobytes() == h2.tobytes() and final.tobytes() == final2.tobytes()


def test_long_unit_circle_rotation_stays_finite():
    """|a| = 1 over a long axis (an LRU at the stability edge): finite, |h| bounded."""
    L = 4096
    theta = RNG.uniform(0, 2 * np.pi, (4, 1))
    a = np.broadcast_to(np.exp(1j * theta), (4, L)).astype(np.complex64)
    b = crandn(4, L) * 1e-3
    h = sw.linear_scan(a, b, backend="cpu")
    ref, _ = scan_reference(a, b, 1)
    assert np.isfinite(h).all()
    np.testing.assert_allclose(h, ref, atol=2e-4)


def test_mixed_real_complex_promotes_like_numpy():
    a_real = RNG.uniform(0.1, 0.9, (3, 16)).astype(np.float32)
    b = crandn(3, 16)
    h = sw.linear_scan(a_real, b, backend="cpu")
    assert h.dtype == np.complex64
    np.testing.assert_allclose(h, scan_reference(a_real, b, 1)[0], rtol=2e-5, atol=2e-5)
    h64 = sw.linear_scan(crandn(3, 16), RNG.standard_normal((3, 16)), backend="cpu")
    assert h64.dtype == np.complex128  # float64 with complex64: numpy gives complex128
    h0 = sw.linear_scan(crandn(2, 8), crandn(2, 8), h0=0.5 + 1j, backend="cpu", return_final_state=True)
    assert h0[1].dtype == np.complex64


def test_complex_refusals_name_the_argument(monkeypatch):
    with pytest.raises(ScanWeaverTypeError, match="argument 'b' has dtype int32"):
        sw.linear_scan(crandn(2, 8), np.ones((2, 8), np.int32), backend="cpu")
    with pytest.raises(ScanWeaverTypeError, match="argument 'h0' has dtype float64"):
        sw.linear_scan(crandn(2, 8), crandn(2, 8), h0=np.ones(2), backend="cpu")
    # complex takes the GPU kernel now (tests/test_complex_gpu_affine.py); without CUDA,
    # backend="cuda" is the usual unavailable error
    monkeypatch.setattr(api, "_cuda_usable", lambda: False)
    with pytest.raises(BackendUnavailableError, match="backend='cuda' is not available"):
        sw.linear_scan(crandn(2, 8), crandn(2, 8), backend="cuda")
    with pytest.raises(ScanWeaverValueError, match="variant 'chunked' does not take complex"):
        affine_scan_cpu(crandn(2, 8), crandn(2, 8), variant="chunked")


# ------------------------------------------------------------------ selective scan


def selective_reference(u, delta, A, B, C, D=None, z=None, bias=None, softplus=False, h0=None):
    """mamba_ssm's selective_scan_ref with complex A, in complex128."""
    u = u.astype(np.float64)
    dt = delta.astype(np.float64)
    if bias is not None:
        dt = dt + bias[:, None]
    if softplus:
        dt = np.where(dt > 20, dt, np.log1p(np.exp(dt)))
    batch, dim, L = u.shape

    def as_complex(x):
        x = np.asarray(x)
        if x.ndim >= 3 and x.dtype.kind == "f":
            x = x[..., 0::2] + 1j * x[..., 1::2]
        return x.astype(np.complex128)

    B, C = as_complex(B), as_complex(C)

    def at(x, t):
        if x.ndim == 2:
            return x[None]
        if x.ndim == 3:
            return x[:, None, :, t]
        return np.repeat(x[..., t], dim // x.shape[1], axis=1)

    h = np.zeros((batch, dim, A.shape[1]), np.complex128) if h0 is None else h0.astype(np.complex128)
    ys = []
    for t in range(L):
        h = np.exp(dt[:, :, t, None] * A[None]) * h + dt[:, :, t, None] * u[:, :, t, None] * at(B, t)
        ys.append(2 * (h * at(C, t)).sum(-1).real)
    y = np.stack(ys, -1)
    if D is not None:
        y = y + u * D[:, None]
    if z is not None:
        y = y * z / (1 + np.exp(-z))
    return y, h


def _s4d_A(dim, n, dtype=np.complex64):
    return (-np.exp(RNG.standard_normal((dim, n)) * 0.5) + 1j * np.pi * RNG.standard_normal((dim, n))).astype(dtype)


@pytest.mark.parametrize("b_form,c_form", [("pairs", "const"), ("const", "pairs"), ("grouped", "complex")])
def test_selective_scan_complex_A_matches_mamba_reference(b_form, c_form):
    batch, dim, L, n = 2, 4, 24, 3
    A = _s4d_A(dim, n)
    u = RNG.standard_normal((batch, dim, L)).astype(np.float32)
    delta = RNG.uniform(0.01, 0.5, (batch, dim, L)).astype(np.float32)

    def weight(form):
        if form == "const":
            return crandn(dim, n)
        if form == "pairs":  # Mamba's layout: real (batch, N, 2L), (re, im) per step
            return RNG.standard_normal((batch, n, 2 * L)).astype(np.float32)
        if form == "grouped":
            return RNG.standard_normal((batch, 2, n, 2 * L)).astype(np.float32)
        return crandn(batch, n, L)

    B, C = weight(b_form), weight(c_form)
    D = RNG.standard_normal(dim).astype(np.float32)
    z = RNG.standard_normal((batch, dim, L)).astype(np.float32)
    bias = RNG.standard_normal(dim).astype(np.float32) * 0.1
    h0 = crandn(batch, dim, n)
    out, last = sw.selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=True,
                                  return_last_state=True, initial_state=h0, backend="cpu")
    ref, ref_last = selective_reference(u, delta, A, B, C, D, z, bias, True, h0)
    assert out.dtype == np.float32 and last.dtype == np.complex64 and last.shape == (batch, dim, n)
    np.testing.assert_allclose(out, ref, rtol=5e-5, atol=5e-5)
    np.testing.assert_allclose(last, ref_last, rtol=5e-5, atol=5e-5)


def test_selective_scan_pairs_and_complex_B_agree_bit_for_bit():
    batch, dim, L, n = 1, 2, 10, 2
    A = _s4d_A(dim, n)
    u = RNG.standard_normal((batch, dim, L)).astype(np.float32)
    delta = RNG.uniform(0.1, 0.4, (batch, dim, L)).astype(np.float32)
    pairs = RNG.standard_normal((batch, n, 2 * L)).astype(np.float32)
    C = crandn(dim, n)
    y1 = sw.selective_scan(u, delta, A, pairs, C, backend="cpu")
    y2 = sw.selective_scan(u, delta, A, pairs.view(np.complex64), C, backend="cpu")
    assert y1.tobytes() == y2.tobytes()


def test_selective_scan_complex128_and_refusals():
    batch, dim, L, n = 1, 2, 12, 2
    A = _s4d_A(dim, n, np.complex128)
    u = RNG.standard_normal((batch, dim, L))
    delta = RNG.uniform(0.1, 0.4, (batch, dim, L))
    B, C = crandn(dim, n, dtype=np.complex128), crandn(dim, n, dtype=np.complex128)
    out = sw.selective_scan(u, delta, A, B, C, backend="cpu")
    np.testing.assert_allclose(out, selective_reference(u, delta, A, B, C)[0], rtol=1e-11, atol=1e-11)
    with pytest.raises(ScanWeaverValueError, match="length 2L = 24"):
        sw.selective_scan(u, delta, A, RNG.standard_normal((batch, n, L)), C, backend="cpu")
    # backend="cuda" takes complex A now (tests/test_complex_gpu_selective.py): without a
    # GPU it is the backend's error; GPU arrays with "auto" still name the CPU-only case
    from scanweaver import api

    if not api._cuda_usable():
        with pytest.raises(sw.BackendUnavailableError, match="backend='cuda' is not available"):
            sw.selective_scan(u, delta, A, B, C, backend="cuda")


@pytest.mark.parametrize("reverse", [False, True])
def test_time_major_kernel_bit_identical_and_threads_agree(reverse):
    """axis 0 of (L, N) data: the time-major kernel, split over columns on threads,
    gives the interpreter's bits (the sequential reference of scan.affine)."""
    from scanweaver.runtime.cpu_complex import complex_scan_cpu

    L, N = 13, 40
    a, b, h0 = crandn(L, N, scale=0.9), crandn(L, N), crandn(N)
    outs = [complex_scan_cpu(a, b, h0, 0, reverse, threads=t) for t in (1, 2)]
    text = affine_ir("complex<f32>", 2, True, True, reverse).replace(" axis 1", " axis 0")
    h, final = np.zeros((L, N), np.complex64), np.zeros(N, np.complex64)
    run_function(text, "affine", a, b, h0, h, final)
    for got_h, got_final in outs:
        assert got_h.tobytes() == h.tobytes() and got_final.tobytes() == final.tobytes()


def test_empty_axis_keeps_initial_state():
    a = np.zeros((0, 5), np.complex64)
    h, final = sw.linear_scan(a, a, h0=np.full(5, 2 - 1j, np.complex64), axis=0, backend="cpu",
                              return_final_state=True)
    assert h.shape == (0, 5) and final.tolist() == [2 - 1j] * 5
