"""A 2-D state of dynamic size (or over 64 elements) whose emit sums over one state
index (dynamic RetNet / linear attention, issue 14): `rewrites/gpu_state_matrix.py`,
one block per column, threads over rows, time chunks staged in shared memory.  The
thread-block simulator against the interpreter on the original loops at many sizes
(rows not a multiple of the block, D = 0, 1, L = 0, 1, no columns): integers bit for
bit; floats (the sum over rows reassociated) finite where the loop is and within a
small factor of the loop's own error against a float64 reference.  The CUDA runtime
with a driver whose launches run in the simulator; ptxas (sm_80, sm_90)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from test_gpu_seeded_scan import ScalarSimulatorDriver
from test_raise_forms import retnet
from xdsl.dialects import func

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.blelloch_gpu import refusals
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.scan_to_gpu import ScanToGpu
from scanweaver.rewrites.scan_to_loops import ScanToLoops
from scanweaver.runtime.cuda_program import _host_launches
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available


def rename(src: str, new: str) -> str:
    return src.replace("func.func @retnet(", f"func.func @{new}(", 1)


def as_int(src: str, el: str) -> str:
    return (src.replace("xf32>", f"x{el}>").replace(": f32", f": {el}").replace("-> (f32)", f"-> ({el})")
            .replace("arith.mulf", "arith.muli").replace("arith.addf", "arith.addi")
            .replace("0.0 : ", "0 : "))


#: out[t, d] = sum_e S[d, e] * w[t, e]: the sum over the state's second dimension
ROWS = """
func.func @rows(%w: memref<?x?xf32>, %a: memref<?x?xf32>, %b: memref<?x?xf32>, %S: memref<?x?xf32>, %out: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %T = memref.dim %w, %c0 : memref<?x?xf32>
  %D = memref.dim %S, %c0 : memref<?x?xf32>
  %E = memref.dim %S, %c1 : memref<?x?xf32>
  %one = arith.constant 1.0 : f32
  scf.for %t = %c0 to %T step %c1 {
    scf.for %d = %c0 to %D step %c1 {
      %ad = memref.load %a[%t, %d] : memref<?x?xf32>
      scf.for %e = %c0 to %E step %c1 {
        %s = memref.load %S[%d, %e] : memref<?x?xf32>
        %be = memref.load %b[%t, %e] : memref<?x?xf32>
        %as = arith.mulf %ad, %s : f32
        %sn = arith.addf %as, %be : f32
        memref.store %sn, %S[%d, %e] : memref<?x?xf32>
      }
    }
    scf.for %d = %c0 to %D step %c1 {
      %acc = scf.for %e = %c0 to %E step %c1 iter_args(%x = %one) -> (f32) {
        %we = memref.load %w[%t, %e] : memref<?x?xf32>
        %s = memref.load %S[%d, %e] : memref<?x?xf32>
        %p = arith.mulf %s, %we : f32
        %xn = arith.addf %p, %x : f32
        scf.yield %xn : f32
      }
      memref.store %acc, %out[%t, %d] : memref<?x?xf32>
    }
  }
  func.return
}
"""

#: name -> (source, element type, the sum over state dimension, static (D, E) or None)
FORMS = {
    "retnet_dyn": (rename(retnet(dynamic=True), "retnet_dyn"), "f32", 0, None),
    "retnet_f64": (rename(retnet(dynamic=True).replace("f32", "f64"), "retnet_f64"), "f64", 0, None),
    "retnet_i32": (rename(as_int(retnet(dynamic=True), "i32"), "retnet_i32"), "i32", 0, None),
    "retnet_big": (rename(retnet(T=7, D=12, E=9), "retnet_big"), "f32", 0, (12, 9)),
    "rows": (ROWS, "f32", 1, None),
}

#: (T, D, E): rows around the block of 4, the time chunk of 4, and the empty cases
SIZES = [(10, 4, 3), (9, 5, 2), (0, 3, 3), (1, 1, 1), (6, 0, 2), (7, 9, 0), (17, 13, 3), (4, 8, 1), (5, 1, 4)]


def args_for(name: str, T: int, D: int, E: int) -> list[np.ndarray]:
    _, el, _, static = FORMS[name]
    rng = np.random.default_rng(T * 100 + D * 10 + E)
    dt = {"f32": np.float32, "f64": np.float64, "i32": np.int32}[el]

    def r(*shape, lo=-1.0, hi=1.0):
        if el == "i32":
            return rng.integers(-50, 50, shape).astype(dt)
        return rng.uniform(lo, hi, shape).astype(dt)

    if name == "rows":
        return [r(T, E), r(T, D, lo=0.5, hi=1.0), r(T, E), r(D, E), np.zeros((T, D), dt)]
    return [r(T, D), r(T, D), r(T, E), r(T, lo=0.5, hi=1.0), r(D, E), np.zeros((T, E), dt)]


@pytest.fixture(scope="module")
def lowered():
    text = "\n".join(src for src, *_ in FORMS.values())
    m = parse_ir(text)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, m)
    ScanToGpu(block_size=4, items_per_thread=2).apply(ctx, m)
    left = {fn.sym_name.data: refusals(fn) for fn in m.ops if isinstance(fn, func.FuncOp) and refusals(fn)}
    assert left == {}, left
    ScanToLoops().apply(ctx, m)
    launches, _ = _host_launches(m)  # nothing but launches on the host
    assert all(len(launches[n]) == 1 for n in FORMS), launches
    return text, m


def reference64(name: str, args: list[np.ndarray]) -> list[np.ndarray]:
    """The loop's arrays after it, computed in float64 with numpy."""
    a = [x.astype(np.float64) for x in args]
    if name == "rows":
        w, ad, b, S, out = a
        for t in range(w.shape[0]):
            S[...] = ad[t][:, None] * S + b[t][None, :]
            out[t] = 1.0 + S @ w[t]
        return a
    q, k, v, g, S, out = a
    for t in range(q.shape[0]):
        S[...] = g[t] * S + np.outer(k[t], v[t])
        out[t] = q[t] @ S
    return a


