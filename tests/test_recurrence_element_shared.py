"""Element-only coefficient values of large states in one shared copy per block
(`recurrence_gpu._hoist_elements_to_shared`): the selective scan's A[d, n] (and B, C
where they do not vary with time) at N > 32 are read from shared memory where used,
instead of a global load per step and element; the loads stay next to their uses
(`toolchain/shared_reloads.py`: `volatile`, so the replay does not keep the first
pass's 64 values live).

The simulator runs the kernel against the interpreter (float: close) and against the
same kernel built without the shared copy (bit for bit: the same values, the same
arithmetic in the same order); ptxas checks registers and spills on sm_80 and sm_90."""

from __future__ import annotations

import re

import numpy as np
import pytest

from scanweaver.bench import gpu_kernels as gk
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites import recurrence_gpu as rg
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.toolchain import shared_reloads as sr
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.workloads.loops import selective_scan_loops


def _args(rng: np.random.Generator, batch: int, D: int, L: int, N: int, bc: str) -> list[np.ndarray]:
    bc_shape = (D, N) if bc == "constant" else (batch, N, L)
    return [
        rng.uniform(-1, 1, (batch, D, L)).astype(np.float32),   # u
        rng.uniform(0, 0.5, (batch, D, L)).astype(np.float32),  # delta
        -rng.uniform(0.1, 1, (D, N)).astype(np.float32),        # A
        rng.uniform(-1, 1, bc_shape).astype(np.float32),        # B
        rng.uniform(-1, 1, bc_shape).astype(np.float32),        # C
        rng.uniform(-1, 1, D).astype(np.float32),               # D skip
        rng.uniform(-1, 1, (batch, D, L)).astype(np.float32),   # z
        rng.uniform(-0.1, 0.1, D).astype(np.float32),           # delta bias
        np.full((batch, D, L), np.nan, np.float32),             # out
    ]


def _gpu(module, time_blocks: str = "never"):
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanToGpu(block_size=4, items_per_thread=4, chunk_tiles=1, time_blocks=time_blocks).apply(ctx, module)
    return module


@pytest.mark.parametrize("N,L,bc,tb", [(40, 11, "constant", "never"), (64, 9, "shared", "never"),
                                       (33, 1, "shared", "never"), (64, 0, "constant", "never"),
                                       (48, 17, "constant", "never"),
                                       # time blocks of 4-step chunks: the reduce and chunk kernels
                                       (40, 11, "constant", "always"), (33, 9, "shared", "always")])
def test_shared_copy_runs_like_the_loops_and_like_the_global_reloads(monkeypatch, N, L, bc, tb):
    batch, D = 1, 1 if tb == "always" else 2
    original = selective_scan_loops(batch, D, L, N, bc=bc)
    fname = next(op.sym_name.data for op in original.ops if op.name == "func.func")
    shared = _gpu(parse_ir(print_ir(original)), tb)
    text = print_ir(shared)
    # the path under test was taken (in the time blocks' reduce and chunk kernels both)
    assert text.count("_sE") >= 2 * (2 if tb == "always" else 1), text.count("_sE")
    monkeypatch.setattr(rg, "HOIST_PER_ELEMENT_SHARED_BYTES", 0)
    reloaded = _gpu(parse_ir(print_ir(original)), tb)
    assert "_sE" not in print_ir(reloaded)
    args = _args(np.random.default_rng(N + L), batch, D, L, N, bc)
    ref, got, old = ([a.copy() for a in args] for _ in range(3))
    run_function(original, fname, *ref)
    simulate_launch(shared, fname, *got, block_order=3)
    simulate_launch(reloaded, fname, *old)
    assert got[-1].tobytes() == old[-1].tobytes()  # bit for bit
    assert np.all(np.isfinite(got[-1]))
    np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-5, atol=1e-6)


TEXT = """module {
  llvm.mlir.global private @k_sE() {addr_space = 3 : i32} : !llvm.array<4 x f32>
  llvm.func @k(%arg0: !llvm.ptr, %arg1: i64) attributes {gpu.kernel} {
    %0 = llvm.mlir.addressof @k_sE : !llvm.ptr<3>
    %1 = llvm.mlir.addressof @k_sC : !llvm.ptr<3>
    %2 = llvm.getelementptr %0[0, 0] : (!llvm.ptr<3>) -> !llvm.ptr<3>, !llvm.array<4 x f32>
    %3 = llvm.getelementptr inbounds|nuw %2[1] : (!llvm.ptr<3>) -> !llvm.ptr<3>, f32
    %4 = llvm.load %3 : !llvm.ptr<3> -> f32
    %5 = llvm.load %2 : !llvm.ptr<3> -> f32
    %6 = llvm.load %1 : !llvm.ptr<3> -> f32
    %7 = llvm.load %arg0 : !llvm.ptr -> f32
    llvm.return
  }
  llvm.func @host(%arg0: !llvm.ptr) {
    %0 = llvm.mlir.addressof @k_sE : !llvm.ptr<3>
    %1 = llvm.load %0 : !llvm.ptr<3> -> f32
    llvm.return
  }
}
"""


