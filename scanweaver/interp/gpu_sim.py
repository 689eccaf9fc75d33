"""A thread-block simulator for `gpu.func` kernels, on the CPU.

`simulate_launch(module, "fname", *arrays)` runs a host `func.func` like
`run_function` does; every `gpu.launch_func` it meets runs the kernel here:

* blocks of the grid run one after the other (x fastest, then y, z, or in the order
  `block_order` gives: "reverse", or an int seed for a random permutation, so tests
  can show that no block depends on another block of the same launch); inside a block
  every thread is a Python generator over the kernel body that stops at each
  `gpu.barrier`. The block scheduler advances all threads to their next barrier, then
  releases them together.
* `gpu.thread_id / block_id / block_dim / grid_dim / global_id` give each thread its
  own values; `memref.get_global` of a global in address space 3 (shared memory)
  returns one buffer per block, shared by its threads and filled with garbage (NaN for
  floats, 0x5A5A... for integers) as uninitialised shared memory is; every other
  memref (kernel arguments, global memory) is shared by all blocks.
* Errors (`GpuSimError`): barrier divergence (some threads of a block finished or wait
  at another barrier op while others wait), and, with `race_check=True` (default),
  shared-memory data races: two threads of a block touching the same shared element
  between two barriers where at least one of them writes.
* Cross-block races in global memory (`race_check`): within one launch, a block that
  reads or writes an element of a memref kernel argument that another block wrote (or writes
  one another block read) is an error unless `llvm.fence`s around relaxed
  `memref.atomic_rmw`s order the two accesses (`_GlobalAccesses`): blocks of a launch
  run in any order and concurrently, so data passes between blocks of one launch only
  behind a flag published (after a fence) after the data.
* Blocks of one launch may run interleaved (`interleave`, `resident`: `_Scheduler`):
  every `memref.atomic_rmw` is a point where the scheduler may switch blocks (random,
  or "latest-first": later-started blocks run until they spin); `scf.while` runs, so
  a kernel can spin on a status flag, and a schedule where no block writes memory for
  long is reported as a deadlock (`GpuSimError`) instead of hanging. By default blocks
  run one at a time to their end, as before.
* `gpu.shuffle` is warp-synchronous: the lanes of a warp (32 consecutive linear
  thread ids) run to their next shuffle, barrier or return together; at a shuffle
  every lane of the warp must wait at that same op (else `GpuSimError`: warp
  divergence), then they exchange values (see `scanweaver.dialects.gpu_shuffle`;
  a lane whose source lies outside its segment gets garbage and `valid` false).
  `gpu.lane_id` is the linear thread id mod 32.
* 1-D `vector.load` / `vector.store` of global or shared memory (a vector is a tuple
  of its elements), with `vector.extract`, `vector.insert` and `vector.broadcast` at
  static positions: the same bounds and race checks per element, and an error where a
  vector access with `alignment = 16` is not 16-byte aligned (its buffer's base offset
  plus the flat element offset).
* Base addresses: `memref.extract_aligned_pointer_as_index` of a buffer gives a made-up
  address, 256-byte aligned plus the byte offset `base_offsets` gives the host function
  argument it came from (`simulate_launch`), 0 by default: so tests run kernels on
  device views that start off a 16-byte boundary (`rewrites/gpu_aligned_bases.py`).
* Inside a thread the executor walks `scf.for`, `scf.if`, `scf.yield`, `gpu.return`
  itself and runs every other op (arith, math, memref, ...) with the implementations
  registered in ScanWeaver's interpreter (`make_interpreter`), so f32 rounding and
  integer wrap-around are those of the oracle.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Generator
from typing import Any

from xdsl.dialects import func, gpu, memref, scf, vector
from xdsl.dialects.builtin import (
    ComplexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
)
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.interpreters.builtin import xtype_for_el_type
from xdsl.interpreters.shaped_array import ShapedArray
from xdsl.interpreters.utils.ptr import TypedPtr
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.traits import SymbolTable

from scanweaver.dialects.gpu_shuffle import ShuffleOp
from scanweaver.dialects.llvm_fence import FenceOp
from scanweaver.errors import ScanWeaverError
from scanweaver.interp.run import run_function


class GpuSimError(ScanWeaverError):
    """The simulated kernel did something that is an error on a real GPU."""


def _is_shared(t: MemRefType) -> bool:
    space = t.memory_space
    return isinstance(space, IntegerAttr) and space.value.data == 3


_DIMS = {"x": 0, "y": 1, "z": 2}
WARP = 32
#: the made-up address of every buffer's 256-byte-aligned base (`base_offsets` is added)
_BASE_ADDRESS = 1 << 32


class _Block:
    """State shared by the threads of one block."""

    def __init__(self, block_id: tuple[int, int, int], block_dim, grid_dim, race_check: bool, glob=None,
                 bases: dict[int, int] | None = None, progress: list[int] | None = None):
        self.block_id = block_id
        # memory writes of the whole launch so far (shared with the other blocks): the
        # scheduler's spin detection, a block that writes nothing between atomics spins
        self.progress = [0] if progress is None else progress
        self.bases = bases or {}  # id(buffer) -> byte offset of its base past a 256-byte boundary
        self.glob = glob  # _GlobalAccesses of the launch (cross-block race check), or None
        self.barriers = 0  # barrier releases of this block
        self.global_bytes = [0, 0]  # bytes loaded from / stored to global memory
        self.vector_accesses = 0  # vector.load / vector.store executed (all threads)
        self.block_dim = block_dim
        self.grid_dim = grid_dim
        self.shared: dict[str, ShapedArray[Any]] = {}
        self.shared_ids: set[int] = set()
        self.race_check = race_check
        # epoch bookkeeping for race detection: (buffer id, flat index) -> tid / tids
        self.writes: dict[tuple[int, tuple[int, ...]], int] = {}
        self.reads: dict[tuple[int, tuple[int, ...]], set[int]] = {}

    def shared_buffer(self, interp: Interpreter, glob: memref.GlobalOp) -> ShapedArray[Any]:
        name = glob.sym_name.data
        if name not in self.shared:
            t = glob.type
            shape = list(t.get_shape())
            el = t.get_element_type()
            xtype = xtype_for_el_type(el, interp.index_bitwidth)
            size = math.prod(shape)
            garbage = 0x5A5A5A5A if isinstance(el, IntegerType) else math.nan
            if isinstance(el, ComplexType):  # (re, im) pairs, the interpreter's own storage
                from scanweaver.interp.complex_impls import ComplexStorage

                xtype, garbage = ComplexStorage(el), (math.nan, math.nan)
            buf = ShapedArray(TypedPtr[Any].new([garbage] * size, xtype=xtype), shape)
            self.shared[name] = buf
            self.shared_ids.add(id(buf))
        return self.shared[name]

    def new_epoch(self) -> None:
        self.writes.clear()
        self.reads.clear()

    def check_access(self, buf: ShapedArray[Any], idx: tuple[int, ...], tid: int, write: bool, op: Operation) -> None:
        key = (id(buf), idx)
        writer = self.writes.get(key)
        if writer is not None and writer != tid:
            raise GpuSimError(
                f"shared-memory race in block {self.block_id}: thread {tid} "
                f"{'writes' if write else 'reads'} element {list(idx)} that thread {writer} "
                f"wrote since the last barrier ({op.name})"
            )
        if write:
            readers = self.reads.get(key)
            if readers and readers - {tid}:
                other = min(readers - {tid})
                raise GpuSimError(
                    f"shared-memory race in block {self.block_id}: thread {tid} writes "
                    f"element {list(idx)} that thread {other} read since the last barrier"
                )
            self.writes[key] = tid
        else:
            self.reads.setdefault(key, set()).add(tid)


_VECTOR_OPS = (vector.LoadOp, vector.StoreOp, vector.ExtractOp, vector.InsertOp, vector.BroadcastOp)


def _element_bytes(op: Operation) -> int:
    store = isinstance(op, (memref.StoreOp, vector.StoreOp, memref.AtomicRMWOp))
    el = (op.operands[1] if store else op.operands[0]).type.element_type  # type: ignore[attr-defined]
    width = getattr(el, "bitwidth", None) or getattr(getattr(el, "width", None), "data", 64)
    return max(1, width // 8)


class _GlobalAccesses:
    """Cross-block race check of one launch's global memory, by happens-before.

    Every block has a vector clock. `memref.atomic_rmw` is relaxed, as the PTX that
    NVPTX emits for it is (`atom` without ordering, `dialects/llvm_fence.py`); ordering
    comes from `llvm.fence` as in C++: an atomic releases at its element the block's
    clock as of the block's last fence, and what an atomic reads there is acquired at
    the block's next fence. A plain access of an element that another block wrote (or a
    write of one another block read) is a race unless ordered after it through such a
    fence-atomic-atomic-fence chain: so a status flag published before its value, a
    missing fence, or a value read without acquiring its flag is an error whatever the
    schedule."""

    def __init__(self, tracked: set[int]) -> None:
        self.tracked = tracked  # ids of the kernel's memref arguments (alive all launch long)
        self.writer: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, int, int], int]] = {}
        self.readers: dict[tuple[int, tuple[int, ...]], dict[tuple[int, int, int], int]] = {}
        self.clocks: dict[tuple[int, int, int], dict[tuple[int, int, int], int]] = {}
        self.released: dict[tuple[int, tuple[int, ...]], dict[tuple[int, int, int], int]] = {}
        self.fenced: dict[tuple[int, int, int], dict[tuple[int, int, int], int]] = {}  # clock at last fence
        self.seen: dict[tuple[int, int, int], dict[tuple[int, int, int], int]] = {}  # read since last fence

    def _clock(self, blk: tuple[int, int, int]) -> dict[tuple[int, int, int], int]:
        return self.clocks.setdefault(blk, {blk: 1})

    def _ordered(self, blk: tuple[int, int, int], other: tuple[int, int, int], epoch: int) -> bool:
        return other == blk or self._clock(blk).get(other, 0) >= epoch

    def atomic(self, buf: Any, idx: tuple[int, ...], blk: tuple[int, int, int]) -> None:
        loc = self.released.setdefault((id(buf), idx), {})
        _join(self.seen.setdefault(blk, {}), loc)  # acquired at the next fence
        _join(loc, self.fenced.get(blk, {}))  # what the last fence released

    def fence(self, blk: tuple[int, int, int]) -> None:
        clock = self._clock(blk)
        _join(clock, self.seen.pop(blk, {}))
        self.fenced[blk] = dict(clock)
        clock[blk] += 1

    def check(self, buf: Any, idx: tuple[int, ...], blk: tuple[int, int, int], write: bool, op: Operation) -> None:
        key = (id(buf), idx)
        epoch = self._clock(blk)[blk]
        w = self.writer.get(key)
        if w is not None and not self._ordered(blk, *w):
            raise GpuSimError(
                f"cross-block race in global memory: block {blk} {'writes' if write else 'reads'} element "
                f"{list(idx)} that block {w[0]} wrote in the same launch with no release/acquire "
                f"(memref.atomic_rmw) ordering the two ({op.name})"
            )
        if write:
            others = [b for b, e in self.readers.get(key, {}).items() if not self._ordered(blk, b, e)]
            if others:
                raise GpuSimError(
                    f"cross-block race in global memory: block {blk} writes element {list(idx)} "
                    f"that block {min(others)} read in the same launch with no release/acquire ordering "
                    f"the two ({op.name}): a value published after its flag?"
                )
            self.writer[key] = (blk, epoch)
        else:
            self.readers.setdefault(key, {})[blk] = epoch


def _join(into: dict, other: dict) -> None:
    for b, t in other.items():
        if into.get(b, 0) < t:
            into[b] = t


class _Thread:
    def __init__(self, interp: Interpreter, blk: _Block, tid: tuple[int, int, int]):
        self.interp = interp
        self.blk = blk
        self.tid = tid
        bd = blk.block_dim
        self.linear = tid[0] + bd[0] * (tid[1] + bd[1] * tid[2])
        self.env: dict[SSAValue, Any] = {}
        self.shuffle_in: tuple[Any, int, int] | None = None  # (value, offset, width) at a shuffle
        self.shuffle_out: tuple[Any, bool] | None = None  # what the warp exchange gave it

    def run(self, kernel: gpu.FuncOp, args: PythonValues) -> Generator[Operation, None, None]:
        body = kernel.body.blocks.first
        assert body is not None
        yield from self.exec_block(body, args)

    def exec_block(self, block: Block, args: PythonValues) -> Generator[Operation, None, tuple[Any, ...]]:
        env = self.env
        for a, v in zip(block.args, args):
            env[a] = v
        for op in block.ops:
            kind = type(op)
            if kind is scf.ForOp:
                lb, ub, step, *iters = (env[v] for v in op.operands)
                body = op.body.block
                for iv in range(lb, ub, step):
                    iters = list((yield from self.exec_block(body, (iv, *iters))))
                for r, v in zip(op.results, iters):
                    env[r] = v
            elif kind is scf.IfOp:
                region = op.true_region if env[op.cond] else op.false_region
                vals: tuple[Any, ...] = ()
                if region.blocks:
                    vals = yield from self.exec_block(region.block, ())
                for r, v in zip(op.results, vals):
                    env[r] = v
            elif kind is scf.WhileOp:
                vals = [env[v] for v in op.operands]
                while True:
                    yield op  # a switch point per iteration: a spin loop cannot starve the others
                    cond, *vals = yield from self.exec_block(op.before_region.block, vals)
                    if not cond:
                        break
                    vals = list((yield from self.exec_block(op.after_region.block, vals)))
                for r, v in zip(op.results, vals):
                    env[r] = v
            elif kind is scf.YieldOp or kind is gpu.ReturnOp or kind is scf.ConditionOp:
                return tuple(env[v] for v in op.operands)
            elif kind is gpu.BarrierOp:
                yield op
            elif kind is ShuffleOp:
                self.shuffle_in = (env[op.value], env[op.offset], env[op.width])
                yield op  # the warp scheduler fills shuffle_out
                assert self.shuffle_out is not None
                env[op.results[0]], env[op.results[1]] = self.shuffle_out
                self.shuffle_in = self.shuffle_out = None
            elif kind is memref.AtomicRMWOp:
                yield op  # switch points before and after: other blocks may run in between
                self._atomic(op, [env[v] for v in op.operands])
                yield op
            elif kind is FenceOp:
                yield op  # a switch point, like an atomic
                if self.blk.glob is not None:
                    self.blk.glob.fence(self.blk.block_id)
            elif kind is gpu.LaneIdOp:
                env[op.results[0]] = self.linear % WARP
            elif kind is memref.LoadOp or kind is memref.StoreOp:
                inputs = [env[v] for v in op.operands]
                if self.blk.race_check:
                    is_store = kind is memref.StoreOp
                    buf = inputs[1] if is_store else inputs[0]
                    idx = tuple(inputs[2:] if is_store else inputs[1:])
                    if id(buf) in self.blk.shared_ids:
                        self.blk.check_access(buf, idx, self.linear, is_store, op)
                    elif self.blk.glob is not None and id(buf) in self.blk.glob.tracked:
                        # global memory only: a thread's own memref.alloca is private
                        self.blk.glob.check(buf, idx, self.blk.block_id, is_store, op)
                buf = inputs[1] if kind is memref.StoreOp else inputs[0]
                glob = self.blk.glob
                if id(buf) not in self.blk.shared_ids and (glob is None or id(buf) in glob.tracked):
                    self.blk.global_bytes[kind is memref.StoreOp] += _element_bytes(op)
                self._bounds_check(op, inputs, kind is memref.StoreOp)
                self.blk.progress[0] += kind is memref.StoreOp
                results = self.interp.run_op(op, tuple(inputs))
                for r, v in zip(op.results, results):
                    env[r] = v
            elif kind in _VECTOR_OPS:
                self._vector_op(op, [env[v] for v in op.operands])
            elif kind is memref.GetGlobalOp and _is_shared(op.memref.type):
                glob = SymbolTable.lookup_symbol(op, op.name_)
                assert isinstance(glob, memref.GlobalOp)
                env[op.results[0]] = self.blk.shared_buffer(self.interp, glob)
            elif kind is memref.ExtractAlignedPointerAsIndexOp:
                env[op.results[0]] = _BASE_ADDRESS + self.blk.bases.get(id(env[op.operands[0]]), 0)
            elif kind is gpu.ThreadIdOp:
                env[op.results[0]] = self.tid[_DIMS[op.dimension.data.value]]
            elif kind is gpu.BlockIdOp:
                env[op.results[0]] = self.blk.block_id[_DIMS[op.dimension.data.value]]
            elif kind is gpu.BlockDimOp:
                env[op.results[0]] = self.blk.block_dim[_DIMS[op.dimension.data.value]]
            elif kind is gpu.GridDimOp:
                env[op.results[0]] = self.blk.grid_dim[_DIMS[op.dimension.data.value]]
            elif kind is gpu.GlobalIdOp:
                d = _DIMS[op.dimension.data.value]
                env[op.results[0]] = self.blk.block_id[d] * self.blk.block_dim[d] + self.tid[d]
            elif op.regions:
                raise GpuSimError(f"gpu simulator: unsupported op with regions '{op.name}' in a kernel")
            else:
                results = self.interp.run_op(op, tuple(env[v] for v in op.operands))
                for r, v in zip(op.results, results):
                    env[r] = v
        return ()

    def _atomic(self, op: memref.AtomicRMWOp, inputs: list[Any]) -> None:
        _, buf, *idx = inputs
        self._bounds_check(op, [buf, *idx], False)
        glob = self.blk.glob
        if id(buf) not in self.blk.shared_ids and (glob is None or id(buf) in glob.tracked):
            self.blk.global_bytes[0] += _element_bytes(op)
            self.blk.global_bytes[1] += _element_bytes(op)
            if glob is not None:
                glob.atomic(buf, tuple(idx), self.blk.block_id)
        (old,) = self.interp.run_op(op, tuple(inputs))
        self.blk.progress[0] += buf.load(tuple(idx)) != old  # a flag poll that changes nothing is no progress
        self.env[op.results[0]] = old

    def _vector_op(self, op: Operation, inputs: list[Any]) -> None:
        env = self.env
        if isinstance(op, (vector.LoadOp, vector.StoreOp)):
            is_store = isinstance(op, vector.StoreOp)
            buf = inputs[1] if is_store else inputs[0]
            idx = list(inputs[2:] if is_store else inputs[1:])
            n = (op.vector.type if is_store else op.result.type).get_shape()[-1]  # type: ignore[union-attr]
            align = op.attributes.get("alignment")
            el_bytes = _element_bytes(op)
            if align is not None:
                flat = 0
                for i, d in zip(idx, buf.shape):
                    flat = flat * d + i
                if (self.blk.bases.get(id(buf), 0) + flat * el_bytes) % align.value.data:  # type: ignore[attr-defined]
                    raise GpuSimError(
                        f"{op.name} at {idx} of a {list(buf.shape)} memref is not {align.value.data}-byte aligned "  # type: ignore[attr-defined]
                        f"(block {self.blk.block_id}, thread {self.tid})"
                    )
            values = list(inputs[0]) if is_store else []
            self.blk.vector_accesses += 1
            for lane in range(n):
                at = (*idx[:-1], idx[-1] + lane)
                self._bounds_check(op, [buf, *at] if not is_store else [None, buf, *at], is_store)
                if self.blk.race_check:
                    if id(buf) in self.blk.shared_ids:
                        self.blk.check_access(buf, at, self.linear, is_store, op)
                    elif self.blk.glob is not None and id(buf) in self.blk.glob.tracked:
                        self.blk.glob.check(buf, at, self.blk.block_id, is_store, op)
                glob = self.blk.glob
                if id(buf) not in self.blk.shared_ids and (glob is None or id(buf) in glob.tracked):
                    self.blk.global_bytes[is_store] += el_bytes
                if is_store:
                    self.blk.progress[0] += 1
                    buf.store(at, values[lane])
                else:
                    values.append(buf.load(at))
            if not is_store:
                env[op.results[0]] = tuple(values)
        elif isinstance(op, vector.ExtractOp):
            (pos,) = op.static_position.get_values()
            env[op.results[0]] = inputs[0][pos]
        elif isinstance(op, vector.InsertOp):
            (pos,) = op.static_position.get_values()
            vals = list(inputs[1])
            vals[pos] = inputs[0]
            env[op.results[0]] = tuple(vals)
        else:  # broadcast of a scalar
            env[op.results[0]] = (inputs[0],) * op.results[0].type.get_shape()[-1]  # type: ignore[attr-defined]

    def _bounds_check(self, op: Operation, inputs: list[Any], is_store: bool) -> None:
        buf = inputs[1] if is_store else inputs[0]
        idx = inputs[2:] if is_store else inputs[1:]
        if any(not 0 <= i < n for i, n in zip(idx, buf.shape)):
            raise GpuSimError(
                f"out-of-bounds {op.name} at {list(idx)} of a {list(buf.shape)} memref "
                f"(block {self.blk.block_id}, thread {self.tid})"
            )


def _warps(live: list) -> list[list]:
    """The live (thread, generator) pairs grouped by warp (linear id // 32)."""
    groups: dict[int, list] = {}
    for th, gen in live:
        groups.setdefault(th.linear // WARP, []).append((th, gen))
    return list(groups.values())


#: ops a thread yields to the grid scheduler (not barriers or shuffles of its block)
_SWITCH_POINTS = (memref.AtomicRMWOp, scf.WhileOp, FenceOp)


def _next_stop(gen: Generator[Operation, None, None]) -> Generator[Operation, None, Operation | None]:
    """Run one thread to its next barrier or shuffle (None: it returned), yielding each
    switch point it meets (before and after an atomic, each `scf.while` iteration) to
    the grid scheduler."""
    while True:
        try:
            op = next(gen)
        except StopIteration:
            return None
        if not isinstance(op, _SWITCH_POINTS):
            return op
        yield op


def _run_warp_to_barrier(blk: _Block, warp: list, waiting: list, finished: list) -> Generator[Operation, None, None]:
    """Advance the lanes of one warp together through their shuffles up to their next
    barrier (appended to `waiting`) or their end (`finished`); yields at switch points."""
    while True:
        stops: list[tuple[Any, Any, Operation | None]] = []
        for th, gen in warp:
            stops.append((th, gen, (yield from _next_stop(gen))))
        shuffles = [s for s in stops if isinstance(s[2], ShuffleOp)]
        if not shuffles:
            for th, gen, op in stops:
                if op is None:
                    finished.append(th)
                else:
                    waiting.append((th, gen, op))
            return
        op = shuffles[0][2]
        if len(shuffles) != len(stops) or any(s[2] is not op for s in shuffles):
            other = next(s for s in stops if s[2] is not op)
            where = "returned" if other[2] is None else f"is at another op ({other[2].name})"
            raise GpuSimError(
                f"warp divergence at gpu.shuffle in block {blk.block_id}: thread {shuffles[0][0].tid} "
                f"waits at a gpu.shuffle while thread {other[0].tid} {where}"
            )
        _exchange(blk, op, [th for th, _, _ in stops])


def _exchange(blk: _Block, op: ShuffleOp, lanes: list[_Thread]) -> None:
    """One `gpu.shuffle` among the lanes of a warp (all waiting at `op`)."""
    by_lane = {th.linear % WARP: th for th in lanes}
    el = op.value.type
    garbage = 0x5A5A5A5A if isinstance(el, IntegerType) else math.nan
    mode = op.mode.data.value
    for th in lanes:
        value, offset, width = th.shuffle_in  # type: ignore[misc]
        if width < 1 or width > WARP or width & (width - 1) or offset < 0:
            raise GpuSimError(f"gpu.shuffle: width {width} / offset {offset} invalid (block {blk.block_id}, thread {th.tid})")
        lane = th.linear % WARP
        seg, pos = lane - lane % width, lane % width
        src = {"up": pos - offset, "down": pos + offset, "xor": pos ^ offset, "idx": offset}[mode]
        valid = 0 <= src < width
        if valid:
            other = by_lane.get(seg + src)
            if other is None:
                raise GpuSimError(
                    f"gpu.shuffle in block {blk.block_id}: thread {th.tid} reads lane {seg + src}, "
                    "which is not a thread of the block"
                )
            th.shuffle_out = (other.shuffle_in[0], True)  # type: ignore[index]
        else:
            th.shuffle_out = (garbage, False)


def _run_block(blk: _Block, threads: list) -> Generator[Operation, None, None]:
    """Run the threads of one block barrier round by barrier round; yields at each
    switch point (where the grid scheduler may run another block)."""
    live = threads
    while live:
        waiting: list[tuple[_Thread, Generator[Operation, None, None], Operation]] = []
        finished: list[_Thread] = []
        for warp in _warps(live):
            yield from _run_warp_to_barrier(blk, warp, waiting, finished)
        if waiting and finished:
            raise GpuSimError(
                f"barrier divergence in block {blk.block_id}: thread {finished[0].tid} "
                f"returned while thread {waiting[0][0].tid} waits at a gpu.barrier"
            )
        barriers = {id(b) for _, _, b in waiting}
        if len(barriers) > 1:
            first = waiting[0]
            other = next(w for w in waiting if w[2] is not first[2])
            raise GpuSimError(
                f"barrier divergence in block {blk.block_id}: threads {first[0].tid} "
                f"and {other[0].tid} wait at different gpu.barrier ops"
            )
        blk.new_epoch()
        if waiting:
            blk.barriers += 1
        live = [(th, gen) for th, gen, _ in waiting]


def _start_order(grid: tuple[int, int, int], block_order: str | int) -> list[tuple[int, int, int]]:
    order = [(bx, by, bz) for bz, by, bx in itertools.product(range(grid[2]), range(grid[1]), range(grid[0]))]
    if block_order == "reverse":
        order.reverse()
    elif isinstance(block_order, int) and not isinstance(block_order, bool):
        random.Random(block_order).shuffle(order)
    elif block_order != "forward":
        raise GpuSimError(f"gpu simulator: unknown block order {block_order!r}")
    return order


class _Scheduler:
    """Which started block runs next, up to its next switch point (`_SWITCH_POINTS`).
    Blocks start in `block_order`, at most `resident` at a time (a slot frees when its
    block returns).

    `interleave`: None runs each block to its end (one resident block); an int seeds a
    random pick at every switch point; "round-robin" switches to the next block at each
    (so a flag published before its value is seen before the value is written);
    "latest-first" is the adversary of a look-back: the block started last runs until
    it spins (a quantum writing no memory), then the next latest, and so on.
    A run of `spin_limit` quanta per started block writing no memory is a deadlock."""

    def __init__(self, interleave: str | int | None, resident: int | None, spin_limit: int):
        if interleave not in (None, "latest-first", "round-robin") and (not isinstance(interleave, int) or isinstance(interleave, bool)):
            raise GpuSimError(f"gpu simulator: unknown interleave {interleave!r}")
        if resident is not None and resident < 1:
            raise GpuSimError(f"gpu simulator: resident must be >= 1, got {resident}")
        self.interleave = interleave
        self.resident = 1 if interleave is None and resident is None else resident
        self.spin_limit = spin_limit
        self.rng = random.Random(interleave) if isinstance(interleave, int) else None
        self.stalled: set[int] = set()  # ids of blocks seen spinning
        self.turn = 0  # round-robin position

    def has_room(self, active: list) -> bool:
        return self.resident is None or len(active) < self.resident

    def pick(self, active: list) -> int:
        if self.rng is not None:
            return self.rng.randrange(len(active))
        if self.interleave is None:
            return 0
        if self.interleave == "round-robin":
            self.turn = (self.turn + 1) % len(active)
            return self.turn
        fresh = [i for i in range(len(active)) if id(active[i][0]) not in self.stalled]
        if not fresh:  # everyone spins: a round latest first, each once
            self.stalled.clear()
            fresh = list(range(len(active)))
        return fresh[-1]

    def ran(self, blk: _Block, wrote: bool) -> None:
        if wrote:
            self.stalled.discard(id(blk))
        else:
            self.stalled.add(id(blk))


def _record(stats: dict, blk: _Block) -> None:
    stats["blocks"] = stats.get("blocks", 0) + 1
    stats["max_barriers"] = max(stats.get("max_barriers", 0), blk.barriers)
    stats["load_bytes"] = stats.get("load_bytes", 0) + blk.global_bytes[0]
    stats["store_bytes"] = stats.get("store_bytes", 0) + blk.global_bytes[1]
    stats["vector_accesses"] = stats.get("vector_accesses", 0) + blk.vector_accesses


def run_kernel(
    interp: Interpreter,
    kernel: gpu.FuncOp,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    args: PythonValues,
    race_check: bool = True,
    block_order: str | int = "forward",
    stats: dict | None = None,
    bases: dict[int, int] | None = None,
    interleave: str | int | None = None,
    resident: int | None = None,
    spin_limit: int = 2000,
) -> None:
    """Execute `kernel` over the whole grid; `args` are interpreter values (ShapedArrays).
    `bases`: id(buffer) -> its base's byte offset past a 256-byte boundary (default 0).
    `block_order`: the order blocks start in: "forward", "reverse" or an int seed of a
    random permutation. `interleave`, `resident`, `spin_limit`: see `_Scheduler`. `stats`
    (a dict) receives `blocks`, `max_barriers` (per block), `load_bytes`, `store_bytes`
    (global memory, summed over the grid), `vector_accesses` (vector loads and stores)."""
    if any(g < 1 for g in grid) or any(b < 1 for b in block):
        raise GpuSimError(f"invalid launch configuration grid={grid} block={block}")
    pending = _start_order(grid, block_order)
    pending.reverse()  # popped from the end
    sched = _Scheduler(interleave, resident, spin_limit)
    glob = _GlobalAccesses({id(a) for a in args if isinstance(a, ShapedArray)}) if race_check else None
    progress = [0]
    active: list[tuple[_Block, Generator[Operation, None, None], list]] = []  # (block, run, [last atomic])
    quiet = 0  # consecutive quanta that wrote no memory
    while pending or active:
        while pending and sched.has_room(active):
            blk = _Block(pending.pop(), block, grid, race_check, glob, bases, progress)
            threads = []
            for tz, ty, tx in itertools.product(range(block[2]), range(block[1]), range(block[0])):
                th = _Thread(interp, blk, (tx, ty, tz))
                threads.append((th, th.run(kernel, args)))
            active.append((blk, _run_block(blk, threads), [None]))
        i = sched.pick(active)
        blk, run, last = active[i]
        before = progress[0]
        try:
            last[0] = next(run)
        except StopIteration:
            del active[i]
            sched.stalled.discard(id(blk))
            if stats is not None:
                _record(stats, blk)
            quiet = 0
            continue
        sched.ran(blk, progress[0] != before)
        quiet = 0 if progress[0] != before else quiet + 1
        if quiet > spin_limit * len(active):
            where = ", ".join(f"block {b.block_id} at {op.name if op else 'start'}" for b, _, (op,) in active)
            raise GpuSimError(
                f"deadlock in the inter-block protocol: no block wrote memory in {quiet} scheduling steps "
                f"({where}; {len(pending)} blocks not started, {sched.resident or 'all'} resident)"
            )


def _lookup_kernel(module: ModuleOp, ref) -> gpu.FuncOp:
    mod_name = ref.root_reference.data
    kname = ref.nested_references.data[0].data if ref.nested_references.data else None
    for op in module.walk():
        if isinstance(op, gpu.ModuleOp) and op.sym_name.data == mod_name:
            for k in op.body.block.ops:
                if isinstance(k, gpu.FuncOp) and k.sym_name.data == kname:
                    return k
    raise GpuSimError(f"gpu simulator: kernel {ref} not found")


@register_impls
class GpuLaunchFunctions(InterpreterFunctions):
    """Host-side `gpu.launch_func`, running the kernel in the block simulator."""

    race_check: bool = True
    block_order: str | int = "forward"
    interleave: str | int | None = None  # see `_Scheduler`
    resident: int | None = None
    on_launch: Any = None  # called as on_launch(kernel name, grid, block, kernel args)
    stats: Any = None  # a list: one `run_kernel` stats dict per launch, with "kernel"
    base_offsets: Any = None  # host argument position -> byte offset of its base

    @impl(gpu.LaunchFuncOp)
    def run_launch_func(self, interpreter: Interpreter, op: gpu.LaunchFuncOp, args: PythonValues):
        vals = dict(zip(op.operands, args))
        if op.asyncDependencies or op.asyncToken is not None:
            raise GpuSimError("gpu simulator: async launches are not supported")
        grid = (vals[op.gridSizeX], vals[op.gridSizeY], vals[op.gridSizeZ])
        block = (vals[op.blockSizeX], vals[op.blockSizeY], vals[op.blockSizeZ])
        kernel = _lookup_kernel(interpreter.module, op.kernel)
        kargs = tuple(vals[v] for v in op.kernelOperands)
        if self.on_launch is not None:
            self.on_launch(kernel.sym_name.data, grid, block, kargs)
        st = None if self.stats is None else {"kernel": kernel.sym_name.data, "grid": grid}
        bases = {}
        for v, a in zip(op.kernelOperands, kargs):
            if self.base_offsets and isinstance(v, BlockArgument) and isinstance(v.block.parent_op(), func.FuncOp):
                bases[id(a)] = self.base_offsets.get(v.index, 0)
        run_kernel(interpreter, kernel, grid, block, kargs, self.race_check, self.block_order, st, bases,
                   self.interleave, self.resident)
        if st is not None:
            self.stats.append(st)
        return ()


def simulate_launch(
    module: ModuleOp | str, name: str, *args: Any, race_check: bool = True, on_launch: Any = None,
    block_order: str | int = "forward",
    stats: list | None = None,
    base_offsets: dict[int, int] | None = None,
    interleave: str | int | None = None,
    resident: int | None = None,
) -> tuple[Any, ...]:
    """Run host `func.func @name` on numpy arrays (updated in place), kernels simulated.
    `on_launch(kernel name, grid, block, kernel args)` sees each launch before it runs;
    `block_order` as in `run_kernel`; `stats` (a list) gets one dict per launch;
    `base_offsets` (argument position -> bytes, each below 256) places that argument's
    base off a 16-byte boundary, as a device view would be. `interleave` / `resident`:
    how blocks of one launch run concurrently (`_Scheduler`)."""
    if isinstance(module, str):
        from scanweaver.ir import parse_ir

        module = parse_ir(module)
    launcher = GpuLaunchFunctions()
    launcher.race_check = race_check
    launcher.on_launch = on_launch
    launcher.block_order = block_order
    launcher.stats = stats
    launcher.base_offsets = base_offsets
    launcher.interleave = interleave
    launcher.resident = resident
    return run_function(module, name, *args, extra_impls=[launcher])
