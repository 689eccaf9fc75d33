"""The seeded GPU scan of per-channel state kept in memory (issue 14): `m[c] = op(m[c],
x[c, t])`, in either loop order (`for c { for t }`, or `for t { for c }` over x[t, c],
which the promote reshape turns channel-outer), raised to a scan.scan inside a host
loop over the channels, becomes ONE kernel launch whose grid is that loop: block c loads
its seed m[c], scans x[c, :] (or x[:, c]) and the thread of the last step stores m[c].
Checked bit for bit against the interpreted loop for the nine associative ops, channel
counts 0, 1 and 3 and lengths around the tile of 8 (4 threads x 2 items): in the
thread-block simulator, in the CUDA runtime with a driver whose launches run in the
simulator, and by ptxas (sm_80, sm_90, no spills).  Forms it does not fold keep the
refusal, with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu_seeded_memory import fn_of
from test_gpu_seeded_scan import ScalarSimulatorDriver, gpu_module
from test_raise_forms import ASSOC_OPS
from test_raise_memory_assoc import channels, values

from scanweaver.errors import ScanWeaverValueError
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.blelloch_gpu import refusals
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.pipeline import stages_for
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.runtime.cuda_program import _host_launches
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

LENGTHS = [0, 1, 7, 8, 9, 16, 17]  # around the tile of 8
CHANNELS = [0, 1, 3]
#: (channels, length): every length with 3 channels, no and one channel at a few
CASES = [(3, n) for n in LENGTHS] + [(0, 0), (0, 9), (1, 0), (1, 9)]
HOST_OPS = {"func.func", "func.return", "arith.constant", "memref.dim", "arith.cmpi", "scf.if", "scf.yield",
            "gpu.launch_func"}


def args_for(el: str, nc: int, n: int, time_outer: bool) -> list[np.ndarray]:
    return [values((n, nc) if time_outer else (nc, n), el), values(nc, el)]


def agree(src: str, run, fname: str, args: list[np.ndarray]) -> None:
    ref, got = [a.copy() for a in args], [a.copy() for a in args]
    run_function(parse_ir(src), fname, *ref)
    run(*got)
    for g, r in zip(got, ref):
        assert g.tobytes() == r.tobytes(), (args, got, ref)


def static_channels(el: str = "i32", n: str = "?") -> str:
    """`for c < 3` over x: memref<3 x n>, m: memref<3>: a constant channel count."""
    return f"""
