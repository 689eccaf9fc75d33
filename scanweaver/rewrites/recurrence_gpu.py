"""`scan-to-gpu` for `scan.recurrence`: one fused producer/scan/consumer kernel per nest.

`ScanToGpu` calls `lower_recurrences(module, block_size, items_per_thread)`; every
`scan.recurrence` that matches below becomes one `gpu.func` plus one `gpu.launch_func`
replacing its whole loop nest. Nothing of a, b or h (batch x D x N x L for the Mamba
selective scan) goes to global memory: coefficients are produced in registers from the
cloned `coeffs` region, scanned, and consumed in registers by the cloned `emit` region.
Anything that does not match is left unchanged, for the sequential lowering.

What matches
------------
    func.func @f(...memref args...) {
      scf.for %b ... {                 channel loops (depth >= 0, no iter_args); their
        scf.for %d ... {               bodies before the inner loop: pure ops and loads
          prologue                     e.g. %h = memref.alloca; zero fill / copy from h0
          scan.recurrence ... state(%h) coeffs {...} emit {...}
          epilogue                     e.g. copy %h out to last_state[b, d, :]
    } } }

* Channel loop bounds: constants, or `0 to memref.dim(%arg, c) step 1` (a dynamic grid
  term `arg.shape[c]` in the launch description). The state is a static-shape
  `memref.alloca` of the innermost body (per channel iteration), at most 64 elements
  (up to 32 assemble without spills for the selective scan; 64 spills);
  at depth 0 (no channel loop, e.g. the reset loop) it is a function argument
  (initial state in, final state out), or a `memref.alloca` of the function body (a
  scalar `iter_args` state over one long sequence): then `wrap_depth0` first puts the
  recurrence with its set-up and final stores into a one-trip loop (one block).
* Parallel channels (a simple sufficient check): every memref written anywhere in the
  nest, other than allocas of the innermost body, is a function argument, and all of
  its loads and stores index it with each channel loop variable itself at one fixed
  dimension (not needed for a loop of one iteration); so different channel
  iterations touch disjoint elements.
* Parallel steps: coeffs neither writes memory nor reads what emit writes; emit never
  reads a memref it writes (other than its own allocas), except exactly the element
  every store to it in that block writes, one element per step (`y[t] += ...`: no step
  reads what another writes); it never writes the prologue's
  allocas; each emit store either indexes one dimension injectively in the step
  (`t`, `t + c`, `c - t`, `k * t`, with c the same in every step -- not an emit loop
  variable -- and the same expression for every store to that memref; such stores may
  be conditional), or is step-invariant and unconditional (e.g. the write-through
  `g[c] = state` of the discounted return, or a fixed-bound emit loop over c writing
  m[c]): then only the last step performs it, which leaves memory exactly as the
  sequential loop does. The prologue writes only its own allocas.
* Values from outside the nest: function memref arguments (kernel arguments), scalar
  function arguments (integers, index, f32, f64: kernel parameters), constants,
  `memref.dim` of arguments, pure arith on those, and loads from argument memrefs in the
  function body before the nest, with nothing writing memory in between and the nest
  not writing that memref (cloned into the kernel: every thread reads it).
* Launch checks: `covers_dims` in the launch description says which array sizes must be
  at least the trip counts of the loops that index them directly.

Kernel design
-------------
* Grid: one block per channel iteration; blockIdx.x is delinearised over the channel
  loops' trip counts (row-major), like the scan.affine kernel's channels. Every thread
  runs the cloned prologue (so each has its own private state alloca); thread 0 puts
  the initial state into the shared carry `sC[N]`.
* Hoisting: ops of coeffs that depend on neither the step nor the state index run once
  per thread; those that depend on the state index only (Mamba: `A[d, n]`, constant
  `B[d, n]`) once per state element, kept in registers when they take at most 32
  (N = 16: A and B), else reloaded per step (N = 32: no spills that way); step-invariant
  emit ops are hoisted too. Loads could be out of bounds for an empty sequence, so this
  block is guarded by `trip > 0`. Constants are simply cloned.
* Tile = block_size * items_per_thread consecutive steps; thread `tid` owns
  `items_per_thread` consecutive ones. Phase 1: per item, the step-dependent ops of
  coeffs are cloned once, the step-and-element-dependent ones once per state element
  (N unrolled copies, the element index a constant), giving N pairs (identity (1, 0)
  past the end); they are folded into N aggregate pairs.
* Scan: the N components are scanned together: shared `sA`, `sB` hold
  `G x block_size` pairs, component-major (`c * block_size + tid`: conflict-free
  stores and prefix reads), and each up/down-sweep node does G independent combines,
  so a tile costs 2 log2(block_size) + 1 barriers however large N is. G = N unless
  that would exceed 32 KiB of shared memory (static shared memory stops at 48 KiB),
  then the components go in groups of G, each group its own sweeps. Scanning the
  components one after another would cost N times the barriers for no gain at the
  sizes that fit (Mamba: N = 16, 128 threads -> 16 KiB). Thread 0 seeds the roots
  with the carry `sC`; the down-sweep yields each thread's exclusive prefix state
  h[0..N) (the scan.affine kernel's b-only down-sweep, shared helpers).
* Phase 3 (replay): per item, in range only, `h_n = a_n * h_n + b_n` for the N
  elements, the new state is stored to the thread's private state alloca (constant
  indices; LLVM promotes it to registers once the emit's loop over N is unrolled)
  and the cloned emit runs on it. The pairs are recomputed from the per-item
  step-only values kept from phase 1 (Mamba: softplus(dt), dt*u) rather than kept
  (2 N items_per_thread registers) unless that is small (<= 16 registers); the
  recomputation is a multiply and an exp per pair, the loads hit L1. Measured with
  ptxas for the selective scan, N = 16, 128 x 4: 128 registers recomputing, 235
  keeping (no spills either way; recomputing allows twice the resident blocks).
* Overflow guard (blelloch_gpu, "Numerics"): thread 0 flags a tile whose root
  aggregates are not finite; such a tile takes its entering states in the loop's own
  order (thread after thread), its pairs recomputed from the loads (kept values would
  be hoisted out of that loop by LLVM: N * items_per_thread more registers) and each
  thread's entering state kept in its own `sB` slots (one component group). No
  underflow poison here: Mamba's exp(dt A) products underflow in most tiles.
* Chained tiles: the last thread's final h (identity padding keeps it) goes to `sC`
  for the next tile's seed; only thread 0 reads it, after the next up-sweep's barrier.
  After the last tile a barrier, then thread 0 copies `sC` into its state buffer and
  runs the cloned epilogue (e.g. return_last_state), or at depth 0 writes the final
  state to the state argument. Any length, lb/ub/step (positive step); the emit never
  runs for a step outside [lb, ub).
* Launch: grid (channels, 1, 1) (at most 2^31 - 1; a static empty grid launches
  nothing, a dynamic one is skipped by the CUDA runtime), block (block_size, 1, 1),
  static shared memory (2 G block_size + N) * sizeof(state); a `scanweaver.launch`
  description on the kernel; the host function keeps only constants, index
  arithmetic and the launch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects import arith, func, gpu, memref, scf
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FunctionType,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    SymbolRefAttr,
    UnitAttr,
)
from xdsl.ir import Attribute, Block, BlockArgument, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.errors import CannotLower
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.affine_to_pairs import Emitter, PairArith
from scanweaver.rewrites.launch import KernelLaunch

#: Largest state (elements per channel) kept in registers.
MAX_STATE = 64
#: Shared memory for the sweep arrays sA + sB (bytes); components go in groups beyond.
SWEEP_SHARED_BUDGET = 32 * 1024
#: Hoist element-only coefficient values (N copies each) when they fit in this many registers.
HOIST_PER_ELEMENT_REGISTERS = 32
#: Keep phase-1 pairs in registers for the replay when 2 * N * items <= this.
KEEP_PAIRS_REGISTERS = 16


#: Why a `scan.recurrence` is left for the sequential lowering (the shared "cannot lower").
Unsupported = CannotLower


def _scalar(t: Attribute) -> bool:
    return isinstance(t, (IndexType, IntegerType, Float16Type, BFloat16Type, Float32Type, Float64Type))


def _const_int(v: SSAValue) -> int | None:
    op = v.owner
    if isinstance(op, arith.ConstantOp) and isinstance(op.value, IntegerAttr):
        return op.value.value.data
    return None


def _defined_inside(ops: Iterable[Operation]) -> set[SSAValue]:
    inside: set[SSAValue] = set()
    for top in ops:
        for o in top.walk():
            inside.update(o.results)
            for r in o.regions:
                for b in r.blocks:
                    inside.update(b.args)
    return inside


def _free_values(ops: Sequence[Operation]) -> list[SSAValue]:
    """Values used by `ops` (nested regions included) but defined elsewhere, in order."""
    inside = _defined_inside(ops)
    seen: dict[SSAValue, None] = {}
    for top in ops:
        for o in top.walk():
            for v in o.operands:
                if v not in inside:
                    seen.setdefault(v, None)
    return list(seen)


def _accesses(ops: Iterable[Operation]) -> list[tuple[Operation, SSAValue, Sequence[SSAValue], bool]]:
    out = []
    for top in ops:
        for o in top.walk():
            if isinstance(o, memref.LoadOp):
                out.append((o, o.memref, o.indices, False))
            elif isinstance(o, memref.StoreOp):
                out.append((o, o.memref, o.indices, True))
    return out


def _allocas(ops: Iterable[Operation]) -> set[SSAValue]:
    return {o.memref for top in ops for o in top.walk() if isinstance(o, memref.AllocaOp)}


def _check_ops(ops: Iterable[Operation], where: str, *, stores: bool, allocas: bool) -> None:
    """Only ops the kernel can clone: pure scalar ops, loads, stores, allocas, scf."""
    for top in ops:
        for o in top.walk():
            if isinstance(o, (scf.ForOp, scf.IfOp)):
                if any(isinstance(r.type, MemRefType) for r in o.results):
                    raise Unsupported(f"{where}: '{o.name}' yields a memref")
                continue
            if isinstance(o, (scf.YieldOp, memref.LoadOp, memref.DimOp, scan.YieldOp)):
                continue
            if isinstance(o, memref.StoreOp):
                if stores:
                    continue
                raise Unsupported(f"{where}: writes memory")
            if isinstance(o, memref.AllocaOp):
                if allocas and not o.dynamic_sizes and not o.symbol_operands:
                    continue
                raise Unsupported(f"{where}: unsupported memref.alloca")
            if o.regions or not is_side_effect_free(o):
                raise Unsupported(f"{where}: '{o.name}' is not supported in a kernel")
            if any(isinstance(v.type, MemRefType) for v in (*o.operands, *o.results)):
                raise Unsupported(f"{where}: '{o.name}' makes a view of a memref")


def _name_of(v: SSAValue) -> str:
    return f"%{v.name_hint}" if v.name_hint else "a memref"


# ---------------------------------------------------------------------------
# Emit stores: which step writes what
# ---------------------------------------------------------------------------

_Lin = tuple[int, int, frozenset]  # (coefficient of t, constant, {(opaque value, coeff)})


class _EmitStores:
    """Classifies emit stores: one element per step (injective in the step index `t`),
    or step-invariant (every step writes the same elements: only the last step needs to).

    `fixed` values are the same in every step: defined outside emit, or pure ops of
    fixed values. Injective forms are `k * t + (fixed terms)`, k != 0; an emit loop
    variable is not fixed (`y[t + c]` in a loop over c overlaps between steps).
    Step-invariant stores must run unconditionally in each step (nested only in
    `scf.for` loops with fixed bounds) at indices built from fixed values and those
    loops' variables.
    """

    def __init__(self, emit: Block):
        self.emit = emit
        self.t = emit.args[0]
        inside = _defined_inside(list(emit.ops)) | set(emit.args)
        self.fixed: set[SSAValue] = set()
        for o in emit.walk():
            if (
                not o.regions
                and is_side_effect_free(o)
                and all(v in self.fixed or v not in inside for v in o.operands)
            ):
                self.fixed.update(o.results)
        self.inside = inside

    def is_fixed(self, v: SSAValue) -> bool:
        return v not in self.inside or v in self.fixed

    def lin(self, v: SSAValue) -> _Lin | None:
        if v == self.t:
            return (1, 0, frozenset())
        c = _const_int(v)
        if c is not None:
            return (0, c, frozenset())
        if self.is_fixed(v):
            return (0, 0, frozenset({(v, 1)}))
        op = v.owner
        if isinstance(op, (arith.AddiOp, arith.SubiOp)):
            x, y = self.lin(op.lhs), self.lin(op.rhs)
            if x is None or y is None:
                return None
            sign = 1 if isinstance(op, arith.AddiOp) else -1
            terms: dict[SSAValue, int] = dict(x[2])
            for k, cf in y[2]:
                terms[k] = terms.get(k, 0) + sign * cf
            return (x[0] + sign * y[0], x[1] + sign * y[1], frozenset((k, cf) for k, cf in terms.items() if cf))
        if isinstance(op, arith.MuliOp):
            for a, b in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
                c = _const_int(b)
                x = self.lin(a)
                if c is not None and x is not None:
                    return (x[0] * c, x[1] * c, frozenset((k, cf * c) for k, cf in x[2]))
        return None

    def kind(self, store: memref.StoreOp) -> tuple | None:
        """("inj", dim, form) | ("last",) | None (not provably safe)."""
        for p, ix in enumerate(store.indices):
            f = self.lin(ix)
            if f is not None and f[0] != 0:
                return ("inj", p, f)
        loop_vars: set[SSAValue] = set()
        op: Operation | None = store.parent_op()
        while op is not None and op is not self.emit.parent_op():
            if not isinstance(op, scf.ForOp) or not all(self.is_fixed(v) for v in (op.lb, op.ub, op.step)):
                return None  # conditional, or a loop whose trip count depends on the step
            loop_vars.add(op.body.block.args[0])
            op = op.parent_op()

        def invariant(v: SSAValue) -> bool:
            if self.is_fixed(v) or v in loop_vars:
                return True
            o = v.owner
            return (
                isinstance(o, Operation)
                and not o.regions
                and is_side_effect_free(o)
                and all(invariant(x) for x in o.operands)
            )

        if all(invariant(ix) for ix in store.indices):
            return ("last",)
        return None


# ---------------------------------------------------------------------------
# Matching
# ---------------------------------------------------------------------------


@dataclass
class _Nest:
    fn: func.FuncOp
    rec: scan.LoopRecurrence  # scan.recurrence, or scan.linear_recurrence (linear_gpu.py)
    loops: list[scf.ForOp]
    outer_pre: list[list[Operation]]
    prologue: list[Operation]
    epilogue: list[Operation]
    state_arg: BlockArgument | None  # depth 0: the function argument holding the state
    trips: list[int | tuple[BlockArgument, int]]  # static trip, or (argument, dim)
    last_stores: set[Operation]
    kernel_args: list[BlockArgument] = field(default_factory=list)
    stored_args: set[SSAValue] = field(default_factory=set)
    loaded_args: set[SSAValue] = field(default_factory=set)
    outside_loads: list[Operation] = field(default_factory=list)  # host loads cloned into the kernel

    @property
    def root(self) -> Operation:
        return self.loops[0] if self.loops else self.rec


def _check_nothing_written_between(first: Operation, last: Operation) -> None:
    block = first.parent_block()
    assert block is not None
    ops = list(block.ops)
    for o in ops[ops.index(first) + 1 : ops.index(last)]:
        if not (is_side_effect_free(o) or isinstance(o, memref.LoadOp)):
            raise Unsupported(f"'{o.name}' between a load the nest needs and the nest may write memory")


def _reads_own_element(load: Operation, ref: SSAValue, idx: Sequence[SSAValue], accesses, kinds: set) -> bool:
    """`y[i] += ...` in emit: the load reads exactly the element that every store to
    `ref` in the same block writes, and those stores write one element per step (so no
    step reads what another step writes)."""
    if kinds == {("last",)}:
        return False
    stores = [(o, i) for o, r, i, st in accesses if st and r == ref]
    return all(
        o.parent_block() is load.parent_block() and tuple(i) == tuple(idx) for o, i in stores
    )


def _arg_dim(v: SSAValue, fn_args: set[SSAValue]) -> tuple[BlockArgument, int] | None:
    op = v.owner
    if isinstance(op, memref.DimOp) and op.source in fn_args:
        d = _const_int(op.index)
        if d is not None:
            return op.source, d  # type: ignore[return-value]
    return None


def _trip(loop: scf.ForOp, fn_args: set[SSAValue]) -> int | tuple[BlockArgument, int]:
    if not isinstance(loop.lb.type, IndexType):
        raise Unsupported("channel loops must iterate over index values")
    lb, ub, st = _const_int(loop.lb), _const_int(loop.ub), _const_int(loop.step)
    if st is not None and st <= 0:
        raise Unsupported("channel loop step must be positive")
    if lb is not None and ub is not None and st is not None:
        return max(0, -(-(ub - lb) // st))
    d = _arg_dim(loop.ub, fn_args)
    if lb == 0 and st == 1 and d is not None:
        return d
    raise Unsupported("channel loop bounds must be constants, or 0 to memref.dim(%arg, c) step 1")


def match_recurrence(rec: scan.LoopRecurrence) -> _Nest:
    """The loop nest of `rec` if the kernel design applies, else `Unsupported(reason)`.

    The checks run in this order (the first that fails gives the reason): the nest's
    shape, the state, what runs around the recurrence, the memory discipline that lets
    steps run in parallel, the one that lets channels run in parallel, and the values
    the nest takes from outside it."""
    loops, fn = _channel_loops(rec)
    fn_args: set[SSAValue] = set(fn.body.block.args)
    _check_state(rec)
    outer_pre, prologue, epilogue = _split_levels(loops, rec)
    state_arg = _state_argument(rec, loops, prologue, fn_args)
    pro_allocas = _check_around(rec, prologue, epilogue)
    last_stores = _check_steps_parallel(rec, pro_allocas)
    trips = _check_channels_parallel(loops, fn_args)
    nest = _Nest(fn, rec, loops, outer_pre, prologue, epilogue, state_arg, trips, last_stores)
    _collect_outside_values(nest, fn_args)
    if state_arg is not None:
        nest.stored_args.add(state_arg)
        nest.loaded_args.add(state_arg)
    return nest


def _channel_loops(rec: scan.LoopRecurrence) -> tuple[list[scf.ForOp], func.FuncOp]:
    """The scf.for loops around `rec`, outermost first, and the function holding them."""
    loops: list[scf.ForOp] = []
    cur: Operation = rec
    while True:
        parent = cur.parent_op()
        if isinstance(parent, scf.ForOp):
            if parent.iter_args or parent.results:
                raise Unsupported("an enclosing scf.for carries values")
            loops.append(parent)
            cur = parent
            continue
        if isinstance(parent, func.FuncOp):
            break
        raise Unsupported(f"nested in '{parent.name if parent else '?'}', not in scf.for channel loops")
    loops.reverse()
    return loops, parent


def _check_state(rec: scan.LoopRecurrence) -> None:
    state_t = rec.state_type
    if not state_t.has_static_shape():
        raise Unsupported("the state must have a static shape")
    if math.prod(state_t.get_shape()) > MAX_STATE:
        raise Unsupported(f"the state has more than {MAX_STATE} elements")
    if not isinstance(rec.lb.type, IndexType):
        raise Unsupported("the recurrence must step over index values")


def _split_levels(
    loops: list[scf.ForOp], rec: scan.LoopRecurrence
) -> tuple[list[list[Operation]], list[Operation], list[Operation]]:
    """(ops before each inner channel loop, prologue, epilogue of the innermost body)."""
    outer_pre: list[list[Operation]] = []
    prologue: list[Operation] = []
    epilogue: list[Operation] = []
    for i, loop in enumerate(loops):
        child = loops[i + 1] if i + 1 < len(loops) else rec
        ops = list(loop.body.block.ops)
        k = ops.index(child)
        pre, post = ops[:k], ops[k + 1 :]
        if i + 1 < len(loops):
            for o in pre:
                if (
                    o.regions
                    or not (is_side_effect_free(o) or isinstance(o, memref.LoadOp))
                    or any(isinstance(r.type, MemRefType) for r in o.results)
                ):
                    raise Unsupported(f"'{o.name}' between channel loops")
            if len(post) != 1:
                raise Unsupported("ops after an inner channel loop")
            outer_pre.append(pre)
        else:
            prologue, epilogue = pre, post[:-1]
    return outer_pre, prologue, epilogue


def _state_argument(
    rec: scan.LoopRecurrence, loops: list[scf.ForOp], prologue: list[Operation], fn_args: set[SSAValue]
) -> SSAValue | None:
    """The function argument holding the state (no channel loops), or None (an alloca)."""
    if loops:
        owner = rec.state.owner
        if not (isinstance(owner, memref.AllocaOp) and any(owner is o for o in prologue)):
            raise Unsupported("the state is not a memref.alloca of the innermost channel loop body")
        return None
    if rec.state not in fn_args:
        raise Unsupported("outside channel loops the state must be a function argument")
    return rec.state


def _check_around(rec: scan.LoopRecurrence, prologue: list[Operation], epilogue: list[Operation]) -> set[SSAValue]:
    """The ops of the prologue, epilogue and regions are ones a kernel can hold; the
    prologue writes only its own allocas (returned)."""
    coeffs_ops = list(rec.coeffs.block.ops)[:-1]
    emit_ops = list(rec.emit.block.ops)[:-1]
    _check_ops(prologue, "before the recurrence", stores=True, allocas=True)
    _check_ops(epilogue, "after the recurrence", stores=True, allocas=True)
    _check_ops(coeffs_ops, "coeffs", stores=False, allocas=False)
    _check_ops(emit_ops, "emit", stores=True, allocas=True)

    pro_allocas = _allocas(prologue)
    for _, ref, _, is_store in _accesses(prologue):
        if is_store and ref not in pro_allocas:
            raise Unsupported("the prologue writes a memref other than its own allocas")
    return pro_allocas


def _check_steps_parallel(rec: scan.LoopRecurrence, pro_allocas: set[SSAValue]) -> set[Operation]:
    """Steps in parallel: coeffs / emit memory discipline.  Returns emit's stores of
    the last step only."""
    coeffs_ops = list(rec.coeffs.block.ops)[:-1]
    emit_ops = list(rec.emit.block.ops)[:-1]
    if rec.state in _free_values(emit_ops):
        raise Unsupported("emit uses the state buffer directly instead of its block argument")
    s_e = rec.emit.block.args[1]
    emit_local = _allocas(emit_ops)
    emit_acc = _accesses(emit_ops)
    classify = _EmitStores(rec.emit.block)
    kinds: dict[SSAValue, set] = {}
    last_stores: set[Operation] = set()
    for o, ref, _, is_store in emit_acc:
        if not is_store or ref in emit_local:
            continue
        if ref == s_e or ref == rec.state:
            raise Unsupported("emit writes the state")
        if ref in pro_allocas:
            raise Unsupported("emit writes a buffer of the prologue (state carried through memory)")
        kind = classify.kind(o)  # type: ignore[arg-type]
        if kind is None:
            raise Unsupported(f"emit store to {_name_of(ref)} is neither one element per step nor step-invariant")
        kinds.setdefault(ref, set()).add(kind)
        if kind == ("last",):
            last_stores.add(o)
    for ref, ks in kinds.items():
        if len(ks) > 1:
            raise Unsupported(f"emit stores to {_name_of(ref)} at different per-step positions")
    emit_written = set(kinds)
    for o, ref, idx, is_store in emit_acc:
        if not is_store and ref in emit_written and not _reads_own_element(o, ref, idx, emit_acc, kinds[ref]):
            raise Unsupported(f"emit reads {_name_of(ref)}, which it writes (a dependence between steps)")
    for _, ref, _, _ in _accesses(coeffs_ops):
        if ref in emit_written:
            raise Unsupported(f"coeffs reads {_name_of(ref)}, which emit writes")
        if ref == rec.state:
            raise Unsupported("coeffs reads the state")
    return last_stores


def _check_channels_parallel(loops: list[scf.ForOp], fn_args: set[SSAValue]) -> list:
    """Channels in parallel: every memref the nest writes is indexed by each channel
    variable.  Returns the channel loops' trip counts."""
    trips = [_trip(loop, fn_args) for loop in loops]
    if all(isinstance(t, int) for t in trips) and math.prod(trips) > 2**31 - 1:  # type: ignore[arg-type]
        raise Unsupported("more than 2^31 - 1 channel iterations (the blockIdx.x limit)")
    if loops:
        ivs = [loop.body.block.args[0] for loop in loops]
        private = _allocas([loops[-1]])
        by_ref: dict[SSAValue, list[tuple[Sequence[SSAValue], bool]]] = {}
        for _, ref, idx, is_store in _accesses([loops[0]]):
            by_ref.setdefault(ref, []).append((idx, is_store))
        for ref, lst in by_ref.items():
            if ref in private or not any(st for _, st in lst):
                continue
            if ref not in fn_args:
                raise Unsupported(f"the nest writes {_name_of(ref)}, which is not a function argument")
            common: set[tuple[int, int]] | None = None
            for idx, _ in lst:
                here = {(j, p) for p, x in enumerate(idx) for j, iv in enumerate(ivs) if x == iv}
                common = here if common is None else common & here
            assert common is not None
            for j, iv in enumerate(ivs):
                if trips[j] == 1:
                    continue  # a one-iteration loop cannot overlap with itself
                if not any(c[0] == j for c in common):
                    raise Unsupported(
                        f"{_name_of(ref)} is written, but not always indexed by the channel "
                        f"variable %{iv.name_hint or j} at one dimension: channels may overlap"
                    )
    return trips


