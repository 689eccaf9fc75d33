"""Corner cases found by the outside-user probe of the newest CPU paths
(`scanweaver/bench/fuzz_cpu.py` is the longer seeded driver): each test is the
minimal failing case of one bug, kept as a regression test."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.runtime import cpu_chunked
from scanweaver.runtime.cpu_scan import affine_scan_cpu


@pytest.fixture
def small_chunks():
    old = cpu_chunked.CHUNKED_TEST_MIN_CHUNK
    cpu_chunked.CHUNKED_TEST_MIN_CHUNK = 16
    yield
    cpu_chunked.CHUNKED_TEST_MIN_CHUNK = old


@pytest.mark.parametrize("reverse, L", [(False, 256), (True, 256 + 5)])  # forward: no tail past the chunks
def test_chunked_final_state_is_the_last_step_of_h(small_chunks, reverse, L):
    # Fewer rows than threads: the time-chunked form (not the cache-blocked one).  The
    # final state returned was the f64 carry after the last chunk rounded once, not the
    # last state the scan wrote into h (1 ulp apart; linear_scan of a 1 x 2^21 f32 row).
    rng = np.random.default_rng(5)
    a = rng.uniform(0.5, 1.0, (2, L)).astype(np.float32)
    b = rng.standard_normal((2, L)).astype(np.float32)
    h, last = affine_scan_cpu(a, b, None, reverse, True, variant="chunked", threads=3)
    edge = h[:, 0] if reverse else h[:, -1]
    assert last.tobytes() == edge.tobytes(), (last, edge)


def test_chunked_of_no_rows_is_empty():
    # variant="chunked" with 0 rows raised numpy's "could not broadcast" ValueError.
    a = np.ones((0, 8192), np.float32)
    h, last = affine_scan_cpu(a, a, None, False, True, variant="chunked", threads=2)
    assert h.shape == (0, 8192) and last.shape == (0,)


def test_linear_scan_takes_numpy_bool_flags():
    # _check_flag accepts np.bool_, but the kernel cache's key refused it: a raw
    # "TypeError: cannot key a workload option of type bool" for reverse=np.True_.
    import scanweaver
    from scanweaver.runtime.cpu_jit import clear_cache

    a = np.full((2, 5), 0.5, np.float32)
    clear_cache()  # the in-process kernel getters, whose keys take np.True_ as True
    got = scanweaver.linear_scan(a, a, 1.0, axis=0, reverse=np.bool_(True))
    want = scanweaver.linear_scan(a, a, 1.0, axis=0, reverse=True)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("name", ["SCANWEAVER_NUM_THREADS", "SCANWEAVER_OUTPUT_CACHE_MB"])
def test_a_non_integer_thread_or_cache_variable_is_one_clear_error(monkeypatch, name):
    # int("abc") escaped as a bare ValueError from deep inside the call.
    import scanweaver
    from scanweaver.errors import ScanWeaverValueError

    monkeypatch.setenv(name, "abc")
    a = np.full((4, 1 << 19), 0.5, np.float32)  # large enough for the thread count and the output cache
    with pytest.raises(ScanWeaverValueError, match=f"{name} must be an integer, got 'abc'"):
        scanweaver.linear_scan(a, a)

