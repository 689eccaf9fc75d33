"""The fast CPU path: `scan-to-cpu`, the polynomial exp/log1p, the compiled drivers.

* scan.affine compiled through `scan-to-cpu` is bit-identical to the interpreter
  (unfused multiply and add, sequential order per channel), for every element type,
  reverse, init/final, remainder channels and time remainders; long rows (skewed,
  prefetched tiles) are checked against the sequential lowering compiled the same way.
* the selective scan kernel (vectorised recurrence, polynomial exp) is within 1e-4 of
  the float64 numpy reference; the loop form from the workload builder too.
* the thread-split and parallel-in-time drivers agree with the single call.
No timing assertions; every kernel here is small.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.exp_polynomial import ExpToPolynomial, rewrite_log1ps
from scanweaver.rewrites.scan_to_cpu import ScanToCpu
from scanweaver.runtime import cpu_scan, cpu_variants
from scanweaver.runtime.cpu import CpuProgram
from scanweaver.toolchain.mlir import emit_c_interface, lower_to_llvm_ir

EL = {np.float32: "f32", np.float64: "f64", np.int32: "i32", np.int64: "i64"}


def inputs(rng, shape, dtype):
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        return a, b
    return rng.uniform(0.5, 1.0, shape).astype(dtype), rng.uniform(-1.0, 1.0, shape).astype(dtype)


def lowered_text(text: str, **options) -> str:
    module = parse_ir(text)
    ScanToCpu(**options).apply(make_context(), module)
    module.verify()
    out = print_ir(module)
    assert "scan." not in out
    return out


# ---------------------------------------------------------------------------
# scan.affine vs the interpreter, bit for bit
# ---------------------------------------------------------------------------

FLAGS = [(False, False, False), (True, True, True), (True, False, False), (False, True, True)]


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float64])
@pytest.mark.parametrize("init,final,reverse", FLAGS[:2])
def test_affine_time_innermost_bit_exact(dtype, init, final, reverse):
    el = EL[dtype]
    text = cpu_scan.affine_ir(el, 2, init, final, reverse)
    k = cpu_scan.kernel(text, "affine", [2, 2] + [1] * init + [2] + [1] * final)
    rng = np.random.default_rng(3)
    # remainder channels (13, 3), time remainders (37, 5), exact tiles (16x16), empty rows
    for shape in ((13, 37), (16, 16), (3, 5), (9, 1), (2, 0)):
        a, b = inputs(rng, shape, dtype)
        h0 = inputs(rng, shape[:1], dtype)[1]
        args = [a, b] + ([h0] if init else [])
        want = [*args, np.full(shape, 7, dtype)] + ([np.full(shape[:1], 7, dtype)] if final else [])
        got = [x.copy() for x in want]
        run_function(text, "affine", *want)
        k(*got)
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=f"{shape}")


@pytest.mark.parametrize("init,final,reverse", FLAGS[2:])
def test_affine_rank3_and_flags_bit_exact(init, final, reverse):
    text = cpu_scan.affine_ir("f32", 3, init, final, reverse)
    k = cpu_scan.kernel(text, "affine", [3, 3] + [2] * init + [3] + [2] * final)
    rng = np.random.default_rng(4)
    shape = (2, 11, 21)
    a, b = inputs(rng, shape, np.float32)
    h0 = inputs(rng, shape[:2], np.float32)[1]
    want = [a, b] + ([h0] if init else []) + [np.zeros(shape, np.float32)]
    want += [np.zeros(shape[:2], np.float32)] if final else []
    got = [x.copy() for x in want]
    run_function(text, "affine", *want)
    k(*got)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)


CHANNELS_IR = """func.func @f(%a: memref<?x?xT>, %b: memref<?x?xT>, %h0: memref<?xT>, %h: memref<?x?xT>, %hT: memref<?xT>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 0 REV : memref<?x?xT>, memref<?x?xT>, memref<?xT> -> memref<?x?xT>, memref<?xT>
  func.return
}
"""


@pytest.mark.parametrize("dtype,reverse", [(np.float32, False), (np.int64, True)])
def test_affine_channels_innermost_bit_exact(dtype, reverse):
    el = EL[dtype]
    text = CHANNELS_IR.replace("T>", f"{el}>").replace("REV", "reverse" if reverse else "")
    k = cpu_scan.kernel(text, "f", [2, 2, 1, 2, 1])
    rng = np.random.default_rng(5)
    for shape in ((23, 45), (7, 3), (4, 32)):  # wide groups, single vectors, masked tail
        a, b = inputs(rng, shape, dtype)
        h0 = inputs(rng, shape[1:], dtype)[1]
        want = [a, b, h0, np.zeros(shape, dtype), np.zeros(shape[1:], dtype)]
        got = [x.copy() for x in want]
        run_function(text, "f", *want)
        k(*got)
        for x, y in zip(got, want):
            np.testing.assert_array_equal(x, y)


def test_long_rows_match_sequential_lowering():
    """Skewed tiles (rows >= 512 steps; prefetched from 2048) vs the sequential loops, compiled."""
    text = cpu_scan.affine_ir("f32", 2, True, True, False)
    fast = cpu_scan.kernel(text, "affine", [2, 2, 1, 2, 1])
    from scanweaver.rewrites.scan_to_loops import ScanToLoops

    module = parse_ir(text)
    ScanToLoops().apply(make_context(), module)
    slow = cpu_scan.Kernel(CpuProgram(lower_to_llvm_ir(print_ir(module))), "affine", [2, 2, 1, 2, 1])
    rng = np.random.default_rng(6)
    for shape in ((19, 2100), (8, 4096), (11, 700)):  # skew SKEW_BLOCKS, SKEW_BLOCKS, 1
        a, b = inputs(rng, shape, np.float32)
        h0 = inputs(rng, shape[:1], np.float32)[1]
        got = [np.empty(shape, np.float32), np.empty(shape[0], np.float32)]
        want = [np.empty(shape, np.float32), np.empty(shape[0], np.float32)]
        fast(a, b, h0, *got)
        slow(a, b, h0, *want)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        # the reverse scan of a sequence is the forward scan of the reversed sequence
        hr, fr = cpu_scan.affine_scan_cpu(a[:, ::-1], b[:, ::-1], h0, reverse=False, return_final=True, variant="single")
        hf, ff = cpu_scan.affine_scan_cpu(a, b, h0, reverse=True, return_final=True, variant="single")
        np.testing.assert_array_equal(hf, hr[:, ::-1])
        np.testing.assert_array_equal(ff, fr)


SCAN_IR = """func.func @f(%x: memref<5x19xf32>, %y: memref<5x19xf32>) {
  scan.scan ins(%x : memref<5x19xf32>) outs(%y : memref<5x19xf32>) axis 1 {
  ^bb0(%p: f32, %q: f32):
    %m = arith.maximumf %p, %q : f32
    scan.yield %m : f32
  }
  func.return
}
"""


def test_fallbacks_stay_exact():
    """scan.scan and unvectorisable recurrences take the sequential lowering."""
    lowered = lowered_text(SCAN_IR)
    assert "vector." not in lowered
    program = CpuProgram(lower_to_llvm_ir(print_ir(emit_c_interface(parse_ir(lowered)))))
    x = np.random.default_rng(7).standard_normal((5, 19)).astype(np.float32)
    got, want = np.zeros_like(x), np.zeros_like(x)
    program.get("f", ["memref<5x19xf32>"] * 2)(x, got)
    run_function(SCAN_IR, "f", x, want)
    np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------
# scan.recurrence (the selective scan)
# ---------------------------------------------------------------------------

RECURRENCE_IR = """func.func @f(%a: memref<4x128xf32>, %y: memref<128xf32>, %h: memref<4xf32>) {
  %lb = arith.constant 0 : index
  %ub = arith.constant 128 : index
  %c1 = arith.constant 1 : index
  scan.recurrence %lb to %ub step %c1 state(%h : memref<4xf32>) coeffs {
  ^bb0(%i: index, %k: index):
    %av = memref.load %a[%k, %i] : memref<4x128xf32>
    %one = arith.constant 1.0 : f32
    scan.yield %av, %one : f32, f32
  } emit {
  ^bb0(%t: index, %s: memref<4xf32>):
    %c2 = arith.constant 2 : index
    %v = memref.load %s[%c2] : memref<4xf32>
    memref.store %v, %y[%t] : memref<128xf32>
    scan.yield
  }
  func.return
}
"""


def test_recurrence_vectorised_exactly():
    """Gather loads (state index not last) and a state read at a fixed index."""
    lowered = lowered_text(RECURRENCE_IR)
    assert "vector.insert" in lowered  # the gather of a[k, i]
    program = CpuProgram(lower_to_llvm_ir(print_ir(emit_c_interface(parse_ir(lowered)))))
    rng = np.random.default_rng(8)
    a = rng.uniform(0.5, 1.0, (4, 128)).astype(np.float32)
    h0 = rng.standard_normal(4).astype(np.float32)
    got = [np.zeros(128, np.float32), h0.copy()]
    want = [np.zeros(128, np.float32), h0.copy()]
    program.get("f", ["memref<4x128xf32>", "memref<128xf32>", "memref<4xf32>"])(a, *got)
    run_function(RECURRENCE_IR, "f", a, *want)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def _selective_inputs(rng, batch, D, N, L, bc, groups=2):
    shape = {"const": (D, N), "shared": (batch, N, L), "grouped": (batch, groups, N, L)}[bc]
    return {
        "u": rng.standard_normal((batch, D, L)).astype(np.float32),
        "delta": (0.5 * rng.standard_normal((batch, D, L))).astype(np.float32),
        "A": (-np.exp(0.5 * rng.standard_normal((D, N)))).astype(np.float32),
        "B": rng.standard_normal(shape).astype(np.float32),
        "C": rng.standard_normal(shape).astype(np.float32),
        "D": rng.standard_normal(D).astype(np.float32),
        "z": rng.standard_normal((batch, D, L)).astype(np.float32),
        "delta_bias": (0.1 * rng.standard_normal(D)).astype(np.float32),
    }


def _rel(x, ref):
    return np.max(np.abs(x - ref)) / np.max(np.abs(ref))


@pytest.mark.parametrize(
    "batch,D,N,L,bc,full",
    [(2, 6, 16, 37, "shared", True), (1, 4, 5, 20, "const", False), (2, 4, 16, 33, "grouped", True)],
)
def test_selective_scan_matches_reference(batch, D, N, L, bc, full):
    from scanweaver.workloads.reference import selective_scan_reference

    rng = np.random.default_rng(9)
    x = _selective_inputs(rng, batch, D, N, L, bc)
    if not full:
        x["delta"] = np.abs(x["delta"])
        for k in ("D", "z", "delta_bias"):
            x[k] = None
    kw = dict(D=x["D"], z=x["z"], delta_bias=x["delta_bias"], delta_softplus=full, return_last_state=True)
    out, last = cpu_scan.selective_scan_cpu(x["u"], x["delta"], x["A"], x["B"], x["C"], **kw)
    ref, ref_last = selective_scan_reference(x["u"], x["delta"], x["A"], x["B"], x["C"], **kw)
    assert out.dtype == np.float32 and out.shape == (batch, D, L)
    assert _rel(out, ref) < 1e-4
    assert _rel(last, ref_last) < 1e-4


def test_selective_scan_initial_state_and_threads():
    rng = np.random.default_rng(10)
    x = _selective_inputs(rng, 1, 9, 16, 40, "shared")
    h0 = rng.standard_normal((1, 9, 16)).astype(np.float32)
    args = (x["u"], x["delta"], x["A"], x["B"], x["C"])
    kw = dict(D=x["D"], delta_softplus=True, return_last_state=True)
    one = cpu_scan.selective_scan_cpu(*args, h0=h0, threads=1, **kw)
    two = cpu_scan.selective_scan_cpu(*args, h0=h0, threads=2, **kw)
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])
    # h0 then L steps == the first half, then the second half from its last state
    first = cpu_scan.selective_scan_cpu(*(a[..., :20] for a in args[:2]), x["A"], x["B"][..., :20],
                                        x["C"][..., :20], h0=h0, **kw)
    second = cpu_scan.selective_scan_cpu(*(a[..., 20:] for a in args[:2]), x["A"], x["B"][..., 20:],
                                         x["C"][..., 20:], h0=first[1], **kw)
    assert _rel(np.concatenate([first[0], second[0]], axis=-1), one[0]) < 1e-5
    assert _rel(second[1], one[1]) < 1e-5


def test_selective_scan_loops_are_vectorised():
    """The workload builder's loop form: raised, then vectorised over the state."""
    from scanweaver.workloads.loops import selective_scan_loops
    from scanweaver.workloads.reference import selective_scan_reference

    batch, D, L, N = 1, 3, 24, 16
    text = print_ir(selective_scan_loops(batch, D, L, N, bc="shared"))
    from scanweaver import compiler

    lowered = compiler.lower(text, "cpu", keep_stages=False).text
    assert "scan." not in lowered and "vector.reduction" in lowered
    program = cpu_scan.compile_cpu(text)
    rng = np.random.default_rng(11)
    x = _selective_inputs(rng, batch, D, N, L, "shared")
    out = np.empty((batch, D, L), np.float32)
    k = cpu_scan.Kernel(program, "selective_scan", [3, 3, 2, 3, 3, 1, 3, 1, 3])
    k(x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"], x["delta_bias"], out)
    ref = selective_scan_reference(x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"], x["delta_bias"], True)
    assert _rel(out, ref) < 1e-4


# ---------------------------------------------------------------------------
# Polynomial exp and log1p
# ---------------------------------------------------------------------------

MAP_IR = """func.func @v(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c16 = arith.constant 16 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %i = %c0 to %n step %c16 {
    %v = vector.load %x[%i] : memref<?xf32>, vector<16xf32>
    %e = math.OP %v : vector<16xf32>
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
    %e = math.OP %v : f32
    memref.store %e, %y[%i] : memref<?xf32>
  }
  func.return
}
"""


def _map_program(op: str):
    module = parse_ir(MAP_IR.replace("OP", op))
    if op == "exp":
        ExpToPolynomial().apply(make_context(), module)
    else:
        rewrite_log1ps(module)
    module.verify()
    text = print_ir(emit_c_interface(module))
    assert f"math.{op}" not in text
    program = CpuProgram(lower_to_llvm_ir(text))
    return [program.get(n, ["memref<?xf32>"] * 2) for n in ("v", "s")]


def _ulps(got, want):
    return np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))


