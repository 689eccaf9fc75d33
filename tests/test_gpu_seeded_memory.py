"""The seeded GPU scan of state kept in memory (issue 14): `m[0] = op(m[0], x[t])` raised
to a scan.scan whose seed is the host load of m[0] and whose last value is stored back to
m[0] becomes one kernel that loads m[0] itself and stores the last value to it (the
thread of the last step); m is left alone for an empty series.  Checked bit for bit
against the interpreted loop: the thread-block simulator (4 threads x 2 items, so tiles
chain), the CUDA runtime with a driver whose launches run in the simulator, and ptxas
(sm_80, sm_90, no spills).  In time blocks the chunk kernel (launch 1) reads m[0] and
scans chunk 0 from it, and only the carry kernel (launch 3) writes m[0]: no two blocks
of one launch race on it.  A state memref of dynamic
size (`m[0]` loaded and stored under the guard `0 < n`) is read and written only when
n > 0 and m[0] is in bounds.  Per-channel state (`m[c]`, a host loop over channels):
tests/test_gpu_seeded_channels.py."""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu_seeded_scan import ScalarSimulatorDriver, gpu_module
from test_raise_memory_assoc import series, series_args, values
from xdsl.dialects import func

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.blelloch_gpu import refusals
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.runtime.cuda_program import _host_launches
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

OPS = [("arith.maximumf", "f32"), ("arith.xori", "i32"), ("arith.minsi", "i64")]
LENGTHS = [0, 1, 2, 7, 8, 9, 16, 17]  # around the tile of 8 (4 threads x 2 items)


def fn_of(m, name):
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp) and f.sym_name.data == name]
    return fn


def kernels(m) -> list[str]:
    return [d.kernel_name for d in launch_descriptions(m)]


def check(src: str, m, el: str, n: int) -> None:
    args = series_args(el, n)
    ref, got = [a.copy() for a in args], [a.copy() for a in args]
    run_function(parse_ir(src), "mm", *ref)
    simulate_launch(m, "mm", *got)
    for g, r in zip(got, ref):
        assert g.tobytes() == r.tobytes(), (n, got, ref)


def guarded(op: str, el: str) -> str:
    """m: memref<? x el>: m[0] not provably in bounds, so the promote reshape loads it
    under `0 < n` (0 otherwise) and stores it back under the same guard."""
    return series(op, el).replace(f"memref<1x{el}>", f"memref<?x{el}>")


@pytest.mark.parametrize("op,el", OPS)
@pytest.mark.parametrize("swap", [False, True])
def test_state_in_memory_runs_in_one_seeded_kernel(op, el, swap):
    src = series(op, el, swap)
    m = gpu_module(src)
    fn = fn_of(m, "mm")
    assert refusals(fn) == []
    # no host copies left: only the launch
    assert {o.name for o in fn.walk()} <= {"func.func", "func.return", "arith.constant", "memref.dim",
                                          "gpu.launch_func", "arith.addi", "arith.subi", "arith.divui",
                                          "arith.maxui", "arith.ceildivui", "arith.maxsi", "arith.muli"}, \
        sorted({o.name for o in fn.walk()})
    (desc,) = launch_descriptions(m)
    assert "seeded" in desc.notes and "last values to the results" in desc.notes
    assert [a[1] for a in desc.args if a[0] == "init0"] == ["inout"], desc.args
    for n in LENGTHS:
        check(src, m, el, n)


TB_NAMES = {"func.func", "func.return", "arith.constant", "memref.dim", "gpu.launch_func", "arith.addi",
            "arith.subi", "arith.divui", "arith.maxui", "arith.ceildivui", "arith.maxsi", "arith.muli",
            "memref.alloc", "memref.dealloc", "arith.cmpi", "scf.if", "scf.yield"}


