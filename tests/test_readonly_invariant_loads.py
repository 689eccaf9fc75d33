"""Loads through read-only kernel parameters marked `invariant` (`!invariant.load`,
`toolchain/readonly_params.mark_readonly_loads_invariant`), so NVPTX keeps `ld.global.nc`
on addresses built along long chains of `getelementptr` (the selective scan's rows of
B and C, one from the previous), where its own look-through stops after 6 steps."""

from __future__ import annotations

import re

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


def _scalar_loads(m) -> tuple[int, int]:
    """(plain, .nc) scalar global loads in the PTX of `m`."""
    from scanweaver.toolchain.gpu_export import export_gpu

    (ptx,) = export_gpu(m, chip="sm_90")["ptx"].values()
    loads = re.findall(r"\bld\.global(\.nc)?(\.v4)?\.[bf]32\b", ptx)
    return sum(1 for nc, v in loads if not nc and not v), sum(1 for nc, v in loads if nc and not v)


def test_selective_scan_scalar_loads_all_read_only(monkeypatch):
    """N = 16 (16 rows of B and C), dynamic shapes as the runtime builds it: with the
    marks every scalar global load of the kernel is `ld.global.nc`; without them some of
    the last rows' are not."""
    m = gk._lower(gk.case_ir("selective_N16_8x1536x2048", 64), small=False)
    plain, nc = _scalar_loads(m)
    assert plain == 0 and nc > 0
    monkeypatch.setattr(rp, "mark_readonly_loads_invariant", lambda text: text)
    plain, _ = _scalar_loads(m)
    assert plain > 0
