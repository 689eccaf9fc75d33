"""scanweaver-grad as a pass: xdsl-opt, what it refuses, the memory it uses, and the
compiled (CPU) VJP against the interpreted one."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from grad_oracle import raise_and_grad
from xdsl.dialects import func, memref
from xdsl.dialects.builtin import DYNAMIC_INDEX

from scanweaver.dialects import scan
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.grad import GradRefused
from scanweaver.workloads import loops

BIN = os.path.dirname(sys.executable)


def test_xdsl_opt_runs_the_pass():
    src = print_ir(loops.ema_loops(2, 8))
    out = subprocess.run([os.path.join(BIN, "xdsl-opt"), "-p", "scanweaver-raise,scanweaver-grad{chunk=4}"],
                         input=src, capture_output=True, text=True, check=True).stdout
    module = parse_ir(out)
    names = [f.sym_name.data for f in module.ops if isinstance(f, func.FuncOp)]
    assert names == ["ema", "ema_vjp"]
    vjp = module.ops.last
    assert [str(t) for t in vjp.function_type.inputs.data][5:] == [
        "memref<2x8xf32>", "memref<2xf32>", "memref<2xf32>", "memref<2x8xf32>", "memref<2xf32>"]
    # the adjoint is a scan op, like the forward (the checkpoint run: the chunks before the
    # window of kept coefficients, then those in it; the chunk's recompute; the adjoint)
    assert sum(isinstance(op, scan.RecurrenceOp) for op in vjp.walk()) == 4


def test_scanweaver_opt_refuses_with_one_line(tmp_path):
    src = tmp_path / "cumsum.mlir"
    src.write_text(print_ir(loops.cumsum_loops(2, 4, "i32")))
    r = subprocess.run([os.path.join(BIN, "scanweaver-opt"), str(src), "-p", "scanweaver-raise,scanweaver-grad{functions=cumsum}"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "integer recurrences have no gradient" in r.stderr


REFUSED = [
    (lambda: loops.cumsum_loops(2, 4, "i64"), "integer recurrences have no gradient"),
    ("""func.func @f(%x: memref<4xf32>, %s: f32) {
  %c0 = arith.constant 0 : index
  memref.store %s, %x[%c0] : memref<4xf32>
  func.return
}""", "argument #1 is a float scalar"),
    ("""func.func @f(%x: memref<4xf32>) -> f32 {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<4xf32>
  func.return %v : f32
}""", "it returns values"),
    ("""func.func @f(%x: memref<4xf32>, %y: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %v = memref.load %x[%c0] : memref<4xf32>
  %s = math.sin %v : f32
  memref.store %s, %y[%c0] : memref<4xf32>
  func.return
}""", r"\('math.sin'\): no derivative rule"),
    ("""func.func @f(%x: memref<4xf32>, %y: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %v = memref.load %x[%c0] : memref<4xf32>
  memref.store %v, %x[%c1] : memref<4xf32>
  %w = memref.load %x[%c1] : memref<4xf32>
  memref.store %w, %y[%c0] : memref<4xf32>
  func.return
}""", "argument #0 is read after being written"),
]


@pytest.mark.parametrize("src, why", REFUSED)
def test_refuses_with_a_reason(src, why):
    with pytest.raises(GradRefused, match=why):
        raise_and_grad(src() if callable(src) else src, functions="cumsum" if callable(src) else "f")


def test_no_per_step_state_arrays():
    """Buffers of the VJP do not grow with L: checkpoints (one state per chunk, dynamic
    first dimension), the kept coefficients of at most `window` steps (dynamic: fewer for
    short sequences) and chunk-sized buffers, never L x N per channel or B x D x L x N."""
    batch, D, N, chunk = 2, 3, 4, 8

    def buffers(L):
        text = raise_and_grad(loops.selective_scan_loops(batch, D, L, N), chunk=chunk)
        vjp = next(f for f in parse_ir(text).ops if isinstance(f, func.FuncOp) and f.sym_name.data.endswith("_vjp"))
        return [op.memref.type.get_shape() for op in vjp.walk() if isinstance(op, (memref.AllocOp, memref.AllocaOp))]

    short, long = buffers(64), buffers(256)
    assert short == long
    for shape in long:
        assert len(shape) <= 2 and all(d == DYNAMIC_INDEX or d <= max(chunk, N, 16) for d in shape), shape
    # the checkpoints (chunks + 1, N); a (rows, N), the states (rows + 1, N) and the
    # kept values (kept, rows) of the window (b = dt*u*B[n] is computed again: staged)
    dynamic = [tuple(shape) for shape in long if DYNAMIC_INDEX in shape]
    assert len(dynamic) == 4 and dynamic.count((DYNAMIC_INDEX, N)) == 3, dynamic


@pytest.mark.parametrize("window", [8192, 8])  # 8: chunks before the window (refilled)
def test_compiled_vjp_matches_interpreter(window):
    """The VJP through the CPU pipeline (scanweaver.compile) = the interpreted VJP."""
    import scanweaver

    batch, D, L, N = 1, 3, 21, 4
    text = raise_and_grad(loops.selective_scan_loops(batch, D, L, N, return_last_state=True), chunk=8,
                          window=window)
    program = scanweaver.compile(text)
    rng = np.random.default_rng(0)
    f32 = np.float32
    prim = [rng.standard_normal((batch, D, L)).astype(f32), rng.uniform(-1, 1, (batch, D, L)).astype(f32),
            -rng.uniform(0.3, 1.5, (D, N)).astype(f32), rng.standard_normal((D, N)).astype(f32),
            rng.standard_normal((D, N)).astype(f32), rng.standard_normal(D).astype(f32),
            rng.standard_normal((batch, D, L)).astype(f32), rng.uniform(-0.5, 0.5, D).astype(f32),
            np.zeros((batch, D, L), f32), np.zeros((batch, D, N), f32)]
    cot = [np.zeros_like(x) for x in prim[:-2]] + [rng.standard_normal(x.shape).astype(f32) for x in prim[-2:]]
    compiled = [c.copy() for c in cot]
    program.selective_scan_vjp(*[p.copy() for p in prim], *compiled)
    interpreted = [c.copy() for c in cot]
    run_function(text, "selective_scan_vjp", *[p.copy() for p in prim], *interpreted)
    for x, y in zip(compiled, interpreted):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-5 * max(1.0, np.abs(y).max()))
    assert np.abs(compiled[0]).max() > 0  # a gradient that is there


@pytest.mark.parametrize("window", [8192, 2])  # 2: chunks before the window (refilled)
def test_fused_adjoint_matches_unfused(window):
    """fuse=true (the coefficients' reverse in the emit of an adjoint scan on lambda)
    computes the gradients of fuse=false, and holds no per-step buffer of the adjoint."""
    batch, D, L, N = 1, 2, 5, 3
    m = lambda: loops.selective_scan_loops(batch, D, L, N, dtype="f64", return_last_state=True)  # noqa: E731
    texts = {f: raise_and_grad(m(), chunk=2, window=window, fuse=f) for f in (True, False)}
    vjp = next(f for f in parse_ir(texts[True]).ops if isinstance(f, func.FuncOp) and f.sym_name.data.endswith("_vjp"))
    # the adjoint scan (the last recurrence) writes the input gradients in its emit
    adjoint = [op for op in vjp.walk() if isinstance(op, scan.RecurrenceOp)][-1]
    shadows = {a for a in vjp.body.block.args if (a.name_hint or "").startswith("d_")}
    assert any(isinstance(o, memref.StoreOp) and o.memref in shadows for o in adjoint.emit.walk())
    rng = np.random.default_rng(3)
    prim = [rng.standard_normal((batch, D, L)), rng.uniform(-1, 1, (batch, D, L)), -rng.uniform(0.3, 1.5, (D, N)),
            rng.standard_normal((D, N)), rng.standard_normal((D, N)), rng.standard_normal(D),
            rng.standard_normal((batch, D, L)), rng.uniform(-0.5, 0.5, D), np.zeros((batch, D, L)),
            np.zeros((batch, D, N))]
    cot = [np.zeros_like(x) for x in prim[:-2]] + [rng.standard_normal(x.shape) for x in prim[-2:]]
    grads = {}
    for f, text in texts.items():
        grads[f] = [c.copy() for c in cot]
        run_function(text, "selective_scan_vjp", *[p.copy() for p in prim], *grads[f])
    for x, y in zip(grads[True], grads[False]):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12 * max(1.0, np.abs(y).max()))
    assert all(np.abs(g).max() > 0 for g in grads[True][:8])  # every input gets a gradient
