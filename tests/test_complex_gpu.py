"""Complex recurrences and the GPU target (no GPU needed: PTX is built here and
checked with ptxas when the CUDA toolkit is installed).

* The (re, im) pair form of the LRU recurrence (`lru_pair_loops`) keeps its 2x2 form on
  the GPU target and becomes one fused linear-recurrence kernel: PTX for sm_80 and
  sm_90, no spills, no stack frame.
* Complex-state scan ops (complex<f32> memref / iter_arg state) have no GPU kernel yet:
  the GPU target lowers them to sequential host loops (`scan-complex-to-host-loops`)
  instead of failing, and the API refuses backend='cuda' for complex inputs.
"""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver import compiler
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.workloads.lru import lru_iter_arg_loops, lru_pair_loops


@pytest.mark.parametrize("chip,features", [("sm_80", "+ptx70"), ("sm_90", "+ptx80")])
def test_pair_lru_kernel_ptxas(chip, features):
    module = lru_pair_loops(64, 4096)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanToGpu(block_size=128, items_per_thread=4).apply(ctx, module)
    module.verify()
    out = export_gpu(module, chip, features)
    (ptx,) = out["ptx"].values()
    (desc,) = out["launches"]
    assert f".target {chip}" in ptx and f".entry {desc.kernel_name}(" in ptx
    assert "bar.sync" in ptx and ".shared" in ptx
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    info = out["ptxas"][desc.kernel_name]
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, out["warnings"]
    assert info["stack_bytes"] == 0 and info["registers"] <= 255


def test_complex_state_on_gpu_target_becomes_host_loops():
    text = print_ir(lru_iter_arg_loops(2, 6))
    low = compiler.lower(text, "gpu")
    final = low.stages[-1].ir
    assert "gpu.func" not in final and "scan." not in final and "complex.mul" not in final
    # ... and those loops keep the meaning (interpreted, bit for bit the original loops).
    rng = np.random.default_rng(0)
    lam = (rng.standard_normal(2) + 1j * rng.standard_normal(2)).astype(np.complex64) * 0.5
    b = (rng.standard_normal((2, 6)) + 1j * rng.standard_normal((2, 6))).astype(np.complex64)
    outs = []
    for form in (text, final):
        h, hT = np.zeros((2, 6), np.complex64), np.zeros(2, np.complex64)
        run_function(form, "lru_iter", lam, b, h, hT)
        outs.append((h, hT))
    assert outs[0][0].tobytes() == outs[1][0].tobytes() and outs[0][1].tobytes() == outs[1][1].tobytes()
