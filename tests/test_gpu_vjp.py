"""The selective scan's VJP on the GPU (`rewrites/gpu_channel_program.py`): one thread
per (batch, channel) runs the compiled VJP's whole per-channel program.

The thread-block simulator runs the lowered module against the interpreted VJP
(`@selective_scan_vjp` of `scanweaver-grad`) on random inputs; the CUDA runtime runs it
through a simulator-backed driver against the CPU backward of `scanweaver.torch`;
ptxas reports no spills; a real GPU test runs where there is one."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.runtime.cuda_vjp import selective_vjp_ir, vjp_spec

N = 4


def _layout(kind, batch, dn, n, length):
    groups = 2 if dn % 2 == 0 else 1
    return {"const": (dn, n), "shared": (batch, n, length), "grouped": (batch, groups, n, length)}[kind]


def _inputs(rng, batch, dn, length, b_kind, c_kind, has_z, has_h0, n=N):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    fwd = [f(batch, dn, length), 0.5 * f(batch, dn, length), -np.abs(f(dn, n)) - 0.1,
           f(*_layout(b_kind, batch, dn, n, length)), f(*_layout(c_kind, batch, dn, n, length)), f(dn)]
    fwd += [f(batch, dn, length)] if has_z else []
    fwd += [0.3 * f(dn)]
    fwd += [f(batch, dn, n)] if has_h0 else []
    fwd += [np.zeros((batch, dn, length), np.float32), np.zeros((batch, dn, n), np.float32)]
    shadows = [np.zeros_like(x) for x in fwd[:-2]] + [f(batch, dn, length), f(batch, dn, n)]
    return fwd + shadows


CASES = [  # (batch, D, L), B kind, C kind, z, softplus, h0
    ((2, 3, 5), "shared", "shared", True, True, False),
    ((1, 2, 0), "const", "grouped", False, False, True),
    ((1, 1, 1), "grouped", "const", True, False, False),
    ((2, 2, 3), "grouped", "shared", False, True, True),
]


@functools.lru_cache(maxsize=None)
def _lowered(spec):
    text = selective_vjp_ir(spec)
    return text, compiler.lower(text, "gpu").module


@pytest.mark.parametrize("shape,b_kind,c_kind,has_z,softplus,has_h0", CASES)
def test_simulated_vjp_equals_interpreted_vjp(shape, b_kind, c_kind, has_z, softplus, has_h0):
    text, lowered = _lowered(vjp_spec(N, b_kind, c_kind, has_z, softplus, has_h0))
    (desc,) = launch_descriptions(lowered)
    assert desc.notes.startswith("channel program") and desc.scratch
    rng = np.random.default_rng(sum(shape) + len(b_kind))
    got = _inputs(rng, *shape, b_kind, c_kind, has_z, has_h0)
    want = [x.copy() for x in got]
    run_function(parse_ir(text), "selective_scan_vjp", *want)
    simulate_launch(lowered, "selective_scan_vjp", *got)
    n_fwd = len(got) // 2
    assert any(np.any(w != 0) for w in want[n_fwd:-2]) or shape[2] == 0
    for g, w in zip(got[n_fwd:], want[n_fwd:]):
        # threads of a simulated block run in channel order, the interpreter's order:
        # even the atomic accumulations (dA, dB, ...) agree bit for bit
        np.testing.assert_array_equal(g, w)


def test_scratch_is_one_interleaved_buffer_and_no_alloca_in_the_kernel():
    _, lowered = _lowered(vjp_spec(16, "grouped", "shared", True, True, True))
    kernels = [o for o in lowered.walk() if o.name == "gpu.func"]
    assert len(kernels) == 1
    names = {o.name for o in kernels[0].walk()}
    assert "memref.alloca" not in names and "memref.alloc" not in names
    assert "memref.atomic_rmw" in names  # dA, dD, dbias over the batch; dB, dC over D
    (desc,) = launch_descriptions(lowered)
    shapes = {"u": (2, 8, 130)}
    (entry,) = desc.scratch[0][1]
    per_channel = desc.scratch_shape(desc.scratch[0][0], shapes)[0] // 32  # 16 channels, one warp group
    # checkpoints (L / 64 + 1) x N plus O(64 x N): no whole-sequence state
    assert 16 * 3 * 16 < per_channel < 16 * 16 * 64, (entry, per_channel)
    assert desc.resolve_grid(shapes) == (1, 1, 1)


def test_runtime_with_a_simulator_driver_matches_pytorch_autograd():
    torch = pytest.importorskip("torch")
    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.runtime.cuda_vjp import numpy_grads
    from scanweaver.torch.reference import selective_scan_ref

    rng = np.random.default_rng(5)
    batch, dn, length = 2, 2, 5
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    u, delta, z = f(batch, dn, length), 0.5 * f(batch, dn, length), f(batch, dn, length)
    A, B, C = -np.abs(f(dn, N)) - 0.1, f(batch, N, length), f(dn, N)
    D, bias, h0 = f(dn), f(dn), f(batch, dn, N)
    dout, dlast = f(batch, dn, length), f(batch, dn, N)
    _, lowered = _lowered(vjp_spec(N, "shared", "const", True, True, True))
    driver = SimulatorDriver(lowered)
    got = numpy_grads(u, delta, A, B, C, D, z, bias, True, h0, dout, dlast, driver=driver)
    xs = [torch.from_numpy(x).double().requires_grad_() for x in (u, delta, A, B, C, D, z, bias, h0)]
    out, last = selective_scan_ref(*xs[:5], D=xs[5], z=xs[6], delta_bias=xs[7], delta_softplus=True,
                                   return_last_state=True, initial_state=xs[8])
    want = torch.autograd.grad((out, last), xs, (torch.from_numpy(dout).double(), torch.from_numpy(dlast).double()))
    assert len(driver.launches) == 1
    for name, g, w in zip("u delta A B C D z bias h0".split(), got, want):
        w = w.numpy()
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())), err_msg=name)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_no_spills(chip):
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    if not ptxas_available():
        pytest.skip("ptxas is not installed")
    _, lowered = _lowered(vjp_spec(16, "grouped", "shared", True, True, True))
    stats = dict(export_gpu(lowered, chip=chip)["ptxas"])
    stats.update(export_gpu(_linear_lowered("f32", True), chip=chip)["ptxas"])
    assert len(stats) == 5
    assert stats and all(s.get("spill_stores", 0) == 0 and s.get("spill_loads", 0) == 0 for s in stats.values()), stats
    assert all(s.get("stack_bytes", 0) == 0 for s in stats.values()), stats


def test_torch_cuda_backward_on_a_real_gpu():
    torch = pytest.importorskip("torch")
    from scanweaver.runtime.cuda import cuda_available, why_no_cuda

    if not (torch.cuda.is_available() and cuda_available()):
        pytest.skip(f"no usable GPU here: {why_no_cuda() or 'torch.cuda is not available'}")
    from scanweaver.torch import selective_scan_fn

    g = torch.Generator().manual_seed(0)
    batch, dn, length = 2, 8, 300
    mk = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    cpu = [mk(batch, dn, length), 0.5 * mk(batch, dn, length), -mk(dn, 16).abs(), mk(batch, 16, length),
           mk(batch, 16, length), mk(dn), mk(batch, dn, length), mk(dn)]
    grads = []
    for dev in ("cpu", "cuda"):
        xs = [x.to(dev).requires_grad_() for x in cpu]
        out = selective_scan_fn(*xs[:5], D=xs[5], z=xs[6], delta_bias=xs[7], delta_softplus=True)
        out.square().sum().backward()
        grads.append([x.grad.cpu() for x in xs])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3 * float(a.abs().max()))


@pytest.mark.parametrize("b_kind,c_kind,options", [("shared", "const", True), ("grouped", "grouped", False)])
def test_torch_cuda_backward_path_through_a_simulator_driver(monkeypatch, b_kind, c_kind, options):
    """`selective_scan_bwd`'s CUDA branch (argument assembly, optional inputs, dtypes)
    with CPU tensors standing in for device memory and the simulator as the GPU."""
    torch = pytest.importorskip("torch")
    import contextlib

    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.runtime import cuda_vjp
    from scanweaver.torch import selective
    from scanweaver.torch.reference import selective_scan_ref

    real = cuda_vjp.selective_scan_vjp_cuda

    def on_simulator(arrays, spec, driver=None):
        real([a.numpy() for a in arrays], spec, SimulatorDriver(_lowered(spec)[1]))

    monkeypatch.setattr(cuda_vjp, "selective_scan_vjp_cuda", on_simulator)
    monkeypatch.setattr(selective, "_require_cuda", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda _: contextlib.nullcontext())
    g = torch.Generator().manual_seed(3)
    batch, dn, length = 1, 2, 4
    mk = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    shape = lambda kind: _layout(kind, batch, dn, N, length)  # noqa: E731
    u, delta, A = mk(batch, dn, length), 0.5 * mk(batch, dn, length), -mk(dn, N).abs() - 0.1
    B, C = mk(*shape(b_kind)), mk(*shape(c_kind))
    D, z, bias, h0 = (mk(dn), mk(batch, dn, length), mk(dn), mk(batch, dn, N)) if options else (None,) * 4
    dout, dlast = mk(batch, dn, length), mk(batch, dn, N)
    got = selective._backward_cuda(u, delta, A, B, C, D, z, bias, options, dout, dlast, h0)
    xs = [x.clone().requires_grad_() if x is not None else None for x in (u, delta, A, B, C, D, z, bias, h0)]
    out, last = selective_scan_ref(*xs[:5], D=xs[5], z=xs[6], delta_bias=xs[7], delta_softplus=options,
                                   return_last_state=True, initial_state=xs[8])
    present = [x for x in xs if x is not None]
    want = iter(torch.autograd.grad((out, last), present, (dout, dlast)))
    for x, gx in zip(xs, got):
        if x is None:
            assert gx.numel() == 0
            continue
        w = next(want)
        assert gx.dtype == x.dtype and gx.shape == x.shape
        torch.testing.assert_close(gx, w, rtol=1e-4, atol=1e-4 * max(1.0, float(w.abs().max())))


# -- linear_scan: the affine VJP as GPU stages -------------------------------------------------


@functools.lru_cache(maxsize=None)
def _linear_lowered(el, reverse):
    from scanweaver.runtime.cuda_vjp import linear_vjp_ir

    return compiler.lower(linear_vjp_ir(el, reverse), "gpu").module


@pytest.mark.parametrize("reverse", [False, True])
def test_linear_vjp_stages_simulated_and_through_the_runtime(reverse):
    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.runtime.cuda_vjp import linear_scan_vjp_cuda, linear_vjp_ir

    text = linear_vjp_ir("f32", reverse)
    lowered = _linear_lowered("f32", reverse)
    descs = launch_descriptions(lowered)
    # two scan.affine kernels (parallel in time) and two loop stages, nothing on the host
    assert sorted(d.kernel_name.rsplit("_", 1)[0] for d in descs) == [
        "linear_scan_vjp_stage", "linear_scan_vjp_stage", "scan_affine", "scan_affine"]
    assert all(i >= 0 or i <= -2 for d in descs for i in d.host_args)
    driver = SimulatorDriver(lowered)
    rng = np.random.default_rng(7 + reverse)
    for C, L in [(3, 5), (2, 0), (0, 3), (1, 1)]:
        f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
        z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
        want = [f(C, L), f(C, L), f(C), z(C, L), z(C, L), z(C, L), z(C), f(C, L)]
        sim, rt = [x.copy() for x in want], [x.copy() for x in want]
        run_function(parse_ir(text), "linear_scan_vjp", *want)
        simulate_launch(lowered, "linear_scan_vjp", *sim)
        linear_scan_vjp_cuda(rt, "f32", reverse, driver=driver)
        for got in (sim, rt):
            for g, w in zip(got[4:7], want[4:7]):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_torch_linear_scan_cuda_backward_path_through_a_simulator_driver(monkeypatch):
    torch = pytest.importorskip("torch")
    import contextlib

    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.runtime import cuda_vjp
    from scanweaver.torch import linear
    from scanweaver.torch.reference import linear_scan_ref

    real = cuda_vjp.linear_scan_vjp_cuda

    def on_simulator(arrays, el, reverse, driver=None):
        lowered = _linear_lowered(el, reverse)
        real([x.numpy() for x in arrays], el, reverse, SimulatorDriver(lowered))

    monkeypatch.setattr(cuda_vjp, "linear_scan_vjp_cuda", on_simulator)
    monkeypatch.setattr(linear, "_require_cuda", lambda what: None)
    monkeypatch.setattr(torch.cuda, "device", lambda _: contextlib.nullcontext())
    g = torch.Generator().manual_seed(1)
    a, b, h0, dh = (torch.randn(*s, generator=g) for s in ((3, 6), (3, 6), (3,), (3, 6)))
    da, db, dh0 = linear._backward_cuda(a, b, h0, True, dh)
    xs = [x.clone().requires_grad_() for x in (a, b, h0)]
    want = torch.autograd.grad(linear_scan_ref(*xs, reverse=True), xs, dh)
    for got, w in zip((da, db, dh0), want):
        torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-5)


# -- pieces: size formulas, refusals ------------------------------------------------------------


def test_size_formulas():
    from scanweaver.errors import ScanWeaverValueError
    from scanweaver.runtime.cuda_launch import eval_grid_entry

    shapes = {"u": (2, 3, 130)}
    assert eval_grid_entry("expr:mul(add(ceildivu(u.shape[2],64),1),4)", shapes) == 16
    assert eval_grid_entry("expr:mins(sub(u.shape[0],5),3)", shapes) == 0  # clamped at 0
    for bad in ("expr:add(u.shape[2])", "expr:pow(1,2)", "expr:mul(v.shape[0],2)", "expr:add(1,2) 3"):
        with pytest.raises(ScanWeaverValueError):
            eval_grid_entry(bad, shapes)


SHARED_STORE = """
func.func @f(%x: memref<?x?xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?x?xf32>
  %len = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %n step %c1 {
    %h = memref.alloca() : memref<f32>
    %t = memref.alloca() : memref<4xf32>
    %z = arith.constant 0.0 : f32
    memref.store %z, %h[] : memref<f32>
    scf.for %i = %c0 to %len step %c1 {
      %hv = memref.load %h[] : memref<f32>
      %xv = memref.load %x[%c, %i] : memref<?x?xf32>
      %a = arith.constant 0.5 : f32
      %m = arith.mulf %a, %hv : f32
      %s = arith.addf %m, %xv : f32
      memref.store %s, %h[] : memref<f32>
      memref.store %s, %y[%i] : memref<?xf32>
    }
  }
  func.return
}
"""


def test_a_store_shared_between_channels_is_refused_with_the_reason():
    from scanweaver.ir import make_context
    from scanweaver.rewrites import gpu_channel_program as gcp
    from scanweaver.rewrites.gpu_kernel import Unsupported
    from scanweaver.rewrites.raise_affine import RaiseRecurrences

    m = parse_ir(SHARED_STORE)
    RaiseRecurrences().apply(make_context(), m)
    fn = next(o for o in m.ops if o.name == "func.func")
    nest = gcp.channel_nest(fn)
    assert nest is not None and len(nest) == 1
    with pytest.raises(Unsupported, match="'y' is shared between channels and is not an accumulation"):
        gcp.lower_channel_program(fn, nest, m)
    assert not any(o.name == "gpu.launch_func" for o in fn.walk())  # left unchanged


def test_a_scratch_size_that_depends_on_the_channel_is_refused():
    from scanweaver.ir import make_context
    from scanweaver.rewrites import gpu_channel_program as gcp
    from scanweaver.rewrites.gpu_kernel import Unsupported
    from scanweaver.rewrites.raise_affine import RaiseRecurrences

    text = SHARED_STORE.replace("%t = memref.alloca() : memref<4xf32>", "%t = memref.alloc(%c) : memref<?xf32>")
    text = text.replace("%y[%i]", "%y[%c]")
    m = parse_ir(text)
    RaiseRecurrences().apply(make_context(), m)
    fn = next(o for o in m.ops if o.name == "func.func")
    with pytest.raises(Unsupported, match="size depends on the channel"):
        gcp.lower_channel_program(fn, gcp.channel_nest(fn), m)
