"""16-byte vector loads and stores in the full tiles of the generic `scan.scan` kernels
(`scan_gpu.py`, and the chunk kernel of `scan_time_blocks.py`), the last partial tile on
the guarded scalar path: the thread-block simulator against the sequential oracle, with
the vector accesses counted (the simulator refuses a misaligned one)."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from test_scan_gpu import inputs, scan_text

BS, IPT = 8, 4  # 32-step tiles; a thread's 4 steps are one 16-byte vector of i32/f32


def run(name, shape, reverse=False, *, time_blocks="never", chunk_tiles=1, in_place=False, bs=BS, ipt=IPT):
    """Simulated outputs == the oracle's (bit for bit for integers); returns the stats."""
    text = scan_text(name, shape, len(shape) - 1, reverse, in_place=in_place)
    xs = inputs(name, shape)
    args = xs if in_place else xs + [np.full_like(x, 77) for x in xs]
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(text, "f", *ref)
    m = parse_ir(text)
    ScanToGpu(block_size=bs, items_per_thread=ipt, time_blocks=time_blocks, chunk_tiles=chunk_tiles).apply(Context(), m)
    stats: list = []
    simulate_launch(m, "f", *got, stats=stats)
    for r, g in zip(ref, got):
        if g.dtype.kind == "f" and name in ("cumsum_f32", "affine_pair_f32"):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, r)
    return stats


def vector_accesses(stats) -> int:
    return sum(s.get("vector_accesses", 0) for s in stats)


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("length", [0, 1, 31, 33, 64, 65, 100])
def test_lengths_around_tiles(length, reverse):
    stats = run("affine_pair_i32", (2, length), reverse)
    full_tiles = length // (BS * IPT) if length % 4 == 0 else 0  # rows of whole vectors only
    # 2 rows x full tiles x 8 threads x (2 loads + 2 stores) of one vector each
    assert vector_accesses(stats) == 2 * full_tiles * BS * 4


@pytest.mark.parametrize("name", ["cumsum_i32", "cummax_i32", "first_i64", "argmax_f32_i32", "cumsum_f32",
                                  "max_via_scf_if_f64"])
def test_combines(name):
    stats = run(name, (3, 96), reverse=name == "first_i64")
    assert vector_accesses(stats) > 0


def test_in_place_scan():
    stats = run("affine_pair_i32", (2, 64), in_place=True)
    assert vector_accesses(stats) == 2 * 2 * BS * 4


def test_rows_not_a_multiple_of_the_vector_stay_scalar():
    # row length 66: the second row starts 8 bytes past a 16-byte boundary
    assert vector_accesses(run("cumsum_i32", (2, 66))) == 0


def test_one_warp_block():
    # 32 threads: the carry moves by shuffle, no barrier; 2 full tiles of 128 steps
    assert vector_accesses(run("cumsum_i32", (1, 256), bs=32)) == 2 * 32 * 2


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("length", [63, 65, 256])
def test_time_block_chunks(length, reverse):
    stats = run("affine_pair_i32", (1, length), reverse, time_blocks="always", chunk_tiles=2)
    by_kernel = {s["kernel"].rsplit("_", 1)[-1]: s.get("vector_accesses", 0) for s in stats}
    if length == 256:  # 4 chunks of 64: chunks 1..3 get the carry, 16 runs of 4 steps each
        assert by_kernel["carry"] == 3 * 16 * 2 * 2  # 2 outputs, a load and a store each
        assert vector_accesses(stats) > by_kernel["carry"]
    else:  # rows of 63 or 65 steps: not whole vectors
        assert vector_accesses(stats) == 0
