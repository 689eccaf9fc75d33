"""`scan.recurrence` parallel in time across blocks (rewrites/recurrence_time_blocks.py):
several blocks per channel, three launches passing chunk aggregates and carries through
scratch memory, the emit run by the block owning each step from the chunk's true entry
state. Checked in the thread-block simulator (several blocks of a grid, permuted block
orders, shared and cross-block global-memory race checks) against the interpreter on
the original loops, through the CUDA runtime with a driver whose launches run in the
simulator, and with ptxas at 2^26 steps."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from xdsl.context import Context

from scanweaver.dialects import scan
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.scan_to_gpu import ScanToGpu
from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR
from scanweaver.workloads import loops

BS, IPT, TILES = 4, 2, 2  # chunk = 16 steps
CHUNK = BS * IPT * TILES
KINDS = ["reduce", "carries", "chunks"]


def lower(module, time_blocks: str = "always", raise_loops: bool = True, bs: int = BS, ipt: int = IPT):
    m = parse_ir(print_ir(module))
    if raise_loops:
        RaiseRecurrences().apply(make_context(), m)
        assert any(isinstance(o, scan.RecurrenceOp) for o in m.walk())
    ScanToGpu(block_size=bs, items_per_thread=ipt, time_blocks=time_blocks, chunk_tiles=TILES).apply(Context(), m)
    m.verify()
    return m


def kinds(m) -> list[str]:
    return [d.kernel_name.rsplit("_", 1)[-1] for d in launch_descriptions(m)]


def run_both(module, fname, args, time_blocks="always", **sim):
    """(interpreter on the loops, simulator on the time blocks) outputs, and the module."""
    ref = [x.copy() for x in args]
    run_function(parse_ir(print_ir(module)), fname, *ref)
    m = lower(module, time_blocks)
    got = [x.copy() for x in args]
    simulate_launch(m, fname, *got, **sim)
    return ref, got, m


def f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def ema_args(rng, C, L, dtype=np.float32):
    if np.dtype(dtype).kind == "i":
        x, al, h0 = (rng.integers(-(2**30), 2**30, s).astype(dtype) for s in [(C, L), (C,), (C,)])
    else:
        x, al, h0 = f32(rng, C, L), f32(rng, C, lo=0.5, hi=1.0), f32(rng, C)
    return [x, al, h0, np.zeros((C, L), dtype), np.zeros(C, dtype)]


@pytest.mark.parametrize("L", [0, 1, 2, 15, 16, 17, 31, 33, 2 * CHUNK + 5])
def test_ema_lengths_several_blocks(L):
    rng = np.random.default_rng(L)
    args = ema_args(rng, 2, L)
    ref, got, m = run_both(loops.ema_loops(2, L), "ema", args, block_order=L)
    assert kinds(m) == KINDS
    assert launch_descriptions(m)[0].grid == (2 * max(1, -(-L // CHUNK)), 1, 1)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)
    if L:
        np.testing.assert_array_equal(got[3][:, 0], ref[3][:, 0])  # chunk 0 starts from h0 itself


@pytest.mark.parametrize("dtype", ["i32", "i64"])
def test_integer_ema_bit_exact(dtype):
    L = 2 * CHUNK + 1
    args = ema_args(np.random.default_rng(1), 3, L, np.dtype(dtype.replace("i", "int")))
    ref, got, m = run_both(loops.ema_loops(3, L, dtype), "ema", args, block_order="reverse")
    assert kinds(m) == KINDS
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r)


def test_ema_f64_state():
    L = 2 * CHUNK + 1
    args = [a.astype(np.float64) for a in ema_args(np.random.default_rng(3), 2, L)]
    ref, got, m = run_both(loops.ema_loops(2, L, "f64"), "ema", args, block_order=9)
    assert kinds(m) == KINDS
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-13, atol=1e-14)


def test_selective_scan_f16_io():
    """f16 inputs/outputs, f32 state: f64 aggregates, each chunk in f32 from its carry."""
    L, N = 2 * CHUNK + 1, 2
    module = loops.selective_scan_loops(1, 1, L, N, dtype="f16", **SSM)
    args = [a.astype(np.float16) for a in ssm_args(np.random.default_rng(2), 1, 1, L, N)]
    ref, got, m = run_both(module, "selective_scan", args, block_order=6)
    assert kinds(m) == KINDS
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("L", [CHUNK - 1, 2 * CHUNK + 1])
def test_discounted_return_reverse_and_write_through(L):
    """G[c, L-1-t] (reverse in time) and g[c] = state (only the loop's last step, in the
    last chunk's block)."""
    rng = np.random.default_rng(L)
    C = 2
    args = [f32(rng, C, L), f32(rng, C, lo=0.5, hi=1.0), f32(rng, C), np.zeros((C, L), np.float32)]
    ref, got, m = run_both(loops.discounted_return_loops(C, L), "discounted_return", args, block_order=5)
    assert kinds(m) == KINDS
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


def test_reset_state_argument_depth0():
    """One long sequence (no channel loop), the state an in/out function argument: only
    launch 1 reads it, only the last chunk's block writes it."""
    rng = np.random.default_rng(4)
    C, L = 3, 3 * CHUNK - 2
    done = (rng.uniform(size=L) < 0.2).astype(np.int32)
    args = [f32(rng, L, C), f32(rng, L, C, lo=0.5, hi=1.0), done, f32(rng, C), np.zeros((L, C), np.float32)]
    ref, got, m = run_both(loops.reset_loops(C, L), "reset", args, block_order=2)
    assert kinds(m) == KINDS
    assert launch_descriptions(m)[0].grid == (3, 1, 1)  # one channel, three chunks
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


SSM = dict(return_last_state=True)


def ssm_args(rng, batch, D, L, N):
    return [f32(rng, batch, D, L), f32(rng, batch, D, L, lo=-2.0, hi=0.5), f32(rng, D, N, lo=-2.0, hi=-0.1),
            f32(rng, D, N), f32(rng, D, N), f32(rng, D), f32(rng, batch, D, L), f32(rng, D, lo=-0.5, hi=0.5),
            np.zeros((batch, D, L), np.float32), np.zeros((batch, D, N), np.float32)]


@pytest.mark.parametrize("N", [1, 3])
def test_selective_scan_one_channel(N):
    """One channel (batch = D = 1), a state of N elements: N aggregate rows per channel."""
    L = 2 * CHUNK + 3
    module = loops.selective_scan_loops(1, 1, L, N, **SSM)
    ref, got, m = run_both(module, "selective_scan", ssm_args(np.random.default_rng(N), 1, 1, L, N), block_order=1)
    assert kinds(m) == KINDS
    assert launch_descriptions(m)[1].grid == (N, 1, 1)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_selective_scan_component_groups(monkeypatch):
    """A small shared-memory budget: the f64 aggregates go in groups of sweeps."""
    import scanweaver.rewrites.recurrence_gpu as rg
    import scanweaver.rewrites.recurrence_time_blocks as rtb

    monkeypatch.setattr(rg, "SWEEP_SHARED_BUDGET", 2 * 4 * 8 * 2)
    monkeypatch.setattr(rtb, "SWEEP_SHARED_BUDGET", 2 * 4 * 8 * 2)  # 2 components of f64
    monkeypatch.setattr(rg, "WARP_SHUFFLE_SCANS", False)  # the sweeps' groups (f32 takes shuffles)
    L, N = CHUNK + 5, 3
    module = loops.selective_scan_loops(1, 2, L, N, **SSM)
    ref, got, m = run_both(module, "selective_scan", ssm_args(np.random.default_rng(9), 1, 2, L, N))
    assert launch_descriptions(m)[0].shared_bytes == (2 * 2 * BS + 2 * N) * 8
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_large_state_path_folds_by_component_group(monkeypatch):
    """Beyond 16 registers of state launch 1 produces one component group's pairs at a
    time (forced here for N = 3 with groups of 2)."""
    import scanweaver.rewrites.recurrence_time_blocks as rtb

    monkeypatch.setattr(rtb, "REDUCE_ALL_PAIRS_WORDS", 1)
    monkeypatch.setattr(rtb, "SWEEP_SHARED_BUDGET", 2 * 4 * 8 * 2)
    L, N = 2 * CHUNK - 3, 3
    module = loops.selective_scan_loops(1, 1, L, N, **SSM)
    ref, got, m = run_both(module, "selective_scan", ssm_args(np.random.default_rng(8), 1, 1, L, N), block_order=4)
    assert kinds(m) == KINDS
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_any_block_order_gives_the_same_bits():
    L = 3 * CHUNK + 5
    module = loops.selective_scan_loops(1, 2, L, 2, **SSM)
    args = ssm_args(np.random.default_rng(2), 1, 2, L, 2)
    m = lower(module)
    forward = [x.copy() for x in args]
    simulate_launch(m, "selective_scan", *forward)
    for order in ("reverse", 7):
        permuted = [x.copy() for x in args]
        simulate_launch(m, "selective_scan", *permuted, block_order=order)
        for x, y in zip(forward, permuted):
            np.testing.assert_array_equal(x, y)


def test_inf_input_redoes_the_channel_like_the_fused_kernel():
    rng = np.random.default_rng(5)
    C, L = 2, 3 * CHUNK
    args = ema_args(rng, C, L)
    args[0][0, CHUNK + 3] = np.inf  # channel 0 holds an Inf; channel 1 stays time-parallel
    module = loops.ema_loops(C, L)
    ref, got, _ = run_both(module, "ema", args)
    fused = [x.copy() for x in args]
    simulate_launch(lower(module, "never"), "ema", *fused)
    np.testing.assert_array_equal(got[3][0], fused[3][0])
    np.testing.assert_array_equal(got[4][0], fused[4][0])
    np.testing.assert_array_equal(np.isfinite(got[3]), np.isfinite(ref[3]))
    np.testing.assert_allclose(got[3][1], ref[3][1], rtol=2e-5, atol=2e-6)


def test_strong_decay_stays_finite():
    """alpha = 0.05: chunk products underflow f32 long before the end; the f64
    aggregates keep every carry and the result matches the loop."""
    rng = np.random.default_rng(6)
    C, L = 1, 4 * CHUNK
    args = ema_args(rng, C, L)
    args[1][:] = 0.05
    ref, got, _ = run_both(loops.ema_loops(C, L), "ema", args)
    assert all(np.isfinite(g).all() for g in got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


# -- dynamic length: one build, several lengths -----------------------------------------------


def _dynamic_selective(n: int, sizes=None):
    from scanweaver.workloads.selective import selective_scan_gpu
    from scanweaver.workloads.specs import SelectiveScanSpec

    spec = SelectiveScanSpec(n, "shared", "shared", True, True, True, True, False, True)
    return spec, (selective_scan_gpu(spec) if sizes is None else selective_scan_gpu(spec, sizes))


@pytest.mark.parametrize("length", [0, 1, CHUNK + 1])
def test_dynamic_length_selective_scan(length):
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_selective_gpu_dynamic import inputs

    spec, module = _dynamic_selective(3)  # the N of test_selective_gpu_dynamic.inputs
    m = lower(module, raise_loops=False)
    assert kinds(m) == KINDS
    d0 = launch_descriptions(m)[0]
    assert f"cdiv(u.shape[2],{CHUNK})" in str(d0.grid[0])
    x = inputs(np.random.default_rng(length), spec, 1, 2, length)
    args = [*x.values(), np.full((1, 2, length), np.nan, np.float32), np.full((1, 2, 3), np.nan, np.float32)]
    ref = [a.copy() for a in args]
    run_function(parse_ir(print_ir(module)), "selective_scan", *ref)
    got = [a.copy() for a in args]
    simulate_launch(m, "selective_scan", *got, block_order=length)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


# -- strategy choice and launch descriptions --------------------------------------------------


def test_strategy_choice():
    auto = lambda mod: kinds(lower(mod, "auto"))  # noqa: E731
    m = parse_ir(print_ir(loops.ema_loops(2, 2 * CHUNK)))
    RaiseRecurrences().apply(make_context(), m)
    ScanToGpu(block_size=BS, items_per_thread=IPT, chunk_tiles=TILES).apply(Context(), m)
    assert kinds(m) == KINDS  # static, few channels, two chunks: time blocks
    assert len(auto(loops.ema_loops(2, 2 * CHUNK - 1))) == 1  # shorter than two chunks
    assert len(auto(loops.ema_loops(300, 2 * CHUNK))) == 1  # enough channels for the chip
    assert len(kinds(lower(loops.ema_loops(2, 2 * CHUNK), "never"))) == 1
    # dynamic sizes stay one block per channel unless the op asks
    _, dyn = _dynamic_selective(2)
    assert len(kinds(lower(dyn, "auto", raise_loops=False))) == 1
    from xdsl.dialects.builtin import StringAttr

    asked = parse_ir(print_ir(dyn))
    for o in asked.walk():
        if isinstance(o, scan.RecurrenceOp):
            o.attributes[TIME_BLOCKS_ATTR] = StringAttr("time_blocks")
    assert kinds(lower(asked, "auto", raise_loops=False)) == KINDS


def _complex_gpu(module_text: str, **pass_opts):
    from scanweaver.rewrites.complex_affine_loops import ComplexScansToLoops
    from scanweaver.rewrites.complex_to_real import ComplexToReal
    from scanweaver.rewrites.raise_complex_pairs import ComplexToPairs

    m = parse_ir(module_text)
    ctx = make_context()
    for stage in (RaiseRecurrences(), ComplexToPairs(), ComplexScansToLoops(), ScanToGpu(**pass_opts), ComplexToReal()):
        stage.apply(ctx, m)
    m.verify()
    return m


@pytest.mark.parametrize("el,tol", [("f32", 2e-5), ("f64", 1e-12)])
@pytest.mark.parametrize("L", [0, 1, CHUNK + 1, 2 * CHUNK - 1])
def test_complex_lru_state_in_time_blocks(L, el, tol):
    """The LRU's memref<N x complex> state (one sequence, the state an in/out argument):
    aggregates and carries in complex<f64>, after scan-complex-to-real."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_complex_gpu_state import lru_args

    from scanweaver.workloads.lru import lru_loops

    N, H = 2, 2
    text = print_ir(lru_loops(L, N, H, el))
    m = _complex_gpu(text, block_size=BS, items_per_thread=IPT, time_blocks="always", chunk_tiles=TILES)
    assert kinds(m) == KINDS
    assert "complex<f64>" in str(launch_descriptions(m)[1].args)
    args = lru_args(L, N, H, el, lam_scale=0.4)  # mostly |lambda| < 1: the state stays O(1)
    ref, got = [x.copy() for x in args], [x.copy() for x in args]
    run_function(text, "lru", *ref)
    simulate_launch(m, "lru", *got, block_order=L)
    np.testing.assert_allclose(got[6], ref[6], rtol=tol, atol=tol)  # last state (h in/out)
    np.testing.assert_allclose(got[7], ref[7], rtol=tol, atol=tol * 10)
    if L <= 1:
        assert got[6].tobytes() == ref[6].tobytes() and got[7].tobytes() == ref[7].tobytes()


@pytest.mark.parametrize("el,N", [("f32", 4), ("f64", 4)])  # N = 16 / 8 take ~40 s / 20 s here
def test_ptxas_complex_lru_one_sequence_2_pow_20(el, N):
    from scanweaver.workloads.lru import lru_loops

    m = _complex_gpu(print_ir(lru_loops(1 << 20, N, 4, el)))  # auto: one long sequence
    assert kinds(m) == KINDS
    _ptxas_no_spills(m, "sm_80" if el == "f32" else "sm_90")


def test_launch_descriptions_and_runtime_replay():
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.runtime.cuda import CudaFunction, CudaModule

    C, L = 2, 2 * CHUNK + 1
    module = loops.ema_loops(C, L)
    m = lower(module)
    descs = launch_descriptions(m)
    assert kinds(m) == KINDS
    assert [d.grid for d in descs] == [(C * 3, 1, 1), (C, 1, 1), (C * 3, 1, 1)]
    assert descs[0].scratch_shape("tb_agg_a", {}) == (C, 3)
    assert descs[0].host_args[-3:] == (-2, -3, -4) and descs[1].host_args == (-2, -3, -4, -5, -6)
    assert descs[2].host_args[-3:] == (-4, -5, -6)
    out_kinds = {n: k for n, k, _, _ in descs[2].args}
    assert out_kinds["y"] == "out" and out_kinds["hT"] == "out" and out_kinds["x"] == "in"
    driver = SimulatorDriver(m)
    args = ema_args(np.random.default_rng(11), C, L)
    ref = [x.copy() for x in args]
    run_function(parse_ir(print_ir(module)), "ema", *ref)
    CudaFunction(CudaModule("ptx", driver=driver), "ema", descs, 5)(*args)
    assert [g for _, g in driver.launches] == [(6, 1, 1), (2, 1, 1), (6, 1, 1)]
    for r, g in zip(ref, args):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)


# -- ptxas at 2^26 steps on one channel --------------------------------------------------------


def _ptxas_no_spills(m, chip):
    from scanweaver.toolchain.gpu_export import MIN_PTX_FEATURES, export_gpu, ptxas_available

    if not ptxas_available():
        pytest.skip("ptxas is not installed: PTX checked, not assembled")
    out = export_gpu(m, chip=chip, features=MIN_PTX_FEATURES[chip])
    assert set(out["ptxas"]) == {d.kernel_name for d in launch_descriptions(m)}
    for kernel, figures in out["ptxas"].items():
        assert figures["spill_stores"] == 0 and figures["spill_loads"] == 0, (kernel, figures)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_ema_one_channel_2_pow_26(chip):
    n = 1 << 26
    m = parse_ir(print_ir(loops.ema_loops(1, n)))
    RaiseRecurrences().apply(make_context(), m)
    ScanToGpu().apply(Context(), m)  # auto: one channel, a long static row -> time blocks
    chunks = n // (128 * 4 * 16)
    assert [d.grid for d in launch_descriptions(m)] == [(chunks, 1, 1), (1, 1, 1), (chunks, 1, 1)]
    _ptxas_no_spills(m, chip)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_selective_scan_n16_dynamic_length(chip):
    """The selective scan at N = 16, dynamic (batch, D, L): one build for a single
    channel of 2^26 steps (grid cdiv(L, 8192) blocks per channel)."""
    _, module = _dynamic_selective(16)
    m = parse_ir(print_ir(module))
    ScanToGpu(time_blocks="always").apply(Context(), m)
    descs = launch_descriptions(m)
    assert kinds(m) == KINDS
    shapes = {"u": (1, 1, 1 << 26)}
    assert descs[0].resolve_grid(shapes) == ((1 << 26) // 8192, 1, 1)
    assert descs[1].resolve_grid({"a": (16, (1 << 26) // 8192)}) == (16, 1, 1)
    _ptxas_no_spills(m, chip)


def test_runtime_replay_dynamic_sizes_scratch_from_formulas():
    """Dynamic (batch, D, L): the runtime sizes the scratch from the formulas of the
    launch descriptions (rows = batch * D * N, chunks = cdiv(L, chunk))."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_gpu_time_blocks import SimulatorDriver
    from test_selective_gpu_dynamic import inputs

    from scanweaver.runtime.cuda import CudaFunction, CudaModule

    spec, module = _dynamic_selective(3)
    m = lower(module, raise_loops=False)
    descs = launch_descriptions(m)
    batch, dim, length = 1, 2, CHUNK + 3
    x = inputs(np.random.default_rng(12), spec, batch, dim, length)
    args = [*x.values(), np.zeros((batch, dim, length), np.float32), np.zeros((batch, dim, 3), np.float32)]
    shapes = {"u": x["u"].shape}
    assert descs[0].scratch_shape("tb_agg_a", shapes) == (batch * dim * 3, 2)
    ref = [a.copy() for a in args]
    run_function(parse_ir(print_ir(module)), "selective_scan", *ref)
    driver = SimulatorDriver(m)
    CudaFunction(CudaModule("ptx", driver=driver), "selective_scan", descs, len(args))(*args)
    assert [g for _, g in driver.launches] == [(4, 1, 1), (6, 1, 1), (4, 1, 1)]
    for r, g in zip(ref, args):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