def _collect_outside_values(nest: _Nest, fn_args: set[SSAValue]) -> None:
    """Values from outside the nest: function arguments become kernel parameters, pure
    arith is cloned, scalar loads before the nest are re-read in the kernel."""
    args: set[BlockArgument] = set()
    work = list(_free_values([nest.root]))
    seen: set[SSAValue] = set()
    while work:
        v = work.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in fn_args:
            if not isinstance(v.type, (MemRefType, IntegerType, IndexType, Float32Type, Float64Type)):
                raise Unsupported(f"the nest uses a function argument of type {v.type} (kernels take memrefs, "
                                  "integers, index, f32 and f64)")
            args.add(v)  # type: ignore[arg-type]  # scalars become kernel parameters
            continue
        op = v.owner
        if isinstance(op, Operation) and not op.regions and (
            isinstance(op, (arith.ConstantOp, memref.DimOp))
            or (op.dialect_name() == "arith" and is_side_effect_free(op))
        ):
            work.extend(op.operands)
            continue
        if isinstance(op, memref.LoadOp) and op.memref in fn_args and op.parent_block() is nest.root.parent_block():
            # a scalar read before the nest (`%alpha = memref.load %p[%c0]`): every thread
            # reads it again in the kernel, if nothing in between writes memory
            _check_nothing_written_between(op, nest.root)
            nest.outside_loads.append(op)
            work.extend(op.operands)
            continue
        raise Unsupported(f"the nest uses a value defined by '{getattr(op, 'name', '?')}' outside it")
    nest.kernel_args = sorted(args, key=lambda a: a.index)
    for _, ref, _, is_store in _accesses([nest.root]):
        (nest.stored_args if is_store else nest.loaded_args).add(ref)
    for load in nest.outside_loads:
        if load.memref in nest.stored_args:  # type: ignore[attr-defined]
            raise Unsupported(f"the nest writes {_name_of(load.memref)}, which is read before it")  # type: ignore[attr-defined]
        nest.loaded_args.add(load.memref)  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------
