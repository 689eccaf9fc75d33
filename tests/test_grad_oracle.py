"""scanweaver-grad: the interpreted VJP of every workload agrees with finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from grad_oracle import check_vjp, raise_and_grad

from scanweaver.workloads import loops
from scanweaver.workloads.scans import affine_scan_ir

RNG = np.random.default_rng


def _ss_args(rng, batch, D, L, N, bc, groups, with_D, with_z, with_bias, last):
    shape = {"constant": (D, N), "shared": (batch, N, L), "grouped": (batch, groups, N, L)}[bc]
    args = [rng.standard_normal((batch, D, L)), rng.uniform(-1.0, 1.0, (batch, D, L)),
            -rng.uniform(0.3, 1.5, (D, N)), rng.standard_normal(shape), rng.standard_normal(shape)]
    args += [rng.standard_normal(D)] if with_D else []
    args += [rng.standard_normal((batch, D, L))] if with_z else []
    args += [rng.uniform(-0.5, 0.5, D)] if with_bias else []
    args += [np.zeros((batch, D, L))]
    args += [np.zeros((batch, D, N))] if last else []
    return args


@pytest.mark.parametrize(
    "bc, groups, with_D, with_z, with_bias, softplus, last",
    [
        ("constant", 1, True, True, True, True, False),
        ("constant", 1, False, False, False, False, True),
        ("shared", 1, True, False, True, True, True),
        ("grouped", 2, False, True, False, True, False),
    ],
)
@pytest.mark.parametrize("window", [8192, 2])  # 2: one chunk of 3 in the window
def test_selective_scan_vjp(bc, groups, with_D, with_z, with_bias, softplus, last, window):
    batch, D, L, N = 1, 2, 5, 3
    m = loops.selective_scan_loops(batch, D, L, N, bc=bc, groups=groups, with_D=with_D, with_z=with_z,
                                   with_delta_bias=with_bias, delta_softplus=softplus, dtype="f64",
                                   return_last_state=last)
    text = raise_and_grad(m, chunk=2, window=window)
    assert "scan.recurrence" in text.split("@selective_scan_vjp")[1]
    rng = RNG(1)
    check_vjp(text, "selective_scan", _ss_args(rng, batch, D, L, N, bc, groups, with_D, with_z, with_bias, last), rng)


SMALL = [
    ("ema", lambda: loops.ema_loops(2, 5, "f64"),
     lambda r: [r.standard_normal((2, 5)), r.uniform(0.2, 0.9, 2), r.standard_normal(2), np.zeros((2, 5)), np.zeros(2)]),
    ("discounted_return", lambda: loops.discounted_return_loops(2, 5, "f64"),
     lambda r: [r.standard_normal((2, 5)), r.uniform(0.5, 0.99, 2), r.standard_normal(2), np.zeros((2, 5))]),
    ("reset", lambda: loops.reset_loops(3, 5, "f64"),
     lambda r: [r.standard_normal((5, 3)), r.uniform(0.2, 0.9, (5, 3)), np.array([0, 0, 1, 0, 1], np.int32),
                r.standard_normal(3), np.zeros((5, 3))]),
    ("iir2", lambda: loops.iir2_loops(2, 6, "f64"),
     lambda r: [r.standard_normal((2, 6)), r.uniform(0.1, 0.5, 2), r.uniform(-0.4, 0.2, 2), np.zeros((2, 6))]),
    ("cumsum", lambda: loops.cumsum_loops(2, 5, "f64"), lambda r: [r.standard_normal((2, 5)), np.zeros((2, 5))]),
    ("cumprod", lambda: loops.cumprod_loops(2, 5, "f64"),
     lambda r: [r.uniform(0.5, 1.5, (2, 5)), np.zeros((2, 5))]),
    ("shifted_recurrence", lambda: loops.shifted_recurrence_loops(2, 6, dtype="f64"),
     lambda r: [r.uniform(-0.9, 0.9, (2, 6)), r.standard_normal((2, 6)), r.standard_normal((2, 6))]),
    ("shifted_recurrence", lambda: loops.shifted_recurrence_loops(2, 6, reverse=True, dtype="f64"),
     lambda r: [r.uniform(-0.9, 0.9, (2, 6)), r.standard_normal((2, 6)), r.standard_normal((2, 6))]),
]


@pytest.mark.parametrize("name, build, make_args", SMALL, ids=[f"{s[0]}{i}" for i, s in enumerate(SMALL)])
@pytest.mark.parametrize("chunk, window", [(2, 8192), (64, 8192), (2, 4)])
def test_small_workload_vjp(name, build, make_args, chunk, window):
    text = raise_and_grad(build(), chunk=chunk, window=window)
    assert f"@{name}_vjp" in text
    rng = RNG(7)
    check_vjp(text, name, make_args(rng), rng)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("init, final", [(False, False), (True, True), (True, False)])
def test_affine_scan_vjp(reverse, init, final):
    text = raise_and_grad(affine_scan_ir((3, 6), 1, "f64", "f64", init=init, final=final, reverse=reverse))
    rng = RNG(3)
    args = [rng.uniform(-1, 1, (3, 6)), rng.standard_normal((3, 6))]
    args += [rng.standard_normal(3)] if init else []
    args += [np.zeros((3, 6))]
    args += [np.zeros(3)] if final else []
    check_vjp(text, "f", args, rng)


def test_affine_scan_vjp_axis0():
    text = raise_and_grad(affine_scan_ir((5, 2), 0, "f64", "f64", init=True, final=True))
    rng = RNG(4)
    args = [rng.uniform(-1, 1, (5, 2)), rng.standard_normal((5, 2)), rng.standard_normal(2),
            np.zeros((5, 2)), np.zeros(2)]
    check_vjp(text, "f", args, rng)


def test_vjp_matches_closed_form_for_ema():
    """A case with a known answer: dL/dx[t] for y = EMA(x), L = sum(y) over 3 steps."""
    text = raise_and_grad(loops.ema_loops(1, 3, "f64"))
    a = 0.5
    args = [np.array([[1.0, 2.0, 3.0]]), np.array([a]), np.array([0.0]), np.zeros((1, 3)), np.zeros(1)]
    from scanweaver.interp.run import run_function

    shadows = [np.zeros((1, 3)), np.zeros(1), np.zeros(1), np.ones((1, 3)), np.zeros(1)]
    run_function(text, "ema_vjp", *args, *shadows)
    # y_t = sum_{s<=t} a^(t-s) (1-a) x_s  ->  dL/dx_s = (1-a) * sum_{t>=s} a^(t-s)
    expect = [(1 - a) * (1 + a + a * a), (1 - a) * (1 + a), (1 - a)]
    np.testing.assert_allclose(shadows[0][0], expect, rtol=1e-12)
    np.testing.assert_array_equal(shadows[3], 0.0)  # the output's cotangent is consumed


def test_selective_scan_vjp_matches_jax():
    """Where JAX is installed: the interpreted VJP against jax.vjp of the same computation
    written in jax.numpy (float64)."""
    jax = pytest.importorskip("jax", reason="jax is not installed (pip install '.[bench]' to run this check)")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    batch, D, L, N = 1, 2, 5, 3
    text = raise_and_grad(loops.selective_scan_loops(batch, D, L, N, dtype="f64"), chunk=2)
    rng = RNG(5)
    args = _ss_args(rng, batch, D, L, N, "constant", 1, True, True, True, False)

    def f(u, delta, A, B, C, Dk, z, bias):
        dt = delta + bias[None, :, None]
        dt = jnp.where(dt > 20.0, dt, jnp.log1p(jnp.exp(jnp.minimum(dt, 20.0))))
        h = jnp.zeros((batch, D, N))
        ys = []
        for t in range(L):
            h = jnp.exp(dt[:, :, t, None] * A[None]) * h + (dt[:, :, t] * u[:, :, t])[..., None] * B[None]
            ys.append(jnp.sum(h * C[None], axis=-1))
        y = jnp.stack(ys, axis=-1) + Dk[None, :, None] * u
        return y * z / (1.0 + jnp.exp(-z))

    g = rng.standard_normal((batch, D, L))
    _, pullback = jax.vjp(f, *[jnp.asarray(a) for a in args[:-1]])
    want = pullback(jnp.asarray(g))
    from scanweaver.interp.run import run_function

    shadows = [np.zeros_like(a) for a in args[:-1]] + [g.copy()]
    run_function(text, "selective_scan_vjp", *[a.copy() for a in args], *shadows)
    for got, ref in zip(shadows, want):
        np.testing.assert_allclose(got, np.asarray(ref), rtol=1e-10, atol=1e-12)
