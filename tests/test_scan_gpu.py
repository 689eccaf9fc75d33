"""`scan-to-gpu` on generic `scan.scan`: the chained-tile Blelloch kernel with a cloned
combine region, run in the thread-block simulator (races and barrier divergence
checked) against the sequential oracle (`run_function` on the original IR). Integer
combines must agree bit for bit, float ones within 1e-5. Small blocks (4 threads x 2
items) so that short axes span several chained tiles, partial tiles and idle threads."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects import gpu

from scanweaver.dialects import scan
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.scan_gpu import lower_scans

NP = {"i32": np.int32, "i64": np.int64, "f32": np.float32, "f64": np.float64}

# name: (element types, combine body over %a<j> (earlier) and %b<j> (later), yielded)
COMBINES = {
    "cumsum_i32": (["i32"], "%r = arith.addi %a0, %b0 : i32", "%r"),
    "cummax_i32": (["i32"], "%r = arith.maxsi %a0, %b0 : i32", "%r"),
    # (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2): associative, not commutative, wraps
    "affine_pair_i32": (
        ["i32", "i32"],
        "%ra = arith.muli %a0, %b0 : i32\n    %m = arith.muli %b0, %a1 : i32\n"
        "    %rb = arith.addi %m, %b1 : i32",
        "%ra, %rb",
    ),
    # keeps the earlier element: shows any swap of combine operands
    "first_i64": (["i64"], "", "%a0"),
    # (max, index of its first occurrence in scan order), mixed types
    "argmax_f32_i32": (
        ["f32", "i32"],
        "%gt = arith.cmpf ogt, %b0, %a0 : f32\n    %v = arith.select %gt, %b0, %a0 : f32\n"
        "    %i = arith.select %gt, %b1, %a1 : i32",
        "%v, %i",
    ),
    "cumsum_f32": (["f32"], "%r = arith.addf %a0, %b0 : f32", "%r"),
    "affine_pair_f32": (
        ["f32", "f32"],
        "%ra = arith.mulf %a0, %b0 : f32\n    %m = arith.mulf %b0, %a1 : f32\n"
        "    %rb = arith.addf %m, %b1 : f32",
        "%ra, %rb",
    ),
    "max_via_scf_if_f64": (
        ["f64"],
        "%gt = arith.cmpf ogt, %b0, %a0 : f64\n"
        "    %r = scf.if %gt -> (f64) {\n      scf.yield %b0 : f64\n    } else {\n"
        "      scf.yield %a0 : f64\n    }",
        "%r",
    ),
}


def memref(shape, t: str) -> str:
    return "memref<" + "".join(f"{d}x" for d in shape) + f"{t}>"


def scan_text(name, shape, axis, reverse=False, *, in_place=False, prelude="") -> str:
    """`func.func @f(x0.., y0..)` holding one scan.scan of combine `name` (`shape` may
    hold "?" for dynamic sizes)."""
    types, body, results = COMBINES[name]
    k = len(types)
    ins = [f"%x{j}" for j in range(k)]
    outs = ins if in_place else [f"%y{j}" for j in range(k)]
    mts = [memref(shape, t) for t in types]
    params = [f"%x{j}: {mts[j]}" for j in range(k)]
    if not in_place:
        params += [f"%y{j}: {mts[j]}" for j in range(k)]
    bargs = [f"%a{j}: {t}" for j, t in enumerate(types)] + [f"%b{j}: {t}" for j, t in enumerate(types)]
    return (
        f"func.func @f({', '.join(params)}) {{\n{prelude}"
        f"  scan.scan ins({', '.join(ins)} : {', '.join(mts)}) outs({', '.join(outs)} : {', '.join(mts)}) "
        f"axis {axis}{' reverse' if reverse else ''} {{\n"
        f"  ^bb0({', '.join(bargs)}):\n    {body}\n    scan.yield {results} : {', '.join(types)}\n  }}\n"
        "  func.return\n}\n"
    )


def inputs(name, shape, seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for j, t in enumerate(COMBINES[name][0]):
        if t.startswith("i"):
            if name.startswith("argmax"):
                out.append(rng.integers(0, 1000, size=shape).astype(NP[t]))
            else:
                info = np.iinfo(NP[t])
                out.append(rng.integers(info.min, info.max, size=shape, dtype=NP[t], endpoint=True))
        elif name.startswith("argmax"):  # few distinct values: ties must keep the first
            out.append(rng.integers(0, 5, size=shape).astype(NP[t]))
        elif name == "affine_pair_f32" and j == 0:
            out.append(rng.uniform(0.5, 1.0, size=shape).astype(NP[t]))
        else:
            out.append(rng.uniform(-1.0, 1.0, size=shape).astype(NP[t]))
    return out


def lower(text: str, block_size=4, items_per_thread=2):
    m = parse_ir(text)
    ScanToGpu(block_size=block_size, items_per_thread=items_per_thread).apply(Context(), m)
    m.verify()
    assert not any(isinstance(o, scan.ScanOp) for o in m.walk()), "scan.scan was not lowered"
    return m


def check(name, shape, axis, reverse=False, *, block_size=4, items_per_thread=2, dynamic=(), in_place=False,
          prelude="", seed=0):
    dyn_shape = ["?" if i in dynamic else d for i, d in enumerate(shape)]
    text = scan_text(name, dyn_shape, axis, reverse, in_place=in_place, prelude=prelude)
    xs = inputs(name, shape, seed)
    args = xs if in_place else xs + [np.full_like(x, 77) for x in xs]  # garbage: every element is written
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(text, "f", *ref)
    m = lower(text, block_size, items_per_thread)
    simulate_launch(m, "f", *got)
    for r, g in zip(ref, got):
        if g.dtype.kind == "f" and not name.startswith(("argmax", "max")):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, r)  # bit for bit
    return m


# ------------------------------------------------------------------------------ combines


@pytest.mark.parametrize("reverse", [False, True], ids=["fwd", "rev"])
@pytest.mark.parametrize("name", sorted(COMBINES))
def test_combines_multi_tile(name, reverse):
    # 8-step tiles: 37 steps = 4 full tiles + a partial one (5 valid steps: idle threads)
    check(name, (2, 37), 1, reverse)


@pytest.mark.parametrize("length", [0, 1, 2, 3, 7, 8, 9, 16, 17])
def test_lengths_around_tiles(length):
    check("affine_pair_i32", (2, length), 1)


@pytest.mark.parametrize("length", [0, 1, 5, 8, 11])
def test_lengths_reverse_non_commutative(length):
    check("first_i64", (3, length), 1, reverse=True)


@pytest.mark.parametrize(
    "shape,axis,reverse",
    [((13, 3), 0, False), ((11, 2), 0, True), ((3, 10, 2), 1, False), ((2, 3, 9), 2, True),
     ((9, 2, 2), 0, False), ((19,), 0, True)],
)
def test_shapes_and_axes(shape, axis, reverse):
    check("affine_pair_i32", shape, axis, reverse)
    check("argmax_f32_i32", shape, axis, reverse, seed=1)


@pytest.mark.parametrize("bs,ipt", [(1, 1), (1, 3), (2, 1), (8, 3), (16, 1)])
def test_block_shapes(bs, ipt):
    check("affine_pair_i32", (2, 23), 1, block_size=bs, items_per_thread=ipt)


def test_f32_large_block_single_tile():
    check("cumsum_f32", (2, 100), 1, block_size=32, items_per_thread=4)


# ------------------------------------------------------------------------------ forms


def test_dynamic_sizes_and_launch_grid():
    m = check("cummax_i32", (3, 2, 14), 2, dynamic=(0, 2))
    (desc,) = launch_descriptions(m)
    assert desc.grid == ("y0.shape[0]*2", 1, 1)
    assert desc.resolve_grid({"y0": (5, 2, 14)}) == (10, 1, 1)


def test_in_place():
    """outs are the ins: each element is read and then written by the same thread."""
    m = check("affine_pair_i32", (2, 21), 1, True, in_place=True)
    (desc,) = launch_descriptions(m)
    assert [(n, k) for n, k, _, _ in desc.args] == [("x0", "inout"), ("x1", "inout")]


def test_combine_uses_outside_constant():
    # a (+) b = a + b + c is associative for a constant c
    COMBINES["plus_c_i32"] = (["i32"], "%s = arith.addi %a0, %b0 : i32\n    %r = arith.addi %s, %c : i32", "%r")
    try:
        check("plus_c_i32", (2, 19), 1, prelude="  %c = arith.constant 12345 : i32\n")
    finally:
        del COMBINES["plus_c_i32"]


def test_left_alone_when_combine_reads_memory():
    text = """
