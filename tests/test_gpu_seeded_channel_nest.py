"""The seeded GPU scan of state kept in memory over a NEST of host channel loops (issue
14): `for b { for c { for t { m[b, c] = op(m[b, c], x[b, c, t]) } } }` becomes ONE
kernel launch whose grid is the product of the trip counts; each block delinearises its
id row-major (innermost fastest) into (b, c).  Checked bit for bit against the
interpreted loops, for channel shapes (0|1|2, 0|1|3) and lengths 0, 1 and 9, in the
thread-block simulator and in the CUDA runtime with a driver whose launches run in the
simulator; by ptxas (sm_80, sm_90, no spills); and on the command line.  Imperfect
nests and constant counts past the grid's limit keep the refusal, with the reason."""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu_seeded_channels import HOST_OPS, agree, refusal_of, runtime_function
from test_gpu_seeded_memory import fn_of
from test_gpu_seeded_scan import gpu_module
from test_raise_memory_assoc import values

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.blelloch_gpu import refusals
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.pipeline import stages_for
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

SHAPES = [(nb, nc) for nb in (0, 1, 2) for nc in (0, 1, 3)]
LENGTHS = [0, 1, 9]  # 9: past one tile of 8 (4 threads x 2 items), so tiles chain
OPS = [("arith.maximumf", "f32"), ("arith.minsi", "i32"), ("arith.xori", "i64")]


def nested(op: str, el: str) -> str:
    """`m[b, c] = op(m[b, c], x[b, c, t])`, both channel counts `memref.dim` of m."""
    return f"""
func.func @mc(%x: memref<?x?x?x{el}>, %m: memref<?x?x{el}>) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %nb = memref.dim %m, %c0 : memref<?x?x{el}>
  %nc = memref.dim %m, %c1 : memref<?x?x{el}>
  %n = memref.dim %x, %c2 : memref<?x?x?x{el}>
  scf.for %b = %c0 to %nb step %c1 {{
    scf.for %c = %c0 to %nc step %c1 {{
      scf.for %t = %c0 to %n step %c1 {{
        %xv = memref.load %x[%b, %c, %t] : memref<?x?x?x{el}>
        %old = memref.load %m[%b, %c] : memref<?x?x{el}>
        %new = {op} %old, %xv : {el}
        memref.store %new, %m[%b, %c] : memref<?x?x{el}>
      }}
    }}
  }}
  func.return
}}
"""


#: (m, s) in ms[b, c, 0], ms[b, c, 1]: the online log-sum-exp pair (reassociate=true)
LSE_NEST = """
func.func @mc(%x: memref<?x?x?xf32>, %ms: memref<?x?x2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %nb = memref.dim %ms, %c0 : memref<?x?x2xf32>
  %nc = memref.dim %ms, %c1 : memref<?x?x2xf32>
  %n = memref.dim %x, %c2 : memref<?x?x?xf32>
  scf.for %b = %c0 to %nb step %c1 {
    scf.for %c = %c0 to %nc step %c1 {
      scf.for %t = %c0 to %n step %c1 {
        %xv = memref.load %x[%b, %c, %t] : memref<?x?x?xf32>
        %m = memref.load %ms[%b, %c, %c0] : memref<?x?x2xf32>
        %s = memref.load %ms[%b, %c, %c1] : memref<?x?x2xf32>
        %mn = arith.maximumf %m, %xv : f32
        %d1 = arith.subf %m, %mn : f32
        %e1 = math.exp %d1 : f32
        %sc = arith.mulf %s, %e1 : f32
        %d2 = arith.subf %xv, %mn : f32
        %e2 = math.exp %d2 : f32
        %sn = arith.addf %sc, %e2 : f32
        memref.store %mn, %ms[%b, %c, %c0] : memref<?x?x2xf32>
        memref.store %sn, %ms[%b, %c, %c1] : memref<?x?x2xf32>
      }
    }
  }
  func.return
}
"""


def static_nest(nb: int = 2, nc: int = 3, el: str = "i32") -> str:
    """Constant counts `for b < nb { for c < nc }` over static channel sizes."""
    return (nested("arith.maxsi", el)
            .replace(f"memref<?x?x?x{el}>", f"memref<{nb}x{nc}x?x{el}>").replace(f"memref<?x?x{el}>", f"memref<{nb}x{nc}x{el}>")
            .replace("%nb = memref.dim %m, %c0", f"%nb = arith.constant {nb} : index\n  %unused0 = memref.dim %m, %c0")
            .replace("%nc = memref.dim %m, %c1", f"%nc = arith.constant {nc} : index\n  %unused1 = memref.dim %m, %c1"))