def test_loads_from_the_shared_copy_become_volatile():
    out = sr.mark_shared_reloads_volatile(TEXT)
    loads = {line.split("=")[0].strip(): line for line in out.split("\n")[:12] if "llvm.load" in line}
    assert "%4 = llvm.load volatile %3 : !llvm.ptr<3> -> f32" in loads["%4"]
    assert "llvm.load volatile %2 :" in loads["%5"]
    for name in ("%6", "%7"):  # another shared array; a global pointer
        assert "volatile" not in loads[name], loads[name]
    assert "llvm.load %0 :" in out.split("@host")[1]  # not a kernel
    assert sr.mark_shared_reloads_volatile(out) == out  # idempotent


def _n64(chip: str) -> tuple[dict, str]:
    m = gk._lower(gk.case_ir("selective_N64_8x1536x2048", "big"), small=False)
    out = export_gpu(m, chip=chip)
    (ptx,) = out["ptx"].values()
    (info,) = out["ptxas"].values()
    return info, ptx


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_n64_reads_a_from_shared_memory_without_more_registers(monkeypatch, chip):
    """Mamba's N = 64 (B, C vary with time): A from the shared copy, no global load of it
    per step, and B staged (31 of 64 elements); 168 registers as with the global reloads
    (3 resident blocks of 128), no spills. Unstaged and without the `volatile` marks,
    LLVM keeps the 64 values of A live: 251 (sm_80), 255 (sm_90)."""
    info, ptx = _n64(chip)
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0 and info["stack_bytes"] == 0, info
    assert info["registers"] <= 168, info
    assert info["shared_bytes"] > 33280, info  # the stage of B
    assert len(re.findall(r"\bld\.volatile\.shared\.[bf]32\b", ptx)) >= 2 * 64  # phase 1 and replay
    monkeypatch.setattr(rg._KernelGen, "stage_max_shared_copy", rg.STAGE_MAX_ELEMENTS)
    info, _ = _n64(chip)
    assert info["registers"] <= 168, info
    monkeypatch.setattr(sr, "mark_shared_reloads_volatile", lambda text: text)
    info, _ = _n64(chip)
    assert info["registers"] > 168, info


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_n64_time_blocks_without_spills(chip):
    """One channel of N = 64 in time blocks: A in the shared copy of the reduce and chunk
    kernels; the chunk kernel keeps B's scalar loads (`_ChunkGen.stage_max_shared_copy`:
    staged it takes 254 registers on sm_90) and 168 registers (254 with A per step)."""
    module = selective_scan_loops(1, 1, 1 << 20, 64, bc="shared")
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanToGpu(time_blocks="always").apply(ctx, module)
    info = export_gpu(module, chip)["ptxas"]
    assert {k.rsplit("_", 1)[1] for k in info} == {"reduce", "carries", "chunks"}
    for v in info.values():
        assert v["spill_stores"] == 0 and v["spill_loads"] == 0 and v["stack_bytes"] == 0, info
    (chunks,) = [v for k, v in info.items() if k.endswith("_chunks")]
    assert chunks["registers"] <= 168, info


def _reduce_vector_loads(module) -> int:
    from xdsl.dialects import gpu, vector

    (fn,) = [op for op in module.walk() if isinstance(op, gpu.FuncOp) and op.sym_name.data.endswith("_reduce")]
    return sum(isinstance(op, vector.LoadOp) for op in fn.walk())


@pytest.mark.parametrize("N,L", [(8, 36), (16, 52), (4, 16)])  # rows 16-byte aligned: L % 4 == 0
def test_time_block_reduce_loads_b_by_vectors(monkeypatch, N, L):
    """The time-block reduce kernel (launch 1) reads B[b, n, t0 .. t0 + 3] by 16-byte
    vectors in full tiles (`_ReduceGen.element_runs`): the same values, so the same
    aggregates and results bit for bit as with its scalar loads, and the loop's within
    float tolerance; 16-step chunks, the last one partial."""
    from scanweaver.rewrites import recurrence_time_blocks as rtb

    original = selective_scan_loops(1, 1, L, N, bc="shared")
    fname = next(op.sym_name.data for op in original.ops if op.name == "func.func")
    vec = _gpu(parse_ir(print_ir(original)), "always")
    monkeypatch.setattr(rtb._ReduceGen, "element_runs", False)
    scalar = _gpu(parse_ir(print_ir(original)), "always")
    loads = [_reduce_vector_loads(m) for m in (vec, scalar)]
    assert loads[0] - loads[1] >= N, loads  # one vector per element of B (and the step runs)
    args = _args(np.random.default_rng(N * L), 1, 1, L, N, "shared")
    ref, got, old = ([a.copy() for a in args] for _ in range(3))
    run_function(original, fname, *ref)
    simulate_launch(vec, fname, *got, block_order=5)
    simulate_launch(scalar, fname, *old)
    assert got[-1].tobytes() == old[-1].tobytes()  # bit for bit
    np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-5, atol=1e-6)
