"""The `time_lanes` variant (integer rows, time in the vector lanes): bit for bit the
interpreted `scan.affine`, with full-range (wrapping) integers, every remainder of the
vector width, forward and reverse, through the variant choice and the public API."""

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import ScanWeaverTypeError
from scanweaver.interp.run import run_function
from scanweaver.runtime import cpu_scan, cpu_variants

EL = {np.int32: "i32", np.int64: "i64"}


def _full_range(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("reverse", [False, True])
def test_time_lanes_match_interpreter(dtype, reverse):
    text = cpu_scan.affine_ir(EL[dtype], 2, True, True, reverse)
    rng = np.random.default_rng(21)
    # L below, at and around the lane counts (4, 8), several vectors plus every tail, empty rows
    for shape in ((3, 1), (2, 7), (5, 8), (2, 9), (3, 20), (4, 37), (1, 64), (2, 0)):
        a, b = _full_range(rng, shape, dtype), _full_range(rng, shape, dtype)
        h0 = _full_range(rng, shape[:1], dtype)
        want_h, want_f = np.zeros(shape, dtype), np.zeros(shape[:1], dtype)
        run_function(text, "affine", a, b, h0, want_h, want_f)
        for threads in (1, 2):
            h, f = cpu_scan.affine_scan_cpu(a, b, h0, reverse, True, variant="time_lanes", threads=threads)
            np.testing.assert_array_equal(h, want_h, err_msg=f"{shape} threads={threads}")
            np.testing.assert_array_equal(f, want_f, err_msg=f"{shape} threads={threads}")


def test_time_lanes_agree_with_tiles_without_init():
    """No h0 (zero start), no final: the same bits as the tiled `single` variant."""
    rng = np.random.default_rng(22)
    a, b = _full_range(rng, (6, 1003), np.int32), _full_range(rng, (6, 1003), np.int32)
    for reverse in (False, True):
        want = cpu_scan.affine_scan_cpu(a, b, reverse=reverse, variant="single")
        got = cpu_scan.affine_scan_cpu(a, b, reverse=reverse, variant="time_lanes", threads=2)
        np.testing.assert_array_equal(got, want)


def test_time_lanes_chosen_for_i32_and_public_api():
    choose = cpu_scan.choose_affine_variant
    for C, L in ((4, 1 << 20), (1, 1 << 24)):
        assert choose(C, L, np.int32, threads=2) == "time_lanes", (C, L)
    for C, L in ((16384, 256), (1024, 4096), (64, 1 << 16)):  # full lane groups: the tiles
        assert choose(C, L, np.int32, threads=2) != "time_lanes", (C, L)
    assert choose(4, 1 << 14, np.int32, threads=1) == "time_lanes"  # fewer rows than lanes
    assert choose(256, 256, np.int32, threads=2) == "single"  # in cache, full groups: tiles
    assert choose(4, 1 << 20, np.float32, threads=2) == "chunked"  # floats never: reassociation
    assert choose(1024, 4096, np.float64, threads=2) != "time_lanes"
    # Through linear_scan, large enough to take the variant (4 rows of 2^18 + 5 steps).
    rng = np.random.default_rng(23)
    shape = (4, (1 << 18) + 5)
    assert cpu_variants.choose_affine_variant(*shape, np.int32) == "time_lanes"
    a, b = _full_range(rng, shape, np.int32), _full_range(rng, shape, np.int32)
    got = scanweaver.linear_scan(a, b, reverse=True)
    want = cpu_scan.affine_scan_cpu(a, b, reverse=True, variant="single")
    np.testing.assert_array_equal(got, want)


def test_time_lanes_refuses_floats():
    x = np.ones((2, 16), np.float32)
    with pytest.raises(ScanWeaverTypeError, match="time_lanes.*float32"):
        cpu_scan.affine_scan_cpu(x, x, variant="time_lanes")


@pytest.mark.parametrize("bits", [256, 512])
@pytest.mark.parametrize("reverse", [False, True])
def test_time_lanes_both_vector_widths_match_interpreter(monkeypatch, bits, reverse):
    """256-bit and 512-bit vectors (the host's choice is `vector_bits`; LLVM splits 512-bit
    vectors where the CPU has no AVX-512): the same bits, every remainder of 16 lanes."""
    from scanweaver.runtime import cpu_time_lanes

    monkeypatch.setattr(cpu_time_lanes, "vector_bits", lambda: bits)
    cpu_time_lanes._time_lanes_kernel.cache_clear()
    try:
        text = cpu_scan.affine_ir("i32", 2, True, True, reverse)
        rng = np.random.default_rng(23)
        for shape in ((2, 15), (2, 16), (3, 17), (2, 40), (1, 100)):
            a, b = _full_range(rng, shape, np.int32), _full_range(rng, shape, np.int32)
            h0 = _full_range(rng, shape[:1], np.int32)
            want_h, want_f = np.zeros(shape, np.int32), np.zeros(shape[:1], np.int32)
            run_function(text, "affine", a, b, h0, want_h, want_f)
            h, f = cpu_scan.affine_scan_cpu(a, b, h0, reverse, True, variant="time_lanes", threads=2)
            np.testing.assert_array_equal(h, want_h, err_msg=str(shape))
            np.testing.assert_array_equal(f, want_f, err_msg=str(shape))
    finally:
        cpu_time_lanes._time_lanes_kernel.cache_clear()
