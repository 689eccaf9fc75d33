"""Warp-shuffle in-tile scans in the `scan.recurrence` kernels (rewrites/recurrence_gpu.py,
the fused one-block-per-channel kernel, and the chunk kernel of
rewrites/recurrence_time_blocks.py): several warps per block (2 barriers per tile),
in the thread-block simulator (lockstep warps at each shuffle, shared-memory races,
barrier divergence) against the interpreter on the original loops."""

from __future__ import annotations

import numpy as np
import pytest
from test_recurrence_gpu import check, lowered, ssm_args
from xdsl.dialects import gpu

from scanweaver.dialects.gpu_shuffle import ShuffleOp
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.workloads import loops

WARPS2 = dict(block_size=64, items_per_thread=1)  # tile = 64 steps, two warps


def _ema_args(rng, C, L, dtype=np.float32):
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)
        x, al, h0 = (rng.integers(info.min, info.max, s, dtype=dtype, endpoint=True) for s in [(C, L), (C,), (C,)])
    else:
        x = rng.uniform(-1, 1, (C, L)).astype(dtype)
        al = rng.uniform(0.5, 1.0, C).astype(dtype)
        h0 = rng.uniform(-1, 1, C).astype(dtype)
    return [x, al, h0, np.zeros((C, L), dtype), np.zeros(C, dtype)]


@pytest.mark.parametrize("L", [0, 1, 2, 63, 64, 65, 129])
def test_ema_h0_final_lengths_around_tiles(L):
    """h0 in, hT out (= h0 at L = 0); lengths 0, 1, 2^k +- 1 and tile boundaries."""
    args = _ema_args(np.random.default_rng(L), 2, L)
    check(loops.ema_loops(2, L), "ema", args, **WARPS2)


@pytest.mark.parametrize("L", [65, 150])
def test_discounted_return_reverse_over_warps(L):
    """Reversed time (G[c, L-1-t]) and the state in memory (initial value in, last out)."""
    rng = np.random.default_rng(L)
    args = [rng.uniform(-1, 1, (2, L)).astype(np.float32), rng.uniform(0.5, 1.0, 2).astype(np.float32),
            rng.uniform(-1, 1, 2).astype(np.float32), np.zeros((2, L), np.float32)]
    check(loops.discounted_return_loops(2, L), "discounted_return", args, block_size=64, items_per_thread=1)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_ema_bit_exact_over_warps(dtype):
    """Wrapping integer states: every association gives the loop's bits."""
    args = _ema_args(np.random.default_rng(5), 2, 140, dtype)
    check(loops.ema_loops(2, 140, "i32" if dtype == np.int32 else "i64"), "ema", args, rtol=0, atol=0,
          block_size=128, items_per_thread=1)


@pytest.mark.parametrize("bc", ["constant", "shared", "grouped"])
def test_selective_scan_every_bc_layout_over_warps(bc):
    opts = dict(bc=bc, groups=2, return_last_state=True)
    args = ssm_args(np.random.default_rng(3), 1, 2, 100, 3, **opts)
    check(loops.selective_scan_loops(1, 2, 100, 3, **opts), "selective_scan", args, **WARPS2)


@pytest.mark.parametrize("N", [16, 32, 64])
def test_selective_scan_state_sizes_over_warps(N):
    """N = 16, 32 (warp shuffles) and 64 (the sweep: aggregates staged in shared memory)
    over two tiles of two warps."""
    opts = dict(bc="shared", return_last_state=True)
    args = ssm_args(np.random.default_rng(N), 1, 1, 70, N, **opts)
    m = check(loops.selective_scan_loops(1, 1, 70, N, **opts), "selective_scan", args, **WARPS2)
    (desc,) = launch_descriptions(m)
    assert ("warp-shuffle scans" in desc.notes) == (N <= 32), desc.notes


def test_overflowing_tiles_take_the_loops_order():
    """EMA with |alpha| = 1e30 from h0 = 0, x = 0 but at the last step: the loop's states
    are 0 then one finite value, while the tiles' products of alpha overflow (inf * 0 =
    NaN in the tree): flagged tiles replay thread after thread, bit for bit."""
    L = 150
    x = np.zeros((2, L), np.float32)
    x[:, -1] = 0.5
    al = np.array([1e30, -1e30], np.float32)
    args = [x, al, np.zeros(2, np.float32), np.zeros((2, L), np.float32), np.zeros(2, np.float32)]
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    original, m = lowered(loops.ema_loops(2, L), **WARPS2)
    with np.errstate(all="ignore"):
        run_function(original, "ema", *ref)
        simulate_launch(m, "ema", *got)
    assert np.isfinite(ref[3]).all() and (ref[3][:, -1] != 0).all()
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r)


