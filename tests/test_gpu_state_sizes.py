"""Large states on the GPU: the selective scan at N = 16, 32 and 64 assembles for sm_80
and sm_90 without spills or a stack frame at the default items per thread (beyond 32
state elements the lowering takes one item per thread and unrolls the emit's loops
over the state itself), and a capped kernel still runs like the loops (simulator
against the interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.recurrence_gpu import items_for_state
from scanweaver.rewrites.scan_to_loops import ScanToLoops
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.workloads.loops import selective_scan_loops


def test_items_per_thread_follow_the_state_size():
    assert [items_for_state(n, 4) for n in (1, 16, 32, 33, 64)] == [4, 4, 4, 1, 1]


# N = 16 and 32 on sm_90 at 128 x 4 are built by tests/test_recurrence_ptx.py already
# (mamba_2x64x2048_n16, n32_reloaded_coefficients): the same kernels, not built twice.
@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("N,chip", [(16, "sm_80"), (32, "sm_80"), (64, "sm_80"), (64, "sm_90")])
def test_selective_scan_has_no_spills_at_the_default_items_per_thread(N, chip):
    module = selective_scan_loops(2, 64, 2048, N)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanToGpu().apply(ctx, module)  # defaults: 128 threads, 4 items per thread
    out = export_gpu(module, chip)
    (desc,) = out["launches"]
    info = out["ptxas"][desc.kernel_name]
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (N, chip, info)
    assert info["stack_bytes"] == 0, (N, chip, info)
    assert info["shared_bytes"] + desc.dynamic_shared_bytes <= 48 * 1024


def test_capped_kernel_runs_like_the_loops():
    N = 40
    module = selective_scan_loops(1, 2, 11, N)
    original = parse_ir(print_ir(module))
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanToGpu(block_size=4, items_per_thread=4).apply(ctx, module)
    (desc,) = launch_descriptions(module)
    assert "items_per_thread=1 (capped from 4 for the state)" in desc.notes
    ScanToLoops().apply(ctx, module)
    rng = np.random.default_rng(64)
    args = [
        rng.uniform(-1, 1, (1, 2, 11)).astype(np.float32),   # u
        rng.uniform(0, 0.5, (1, 2, 11)).astype(np.float32),  # delta
        -rng.uniform(0.1, 1, (2, N)).astype(np.float32),     # A
        rng.uniform(-1, 1, (2, N)).astype(np.float32),       # B
        rng.uniform(-1, 1, (2, N)).astype(np.float32),       # C
        rng.uniform(-1, 1, 2).astype(np.float32),            # D skip
        rng.uniform(-1, 1, (1, 2, 11)).astype(np.float32),   # z
        rng.uniform(-0.1, 0.1, 2).astype(np.float32),        # delta bias
        np.full((1, 2, 11), np.nan, np.float32),             # out
    ]
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    fname = next(op.sym_name.data for op in original.ops if op.name == "func.func")
    run_function(original, fname, *ref)
    simulate_launch(module, fname, *got)
    assert np.all(np.isfinite(got[-1]))
    np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-5, atol=1e-6)
