"""The per-kernel table (`python -m scanweaver.bench.gpu_kernels`): its figures from PTX
text and sm_90 limits, and the committed KERNELS.md rendered from the committed json."""

from __future__ import annotations

import json
from pathlib import Path

from scanweaver.bench.gpu_kernels import markdown, occupancy, ptx_figures, ptx_kernel_text

GPU = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"

PTX = """
.visible .entry k1(
  ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd1];
  ld.global.f32 %f5, [%rd2];
  st.global.v2.b64 [%rd3], {%rd4, %rd5};
  bar.sync 0;
  shfl.sync.up.b32 %r1, %r2, 1, 0, -1;
  barrier.sync 0;
}
.visible .entry k2(
  st.global.b32 [%rd1], %r1;
}
"""


def test_ptx_figures_by_kernel():
    k1 = ptx_figures(ptx_kernel_text(PTX, "k1"))
    assert k1 == {"global_loads": {"128b.nc": 1, "32b": 1}, "global_stores": {"128b": 1}, "barriers": 2, "shuffles": 1}
    assert ptx_figures(ptx_kernel_text(PTX, "k2"))["global_stores"] == {"32b": 1}


def test_occupancy_on_sm90_limits():
    assert occupancy(32, 1028, 128) == 1.0  # 16 blocks of 4 warps
    assert occupancy(96, 16448, 128) == 5 * 4 / 64  # registers: 21 warps -> 5 blocks
    assert occupancy(32, 100 * 1024, 128) == 2 * 4 / 64  # shared memory: 2 blocks
    assert occupancy(255, 0, 1024) == 0.0  # does not fit at all


def test_committed_table_is_the_rendered_json():
    doc = json.loads((GPU / "kernels.json").read_text())
    assert (GPU / "KERNELS.md").read_text() == markdown(doc["before"], doc["after"], doc["before_ref"])
    after = doc["after"]
    assert [r["kernel"].rsplit("_", 1)[-1] for r in after["affine_f32_1x2p26"]] == ["reduce", "carries", "chunks"]
    assert all(r["spill_bytes"] == 0 for rows in after.values() for r in rows)
