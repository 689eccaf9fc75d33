"""The associative raise's producer reading values from above the loop (issue 14): a
scalar function argument (`h = max(h, x[t] * scale)`), pure arith on arguments, a
`memref.dim`, a load before the loop from a memref the kernel does not write.  The
seeded kernel (`rewrites/scan_seed_gpu.py`) rebuilds those values itself, the function
arguments they start from passed as kernel arguments.  The thread-block simulator and
the CUDA runtime (simulator driver) against the interpreter, bit for bit; ptxas."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from test_gpu_seeded_scan import ScalarSimulatorDriver, gpu_module
from xdsl.dialects import func

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import refusals
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.runtime.cuda_program import _host_launches
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

LENGTHS = [0, 1, 2, 7, 8, 9, 16, 17]  # around the tile of 4 threads x 2 items


def form(el: str, body: str, above: str = "", args: str = "") -> str:
    """A running max of `%xo` (computed by `body` from `%xv = x[t]`), every value stored."""
    mx = "arith.maximumf" if el.startswith("f") else "arith.maxsi"
    return f"""
func.func @run(%x: memref<?x{el}>, %y: memref<?x{el}>, %h0: {el}{args}) -> {el} {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?x{el}>
  {above}
  %r = scf.for %t = %c0 to %n step %c1 iter_args(%h = %h0) -> ({el}) {{
    %xv = memref.load %x[%t] : memref<?x{el}>
    {body}
    %hn = {mx} %h, %xo : {el}
    memref.store %hn, %y[%t] : memref<?x{el}>
    scf.yield %hn : {el}
  }}
  func.return %r : {el}
}}
"""


#: name -> (source, element type, extra arguments after h0 for length n)
FORMS = {
    # the form: a scalar f32 function argument
    "scale": (form("f32", "%xo = arith.mulf %xv, %scale : f32", args=", %scale: f32"), "f32",
              lambda n: [np.float32(1.7)]),
    # pure arith on an f64 argument, and a load before the loop from another memref
    "arith_load": (
        form("f64", "%xs = arith.mulf %xv, %s2 : f64\n    %xo = arith.addf %xs, %off : f64",
             "%off = memref.load %p[%c1] : memref<2xf64>\n  %s2 = arith.mulf %scale, %scale : f64",
             ", %scale: f64, %p: memref<2xf64>"),
        "f64", lambda n: [np.float64(-0.8), np.array([5.0, 0.25])]),
    # a dim (the length itself, as an integer) and an i32 argument
    "dim_i32": (
        form("i32", "%xw = arith.addi %xv, %ni : i32\n    %xo = arith.muli %xw, %k : i32",
             "%ni = arith.index_cast %n : index to i32", ", %k: i32"),
        "i32", lambda n: [np.int32(-3)]),
}


def inputs(name: str, n: int) -> list:
    src, el, extra = FORMS[name]
    rng = np.random.default_rng(n + len(name))
    dt = {"f32": np.float32, "f64": np.float64, "i32": np.int32}[el]
    if el == "i32":
        x = rng.integers(-1000, 1000, n).astype(dt)
        h0 = dt(-5000)
    else:
        x = rng.uniform(-2, 2, n).astype(dt)
        if n > 3:
            x[2] = -0.0  # signed zeros: maximumf orders -0 < +0
        h0 = dt(-1.5)
    return [x, np.zeros_like(x), h0, *extra(n)]


def copies(args: list) -> list:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


@pytest.mark.parametrize("name", sorted(FORMS))
@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_producer_with_values_from_above_runs_like_the_loop(name, time_blocks):
    src, el, _ = FORMS[name]
    m = gpu_module(src, time_blocks)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert refusals(fn) == []
    launches, _ = _host_launches(m)  # nothing but launches on the host
    assert launches["run"]
    assert not any(o.name in ("scf.for", "memref.load") for o in fn.body.walk())  # (allocs: runtime scratch)
    for n in LENGTHS:
        args = inputs(name, n)
        ref, got = copies(args), copies(args)
        (want,) = run_function(parse_ir(src), "run", *ref)
        result = np.full((), 7, args[0].dtype)
        simulate_launch(m, "run", *got, result)
        assert got[1].tobytes() == ref[1].tobytes(), (name, n, got[1], ref[1])
        assert result.tobytes() == np.asarray(want, args[0].dtype).tobytes(), (name, n, result, want)


def test_captured_arguments_are_kernel_arguments():
    m = gpu_module(FORMS["arith_load"][0])
    (desc,) = launch_descriptions(m)
    assert [a[:2] for a in desc.args] == [
        ("x0", "in"), ("y0", "out"), ("init0", "scalar"), ("final0", "out"), ("p0", "scalar"), ("p1", "in")]


@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_cuda_runtime_passes_the_scalar(time_blocks):
    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from scanweaver.runtime.cuda_results import with_results

    src = FORMS["scale"][0]
    m = gpu_module(src, time_blocks)
    fn = with_results(CudaFunction(CudaModule("ptx", driver=ScalarSimulatorDriver(m)), "run",
                                   _host_launches(m)[0]["run"], 5), "run", ["f32"], 5)
    for n in (0, 9, 17):
        for scale in (np.float32(1.7), np.float32(-0.5)):
            x, y, h0, _ = inputs("scale", n)
            ref = [x.copy(), y.copy(), h0, scale]
            (want,) = run_function(parse_ir(src), "run", *ref)
            got = fn(x, y, h0, scale)
            assert y.tobytes() == ref[1].tobytes(), (n, scale)
            assert np.float32(got).tobytes() == np.float32(want).tobytes(), (n, got, want)


NEAR_MISSES = {
    # the load before the loop reads y, which the kernel writes: not the value the loop saw
    "load_of_a_dst": FORMS["arith_load"][0].replace("%p[%c1] : memref<2xf64>", "%y[%c1] : memref<?xf64>"),
    # an f16 argument: the CUDA runtime passes no f16 scalars
    "f16_arg": form("f32", "%sf = arith.extf %scale : f16 to f32\n    %xo = arith.mulf %xv, %sf : f32",
                    args=", %scale: f16"),
    # a store between the load and the loop may change what the loop reads
    "store_between": FORMS["arith_load"][0].replace(
        "%s2 = arith.mulf %scale, %scale : f64",
        "%s2 = arith.mulf %scale, %scale : f64\n  memref.store %s2, %p[%c0] : memref<2xf64>"
    ).replace("memref.load %p[%c1]", "memref.load %p[%c0]"),
}


@pytest.mark.parametrize("name", sorted(NEAR_MISSES))
def test_values_the_kernel_cannot_rebuild_keep_the_refusal(name):
    m = gpu_module(NEAR_MISSES[name])
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert any("operands are temporaries" in r for r in refusals(fn)), refusals(fn)


@functools.cache
def _lowered_for_ptxas():
    """Every form chained, and the first in time blocks (3 kernels), lowered once for both chips."""
    from xdsl.dialects.builtin import StringAttr

    from scanweaver.ir import make_context, print_ir
    from scanweaver.rewrites.raise_affine import RaiseRecurrences
    from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR

    chained = "\n".join(src.replace("@run(", f"@run_{name}(") for name, (src, _, _) in FORMS.items())
    blocked = parse_ir(FORMS["scale"][0].replace("@run(", "@tb_scale("))
    RaiseRecurrences().apply(make_context(), blocked)
    for s in [o for o in blocked.walk() if o.name == "scan.scan"]:
        s.attributes[TIME_BLOCKS_ATTR] = StringAttr("time_blocks")
    text = chained + "\n" + "\n".join(print_ir(o) for o in blocked.ops)
    return compiler.lower(text, "gpu", keep_stages=False).module


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_captured_kernels_assemble_without_spills(chip):
    out = export_gpu(_lowered_for_ptxas(), chip)
    assert len(out["ptxas"]) == len(FORMS) + 3
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)
        assert f["stack_bytes"] == 0, (chip, kernel, f)
