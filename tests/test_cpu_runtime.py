"""The llvmlite CPU JIT: calling convention, numerics, strides, errors."""

import re

import numpy as np
import pytest

from scanweaver.errors import BackendUnavailableError, ScanWeaverError
from scanweaver.runtime.cpu import (
    CpuProgram,
    MemRef,
    Scalar,
    flush_denormals,
    load_openmp_runtime,
    memref_descriptor,
    parse_type,
    set_flush_denormals,
)
from scanweaver.toolchain.mlir import lower_to_llvm_ir

KERNELS = """
func.func @axpy(%alpha: f32, %x: memref<?xf32>, %y: memref<?xf32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %xv = memref.load %x[%i] : memref<?xf32>
    %yv = memref.load %y[%i] : memref<?xf32>
    %p = arith.mulf %alpha, %xv : f32
    %s = arith.addf %p, %yv : f32
    memref.store %s, %y[%i] : memref<?xf32>
  }
  return
}

// c = a + 2 * b over a 2-D identity-layout memref (outer stride from the descriptor).
func.func @add2d(%a: memref<?x?xf64>, %b: memref<?x?xf64>, %c: memref<?x?xf64>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %two = arith.constant 2.0 : f64
  %rows = memref.dim %a, %c0 : memref<?x?xf64>
  %cols = memref.dim %a, %c1 : memref<?x?xf64>
  scf.for %i = %c0 to %rows step %c1 {
    scf.for %j = %c0 to %cols step %c1 {
      %av = memref.load %a[%i, %j] : memref<?x?xf64>
      %bv = memref.load %b[%i, %j] : memref<?x?xf64>
      %t = arith.mulf %two, %bv : f64
      %s = arith.addf %av, %t : f64
      memref.store %s, %c[%i, %j] : memref<?x?xf64>
    }
  }
  return
}

func.func @sum(%x: memref<?xf32>) -> f32 attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %n = memref.dim %x, %c0 : memref<?xf32>
  %r = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> (f32) {
    %v = memref.load %x[%i] : memref<?xf32>
    %a = arith.addf %acc, %v : f32
    scf.yield %a : f32
  }
  return %r : f32
}

// y = tanh(log1p(exp(x))) elementwise: softplus through libm and intrinsics.
func.func @softplus_tanh(%x: memref<?xf32>, %y: memref<?xf32>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32>
    %e = math.exp %v : f32
    %l = math.log1p %e : f32
    %t = math.tanh %l : f32
    memref.store %t, %y[%i] : memref<?xf32>
  }
  return
}

// Strided views: y[i] += x[i] for any (non-negative) strides and offsets.
func.func @add_strided(%x: memref<?xf32, strided<[?], offset: ?>>, %y: memref<?xf32, strided<[?], offset: ?>>) attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32, strided<[?], offset: ?>>
  scf.for %i = %c0 to %n step %c1 {
    %xv = memref.load %x[%i] : memref<?xf32, strided<[?], offset: ?>>
    %yv = memref.load %y[%i] : memref<?xf32, strided<[?], offset: ?>>
    %s = arith.addf %xv, %yv : f32
    memref.store %s, %y[%i] : memref<?xf32, strided<[?], offset: ?>>
  }
  return
}

// Reads element [i, j] of a fully strided 2-D f64 memref.
func.func @at(%a: memref<?x?xf64, strided<[?, ?], offset: ?>>, %i: index, %j: index) -> f64 attributes {llvm.emit_c_interface} {
  %v = memref.load %a[%i, %j] : memref<?x?xf64, strided<[?, ?], offset: ?>>
  return %v : f64
}

// Several results come back through a struct pointer passed first.
func.func @divmod(%a: i64, %b: i64, %scale: f32) -> (i64, i64, f32) attributes {llvm.emit_c_interface} {
  %q = arith.divsi %a, %b : i64
  %r = arith.remsi %a, %b : i64
  %f = arith.sitofp %q : i64 to f32
  %s = arith.mulf %f, %scale : f32
  return %q, %r, %s : i64, i64, f32
}

func.func @less(%a: i32, %b: i32) -> i1 attributes {llvm.emit_c_interface} {
  %c = arith.cmpi slt, %a, %b : i32
  return %c : i1
}

func.func @mul(%a: f32, %b: f32) -> f32 attributes {llvm.emit_c_interface} {
  %c = arith.mulf %a, %b : f32
  return %c : f32
}

func.func @first4(%x: memref<4xf32>) -> f32 attributes {llvm.emit_c_interface} {
  %c3 = arith.constant 3 : index
  %v = memref.load %x[%c3] : memref<4xf32>
  return %v : f32
}

// vector dialect: y[0:8] = fma(x, x, y), returns the sum of x[0:8].
func.func @vec8(%x: memref<?xf32>, %y: memref<?xf32>) -> f32 attributes {llvm.emit_c_interface} {
  %c0 = arith.constant 0 : index
  %xv = vector.load %x[%c0] : memref<?xf32>, vector<8xf32>
  %yv = vector.load %y[%c0] : memref<?xf32>, vector<8xf32>
  %f = vector.fma %xv, %xv, %yv : vector<8xf32>
  vector.store %f, %y[%c0] : memref<?xf32>, vector<8xf32>
  %s = vector.reduction <add>, %xv : vector<8xf32> into f32
  return %s : f32
}

func.func @no_ciface(%a: f32) -> f32 {
  return %a : f32
}
"""


