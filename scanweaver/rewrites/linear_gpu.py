"""`scan-to-gpu` for `scan.linear_recurrence`: one fused kernel per loop nest.

`ScanToGpu` calls `lower_linear_recurrences(module, block_size, items_per_thread)`.
A coupled recurrence over a K-vector state (K <= 4), raised from loops carrying K
linearly dependent values (the 2nd-order IIR filter `iir2_loops`: state
(y_{t-1}, y_{t-2}), M_t = [[c1, c2], [1, 0]], v_t = (x_t, 0)), becomes one kernel like
`recurrence_gpu.py` makes for `scan.recurrence`: its channel loop nest is matched by
`gpu_nest.match_recurrence` (same conditions: parallel channels, emit stores one
element per step or step-invariant, ...), one block per channel iteration. Anything
that does not match is left unchanged, for the sequential lowering.

Without channel loops (depth 0) the raise leaves the state as a `memref.alloca` of
the function body, initialised by stores before the recurrence and read by loads
after it. Such a recurrence is first put into a one-iteration `scf.for` together with
the alloca, its initial stores, the loads (and pure ops) they need, and the final
loads of the state with the stores of them to function arguments (all moved only
across ops without memory writes); that loop is then an ordinary one-block nest. If
the nest still does not match, the loop is dissolved again (`gpu_nest.wrap_depth0`
and `unwrap_depth0`, shared with `scan.recurrence`).

Kernel design
-------------
* The step map s -> M_t s + v_t is the pair (M_t, v_t) (K*K + K values, M row-major);
  pairs compose as (M1, v1) . (M2, v2) = (M2 M1, M2 v1 + v2) (apply 1 first), the
  identity is (I, 0). Everything stays in registers: K is small and fully unrolled.
* Phase 1 (registers): per item the step-dependent ops of `coeffs` are cloned (ops
  depending on nothing are hoisted out of the tile loop, guarded by `trip > 0`);
  steps past the end get the identity; the items fold into one aggregate pair.
* Scan: aggregates go to shared memory component-major (`sM[c * bs + tid]`,
  c < K*K, `sV[c * bs + tid]`, c < K), up-sweep with the pair composition, thread 0
  seeds the root's vector with the carried state `sC`, and the down-sweep runs on
  the state vectors only (the scan.affine kernel's b-only trick generalised: the
  right child's prefix is M_left s_parent + v_left, M_left being the untouched
  up-sweep aggregate of the left subtree), so only K values per node move down.
* Replay: per item in range, s = M s + v with exactly the reference's evaluation
  order (((M[j][0] s[0] + M[j][1] s[1]) + ...) + v[j]), stored to the thread's private
  state buffer, then the cloned `emit`. The items' pairs are kept in registers when
  (K*K + K) * items_per_thread <= 32 (K = 2 with 4 items: 24), else recomputed from
  the cloned `coeffs` (loads hit L1).
* Warp-shuffle tile (states `gpu.shuffle` moves: f32, f64, i32, i64; the sweep above
  stays for the others): the per-thread aggregates are scanned inside each warp by
  Kogge-Stone on every (M, v) component (blelloch_gpu's helpers), the last lane of
  each warp posts its total to sM/sV (one entry per warp), one barrier, and every
  thread applies the totals of the warps before its own to the carried state, then
  its lane's exclusive prefix; the next carry goes through sC behind a second barrier
  (by `shuffle idx` in a block of one warp). Overflow verdict as in the affine kernel:
  a lane with a non-finite inclusive aggregate flags its warp (xor butterfly), a
  flagged warp posts a NaN M[0][0], every thread checks all totals; a non-finite
  entry of a product or of M v + w makes an entry of the result non-finite, so a
  finite verdict means every aggregate the tile used was finite. Shared memory:
  (K*K + K) * (block_size / 32) + K elements.
* Prefetch (the warp-shuffle tile, `PREFETCH`): the tile loop carries the next
  tile's pairs (the cloned step-dependent `coeffs`, loads included, identity past
  the end); each tile produces those of tile k + 1 before its own scan and barriers,
  so their load latency overlaps the scan; the tile after the last produces nothing.
  On: `benchmarks/gpu/KERNELS.md` (generated) shows the registers and occupancy
  with it against `main` without it (the iir2 case).
* Overflow guard (blelloch_gpu, "Numerics"): thread 0 flags a tile whose root (M, v)
  is not finite in the root's M slot (never read by the down-sweep); such a tile takes
  its entering states in the loop's own order, thread after thread.
* Chained tiles: the last thread's final state goes to `sC` for the next tile; after
  the last tile thread 0 writes it to the state buffer and runs the epilogue
  (`gpu_nest.finish_nest_kernel`).
* Launch: grid (channel iterations, 1, 1), block (block_size, 1, 1), static shared
  memory (K*K + K) * block_size + K elements (16-byte aligned arrays).
Integer states wrap exactly like the reference (integer arithmetic is a ring, so the
parallel composition order gives the same bits); float states agree up to
reassociation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.dialects import arith, gpu, memref
from xdsl.dialects.builtin import MemRefType, ModuleOp
from xdsl.ir import Attribute, SSAValue

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites import gpu_nest
from scanweaver.rewrites.affine_to_pairs import Emitter, PairArith
from scanweaver.rewrites.gpu_kernel import Unsupported, kernel_name, refuse_i1_memrefs, shared_layout_bytes

#: Largest state vector handled (the pair is K*K + K registers per item).
MAX_K = 4
#: Keep the items' pairs for the replay when (K*K + K) * items_per_thread <= this.
KEEP_PAIRS_REGISTERS = 32
#: Prefetch of the next tile's pairs in the warp-shuffle tile (module doc, "Prefetch")
PREFETCH = True


# ---------------------------------------------------------------------------
# Pair arithmetic
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MatArith:
    """The monoid of affine maps s -> M s + v on K-vectors; a pair is a flat list
    [M row-major (K*K values), v (K values)] like the `coeffs` yield."""

    el: Attribute
    k: int

    @property
    def scalar(self) -> PairArith:
        return PairArith(self.el)

    def split(self, p: Sequence[SSAValue]) -> tuple[Sequence[SSAValue], Sequence[SSAValue]]:
        return p[: self.k * self.k], p[self.k * self.k :]

    def apply(self, e: Emitter, m: Sequence[SSAValue], s: Sequence[SSAValue], v: Sequence[SSAValue]) -> list[SSAValue]:
        """M s + v, each row summed left to right then + v (the reference order)."""
        k, ar = self.k, self.scalar
        out = []
        for j in range(k):
            acc = ar.mul(e, m[j * k], s[0])
            for c in range(1, k):
                acc = ar.add(e, acc, ar.mul(e, m[j * k + c], s[c]))
            out.append(ar.add(e, acc, v[j]))
        return out

    def compose(self, e: Emitter, first: Sequence[SSAValue], second: Sequence[SSAValue]) -> list[SSAValue]:
        """(M1, v1) . (M2, v2) = (M2 M1, M2 v1 + v2): apply `first`, then `second`."""
        k, ar = self.k, self.scalar
        m1, v1 = self.split(first)
        m2, v2 = self.split(second)
        m = []
        for r in range(k):
            for c in range(k):
                acc = ar.mul(e, m2[r * k], m1[c])
                for x in range(1, k):
                    acc = ar.add(e, acc, ar.mul(e, m2[r * k + x], m1[x * k + c]))
                m.append(acc)
        return m + self.apply(e, m2, v1, v2)

    def identity(self, e: Emitter) -> list[SSAValue]:
        one, zero = self.scalar.one(e), self.scalar.zero(e)
        k = self.k
        return [one if r == c else zero for r in range(k) for c in range(k)] + [zero] * k


# ---------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------


class _LinearKernel:
    """Builds the fused kernel of one matched nest (module doc, "Kernel design").

    `build` runs the steps in order; each step emits its ops where the previous one
    stopped, so the order of the calls is the order of the IR."""

    def __init__(self, nest: gpu_nest.Nest, name: str, bs: int, ipt: int, keep: bool,
                 prefetch: bool | None = None) -> None:
        rec = nest.rec
        assert isinstance(rec, scan.LinearRecurrenceOp)
        self.nest, self.rec, self.bs, self.ipt, self.keep = nest, rec, bs, ipt, keep
        self.el = rec.state_type.element_type
        self.K = rec.size
        self.mat = MatArith(self.el, self.K)
        self.npair = self.K * self.K + self.K
        self.kk = gpu_nest.begin_nest_kernel(nest, name, self.el, (self.K,))
        e = self.kk.e
        self.zero, self.one = e.index(0), e.index(1)
        K = self.K
        self.warp = bg.shuffles(self.el)
        #: the warp tile carries the next tile's pairs (module doc, "Prefetch")
        self.prefetch = self.warp and (PREFETCH if prefetch is None else prefetch)
        #: entries per component in sM / sV: one per thread for the sweep, one per warp
        #: (none in a block of one warp) for the warp-shuffle tile
        self.stride = shared_stride(self.el, bs)
        self.s_m, self.s_v, self.s_c = (
            self._shared(name, "sM", K * K * self.stride), self._shared(name, "sV", K * self.stride),
            self._shared(name, "sC", K),
        )

    def _shared(self, name: str, suffix: str, rows: int) -> SSAValue:
        t = MemRefType(self.el, [max(rows, 1)], memory_space=bg.SHARED_SPACE)  # unused: LLVM drops it
        return self.kk.e.val(memref.GetGlobalOp(f"{name}_{suffix}", t))

    def build(self) -> tuple:
        e, kk, bs, ipt = self.kk.e, self.kk, self.bs, self.ipt
        self._init_carry()
        self._split_regions()
        self.tile = e.index(bs * ipt)
        ntiles = e.divu(e.add(kk.trip, e.index(bs * ipt - 1)), self.tile)
        self.thread_base = e.mul(kk.tid, e.index(ipt))
        self.last_k = e.sub(kk.trip, self.one)
        self.guard = bg.needs_overflow_guard(self.el, bs)
        if self.warp:
            self.width = min(bs, bg.WARP)
            self.lane, self.warp_id = bg.lane_and_warp(e, kk.tid)
            e.op(gpu.BarrierOp())  # thread 0 wrote the entering state to sC
            carry0 = [e.load(self.s_c, [e.index(c)]) for c in range(self.K)]
            if self.prefetch:  # tile 0's pairs before the loop
                carry0 += self._tile_pairs(e, self.zero)
            final = list(e.for_(self.zero, ntiles, self.one, carry0, self._warp_tile_body))[: self.K]
            if bs <= bg.WARP:  # the carry moved by shuffles: sC gets the final state, once
                e.op(gpu.BarrierOp())  # every thread is done with sC

                def store_final(ie: Emitter) -> None:
                    for c, x in enumerate(final):
                        ie.store(x, self.s_c, [ie.index(c)])

                e.if_(e.cmp("eq", kk.tid, self.zero), [], store_final)
        else:
            e.for_(self.zero, ntiles, self.one, [], self._tile_body)
        gpu_nest.finish_nest_kernel(kk, self.K, self.s_c, lambda ie, j: [ie.index(j)])
        return kk.kfunc, self.el, self.K

    # -- before the tile loop ---------------------------------------------------------------

    def _init_carry(self) -> None:
        """Thread 0 copies the entering state into the carry `sC`."""
        e, kk, s_c = self.kk.e, self.kk, self.s_c

        def init_carry(ie: Emitter) -> None:
            for j in range(self.K):
                ie.store(ie.load(kk.state_src, [ie.index(j)]), s_c, [ie.index(j)])

        e.if_(e.cmp("eq", kk.tid, self.zero), [], init_carry)

    def _split_regions(self) -> None:
        """Split `coeffs` and `emit` by dependence; clone the constants and hoist what
        depends on neither the step nor the state (guarded by trip > 0) into `base`."""
        e, vmap, rec = self.kk.e, self.kk.vmap, self.rec
        cblock, eblock = rec.coeffs.block, rec.emit.block
        self.t_c = cblock.args[0]
        self.t_e, self.s_e = eblock.args
        self.yields = list(cblock.last_op.operands)  # type: ignore[union-attr]
        cs = gpu_nest.split_by_dependence(list(cblock.ops)[:-1], {self.t_c: frozenset("t")})
        es = gpu_nest.split_by_dependence(
            list(eblock.ops)[:-1], {self.t_e: frozenset("t"), self.s_e: frozenset("t")}
        )
        self.cs, self.es = cs, es
        for op in cs.consts + es.consts:
            e.op(op.clone(value_mapper=vmap))
        self.base = dict(vmap)
        hoisted = cs.hoist + es.hoist
        if not hoisted:
            return
        later = set(cs.per_step + es.per_step) | {cblock.last_op}
        need = gpu_nest.needed_values(hoisted, later)
        if not need:
            return
        types = [v.type for v in need]

        def hoist(ie: Emitter) -> list[SSAValue]:
            m = dict(vmap)
            for op in hoisted:
                ie.op(op.clone(value_mapper=m))
            return [m[v] for v in need]

        vals = e.if_(e.cmp("sgt", self.kk.trip, self.zero), types, hoist, lambda ie: [ie.const(0, t) for t in types])
        self.base.update(zip(need, vals))

    # -- pairs: produced per step, moved through shared memory ------------------------------

    def produce(self, ie: Emitter, k: SSAValue) -> list[SSAValue]:
        """The (M, v) pair of step k: the cloned step-dependent `coeffs` ops."""
        m = {**self.base, self.t_c: self.kk.step_index(ie, k)}
        for op in self.cs.per_step:
            ie.op(op.clone(value_mapper=m))
        return [m[v] for v in self.yields]

    def slot(self, ie: Emitter, c: int, x: SSAValue) -> SSAValue:
        """Index of component c of entry x (thread, or warp; component-major layout)."""
        return ie.add(x, ie.index(c * self.stride)) if c else x

    def load_pair(self, ie: Emitter, x: SSAValue) -> list[SSAValue]:
        K = self.K
        return [ie.load(self.s_m, [self.slot(ie, c, x)]) for c in range(K * K)] + [
            ie.load(self.s_v, [self.slot(ie, c, x)]) for c in range(K)
        ]

    def store_pair(self, ie: Emitter, p: Sequence[SSAValue], x: SSAValue) -> None:
        K = self.K
        for c in range(K * K):
            ie.store(p[c], self.s_m, [self.slot(ie, c, x)])
        for c in range(K):
            ie.store(p[K * K + c], self.s_v, [self.slot(ie, c, x)])

    # -- one tile ---------------------------------------------------------------------------

    def _tile_body(self, le: Emitter, tl: SSAValue, _: Sequence[SSAValue]) -> None:
        start = le.add(le.mul(tl, self.tile), self.thread_base)
        items = self._fold_items(le, start)
        bg.blelloch_levels(le, self.kk.tid, self.bs, self._up, down=False)
        le.if_(le.cmp("eq", self.kk.tid, self.zero), [], self._seed)
        flag = self._down_sweep(le)
        h = [le.load(self.s_v, [self.slot(le, c, self.kk.tid)]) for c in range(self.K)]
        if self.guard:
            h = self._exact_if_flagged(le, items, flag[0], h)
        h = self._replay(le, items, h)
        self._publish(le, h)

    def _fold_items(self, le: Emitter, start: SSAValue) -> list[tuple[SSAValue, SSAValue, list[SSAValue]]]:
        """1. This thread's pairs (identity past the end), folded in step order into
        its aggregate in shared memory; returns (k, inside, pair) per item."""
        items, agg = self._load_items(le, start)
        self.store_pair(le, agg, self.kk.tid)
        return items

    def _load_items(
        self, le: Emitter, start: SSAValue, pairs: Sequence[SSAValue] | None = None
    ) -> tuple[list[tuple[SSAValue, SSAValue, list[SSAValue]]], list[SSAValue]]:
        """This thread's (k, inside, pair) items, identity past the end, and their
        aggregate in step order (registers). `pairs`: the items' pairs produced before
        (prefetch, flat), else produced here."""
        items = []
        agg: list[SSAValue] = []
        n = self.npair
        for j in range(self.ipt):
            k = le.add(start, le.index(j)) if j else start
            inside = le.cmp("ult", k, self.kk.trip)
            if pairs is not None:
                pair = list(pairs[j * n : (j + 1) * n])
            else:
                pair = list(le.if_(inside, [self.el] * n, lambda ie, k=k: self.produce(ie, k), self.mat.identity))
            items.append((k, inside, pair))
            agg = pair if j == 0 else self.mat.compose(le, agg, pair)
        return items, agg

    def _tile_pairs(self, le: Emitter, tl: SSAValue) -> list[SSAValue]:
        """Tile tl's pairs of this thread, flat; identity past the end (the tile after
        the last produces nothing and loads nothing)."""
        start = le.add(le.mul(tl, self.tile), self.thread_base)
        out: list[SSAValue] = []
        for j in range(self.ipt):
            k = le.add(start, le.index(j)) if j else start
            inside = le.cmp("ult", k, self.kk.trip)
            out += le.if_(inside, [self.el] * self.npair, lambda ie, k=k: self.produce(ie, k), self.mat.identity)
        return out

    # -- the warp-shuffle tile (blelloch_gpu's module doc, "In-tile scan") -----------------

    def _warp_tile_body(self, le: Emitter, tl: SSAValue, carried: Sequence[SSAValue]) -> list[SSAValue]:
        """The tile with warp shuffles: Kogge-Stone over each warp's (M, v) aggregates
        (every component shuffled), one barrier for the warp totals, and the next carry
        through `sC` behind a second one (1 barrier in a block of one warp)."""
        K = self.K
        carry, pairs = list(carried[:K]), (list(carried[K:]) if self.prefetch else None)
        width, mat = self.width, self.mat
        start = le.add(le.mul(tl, self.tile), self.thread_base)
        # prefetch: tile tl + 1's pairs (their loads) first, to overlap this tile's scan
        nxt = self._tile_pairs(le, le.add(tl, self.one)) if self.prefetch else []
        items, agg = self._load_items(le, start, pairs)
        inc = bg.warp_inclusive_scan(le, mat.compose, agg, width)
        ex, has_prev = bg.warp_exclusive(le, inc, width)
        bad = bg.warp_any(le, bg.any_not_finite(le, inc), width) if self.guard else None
        h_warp, bad = self._warp_entry(le, inc, carry, bad)
        m_ex, v_ex = mat.split(ex)
        mine = mat.apply(le, m_ex, h_warp, v_ex)
        h = [le.val(arith.SelectOp(has_prev, x, y)) for x, y in zip(mine, h_warp)]
        if bad is not None:
            h = self._exact_if_flagged(le, items, bad, h, carry)
        h = self._replay(le, items, h)
        if self.bs <= bg.WARP:  # the last lane's state, without shared memory
            return [bg.shuffle(le, "idx", x, width - 1, width)[0] for x in h] + nxt
        self._publish(le, h)
        le.op(gpu.BarrierOp())  # the carry is posted; every thread read the totals
        return [le.load(self.s_c, [le.index(c)]) for c in range(K)] + nxt

    def _warp_entry(
        self, le: Emitter, inc: Sequence[SSAValue], carry: list[SSAValue], bad: SSAValue | None
    ) -> tuple[list[SSAValue], SSAValue | None]:
        """The state entering this thread's warp and the tile's verdict (block-uniform):
        the last lane of each warp posts its warp's (M, v) total (M[0][0] NaN when the
        warp saw a non-finite aggregate), a barrier, then every thread applies the
        totals of the warps before its own to the carry and checks all of them."""
        nw = self.bs // bg.WARP
        if nw <= 1:
            return carry, bad
        el, mat = self.el, self.mat

        def post(ie: Emitter) -> None:
            total = list(inc)
            if bad is not None:
                total[0] = ie.val(arith.SelectOp(bad, ie.const(float("nan"), el), total[0]))
            self.store_pair(ie, total, self.warp_id)

        le.if_(le.cmp("eq", self.lane, le.index(bg.WARP - 1)), [], post)
        le.op(gpu.BarrierOp())
        h = carry
        verdict = None
        for w in range(nw):
            total = self.load_pair(le, le.index(w))
            if bad is not None:
                c = bg.any_not_finite(le, total)
                verdict = c if verdict is None else le.val(arith.OrIOp(verdict, c))
            if w < nw - 1:
                before = le.cmp("ult", le.index(w), self.warp_id)
                m, v = mat.split(total)
                moved = mat.apply(le, m, h, v)
                h = [le.val(arith.SelectOp(before, x, y)) for x, y in zip(moved, h)]
        return h, verdict

    def _up(self, ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
        """2. Up-sweep step: the pair composition."""
        self.store_pair(ie, self.mat.compose(ie, self.load_pair(ie, left), self.load_pair(ie, i)), i)

    def _seed(self, ie: Emitter) -> None:
        """3. Thread 0 seeds the root's vector with the carried state (and, overflow
        guard, flags a root that is not finite in the root's unused M slot)."""
        K, bs, s_m, s_v = self.K, self.bs, self.s_m, self.s_v
        if self.guard:
            root = [ie.load(s_m, [ie.index(c * bs + bs - 1)]) for c in range(K * K)]
            root += [ie.load(s_v, [ie.index(c * bs + bs - 1)]) for c in range(K)]
            bg.flag_tile_root(ie, root, s_m, bs - 1)
        for c in range(K):
            ie.store(ie.load(self.s_c, [ie.index(c)]), s_v, [ie.index(c * bs + bs - 1)])

    def _down_sweep(self, le: Emitter) -> list[SSAValue]:
        """4. Down-sweep on the state vectors (module doc); returns the tile's overflow
        flag (read after the first barrier) when guarded."""
        K, s_m, s_v, slot = self.K, self.s_m, self.s_v, self.slot

        def down(ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
            s_parent = [ie.load(s_v, [slot(ie, c, i)]) for c in range(K)]
            m_left = [ie.load(s_m, [slot(ie, c, left)]) for c in range(K * K)]
            v_left = [ie.load(s_v, [slot(ie, c, left)]) for c in range(K)]
            for c in range(K):
                ie.store(s_parent[c], s_v, [slot(ie, c, left)])
            for c, x in enumerate(self.mat.apply(ie, m_left, s_parent, v_left)):
                ie.store(x, s_v, [slot(ie, c, i)])

        flag: list[SSAValue] = []
        bg.blelloch_levels(
            le, self.kk.tid, self.bs, down, down=True,
            after_first_barrier=(lambda ie: flag.append(bg.read_tile_flag(ie, s_m, self.bs - 1)))
            if self.guard else None,
        )
        return flag

    def _exact_if_flagged(
        self, le: Emitter, items: list, flag: SSAValue, h: list[SSAValue], carry: list[SSAValue] | None = None
    ) -> list[SSAValue]:
        """5a. A flagged tile takes its entering states in the loop's own order
        (blelloch_gpu, "Numerics") instead of the scanned prefix `h`. Thread 0 starts
        from `carry` when given (the warp tile's register), else from `sC`."""
        K, el, mat, s_c = self.K, self.el, self.mat, self.s_c

        def load_state(te: Emitter, j: SSAValue) -> list[SSAValue]:
            def shared(xe: Emitter) -> list[SSAValue]:
                return [xe.load(s_c, [xe.index(c)]) for c in range(K)]

            if carry is None:
                return shared(te)
            return list(te.if_(te.cmp("eq", j, te.index(0)), [el] * K, lambda xe: list(carry), shared))

        def own_steps(ie: Emitter, h: Sequence[SSAValue]) -> list[SSAValue]:
            h = list(h)
            for k, inside, pair in items:

                def step(te: Emitter, k=k, pair=pair, h=h) -> list[SSAValue]:
                    m, v = mat.split(pair if self.keep else self.produce(te, k))
                    return mat.apply(te, m, h, v)

                h = list(ie.if_(inside, [el] * K, step, lambda te, h=h: h))
            return h

        def store_carry(ie: Emitter, h: Sequence[SSAValue]) -> None:
            for c in range(K):
                ie.store(h[c], s_c, [ie.index(c)])

        def exact(ie: Emitter) -> list[SSAValue]:
            return bg.sequential_entry_states(
                ie, self.kk.tid, self.bs, [el] * K, load_state, own_steps, store_carry,
            )

        return list(le.if_(flag, [el] * K, exact, lambda ie, h=h: h))

    def _replay(self, le: Emitter, items: list, h: list[SSAValue]) -> list[SSAValue]:
        """5b. Replay: in-range steps update the state, store it to the private state
        buffer and run the cloned `emit` on it (last-step stores guarded)."""
        K, el, mat, kk = self.K, self.el, self.mat, self.kk
        last_stores = self.nest.last_stores
        for k, inside, pair in items:

            def replay(ie: Emitter, k=k, pair=pair, h=h) -> list[SSAValue]:
                p = pair if self.keep else self.produce(ie, k)
                m, v = mat.split(p)
                new_h = mat.apply(ie, m, h, v)
                for c in range(K):
                    ie.store(new_h[c], kk.priv, [ie.index(c)])
                is_last = ie.cmp("eq", k, self.last_k) if last_stores else None
                me = {**self.base, self.t_e: kk.step_index(ie, k), self.s_e: kk.priv}
                for op in self.es.per_step:
                    new = ie.op(op.clone(value_mapper=me))
                    if last_stores:
                        gpu_nest.guard_last_stores(op, new, last_stores, is_last)  # type: ignore[arg-type]
                return new_h

            h = list(le.if_(inside, [el] * K, replay, lambda ie, h=h: h))
        return h

    def _publish(self, le: Emitter, h: list[SSAValue]) -> None:
        """6. The last thread's final state is the next tile's carry."""

        def publish(ie: Emitter) -> None:
            for c in range(self.K):
                ie.store(h[c], self.s_c, [ie.index(c)])

        le.if_(le.cmp("eq", self.kk.tid, le.index(self.bs - 1)), [], publish)


def shared_stride(el: Attribute, bs: int) -> int:
    """Entries per (M, v) component in shared memory: the warp totals with shuffles
    (`blelloch_gpu.tile_slots`), one per thread for the sweep."""
    return bg.tile_slots(el, bs)


def lower_linear_recurrence(
    rec: scan.LinearRecurrenceOp,
    top: ModuleOp,
    block_size: int,
    items_per_thread: int,
    keep_pairs: bool | None = None,
) -> None:
    """Lower one `scan.linear_recurrence` and its loop nest, or raise `Unsupported`
    (leaving the IR as it was)."""
    K = rec.size
    if K > MAX_K:
        raise Unsupported(f"state of {K} > {MAX_K} elements")
    wrapper = gpu_nest.wrap_depth0(rec)
    try:
        nest = gpu_nest.match_recurrence(rec)
        refuse_i1_memrefs(nest.kernel_args)
    except Unsupported:
        if wrapper is not None:
            gpu_nest.unwrap_depth0(wrapper)
        raise
    keep = ((K * K + K) * items_per_thread <= KEEP_PAIRS_REGISTERS) if keep_pairs is None else keep_pairs
    name = kernel_name(top, "scan_linear")
    kfunc, el, K = _LinearKernel(nest, name, block_size, items_per_thread, keep).build()

    kmod = bg.get_kernel_module(top)
    stride = shared_stride(el, block_size)
    rows = {"sM": K * K * stride, "sV": K * stride, "sC": K}
    for suffix, n in rows.items():
        bg.shared_global(kmod, f"{name}_{suffix}", el, max(n, 1))
    kmod.body.block.add_op(kfunc)
    size = bg.byte_size(el)
    gpu_nest.launch_nest_kernel(
        nest,
        kfunc,
        block_size,
        shared_layout_bytes([n * size for n in rows.values() if n]),
        notes=(
            f"scan.linear_recurrence over "
            f"{'no channel loop (one block)' if wrapper is not None else f'{len(nest.loops)} channel loop(s)'}"
            f", state {K} x {el}; "
            f"block_size={block_size} items_per_thread={items_per_thread}; fused coeffs/emit, "
            f"{'kept' if keep else 'recomputed'} (M, v) pairs"
        ),
    )


def lower_linear_recurrences(
    top: ModuleOp, block_size: int, items_per_thread: int, keep_pairs: bool | None = None
) -> dict[scan.LinearRecurrenceOp, str]:
    """Lower every matching `scan.linear_recurrence`; returns why the others were left."""
    skipped: dict[scan.LinearRecurrenceOp, str] = {}
    for rec in [o for o in top.walk() if isinstance(o, scan.LinearRecurrenceOp)]:
        try:
            lower_linear_recurrence(rec, top, block_size, items_per_thread, keep_pairs)
        except Unsupported as why:
            skipped[rec] = str(why)
    return skipped


__all__ = ["MatArith", "lower_linear_recurrence", "lower_linear_recurrences"]
