"""`scan.affine` parallel in time across blocks (rewrites/affine_time_blocks.py): several
blocks per channel, three launches passing chunk aggregates and carries through scratch
memory.  Checked in the thread-block simulator (permuted block orders, cross-block race
check) against the interpreter, through the CUDA runtime with a driver whose launches run
in the simulator, and with ptxas at 2^26 steps."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from xdsl.context import Context

from scanweaver.interp.gpu_sim import GpuSimError, run_kernel, simulate_launch
from scanweaver.interp.run import _from_shaped, _to_shaped, make_interpreter, run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR, prefer_time_blocks
from scanweaver.workloads.scans import affine_scan_ir

BS, IPT, TILES = 4, 2, 2  # chunk = 16 steps
CHUNK = BS * IPT * TILES


def lower(text: str, time_blocks: str = "always"):
    m = parse_ir(text)
    ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks=time_blocks, chunk_tiles=TILES).apply(Context(), m)
    return m


def affine_args(shape, dtype, state, init: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    if np.dtype(state).kind == "i":
        a, b = (rng.integers(-(2**30), 2**30, shape).astype(state) for _ in range(2))
        h0 = rng.integers(-(2**30), 2**30, shape[:-1]).astype(state)
    else:
        a = rng.uniform(-1.05, 1.05, shape).astype(dtype)
        b = rng.uniform(-1, 1, shape).astype(dtype)
        h0 = rng.uniform(-1, 1, shape[:-1]).astype(state)
    return [a, b] + ([h0] if init else []) + [np.zeros(shape, state), np.zeros(shape[:-1], state)]


def run_both(text, args, **sim):
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    got = [x.copy() for x in args]
    simulate_launch(lower(text), "f", *got, **sim)
    return ref[-2:], got[-2:]


@pytest.mark.parametrize("length", [0, 1, 2, 15, 17, 33, 65])
@pytest.mark.parametrize("reverse", [False, True])
def test_f32_lengths_init_final_reverse(length, reverse):
    shape = (2, length)
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True, reverse=reverse)
    (h_ref, f_ref), (h, f) = run_both(text, affine_args(shape, np.float32, np.float32, True, seed=length))
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(f, f_ref, rtol=2e-5, atol=2e-6)
    if length:
        np.testing.assert_allclose(f, h[:, 0] if reverse else h[:, -1], rtol=2e-6, atol=1e-7)
        # the first chunk starts from init: its first item is the loop's own first step
        first = 0 if not reverse else -1
        np.testing.assert_array_equal(h[:, first], h_ref[:, first])


@pytest.mark.parametrize("state", ["i32", "i64"])
@pytest.mark.parametrize("reverse", [False, True])
def test_integers_bit_exact(state, reverse):
    shape = (3, 2 * CHUNK + 1)
    text = affine_scan_ir(("?", "?"), 1, state, state, init=True, final=True, reverse=reverse)
    (h_ref, f_ref), (h, f) = run_both(text, affine_args(shape, np.dtype(state.replace("i", "int")), np.dtype(state.replace("i", "int")), True))
    np.testing.assert_array_equal(h, h_ref)
    np.testing.assert_array_equal(f, f_ref)


def test_static_3d_axis0_f64_without_init():
    shape = (2 * CHUNK - 1, 2, 3)
    text = affine_scan_ir(shape, 0, "f64", "f64", final=True)
    rng = np.random.default_rng(3)
    a, b = rng.uniform(-1.1, 1.1, shape), rng.uniform(-1, 1, shape)
    args = [a, b, np.zeros(shape), np.zeros(shape[1:])]
    (h_ref, f_ref), (h, f) = run_both(text, args)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(f, h[-1], rtol=1e-13)


def test_f16_inputs_f32_state():
    shape = (1, 3 * CHUNK + 3)
    text = affine_scan_ir(("?", "?"), 1, "f16", "f32", init=True, final=True)
    (h_ref, _), (h, _) = run_both(text, affine_args(shape, np.float16, np.float32, True))
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-6)


def test_any_block_order_gives_the_same_bits():
    shape = (2, 3 * CHUNK + 5)
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    args = affine_args(shape, np.float32, np.float32, True, seed=7)
    m = lower(text)
    forward = [x.copy() for x in args]
    simulate_launch(m, "f", *forward)
    for order in ("reverse", 1, 2):
        permuted = [x.copy() for x in args]
        simulate_launch(m, "f", *permuted, block_order=order)
        for x, y in zip(forward[-2:], permuted[-2:]):
            np.testing.assert_array_equal(x, y)


def test_inf_input_redoes_the_channel_like_the_one_block_kernel():
    shape = (2, 3 * CHUNK)
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    args = affine_args(shape, np.float32, np.float32, True, seed=5)
    args[0][0, CHUNK + 3] = np.inf  # channel 0 holds an Inf; channel 1 stays time-parallel
    got = [x.copy() for x in args]
    simulate_launch(lower(text), "f", *got)
    chained = [x.copy() for x in args]
    simulate_launch(lower(text, "never"), "f", *chained)
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    np.testing.assert_array_equal(got[-2][0], chained[-2][0])
    np.testing.assert_array_equal(got[-1][0], chained[-1][0])
    # Inf/NaN propagate as in the loop (same non-finite pattern)
    np.testing.assert_array_equal(np.isfinite(got[-2][0]), np.isfinite(ref[-2][0]))
    np.testing.assert_allclose(got[-2][1], ref[-2][1], rtol=2e-5, atol=2e-6)


def test_strong_decay_keeps_the_time_blocks_finite():
    # a = 0.5: chunk products underflow f32 (the one-block kernel's tiles poison them),
    # the f64 aggregates do not; the result matches the loop
    shape = (1, 6 * CHUNK)
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", final=True)
    rng = np.random.default_rng(2)
    a = np.full(shape, 0.5, np.float32)
    b = rng.uniform(-1, 1, shape).astype(np.float32)
    (h_ref, f_ref), (h, f) = run_both(text, [a, b, np.zeros(shape, np.float32), np.zeros(1, np.float32)])
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-6)


def test_launch_descriptions_and_grid_formula():
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    m = lower(text)
    descs = launch_descriptions(m)
    assert [d.kernel_name.rsplit("_", 1)[-1] for d in descs] == ["reduce", "carries", "chunks"]
    shapes = {"a": (3, 100), "b": (3, 100), "h": (3, 100)}
    assert descs[0].resolve_grid(shapes) == (3 * 7, 1, 1)  # ceil(100 / 16) chunks
    assert descs[0].scratch_shape("agg_a", shapes) == (3, 7)
    assert descs[2].resolve_grid({**shapes, "h": (3, 0)}) == (3, 1, 1)  # one block writes final
    # the scratch buffers are numbered -2 - j and shared by the launches that use them
    assert descs[0].host_args == (0, 1, -2, -3)
    assert descs[1].host_args == (-2, -3, 2, -4, -5)
    assert descs[2].host_args == (0, 1, 2, -4, -5, 3, 4)
    # the host IR's grids are the descriptions' grids
    seen = []

    def on_launch(kernel, grid, block, kargs):
        d = next(x for x in descs if x.kernel_name == kernel)
        seen.append((grid, d.resolve_grid({a[0]: tuple(v.shape) for a, v in zip(d.args, kargs)})))

    args = affine_args((3, 37), np.float32, np.float32, True)
    simulate_launch(m, "f", *args, on_launch=on_launch)
    assert len(seen) == 3 and all(g == r for g, r in seen), seen
    assert seen[0][0] == (3 * 3, 1, 1)


def test_strategy_choice():
    assert prefer_time_blocks(1, 1 << 26, 8192) and prefer_time_blocks(263, 16384, 8192)
    assert not prefer_time_blocks(264, 1 << 20, 8192) and not prefer_time_blocks(8, 8191, 8192)
    # auto: static few channels and long rows take the time blocks; dynamic ones do not,
    # unless the op asks for them
    static = lower(affine_scan_ir((2, 2 * CHUNK), 1, "f32", "f32"), "auto")
    assert len(launch_descriptions(static)) == 3
    assert len(launch_descriptions(lower(affine_scan_ir(("?", "?"), 1, "f32", "f32"), "auto"))) == 1
    asked = affine_scan_ir(("?", "?"), 1, "f32", "f32").replace(
        "axis 1", f'axis 1 {{"{TIME_BLOCKS_ATTR}" = "time_blocks"}}'
    )
    assert len(launch_descriptions(lower(asked, "auto"))) == 3


def test_cross_block_race_is_caught():
    # every block writes h[0]: a real GPU gives any of the values
    text = """
    builtin.module attributes {gpu.container_module} {
      func.func @f(%h: memref<4xf32>) {
        %c1 = arith.constant 1 : index
        %c2 = arith.constant 2 : index
        "gpu.launch_func"(%c2, %c1, %c1, %c1, %c1, %c1, %h) <{kernel = @k::@w, operandSegmentSizes = array<i32: 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0>}> : (index, index, index, index, index, index, memref<4xf32>) -> ()
        func.return
      }
      "gpu.module"() <{sym_name = "k"}> ({
        "gpu.func"() <{function_type = (memref<4xf32>) -> ()}> ({
        ^bb0(%h: memref<4xf32>):
          %c0 = arith.constant 0 : index
          %v = arith.constant 1.0 : f32
          memref.store %v, %h[%c0] : memref<4xf32>
          "gpu.return"() : () -> ()
        }) {sym_name = "w", gpu.kernel} : () -> ()
      }) : () -> ()
    }
    """
    with pytest.raises(GpuSimError, match="cross-block race"):
        simulate_launch(text, "f", np.zeros(4, np.float32))


# -- the CUDA runtime runs the three launches (a driver whose launches run in the simulator) --


from scanweaver.runtime.cuda_driver import CudaDriver, DeviceBuffer  # noqa: E402


class SimulatorDriver(CudaDriver):
    """Device memory is numpy host memory; each launch decodes the memref descriptors
    from the kernel parameters and runs the kernel in the thread-block simulator."""

    name = "simulator"

    def __init__(self, module):
        self.module, self.interp = module, make_interpreter(module)
        self.buffers: dict[int, np.ndarray] = {}
        self.launches: list[tuple[str, tuple[int, int, int]]] = []

    def load_module(self, image):
        return image

    def get_function(self, module, name):
        return name

    def alloc(self, nbytes):
        buf = np.zeros(nbytes, np.uint8)
        self.buffers[buf.ctypes.data] = buf
        return DeviceBuffer(buf.ctypes.data, nbytes, buf)

    def upload(self, buffer, host):
        self.buffers[buffer.ptr][: host.nbytes] = np.frombuffer(np.ascontiguousarray(host).tobytes(), np.uint8)

    def download(self, host, buffer):
        host[...] = np.frombuffer(self.buffers[buffer.ptr][: host.nbytes].tobytes(), host.dtype).reshape(host.shape)

    def synchronize(self):
        pass

    def launch(self, name, grid, block, dynamic_shared, stream, params):
        from scanweaver.interp.gpu_sim import _lookup_kernel
        from xdsl.dialects.builtin import SymbolRefAttr

        self.launches.append((name, grid))
        kernel = _lookup_kernel(self.module, SymbolRefAttr("scanweaver_kernels", [name]))
        values, views, p = [], [], 0
        for t in kernel.function_type.inputs.data:
            rank = t.get_num_dims()
            ptr = params[p + 1].value or 0
            shape = tuple(int(params[p + 3 + i].value) for i in range(rank))
            p += 3 + 2 * rank
            from scanweaver.interp.run import numpy_dtype_for

            dtype = numpy_dtype_for(t.element_type)
            n = int(np.prod(shape, dtype=np.int64))
            base = next(a for a, buf in self.buffers.items() if a <= ptr < a + max(buf.nbytes, 1))
            raw = self.buffers[base][ptr - base : ptr - base + n * dtype.itemsize]
            arr = np.frombuffer(raw.tobytes(), dtype, count=n).reshape(shape)
            values.append(_to_shaped(arr, t, "arg"))
            views.append(raw)
        run_kernel(self.interp, kernel, grid, block, tuple(values))
        for raw, shaped, t in zip(views, values, kernel.function_type.inputs.data):
            from scanweaver.interp.run import numpy_dtype_for

            out = _from_shaped(shaped, numpy_dtype_for(t.element_type))
            raw[...] = np.frombuffer(np.ascontiguousarray(out).tobytes(), np.uint8)


def test_cuda_runtime_replays_the_three_launches_with_scratch():
    from scanweaver.runtime.cuda import CudaFunction, CudaModule

    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True, reverse=True)
    m = lower(text)
    driver = SimulatorDriver(m)
    descs = launch_descriptions(m)
    fn = CudaFunction(CudaModule("ptx", driver=driver), "f", descs, 5)
    args = affine_args((2, 3 * CHUNK + 1), np.float32, np.float32, True, seed=11)
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    fn(*args)
    assert [g for _, g in driver.launches] == [(8, 1, 1), (2, 1, 1), (8, 1, 1)]
    np.testing.assert_allclose(args[-2], ref[-2], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(args[-1], ref[-1], rtol=2e-5, atol=2e-6)
    assert ctypes.sizeof(ctypes.c_void_p) == 8


# -- ptxas at 2^26 steps on one channel ------------------------------------------------------


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_one_channel_2_pow_26(chip):
    from scanweaver.toolchain.gpu_export import MIN_PTX_FEATURES, export_gpu, ptxas_available

    n = 1 << 26
    m = parse_ir(affine_scan_ir((1, n), 1, "f32", "f32", init=True, final=True))
    ScanToGpu().apply(Context(), m)  # auto: one channel, long row -> time blocks
    descs = launch_descriptions(m)
    assert len(descs) == 3
    chunks = n // (128 * 4 * 16)
    assert [d.grid for d in descs] == [(chunks, 1, 1), (1, 1, 1), (chunks, 1, 1)]
    if not ptxas_available():
        pytest.skip("ptxas is not installed: PTX checked, not assembled")
    out = export_gpu(m, chip=chip, features=MIN_PTX_FEATURES[chip])
    assert set(out["ptxas"]) == {d.kernel_name for d in descs}
    for kernel, figures in out["ptxas"].items():
        assert figures["spill_stores"] == 0 and figures["spill_loads"] == 0, (kernel, figures)


def test_linear_scan_cuda_builds_the_time_blocks_for_one_long_channel(monkeypatch):
    """`linear_scan(..., backend="cuda")` picks the strategy by channels and length; the
    build (no GPU needed) replays three launches for one long channel, one otherwise."""
    from scanweaver.runtime import cuda_scan
    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    built = []
    monkeypatch.setattr(cuda_scan, "_run", lambda ir, name, arrays: built.append((ir, [x.shape for x in arrays])))
    a = np.full((1, 2 * cuda_scan.DEFAULT_TIME_CHUNK), 0.9, np.float32)
    cuda_scan.linear_scan_cuda(a, a.copy(), None, -1, True, True)
    cuda_scan.linear_scan_cuda(np.ones((300, 64), np.float32), np.ones((300, 64), np.float32), None, -1, False, True)
    (long_ir, _), (many_ir, _) = built
    assert TIME_BLOCKS_ATTR in long_ir and TIME_BLOCKS_ATTR not in many_ir
    art = build_cuda_artifacts(long_ir, "sm_90")
    assert [d.kernel_name.rsplit("_", 1)[-1] for d in art.launches["f"]] == ["reduce", "carries", "chunks"]
    assert len(build_cuda_artifacts(many_ir, "sm_90").launches["f"]) == 1


# -- generic scan.scan (rewrites/scan_time_blocks.py) ----------------------------------------------


def _generic(kind, shape, axis, reverse=False, in_place=False, **sim):
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_scan_gpu import inputs, scan_text

    dyn = ["?"] * len(shape)
    text = scan_text(kind, dyn, axis, reverse, in_place=in_place)
    xs = inputs(kind, shape)
    args = xs if in_place else xs + [np.zeros_like(x) for x in xs]
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    got = [x.copy() for x in args]
    simulate_launch(lower(text), "f", *got, **sim)
    return ref, got


@pytest.mark.parametrize("kind", ["cumsum_i32", "cummax_i32", "affine_pair_i32", "first_i64", "argmax_f32_i32"])
@pytest.mark.parametrize("length", [0, 17, 33])
def test_generic_exact_combines_bit_for_bit(kind, length):
    ref, got = _generic(kind, (2, length), 1, reverse=length == 33)
    for r, g in zip(ref, got):
        np.testing.assert_array_equal(g, r)


def test_generic_float_axis0_in_place_any_block_order():
    ref, got = _generic("affine_pair_f32", (2 * CHUNK + 3, 2), 0, in_place=True, block_order=3)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    _, forward = _generic("affine_pair_f32", (2 * CHUNK + 3, 2), 0, in_place=True)
    for f, g in zip(forward, got):
        np.testing.assert_array_equal(g, f)


def test_generic_runtime_replays_scan_then_propagate():
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_scan_gpu import inputs, scan_text

    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from scanweaver.runtime.cuda_program import _host_launches

    text = scan_text("argmax_f32_i32", ["?", "?"], 1, True)
    m = lower(text)
    launches, counts = _host_launches(m)
    assert [d.kernel_name for d in launches["f"]] == ["scan_generic_tb_0", "scan_generic_0", "scan_generic_tb_0_carry"]
    driver = SimulatorDriver(m)
    xs = inputs("argmax_f32_i32", (3, 2 * CHUNK + 5))
    args = xs + [np.zeros_like(x) for x in xs]
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    CudaFunction(CudaModule("ptx", driver=driver), "f", launches["f"], counts["f"])(*args)
    assert [g for _, g in driver.launches] == [(9, 1, 1), (3, 1, 1), (9, 1, 1)]
    for r, g in zip(ref, args):
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_generic_ptxas_one_channel_2_pow_26(chip):
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from test_scan_gpu import scan_text

    from scanweaver.toolchain.gpu_export import MIN_PTX_FEATURES, export_gpu, ptxas_available

    m = parse_ir(scan_text("argmax_f32_i32", [1, 1 << 26], 1))
    ScanToGpu().apply(Context(), m)
    descs = launch_descriptions(m)
    assert sorted(d.grid for d in descs) == sorted([(8192, 1, 1), (1, 1, 1), (8192, 1, 1)])
    if not ptxas_available():
        pytest.skip("ptxas is not installed: PTX checked, not assembled")
    out = export_gpu(m, chip=chip, features=MIN_PTX_FEATURES[chip])
    assert len(out["ptxas"]) == 3
    for kernel, figures in out["ptxas"].items():
        assert figures["spill_stores"] == 0 and figures["spill_loads"] == 0, (kernel, figures)


@pytest.mark.parametrize("length", [0, 5, 3 * CHUNK + 1])
def test_single_sequence_rank1(length):
    text = affine_scan_ir(("?",), 0, "f32", "f32", init=True, final=True)
    rng = np.random.default_rng(length)
    a = rng.uniform(-1.05, 1.05, length).astype(np.float32)
    b = rng.uniform(-1, 1, length).astype(np.float32)
    args = [a, b, np.array(0.5, np.float32), np.zeros(length, np.float32), np.zeros((), np.float32)]
    (h_ref, f_ref), (h, f) = run_both(text, args)
    np.testing.assert_allclose(h, h_ref, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(f, f_ref, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("chip", ["sm_90"])
def test_ptxas_bf16_inputs_and_i64_dynamic(chip):
    from scanweaver.toolchain.gpu_export import MIN_PTX_FEATURES, export_gpu, ptxas_available

    m = parse_ir(affine_scan_ir(("?", "?"), 1, "bf16", "f32", init=True, final=True, reverse=True))
    ScanToGpu(time_blocks="always").apply(Context(), m)
    m2 = parse_ir(affine_scan_ir(("?", "?", "?"), 0, "i64", "i64", init=True, final=True))
    ScanToGpu(time_blocks="always").apply(Context(), m2)
    if not ptxas_available():
        pytest.skip("ptxas is not installed: PTX checked, not assembled")
    for module in (m, m2):
        out = export_gpu(module, chip=chip, features=MIN_PTX_FEATURES[chip])
        assert len(out["ptxas"]) == 3
        for kernel, figures in out["ptxas"].items():
            assert figures["spill_stores"] == 0 and figures["spill_loads"] == 0, (kernel, figures)


def test_selective_scan_cuda_builds_the_time_blocks_for_few_long_channels(monkeypatch):
    """`selective_scan(..., backend="cuda")` asks for the recurrence time blocks when
    there are few (batch, channel) pairs and long rows; the build replays three launches."""
    from scanweaver.runtime import cuda_scan
    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    built = []
    monkeypatch.setattr(cuda_scan, "_run", lambda ir, name, arrays: built.append(ir))

    def call(batch, dim, length, n=4):
        rng = np.random.default_rng(0)
        u = rng.standard_normal((batch, dim, length)).astype(np.float32)
        A = -np.ones((dim, n), np.float32)
        B = np.ones((dim, n), np.float32)
        cuda_scan.selective_scan_cuda(u, np.abs(u), A, B, B.copy(), None, None, None, False, False, None)

    call(1, 2, 2 * cuda_scan.DEFAULT_TIME_CHUNK)
    call(2, 150, 64)
    long_ir, many_ir = built
    assert TIME_BLOCKS_ATTR in long_ir and TIME_BLOCKS_ATTR not in many_ir
    kernels = [d.kernel_name for d in build_cuda_artifacts(long_ir, "sm_90").launches["selective_scan"]]
    assert len(kernels) == 3 and kernels[0].endswith("reduce"), kernels
    assert len(build_cuda_artifacts(many_ir, "sm_90").launches["selective_scan"]) == 1
