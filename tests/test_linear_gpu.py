"""`scan-to-gpu` on `scan.linear_recurrence` (coupled K-vector recurrences raised from
loops, e.g. the 2nd-order IIR filter): the fused kernel (coeffs -> (M, v) pairs,
Blelloch scan over pair aggregates, state-vector down-sweep, replay + emit) run in the
thread-block simulator against the sequential oracle on the original loops. f32
within tolerance, i32 bit for bit (wrapping)."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects import gpu

from scanweaver.dialects import scan
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.linear_gpu import lower_linear_recurrences
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.runtime.cuda_program import _HOST_OPS
from scanweaver.workloads import loops


def raised(module_or_text):
    text = module_or_text if isinstance(module_or_text, str) else print_ir(module_or_text)
    m = parse_ir(text)
    RaiseRecurrences().apply(make_context(), m)
    assert any(isinstance(o, scan.LinearRecurrenceOp) for o in m.walk())
    return text, m


def lowered(module_or_text, block_size=4, items_per_thread=2, keep_pairs=None):
    text, m = raised(module_or_text)
    skipped = lower_linear_recurrences(m, block_size, items_per_thread, keep_pairs)
    assert not skipped, skipped
    m.verify()
    for op in m.walk():
        assert not isinstance(op, scan.LinearRecurrenceOp)
    for fn in m.ops:
        if not isinstance(fn, gpu.ModuleOp):
            for op in fn.walk():
                assert op is fn or isinstance(op, _HOST_OPS), op.name
    return text, m


def check(module_or_text, fname, args, *, exact=False, **kw):
    text, m = lowered(module_or_text, **kw)
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(text), fname, *ref)
    simulate_launch(m, fname, *got)
    for r, g in zip(ref, got):
        if exact:
            np.testing.assert_array_equal(g, r)
        else:
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    return m


def iir2_args(rng, C, L, dtype="f32"):
    if dtype == "i32":
        info = np.iinfo(np.int32)
        x = rng.integers(info.min, info.max, size=(C, L), dtype=np.int32, endpoint=True)
        c1 = rng.integers(info.min, info.max, size=C, dtype=np.int32, endpoint=True)
        c2 = rng.integers(info.min, info.max, size=C, dtype=np.int32, endpoint=True)
        return [x, c1, c2, np.full((C, L), 77, np.int32)]
    # a stable filter: poles inside the unit circle
    c1 = rng.uniform(-0.9, 0.9, size=C).astype(np.float32)
    c2 = rng.uniform(-0.5, 0.0, size=C).astype(np.float32)
    return [rng.uniform(-1, 1, size=(C, L)).astype(np.float32), c1, c2, np.full((C, L), 77, np.float32)]


# ------------------------------------------------------------------------------ iir2


@pytest.mark.parametrize("L", [0, 1, 2, 7, 8, 9, 40])
def test_iir2_f32(L):
    check(loops.iir2_loops(3, L), "iir2", iir2_args(np.random.default_rng(L), 3, L))


@pytest.mark.parametrize("L", [1, 13, 40])
def test_iir2_i32_bit_for_bit(L):
    check(loops.iir2_loops(2, L, "i32"), "iir2", iir2_args(np.random.default_rng(L), 2, L, "i32"), exact=True)


@pytest.mark.parametrize("bs,ipt", [(1, 1), (2, 3), (8, 3), (16, 1)])
def test_iir2_block_shapes(bs, ipt):
    check(loops.iir2_loops(2, 37), "iir2", iir2_args(np.random.default_rng(bs), 2, 37),
          block_size=bs, items_per_thread=ipt)


@pytest.mark.parametrize("keep", [True, False])
def test_iir2_kept_or_recomputed_pairs(keep):
    m = check(loops.iir2_loops(2, 29, "i32"), "iir2", iir2_args(np.random.default_rng(3), 2, 29, "i32"),
              exact=True, keep_pairs=keep)
    (desc,) = launch_descriptions(m)
    assert ("kept" if keep else "recomputed") in desc.notes


def test_launch_description_and_structure():
    _, m = lowered(loops.iir2_loops(6, 50), block_size=8, items_per_thread=4)
    (desc,) = launch_descriptions(m)
    assert desc.kernel_name == "scan_linear_0"
    assert desc.grid == (6, 1, 1) and desc.block == (8, 1, 1)
    # warp-shuffle tile in one warp: no warp totals, sC (2 floats) only
    assert desc.shared_bytes == 2 * 4
    assert {n: k for n, k, _, _ in desc.args} == {"x": "in", "c1": "in", "c2": "in", "y": "out"}
    (kernel,) = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    barriers = [o for o in kernel.walk() if isinstance(o, gpu.BarrierOp)]
    # the entering state, the overflow fallback's loop, before the final sC, epilogue
    assert len(barriers) == 4
    # two warps: sM 4 x 2 totals, sV 2 x 2, sC 2 (16-byte aligned arrays)
    _, m = lowered(loops.iir2_loops(6, 50), block_size=64, items_per_thread=4)
    (desc,) = launch_descriptions(m)
    assert desc.shared_bytes == 4 * 2 * 4 + 2 * 2 * 4 + 2 * 4
    (kernel,) = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    # the entering state, the warp totals, the fallback, the carry, epilogue
    assert len([o for o in kernel.walk() if isinstance(o, gpu.BarrierOp)]) == 4 + 1


# ------------------------------------------------------------------------------ other forms

IIR3_FINAL = """
func.func @iir3(%x: memref<3x?xf32>, %k: memref<3x3xf32>, %y: memref<3x?xf32>, %hT: memref<3x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %n = memref.dim %x, %c1 : memref<3x?xf32>
  scf.for %c = %c0 to %c3 step %c1 {
    %k1 = memref.load %k[%c, %c0] : memref<3x3xf32>
    %k2 = memref.load %k[%c, %c1] : memref<3x3xf32>
    %k3 = memref.load %k[%c, %c2] : memref<3x3xf32>
    %z = arith.constant 0.0 : f32
    %r1, %r2, %r3 = scf.for %t = %c0 to %n step %c1 iter_args(%y1 = %z, %y2 = %z, %y3 = %z) -> (f32, f32, f32) {
      %p = arith.mulf %k1, %y1 : f32
      %q = arith.mulf %k2, %y2 : f32
      %u = arith.mulf %k3, %y3 : f32
      %s = arith.addf %p, %q : f32
      %s2 = arith.addf %s, %u : f32
      %xv = memref.load %x[%c, %t] : memref<3x?xf32>
      %yn = arith.addf %s2, %xv : f32
      memref.store %yn, %y[%c, %t] : memref<3x?xf32>
      scf.yield %yn, %y1, %y2 : f32, f32, f32
    }
    memref.store %r1, %hT[%c, %c0] : memref<3x3xf32>
    memref.store %r2, %hT[%c, %c1] : memref<3x3xf32>
    memref.store %r3, %hT[%c, %c2] : memref<3x3xf32>
  }
  func.return
}"""


@pytest.mark.parametrize("L", [0, 5, 30])
def test_third_order_dynamic_length_final_state(L):
    """K = 3 (recomputed pairs), dynamic length, final state stored per channel."""
    rng = np.random.default_rng(L)
    args = [rng.uniform(-1, 1, (3, L)).astype(np.float32), rng.uniform(-0.4, 0.4, (3, 3)).astype(np.float32),
            np.zeros((3, L), np.float32), np.full((3, 3), 5.0, np.float32)]
    m = check(IIR3_FINAL, "iir3", args, items_per_thread=3)  # (9 + 3) * 3 > 32 registers
    (desc,) = launch_descriptions(m)
    assert "recomputed" in desc.notes


SINGLE_SEQUENCE = """
func.func @iir1(%x: memref<?xi32>, %k: memref<2xi32>, %h0: memref<2xi32>, %y: memref<?xi32>, %last: memref<2xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xi32>
  %k1 = memref.load %k[%c0] : memref<2xi32>
  %k2 = memref.load %k[%c1] : memref<2xi32>
  %i1 = memref.load %h0[%c0] : memref<2xi32>
  %i2 = memref.load %h0[%c1] : memref<2xi32>
  %r1, %r2 = scf.for %t = %c0 to %n step %c1 iter_args(%y1 = %i1, %y2 = %i2) -> (i32, i32) {
    %p = arith.muli %k1, %y1 : i32
    %q = arith.muli %k2, %y2 : i32
    %s = arith.addi %p, %q : i32
    %xv = memref.load %x[%t] : memref<?xi32>
    %yn = arith.addi %s, %xv : i32
    memref.store %yn, %y[%t] : memref<?xi32>
    scf.yield %yn, %y1 : i32, i32
  }
  memref.store %r1, %last[%c0] : memref<2xi32>
  memref.store %r2, %last[%c1] : memref<2xi32>
  func.return
}"""


def single_sequence_args(L: int) -> list:
    """x, k, h0 of SINGLE_SEQUENCE over all of i32 (the products wrap), y and last zeroed."""
    rng = np.random.default_rng(L)
    info = np.iinfo(np.int32)

    def ints(*shape):
        return rng.integers(info.min, info.max, size=shape, dtype=np.int32, endpoint=True)

    return [ints(L), ints(2), ints(2), np.zeros(L, np.int32), np.zeros(2, np.int32)]


@pytest.mark.parametrize("L", [0, 1, 19])
def test_no_channel_loop_one_block(L):
    """Depth 0: state alloca in the function body, initial state loaded from an
    argument, final state stored to one: wrapped into a one-block kernel."""
    args = single_sequence_args(L)
    m = check(SINGLE_SEQUENCE, "iir1", args, exact=True)
    (desc,) = launch_descriptions(m)
    assert desc.grid == (1, 1, 1) and "no channel loop (one block)" in desc.notes


@pytest.mark.parametrize("L", [0, 1, 19])
def test_no_channel_loop_final_state_through_arith(L):
    """The final states feed pure arithmetic before their store (`last[0] = r1 + r2`):
    the kernel computes it after the recurrence, bit for bit the loop's i32 wrap."""
    text = SINGLE_SEQUENCE.replace(
        "  memref.store %r1, %last[%c0] : memref<2xi32>\n",
        "  %w = arith.addi %r1, %r2 : i32\n  memref.store %w, %last[%c0] : memref<2xi32>\n",
    )
    args = single_sequence_args(L)
    m = check(text, "iir1", args, exact=True)
    (desc,) = launch_descriptions(m)
    assert desc.grid == (1, 1, 1)


