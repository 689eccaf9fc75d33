"""B and C of the selective scan loaded once per tile, by 16-byte vectors
(rewrites/recurrence_vector_io.py, element runs; rewrites/recurrence_gpu.py, the shared
stage of B): the thread-block simulator against the interpreter on the original loops,
the bytes the kernel reads, ptxas for sm_80 and sm_90, and the FileCheck file
filecheck/gpu/recurrence_element_loads.mlir run against broken kernels."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_recurrence_gpu import check, lowered, ssm_args

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.rewrites import recurrence_gpu as rg
from scanweaver.rewrites import recurrence_vector_io as vio
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.workloads import loops

VEC = dict(block_size=8, items_per_thread=4)  # tile = 32 steps, one f32 vector per thread and row
TILE = 32


def _selective(N, L, **opts):
    opts = dict(dict(bc="shared", return_last_state=True), **opts)
    return loops.selective_scan_loops(1, 1, L, N, **opts), ssm_args(np.random.default_rng(N * 1000 + L), 1, 1, L, N,
                                                                    **opts)


LENGTHS = [0, 1, TILE - 1, TILE, TILE + 1, 3 * TILE + 4]


CASES = [(9, L) for L in LENGTHS] + [(N, L) for N in (1, 4, 16) for L in (0, TILE + 1, 3 * TILE + 4)]


@pytest.mark.parametrize("N,L", CASES)
def test_selective_scan_element_loads_lengths(N, L):
    """Lengths 0, 1, tile - 1, tile, tile + 1 and several tiles (the last partial: its
    guarded scalar loads, also staged); N = 9 is odd; N = 4 is staged too; N = 1 keeps
    its pairs (B not needed after phase 1)."""
    module, args = _selective(N, L)
    m = check(module, "selective_scan", args, **VEC)
    (desc,) = launch_descriptions(m)
    assert "warp-shuffle scans" in desc.notes


@pytest.mark.parametrize("L", [0, 9])
def test_selective_scan_n64_unchanged(L):
    """N = 64: one item per thread (no vectors), the sweep; still the loop's results."""
    module, args = _selective(64, L)
    check(module, "selective_scan", args, block_size=8, items_per_thread=4)


VARIANTS = {
    "no_D_no_softplus": dict(with_D=False, delta_softplus=False),
    "no_z_no_bias": dict(with_z=False, with_delta_bias=False),
    "grouped": dict(bc="grouped", groups=2),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_selective_scan_element_loads_variants(name):
    """D, z, delta_bias, softplus off (the other tests have them on); B/C per group of
    channels (grouped)."""
    opts = dict(dict(bc="shared", return_last_state=True), **VARIANTS[name])
    L, N = 2 * TILE + 8, 9
    args = ssm_args(np.random.default_rng(7), 1, 2, L, N, **opts)
    check(loops.selective_scan_loops(1, 2, L, N, **opts), "selective_scan", args, **VEC)


def _load_bytes(module, args, **kw):
    _, m = lowered(module, **kw)
    stats: list = []
    simulate_launch(m, "selective_scan", *[a.copy() for a in args], stats=stats)
    return stats[0]["load_bytes"], stats[0]["vector_accesses"]


@pytest.mark.parametrize("L", [2 * TILE, 2 * TILE + 4, 2 * TILE + 5])
def test_b_read_from_global_memory_once(monkeypatch, L):
    """The stage saves exactly one read of B[b, n, t] per element and step (4 N bytes
    per step; full and partial tiles alike), and the full tiles read B and C by
    vectors: per thread and full tile 2 N of them, plus delta, u (coeffs), u, z (emit)
    and out stored only where the state is small (N <= 4, so not here)."""
    N = 9
    module, args = _selective(N, L)
    staged, vectors = _load_bytes(module, args, **VEC)
    monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 0)
    again, vectors_again = _load_bytes(module, args, **VEC)
    assert again - staged == 4 * N * L
    threads, full_tiles = VEC["block_size"], L // TILE if L % 4 == 0 else 0  # rows of whole vectors only
    assert vectors == threads * full_tiles * 2 * N
    assert vectors_again == threads * full_tiles * N  # C only: B keeps its scalar loads


def test_overflowing_tile_replays_from_the_stage():
    """exp(delta * A) of A = 40 overflows the tile's products while u = 0 but at the last
    step keeps the loop's states finite (0, then one value): the flagged tile takes the
    loop's order thread after thread, its pairs from the staged B."""
    check_overflowing_tile(9, TILE)


