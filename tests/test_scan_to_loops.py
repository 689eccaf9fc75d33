"""The sequential lowering preserves semantics: interpreted before and after, bit for bit.

The oracle rounds every float op to its type, so the loop form must agree exactly,
floats included, with the reference semantics of the scan ops it replaces.
"""

from __future__ import annotations

import numpy as np
import pytest
from scan_ir import affine_case, affine_func, random_inputs
from test_reference_semantics import CASES, RECURRENCE, SCAN_PAIRS

from scanweaver.ir import parse_ir, print_ir
from scanweaver.interp.run import run_function
from scanweaver.rewrites.scan_to_loops import ScanToLoops
from scanweaver.ir import make_context


def lower(text: str) -> str:
    module = parse_ir(text)
    ScanToLoops().apply(make_context(), module)
    module.verify()
    out = print_ir(module)
    assert "scan." not in out
    return out


def run_both(text: str, name: str, *arrays):
    """Run the op form and the lowered form on copies of the same inputs."""
    before = [a.copy() for a in arrays]
    after = [a.copy() for a in arrays]
    run_function(text, name, *before)
    run_function(lower(text), name, *after)
    return before, after


@pytest.mark.parametrize("shape,axis,reverse,init,final", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64])
def test_affine_lowering_bit_exact(shape, axis, reverse, init, final, dtype):
    text, arrays = affine_case(11, shape, axis, dtype, init=init, final=final, reverse=reverse)
    before, after = run_both(text, "f", *arrays)
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)


def test_affine_lowering_dynamic_length():
    text = affine_func(("4", "?"), 1, "f32", "f32", reverse=True)
    rng = np.random.default_rng(2)
    a, b = random_inputs(rng, (4, 9), np.float32)
    before, after = run_both(text, "f", a, b, np.zeros((4, 9), np.float32))
    np.testing.assert_array_equal(before[2], after[2])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("L", [1, 5])
def test_scan_lowering_bit_exact(reverse, L):
    rng = np.random.default_rng(L)
    a, b = random_inputs(rng, (3, L), np.float32)
    text = SCAN_PAIRS.format(n=3, L=L, rev="reverse" if reverse else "")
    before, after = run_both(text, "pairs", a, b, np.zeros_like(a), np.zeros_like(b))
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)


def test_recurrence_lowering_bit_exact():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 6)).astype(np.float32)
    h0 = rng.standard_normal(6).astype(np.float32)
    before, after = run_both(RECURRENCE.format(C=6, L=6), "ema", x, np.zeros(6, np.float32), h0)
    for u, v in zip(before, after):
        np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_linear_recurrence_lowering_bit_exact(dtype):
    """The coupled (IIR) form raised from loops, then lowered back to loops."""
    from scanweaver.rewrites.raise_affine import RaiseRecurrences
    from scanweaver.workloads.loops import iir2_loops

    module = iir2_loops(3, 9, dtype)
    RaiseRecurrences().apply(make_context(), module)
    text = print_ir(module)
    assert "scan.linear_recurrence" in text
    rng = np.random.default_rng(3)
    fn = next(op for op in module.walk() if op.name == "func.func")
    arrays = []
    for t in fn.function_type.inputs.data:
        shape = t.get_shape()
        if dtype == "f32":
            arrays.append(rng.uniform(-0.5, 0.5, shape).astype(np.float32))
        else:
            arrays.append(rng.integers(-1000, 1000, shape, dtype=np.int32))
    name = fn.sym_name.data
    before, after = run_both(text, name, *arrays)
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
