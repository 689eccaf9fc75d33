"""A differential probe of the time-parallel multi-block strategies (reduce-then-scan
for `scan.affine` and `scan.recurrence`, scan-then-propagate for `scan.scan`) on what
`test_gpu_time_blocks.py` and `test_recurrence_time_blocks.py` leave out: blocks of
several warps (the cross-warp totals of the reduce kernel), lengths at and around chunk
and tile boundaries, rank-3 inputs scanned along a middle axis, non-commutative
combines where the order of the blocks' aggregates matters, states of more than 16
registers (the component-group reduce), the strategy threshold, the host IR's grid
against the runtime's at 2^26 steps and for dynamic scans along a leading axis, several
time-block ops in one module, and ptxas at 2^26 steps for the selective scan at N = 32.
Simulator results are checked against the interpreter on the original IR, bit for bit
for integers."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from xdsl.context import Context
from xdsl.dialects import gpu
from xdsl.interpreter import impl, register_impls

from scanweaver.interp.gpu_sim import GpuLaunchFunctions, _lookup_kernel, simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.runtime.cuda_launch import TIME_BLOCKS_MAX_CHANNELS
from scanweaver.workloads import loops
from scanweaver.workloads.scans import affine_scan_ir

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import test_scan_gpu as scan_cases  # noqa: E402

KINDS = ["reduce", "carries", "chunks"]


def lower(module, bs: int, ipt: int, tiles: int, time_blocks: str = "always", raise_loops: bool = False):
    m = parse_ir(module if isinstance(module, str) else print_ir(module))
    if raise_loops:
        RaiseRecurrences().apply(make_context(), m)
    ScanToGpu(block_size=bs, items_per_thread=ipt, time_blocks=time_blocks, chunk_tiles=tiles).apply(Context(), m)
    m.verify()
    return m


def simulate_against_interpreter(text: str, fname: str, args, m, **sim):
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), fname, *ref)
    got = [x.copy() for x in args]
    simulate_launch(m, fname, *got, **sim)
    return ref, got


def assert_same(ref, got, rtol=2e-5, atol=2e-6):
    for r, g in zip(ref, got):
        if g.dtype.kind in "iu":
            np.testing.assert_array_equal(g, r)
        else:
            np.testing.assert_array_equal(np.isfinite(g), np.isfinite(r))
            np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


# -- scan.affine: blocks of two warps (the reduce kernel's cross-warp totals) -----------------

BS2, IPT2, TILES2 = 64, 1, 2  # two warps per block; chunk = 128 steps
CHUNK2 = BS2 * IPT2 * TILES2


def affine_args(shape, axis, state: str, init: bool, seed: int):
    """a, b, [init], h, final for a state of MLIR type `state` (garbage in the outputs)."""
    rng = np.random.default_rng(seed)
    channels = tuple(d for i, d in enumerate(shape) if i != axis)
    t = np.dtype(scan_cases.NP[state])
    if t.kind == "i":
        a, b, h0 = (rng.integers(np.iinfo(t).min, np.iinfo(t).max, s, dtype=t, endpoint=True)
                    for s in (shape, shape, channels))
    else:
        a = rng.uniform(-1.05, 1.05, shape).astype(t)
        b = rng.uniform(-1, 1, shape).astype(t)
        h0 = rng.uniform(-1, 1, channels).astype(t)
    return [a, b] + ([h0] if init else []) + [np.full(shape, 7, t), np.full(channels, 7, t)]


@pytest.mark.parametrize("length,state,reverse", [
    (CHUNK2 + 1, "f32", True),  # one step into a second chunk
    (2 * CHUNK2 - 1, "i64", False),  # one step short of two whole chunks
])
def test_affine_two_warp_blocks_around_chunk_boundaries(length, state, reverse):
    text = affine_scan_ir(("?", "?"), 1, state, state, init=True, final=True, reverse=reverse)
    m = lower(text, BS2, IPT2, TILES2)
    args = affine_args((2, length), 1, state, True, seed=length)
    ref, got = simulate_against_interpreter(text, "f", args, m, block_order="reverse")
    assert_same(ref[-2:], got[-2:])


def test_affine_rank3_middle_axis_without_init():
    """Channels on both sides of the scanned axis; final without init (chunk 0 from 0)."""
    bs, ipt, tiles = 4, 2, 2
    shape = (3, 2 * bs * ipt * tiles + 1, 2)
    text = affine_scan_ir(("?", "?", "?"), 1, "i32", "i32", final=True, reverse=True)
    m = lower(text, bs, ipt, tiles)
    assert [d.kernel_name.rsplit("_", 1)[-1] for d in launch_descriptions(m)] == KINDS
    ref, got = simulate_against_interpreter(text, "f", affine_args(shape, 1, "i32", False, 4), m, block_order=3)
    assert_same(ref[-2:], got[-2:])


# -- generic scan.scan: non-commutative combines, block order matters --------------------------

# 2x2 integer matrices (p, q, r, s), combined as the product earlier @ later (wraps)
scan_cases.COMBINES.setdefault("matrix2_i32", (["i32"] * 4, "\n    ".join(
    f"%m{i}{j} = arith.muli %a{2 * i}, %b{j} : i32\n    %n{i}{j} = arith.muli %a{2 * i + 1}, %b{2 + j} : i32\n"
    f"    %r{i}{j} = arith.addi %m{i}{j}, %n{i}{j} : i32" for i in (0, 1) for j in (0, 1)), "%r00, %r01, %r10, %r11"))
# max-plus affine maps (shift, floor): (s1, f1) then (s2, f2) = (s1 + s2, max(f1 + s2, f2))
scan_cases.COMBINES.setdefault("max_plus_i64", (
    ["i64", "i64"],
    "%s = arith.addi %a0, %b0 : i64\n    %t = arith.addi %a1, %b0 : i64\n    %f = arith.maxsi %t, %b1 : i64",
    "%s, %f"))
# keeps the last non-zero element seen
scan_cases.COMBINES.setdefault("last_nonzero_i32", (
    ["i32"],
    "%z = arith.constant 0 : i32\n    %nz = arith.cmpi ne, %b0, %z : i32\n    %r = arith.select %nz, %b0, %a0 : i32",
    "%r"))


def generic_inputs(name, shape, seed):
    rng = np.random.default_rng(seed)
    if name == "matrix2_i32":
        return [rng.integers(-(2**31), 2**31 - 1, shape, dtype=np.int32) for _ in range(4)]
    if name == "max_plus_i64":
        return [rng.integers(-1000, 1000, shape).astype(np.int64) for _ in range(2)]
    x = rng.integers(-5, 5, shape).astype(np.int32)
    x[rng.random(shape) < 0.7] = 0  # long runs of zeros cross chunk boundaries
    return [x]


@pytest.mark.parametrize("name,shape,axis,reverse,order", [
    ("matrix2_i32", (2, 17, 3), 1, False, "reverse"),  # chunk + 1 along a middle axis
    ("matrix2_i32", (31,), 0, True, 5),  # 2 chunks - 1, one sequence
    ("max_plus_i64", (2, 48), 1, True, 2),  # 3 whole chunks
    ("last_nonzero_i32", (33, 2), 0, False, "reverse"),  # 2 chunks + 1 along axis 0
])
def test_generic_non_commutative_combines_bit_for_bit(name, shape, axis, reverse, order):
    text = scan_cases.scan_text(name, ["?"] * len(shape), axis, reverse)
    m = lower(text, 4, 2, 2)  # chunk = 16 steps
    assert len(launch_descriptions(m)) == 3
    xs = generic_inputs(name, shape, seed=len(shape) + shape[axis])
    ref, got = simulate_against_interpreter(text, "f", xs + [np.full_like(x, 77) for x in xs], m, block_order=order)
    assert_same(ref, got)


# -- scan.recurrence: a state of more than 16 registers ---------------------------------------


@pytest.mark.parametrize("n,length", [(17, 33), (32, 17)])
def test_selective_scan_large_state_component_groups(n, length):
    """Launch 1 folds one component group at a time, launch 3 takes half the items:
    several chunks (of 32 steps) of two channels, against the loops."""
    module = loops.selective_scan_loops(1, 2, length, n, bc="shared", return_last_state=True)
    m = lower(module, 4, 4, 2, raise_loops=True)
    assert [d.kernel_name.rsplit("_", 1)[-1] for d in launch_descriptions(m)] == KINDS
    rng = np.random.default_rng(n)
    shapes = [(1, 2, length), (1, 2, length), (2, n), (1, n, length), (1, n, length), (2,), (1, 2, length), (2,)]
    ranges = [(-1, 1), (-2, 0.5), (-2, -0.1), (-1, 1), (-1, 1), (-1, 1), (-1, 1), (-0.5, 0.5)]
    args = [rng.uniform(lo, hi, s).astype(np.float32) for s, (lo, hi) in zip(shapes, ranges)]
    args += [np.zeros((1, 2, length), np.float32), np.zeros((1, 2, n), np.float32)]
    ref, got = simulate_against_interpreter(print_ir(module), "selective_scan", args, m, block_order="reverse")
    assert_same(ref, got, rtol=1e-4, atol=1e-5)


# -- the strategy at its threshold ------------------------------------------------------------


@pytest.mark.parametrize("channels,length,launches", [
    (TIME_BLOCKS_MAX_CHANNELS - 1, 32, 3),
    (TIME_BLOCKS_MAX_CHANNELS, 32, 1),
    (1, 31, 1),  # shorter than two chunks of 16
])
def test_auto_threshold_affine_generic_recurrence(channels, length, launches):
    affine = lower(affine_scan_ir((channels, length), 1, "f32", "f32"), 4, 2, 2, "auto")
    generic = lower(scan_cases.scan_text("cumsum_i32", [channels, length], 1), 4, 2, 2, "auto")
    recurrence = lower(loops.ema_loops(channels, length), 4, 2, 2, "auto", raise_loops=True)
    for m in (affine, generic, recurrence):
        assert len(launch_descriptions(m)) == launches


# -- the host IR's grid against the runtime's at 2^26 steps (no kernel runs) -------------------


@register_impls
class _GridsOnly(GpuLaunchFunctions):
    """Host-side `gpu.launch_func` that records (kernel, grid, argument shapes) only."""

    seen: list | None = None

    @impl(gpu.LaunchFuncOp)
    def run_launch_func(self, interpreter, op, args):
        vals = dict(zip(op.operands, args))
        kernel = _lookup_kernel(interpreter.module, op.kernel).sym_name.data
        grid = (vals[op.gridSizeX], vals[op.gridSizeY], vals[op.gridSizeZ])
        shapes = [tuple(getattr(vals[v], "shape", ())) for v in op.kernelOperands]
        self.seen.append((kernel, grid, shapes))
        return ()


def host_grids_agree(m, fname, args) -> list[tuple[int, int, int]]:
    """Run the host function with launches recorded: each grid the IR computes equals
    the one the runtime resolves from the launch description for those shapes."""
    descs = {d.kernel_name: d for d in launch_descriptions(m)}
    launcher = _GridsOnly()
    launcher.seen = []
    run_function(m, fname, *args, extra_impls=[launcher])
    assert len(launcher.seen) == len(descs)
    for kernel, grid, shapes in launcher.seen:
        d = descs[kernel]
        assert grid == d.resolve_grid({a[0]: s for a, s in zip(d.args, shapes)}), kernel
    return [g for _, g, _ in launcher.seen]


N26 = 1 << 26
CHUNKS26 = N26 // (128 * 4 * 16)


@pytest.mark.parametrize("channels,length", [(1, N26), (3, (1 << 22) + 1)])
def test_grids_at_large_sizes_affine_and_generic(channels, length):
    shape = (channels, length)
    chunks = -(-length // (128 * 4 * 16))
    a = np.zeros(shape, np.float32)  # never touched: the pages stay unallocated
    fin = np.zeros(channels, np.float32)
    m = parse_ir(affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True, reverse=True))
    ScanToGpu(time_blocks="always").apply(Context(), m)
    grids = host_grids_agree(m, "f", [a, a, fin, a, fin])
    assert grids == [(channels * chunks, 1, 1), (channels, 1, 1), (channels * chunks, 1, 1)]
    m = parse_ir(scan_cases.scan_text("argmax_f32_i32", ["?", "?"], 1, True))
    ScanToGpu(time_blocks="always").apply(Context(), m)
    i = np.zeros(shape, np.int32)
    grids = host_grids_agree(m, "f", [a, i, a, i])
    assert sorted(grids) == sorted([(channels * chunks, 1, 1), (channels, 1, 1), (channels * chunks, 1, 1)])


def test_grids_at_2_pow_26_selective_scan():
    from scanweaver.workloads.selective import selective_scan_gpu
    from scanweaver.workloads.specs import SelectiveScanSpec

    n = 2
    spec = SelectiveScanSpec(n, "shared", "shared", True, True, True, True, False, True)
    m = selective_scan_gpu(spec)
    ScanToGpu(time_blocks="always").apply(Context(), m)
    big, per_d, bc = np.zeros((1, 1, N26), np.float32), np.zeros(1, np.float32), np.zeros((1, n, N26), np.float32)
    args = [big, big, np.zeros((1, n), np.float32), bc, bc, per_d, big, per_d, big, np.zeros((1, 1, n), np.float32)]
    assert host_grids_agree(m, "selective_scan", args) == [(CHUNKS26, 1, 1), (n, 1, 1), (CHUNKS26, 1, 1)]


# -- ptxas: the selective scan at N = 32 in time blocks ---------------------------------------


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_ptxas_selective_scan_n32_time_blocks_no_spills(chip):
    """N = 32 (32 registers of state), dynamic sizes (what `selective_scan(...,
    backend="cuda")` builds for one long channel): before launch 1 folded by component
    group and launch 3 took half the items, they spilled 44 to 52 bytes."""
    from test_recurrence_time_blocks import _ptxas_no_spills

    from scanweaver.workloads.selective import selective_scan_gpu
    from scanweaver.workloads.specs import SelectiveScanSpec

    m = selective_scan_gpu(SelectiveScanSpec(32, "shared", "shared", True, True, True, True, False, True))
    ScanToGpu(time_blocks="always").apply(Context(), m)
    descs = launch_descriptions(m)
    assert [d.kernel_name.rsplit("_", 1)[-1] for d in descs] == KINDS
    assert descs[0].resolve_grid({"u": (1, 1, N26)}) == (CHUNKS26, 1, 1)
    _ptxas_no_spills(m, chip)


# -- the carries launch of a dynamic affine scan along a leading axis -------------------------


@pytest.mark.parametrize("shape,axis", [((33, 2, 3), 0), ((2, 33, 3), 1)])
def test_affine_carries_grid_over_its_own_aggregates(shape, axis):
    """The carries kernel's grid is one block per channel of its aggregates. With dynamic
    sizes and the channels after the scanned axis, the runtime once resolved it as
    `h.shape[1]*h.shape[2]` of that kernel's `h` (the carries, channels x chunks): 3 x 3
    blocks for 2 x 3 channels, the last three reading `init` out of bounds."""
    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.runtime.cuda import CudaFunction, CudaModule

    text = affine_scan_ir(("?", "?", "?"), axis, "i32", "i32", init=True, final=True, reverse=True)
    m = lower(text, 4, 2, 2)  # chunk = 16 steps: 3 chunks
    args = affine_args(shape, axis, "i32", True, seed=axis)
    assert host_grids_agree(m, "f", args) == [(18, 1, 1), (6, 1, 1), (18, 1, 1)]
    ref = [x.copy() for x in args]
    run_function(parse_ir(text), "f", *ref)
    driver = SimulatorDriver(m)
    CudaFunction(CudaModule("ptx", driver=driver), "f", launch_descriptions(m), len(args))(*args)
    assert [g for _, g in driver.launches] == [(18, 1, 1), (6, 1, 1), (18, 1, 1)]
    assert_same(ref[-2:], args[-2:])


# -- several time-block ops in one module: distinct kernels ------------------------------------

TWO_AFFINE_AND_A_SCAN = """
func.func @f(%a: memref<?x?xi32>, %b: memref<?x?xi32>, %h0: memref<?xi32>, %h: memref<?x?xi32>, %hT: memref<?xi32>,
             %x: memref<?x?xi64>, %y: memref<?x?xi64>,
             %a2: memref<?x?xi32>, %b2: memref<?x?xi32>, %h2: memref<?x?xi32>, %hT2: memref<?xi32>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 1 : memref<?x?xi32>, memref<?x?xi32>, memref<?xi32> -> memref<?x?xi32>, memref<?xi32>
  scan.scan ins(%x : memref<?x?xi64>) outs(%y : memref<?x?xi64>) axis 0 reverse {
  ^bb0(%p: i64, %q: i64):
    %r = arith.addi %p, %q : i64
    scan.yield %r : i64
  }
  scan.affine %a2, %b2 into %h2 final %hT2 axis 0 reverse : memref<?x?xi32>, memref<?x?xi32> -> memref<?x?xi32>, memref<?xi32>
  func.return
}
"""


def test_two_affine_time_blocks_in_one_function():
    """Each scan.affine's three kernels get their own names (the second op's once took
    `scan_affine_tb_0_*` again: duplicate symbols, the first op's kernels launched on
    the second op's arguments) and their own scratch, through the simulator and the
    runtime's replay."""
    from test_gpu_time_blocks import SimulatorDriver

    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from scanweaver.runtime.cuda_program import _host_launches

    m = lower(TWO_AFFINE_AND_A_SCAN, 4, 2, 2)
    names = [d.kernel_name for d in launch_descriptions(m)]
    assert len(names) == len(set(names)) == 9
    rng = np.random.default_rng(0)
    ints = lambda shape, t=np.int32: rng.integers(np.iinfo(t).min, np.iinfo(t).max, shape, dtype=t, endpoint=True)  # noqa: E731
    args = [ints((2, 37)), ints((2, 37)), ints(2), np.zeros((2, 37), np.int32), np.zeros(2, np.int32),
            ints((35, 2), np.int64), np.zeros((35, 2), np.int64),
            ints((50, 3)), ints((50, 3)), np.zeros((50, 3), np.int32), np.zeros(3, np.int32)]
    ref, got = simulate_against_interpreter(TWO_AFFINE_AND_A_SCAN, "f", args, m, block_order="reverse")
    assert_same(ref, got)
    launches, counts = _host_launches(m)  # in host order: a scratch's first user sizes it
    CudaFunction(CudaModule("ptx", driver=SimulatorDriver(m)), "f", launches["f"], counts["f"])(*args)
    assert_same(ref, args)


