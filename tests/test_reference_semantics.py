"""Golden checks: the interpreter's scan-op semantics against float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest
from scan_ir import MLIR_TYPE, affine_func, affine_reference, random_inputs

from scanweaver.interp.numerics import bf16_bits_to_float, float_to_bf16_bits
from scanweaver.interp.run import run_function

CASES = [
    # shape, axis, reverse, init, final
    ((5,), 0, False, False, False),
    ((1,), 0, False, True, True),
    ((3, 7), 1, True, True, True),
    ((6, 3), 0, False, True, False),
    ((2, 3, 5), 1, True, False, True),
    ((2, 2, 2, 9), 3, False, True, True),
]


def _run_affine(shape, axis, dtype, reverse, init, final, seed=0, state_dtype=None):
    rng = np.random.default_rng(seed)
    state_dtype = np.dtype(state_dtype or dtype)
    a, b = random_inputs(rng, shape, dtype)
    ch = tuple(d for i, d in enumerate(shape) if i != axis)
    h0 = random_inputs(rng, ch, state_dtype)[1] if init else None
    h = np.zeros(shape, state_dtype)
    hT = np.zeros(ch, state_dtype)
    ir = affine_func(
        shape, axis, MLIR_TYPE[np.dtype(dtype)], MLIR_TYPE[state_dtype],
        init=init, final=final, reverse=reverse,
    )
    args = [a, b] + ([h0] if init else []) + [h] + ([hT] if final else [])
    run_function(ir, "f", *args)
    return a, b, h0, h, hT


@pytest.mark.parametrize("shape,axis,reverse,init,final", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_affine_float_matches_float64(shape, axis, reverse, init, final, dtype):
    a, b, h0, h, hT = _run_affine(shape, axis, dtype, reverse, init, final)
    ref, last = affine_reference(a, b, axis, h0, reverse)
    np.testing.assert_allclose(h, ref, rtol=1e-5, atol=1e-6)
    if final:
        np.testing.assert_allclose(hT, last, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,axis,reverse,init,final", CASES)
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_affine_integers_exact(shape, axis, reverse, init, final, dtype):
    a, b, h0, h, hT = _run_affine(shape, axis, dtype, reverse, init, final, seed=1)
    ref, last = affine_reference(a, b, axis, h0, reverse, wrap_dtype=dtype)
    np.testing.assert_array_equal(h, ref)
    if final:
        np.testing.assert_array_equal(hT, last)


def test_affine_f16_inputs_accumulate_in_f32():
    a, b, _, h, _ = _run_affine((3, 40), 1, np.float16, False, False, False, state_dtype=np.float32)
    ref, _ = affine_reference(a.astype(np.float64), b.astype(np.float64), 1)
    np.testing.assert_allclose(h, ref, rtol=1e-5, atol=1e-6)


def test_affine_bf16_inputs_travel_as_bits():
    rng = np.random.default_rng(3)
    a32, b32 = random_inputs(rng, (2, 11), np.float32)
    to_bits = np.vectorize(float_to_bf16_bits, otypes=[np.uint16])
    a, b = to_bits(a32), to_bits(b32)
    h = np.zeros((2, 11), np.float32)
    ir = affine_func((2, 11), 1, "bf16", "f32")
    run_function(ir, "f", a, b, h)
    from_bits = np.vectorize(bf16_bits_to_float, otypes=[np.float64])
    ref, _ = affine_reference(from_bits(a), from_bits(b), 1)
    np.testing.assert_allclose(h, ref, rtol=1e-5, atol=1e-6)


def test_length_zero_axis_leaves_outputs_alone():
    h = np.full((3, 0), 7, np.float32)
    hT = np.full(3, 5, np.float32)
    ir = affine_func((3, 0), 1, "f32", "f32", final=True)
    run_function(ir, "f", np.zeros((3, 0), np.float32), np.zeros((3, 0), np.float32), h, hT)
    # No step runs: the final state is the (zero) initial state.
    np.testing.assert_array_equal(hT, np.zeros(3, np.float32))


SCAN_PAIRS = """
func.func @pairs(%a: memref<{n}x{L}xf32>, %b: memref<{n}x{L}xf32>, %pa: memref<{n}x{L}xf32>, %pb: memref<{n}x{L}xf32>) {{
  scan.scan ins(%a, %b : memref<{n}x{L}xf32>, memref<{n}x{L}xf32>) outs(%pa, %pb : memref<{n}x{L}xf32>, memref<{n}x{L}xf32>) axis 1 {rev} {{
  ^bb0(%a1: f32, %b1: f32, %a2: f32, %b2: f32):
    %aa = arith.mulf %a1, %a2 : f32
    %ab = arith.mulf %a2, %b1 : f32
    %bb = arith.addf %ab, %b2 : f32
    scan.yield %aa, %bb : f32, f32
  }}
  func.return
}}
"""


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("L", [1, 6, 13])
def test_pair_scan_equals_affine_recurrence(reverse, L):
    """scan.scan with the affine combine yields the recurrence in its `b` component."""
    rng = np.random.default_rng(L)
    a, b = random_inputs(rng, (3, L), np.float32)
    pa, pb = np.zeros_like(a), np.zeros_like(b)
    run_function(SCAN_PAIRS.format(n=3, L=L, rev="reverse" if reverse else ""), "pairs", a, b, pa, pb)
    ref, _ = affine_reference(a, b, 1, reverse=reverse)
    np.testing.assert_allclose(pb, ref, rtol=1e-5, atol=1e-6)
    prod = np.cumprod(a[:, ::-1] if reverse else a, axis=1, dtype=np.float64)
    np.testing.assert_allclose(pa, prod[:, ::-1] if reverse else prod, rtol=1e-5)


def test_scan_max_combine_non_arithmetic():
    ir = """
