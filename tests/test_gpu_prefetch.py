"""Prefetch in the warp-shuffle tiles of the affine time-block kernels (`blelloch_gpu`,
"Prefetch"): the next tile's pairs are loaded at the top of each tile. Chunks of three
tiles with 16-byte vectors (bs 8, 4 items), so that the prefetched tile is a vector
tile, a guarded partial one, or past the end; simulator against the interpreter."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.workloads.scans import affine_scan_ir
from test_gpu_time_blocks import affine_args

BS, IPT, TILES = 8, 4, 3  # 32-step tiles, 96-step chunks


def run(text, args):
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    m = parse_ir(text)
    ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks="always", chunk_tiles=TILES).apply(Context(), m)
    got = [x.copy() for x in args]
    stats: list = []
    simulate_launch(m, "f", *got, stats=stats)
    return ref[-2:], got[-2:], stats


@pytest.mark.parametrize("length", [0, 1, 97, 128, 193])
@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
def test_i32_bit_exact(length, reverse):
    text = affine_scan_ir(("?", "?"), 1, "i32", "i32", init=True, final=True, reverse=reverse)
    (h_ref, f_ref), (h, f), stats = run(text, affine_args((1, length), np.int32, np.int32, True, seed=length))
    np.testing.assert_array_equal(h, h_ref)
    np.testing.assert_array_equal(f, f_ref)
    if length == 128:  # whole vectors: the chunk kernel's full tiles load and store by them
        assert any(s.get("vector_accesses", 0) for s in stats)


@pytest.mark.parametrize("length", [64, 289])
def test_f32_init_final(length):
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    (h_ref, f_ref), (h, f), _ = run(text, affine_args((1, length), np.float32, np.float32, True, seed=length))
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(f, f_ref, rtol=2e-5, atol=2e-6)