# Depth 0: a one-iteration channel loop around the recurrence
# ---------------------------------------------------------------------------


def _capturable(v: SSAValue, fn_args: set[SSAValue]) -> bool:
    """Whether the kernel builder can clone `v` (constants, dims, pure arith)."""
    if v in fn_args:
        return isinstance(v.type, (MemRefType, IntegerType, IndexType, Float32Type, Float64Type))
    op = v.owner
    if not isinstance(op, Operation) or op.regions:
        return False
    if isinstance(op, (arith.ConstantOp, memref.DimOp)) or (
        op.dialect_name() == "arith" and is_side_effect_free(op)
    ):
        return all(_capturable(x, fn_args) for x in op.operands)
    return False


def wrap_depth0(rec: scan.LoopRecurrence) -> scf.ForOp | None:
    """Move a depth-0 recurrence with an alloca state (no channel loop: one long
    sequence) into a one-trip `scf.for` together with the alloca, its initial stores,
    the loads (and pure ops) they need, and the final loads of the state with their
    stores to function arguments (all moved only across ops without memory writes):
    that loop is then an ordinary one-block nest.  None when the recurrence is not of
    that form (nothing changed); `unwrap_depth0` dissolves the loop again."""
    fn = rec.parent_op()
    block = rec.parent_block()
    alloca = rec.state.owner
    if not isinstance(fn, func.FuncOp) or block is None:
        return None
    if not isinstance(alloca, memref.AllocaOp) or alloca.parent_block() is not block:
        return None
    fn_args: set[SSAValue] = set(fn.body.block.args)
    ops = list(block.ops)
    pos = {o: i for i, o in enumerate(ops)}
    r = pos[rec]

    def top(o: Operation) -> Operation:
        while o.parent_block() is not block:
            o = o.parent_op()  # type: ignore[assignment]
        return o

    moved: set[Operation] = {alloca, rec}
    for use in rec.state.uses:
        user = top(use.operation)
        if user is rec or user is alloca:
            continue
        if pos[user] < r and isinstance(user, memref.StoreOp) and user.memref == rec.state:
            moved.add(user)
        elif pos[user] > r and isinstance(user, memref.LoadOp) and user.memref == rec.state:
            moved.add(user)
            for u in user.res.uses:
                st = u.operation
                if not (
                    isinstance(st, memref.StoreOp)
                    and st.parent_block() is block
                    and st.value == user.res
                    and st.memref in fn_args
                ):
                    raise Unsupported("a final value of the state is used other than stored to an argument")
                moved.add(st)
        else:
            raise Unsupported(f"the state is used by '{user.name}' outside the recurrence")

    # Values the moved ops need from the block: capturable ones stay, the rest (loads
    # and pure ops on them) move along, provided nothing else uses them.
    work = _free_values(list(moved))
    while work:
        v = work.pop()
        op = v.owner
        after = isinstance(op, Operation) and op.parent_block() is block and pos[op] > r
        if _capturable(v, fn_args) and not after:
            continue
        if not isinstance(op, Operation) or op.parent_block() is not block:
            raise Unsupported("the recurrence uses a value it cannot take into a kernel")
        if op in moved:
            continue
        if op.regions or not (is_side_effect_free(op) or isinstance(op, memref.LoadOp)):
            raise Unsupported(f"the recurrence needs '{op.name}' from the function body")
        moved.add(op)
        work.extend(op.operands)
    for o in moved:
        for res in o.results:
            if any(top(u.operation) not in moved for u in res.uses):
                raise Unsupported(f"'{o.name}' is also used outside the recurrence")

    # Moving keeps the order of the moved ops; what they move across must not care:
    # no writes before the recurrence, nothing but pure ops after it.
    span = [ops[i] for i in range(min(pos[o] for o in moved), max(pos[o] for o in moved) + 1)]
    for o in span:
        if o in moved:
            continue
        if pos[o] < r and not (is_side_effect_free(o) or isinstance(o, memref.LoadOp)):
            raise Unsupported(f"'{o.name}' between the recurrence's setup and the recurrence writes memory")
        if pos[o] > r and not is_side_effect_free(o):
            raise Unsupported(f"'{o.name}' between the recurrence and its final stores touches memory")

    e = Emitter(InsertPoint.before(rec))
    zero, one = e.index(0), e.index(1)
    body = Block(arg_types=[zero.type])
    for o in span:
        if o in moved:
            o.detach()
            body.add_op(o)
    body.add_op(scf.YieldOp())
    loop = scf.ForOp(zero, one, one, [], body)
    # `e`'s constants went before the original position of `rec`, which now is gone from
    # the block: put the loop right after the last op left of the span.
    Rewriter.insert_op(loop, InsertPoint.after(one.owner))  # type: ignore[arg-type]
    return loop


