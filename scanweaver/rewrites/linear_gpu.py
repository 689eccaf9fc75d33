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

from xdsl.dialects import memref
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


def _build_kernel(nest: gpu_nest.Nest, name: str, bs: int, ipt: int, keep: bool) -> tuple:
    rec = nest.rec
    assert isinstance(rec, scan.LinearRecurrenceOp)
    el = rec.state_type.element_type
    K = rec.size
    mat = MatArith(el, K)
    npair = K * K + K
    kk = gpu_nest.begin_nest_kernel(nest, name, el, (K,))
    e, vmap, tid, priv, trip, step_index = kk.e, kk.vmap, kk.tid, kk.priv, kk.trip, kk.step_index
    zero, one = e.index(0), e.index(1)

    def sh(suffix: str, rows: int) -> SSAValue:
        return e.val(memref.GetGlobalOp(f"{name}_{suffix}", MemRefType(el, [rows], memory_space=bg.SHARED_SPACE)))

    s_m, s_v, s_c = sh("sM", K * K * bs), sh("sV", K * bs), sh("sC", K)

    def init_carry(ie: Emitter) -> None:
        for j in range(K):
            ie.store(ie.load(kk.state_src, [ie.index(j)]), s_c, [ie.index(j)])

    e.if_(e.cmp("eq", tid, zero), [], init_carry)

    # -- split the regions, hoist what depends on neither the step nor the state --------
    cblock, eblock = rec.coeffs.block, rec.emit.block
    t_c = cblock.args[0]
    t_e, s_e = eblock.args
    yields = list(cblock.last_op.operands)  # type: ignore[union-attr]
    cs = gpu_nest.split_by_dependence(list(cblock.ops)[:-1], {t_c: frozenset("t")})
    es = gpu_nest.split_by_dependence(list(eblock.ops)[:-1], {t_e: frozenset("t"), s_e: frozenset("t")})
    for op in cs.consts + es.consts:
        e.op(op.clone(value_mapper=vmap))
    base = dict(vmap)
    hoisted = cs.hoist + es.hoist
    if hoisted:
        later = set(cs.per_step + es.per_step) | {cblock.last_op}
        need = gpu_nest.needed_values(hoisted, later)
        if need:
            types = [v.type for v in need]

            def hoist(ie: Emitter) -> list[SSAValue]:
                m = dict(vmap)
                for op in hoisted:
                    ie.op(op.clone(value_mapper=m))
                return [m[v] for v in need]

            vals = e.if_(e.cmp("sgt", trip, zero), types, hoist, lambda ie: [ie.const(0, t) for t in types])
            base.update(zip(need, vals))

    def produce(ie: Emitter, k: SSAValue) -> list[SSAValue]:
        m = {**base, t_c: step_index(ie, k)}
        for op in cs.per_step:
            ie.op(op.clone(value_mapper=m))
        return [m[v] for v in yields]

    def slot(ie: Emitter, c: int, x: SSAValue) -> SSAValue:
        return ie.add(x, ie.index(c * bs)) if c else x

    def load_pair(ie: Emitter, x: SSAValue) -> list[SSAValue]:
        return [ie.load(s_m, [slot(ie, c, x)]) for c in range(K * K)] + [
            ie.load(s_v, [slot(ie, c, x)]) for c in range(K)
        ]

    def store_pair(ie: Emitter, p: Sequence[SSAValue], x: SSAValue) -> None:
        for c in range(K * K):
            ie.store(p[c], s_m, [slot(ie, c, x)])
        for c in range(K):
            ie.store(p[K * K + c], s_v, [slot(ie, c, x)])

    tile = e.index(bs * ipt)
    ntiles = e.divu(e.add(trip, e.index(bs * ipt - 1)), tile)
    thread_base = e.mul(tid, e.index(ipt))
    last_k = e.sub(trip, one)
    last_stores = nest.last_stores

    guard = bg.needs_overflow_guard(el, bs)

    def tile_body(le: Emitter, tl: SSAValue, _: Sequence[SSAValue]) -> None:
        start = le.add(le.mul(tl, tile), thread_base)
        # 1. this thread's pairs (identity past the end), folded in step order.
        items = []
        agg: list[SSAValue] = []
        for j in range(ipt):
            k = le.add(start, le.index(j)) if j else start
            inside = le.cmp("ult", k, trip)
            pair = list(le.if_(inside, [el] * npair, lambda ie, k=k: produce(ie, k), mat.identity))
            items.append((k, inside, pair))
            agg = pair if j == 0 else mat.compose(le, agg, pair)
        store_pair(le, agg, tid)

        # 2. up-sweep with the pair composition.
        def up(ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
            store_pair(ie, mat.compose(ie, load_pair(ie, left), load_pair(ie, i)), i)

        bg.blelloch_levels(le, tid, bs, up, down=False)

        # 3. thread 0 seeds the root's vector with the carried state (and, overflow
        #    guard, flags a root that is not finite in the root's unused M slot).
        def seed(ie: Emitter) -> None:
            if guard:
                root = [ie.load(s_m, [ie.index(c * bs + bs - 1)]) for c in range(K * K)]
                root += [ie.load(s_v, [ie.index(c * bs + bs - 1)]) for c in range(K)]
                bg.flag_tile_root(ie, root, s_m, bs - 1)
            for c in range(K):
                ie.store(ie.load(s_c, [ie.index(c)]), s_v, [ie.index(c * bs + bs - 1)])

        le.if_(le.cmp("eq", tid, zero), [], seed)

        # 4. down-sweep on the state vectors (module doc).
        def down(ie: Emitter, i: SSAValue, left: SSAValue, d: int) -> None:
            s_parent = [ie.load(s_v, [slot(ie, c, i)]) for c in range(K)]
            m_left = [ie.load(s_m, [slot(ie, c, left)]) for c in range(K * K)]
            v_left = [ie.load(s_v, [slot(ie, c, left)]) for c in range(K)]
            for c in range(K):
                ie.store(s_parent[c], s_v, [slot(ie, c, left)])
            for c, x in enumerate(mat.apply(ie, m_left, s_parent, v_left)):
                ie.store(x, s_v, [slot(ie, c, i)])

        flag: list[SSAValue] = []
        bg.blelloch_levels(
            le, tid, bs, down, down=True,
            after_first_barrier=(lambda ie: flag.append(bg.read_tile_flag(ie, s_m, bs - 1))) if guard else None,
        )

        # 5. replay: in-range steps update the state and run the emit on it; a flagged
        #    tile takes its entering states in the loop's own order (blelloch_gpu).
        h = [le.load(s_v, [slot(le, c, tid)]) for c in range(K)]
        if guard:

            def own_steps(ie: Emitter, h: Sequence[SSAValue]) -> list[SSAValue]:
                h = list(h)
                for k, inside, pair in items:

                    def step(te: Emitter, k=k, pair=pair, h=h) -> list[SSAValue]:
                        m, v = mat.split(pair if keep else produce(te, k))
                        return mat.apply(te, m, h, v)

                    h = list(ie.if_(inside, [el] * K, step, lambda te, h=h: h))
                return h

            def store_carry(ie: Emitter, h: Sequence[SSAValue]) -> None:
                for c in range(K):
                    ie.store(h[c], s_c, [ie.index(c)])

            def exact(ie: Emitter) -> list[SSAValue]:
                return bg.sequential_entry_states(
                    ie, tid, bs, [el] * K, lambda te, j: [te.load(s_c, [te.index(c)]) for c in range(K)],
                    own_steps, store_carry,
                )

            h = list(le.if_(flag[0], [el] * K, exact, lambda ie, h=h: h))
        for k, inside, pair in items:

            def replay(ie: Emitter, k=k, pair=pair, h=h) -> list[SSAValue]:
                p = pair if keep else produce(ie, k)
                m, v = mat.split(p)
                new_h = mat.apply(ie, m, h, v)
                for c in range(K):
                    ie.store(new_h[c], priv, [ie.index(c)])
                is_last = ie.cmp("eq", k, last_k) if last_stores else None
                me = {**base, t_e: step_index(ie, k), s_e: priv}
                for op in es.per_step:
                    new = ie.op(op.clone(value_mapper=me))
                    if last_stores:
                        gpu_nest.guard_last_stores(op, new, last_stores, is_last)  # type: ignore[arg-type]
                return new_h

            h = list(le.if_(inside, [el] * K, replay, lambda ie, h=h: h))

        # 6. the last thread's final state is the next tile's carry.
        def publish(ie: Emitter, h: list[SSAValue] = h) -> None:
            for c in range(K):
                ie.store(h[c], s_c, [ie.index(c)])

        le.if_(le.cmp("eq", tid, le.index(bs - 1)), [], publish)

    e.for_(zero, ntiles, one, [], tile_body)
    gpu_nest.finish_nest_kernel(kk, K, s_c, lambda ie, j: [ie.index(j)])
    return kk.kfunc, el, K


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
    kfunc, el, K = _build_kernel(nest, name, block_size, items_per_thread, keep)

    kmod = bg.get_kernel_module(top)
    rows = {"sM": K * K * block_size, "sV": K * block_size, "sC": K}
    for suffix, n in rows.items():
        bg.shared_global(kmod, f"{name}_{suffix}", el, n)
    kmod.body.block.add_op(kfunc)
    size = bg.byte_size(el)
    gpu_nest.launch_nest_kernel(
        nest,
        kfunc,
        block_size,
        shared_layout_bytes([n * size for n in rows.values()]),
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
