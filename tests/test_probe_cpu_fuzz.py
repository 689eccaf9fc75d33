"""Differential fuzz of the CPU API against plain sequential loops (session 26 probe),
and the regressions it found.

`linear_scan` is compared with a numpy loop in the state dtype (separate multiply and
add; Python-int-exact wrap-around for integers, so integer results must be equal bit for
bit); float results must be bit-identical or within the README "Numerics" bound of the
chunked variant (error in units of the loop's rounding scale u*m_t), finite wherever the
loop is.  `selective_scan` is compared with a float64 loop, relative to the magnitude
sum_n |C_n| m_n of the terms.  Seeds are fixed; widen `CASES` ad hoc for a longer sweep.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError

CASES = 40
DTYPES = ("float16", "float32", "float64", "int32", "int64", "complex64", "complex128")
LENGTHS = (0, 1, 2, 3, 7, 16, 33, 257, 1000, 5000, 70000)


def loop_scan(a, b, h0, axis, reverse, state):
    """h[t] = a[t] * h[t-1] + b[t] along `axis`, in `state` precision; also the final
    state and the rounding scale m_t = |a_t| m_{t-1} + |a_t h_{t-1}| + |b_t|."""
    a = np.moveaxis(a, axis, -1).astype(state)
    b = np.moveaxis(b, axis, -1).astype(state)
    s = np.zeros(a.shape[:-1], state)
    if h0 is not None:
        s = np.broadcast_to(np.asarray(h0).astype(state), a.shape[:-1]).copy()
    h, m = np.empty_like(a), np.zeros(a.shape, np.float64)
    ms = np.abs(s).astype(np.float64)
    with np.errstate(all="ignore"):
        for t in range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1]):
            ms = np.abs(a[..., t]) * ms + np.abs(a[..., t] * s) + np.abs(b[..., t])
            s = a[..., t] * s + b[..., t]
            h[..., t], m[..., t] = s, ms
    return np.moveaxis(h, -1, axis), s, np.moveaxis(m, -1, axis)


def random_operands(rng, shape, dtype):
    """a, b with decays below, at and above 1, zeros, and now and then Inf/NaN/huge."""
    dt = np.dtype(dtype)
    if dt.kind == "i":
        wide = rng.random() < 0.3  # full-range values: the products wrap around
        hi = 2**31 if wide else 6
        return (rng.integers(-hi, hi, shape).astype(dt), rng.integers(-hi * 100, hi * 100, shape).astype(dt))

    def draw(lo, hi):
        x = rng.uniform(lo, hi, shape)
        return x * np.exp(1j * rng.uniform(0, 2 * np.pi, shape)) if dt.kind == "c" else x

    a = [draw(0.5, 1.02), draw(-1.5, 1.5), rng.choice([0.0, 1.0, 2.0, 0.5], shape), draw(0.99, 1.0)][
        rng.integers(4)]
    b = draw(-1, 1)
    if a.size and rng.random() < 0.2:
        a.flat[rng.integers(a.size)] = rng.choice([np.nan, np.inf, 0.0])
        b.flat[rng.integers(b.size)] = rng.choice([np.nan, -np.inf, 1e30])
    return a.astype(dt), b.astype(dt)


def as_layout(x, rng):
    """The same values as a C, Fortran, negative-stride or every-other-element view."""
    kind = rng.integers(4)
    if kind == 1:
        return np.asfortranarray(x)
    if kind == 2:
        return x[::-1].copy()[::-1]
    if kind == 3:
        return np.repeat(x, 2, axis=-1)[..., ::2]
    return x


def random_linear_case(rng):
    dtype = DTYPES[rng.integers(len(DTYPES))]
    rank = int(rng.integers(1, 5))
    shape = [int(rng.choice([0, 1, 2, 3, 5, 8])) for _ in range(rank)]
    axis = int(rng.integers(-rank, rank))
    shape[axis] = int(rng.choice(LENGTHS))
    if np.prod(shape) > 200_000:  # long rows alone: the time-parallel variants
        shape = [1] * rank
        shape[axis] = 70000
    return dtype, tuple(shape), axis


def random_initial_state(rng, channels, state):
    kind = rng.integers(4)
    if kind == 1:
        return rng.uniform(-2, 2, channels).astype(state)
    if kind == 2:
        return int(rng.integers(-3, 3)) if state.kind == "i" else float(rng.uniform(-2, 2))
    if kind == 3:
        return rng.integers(-3, 3, channels).astype(state).tolist()
    return None


def check_linear_case(rng):
    dtype, shape, axis = random_linear_case(rng)
    state = np.dtype(np.float32) if dtype == "float16" else np.dtype(dtype)
    a, b = random_operands(rng, shape, dtype)
    channels = shape[: axis % len(shape)] + shape[axis % len(shape) + 1 :]
    h0 = random_initial_state(rng, channels, state)
    if isinstance(h0, list) and 0 in channels:
        h0 = None  # an empty nested list loses its shape (a numpy trait, not ours)
    reverse, final = bool(rng.integers(2)), bool(rng.integers(2))
    what = f"{dtype} {shape} axis={axis} reverse={reverse} h0={type(h0).__name__}"
    out = scanweaver.linear_scan(as_layout(a, rng), as_layout(b, rng), h0, axis=axis, reverse=reverse,
                                 return_final_state=final, backend="cpu")
    h, last = out if final else (out, None)
    want, want_last, scale = loop_scan(a, b, h0, axis, reverse, state)
    assert h.shape == shape and h.dtype == state, what
    if final:
        assert last.shape == channels and last.dtype == state, what
        if shape[axis]:
            np.testing.assert_array_equal(last, np.take(h, 0 if reverse else -1, axis=axis), err_msg=what)
        else:
            np.testing.assert_array_equal(last, want_last, err_msg=what)
    if state.kind == "i" or np.array_equal(h, want, equal_nan=True):
        np.testing.assert_array_equal(h, want, err_msg=what)
        return
    finite = np.isfinite(want)
    assert np.isfinite(h)[finite].all(), f"{what}: not finite where the loop is"
    assert not np.isnan(h)[~np.isnan(want)].any(), f"{what}: NaN where the loop has none"
    with np.errstate(all="ignore"):
        err = np.abs(h.astype(np.complex128) - want) / (np.finfo(state).eps * scale)
    # README "Numerics": at most twice the loop's own error (<= L u m_t), measured per step
    assert np.nan_to_num(err[finite & (scale > 0)], posinf=0).max(initial=0) <= 64, what


@pytest.mark.parametrize("seed", range(CASES))
def test_linear_scan_matches_the_sequential_loop(seed):
    check_linear_case(np.random.default_rng(seed))


@pytest.mark.parametrize("seed", range(4))
def test_linear_scan_matches_the_loop_on_three_threads(seed, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_NUM_THREADS", "3")
    check_linear_case(np.random.default_rng(1000 + seed))


def selective_loop(u, delta, A, B, C, D, z, bias, softplus, h0):
    """shared/DESIGN.md section 2 in float64; also the magnitude of the terms of out."""
    u, delta, A, B, C = (np.asarray(x, np.float64) for x in (u, delta, A, B, C))
    dt = delta + (0 if bias is None else np.asarray(bias, np.float64)[None, :, None])
    if softplus:
        dt = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))
    batch, dim, L = u.shape

    def at(M, t):
        if M.ndim == 2:
            return M[None]
        if M.ndim == 3:
            return M[:, None, :, t]
        return np.repeat(M[:, :, :, t], dim // M.shape[1], axis=1)

    h = np.zeros((batch, dim, A.shape[1])) if h0 is None else np.asarray(h0, np.float64)
    m = np.abs(h)
    y, mag = np.zeros(u.shape), np.zeros(u.shape)
    for t in range(L):
        decay = np.exp(dt[:, :, t, None] * A[None])
        push = dt[:, :, t, None] * at(B, t) * u[:, :, t, None]
        h, m = decay * h + push, decay * m + np.abs(push)
        y[:, :, t], mag[:, :, t] = (h * at(C, t)).sum(-1), (m * np.abs(at(C, t))).sum(-1)
    if D is not None:
        skip = np.asarray(D, np.float64)[None, :, None] * u
        y, mag = y + skip, mag + np.abs(skip)
    if z is not None:
        zz = np.asarray(z, np.float64)
        gate = zz / (1 + np.exp(-zz))
        y, mag = y * gate, mag * np.abs(gate)
    return y, h, mag


def random_bc(rng, batch, dim, N, L, dtype):
    form = rng.integers(3)
    if form == 0:
        return rng.standard_normal((dim, N)).astype(dtype)
    if form == 1:
        return rng.standard_normal((batch, N, L)).astype(dtype)
    groups = [g for g in range(1, dim + 1) if dim % g == 0] or [1]
    return rng.standard_normal((batch, int(rng.choice(groups)), N, L)).astype(dtype)


@pytest.mark.parametrize("seed", range(12))
def test_selective_scan_matches_a_float64_loop(seed):
    rng = np.random.default_rng(seed)
    batch, dim = int(rng.choice([0, 1, 2, 3])), int(rng.choice([1, 2, 4, 6, 17]))
    L, N = int(rng.choice([0, 1, 2, 17, 33, 300, 2000])), int(rng.choice([1, 4, 16, 17, 64]))
    dtype = rng.choice(["float16", "float32", "float64"])
    u = rng.standard_normal((batch, dim, L)).astype(dtype)
    # dt >= 0 with A < 0: decays, as in Mamba (growth would overflow the float32 math)
    delta = np.abs(rng.standard_normal((batch, dim, L)) * 0.5).astype(dtype)
    A = -np.exp(rng.standard_normal((dim, N))).astype(dtype)
    B, C = (random_bc(rng, batch, dim, N, L, dtype) for _ in range(2))
    maybe = lambda make: make() if rng.random() < 0.5 else None  # noqa: E731
    D = maybe(lambda: rng.standard_normal(dim).astype(dtype))
    z = maybe(lambda: rng.standard_normal((batch, dim, L)).astype(dtype))
    bias = maybe(lambda: np.abs(rng.standard_normal(dim) * 0.3).astype(dtype))
    h0 = maybe(lambda: rng.standard_normal((batch, dim, N)).astype(dtype))
    softplus = bool(rng.integers(2))
    out, last = scanweaver.selective_scan(u, delta, A, B, C, D=D, z=z, delta_bias=bias, delta_softplus=softplus,
                                          return_last_state=True, initial_state=h0, backend="cpu")
    y, h, mag = selective_loop(u, delta, A, B, C, D, z, bias, softplus, h0)
    assert out.shape == u.shape and out.dtype == u.dtype and last.shape == (batch, dim, N)
    # float32 math (README): a few units of f32 rounding of the terms; f16 output rounding
    f16 = np.finfo(np.float16)
    tol = 8 * np.finfo(np.float32).eps * mag
    if dtype == "float16":  # and the output's rounding, subnormals included
        tol = tol + f16.eps * np.abs(y) + f16.smallest_subnormal
    fits = np.abs(y) < 0.99 * np.finfo(dtype).max  # beyond, a float16 out rounds to +-inf
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(out.astype(np.float64) - y) <= tol + 1e-30) & fits
        assert not bad.any(), (out[bad][:4], y[bad][:4], mag[bad][:4])
    assert (np.isinf(out) & (np.sign(out) == np.sign(y)))[np.abs(y) / 1.01 > np.finfo(dtype).max].all()
    np.testing.assert_allclose(last, h, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(h).max(initial=0)))


# ----------------------------------------------------------------- regressions it found


def test_an_empty_list_h0_fits_an_integer_state():
    """`[[], []]` is numpy's float64 with no values: it was refused as 'floating-point values'."""
    a = np.ones((2, 0, 3), np.int32)
    assert scanweaver.linear_scan(a, a, [[], []]).shape == (2, 0, 3)


