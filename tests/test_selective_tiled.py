"""The CPU driver's selective scan kernel (`selective_scan_tiled`: B and C staged in
small transposed tiles, the per-step exp with fused multiply-adds).

* bit for bit the untiled CPU form (`selective_scan_recurrence`) run on transposed B/C,
  for every B/C kind, with and without the options, tiles and chunks crossed by
  L and D, on one and two threads, once the exps of both are the fused ones;
* the fused polynomial exp: <= 1 ulp, scalar and vector the same bits, special values;
* no transposed copy of B or C: peak extra memory at the output size.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.exp_polynomial import FUSED_MARK, mark_for_polynomial, rewrite_marked
from scanweaver.runtime import cpu_scan
from scanweaver.runtime.cpu import CpuProgram
from scanweaver.runtime.cpu_jit import kernel
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.toolchain.mlir import emit_c_interface, lower_to_llvm_ir
from scanweaver.workloads.selective import CHUNK_CHANNELS, tile_steps
from scanweaver.workloads.specs import SelectiveScanSpec

from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import UnitAttr


def _fused_untiled_kernel(spec: SelectiveScanSpec):
    """The untiled CPU form with its exps (exp(dt * A), softplus's, silu's) marked fused,
    like the tiled kernel's."""
    text = kernel_ir("selective", spec=spec).text
    module = parse_ir(text)
    for op in module.walk():
        if isinstance(op, mathd.ExpOp):
            op.attributes[FUSED_MARK] = UnitAttr()
    ir = kernel_ir("selective", spec=spec)
    return kernel(print_ir(module), ir.name, ir.args)


def _inputs(rng, batch, D, N, L, b_kind, c_kind, full, h0, groups=4):
    shape = {"const": (D, N), "shared": (batch, N, L), "grouped": (batch, groups, N, L)}
    x = {
        "u": rng.standard_normal((batch, D, L)).astype(np.float32),
        "delta": (0.5 * rng.standard_normal((batch, D, L))).astype(np.float32),
        "A": (-np.exp(0.5 * rng.standard_normal((D, N)))).astype(np.float32),
        "B": rng.standard_normal(shape[b_kind]).astype(np.float32),
        "C": rng.standard_normal(shape[c_kind]).astype(np.float32),
        "D": rng.standard_normal(D).astype(np.float32) if full else None,
        "z": rng.standard_normal((batch, D, L)).astype(np.float32) if full else None,
        "delta_bias": (0.1 * rng.standard_normal(D)).astype(np.float32) if full else None,
        "h0": rng.standard_normal((batch, D, N)).astype(np.float32) if h0 else None,
    }
    if not full:
        x["delta"] = np.abs(x["delta"])
    return x


CASES = [  # (batch, D, N, L), B kind, C kind, D/z/bias/softplus, h0
    # N = 16: the blocked readout; chunks and tiles crossed, a remainder of 13 steps
    ((2, CHUNK_CHANNELS + 6, 16, tile_steps(16) + 45), "shared", "shared", True, True),
    # N = 5: per-step readout; grouped B whose groups cross a chunk, constant C
    ((1, CHUNK_CHANNELS + 8, 5, tile_steps(5) + 7), "grouped", "const", False, False),
]
@pytest.mark.parametrize("shape, b_kind, c_kind, full, h0", CASES)
def test_tiled_kernel_is_the_untiled_kernel_bit_for_bit(shape, b_kind, c_kind, full, h0):
    batch, D, N, L = shape
    x = _inputs(np.random.default_rng(sum(shape)), batch, D, N, L, b_kind, c_kind, full, h0)
    spec = SelectiveScanSpec(N, b_kind, c_kind, full, full, full, full, h0, True)
    untiled = _fused_untiled_kernel(spec)
    tr = lambda m: m if m.ndim == 2 else np.ascontiguousarray(np.swapaxes(m, -1, -2))  # noqa: E731
    want, want_last = np.empty((batch, D, L), np.float32), np.empty((batch, D, N), np.float32)
    arrays = [x["u"], x["delta"], x["A"], tr(x["B"]), tr(x["C"])]
    arrays += [x[k] for k in ("D", "z", "delta_bias", "h0") if x[k] is not None]
    untiled(*arrays, want, want_last, 0, D)
    for threads in (1, 2):
        out, last = cpu_scan.selective_scan_cpu(
            x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"], x["delta_bias"], full,
            return_last_state=True, h0=x["h0"], threads=threads)
        assert out.tobytes() == want.tobytes(), (shape, b_kind, c_kind, threads)
        assert last.tobytes() == want_last.tobytes(), (shape, b_kind, c_kind, threads)


MAP_IR = """func.func @v(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c16 {
    %v = vector.load %x[%i] : memref<?xf32>, vector<16xf32>
    %e = math.exp %v {scanweaver.fused_exp} : vector<16xf32>
    vector.store %e, %y[%i] : memref<?xf32>, vector<16xf32>
  }
  func.return
}
func.func @s(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32>
    %e = math.exp %v {scanweaver.fused_exp} : f32
    memref.store %e, %y[%i] : memref<?xf32>
  }
  func.return
}
"""


def _ulps(got, want):
    return np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))


def test_fused_polynomial_exp_accuracy():
    module = parse_ir(MAP_IR)
    assert mark_for_polynomial(module) == 2 and rewrite_marked(module) == 2
    text = print_ir(emit_c_interface(module))
    assert "math.exp" not in text and "math.fma" in text
    program = CpuProgram(lower_to_llvm_ir(text))
    vec, scalar = (program.get(n, ["memref<?xf32>"] * 2) for n in ("v", "s"))
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.uniform(-104, 88.7, 1 << 20), rng.uniform(-1, 1, 1 << 18)]).astype(np.float32)
    y, ys = np.empty_like(x), np.empty_like(x)
    vec(x, y)
    scalar(x, ys)
    np.testing.assert_array_equal(y, ys)  # same fused ops scalar or vector
    ref = np.exp(x.astype(np.float64))
    normal = ref >= np.finfo(np.float32).tiny
    assert _ulps(y[normal], ref[normal].astype(np.float32)).max() <= 1  # 1 measured (exp_polynomial.py)
    assert np.max(np.abs(y[~normal] - ref[~normal])) <= 2.0**-149
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 89.0, 88.72283935546875, -103.9, -200.0, 1e-30]
                       + [0.0] * 6, np.float32)
    out = np.empty_like(special)
    vec(special, out)
    with np.errstate(over="ignore"):
        want = np.exp(special.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(out, want)


def test_no_transposed_copy_of_b_and_c():
    batch, D, N, L = 1, 64, 16, 2048
    x = _inputs(np.random.default_rng(3), batch, D, N, L, "shared", "shared", False, False)
    run = lambda: cpu_scan.selective_scan_cpu(x["u"], x["delta"], x["A"], x["B"], x["C"], threads=2)  # noqa: E731
    run()
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        out = run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    copy_of_bc = x["B"].nbytes + x["C"].nbytes  # what the transposed copies took (256 KB)
    assert peak - base - out.nbytes < copy_of_bc // 8
