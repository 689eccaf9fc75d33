"""Shared memory is asked for once: static in the PTX, 0 dynamic at launch, and the sum
fits a block's 48 KB (no opt-in) for the selective scan up to N = 64 at 128 threads.
`export_gpu` checks the same for every kernel any test builds."""

from __future__ import annotations

import pytest
from scanweaver.compiler import make_context
from scanweaver.errors import ScanWeaverValueError
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.toolchain.gpu_export import check_shared_memory, export_gpu, ptxas_available
from scanweaver.runtime.cuda_launch import SHARED_PER_BLOCK_LIMIT, KernelLaunch
from scanweaver.toolchain.ptx import static_shared_bytes
from scanweaver.workloads.loops import selective_scan_loops


@pytest.mark.parametrize("N", [16, 24, 32, 64])
def test_selective_scan_shared_memory_fits_one_block(N):
    # items-per-thread 1 keeps the build short; shared memory does not depend on it
    module = selective_scan_loops(2, 8, 100, N, bc="shared")
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanToGpu(block_size=128, items_per_thread=1).apply(ctx, module)
    out = export_gpu(module, "sm_90")
    (desc,) = out["launches"]
    assert desc.block == (128, 1, 1) and desc.dynamic_shared_bytes == 0
    (ptx,) = out["ptx"].values()
    static = static_shared_bytes(ptx)[desc.kernel_name]
    assert out["shared"][desc.kernel_name] == {"static": static, "dynamic": 0}
    assert 0 < static + desc.dynamic_shared_bytes <= SHARED_PER_BLOCK_LIMIT
    assert static == desc.shared_bytes
    if ptxas_available():
        assert out["ptxas"][desc.kernel_name]["shared_bytes"] == static  # ptxas agrees with the PTX read


PTX = """
.shared .align 16 .b8 k_sA[41000];
.shared .align 16 .b8 k_sB[9000];
.shared .align 4 .f32 k_c;
.visible .entry k(
  .param .u64 k_param_0
)
{
  st.shared.b32 [k_sA], %r1;
  st.shared.b32 [k_sB+4], %r1;
  ld.shared.b32 %r2, [k_c];
}
.visible .entry small(
)
{
  ld.shared.b32 %r2, [k_c];
}
"""


def test_static_shared_bytes_read_from_ptx():
    assert static_shared_bytes(PTX) == {"k": 41008 + 9000 + 4, "small": 4}  # k_sB aligned to 16


def test_over_the_limit_or_understated_is_refused():
    def desc(name, static, dynamic=0):
        return KernelLaunch(name, "m", (1, 1, 1), (128, 1, 1), static, dynamic_shared_bytes=dynamic)

    with pytest.raises(ScanWeaverValueError, match=r"kernel k needs 50012 bytes of shared memory per block"):
        check_shared_memory({"m": PTX}, [desc("k", 50012)])
    with pytest.raises(ScanWeaverValueError, match=r"4 static \+ 49152 dynamic"):
        check_shared_memory({"m": PTX}, [desc("small", 4, 49152)])
    with pytest.raises(ScanWeaverValueError, match="says 0 bytes .* PTX declares 4"):
        check_shared_memory({"m": PTX}, [desc("small", 0)])
    assert check_shared_memory({"m": PTX}, [desc("small", 4)]) == {"small": {"static": 4, "dynamic": 0}}
