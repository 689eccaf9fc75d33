"""The sequential lowering compiled for the CPU (mlir-opt → LLVM IR → llvmlite JIT)
gives the interpreter's numbers, bit for bit (both round every f32 op the same way)."""

from __future__ import annotations

import numpy as np
import pytest
from scan_ir import affine_case, affine_func, random_inputs
from test_reference_semantics import CASES, RECURRENCE, SCAN_PAIRS

from scanweaver import compiler
from scanweaver.interp.run import run_function
from scanweaver.runtime.cpu import CpuProgram


def jit(text: str, name: str):
    lowered = compiler.lower(text, "loops")
    llvm_ir, _ = compiler.cpu_llvm_ir(lowered.module)
    fn = compiler.public_functions(lowered.module)[name]
    return CpuProgram(llvm_ir).get(name, [str(t) for t in fn.function_type.inputs.data])


def check_same(text: str, name: str, *arrays):
    interp = [a.copy() for a in arrays]
    compiled = [a.copy() for a in arrays]
    run_function(text, name, *interp)
    jit(text, name)(*compiled)
    for x, y in zip(interp, compiled):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("shape,axis,reverse,init,final", CASES[:4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_compiled_loops_match_interpreter(shape, axis, reverse, init, final, dtype):
    text, arrays = affine_case(21, shape, axis, dtype, init=init, final=final, reverse=reverse)
    check_same(text, "f", *arrays)


def test_compiled_f16_widening_matches_interpreter():
    rng = np.random.default_rng(4)
    a, b = random_inputs(rng, (3, 33), np.float16)
    check_same(affine_func((3, 33), 1, "f16", "f32"), "f", a, b, np.zeros((3, 33), np.float32))


def test_compiled_dynamic_shapes():
    rng = np.random.default_rng(5)
    a, b = random_inputs(rng, (5, 77), np.float32)
    text = affine_func(("?", "?"), 1, "f32", "f32", reverse=True)
    check_same(text, "f", a, b, np.zeros((5, 77), np.float32))


def test_compiled_pair_scan_and_recurrence():
    rng = np.random.default_rng(6)
    a, b = random_inputs(rng, (3, 10), np.float32)
    check_same(SCAN_PAIRS.format(n=3, L=10, rev="reverse"), "pairs", a, b, np.zeros_like(a), np.zeros_like(b))
    x = rng.standard_normal((6, 6)).astype(np.float32)
    check_same(RECURRENCE.format(C=6, L=6), "ema", x, np.zeros(6, np.float32), rng.standard_normal(6).astype(np.float32))
