"""Issue 12: no input may make a GPU kernel touch memory outside its arrays.  The device
checks nothing, so every access of a memref argument in a kernel is proven in bounds
before the launch: by the shape contract (which now reads data guards and bounds guards,
`tests/gpu_bounds/`) or by the launch's `covers_dims`; the GPU lowering refuses the rest,
naming the op, and those functions run on the CPU with runtime bounds checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scanweaver import compiler
from scanweaver.errors import ScanWeaverValueError
from scanweaver.interp.gpu_sim import GpuSimError, simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.runtime.shape_contract import derive_contracts

FORMS = Path(__file__).parent / "gpu_bounds"
REFUSED_FORMS = Path(__file__).parent / "gpu_refused"
C = 3


def _text(name: str) -> str:
    return (FORMS / f"{name}.mlir").read_text()


def _call(name: str, L: int, y_len: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed * 97 + L)
    x = rng.uniform(-1, 1, (C, L)).astype(np.float32)
    return [x, np.float32(0.7), rng.uniform(-1, 1, (C, y_len)).astype(np.float32)]


def _contract(name: str):
    return derive_contracts(parse_ir(_text(name)))[name]


def _runs_like_the_loops(name: str, L: int, y_len: int) -> None:
    lowered = compiler.lower(_text(name), "gpu", keep_stages=False).module
    want = _call(name, L, y_len, seed=1)
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in want]
    run_function(parse_ir(_text(name)), name, *want)
    simulate_launch(lowered, name, *got)
    np.testing.assert_allclose(got[2], want[2], rtol=2e-3, atol=2e-3, err_msg=f"L={L}")


def test_data_guard_hole_is_refused_before_the_launch():
    """`if h > 0 { y[c, t + 1] = h }`: before, the store was unchecked and covers_dims held
    only y's channel dim, so y of (C, 1) passed every check and the kernel wrote y[c, 1..L]
    (the simulator shows it).  Now the contract judges the store over its whole range."""
    contract = _contract("data_guard_next")
    assert contract.unchecked == []
    x, k, y = _call("data_guard_next", 5, 1)
    lowered = compiler.lower(_text("data_guard_next"), "gpu", keep_stages=False).module
    with pytest.raises(GpuSimError, match="out-of-bounds memref.store"):
        simulate_launch(lowered, "data_guard_next", x, k, y)
    with pytest.raises(ScanWeaverValueError, match="'y'"):
        contract.check([x, k, y])
    with pytest.raises(ScanWeaverValueError):
        contract.check(_call("data_guard_next", 5, 5))  # y[c, L] is written too
    contract.check(_call("data_guard_next", 5, 6))


@pytest.mark.parametrize("L", [0, 1, 2, 7, 19])
def test_data_guard_runs_like_the_loops(L):
    _runs_like_the_loops("data_guard_next", L, L + 1)


def test_bounds_guard_accepts_the_safe_call():
    """`if t + 1 < L { y[c, t + 1] = h }`: inside the guard t + 1 <= L - 1, so y of the
    same shape as x passes, and one element shorter does not."""
    contract = _contract("bounds_guard_next")
    assert contract.unchecked == []
    contract.check(_call("bounds_guard_next", 7, 7))
    with pytest.raises(ScanWeaverValueError, match="'y'"):
        contract.check(_call("bounds_guard_next", 7, 6))


@pytest.mark.parametrize("L", [0, 1, 2, 7, 19])
def test_bounds_guard_runs_like_the_loops(L):
    _runs_like_the_loops("bounds_guard_next", L, L)


REFUSED = ["channel_program_gather", "gather", "unread_guard_prev"]  # test_gpu_refusals.py pins their reasons


@pytest.mark.parametrize("name", REFUSED)
def test_refused_forms_are_unchecked_on_the_cpu(name):
    """What the GPU refuses is unchecked in the contract, so the CPU build of it turns
    on MLIR's runtime bounds checks."""
    text = (REFUSED_FORMS / f"{name}.mlir").read_text()
    assert derive_contracts(parse_ir(text))[name].unchecked


def test_refused_gather_runs_on_the_cpu():
    """The refused gather still compiles for the CPU and runs like the interpreter."""
    import scanweaver

    text = (REFUSED_FORMS / "gather.mlir").read_text()
    fn = scanweaver.compile(text, "cpu").gather
    rng = np.random.default_rng(3)
    x, y = rng.uniform(-1, 1, (C, 6)).astype(np.float32), np.zeros((C, 6), np.float32)
    at = rng.integers(0, 6, (C, 6)).astype(np.int32)
    want = y.copy()
    run_function(parse_ir(text), "gather", x, at, np.float32(0.5), want)
    fn(x, at, np.float32(0.5), y)
    np.testing.assert_allclose(y, want, rtol=1e-5)


