"""Prefetch of the next tile in the warp-shuffle tiles of the generic `scan.scan` kernels
(`scan_gpu.py`, one block per channel and the time-block chunk kernel of
`scan_time_blocks.py`) and of the `scan.linear_recurrence` kernel (`linear_gpu.py`): the
tile loop carries the next tile's elements, loaded before the tile's first shuffle.
Simulator against the interpreter at lengths 0, 1, tile - 1, tile, tile + 1 and several
tiles / several blocks, forward and reverse, integers bit for bit, and prefetch on and
off giving the same bits. (init/final of seeded scans: tests/test_gpu_seeded_*.py run
with prefetch on, the default.)"""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects import gpu, memref, scf, vector

from scanweaver.dialects.gpu_shuffle import ShuffleOp
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites import linear_gpu, scan_gpu
from scanweaver.rewrites.scan_to_gpu import ScanToGpu
from scanweaver.workloads import loops
from test_scan_gpu import inputs, scan_text

BS, IPT = 8, 4
TILE = BS * IPT


def _lower(text, time_blocks="never", chunk_tiles=1, bs=BS, ipt=IPT):
    m = parse_ir(text)
    ScanToGpu(block_size=bs, items_per_thread=ipt, time_blocks=time_blocks, chunk_tiles=chunk_tiles).apply(Context(), m)
    return m


def _tile_loops(m) -> list[scf.ForOp]:
    """The tile loops of the kernels: scf.for ops whose body issues shuffles."""
    kernels = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    return [f for k in kernels for f in k.walk() if isinstance(f, scf.ForOp)
            and any(isinstance(o, ShuffleOp) for o in f.body.block.walk())
            and f.parent_op() is k]


def _loads_before_first_shuffle(loop: scf.ForOp, ref_args) -> bool:
    """Some top-level op of the tile body before its first shuffle loads from `ref_args`."""
    for op in loop.body.block.ops:
        if any(isinstance(o, ShuffleOp) for o in op.walk()):
            return False
        for o in op.walk():
            if isinstance(o, (memref.LoadOp, vector.LoadOp)) and o.operands[0] in ref_args:
                return True
    return False


def _run(name, shape, reverse, *, time_blocks="never", chunk_tiles=1, prefetch=True, monkeypatch=None):
    monkeypatch.setattr(scan_gpu, "PREFETCH_ONE_BLOCK", prefetch)
    monkeypatch.setattr(scan_gpu, "PREFETCH_TIME_BLOCKS", prefetch)
    text = scan_text(name, shape, len(shape) - 1, reverse)
    xs = inputs(name, shape, seed=shape[-1])
    args = xs + [np.full_like(x, 77) for x in xs]
    ref = [a.copy() for a in args]
    run_function(text, "f", *ref)
    m = _lower(text, time_blocks, chunk_tiles)
    got = [a.copy() for a in args]
    simulate_launch(m, "f", *got)
    for r, g in zip(ref, got):
        if name == "cumsum_f32":
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, r)
    return m, got


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("length", [0, 1, TILE - 1, TILE, TILE + 1, 3 * TILE + 5])
def test_one_block_per_channel(length, reverse, monkeypatch):
    m, _ = _run("argmax_f32_i32", (2, length), reverse, monkeypatch=monkeypatch)
    (loop,) = _tile_loops(m)
    assert len(loop.iter_args) == 2 * IPT  # the next tile's (value, index) pairs
    kernel = loop.parent_op()
    assert _loads_before_first_shuffle(loop, set(kernel.body.block.args[:2]))


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("length", [2 * TILE - 1, 2 * TILE, 4 * TILE + 1, 6 * TILE + 7])
def test_time_blocks_several_blocks(length, reverse, monkeypatch):
    """Chunks of two tiles: several blocks per channel, and the prefetched tile of a
    chunk's last tile lies past the chunk (guarded: it loads nothing)."""
    m, _ = _run("cumsum_i32", (1, length), reverse, time_blocks="always", chunk_tiles=2, monkeypatch=monkeypatch)
    chunk_loop = next(f for f in _tile_loops(m) if "_tb_" in f.parent_op().sym_name.data)
    assert len(chunk_loop.iter_args) == IPT


