"""Functions returning scalars (a final state, `-> f32`) on the GPU: `gpu-results-to-args`
makes each result a rank-0 output argument; the simulator runs the lowered module
against the interpreter's returned values, and the runtime (fake driver) allocates the
result on the device, launches, copies it back and returns it, from `compile` and from
a deployed artifact alike."""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest
from test_gpu_raised_forms import rename
from test_raise_forms import lfilter, lfilter_args, masked, masked_args

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.gpu_results import returned_scalars
from scanweaver.rewrites.pipeline import stages_for
from scanweaver.rewrites.scan_to_gpu import ScanToGpu
from scanweaver.runtime.cuda_program import artifacts_from_module

EMA_LAST = """
func.func @ema_last(%a: memref<?xf32>, %b: memref<?xf32>, %y: memref<?xf32>) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %L = memref.dim %a, %c0 : memref<?xf32>
  %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
    %av = memref.load %a[%t] : memref<?xf32>
    %bv = memref.load %b[%t] : memref<?xf32>
    %p = arith.mulf %av, %h : f32
    %hn = arith.addf %p, %bv : f32
    memref.store %hn, %y[%t] : memref<?xf32>
    scf.yield %hn : f32
  }
  func.return %r : f32
}
"""


def ema_args(n):
    rng = np.random.default_rng(n)
    return [rng.uniform(0.5, 1, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32),
            np.zeros(n, np.float32)]


# name -> (source, arguments, exact comparison)
FORMS = {
    "ema_last": (EMA_LAST, lambda: ema_args(37), False),
    "ema_last_L0": (rename(EMA_LAST, "ema_last", "ema_last_L0"), lambda: ema_args(0), True),
    "lfilter_ret_i64": (rename(lfilter("i64"), "lfilter", "lfilter_ret_i64"), lambda: lfilter_args("i64", n=41), True),
    "masked_ret_i32": (rename(masked("i32", mask="i32"), "masked", "masked_ret_i32"),
                       lambda: masked_args("i32", n=29, mask_dtype=np.int32), True),
}


@pytest.fixture(scope="module")
def lowered():
    text = "\n".join(src for src, _, _ in FORMS.values())
    # the whole GPU pipeline, small blocks (4 threads x 2 items) so tiles chain
    stages = [ScanToGpu(block_size=4, items_per_thread=2) if isinstance(p, ScanToGpu) else p
              for p in stages_for("gpu")]
    m = parse_ir(text)
    ctx = make_context()
    for stage in stages:
        stage.apply(ctx, m)
    return text, m


@pytest.mark.parametrize("name", sorted(FORMS))
def test_returned_values_match_the_interpreter(lowered, name):
    text, m = lowered
    _, make, exact = FORMS[name]
    (fn,) = [f for f in m.ops if getattr(f, "sym_name", None) is not None and f.sym_name.data == name]
    types = returned_scalars(fn)
    assert types, name
    args = make()
    copy = lambda xs: [x.copy() if isinstance(x, np.ndarray) else x for x in xs]  # noqa: E731
    ref = copy(args)
    want = run_function(parse_ir(text), name, *ref)
    got = copy(args)
    results = [np.full((), -7, np.dtype({"f32": np.float32, "i32": np.int32, "i64": np.int64}[t])) for t in types]
    simulate_launch(m, name, *got, *results)
    assert len(want) == len(results)
    for w, r in zip(want, results):
        if exact:
            assert r[()] == w, (name, r, w)
        else:
            np.testing.assert_allclose(r[()], w, rtol=1e-5, atol=1e-6)
    for r, g in zip(ref, got):
        if not isinstance(r, np.ndarray):
            continue
        if exact:
            assert g.tobytes() == r.tobytes()
        else:
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def _fake_kernel_writing(value: float):
    """The fake GPU: writes `value` through the last rank-0 descriptor (result0)."""

    def kernel(param_bytes):
        ptr = struct.unpack("<q", param_bytes[-2])[0]  # allocated, aligned, offset
        ctypes.c_float.from_address(ptr).value = value

    return kernel


def test_runtime_returns_the_scalar_from_compile_and_from_an_artifact(monkeypatch, tmp_path):
    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from scanweaver.runtime.cuda_artifact import describe, load, write_artifact
    from scanweaver.runtime.cuda_driver import CudaPythonDriver
    from scanweaver.runtime.cuda_results import ReturningFunction, with_results
    from tests.cuda_fakes import fake_cuda_bindings_driver

    low = compiler.lower(EMA_LAST, "gpu", keep_stages=False)
    art = artifacts_from_module(low.module, [], "sm_90")
    assert art.results == {"ema_last": ["f32"]} and art.arg_counts["ema_last"] == 4
    assert art.ptxas and all(f["spill_stores"] == 0 for f in art.ptxas.values())
    (desc,) = art.launches["ema_last"]
    assert desc.args[-1][:2] == ("result0", "out") and desc.args[-1][3] == ()
    sizes = [8] * 5 * 3 + [8] * 3  # three rank-1 descriptors, one rank-0
    fake = fake_cuda_bindings_driver(sizes, kernel=_fake_kernel_writing(2.5))
    driver = CudaPythonDriver(fake)
    fn = with_results(CudaFunction(CudaModule(art.ptx, driver=driver), "ema_last", art.launches["ema_last"], 4),
                      "ema_last", art.results["ema_last"], 4)
    assert isinstance(fn, ReturningFunction)
    a, b, y = ema_args(9)
    assert fn(a, b, y) == np.float32(2.5)
    with pytest.raises(Exception, match="takes 3 arguments, got 4"):
        fn(a, b, y, np.zeros((), np.float32))
    # the deployed artifact: launch.json carries the results, the loader hides the argument
    doc = describe(art.ptx, "k.ptx", "sm_90", art.launches, art.arg_counts, art.ptxas, art.results)
    assert doc["functions"]["ema_last"]["results"] == ["f32"]
    out = write_artifact(tmp_path / "k.ptx", art.ptx, doc)
    fake2 = fake_cuda_bindings_driver(sizes, kernel=_fake_kernel_writing(-1.25))
    prog = load(out, driver=CudaPythonDriver(fake2))
    assert prog.ema_last(a, b, y) == np.float32(-1.25)
    assert len(fake2.launches) == 1 and fake2.launches[0].grid == (1, 1, 1)
