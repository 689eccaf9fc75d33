"""Warp-shuffle in-tile scans: `gpu.shuffle` in the thread-block simulator, and the
affine kernels of several warps (2 barriers per tile) against the sequential loop."""

from __future__ import annotations

import numpy as np
import pytest
from test_blelloch import check, lower
from scan_ir import affine_func
from xdsl.dialects import gpu

from scanweaver.interp.gpu_sim import GpuSimError, simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.toolchain.gpu_export import print_generic

# -- gpu.shuffle in the simulator -----------------------------------------------------------

_SHUFFLE_KERNEL = """
"builtin.module"() ({
  "func.func"() <{function_type = (memref<NxT>, memref<NxT>, memref<Nxi32>) -> (), sym_name = "main"}> ({
  ^bb0(%m: memref<NxT>, %o: memref<NxT>, %ok: memref<Nxi32>):
    %c1 = "arith.constant"() <{value = 1 : index}> : () -> index
    %cn = "arith.constant"() <{value = N : index}> : () -> index
    "gpu.launch_func"(%c1, %c1, %c1, %cn, %c1, %c1, %m, %o, %ok) <{kernel = @k::@f, operandSegmentSizes = array<i32: 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 3, 0>}> : (index, index, index, index, index, index, memref<NxT>, memref<NxT>, memref<Nxi32>) -> ()
    "func.return"() : () -> ()
  }) : () -> ()
  "gpu.module"() <{sym_name = "k"}> ({
    "gpu.func"() <{function_type = (memref<NxT>, memref<NxT>, memref<Nxi32>) -> ()}> ({
    ^bb0(%m: memref<NxT>, %o: memref<NxT>, %ok: memref<Nxi32>):
      %t = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
      %v = "memref.load"(%m, %t) : (memref<NxT>, index) -> T
      %off = "arith.constant"() <{value = OFF : i32}> : () -> i32
      %w = "arith.constant"() <{value = W : i32}> : () -> i32
      %r, %valid = "gpu.shuffle"(%v, %off, %w) <{mode = #gpu<shuffle_mode MODE>}> : (T, i32, i32) -> (T, i1)
      %s = "arith.select"(%valid, %r, %v) : (i1, T, T) -> T
      "memref.store"(%s, %o, %t) : (T, memref<NxT>, index) -> ()
      %one = "arith.constant"() <{value = 1 : i32}> : () -> i32
      %zero = "arith.constant"() <{value = 0 : i32}> : () -> i32
      %e = "arith.select"(%valid, %one, %zero) : (i1, i32, i32) -> i32
      "memref.store"(%e, %ok, %t) : (i32, memref<Nxi32>, index) -> ()
      "gpu.return"() : () -> ()
    }) {gpu.kernel, sym_name = "f", workgroup_attributions = 0 : i64} : () -> ()
  }) : () -> ()
}) {gpu.container_module} : () -> ()
"""


def _run_shuffle(mode: str, offset: int, width: int, n: int, el: str = "f32"):
    text = (_SHUFFLE_KERNEL.replace("MODE", mode).replace("OFF", str(offset)).replace("W", str(width))
            .replace("NxT", f"{n}x{el}").replace("Nxi32", f"{n}xi32").replace("T", el).replace("value = N ", f"value = {n} "))
    dt = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}[el]
    x = (np.arange(n) * 3 + 1).astype(dt)
    out, ok = np.zeros(n, dt), np.full(n, 7, np.int32)
    simulate_launch(parse_ir(text), "main", x, out, ok)
    return x, out, ok


@pytest.mark.parametrize("mode", ["up", "down", "xor", "idx"])
@pytest.mark.parametrize("width", [32, 8])
def test_shuffle_modes_match_cuda_semantics(mode, width):
    n = 64  # two warps: lanes never cross a warp
    offset = 3
    x, out, ok = _run_shuffle(mode, offset, width, n)
    for t in range(n):
        lane = t % 32
        seg, pos = lane - lane % width, lane % width
        src = {"up": pos - offset, "down": pos + offset, "xor": pos ^ offset, "idx": offset}[mode]
        valid = 0 <= src < width
        assert ok[t] == int(valid), (t, mode)
        assert out[t] == (x[(t - lane) + seg + src] if valid else x[t]), (t, mode)


@pytest.mark.parametrize("el", ["f64", "i64", "i32"])
def test_shuffle_64_bit_and_integer_values(el):
    x, out, ok = _run_shuffle("up", 1, 32, 32, el)
    np.testing.assert_array_equal(out[1:], x[:-1])
    assert out[0] == x[0] and ok[0] == 0 and ok[1:].all()


