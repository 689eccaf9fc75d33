"""Loops people write, through raise -> scan-to-gpu -> the thread-block simulator,
against the interpreter on the original loops: scalar function arguments as kernel
parameters, one long sequence (no channel loop, scalar iter_args state: one block),
`y[t] += ...` in emit, time loops with step 2, reversed indexing (advantage
estimation), two EMAs in one loop, f16 I/O, bias correction, RG-LRU-like gates,
thresholds, a scalar loaded before the loops, Mamba-2's scalar decay over a vector
state; then all of them to PTX for sm_80 and sm_90 with no spills.  The forms
the GPU lowering still refuses are pinned with their reasons."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdsl.dialects import func

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.scan_to_loops import ScanToLoops
from scanweaver.runtime.cuda_program import _host_launches

FORMS = Path(__file__).parent / "gpu_loop_forms"
SOURCES = ["ema_alpha", "single_seq", "accumulate", "step2", "more", "outside_load", "mamba2"]
TEXT = "\n".join((FORMS / f"{n}.mlir").read_text() for n in SOURCES)

C, L = 3, 11


def _args(name: str, rng) -> list:
    f32 = lambda *s: rng.uniform(-1, 1, s).astype(np.float32)  # noqa: E731
    dec = lambda *s: rng.uniform(0.5, 0.95, s).astype(np.float32)  # noqa: E731
    return {
        "ema": [f32(C, L), np.float32(0.3), np.full((C, L), 7, np.float32)],
        "seq": [dec(L), f32(L), np.full(L, 7, np.float32)],
        "acc": [dec(C, L), f32(C, L), f32(C, L)],
        "step2": [dec(C, L), f32(C, L), np.full((C, L), 7, np.float32)],
        "gae": [f32(C, L), f32(C, L), f32(C, L), np.float32(0.99), np.float32(0.95), np.full((C, L), 7, np.float32)],
        "two_emas": [f32(C, L), np.float32(0.1), np.float32(0.6), np.zeros((C, L), np.float32),
                     np.zeros((C, L), np.float32)],
        "ema_f16": [f32(C, L).astype(np.float16), np.float32(0.25), np.zeros((C, L), np.float16)],
        "ema_bias": [f32(C, L), np.float32(0.9), np.zeros((C, L), np.float32)],
        "rglru": [f32(C, L), rng.uniform(0, 1, (C, L)).astype(np.float32),
                  np.log(dec(C)), np.float32(8.0), np.zeros((C, L), np.float32)],
        "reset_thr": [f32(C, L), np.float32(0.5), np.float32(0.8), np.zeros((C, L), np.float32)],
        "outside_load": [f32(C, L), np.array([0.7], np.float32), np.full((C, L), 7, np.float32)],
        "mamba2": [f32(C, L), rng.uniform(0.01, 0.2, (C, L)).astype(np.float32), -dec(C), f32(L, 8), f32(L, 8),
                   np.full((C, L), 7, np.float32)],
        "seq_i32_final": [rng.integers(-5, 5, L, dtype=np.int32), rng.integers(-9, 9, L, dtype=np.int32),
                          np.int32(3), np.zeros(L, np.int32), np.zeros(1, np.int32)],
    }[name]


NAMES = ["ema", "seq", "acc", "step2", "gae", "two_emas", "ema_f16", "ema_bias", "rglru", "reset_thr", "seq_i32_final",
         "outside_load", "mamba2"]


def lower_forms(text: str):
    """`text` raised, through scan-to-gpu (tiles of 4 threads x 2 items) and
    scan-to-loops: (module, the functions the raise found a scan op in, the scan ops
    left for the sequential lowering by function)."""
    m = parse_ir(text)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, m)
    fns = [op for op in m.ops if isinstance(op, func.FuncOp)]
    raised = {fn.sym_name.data for fn in fns if any(o.name.startswith("scan.") for o in fn.walk())}
    ScanToGpu(block_size=4, items_per_thread=2).apply(ctx, m)
    left = {fn.sym_name.data: [o.name for o in fn.walk() if o.name.startswith("scan.") and o.name != "scan.yield"]
            for fn in fns}
    ScanToLoops().apply(ctx, m)
    return m, raised, {n: ops for n, ops in left.items() if ops}


@pytest.fixture(scope="module")
def lowered():
    m, raised, left = lower_forms(TEXT)
    assert raised == set(NAMES), "the raise must find every loop of the forms"
    assert left == {}, f"left for the sequential lowering: {left}"
    launches, _ = _host_launches(m)  # host functions hold launches and index math only
    assert all(launches[n] for n in NAMES)
    return m


@pytest.mark.parametrize("name", NAMES)
def test_form_runs_like_the_loops(lowered, name):
    rng = np.random.default_rng(len(name))
    args = _args(name, rng)
    ref = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_function(parse_ir(TEXT), name, *ref)
    simulate_launch(lowered, name, *got)
    for r, g in zip(ref, got):
        if isinstance(r, np.ndarray):
            if r.dtype.kind == "i":
                np.testing.assert_array_equal(g, r)
            else:
                np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=2e-3, atol=2e-3)


def test_scalars_are_kernel_parameters(lowered):
    from scanweaver.rewrites.launch import launch_descriptions

    descs = {d.func_name: d for d in launch_descriptions(lowered)}
    assert [a for a in descs["gae"].args if a[1] == "scalar"] == [("gamma", "scalar", "f32", ()),
                                                                 ("lam", "scalar", "f32", ())]
    assert descs["seq"].grid == (1, 1, 1) and "no channel loop (one block)" in descs["seq"].notes
    assert ("y", "inout", "f32", ("?", "?")) in descs["acc"].args


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_every_form_assembles_without_spills(chip):
    lowered = compiler.lower(TEXT, "gpu", keep_stages=False)
    out = export_gpu(lowered.module, chip)
    assert len(out["ptxas"]) == len(NAMES)
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)