@pytest.mark.parametrize("L", [0, 1, 6])
def test_channel_program_with_proven_accesses_still_runs(L):
    """The channel-program form of a direct index: a kernel, simulated like the loops."""
    text = _text("channel_program_direct")
    lowered = compiler.lower(text, "gpu", keep_stages=False).module
    assert any(o.name == "gpu.func" for o in lowered.walk())
    rng = np.random.default_rng(L)
    x, y = rng.uniform(-1, 1, (2, C, L)).astype(np.float32), np.zeros((2, C, L), np.float32)
    want = y.copy()
    run_function(parse_ir(text), "channel_program_direct", x, want)
    simulate_launch(lowered, "channel_program_direct", x, y)
    np.testing.assert_allclose(y, want, rtol=2e-3, atol=2e-3)


GUARDED = """
func.func @g(%x: memref<?x?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    scf.for %t = %c0 to %L step %c1 {
      %v = memref.load %x[%c, %t] : memref<?x?xf32>
      GUARD
    }
  }
  func.return
}
"""

#: guard -> (judged: not unchecked, the interpreter's own y lengths that stay in bounds for x of length 5)
GUARDS = {
    # t >= 1 before y[c, t - 1]: the lower bound (sge), any y of length >= 4
    "%t1 = arith.subi %t, %c1 : index\n %g = arith.cmpi sge, %t, %c1 : index\n"
    "scf.if %g { memref.store %v, %y[%c, %t1] : memref<?x?xf32> }": True,
    # L > t + 2 (sgt, the loop index on the right), nested in t + 1 < L
    "%t1 = arith.addi %t, %c1 : index\n %t2 = arith.addi %t, %c2 : index\n"
    "%g = arith.cmpi slt, %t1, %L : index\n %h = arith.cmpi sgt, %L, %t2 : index\n"
    "scf.if %g { scf.if %h { memref.store %v, %y[%c, %t2] : memref<?x?xf32> } }": True,
    # both bounds in one conjunction
    "%t1 = arith.addi %t, %c1 : index\n %a = arith.cmpi sle, %t1, %L : index\n %b = arith.cmpi sge, %t, %c0 : index\n"
    "%g = arith.andi %a, %b : i1\n scf.if %g { memref.store %v, %y[%c, %t1] : memref<?x?xf32> }": True,
    # a data guard's else-branch is judged too
    "%z = arith.constant 0.0 : f32\n %g = arith.cmpf ogt, %v, %z : f32\n %t1 = arith.addi %t, %c1 : index\n"
    "scf.if %g { } else { memref.store %v, %y[%c, %t1] : memref<?x?xf32> }": True,
    # a bounds guard's else-branch is not read: unchecked
    "%t1 = arith.addi %t, %c1 : index\n %g = arith.cmpi sge, %t1, %L : index\n"
    "scf.if %g { } else { memref.store %v, %y[%c, %t1] : memref<?x?xf32> }": False,
    # an unsigned comparison says nothing about a negative index: unchecked
    "%t1 = arith.addi %t, %c1 : index\n %g = arith.cmpi ult, %t1, %L : index\n"
    "scf.if %g { memref.store %v, %y[%c, %t1] : memref<?x?xf32> }": False,
}


@pytest.mark.parametrize("guard", list(GUARDS), ids=range(len(GUARDS)))
def test_guarded_contract_refuses_exactly_the_calls_that_leave_y(guard):
    """Where the contract reads the guard it accepts a call iff the interpreter (the
    oracle, which raises on an access outside an array) stays inside y, over y's lengths
    around x's (data all positive or all negative, so a data guard goes either way)."""
    text = GUARDED.replace("GUARD", guard)
    contract = derive_contracts(parse_ir(text))["g"]
    assert (contract.unchecked == []) == GUARDS[guard]
    if not GUARDS[guard]:
        return
    outcomes = set()
    for y_len in range(2, 9):
        for sign in (1, -1) if "cmpf" not in guard else (-1,):  # (the data guard's branch runs for x <= 0)
            x, y = np.full((2, 5), sign, np.float32), np.zeros((2, y_len), np.float32)
            try:
                run_function(parse_ir(text), "g", x, y)
                inside = True
            except Exception:  # noqa: BLE001 - the interpreter's out-of-bounds error
                inside = False
            try:
                contract.check([x, y])
                accepted = True
            except ScanWeaverValueError:
                accepted = False
            assert accepted == inside, (y_len, sign)
            outcomes.add(inside)
    assert outcomes == {True, False}