func.func @cummax(%x: memref<9xi32>, %o: memref<9xi32>) {
  scan.scan ins(%x : memref<9xi32>) outs(%o : memref<9xi32>) axis 0 {
  ^bb0(%p: i32, %q: i32):
    %m = arith.maxsi %p, %q : i32
    scan.yield %m : i32
  }
  func.return
}
"""
    x = np.array([3, -1, 4, 1, 5, 9, -2, 6, 5], np.int32)
    o = np.zeros_like(x)
    run_function(ir, "cummax", x, o)
    np.testing.assert_array_equal(o, np.maximum.accumulate(x))


RECURRENCE = """
func.func @ema(%x: memref<{C}x{L}xf32>, %y: memref<{L}xf32>, %h: memref<{C}xf32>) {{
  %lb = arith.constant 0 : index
  %ub = arith.constant {L} : index
  %c1 = arith.constant 1 : index
  %alpha = arith.constant 0.75 : f32
  %beta = arith.constant 0.25 : f32
  scan.recurrence %lb to %ub step %c1 state(%h : memref<{C}xf32>) coeffs {{
  ^bb0(%i: index, %k: index):
    %xv = memref.load %x[%k, %i] : memref<{C}x{L}xf32>
    %bv = arith.mulf %beta, %xv : f32
    scan.yield %alpha, %bv : f32, f32
  }} emit {{
  ^bb0(%t: index, %s: memref<{C}xf32>):
    %c0 = arith.constant 0 : index
    %zero = arith.constant 0.0 : f32
    %sum = scf.for %k = %c0 to %ub step %c1 iter_args(%acc = %zero) -> (f32) {{
      %hv = memref.load %s[%k] : memref<{C}xf32>
      %nacc = arith.addf %acc, %hv : f32
      scf.yield %nacc : f32
    }}
    memref.store %sum, %y[%t] : memref<{L}xf32>
    scan.yield
  }}
  func.return
}}
"""


def test_recurrence_fused_producer_and_consumer():
    """EMA per channel, consumer sums the channels each step (ub reused as C here)."""
    C = L = 6
    rng = np.random.default_rng(7)
    x = rng.standard_normal((C, L)).astype(np.float32)
    h0 = rng.standard_normal(C).astype(np.float32)
    h = h0.copy()
    y = np.zeros(L, np.float32)
    run_function(RECURRENCE.format(C=C, L=L), "ema", x, y, h)
    ref, last = affine_reference(np.full((C, L), 0.75), 0.25 * x.astype(np.float64), 1, h0)
    np.testing.assert_allclose(y, ref.sum(axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, last, rtol=1e-5, atol=1e-6)