@pytest.mark.parametrize("op,el", OPS)
@pytest.mark.parametrize("form", ["static", "guarded"])
def test_state_in_memory_in_time_blocks(op, el, form):
    """time_blocks=always, chunks of 8 steps: launch 1 reads m[0] (chunk 0 scans from it),
    the carry kernel (launch 3) writes it; bit for bit up to 5 chunks, m sizes 1 and 3."""
    src = series(op, el) if form == "static" else guarded(op, el)
    m = gpu_module(src, "always")
    fn = fn_of(m, "mm")
    assert refusals(fn) == [] and {o.name for o in fn.walk()} <= TB_NAMES, sorted({o.name for o in fn.walk()})
    descs = {d.kernel_name: d for d in launch_descriptions(m)}
    assert sorted(descs) == ["scan_generic_0", "scan_generic_tb_0", "scan_generic_tb_0_carry"]
    assert ("init0", "in") in [a[:2] for a in descs["scan_generic_tb_0"].args]
    assert ("final0", "inout") in [a[:2] for a in descs["scan_generic_tb_0_carry"].args]
    for n in (*LENGTHS, 24, 33):
        for size in (1,) if form == "static" else (1, 3):
            x = values(n, el)
            ref = [x.copy(), values(size, el), np.zeros_like(x)]
            got = [a.copy() for a in ref]
            run_function(parse_ir(src), "mm", *ref)
            simulate_launch(m, "mm", *got)
            for g, r in zip(got, ref):
                assert g.tobytes() == r.tobytes(), (n, size, got, ref)


def test_time_blocks_leave_the_state_alone_when_empty_or_out_of_bounds():
    """n == 0: m[0] keeps its bits; m empty (guarded form): nothing of m is read or
    written, the scan starts from the guard's other value."""
    m = gpu_module(series("arith.maximumf", "f32"), "always")
    state = np.array([0x7FC01234], np.uint32).view(np.float32)
    got = [np.zeros(0, np.float32), state.copy(), np.zeros(0, np.float32)]
    simulate_launch(m, "mm", *got)
    assert got[1].view(np.uint32)[0] == 0x7FC01234
    m = gpu_module(guarded("arith.maxsi", "i32"), "always")
    x = values(20, "i32")
    got = [x.copy(), np.zeros(0, np.int32), np.zeros_like(x)]
    simulate_launch(m, "mm", *got)
    assert got[1].size == 0
    assert got[2].tobytes() == np.maximum.accumulate(np.maximum(x, 0)).astype(np.int32).tobytes()


def test_an_empty_series_leaves_the_state_alone():
    """n == 0: m[0] keeps its bits (a NaN payload included), y is untouched."""
    src = series("arith.maximumf", "f32")
    m = gpu_module(src)
    for bits in (0x7FC01234, 0x80000000, 0x3F800000):
        state = np.array([bits], np.uint32).view(np.float32)
        got = [np.zeros(0, np.float32), state.copy(), np.zeros(0, np.float32)]
        simulate_launch(m, "mm", *got)
        assert got[1].view(np.uint32)[0] == bits


def test_the_state_memref_read_elsewhere_keeps_the_host_copies():
    """m also read after the loop: the kernel's store would not be the only one that
    sees it between its load and its store; not matched, the refusal named."""
    src = series("arith.maxsi", "i32").replace(
        "  func.return\n", "  %again = memref.load %m[%c0] : memref<1xi32>\n"
        "  memref.store %again, %y[%c0] : memref<?xi32>\n  func.return\n")
    m = gpu_module(src)
    assert any("operands are temporaries" in r for r in refusals(fn_of(m, "mm"))), refusals(fn_of(m, "mm"))


@pytest.mark.parametrize("op,el", OPS)
@pytest.mark.parametrize("form", ["static", "guarded", "time blocks"])
def test_cuda_runtime_updates_the_state(op, el, form):
    from scanweaver.runtime.cuda import CudaFunction, CudaModule

    src = guarded(op, el) if form == "guarded" else series(op, el)
    m = gpu_module(src, "always" if form == "time blocks" else "auto")
    fn = CudaFunction(CudaModule("ptx", driver=ScalarSimulatorDriver(m)), "mm", _host_launches(m)[0]["mm"], 3)
    for n in (0, 1, 9, 17):
        args = series_args(el, n)
        ref, got = [a.copy() for a in args], [a.copy() for a in args]
        run_function(parse_ir(src), "mm", *ref)
        fn(*got)
        for g, r in zip(got, ref):
            assert g.tobytes() == r.tobytes(), (n, got, ref)