@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("shape, dim", [((3, 0), -1), ((0, 0), 0), ((2, 0, 4), 1)])
def test_torch_linear_scan_of_an_empty_dim(shape, dim, dtype):
    """L = 0 left reshape(-1, 0) undetermined: a RuntimeError from torch."""
    torch = pytest.importorskip("torch")
    from scanweaver.torch import linear_scan

    a = torch.ones(shape, dtype=getattr(torch, dtype), requires_grad=True)
    h = linear_scan(a, a.detach(), dim=dim)
    assert h.shape == a.shape
    h.abs().sum().backward()
    assert a.grad.shape == a.shape


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
def test_torch_linear_scan_argument_types(dtype):
    torch = pytest.importorskip("torch")
    from scanweaver.torch import linear_scan

    a = torch.ones(2, 5, dtype=getattr(torch, dtype))
    for bad in (1.0, "x", None):
        with pytest.raises(ScanWeaverTypeError, match="dim must be an integer"):
            linear_scan(a, a, dim=bad)
    with pytest.raises(ScanWeaverValueError, match="dim 2 is out of range"):
        linear_scan(a, a, dim=2)
    for bad in ("yes", 1):
        with pytest.raises(ScanWeaverTypeError, match="reverse must be True or False"):
            linear_scan(a, a, reverse=bad)
    with pytest.raises(ScanWeaverTypeError, match="argument 'b' is required"):
        linear_scan(a, None)
    want = linear_scan(a, a, dim=0, reverse=True)  # numpy integers and bools, as numpy's API takes
    assert torch.equal(linear_scan(a, a, dim=np.int64(0), reverse=np.bool_(True)), want)