def test_polynomial_exp_accuracy():
    vec, scalar = _map_program("exp")
    rng = np.random.default_rng(12)
    x = np.concatenate([rng.uniform(-104, 88.7, 1 << 20), rng.uniform(-1, 1, 1 << 18)]).astype(np.float32)
    y, ys = np.empty_like(x), np.empty_like(x)
    vec(x, y)
    scalar(x, ys)
    np.testing.assert_array_equal(y, ys)  # same ops scalar or vector
    ref = np.exp(x.astype(np.float64))
    normal = ref >= np.finfo(np.float32).tiny
    assert np.max(np.abs(y[normal] - ref[normal]) / ref[normal]) < 2.5e-7
    assert _ulps(y[normal], ref[normal].astype(np.float32)).max() <= 2
    # subnormal results: within one subnormal step
    assert np.max(np.abs(y[~normal] - ref[~normal])) <= 2.0**-149
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 89.0, 88.72283935546875, -103.9, -200.0, 1e-30]
                       + [0.0] * 6, np.float32)
    out = np.empty_like(special)
    vec(special, out)
    with np.errstate(over="ignore"):
        want = np.exp(special.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(out, want)


def test_polynomial_log1p_accuracy():
    vec, scalar = _map_program("log1p")
    rng = np.random.default_rng(13)
    x = np.concatenate([rng.uniform(-1, 3, 1 << 18), np.exp(rng.uniform(-80, 80, 1 << 18))]).astype(np.float32)
    y, ys = np.empty_like(x), np.empty_like(x)
    vec(x, y)
    scalar(x, ys)
    np.testing.assert_array_equal(y, ys)
    ref = np.log1p(x.astype(np.float64))
    ok = x > -1
    assert _ulps(y[ok], ref[ok].astype(np.float32)).max() <= 2
    special = np.array([0.0, -0.0, np.inf, np.nan, -1.0, -2.0, 1e-30, 3e38] + [0.0] * 8, np.float32)
    out = np.empty_like(special)
    vec(special, out)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log1p(special)
    np.testing.assert_array_equal(out, want)
    assert np.signbit(out[1])


# ---------------------------------------------------------------------------
# Drivers: threads and parallel-in-time
# ---------------------------------------------------------------------------


def test_kernel_calls_release_the_gil():
    k = cpu_scan._affine_kernel("f32", 2, False, False, False)
    assert not type(k._fn)._flags_ & ctypes._FUNCFLAG_PYTHONAPI  # CFUNCTYPE: GIL released


def _variant_inputs(rng, C, L, dtype):
    """Small integers (exact, no overflow) or decays near 1 (long memory): a, b, h0."""
    if np.dtype(dtype).kind == "i":
        return (rng.integers(-3, 4, (C, L)).astype(dtype), rng.integers(-9, 10, (C, L)).astype(dtype),
                rng.integers(-9, 10, C).astype(dtype))
    return (rng.uniform(0.9, 1.0, (C, L)).astype(dtype), rng.uniform(-1, 1, (C, L)).astype(dtype),
            rng.uniform(-1, 1, C).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_variants_agree(dtype):
    rng = np.random.default_rng(14)
    for (C, L), reverse in (((3, 5000), False), ((20, 3001), True), ((1, 9000), True)):
        a, b, h0 = _variant_inputs(rng, C, L, dtype)
        base = cpu_scan.affine_scan_cpu(a, b, h0, reverse, True, variant="single")
        split = cpu_scan.affine_scan_cpu(a, b, h0, reverse, True, variant="channels", threads=2)
        np.testing.assert_array_equal(split[0], base[0])  # same chains, same rounding
        np.testing.assert_array_equal(split[1], base[1])
        chunked = cpu_scan.affine_scan_cpu(a, b, h0, reverse, True, variant="chunked", threads=2)
        if np.dtype(dtype).kind == "i":  # wrap-around arithmetic is associative
            np.testing.assert_array_equal(chunked[0], base[0])
            np.testing.assert_array_equal(chunked[1], base[1])
        else:
            tol = 1e-4 if dtype == np.float32 else 1e-10
            assert _rel(chunked[0], base[0]) < tol
            assert _rel(chunked[1], base[1]) < tol


def test_chunked_flushes_denormal_products():
    """Products of many decays underflow; the chunked variant stays correct."""
    rng = np.random.default_rng(15)
    a = rng.uniform(0.5, 0.6, (2, 20000)).astype(np.float32)
    b = rng.uniform(-1, 1, (2, 20000)).astype(np.float32)
    base = cpu_scan.affine_scan_cpu(a, b, variant="single")
    chunked = cpu_scan.affine_scan_cpu(a, b, variant="chunked", threads=2)
    assert _rel(chunked, base) < 1e-5


def test_variant_choice_and_errors(monkeypatch):
    big = "openmp" if cpu_scan.openmp_available() else "channels"
    assert cpu_scan.choose_affine_variant(1024, 4096, np.float32, threads=2) == big
    assert cpu_scan.choose_affine_variant(1024, 4096, np.float32, threads=1) == "single"
    monkeypatch.setattr(cpu_variants, "openmp_available", lambda: False)  # no libomp: Python threads
    assert cpu_scan.choose_affine_variant(1024, 4096, np.float32, threads=2) == "channels"
    monkeypatch.undo()
    assert cpu_scan.choose_affine_variant(4, 1 << 20, np.float32, threads=2) == "chunked"
    # f64: only one long row is cut in time (README "Numerics"); more rows stay bit-identical.
    assert cpu_scan.choose_affine_variant(1, 1 << 24, np.float64, threads=2) == "chunked"
    assert cpu_scan.choose_affine_variant(1, 1 << 24, np.float64, threads=1) == "chunked"
    assert cpu_scan.choose_affine_variant(1, 1 << 20, np.float64, threads=2) == "single"
    assert cpu_scan.choose_affine_variant(2, 1 << 22, np.float64, threads=2) in ("single", "channels")
    assert cpu_scan.choose_affine_variant(4, 1 << 20, np.float64, threads=2) == "channels"
    assert cpu_scan.choose_affine_variant(8, 64, np.float32, threads=2) == "single"
    from scanweaver.errors import ScanWeaverError

    with pytest.raises(ScanWeaverError, match="dtype"):
        cpu_scan.affine_scan_cpu(np.ones((2, 3), np.float16), np.ones((2, 3), np.float16))
    with pytest.raises(ScanWeaverError, match="2-D"):
        cpu_scan.affine_scan_cpu(np.ones(3, np.float32), np.ones(3, np.float32))
    with pytest.raises(ScanWeaverError, match="B"):
        x = np.ones((1, 2, 5), np.float32)
        cpu_scan.selective_scan_cpu(x, x, np.ones((2, 4), np.float32), np.ones((3, 3), np.float32), np.ones((2, 4), np.float32))


def test_single_long_f64_row_is_chunked_within_bound():
    """The public linear_scan cuts one long f64 row in time (README "Numerics"): finite,
    and within the documented bound of the bit-identical sequential variant."""
    import scanweaver

    L = cpu_variants.F64_CHUNKED_MIN_LENGTH
    assert cpu_scan.choose_affine_variant(1, L, np.float64, threads=2) == "chunked"
    rng = np.random.default_rng(7)
    a = rng.uniform(0.9, 1.0, (1, L))
    b = rng.standard_normal((1, L))
    h = scanweaver.linear_scan(a, b)
    seq = cpu_scan.affine_scan_cpu(a, b, variant="single")
    assert np.isfinite(h).all()
    # |h| and the loop's rounding scale stay below 10 * max|b| (a <= 1 - 1/10 on average);
    # rounding errors are ~1e-13 of that, a wrong carry between chunks is of order 1.
    np.testing.assert_allclose(h, seq, rtol=0, atol=1e-9 * np.abs(b).max())


def _openmp_or_skip() -> None:
    from scanweaver.errors import BackendUnavailableError
    from scanweaver.runtime.cpu import load_openmp_runtime

    try:
        load_openmp_runtime()
    except BackendUnavailableError as error:
        pytest.skip(f"openmp variant not tested: {error}")


def test_parallel_channels_option_only_changes_the_group_loop():
    text = cpu_scan.affine_ir("f32", 2, True, True, False)
    outs = []
    for parallel in (False, True):
        module = parse_ir(text)
        ScanToCpu(parallel_channels=parallel).apply(make_context(), module)
        module.verify()
        outs.append(print_ir(module))
    assert "scf.parallel" not in outs[0] and outs[1].count("scf.parallel") == 1


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_openmp_variant_equals_single(dtype):
    _openmp_or_skip()
    rng = np.random.default_rng(16)
    # 8 lanes per group for 32-bit types: 37 and 203 channels leave a partial group.
    for (C, L), reverse, init, final in (
        ((64, 1000), False, False, False),
        ((37, 300), True, True, True),
        ((203, 2049), False, True, True),
        ((203, 2049), True, False, True),
        ((5, 17), False, True, False),
    ):
        a, b, h0 = _variant_inputs(rng, C, L, dtype)
        h0 = h0 if init else None
        base = cpu_scan.affine_scan_cpu(a, b, h0, reverse, final, variant="single")
        for threads in (1, 2, 3):
            got = cpu_scan.affine_scan_cpu(a, b, h0, reverse, final, variant="openmp", threads=threads)
            if final:
                np.testing.assert_array_equal(got[0], base[0])
                np.testing.assert_array_equal(got[1], base[1])
            else:
                np.testing.assert_array_equal(got, base)


def _tiled_kernel(text: str, spec, nontemporal: bool, parallel: bool, **options) -> cpu_scan.Kernel:
    """The CPU pipeline with chosen scan-to-cpu options, compiled without the disk cache
    (tests below change NONTEMPORAL_MIN_BYTES, which the cache key does not see)."""
    from dataclasses import replace

    from scanweaver.rewrites.pipeline import stages_for

    module = parse_ir(text)
    ctx = make_context()
    for stage in stages_for("cpu"):
        if isinstance(stage, ScanToCpu):
            stage = replace(stage, nontemporal=nontemporal, parallel_channels=parallel, **options)
        stage.apply(ctx, module)
    module.verify()
    emit_c_interface(module)
    program = CpuProgram(lower_to_llvm_ir(print_ir(module), openmp=parallel), openmp=parallel)
    return cpu_scan.Kernel(program, "affine", spec)


@pytest.mark.parametrize("skew", [2, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_other_skews_bit_exact(skew, dtype):
    """Skews other than the default (the `skew` option): the same bits as the default."""
    el = EL[dtype]
    text = cpu_scan.affine_ir(el, 2, True, True, False)
    spec = [2, 2, 1, 2, 1]
    default = _tiled_kernel(text, spec, False, False)
    other = _tiled_kernel(text, spec, False, False, skew=skew)
    rng = np.random.default_rng(skew)
    for shape in ((19, 2100), (8, 4096), (11, 700), (21, 1000)):  # long, long, medium, medium
        a, b = inputs(rng, shape, dtype)
        h0 = inputs(rng, shape[:1], dtype)[1]
        got = [np.empty(shape, dtype), np.empty(shape[0], dtype)]
        want = [np.empty(shape, dtype), np.empty(shape[0], dtype)]
        other(a, b, h0, *got)
        default(a, b, h0, *want)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("init,final,reverse", FLAGS[:2])
def test_nontemporal_stores_bit_exact(monkeypatch, dtype, init, final, reverse):
    """Streaming h stores (aligned output) == ordinary stores; misaligned falls back."""
    import scanweaver.rewrites.cpu_affine_tiles as s2c

    monkeypatch.setattr(s2c, "NONTEMPORAL_MIN_BYTES", 0)  # small test arrays take the NT path
    el = EL[dtype]
    text = cpu_scan.affine_ir(el, 2, init, final, reverse)
    spec = [2, 2] + [1] * init + [2] + [1] * final
    nt = _tiled_kernel(text, spec, True, False)
    plain = _tiled_kernel(text, spec, False, False)
    assert "!nontemporal" in nt.program.optimized_ir()
    assert "!nontemporal" not in plain.program.optimized_ir()
    rng = np.random.default_rng(21)
    # L multiple of 16 (full tiles), of 8 only, of neither (rows unaligned: fallback);
    # 4096: skew 2 and prefetch; 37/21/19 channels: a partial group.
    for shape in ((37, 1024), (21, 1000), (19, 2100), (16, 4096), (8, 48)):
        a, b = inputs(rng, shape, dtype)
        h0 = inputs(rng, shape[:1], dtype)[1]
        args = [a, b] + ([h0] if init else [])
        n = shape[0] * shape[1]
        aligned = cpu_scan.aligned_empty(shape, dtype)
        misaligned = cpu_scan.aligned_empty((n + 4,), dtype)[4:].reshape(shape)  # 16 bytes off
        off_line = cpu_scan.aligned_empty((n + 8,), dtype)[8:].reshape(shape)  # 32 bytes off a line: ordinary stores
        assert aligned.ctypes.data % 64 == 0 and misaligned.ctypes.data % 32 == 16 and off_line.ctypes.data % 64 == 32
        want = [np.full(shape, 7, dtype)] + ([np.full(shape[:1], 7, dtype)] if final else [])
        plain(*args, *want)
        for out in (aligned, misaligned, off_line):
            out.fill(7)
            got = [out] + ([np.full(shape[:1], 7, dtype)] if final else [])
            nt(*args, *got)
            for x, y in zip(got, want):
                np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=f"{shape}")


def test_nontemporal_openmp_and_driver(monkeypatch):
    """The OpenMP variant with streaming stores, and affine_scan_cpu's aligned output."""
    _openmp_or_skip()
    import scanweaver.rewrites.cpu_affine_tiles as s2c

    monkeypatch.setattr(s2c, "NONTEMPORAL_MIN_BYTES", 0)
    text = cpu_scan.affine_ir("f32", 2, True, True, True)
    nt = _tiled_kernel(text, [2, 2, 1, 2, 1], True, True)
    rng = np.random.default_rng(22)
    a, b = inputs(rng, (203, 2048), np.float32)
    h0 = inputs(rng, (203,), np.float32)[1]
    h, f = cpu_scan.aligned_empty(a.shape, a.dtype), np.empty(203, np.float32)
    nt(a, b, h0, h, f)
    want_h, want_f = cpu_scan.affine_scan_cpu(a, b, h0, True, True, variant="single", out=np.empty_like(a))
    np.testing.assert_array_equal(h, want_h)
    np.testing.assert_array_equal(f, want_f)
    assert cpu_scan.affine_scan_cpu(a, b).ctypes.data % 64 == 0  # the driver's own output