def unwrap_depth0(loop: scf.ForOp) -> None:
    body = loop.body.block
    for o in list(body.ops)[:-1]:
        o.detach()
        Rewriter.insert_op(o, InsertPoint.before(loop))
    consts = [loop.lb.owner, loop.ub.owner]
    Rewriter.erase_op(loop)
    for c in consts:
        if isinstance(c, Operation) and not any(r.uses for r in c.results):
            Rewriter.erase_op(c)


# ---------------------------------------------------------------------------
# Kernel generation
# ---------------------------------------------------------------------------


@dataclass
class _Split:
    """The ops of a region by what they vary with (see module doc, "Hoisting")."""

    consts: list[Operation]
    hoist: list[Operation]  # neither step nor element
    per_elem: list[Operation]  # element only (coeffs)
    per_step: list[Operation]  # step only (coeffs); everything varying (emit)
    per_both: list[Operation]  # step and element (coeffs)


def _split(
    ops: Sequence[Operation], varying: dict[SSAValue, frozenset[str]], per_elem: bool = True
) -> _Split:
    """Classify `ops`; with `per_elem=False` element-only ops stay in the step loop."""
    dep = dict(varying)
    out = _Split([], [], [], [], [])
    for op in ops:
        if isinstance(op, arith.ConstantOp):
            out.consts.append(op)
            continue
        d: set[str] = set()
        for v in _free_values([op]):
            d |= dep.get(v, frozenset())
        hoistable = (
            (per_elem or "n" not in d)
            and not op.regions
            and (is_side_effect_free(op) or isinstance(op, memref.LoadOp))
            and all(_scalar(r.type) for r in op.results)
        )
        if not hoistable:
            d.add("t")
        for r in op.results:
            dep[r] = frozenset(d)
        if not d:
            out.hoist.append(op)
        elif d == {"n"}:
            out.per_elem.append(op)
        elif d == {"t"}:
            out.per_step.append(op)
        else:
            out.per_both.append(op)
    return out