def check(name: str, args: list[np.ndarray], run) -> None:
    src, el, _, _ = FORMS[name]
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(src), name, *ref)
    run(got)
    if el == "i32":
        for r, g in zip(ref, got):
            assert g.tobytes() == r.tobytes(), (name, r, g)
        return
    exact = reference64(name, args)
    for r, g, x in zip(ref, got, exact):
        assert np.all(np.isfinite(g)) or not np.all(np.isfinite(r))
        loop_err = float(np.max(np.abs(r - x), initial=0.0))
        err = float(np.max(np.abs(g - x), initial=0.0))
        ulp = float(np.finfo(r.dtype).eps) * float(np.max(np.abs(x), initial=1.0))
        assert err <= 4 * loop_err + 4 * ulp, (name, err, loop_err)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_state_matrix_runs_like_the_loop(lowered, name):
    _, m = lowered
    static = FORMS[name][3]
    sizes = [(7, *static)] if static else SIZES if name == "retnet_dyn" else SIZES[:3] + SIZES[4:5]  # (a static T too)
    for T, D, E in sizes:
        check(name, args_for(name, T, D, E), lambda got: simulate_launch(m, name, *got))


def test_one_block_per_column(lowered):
    descs = {d.func_name: d for d in launch_descriptions(lowered[1])}
    assert descs["retnet_dyn"].grid == ("S.shape[1]", 1, 1)
    assert descs["rows"].grid == ("S.shape[0]", 1, 1)
    assert descs["retnet_big"].grid == (9, 1, 1)
    # q[t, d] is read for every row of S: it must be that wide
    assert ("q", 1, "S", 0) in descs["retnet_dyn"].covers_dims
    assert ("out", 1, "S", 1) in descs["retnet_dyn"].covers_dims


def test_cuda_runtime_runs_it(lowered):
    from scanweaver.runtime.cuda import CudaFunction, CudaModule

    _, m = lowered
    for name in ("retnet_dyn", "retnet_i32"):
        fn = CudaFunction(CudaModule("ptx", driver=ScalarSimulatorDriver(m)), name, _host_launches(m)[0][name], 6)
        for T, D, E in [(9, 5, 2), (0, 3, 3), (5, 0, 2)]:
            check(name, args_for(name, T, D, E), lambda got: fn(*got))
    fn = CudaFunction(CudaModule("ptx", driver=ScalarSimulatorDriver(m)), "retnet_dyn",
                      _host_launches(m)[0]["retnet_dyn"], 6)
    bad = args_for("retnet_dyn", 5, 4, 3)
    bad[0] = bad[0][:, :3].copy()  # q narrower than S's rows: refused, not read past its end
    with pytest.raises(ValueError, match="smaller"):
        fn(*bad)


def test_a_combine_other_than_a_sum_keeps_the_refusal():
    src = rename(retnet(dynamic=True), "retnet_max").replace("%an = arith.addf %a, %p", "%an = arith.maximumf %a, %p")
    m = parse_ir(src)
    RaiseRecurrences().apply(make_context(), m)
    ScanToGpu(block_size=4).apply(make_context(), m)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    (why,) = refusals(fn)
    assert "nor as a state matrix (one block per column): emit's sum loop must end with 'arith.addf" in why, why


@functools.cache
def _lowered_for_ptxas():
    return compiler.lower("\n".join(src for src, *_ in FORMS.values()), "gpu", keep_stages=False).module


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_state_matrix_kernels_assemble_without_spills(chip):
    out = export_gpu(_lowered_for_ptxas(), chip)
    assert len(out["ptxas"]) == len(FORMS)
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0 and f["stack_bytes"] == 0, (chip, kernel, f)


def test_several_parts_per_time_step(monkeypatch):
    """Time chunks shorter than the block (at the default 128 threads: 32 steps, four
    parts of 32 terms per step): 2-step chunks at 4 threads, two parts per step."""
    from scanweaver.rewrites import gpu_state_matrix

    monkeypatch.setattr(gpu_state_matrix, "MAX_TIME_CHUNK", 2)
    for name in ("retnet_i32", "rows"):
        m = parse_ir(FORMS[name][0])
        RaiseRecurrences().apply(make_context(), m)
        ScanToGpu(block_size=4).apply(make_context(), m)
        (desc,) = launch_descriptions(m)
        assert "2-step time chunks" in desc.notes
        ScanToLoops().apply(make_context(), m)
        for T, D, E in [(9, 5, 2), (1, 1, 1), (5, 11, 3)]:
            check(name, args_for(name, T, D, E), lambda got: simulate_launch(m, name, *got))