def test_the_state_element_of_a_longer_memref():
    """m: memref<3 x i64>, the state in m[2]; m[0], m[1] untouched."""
    src = series("arith.minsi", "i64").replace("memref<1xi64>", "memref<3xi64>").replace(
        "%m[%c0]", "%m[%c2]").replace("%c1 = arith.constant 1 : index",
                                       "%c1 = arith.constant 1 : index\n  %c2 = arith.constant 2 : index")
    m = gpu_module(src)
    assert refusals(fn_of(m, "mm")) == []
    for n in (0, 1, 17):
        x = values(n, "i64")
        ref = [x.copy(), values(3, "i64"), np.zeros_like(x)]
        got = [a.copy() for a in ref]
        run_function(parse_ir(src), "mm", *ref)
        simulate_launch(m, "mm", *got)
        for g, r in zip(got, ref):
            assert g.tobytes() == r.tobytes(), (n, got, ref)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_state_kernels_assemble_without_spills(chip):
    text = "\n".join(series(op, el).replace("@mm(", f"@mm_{el}(") for op, el in OPS)
    text += "\n" + guarded("arith.maximumf", "f32").replace("@mm(", "@mm_guarded(")
    out = export_gpu(compiler.lower(text, "gpu", keep_stages=False).module, chip)
    assert len(out["ptxas"]) == len(OPS) + 1
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_state_time_block_kernels_assemble_without_spills(chip):
    """The default block (128 x 4, chunks of 16 tiles), time blocks asked for."""
    from scanweaver.ir import make_context
    from scanweaver.rewrites.pipeline import stages_for
    from scanweaver.rewrites.scan_to_gpu import ScanToGpu

    text = "\n".join(series(op, el).replace("@mm(", f"@mm_{el}(") for op, el in OPS)
    text += "\n" + guarded("arith.maximumf", "f32").replace("@mm(", "@mm_guarded(")
    m, ctx = parse_ir(text), make_context()
    for p in stages_for("gpu"):
        (ScanToGpu(time_blocks="always") if isinstance(p, ScanToGpu) else p).apply(ctx, m)
    out = export_gpu(m, chip)
    assert len(out["ptxas"]) == 3 * (len(OPS) + 1), sorted(out["ptxas"])
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)


@pytest.mark.parametrize("op,el", OPS)
def test_a_guarded_state_runs_in_one_seeded_kernel(op, el):
    src = guarded(op, el)
    m = gpu_module(src)
    fn = fn_of(m, "mm")
    assert refusals(fn) == [] and [o.name for o in fn.walk()].count("gpu.launch_func") == 1
    assert not any(o.name in ("scf.if", "memref.load", "memref.store") for o in fn.walk())
    for n in (0, 1, 9, 17):
        for size in (1, 3):
            x = values(n, el)
            ref = [x.copy(), values(size, el), np.zeros_like(x)]
            got = [a.copy() for a in ref]
            run_function(parse_ir(src), "mm", *ref)
            simulate_launch(m, "mm", *got)
            for g, r in zip(got, ref):
                assert g.tobytes() == r.tobytes(), (n, size, got, ref)


def test_a_guarded_state_out_of_bounds_is_not_touched():
    """n > 0 but m empty (the loop itself would read outside m): the kernel checks the
    bounds, reads and writes no element of m, and scans from the guard's other value."""
    src = guarded("arith.maxsi", "i32")
    m = gpu_module(src)
    x = values(9, "i32")
    got = [x.copy(), np.zeros(0, np.int32), np.zeros_like(x)]
    simulate_launch(m, "mm", *got)
    assert got[1].size == 0
    assert got[2].tobytes() == np.maximum.accumulate(np.maximum(x, 0)).astype(np.int32).tobytes()


@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_log_sum_exp_state_in_memory(time_blocks):
    """(m, s) in ms[0], ms[1] (reassociate=true): two seeds loaded from one memref and
    both last values stored back; the max bit for bit, the sum to rounding."""
    from test_raise_memory_assoc import LSE_MEM

    m = gpu_module(LSE_MEM, time_blocks, reassociate=True)
    assert refusals(fn_of(m, "lse")) == []
    assert ("scan_generic_tb_0" in kernels(m)) == (time_blocks == "always"), kernels(m)
    rng = np.random.default_rng(3)
    for n in (0, 1, 9, 17, 33):
        x = rng.uniform(-5, 5, n).astype(np.float32)
        state = np.array([-np.inf, 0.0], np.float32)
        ref, got = [x.copy(), state.copy()], [x.copy(), state.copy()]
        run_function(parse_ir(LSE_MEM), "lse", *ref)
        simulate_launch(m, "lse", *got)
        assert got[1][0].tobytes() == ref[1][0].tobytes(), (n, got, ref)
        assert np.isclose(got[1][1], ref[1][1], rtol=2e-6, atol=0), (n, got, ref)
        if n == 0:
            assert got[1].tobytes() == state.tobytes()