def _used_by(v: SSAValue, among: set[Operation]) -> bool:
    """Whether some use of `v` is (nested inside) one of `among`."""
    for use in v.uses:
        top: Operation | None = use.operation
        while top is not None and top not in among:
            top = top.parent_op()
        if top is not None:
            return True
    return False


def _needed(ops: Sequence[Operation], among: set[Operation]) -> list[SSAValue]:
    """Results of `ops` that some op of `among` uses."""
    return [r for op in ops for r in op.results if _used_by(r, among)]


@dataclass
class NestKernel:
    """The start of a kernel for a matched nest (`begin_nest_kernel`): what the
    recurrence-specific code needs to go on."""

    nest: _Nest
    kfunc: gpu.FuncOp
    e: Emitter
    vmap: dict[SSAValue, SSAValue]  # nest values -> kernel values
    tid: SSAValue
    priv: SSAValue  # this thread's private state buffer
    state_src: SSAValue  # where the initial state is read (priv, or the state argument)
    trip: SSAValue  # number of steps of the recurrence
    step_index: Callable[[Emitter, SSAValue], SSAValue]  # step number k -> loop index


def begin_nest_kernel(nest: _Nest, name: str, el: Attribute, shape: Sequence[int]) -> NestKernel:
    """A `gpu.func` taking the nest's memref arguments, started with what every
    thread runs first: values captured from outside the nest (constants, dims, pure
    arith), the channel loop variables from the block id (row-major over the trip
    counts), the cloned ops before the inner loops and the prologue, the private
    state buffer and the recurrence's trip count."""
    rec = nest.rec
    types = [a.type for a in nest.kernel_args]
    kfunc = gpu.FuncOp(name, FunctionType.from_lists(types, []), kernel=True)
    kfunc.attributes["gpu.kernel"] = UnitAttr()
    body = kfunc.body.block
    vmap: dict[SSAValue, SSAValue] = {}
    for fa, ka in zip(nest.kernel_args, body.args):
        ka.name_hint = arg_name(nest, fa)
        vmap[fa] = ka
    e = Emitter(body)
    tid = bg._thread_id(e)
    bid = bg._block_id(e)

    # values from outside the nest (constants, dims, pure arith)
    def capture(v: SSAValue) -> None:
        if v in vmap:
            return
        op = v.owner
        assert isinstance(op, Operation), v
        for o in op.operands:
            capture(o)
        e.op(op.clone(value_mapper=vmap))

    for v in _free_values([nest.root]):
        capture(v)

    # channel loop variables from the block id
    trips: list[SSAValue] = [
        e.index(t) if isinstance(t, int) else e.dim(vmap[t[0]], t[1]) for t in nest.trips
    ]
    rest = bid
    ks: list[SSAValue] = [bid] * len(trips)
    for i in range(len(trips) - 1, -1, -1):
        if i == 0:
            ks[i] = rest
        else:
            ks[i] = e.remu(rest, trips[i])
            rest = e.divu(rest, trips[i])
    for loop, k in zip(nest.loops, ks):
        lb, st = _const_int(loop.lb), _const_int(loop.step)
        assert lb is not None and st is not None
        iv = k if st == 1 else e.mul(k, e.index(st))
        iv = iv if lb == 0 else e.add(iv, e.index(lb))
        vmap[loop.body.block.args[0]] = iv
    for pre in nest.outer_pre:
        for op in pre:
            e.op(op.clone(value_mapper=vmap))
    for op in nest.prologue:
        e.op(op.clone(value_mapper=vmap))

    # state buffer (private per thread)
    if nest.state_arg is None:
        priv = vmap[rec.state]
        state_src = priv
    else:
        priv = e.val(memref.AllocaOp.get(el, shape=list(shape)))
        state_src = vmap[nest.state_arg]

    # trip count and step index of the recurrence
    lb_v, ub_v, step_v = vmap[rec.lb], vmap[rec.ub], vmap[rec.step]
    lb_c, step_c, ub_c = _const_int(rec.lb), _const_int(rec.step), _const_int(rec.ub)
    ub_nonneg = (ub_c is not None and ub_c >= 0) or isinstance(rec.ub.owner, memref.DimOp)
    zero, one = e.index(0), e.index(1)
    if lb_c == 0 and step_c == 1 and ub_nonneg:
        trip = ub_v
    else:
        diff = e.sub(ub_v, lb_v)
        q = e.divu(e.add(diff, e.sub(step_v, one)), step_v)
        trip = e.val(arith.SelectOp(e.cmp("sgt", diff, zero), q, zero))

    def step_index(le: Emitter, k: SSAValue) -> SSAValue:
        if lb_c == 0 and step_c == 1:
            return k
        i = k if step_c == 1 else le.mul(k, step_v)
        return i if lb_c == 0 else le.add(i, lb_v)

    return NestKernel(nest, kfunc, e, vmap, tid, priv, state_src, trip, step_index)


