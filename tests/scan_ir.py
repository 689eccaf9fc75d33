"""Test helpers: IR text for single scan ops, and float64 numpy references."""

from __future__ import annotations

import numpy as np

from scanweaver.workloads.scans import MLIR_ELEMENT as MLIR_TYPE
from scanweaver.workloads.scans import affine_scan_ir as affine_func
from scanweaver.workloads.scans import memref_type as memref

__all__ = ["MLIR_TYPE", "affine_func", "memref", "affine_reference", "random_inputs"]


def affine_reference(a, b, axis, h0=None, reverse=False, wrap_dtype=None):
    """h_t = a_t h_{t-1} + b_t along `axis` in float64 (or exact Python ints)."""
    a = np.moveaxis(a, axis, -1)
    b = np.moveaxis(b, axis, -1)
    exact = wrap_dtype is not None
    dtype = object if exact else np.float64
    h = np.zeros(a.shape, dtype=dtype)
    state = (
        np.zeros(a.shape[:-1], dtype=dtype)
        if h0 is None
        else np.asarray(h0).astype(dtype)
    )
    steps = range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1])
    for t in steps:
        state = a[..., t].astype(dtype) * state + b[..., t].astype(dtype)
        if exact:
            state = _wrap(state, wrap_dtype)
        h[..., t] = state
    if exact:
        return np.moveaxis(h.astype(wrap_dtype), -1, axis), state.astype(wrap_dtype)
    return np.moveaxis(h, -1, axis), state


def _wrap(x, dtype):
    bits = np.dtype(dtype).itemsize * 8
    f = np.vectorize(lambda v: ((int(v) + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1)), otypes=[object])
    return f(x)


def random_inputs(rng, shape, dtype):
    """Decay-like `a` in (0.5, 1) and `b` in (-1, 1): stable, no overflow."""
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        return (
            rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True),
            rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True),
        )
    a = rng.uniform(0.5, 1.0, size=shape).astype(dtype)
    b = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
    return a, b


def affine_case(seed, shape, axis, dtype, *, init=False, final=False, reverse=False):
    """(IR text, argument arrays) of one scan.affine test case with random inputs."""
    rng = np.random.default_rng(seed)
    a, b = random_inputs(rng, shape, dtype)
    channels = tuple(d for i, d in enumerate(shape) if i != axis)
    arrays = [a, b]
    if init:
        arrays.append(random_inputs(rng, channels, dtype)[1])
    arrays.append(np.zeros(shape, dtype))
    if final:
        arrays.append(np.zeros(channels, dtype))
    el = MLIR_TYPE[np.dtype(dtype)]
    return affine_func(shape, axis, el, el, init=init, final=final, reverse=reverse), arrays
