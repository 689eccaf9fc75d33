"""The GPU selective scan: one build (dynamic batch, D, L) serves every shape.

The GPU form of `workloads/selective.py` is lowered once per spec and run in the
thread-block simulator (races and barrier divergence checked) at several shapes,
against the interpreter on the same unlowered IR and the float64 reference (which
pins the B/C layouts); the runtime compiles it once for two shapes (fake driver)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from xdsl.context import Context

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.workloads.reference import selective_scan_reference
from scanweaver.workloads.selective import selective_scan_gpu
from scanweaver.workloads.specs import SelectiveScanSpec

N = 3
SHAPES = [(1, 2, 13), (2, 3, 5), (2, 2, 1), (1, 4, 9)]  # (batch, D, L): partial tiles, L = 1


def spec_of(b_kind="shared", c_kind="grouped", h0=False, last=True, full=True) -> SelectiveScanSpec:
    return SelectiveScanSpec(N, b_kind, c_kind, full, full, full, full, h0, last)


def lowered(spec: SelectiveScanSpec):
    """(unlowered IR text, the module after scan-to-gpu with 4 threads x 2 items)."""
    text = print_ir(selective_scan_gpu(spec))
    m = parse_ir(text)
    ScanToGpu(block_size=4, items_per_thread=2).apply(Context(), m)
    return text, m


def inputs(rng, spec: SelectiveScanSpec, batch: int, dim: int, length: int) -> dict[str, np.ndarray]:
    def f(*shape, lo=-1.0, hi=1.0):
        return rng.uniform(lo, hi, size=shape).astype(np.float32)

    bc = {"const": (dim, N), "shared": (batch, N, length), "grouped": (batch, 2, N, length)}
    x = {"u": f(batch, dim, length), "delta": f(batch, dim, length, lo=-2.0, hi=0.5),
         "A": f(dim, N, lo=-2.0, hi=-0.1), "B": f(*bc[spec.b_kind]), "C": f(*bc[spec.c_kind])}
    if spec.has_d:
        x["D"] = f(dim)
    if spec.has_z:
        x["z"] = f(batch, dim, length)
    if spec.has_bias:
        x["delta_bias"] = f(dim, lo=-0.5, hi=0.5)
    if spec.has_h0:
        x["h0"] = f(batch, dim, N)
    return x


def run_both(text, m, spec, x, batch, dim, length):
    """(interpreter outputs, simulator outputs, simulated grids)."""
    outs = [np.full((batch, dim, length), np.nan, np.float32)]
    outs += [np.full((batch, dim, N), np.nan, np.float32)] if spec.has_last else []
    ref = [o.copy() for o in outs]
    run_function(parse_ir(text), "selective_scan", *x.values(), *ref)
    grids = []
    simulate_launch(m, "selective_scan", *x.values(), *outs, on_launch=lambda k, g, b, a: grids.append(g))
    return ref, outs, grids


@pytest.mark.parametrize("b_kind,c_kind", [("shared", "grouped"), ("const", "shared"), ("grouped", "const")])
def test_one_build_every_shape_matches_interpreter_and_reference(b_kind, c_kind):
    spec = spec_of(b_kind, c_kind)
    text, m = lowered(spec)
    for batch, dim, length in SHAPES if b_kind != "grouped" and c_kind != "grouped" else [s for s in SHAPES if s[1] % 2 == 0]:
        x = inputs(np.random.default_rng(batch * 100 + dim * 10 + length), spec, batch, dim, length)
        ref, got, grids = run_both(text, m, spec, x, batch, dim, length)
        assert grids == [(batch * dim, 1, 1)]  # one block per (batch, channel), from the sizes
        for r, g in zip(ref, got):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
        want, want_last = selective_scan_reference(
            x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"], delta_bias=x["delta_bias"],
            delta_softplus=True, return_last_state=True,
        )
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[1], want_last, rtol=1e-4, atol=1e-5)


def test_initial_state_and_plain_options():
    """h0 (batch, D, N) seeds the state: continuing a split sequence from its last state
    gives the whole sequence's result."""
    spec = spec_of("shared", "shared", h0=True, last=True, full=False)
    text, m = lowered(spec)
    batch, dim, length, cut = 2, 3, 11, 6
    x = inputs(np.random.default_rng(5), spec, batch, dim, length)
    ref, got, _ = run_both(text, m, spec, x, batch, dim, length)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    # first part from h0, then the rest from its last state, with the same build
    first = {k: v[..., :cut].copy() if v.ndim == 3 and k != "h0" else v for k, v in x.items()}
    _, got1, _ = run_both(text, m, spec, first, batch, dim, cut)
    rest = {k: v[..., cut:].copy() if v.ndim == 3 and k != "h0" else v for k, v in x.items()}
    rest["h0"] = got1[1]
    _, got2, _ = run_both(text, m, spec, rest, batch, dim, length - cut)
    np.testing.assert_allclose(np.concatenate([got1[0], got2[0]], axis=-1), got[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got2[1], got[1], rtol=1e-5, atol=1e-6)


def test_launch_description_is_dynamic():
    _, m = lowered(spec_of())
    (desc,) = launch_descriptions(m)
    assert desc.grid == ("u.shape[0]*u.shape[1]", 1, 1)
    assert dict((n, s) for n, _, _, s in desc.args)["u"] == ("?", "?", "?")
    assert ("C", 3, "u", 2) in desc.covers_dims  # grouped C: time is its last axis


def _shapes(n, b_rank, batch=2, dim=8, length=300):
    bc = {2: (dim, n), 3: (batch, n, length), 4: (batch, 2, n, length)}[b_rank]
    return {"u": (batch, dim, length), "delta": (batch, dim, length), "A": (dim, n), "B": bc, "C": bc,
            "D": (dim,), "z": (batch, dim, length), "delta_bias": (dim,), "h0": (batch, dim, n)}


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("n,b_rank", [(16, 3), (32, 4), (64, 2)])
def test_ptx_for_the_default_blocks_has_no_spills(chip, n, b_rank):
    """Every option on; up to N = 32 the one dynamic build, above it the build for the
    call's sizes (dynamic sizes spill at N = 64: `DYNAMIC_SIZES_MAX_N`)."""
    from scanweaver.runtime.cuda_program import build_cuda_artifacts
    from scanweaver.runtime.cuda_scan import selective_scan_ir

    ir = selective_scan_ir(_shapes(n, b_rank), {"delta_softplus": True, "return_last_state": True})
    assert ("memref<?x?x?xf32>" in ir) == (n <= 32)
    art = build_cuda_artifacts(ir, chip)
    assert art.ptxas and all(f["spill_stores"] == 0 and f["spill_loads"] == 0 for f in art.ptxas.values())


def test_build_key_leaves_out_the_sizes_up_to_n32():
    from scanweaver.runtime.cuda_scan import selective_scan_ir

    opts = {"delta_softplus": True, "return_last_state": False}
    assert selective_scan_ir(_shapes(32, 3), opts) == selective_scan_ir(_shapes(32, 3, 5, 3, 7), opts)
    assert selective_scan_ir(_shapes(64, 3), opts) != selective_scan_ir(_shapes(64, 3, 5, 3, 7), opts)


def test_runtime_compiles_once_for_two_shapes(monkeypatch):
    """Two calls at different (batch, D, L) through a fake driver: one PTX build, one
    module load, grids from the sizes, and descriptors carrying each call's sizes."""
    from scanweaver.runtime import cuda_driver, cuda_program, cuda_scan
    from scanweaver.runtime.cuda_driver import CudaPythonDriver
    from tests.cuda_fakes import fake_cuda_bindings_driver

    built = []
    real_build = cuda_program.build_cuda_artifacts
    monkeypatch.setattr(cuda_program, "build_cuda_artifacts",
                        lambda *a, **k: built.append(a) or real_build(*a, **k))
    # rank-3 memrefs (u, delta, out): 9 words; A, B (const, rank 2): 7; D, bias: 5
    sizes = [8] * (9 + 9 + 7 + 7 + 7 + 5 + 5 + 9)
    fake = fake_cuda_bindings_driver(sizes, cc=(9, 0))
    driver = CudaPythonDriver(fake)
    monkeypatch.setattr(cuda_driver, "open_driver", lambda name=None: driver)
    cuda_scan._program.cache_clear()
    rng = np.random.default_rng(0)
    for batch, dim, length in [(2, 8, 64), (3, 5, 1000)]:
        u = rng.standard_normal((batch, dim, length)).astype(np.float32)
        A, B = -np.ones((dim, 16), np.float32), np.ones((dim, 16), np.float32)
        cuda_scan.selective_scan_cuda(u, u.copy(), A, B, B.copy(), np.ones(dim, np.float32), None,
                                      np.zeros(dim, np.float32), True, False, None)
    cuda_scan._program.cache_clear()
    assert len(built) == 1 and len(fake.images) == 1
    assert [launch.grid for launch in fake.launches] == [(16, 1, 1), (15, 1, 1)]
    word = lambda b: struct.unpack("<q", b)[0]  # noqa: E731
    # u's descriptor: allocated, aligned, offset, sizes[3], strides[3]
    assert [[word(b) for b in launch.param_bytes[3:6]] for launch in fake.launches] == [[2, 8, 64], [3, 5, 1000]]


def test_shapes_the_kernel_cannot_take_are_one_clear_error():
    """Checked before any build or launch (device arrays skip the API's checks): a group
    count not dividing D would index B past its groups."""
    from scanweaver.errors import ScanWeaverValueError
    from scanweaver.runtime.cuda_scan import selective_spec

    ok = {"u": (2, 4, 9), "delta": (2, 4, 9), "A": (4, 3), "B": (2, 2, 3, 9), "C": (4, 3)}
    spec = selective_spec(ok, True, False)
    assert (spec.n, spec.b_kind, spec.c_kind, spec.has_h0) == (3, "grouped", "const", False)
    assert selective_spec({**ok, "h0": (2, 4, 3)}, True, True).has_h0
    bad = {
        "B": ({**ok, "B": (2, 3, 3, 9)}, r"argument 'B' has shape \(2, 3, 3, 9\).*G dividing D = 4"),
        "C": ({**ok, "C": (2, 9, 3)}, r"argument 'C' has shape \(2, 9, 3\)"),
        "A": ({**ok, "A": (4, 65)}, r"argument 'A' has shape \(4, 65\)"),
        "h0": ({**ok, "h0": (2, 4, 2)}, r"argument 'h0' has shape \(2, 4, 2\); expected \(2, 4, 3\)"),
        "delta": ({**ok, "delta": (2, 4, 8)}, r"argument 'delta' has shape"),
    }
    for shapes, message in bad.values():
        with pytest.raises(ScanWeaverValueError, match=message):
            selective_spec(shapes, True, False)


def test_static_sizes_build_matches_the_interpreter():
    """The build for one (batch, D, L) (taken above N = 32) computes the same."""
    spec = spec_of("grouped", "shared", h0=True)
    batch, dim, length = 1, 2, 13
    text = print_ir(selective_scan_gpu(spec, (batch, dim, length)))
    assert "memref<1x2x13xf32>" in text
    m = parse_ir(text)
    ScanToGpu(block_size=4, items_per_thread=2).apply(Context(), m)
    x = inputs(np.random.default_rng(9), spec, batch, dim, length)
    ref, got, grids = run_both(text, m, spec, x, batch, dim, length)
    assert grids == [(batch * dim, 1, 1)]
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