func.func @mc(%x: memref<3x{n}x{el}>, %m: memref<3x{el}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %n = memref.dim %x, %c1 : memref<3x{n}x{el}>
  scf.for %c = %c0 to %c3 step %c1 {{
    scf.for %t = %c0 to %n step %c1 {{
      %xv = memref.load %x[%c, %t] : memref<3x{n}x{el}>
      %old = memref.load %m[%c] : memref<3x{el}>
      %new = arith.maxsi %old, %xv : {el}
      memref.store %new, %m[%c] : memref<3x{el}>
    }}
  }}
  func.return
}}
"""


LSE_CHANNELS = """
func.func @mc(%x: memref<?x?xf32>, %ms: memref<?x2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nc = memref.dim %ms, %c0 : memref<?x2xf32>
  %n = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %nc step %c1 {
    scf.for %t = %c0 to %n step %c1 {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %m = memref.load %ms[%c, %c0] : memref<?x2xf32>
      %s = memref.load %ms[%c, %c1] : memref<?x2xf32>
      %mn = arith.maximumf %m, %xv : f32
      %d1 = arith.subf %m, %mn : f32
      %e1 = math.exp %d1 : f32
      %sc = arith.mulf %s, %e1 : f32
      %d2 = arith.subf %xv, %mn : f32
      %e2 = math.exp %d2 : f32
      %sn = arith.addf %sc, %e2 : f32
      memref.store %mn, %ms[%c, %c0] : memref<?x2xf32>
      memref.store %sn, %ms[%c, %c1] : memref<?x2xf32>
    }
  }
  func.return
}
"""


CAPTURES = """
func.func @mc(%x: memref<?x?xf32>, %m: memref<?xf32>, %p: memref<1xf32>, %k: f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %sc = memref.load %p[%c0] : memref<1xf32>
  %nc = memref.dim %m, %c0 : memref<?xf32>
  %n = memref.dim %x, %c0 : memref<?x?xf32>
  scf.for %t = %c0 to %n step %c1 {
    scf.for %c = %c0 to %nc step %c1 {
      %xv = memref.load %x[%t, %c] : memref<?x?xf32>
      %xs = arith.mulf %xv, %sc : f32
      %xk = arith.addf %xs, %k : f32
      %old = memref.load %m[%c] : memref<?xf32>
      %new = arith.maximumf %old, %xk : f32
      memref.store %new, %m[%c] : memref<?xf32>
    }
  }
  func.return
}
"""


def with_output(el: str = "i32") -> str:
    """Every running value also stored to y[c, t]: the consumer folded in too."""
    return channels("arith.maxsi", el).replace(
        f"%m: memref<?x{el}>)", f"%m: memref<?x{el}>, %y: memref<?x?x{el}>)").replace(
        f"      memref.store %new, %m[%c] : memref<?x{el}>\n",
        f"      memref.store %new, %m[%c] : memref<?x{el}>\n      memref.store %new, %y[%c, %t] : memref<?x?x{el}>\n")


@pytest.mark.parametrize("op,el", ASSOC_OPS)
@pytest.mark.parametrize("time_outer", [False, True])
def test_per_channel_state_runs_in_one_seeded_kernel(op, el, time_outer):
    src = channels(op, el, time_outer)
    m = gpu_module(src)
    fn = fn_of(m, "mc")
    assert refusals(fn) == []
    # no host loop nor copy left: the launch (guarded by C > 0) and the sizes it needs
    names = [o.name for o in fn.walk()]
    assert set(names) <= HOST_OPS and names.count("gpu.launch_func") == 1, sorted(set(names))
    (desc,) = launch_descriptions(m)
    assert "the host channel loop is the grid" in desc.notes
    assert desc.grid == ("init0.shape[0]", 1, 1), desc.grid
    assert desc.covers_dims == (("x0", 1 if time_outer else 0, "init0", 0),), desc.covers_dims
    for nc, n in CASES:
        agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", args_for(el, nc, n, time_outer))


def test_an_empty_series_leaves_every_channel_alone():
    """n == 0: every m[c] keeps its bits (NaN payloads included)."""
    m = gpu_module(channels("arith.maximumf", "f32"))
    bits = np.array([0x7FC01234, 0x80000000, 0x3F800000], np.uint32)
    got = [np.zeros((3, 0), np.float32), bits.view(np.float32).copy()]
    simulate_launch(m, "mc", *got)
    assert got[1].view(np.uint32).tolist() == bits.tolist()


@pytest.mark.parametrize("n", ["?", "17"])
def test_a_constant_channel_count(n):
    src = static_channels(n=n)
    m = gpu_module(src)
    assert refusals(fn_of(m, "mc")) == []
    (desc,) = launch_descriptions(m)
    assert desc.grid == (3, 1, 1) and desc.covers_dims == ()
    for length in ([0, 1, 9, 17] if n == "?" else [17]):
        agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", args_for("i32", 3, length, False))


def test_the_running_values_go_to_an_output_per_channel():
    src = with_output()
    m = gpu_module(src)
    assert refusals(fn_of(m, "mc")) == []
    for nc in CHANNELS:
        for n in (0, 1, 9, 17):
            args = [*args_for("i32", nc, n, False), np.zeros((nc, n), np.int32)]
            agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", args)


def test_values_from_above_the_channel_loop_are_captured():
    """x[t, c] * p[0] + k (a load before the loops, a scalar argument): kernel arguments."""
    m = gpu_module(CAPTURES)
    assert refusals(fn_of(m, "mc")) == []
    rng = np.random.default_rng(0)
    for nc, n in [(0, 9), (1, 1), (3, 0), (3, 17)]:
        args = [rng.uniform(-1, 1, (n, nc)).astype(np.float32), rng.uniform(-1, 1, nc).astype(np.float32),
                np.array([0.5], np.float32), np.float32(0.25)]
        ref, got = [np.copy(a) for a in args], [np.copy(a) for a in args]
        run_function(parse_ir(CAPTURES), "mc", *ref)
        simulate_launch(m, "mc", *got)
        for g, r in zip(got, ref):
            assert np.asarray(g).tobytes() == np.asarray(r).tobytes(), (nc, n, got, ref)


def test_log_sum_exp_state_per_channel():
    """(m, s) in ms[c, 0], ms[c, 1] (reassociate=true): the max bit for bit, the sum to rounding."""
    m = gpu_module(LSE_CHANNELS, reassociate=True)
    assert refusals(fn_of(m, "mc")) == []
    rng = np.random.default_rng(5)
    for nc in CHANNELS:
        for n in (0, 1, 9, 17):
            x = rng.uniform(-5, 5, (nc, n)).astype(np.float32)
            state = np.tile(np.array([-np.inf, 0.0], np.float32), (nc, 1))
            ref, got = [x.copy(), state.copy()], [x.copy(), state.copy()]
            run_function(parse_ir(LSE_CHANNELS), "mc", *ref)
            simulate_launch(m, "mc", *got)
            assert got[1][:, 0].tobytes() == ref[1][:, 0].tobytes(), (nc, n, got, ref)
            assert np.allclose(got[1][:, 1], ref[1][:, 1], rtol=2e-6, atol=0), (nc, n, got, ref)
            if n == 0:
                assert got[1].tobytes() == state.tobytes()


def test_time_blocks_keep_the_one_block_kernel():
    """time_blocks=always: chunk blocks would race on m[c]; the one seeded launch stays."""
    src = channels("arith.minsi", "i64", True)
    m = gpu_module(src, "always")
    assert refusals(fn_of(m, "mc")) == [] and [d.kernel_name for d in launch_descriptions(m)] == ["scan_generic_0"]
    for n in (0, 17):
        agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", args_for("i64", 3, n, True))


def runtime_function(m, nargs: int):
    from scanweaver.runtime.cuda import CudaFunction, CudaModule

    return CudaFunction(CudaModule("ptx", driver=ScalarSimulatorDriver(m)), "mc", _host_launches(m)[0]["mc"], nargs)


@pytest.mark.parametrize("op,el", [("arith.maximumf", "f32"), ("arith.xori", "i32"), ("arith.minui", "i64")])
@pytest.mark.parametrize("time_outer", [False, True])
def test_cuda_runtime_updates_every_channel(op, el, time_outer):
    src = channels(op, el, time_outer)
    fn = runtime_function(gpu_module(src), 2)
    for nc in CHANNELS:
        for n in (0, 1, 9, 17):
            agree(src, fn, "mc", args_for(el, nc, n, time_outer))


def test_cuda_runtime_checks_the_channel_sizes():
    """x has fewer channels than m: a loop over m's channels would read past x; the launch
    refuses with one clear error naming both shapes, and nothing is written."""
    fn = runtime_function(gpu_module(channels("arith.maxsi", "i32")), 2)
    x, st = values((2, 5), "i32"), values(3, "i32")
    before = st.copy()
    with pytest.raises(ScanWeaverValueError, match=r"x0.*init0|init0.*x0"):
        fn(x, st)
    assert st.tobytes() == before.tobytes()


def refusal_of(src: str) -> str:
    m = gpu_module(src)
    (why,) = refusals(fn_of(m, "mc"))
    assert "operands are temporaries" in why
    assert not launch_descriptions(m) or all("channel loop is the grid" not in d.notes for d in launch_descriptions(m))
    return why


def test_a_constant_count_over_a_dynamic_size_keeps_the_refusal():
    """`for c < 3` over x: memref<?x?>: nothing would check x has 3 rows."""
    src = static_channels().replace("memref<3x?xi32>", "memref<?x?xi32>")
    assert "a constant channel count indexes an array whose size there is dynamic" in refusal_of(src)


def test_a_channel_loop_doing_more_keeps_the_refusal():
    """The channel loop also stores m[c] + 0 to a second array: the kernel would drop it."""
    src = channels("arith.maxsi", "i32").replace(
        "%m: memref<?xi32>)", "%m: memref<?xi32>, %z: memref<?xi32>)").replace(
        "    }\n  }\n  func.return", "    }\n    %k = arith.constant 7 : i32\n    memref.store %k, %z[%c] : memref<?xi32>\n"
        "  }\n  func.return")
    assert "the channel loop does more than the scan's group" in refusal_of(src)


def test_a_channel_loop_with_a_step_keeps_the_refusal():
    src = channels("arith.maxsi", "i32").replace("scf.for %c = %c0 to %nc step %c1", "scf.for %c = %c1 to %nc step %c1")
    assert "the channel loop must run from 0 step 1" in refusal_of(src)


NESTED = """
func.func @mc(%x: memref<?x?x?xi32>, %m: memref<?x?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %nb = memref.dim %m, %c0 : memref<?x?xi32>
  %nc = memref.dim %m, %c1 : memref<?x?xi32>
  %n = memref.dim %x, %c2 : memref<?x?x?xi32>
  scf.for %b = %c0 to %nb step %c1 {
    scf.for %c = %c0 to %nc step %c1 {
      scf.for %t = %c0 to %n step %c1 {
        %xv = memref.load %x[%b, %c, %t] : memref<?x?x?xi32>
        %old = memref.load %m[%b, %c] : memref<?x?xi32>
        %new = arith.maxsi %old, %xv : i32
        memref.store %new, %m[%b, %c] : memref<?x?xi32>
      }
    }
  }
  func.return
}
"""


def test_nested_channel_loops_fold_too():
    """m[b, c] over two channel loops: the grid is their product (more in
    test_gpu_seeded_channel_nest.py)."""
    m = gpu_module(NESTED)
    assert refusals(fn_of(m, "mc")) == []
    (desc,) = launch_descriptions(m)
    assert desc.grid == ("init0.shape[0]*init0.shape[1]", 1, 1), desc.grid
    agree(NESTED, lambda *a: simulate_launch(m, "mc", *a), "mc", [values((2, 3, 9), "i32"), values((2, 3), "i32")])


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_channel_kernels_assemble_without_spills(chip):
    """One kernel per element type and loop order, the constant count and the pair."""
    forms = [channels(op, el, to).replace("@mc(", f"@mc_{el}_{int(to)}(")
             for op, el in [("arith.maximumf", "f32"), ("arith.minimumf", "f64"), ("arith.xori", "i32"),
                            ("arith.minsi", "i64")] for to in (False, True)]
    forms += [static_channels().replace("@mc(", "@mc_static("), LSE_CHANNELS.replace("@mc(", "@mc_lse(")]
    text = "\n".join(forms)
    m = parse_ir(text)  # the GPU pipeline's default blocks, the raise with reassociate=true (the pair)
    ctx = make_context()
    for p in stages_for("gpu"):
        (RaiseRecurrences(reassociate=True) if isinstance(p, RaiseRecurrences) else p).apply(ctx, m)
    out = export_gpu(m, chip)
    assert len(out["ptxas"]) == len(forms)
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)
