"""The large-output cache of `aligned_empty` (runtime/cpu_variants.py): a buffer is
handed out again only when nothing outside the cache refers to it."""

import threading

import numpy as np
import pytest

from scanweaver.runtime import cpu_variants as cv
from scanweaver.runtime.cpu_scan import affine_scan_cpu

SHAPE = (8, cv.OUTPUT_CACHE_MIN_BYTES // 8 // 4)  # float32: exactly the smallest cached size


@pytest.fixture(autouse=True)
def _empty_cache():
    cv.release_outputs()
    yield
    cv.release_outputs()


def test_reused_only_when_unreferenced():
    x = cv.aligned_empty(SHAPE, np.float32)
    ptr = x.ctypes.data
    assert ptr % 64 == 0
    view = x.reshape(-1)[5:]  # a view keeps the buffer in use
    del x
    y = cv.aligned_empty(SHAPE, np.float32)
    assert y.ctypes.data != ptr
    del view
    z = cv.aligned_empty(SHAPE, np.float32)
    assert z.ctypes.data == ptr
    # Another size or dtype of the same byte count may share it; a different size does not.
    del z
    w = cv.aligned_empty((SHAPE[0] + 1, SHAPE[1]), np.float32)
    assert w.ctypes.data != ptr


def test_small_outputs_not_cached():
    x = cv.aligned_empty((4, 1024), np.float32)
    assert cv._OUTPUTS._bufs == []  # glibc's heap reuses these already
    assert x.ctypes.data % 64 == 0


def test_cap_and_off_switch(monkeypatch):
    monkeypatch.setenv("SCANWEAVER_OUTPUT_CACHE_MB", str((2 * cv.OUTPUT_CACHE_MIN_BYTES >> 20) + 1))
    held = [cv.aligned_empty(SHAPE, np.float32) for _ in range(3)]  # the cap holds two
    assert len(cv._OUTPUTS._bufs) == 2
    assert len({h.ctypes.data for h in held}) == 3  # buffers in use are never shared
    del held
    monkeypatch.setenv("SCANWEAVER_OUTPUT_CACHE_MB", "0")
    cv.release_outputs()
    cv.aligned_empty(SHAPE, np.float32)
    assert cv._OUTPUTS._bufs == []


def test_results_stay_distinct_and_correct():
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 1.0, SHAPE).astype(np.float32)
    b = rng.standard_normal(SHAPE).astype(np.float32)
    first = affine_scan_cpu(a, b, variant="single")
    kept = first.copy()
    second = affine_scan_cpu(a * 0.5, b, variant="single")  # `first` still alive: a new buffer
    assert first.ctypes.data != second.ctypes.data
    np.testing.assert_array_equal(first, kept)
    del second
    again = affine_scan_cpu(a, b, variant="single")  # may reuse second's buffer: same bits
    np.testing.assert_array_equal(again, kept)


def test_threads_never_share_a_buffer():
    got, barrier = [], threading.Barrier(4)

    def take():
        barrier.wait()
        got.append(cv.aligned_empty(SHAPE, np.float32))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({x.ctypes.data for x in got}) == 4
