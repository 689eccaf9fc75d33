"""Associative updates of state kept in memory (issue 14): `m[0]` (one series) or
`m[c]` (per channel, channel loop outside or inside the time loop) loaded and stored
every step, updated by max/min/and/or/xor.  Raised to scan.scan after the promote
reshape; checked against the interpreted original bit for bit (max/min and the integer
ops are exact), lengths 0 and 1 included, then on the CPU and through the GPU kernel
lowering (simulator, ptxas spills)."""

from __future__ import annotations

import numpy as np
import pytest
from test_raise import raised, run_both
from test_raise_forms import ASSOC_OPS

import scanweaver
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.raise_affine import raise_recurrences

RNG = np.random.default_rng(21)
PROMOTED = "after carrying the state in memory as iter_args"


def series(op: str, el: str, swap: bool = False) -> str:
    """`m[0] = op(m[0], x[t])`, every running value also stored to y[t]."""
    a, b = ("%xv", "%old") if swap else ("%old", "%xv")
    return f"""
func.func @mm(%x: memref<?x{el}>, %m: memref<1x{el}>, %y: memref<?x{el}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?x{el}>
  scf.for %t = %c0 to %n step %c1 {{
    %xv = memref.load %x[%t] : memref<?x{el}>
    %old = memref.load %m[%c0] : memref<1x{el}>
    %new = {op} {a}, {b} : {el}
    memref.store %new, %m[%c0] : memref<1x{el}>
    memref.store %new, %y[%t] : memref<?x{el}>
  }}
  func.return
}}
"""


def channels(op: str, el: str, time_outer: bool = False) -> str:
    """`m[c] = op(m[c], x[c, t])` (time_outer: x[t, c], `for t { for c }`), the
    channel count dynamic."""
    x_idx = "%t, %c" if time_outer else "%c, %t"
    outer, inner = ("%t = %c0 to %n", "%c = %c0 to %nc") if time_outer else ("%c = %c0 to %nc", "%t = %c0 to %n")
    tdim = 0 if time_outer else 1
    return f"""
func.func @mc(%x: memref<?x?x{el}>, %m: memref<?x{el}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nc = memref.dim %m, %c0 : memref<?x{el}>
  %n = memref.dim %x, %c{tdim} : memref<?x?x{el}>
  scf.for {outer} step %c1 {{
    scf.for {inner} step %c1 {{
      %xv = memref.load %x[{x_idx}] : memref<?x?x{el}>
      %old = memref.load %m[%c] : memref<?x{el}>
      %new = {op} %old, %xv : {el}
      memref.store %new, %m[%c] : memref<?x{el}>
    }}
  }}
  func.return
}}
"""


def values(shape, el):
    if el.startswith("f"):
        x = RNG.uniform(-1, 1, size=shape).astype(np.float32 if el == "f32" else np.float64)
        flat = x.reshape(-1)
        for k, v in zip(range(0, flat.size, 7), [0.0, -0.0, np.nan, -0.0]):
            flat[k] = v  # signed zeros (maximumf orders -0 < +0) and NaN
        return x
    dt = np.int32 if el == "i32" else np.int64
    info = np.iinfo(dt)
    return RNG.integers(info.min, info.max, size=shape, dtype=dt)


def series_args(el, n):
    x = values(n, el)
    return [x, values(1, el), np.zeros_like(x)]


def channel_args(el, n, nc=4, time_outer=False):
    return [values((n, nc) if time_outer else (nc, n), el), values(nc, el)]


def report(src, reassociate=False):
    module = parse_ir(src)
    lines: list[str] = []
    ops, _ = raise_recurrences(module, reassociate, lines)
    module.verify()
    return module, ops, lines


def same_bits(a1, a2):
    for x, y in zip(a1, a2):
        if isinstance(x, np.ndarray):
            assert x.tobytes() == y.tobytes(), (x, y)


@pytest.mark.parametrize("op,el", ASSOC_OPS)
@pytest.mark.parametrize("swap", [False, True])
def test_series_in_memory_becomes_a_generic_scan_and_agrees(op, el, swap):
    src = series(op, el, swap)
    _, ops, lines = report(src)
    assert [o.name for o in ops] == ["scan.scan"]
    assert [o.name for o in ops[0].combine.block.ops] == [op, "scan.yield"]
    assert len(lines) == 1 and "loop raised to scan.scan" in lines[0] and PROMOTED in lines[0]
    original, module, _ = raised(src)
    for n in (0, 1, 23):
        (a1, _), (a2, _) = run_both(original, module, "mm", series_args(el, n))
        same_bits(a1, a2)  # y and the final m[0], bit for bit


