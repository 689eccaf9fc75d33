"""numpy references (float64) for the loop workloads in `loops.py`."""

from __future__ import annotations

import numpy as np


def softplus(x: np.ndarray) -> np.ndarray:
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def selective_scan_reference(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
    return_last_state=False,
):
    """shared/DESIGN.md §2 in float64, streaming over time: no (batch, D, L, N) array.

    B, C: (D, N) constant, (batch, N, L) shared, or (batch, G, N, L) grouped."""
    u, delta, A = (np.asarray(v, np.float64) for v in (u, delta, A))
    B, C = np.asarray(B, np.float64), np.asarray(C, np.float64)
    batch, dim, L = u.shape
    dt = delta + (np.asarray(delta_bias, np.float64)[None, :, None] if delta_bias is not None else 0.0)
    if delta_softplus:
        dt = softplus(dt)

    def at_step(M, t):  # -> (batch or 1, D, N) for step t
        if M.ndim == 2:
            return M[None]
        if M.ndim == 3:
            return M[:, None, :, t]
        return np.repeat(M[:, :, :, t], dim // M.shape[1], axis=1)

    h = np.zeros((batch, dim, A.shape[1]))
    y = np.zeros((batch, dim, L))
    for t in range(L):
        d = dt[:, :, t, None]
        h = np.exp(d * A[None]) * h + d * at_step(B, t) * u[:, :, t, None]
        y[:, :, t] = np.sum(h * at_step(C, t), axis=-1)
    out = y
    if D is not None:
        out = out + np.asarray(D, np.float64)[None, :, None] * u
    if z is not None:
        zz = np.asarray(z, np.float64)
        out = out * zz / (1.0 + np.exp(-zz))
    return (out, h) if return_last_state else out


def ema_reference(x, alpha, h0):
    x, alpha = np.asarray(x, np.float64), np.asarray(alpha, np.float64)
    h = np.asarray(h0, np.float64).copy()
    y = np.empty_like(x)
    for t in range(x.shape[1]):
        h = alpha * h + (1 - alpha) * x[:, t]
        y[:, t] = h
    return y, h


def discounted_return_reference(r, gamma, g0):
    r, gamma = np.asarray(r, np.float64), np.asarray(gamma, np.float64)
    g = np.asarray(g0, np.float64).copy()
    G = np.empty_like(r)
    for t in range(r.shape[1] - 1, -1, -1):
        g = r[:, t] + gamma * g
        G[:, t] = g
    return G, g


def reset_reference(x, a, done, h0):
    x, a = np.asarray(x, np.float64), np.asarray(a, np.float64)
    h = np.asarray(h0, np.float64).copy()
    y = np.empty_like(x)
    for t in range(x.shape[0]):
        h = a[t] * np.where(done[t] != 0, 0.0, h) + x[t]
        y[t] = h
    return y, h


def iir2_reference(x, c1, c2):
    x = np.asarray(x, np.float64)
    c1, c2 = np.asarray(c1, np.float64), np.asarray(c2, np.float64)
    y1 = np.zeros(x.shape[0])
    y2 = np.zeros(x.shape[0])
    y = np.empty_like(x)
    for t in range(x.shape[1]):
        y1, y2 = c1 * y1 + c2 * y2 + x[:, t], y1
        y[:, t] = y1
    return y


def cumsum_reference(x):
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.integer):
        return np.cumsum(x, axis=1, dtype=x.dtype)  # numpy wraps like the loop
    return np.cumsum(np.asarray(x, np.float64), axis=1)


def cumprod_reference(x):
    x = np.asarray(x)
    if np.issubdtype(x.dtype, np.integer):
        return np.cumprod(x, axis=1, dtype=x.dtype)
    return np.cumprod(np.asarray(x, np.float64), axis=1)