def finish_nest_kernel(
    k: NestKernel, n: int, s_c: SSAValue, elem_index: Callable[[Emitter, int], list[SSAValue]]
) -> None:
    """After the last tile: a barrier, then thread 0 copies the final state (`n`
    elements in the shared carry `s_c`) into the state buffer (the state argument at
    depth 0) and runs the cloned epilogue; then `gpu.return`."""
    nest, e = k.nest, k.e
    if nest.state_arg is not None or nest.epilogue:
        e.op(gpu.BarrierOp())

        def finish(ie: Emitter) -> None:
            dest = k.state_src if nest.state_arg is not None else k.priv
            for j in range(n):
                ie.store(ie.load(s_c, [ie.index(j)]), dest, elem_index(ie, j))
            m = dict(k.vmap)
            for op in nest.epilogue:
                ie.op(op.clone(value_mapper=m))

        e.if_(e.cmp("eq", k.tid, e.index(0)), [], finish)
    e.op(gpu.ReturnOp([]))
    _check_closed(k.kfunc)


def arg_name(nest: _Nest, a: BlockArgument) -> str:
    """The kernel argument name of function argument `a` (its name, made unique)."""
    base = a.name_hint or f"arg{a.index}"
    names = [x.name_hint or f"arg{x.index}" for x in nest.kernel_args]
    return base if names.count(base) == 1 else f"{base}_{a.index}"