@pytest.mark.parametrize("op,el", ASSOC_OPS)
@pytest.mark.parametrize("time_outer", [False, True])
def test_per_channel_state_in_memory_becomes_a_generic_scan_and_agrees(op, el, time_outer):
    src = channels(op, el, time_outer)
    _, ops, lines = report(src)
    assert [o.name for o in ops] == ["scan.scan"]
    assert len(lines) == 1 and "carrying the state in memory as iter_args" in lines[0], lines
    assert ("moving the channel loop outside" in lines[0]) == time_outer
    original, module, _ = raised(src)
    for n in (0, 1, 17):  # n == 0: m[c] is neither read nor written (guarded)
        (a1, _), (a2, _) = run_both(original, module, "mc", channel_args(el, n, time_outer=time_outer))
        same_bits(a1, a2)


def test_an_empty_channel_set_reads_no_state():
    """nc == 0 and n == 0 together: nothing is touched (m has no element)."""
    original, module, _ = raised(channels("arith.maximumf", "f32"))
    (a1, _), (a2, _) = run_both(original, module, "mc", [np.zeros((0, 0), np.float32), np.zeros(0, np.float32)])
    same_bits(a1, a2)


@pytest.mark.parametrize("op", ["arith.maxnumf", "arith.minnumf"])
def test_maxnumf_in_memory_is_refused_with_its_reason(op):
    for src in (series(op, "f32"), channels(op, "f32")):
        module, ops, lines = report(src)
        assert ops == [] and len(lines) == 1
        assert "use arith.maximumf" in lines[0] and PROMOTED in lines[0], lines
        assert print_ir(module) == print_ir(parse_ir(src))  # the promoted copy is undone


@pytest.mark.parametrize("update", [
    "%sq = arith.muli %old, %old : i32\n    %new = arith.addi %sq, %xv : i32",  # h*h + x
    "%new = arith.maxsi %old, %old : i32",  # no element
    "%d = arith.divsi %old, %xv : i32\n    %new = arith.maxsi %d, %xv : i32",  # max(h / x, x)
])
def test_non_associative_updates_in_memory_stay_refused(update):
    src = series("arith.maxsi", "i32").replace("%new = arith.maxsi %old, %xv : i32", update)
    module, ops, lines = report(src)
    assert ops == [] and len(lines) == 1 and "loop not raised" in lines[0]
    assert print_ir(module) == print_ir(parse_ir(src))


def test_escaping_previous_value_in_memory_stays_refused():
    """y[t] = m[0] before the update: the scan's state would be used twice."""
    src = series("arith.maxsi", "i32").replace(
        "memref.store %new, %y[%t]", "memref.store %old, %y[%t]")
    module, ops, lines = report(src)
    assert ops == [] and len(lines) == 1 and "not affine" in lines[0]
    assert print_ir(module) == print_ir(parse_ir(src))


def test_state_memref_read_elsewhere_in_the_loop_is_not_promoted():
    """x[t] read from the state's own memref: not a fixed location, may alias m[0]."""
    src = series("arith.maxsi", "i32").replace(
        "%xv = memref.load %x[%t] : memref<?xi32>", "%xv = memref.load %y[%t] : memref<?xi32>")
    src = src.replace("memref.store %new, %y[%t] : memref<?xi32>", "")
    src = src.replace("%y: memref<?xi32>", "%y: memref<1xi32>").replace("%y[%t] : memref<?xi32>", "%m[%t] : memref<1xi32>")
    assert "memref.load %m[%t]" in src
    module, ops, lines = report(src)
    assert ops == [] and len(lines) == 1 and "loop not raised" in lines[0]
    assert print_ir(module) == print_ir(parse_ir(src))


LSE_MEM = """
func.func @lse(%x: memref<?xf32>, %ms: memref<2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %t = %c0 to %n step %c1 {
    %xv = memref.load %x[%t] : memref<?xf32>
    %m = memref.load %ms[%c0] : memref<2xf32>
    %s = memref.load %ms[%c1] : memref<2xf32>
    %mn = arith.maximumf %m, %xv : f32
    %d1 = arith.subf %m, %mn : f32
    %e1 = math.exp %d1 : f32
    %sc = arith.mulf %s, %e1 : f32
    %d2 = arith.subf %xv, %mn : f32
    %e2 = math.exp %d2 : f32
    %sn = arith.addf %sc, %e2 : f32
    memref.store %mn, %ms[%c0] : memref<2xf32>
    memref.store %sn, %ms[%c1] : memref<2xf32>
  }
  func.return
}
"""


