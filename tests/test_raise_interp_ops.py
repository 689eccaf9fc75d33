"""Interpreter implementations added for the forms of issue 14 (math.powf & co.):
each op interpreted in a tiny function and compared with numpy's f32/f64/int result."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scanweaver.interp.run import run_function


def unary(op: str, el: str = "f32") -> str:
    return f"""
func.func @f(%x: memref<8x{el}>, %y: memref<8x{el}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scf.for %i = %c0 to %c8 step %c1 {{
    %v = memref.load %x[%i] : memref<8x{el}>
    %r = {op} %v : {el}
    memref.store %r, %y[%i] : memref<8x{el}>
  }}
  func.return
}}
"""


def binary(op: str, el: str = "f32", el2: str | None = None) -> str:
    el2 = el2 or el
    return f"""
func.func @f(%x: memref<8x{el}>, %z: memref<8x{el2}>, %y: memref<8x{el}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scf.for %i = %c0 to %c8 step %c1 {{
    %v = memref.load %x[%i] : memref<8x{el}>
    %w = memref.load %z[%i] : memref<8x{el2}>
    %r = {op} %v, %w : {el}{", " + el2 if el2 != el else ""}
    memref.store %r, %y[%i] : memref<8x{el}>
  }}
  func.return
}}
"""


def run1(text, x):
    y = np.zeros_like(x)
    run_function(text, "f", x, y)
    return y


def run2(text, x, z):
    y = np.zeros_like(x)
    run_function(text, "f", x, z, y)
    return y


def test_powf_matches_ieee_pow():
    x = np.array([2.0, -2.0, 0.0, -0.0, 0.5, -1.5, 1e30, 3.0], np.float32)
    z = np.array([0.5, 3.0, -1.0, -3.0, 2.0, 0.5, 4.0, -2.0], np.float32)
    with np.errstate(all="ignore"):
        want = np.power(x, z)
    np.testing.assert_array_equal(run2(binary("math.powf"), x, z), want)


def test_fpowi_and_ipowi():
    x = np.array([2, -3, 1.5, 0, -1, 10, 0.5, 7], np.float64)
    n = np.array([3, 2, -2, 5, 7, 3, 10, 0], np.int32)
    np.testing.assert_array_equal(run2(binary("math.fpowi", "f64", "i32"), x, n), x ** n.astype(np.float64))
    b = np.array([2, -3, 1, -1, -1, 7, 0, 123456], np.int32)
    e = np.array([31, 3, -5, -3, -4, -1, 0, 5], np.int32)
    got = run2(binary("math.ipowi", "i32"), b, e)
    want = [np.int32(np.int64(2) ** 31 - 2**32), -27, 1, -1, 1, 0, 1,
            np.int32((123456**5) % 2**32 - (2**32 if (123456**5) % 2**32 >= 2**31 else 0))]
    np.testing.assert_array_equal(got, np.array(want, np.int32))


@pytest.mark.parametrize(
    "op,fn",
    [("math.tan", np.tan), ("math.atan", np.arctan), ("math.sinh", np.sinh),
     ("math.cosh", np.cosh), ("math.asinh", np.arcsinh), ("math.trunc", np.trunc),
     ("math.roundeven", np.rint), ("math.cbrt", np.cbrt), ("math.asin", np.arcsin),
     ("math.acos", np.arccos)],
)
def test_unary_math(op, fn):
    x = np.array([0.25, -0.5, 0.0, -0.0, 2.5, -3.5, 0.75, 1.0], np.float64)
    with np.errstate(all="ignore"):
        want = fn(x)
    np.testing.assert_allclose(run1(unary(op, "f64"), x), want, rtol=1e-15, atol=0)


def test_round_is_half_away_from_zero():
    x = np.array([0.5, -0.5, 1.5, 2.5, -2.5, 0.49, -0.0, 3.0], np.float32)
    got = run1(unary("math.round"), x)
    np.testing.assert_array_equal(got, [1.0, -1.0, 2.0, 3.0, -3.0, 0.0, -0.0, 3.0])
    assert math.copysign(1, got[6]) < 0


def test_unsigned_max_min_and_copysign():
    a = np.array([-1, 5, 0, 7, -8, 3, 2, 1], np.int32)
    b = np.array([1, -5, 0, 9, 8, 3, -2, 1], np.int32)
    u = lambda v: v.view(np.uint32)  # noqa: E731
    np.testing.assert_array_equal(u(run2(binary("arith.maxui", "i32"), a, b)), np.maximum(u(a), u(b)))
    np.testing.assert_array_equal(u(run2(binary("arith.minui", "i32"), a, b)), np.minimum(u(a), u(b)))
    x = np.array([1.0, -2.0, 3.0, 0.0, -0.0, 5.0, 6.0, 7.0], np.float32)
    s = np.array([-1.0, 1.0, -0.0, -1.0, 1.0, 2.0, -3.0, 0.0], np.float32)
    np.testing.assert_array_equal(run2(binary("math.copysign"), x, s), np.copysign(x, s))