func.func @f(%x: memref<8xf32>, %y: memref<8xf32>, %w: memref<1xf32>) {
  %c0 = arith.constant 0 : index
  scan.scan ins(%x : memref<8xf32>) outs(%y : memref<8xf32>) axis 0 {
  ^bb0(%a: f32, %b: f32):
    %s = memref.load %w[%c0] : memref<1xf32>
    %r = arith.addf %a, %b : f32
    scan.yield %r : f32
  }
  func.return
}"""
    m = parse_ir(text)
    before = print_ir(m)
    (why,) = lower_scans(m, 4, 2).values()
    assert "memref" in why
    assert print_ir(m) == before


def test_structure_and_launch_description():
    m = lower(scan_text("argmax_f32_i32", (4, 64), 1), block_size=8, items_per_thread=4)
    (k,) = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    assert "gpu.kernel" in k.attributes
    # per tile (warp-shuffle scan): 1 before reading the carry (and the warp totals),
    # 1 before the next carry is posted
    assert sum(isinstance(o, gpu.BarrierOp) for o in k.walk()) == 2
    # 3 Kogge-Stone steps and the exclusive shift, for both operands
    assert sum(o.name == "gpu.shuffle" for o in k.walk()) == 8
    (desc,) = launch_descriptions(m)
    assert desc.kernel_name == "scan_generic_0" and desc.grid == (4, 1, 1) and desc.block == (8, 1, 1)
    assert [a[:3] for a in desc.args] == [
        ("x0", "in", "f32"), ("x1", "in", "i32"), ("y0", "out", "f32"), ("y1", "out", "i32")
    ]
    assert desc.host_args == (0, 1, 2, 3)
    # s0, s1 (8 x 4 bytes each), c0, c1 (4 bytes, 16-byte aligned)
    assert desc.shared_bytes == 32 + 32 + 16 + 4


def test_full_gpu_pipeline():
    """scanweaver-lower{target=gpu}: no scan op left, result still exact."""
    from scanweaver import compiler

    text = scan_text("affine_pair_i32", (3, 20), 1, True)
    low = compiler.lower(text, "gpu").module
    assert not any(o.dialect_name() == "scan" for o in low.walk())
    xs = inputs("affine_pair_i32", (3, 20))
    args = xs + [np.zeros_like(x) for x in xs]
    ref = [a.copy() for a in args]
    run_function(text, "f", *ref)
    simulate_launch(low, "f", *args)
    for r, g in zip(ref, args):
        np.testing.assert_array_equal(g, r)


# ------------------------------------------------------------------------------ PTX (sm_90)

PTX_CASES = {
    "cumsum_i32": ((64, 4096), 1, False),
    "affine_pair_f32": ((64, 4096), 1, True),
    "argmax_f32_i32": ((4096, 8, 8), 0, False),
}


@pytest.mark.parametrize("name", sorted(PTX_CASES))
def test_kernel_sm90_ptxas(name):
    shape, axis, reverse = PTX_CASES[name]
    m = lower(scan_text(name, shape, axis, reverse), block_size=128, items_per_thread=4)
    out = export_gpu(m, "sm_90")
    (ptx,) = out["ptx"].values()
    (desc,) = out["launches"]
    assert f".entry {desc.kernel_name}(" in ptx and "bar.sync" in ptx
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    info = out["ptxas"][desc.kernel_name]
    print(name, info)
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, out["warnings"]
    assert info["stack_bytes"] == 0
    assert info["shared_bytes"] == desc.shared_bytes