@pytest.fixture(scope="module")
def program():
    return CpuProgram(lower_to_llvm_ir(KERNELS))


def test_axpy(program):
    axpy = program.get("axpy", ["f32", "memref<?xf32>", "memref<?xf32>"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    y = rng.standard_normal(1000).astype(np.float32)
    expected = np.float32(0.5) * x + y
    assert axpy(0.5, x, y) is None
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


def test_loop_is_vectorised_for_the_host(program):
    assert re.search(r"<\d+ x float>", program.optimized_ir())


def test_2d(program):
    add2d = program.get("add2d", ["memref<?x?xf64>"] * 3)
    a = np.arange(12.0).reshape(3, 4)
    b = np.full((3, 4), 0.25)
    c = np.zeros((3, 4))
    add2d(a, b, c)
    np.testing.assert_array_equal(c, a + 0.5)
    assert c[2, 3] == 11.5


def test_2d_rows_of_a_wider_array(program):
    # Identity layout reads the outer stride from the descriptor: a column slice of
    # whole rows (inner stride 1) is fine.
    add2d = program.get("add2d", ["memref<?x?xf64>"] * 3)
    big = np.arange(40.0).reshape(5, 8)
    a = big[1:4, 2:6]
    b = np.ones((3, 4))
    c = np.zeros((6, 4))[::2]  # every other row
    add2d(a, b, c)
    np.testing.assert_array_equal(c, a + 2.0)


def test_identity_layout_rejects_inner_stride(program):
    add2d = program.get("add2d", ["memref<?x?xf64>"] * 3)
    a = np.zeros((3, 8))[:, ::2]
    with pytest.raises(ScanWeaverError, match=r"argument 0 of add2d has element strides \(8, 2\)"):
        add2d(a, np.zeros((3, 4)), np.zeros((3, 4)))


def test_scalar_result(program):
    total = program.get("sum", ["memref<?xf32>"], ["f32"])
    x = np.arange(1, 101, dtype=np.float32)
    assert total(x) == 5050.0
    assert total(np.zeros(0, np.float32)) == 0.0


def test_math_functions(program):
    f = program.get("softplus_tanh", ["memref<?xf32>", "memref<?xf32>"])
    x = np.linspace(-30, 10, 257, dtype=np.float32)
    y = np.empty_like(x)
    f(x, y)
    expected = np.tanh(np.log1p(np.exp(x.astype(np.float64))))
    np.testing.assert_allclose(y, expected, rtol=2e-6, atol=0)
    # log1p stays exact for tiny arguments (log(1 + x) would give 0 here).
    assert y[0] > 0 and abs(y[0] / expected[0] - 1) < 1e-5


def test_strided_views(program):
    f = program.get("add_strided", ["memref<?xf32, strided<[?], offset: ?>>"] * 2)
    base_x = np.arange(30, dtype=np.float32)
    base_y = np.zeros(20, dtype=np.float32)
    x = base_x[1::3]  # 10 elements, stride 3, starting at offset 1
    y = base_y[::2]  # 10 elements, stride 2
    f(x, y)
    np.testing.assert_array_equal(base_y[::2], np.arange(1, 30, 3, dtype=np.float32))
    np.testing.assert_array_equal(base_y[1::2], 0)  # untouched in between


def test_transposed_2d(program):
    at = program.get("at", ["memref<?x?xf64, strided<[?, ?], offset: ?>>", "index", "index"], ["f64"])
    a = np.arange(12.0).reshape(3, 4)
    t = a.T  # strides (1, 4) elements
    assert at(t, 3, 1) == a[1, 3] == 7.0
    assert at(a[1:, 1:], 1, 2) == a[2, 3]


def test_multiple_results(program):
    divmod_ = program.get("divmod", ["i64", "i64", "f32"], ["i64", "i64", "f32"])
    assert divmod_(47, 5, 0.5) == (9, 2, 4.5)
    assert divmod_(-(2**40), 3, 1.0)[0] == -(2**40) // 3 + 1  # truncating division


def test_bool_result(program):
    less = program.get("less", [Scalar("i32"), Scalar("i32")], [Scalar("i1")])
    assert less(1, 2) is True
    assert less(2, -1) is False


def test_vector_dialect(program):
    vec8 = program.get("vec8", ["memref<?xf32>", "memref<?xf32>"], ["f32"])
    x = np.arange(8, dtype=np.float32)
    y = np.ones(8, dtype=np.float32)
    assert vec8(x, y) == 28.0
    np.testing.assert_array_equal(y, x * x + 1)


def test_static_shape_is_checked(program):
    first4 = program.get("first4", ["memref<4xf32>"], ["f32"])
    assert first4(np.array([1, 2, 3, 4], np.float32)) == 4.0
    with pytest.raises(ScanWeaverError, match="expects size 4 in dimension 0"):
        first4(np.zeros(5, np.float32))


def test_argument_errors_name_the_argument(program):
    axpy = program.get("axpy", ["f32", "memref<?xf32>", "memref<?xf32>"])
    x = np.zeros(4, np.float32)
    with pytest.raises(ScanWeaverError, match=r"argument 2 of axpy expects dtype float32 .* got float64"):
        axpy(1.0, x, np.zeros(4))
    with pytest.raises(ScanWeaverError, match=r"argument 1 of axpy expects a 1-D array"):
        axpy(1.0, np.zeros((2, 2), np.float32), x)
    with pytest.raises(ScanWeaverError, match=r"argument 1 of axpy has negative strides"):
        axpy(1.0, x[::-1], x)
    odd = np.lib.stride_tricks.as_strided(np.zeros(16, np.float32), shape=(3,), strides=(6,))
    with pytest.raises(ScanWeaverError, match=r"argument 1 of axpy has byte strides \(6,\)"):
        axpy(1.0, odd, x)
    with pytest.raises(ScanWeaverError, match=r"argument 1 of axpy expects a numpy array"):
        axpy(1.0, [1.0, 2.0], x)
    with pytest.raises(ScanWeaverError, match="takes 3 arguments, got 2"):
        axpy(1.0, x)
    less = program.get("less", ["i32", "i32"], ["i1"])
    with pytest.raises(ScanWeaverError, match="does not fit in i32"):
        less(2**31, 0)


def test_function_lookup_errors(program):
    with pytest.raises(ScanWeaverError, match="mark it with llvm.emit_c_interface"):
        program.get("no_ciface", ["f32"], ["f32"])
    with pytest.raises(ScanWeaverError, match="no such function"):
        program.get("missing", [])
    with pytest.raises(ScanWeaverError, match="memref results are not supported"):
        program.get("sum", ["memref<?xf32>"], ["memref<?xf32>"])


def test_parse_type():
    assert parse_type("f32") == Scalar("f32")
    assert parse_type("memref<?x4xf16>") == MemRef("f16", (None, 4))
    assert parse_type("memref<f64>") == MemRef("f64", ())
    strided = parse_type("memref<?x?xf32, strided<[?, 1], offset: ?>>")
    assert strided == MemRef("f32", 2, (None, 1), None)
    assert str(strided) == "memref<?x?xf32, strided<[?, 1], offset: ?>>"
    assert MemRef("f32", (None, 8, None)).static_strides() == (None, None, 1)
    assert MemRef("f32", (4, 8)).static_strides() == (8, 1)
    with pytest.raises(ScanWeaverError, match="unsupported scalar type"):
        parse_type("f128")
    assert memref_descriptor(2).sizes.size == 16  # two i64 after ptr, ptr, i64 offset
    assert memref_descriptor(2).strides.offset == 40


def test_flush_denormals(program):
    mul = program.get("mul", ["f32", "f32"], ["f32"])
    tiny = mul(1e-20, 1e-20)  # 1e-40 is an f32 denormal
    assert 0 < tiny < 1.2e-38
    assert program.get("mul", ["f32", "f32"], ["f32"], ftz=True)(1e-20, 1e-20) == 0.0
    with flush_denormals():
        assert mul(1e-20, 1e-20) == 0.0
    assert mul(1e-20, 1e-20) == tiny  # the old mode is restored
    previous = set_flush_denormals(True)
    try:
        assert previous is False
        assert mul(1e-20, 1e-20) == 0.0
    finally:
        set_flush_denormals(previous)


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_built_fp_control_helpers_are_the_old_texts(machine):
    """The helpers built with llvmlite.ir parse (O0) to the functions of the LLVM IR
    text they replaced (`tests/legacy_ir.py`)."""
    import legacy_ir
    from scanweaver.runtime.cpu import fp_control_ir

    old = legacy_ir._DENORMAL_HELPERS[machine]
    try:
        expected = legacy_ir.canonical_llvm_ir(old[1], 0)
    except ScanWeaverError:  # (an LLVM built without this target may not know its intrinsics)
        pytest.skip(f"this LLVM does not parse {machine}'s intrinsics")
    assert legacy_ir.canonical_llvm_ir(fp_control_ir(machine), 0) == expected


def test_openmp_parallel_loop():
    try:
        load_openmp_runtime()
    except BackendUnavailableError as error:
        pytest.skip(str(error))
    text = """
    func.func @par_exp(%x: memref<?xf32>, %y: memref<?xf32>) attributes {llvm.emit_c_interface} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %n = memref.dim %x, %c0 : memref<?xf32>
      scf.parallel (%i) = (%c0) to (%n) step (%c1) {
        %v = memref.load %x[%i] : memref<?xf32>
        %e = math.exp %v : f32
        memref.store %e, %y[%i] : memref<?xf32>
      }
      return
    }
    """
    ir = lower_to_llvm_ir(text, openmp=True)
    assert "@__kmpc_fork_call" in ir
    program = CpuProgram(ir)
    assert program.openmp_runtime
    x = np.linspace(-5, 5, 10001, dtype=np.float32)
    y = np.zeros_like(x)
    program.get("par_exp", ["memref<?xf32>", "memref<?xf32>"])(x, y)
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-6)
