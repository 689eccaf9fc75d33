"""scanweaver-raise on the recurrence forms of issue 14, written the way people write them.

Each form gets: the decision (raised, with which op), a golden check (the raised IR
against the interpreted original on random inputs: bit for bit where the association
is unchanged, exact for integers), and an end-to-end CPU build compared with the
interpreted original.  GPU builds (PTX, ptxas) are checked where the GPU lowering
accepts the raised form; `test_gpu_refusals_are_recorded` pins the forms it refuses.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_raise import golden, loop_decisions, raised

import scanweaver
from scanweaver.interp.run import run_function

RNG = np.random.default_rng(14)


def rand(shape, dtype=np.float32, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


def ints(shape, dtype=np.int32, lo=None, hi=None):
    info = np.iinfo(dtype)
    return RNG.integers(info.min if lo is None else lo, info.max if hi is None else hi,
                        size=shape, dtype=dtype)


def cpu_matches_interpreter(text, fname, args, *, raised_op, exact=True):
    """Compile for the CPU, run, compare every array (and result) with the interpreter."""
    program = scanweaver.compile(text, target="cpu")
    assert raised_op in program.stage_ir("scanweaver-raise")
    a_cpu = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
    a_ref = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
    r_cpu = program[fname](*a_cpu)
    r_ref = run_function(text, fname, *a_ref)
    for x, y in zip(a_cpu, a_ref):
        if isinstance(x, np.ndarray):
            if exact:
                np.testing.assert_array_equal(x, y)
            else:
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    if r_ref:
        got = r_cpu if isinstance(r_cpu, tuple) else (r_cpu,)
        for x, y in zip(got, r_ref):
            assert (x == y) if exact else np.isclose(x, y, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# 1. Dynamic channel counts (time outer, channel inner, %nc = memref.dim)
# ---------------------------------------------------------------------------


def dyn_channels(nc: str = "%nc = memref.dim %h, %c0 : memref<?xf32>") -> str:
    return f"""
func.func @ema(%x: memref<?x?xf32>, %a: memref<?xf32>, %h: memref<?xf32>, %y: memref<?x?xf32>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nt = memref.dim %x, %c0 : memref<?x?xf32>
  {nc}
  scf.for %t = %c0 to %nt step %c1 {{
    scf.for %c = %c0 to %nc step %c1 {{
      %hv = memref.load %h[%c] : memref<?xf32>
      %av = memref.load %a[%c] : memref<?xf32>
      %xv = memref.load %x[%t, %c] : memref<?x?xf32>
      %m = arith.mulf %av, %hv : f32
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%c] : memref<?xf32>
      memref.store %hn, %y[%t, %c] : memref<?x?xf32>
    }}
  }}
  func.return
}}
"""


DYN_NC_OF_X = "%c1b = arith.constant 1 : index\n  %nc = memref.dim %x, %c1b : memref<?x?xf32>"


def dyn_args(nt=7, nc=5, nh=5):
    return [rand((nt, nc)), rand(nh, lo=0, hi=1), rand(nh), np.zeros((nt, nc), np.float32)]


def test_dynamic_channel_count_of_the_state_is_the_direct_state():
    _, module, (rec,) = raised(dyn_channels())
    assert rec.name == "scan.recurrence"
    fn = next(op for op in module.walk() if op.name == "func.func")
    assert rec.state is fn.body.block.args[2]  # %h itself: the loop covers all of it
    golden(dyn_channels(), "ema", dyn_args(), exact=True)


def test_dynamic_channel_count_of_another_memref_uses_a_dynamic_temporary():
    # h has 8 elements, the loop updates the first 5 (x's width): a memref<?xf32>
    # temporary of the channel count is the state; h[5:] must stay untouched.
    _, _, (rec,) = raised(dyn_channels(DYN_NC_OF_X))
    assert rec.state.owner.name == "memref.alloca"
    assert str(rec.state.type) == "memref<?xf32>"
    _, a2, _ = golden(dyn_channels(DYN_NC_OF_X), "ema", dyn_args(nh=8), exact=True)


def test_dynamic_channel_count_from_an_argument():
    src = dyn_channels("").replace("%y: memref<?x?xf32>)", "%y: memref<?x?xf32>, %nc: index)")
    (d, _) = loop_decisions(src)
    assert d.affine and d.kind == "vector" and not d.plan.direct
    golden(src, "ema", dyn_args() + [4], exact=True)


def test_channel_count_computed_inside_the_time_loop_is_refused():
    src = dyn_channels("").replace(
        "scf.for %c = %c0 to %nc", "%nc = arith.addi %t, %c1 : index\n    scf.for %c = %c0 to %nc"
    )
    d = loop_decisions(src)[0]
    assert not d.affine and "loop-invariant" in d.reason


@pytest.mark.parametrize("nc", ["%nc = memref.dim %h, %c0 : memref<?xf32>", DYN_NC_OF_X])
def test_dynamic_channels_cpu_end_to_end(nc):
    cpu_matches_interpreter(dyn_channels(nc), "ema", dyn_args(40, 13, 13), raised_op="scan.recurrence")
