"""The raise of complex loops: raised and original IR agree through the interpreter
(bit for bit: the raised op computes complex.mul then complex.add as the loop does),
the LRU matches its complex128 reference, and compiled code matches the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver as sw
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.raise_complex_pairs import PairsToComplex
from scanweaver.workloads.lru import (
    lru_iter_arg_loops,
    lru_loops,
    lru_pair_loops,
    lru_parameters,
    lru_reference,
)

RNG = np.random.default_rng(1701)


def crandn(*shape, dtype=np.complex64, scale=1.0):
    return ((RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)) * scale).astype(dtype)


def raised(text: str) -> str:
    """scanweaver-raise, then scan-pairs-to-complex (the CPU pipeline's next stage)."""
    module = parse_ir(text)
    RaiseRecurrences().apply(make_context(), module)
    PairsToComplex().apply(make_context(), module)
    module.verify()
    return print_ir(module)


def run_both(text: str, name: str, make_args):
    """(original outputs, raised outputs) of `name` on the same inputs."""
    outs = []
    for form in (text, raised(text)):
        args = make_args()
        run_function(form, name, *args)
        outs.append(args)
    return outs


def test_lru_raises_to_one_recurrence_and_matches():
    L, N, H = 7, 4, 3
    lam, gamma = lru_parameters(N, seed=3)
    Bu, C, h0 = crandn(L, N), crandn(H, N), crandn(N)
    D, x = RNG.standard_normal(H).astype(np.float32), RNG.standard_normal((L, H)).astype(np.float32)
    text = print_ir(lru_loops(L, N, H))
    up = raised(text)
    assert up.count("scan.recurrence") == 1 and "scf.for %t" not in up

    def make_args():
        return [lam.astype(np.complex64), gamma.astype(np.float32), Bu, C, D, x, h0.copy(),
                np.zeros((L, H), np.float32)]

    orig, new = run_both(text, "lru", make_args)
    for k in (6, 7):  # last state h, output y
        assert orig[k].tobytes() == new[k].tobytes()
    y_ref, h_ref = lru_reference(lam.astype(np.complex64), gamma.astype(np.float32), Bu, C, D, x, h0)
    np.testing.assert_allclose(orig[7], y_ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(orig[6], h_ref, rtol=2e-5, atol=2e-5)
    # Compiled (raise -> loops -> scan-complex-to-real -> LLVM): the interpreter's bits.
    program = sw.compile(text)
    args = make_args()
    program.lru(*args)
    assert args[7].tobytes() == orig[7].tobytes() and args[6].tobytes() == orig[6].tobytes()


@pytest.mark.parametrize("dtype,el", [(np.complex64, "f32"), (np.complex128, "f64")])
def test_complex_iter_arg_raise(dtype, el):
    C, L = 3, 9
    text = print_ir(lru_iter_arg_loops(C, L, el))
    assert "scan.recurrence" in raised(text)
    lam, b = crandn(C, dtype=dtype, scale=0.6), crandn(C, L, dtype=dtype)
    orig, new = run_both(text, "lru_iter", lambda: [lam, b, np.zeros((C, L), dtype), np.zeros(C, dtype)])
    assert orig[2].tobytes() == new[2].tobytes() and orig[3].tobytes() == new[3].tobytes()
    ref = np.zeros((C, L), np.complex128)
    s = np.zeros(C, np.complex128)
    for t in range(L):
        s = lam * s + b[:, t]
        ref[:, t] = s
    tol = 1e-5 if dtype == np.complex64 else 1e-13
    np.testing.assert_allclose(orig[2], ref, rtol=tol, atol=tol)


def test_pair_recurrence_becomes_complex_and_is_exact():
    """(re, im) by hand: raised to a complex scan.recurrence, bit for bit the loop."""
    C, L = 3, 11
    text = print_ir(lru_pair_loops(C, L))
    up = raised(text)
    assert "scan.recurrence" in up and "complex<f32>" in up and "linear_recurrence" not in up
    lam = crandn(C, scale=0.8)
    b = crandn(C, L)

    def make_args():
        return [lam.real.copy(), lam.imag.copy(), b.real.copy(), b.imag.copy(),
                np.zeros((C, L), np.float32), np.zeros((C, L), np.float32)]

    orig, new = run_both(text, "lru_pair", make_args)
    assert orig[4].tobytes() == new[4].tobytes() and orig[5].tobytes() == new[5].tobytes()
    # ... and equal to the complex iter_arg form of the same recurrence.
    h = np.zeros((C, L), np.complex64)
    run_function(print_ir(lru_iter_arg_loops(C, L)), "lru_iter", lam, b, h, np.zeros(C, np.complex64))
    assert h.real.tobytes() == orig[4].tobytes() and h.imag.tobytes() == orig[5].tobytes()


def test_pair_with_other_matrix_stays_linear_recurrence():
    """[[p, q], [q, p]] (no negation) is not a complex multiply: stays 2x2."""
    text = print_ir(lru_pair_loops(2, 4)).replace("arith.subf", "arith.addf")
    up = raised(text)
    assert "scan.linear_recurrence" in up and "complex" not in up
