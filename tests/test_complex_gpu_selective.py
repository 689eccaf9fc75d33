"""The complex selective scan's GPU form (`selective_scan_complex_gpu`): each
(batch, channel) its own state of N complex values, the channel loop over all of D,
B/C state index before time, so the diagonal recurrence kernel with complex pairs takes
it (one block per (batch, channel), no host loops).

Checked: interpreted, the GPU form gives the CPU form's bits (same operations in the
same order); lowered, in the thread-block simulator against the interpreter at lengths
0, 1 and odd, f32 and f64, every B/C kind; ptxas sm_80 / sm_90 without spills (when
installed); `selective_scan(..., backend="cuda")` with complex A through the CUDA
runtime with a driver whose launches run in the simulator, against the CPU path and a
complex128 numpy reference of mamba_ssm's meaning."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.complex_to_real import ComplexToReal
from scanweaver.workloads.selective_complex import selective_scan_complex_gpu, selective_scan_complex_recurrence
from scanweaver.workloads.specs import ComplexSelectiveSpec

DT = {"f32": (np.float32, np.complex64), "f64": (np.float64, np.complex128)}
G = 2  # groups of grouped B/C


def spec_of(n, real="f32", b_kind="shared", c_kind="grouped", full=True, h0=True, last=True):
    return ComplexSelectiveSpec(n, real, b_kind, c_kind, full, full, full, full, h0, last)


def gpu_inputs(spec, rng, batch, dim, length):
    """The GPU form's arguments before out/last, B/C in its layout (N before time)."""
    rdt, cdt = DT[spec.real]
    r = lambda *s: rng.standard_normal(s).astype(rdt)  # noqa: E731
    c = lambda *s: (rng.standard_normal(s) + 1j * rng.standard_normal(s)).astype(cdt)  # noqa: E731
    bc = {"const": (dim, spec.n), "shared": (batch, spec.n, length), "grouped": (batch, G, spec.n, length)}
    A = (-np.abs(r(dim, spec.n)) - 0.1 + 1j * r(dim, spec.n)).astype(cdt)
    x = {"u": r(batch, dim, length), "delta": (0.3 * r(batch, dim, length)).astype(rdt), "A": A,
         "B": c(*bc[spec.b_kind]), "C": c(*bc[spec.c_kind])}
    x.update({"D": r(dim)} if spec.has_d else {})
    x.update({"z": r(batch, dim, length)} if spec.has_z else {})
    x.update({"delta_bias": (0.2 * r(dim)).astype(rdt)} if spec.has_bias else {})
    x.update({"h0": c(batch, dim, spec.n)} if spec.has_h0 else {})
    return x


def outputs(spec, batch, dim, length):
    rdt, cdt = DT[spec.real]
    return [np.full((batch, dim, length), np.nan, rdt)] + [np.full((batch, dim, spec.n), np.nan, cdt)] * spec.has_last


def cpu_layout(x, spec):
    """The CPU form's B/C layout: time before the state index."""
    y = dict(x)
    for name, kind in (("B", spec.b_kind), ("C", spec.c_kind)):
        if kind != "const":
            y[name] = np.ascontiguousarray(np.swapaxes(x[name], -1, -2))
    return y


def interpret(module, x, outs, *extra):
    got = [o.copy() for o in outs]
    run_function(module, "selective_scan_complex", *[v.copy() for v in x.values()], *got, *extra)
    return got


def lowered(spec):
    text = print_ir(selective_scan_complex_gpu(spec))
    module = parse_ir(text)
    for stage in (ScanToGpu(block_size=4, items_per_thread=2), ComplexToReal()):
        stage.apply(Context(), module)
    module.verify()
    return text, module


@pytest.mark.parametrize("real", ["f32", "f64"])
@pytest.mark.parametrize("b_kind,c_kind", [("shared", "grouped"), ("const", "shared"), ("grouped", "const")])
def test_gpu_form_interprets_to_the_cpu_forms_bits(real, b_kind, c_kind):
    spec = spec_of(3, real, b_kind, c_kind)
    batch, dim, length = 2, 4, 5
    x = gpu_inputs(spec, np.random.default_rng(len(b_kind) * 7 + len(c_kind)), batch, dim, length)
    outs = outputs(spec, batch, dim, length)
    cpu = interpret(selective_scan_complex_recurrence(spec), cpu_layout(x, spec), outs, 0, dim)
    for sizes in (("?", "?", "?"), (batch, dim, length)):  # dynamic, and built for this shape
        gpu = interpret(selective_scan_complex_gpu(spec, sizes), x, outs)
        for want, got in zip(cpu, gpu):
            assert np.isfinite(want).all()
            assert want.tobytes() == got.tobytes()


