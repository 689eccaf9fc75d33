"""Loads through read-only kernel parameters marked `invariant` (`!invariant.load`,
`toolchain/readonly_params.mark_readonly_loads_invariant`), so NVPTX keeps `ld.global.nc`
on addresses built along long chains of `getelementptr` (the selective scan's rows of
B and C, one from the previous), where its own look-through stops after 6 steps."""

from __future__ import annotations

import re

import pytest

from scanweaver.bench import gpu_kernels as gk
from scanweaver.toolchain import readonly_params as rp

TEXT = """module {
  llvm.func @host(%arg0: !llvm.ptr {llvm.readonly}) {
    %0 = llvm.load %arg0 : !llvm.ptr -> f32
    llvm.return
  }
  llvm.func @k(%arg0: !llvm.ptr {llvm.noalias, llvm.readonly}, %arg1: !llvm.ptr, %arg2: i64) attributes {gpu.kernel} {
    %1 = llvm.getelementptr inbounds|nuw %arg0[%arg2] : (!llvm.ptr, i64) -> !llvm.ptr, f32
    %2 = llvm.getelementptr %1[%arg2] : (!llvm.ptr, i64) -> !llvm.ptr, f32
    %3 = llvm.load %2 {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>
    %4 = llvm.load %arg0 : !llvm.ptr -> f32
    %5 = llvm.getelementptr %arg1[%arg2] : (!llvm.ptr, i64) -> !llvm.ptr, f32
    %6 = llvm.load %5 : !llvm.ptr -> f32
    %7 = llvm.load %arg1 : !llvm.ptr -> f32
    llvm.return
  }
}
"""


def test_loads_through_readonly_parameters_become_invariant():
    out = rp.mark_readonly_loads_invariant(TEXT).split("\n")
    loads = {line.split("=")[0].strip(): line for line in out if "llvm.load" in line}
    assert "%3 = llvm.load %2 invariant {alignment = 16 : i64} : !llvm.ptr -> vector<4xf32>" in loads["%3"]
    assert "llvm.load %arg0 invariant : !llvm.ptr -> f32" in loads["%4"]
    for name in ("%0", "%6", "%7"):  # not a kernel; a parameter the kernel may write
        assert "invariant" not in loads[name], loads[name]
    assert rp.mark_readonly_loads_invariant("\n".join(out)) == "\n".join(out)  # idempotent


def _global_loads(m, chip: str = "sm_90") -> tuple[list[str], list[str]]:
    """(plain, `.nc`) global load instructions in the PTX of `m`, all widths."""
    from scanweaver.toolchain.gpu_export import export_gpu

    (ptx,) = export_gpu(m, chip=chip)["ptx"].values()
    loads = re.findall(r"\bld\.global(?:\.\w+)*", ptx)
    return [ld for ld in loads if ".nc" not in ld], [ld for ld in loads if ".nc" in ld]


def _selective(n: int, time_blocks: bool = False):
    """The benchmark's selective scan at state size `n` (8 x 1536 x 2048, one block per
    channel), or one channel of 2^20 steps in time blocks (chunks, carries, reduce)."""
    if not time_blocks:
        return gk._lower(gk.case_ir(f"selective_N{n}_8x1536x2048", "big"), small=False)
    from scanweaver.ir import make_context, parse_ir
    from scanweaver.rewrites.pipeline import stages_for
    from scanweaver.rewrites.scan_to_gpu import ScanToGpu

    module = parse_ir(gk.case_ir(f"selective_N{n}_8x1536x2048", 1 << 20))
    ctx = make_context()
    for stage in stages_for("gpu"):
        (ScanToGpu(time_blocks="always") if isinstance(stage, ScanToGpu) else stage).apply(ctx, module)
    return module