def nest_args(el: str, nb: int, nc: int, n: int) -> list[np.ndarray]:
    return [values((nb, nc, n), el), values((nb, nc), el)]


@pytest.mark.parametrize("op,el", OPS)
def test_a_channel_nest_runs_in_one_seeded_kernel(op, el):
    src = nested(op, el)
    m = gpu_module(src)
    fn = fn_of(m, "mc")
    assert refusals(fn) == []
    names = [o.name for o in fn.walk()]
    assert set(names) <= HOST_OPS | {"arith.muli"} and names.count("gpu.launch_func") == 1, sorted(set(names))
    (desc,) = launch_descriptions(m)
    assert "the host channel loop is the grid" in desc.notes
    assert desc.grid == ("init0.shape[0]*init0.shape[1]", 1, 1), desc.grid
    assert desc.covers_dims == (("x0", 0, "init0", 0), ("x0", 1, "init0", 1)), desc.covers_dims
    for nb, nc in SHAPES:
        for n in LENGTHS:
            agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", nest_args(el, nb, nc, n))


@pytest.mark.parametrize("op,el", OPS)
def test_cuda_runtime_updates_every_channel_of_the_nest(op, el):
    src = nested(op, el)
    fn = runtime_function(gpu_module(src), 2)
    for nb, nc in SHAPES:
        for n in LENGTHS:
            agree(src, fn, "mc", nest_args(el, nb, nc, n))


def test_the_runtime_checks_every_channel_size():
    """x has fewer inner channels than m: block (b, c = 2) would read past x[b]."""
    from scanweaver.errors import ScanWeaverValueError

    fn = runtime_function(gpu_module(nested("arith.minsi", "i32")), 2)
    x, st = values((2, 2, 5), "i32"), values((2, 3), "i32")
    before = st.copy()
    with pytest.raises(ScanWeaverValueError, match=r"x0.*init0|init0.*x0"):
        fn(x, st)
    assert st.tobytes() == before.tobytes()


def test_the_delinearisation_is_over_the_trip_counts():
    """x larger than m in both channel dimensions: the block id counts m's (b, c), not x's."""
    src = nested("arith.maxsi", "i32")
    m = gpu_module(src)
    for nb, nc in [(2, 3), (1, 3), (2, 1)]:
        agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", [values((nb + 1, nc + 2, 9), "i32"), values((nb, nc), "i32")])


def test_log_sum_exp_state_per_channel_of_the_nest():
    """The max bit for bit, the sum to rounding (reassociate=true)."""
    m = gpu_module(LSE_NEST, reassociate=True)
    assert refusals(fn_of(m, "mc")) == []
    rng = np.random.default_rng(7)
    for nb, nc in SHAPES:
        for n in LENGTHS:
            x = rng.uniform(-5, 5, (nb, nc, n)).astype(np.float32)
            state = np.tile(np.array([-np.inf, 0.0], np.float32), (nb, nc, 1))
            ref, got = [x.copy(), state.copy()], [x.copy(), state.copy()]
            run_function(parse_ir(LSE_NEST), "mc", *ref)
            simulate_launch(m, "mc", *got)
            assert got[1][..., 0].tobytes() == ref[1][..., 0].tobytes(), (nb, nc, n, got, ref)
            assert np.allclose(got[1][..., 1], ref[1][..., 1], rtol=2e-6, atol=0), (nb, nc, n, got, ref)
            if n == 0:
                assert got[1].tobytes() == state.tobytes()


def test_constant_counts_multiply_into_the_grid():
    src = static_nest()
    m = gpu_module(src)
    assert refusals(fn_of(m, "mc")) == []
    (desc,) = launch_descriptions(m)
    assert desc.grid == (6, 1, 1) and desc.covers_dims == (), (desc.grid, desc.covers_dims)
    for n in LENGTHS:
        agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", nest_args("i32", 2, 3, n))