def test_gpu_form_state_per_channel_and_no_channel_range():
    text = print_ir(selective_scan_complex_gpu(spec_of(4)))
    assert "d_begin" not in text and "memref<?x?x4x?xcomplex<f32>>" in text  # grouped C: N before time
    assert text.split("memref.alloca")[0].count("scf.for") == 2  # the state inside the batch and channel loops


def test_lowers_to_one_kernel_through_the_gpu_pipeline():
    """The whole `gpu` pipeline (no host loops) at the largest complex state, N = 16, B/C
    input-dependent, no options and no h0 (N = 4 and 8: the runtime and ptxas tests)."""
    from scanweaver import compiler

    spec = spec_of(16, "f32", "shared", "shared", full=False, h0=False, last=True)
    assert is_kernel(compiler.lower(print_ir(selective_scan_complex_gpu(spec)), "gpu").module)


def is_kernel(module) -> bool:
    """One launch, nothing left as scan ops or refused to the host loops."""
    final = print_ir(module)
    return (final.count("gpu.launch_func") == 1 and "gpu_refused" not in final
            and not any(o.dialect_name() == "scan" for o in module.walk()))


@pytest.mark.parametrize("real,tol,full", [("f32", 3e-5, True), ("f64", 1e-12, True), ("f32", 3e-5, False)])
@pytest.mark.parametrize("b_kind,c_kind", [("shared", "grouped"), ("grouped", "const")])
def test_kernel_in_simulator_matches_interpreter(real, tol, full, b_kind, c_kind):
    """Every option with h0, and none (the zero state made in the kernel)."""
    spec = spec_of(4, real, b_kind, c_kind, full=full, h0=full, last=True)
    text, module = lowered(spec)
    assert is_kernel(module)
    for batch, dim, length in [(1, 2, 0), (2, 2, 1), (1, 2, 7), (2, 4, 9)]:
        x = gpu_inputs(spec, np.random.default_rng(100 * batch + 10 * dim + length), batch, dim, length)
        outs = outputs(spec, batch, dim, length)
        ref = interpret(parse_ir(text), x, outs)
        got, grids = [o.copy() for o in outs], []
        simulate_launch(module, "selective_scan_complex", *[v.copy() for v in x.values()], *got,
                        on_launch=lambda k, g, b, a: grids.append(g))
        assert grids == [(batch * dim, 1, 1)]  # one block per (batch, channel)
        for want, have in zip(ref, got):
            assert not np.isnan(have).any()
            np.testing.assert_allclose(have, want, rtol=tol, atol=tol)
            if length <= 1:  # nothing reassociated: the loop's bits
                assert have.tobytes() == want.tobytes()


# -- selective_scan(..., backend="cuda") with complex A: through the CUDA runtime ----------


def reference(u, delta, A, B, C, D, z, bias, h0):
    """mamba_ssm's meaning in complex128: B/C real (re, im) pairs on a last axis of 2L."""
    dt = np.log1p(np.exp(delta.astype(np.float64) + bias[:, None]))
    pair = lambda M: M[..., 0::2] + 1j * M[..., 1::2]  # noqa: E731
    Bc, Cc = pair(B.astype(np.float64)), pair(C.astype(np.float64))  # (batch, N, L)
    h = h0.astype(np.complex128)
    ys = []
    for t in range(u.shape[2]):
        h = np.exp(dt[:, :, t, None] * A[None]) * h + (dt[:, :, t] * u[:, :, t])[..., None] * Bc[:, None, :, t]
        ys.append(2 * np.einsum("bdn,bn->bd", h, Cc[:, :, t]).real)
    y = np.stack(ys, axis=-1) + D[:, None] * u
    return y * z / (1 + np.exp(-z)), h