@pytest.mark.parametrize("complex_A", [False, True])
@pytest.mark.parametrize("L", [10, 4096])
def test_torch_selective_backward_without_channels(complex_A, L):
    """D = 0 has no backward task: the real op indexed an empty task list, the complex one
    summed an empty one (IndexError); dB and dC of shared B, C are zeros (at L = 4096 from
    the reused, uninitialised gradient buffers)."""
    torch = pytest.importorskip("torch")
    from scanweaver.torch import selective_scan_fn

    u = torch.randn(2, 0, L, requires_grad=True)
    A = -torch.rand(0, 16)
    if complex_A:
        A = torch.complex(A, torch.rand(0, 16))
    A.requires_grad_()
    width = 2 * L if complex_A else L  # complex A: (re, im) pairs along the last axis
    B, C = (torch.randn(2, 16, width, requires_grad=True) for _ in range(2))
    out, last = selective_scan_fn(u, torch.rand(2, 0, L), A, B, C, return_last_state=True)
    (out.sum() + last.abs().sum()).backward()
    assert out.shape == (2, 0, L) and last.shape == (2, 0, 16)
    assert u.grad.shape == u.shape and A.grad.shape == A.shape
    assert torch.count_nonzero(B.grad) == 0 and torch.count_nonzero(C.grad) == 0


