"""The grid the runtime computes from a launch description equals the grid of the host
IR's `gpu.launch_func` (the one the thread-block simulator runs), across shapes and
every kernel family.  Both come from one formula (`emit_grid_size` builds the IR from
the description's terms); this test checks they cannot drift apart."""

from __future__ import annotations

import numpy as np
import pytest
from test_linear_gpu import SINGLE_SEQUENCE
from test_recurrence_gpu import RANK2_DYNAMIC
from test_scan_gpu import inputs, lower, scan_text
from xdsl.context import Context

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.workloads.scans import affine_scan_ir


def _grids_agree(module, args):
    descs = {d.kernel_name: d for d in launch_descriptions(module)}
    seen = []

    def on_launch(kernel, grid, block, kargs):
        desc = descs[kernel]
        shapes = {a[0]: tuple(v.shape) for a, v in zip(desc.args, kargs) if hasattr(v, "shape")}
        seen.append((kernel, grid, desc.resolve_grid(shapes), block, desc.block))

    simulate_launch(module, "f" if "f" in _funcs(module) else _funcs(module)[0], *args, on_launch=on_launch)
    assert seen, "no kernel was launched"
    for kernel, ir_grid, desc_grid, ir_block, desc_block in seen:
        assert ir_grid == desc_grid, kernel
        assert ir_block == desc_block, kernel
    return [s[1] for s in seen]


def _funcs(module):
    from xdsl.dialects import func

    return [op.sym_name.data for op in module.ops if isinstance(op, func.FuncOp)]


def _gpu(text, bs=4, ipt=2):
    m = parse_ir(text)
    ScanToGpu(block_size=bs, items_per_thread=ipt).apply(Context(), m)
    return m


@pytest.mark.parametrize("shape", [(3, 10), (1, 1), (7, 5)])
def test_affine_dynamic_2d(shape):
    m = _gpu(affine_scan_ir(("?", "?"), 1, "f32", "f32", final=True))
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, shape).astype(np.float32) for _ in range(2))
    grids = _grids_agree(m, [a, b, np.zeros(shape, np.float32), np.zeros(shape[:1], np.float32)])
    assert grids == [(shape[0], 1, 1)]


@pytest.mark.parametrize("shape", [(5, 3, 2), (2, 1, 4)])
def test_affine_dynamic_3d_axis0(shape):
    m = _gpu(affine_scan_ir(("?", "?", "?"), 0, "f32", "f32", init=True))
    a = np.full(shape, 0.5, np.float32)
    grids = _grids_agree(m, [a, a.copy(), np.ones(shape[1:], np.float32), np.zeros(shape, np.float32)])
    assert grids == [(shape[1] * shape[2], 1, 1)]


@pytest.mark.parametrize("shape", [(3, 2, 9), (1, 2, 4)])
def test_generic_scan_partly_dynamic(shape):
    text = scan_text("cummax_i32", ["?", 2, "?"], 2)
    xs = inputs("cummax_i32", shape)
    grids = _grids_agree(lower(text), xs + [np.zeros_like(x) for x in xs])
    assert grids == [(shape[0] * 2, 1, 1)]


@pytest.mark.parametrize("B,L,D", [(2, 5, 3), (1, 1, 2)])
def test_recurrence_nest_dynamic_channel_loops(B, L, D):
    rng = np.random.default_rng(B)
    args = [rng.uniform(0, 1, (B, L, 2, 3)).astype(np.float32), rng.uniform(0.5, 1, (2, 3)).astype(np.float32),
            np.zeros((B, D, L), np.float32), np.zeros((B, D, 2, 3), np.float32)]
    grids = _grids_agree(_gpu(RANK2_DYNAMIC), args)
    assert grids == [(B * D, 1, 1)]


def test_linear_recurrence_single_sequence():
    L = 9
    args = [np.arange(L, dtype=np.int32), np.array([1, 2], np.int32), np.array([3, 4], np.int32),
            np.zeros(L, np.int32), np.zeros(2, np.int32)]
    from scanweaver import compiler

    m = compiler.lower(SINGLE_SEQUENCE, "gpu", keep_stages=False).module  # raise, then scan-to-gpu
    (name,) = _funcs(m)
    descs = {d.kernel_name: d for d in launch_descriptions(m)}
    seen = []
    simulate_launch(m, name, *args, on_launch=lambda k, g, b, kargs: seen.append((g, descs[k].resolve_grid({}))))
    assert seen == [((1, 1, 1), (1, 1, 1))]


