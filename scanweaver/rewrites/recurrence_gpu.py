"""`scan-to-gpu` for `scan.recurrence`: one fused producer/scan/consumer kernel per nest.

`ScanToGpu` calls `lower_recurrences(module, block_size, items_per_thread)`; every
`scan.recurrence` that matches below becomes one `gpu.func` plus one `gpu.launch_func`
replacing its whole loop nest. Nothing of a, b or h (batch x D x N x L for the Mamba
selective scan) goes to global memory: coefficients are produced in registers from the
cloned `coeffs` region, scanned, and consumed in registers by the cloned `emit` region.
Anything that does not match is left unchanged, for the sequential lowering.

What matches
------------
(Matched by `gpu_nest.match_recurrence`, shared with `linear_gpu.py`, like the kernel's
entry, exit and launch.)

    func.func @f(...memref args...) {
      scf.for %b ... {                 channel loops (depth >= 0, no iter_args); their
        scf.for %d ... {               bodies before the inner loop: pure ops and loads
          prologue                     e.g. %h = memref.alloca; zero fill / copy from h0
          scan.recurrence ... state(%h) coeffs {...} emit {...}
          epilogue                     e.g. copy %h out to last_state[b, d, :]
    } } }

* Channel loop bounds: constants, or `0 to memref.dim(%arg, c) step 1` (a dynamic grid
  term `arg.shape[c]` in the launch description), or a constant `lb >= 0` to that size
  with a constant step (the term `span(arg.shape[c],lb,step)`, never negative). The state is a static-shape
  `memref.alloca` of the innermost body (per channel iteration), at most 64 elements
  (beyond 32, one item per thread and the emit's loops over the state unrolled here:
  the selective scan at N = 64 then assembles without spills); a state of dynamic
  shape or of more than 64 elements is first split into one channel per element
  (`gpu_split_state.py`) where emit reads it element by element;
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
  sequential loop does. The prologue writes only its own allocas, apart from stores
  that set an element before the loop (`y[c, 0] = h0` with the time loop from 1): those
  move after the recurrence, into the epilogue, when nothing after them reads that
  memref and emit provably never writes that element (`_defer_prologue_stores`).
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
  loops' trip counts (row-major), like the scan.affine kernel's channels. Few long
  channels (`time_blocks`) go to `recurrence_time_blocks.py` instead, which runs this
  kernel's steps over one time chunk per block (`_tiles(t_begin, t_end)`). Every thread
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
* Scan with warp shuffles (f32, f64, i32, i64 states of at most 32 registers, e.g. the
  selective scan up to N = 32; `WARP_SHUFFLE_SCANS`): instead of the sweeps, each state
  element's aggregates are scanned inside each warp by Kogge-Stone (`gpu.shuffle up`,
  blelloch_gpu's helpers); the last lane of each warp posts its N totals to shared
  `sA`, `sB` (N x warps, component-major), one barrier, and every thread folds the
  totals of the warps before its own onto the carry (a loop over those warps: the
  totals are loaded as used, not all live at once). A thread's entering state is its
  previous lane's state after that lane's steps (one shuffle per element). The carry
  is in registers; the last thread's final state goes through `sC` and a second
  barrier (2 barriers per tile), or in a block of one warp moves by `shuffle idx` (no
  barrier). Overflow verdict as in the affine kernel: a lane with a non-finite
  inclusive aggregate flags its warp (xor butterfly), a flagged warp posts a NaN
  total, every thread checks all warps' flag slots; flagged tiles take the loop's
  order thread after thread (the entering states in registers, the first from the
  carry). Larger states keep the sweep, their aggregates staged in shared memory (N =
  64: no spills that way). Full tiles read the per-step operands (u, delta, z) with
  16-byte vector loads and write the emit's step outputs with vector stores, for
  states of at most `VECTOR_STEP_IO_MAX_STATE` elements (`recurrence_vector_io.py`).
* B and C once per tile (`VECTOR_ELEMENT_IO`, states of 4 to 32 elements): the
  per-element step operands (Mamba's B[b, n, t] in coeffs, C[b, n, t] in the emit's
  dot product over the state) are one 16-byte vector per element and thread in a full
  tile (coalesced: a warp reads 512 consecutive bytes of a row), guarded scalars in the
  others. B goes from inside the load branches to a per-thread shared stage `sS`
  (`_stage_element_loads`: its own slots, no barrier) that phase 1, the overflow
  fallback and the replay read, so B leaves global memory once per tile instead of
  twice; C is read just before the replay, the emit's loop over the state unrolled so
  each term takes its lane. ptxas, selective scan N = 16, 128 x 4: 128 registers as
  before, 0 spills, 32 KiB more shared memory (still 4 resident blocks, limited by
  registers). Where the whole stage would pass 48 KiB of static shared memory (N = 24,
  32 at 128 x 4; 256 threads at N = 16) the elements that fit are staged (N = 24: 23
  of 24, N = 32: 23 of 32), the others keep their scalar loads, read again by the
  replay. Not staged below `STAGE_MIN_ELEMENTS` (N = 3: 7 more registers), at N = 7 (the
  same), or above
  `STAGE_MAX_ELEMENTS` (N = 64, one item per thread: 37 more registers) unless the
  element-only values (A) are in the block's shared copy (`STAGE_MAX_ELEMENTS_SHARED_COPY`,
  N = 64: 31 of 64 staged, no more registers): elsewhere B keeps
  its scalar loads (B vectors whose values leave the load branch cost 40 registers at
  N = 16 and spill at N = 32). C is loaded by vectors up to
  `VECTOR_ELEMENT_IO_MAX_STATE` elements, by scalars (once per tile all the same) beyond.
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
  static shared memory (2 G block_size + N) * sizeof(state) with the sweep, 2 N
  (block_size / 32) + N elements with warp shuffles (16-byte aligned globals); a `scanweaver.launch`
  description on the kernel; the host function keeps only constants, index
  arithmetic and the launch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from xdsl.dialects import arith, gpu, memref
from xdsl.dialects.builtin import Float64Type, MemRefType, ModuleOp, f32
from xdsl.ir import Attribute, Operation, SSAValue

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites import recurrence_vector_io as vio
from scanweaver.rewrites.affine_to_pairs import Emitter, PairArith
from scanweaver.rewrites.gpu_kernel import (
    Unsupported,
    kernel_name,
    refuse_i1_memrefs,
    shared_layout_bytes,
    unroll_loops_over,
)
from scanweaver.rewrites.gpu_nest import (
    MAX_STATE,
    Nest,
    NestKernel,
    begin_nest_kernel,
    finish_nest_kernel,
    guard_last_stores,
    is_scalar_type,
    launch_nest_kernel,
    match_recurrence,
    needed_values,
    split_by_dependence,
    unwrap_depth0,
    wrap_depth0,
)
from scanweaver.rewrites.complex_gpu import component_words, state_words
from scanweaver.rewrites.gpu_split_state import needs_split, split_state

#: States up to this size are indexed by constants after LLVM's own full unroll.
UNROLL_BY_LLVM = 32
#: The most f64 values in a state the kernel takes: beyond, ptxas spills on sm_80 and
#: sm_90 at every option tried (selective scan N = 24 f64, one item per thread, by the
#: sweep, B staged or not, C by vectors or not, smaller sweep groups: 16 to 96 spill
#: stores; N = 32: up to 808), the f64 `exp`, softplus and pairs taking two registers per
#: value. Such a recurrence is refused (the function runs on the CPU).
MAX_F64_STATE = 16
#: ... and the most register words (`register_words`) of any state: 64 i64 values (256
#: words) spill 96 to 260 bytes (ptxas sm_80 / sm_90, the selective scan's loop without
#: exp); 32 i64 values, 64 f32 and 16 complex<f64> (128 words at most) do not.
MAX_STATE_REGISTER_WORDS = 128
#: Shared memory for the sweep arrays sA + sB (bytes); components go in groups beyond.
SWEEP_SHARED_BUDGET = 32 * 1024
#: Hoist element-only coefficient values (N copies each) when they fit in this many registers.
HOIST_PER_ELEMENT_REGISTERS = 32
#: Beyond that, hoist them into one shared array of the block (`_hoist_invariants`) when
#: it takes at most this many bytes, instead of loading them again at every step (the
#: selective scan's A[d, n] at N = 64: 256 of its 1305 bytes moved per element).
HOIST_PER_ELEMENT_SHARED_BYTES = 4 * 1024
#: Keep phase-1 pairs in registers for the replay when 2 * N * items <= this.
KEEP_PAIRS_REGISTERS = 16
#: In-tile scans by warp shuffles for the state types `gpu.shuffle` moves (False: the
#: shared-memory sweep for every type, as for the others; tests of the sweep set it).
WARP_SHUFFLE_SCANS = True
#: 16-byte vector loads / stores of the per-step operands in full tiles
#: (`recurrence_vector_io.py`; False: scalar accesses everywhere).
VECTOR_STEP_IO = True
#: ... for states of at most this many elements. Beyond, the per-element loads (Mamba's
#: B and C, 2 N of the 2 N + 3 loads of a step) dominate the traffic while the vectors
#: cost registers (ptxas, selective scan N = 16, 128 x 4: 150 registers with them, 128
#: without: 3 resident blocks instead of 4).
VECTOR_STEP_IO_MAX_STATE = 4
#: The per-element step operands (Mamba's B[b, n, t] in coeffs, C[b, n, t] in the emit's
#: dot product) by 16-byte vectors in full tiles, once per tile (`recurrence_vector_io`,
#: element runs); False: cloned scalar loads per item (and B again in the replay).
VECTOR_ELEMENT_IO = True
#: ... for states of at most this many elements (C; B is staged up to
#: `STAGE_MAX_ELEMENTS`, `_stage_element_loads`): the C vectors' 4 N values are live at
#: the replay's start (ptxas, selective scan, 128 x 4: N = 16 128 registers either way;
#: N = 20 151 to 168; N = 24 168 to 194, 3 resident blocks to 2).
VECTOR_ELEMENT_IO_MAX_STATE = 16
#: Stage the coefficients' element loads (B) in shared memory for the replay and the
#: overflow fallback, instead of loading them from global memory again, when the block's
#: static shared memory stays within this many bytes.
STAGE_ELEMENT_LOADS_BUDGET = 48 * 1024
#: ... for states of at least this many elements (module doc, `_stage_element_loads`;
#: ptxas, selective scan 128 x 4, sm_80 / sm_90: N = 4 65 / 64 registers to 64 / 64, N = 5
#: 56 / 56 to 56 / 48, N = 6 64 to 56, 0 spills; N = 3 50 to 57 on sm_90, 9 resident
#: blocks to 8) ...
STAGE_MIN_ELEMENTS = 4
#: ... except these (ptxas sm_90, N = 7: 64 to 71 registers, 8 resident blocks to 7).
STAGE_SKIP_ELEMENTS = frozenset({7})
#: ... and at most this many (ptxas sm_90, selective scan N = 64, one item per thread:
#: staging the 31 elements that fit costs 168 to 205 registers, 3 resident blocks to 2,
#: while A is loaded from global memory at every step) ...
STAGE_MAX_ELEMENTS = 32
#: ... or this many where the element-only values are in the block's shared copy
#: (`_hoist_elements_to_shared`; ptxas sm_80 and sm_90, N = 64 with A there: 168
#: registers staged or not, 0 spills, 48 KiB of shared memory, 3 resident blocks).
STAGE_MAX_ELEMENTS_SHARED_COPY = 64


#: the value of element load `op` for element n (None: the load is cloned)
ElementValue = Callable[[Operation, int], "SSAValue | None"]


class _Item:
    """One step of a thread's tile (phase 1): its step number, whether it is in range,
    the step-only values the replay needs and its N pairs."""

    def __init__(self, k: SSAValue, inside: SSAValue, f_vals: list[SSAValue], a_s: list[SSAValue], b_s: list[SSAValue]):
        self.k, self.inside, self.f_vals, self.a_s, self.b_s = k, inside, f_vals, a_s, b_s


class _KernelGen:
    """Builds the fused kernel of one matched nest (module doc, "Kernel design"); the
    steps below share the kernel's values through the instance."""

    #: element runs (B, C by vectors) in this kernel (and in the time-block kernels)
    element_runs = True
    #: element-only values beyond the registers' budget in shared memory (`_hoist_invariants`)
    elements_in_shared = True
    #: B staged up to this many elements where those values are in shared memory
    stage_max_shared_copy = STAGE_MAX_ELEMENTS_SHARED_COPY
    #: B staged from this many elements (`_stage_element_loads`)
    stage_min = STAGE_MIN_ELEMENTS

    def __init__(self, nest: Nest, name: str, bs: int, ipt: int, keep_pairs: bool | None):
        self.nest, self.name, self.bs, self.ipt = nest, name, bs, ipt
        rec = nest.rec
        st = rec.state_type
        self.el = st.element_type
        self.shape = tuple(st.get_shape())
        self.n = math.prod(self.shape)
        self.words = self.n * register_words(self.el)  # what the state costs in registers
        self.pairs = PairArith(self.el)
        size = bg.byte_size(self.el)
        self.group = max(1, min(self.n, SWEEP_SHARED_BUDGET // (2 * bs * size)))
        self.keep = (2 * self.words * ipt <= KEEP_PAIRS_REGISTERS) if keep_pairs is None else keep_pairs
        # warp shuffles for the state types `gpu.shuffle` moves, up to 32 register words
        # of state; the sweep for the others, and beyond (its aggregates staged in shared
        # memory: ptxas, selective scan N = 64, one item per thread: 12 spill bytes with
        # shuffles, none with the sweep; N = 16 f64, sm_90: 28 with shuffles, none with
        # the sweep)
        self.warp = WARP_SHUFFLE_SCANS and bg.shuffles(self.el) and self.words <= UNROLL_BY_LLVM
        self.nw = bs // bg.WARP if bs > bg.WARP else 0  # warps posting totals (0: one warp)
        if self.warp:
            self.sweep_rows = self.nw * self.n  # the warp totals, component-major
            sizes = [self.sweep_rows * size] * 2 if self.sweep_rows else []
            self.shared_bytes = shared_layout_bytes(sizes + [self.n * size])
        else:
            self.sweep_rows = self.group * bs
            self.shared_bytes = (2 * self.group * bs + self.n) * size

    def elem_ints(self, n: int) -> list[int]:
        idx = []
        for extent in reversed(self.shape):
            idx.append(n % extent)
            n //= extent
        return idx[::-1]

    def elem_index(self, e: Emitter, n: int) -> list[SSAValue]:
        return [e.index(i) for i in self.elem_ints(n)]

    # -- the kernel ---------------------------------------------------------------------
    def build(self) -> gpu.FuncOp:
        k_ = begin_nest_kernel(self.nest, self.name, self.el, self.shape)
        self._start(k_)
        self.e.if_(self.e.cmp("eq", self.tid, self.zero), [], self._init_carry)
        self._prepare()
        self._tiles(self.zero, self.trip)
        finish_nest_kernel(k_, self.n, self.s_c, self.elem_index)
        return k_.kfunc

    def _start(self, k_: NestKernel) -> None:
        """Take the kernel's common values from `begin_nest_kernel`; the shared arrays."""
        self.priv = k_.priv
        self.e, self.vmap, self.tid = k_.e, k_.vmap, k_.tid
        self.state_src, self.trip, self.step_index = k_.state_src, k_.trip, k_.step_index
        self.zero, self.one = self.e.index(0), self.e.index(1)
        self._shared_arrays()

    def _prepare(self) -> None:
        self._split_regions()
        self._hoist_invariants()
        self._step_frontier()
        self.load_runs, self.emit_runs, self.store_runs = (
            vio.find_step_runs(self.nest, self.cs.per_step, self.cs.per_both, self.es.per_step, self.t_c,
                               self.t_e, self.ipt)
            if VECTOR_STEP_IO and self.words <= VECTOR_STEP_IO_MAX_STATE else ([], [], [])
        )
        self.pre: list[dict] | None = None  # this tile's preloaded step values, per item
        self.b_runs: list[vio.StepRun] = []
        self.unroll_emit: set = set()
        self.stage_rows = 0
        self.keep_b_vectors = True  # kept pairs: B's vectors used by phase 1 directly
        if VECTOR_ELEMENT_IO and self.element_runs:
            elements = [self.elem_ints(n) for n in range(self.n)]
            self.b_runs, c_runs, self.unroll_emit = vio.find_element_runs(
                self.nest, self.cs.per_step, self.cs.per_both, self.es.per_step, self.t_c, self.k_c, elements,
                self.t_e, self.ipt, emit=self.n <= VECTOR_ELEMENT_IO_MAX_STATE)
            if self.n > VECTOR_ELEMENT_IO_MAX_STATE or any(r.vec == 1 for r in self.b_runs):
                self.keep_b_vectors = False  # staged or scalar (module doc)
            self.load_runs = self.load_runs + self.b_runs
            self.emit_runs = self.emit_runs + c_runs
            self._stage_element_loads()

    def _stage_element_loads(self) -> None:
        """Where the tile's B values live between phase 1 and the replay, so that B is
        read from global memory once per tile: in shared `sS`, each thread's values at
        `(run * ipt + item) * bs + tid` (its own slots: no barrier; conflict-free),
        written from inside the load branches (not all the tile's values live at once)
        and read by phase 1, the replay and the overflow fallback. Where not all runs
        fit, the first ones that do (element order; N = 24, 32); outside
        `STAGE_MIN_ELEMENTS`..`STAGE_MAX_ELEMENTS` elements (and at
        `STAGE_SKIP_ELEMENTS`) none, and B keeps its scalar loads, read again by the
        replay: vectors whose values flow out of the load branch spill (ptxas, N = 32:
        124 spill stores), kept in registers they cost registers at N = 4 (56 to 72).
        Staged, N = 4 needs no more registers since each lane is taken out of its
        vector just before its store (`recurrence_vector_io.load_runs`; 68 before).
        With kept pairs B is not needed after phase 1: its vectors are used there
        directly."""
        runs = self.b_runs
        if not runs or (self.keep and self.keep_b_vectors):
            return
        el = runs[0].el
        per_run = self.ipt * self.bs
        # the runs (one per element, in element order) that fit; a prefix where all do not
        # (N = 24, 32, 64: the others keep their scalar loads, read again by the replay)
        room = (STAGE_ELEMENT_LOADS_BUDGET - shared_layout_bytes([self.shared_bytes, 0])) // (per_run * bg.byte_size(el))
        runs = runs[: max(0, room)]
        top = STAGE_MAX_ELEMENTS if self.elem_el is None else self.stage_max_shared_copy
        if (len({r.el for r in self.b_runs}) != 1 or self.keep or not self.stage_min <= self.words <= top
                or self.words in STAGE_SKIP_ELEMENTS):  # in register words (`register_words`)
            runs = []
        self.load_runs = [r for r in self.load_runs if r.elem is None] + runs
        self.b_runs = runs
        if not runs:
            return
        rows = len(runs) * per_run
        total = shared_layout_bytes([self.shared_bytes, rows * bg.byte_size(el)])
        self.stage_rows, self.stage_el, self.shared_bytes = rows, el, total
        self.s_stage = self.e.val(memref.GetGlobalOp(f"{self.name}_sS",
                                                     MemRefType(el, [rows], memory_space=bg.SHARED_SPACE)))
        self.stage_slot = {(op, r.elem): c for c, r in enumerate(runs) for op in r.ops}

    def _b_values(self, ie: Emitter, j: int) -> ElementValue | None:
        """Item j's B values (`_stage_element_loads`) from the stage, loaded where used;
        None where B is loaded again."""
        if not self.stage_rows:
            return None

        def staged(op: Operation, n: int) -> SSAValue | None:
            run = self.stage_slot.get((op, n))
            return None if run is None else ie.load(self.s_stage, [self._stage_slot(ie, run, j)])

        return staged

    def _stage_slot(self, ie: Emitter, run: int, j: int) -> SSAValue:
        """This thread's slot of B run `run`, item `j` in the stage."""
        return ie.add(self.tid, ie.index((run * self.ipt + j) * self.bs)) if run or j else self.tid


    def _tiles(self, t_begin: SSAValue, t_end: SSAValue) -> None:
        """The chained tiles over steps [t_begin, t_end) (the whole loop here; one time
        chunk in `recurrence_time_blocks.py`)."""
        e = self.e
        self.t_begin, self.t_end = t_begin, t_end
        self.tile = e.index(self.bs * self.ipt)
        span = t_end if t_begin is self.zero else e.sub(t_end, t_begin)
        ntiles = e.divu(e.add(span, e.index(self.bs * self.ipt - 1)), self.tile)
        self.thread_base = e.mul(self.tid, e.index(self.ipt))
        if t_begin is not self.zero:
            self.thread_base = e.add(t_begin, self.thread_base)
        self.last_k = e.sub(self.trip, self.one)
        self.guard = bg.needs_overflow_guard(self.el, self.bs)
        self.one_group = self.group >= self.n
        if not self.warp:
            e.for_(self.zero, ntiles, self.one, [], self._tile_body)
            return
        # warp shuffles: the carry in registers (iter_args), from thread 0's sC
        self.width = min(self.bs, bg.WARP)
        self.lane, self.warp_id = bg.lane_and_warp(e, self.tid)
        e.op(gpu.BarrierOp())
        carry0 = [e.load(self.s_c, [e.index(n)]) for n in range(self.n)]
        final = e.for_(self.zero, ntiles, self.one, carry0, self._warp_tile_body)
        if not self.nw:  # one warp: the carry moved by shuffles; sC for the epilogue
            e.op(gpu.BarrierOp())  # after a fallback's last sC write

            def keep_final(ie: Emitter) -> None:
                for n in range(self.n):
                    ie.store(final[n], self.s_c, [ie.index(n)])

            e.if_(e.cmp("eq", self.tid, self.zero), [], keep_final)

    def _shared_arrays(self) -> None:
        """The sweep arrays sA, sB (G x block_size) and the carry sC (N)."""
        e, el = self.e, self.el
        g_rows = self.sweep_rows
        self.s_a = e.val(memref.GetGlobalOp(f"{self.name}_sA", MemRefType(el, [g_rows], memory_space=bg.SHARED_SPACE)))
        self.s_b = e.val(memref.GetGlobalOp(f"{self.name}_sB", MemRefType(el, [g_rows], memory_space=bg.SHARED_SPACE)))
        self.s_c = e.val(memref.GetGlobalOp(f"{self.name}_sC", MemRefType(el, [self.n], memory_space=bg.SHARED_SPACE)))

    def _init_carry(self, ie: Emitter) -> None:
        """Thread 0: initial state -> carry."""
        for n in range(self.n):
            ie.store(ie.load(self.state_src, self.elem_index(ie, n)), self.s_c, [ie.index(n)])

    def _split_regions(self) -> None:
        """Split coeffs and emit by what their ops vary with; clone their constants."""
        rec = self.nest.rec
        cblock, eblock = rec.coeffs.block, rec.emit.block
        self.cyield = cblock.last_op
        self.t_c, self.k_c = cblock.args[0], list(cblock.args[1:])
        self.t_e, self.s_e = eblock.args
        coeffs_ops = list(cblock.ops)[:-1]
        emit_ops = list(eblock.ops)[:-1]
        self.y_a, self.y_b = cblock.last_op.operands  # type: ignore[union-attr]
        cvary = {self.t_c: frozenset("t"), **{k: frozenset("n") for k in self.k_c}}
        cs = split_by_dependence(coeffs_ops, cvary)
        self.elem_el = None  # the type of the element-only values hoisted to shared memory
        per_elem = needed_values(cs.per_elem, set(cs.per_both) | {cblock.last_op})
        if len(per_elem) * self.n > HOIST_PER_ELEMENT_REGISTERS:
            types = {v.type for v in per_elem}
            el = types.pop() if len(types) == 1 else None
            if (self.elements_in_shared and el is not None and is_scalar_type(el)
                    and len(per_elem) * self.n * bg.byte_size(el) <= HOIST_PER_ELEMENT_SHARED_BYTES):
                self.elem_el = el
            else:
                cs = split_by_dependence(coeffs_ops, cvary, per_elem=False)  # reload them per step instead
        es = split_by_dependence(emit_ops, {self.t_e: frozenset("t"), self.s_e: frozenset("t")})
        for op in cs.consts + es.consts:
            self.e.op(op.clone(value_mapper=self.vmap))
        self.cs, self.es = cs, es

    def _hoist_invariants(self) -> None:
        """Run the step-invariant ops once per thread and the element-only ones once per
        element, under `trip > 0`; `base` and `nmaps` then map them to the results."""
        e, cs, es, vmap = self.e, self.cs, self.es, self.vmap
        self.base = vmap
        self.nmaps: list[dict[SSAValue, SSAValue]] = [{} for _ in range(self.n)]
        hoisted = cs.hoist + es.hoist
        if not (hoisted or cs.per_elem):
            return
        later = set(cs.per_step + cs.per_both + es.per_step) | {self.cyield}
        need_i = needed_values(hoisted, later | set(cs.per_elem))
        need_n = needed_values(cs.per_elem, later)
        in_shared = self.elem_el is not None
        out_types = [v.type for v in need_i] + ([] if in_shared else [v.type for v in need_n] * self.n)

        def hoist(ie: Emitter) -> list[SSAValue]:
            m = dict(vmap)
            for op in hoisted:
                ie.op(op.clone(value_mapper=m))
            res = [m[v] for v in need_i]
            for n in range(0 if in_shared else self.n):
                mn = {**m, **dict(zip(self.k_c, self.elem_index(ie, n)))}
                for op in cs.per_elem:
                    ie.op(op.clone(value_mapper=mn))
                res += [mn[v] for v in need_n]
            return res

        def skip(ie: Emitter) -> list[SSAValue]:
            return [ie.const(0, t) for t in out_types]

        vals = list(e.if_(e.cmp("sgt", self.trip, self.zero), out_types, hoist, skip)) if out_types else []
        self.base = dict(vmap)
        self.base.update(zip(need_i, vals[: len(need_i)]))
        pos = len(need_i)
        for n in range(0 if in_shared else self.n):
            self.nmaps[n] = dict(zip(need_n, vals[pos : pos + len(need_n)]))
            pos += len(need_n)
        if in_shared:
            self._hoist_elements_to_shared(need_n)

    def _hoist_elements_to_shared(self, need_n: list[SSAValue]) -> None:
        """The element-only values (`need_n` of each element) in shared `sE[v * N + n]`,
        written once by thread 0 (they depend on the channel only, not on the thread),
        a barrier, then read where used (`_elem_map`): one copy per block instead of
        N copies per thread in registers or a global load per step and element."""
        e, n_el = self.e, self.n
        self.elem_vals = need_n
        rows = len(need_n) * n_el
        self.s_elem = e.val(memref.GetGlobalOp(f"{self.name}_sE",
                                               MemRefType(self.elem_el, [rows], memory_space=bg.SHARED_SPACE)))
        self.elem_rows = rows
        self.shared_bytes = shared_layout_bytes([self.shared_bytes, rows * bg.byte_size(self.elem_el)])

        def write(ie: Emitter) -> None:
            for n in range(n_el):
                mn = {**self.base, **dict(zip(self.k_c, self.elem_index(ie, n)))}
                for op in self.cs.per_elem:
                    ie.op(op.clone(value_mapper=mn))
                for v, val in enumerate(need_n):
                    ie.store(mn[val], self.s_elem, [ie.index(v * n_el + n)])

        first = e.val(arith.AndIOp(e.cmp("eq", self.tid, self.zero), e.cmp("sgt", self.trip, self.zero)))
        e.if_(first, [], write)
        e.op(gpu.BarrierOp())  # written before any thread's first step reads them

    def _step_frontier(self) -> None:
        """Values of the step-only part that the replay needs (recompute mode)."""
        cs = self.cs
        self.frontier = [] if self.keep else needed_values(cs.per_step, set(cs.per_both) | {self.cyield})
        for v in self.frontier:
            if not is_scalar_type(v.type):
                raise Unsupported("coeffs passes a non-scalar value between its parts")

    # -- pieces of a tile ---------------------------------------------------------------
    def _elem_map(self, ie: Emitter, m: dict[SSAValue, SSAValue], n: int) -> dict[SSAValue, SSAValue]:
        elem = self.nmaps[n]
        if self.elem_el is not None:  # from the block's shared copy (`_hoist_elements_to_shared`)
            elem = {v: ie.load(self.s_elem, [ie.index(i * self.n + n)]) for i, v in enumerate(self.elem_vals)}
        return {**m, **elem, **dict(zip(self.k_c, self.elem_index(ie, n)))}

    def _pair_values(
        self, ie: Emitter, m: dict[SSAValue, SSAValue], elem: ElementValue | None = None
    ) -> tuple[list[SSAValue], list[SSAValue]]:
        """The N pairs of one step from the step-only values in `m`; an element load
        for which `elem(op, n)` gives a value takes it."""
        a_s, b_s = [], []
        for n in range(self.n):
            mn = self._elem_map(ie, m, n)
            for op in self.cs.per_both:
                v = elem(op, n) if elem is not None else None
                if v is not None:
                    mn[op.results[0]] = v
                    continue
                ie.op(op.clone(value_mapper=mn))
            a_s.append(self.pairs.widen(ie, mn[self.y_a]))
            b_s.append(self.pairs.widen(ie, mn[self.y_b]))
        return a_s, b_s

    def _step_pairs(
        self, ie: Emitter, k: SSAValue, j: int | None = None, staged: bool = False, from_stage: bool = False
    ) -> tuple[dict[SSAValue, SSAValue], list[SSAValue], list[SSAValue]]:
        """Step `k`'s step-only values cloned, then its N pairs; item `j` of the tile takes
        its preloaded step values (None: the loads are cloned), `staged`: its element
        loads from the shared stage (the overflow fallback)."""
        m = {**self.base, self.t_c: self.step_index(ie, k)}
        pre = self.pre[j] if self.pre is not None and j is not None and not staged else {}
        for op in self.cs.per_step:
            if op in pre:
                m[op.results[0]] = pre[op]
                continue
            ie.op(op.clone(value_mapper=m))
        elem: ElementValue | None = (lambda op, n: pre.get((op, n))) if pre else None
        if j is not None and (staged or from_stage) and self.stage_rows:
            elem = self._b_values(ie, j)
        a_s, b_s = self._pair_values(ie, m, elem)
        return m, a_s, b_s

    def _tree_prefix(self, ie: Emitter, comps: list[int]) -> list[SSAValue]:
        """The down-sweep's entering states of this thread for a group's components."""
        return [ie.load(self.s_b, [ie.add(self.tid, ie.index(c * self.bs)) if c else self.tid]) for c in range(len(comps))]

    def _tile_body(self, le: Emitter, tl: SSAValue, _: Sequence[SSAValue]) -> None:
        items, agg_a, agg_b = self._produce_items(le, tl)
        prefix, flags = self._scan_aggregates(le, agg_a, agg_b)
        if self.guard:
            prefix = self._overflow_fallback(le, items, prefix, flags)
        h = self._replay(le, items, prefix)
        self._publish(le, h)

    def _warp_tile_body(self, le: Emitter, tl: SSAValue, carried: Sequence[SSAValue]) -> list[SSAValue]:
        """The tile with warp-shuffle scans (blelloch_gpu, "In-tile scan"), all N
        components at once: Kogge-Stone over the lanes, one cross-warp step through the
        warp totals in shared memory; 2 barriers per tile, none in a block of one warp.
        Returns the next tile's carry (the last thread's final state)."""
        carry = list(carried)
        items, agg_a, agg_b = self._produce_items(le, tl)
        n = self.n
        # one element after the other: 2 N + 2 values live at each shuffle, not 4 N
        combine = bg.pair_list_combine(self.pairs)
        scanned = [bg.warp_inclusive_scan(le, combine, [agg_a[c], agg_b[c]], self.width) for c in range(n)]
        inc = [p[0] for p in scanned] + [p[1] for p in scanned]
        bad = bg.warp_any(le, bg.any_not_finite(le, inc), self.width) if self.guard else None
        h_warp, verdict = self._warp_entry(le, inc, carry, bad)

        def tree(ie: Emitter) -> list[SSAValue]:
            # the previous lane's state after its steps: the same a * h + b the
            # exclusive pair would give here, one shuffle per element instead of two
            after = [self.pairs.apply(ie, inc[c], h_warp[c], inc[n + c]) for c in range(n)]
            got = [bg.shuffle(ie, "up", v, 1, self.width) for v in after]
            has_prev = got[0][1]
            return [ie.val(arith.SelectOp(has_prev, g, h)) for (g, _), h in zip(got, h_warp)]

        if verdict is None:
            prefix = tree(le)
        else:
            prefix = list(le.if_(verdict, [self.el] * n, lambda ie: self._warp_fallback(ie, items, carry), tree))
        h = self._replay(le, items, prefix)
        if not self.nw:  # the last lane's state, without shared memory
            return [bg.shuffle(le, "idx", v, self.width - 1, self.width)[0] for v in h]
        self._publish(le, h)
        le.op(gpu.BarrierOp())
        return [le.load(self.s_c, [le.index(c)]) for c in range(n)]

    def _warp_entry(
        self, le: Emitter, inc: Sequence[SSAValue], carry: list[SSAValue], bad: SSAValue | None
    ) -> tuple[list[SSAValue], SSAValue | None]:
        """The states entering this thread's warp and the tile's overflow verdict
        (block-uniform): the last lane of each warp posts its N totals (element 0's `a`
        NaN when the warp saw a non-finite aggregate), a barrier, then every thread
        folds the totals of the warps before its own onto the carry and checks every
        warp's flag slot (the totals are among the checked aggregates)."""
        nw, n = self.nw, self.n
        if not nw:
            return carry, bad
        s_a, s_b, warp_id = self.s_a, self.s_b, self.warp_id

        def post(ie: Emitter) -> None:
            for c in range(n):
                a = inc[c]
                if c == 0 and bad is not None:
                    a = ie.val(arith.SelectOp(bad, ie.const(float("nan"), self.el), a))
                slot = ie.add(warp_id, ie.index(c * nw)) if c else warp_id
                ie.store(a, s_a, [slot])
                ie.store(inc[n + c], s_b, [slot])

        le.if_(le.cmp("eq", self.lane, le.index(bg.WARP - 1)), [], post)
        le.op(gpu.BarrierOp())
        verdict = None
        if bad is not None:
            for v in range(nw):
                c0 = bg.any_not_finite(le, [le.load(s_a, [le.index(v)])])
                verdict = c0 if verdict is None else le.val(arith.OrIOp(verdict, c0))

        def fold(fe: Emitter, v: SSAValue, h: Sequence[SSAValue]) -> list[SSAValue]:
            # a loop over the warps before this one, not an unrolled select chain: the
            # totals are loaded as used (N x (nw - 1) x 2 of them otherwise live at once)
            out = []
            for c in range(n):
                slot = fe.add(v, fe.index(c * nw)) if c else v
                out.append(self.pairs.apply(fe, fe.load(s_a, [slot]), h[c], fe.load(s_b, [slot])))
            return out

        h = list(le.for_(self.zero, warp_id, self.one, list(carry), fold))
        return h, verdict

    def _warp_fallback(self, ie: Emitter, items: list[_Item], carry: list[SSAValue]) -> list[SSAValue]:
        """The flagged tile's entering states in the loop's own order (thread after
        thread through sC, the first from the carry registers)."""
        el, n, s_c = self.el, self.n, self.s_c

        def load_state(te: Emitter, j: SSAValue) -> list[SSAValue]:
            first = te.cmp("eq", j, te.index(0))
            return list(te.if_(first, [el] * n, lambda x: list(carry),
                               lambda x: [x.load(s_c, [x.index(c)]) for c in range(n)]))

        def store_state(te: Emitter, h: Sequence[SSAValue]) -> None:
            for c in range(n):
                te.store(h[c], s_c, [te.index(c)])

        return bg.sequential_entry_states(ie, self.tid, self.bs, [el] * n, load_state,
                                          self._own_steps(items), store_state)

    def _own_steps(self, items: list[_Item]):
        """The fallback's replay of this thread's in-range steps on a state."""

        def own_steps(ie: Emitter, h: Sequence[SSAValue]) -> list[SSAValue]:
            h = list(h)
            for j, it in enumerate(items):

                def step(te: Emitter, k=it.k, a_s=it.a_s, b_s=it.b_s, h=h, j=j) -> list[SSAValue]:
                    if self.keep:
                        pa, pb = a_s, b_s
                    else:
                        # from the loads (or the shared stage) again, not from the kept
                        # step values: that keeps LLVM from hoisting N * items_per_thread
                        # pairs out of the turn loop (the loads cannot cross its barriers)
                        _, pa, pb = self._step_pairs(te, k, j, staged=True)
                    return [self.pairs.apply(te, pa[c], h[c], pb[c]) for c in range(self.n)]

                h = list(ie.if_(it.inside, [self.el] * self.n, step, lambda te, h=h: h))
            return h

        return own_steps

    def _preload(self, le: Emitter, tl: SSAValue, start: SSAValue) -> None:
        """The tile's step loads (recurrence_vector_io): vectors in a full tile; sets
        `self.pre` and `self.full` (None without step accesses)."""
        self.pre, self.full = None, None
        runs = self.load_runs + self.emit_runs + self.store_runs
        if not runs:
            return
        t0 = le.mul(tl, self.tile)
        if self.t_begin is not self.zero:
            t0 = le.add(self.t_begin, t0)
        self.full = vio.full_tile(le, runs, self.base, t0, self.step_index(le, t0), self.bs * self.ipt, self.t_end)
        self.run_steps = []
        for j in range(self.ipt):
            k = le.add(start, le.index(j)) if j else start
            self.run_steps.append((self.step_index(le, k), le.cmp("ult", k, self.t_end)))
        plain = [r for r in self.load_runs if r.elem is None] if self.stage_rows else self.load_runs
        if plain:
            self.pre = vio.load_runs(le, plain, self.base, self.full, self.run_steps[0][0], self.run_steps, self.ipt)
        if self.stage_rows:
            # B into this thread's own slots of the stage, from inside the load branches
            # (no barrier: only this thread reads them; not the tile's 64 values live at once)
            def sink(ie: Emitter, c: int, j: int, v: SSAValue) -> None:
                ie.store(v, self.s_stage, [self._stage_slot(ie, c, j)])

            vio.load_runs(le, self.b_runs, self.base, self.full, self.run_steps[0][0], self.run_steps, self.ipt, sink)
            if self.pre is None:
                self.pre = [{} for _ in range(self.ipt)]

    def _produce_items(self, le: Emitter, tl: SSAValue) -> tuple[list[_Item], list[SSAValue], list[SSAValue]]:
        """1. this thread's pairs for all state elements; fold into aggregates."""
        el, pairs, nf = self.el, self.pairs, len(self.frontier)
        f_types = [v.type for v in self.frontier]
        start = le.add(le.mul(tl, self.tile), self.thread_base)
        self._preload(le, tl, start)
        items: list[_Item] = []
        agg_a: list[SSAValue] = []
        agg_b: list[SSAValue] = []
        for j in range(self.ipt):
            k = le.add(start, le.index(j)) if j else start
            inside = le.cmp("ult", k, self.t_end)

            def produce(ie: Emitter, k: SSAValue = k, j: int = j) -> list[SSAValue]:
                m, a_s, b_s = self._step_pairs(ie, k, j, from_stage=True)
                return [*(m[v] for v in self.frontier), *a_s, *b_s]

            def pad(ie: Emitter) -> list[SSAValue]:
                ident = pairs.identity(ie)
                return [*(ie.const(0, t) for t in f_types), *[ident[0]] * self.n, *[ident[1]] * self.n]

            res = list(le.if_(inside, f_types + [el] * (2 * self.n), produce, pad))
            f_vals, a_s, b_s = res[:nf], res[nf : nf + self.n], res[nf + self.n :]
            items.append(_Item(k, inside, f_vals, a_s, b_s))
            if j == 0:
                agg_a, agg_b = a_s, b_s
            else:
                folded = [pairs.combine(le, (agg_a[n], agg_b[n]), (a_s[n], b_s[n])) for n in range(self.n)]
                agg_a, agg_b = [x for x, _ in folded], [y for _, y in folded]
        return items, agg_a, agg_b

    def _scan_aggregates(
        self, le: Emitter, agg_a: list[SSAValue], agg_b: list[SSAValue]
    ) -> tuple[list[SSAValue], list[SSAValue]]:
        """2. exclusive scan of the aggregates, component groups of `self.group`; returns
        the entering states (empty where the guard loads them later) and the groups'
        overflow flags."""
        bs, tid, s_a, s_b, s_c, guard = self.bs, self.tid, self.s_a, self.s_b, self.s_c, self.guard
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
            bg.blelloch_up_sweep(le, self.pairs, tid, bs, slots)

            def seed(ie: Emitter, comps: list[int] = comps) -> None:
                if guard:  # overflow guard: the group's roots, flag in its first a slot
                    roots = [ie.load(s, [ie.index(c * bs + bs - 1)]) for c in range(len(comps)) for s in (s_a, s_b)]
                    bg.flag_tile_root(ie, roots, s_a, bs - 1)
                for c, n in enumerate(comps):
                    ie.store(ie.load(s_c, [ie.index(n)]), s_b, [ie.index(c * bs + bs - 1)])

            le.if_(le.cmp("eq", tid, self.zero), [], seed)
            bg.blelloch_down_sweep(
                le, self.pairs, tid, bs, slots,
                after_first_barrier=(lambda ie: flags.append(bg.read_tile_flag(ie, s_a, bs - 1))) if guard else None,
            )
            if not (guard and self.one_group):  # else loaded where used (not live across the fallback)
                prefix += self._tree_prefix(le, comps)
        return prefix, flags

    def _overflow_fallback(
        self, le: Emitter, items: list[_Item], prefix: list[SSAValue], flags: list[SSAValue]
    ) -> list[SSAValue]:
        """A tile whose aggregates are not all finite takes its entering states in the
        loop's own order instead (blelloch_gpu, overflow guard)."""
        el, bs, tid, s_b, s_c = self.el, self.bs, self.tid, self.s_b, self.s_c
        bad = flags[0]
        for f in flags[1:]:
            bad = le.val(arith.OrIOp(bad, f))

        own_steps = self._own_steps(items)

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
                keep_in=(keep_own, lambda te: self._tree_prefix(te, list(range(self.n)))) if self.one_group else None,
            )

        tree = (lambda ie: self._tree_prefix(ie, list(range(self.n)))) if self.one_group else (lambda ie: prefix)
        return list(le.if_(bad, [el] * self.n, exact, tree))

    def _replay(self, le: Emitter, items: list[_Item], prefix: list[SSAValue]) -> list[SSAValue]:
        """3. replay: in-range steps update h and run the emit on the private state."""
        el, pairs, priv = self.el, self.pairs, self.priv
        last_stores = self.nest.last_stores
        if self.emit_runs:  # the emit's step loads, now (not live across the scan)
            self.pre = vio.load_runs(le, self.emit_runs, self.base, self.full, self.run_steps[0][0], self.run_steps,
                                     self.ipt)
        deferred = {r.ops[0]: c for c, r in enumerate(self.store_runs)}
        store_types = [r.el for r in self.store_runs]
        stored: list[list[SSAValue]] = [[] for _ in self.store_runs]
        h = prefix
        for j, it in enumerate(items):

            def replay(ie: Emitter, it: _Item = it, h=h, j: int = j) -> list[SSAValue]:
                i = self.step_index(ie, it.k)
                if self.keep:
                    pa, pb = it.a_s, it.b_s
                else:
                    pa, pb = self._pair_values(ie, {**self.base, self.t_c: i, **dict(zip(self.frontier, it.f_vals))},
                                               self._b_values(ie, j))
                new_h = [pairs.apply(ie, pa[n], h[n], pb[n]) for n in range(self.n)]
                for n in range(self.n):
                    ie.store(new_h[n], priv, self.elem_index(ie, n))
                is_last = ie.cmp("eq", it.k, self.last_k) if last_stores else None
                me = {**self.base, self.t_e: i, self.s_e: priv}
                pre = self.pre[j] if self.pre is not None else {}
                out: list[SSAValue | None] = [None] * len(self.store_runs)
                for op in self.es.per_step:
                    if op in pre:
                        me[op.results[0]] = pre[op]
                        continue
                    if op in deferred:  # written after the items (vectors in full tiles)
                        out[deferred[op]] = me.get(op.operands[0], op.operands[0])
                        continue
                    if op in self.unroll_emit:  # C . h with C preloaded, unrolled over the state
                        vio.unrolled_emit_loop(ie, op, me, pre)
                        continue
                    new = ie.op(op.clone(value_mapper=me))
                    if last_stores:
                        guard_last_stores(op, new, last_stores, is_last)
                return new_h + out  # type: ignore[operator]

            def skip(ie: Emitter, h=h) -> list[SSAValue]:
                return h + [ie.const(0, t) for t in store_types]

            res = list(le.if_(it.inside, [el] * self.n + store_types, replay, skip))
            h = res[: self.n]
            for c, v in enumerate(res[self.n :]):
                stored[c].append(v)
        if self.store_runs:
            vio.store_runs(le, self.store_runs, self.base, self.full, self.run_steps[0][0], self.run_steps, stored,
                           self.ipt)
        return h

    def _publish(self, le: Emitter, h: list[SSAValue]) -> None:
        """4. the last thread's final state is the next tile's carry."""

        def publish(ie: Emitter) -> None:
            for n in range(self.n):
                ie.store(h[n], self.s_c, [ie.index(n)])

        le.if_(le.cmp("eq", self.tid, self.e.index(self.bs - 1)), [], publish)


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def items_for_state(n: int, items_per_thread: int, el: Attribute = f32) -> int:
    """Items per thread for a state of `n` elements of type `el`: each thread holds n
    states, n aggregate pairs and the per-item values, so beyond `UNROLL_BY_LLVM`
    register words (`register_words`) one item per thread keeps within the 255
    registers (ptxas, selective scan N = 64: 4 items spill 1392 stores, 2 items 96, 1
    item none; N = 16 f64, sm_90: 4 items 580, 2 items 20 to 140, 1 item none)."""
    return items_per_thread if n * register_words(el) <= UNROLL_BY_LLVM else 1


def register_words(el: Attribute) -> int:
    """32-bit registers one state element of type `el` costs in the kernels' budgets
    (items per thread, warp shuffles, kept pairs, vector loads, staging): its own words
    (`state_words`), doubled for 64-bit components, whose per-item values (pairs,
    exp's temporaries, loaded operands) take two registers each too. 1 for f32."""
    return state_words(el) * component_words(el)


def lower_recurrence(
    rec: scan.RecurrenceOp,
    top: ModuleOp,
    block_size: int,
    items_per_thread: int,
    keep_pairs: bool | None = None,
    time_blocks: str = "never",
    chunk_tiles: int = 16,
) -> None:
    """Lower one `scan.recurrence` and its loop nest, or raise `Unsupported` (leaving
    the IR as it was).  Without channel loops (one long sequence) the recurrence is
    wrapped into a one-trip loop first: one block runs it, unless `time_blocks`
    ("auto", "always"; `recurrence_time_blocks.py`) spreads its time over blocks."""
    wrapper = wrap_depth0(rec)
    try:
        nest = match_recurrence(rec)
        refuse_i1_memrefs(nest.kernel_args)
        n_state = math.prod(rec.state_type.get_shape())
        if isinstance(rec.state_type.element_type, Float64Type) and n_state > MAX_F64_STATE:
            raise Unsupported(f"a state of {n_state} f64 values: the recurrence kernel takes at most "
                              f"{MAX_F64_STATE} (more spill registers in ptxas)")
        words = n_state * register_words(rec.state_type.element_type)
        if words > MAX_STATE_REGISTER_WORDS:
            raise Unsupported(f"a state of {n_state} {rec.state_type.element_type} values ({words} register words): "
                              f"the recurrence kernel takes at most {MAX_STATE_REGISTER_WORDS} (more spill in ptxas)")
        ipt = items_for_state(n_state, items_per_thread, rec.state_type.element_type)
        if time_blocks != "never":
            # imported here: it builds on this module's kernel generator
            from scanweaver.rewrites import recurrence_time_blocks as rtb

            if rtb.wants_time_blocks(nest, block_size * ipt * chunk_tiles, time_blocks):
                try:  # builds its kernels before it changes the IR
                    rtb.lower_recurrence_time_blocks(nest, top, block_size, ipt, chunk_tiles, keep_pairs)
                    return
                except Unsupported:
                    pass  # the fused kernel, one block per channel
        name = kernel_name(top, "scan_recurrence")
        gen = _KernelGen(nest, name, block_size, ipt, keep_pairs)
        kfunc = gen.build()
        if gen.words > UNROLL_BY_LLVM:  # the emit's loops over the state: constant indices
            unroll_loops_over(kfunc, gen.priv, MAX_STATE)
    except Unsupported:
        if wrapper is not None:
            unwrap_depth0(wrapper)
        raise

    # -- commit: kernel, shared arrays, launch -----------------------------------------------
    kmod = bg.get_kernel_module(top)
    rows = gen.sweep_rows
    bg.shared_global(kmod, f"{name}_sA", gen.el, rows)
    bg.shared_global(kmod, f"{name}_sB", gen.el, rows)
    bg.shared_global(kmod, f"{name}_sC", gen.el, gen.n)
    if gen.stage_rows:
        bg.shared_global(kmod, f"{name}_sS", gen.stage_el, gen.stage_rows)
    if gen.elem_el is not None:
        bg.shared_global(kmod, f"{name}_sE", gen.elem_el, gen.elem_rows)
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
            f"items_per_thread={ipt}{'' if ipt == items_per_thread else f' (capped from {items_per_thread} for the state)'}"
            f"; fused coeffs/emit, "
            f"{'kept' if gen.keep else 'recomputed'} pairs, "
            f"{'warp-shuffle scans' if gen.warp else f'{gen.group} components per sweep'}"
        ),
    )


def lower_recurrences(
    top: ModuleOp, block_size: int, items_per_thread: int, keep_pairs: bool | None = None,
    time_blocks: str = "never", chunk_tiles: int = 16,
) -> dict[scan.RecurrenceOp, str]:
    """Lower every matching `scan.recurrence`; returns why the others were left alone.
    `time_blocks` / `chunk_tiles`: see `lower_recurrence`."""
    skipped: dict[scan.RecurrenceOp, str] = {}
    tb = dict(time_blocks=time_blocks, chunk_tiles=chunk_tiles)
    for rec in [o for o in top.walk() if isinstance(o, scan.RecurrenceOp)]:
        try:
            if needs_split(rec, MAX_STATE):  # dynamic or large diagonal state: one channel per element
                split = split_state(rec)
                try:
                    lower_recurrence(split.rec, top, block_size, items_per_thread, keep_pairs, **tb)
                except Unsupported:
                    split.undo()
                    raise
                split.drop_unused()
            else:
                lower_recurrence(rec, top, block_size, items_per_thread, keep_pairs, **tb)
        except Unsupported as why:
            skipped[rec] = str(why)
    return skipped


__all__ = ["Unsupported", "lower_recurrence", "lower_recurrences", "match_recurrence"]
