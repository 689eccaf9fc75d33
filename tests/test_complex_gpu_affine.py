"""Complex `scan.affine` on the GPU target (`scan-complex-affine-to-recurrence`): one
complex recurrence per channel, then the fused 2x2 (re, im) kernel.

* Sequentially the per-channel form is the reference loop: interpreted, it gives the
  same bits as the `scan.affine` it replaces.
* The kernel, run in the thread-block simulator, matches the interpreter within
  rounding (it reassociates the products of a): forward and reverse, with and without
  init/final, lengths 0, 1 and 2^k +- 1 around the tile size, any axis, f32 and f64.
* PTX for sm_80 / sm_90 has no spills and no stack frame (ptxas, when installed).
"""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.complex_gpu import ComplexAffineToRecurrence
from scanweaver.rewrites.complex_to_real import ComplexToReal
from scanweaver.rewrites.raise_complex_pairs import ComplexToPairs
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

RNG = np.random.default_rng(170)
NP = {"f32": np.complex64, "f64": np.complex128}
TOL = {"f32": 2e-5, "f64": 1e-12}


def affine_ir(shape, axis, reverse=False, init=True, final=True, el="f32") -> str:
    ct = f"complex<{el}>"
    full = "x".join(map(str, shape))
    chan = "x".join(str(s) for i, s in enumerate(shape) if i != axis)
    mt, ht = f"memref<{full}x{ct}>", (f"memref<{chan}x{ct}>" if chan else f"memref<{ct}>")
    args = [f"%a: {mt}", f"%b: {mt}"] + ([f"%h0: {ht}"] if init else []) + [f"%h: {mt}"]
    args += [f"%hT: {ht}"] if final else []
    op = "scan.affine %a, %b" + (" init %h0" if init else "") + " into %h" + (" final %hT" if final else "")
    op += f" axis {axis}" + (" reverse" if reverse else "")
    ins = [mt, mt] + ([ht] if init else [])
    outs = [mt] + ([ht] if final else [])
    op += f" : {', '.join(ins)} -> {', '.join(outs)}"
    return f"func.func @f({', '.join(args)}) {{\n  {op}\n  func.return\n}}\n"


def inputs(shape, axis, init, final, el):
    dt = NP[el]
    chan = tuple(s for i, s in enumerate(shape) if i != axis)

    def cplx(sh, scale):
        return np.asarray((RNG.standard_normal(sh) + 1j * RNG.standard_normal(sh)) * scale).astype(dt)

    a = cplx(shape, 0.6)
    args = [a, cplx(shape, 1.0)] + ([cplx(chan, 1.0)] if init else []) + [np.zeros(shape, dt)]
    return args + ([np.full(chan, 7 + 7j, dt)] if final else [])


def gpu_lowered(text: str, block_size=4, items_per_thread=2):
    module = parse_ir(text)
    ctx = make_context()
    ComplexAffineToRecurrence().apply(ctx, module)
    ComplexToPairs().apply(ctx, module)
    ScanToGpu(block_size=block_size, items_per_thread=items_per_thread).apply(ctx, module)
    ComplexToReal().apply(ctx, module)
    module.verify()
    return module


def interpret(text_or_module, *args):
    out = [x.copy() for x in args]
    run_function(text_or_module, "f", *out)
    return out


CASES = [
    # (shape, axis, reverse, init, final)
    ((3, 9), 1, False, True, True),
    ((3, 9), 1, True, True, True),
    ((2, 7), 1, False, False, True),
    ((2, 17), 1, True, False, False),
    ((2, 15), 1, False, True, False),
    ((2, 1), 1, False, True, True),
    ((2, 1), 1, True, False, True),
    ((2, 0), 1, False, True, True),
    ((2, 0), 1, True, False, True),
    ((9, 3), 0, False, True, True),
    ((2, 9, 2), 1, True, True, True),
    ((33,), 0, False, True, True),
]


@pytest.mark.parametrize("shape,axis,reverse,init,final", CASES)
def test_per_channel_form_is_the_reference_bit_for_bit(shape, axis, reverse, init, final):
    text = affine_ir(shape, axis, reverse, init, final)
    module = parse_ir(text)
    ComplexAffineToRecurrence().apply(make_context(), module)
    module.verify()
    assert "scan.affine" not in print_ir(module) and "scan.recurrence" in print_ir(module)
    args = inputs(shape, axis, init, final, "f32")
    ref, got = interpret(text, *args), interpret(module, *args)
    for r, g in zip(ref, got):
        assert r.tobytes() == g.tobytes()


