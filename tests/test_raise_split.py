"""The raise's split of a loop whose carried values have different types
(`rewrites/raise_split.py`): one loop, and one scan op, per independent group of
values, equal to the loop on the interpreter; refused, with the reason, when the
values or the memory the parts touch tie them together."""

from __future__ import annotations

import numpy as np
import pytest
from test_raise import golden

from scanweaver.ir import parse_ir
from scanweaver.rewrites.raise_affine import raise_recurrences

# an f32 EMA beside an i32 count of positive inputs, one sequence; {extra} goes in the body
LOOP = """
func.func @f(%x: memref<?xf32>, %y: memref<?xf32>, %n: memref<?xi32>, %k: f32) -> (f32, i32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %z32 = arith.constant 0 : i32
  %one32 = arith.constant 1 : i32
  %L = memref.dim %x, %c0 : memref<?xf32>
  %r:2 = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero, %cnt = %z32) -> (f32, i32) {
    %xv = memref.load %x[%t] : memref<?xf32>
    %pos = arith.cmpf ogt, %xv, %zero : f32
    %m = arith.select %pos, %one32, %z32 : i32
    %cn = arith.addi %cnt, %m : i32
    %p = arith.mulf %k, %h : f32
    %hn = arith.addf %p, %xv : f32
    {extra}
    scf.yield %hn, %cn : f32, i32
  }
  func.return %r#0, %r#1 : f32, i32
}
"""
PER_STEP = """memref.store %hn, %y[%t] : memref<?xf32>
    memref.store %cn, %n[%t] : memref<?xi32>"""


@pytest.mark.parametrize("L", [0, 1, 2, 7, 40])
def test_split_into_one_scan_per_type_runs_like_the_loop(L):
    rng = np.random.default_rng(L)
    args = [rng.uniform(-1, 1, L).astype(np.float32), np.zeros(L, np.float32), np.zeros(L, np.int32),
            np.float32(0.8)]
    module, out, results = golden(LOOP.replace("{extra}", PER_STEP), "f", args, exact=True,
                                  expect=["scan.recurrence", "scan.recurrence"])
    assert int(results[1]) == int((args[0] > 0).sum())  # the loop's count, not a copy of it


@pytest.mark.parametrize("extra,why", [
    # the count's store reads y, which the EMA's part writes: a dependence through memory
    ("""memref.store %hn, %y[%t] : memref<?xf32>
    %yv = memref.load %y[%t] : memref<?xf32>
    %yi = arith.fptosi %yv : f32 to i32
    %s = arith.addi %cn, %yi : i32
    memref.store %s, %n[%t] : memref<?xi32>""", "no part accesses a memref another part writes"),
    # one store of a value built from both
    ("""%cf = arith.sitofp %cn : i32 to f32
    %both = arith.addf %cf, %hn : f32
    memref.store %both, %y[%t] : memref<?xf32>""", "do not depend on each other"),
])
def test_tied_values_are_not_split(extra, why):
    report: list[str] = []
    ops, _ = raise_recurrences(parse_ir(LOOP.replace("{extra}", extra)), report=report)
    assert ops == []
    (line,) = report
    assert "loop not raised: carried values have different types (f32, i32)" in line and why in line