def test_online_logsumexp_in_memory_needs_the_reassociation_option():
    module, ops, lines = report(LSE_MEM)
    assert ops == [] and len(lines) == 1 and "reassociate=true" in lines[0], lines
    assert print_ir(module) == print_ir(parse_ir(LSE_MEM))
    module, ops, lines = report(LSE_MEM, reassociate=True)
    assert [o.name for o in ops] == ["scan.scan"] and PROMOTED in lines[0]
    x = RNG.uniform(-5, 5, 30).astype(np.float32)
    (a1, _), (a2, _) = run_both(parse_ir(LSE_MEM), module, "lse", [x, np.array([-np.inf, 0.0], np.float32)])
    same_bits(a1, a2)  # the sequential fold of the combine is the loop, bit for bit


@pytest.mark.parametrize("src,fname,make", [
    (series("arith.maximumf", "f32"), "mm", lambda: series_args("f32", 300)),
    (series("arith.minui", "i64", swap=True), "mm", lambda: series_args("i64", 1)),
    (channels("arith.xori", "i64"), "mc", lambda: channel_args("i64", 200, nc=3)),
    (channels("arith.minimumf", "f64", time_outer=True), "mc", lambda: channel_args("f64", 0, time_outer=True)),
])
def test_cpu_build_matches_the_interpreter(src, fname, make):
    program = scanweaver.compile(src, target="cpu")
    assert "scan.scan" in program.stage_ir("scanweaver-raise")
    args = make()
    a_cpu = [x.copy() for x in args]
    a_ref = [x.copy() for x in args]
    program[fname](*a_cpu)
    run_function(src, fname, *a_ref)
    same_bits(a_cpu, a_ref)


GPU_FORMS = {
    "mm": (series("arith.maximumf", "f32"), lambda: series_args("f32", 37)),
    "mc": (channels("arith.maxsi", "i32"), lambda: channel_args("i32", 29, nc=3)),
}


@pytest.mark.parametrize("name", sorted(GPU_FORMS))
def test_scan_kernel_runs_like_the_loop(name):
    """The scan.scan kernel (scan-to-gpu), the host copies around it run by the
    thread-block simulator: bit for bit against the interpreted loop."""
    from scanweaver.interp.gpu_sim import simulate_launch
    from scanweaver.ir import make_context
    from scanweaver.rewrites.blelloch_gpu import ScanToGpu
    from scanweaver.rewrites.raise_affine import RaiseRecurrences
    from scanweaver.rewrites.scan_to_loops import ScanToLoops

    src, make = GPU_FORMS[name]
    m, ctx = parse_ir(src), make_context()
    RaiseRecurrences().apply(ctx, m)
    ScanToGpu(block_size=4, items_per_thread=2).apply(ctx, m)
    assert not any(o.name == "scan.scan" for o in m.walk())
    assert any(o.name == "gpu.launch_func" for o in m.walk())
    ScanToLoops().apply(ctx, m)
    args = make()
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(src), name, *ref)
    simulate_launch(m, name, *got)
    same_bits(got, ref)


def test_the_whole_gpu_build_folds_the_host_copies(tmp_path):
    """The seeded scan (scan_seed_gpu.py) loads its seed from m[0] in the kernel and
    stores the last value back to it, so the whole-program GPU build succeeds for the
    series (tests/test_gpu_seeded_memory.py runs it); state per channel (m[c]) folds the
    host channel loop into the grid: one kernel, one launch per call
    (tests/test_gpu_seeded_channels.py runs it)."""
    from scanweaver.cli import main

    for name in ("mm", "mc"):
        f = tmp_path / f"{name}.mlir"
        f.write_text(GPU_FORMS[name][0])
        out = tmp_path / f"{name}.ptx"
        assert main(["compile", str(f), "--target", "ptx", "-o", str(out)]) == 0
        ptx = out.read_text()
        assert ptx.count(".entry ") == 1 and ".entry scan_generic_0" in ptx, name


def test_kernels_assemble_without_spills():
    from scanweaver import compiler
    from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

    if not ptxas_available():
        pytest.skip("ptxas not found on PATH: spills not checked")
    text = "\n".join(src for src, _ in GPU_FORMS.values())
    for chip in ("sm_80", "sm_90"):
        out = export_gpu(compiler.lower(text, "gpu", keep_stages=False).module, chip)
        assert len(out["ptxas"]) == len(GPU_FORMS)
        for kernel, f in out["ptxas"].items():
            assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)
