"""scanweaver-grad's `staged` form of a scan.recurrence's reverse (the default).

`staged` moves per-step scalar work out of the loops that carry the state (the fused
adjoint's time-only reverse into a loop after it, the emit's reverse split around its
sums over the state) and computes b = dt*u*B[k] again where the buffered recurrence
reads it.  Only accumulations into gradients move, so against `staged=0` every gradient
is the same bits except the sums over time of dD and ddelta_bias (reassociable cells).
The gradients themselves are checked against finite differences, gradcheck and autograd
through the reference in tests/test_grad_oracle.py and tests/test_torch_ops.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects import func, memref, scf

from scanweaver.dialects import scan
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.grad import ScanweaverGrad
from scanweaver.runtime.cpu_scan import Kernel, SelectiveScanSpec
from scanweaver.torch import _kernels

SPEC = SelectiveScanSpec(n=16, b_kind="shared", c_kind="shared", has_d=True, has_z=True,
                         has_bias=True, softplus=True, has_h0=False, has_last=True)


def _vjp_module(staged: bool, chunk: int = 64, window: int = 8192):
    """As _kernels._vjp_only, with the pass's options."""
    module = parse_ir(_kernels.selective_ir(SPEC, False).text)
    _kernels.mark_step_exp(module)
    ScanweaverGrad(chunk=chunk, window=window, staged=staged).apply(make_context(), module)
    for op in list(module.ops):
        if isinstance(op, func.FuncOp) and not op.sym_name.data.endswith("_vjp"):
            module.body.block.erase_op(op)
    return module


def _vjp_kernel(module) -> Kernel:
    ir = _kernels.selective_ir(SPEC, False)
    _kernels._polynomial_math_outside_scans(module)
    program = _kernels._compile_noalias(print_ir(module), f"{ir.name}_vjp")
    return Kernel(program, f"{ir.name}_vjp", [*ir.args, *_kernels.selective_arg_ranks(SPEC)])


def _grads(kernel: Kernel, L: int, seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    batch, D, N = 1, 3, SPEC.n
    u, delta, z = (rng.standard_normal((batch, D, L)).astype(np.float32) for _ in range(3))
    A = -np.exp(rng.standard_normal((D, N))).astype(np.float32)
    B, C = (rng.standard_normal((batch, L, N)).astype(np.float32) for _ in range(2))  # kernel layout
    Dskip, bias = (rng.standard_normal(D).astype(np.float32) for _ in range(2))
    delta[0, 0, :5] = 25.0  # softplus' linear branch (dt > 20) in the reverse too
    g = rng.standard_normal((batch, D, L)).astype(np.float32)
    arrs = [u, delta, A, B, C, Dskip, z, bias]
    shadows = [np.zeros_like(a) for a in arrs] + [g, np.zeros((batch, D, N), np.float32)]
    kernel(*arrs, np.empty_like(u), np.empty((batch, D, N), np.float32), 0, D, *shadows)
    out = shadows[:8]
    assert all(np.isfinite(s).all() and np.abs(s).max() > 0 for s in out)
    return out


def _allocs(module) -> int:
    return sum(isinstance(op, memref.AllocOp) for op in module.walk())


def test_staged_ir_buffers_no_b_and_splits_the_emit_reverse():
    staged, plain = _vjp_module(True), _vjp_module(False)
    # checkpoints, a, kept values, states; the plain form also buffers b
    assert _allocs(staged) == 4 and _allocs(plain) == 5
    loops = lambda m: sum(isinstance(op, scf.ForOp) for op in m.walk())  # noqa: E731
    # the emit's reverse: 3 loops over the steps instead of 1; the time-only reverse: 1;
    # the fill of a (a loop over the steps around one over the state: the window's and
    # a chunk's before it) left to the buffered recurrences, whose coeffs store a
    assert loops(staged) == loops(plain) + 2 + 1 + 1 - 2 * 2

    def coeffs_stores(m):
        return [o for op in m.walk() if isinstance(op, scan.RecurrenceOp) for o in op.coeffs.walk()
                if isinstance(o, memref.StoreOp)]

    assert len(coeffs_stores(staged)) == 2 and not coeffs_stores(plain)


# names of the 8 gradients, in argument order; dD and ddelta_bias are sums over time
NAMES = ("du", "ddelta", "dA", "dB", "dC", "dD", "dz", "ddelta_bias")
SUMMED = {"dD", "ddelta_bias"}


@pytest.fixture(scope="module")
def kernels():
    return {"staged": _vjp_kernel(_vjp_module(True)), "plain": _vjp_kernel(_vjp_module(False))}


@pytest.mark.parametrize("L", [150, 64, 7])  # several chunks and a partial one; one chunk; a part of one
def test_staged_vjp_is_the_plain_vjp_up_to_the_order_of_two_sums(kernels, L):
    _same_up_to_sums(_grads(kernels["staged"], L), _grads(kernels["plain"], L))


def _same_up_to_sums(got, want) -> None:
    for name, x, y in zip(NAMES, got, want):
        if name in SUMMED:
            # the sums over time vectorise in the staged loops: another order (the bound
            # holds at (1, 256, 16, 2048) and (2, 768, 16, 2048) too)
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6 * np.abs(y).max(), err_msg=name)
        else:
            np.testing.assert_array_equal(x, y, err_msg=name)


def test_staged_vjp_before_the_window_matches_inside_it(kernels):
    """window=32 of chunk=16: the chunks before the window run the recurrence itself in
    the checkpoint run and refill their coefficients in the reverse (b computed again
    there too); same gradients as one window holding all the steps (chunk=64)."""
    small = _vjp_kernel(_vjp_module(True, chunk=16, window=32))
    L = 100
    _same_up_to_sums(_grads(small, L), _grads(kernels["staged"], L))
