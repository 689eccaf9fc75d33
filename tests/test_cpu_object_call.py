"""The object-call trampoline (runtime/cpu_object_call.py) and linear_scan's small-call path.

Both call the same compiled kernel as the ordinary ctypes path; results must be
bit-identical, and every input the small path does not take must reach the general
path (its validation and errors unchanged)."""

import numpy as np
import pytest

import scanweaver as sw
from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime import cpu_scan
from scanweaver.runtime.cpu_object_call import layout_ok, object_caller, trampoline_ir


def _inputs(rng, shape, dtype):
    if np.dtype(dtype).kind == "f":
        return (rng.uniform(-1.1, 1.1, shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
    return rng.integers(-5, 5, shape).astype(dtype), rng.integers(-1000, 1000, shape).astype(dtype)


def test_layout_probe_passes_here():
    assert layout_ok()


def test_trampoline_ir_reads_sizes_and_strides():
    ir = trampoline_ir([2, 1, "index"], [4, 8])
    assert "define void @sw_object_call(ptr %fn, ptr %o0, ptr %o1, i64 %x2)" in ir
    assert "sdiv exact i64 %o0.s1b, 4" in ir and "sdiv exact i64 %o1.s0b, 8" in ir
    assert "call void %fn(ptr %o0.data, ptr %o0.data, i64 0, i64 %o0.n0b, i64 %o0.n1b, i64 %o0.s0, i64 %o0.s1," in ir


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_object_call_equals_kernel_call_on_views(dtype):
    """Strided views (outer stride not the row length, offset data pointer); an innermost
    stride other than 1 is refused by `Kernel` (tests/test_cpu_native.py)."""
    k = cpu_scan._affine_kernel(cpu_scan._mlir_el(np.dtype(dtype)), 2, True, True, True)
    it = np.dtype(dtype).itemsize
    call = object_caller(k.program.address("affine"), k.spec, [it] * 5)
    rng = np.random.default_rng(3)
    big_a, big_b = _inputs(rng, (14, 90), dtype)
    a, b = big_a[1::2, 5:72], big_b[::2, 3:70]
    h0 = _inputs(rng, (14,), dtype)[1][3:10]  # offset data pointer; innermost stride must be 1
    got_h, got_f = np.full(a.shape, 7, dtype), np.full(7, 7, dtype)
    want_h, want_f = got_h.copy(), got_f.copy()
    call(a, b, h0, got_h, got_f)
    k(a, b, h0, want_h, want_f)
    assert np.array_equal(got_h.view(np.uint8), want_h.view(np.uint8))
    assert np.array_equal(got_f.view(np.uint8), want_f.view(np.uint8))


@pytest.mark.parametrize("dtype,reverse,final", [(np.float32, False, False), (np.float64, True, True),
                                                 (np.int32, False, True), (np.int64, True, False)])
def test_small_linear_scan_matches_general_path(dtype, reverse, final):
    rng = np.random.default_rng(4)
    a, b = _inputs(rng, (5, 67), dtype)
    a[0, 3] = np.nan if np.dtype(dtype).kind == "f" else a[0, 3]
    got = sw.linear_scan(a, b, reverse=reverse, return_final_state=final)
    want = cpu_scan.affine_scan_cpu(a, b, reverse=reverse, return_final=final, variant="single")
    for x, y in zip(got if final else (got,), want if final else (want,)):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8))


def test_small_path_leaves_other_calls_to_the_general_path():
    rng = np.random.default_rng(5)
    a, b = _inputs(rng, (4, 64), np.float32)
    with pytest.raises(ScanWeaverTypeError, match="same dtype"):
        sw.linear_scan(a, b.astype(np.float64))
    with pytest.raises(ScanWeaverValueError, match="shape"):
        sw.linear_scan(a, b[:, :10])
    with pytest.raises(ScanWeaverTypeError, match="dtype bool"):
        sw.linear_scan(a > 0, b > 0)
    with pytest.raises(ScanWeaverValueError, match="backend"):
        sw.linear_scan(a, b, backend="gpu")
    # Non-contiguous and float16 inputs: the general path's results.
    at, bt = a.T, b.T
    assert np.array_equal(sw.linear_scan(at, bt), cpu_scan.affine_scan_cpu(at.copy(), bt.copy()))
    half = sw.linear_scan(a.astype(np.float16), b.astype(np.float16))
    assert half.dtype == np.float32