def test_three_nested_channel_loops():
    """Any depth: m[a, b, c] over x[a, b, c, t]."""
    src = """
func.func @mc(%x: memref<?x?x?x?xi64>, %m: memref<?x?x?xi64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %na = memref.dim %m, %c0 : memref<?x?x?xi64>
  %nb = memref.dim %m, %c1 : memref<?x?x?xi64>
  %nc = memref.dim %m, %c2 : memref<?x?x?xi64>
  %n = memref.dim %x, %c3 : memref<?x?x?x?xi64>
  scf.for %a = %c0 to %na step %c1 {
    scf.for %b = %c0 to %nb step %c1 {
      scf.for %c = %c0 to %nc step %c1 {
        scf.for %t = %c0 to %n step %c1 {
          %xv = memref.load %x[%a, %b, %c, %t] : memref<?x?x?x?xi64>
          %old = memref.load %m[%a, %b, %c] : memref<?x?x?xi64>
          %new = arith.xori %old, %xv : i64
          memref.store %new, %m[%a, %b, %c] : memref<?x?x?xi64>
        }
      }
    }
  }
  func.return
}
"""
    m = gpu_module(src)
    assert refusals(fn_of(m, "mc")) == []
    (desc,) = launch_descriptions(m)
    assert desc.grid == ("init0.shape[0]*init0.shape[1]*init0.shape[2]", 1, 1), desc.grid
    for shape in [(2, 2, 3), (0, 2, 3), (1, 3, 1)]:
        for n in (0, 9):
            agree(src, lambda *a: simulate_launch(m, "mc", *a), "mc", [values((*shape, n), "i64"), values(shape, "i64")])


def test_an_imperfect_nest_keeps_the_refusal():
    """A store between the two channel loops: the kernel would drop it."""
    src = nested("arith.maxsi", "i32").replace(
        "%m: memref<?x?xi32>)", "%m: memref<?x?xi32>, %z: memref<?xi32>)").replace(
        "  scf.for %b = %c0 to %nb step %c1 {\n",
        "  scf.for %b = %c0 to %nb step %c1 {\n    %k = arith.constant 7 : i32\n    memref.store %k, %z[%b] : memref<?xi32>\n")
    assert "the channel loops must be perfectly nested" in refusal_of(src)


def test_constant_counts_past_the_grid_limit_keep_the_refusal():
    """65536 x 65536 channels: 2^32 blocks, more than gridDim.x allows."""
    assert "multiply to more than 2^31 - 1 blocks" in refusal_of(static_nest(65536, 65536))


def test_an_inner_loop_with_a_step_keeps_the_refusal():
    src = nested("arith.maxsi", "i32").replace("scf.for %c = %c0 to %nc step %c1", "scf.for %c = %c0 to %nc step %c2")
    assert "the channel loop must run from 0 step 1" in refusal_of(src)


def test_a_channel_nest_compiles_on_the_command_line(tmp_path):
    from scanweaver.cli import main

    f = tmp_path / "nest.mlir"
    f.write_text(nested("arith.minsi", "i32"))
    out = tmp_path / "nest.ptx"
    assert main(["compile", str(f), "--target", "ptx", "-o", str(out)]) == 0
    assert ".entry scan_generic_0" in out.read_text()


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_channel_nest_kernels_assemble_without_spills(chip):
    forms = [nested(op, el).replace("@mc(", f"@mc_{el}(") for op, el in OPS]
    forms += [static_nest().replace("@mc(", "@mc_static("), LSE_NEST.replace("@mc(", "@mc_lse(")]
    m = parse_ir("\n".join(forms))
    ctx = make_context()
    for p in stages_for("gpu"):
        (RaiseRecurrences(reassociate=True) if isinstance(p, RaiseRecurrences) else p).apply(ctx, m)
    out = export_gpu(m, chip)
    assert len(out["ptxas"]) == len(forms)
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)


class _NoDriver:
    """A driver no launch may reach (the grid check comes first)."""

    def load_module(self, image):
        return image

    def launch(self, *args):
        raise AssertionError("launched a grid over CUDA's limits")


class _DeviceArray:
    """Only the `__cuda_array_interface__` of a device array (nothing is read)."""

    def __init__(self, shape, typestr="<i4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0x1000, False), "version": 3}


def test_the_launch_checks_a_dynamic_grid_against_the_limit():
    """65536 x 65536 channels from memref.dim: 2^32 blocks, refused at launch, one clear error."""
    from scanweaver.errors import ScanWeaverValueError
    from scanweaver.runtime.cuda import CudaModule, launch

    (desc,) = launch_descriptions(gpu_module(nested("arith.minsi", "i32")))
    arrays = [_DeviceArray((65536, 65536, 4)), _DeviceArray((65536, 65536))]
    with pytest.raises(ScanWeaverValueError, match=r"over CUDA's limits"):
        launch(CudaModule("ptx", driver=_NoDriver()), desc, arrays)