@pytest.mark.parametrize("name", ["cumsum_i32", "first_i64", "cumsum_f32", "max_via_scf_if_f64"])
def test_prefetch_on_and_off_agree(name, monkeypatch):
    shape = (2, 3 * TILE + 4)
    _, on = _run(name, shape, False, prefetch=True, monkeypatch=monkeypatch)
    m_off, off = _run(name, shape, False, prefetch=False, monkeypatch=monkeypatch)
    assert all(not f.iter_args for f in _tile_loops(m_off))
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)


def test_one_warp_block(monkeypatch):
    """A block of one warp moves the carry by shuffle (no barrier): prefetch too."""
    text = scan_text("cumsum_i32", (1, 300), 1)
    xs = inputs("cumsum_i32", (1, 300))
    args = xs + [np.zeros_like(x) for x in xs]
    ref, got = [a.copy() for a in args], [a.copy() for a in args]
    run_function(text, "f", *ref)
    m = _lower(text, bs=32, ipt=4)
    (loop,) = _tile_loops(m)
    assert len(loop.iter_args) == 4
    simulate_launch(m, "f", *got)
    np.testing.assert_array_equal(got[1], ref[1])


# -------------------------------------------------------------- scan.linear_recurrence


def _iir2(L, dtype, prefetch, monkeypatch, bs=BS, ipt=IPT):
    from test_linear_gpu import iir2_args, lowered

    monkeypatch.setattr(linear_gpu, "PREFETCH", prefetch)
    text, m = lowered(loops.iir2_loops(2, L, dtype), block_size=bs, items_per_thread=ipt)
    args = iir2_args(np.random.default_rng(L), 2, L, dtype)
    ref, got = [a.copy() for a in args], [a.copy() for a in args]
    run_function(parse_ir(text), "iir2", *ref)
    simulate_launch(m, "iir2", *got)
    return m, ref, got


@pytest.mark.parametrize("L", [0, 1, TILE - 1, TILE, TILE + 1, 3 * TILE + 5])
def test_linear_iir2_i32_bit_for_bit(L, monkeypatch):
    m, ref, got = _iir2(L, "i32", True, monkeypatch)
    np.testing.assert_array_equal(got[-1], ref[-1])
    (loop,) = _tile_loops(m)
    assert len(loop.iter_args) == 2 + 6 * IPT  # the carried state, then the next tile's (M, v) pairs
    kernel = loop.parent_op()
    assert _loads_before_first_shuffle(loop, {kernel.body.block.args[0]})  # x


@pytest.mark.parametrize("bs", [8, 32, 64])
def test_linear_iir2_f32_on_and_off(bs, monkeypatch):
    """One warp (the carry by shuffle), several warps; f32 within tolerance of the loop
    and prefetch on = off bit for bit (the same arithmetic in the same order)."""
    _, ref, on = _iir2(2 * bs * 2 + 3, "f32", True, monkeypatch, bs=bs, ipt=2)
    _, _, off = _iir2(2 * bs * 2 + 3, "f32", False, monkeypatch, bs=bs, ipt=2)
    np.testing.assert_allclose(on[-1], ref[-1], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(on[-1], off[-1])


@pytest.mark.parametrize("case", ["generic_one_block", "generic_time_blocks", "iir2"])
def test_prefetching_kernels_assemble_without_spills(case):
    """ptxas sm_80 and sm_90 on the prefetching kernels at the issue's sizes (default
    block configuration): no spills."""
    from scanweaver.bench import gpu_kernels as gk
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    if not ptxas_available():
        pytest.skip("ptxas not on PATH: register/spill figures need it")
    name = {"generic_one_block": "generic_cumsum_i32_1024x4096", "generic_time_blocks": "generic_cumsum_i32_1x2p26",
            "iir2": "iir2_f32_512x4096"}[case]
    for chip in ("sm_80", "sm_90"):
        module = gk._lower(gk.case_ir(name, "big"), small=False)
        assert all(f.iter_args for f in _tile_loops(module)), "the tile loops carry the next tile"
        out = export_gpu(module, chip=chip)
        assert out["ptxas"], chip
        for kernel, info in out["ptxas"].items():
            assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (chip, kernel, info)
