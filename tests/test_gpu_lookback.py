"""`scan.affine` in one pass with a decoupled look-back (rewrites/affine_lookback.py,
`time-blocks=lookback`): a reset launch, then one block per (channel, chunk) taking its
chunk by ticket and its carry from its predecessors' status words.  Checked in the
thread-block simulator against the interpreter with blocks interleaved (random,
round-robin, latest-first, few resident), with the simulator's fence-aware cross-block
race check; a deliberately broken protocol must be caught; ptxas at 2^26 steps."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects import memref

from scanweaver.dialects.llvm_fence import FenceOp
from scanweaver.errors import ScanWeaverError
from scanweaver.interp.gpu_sim import GpuSimError, simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.workloads.scans import affine_scan_ir

BS, IPT = 4, 2  # chunk = one tile = 8 steps
CHUNK = BS * IPT

_SCHEDULES = [
    {},
    {"block_order": "reverse"},
    {"interleave": 1},
    {"interleave": 2, "resident": 3, "block_order": 5},
    {"interleave": "round-robin"},
    {"interleave": "latest-first", "resident": 2, "block_order": "reverse"},
]


def lower(text: str, bs: int = BS, ipt: int = IPT):
    m = parse_ir(text)
    ScanToGpu(block_size=bs, items_per_thread=ipt, time_blocks="lookback").apply(Context(), m)
    return m


def affine_args(shape, dtype, state, init: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    if np.dtype(state).kind == "i":
        a, b = (rng.integers(np.iinfo(state).min, np.iinfo(state).max, shape, dtype=state) for _ in range(2))
        h0 = rng.integers(-(2**30), 2**30, shape[:-1]).astype(state)
    else:
        a = rng.uniform(-1.05, 1.05, shape).astype(dtype)
        b = rng.uniform(-1, 1, shape).astype(dtype)
        h0 = rng.uniform(-1, 1, shape[:-1]).astype(state)
    return [a, b] + ([h0] if init else []) + [np.full(shape, 77, state), np.full(shape[:-1], 77, state)]


def run_both(text, args, module=None, **schedule):
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    got = [x.copy() for x in args]
    simulate_launch(module if module is not None else lower(text), "f", *got, **schedule)
    return ref[-2:], got[-2:]


@pytest.mark.parametrize("schedule", _SCHEDULES, ids=str)
@pytest.mark.parametrize("length", [0, 1, 2, 7, 8, 9, 17, 31, 33])
@pytest.mark.parametrize("reverse", [False, True])
def test_f32_lengths_init_final_reverse(length, reverse, schedule):
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True, reverse=reverse)
    (h_ref, f_ref), (h, f) = run_both(text, affine_args((2, length), np.float32, np.float32, True, length), **schedule)
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(f, f_ref, rtol=2e-5, atol=2e-6)
    if length:
        # the tile's last state (as the chained tiles return it): within an ulp of h's last
        np.testing.assert_allclose(f, h[:, 0] if reverse else h[:, -1], rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("schedule", _SCHEDULES, ids=str)
@pytest.mark.parametrize("state", ["i32", "i64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_integers_bit_exact(state, reverse, schedule):
    dt = np.dtype(state.replace("i", "int"))
    text = affine_scan_ir(("?", "?"), 1, state, state, init=True, final=True, reverse=reverse)
    (h_ref, f_ref), (h, f) = run_both(text, affine_args((3, 4 * CHUNK + 1), dt, dt, True, 3), **schedule)
    np.testing.assert_array_equal(h, h_ref)
    np.testing.assert_array_equal(f, f_ref)


@pytest.mark.parametrize("schedule", [{}, {"interleave": 4}], ids=str)
def test_static_3d_axis0_f64_without_init(schedule):
    shape = (3 * CHUNK - 1, 2, 3)
    text = affine_scan_ir(shape, 0, "f64", "f64", final=True)
    rng = np.random.default_rng(3)
    args = [rng.uniform(-1.1, 1.1, shape), rng.uniform(-1, 1, shape), np.zeros(shape), np.zeros(shape[1:])]
    (h_ref, f_ref), (h, f) = run_both(text, args, **schedule)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(f, f_ref, rtol=1e-12, atol=1e-13)


def test_warps_and_vector_tiles_i32_bit_exact():
    # 64 threads x 4 items: two warps, 16-byte loads in full tiles, a guarded last tile
    text = affine_scan_ir(("?", "?"), 1, "i32", "i32", init=True, final=True)
    args = affine_args((2, 3 * 256 + 5), np.int32, np.int32, True, 9)
    m = lower(text, 64, 4)
    (h_ref, f_ref), (h, f) = run_both(text, args, m, interleave=6)
    np.testing.assert_array_equal(h, h_ref)
    np.testing.assert_array_equal(f, f_ref)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("schedule", [{}, {"interleave": "round-robin"}, {"interleave": 8}], ids=str)
def test_non_finite_inputs_like_the_one_block_kernel(bad, schedule):
    # channel 0 holds a non-finite a; its later chunks wait for the exact state before
    # them (the fallback); channel 1 stays on the aggregates
    shape = (2, 4 * CHUNK)
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    args = affine_args(shape, np.float32, np.float32, True, seed=5)
    args[0][0, CHUNK + 3] = bad
    with np.errstate(invalid="ignore", over="ignore"):
        (h_ref, f_ref), (h, f) = run_both(text, args, **schedule)
        one_block = [x.copy() for x in args]
        m = parse_ir(text)
        ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks="never").apply(Context(), m)
        simulate_launch(m, "f", *one_block)
    np.testing.assert_array_equal(np.isfinite(h), np.isfinite(one_block[-2]))
    np.testing.assert_array_equal(np.isnan(h), np.isnan(one_block[-2]))
    np.testing.assert_array_equal(h[0], one_block[-2][0])  # chained exactly like it
    np.testing.assert_allclose(h[1], h_ref[1], rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(f, one_block[-1])


def test_huge_aggregates_fall_back_to_exact_states():
    # |a| = 1e30: chunk products overflow even f64 (1e240 per chunk squared...), so
    # composed carries are not finite; the exact chain matches the one-block kernel
    shape = (1, 6 * CHUNK)
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", final=True)
    a = np.full(shape, 1e30, np.float32)
    a[0, ::3] = 1e-30
    b = np.random.default_rng(1).uniform(-1, 1, shape).astype(np.float32)
    args = [a, b, np.zeros(shape, np.float32), np.zeros(1, np.float32)]
    with np.errstate(invalid="ignore", over="ignore"):
        got = [x.copy() for x in args]
        simulate_launch(lower(text), "f", *got, interleave=2)
        one_block = [x.copy() for x in args]
        m = parse_ir(text)
        ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks="never").apply(Context(), m)
        simulate_launch(m, "f", *one_block)
    np.testing.assert_array_equal(np.isfinite(got[-2]), np.isfinite(one_block[-2]))


def _move_first_flag_before_its_value(module) -> None:
    """Break the protocol: the AGGREGATE flag's fence and atomic go before the stores
    of the aggregate."""
    kernel = next(o for o in module.walk() if getattr(o, "sym_name", None) and o.sym_name.data.endswith("_lookback"))
    fence = next(o for o in kernel.walk() if isinstance(o, FenceOp))
    flag = fence.next_op
    assert isinstance(flag, memref.AtomicRMWOp)
    first_store = fence.prev_op.prev_op
    assert isinstance(first_store, memref.StoreOp)
    for op in (fence, flag):
        op.detach()
        first_store.parent_block().insert_op_before(op, first_store)


def test_flag_before_value_is_caught():
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    m = lower(text)
    _move_first_flag_before_its_value(m)
    with pytest.raises(GpuSimError, match="cross-block race in global memory"):
        simulate_launch(m, "f", *affine_args((2, 5 * CHUNK), np.float32, np.float32, True), interleave="round-robin")


def test_launches_scratch_and_host_grid():
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    m = lower(text)
    descs = launch_descriptions(m)
    assert [d.kernel_name.rsplit("_", 1)[-1] for d in descs] == ["reset", "lookback"]
    shapes = {"a": (3, 100), "b": (3, 100), "h": (3, 100)}
    assert descs[0].resolve_grid(shapes) == (3, 1, 1)
    assert descs[1].resolve_grid(shapes) == (3 * 13, 1, 1)  # ceil(100 / 8) chunks
    assert descs[0].scratch_shape("counter", shapes) == (1,)
    assert descs[0].scratch_shape("flags", shapes) == (3, 13)
    assert descs[1].scratch_shape("incl", shapes) == (3, 13)
    # scratch numbered -2 - j: counter, flags, agg_a, agg_b, incl; the reset zeroes what the kernel uses
    assert descs[0].host_args == (0, -2, -3)
    assert descs[1].host_args == (0, 1, 2, 3, 4, -2, -3, -4, -5, -6)
    seen = []

    def on_launch(kernel, grid, block, kargs):
        d = next(x for x in descs if x.kernel_name == kernel)
        seen.append((grid, d.resolve_grid({a[0]: tuple(v.shape) for a, v in zip(d.args, kargs)})))

    simulate_launch(m, "f", *affine_args((3, 37), np.float32, np.float32, True), on_launch=on_launch)
    assert len(seen) == 2 and all(g == r for g, r in seen), seen
    assert seen[1][0] == (3 * 5, 1, 1)


def test_stale_scratch_is_reset_each_call():
    # the runtime's scratch is uninitialised: the reset launch must zero the counter and flags
    text = affine_scan_ir((2, 3 * CHUNK), 1, "i32", "i32", final=True)
    m = lower(text)
    resets = []
    simulate_launch(m, "f", *affine_args((2, 3 * CHUNK), np.int32, np.int32, False),
                    on_launch=lambda k, g, b, kargs: resets.append(k) if k.endswith("_reset") else None)
    assert len(resets) == 1
    reset = next(o for o in m.walk() if getattr(o, "sym_name", None) and o.sym_name.data.endswith("_reset"))
    stores = [o for o in reset.walk() if isinstance(o, memref.StoreOp)]
    assert len(stores) == 2  # flags (in a loop over the chunks) and the counter


def test_bad_option_names_lookback():
    with pytest.raises(ScanWeaverError, match="auto, always, never or lookback"):
        ScanToGpu(time_blocks="sideways").apply(Context(), parse_ir(affine_scan_ir((2, 8), 1, "f32", "f32")))


def test_ptxas_2p26_no_spills_fences_and_atomics():
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    if not ptxas_available():
        pytest.skip("ptxas not on PATH")
    for chip in ("sm_80", "sm_90"):
        m = parse_ir(affine_scan_ir((1, 1 << 26), 1, "f32", "f32", init=True, final=True))
        ScanToGpu(time_blocks="lookback").apply(Context(), m)
        out = export_gpu(m, chip=chip)
        (ptx,) = out["ptx"].values()
        for needle in ("atom.global.add", "atom.global.exch", "atom.global.or", "fence.acq_rel.gpu",
                       "ld.global.nc.v4", "shfl.sync.up"):
            assert needle in ptx, (chip, needle)
        assert len(out["ptxas"]) == 2
        for kernel, info in out["ptxas"].items():
            assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (chip, kernel, info)
        descs = {d.kernel_name: d for d in launch_descriptions(m)}
        for kernel, info in out["ptxas"].items():
            assert info["shared_bytes"] == descs[kernel].shared_bytes, (chip, kernel, info)


@pytest.mark.parametrize("schedule", [{"interleave": "round-robin"}, {"interleave": 3}, {"interleave": "latest-first"}],
                         ids=str)
def test_look_back_across_several_windows_bit_exact(schedule):
    # 4-thread blocks look back 4 chunks at a time: 24 chunks interleaved leave windows
    # of aggregates only, so the walk moves back over several windows
    text = affine_scan_ir(("?", "?"), 1, "i32", "i32", init=True, final=True)
    args = affine_args((1, 24 * CHUNK), np.int32, np.int32, True, 4)
    (h_ref, f_ref), (h, f) = run_both(text, args, **schedule)
    np.testing.assert_array_equal(h, h_ref)
    np.testing.assert_array_equal(f, f_ref)


def test_cuda_runtime_with_garbage_scratch_twice(monkeypatch):
    # the runtime allocates scratch uninitialised: here filled with 0xA5 bytes (flags
    # that look published); the reset launch must make every call right. Blocks run
    # randomly interleaved, so that some read flags of chunks not yet published (without
    # the reset's flag stores this fails)
    import functools

    import test_gpu_time_blocks
    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.interp.gpu_sim import run_kernel

    monkeypatch.setattr(test_gpu_time_blocks, "run_kernel", functools.partial(run_kernel, interleave=1))

    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from scanweaver.runtime.cuda_driver import DeviceBuffer

    class GarbageDriver(SimulatorDriver):
        def alloc(self, nbytes):
            buf = np.full(nbytes, 0xA5, np.uint8)
            self.buffers[buf.ctypes.data] = buf
            return DeviceBuffer(buf.ctypes.data, nbytes, buf)

    text = affine_scan_ir(("?", "?"), 1, "i32", "i32", init=True, final=True, reverse=True)
    m = lower(text)
    driver = GarbageDriver(m)
    fn = CudaFunction(CudaModule("ptx", driver=driver), "f", launch_descriptions(m), 5)
    for seed in (1, 2):
        args = affine_args((2, 12 * CHUNK + 1), np.int32, np.int32, True, seed)
        ref = [x.copy() for x in args]
        run_function(parse_ir(text), "f", *ref)
        fn(*args)
        np.testing.assert_array_equal(args[-2], ref[-2])
        np.testing.assert_array_equal(args[-1], ref[-1])
    assert [name.rsplit("_", 1)[-1] for name, _ in driver.launches] == ["reset", "lookback"] * 2
    assert [g for _, g in driver.launches][:2] == [(2, 1, 1), (26, 1, 1)]


def test_the_op_attribute_asks_for_the_look_back_under_auto():
    """`ask_time_blocks(..., "lookback")` (the GPU check bundle's look-back cases) marks
    the scan.affine: the default `time-blocks=auto` then takes the look-back for it, and
    the result equals the interpreter's, bit for bit for i32."""
    from scanweaver.rewrites.affine_time_blocks import ask_time_blocks

    text = affine_scan_ir(("?", "?"), 1, "i32", "i32", final=True, reverse=True)
    m = parse_ir(ask_time_blocks(text, "lookback"))
    ScanToGpu(block_size=BS, items_per_thread=IPT).apply(Context(), m)
    assert [d.kernel_name.rsplit("_", 1)[-1] for d in launch_descriptions(m)] == ["reset", "lookback"]
    args = affine_args((2, 29), np.int32, np.int32, False, seed=3)
    ref, got = run_both(text, args, module=m, interleave=1)
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r)
    with pytest.raises(ValueError, match="strategy"):
        ask_time_blocks(text, "fast")