def test_shuffle_reading_a_missing_lane_is_an_error():
    # a block of 16 threads: lane 15 + 3 does not exist in a segment of 32
    with pytest.raises(GpuSimError, match="not a thread of the block"):
        _run_shuffle("down", 3, 32, 16)


def test_shuffle_roundtrips_in_upstream_generic_form():
    text = _SHUFFLE_KERNEL.replace("MODE", "xor").replace("OFF", "1").replace("W", "32").replace(
        "NxT", "32xf32").replace("Nxi32", "32xi32").replace("T", "f32").replace("value = N ", "value = 32 ")
    printed = print_generic(parse_ir(text))
    assert '"gpu.shuffle"' in printed and "#gpu<shuffle_mode xor>" in printed
    assert parse_ir(printed) is not None


# -- affine kernels of several warps ---------------------------------------------------------


def _kernel(module) -> gpu.FuncOp:
    (k,) = [op for op in module.walk() if isinstance(op, gpu.FuncOp)]
    return k


@pytest.mark.parametrize("length", [0, 1, 65, 127, 128, 129])
def test_two_warps_lengths_around_tiles(length):
    # 64 threads x 2 items = 128-step tiles
    check((1, length), 1, init=True, final=True, block_size=64, items_per_thread=2)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("state", ["f32", "f64"])
def test_four_warps_float_reverse_init_final(reverse, state):
    check((1, 200), 1, state, state, init=True, final=True, reverse=reverse, block_size=128, items_per_thread=1)


