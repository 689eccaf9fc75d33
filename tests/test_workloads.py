"""Loop workloads against their numpy references, before and after scanweaver-raise."""

from __future__ import annotations

import numpy as np
import pytest
from test_raise import golden, rand

from scanweaver.interp.run import run_function
from scanweaver.workloads import loops, reference

RNG = np.random.default_rng(1)
BATCH, D, L, N = 1, 2, 5, 3


def selective_scan_args(bc, groups=1, *, dtype=np.float32, options=True, last=False):
    shape_bc = {"constant": (D, N), "shared": (BATCH, N, L), "grouped": (BATCH, groups, N, L)}[bc]
    a = {
        "u": rand((BATCH, D, L), dtype),
        "delta": rand((BATCH, D, L), dtype, -2.0, 1.0),
        "A": rand((D, N), dtype, -1.5, -0.1),
        "B": rand(shape_bc, dtype),
        "C": rand(shape_bc, dtype),
    }
    if options:
        a["D_skip"] = rand(D, dtype)
        a["z"] = rand((BATCH, D, L), dtype)
        a["delta_bias"] = rand(D, dtype, -0.5, 0.5)
        a["delta"][0, 0, 1] = 25.0  # softplus' x > 20 branch
    a["out"] = np.zeros((BATCH, D, L), dtype)
    if last:
        a["last_state"] = np.zeros((BATCH, D, N), dtype)
    return a


def reference_of(a, options, last):
    return reference.selective_scan_reference(
        a["u"], a["delta"], a["A"], a["B"], a["C"],
        D=a.get("D_skip"), z=a.get("z"), delta_bias=a.get("delta_bias"),
        delta_softplus=options, return_last_state=last,
    )


CASES = [
    ("constant", 1, True, False),
    ("shared", 1, True, True),
    ("grouped", 2, True, False),
    ("constant", 1, False, True),
]


@pytest.mark.parametrize("bc,groups,options,last", CASES)
def test_selective_scan_loops_match_reference_and_raise(bc, groups, options, last):
    module = loops.selective_scan_loops(
        BATCH, D, L, N, bc=bc, groups=groups, with_D=options, with_z=options,
        with_delta_bias=options, delta_softplus=options, return_last_state=last,
    )
    a = selective_scan_args(bc, groups, options=options, last=last)
    ref = reference_of(a, options, last)
    raised_module, outs, _ = golden(module, "selective_scan", list(a.values()),
                                    expect=["scan.recurrence"])
    got = dict(zip(a, outs))
    ref_out, ref_h = ref if last else (ref, None)
    np.testing.assert_allclose(got["out"], ref_out, rtol=2e-5, atol=2e-6)
    if last:
        np.testing.assert_allclose(got["last_state"], ref_h, rtol=2e-5, atol=2e-6)


def test_selective_scan_f64():
    module = loops.selective_scan_loops(BATCH, D, L, N, bc="shared", dtype="f64")
    a = selective_scan_args("shared", dtype=np.float64)
    args = list(a.values())
    run_function(module, "selective_scan", *args)
    np.testing.assert_allclose(args[-1], reference_of(a, True, False), rtol=1e-12, atol=1e-13)
    golden(loops.selective_scan_loops(BATCH, D, L, N, bc="shared", dtype="f64"),
           "selective_scan", list(selective_scan_args("shared", dtype=np.float64).values()),
           exact=True)


def test_selective_scan_f16_inputs_accumulate_in_f32():
    module = loops.selective_scan_loops(1, 1, 3, 2, dtype="f16")
    a = {
        "u": rand((1, 1, 3), np.float16), "delta": rand((1, 1, 3), np.float16),
        "A": rand((1, 2), np.float16, -1, -0.1), "B": rand((1, 2), np.float16),
        "C": rand((1, 2), np.float16), "D_skip": rand(1, np.float16),
        "z": rand((1, 1, 3), np.float16), "delta_bias": rand(1, np.float16),
        "out": np.zeros((1, 1, 3), np.float16),
    }
    ref = reference_of(a, True, False)
    _, outs, _ = golden(module, "selective_scan", list(a.values()), exact=True)
    np.testing.assert_allclose(outs[-1].astype(np.float64), ref, rtol=2e-3, atol=2e-3)


def test_ema_reference():
    x, al, h0 = rand((2, 6)), rand(2, np.float32, 0, 1), rand(2)
    y, hT = np.zeros((2, 6), np.float32), np.zeros(2, np.float32)
    _, outs, _ = golden(loops.ema_loops(2, 6), "ema", [x, al, h0, y, hT])
    ry, rh = reference.ema_reference(x, al, h0)
    np.testing.assert_allclose(outs[3], ry, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[4], rh, rtol=1e-5, atol=1e-6)


def test_discounted_return_reference():
    r, gm, g = rand((2, 6)), rand(2, np.float32, 0, 1), rand(2)
    G = np.zeros((2, 6), np.float32)
    _, outs, _ = golden(loops.discounted_return_loops(2, 6), "discounted_return", [r, gm, g, G])
    rG, rg = reference.discounted_return_reference(r, gm, g)
    np.testing.assert_allclose(outs[3], rG, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[2], rg, rtol=1e-5, atol=1e-6)


def test_reset_reference():
    x, a, h = rand((6, 3)), rand((6, 3)), rand(3)
    done = np.array([0, 0, 1, 0, 1, 0], np.int32)
    _, outs, _ = golden(loops.reset_loops(3, 6), "reset", [x, a, done, h, np.zeros((6, 3), np.float32)])
    ry, rh = reference.reset_reference(x, a, done, h)
    np.testing.assert_allclose(outs[4], ry, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[3], rh, rtol=1e-5, atol=1e-6)


def test_iir2_reference():
    x, c1, c2 = rand((2, 7)), rand(2, np.float32, -0.5, 0.5), rand(2, np.float32, -0.5, 0.5)
    _, outs, _ = golden(loops.iir2_loops(2, 7), "iir2", [x, c1, c2, np.zeros((2, 7), np.float32)])
    np.testing.assert_allclose(outs[3], reference.iir2_reference(x, c1, c2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_prefix_references(dtype):
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        x = RNG.integers(info.min, info.max, size=(2, 5), dtype=dtype)
    else:
        x = rand((2, 5), dtype)
    name = {np.int32: "i32", np.int64: "i64", np.float64: "f64"}[dtype]
    for builder, ref, fname in (
        (loops.cumsum_loops, reference.cumsum_reference, "cumsum"),
        (loops.cumprod_loops, reference.cumprod_reference, "cumprod"),
    ):
        _, outs, _ = golden(builder(2, 5, name), fname, [x, np.zeros_like(x)], exact=True)
        if np.dtype(dtype).kind == "i":
            np.testing.assert_array_equal(outs[1], ref(x))
        else:
            np.testing.assert_allclose(outs[1], ref(x), rtol=1e-12)


def test_bad_workload_options():
    from scanweaver.errors import ScanWeaverError

    with pytest.raises(ScanWeaverError):
        loops.selective_scan_loops(1, 3, 2, 2, bc="grouped", groups=2)
    with pytest.raises(ScanWeaverError):
        loops.selective_scan_loops(1, 2, 2, 2, bc="diagonal")