@pytest.mark.parametrize("el", ["f32", "f64"])
@pytest.mark.parametrize("shape,axis,reverse,init,final", CASES)
def test_kernel_in_simulator_matches_interpreter(shape, axis, reverse, init, final, el):
    text = affine_ir(shape, axis, reverse, init, final, el)
    module = gpu_lowered(text)
    ir = print_ir(module)
    assert "gpu.func" in ir and not any(o.dialect_name() == "scan" for o in module.walk())
    args = inputs(shape, axis, init, final, el)
    ref = interpret(text, *args)
    got = [x.copy() for x in args]
    simulate_launch(module, "f", *got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=TOL[el], atol=TOL[el])
    if shape[axis] <= 1:  # nothing to reassociate: the sequential bits
        for r, g in zip(ref, got):
            assert r.tobytes() == g.tobytes()


def test_gpu_pipeline_takes_complex_affine_as_a_kernel():
    text = affine_ir((2, 5), 1, True, True, True)
    final = compiler.lower(text, "gpu").stages[-1].ir
    assert "gpu.func" in final and "gpu.launch_func" in final
    assert not any(o.dialect_name() == "scan" for o in parse_ir(final).walk())
    args = inputs((2, 5), 1, True, True, "f32")
    ref = interpret(text, *args)
    got = [x.copy() for x in args]
    simulate_launch(final, "f", *got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("el", ["f32", "f64"])
def test_complex_affine_kernel_ptxas(chip, el):
    module = gpu_lowered(affine_ir((64, 4096), 1, True, True, True, el), 128, 4)
    out = export_gpu(module, chip)
    (ptx,) = out["ptx"].values()
    (desc,) = out["launches"]
    assert f".target {chip}" in ptx and f".entry {desc.kernel_name}(" in ptx
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    info = out["ptxas"][desc.kernel_name]
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, out["warnings"]
    assert info["stack_bytes"] == 0 and info["registers"] <= 255


# -- linear_scan(backend="cuda") with complex arrays: the CUDA runtime's packing ------------


def test_linear_scan_cuda_complex_through_the_runtime(monkeypatch):
    """`linear_scan(..., backend="cuda")` on complex64 arrays, with a driver whose launches
    decode the memref descriptors from the kernel parameters and run the kernel in the
    thread-block simulator: complex arrays travel as interleaved (re, im) pairs with
    sizes and strides in complex elements, and the result is the CPU's."""
    import scanweaver as sw
    from scanweaver import api
    from scanweaver.rewrites.launch import launch_descriptions
    from scanweaver.runtime import cuda_scan
    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from tests.test_gpu_time_blocks import SimulatorDriver

    runs = []

    def run_in_simulator(ir, name, arrays):
        module = compiler.lower(ir, "gpu").module
        descs = [d for d in launch_descriptions(module) if d.func_name == name]
        CudaFunction(CudaModule("ptx", driver=SimulatorDriver(module)), name, descs, len(arrays))(*arrays)
        runs.append([d.args for d in descs])

    monkeypatch.setattr(api, "_cuda_usable", lambda: True)
    monkeypatch.setattr(cuda_scan, "_run", run_in_simulator)
    a = (RNG.standard_normal((2, 9)) + 1j * RNG.standard_normal((2, 9))).astype(np.complex64) * 0.7
    b = (RNG.standard_normal((2, 9)) + 1j * RNG.standard_normal((2, 9))).astype(np.complex64)
    h0 = (RNG.standard_normal(2) + 1j * RNG.standard_normal(2)).astype(np.complex64)
    for reverse in (False, True):
        got_h, got_f = sw.linear_scan(a, b, h0=h0, reverse=reverse, backend="cuda", return_final_state=True)
        ref_h, ref_f = sw.linear_scan(a, b, h0=h0, reverse=reverse, backend="cpu", return_final_state=True)
        assert got_h.dtype == np.complex64 and got_f.dtype == np.complex64
        np.testing.assert_allclose(got_h, ref_h, rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(got_f, ref_f, rtol=2e-6, atol=2e-6)
    assert len(runs) == 2 and all(arg[2] == "complex<f32>" for run in runs for args in run for arg in args)
    # "auto" keeps complex host arrays on the CPU (no time blocks for complex on the GPU)
    sw.linear_scan(a, b, backend="auto")
    assert len(runs) == 2


def test_kernel_finite_where_the_loop_is():
    """|a| = 1e6 with b = 0 until the last step: the loop's state stays 0 while tile
    products of a overflow; the kernel's overflow guard keeps the sequential result."""
    text = affine_ir((2, 40), 1, False, False, True)
    module = gpu_lowered(text)
    a = np.full((2, 40), 1e6 + 0j, np.complex64)
    a[1] = 3e5 + 2e5j
    b = np.zeros((2, 40), np.complex64)
    b[:, -1] = 1 + 1j
    args = [a, b, np.zeros((2, 40), np.complex64), np.zeros(2, np.complex64)]
    ref = interpret(text, *args)
    got = [x.copy() for x in args]
    simulate_launch(module, "f", *got)
    assert np.isfinite(ref[2]).all() and np.isfinite(got[2]).all()
    np.testing.assert_array_equal(got[2], ref[2])
    np.testing.assert_array_equal(got[3], ref[3])