def test_selective_scan_cuda_complex_through_the_runtime(monkeypatch):
    """complex64 A, B/C as Mamba's real (re, im) pairs, every option: the runtime views
    them as complex (batch, N, L), packs complex descriptors, and a driver whose launch
    runs the kernel in the simulator gives the CPU path's result."""
    import scanweaver as sw
    from scanweaver import api, compiler
    from scanweaver.rewrites.launch import launch_descriptions
    from scanweaver.runtime import cuda_scan
    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from tests.test_gpu_time_blocks import SimulatorDriver

    runs = []

    def run_in_simulator(ir, name, arrays):
        module = compiler.lower(ir, "gpu").module
        descs = [d for d in launch_descriptions(module) if d.func_name == name]
        driver = SimulatorDriver(module)
        CudaFunction(CudaModule("ptx", driver=driver), name, descs, len(arrays))(*arrays)
        runs.append(driver.launches)

    monkeypatch.setattr(api, "_cuda_usable", lambda: True)
    monkeypatch.setattr(cuda_scan, "_run", run_in_simulator)
    rng = np.random.default_rng(17)
    batch, dim, n, length = 2, 2, 4, 7
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    A = (-np.abs(f(dim, n)) - 0.1 + 1j * f(dim, n)).astype(np.complex64)
    args = dict(u=f(batch, dim, length), delta=0.3 * f(batch, dim, length), A=A,
                B=f(batch, n, 2 * length), C=f(batch, n, 2 * length))
    opts = dict(D=f(dim), z=f(batch, dim, length), delta_bias=0.2 * f(dim), delta_softplus=True,
                return_last_state=True, initial_state=(f(batch, dim, n) + 1j * f(batch, dim, n)).astype(np.complex64))
    out, last = sw.selective_scan(**args, **opts, backend="cuda")
    want, want_last = sw.selective_scan(**args, **opts, backend="cpu")
    assert [name for name, _ in runs[0]] == ["scan_recurrence_0"] and runs[0][0][1] == (batch * dim, 1, 1)
    assert out.dtype == np.float32 and last.dtype == np.complex64
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(last, want_last, rtol=2e-5, atol=2e-5)
    ref, ref_last = reference(args["u"], args["delta"], A, args["B"], args["C"], opts["D"], opts["z"],
                              opts["delta_bias"], opts["initial_state"])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(last, ref_last, rtol=1e-4, atol=1e-4)
    # constant real B/C and complex input-dependent C of length L, no options
    args2 = dict(args, B=f(dim, n), C=(f(batch, n, length) + 1j * f(batch, n, length)).astype(np.complex64))
    np.testing.assert_allclose(sw.selective_scan(**args2, backend="cuda"), sw.selective_scan(**args2, backend="cpu"),
                               rtol=2e-5, atol=2e-5)
    assert len(runs) == 2


def test_selective_scan_cuda_complex_refusals():
    """Checked before any build: one clear error naming the argument."""
    from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
    from scanweaver.runtime.cuda_scan import selective_scan_complex_cuda

    u = np.zeros((1, 2, 3), np.float32)
    A = np.full((2, 4), -1 + 0j, np.complex64)
    B = np.zeros((1, 4, 6), np.float32)
    call = lambda **k: selective_scan_complex_cuda(  # noqa: E731
        *[k.get(x, d) for x, d in (("u", u), ("delta", u), ("A", A), ("B", B), ("C", B))],
        None, None, None, False, False, None)
    with pytest.raises(ScanWeaverValueError, match=r"argument 'A' has shape \(2, 9\).*N <= 8 .*complex64"):
        call(A=np.zeros((2, 9), np.complex64))
    with pytest.raises(ScanWeaverValueError, match=r"argument 'A' has shape \(2, 5\).*N <= 4 .*complex128"):
        call(A=np.zeros((2, 5), np.complex128))
    with pytest.raises(ScanWeaverValueError, match=r"argument 'B'.*2L = 6"):
        call(B=np.zeros((1, 4, 3), np.float32))
    with pytest.raises(ScanWeaverValueError, match=r"argument 'C' \(grouped\).*G dividing D = 2"):
        call(C=np.zeros((1, 3, 4, 6), np.float32))
    with pytest.raises(ScanWeaverTypeError, match=r"argument 'B' has dtype int64"):
        call(B=np.zeros((1, 4, 6), np.int64))

    class DeviceArray:  # a GPU array: complex A takes host arrays only
        __cuda_array_interface__ = {"shape": (1, 2, 3), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(ScanWeaverValueError, match="host arrays"):
        call(u=DeviceArray())


@pytest.mark.parametrize("real,n,b_kind,c_kind,chip",
                         [("f32", 8, "shared", "grouped", "sm_80"), ("f64", 4, "grouped", "const", "sm_90")])
def test_kernel_ptxas_no_spills(real, n, b_kind, c_kind, chip):
    """The largest states the runtime takes (`COMPLEX_MAX_N`), every option, dynamic
    sizes; one chip each (ptxas on these kernels is the slow part of this file)."""
    from scanweaver import compiler
    from scanweaver.runtime.cuda_scan import COMPLEX_MAX_N
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    assert COMPLEX_MAX_N[real] == n
    module = compiler.lower(print_ir(selective_scan_complex_gpu(spec_of(n, real, b_kind, c_kind))), "gpu").module
    assert is_kernel(module)
    out = export_gpu(module, chip)
    (ptx,) = out["ptx"].values()
    (desc,) = out["launches"]
    assert f".target {chip}" in ptx and f".entry {desc.kernel_name}(" in ptx
    if not ptxas_available():
        pytest.skip("ptxas not found on PATH (install the CUDA toolkit): registers/spills not checked")
    info = out["ptxas"][desc.kernel_name]
    assert info["spill_stores"] == 0 and info["spill_loads"] == 0, (chip, info, out["warnings"])
    assert info["registers"] <= 255 and info["shared_bytes"] == desc.shared_bytes, (chip, info)
