"""B of the selective scan staged in shared memory where not all of it fits (the first
elements that do; N = 24, 32 at 128 threads x 4 items), and staged element by element
where no 16-byte vector divides the items (`recurrence_gpu._stage_element_loads`,
`recurrence_vector_io`, runs of width 1): the thread-block simulator against the
interpreter on the original loops, and the bytes the kernel reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_recurrence_element_loads import TILE, VEC, _filecheck_rc, _load_bytes, _reloads, _replay_reloads, _selective, check_overflowing_tile
from test_recurrence_gpu import check

from scanweaver.rewrites import recurrence_gpu as rg
from scanweaver.rewrites import recurrence_vector_io as vio


def _budget_for(N: int, staged: int, ipt: int = VEC["items_per_thread"], bs: int = VEC["block_size"]) -> int:
    """A shared budget that fits the carry (one warp: no warp totals) and `staged` runs of B."""
    carry = -(-4 * N // 16) * 16
    return carry + staged * ipt * bs * 4 + 4 * ipt * bs - 1


@pytest.mark.parametrize("N,L,staged", [(24, 0, 24), (24, TILE + 1, 24), (24, 3 * TILE + 4, 24),
                                        (24, 1, 10), (24, TILE - 1, 10), (24, TILE, 10), (24, 3 * TILE + 4, 10),
                                        (32, 3 * TILE + 4, 32), (32, TILE + 1, 7)])
def test_prefix_stage_lengths(monkeypatch, N, L, staged):
    """All of B staged, or only its first `staged` elements (the rest read again by the
    replay): lengths 0, 1, tile - 1, tile, tile + 1, several tiles."""
    if staged < N:
        monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", _budget_for(N, staged))
    module, args = _selective(N, L)
    check(module, "selective_scan", args, **VEC)


def test_prefix_stage_saves_one_read_per_staged_element(monkeypatch):
    """Each staged element saves exactly one read of B[b, n, t] per step (4 bytes); C
    keeps its scalar loads beyond 16 elements, so only B comes by vectors (full tiles)."""
    N, L = 24, 2 * TILE + 4
    module, args = _selective(N, L)
    monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 0)
    again, none = _load_bytes(module, args, **VEC)
    assert none == 0
    for staged in (10, 24):
        monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", _budget_for(N, staged))
        got, vectors = _load_bytes(module, args, **VEC)
        assert again - got == 4 * staged * L
        assert vectors == VEC["block_size"] * (L // TILE) * staged


def test_prefix_stage_variants_and_overflow(monkeypatch):
    """Grouped B/C with D, z off; then a tile whose products overflow (exp(40 delta)),
    which replays thread after thread from the partly staged B."""
    N = 24
    monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", _budget_for(N, 10))
    from test_recurrence_gpu import ssm_args

    from scanweaver.workloads import loops

    opts = dict(bc="grouped", groups=2, with_D=False, with_z=False, return_last_state=True)
    L = 2 * TILE + 8
    args = ssm_args(np.random.default_rng(3), 1, 2, L, N, **opts)
    check(loops.selective_scan_loops(1, 2, L, N, **opts), "selective_scan", args, **VEC)

    check_overflowing_tile(N, TILE)


@pytest.mark.parametrize("L", [0, 7, 8, 3 * 16 + 5])
def test_stage_by_elements_where_no_vector_divides_the_items(L):
    """Two items per thread (an f32 vector needs 4): B is staged element by element
    (unguarded in a full tile), still once per step and element."""
    N, kw = 9, dict(block_size=8, items_per_thread=2)
    module, args = _selective(N, L)
    check(module, "selective_scan", args, **kw)


def test_stage_by_elements_saves_one_read(monkeypatch):
    N, L, kw = 9, 2 * 16 + 5, dict(block_size=8, items_per_thread=2)
    module, args = _selective(N, L)
    got, vectors = _load_bytes(module, args, **kw)
    monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 0)
    again, _ = _load_bytes(module, args, **kw)
    assert again - got == 4 * N * L and vectors == 0


def test_n64_stage_by_elements_when_allowed(monkeypatch):
    """N = 64 (one item per thread, the sweep) is staged by default where A is in the
    block's shared copy (`STAGE_MAX_ELEMENTS_SHARED_COPY`), else not (registers,
    `STAGE_MAX_ELEMENTS`); allowed, its first elements are staged element by element
    and the results are still the loop's."""
    N, L = 64, 9
    monkeypatch.setattr(rg, "STAGE_MAX_ELEMENTS", 64)
    module, args = _selective(N, L)
    base, _ = _load_bytes(module, args, block_size=8, items_per_thread=4)
    monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 0)
    again, _ = _load_bytes(module, args, block_size=8, items_per_thread=4)
    assert again - base == 4 * N * L
    monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 48 * 1024)
    check(module, "selective_scan", args, block_size=8, items_per_thread=4)


