"""Golden checks of `scan-to-gpu`: the generated kernels, run in the thread-block
simulator, against the sequential reference (`run_function` on the original IR)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scan_ir import affine_func
from xdsl.context import Context
from xdsl.dialects import gpu, scf
from xdsl.dialects.builtin import ModuleOp

from scanweaver.dialects.gpu_shuffle import ShuffleOp
from scanweaver.interp.gpu_sim import GpuSimError, simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import print_generic
from scanweaver.rewrites.launch import KernelLaunch, launch_descriptions

NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32, "i64": np.int64}


def lower(text: str, block_size: int = 4, items_per_thread: int = 2) -> ModuleOp:
    module = parse_ir(text)
    ScanToGpu(block_size=block_size, items_per_thread=items_per_thread).apply(Context(), module)
    module.verify()
    return module


def random_array(rng, shape, el: str) -> np.ndarray:
    if el in ("i32", "i64"):
        info = np.iinfo(NP[el])
        return rng.integers(info.min, info.max, size=shape, dtype=NP[el], endpoint=True)
    x = rng.uniform(-1.0, 1.0, size=shape)
    if el == "bf16":  # bf16 travels as its bit pattern (upper half of an f32)
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(NP[el])


def decay_array(rng, shape, el: str) -> np.ndarray:
    if el in ("i32", "i64"):
        return random_array(rng, shape, el)
    x = rng.uniform(0.5, 1.0, size=shape)
    if el == "bf16":
        return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return x.astype(NP[el])


def check(
    shape,
    axis,
    in_el="f32",
    state_el="f32",
    *,
    init=False,
    final=False,
    reverse=False,
    block_size=4,
    items_per_thread=2,
    dynamic=(),
    seed=0,
):
    """Simulated kernel == sequential reference (bit for bit for ints, 1e-5 for floats)."""
    text = affine_func(shape, axis, in_el, state_el, init=init, final=final, reverse=reverse)
    if dynamic:  # make the listed dims dynamic in every memref type of the function
        text = _make_dynamic(text, shape, axis, dynamic)
    rng = np.random.default_rng(seed)
    ch = [d for i, d in enumerate(shape) if i != axis]
    a = decay_array(rng, shape, in_el)
    b = random_array(rng, shape, in_el)
    args = [a, b]
    if init:
        args.append(random_array(rng, ch, state_el))
    h_pos = len(args)
    args.append(np.zeros(shape, NP[state_el]))
    if final:
        args.append(np.zeros(ch, NP[state_el]))
    ref = [x.copy() for x in args]
    got = [x.copy() for x in args]
    # Garbage in the outputs: the kernel must write every element.
    got[h_pos][...] = 77
    run_function(text, "f", *ref)
    module = lower(text, block_size, items_per_thread)
    simulate_launch(module, "f", *got)
    for r, g in zip(ref[h_pos:], got[h_pos:]):
        if state_el.startswith("i"):
            np.testing.assert_array_equal(g, r)
        else:
            np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-6)
    return module


def _make_dynamic(text: str, shape, axis, dynamic) -> str:
    def sub(dims):
        return "x".join(str(d) for d in dims)

    full = list(shape)
    dyn_full = ["?" if i in dynamic else d for i, d in enumerate(full)]
    ch = [d for i, d in enumerate(full) if i != axis]
    dyn_ch = [("?" if i in dynamic else d) for i, d in enumerate(full) if i != axis]
    text = text.replace(f"memref<{sub(full)}x", f"memref<{sub(dyn_full)}x")
    if ch:
        text = text.replace(f"memref<{sub(ch)}x", f"memref<{sub(dyn_ch)}x")
    return text


# ---------------------------------------------------------------------------------- basics


def test_single_tile_power_of_two():
    check((2, 8), 1)


@pytest.mark.parametrize("length", [1, 3, 7, 13, 37])
def test_non_power_of_two_lengths(length):
    check((2, length), 1)


def test_length_zero_writes_init_to_final():
    check((3, 0), 1, init=True, final=True)


@pytest.mark.parametrize("reverse", [False, True])
def test_init_final_reverse(reverse):
    check((3, 21), 1, init=True, final=True, reverse=reverse)


def test_multi_tile_chained_carry():
    # 8 threads x 3 items = 24-step tiles; 100 steps = 5 tiles, the last partial.
    check((2, 100), 1, init=True, final=True, block_size=8, items_per_thread=3)


def test_multi_tile_reverse():
    check((2, 50), 1, final=True, reverse=True, block_size=4, items_per_thread=2)


def test_many_channels_3d_middle_axis():
    # channels (2, 3) -> 6 blocks, delinearised in the kernel.
    check((2, 11, 3), 1, init=True, final=True)


def test_axis_zero():
    check((9, 3), 0, init=True, final=True, reverse=True)


def test_rank_one():
    check((19,), 0, init=True, final=True)


@pytest.mark.parametrize("bs,ipt", [(1, 1), (1, 4), (2, 1), (8, 1), (16, 2)])
def test_block_shapes(bs, ipt):
    check((2, 23), 1, init=True, block_size=bs, items_per_thread=ipt)


# ------------------------------------------------------------------------------ element types


def test_i32_bit_for_bit_wraps():
    check((3, 29), 1, "i32", "i32", init=True, final=True)


def test_i32_reverse_multi_tile():
    check((2, 41), 1, "i32", "i32", final=True, reverse=True, block_size=4, items_per_thread=3)


def test_i64():
    check((2, 13), 1, "i64", "i64", init=True, final=True)


def test_f64():
    check((2, 17), 1, "f64", "f64", init=True, final=True)


def test_f16_inputs_f32_state():
    check((2, 19), 1, "f16", "f32", init=True, final=True)


def test_bf16_inputs_f32_state():
    check((2, 19), 1, "bf16", "f32", final=True, reverse=True)


# ------------------------------------------------------------------------------ dynamic shapes


def test_dynamic_length():
    module = check((3, 27), 1, init=True, final=True, dynamic=(1,))
    (desc,) = launch_descriptions(module)
    assert desc.grid == (3, 1, 1)
    assert desc.args[0][3] == (3, "?")


def test_dynamic_channels_and_length():
    module = check((2, 3, 14), 2, init=True, final=True, dynamic=(0, 2))
    (desc,) = launch_descriptions(module)
    assert desc.grid == ("h.shape[0]*3", 1, 1)
    assert desc.resolve_grid({"h": (5, 3, 14)}) == (15, 1, 1)


# ------------------------------------------------------------------------------ random shapes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    rank=st.integers(1, 3),
    reverse=st.booleans(),
    init=st.booleans(),
    final=st.booleans(),
    bs=st.sampled_from([1, 2, 4, 8]),
    ipt=st.integers(1, 3),
)
def test_random_shapes(data, rank, reverse, init, final, bs, ipt):
    shape = tuple(data.draw(st.integers(1, 3)) for _ in range(rank))
    axis = data.draw(st.integers(0, rank - 1))
    shape = shape[:axis] + (data.draw(st.integers(0, 30)),) + shape[axis + 1 :]
    check(shape, axis, init=init, final=final, reverse=reverse, block_size=bs, items_per_thread=ipt)


# ------------------------------------------------------------------------------ structure


def test_structure_and_launch_description():
    text = affine_func((4, 64), 1, "f32", "f32", init=True, final=True)
    module = lower(text, block_size=8, items_per_thread=4)
    assert "gpu.container_module" in module.attributes
    kernels = [op for op in module.walk() if isinstance(op, gpu.FuncOp)]
    assert len(kernels) == 1
    k = kernels[0]
    assert k.kernel is not None and "gpu.kernel" in k.attributes
    # One warp: the in-tile scan and the carry broadcast are shuffles; the only barrier
    # is in the loop of the overflow fallback (sequential entry states of a flagged tile).
    assert sum(isinstance(op, gpu.BarrierOp) for op in k.walk()) == 1
    # 3 Kogge-Stone steps x (a, b), the exclusive shift (a, b), the 3-step verdict, the carry
    assert sum(isinstance(op, ShuffleOp) for op in k.walk()) == 12
    (desc,) = launch_descriptions(module)
    assert desc == KernelLaunch(
        kernel_name="scan_affine_0",
        module_name="scanweaver_kernels",
        grid=(4, 1, 1),
        block=(8, 1, 1),
        shared_bytes=4,  # one warp: only the carry slot of the overflow fallback
        args=[
            ("a", "in", "f32", (4, 64)),
            ("b", "in", "f32", (4, 64)),
            ("init", "in", "f32", (4,)),
            ("h", "out", "f32", (4, 64)),
            ("final", "out", "f32", (4,)),
        ],
        func_name="f",
        host_args=(0, 1, 2, 3, 4),
        equal_dims=(("a", 0, "h", 0), ("a", 1, "h", 1), ("b", 0, "h", 0), ("b", 1, "h", 1),
                    ("init", 0, "h", 0), ("final", 0, "h", 0)),
        notes=desc.notes,
    )
    assert desc.param_count() == 31  # 3 + 2 * rank per memref, as in the PTX
    # The description survives printing (generic form) and parsing back.
    again = parse_ir(print_generic(module))
    assert launch_descriptions(again) == [desc]


def test_two_scans_two_kernels():
    text = (
        "func.func @f(%a: memref<2x9xf32>, %b: memref<2x9xf32>, %h: memref<2x9xf32>, "
        "%x: memref<9xi32>, %hx: memref<9xi32>) {\n"
        "  scan.affine %a, %b into %h axis 1 : memref<2x9xf32>, memref<2x9xf32> -> memref<2x9xf32>\n"
        "  scan.affine %x, %x into %hx axis 0 reverse : memref<9xi32>, memref<9xi32> -> memref<9xi32>\n"
        "  func.return\n}\n"
    )
    module = lower(text)
    names = [d.kernel_name for d in launch_descriptions(module)]
    assert names == ["scan_affine_0", "scan_affine_1"]
    rng = np.random.default_rng(1)
    args = [
        random_array(rng, (2, 9), "f32"),
        random_array(rng, (2, 9), "f32"),
        np.zeros((2, 9), np.float32),
        random_array(rng, (9,), "i32"),
        np.zeros(9, np.int32),
    ]
    ref = [x.copy() for x in args]
    run_function(text, "f", *ref)
    simulate_launch(module, "f", *args)
    np.testing.assert_allclose(args[2], ref[2], rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(args[4], ref[4])


def test_bad_options():
    from scanweaver.errors import ScanWeaverError

    with pytest.raises(ScanWeaverError, match="power of two"):
        lower(affine_func((2, 8), 1, "f32", "f32"), block_size=6)


# ------------------------------------------------------------------------------ simulator errors


def _kernel(module: ModuleOp) -> gpu.FuncOp:
    return next(op for op in module.walk() if isinstance(op, gpu.FuncOp))


def _args(shape):
    rng = np.random.default_rng(0)
    return [random_array(rng, shape, "f32"), random_array(rng, shape, "f32"), np.zeros(shape, np.float32)]


def test_simulator_detects_missing_barrier_race():
    # two warps: the warp totals and the carry go through shared memory
    module = lower(affine_func((1, 128), 1, "f32", "f32"), block_size=64, items_per_thread=1)
    for op in list(_kernel(module).walk()):
        if isinstance(op, gpu.BarrierOp):
            op.detach()
            op.erase()
    with pytest.raises(GpuSimError, match="race"):
        simulate_launch(module, "f", *_args((1, 128)))


def test_simulator_detects_barrier_divergence():
    module = lower(affine_func((1, 13), 1, "f32", "f32"), block_size=4, items_per_thread=2)
    # A barrier inside the first `if t < end` (a thread's first load): in the second
    # tile only threads 0..2 reach it, thread 3 runs on to a gpu.shuffle.
    guarded = next(op for op in _kernel(module).walk() if isinstance(op, scf.IfOp))
    guarded.true_region.block.insert_op_before(gpu.BarrierOp(), guarded.true_region.block.first_op)
    with pytest.raises(GpuSimError, match="divergence"):
        simulate_launch(module, "f", *_args((1, 13)))


def test_simulator_thread_and_block_ids():
    # A tiny hand-built kernel: out[block, thread] = block * 100 + thread + grid*1000 + bdim*10000
    from xdsl.dialects import arith, func, memref
    from xdsl.dialects.builtin import FunctionType, IndexType, MemRefType, StringAttr, SymbolRefAttr, UnitAttr, i64
    from xdsl.ir import Block, Region

    t = MemRefType(i64, [3, 4])
    kfunc = gpu.FuncOp("k", FunctionType.from_lists([t], []), kernel=True)
    blk = kfunc.body.block
    x = gpu.DimensionAttr(gpu.DimensionEnum.X)
    ops = [
        tid := gpu.ThreadIdOp(x),
        bid := gpu.BlockIdOp(x),
        gd := gpu.GridDimOp(x),
        bd := gpu.BlockDimOp(x),
        c100 := arith.ConstantOp.from_int_and_width(100, IndexType()),
        c1000 := arith.ConstantOp.from_int_and_width(1000, IndexType()),
        c10000 := arith.ConstantOp.from_int_and_width(10000, IndexType()),
        v1 := arith.MuliOp(bid, c100),
        v2 := arith.AddiOp(v1, tid),
        v3 := arith.MuliOp(gd, c1000),
        v4 := arith.AddiOp(v2, v3),
        v5 := arith.MuliOp(bd, c10000),
        v6 := arith.AddiOp(v4, v5),
        cast := arith.IndexCastOp(v6, i64),
        memref.StoreOp.get(cast, blk.args[0], [bid, tid]),
        gpu.ReturnOp([]),
    ]
    blk.add_ops(ops)
    kmod = gpu.ModuleOp(StringAttr("m"), Region(Block([kfunc])))
    host_block = Block(arg_types=[t])
    h = [
        c3 := arith.ConstantOp.from_int_and_width(3, IndexType()),
        c4 := arith.ConstantOp.from_int_and_width(4, IndexType()),
        c1 := arith.ConstantOp.from_int_and_width(1, IndexType()),
        gpu.LaunchFuncOp(SymbolRefAttr("m", ["k"]), [c3, c1, c1], [c4, c1, c1], kernelOperands=[host_block.args[0]]),
        func.ReturnOp(),
    ]
    host_block.add_ops(h)
    fn = func.FuncOp("f", FunctionType.from_lists([t], []), Region(host_block))
    module = ModuleOp([kmod, fn])
    module.attributes["gpu.container_module"] = UnitAttr()
    module.verify()
    out = np.zeros((3, 4), np.int64)
    simulate_launch(module, "f", out)
    want = np.arange(3)[:, None] * 100 + np.arange(4)[None, :] + 3000 + 40000
    np.testing.assert_array_equal(out, want)
