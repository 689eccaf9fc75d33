"""Every kernel `scan-to-gpu` generates goes through upstream mlir-opt to PTX (sm_90 and
sm_80) and assembles with `ptxas -arch=sm_90` without spills."""

from __future__ import annotations

import re

import pytest
from scan_ir import affine_func
from xdsl.context import Context

from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import MIN_PTX_FEATURES, export_gpu, ptxas_available
from scanweaver.toolchain.mlir import ptxas_info

CONFIGS = {
    # name: (shape, axis, in, state, flags, block_size, items_per_thread)
    "f32_default": ((64, 4096), 1, "f32", "f32", {}, 128, 4),
    "f32_init_final_reverse": ((8, 1024), 1, "f32", "f32", dict(init=True, final=True, reverse=True), 128, 4),
    "f32_long_2p20": ((2, 1 << 20), 1, "f32", "f32", dict(final=True), 256, 8),
    "f32_3d_axis0": ((512, 4, 3), 0, "f32", "f32", dict(init=True), 64, 4),
    "bf16_in": ((16, 2048), 1, "bf16", "f32", dict(init=True, final=True), 128, 8),
    "f16_in": ((16, 2048), 1, "f16", "f32", {}, 128, 16),
    "i32": ((16, 1000), 1, "i32", "i32", dict(init=True, final=True, reverse=True), 128, 4),
    "f64": ((4, 300), 1, "f64", "f64", dict(final=True), 32, 2),
    "big_block": ((4, 70000), 1, "f32", "f32", dict(init=True, final=True), 1024, 4),
}


def _module(name: str, dynamic: bool = False):
    shape, axis, in_el, st_el, flags, bs, ipt = CONFIGS[name]
    text = affine_func(shape, axis, in_el, st_el, **flags)
    if dynamic:
        text = text.replace(f"x{shape[-1]}x", "x?x")
    module = parse_ir(text)
    ScanToGpu(block_size=bs, items_per_thread=ipt).apply(Context(), module)
    return module


def _need_ptxas():
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): PTX assembly not checked")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sm90_ptx_and_ptxas(name):
    module = _module(name)
    out = export_gpu(module, "sm_90")
    (ptx,) = out["ptx"].values()
    assert ".target sm_90" in ptx and ".version 8.0" in ptx
    # one kernel, or three for few long channels (time blocks, affine_time_blocks.py)
    assert len(out["launches"]) in (1, 3)
    assert "bar.sync" in ptx and ".shared" in ptx
    for desc in out["launches"]:
        assert f".entry {desc.kernel_name}(" in ptx
        # one .param per expanded memref-descriptor field
        assert len(re.findall(rf"\.param [^\n]*{desc.kernel_name}_param_\d+", ptx)) == desc.param_count()
    _need_ptxas()
    for desc in out["launches"]:
        info = out["ptxas"][desc.kernel_name]
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, out["warnings"]
        assert info["stack_bytes"] == 0
        # LLVM may drop the carry slot when one tile covers the sequence and no final is asked
        assert desc.shared_bytes - 8 <= info["shared_bytes"] <= desc.shared_bytes
    assert not out["warnings"]


@pytest.mark.parametrize("name", ["f32_init_final_reverse", "bf16_in", "i32"])
def test_sm80_ptx(name):
    module = _module(name)
    for features in (None, MIN_PTX_FEATURES["sm_80"]):
        out = export_gpu(module, "sm_80", features=features, ptxas_arch="sm_90")
        (ptx,) = out["ptx"].values()
        assert ".target sm_80" in ptx
        if features:
            assert ".version 7.0" in ptx
        if ptxas_available():
            for arch in ("sm_80", "sm_90"):
                (info,) = ptxas_info(ptx, arch).values()
                assert info["spill_stores"] == 0 and info["spill_loads"] == 0


def test_dynamic_length_kernel():
    module = _module("f32_init_final_reverse", dynamic=True)
    out = export_gpu(module, "sm_90")
    (desc,) = out["launches"]
    assert desc.args[0][3] == (8, "?")
    _need_ptxas()
    assert not out["warnings"]