@pytest.mark.parametrize("dtype", ["int64", "int32", "float32", "complex64"])
@pytest.mark.parametrize("h0", [2**70, [2**70, 1], -(2**100)])
def test_an_h0_integer_past_64_bits_is_a_value_error(dtype, h0):
    """numpy makes such a Python int an object array: it was refused as 'dtype object'
    (a TypeError), where a smaller overflow (2**40 for int32) is a ValueError."""
    a = np.ones((2, 3), dtype)
    with pytest.raises(ScanWeaverValueError, match="'h0' has values that do not fit the state dtype"):
        scanweaver.linear_scan(a, a, h0)


def test_numpy_api_takes_torch_tensors_or_names_the_argument():
    """A tensor's dtype is not a numpy dtype: the complex test raised numpy's raw
    TypeError "Cannot interpret 'torch.float32' as a data type" before any check."""
    torch = pytest.importorskip("torch")
    a = torch.rand(2, 5)
    np.testing.assert_array_equal(scanweaver.linear_scan(a, a), scanweaver.linear_scan(a.numpy(), a.numpy()))
    u, A, B = torch.randn(1, 2, 3), -torch.rand(2, 4), torch.randn(2, 4)
    assert scanweaver.selective_scan(u, u.abs(), A, B, B).shape == (1, 2, 3)
    with pytest.raises(ScanWeaverValueError, match="argument 'a' is not an array: .*requires grad"):
        scanweaver.linear_scan(a.requires_grad_(), a)


def test_compiled_functions_refuse_keywords_and_unsupported_signatures():
    """A keyword argument escaped as Python's own TypeError; a tensor argument reached
    mlir-translate and came back as a ToolFailedError."""
    program = scanweaver.compile("func.func @f(%x: memref<?xf32>) {\n  func.return\n}")
    with pytest.raises(ScanWeaverTypeError, match="@f takes its arguments by position, got keyword 'x'"):
        program.f(x=np.zeros(3, np.float32))
    with pytest.raises(ScanWeaverTypeError, match="@f: unsupported scalar type 'tensor<4xf32>'"):
        scanweaver.compile("func.func @f(%x: tensor<4xf32>) {\n  func.return\n}")


@pytest.mark.parametrize("complex_A", [False, True])
@pytest.mark.parametrize("flag", ["delta_softplus", "return_last_state"])
def test_torch_selective_flags_must_be_booleans(flag, complex_A):
    """As in the numpy API: 'yes' or 1 ran as True (and return_last_state=1 returned a tuple)."""
    torch = pytest.importorskip("torch")
    from scanweaver.torch import selective_scan_fn

    A = -torch.rand(2, 3)
    if complex_A:
        A = torch.complex(A, torch.rand(2, 3))
    u, B = torch.randn(1, 2, 4), torch.randn(2, 3, dtype=A.dtype)
    for bad in ("yes", 1):
        with pytest.raises(ScanWeaverTypeError, match=f"{flag} must be True or False"):
            selective_scan_fn(u, u.abs(), A, B, B, **{flag: bad})
    want = selective_scan_fn(u, u.abs(), A, B, B, **{flag: True})
    got = selective_scan_fn(u, u.abs(), A, B, B, **{flag: np.bool_(True)})  # numpy bools, as numpy's API takes
    for w, g in zip(*(x if isinstance(x, tuple) else (x,) for x in (want, got)), strict=True):
        assert torch.equal(w, g)
