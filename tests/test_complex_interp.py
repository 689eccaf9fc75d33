"""Complex element types: the scan dialect's verifier and the interpreter's complex ops.

Golden references are complex128 numpy; the per-op rounding is checked by running the
same IR before and after `scan-complex-to-real` (real arithmetic on (re, im) pairs),
which must agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.errors import ScanWeaverValueError
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.complex_to_real import ComplexToReal
from scanweaver.rewrites.scan_to_loops import ScanToLoops

RNG = np.random.default_rng(17)
CT = {np.complex64: "complex<f32>", np.complex128: "complex<f64>"}


def crandn(*shape, dtype=np.complex64, scale=1.0):
    return ((RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)) * scale).astype(dtype)


def affine_text(el: str, shape: tuple[int, ...], axis: int, init: bool, final: bool, reverse: bool) -> str:
    full = "memref<" + "x".join(map(str, shape)) + f"x{el}>"
    ch = [d for i, d in enumerate(shape) if i != axis]
    chan = "memref<" + "".join(f"{d}x" for d in ch) + f"{el}>"
    args = ["%a: " + full, "%b: " + full] + (["%h0: " + chan] if init else []) + ["%h: " + full]
    args += ["%hT: " + chan] if final else []
    op = "scan.affine %a, %b" + (" init %h0" if init else "") + " into %h" + (" final %hT" if final else "")
    op += f" axis {axis}" + (" reverse" if reverse else "")
    ins = [full, full] + ([chan] if init else [])
    outs = [full] + ([chan] if final else [])
    return (
        f"func.func @f({', '.join(args)}) {{\n  {op} : {', '.join(ins)} -> {', '.join(outs)}\n"
        "  func.return\n}\n"
    )


def reference(a, b, axis, h0=None, reverse=False):
    a, b = (np.moveaxis(x.astype(np.complex128), axis, -1) for x in (a, b))
    state = np.zeros(a.shape[:-1], np.complex128) if h0 is None else h0.astype(np.complex128)
    h = np.zeros(a.shape, np.complex128)
    for t in range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1]):
        state = a[..., t] * state + b[..., t]
        h[..., t] = state
    return np.moveaxis(h, -1, axis), state


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("axis,reverse", [(0, False), (1, True), (2, False)])
def test_affine_matches_complex128(dtype, axis, reverse):
    shape = (3, 6, 4)
    a, b = crandn(*shape, dtype=dtype, scale=0.7), crandn(*shape, dtype=dtype)
    ch = tuple(d for i, d in enumerate(shape) if i != axis)
    h0 = crandn(*ch, dtype=dtype)
    h, hT = np.zeros(shape, dtype), np.zeros(ch, dtype)
    run_function(affine_text(CT[dtype], shape, axis, True, True, reverse), "f", a, b, h0, h, hT)
    ref, ref_final = reference(a, b, axis, h0, reverse)
    tol = 1e-5 if dtype == np.complex64 else 1e-13
    np.testing.assert_allclose(h, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(hT, ref_final, rtol=tol, atol=tol)


def _lowered(text: str, to_real: bool) -> str:
    module = parse_ir(text)
    ScanToLoops().apply(make_context(), module)
    if to_real:
        ComplexToReal().apply(make_context(), module)
    module.verify()
    return print_ir(module)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_loops_and_real_form_bit_identical(dtype):
    """scan.affine, its complex loops, and those loops on (re, im) pairs: same bits."""
    shape = (4, 9)
    text = affine_text(CT[dtype], shape, 1, False, True, False)
    a, b = crandn(*shape, dtype=dtype, scale=0.8), crandn(*shape, dtype=dtype)
    outs = []
    for form in (text, _lowered(text, False), _lowered(text, True)):
        h, hT = np.zeros(shape, dtype), np.zeros(4, dtype)
        run_function(form, "f", a, b, h, hT)
        outs.append((h, hT))
    real_form = _lowered(text, True)
    assert "complex.mul" not in real_form and "complex.add" not in real_form
    for h, hT in outs[1:]:
        assert h.tobytes() == outs[0][0].tobytes() and hT.tobytes() == outs[0][1].tobytes()


OPS_IR = """
func.func @ops(%x: memref<{n}xcomplex<f32>>, %y: memref<{n}xcomplex<f32>>, %out: memref<7x{n}xcomplex<f32>>, %mag: memref<{n}xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cn = arith.constant {n} : index
  %k0 = arith.constant 0 : index
  %k1 = arith.constant 1 : index
  %k2 = arith.constant 2 : index
  %k3 = arith.constant 3 : index
  %k4 = arith.constant 4 : index
  %k5 = arith.constant 5 : index
  %k6 = arith.constant 6 : index
  scf.for %i = %c0 to %cn step %c1 {{
    %p = memref.load %x[%i] : memref<{n}xcomplex<f32>>
    %q = memref.load %y[%i] : memref<{n}xcomplex<f32>>
    %s = complex.add %p, %q : complex<f32>
    %d = complex.sub %p, %q : complex<f32>
    %m = complex.mul %p, %q : complex<f32>
    %v = complex.div %p, %q : complex<f32>
    %e = complex.exp %p : complex<f32>
    %j = complex.conj %p : complex<f32>
    %re = complex.re %q : complex<f32>
    %im = complex.im %p : complex<f32>
    %w = complex.create %re, %im : complex<f32>
    %a = complex.abs %p : complex<f32>
    memref.store %s, %out[%k0, %i] : memref<7x{n}xcomplex<f32>>
    memref.store %d, %out[%k1, %i] : memref<7x{n}xcomplex<f32>>
    memref.store %m, %out[%k2, %i] : memref<7x{n}xcomplex<f32>>
    memref.store %v, %out[%k3, %i] : memref<7x{n}xcomplex<f32>>
    memref.store %e, %out[%k4, %i] : memref<7x{n}xcomplex<f32>>
    memref.store %j, %out[%k5, %i] : memref<7x{n}xcomplex<f32>>
    memref.store %w, %out[%k6, %i] : memref<7x{n}xcomplex<f32>>
    memref.store %a, %mag[%i] : memref<{n}xf32>
  }}
  func.return
}}
"""


def _run_ops(text: str, x, y):
    n = x.shape[0]
    out, mag = np.zeros((7, n), np.complex64), np.zeros(n, np.float32)
    run_function(text, "ops", x, y, out, mag)
    return out, mag


def test_complex_ops_match_numpy_and_real_form():
    n = 16
    x, y = crandn(n), crandn(n)
    y[0] = 3e-3 + 2.0j  # |im| > |re|: the other branch of Smith's division
    x[1] = 3e30 + 4e30j  # |x| beyond sqrt(f32 max): abs must not overflow
    x[2] = 0
    text = OPS_IR.format(n=n)
    out, mag = _run_ops(text, x, y)
    x64, y64 = x.astype(np.complex128), y.astype(np.complex128)
    with np.errstate(over="ignore"):
        want = [x64 + y64, x64 - y64, x64 * y64, x64 / y64, np.exp(x64), np.conj(x64), y64.real + 1j * x64.imag]

    for k, w in enumerate(want):
        fin = np.isfinite(w)
        np.testing.assert_allclose(out[k][fin], w[fin], rtol=3e-6, atol=1e-6, err_msg=f"row {k}")
    np.testing.assert_allclose(mag, np.abs(x64), rtol=3e-7)
    # The real form (what compiles) computes the same bits.
    out2, mag2 = _run_ops(_lowered(text, True), x, y)
    assert out2.tobytes() == out.tobytes() and mag2.tobytes() == mag.tobytes()


def test_constant_and_zero_init():
    text = """