@pytest.mark.parametrize("state", ["i32", "i64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_integer_scans_bit_exact_over_warps(state, reverse):
    check((2, 257), 1, state, state, init=True, final=True, reverse=reverse, block_size=64, items_per_thread=2)


def test_barriers_and_shuffles_per_tile():
    text = affine_func((1, 64), 1, "f32", "f32", init=True, final=True)
    k = _kernel(lower(text, block_size=128, items_per_thread=4))
    # 1 after the warp totals, 1 for the carry broadcast, 1 in the overflow fallback loop
    assert sum(isinstance(op, gpu.BarrierOp) for op in k.walk()) == 3
    stats: list = []
    module = lower(affine_func((1, 2 * 512 + 5), 1, "f32", "f32"), block_size=128, items_per_thread=4)
    a = np.full((1, 1029), 0.9, np.float32)
    b = np.ones((1, 1029), np.float32)
    h = np.zeros((1, 1029), np.float32)
    simulate_launch(module, "f", a, b, h, stats=stats)
    (st,) = stats
    assert st["max_barriers"] == 2 * 3  # 3 tiles, none flagged


def _overflow_rows(dt, length):
    """Growth whose product over a tile leaves the range while the state is 0 (the
    loop never forms inf * 0), then a few nonzero b: the tiles must be flagged."""
    big = 1e15 if dt == np.float32 else 1e120
    a = np.full((2, length), big, dt)
    a[1] = -big
    b = np.zeros((2, length), dt)
    b[:, -3:] = 1.5
    return a, b


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
def test_overflowing_tiles_over_warps_take_the_loops_order(dt, reverse):
    el = "f32" if dt == np.float32 else "f64"
    length = 150
    text = affine_func((2, length), 1, el, el, reverse=reverse)
    a, b = _overflow_rows(dt, length)
    if reverse:
        b = b[:, ::-1].copy()
    ref_h, got_h = np.zeros((2, length), dt), np.full((2, length), 77, dt)
    with np.errstate(all="ignore"):
        run_function(text, "f", a, b, ref_h)
        simulate_launch(lower(text, block_size=64, items_per_thread=1), "f", a, b, got_h)
    assert np.isfinite(ref_h).all()
    np.testing.assert_array_equal(got_h, ref_h)


def test_nan_inputs_propagate_like_the_loop_over_warps():
    rng = np.random.default_rng(3)
    length = 200
    text = affine_func((1, length), 1, "f32", "f32")
    a = rng.uniform(0.5, 1.0, (1, length)).astype(np.float32)
    b = rng.uniform(-1, 1, (1, length)).astype(np.float32)
    b[0, 90] = np.nan
    ref_h, got_h = np.zeros((1, length), np.float32), np.zeros((1, length), np.float32)
    with np.errstate(all="ignore"):
        run_function(text, "f", a, b, ref_h)
        simulate_launch(lower(text, block_size=64, items_per_thread=1), "f", a, b, got_h)
    np.testing.assert_array_equal(np.isnan(got_h), np.isnan(ref_h))
    np.testing.assert_allclose(got_h[0, :90], ref_h[0, :90], rtol=2e-5, atol=2e-6)


# -- generic scan.scan over several warps ------------------------------------------------------


@pytest.mark.parametrize("length", [1, 63, 128, 129])
def test_generic_two_warps_lengths_around_tiles(length):
    from test_scan_gpu import check as check_scan

    # non-commutative pair combine, bit for bit in i32
    check_scan("affine_pair_i32", (1, length), 1, block_size=64, items_per_thread=2)


@pytest.mark.parametrize("name", ["argmax_f32_i32", "first_i64", "affine_pair_f32", "max_via_scf_if_f64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_generic_four_warps_combines(name, reverse):
    from test_scan_gpu import check as check_scan

    check_scan(name, (1, 200), 1, reverse, block_size=128, items_per_thread=1)


def test_generic_zero_length_and_barriers_per_tile():
    from test_scan_gpu import check as check_scan
    from test_scan_gpu import lower as lower_scan
    from test_scan_gpu import scan_text, inputs

    check_scan("cumsum_i32", (2, 0), 1, block_size=64, items_per_thread=2)
    m = lower_scan(scan_text("cumsum_i32", (1, 3 * 128 + 1), 1), block_size=64, items_per_thread=2)
    stats: list = []
    xs = inputs("cumsum_i32", (1, 3 * 128 + 1))
    simulate_launch(m, "f", *xs, *[np.zeros_like(x) for x in xs], stats=stats)
    assert stats[0]["max_barriers"] == 2 * 4  # 4 tiles


# -- 16-byte loads and stores of full tiles ------------------------------------------------------


def _run_affine(shape, el, *, reverse=False, init=True, bs=64, ipt=4, seed=0):
    """Simulated == loop (1e-5), and the simulator's stats of the launch."""
    dt = {"f32": np.float32, "f64": np.float64}[el]
    text = affine_func(shape, len(shape) - 1, el, el, init=init, final=True, reverse=reverse)
    rng = np.random.default_rng(seed)
    ch = shape[:-1]
    args = [rng.uniform(0.5, 1.0, shape).astype(dt), rng.uniform(-1, 1, shape).astype(dt)]
    if init:
        args.append(rng.uniform(-1, 1, ch).astype(dt))
    args += [np.full(shape, 77, dt), np.full(ch, 77, dt)]
    ref, got = [x.copy() for x in args], [x.copy() for x in args]
    run_function(text, "f", *ref)
    stats: list = []
    simulate_launch(lower(text, block_size=bs, items_per_thread=ipt), "f", *got, stats=stats)
    for r, g in zip(ref[-2:], got[-2:]):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)
    return stats[0]


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length,full_tiles", [(256, 1), (516, 2), (4, 0)])
def test_vector_loads_in_full_tiles_scalar_last_tile(length, full_tiles, reverse):
    # 64 threads x 4 items = 256-step tiles; each full tile: 2 loads + 1 store per thread
    st = _run_affine((2, length), "f32", reverse=reverse)
    assert st["vector_accesses"] == 2 * full_tiles * 3 * 64


@pytest.mark.parametrize("length", [257, 255])
def test_rows_off_16_bytes_take_scalar_accesses(length):
    st = _run_affine((2, length), "f32", init=False)
    assert st["vector_accesses"] == 0


@pytest.mark.parametrize("reverse", [False, True])
def test_vector_loads_f64_pairs(reverse):
    # ipt 2: one vector<2xf64> per thread and array; 3-d, scan axis innermost
    st = _run_affine((2, 1, 130), "f64", reverse=reverse, bs=32, ipt=2)
    assert st["vector_accesses"] == 2 * 2 * 3 * 32


def test_middle_axis_keeps_scalar_accesses():
    check((3, 256, 2), 1, block_size=64, items_per_thread=4, init=True, final=True)
    text = affine_func((3, 256, 2), 1, "f32", "f32")
    assert not any(op.name == "vector.load" for op in lower(text, block_size=64, items_per_thread=4).walk())


def test_misaligned_vector_access_is_a_simulator_error():
    text = affine_func((1, 256), 1, "f32", "f32")
    module = lower(text, block_size=64, items_per_thread=4)
    for op in module.walk():
        if op.name == "vector.load":  # shift the first load by one element
            from xdsl.dialects import arith
            from xdsl.dialects.builtin import IndexType, IntegerAttr

            one = arith.ConstantOp(IntegerAttr(1, IndexType()))
            add = arith.AddiOp(op.operands[-1], one)
            op.parent_block().insert_ops_before([one, add], op)
            op.operands = [*op.operands[:-1], add.result]
            break
    a = np.ones((1, 256), np.float32)
    with pytest.raises(GpuSimError, match="16-byte aligned|out-of-bounds"):
        simulate_launch(module, "f", a, a.copy(), np.zeros_like(a))


# -- ptxas: every new kernel form on sm_80 and sm_90, no spills ----------------------------------

_PTXAS_CASES = {
    # (IR, pass options, what the PTX must show)
    "affine_f32_128x4": (lambda: affine_func((4, 4096), 1, "f32", "f32", init=True, final=True),
                         {}, ["ld.global.nc.v4", "st.global.v4", "shfl.sync.up", "shfl.sync.bfly"]),
    "affine_f64_rev": (lambda: affine_func((4, 4096), 1, "f64", "f64", final=True, reverse=True),
                       {"items_per_thread": 2}, ["ld.global.nc.v2.b64", "st.global.v2.b64", "shfl.sync.up"]),
    "affine_i64_one_warp": (lambda: affine_func((4, 1000), 1, "i64", "i64", init=True), {"block_size": 32},
                            ["shfl.sync.idx"]),
    "affine_time_blocks_2p26": (lambda: affine_func((1, 1 << 26), 1, "f32", "f32", init=True, final=True),
                                {"time_blocks": "always"}, ["ld.global.nc.v4", "shfl.sync.up"]),
}


@pytest.mark.parametrize("case", sorted(_PTXAS_CASES))
def test_new_kernels_assemble_without_spills(case):
    from xdsl.context import Context

    from scanweaver.rewrites.blelloch_gpu import ScanToGpu
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    if not ptxas_available():
        pytest.skip("ptxas not on PATH: register/spill figures need it")
    build, options, needles = _PTXAS_CASES[case]
    for chip in ("sm_80", "sm_90"):
        module = parse_ir(build())
        ScanToGpu(**options).apply(Context(), module)
        out = export_gpu(module, chip=chip)
        (ptx,) = out["ptx"].values()
        for needle in needles:
            assert needle in ptx, (chip, needle)
        assert out["ptxas"], chip
        for kernel, info in out["ptxas"].items():
            assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (chip, kernel, info)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("el", ["f32", "i32"])
@pytest.mark.parametrize("length", [0, 257, 300])
def test_time_blocks_with_vector_loads_and_warp_scans(reverse, el, length):
    """Three launches (reduce, carries, chunks) of 32 x 4-step tiles, 2-tile chunks: full
    chunks read by 16-byte loads, the rest guarded; bit for bit in i32."""
    from xdsl.context import Context

    from scanweaver.rewrites.blelloch_gpu import ScanToGpu

    dt = {"f32": np.float32, "i32": np.int32}[el]
    text = affine_func((2, length), 1, el, el, init=True, final=True, reverse=reverse)
    rng = np.random.default_rng(length)
    if el == "i32":
        a, b = (rng.integers(-2**31, 2**31 - 1, (2, length), dtype=np.int64).astype(dt) for _ in range(2))
        h0 = rng.integers(-1000, 1000, 2).astype(dt)
    else:
        a, b = rng.uniform(0.5, 1.0, (2, length)).astype(dt), rng.uniform(-1, 1, (2, length)).astype(dt)
        h0 = rng.uniform(-1, 1, 2).astype(dt)
    args = [a, b, h0, np.full((2, length), 77, dt), np.full(2, 77, dt)]
    ref, got = [x.copy() for x in args], [x.copy() for x in args]
    run_function(text, "f", *ref)
    m = parse_ir(text)
    ScanToGpu(block_size=32, items_per_thread=4, time_blocks="always", chunk_tiles=2).apply(Context(), m)
    stats: list = []
    with np.errstate(over="ignore"):
        simulate_launch(m, "f", *got, stats=stats, block_order=1)
    for r, g in zip(ref[3:], got[3:]):
        if el == "i32":
            np.testing.assert_array_equal(g, r)
        else:
            np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)
    if length >= 128 and length % 4 == 0:  # a full aligned tile in reduce and chunks
        assert stats[0]["vector_accesses"] > 0 and stats[-1]["vector_accesses"] > 0


@pytest.mark.parametrize("el,bs", [("f32", 32), ("i32", 32), ("i64", 64), ("f64", 128), ("f32", 8)])
def test_shared_bytes_described_as_the_ptx_declares(el, bs):
    from xdsl.context import Context

    from scanweaver.rewrites.blelloch_gpu import ScanToGpu
    from scanweaver.rewrites.launch import launch_descriptions
    from scanweaver.toolchain.gpu_export import export_gpu
    from scanweaver.toolchain.ptx import static_shared_bytes

    for tb in ("never", "always"):
        m = parse_ir(affine_func((2, 1 << 16), 1, el, el, init=True, final=True))
        ScanToGpu(block_size=bs, items_per_thread=4, time_blocks=tb).apply(Context(), m)
        (ptx,) = export_gpu(m, chip="sm_90")["ptx"].values()
        static = static_shared_bytes(ptx)
        for desc in launch_descriptions(m):
            assert static.get(desc.kernel_name, 0) == desc.shared_bytes, (tb, desc.kernel_name)