class _KernelGen:
    def __init__(self, nest: _Nest, name: str, bs: int, ipt: int, keep_pairs: bool | None):
        self.nest, self.name, self.bs, self.ipt = nest, name, bs, ipt
        rec = nest.rec
        st = rec.state_type
        self.el = st.element_type
        self.shape = tuple(st.get_shape())
        self.n = math.prod(self.shape)
        self.pairs = PairArith(self.el)
        size = bg.byte_size(self.el)
        self.group = max(1, min(self.n, SWEEP_SHARED_BUDGET // (2 * bs * size)))
        self.keep = (2 * self.n * ipt <= KEEP_PAIRS_REGISTERS) if keep_pairs is None else keep_pairs
        self.shared_bytes = (2 * self.group * bs + self.n) * size

    def elem_index(self, e: Emitter, n: int) -> list[SSAValue]:
        idx = []
        for extent in reversed(self.shape):
            idx.append(n % extent)
            n //= extent
        return [e.index(i) for i in reversed(idx)]

    # -- the kernel ---------------------------------------------------------------------
    def build(self) -> gpu.FuncOp:
        nest, rec, bs, ipt = self.nest, self.nest.rec, self.bs, self.ipt
        k_ = begin_nest_kernel(nest, self.name, self.el, self.shape)
        kfunc, e, vmap, tid = k_.kfunc, k_.e, k_.vmap, k_.tid
        priv, state_src, trip, step_index = k_.priv, k_.state_src, k_.trip, k_.step_index
        pairs, el = self.pairs, self.el
        zero, one = e.index(0), e.index(1)
        g_rows = self.group * bs
        s_a = e.val(memref.GetGlobalOp(f"{self.name}_sA", MemRefType(el, [g_rows], memory_space=bg.SHARED_SPACE)))
        s_b = e.val(memref.GetGlobalOp(f"{self.name}_sB", MemRefType(el, [g_rows], memory_space=bg.SHARED_SPACE)))
        s_c = e.val(memref.GetGlobalOp(f"{self.name}_sC", MemRefType(el, [self.n], memory_space=bg.SHARED_SPACE)))

        # thread 0: initial state -> carry
        def init_carry(ie: Emitter) -> None:
            for n in range(self.n):
                ie.store(ie.load(state_src, self.elem_index(ie, n)), s_c, [ie.index(n)])

        e.if_(e.cmp("eq", tid, zero), [], init_carry)

        # -- split the regions, hoist the invariant parts ------------------------------------
        cblock, eblock = rec.coeffs.block, rec.emit.block
        t_c, k_c = cblock.args[0], list(cblock.args[1:])
        t_e, s_e = eblock.args
        coeffs_ops = list(cblock.ops)[:-1]
        emit_ops = list(eblock.ops)[:-1]
        y_a, y_b = cblock.last_op.operands  # type: ignore[union-attr]
        cvary = {t_c: frozenset("t"), **{k: frozenset("n") for k in k_c}}
        cs = _split(coeffs_ops, cvary)
        if len(_needed(cs.per_elem, set(cs.per_both) | {cblock.last_op})) * self.n > HOIST_PER_ELEMENT_REGISTERS:
            cs = _split(coeffs_ops, cvary, per_elem=False)  # reload them per step instead
        es = _split(emit_ops, {t_e: frozenset("t"), s_e: frozenset("t")})
        for op in cs.consts + es.consts:
            e.op(op.clone(value_mapper=vmap))
        base = vmap
        nmaps: list[dict[SSAValue, SSAValue]] = [{} for _ in range(self.n)]
        hoisted = cs.hoist + es.hoist
        if hoisted or cs.per_elem:
            later = set(cs.per_step + cs.per_both + es.per_step) | {cblock.last_op}
            need_i = _needed(hoisted, later | set(cs.per_elem))
            need_n = _needed(cs.per_elem, later)
            out_types = [v.type for v in need_i] + [v.type for v in need_n] * self.n

            def hoist(ie: Emitter) -> list[SSAValue]:
                m = dict(vmap)
                for op in hoisted:
                    ie.op(op.clone(value_mapper=m))
                res = [m[v] for v in need_i]
                for n in range(self.n):
                    mn = {**m, **dict(zip(k_c, self.elem_index(ie, n)))}
                    for op in cs.per_elem:
                        ie.op(op.clone(value_mapper=mn))
                    res += [mn[v] for v in need_n]
                return res

            def skip(ie: Emitter) -> list[SSAValue]:
                return [ie.const(0, t) for t in out_types]

            vals = list(e.if_(e.cmp("sgt", trip, zero), out_types, hoist, skip)) if out_types else []
            base = dict(vmap)
            base.update(zip(need_i, vals[: len(need_i)]))
            pos = len(need_i)
            for n in range(self.n):
                nmaps[n] = dict(zip(need_n, vals[pos : pos + len(need_n)]))
                pos += len(need_n)

        # values of the step-only part that the replay needs (recompute mode)
        frontier = [] if self.keep else _needed(cs.per_step, set(cs.per_both) | {cblock.last_op})
        for v in frontier:
            if not _scalar(v.type):
                raise Unsupported("coeffs passes a non-scalar value between its parts")

        def elem_map(ie: Emitter, m: dict[SSAValue, SSAValue], n: int) -> dict[SSAValue, SSAValue]:
            return {**m, **nmaps[n], **dict(zip(k_c, self.elem_index(ie, n)))}

        def pair_values(ie: Emitter, m: dict[SSAValue, SSAValue]) -> tuple[list[SSAValue], list[SSAValue]]:
            a_s, b_s = [], []
            for n in range(self.n):
                mn = elem_map(ie, m, n)
                for op in cs.per_both:
                    ie.op(op.clone(value_mapper=mn))
                a_s.append(pairs.widen(ie, mn[y_a]))
                b_s.append(pairs.widen(ie, mn[y_b]))
            return a_s, b_s

        tile = e.index(bs * ipt)
        ntiles = e.divu(e.add(trip, e.index(bs * ipt - 1)), tile)
        thread_base = e.mul(tid, e.index(ipt))
        last_k = e.sub(trip, one)
        nf = len(frontier)
        f_types = [v.type for v in frontier]
        last_stores = nest.last_stores

        guard = bg.needs_overflow_guard(el, bs)
        one_group = self.group >= self.n

        def tree_prefix(ie: Emitter, comps: list[int]) -> list[SSAValue]:
            """The down-sweep's entering states of this thread for a group's components."""
            return [ie.load(s_b, [ie.add(tid, ie.index(c * bs)) if c else tid]) for c in range(len(comps))]

        def tile_body(le: Emitter, tl: SSAValue, _: Sequence[SSAValue]) -> None:
            start = le.add(le.mul(tl, tile), thread_base)
            # 1. this thread's pairs for all state elements; fold into aggregates.
            items = []
            agg_a: list[SSAValue] = []
            agg_b: list[SSAValue] = []
            for j in range(ipt):
                k = le.add(start, le.index(j)) if j else start
                inside = le.cmp("ult", k, trip)

                def produce(ie: Emitter, k: SSAValue = k) -> list[SSAValue]:
                    m = {**base, t_c: step_index(ie, k)}
                    for op in cs.per_step:
                        ie.op(op.clone(value_mapper=m))
                    a_s, b_s = pair_values(ie, m)
                    return [*(m[v] for v in frontier), *a_s, *b_s]

                def pad(ie: Emitter) -> list[SSAValue]:
                    ident = pairs.identity(ie)
                    return [*(ie.const(0, t) for t in f_types), *[ident[0]] * self.n, *[ident[1]] * self.n]

                res = list(le.if_(inside, f_types + [el] * (2 * self.n), produce, pad))
                f_vals, a_s, b_s = res[:nf], res[nf : nf + self.n], res[nf + self.n :]
                items.append((k, inside, f_vals, a_s, b_s))
                if j == 0:
                    agg_a, agg_b = a_s, b_s
                else:
                    folded = [pairs.combine(le, (agg_a[n], agg_b[n]), (a_s[n], b_s[n])) for n in range(self.n)]
                    agg_a, agg_b = [x for x, _ in folded], [y for _, y in folded]

            # 2. exclusive scan of the aggregates, component groups of `self.group`.
            prefix: list[SSAValue] = []
            flags: list[SSAValue] = []
            for g0 in range(0, self.n, self.group):
                comps = list(range(g0, min(self.n, g0 + self.group)))
                slots = []
                for c, n in enumerate(comps):
                    slot = le.add(tid, le.index(c * bs)) if c else tid
                    le.store(agg_a[n], s_a, [slot])
                    le.store(agg_b[n], s_b, [slot])
                    slots.append((s_a, s_b, c * bs))
                bg.blelloch_up_sweep(le, pairs, tid, bs, slots)

                def seed(ie: Emitter, comps: list[int] = comps) -> None:
                    if guard:  # overflow guard: the group's roots, flag in its first a slot
                        roots = [ie.load(s, [ie.index(c * bs + bs - 1)]) for c in range(len(comps)) for s in (s_a, s_b)]
                        bg.flag_tile_root(ie, roots, s_a, bs - 1)
                    for c, n in enumerate(comps):
                        ie.store(ie.load(s_c, [ie.index(n)]), s_b, [ie.index(c * bs + bs - 1)])

                le.if_(le.cmp("eq", tid, zero), [], seed)
                bg.blelloch_down_sweep(
                    le, pairs, tid, bs, slots,
                    after_first_barrier=(lambda ie: flags.append(bg.read_tile_flag(ie, s_a, bs - 1))) if guard else None,
                )
                if not (guard and one_group):  # else loaded where used (not live across the fallback)
                    prefix += tree_prefix(le, comps)

            # A tile whose aggregates are not all finite takes its entering states in the
            # loop's own order instead (blelloch_gpu, overflow guard).
            if guard:
                bad = flags[0]
                for f in flags[1:]:
                    bad = le.val(arith.OrIOp(bad, f))

                def own_steps(ie: Emitter, h: Sequence[SSAValue]) -> list[SSAValue]:
                    h = list(h)
                    for k, inside, _f, a_s, b_s in items:

                        def step(te: Emitter, k=k, a_s=a_s, b_s=b_s, h=h) -> list[SSAValue]:
                            if self.keep:
                                pa, pb = a_s, b_s
                            else:
                                # from the loads again, not from the kept step values: that
                                # keeps LLVM from hoisting N * items_per_thread pairs out of
                                # the turn loop (the loads cannot cross its barriers)
                                m = {**base, t_c: step_index(te, k)}
                                for op in cs.per_step:
                                    te.op(op.clone(value_mapper=m))
                                pa, pb = pair_values(te, m)
                            return [pairs.apply(te, pa[n], h[n], pb[n]) for n in range(self.n)]

                        h = list(ie.if_(inside, [el] * self.n, step, lambda te, h=h: h))
                    return h

                def store_carry(ie: Emitter, h: Sequence[SSAValue]) -> None:
                    for n in range(self.n):
                        ie.store(h[n], s_c, [ie.index(n)])

                def keep_own(ie: Emitter, h: Sequence[SSAValue]) -> None:
                    for n in range(self.n):  # the thread's own down-sweep slots, free now
                        ie.store(h[n], s_b, [ie.add(tid, ie.index(n * bs)) if n else tid])

                def exact(ie: Emitter) -> list[SSAValue]:
                    return bg.sequential_entry_states(
                        ie, tid, bs, [el] * self.n,
                        lambda te, j: [te.load(s_c, [te.index(n)]) for n in range(self.n)],
                        own_steps, store_carry,
                        keep_in=(keep_own, lambda te: tree_prefix(te, list(range(self.n)))) if one_group else None,
                    )

                tree = (lambda ie: tree_prefix(ie, list(range(self.n)))) if one_group else (lambda ie: prefix)
                prefix = list(le.if_(bad, [el] * self.n, exact, tree))

            # 3. replay: in-range steps update h and run the emit on the private state.
            h = prefix
            for k, inside, f_vals, a_s, b_s in items:

                def replay(
                    ie: Emitter, k=k, f_vals=f_vals, a_s=a_s, b_s=b_s, h=h
                ) -> list[SSAValue]:
                    i = step_index(ie, k)
                    if self.keep:
                        pa, pb = a_s, b_s
                    else:
                        pa, pb = pair_values(ie, {**base, t_c: i, **dict(zip(frontier, f_vals))})
                    new_h = [pairs.apply(ie, pa[n], h[n], pb[n]) for n in range(self.n)]
                    for n in range(self.n):
                        ie.store(new_h[n], priv, self.elem_index(ie, n))
                    is_last = ie.cmp("eq", k, last_k) if last_stores else None
                    me = {**base, t_e: i, s_e: priv}
                    for op in es.per_step:
                        new = ie.op(op.clone(value_mapper=me))
                        if last_stores:
                            _guard_last(op, new, last_stores, is_last)
                    return new_h

                h = list(le.if_(inside, [el] * self.n, replay, lambda ie, h=h: h))

            # 4. the last thread's final state is the next tile's carry.
            def publish(ie: Emitter, h: list[SSAValue] = h) -> None:
                for n in range(self.n):
                    ie.store(h[n], s_c, [ie.index(n)])

            le.if_(le.cmp("eq", tid, e.index(bs - 1)), [], publish)

        e.for_(zero, ntiles, one, [], tile_body)

        finish_nest_kernel(k_, self.n, s_c, self.elem_index)
        return kfunc


def _guard_last(orig: Operation, new: Operation, last_stores: set[Operation], cond: SSAValue) -> None:
    """Wrap the clones of step-invariant emit stores in `scf.if (last step)`."""
    for o, c in zip(orig.walk(), new.walk()):
        if o in last_stores:
            block = Block()
            if_op = scf.IfOp(cond, [], Region(block))
            Rewriter.insert_op(if_op, InsertPoint.before(c))
            c.detach()
            block.add_op(c)
            block.add_op(scf.YieldOp())


def _check_closed(kfunc: gpu.FuncOp) -> None:
    inside = _defined_inside([kfunc])
    for o in kfunc.walk():
        for v in o.operands:
            if v not in inside:
                raise AssertionError(f"recurrence kernel: '{o.name}' uses a value from outside the kernel")


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def _kernel_name(top: ModuleOp, base: str) -> str:
    for op in top.ops:
        if isinstance(op, gpu.ModuleOp) and op.sym_name.data == bg.KERNEL_MODULE:
            return bg._unique_name(op, base)
    return f"{base}_0"


def lower_recurrence(
    rec: scan.RecurrenceOp,
    top: ModuleOp,
    block_size: int,
    items_per_thread: int,
    keep_pairs: bool | None = None,
) -> None:
    """Lower one `scan.recurrence` and its loop nest, or raise `Unsupported` (leaving
    the IR as it was).  Without channel loops (one long sequence) the recurrence is
    wrapped into a one-trip loop first: one block runs it."""
    wrapper = wrap_depth0(rec)
    try:
        nest = match_recurrence(rec)
        name = _kernel_name(top, "scan_recurrence")
        gen = _KernelGen(nest, name, block_size, items_per_thread, keep_pairs)
        kfunc = gen.build()
    except Unsupported:
        if wrapper is not None:
            unwrap_depth0(wrapper)
        raise

    # -- commit: kernel, shared arrays, launch -----------------------------------------------
    kmod = bg.get_kernel_module(top)
    rows = gen.group * block_size
    bg.shared_global(kmod, f"{name}_sA", gen.el, rows)
    bg.shared_global(kmod, f"{name}_sB", gen.el, rows)
    bg.shared_global(kmod, f"{name}_sC", gen.el, gen.n)
    kmod.body.block.add_op(kfunc)

    launch_nest_kernel(
        nest,
        kfunc,
        block_size,
        gen.shared_bytes,
        notes=(
            f"scan.recurrence over "
            f"{'no channel loop (one block)' if wrapper is not None else f'{len(nest.loops)} channel loop(s)'}, state "
            f"{'x'.join(map(str, gen.shape)) or 'scalar'} {gen.el}; block_size={block_size} "
            f"items_per_thread={items_per_thread}; fused coeffs/emit, "
            f"{'kept' if gen.keep else 'recomputed'} pairs, {gen.group} components per sweep"
        ),
    )


def _covered_sizes(nest: _Nest, names: dict[SSAValue, str]) -> tuple[tuple[str, int, str, int], ...]:
    """(arg, dim, other, dim'): wherever a loop running over `other.shape[dim']` (a
    channel loop, or the recurrence from 0 step 1) indexes `arg` at `dim` directly,
    `arg` must be at least that large, or the kernel would read or write past it."""
    loops: dict[SSAValue, tuple[BlockArgument, int]] = {}
    for loop, trip in zip(nest.loops, nest.trips):
        if not isinstance(trip, int):
            loops[loop.body.block.args[0]] = trip
    rec = nest.rec
    bound = _arg_dim(rec.ub, set(names))
    if bound is not None and _const_int(rec.lb) == 0 and _const_int(rec.step) == 1:
        for region in (rec.coeffs, rec.emit):
            loops[region.block.args[0]] = bound
    out: set[tuple[str, int, str, int]] = set()
    for _, ref, idx, _ in _accesses([nest.root]):
        if ref not in names:
            continue
        for pos, x in enumerate(idx):
            if x in loops:
                other, dim = loops[x]
                if (ref, pos) != (other, dim):
                    out.add((names[ref], pos, names[other], dim))
    return tuple(sorted(out))


def launch_nest_kernel(nest: _Nest, kfunc: gpu.FuncOp, block_size: int, shared_bytes: int, notes: str) -> None:
    """Replace the nest by the launch of `kfunc` (one block per channel iteration) and
    attach its launch description."""
    name = kfunc.sym_name.data
    args = nest.kernel_args
    names = [arg_name(nest, a) for a in args]
    static = all(isinstance(t, int) for t in nest.trips)
    host = Emitter(InsertPoint.before(nest.root))
    if static:
        grid0: int | str = math.prod(nest.trips)  # type: ignore[arg-type]
    else:
        grid0 = "*".join(
            str(t) if isinstance(t, int) else f"{names[args.index(t[0])]}.shape[{t[1]}]" for t in nest.trips
        )
    # the host IR's grid comes from the description's formula (one formula for both)
    nblocks = bg.emit_grid_size(host, grid0, dict(zip(names, args))) if grid0 != 0 else None
    if nblocks is not None:
        one = host.index(1)
        host.op(
            gpu.LaunchFuncOp(
                SymbolRefAttr(bg.KERNEL_MODULE, [name]),
                [nblocks, one, one],
                [host.index(block_size), one, one],
                kernelOperands=list(args),
            )
        )

    def kind(a: SSAValue) -> str:
        w, r = a in nest.stored_args, a in nest.loaded_args
        return "inout" if w and r else "out" if w else "in"

    desc = KernelLaunch(
        kernel_name=name,
        module_name=bg.KERNEL_MODULE,
        func_name=nest.fn.sym_name.data,
        grid=(grid0, 1, 1),
        block=(block_size, 1, 1),
        shared_bytes=shared_bytes,
        args=[
            (n, kind(a), bg.type_name(a.type.element_type), bg._shape_entries(a.type))  # type: ignore[attr-defined]
            if isinstance(a.type, MemRefType)
            else (n, "scalar", bg.type_name(a.type), ())
            for n, a in zip(names, args)
        ],
        host_args=tuple(a.index for a in args),
        covers_dims=_covered_sizes(nest, dict(zip(args, names))),
        notes=notes,
    )
    kfunc.attributes["scanweaver.launch"] = desc.to_attr()
    Rewriter.erase_op(nest.root)
    for load in nest.outside_loads:  # now read in the kernel; the host keeps only launches
        if not load.results[0].uses:
            Rewriter.erase_op(load)


def lower_recurrences(
    top: ModuleOp, block_size: int, items_per_thread: int, keep_pairs: bool | None = None
) -> dict[scan.RecurrenceOp, str]:
    """Lower every matching `scan.recurrence`; returns why the others were left alone."""
    skipped: dict[scan.RecurrenceOp, str] = {}
    for rec in [o for o in top.walk() if isinstance(o, scan.RecurrenceOp)]:
        try:
            lower_recurrence(rec, top, block_size, items_per_thread, keep_pairs)
        except Unsupported as why:
            skipped[rec] = str(why)
    return skipped


__all__ = ["Unsupported", "lower_recurrence", "lower_recurrences", "match_recurrence"]
