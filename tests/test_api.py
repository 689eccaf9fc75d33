"""The Python API on the CPU: results against float64/exact references, edge cases."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scan_ir import affine_reference

import scanweaver
from scanweaver.workloads.reference import selective_scan_reference


@pytest.mark.parametrize(
    "shape,axis", [((7,), 0), ((3, 50), -1), ((50, 3), 0), ((2, 3, 33), 1), ((4, 2, 3, 17), -1)]
)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("with_h0", [False, True])
def test_linear_scan_float32(shape, axis, reverse, with_h0):
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    ax = axis % len(shape)
    h0 = rng.standard_normal(shape[:ax] + shape[ax + 1 :]).astype(np.float32) if with_h0 else None
    h, last = scanweaver.linear_scan(a, b, h0, axis=axis, reverse=reverse, return_final_state=True)
    want, want_last = affine_reference(a, b, ax, h0, reverse)
    assert h.shape == shape and h.dtype == np.float32
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(last, want_last, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_linear_scan_integers_wrap_exactly(dtype):
    rng = np.random.default_rng(1)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (5, 40), dtype=dtype)
    b = rng.integers(info.min, info.max, (5, 40), dtype=dtype)
    want, _ = affine_reference(a, b, 1, wrap_dtype=dtype)
    np.testing.assert_array_equal(scanweaver.linear_scan(a, b), want)


def test_linear_scan_float16_accumulates_in_float32():
    rng = np.random.default_rng(2)
    a = rng.uniform(0.5, 1.0, (3, 64)).astype(np.float16)
    b = rng.standard_normal((3, 64)).astype(np.float16)
    h = scanweaver.linear_scan(a, b)
    assert h.dtype == np.float32
    want, _ = affine_reference(a.astype(np.float64), b.astype(np.float64), 1)
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5)


def test_linear_scan_lengths_zero_and_one():
    a = np.zeros((3, 0), np.float32)
    h, last = scanweaver.linear_scan(a, a, np.ones(3, np.float32), return_final_state=True)
    assert h.shape == (3, 0)
    np.testing.assert_array_equal(last, np.ones(3, np.float32))  # no step: the initial state
    one = scanweaver.linear_scan(np.full((2, 1), 3, np.float32), np.full((2, 1), 2, np.float32), np.ones(2, np.float32))
    np.testing.assert_array_equal(one, np.full((2, 1), 5, np.float32))


def _loop(a, b, out):
    for c in range(a.shape[0]):
        s = np.float32(0)
        for t in range(a.shape[1]):
            s = a[c, t] * s + b[c, t]
            out[c, t] = s


def test_linear_scan_nan_and_inf_propagate_like_the_loop():
    a = np.array([[1.0, 0.5, 0.0, 2.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    b = np.array([[np.nan, 1.0, 1.0, 1.0], [np.inf, -np.inf, 1.0, 1.0]], np.float32)
    h = scanweaver.linear_scan(a, b)
    loop = np.zeros_like(a)
    with np.errstate(invalid="ignore"):
        _loop(a, b, loop)

    # NaN times zero stays NaN in IEEE arithmetic, so the NaN reaches the end.
    np.testing.assert_array_equal(np.isnan(h), np.isnan(loop))
    np.testing.assert_array_equal(h[~np.isnan(h)], loop[~np.isnan(loop)])


def _selective_inputs(rng, batch, dim, length, n, bc, groups=2):
    f = np.float32
    B_shape = {"constant": (dim, n), "shared": (batch, n, length), "grouped": (batch, groups, n, length)}[bc]
    return dict(
        u=rng.standard_normal((batch, dim, length)).astype(f),
        delta=(0.5 * rng.standard_normal((batch, dim, length))).astype(f),
        A=-np.exp(rng.standard_normal((dim, n))).astype(f),
        B=rng.standard_normal(B_shape).astype(f),
        C=rng.standard_normal(B_shape).astype(f),
    )


@pytest.mark.parametrize("bc", ["constant", "shared", "grouped"])
@pytest.mark.parametrize("full", [False, True])
def test_selective_scan_matches_reference(bc, full):
    rng = np.random.default_rng(3)
    x = _selective_inputs(rng, 2, 4, 37, 16, bc)
    extra = {}
    if full:
        extra = dict(
            D=rng.standard_normal(4).astype(np.float32),
            z=rng.standard_normal((2, 4, 37)).astype(np.float32),
            delta_bias=(0.1 * rng.standard_normal(4)).astype(np.float32),
            delta_softplus=True,
        )
    out, last = scanweaver.selective_scan(**x, **extra, return_last_state=True)
    want, want_last = selective_scan_reference(**x, **extra, return_last_state=True)
    scale = np.max(np.abs(want))
    assert np.max(np.abs(out - want)) / scale < 1e-5
    assert np.max(np.abs(last - want_last)) / np.max(np.abs(want_last)) < 1e-5


def test_empty_channel_and_time_axes():
    h = scanweaver.linear_scan(np.zeros((0, 5), np.float32), np.zeros((0, 5), np.float32))
    assert h.shape == (0, 5)
    x = _selective_inputs(np.random.default_rng(6), 1, 3, 0, 4, "constant")
    out, last = scanweaver.selective_scan(**x, return_last_state=True)
    assert out.shape == (1, 3, 0)
    np.testing.assert_array_equal(last, np.zeros((1, 3, 4), np.float32))


def test_selective_scan_length_one_and_initial_state():
    rng = np.random.default_rng(4)
    x = _selective_inputs(rng, 1, 3, 1, 4, "constant")
    h0 = rng.standard_normal((1, 3, 4)).astype(np.float32)
    out, last = scanweaver.selective_scan(**x, initial_state=h0, return_last_state=True)
    dt = x["delta"][..., 0:1]  # (1, 3, 1)
    h1 = np.exp(dt * x["A"]) * h0 + dt * x["B"] * x["u"][..., 0:1]
    np.testing.assert_allclose(last, h1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out[..., 0], (h1 * x["C"]).sum(-1), rtol=1e-5, atol=1e-6)


def test_compile_user_loop_ir_runs_and_shows_stages():
    from scanweaver.ir import print_ir
    from scanweaver.workloads.loops import discounted_return_loops
    from scanweaver.workloads.reference import discounted_return_reference

    program = scanweaver.compile(print_ir(discounted_return_loops(3, 20)), target="cpu")
    assert "scan.recurrence" in program.stage_ir("scanweaver-raise")
    assert [s for s, _ in program.stages][0] == "input"
    assert program.function_names == ["discounted_return"]
    rng = np.random.default_rng(5)
    r = rng.standard_normal((3, 20)).astype(np.float32)
    gamma = np.full(3, 0.9, np.float32)
    g = rng.standard_normal(3).astype(np.float32)
    G = np.zeros((3, 20), np.float32)
    want, want_last = discounted_return_reference(r, gamma, g)
    program.discounted_return(r, gamma, g, G)
    np.testing.assert_allclose(G, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g, want_last, rtol=1e-5, atol=1e-5)


def test_demo_runs_end_to_end():
    r = subprocess.run(
        [sys.executable, "-m", "scanweaver.cli", "demo", "--quick"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "-> OK" in r.stdout and "WRONG" not in r.stdout
    assert "after scanweaver-raise" in r.stdout


def test_compiled_program_refuses_aliasing_and_read_only_arrays():
    from scanweaver.workloads.scans import affine_scan_ir

    program = scanweaver.compile(affine_scan_ir(("?", "?"), 1, "f32", "f32"), target="cpu")
    buf = np.ones((2, 9), np.float32)
    with pytest.raises(scanweaver.ScanWeaverError, match=r"arguments #0 and #2 overlap in memory"):
        program.f(buf[:, :-1], np.ones((2, 8), np.float32), buf[:, 1:])
    ro = np.ones((2, 8), np.float32)
    ro.setflags(write=False)
    with pytest.raises(scanweaver.ScanWeaverError, match="is read-only"):
        program.f(ro, ro.copy(), np.zeros((2, 8), np.float32))


@pytest.mark.parametrize("reverse", [False, True])
def test_shifted_index_recurrence_end_to_end(reverse):
    """`y[c,t] = a*y[c,t-1] + x`: raised, JIT-compiled bit for bit, and a GPU kernel built."""
    from scanweaver.interp.run import run_function
    from scanweaver.ir import print_ir
    from scanweaver.runtime.cuda_program import build_cuda_artifacts
    from scanweaver.workloads.loops import shifted_recurrence_loops

    text = print_ir(shifted_recurrence_loops(3, 50, reverse=reverse))
    program = scanweaver.compile(text, target="cpu")
    assert "scan.recurrence" in program.stage_ir("scanweaver-raise")
    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 1, (3, 50)).astype(np.float32)
    x = rng.standard_normal((3, 50)).astype(np.float32)
    y = rng.standard_normal((3, 50)).astype(np.float32)
    y_interp = y.copy()
    program.shifted_recurrence(a, x, y)
    run_function(text, "shifted_recurrence", a, x, y_interp)
    np.testing.assert_array_equal(y, y_interp)
    art = build_cuda_artifacts(text, "sm_90")
    assert [d.kernel_name for d in art.launches["shifted_recurrence"]] == ["scan_recurrence_0"]
    assert all(f["spill_stores"] == 0 for f in art.ptxas.values())