def test_two_recurrence_time_blocks_in_one_module():
    """Two raised loop nests (two functions, one kernel module): distinct kernels."""
    body = lambda t: t[t.index("{") + 1 : t.rindex("}")]  # noqa: E731
    second = print_ir(loops.ema_loops(3, 37, "i32")).replace("@ema", "@ema2")
    text = "builtin.module {" + body(print_ir(loops.ema_loops(2, 40))) + body(second) + "}"
    m = lower(text, 4, 2, 2, raise_loops=True)
    names = [d.kernel_name for d in launch_descriptions(m)]
    assert len(names) == len(set(names)) == 6
    rng = np.random.default_rng(1)
    ema = [rng.uniform(-1, 1, (2, 40)).astype(np.float32), rng.uniform(0.5, 1, 2).astype(np.float32),
           rng.uniform(-1, 1, 2).astype(np.float32), np.zeros((2, 40), np.float32), np.zeros(2, np.float32)]
    ema2 = [rng.integers(-(2**30), 2**30, s).astype(np.int32) for s in [(3, 37), (3,), (3,)]]
    ema2 += [np.zeros((3, 37), np.int32), np.zeros(3, np.int32)]
    for fname, args in (("ema", ema), ("ema2", ema2)):
        ref, got = simulate_against_interpreter(text, fname, args, m)
        assert_same(ref, got)
