"""linear_scan without full-size copies: axis != -1 and float16 inputs are staged in
time segments (cpu_scan.affine_scan_staged); results equal the contiguous scan."""

import numpy as np
import pytest

import scanweaver as sw
from scanweaver.runtime import cpu_scan


def _contiguous(a, b, h0, axis, reverse, state):
    """The former path: whole moved, widened copies, one scan."""
    moved = lambda x: np.ascontiguousarray(np.moveaxis(x, axis, -1).astype(state))  # noqa: E731
    ma, mb = moved(a), moved(b)
    shape = ma.shape
    h, f = cpu_scan.affine_scan_cpu(ma.reshape(-1, shape[-1]), mb.reshape(-1, shape[-1]),
                                    None if h0 is None else np.asarray(h0, state).reshape(-1),
                                    reverse=reverse, return_final=True, variant="single")
    return np.moveaxis(h.reshape(shape), -1, axis), f.reshape(shape[:-1])


@pytest.mark.parametrize("dtype,shape,axis,reverse,init", [
    (np.float32, (300, 7), 0, True, True),
    (np.float16, (5, 301), -1, False, True),
    (np.float16, (301, 5), 0, True, True),
    (np.int32, (4, 97, 3), 1, True, True),  # channel dims do not merge: the copying path
    (np.int64, (97, 2, 3), 0, True, True),
])
def test_staged_segments_equal_the_whole_scan(monkeypatch, dtype, shape, axis, reverse, init):
    monkeypatch.setattr(cpu_scan, "SEGMENT_ELEMENTS", 64)  # many segments, and a short last one
    rng = np.random.default_rng(7)
    if np.dtype(dtype).kind == "f":
        a, b = rng.uniform(-1.1, 1.1, shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    else:
        a, b = rng.integers(-3, 4, shape).astype(dtype), rng.integers(-99, 99, shape).astype(dtype)
    state = np.float32 if dtype == np.float16 else dtype
    chan = shape[:axis % len(shape)] + shape[axis % len(shape) + 1:]
    h0 = rng.integers(-3, 3, chan).astype(state) if init else None
    got_h, got_f = sw.linear_scan(a, b, h0=h0, axis=axis, reverse=reverse, return_final_state=True)
    want_h, want_f = _contiguous(a, b, h0, axis, reverse, state)
    assert got_h.dtype == np.dtype(state) and got_h.shape == shape
    np.testing.assert_array_equal(got_h, want_h)
    np.testing.assert_array_equal(got_f, want_f)


def test_staging_keeps_extra_memory_to_the_segments(monkeypatch):
    import tracemalloc

    monkeypatch.setattr(cpu_scan, "SEGMENT_ELEMENTS", 1 << 12)
    a = np.full((1 << 16, 4), 0.5, np.float16)
    sw.linear_scan(a, a, axis=0)  # compile first
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        h = sw.linear_scan(a, a, axis=0)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert h.nbytes == 4 * a.size
    assert peak < h.nbytes + 3 * 4 * (1 << 12) + (1 << 16)  # the result, three segments, small change
