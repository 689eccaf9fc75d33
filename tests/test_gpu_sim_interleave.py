"""Blocks of one launch interleaved in the thread-block simulator (`interp/gpu_sim.py`).

A hand-written decoupled look-back prefix sum (one thread per block: the inter-block
protocol is what is under test) runs under sequential, reversed, random and
"latest-first" schedules with few or all blocks resident, and must give numpy's
wrapped int32 cumsum bit for bit; each deliberately broken variant of the protocol
(flag before value, flag read without acquire, chunk index from the block id instead
of a ticket) must be reported by the simulator instead of passing or hanging."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.interp.gpu_sim import GpuSimError, simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.toolchain.mlir import mlir_opt

# NN elements, chunks of CC, GG = ceil(NN / CC) blocks; scratch: counter (ticket),
# flags (0 invalid, 1 aggregate, 2 inclusive prefix), aggs, incl
_LOOKBACK = """
module attributes {gpu.container_module} {
  func.func @scan(%x: memref<NNxi32>, %y: memref<NNxi32>, %counter: memref<1xi32>, %flags: memref<GGxi32>, %aggs: memref<GGxi32>, %incl: memref<GGxi32>) {
    %c1 = arith.constant 1 : index
    %g = arith.constant GG : index
    gpu.launch_func @k::@lb blocks in (%g, %c1, %c1) threads in (%c1, %c1, %c1) args(%x : memref<NNxi32>, %y : memref<NNxi32>, %counter : memref<1xi32>, %flags : memref<GGxi32>, %aggs : memref<GGxi32>, %incl : memref<GGxi32>)
    return
  }
  gpu.module @k {
    gpu.func @lb(%x: memref<NNxi32>, %y: memref<NNxi32>, %counter: memref<1xi32>, %flags: memref<GGxi32>, %aggs: memref<GGxi32>, %incl: memref<GGxi32>) kernel {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %cc = arith.constant CC : index
      %n = arith.constant NN : index
      %zero = arith.constant 0 : i32
      %one = arith.constant 1 : i32
      %two = arith.constant 2 : i32
      %ticket = memref.atomic_rmw addi %one, %counter[%c0] : (i32, memref<1xi32>) -> i32
      %t = arith.index_cast %ticket : i32 to index
      %lo = arith.muli %t, %cc : index
      %end = arith.addi %lo, %cc : index
      %hi = arith.minui %end, %n : index
      %agg = scf.for %i = %lo to %hi step %c1 iter_args(%s = %zero) -> (i32) {
        %v = memref.load %x[%i] : memref<NNxi32>
        %s2 = arith.addi %s, %v : i32
        scf.yield %s2 : i32
      }
      memref.store %agg, %aggs[%t] : memref<GGxi32>
      llvm.fence syncscope("device") acq_rel
      %f1 = memref.atomic_rmw assign %one, %flags[%t] : (i32, memref<GGxi32>) -> i32
      %last:2 = scf.while (%p = %t, %acc = %zero) : (index, i32) -> (index, i32) {
        %more = arith.cmpi ugt, %p, %c0 : index
        scf.condition(%more) %p, %acc : index, i32
      } do {
      ^bb0(%p: index, %acc: i32):
        %q = arith.subi %p, %c1 : index
        %fl = memref.atomic_rmw ori %zero, %flags[%q] : (i32, memref<GGxi32>) -> i32
        llvm.fence syncscope("device") acq_rel
        %ready = arith.cmpi ne, %fl, %zero : i32
        %np, %nacc = scf.if %ready -> (index, i32) {
          %done = arith.cmpi eq, %fl, %two : i32
          %rp, %racc = scf.if %done -> (index, i32) {
            %iv = memref.load %incl[%q] : memref<GGxi32>
            %a2 = arith.addi %acc, %iv : i32
            scf.yield %c0, %a2 : index, i32
          } else {
            %av = memref.load %aggs[%q] : memref<GGxi32>
            %a3 = arith.addi %acc, %av : i32
            scf.yield %q, %a3 : index, i32
          }
          scf.yield %rp, %racc : index, i32
        } else {
          scf.yield %p, %acc : index, i32
        }
        scf.yield %np, %nacc : index, i32
      }
      %inc = arith.addi %last#1, %agg : i32
      memref.store %inc, %incl[%t] : memref<GGxi32>
      llvm.fence syncscope("device") acq_rel
      %f2 = memref.atomic_rmw assign %two, %flags[%t] : (i32, memref<GGxi32>) -> i32
      %out = scf.for %i = %lo to %hi step %c1 iter_args(%s = %last#1) -> (i32) {
        %v = memref.load %x[%i] : memref<NNxi32>
        %s2 = arith.addi %s, %v : i32
        memref.store %s2, %y[%i] : memref<NNxi32>
        scf.yield %s2 : i32
      }
      gpu.return
    }
  }
}
"""

_PUBLISH = """      memref.store %agg, %aggs[%t] : memref<GGxi32>
      llvm.fence syncscope("device") acq_rel
      %f1 = memref.atomic_rmw assign %one, %flags[%t] : (i32, memref<GGxi32>) -> i32
