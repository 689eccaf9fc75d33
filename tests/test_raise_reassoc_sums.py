"""A sum marked reorderable (`arith.addf ... fastmath<reassoc>`, as scanweaver-grad marks
its sums over time into a cell) is a pure reduction: scanweaver-raise leaves it as a loop,
where LLVM vectorises it, instead of a sequential scan that drops the mark.  Without the
mark, or with the running sum read in the loop (a prefix sum), the loop is still raised.
The compiled VJP's emit-reverse and softplus-reverse loops then vectorise."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.ir import parse_ir
from scanweaver.rewrites.raise_affine import raise_recurrences

FM = " fastmath<reassoc,nsz>"


def cell_sum(fm: str, prefix: bool = False) -> str:
    """`m[] = m[] + x[t]` (prefix: each running value also read back into y[t])."""
    readback = ("%r = memref.load %m[] : memref<f32>\n    memref.store %r, %y[%t] : memref<?xf32>"
                if prefix else "")
    return f"""
func.func @s(%x: memref<?xf32>, %m: memref<f32>, %y: memref<?xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %t = %c0 to %n step %c1 {{
    %xv = memref.load %x[%t] : memref<?xf32>
    %old = memref.load %m[] : memref<f32>
    %new = arith.addf %old, %xv{fm} : f32
    memref.store %new, %m[] : memref<f32>
    {readback}
  }}
  func.return
}}
"""


def iter_sum(fm: str) -> str:
    """`acc = acc + x[t]` carried in iter_args, the total stored once."""
    return f"""
func.func @s(%x: memref<?xf32>, %m: memref<f32>, %y: memref<?xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %z = arith.constant 0.0 : f32
  %n = memref.dim %x, %c0 : memref<?xf32>
  %tot = scf.for %t = %c0 to %n step %c1 iter_args(%acc = %z) -> (f32) {{
    %xv = memref.load %x[%t] : memref<?xf32>
    %new = arith.addf %acc, %xv{fm} : f32
    scf.yield %new : f32
  }}
  memref.store %tot, %m[] : memref<f32>
  func.return
}}
"""


@pytest.mark.parametrize("build", [cell_sum, iter_sum])
def test_reassoc_sum_is_left_as_a_loop(build):
    ops, diags = raise_recurrences(parse_ir(build(FM)))
    assert ops == []
    assert any("marked reorderable" in d for d in diags), diags
    ops, _ = raise_recurrences(parse_ir(build("")))
    assert [op.name for op in ops] != []  # the same sum without the mark: raised


def test_reassoc_prefix_sum_is_still_raised():
    ops, diags = raise_recurrences(parse_ir(cell_sum(FM, prefix=True)))
    assert ops, diags


@pytest.mark.parametrize("n", [0, 1, 37, 1000])
def test_reassoc_sum_compiled(n):
    """The loop left to LLVM sums as a reduction may: within float32 reordering."""
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    m = np.array(0.5, np.float32)
    program = scanweaver.compile(cell_sum(FM), target="cpu")
    assert "scan." not in program.stage_ir("scanweaver-raise")
    program["s"](x, m, np.empty(n, np.float32))
    want = 0.5 + np.sum(x.astype(np.float64))
    assert abs(float(m) - want) <= 1e-6 * (1 + np.abs(x).sum())


def test_vjp_sums_over_time_stay_loops():
    """The selective VJP's two sums over time (dD, ddelta_bias) are not raised."""
    from scanweaver.runtime.cpu_scan import SelectiveScanSpec
    from scanweaver.torch import _kernels

    spec = SelectiveScanSpec(n=16, b_kind="shared", c_kind="shared", has_d=True, has_z=True,
                             has_bias=True, softplus=True, has_h0=False, has_last=True)
    text = _kernels._vjp_only(_kernels.selective_ir(spec, False).text, read_only=("out",))
    report: list[str] = []
    raise_recurrences(parse_ir(text), report=report)
    assert sum("marked reorderable" in line for line in report) == 2, report
