"""Issue 10 item 4: compiled programs never touch memory outside their arrays: shapes
that the IR's accesses rely on are derived from the IR and checked before each call."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import scanweaver
from scanweaver.errors import ScanWeaverValueError
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.runtime.shape_contract import derive_contracts

EMA = """
func.func @ema(%x: memref<?x?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %alpha = arith.constant 0.9 : f32
  %beta = arith.constant 0.1 : f32
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %ah = arith.mulf %alpha, %h : f32
      %bx = arith.mulf %beta, %xv : f32
      %hn = arith.addf %ah, %bx : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
"""

# y[c, t] = a[c, t] * y[c, t-1] + x[c, t] for t >= 1: an offset index (t - 1).
SHIFTED = """
func.func @shifted(%a: memref<?x?xf32>, %x: memref<?x?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %C = memref.dim %y, %c0 : memref<?x?xf32>
  %L = memref.dim %y, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    scf.for %t = %c1 to %L step %c1 {
      %tm = arith.subi %t, %c1 : index
      %p = memref.load %y[%c, %tm] : memref<?x?xf32>
      %av = memref.load %a[%c, %t] : memref<?x?xf32>
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %m = arith.mulf %av, %p : f32
      %n = arith.addf %m, %xv : f32
      memref.store %n, %y[%c, %t] : memref<?x?xf32>
    }
  }
  func.return
}
"""


@pytest.fixture(scope="module")
def ema():
    return scanweaver.compile(EMA, target="cpu")


@pytest.fixture(scope="module")
def shifted():
    return scanweaver.compile(SHIFTED, target="cpu")


def test_issue_example_is_refused_naming_both_arguments(ema):
    x = np.ones((4, 64), np.float32)
    y = np.zeros((4, 32), np.float32)
    with pytest.raises(ScanWeaverValueError) as info:
        ema.ema(x, y)
    msg = str(info.value)
    assert "'y' (#1)" in msg and "dim 1 of argument 'x' (#0)" in msg and "(4, 32)" in msg
    assert isinstance(info.value, ValueError)


def test_contract_of_the_ema_is_complete():
    c = derive_contracts(parse_ir(EMA))["ema"]
    assert not c.unchecked and len(c.accesses) == 2


def _inputs(rng, shapes):
    return [rng.uniform(0.5, 1.0, s).astype(np.float32) for s in shapes]


def _ema_in_bounds(x, y):
    C, L = x.shape
    return C == 0 or L == 0 or (y.shape[0] >= C and y.shape[1] >= L)


def _shifted_in_bounds(a, x, y):
    C, L = y.shape
    return C == 0 or L <= 1 or all(m.shape[0] >= C and m.shape[1] >= L for m in (a, x))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40)), min_size=3, max_size=3), st.integers(0, 2**31))
def test_random_shape_mismatches_are_refused_or_safe(ema, shifted, shapes, seed):
    """Random shapes never crash: refused exactly when some access would leave its array
    (an independent model of each loop nest's accesses), else the results equal the
    interpreter's."""
    rng = np.random.default_rng(seed)
    cases = ((ema, "ema", EMA, 2, _ema_in_bounds), (shifted, "shifted", SHIFTED, 3, _shifted_in_bounds))
    for program, name, text, n, in_bounds in cases:
        args = _inputs(rng, shapes[:n])
        expected = [x.copy() for x in args]
        safe = in_bounds(*args)
        try:
            program[name](*args)
        except ScanWeaverValueError:
            assert not safe, f"{name} refused in-bounds shapes {[x.shape for x in args]}"
            continue
        assert safe, f"{name} accepted out-of-bounds shapes {[x.shape for x in args]}"
        run_function(text, name, *expected)
        for got, want in zip(args, expected):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


GATHER = """
func.func @g(%x: memref<?xf32>, %y: memref<?xf32>, %idx: memref<?xindex>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %L = memref.dim %idx, %c0 : memref<?xindex>
  scf.for %t = %c0 to %L step %c1 {
    %i = memref.load %idx[%t] : memref<?xindex>
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %y[%t] : memref<?xf32>
  }
  func.return
}
"""


def test_unfollowable_index_gets_runtime_bounds_checks(tmp_path):
    """x[idx[t]]: no shape relation to derive; that build checks bounds at run time
    (upstream -generate-runtime-verification): out of bounds aborts, never writes."""
    c = derive_contracts(parse_ir(GATHER))["g"]
    assert len(c.unchecked) == 1 and "%x" in c.unchecked[0]
    program = scanweaver.compile(GATHER, target="cpu")
    x, y = np.arange(8, dtype=np.float32), np.zeros(4, np.float32)
    program.g(x, y, np.array([1, 2, 3, 7]))
    np.testing.assert_array_equal(y, [1, 2, 3, 7])
    with pytest.raises(ScanWeaverValueError, match="'y' \\(#1\\)"):
        program.g(x, np.zeros(3, np.float32), np.array([1, 2, 3, 7]))  # y too short: refused
    script = tmp_path / "oob.py"
    script.write_text(
        "import numpy as np, scanweaver\n"
        f"p = scanweaver.compile({GATHER!r})\n"
        "p.g(np.arange(8, dtype=np.float32), np.zeros(4, np.float32), np.array([1, 2, 3, 9]))\n"
        "print('returned')\n"
    )
    import subprocess
    import sys

    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert r.returncode != 0 and "returned" not in r.stdout
    assert "out-of-bounds" in r.stdout + r.stderr  # the runtime check prints to stdout


def test_cuda_program_checks_the_contract_before_any_launch():
    """The CUDA caller's hook (no GPU needed: the check comes before staging)."""
    from scanweaver.runtime.cuda import CudaFunction

    contract = derive_contracts(parse_ir(EMA))["ema"].to_data()
    fn = CudaFunction(module=None, name="ema", launches=[], arg_count=2, contract=contract)
    with pytest.raises(ScanWeaverValueError, match="'y' \\(#1\\)"):
        fn(np.ones((4, 64), np.float32), np.zeros((4, 32), np.float32))


CHUNKED_COPY = """
func.func @chunked(%x: memref<?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %t0 = %c0 to %n step %c8 {
    %left = arith.subi %n, %t0 : index
    %len = arith.minsi %c8, %left : index
    scf.for %i = %c0 to %len step %c1 {
      %t = arith.addi %t0, %i : index
      %v = memref.load %x[%t] : memref<?xf32>
      memref.store %v, %y[%t] : memref<?xf32>
    }
  }
  func.return
}
"""


def test_chunked_loops_are_never_refused_wrongly():
    """`t0 + i` with `i < min(8, n - t0)` stays below n; intervals alone would say
    t0 + 7, so such accesses go to the runtime checks instead of a false refusal."""
    contract = derive_contracts(parse_ir(CHUNKED_COPY))["chunked"]
    assert contract.unchecked and not contract.accesses
    program = scanweaver.compile(CHUNKED_COPY, target="cpu")
    x = np.arange(21, dtype=np.float32)
    y = np.zeros_like(x)
    program.chunked(x, y)  # 21 is not a multiple of the chunk: a valid call
    np.testing.assert_array_equal(x, y)


# Accesses the contract did not see (probe of session 26): each wrote outside a 2-element
# array.  Now they are refused before the call, or left to the runtime bounds checks.
CALLED_STORE = """
func.func private @fill(%x: memref<?xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %v = arith.constant 7.0 : f32
  scf.for %i = %c0 to %n step %c1 {
    memref.store %v, %x[%i] : memref<?xf32>
  }
  func.return
}
func.func @f(%x: memref<?xf32>, %n: index) {
  func.call @fill(%x, %n) : (memref<?xf32>, index) -> ()
  func.return
}
"""

SUBVIEW_STORE = """
func.func @f(%x: memref<?xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %v = arith.constant 7.0 : f32
  %s = memref.subview %x[4][4][1] : memref<?xf32> to memref<4xf32, strided<[1], offset: 4>>
  scf.for %i = %c0 to %c4 step %c1 {
    memref.store %v, %s[%i] : memref<4xf32, strided<[1], offset: 4>>
  }
  func.return
}
"""

# maxui/minui of a negative index are unsigned: (0 - 10) maxui dim is 2^64 - 10, so the
# loop runs to 10, where signed max and min would say dim(x).
UNSIGNED_BOUND = """
func.func @f(%x: memref<?xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c10 = arith.constant 10 : index
  %d = memref.dim %x, %c0 : memref<?xf32>
  %k = arith.subi %n, %c10 : index
  %wide = arith.maxui %k, %d : index
  %ub = arith.minui %wide, %c10 : index
  %v = arith.constant 7.0 : f32
  scf.for %i = %c0 to %ub step %c1 {
    memref.store %v, %x[%i] : memref<?xf32>
  }
  func.return
}
"""

# divsi rounds toward zero: (n - 7) / 2 is -3 for n = 0, not floor's -4, so the store
# below writes x[dim] (one past the end) where floor division would say x[dim - 1].
TRUNCATING_DIV = """
func.func @f(%x: memref<?xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c7 = arith.constant 7 : index
  %d = memref.dim %x, %c0 : memref<?xf32>
  %k = arith.subi %n, %c7 : index
  %q = arith.divsi %k, %c2 : index
  %e = arith.addi %d, %c3 : index
  %i = arith.addi %e, %q : index
  %v = arith.constant 7.0 : f32
  memref.store %v, %x[%i] : memref<?xf32>
  func.return
}
"""

# i32 arithmetic wraps at 32 bits: n * 2^28 is 0 for n = 16, so the store writes x[-2]
# where exact integers would say x[14].
NARROW_WRAP = """
func.func @f(%x: memref<?xf32>, %n: i32) {
  %c2 = arith.constant 2 : index
  %k = arith.constant 268435456 : i32
  %m = arith.muli %n, %k : i32
  %q = arith.divsi %m, %k : i32
  %qi = arith.index_cast %q : i32 to index
  %i = arith.subi %qi, %c2 : index
  %v = arith.constant 7.0 : f32
  memref.store %v, %x[%i] : memref<?xf32>
  func.return
}
"""


SCAN_SCAN = """
func.func @f(%x: memref<?x?xf32>, %y: memref<?x?xf32>) {
  scan.scan ins(%x : memref<?x?xf32>) outs(%y : memref<?x?xf32>) axis 1 {
  ^bb0(%p: f32, %q: f32):
    %s = arith.addf %p, %q : f32
    scan.yield %s : f32
  }
  func.return
}
"""

LOCAL_BUFFER = """
func.func @f(%x: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %buf = memref.alloca() : memref<4xf32>
  scf.for %i = %c0 to %n step %c1 {
    %v = memref.load %x[%i] : memref<?xf32>
    memref.store %v, %buf[%i] : memref<4xf32>
  }
  func.return
}
"""


@pytest.mark.parametrize("text", [CALLED_STORE, SUBVIEW_STORE])
def test_accesses_behind_calls_and_views_get_runtime_bounds_checks(text):
    """A call's or a view's accesses are not followed: they are unchecked, so the build
    checks them at run time (a call that stays inside its array still runs)."""
    contract = derive_contracts(parse_ir(text))["f"]
    assert contract.unchecked
    program = scanweaver.compile(text, target="cpu")
    assert "out-of-bounds" in program.artifact  # the runtime checks' message is in the build
    x = np.zeros(8, np.float32)
    program.f(x, 8)
    assert np.count_nonzero(x) == (8 if text is CALLED_STORE else 4)


@pytest.mark.parametrize("text, size, bad, n, inside",
                         [(UNSIGNED_BOUND, 2, 0, 20, 10), (TRUNCATING_DIV, 2, 0, -1, 1), (NARROW_WRAP, 20, 16, 5, 1)])
def test_unsigned_truncating_and_wrapping_index_arithmetic_is_refused_past_the_array(text, size, bad, n, inside):
    """`bad` takes each outside an array of `size` (see the IR's comments): refused, no
    write; `n` keeps them inside a 12-element one (10 steps; x[12 + 3 - 4]; x[5 - 2]),
    which runs."""
    guard = np.zeros(32, np.float32)
    program = scanweaver.compile(text, target="cpu")
    with pytest.raises(ScanWeaverValueError, match=f"'x' \\(#0\\) has shape \\({size},\\)"):
        program.f(guard[4 : 4 + size], bad)
    assert not guard.any()
    x = np.zeros(12, np.float32)
    program.f(x, n)
    assert np.count_nonzero(x) == inside


def test_scan_scan_operands_must_have_one_shape():
    guard = np.zeros(64, np.float32)
    program = scanweaver.compile(SCAN_SCAN, target="cpu")
    with pytest.raises(ScanWeaverValueError, match="'y' \\(#1\\) has shape \\(2, 2\\)"):
        program.f(np.ones((2, 6), np.float32), guard[10:14].reshape(2, 2))
    assert not guard.any()
    y = np.zeros((2, 6), np.float32)
    program.f(np.ones((2, 6), np.float32), y)
    np.testing.assert_array_equal(y, np.tile(np.arange(1, 7, dtype=np.float32), (2, 1)))


def test_static_local_buffers_are_checked_against_their_shape():
    program = scanweaver.compile(LOCAL_BUFFER, target="cpu")
    assert not derive_contracts(parse_ir(LOCAL_BUFFER))["f"].unchecked
    program.f(np.ones(4, np.float32))
    with pytest.raises(ScanWeaverValueError, match="a local buffer has shape \\(4,\\)"):
        program.f(np.ones(9, np.float32))


def test_a_recurrence_state_seen_through_its_emit_region_needs_no_runtime_checks():
    """The raised EMA reads its state through the emit region's argument, which is the
    recurrence's `state` operand (a local buffer): checked, not left to runtime checks
    (that would slow every raised program down)."""
    from scanweaver.compiler import lower

    raised = next(stage.ir for stage in lower(EMA, "cpu").stages if stage.name == "scanweaver-raise")
    assert "scan.recurrence" in raised
    assert not derive_contracts(parse_ir(raised))["ema"].unchecked


def test_vjp_shadows_must_have_their_arguments_shapes():
    """`@ema_vjp(x, y, d_x, d_y)`: the shadows' accesses sit in chunked loops (runtime
    checks only), so a short `d_x` stopped the process; now it is refused before the call."""
    import os
    import subprocess
    import sys

    xdsl_opt = os.path.join(os.path.dirname(sys.executable), "xdsl-opt")
    r = subprocess.run([xdsl_opt, "-p", "scanweaver-raise,scanweaver-grad"], input=EMA,
                       capture_output=True, text=True, check=True)
    program = scanweaver.compile(r.stdout, target="cpu")
    x, y = np.ones((2, 5), np.float32), np.zeros((2, 5), np.float32)
    with pytest.raises(ScanWeaverValueError, match="'d_x' \\(#2\\) has shape \\(2, 3\\)"):
        program.ema_vjp(x, y, np.zeros((2, 3), np.float32), np.ones((2, 5), np.float32))
    dx, dy = np.zeros((2, 5), np.float32), np.ones((2, 5), np.float32)
    program.ema_vjp(x, y, dx, dy)
    # y_t = 0.9 y_{t-1} + 0.1 x_t: dx_t = 0.1 * sum_{s >= t} 0.9^(s - t) for dy = 1
    want = 0.1 * np.cumsum(0.9 ** np.arange(5))[::-1]
    np.testing.assert_allclose(dx, np.tile(want, (2, 1)), rtol=1e-6)


def test_chunked_local_buffers_of_a_vjp_are_not_refused():
    """The iir2 VJP indexes its chunk buffers (65 x 2) by `t - t0` within a chunk: intervals
    over-estimate such indices, which refused every call once local buffers were checked;
    they go to the runtime checks instead, and the gradient matches finite differences."""
    import os
    import subprocess
    import sys

    from scanweaver.ir import print_ir
    from scanweaver.workloads.loops import iir2_loops

    xdsl_opt = os.path.join(os.path.dirname(sys.executable), "xdsl-opt")
    r = subprocess.run([xdsl_opt, "-p", "scanweaver-raise,scanweaver-grad"], input=print_ir(iir2_loops(3, 70, "f64")),
                       capture_output=True, text=True, check=True)
    program = scanweaver.compile(r.stdout, target="cpu")
    rng = np.random.default_rng(0)
    x, c1, c2 = rng.standard_normal((3, 70)), rng.uniform(0.1, 0.5, 3), rng.uniform(0.1, 0.4, 3)
    w = rng.standard_normal((3, 70))  # loss = sum(w * y)

    def loss(x):
        y = np.zeros((3, 70))
        program.iir2(x, c1.copy(), c2.copy(), y)
        return (w * y).sum()

    dx = np.zeros_like(x)
    program.iir2_vjp(x.copy(), c1.copy(), c2.copy(), np.zeros((3, 70)), dx, np.zeros(3), np.zeros(3), w.copy())
    for index in [(0, 0), (1, 35), (2, 69)]:
        step = np.zeros_like(x)
        step[index] = 1e-6
        assert dx[index] == pytest.approx((loss(x + step) - loss(x - step)) / 2e-6, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("text", ["UNSIGNED_BOUND", "TRUNCATING_DIV", "NARROW_WRAP", "LOCAL_BUFFER"])
def test_contracts_as_deployed_data_are_valid_and_judge_as_in_process(text):
    """A deployed artifact carries the contract as JSON (`contract_check`): the unsigned,
    truncating and width-bounded index trees and local buffers must validate and give the
    in-process verdict for sizes inside and outside."""
    import json

    from scanweaver.runtime.contract_check import check_contract, validate_contract

    contract = derive_contracts(parse_ir(globals()[text]))["f"]
    data = json.loads(json.dumps(contract.to_data()))
    n_args = len(contract.arg_names)
    scalars = {i for i in range(n_args) if i > 0}
    assert validate_contract(data, n_args, {0: 1}, scalars) is None
    cases = [(np.ones(s, np.float32), *([v] if n_args > 1 else [])) for s in (2, 4, 9, 12, 20) for v in (-1, 0, 5, 16, 20)]
    refused = set()
    for args in cases:
        verdicts = []
        for check in (contract.check, lambda a: check_contract(data, a)):
            try:
                check(list(args))
                verdicts.append(None)
            except ScanWeaverValueError as e:
                verdicts.append(str(e))
        assert verdicts[0] == verdicts[1], args
        refused.add(verdicts[0] is not None)
    assert refused == {True, False}  # the cases reach both verdicts


SIZE_GUARD = """
func.func @f(%y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %one = arith.constant 1.0 : f32
  %n = memref.dim %y, %c0 : memref<?xf32>
  %big = arith.cmpi slt, %c3, %n : index
  scf.if %big {
    memref.store %one, %y[%c5] : memref<?xf32>
  }
  func.return
}
"""


def test_a_size_guard_skips_the_access_only_where_it_is_false():
    """`if 3 < dim(y) { y[5] = 1 }`: followed, not unchecked (the GPU kernels take such
    initial-state loads, the raised IIR filters'); sizes up to 3 skip it, 4 and 5 are
    refused (the branch runs and writes past the array), 6 and more run; the same from
    the deployed JSON."""
    import json

    from scanweaver.runtime.contract_check import check_contract

    contract = derive_contracts(parse_ir(SIZE_GUARD))["f"]
    assert not contract.unchecked
    data = json.loads(json.dumps(contract.to_data()))
    for n in range(9):
        y = np.zeros(n, np.float32)
        for check in (contract.check, lambda a: check_contract(data, a)):
            if n in (4, 5):
                with pytest.raises(ScanWeaverValueError, match="'y' \\(#0\\) has shape"):
                    check([y])
            else:
                check([y])
    guard = np.zeros(16, np.float32)
    program = scanweaver.compile(SIZE_GUARD, target="cpu")
    with pytest.raises(ScanWeaverValueError):
        program.f(guard[4:8])
    assert not guard.any()
    program.f(guard[4:6])
    assert not guard.any()
    y = np.zeros(7, np.float32)
    program.f(y)
    assert y[5] == 1 and np.count_nonzero(y) == 1