def check_overflowing_tile(N: int, L: int) -> None:
    """The simulator against the interpreter on a tile whose products overflow (A = 40)
    while the loop's states stay finite (u = 0 but at the last step)."""
    module, args = _selective(N, L, with_delta_bias=False, delta_softplus=False)
    u, delta, A = args[0], args[1], args[2]
    u[:] = 0
    u[..., -1] = 0.5
    delta[:] = 1.0
    A[:] = 40.0
    _, m = lowered(module, **VEC)
    ref, got = [a.copy() for a in args], [a.copy() for a in args]
    run_function(parse(module), "selective_scan", *ref)
    simulate_launch(m, "selective_scan", *got)
    assert np.all(np.isfinite(ref[-2]))
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def parse(module):
    from scanweaver.ir import parse_ir, print_ir

    return parse_ir(print_ir(module))


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_selective_n16_vectors_no_spills(chip):
    """The benchmark's N = 16 kernel (runtime/cuda_scan.py's build, 8 x 1536 x 2048): B and
    C by 128-bit loads (16 + 16), no spill, no stack frame, at most 128 registers (the
    budget before B and C were vectorised)."""
    from scanweaver.bench import gpu_kernels as gk
    from scanweaver.runtime.cuda_scan import selective_scan_ir
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    b, d, n, length = 8, 1536, 16, 2048
    shapes = {"u": (b, d, length), "delta": (b, d, length), "A": (d, n), "B": (b, n, length),
              "C": (b, n, length), "D": (d,), "z": (b, d, length), "delta_bias": (d,)}
    ir = selective_scan_ir(shapes, {"delta_softplus": True, "return_last_state": True})
    out = export_gpu(gk._lower(ir, small=False), chip=chip)
    (ptx,) = out["ptx"].values()
    assert len(re.findall(r"ld\.global(?:\.nc)?\.v4\.(?:f32|b32)", ptx)) >= 2 * n
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    (info,) = out["ptxas"].values()
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0 and info["stack_bytes"] == 0, info
    assert info["registers"] <= 128, info


# -- the FileCheck file fails on broken kernels -------------------------------------------------

FILECHECK_FILE = Path(__file__).resolve().parent.parent / "filecheck" / "gpu" / "recurrence_element_loads.mlir"


def _filecheck_rc(path: Path = FILECHECK_FILE, items_per_thread: int = 4) -> int:
    """FileCheck's exit status on `path` lowered by ScanToGpu (block 8): 0 when every check holds."""
    from scanweaver.ir import make_context, parse_ir, print_ir
    from scanweaver.rewrites.blelloch_gpu import ScanToGpu

    tool = shutil.which("filecheck") or str(Path(sys.executable).parent / "filecheck")
    m = parse_ir(path.read_text())
    ScanToGpu(block_size=8, items_per_thread=items_per_thread).apply(make_context(), m)
    return subprocess.run([tool, str(path)], input=print_ir(m), text=True, capture_output=True).returncode


def _no_c_runs(find):
    def patched(*a, **k):
        b, _, _ = find(*a, **k)
        return b, [], set()

    return patched


def _replay_reloads(b_values):
    def patched(self, ie, j):
        return None if inspect.stack()[1].function == "replay" else b_values(self, ie, j)

    return patched


def _reloads(step_pairs, where: str):
    def patched(self, ie, k, j=None, staged=False, from_stage=False):
        if where == "fallback" and staged or where == "phase 1" and from_stage:
            return step_pairs(self, ie, k)  # the loads cloned again
        return step_pairs(self, ie, k, j, staged, from_stage)

    return patched


BROKEN = {
    "no stage": lambda mp: mp.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 0),
    "no element vectors": lambda mp: mp.setattr(rg, "VECTOR_ELEMENT_IO", False),
    "C by scalars": lambda mp: mp.setattr(vio, "find_element_runs", _no_c_runs(vio.find_element_runs)),
    "replay reloads B": lambda mp: mp.setattr(rg._KernelGen, "_b_values", _replay_reloads(rg._KernelGen._b_values)),
    "fallback reloads B": lambda mp: mp.setattr(rg._KernelGen, "_step_pairs",
                                                _reloads(rg._KernelGen._step_pairs, "fallback")),
    "phase 1 reloads B": lambda mp: mp.setattr(rg._KernelGen, "_step_pairs",
                                               _reloads(rg._KernelGen._step_pairs, "phase 1")),
}


def test_filecheck_file_passes_on_the_kernel():
    assert _filecheck_rc() == 0


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_filecheck_file_fails_on_a_broken_kernel(monkeypatch, name):
    BROKEN[name](monkeypatch)
    assert _filecheck_rc() != 0, name


@pytest.mark.parametrize("L", [2 * 2 * TILE, 3 * 2 * TILE + 4])
def test_time_block_chunk_kernel_element_loads(L):
    """One long channel in time blocks (two-tile chunks, several blocks run out of
    order): the chunk kernel takes the B vectors into its stage and the C vectors; the
    reduce kernel the B vectors only (used directly: no replay, no emit)."""
    from xdsl.context import Context
    from xdsl.dialects import gpu, memref, vector

    from scanweaver.ir import make_context
    from scanweaver.rewrites.raise_affine import RaiseRecurrences
    from scanweaver.rewrites.scan_to_gpu import ScanToGpu

    module, args = _selective(9, L)
    ref, got = [a.copy() for a in args], [a.copy() for a in args]
    run_function(parse(module), "selective_scan", *ref)
    m = parse(module)
    RaiseRecurrences().apply(make_context(), m)
    ScanToGpu(time_blocks="always", chunk_tiles=2, **VEC).apply(Context(), m)
    kernels = {k.sym_name.data: k for k in m.walk() if isinstance(k, gpu.FuncOp)}
    chunks = next(k for n, k in kernels.items() if n.endswith("_chunks"))
    reduce = next(k for n, k in kernels.items() if n.endswith("_reduce"))
    assert any(isinstance(o, memref.GetGlobalOp) and str(o.properties["name"]).endswith("_sS")
               for o in chunks.walk())
    assert sum(isinstance(o, vector.LoadOp) for o in chunks.walk()) == 2 * 9
    assert sum(isinstance(o, vector.LoadOp) for o in reduce.walk()) == 9
    simulate_launch(m, "selective_scan", *got, block_order=L)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)