# (N, time blocks): `.v4` loads, B and C by 16-byte vectors (16: B staged, C by vectors;
# 24: 23 of 24 rows of B staged; in time blocks, N = 16: the chunk kernel as the one-block
# kernel, the reduce kernel B only)
VECTOR_LOADS = {(16, False): 32, (24, False): 23, (16, True): 32 + 16}


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("n,time_blocks", sorted(VECTOR_LOADS))
def test_selective_scan_global_loads_all_read_only(n, time_blocks, chip):
    """Every global load of the selective scan's kernels, 16-byte vectors included, is
    `ld.global.nc` (they write none of the arrays they read). Before the vectors' lanes
    were taken apart away from their loads (`recurrence_vector_io.load_runs`), the last
    rows' vectors were plain `ld.global.v4` (N = 16: 2, N = 24: 8; in time blocks, N = 16:
    2 in the chunk kernel, 1 in the reduce kernel)."""
    plain, nc = _global_loads(_selective(n, time_blocks), chip)
    assert plain == [], plain
    assert sum(".v4" in ld for ld in nc) == VECTOR_LOADS[n, time_blocks]


def test_without_the_marks_some_loads_are_plain(monkeypatch):
    """The check above can fail: without the `invariant` marks, NVPTX's own test of the
    parameters misses the last rows of B and C, scalar and vector loads alike."""
    monkeypatch.setattr(rp, "mark_readonly_loads_invariant", lambda text: text)
    plain, _ = _global_loads(_selective(16))
    assert any(".v4" in ld for ld in plain) and any(".v4" not in ld for ld in plain), plain


def _lanes_next_to_load(kernel) -> list:
    """The vector loads of `kernel` that LLVM's VectorCombine would split into scalar
    loads, losing `!invariant.load` (`readonly_params.mark_readonly_loads_invariant`):
    every user a `vector.extract` in the load's own block, with no store between."""
    from xdsl.dialects import memref, vector

    split = []
    for load in kernel.walk():
        if not isinstance(load, vector.LoadOp):
            continue
        users = [u.operation for u in load.result.uses]
        if not all(isinstance(u, vector.ExtractOp) and u.parent_block() is load.parent_block() for u in users):
            continue
        block_ops = list(load.parent_block().ops)
        last = max(block_ops.index(u) for u in users)
        between = block_ops[block_ops.index(load) + 1 : last]
        if not any(isinstance(o, memref.StoreOp | vector.StoreOp) for o in between):
            split.append(load)
    return split


def _recurrence_kernels(n: int) -> list:
    """The kernels whose vector loads `recurrence_vector_io.load_runs` emits: the
    one-block kernel, and in time blocks the chunk and reduce kernels (the carries
    kernel reads its 4 aggregates by `blelloch_gpu.load_run`, off one short address
    chain, which NVPTX's own test sees through: `.nc` above)."""
    from xdsl.dialects import gpu

    kernels = [k for m in (_selective(n), _selective(n, time_blocks=True)) for k in m.walk()
               if isinstance(k, gpu.FuncOp) and not k.sym_name.data.endswith("_carries")]
    assert any(k.sym_name.data.endswith("_chunks") for k in kernels)
    return kernels


@pytest.mark.parametrize("n", [4, 16, 24])
def test_no_vector_lane_is_taken_out_next_to_its_load(n):
    """The kernels' shape that keeps every mark (`recurrence_vector_io.load_runs`)."""
    from xdsl.dialects import vector

    kernels = _recurrence_kernels(n)
    assert sum(isinstance(o, vector.LoadOp) for k in kernels for o in k.walk()) > 0
    for kernel in kernels:
        assert _lanes_next_to_load(kernel) == [], kernel.sym_name.data


def test_lanes_taken_out_at_once_are_found(monkeypatch):
    """The check above can fail: a staged vector's lanes all extracted before their stores."""
    from scanweaver.rewrites import recurrence_vector_io as vio

    lanes = vio._lanes
    monkeypatch.setattr(vio, "_lanes", lambda ie, values: iter(list(lanes(ie, values))))
    assert any(_lanes_next_to_load(k) for k in _recurrence_kernels(16))