def test_nan_input_propagates_like_the_loop():
    L = 200
    args = _ema_args(np.random.default_rng(9), 1, L)
    args[0][0, 90] = np.nan
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    original, m = lowered(loops.ema_loops(1, L), **WARPS2)
    with np.errstate(all="ignore"):
        run_function(original, "ema", *ref)
        simulate_launch(m, "ema", *got)
    np.testing.assert_array_equal(np.isnan(got[3]), np.isnan(ref[3]))
    np.testing.assert_allclose(got[3][0, :90], ref[3][0, :90], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("bs", [32, 128])
def test_shuffles_and_barriers_in_the_kernel(bs):
    """Shuffles replace the sweep: per tile 2 barriers with several warps (warp totals,
    next carry), none in one warp; plus the initial carry, the fallback's loop, the
    epilogue (and after the tiles, one warp)."""
    _, m = lowered(loops.selective_scan_loops(1, 2, 64, 16, return_last_state=True), block_size=bs,
                   items_per_thread=4)
    (kernel,) = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    ops = list(kernel.walk())
    barriers = sum(isinstance(o, gpu.BarrierOp) for o in ops)
    shuffles = sum(isinstance(o, ShuffleOp) for o in ops)
    assert barriers == 3 + (2 if bs > 32 else 1)
    # Kogge-Stone over 32 values (5 steps), 5 for the overflow vote, 16 for the prefix,
    # and in one warp 16 for the next carry
    assert shuffles == 5 * 32 + 5 + 16 + (16 if bs == 32 else 0)


@pytest.mark.parametrize("L", [1, 129, 3 * 64 + 1])
def test_time_blocks_chunks_over_warps(L):
    """The chunk kernel of the time blocks (several blocks per channel) with warp scans."""
    from scanweaver.ir import make_context
    from scanweaver.rewrites.raise_affine import RaiseRecurrences
    from scanweaver.rewrites.scan_to_gpu import ScanToGpu
    from xdsl.context import Context

    module = loops.ema_loops(1, L)
    args = _ema_args(np.random.default_rng(L), 1, L)
    ref = [a.copy() for a in args]
    run_function(parse_ir(print_ir(module)), "ema", *ref)
    m = parse_ir(print_ir(module))
    RaiseRecurrences().apply(make_context(), m)
    ScanToGpu(block_size=64, items_per_thread=1, time_blocks="always", chunk_tiles=1).apply(Context(), m)
    got = [a.copy() for a in args]
    simulate_launch(m, "ema", *got, block_order=L)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


# -- 16-byte vector loads and stores of the per-step operands (recurrence_vector_io.py) ---------

VEC = dict(block_size=8, items_per_thread=4)  # tile = 32 steps, runs of one f32 vector


def _vector_ops(m):
    from xdsl.dialects import vector

    kernels = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    loads = [o for k in kernels for o in k.walk() if isinstance(o, vector.LoadOp)]
    stores = [o for k in kernels for o in k.walk() if isinstance(o, vector.StoreOp)]
    return loads, stores


@pytest.mark.parametrize("L", [0, 1, 31, 32, 33, 64, 68, 67])
def test_selective_scan_vector_loads_full_tiles_scalar_last_tile(L):
    """delta, u, z, C[b, n, :] and B[b, n, :] (each of the 4 elements; B into its shared
    stage, read once per tile from N = 4) read and out written by vectors in full tiles;
    the last partial tile and rows whose length is no multiple of 4 (L = 67: every tile)
    take scalars."""
    opts = dict(bc="shared", return_last_state=True)
    args = ssm_args(np.random.default_rng(L), 1, 2, L, 4, **opts)
    original, m = lowered(loops.selective_scan_loops(1, 2, L, 4, **opts), **VEC)
    loads, stores = _vector_ops(m)
    assert len(loads) == 12 and len(stores) == 1  # delta, u (coeffs); u, z, C x 4 (emit); B x 4 (stage); out
    ref, got = [a.copy() for a in args], [a.copy() for a in args]
    run_function(original, "selective_scan", *ref)
    stats: list = []
    simulate_launch(m, "selective_scan", *got, stats=stats)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    full_tiles = L // 32 if L % 4 == 0 else 0
    # 2 channels x full tiles x 8 threads x (12 loads + 1 store)
    assert stats[0]["vector_accesses"] == 2 * full_tiles * 8 * 13


@pytest.mark.parametrize("bc", ["constant", "grouped"])
def test_selective_scan_vector_loads_bc_layouts_and_kept_pairs(bc):
    opts = dict(bc=bc, groups=2, return_last_state=True)
    args = ssm_args(np.random.default_rng(4), 1, 2, 70, 2, **opts)
    for keep in (True, False):
        check(loops.selective_scan_loops(1, 2, 70, 2, **opts), "selective_scan", args, keep_pairs=keep, **VEC)


def test_reversed_index_keeps_scalar_accesses():
    """G[c, L-1-t] is no run of consecutive steps: scalar accesses, same results."""
    L = 70
    rng = np.random.default_rng(L)
    args = [rng.uniform(-1, 1, (2, L)).astype(np.float32), rng.uniform(0.5, 1.0, 2).astype(np.float32),
            rng.uniform(-1, 1, 2).astype(np.float32), np.zeros((2, L), np.float32)]
    m = check(loops.discounted_return_loops(2, L), "discounted_return", args, **VEC)
    assert _vector_ops(m) == ([], [])


@pytest.mark.parametrize("dtype", ["i32", "f64"])
def test_ema_vector_accesses_other_types(dtype):
    """i32 (bit for bit) and f64 (two per vector) runs, h0 in and hT out."""
    L = 69
    npdt = {"i32": np.int32, "f64": np.float64}[dtype]
    args = _ema_args(np.random.default_rng(2), 2, L, npdt)
    tol = dict(rtol=0, atol=0) if dtype == "i32" else dict(rtol=1e-12, atol=1e-14)
    m = check(loops.ema_loops(2, L, dtype), "ema", args, **VEC, **tol)
    loads, stores = _vector_ops(m)
    assert len(loads) == (1 if dtype == "i32" else 2) and len(stores) == (1 if dtype == "i32" else 2)


@pytest.mark.parametrize("L", [1, 64, 100])
def test_time_blocks_vector_loads(L):
    """The reduce and chunk kernels of the time blocks take the step loads too."""
    from scanweaver.ir import make_context
    from scanweaver.rewrites.raise_affine import RaiseRecurrences
    from scanweaver.rewrites.scan_to_gpu import ScanToGpu
    from xdsl.context import Context

    module = loops.ema_loops(1, L)
    args = _ema_args(np.random.default_rng(L), 1, L)
    ref = [a.copy() for a in args]
    run_function(parse_ir(print_ir(module)), "ema", *ref)
    m = parse_ir(print_ir(module))
    RaiseRecurrences().apply(make_context(), m)
    ScanToGpu(block_size=8, items_per_thread=4, time_blocks="always", chunk_tiles=1).apply(Context(), m)
    loads, stores = _vector_ops(m)
    assert len(loads) >= 2 and len(stores) >= 1
    got = [a.copy() for a in args]
    simulate_launch(m, "ema", *got, block_order=L)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("N,vectors", [(4, True), (16, False)])
def test_ptxas_selective_scan_warp_kernels(chip, N, vectors):
    """Through upstream mlir-opt and ptxas: shuffles, 128-bit step accesses where the
    state is small (N = 4), no spills, no stack frame."""
    import re

    from scanweaver.ir import make_context
    from scanweaver.rewrites.blelloch_gpu import ScanToGpu
    from scanweaver.rewrites.raise_affine import RaiseRecurrences
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    module = loops.selective_scan_loops(2, 64, 2048, N, bc="shared", return_last_state=True)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanToGpu(block_size=128, items_per_thread=4, time_blocks="never").apply(ctx, module)
    out = export_gpu(module, chip)
    (ptx,) = out["ptx"].values()
    assert "shfl.sync" in ptx
    # the step outputs by 128-bit stores where vectorised (LLVM may merge other loads,
    # e.g. A[d, 0..3], into vectors by itself, so loads are checked only where expected)
    assert bool(re.search(r"st\.global\.v4\.(f32|b32)", ptx)) == vectors
    if vectors:
        assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", ptx)
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    (info,) = out["ptxas"].values()
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0 and info["stack_bytes"] == 0, info