func.func @c(%o: memref<2xcomplex<f64>>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %k = complex.constant [1.5 : f64, -2.0 : f64] : complex<f64>
  %n = complex.neg %k : complex<f64>
  memref.store %k, %o[%c0] : memref<2xcomplex<f64>>
  memref.store %n, %o[%c1] : memref<2xcomplex<f64>>
  func.return
}
"""
    o = np.zeros(2, np.complex128)
    run_function(text, "c", o)
    assert o.tolist() == [1.5 - 2j, -1.5 + 2j]
    o2 = np.zeros(2, np.complex128)
    run_function(_lowered(text, True), "c", o2)
    assert o2.tolist() == o.tolist()


@pytest.mark.parametrize(
    "a_el,h_el,msg",
    [
        ("complex<f32>", "complex<f64>", "share one complex type"),
        ("f32", "complex<f32>", "share one complex type"),
        ("complex<f32>", "f32", "share one complex type"),
        ("complex<f16>", "complex<f16>", "is not supported"),
    ],
)
def test_verifier_refuses_mixed_types(a_el, h_el, msg):
    text = (
        f"func.func @f(%a: memref<4x{a_el}>, %b: memref<4x{a_el}>, %h: memref<4x{h_el}>) {{\n"
        f"  scan.affine %a, %b into %h axis 0 : memref<4x{a_el}>, memref<4x{a_el}> -> memref<4x{h_el}>\n"
        "  func.return\n}\n"
    )
    with pytest.raises(ScanWeaverValueError, match=msg):  # parse_ir verifies
        parse_ir(text)


def test_recurrence_with_complex_state():
    """scan.recurrence with a complex<f32> state: coeffs yield complex (a, b)."""
    text = """
func.func @r(%a: memref<8x3xcomplex<f32>>, %b: memref<8x3xcomplex<f32>>, %h: memref<3xcomplex<f32>>, %y: memref<8x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scan.recurrence %c0 to %c8 step %c1 state(%h : memref<3xcomplex<f32>>) coeffs {
  ^bb0(%i: index, %n: index):
    %x = memref.load %a[%i, %n] : memref<8x3xcomplex<f32>>
    %u = memref.load %b[%i, %n] : memref<8x3xcomplex<f32>>
    scan.yield %x, %u : complex<f32>, complex<f32>
  } emit {
  ^bb0(%i: index, %s: memref<3xcomplex<f32>>):
    %c3 = arith.constant 3 : index
    scf.for %n = %c0 to %c3 step %c1 {
      %v = memref.load %s[%n] : memref<3xcomplex<f32>>
      %re = complex.re %v : complex<f32>
      memref.store %re, %y[%i, %n] : memref<8x3xf32>
    }
    scan.yield
  }
  func.return
}
"""
    parse_ir(text).verify()
    a, b = crandn(8, 3, scale=0.9), crandn(8, 3)
    h0 = crandn(3)
    outs = []
    for form in (text, _lowered(text, True)):
        h, y = h0.copy(), np.zeros((8, 3), np.float32)
        run_function(form, "r", a, b, h, y)
        outs.append((h, y))
    ref, final = reference(a, b, 0, h0)
    np.testing.assert_allclose(outs[0][1], ref.real, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[0][0], final, rtol=1e-5, atol=1e-5)
    assert outs[1][0].tobytes() == outs[0][0].tobytes() and outs[1][1].tobytes() == outs[0][1].tobytes()