"""
_TICKET = "%ticket = memref.atomic_rmw addi %one, %counter[%c0] : (i32, memref<1xi32>) -> i32"
_POLL = "%fl = memref.atomic_rmw ori %zero, %flags[%q] : (i32, memref<GGxi32>) -> i32"
_FENCE = '''      llvm.fence syncscope("device") acq_rel
'''

# sequentially every predecessor is complete (flag 2) and its aggregate is never read:
# a publication bug of the aggregate shows only where blocks interleave
_BROKEN = {
    # the aggregate's flag goes up before the aggregate is stored
    "flag_before_value": (_PUBLISH, """      llvm.fence syncscope("device") acq_rel
      %f1 = memref.atomic_rmw assign %one, %flags[%t] : (i32, memref<GGxi32>) -> i32
      memref.store %agg, %aggs[%t] : memref<GGxi32>
"""),
    # no release fence: the relaxed atomic does not order the store before it
    "no_release_fence": (_PUBLISH, _PUBLISH.replace(_FENCE, "")),
    # no acquire fence after the poll: the loads after it are not ordered
    "no_acquire_fence": (_POLL + "\n  " + _FENCE, _POLL + "\n"),
    # the flag is polled with a plain load: nothing orders the value read after it
    "plain_flag_load": (_POLL, "%fl = memref.load %flags[%q] : memref<GGxi32>"),
}
# the chunk index from the block id: a block may wait on a block that has not started
_STATIC = (_TICKET, """%bid = gpu.block_id x
      %ticket = arith.index_cast %bid : index to i32
      %unused = memref.atomic_rmw addi %one, %counter[%c0] : (i32, memref<1xi32>) -> i32""")


def _module(n: int, chunk: int, edit: tuple[str, str] | None = None):
    text = _LOOKBACK
    if edit is not None:
        assert edit[0] in text
        text = text.replace(*edit)
    grid = -(-n // chunk)
    text = text.replace("NN", str(n)).replace("GG", str(grid)).replace("CC", str(chunk))
    return parse_ir(mlir_opt(text, ["--mlir-print-op-generic"])), grid


def _run(module, grid: int, x: np.ndarray, **schedule) -> np.ndarray:
    y = np.full_like(x, 0x5A5A)
    scratch = [np.zeros(1, np.int32)] + [np.zeros(grid, np.int32) for _ in range(3)]
    simulate_launch(module, "scan", x, y, *scratch, **schedule)
    return y


_SCHEDULES = [
    {},
    {"block_order": "reverse"},
    {"block_order": 5},
    {"interleave": 1},
    {"interleave": 2, "block_order": "reverse"},
    {"interleave": 7, "resident": 3, "block_order": 11},
    {"interleave": "latest-first"},
    {"interleave": "latest-first", "resident": 2, "block_order": "reverse"},
    {"interleave": "round-robin"},
    {"interleave": "round-robin", "resident": 2, "block_order": 3},
]


@pytest.mark.parametrize("schedule", _SCHEDULES, ids=str)
@pytest.mark.parametrize("n,chunk", [(1, 4), (17, 4), (31, 2), (33, 8)])
def test_lookback_matches_cumsum_under_every_schedule(n, chunk, schedule):
    module, grid = _module(n, chunk)
    x = np.random.default_rng(n).integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32)
    want = np.cumsum(x, dtype=np.int32)  # wraps like the kernel's i32 adds
    np.testing.assert_array_equal(_run(module, grid, x, **schedule), want)


def test_random_interleaving_really_interleaves():
    # blocks that poll a predecessor's flag before it is up do more atomic reads
    module, grid = _module(40, 2)
    x = np.arange(40, dtype=np.int32)
    loads = []
    for schedule in ({}, {"interleave": 4}):
        stats: list = []
        simulate_launch(module, "scan", x, np.zeros_like(x), np.zeros(1, np.int32),
                        *(np.zeros(grid, np.int32) for _ in range(3)), stats=stats, **schedule)
        loads.append(stats[0]["load_bytes"])
    assert loads[1] > loads[0]


@pytest.mark.parametrize("broken", sorted(_BROKEN))
@pytest.mark.parametrize("schedule", [{"interleave": "round-robin"}, {"interleave": 3}], ids=str)
def test_broken_publication_is_a_cross_block_race(broken, schedule):
    module, grid = _module(12, 3, _BROKEN[broken])
    with pytest.raises(GpuSimError, match="cross-block race in global memory"):
        _run(module, grid, np.arange(12, dtype=np.int32), **schedule)


def test_block_id_chunks_deadlock_when_later_blocks_start_first():
    module, grid = _module(12, 3, _STATIC)
    x = np.arange(12, dtype=np.int32)
    # all blocks resident: the spinning blocks yield, so it completes (and is right)
    for schedule in ("latest-first", "round-robin", 6):
        np.testing.assert_array_equal(_run(module, grid, x, interleave=schedule), np.cumsum(x))
    # one block at a time, started last to first: block 3 waits on block 2 forever
    with pytest.raises(GpuSimError, match=r"deadlock in the inter-block protocol.*block \(3, 0, 0\)"):
        _run(module, grid, x, block_order="reverse")
    # the ticket version makes progress under the same schedule
    module, grid = _module(12, 3)
    np.testing.assert_array_equal(_run(module, grid, x, block_order="reverse"), np.cumsum(x))


@pytest.mark.parametrize("bad", [{"interleave": "sideways"}, {"interleave": True}, {"resident": 0}], ids=str)
def test_bad_schedule_is_refused(bad):
    module, grid = _module(4, 2)
    with pytest.raises(GpuSimError, match="interleave|resident"):
        _run(module, grid, np.arange(4, dtype=np.int32), **bad)


# -- the integer memref.atomic_rmw kinds in the interpreter ------------------------------------

_ATOMIC = """
func.func @f(%m: memref<1xi32>, %v: i32) -> i32 {
  %c0 = arith.constant 0 : index
  %old = memref.atomic_rmw KIND %v, %m[%c0] : (i32, memref<1xi32>) -> i32
  return %old : i32
}
"""


@pytest.mark.parametrize("kind,start,value,want", [
    ("addi", 2**31 - 1, 1, -(2**31)),  # wraps
    ("assign", 5, 9, 9),
    ("ori", 4, 0, 4),
    ("ori", 4, 3, 7),
    ("andi", 6, 3, 2),
    ("xori", 6, 3, 5),
    ("maxs", -3, 2, 2),
    ("maxu", -3, 2, -3),  # 0xFFFFFFFD is the larger unsigned
    ("mins", -3, 2, -3),
    ("minu", -3, 2, 2),
    ("muli", 2**30, 4, 0),
])
def test_integer_atomic_rmw_kinds(kind, start, value, want):
    module = parse_ir(mlir_opt(_ATOMIC.replace("KIND", kind), ["--mlir-print-op-generic"]))
    m = np.array([start], np.int32)
    (old,) = run_function(module, "f", m, value)
    assert old == start and m[0] == want
