"""The fused `scan.recurrence` kernel (Mamba selective scan, N = 16) goes through upstream
mlir-opt to PTX for sm_90 and assembles with `ptxas -arch=sm_90 -v` without spills,
without a stack frame (the private state alloca is promoted to registers) and with the
shared memory its launch description declares."""

from __future__ import annotations

import re

import pytest

from scanweaver.ir import make_context
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.workloads import loops

CONFIGS = {
    # name: (batch, D, L, N, builder options, block_size, items_per_thread)
    "mamba_2x64x2048_n16": (2, 64, 2048, 16, dict(return_last_state=True), 128, 4),
    "mamba_long_2p20": (2, 64, 1 << 20, 16, dict(), 128, 4),
    "shared_bc_bf16": (2, 64, 2048, 16, dict(bc="shared", dtype="bf16"), 128, 4),
    "grouped_bc_block256": (2, 64, 2048, 16, dict(bc="grouped", groups=4, with_z=False), 256, 4),
    "n32_reloaded_coefficients": (2, 64, 2048, 32, dict(), 128, 4),
}


def _export(name: str):
    batch, D, L, N, opts, bs, ipt = CONFIGS[name]
    module = loops.selective_scan_loops(batch, D, L, N, **opts)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    # the fused kernel (128 long channels would take the time blocks by default)
    ScanToGpu(block_size=bs, items_per_thread=ipt, time_blocks="never").apply(ctx, module)
    module.verify()
    return export_gpu(module, "sm_90")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_selective_scan_kernel_sm90(name):
    out = _export(name)
    (ptx,) = out["ptx"].values()
    (desc,) = out["launches"]
    assert desc.kernel_name.startswith("scan_recurrence")
    assert f".entry {desc.kernel_name}(" in ptx and ".target sm_90" in ptx
    assert "bar.sync" in ptx and ".shared" in ptx
    assert ".local" not in ptx, "the private state buffer was not promoted to registers"
    assert len(re.findall(rf"\.param [^\n]*{desc.kernel_name}_param_\d+", ptx)) == desc.param_count()
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    info = out["ptxas"][desc.kernel_name]
    print(name, info)
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, out["warnings"]
    assert info["stack_bytes"] == 0
    assert info["registers"] <= 255
    assert info["shared_bytes"] == desc.shared_bytes