def test_through_scan_to_gpu_pass():
    """Dispatched by `scan-to-gpu`: the raised iir2 leaves no scan op."""
    text, m = raised(loops.iir2_loops(2, 11))
    ScanToGpu(block_size=4, items_per_thread=2).apply(make_context(), m)
    assert not any(o.dialect_name() == "scan" for o in m.walk())
    args = iir2_args(np.random.default_rng(0), 2, 11)
    ref = [a.copy() for a in args]
    run_function(parse_ir(text), "iir2", *ref)
    simulate_launch(m, "iir2", *args)
    np.testing.assert_allclose(args[3], ref[3], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ PTX (sm_90)


@pytest.mark.parametrize("case", ["iir2_f32", "iir2_i32", "iir3_f32"])
def test_kernel_sm90_ptxas(case):
    if case == "iir3_f32":
        _, m = lowered(IIR3_FINAL, block_size=128, items_per_thread=4)
    else:
        _, m = lowered(loops.iir2_loops(64, 4096, case[-3:]), block_size=128, items_per_thread=4)
    out = export_gpu(m, "sm_90")
    (ptx,) = out["ptx"].values()
    (desc,) = out["launches"]
    assert f".entry {desc.kernel_name}(" in ptx and "bar.sync" in ptx
    assert ".local" not in ptx, "the private state buffer was not promoted to registers"
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    info = out["ptxas"][desc.kernel_name]
    print(case, info)
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, out["warnings"]
    assert info["stack_bytes"] == 0
    assert info["shared_bytes"] == desc.shared_bytes


def test_build_cuda_artifacts_on_loop_ir():
    """iir2 loop IR -> the whole GPU pipeline -> one kernel and its PTX (no GPU needed)."""
    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    art = build_cuda_artifacts(print_ir(loops.iir2_loops(4, 64)))
    (seq,) = art.launches.values()
    (desc,) = seq
    assert desc.kernel_name.startswith("scan_linear") and desc.grid == (4, 1, 1)
    assert f".entry {desc.kernel_name}(" in art.ptx
