"""The fused polynomial exp's AVX-512 form (`SCALEF_MARK`: 2^k by `vscalefps`, the
reduced argument bounded by `vrangeps`): the fused form's bits at 4, 8 and 16 lanes over the whole range,
subnormal results, overflow and special values included; the selective kernel takes
it exactly when this CPU has AVX-512F, VL and DQ; other lane counts keep the fused form.
Also softplus's log1p without its selects (`SOFTPLUS_LOG1P_MARK`): the log1p's bits."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.exp_polynomial import SCALEF_MARK, SOFTPLUS_LOG1P_MARK, mark_for_polynomial, rewrite_marked
from scanweaver.runtime import cpu_selective_exp
from scanweaver.runtime.cpu import CpuProgram
from scanweaver.toolchain.mlir import emit_c_interface, lower_to_llvm_ir
from scanweaver.workloads.selective import selective_scan_tiled
from scanweaver.workloads.specs import SelectiveScanSpec

needs_scalef = pytest.mark.skipif(not cpu_selective_exp._host_has_scalef(),
                                  reason="this CPU has no AVX-512F/VL/DQ (vscalefps, vrangeps)")


def _map_ir(lanes: int, marks: str, op: str = "math.exp") -> str:
    return f"""func.func @v(%x: memref<?xf32>, %y: memref<?xf32>) {{
  %c0 = arith.constant 0 : index
  %cl = arith.constant {lanes} : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %cl {{
    %v = vector.load %x[%i] : memref<?xf32>, vector<{lanes}xf32>
    %e = {op} %v {{{marks}}} : vector<{lanes}xf32>
    vector.store %e, %y[%i] : memref<?xf32>, vector<{lanes}xf32>
  }}
  func.return
}}"""


def _lowered(lanes: int, marks: str, op: str = "math.exp") -> str:
    module = parse_ir(_map_ir(lanes, marks, op))
    assert mark_for_polynomial(module) == 1 and rewrite_marked(module) == 1
    return print_ir(emit_c_interface(module))


def _run(text: str, x: np.ndarray) -> np.ndarray:
    fn = CpuProgram(lower_to_llvm_ir(text)).get("v", ["memref<?xf32>"] * 2)
    y = np.empty_like(x)
    fn(x, y)
    return y


def _inputs() -> np.ndarray:
    rng = np.random.default_rng(5)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 89.0, 88.9, 89.5, 1e38, -1e38, 1e-30,
               88.72283935546875, 88.72283172607421875, -87.3, -103.9, -104.0, -104.5, -200.0,
               -126 * np.log(2), -149 * np.log(2), 1.0, -1.0, 2.0, 10.0,
               -104.3, -104.33, -104.4, 104.0, 1e4, -1e4, 2.9e6, -2.9e6, -1e7, 1e7, -3e14, 3e14, -1e20, 1e20,
               -3.4e38, 3.4e38, np.finfo(np.float32).max, -np.finfo(np.float32).max]
    wide = rng.choice([-1.0, 1.0], 1 << 16) * 10.0 ** rng.uniform(-40, 38.5, 1 << 16)  # every magnitude
    x = np.concatenate([rng.uniform(-110, 92, 1 << 18), rng.uniform(-1, 1, 1 << 16),
                        rng.uniform(-104, -87, 1 << 16), wide, special])  # (-104, -87): subnormal results
    return np.resize(x, -(-x.size // 16) * 16).astype(np.float32)


@needs_scalef
@pytest.mark.parametrize("lanes", [16, 8, 4])
def test_scalef_form_is_the_fused_form_bit_for_bit(lanes):
    fused = _lowered(lanes, "scanweaver.fused_exp")
    scalef = _lowered(lanes, f"scanweaver.fused_exp, {SCALEF_MARK}")
    assert "llvm.call_intrinsic" in scalef and "llvm.call_intrinsic" not in fused
    x = _inputs()
    want, got = _run(fused, x), _run(scalef, x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert got[~nan].tobytes() == want[~nan].tobytes()
    assert np.isinf(got[x > 88.72283172607421875]).all() and (got[x <= -104] == 0).all()


def test_other_lane_counts_keep_the_fused_form():
    assert _lowered(5, f"scanweaver.fused_exp, {SCALEF_MARK}") == _lowered(5, "scanweaver.fused_exp")


def test_the_selective_kernel_marks_its_exp_by_the_host(monkeypatch):
    spec = SelectiveScanSpec(16, "shared", "shared", True, True, True, True, False, False)
    assert SCALEF_MARK in print_ir(selective_scan_tiled(spec, scalef=True))
    assert SCALEF_MARK not in print_ir(selective_scan_tiled(spec))
    monkeypatch.setenv(cpu_selective_exp.ENV_SWITCH, "0")
    assert not cpu_selective_exp.scalef_exp()
    monkeypatch.setenv(cpu_selective_exp.ENV_SWITCH, "1")
    assert cpu_selective_exp.scalef_exp() == cpu_selective_exp._host_has_scalef()


@pytest.mark.parametrize("lanes", [16, 1])
def test_softplus_log1p_is_the_log1p_bit_for_bit_on_what_softplus_gives_it(lanes):
    """Without its selects, on every operand softplus's exp can give it where the result
    is used: [0, inf) (0, subnormal, tiny, the exps of the whole range, FLT_MAX); NaN
    stays NaN.  The selects were there for -0, x <= -1 and +inf."""
    plain = _lowered(lanes, "", "math.log1p")
    marked = _lowered(lanes, SOFTPLUS_LOG1P_MARK, "math.log1p")
    assert marked.count("arith.select") < plain.count("arith.select")
    rng = np.random.default_rng(7)
    special = [0.0, 1e-45, 1e-38, 1e-30, 6e-8, 1.0, 2.0, 3.4e38, np.nan]
    x = np.concatenate([np.exp(rng.uniform(-104, 88.7, 1 << 18)), rng.uniform(0, 4, 1 << 16), special])
    x = np.resize(x, -(-x.size // 16) * 16).astype(np.float32)
    want, got = _run(plain, x), _run(marked, x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan) and nan.sum() >= 1
    assert got[~nan].tobytes() == want[~nan].tobytes()