@pytest.mark.parametrize("shape", [(2, 37), (1, 0), (3, 16)])
def test_affine_time_blocks_three_launches(shape):
    """reduce-then-scan: grids with the `cdiv` chunk term, and the channel grid between."""
    m = parse_ir(affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True))
    ScanToGpu(block_size=4, items_per_thread=2, time_blocks="always", chunk_tiles=2).apply(Context(), m)
    a = np.full(shape, 0.5, np.float32)
    chunks = max(1, -(-shape[1] // 16))
    grids = _grids_agree(m, [a, a.copy(), np.zeros(shape[:1], np.float32), np.zeros(shape, np.float32),
                             np.zeros(shape[:1], np.float32)])
    assert grids == [(shape[0] * chunks, 1, 1), (shape[0], 1, 1), (shape[0] * chunks, 1, 1)]


@pytest.mark.parametrize("batch,D,L", [(2, 3, 5), (1, 4, 1), (3, 2, 9)])
def test_selective_scan_one_build_dynamic_shapes(batch, D, L):
    """The GPU selective scan (one build for every (batch, D, L)): the grid of one
    block per (batch, channel) comes from u's sizes in both the IR and the description."""
    from scanweaver.ir import print_ir
    from scanweaver.workloads.selective import selective_scan_gpu
    from scanweaver.workloads.specs import SelectiveScanSpec

    n = 2
    m = _gpu(print_ir(selective_scan_gpu(SelectiveScanSpec(n, "shared", "const", False, False, False, True, True, True))))
    rng = np.random.default_rng(batch + D + L)
    args = [rng.uniform(-1, 1, (batch, D, L)).astype(np.float32), rng.uniform(-1, 0, (batch, D, L)).astype(np.float32),
            -rng.uniform(0.1, 1, (D, n)).astype(np.float32), rng.uniform(-1, 1, (batch, n, L)).astype(np.float32),
            rng.uniform(-1, 1, (D, n)).astype(np.float32), rng.uniform(-1, 1, (batch, D, n)).astype(np.float32),
            np.zeros((batch, D, L), np.float32), np.zeros((batch, D, n), np.float32)]
    assert _grids_agree(m, args) == [(batch * D, 1, 1)]


@pytest.mark.parametrize("form,lb,step", [("chan_lb1", 1, 1), ("chan_lb2_step3", 2, 3)])
@pytest.mark.parametrize("channels", [0, 1, 2, 3, 5, 8])
def test_channel_loop_from_a_constant_with_a_step(form, lb, step, channels):
    """`for c = lb to x.shape[0] step s`: the grid is the loop's trip count, the `span`
    term max(0, ceil((C - lb) / s)), in the IR and the description alike; never
    negative when C < lb (then no block runs), and the kernel writes what the loops do."""
    from pathlib import Path

    from scanweaver import compiler
    from scanweaver.interp.run import run_function

    text = (Path(__file__).parent / "gpu_loop_forms_more" / f"{form}.mlir").read_text()
    m = compiler.lower(text, "gpu", keep_stages=False).module
    (desc,) = launch_descriptions(m)
    assert str(desc.grid[0]).startswith("span(")
    x = np.random.default_rng(channels).uniform(-1, 1, (channels, 5)).astype(np.float32)
    want, got = np.full_like(x, np.nan), np.full_like(x, np.nan)
    run_function(parse_ir(text), form, x, np.float32(0.75), want)
    trip = max(0, -(-(channels - lb) // step))
    if trip:
        assert _grids_agree(m, [x, np.float32(0.75), got]) == [(trip, 1, 1)]
    else:  # nothing to launch: the description says so too
        assert desc.resolve_grid({a[0]: x.shape for a in desc.args if a[1] != "scalar"})[0] == 0
        simulate_launch(m, form, x, np.float32(0.75), got)
    np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)


@pytest.mark.parametrize("channels,L", [(3, 37), (6, 37), (9, 1)])
def test_channel_loop_with_a_step_in_time_blocks(channels, L):
    """The same loop in time blocks: the `span` term times the chunk count, per launch."""
    from pathlib import Path

    from scanweaver.interp.run import run_function
    from scanweaver.rewrites.raise_affine import RaiseRecurrences

    text = (Path(__file__).parent / "gpu_loop_forms_more" / "chan_lb2_step3.mlir").read_text()
    m = parse_ir(text)
    RaiseRecurrences().apply(Context(), m)
    ScanToGpu(block_size=4, items_per_thread=2, time_blocks="always", chunk_tiles=2).apply(Context(), m)
    x = np.random.default_rng(channels).uniform(-1, 1, (channels, L)).astype(np.float32)
    want, got = np.full_like(x, np.nan), np.full_like(x, np.nan)
    run_function(parse_ir(text), "chan_lb2_step3", x, np.float32(0.75), want)
    rows, chunks = (channels - 2 + 2) // 3, max(1, -(-L // 16))
    assert _grids_agree(m, [x, np.float32(0.75), got]) == [(rows * chunks, 1, 1), (rows, 1, 1),
                                                           (rows * chunks, 1, 1)]
    np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)


def test_span_term_counts_loop_iterations():
    """`span(h.shape[0],lb,step)` is the iteration count of `for i = lb to size step s`
    (0, never negative, below lb); a zero step does not parse."""
    from scanweaver.errors import ScanWeaverValueError
    from scanweaver.runtime.cuda_launch import eval_grid_entry

    for size in range(9):
        assert eval_grid_entry("span(h.shape[0],3,2)*2", {"h": (size,)}) == 2 * len(range(3, size, 2))
    with pytest.raises(ScanWeaverValueError, match="cannot parse launch size term"):
        eval_grid_entry("span(h.shape[0],1,0)", {"h": (4,)})
