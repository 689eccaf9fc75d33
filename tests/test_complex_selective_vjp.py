"""The complex selective VJP builder (`workloads/selective_complex_vjp.py`): the compiled
kernel against the xDSL interpreter (the oracle) on a small case with several backward
chunks; the gradients themselves are checked by gradcheck in test_complex_selective_torch.py."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects import func

from scanweaver.interp.run import run_function
from scanweaver.ir import print_ir
from scanweaver.runtime.cpu_scan import kernel
from scanweaver.workloads.selective_complex_vjp import (
    ComplexSelectiveVjpSpec,
    selective_scan_complex_vjp,
    vjp_arguments,
)
from scanweaver.workloads.types import kernel_arguments

RNG = np.random.default_rng(20)


def _crandn(*shape):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(np.complex128)


def _arrays(spec, batch, Dn, L, G):
    """Arguments of @selective_scan_complex_vjp in order (without d_begin/d_end)."""
    N, nch = spec.n, -(-L // spec.chunk)
    bc = {"const": (Dn, N), "shared": (batch, L, N), "grouped": (batch, G, L, N)}
    real = lambda *s: RNG.standard_normal(s)  # noqa: E731
    make = {"u": lambda: real(batch, Dn, L), "delta": lambda: 0.5 * real(batch, Dn, L),
            "A": lambda: -RNG.uniform(0.2, 1, (Dn, N)) + 1j * RNG.standard_normal((Dn, N)),
            "B": lambda: _crandn(*bc[spec.b_kind]), "C": lambda: _crandn(*bc[spec.c_kind]),
            "Dskip": lambda: real(Dn), "z": lambda: real(batch, Dn, L), "bias": lambda: 0.3 * real(Dn),
            "h0": lambda: _crandn(batch, Dn, N), "dout": lambda: real(batch, Dn, L),
            "dlast": lambda: _crandn(batch, Dn, N), "ckpt": lambda: np.zeros((batch, Dn, nch, N), complex),
            "du": lambda: np.zeros((batch, Dn, L)), "ddelta": lambda: np.zeros((batch, Dn, L)),
            "dA": lambda: np.zeros((Dn, N), complex), "dB": lambda: np.zeros(bc[spec.b_kind], complex),
            "dC": lambda: np.zeros(bc[spec.c_kind], complex), "dD": lambda: np.zeros(Dn),
            "dz": lambda: np.zeros((batch, Dn, L)), "dbias": lambda: np.zeros(Dn),
            "dh0": lambda: np.zeros((batch, Dn, N), complex)}
    return [np.ascontiguousarray(make[name]()) for name, _ in vjp_arguments(spec)[:-2]]


@pytest.mark.parametrize("spec", [
    ComplexSelectiveVjpSpec(2, "f64", "shared", "grouped", True, True, chunk=3),
    ComplexSelectiveVjpSpec(3, "f64", "const", "shared", False, False, chunk=4),
])
def test_compiled_vjp_matches_interpreter(spec):
    batch, Dn, L, G = 2, 4, 8, 2  # L = 8: chunks of 3 (3 + 3 + 2) or 4 (4 + 4)
    module = selective_scan_complex_vjp(spec)
    module.verify()
    (fn,) = [op for op in module.body.block.ops if isinstance(op, func.FuncOp)]
    text = print_ir(module)
    compiled = _arrays(spec, batch, Dn, L, G)
    interpreted = [a.copy() for a in compiled]
    kernel(text, fn.sym_name.data, list(kernel_arguments(fn)))(*compiled, 1, Dn)  # channels 1..D-1
    run_function(text, fn.sym_name.data, *interpreted, 1, Dn)
    names = [name for name, _ in vjp_arguments(spec)[:-2]]
    for name, mine, oracle in zip(names, compiled, interpreted):
        np.testing.assert_allclose(mine, oracle, rtol=1e-12, atol=1e-12, err_msg=name)
    grads = dict(zip(names, compiled))
    assert np.abs(grads["dA"][1:]).min() > 0 and not grads["dA"][0].any()  # channel 0 was not asked for


def test_builder_refuses_bad_specs():
    with pytest.raises(ValueError, match="B/C kinds"):
        selective_scan_complex_vjp(ComplexSelectiveVjpSpec(2, "f64", "weird", "const", False, False))
    with pytest.raises(ValueError, match="chunk"):
        selective_scan_complex_vjp(ComplexSelectiveVjpSpec(2, "f32", "const", "const", False, False, chunk=0))
