"""The torch selective VJP evaluates exp(delta*A) in the forward tiled kernel's form.

`_kernels.mark_step_exp` marks the recurrence's coefficient exp for the fused polynomial
(and its AVX-512 scalef form) before `scanweaver-grad`; the VJP's clones of it (the
checkpoint run, the recompute of h, the coefficient buffers) keep the marks, and no
other exp (softplus, the z gate) gets them.  Gradient accuracy against autograd through
the reference is checked in tests/test_torch_ops.py with these kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects import arith, func, memref
from xdsl.dialects import math as mathd

from scanweaver.dialects import scan
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.exp_polynomial import FUSED_MARK, SCALEF_MARK
from scanweaver.rewrites.grad import ScanweaverGrad
from scanweaver.runtime.cpu_scan import SelectiveScanSpec
from scanweaver.runtime.cpu_selective_exp import scalef_exp
from scanweaver.torch import _kernels
from scanweaver.workloads.scans import affine_scan_ir

# z and softplus: three f32 exps in the forward (softplus, exp(delta*A), the z gate)
SPEC = SelectiveScanSpec(n=16, b_kind="shared", c_kind="shared", has_d=True, has_z=True,
                         has_bias=True, softplus=True, has_h0=False, has_last=True)


def _reads_a(x, a_arg) -> bool:
    """x = dt * A[d, n] (either operand order), A being the function argument a_arg."""
    op = x.owner
    return isinstance(op, arith.MulfOp) and any(
        isinstance(v.owner, memref.LoadOp) and v.owner.memref is a_arg for v in op.operands)


def _exps(module) -> list[tuple[bool, mathd.ExpOp]]:
    """(is exp(dt*A), op) for every math.exp of the module's functions."""
    out = []
    for fn in module.ops:
        if isinstance(fn, func.FuncOp):
            a_arg = fn.body.block.args[2]  # (u, delta, A, ...)
            out += [(_reads_a(op.operand, a_arg), op) for op in fn.walk() if isinstance(op, mathd.ExpOp)]
    return out


@pytest.mark.parametrize("scalef", [False, True])
def test_only_the_step_exp_is_marked_and_the_vjp_keeps_the_marks(scalef):
    module = parse_ir(_kernels.selective_ir(SPEC, False).text)
    assert _kernels.mark_step_exp(module, scalef=scalef) == 1
    ScanweaverGrad(chunk=_kernels.CHUNK).apply(make_context(), module)
    exps = _exps(module)
    step = [op for is_step, op in exps if is_step]
    other = [op for is_step, op in exps if not is_step]
    # forward 1 + VJP: checkpoint run, recompute, coefficient buffers (before and in the window)
    assert len(step) >= 4 and other
    assert all(FUSED_MARK in op.attributes and (SCALEF_MARK in op.attributes) == scalef for op in step)
    assert not any(FUSED_MARK in op.attributes or SCALEF_MARK in op.attributes for op in other)
    # staged (the default): the VJP's step exps all lie inside scan ops (lowered by
    # scan-to-cpu: the buffered recurrences compute a); staged=false fills the
    # coefficient buffers in plain loops too
    inside = [any(isinstance(p, scan.RecurrenceOp) for p in _parents(op)) for op in step]
    assert all(inside)
    plain = parse_ir(_kernels.selective_ir(SPEC, False).text)
    _kernels.mark_step_exp(plain, scalef=scalef)
    ScanweaverGrad(chunk=_kernels.CHUNK, staged=False).apply(make_context(), plain)
    plain_step = [op for is_step, op in _exps(plain) if is_step]
    assert all(FUSED_MARK in op.attributes and (SCALEF_MARK in op.attributes) == scalef for op in plain_step)
    inside = [any(isinstance(p, scan.RecurrenceOp) for p in _parents(op)) for op in plain_step]
    assert any(inside) and not all(inside)


def _parents(op):
    p = op.parent_op()
    while p is not None:
        yield p
        p = p.parent_op()


def test_f64_and_affine_irs_get_no_mark():
    assert _kernels.mark_step_exp(parse_ir(_kernels.selective_ir(SPEC, True).text), scalef=True) == 0
    affine = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, reverse=False, name="linear_scan")
    assert _kernels.mark_step_exp(parse_ir(affine), scalef=True) == 0


def test_vjp_text_expands_plain_loop_step_exps_fused(monkeypatch):
    """Outside scan ops the marked exps are expanded here (fused multiply-adds); inside
    them the marks stay for scan-to-cpu's marked-only expansion.  (With the coefficient
    fill in plain loops: by default the buffered recurrences compute a.)"""
    from scanweaver.rewrites.grad import VjpBuilder

    monkeypatch.setattr(VjpBuilder, "FUSED_FILL", False)
    text = _kernels._vjp_only(_kernels.selective_ir(SPEC, False).text)
    module = parse_ir(text)
    exps = _exps(module)
    assert exps and all(any(isinstance(p, scan.RecurrenceOp) for p in _parents(op)) for _, op in exps)
    assert all(FUSED_MARK in op.attributes for is_step, op in exps if is_step)
    assert any(isinstance(op, mathd.FmaOp) for op in module.walk())


@pytest.mark.skipif(not scalef_exp(), reason="the scalef exp needs AVX-512F, VL and DQ (and SCANWEAVER_SCALEF_EXP != 0)")
def test_scalef_and_fused_vjp_give_the_same_bits(monkeypatch):
    """The scalef form's claim (same bits as the fused form) holds through the VJP."""
    from scanweaver.runtime.cpu_scan import Kernel

    rng = np.random.default_rng(7)
    batch, D, L, N = 1, 3, 150, 16  # 150 steps: several checkpoint chunks and a partial one
    u, delta, z = (rng.standard_normal((batch, D, L)).astype(np.float32) for _ in range(3))
    A = -np.exp(rng.standard_normal((D, N))).astype(np.float32)
    B, C = (rng.standard_normal((batch, L, N)).astype(np.float32) for _ in range(2))  # kernel layout
    Dskip, bias = (rng.standard_normal(D).astype(np.float32) for _ in range(2))
    g = rng.standard_normal((batch, D, L)).astype(np.float32)
    ir = _kernels.selective_ir(SPEC, False)
    assert len(ir.args) == 12, ir.args  # u delta A B C D z bias out last lo hi
    arrs = [u, delta, A, B, C, Dskip, z, bias]
    grads = {}
    for scalef in (False, True):
        monkeypatch.setattr(_kernels, "mark_step_exp",
                            lambda m, scalef=scalef, _f=_kernels.mark_step_exp: _f(m, scalef=scalef))
        text = _kernels._vjp_only(ir.text)
        assert (SCALEF_MARK in text) == scalef
        kernel = Kernel(_kernels._compile_noalias(text, f"{ir.name}_vjp"), f"{ir.name}_vjp",
                        [*ir.args, *_kernels.selective_arg_ranks(SPEC)])
        shadows = [np.zeros_like(a) for a in arrs] + [g.copy(), np.zeros((batch, D, N), np.float32)]
        assert len(shadows) == len(_kernels.selective_arg_ranks(SPEC))
        kernel(*arrs, np.empty_like(u), np.empty((batch, D, N), np.float32), 0, D, *shadows)
        grads[scalef] = shadows[:8]
        assert all(np.isfinite(s).all() for s in shadows[:8])
        assert np.abs(shadows[2]).max() > 0  # dA was written
    for x, y in zip(grads[False], grads[True]):
        np.testing.assert_array_equal(x, y)