# -- filecheck/gpu/recurrence_element_stage_scalar.mlir fails on broken kernels ------------------

STAGE_FILE = Path(__file__).resolve().parent.parent / "filecheck" / "gpu" / "recurrence_element_stage_scalar.mlir"


def _stage_filecheck_rc() -> int:
    return _filecheck_rc(STAGE_FILE, items_per_thread=2)


def _no_scalar_runs(find):
    def patched(*a, scalar=False, **k):
        return find(*a, **k)

    return patched


STAGE_BROKEN = {
    "no stage": lambda mp: mp.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 0),
    "no runs of width 1": lambda mp: mp.setattr(vio, "_element_run_loads", _no_scalar_runs(vio._element_run_loads)),
    "replay reloads B": lambda mp: mp.setattr(rg._KernelGen, "_b_values", _replay_reloads(rg._KernelGen._b_values)),
    "phase 1 reloads B": lambda mp: mp.setattr(rg._KernelGen, "_step_pairs",
                                               _reloads(rg._KernelGen._step_pairs, "phase 1")),
}


def test_stage_filecheck_passes_on_the_kernel():
    assert _stage_filecheck_rc() == 0


@pytest.mark.parametrize("name", sorted(STAGE_BROKEN))
def test_stage_filecheck_fails_on_a_broken_kernel(monkeypatch, name):
    STAGE_BROKEN[name](monkeypatch)
    assert _stage_filecheck_rc() != 0, name


# -- small states: N = 4 to 6 staged (`STAGE_MIN_ELEMENTS`), N = 3 and 7 not -------------------


@pytest.mark.parametrize("N,staged", [(3, False), (4, True), (5, True), (6, True), (7, False)])
def test_small_states_read_b_once_where_staged(monkeypatch, N, staged):
    """The simulator against the interpreter (a partial last tile), then the bytes read:
    staged, each element of B leaves global memory once per step (4 N bytes saved per
    step against no stage); N = 3 and 7 keep B's second read (registers)."""
    L = 2 * TILE + 4
    module, args = _selective(N, L)
    check(module, "selective_scan", args, **VEC)
    got, _ = _load_bytes(module, args, **VEC)
    monkeypatch.setattr(rg, "STAGE_ELEMENT_LOADS_BUDGET", 0)
    again, _ = _load_bytes(module, args, **VEC)
    assert again - got == (4 * N * L if staged else 0)


def test_small_state_overflowing_tile_replays_from_the_stage():
    check_overflowing_tile(4, TILE)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_selective_n4_staged_within_64_registers(chip):
    """The benchmark's N = 4 kernel (128 x 4) with B staged: at most 64 registers (8
    resident blocks, occupancy 0.50, as unstaged), no spill, the stage in shared memory
    (4 runs x 4 items x 128 threads x 4 bytes)."""
    from scanweaver.bench import gpu_kernels as gk
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    out = export_gpu(gk._lower(gk.case_ir("selective_N4_8x1536x2048", "big"), small=False), chip=chip)
    (info,) = out["ptxas"].values()
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0 and info["stack_bytes"] == 0, info
    assert info["registers"] <= 64, info
    assert info["shared_bytes"] >= 4 * 4 * 128 * 4, info
