"""The Linear Recurrent Unit (Orvieto et al. 2023) written as plain loops, and its numpy
reference.  A diagonal complex state h (N,) per sequence:

    h_t[n] = lam[n] * h_{t-1}[n] + gamma[n] * Bu[t, n]          (complex, |lam| < 1)
    y[t, k] = sum_n Re(C[k, n] * h_t[n]) + D[k] * x[t, k]       (real readout)

`Bu` (L, N) is the input projection B x_t, computed before the scan as the paper does
(its parallel part); `gamma` (N,) real is the paper's normalisation.  The builders are
the inputs of `scanweaver-raise` and, interpreted, the golden loop semantics:

    lru_loops(L, N, H)            state in a memref<N x complex> (one scan.recurrence:
                                  gamma*Bu the producer, Re(C h) + D x the consumer)
    lru_iter_arg_loops(C, L)      one complex state per channel as an scf.for iter_arg
    lru_pair_loops(C, L)          the same recurrence by hand on a (re, im) pair of f32
                                  iter_args: hr' = (lr*hr - li*hi) + br,
                                  hi' = (lr*hi + li*hr) + bi
"""

from __future__ import annotations

import numpy as np
from xdsl.builder import ImplicitBuilder  # noqa: F401 - the helpers below build inside one
from xdsl.dialects import complex as cx
from xdsl.dialects.builtin import ComplexType, ModuleOp

from scanweaver.workloads.loops import (
    add,
    const,
    element_type,
    for_,
    function,
    load,
    mref,
    mul,
    store,
    sub,
)


def _complex_type(dtype: str) -> ComplexType:
    return ComplexType(element_type(dtype))


def _re(z):
    return cx.ReOp(z).result


def _im(z):
    return cx.ImOp(z).result


def _cmul(x, y):
    return cx.MulOp(x, y).result


def _cadd(x, y):
    return cx.AddOp(x, y).result


def lru_loops(L: int, N: int, H: int, dtype: str = "f32") -> ModuleOp:
    """@lru(lam (N,) c, gamma (N,) r, Bu (L,N) c, C (H,N) c, D (H,) r, x (L,H) r,
    h (N,) c [initial state in, last state out], y (L,H) r)."""
    r, c = element_type(dtype), _complex_type(dtype)

    def body(lam, gamma, bu, cm, dv, x, h, y):
        def step(t):
            def update(n):
                g = load(gamma, n)
                drive = load(bu, t, n)
                scaled = cx.CreateOp(mul(_re(drive), g), mul(_im(drive), g), c).complex
                store(_cadd(_cmul(load(lam, n), load(h, n)), scaled), h, n)

            for_(0, N, update, iv_name="n")

            def readout(k):
                def term(n, acc):
                    return [add(acc, _re(_cmul(load(cm, k, n), load(h, n))))]

                (total,) = for_(0, N, term, iter_args=[const(0.0, r)], iv_name="n")
                store(add(total, mul(load(dv, k), load(x, t, k))), y, t, k)

            for_(0, H, readout, iv_name="k")

        for_(0, L, step, iv_name="t")

    args = [("lam", mref(c, N)), ("gamma", mref(r, N)), ("Bu", mref(c, L, N)), ("C", mref(c, H, N)),
            ("D", mref(r, H)), ("x", mref(r, L, H)), ("h", mref(c, N)), ("y", mref(r, L, H))]
    return function("lru", args, body)


def lru_iter_arg_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@lru_iter(lam (C,) c, b (C,L) c, h (C,L) c, hT (C,) c): the complex state is the
    time loop's iter_arg, h = lam*h + b from zero."""
    c = _complex_type(dtype)

    def body(lam, b, h, hT):
        def chan(ch):
            lv = load(lam, ch)

            def step(t, s):
                new = _cadd(_cmul(lv, s), load(b, ch, t))
                store(new, h, ch, t)
                return [new]

            zero = cx.ConstantOp.from_floats((0.0, 0.0), element_type(dtype)).complex
            (last,) = for_(0, L, step, iter_args=[zero], iv_name="t")
            store(last, hT, ch)

        for_(0, channels, chan, iv_name="c")

    args = [("lam", mref(c, channels)), ("b", mref(c, channels, L)), ("h", mref(c, channels, L)),
            ("hT", mref(c, channels))]
    return function("lru_iter", args, body)


def lru_pair_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@lru_pair(lr, li (C,), br, bi (C,L), yr, yi (C,L)): the complex recurrence by
    hand on two real iter_args (hr, hi) from zero."""
    r = element_type(dtype)

    def body(lr, li, br, bi, yr, yi):
        def chan(ch):
            a, w = load(lr, ch), load(li, ch)

            def step(t, hr, hi):
                nr = add(sub(mul(a, hr), mul(w, hi)), load(br, ch, t))
                ni = add(add(mul(a, hi), mul(w, hr)), load(bi, ch, t))
                store(nr, yr, ch, t)
                store(ni, yi, ch, t)
                return [nr, ni]

            zero = const(0.0, r)
            for_(0, L, step, iter_args=[zero, zero], iv_name="t")

        for_(0, channels, chan, iv_name="c")

    args = [("lr", mref(r, channels)), ("li", mref(r, channels)), ("br", mref(r, channels, L)),
            ("bi", mref(r, channels, L)), ("yr", mref(r, channels, L)), ("yi", mref(r, channels, L))]
    return function("lru_pair", args, body)


# ---------------------------------------------------------------------------
# numpy reference (complex128)
# ---------------------------------------------------------------------------


def lru_reference(lam, gamma, Bu, C, D, x, h0):
    """(y (L, H) float64, last state (N,) complex128) of `lru_loops`'s function."""
    h = np.asarray(h0, np.complex128).copy()
    lam, Bu, C = (np.asarray(v, np.complex128) for v in (lam, Bu, C))
    ys = []
    for t in range(Bu.shape[0]):
        h = lam * h + np.asarray(gamma, np.float64) * Bu[t]
        ys.append((C @ h).real + np.asarray(D, np.float64) * np.asarray(x, np.float64)[t])
    return np.stack(ys), h


def lru_parameters(N: int, r_min: float = 0.4, r_max: float = 0.99, max_phase: float = 2 * np.pi, seed: int = 0):
    """The paper's initialisation: lam = exp(-exp(nu) + i exp(theta)) uniform on a ring
    r_min <= |lam| <= r_max, phase in [0, max_phase]; gamma = sqrt(1 - |lam|^2)."""
    rng = np.random.default_rng(seed)
    u1, u2 = rng.random(N), rng.random(N)
    nu_log = np.log(-0.5 * np.log(u1 * (r_max**2 - r_min**2) + r_min**2))
    theta_log = np.log(max_phase * u2)
    lam = np.exp(-np.exp(nu_log) + 1j * np.exp(theta_log))
    gamma = np.sqrt(1 - np.abs(lam) ** 2)
    return lam, gamma


__all__ = ["lru_iter_arg_loops", "lru_loops", "lru_pair_loops", "lru_parameters", "lru_reference"]
