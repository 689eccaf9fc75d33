"""Issue 10 item 5: i1 memrefs on the CPU path (stored as bytes, passed as numpy bool
arrays), and files with several builtin.modules refused instead of compiled to nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import ScanWeaverError, ScanWeaverTypeError
from scanweaver.interp.run import run_function

ROOT = Path(__file__).resolve().parent.parent
VECTOR_STATE = (ROOT / "filecheck/raise/vector_state.mlir").read_text()

# Reads and writes i1 memrefs: flags[t] = x[t] > 0, count of set flags in n[0].
FLAGS = """
func.func @flags(%x: memref<?xf32>, %flags: memref<?xi1>, %n: memref<1xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %i0 = arith.constant 0 : i32
  %L = memref.dim %x, %c0 : memref<?xf32>
  %cnt = scf.for %t = %c0 to %L step %c1 iter_args(%acc = %i0) -> (i32) {
    %v = memref.load %x[%t] : memref<?xf32>
    %p = arith.cmpf ogt, %v, %zero : f32
    memref.store %p, %flags[%t] : memref<?xi1>
    %q = memref.load %flags[%t] : memref<?xi1>
    %w = arith.extui %q : i1 to i32
    %acc2 = arith.addi %acc, %w : i32
    scf.yield %acc2 : i32
  }
  memref.store %cnt, %n[%c0] : memref<1xi32>
  func.return
}
"""


def test_vector_state_with_an_i1_memref_compiles_and_matches_the_interpreter():
    program = scanweaver.compile(VECTOR_STATE, target="cpu")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    a = rng.uniform(0.5, 1.0, (4, 3)).astype(np.float32)
    done = np.array([False, True, False, True])
    got = [x.copy(), a.copy(), done.copy(), rng.standard_normal(3).astype(np.float32), np.zeros((4, 3), np.float32)]
    want = [v.copy() for v in got]
    program.reset(*got)
    run_function(VECTOR_STATE, "reset", *want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_i1_loads_and_stores_round_trip_through_numpy_bools():
    program = scanweaver.compile(FLAGS, target="cpu")
    x = np.array([1.0, -2.0, 3.0, 0.0, 5.0], np.float32)
    flags = np.zeros(5, bool)
    n = np.zeros(1, np.int32)
    program.flags(x, flags, n)
    np.testing.assert_array_equal(flags, x > 0)
    assert n[0] == 3


def test_i1_memref_in_an_unsupported_use_is_refused_before_the_tool():
    text = """
func.func @f(%m: memref<8xi1>, %o: memref<4xi1, strided<[1], offset: 2>>) {
  %c0 = arith.constant 0 : index
  %s = memref.subview %m[2] [4] [1] : memref<8xi1> to memref<4xi1, strided<[1], offset: 2>>
  %v = memref.load %s[%c0] : memref<4xi1, strided<[1], offset: 2>>
  memref.store %v, %o[%c0] : memref<4xi1, strided<[1], offset: 2>>
  func.return
}
"""
    with pytest.raises(ScanWeaverTypeError, match="memref of i1"):
        scanweaver.compile(text, target="cpu")


def test_cli_compiles_vector_state_to_llvm(tmp_path):
    out = tmp_path / "vs.ll"
    r = subprocess.run([sys.executable, "-m", "scanweaver.cli", "compile", str(ROOT / "filecheck/raise/vector_state.mlir"),
                        "--target", "llvm", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "_mlir_ciface_reset" in out.read_text()


TWO_MODULES = """
builtin.module {
  func.func @f(%x: memref<4xf32>) { func.return }
}
builtin.module {
  func.func @g(%x: memref<4xf32>) { func.return }
}
"""

NESTED = """
builtin.module {
  func.func @f(%x: memref<4xf32>) { func.return }
  builtin.module {
    func.func @g(%x: memref<4xf32>) { func.return }
  }
}
"""


@pytest.mark.parametrize("text", [TWO_MODULES, NESTED], ids=["two", "nested"])
def test_several_modules_are_refused(text, tmp_path):
    with pytest.raises(ScanWeaverError, match="builtin.module"):
        scanweaver.compile(text, target="cpu")
    src, out = tmp_path / "in.mlir", tmp_path / "out.ll"
    src.write_text(text)
    r = subprocess.run([sys.executable, "-m", "scanweaver.cli", "compile", str(src), "--target", "llvm", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "builtin.module" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()
