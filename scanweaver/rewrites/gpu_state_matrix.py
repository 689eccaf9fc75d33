"""A 2-D recurrence state of any size whose emit sums over one state index, for the GPU.

Linear attention / RetNet with dynamic sizes D, E:

    S[d, e] = a(t, d, e) * S[d, e] + b(t, d, e)            (scan.recurrence, state S: D x E)
    emit:  for e < E { acc = init; for d < D { acc = acc + p(t, d, e, S[d, e]) }; out[t, e] = acc }

The register kernel (`recurrence_gpu.py`) holds at most 64 state elements, and the
split into one block per element (`gpu_split_state.py`) needs an emit that reads the
state element by element; here emit combines the elements of a column.  The kernel:

* one block per column e (the emit loop's state dimension), `bs` threads over the rows
  d in chunks of `bs` (at least one chunk, so D = 0 still writes `out = init`): thread
  `tid` owns S[d0 + tid, e] in a register for the whole time loop, read at the start
  and written back at the end;
* time runs in chunks of TC steps: each thread updates its state and computes its
  terms p(t, d, e) for TC steps into shared memory (the identity, -0.0 or 0, where
  d >= D or t is past the end), one barrier; then each thread sums TC terms of one
  step (TC steps x bs / TC parts), one barrier; then thread r < TC adds the parts of
  step t0 + r and writes out[t, e] = init + sum (first row chunk) or out[t, e] + sum
  (later ones: only that thread wrote it before).  Two barriers per TC steps.

Meaning kept: elements never interact in the update; emit at step t reads column e of
S after step t, which is what every thread has then.  The sum over d is *reassociated*
(per chunk of bs rows: parts of TC terms, then the parts), so float results differ
from the loop's left-to-right sum in the last bits (README "Numerics"); integers
(wrapping adds) are exact.  Matches (else `Unsupported`, nothing changed):
`scan.recurrence` with a rank-2 function-argument state of f32/f64/i32/i64 outside
channel loops; emit = pure ops + one `scf.for` over one state dimension (0 to its size
step 1) whose body is pure ops / loads, one `scf.for` over the other dimension carrying
one value with `acc + p` (`arith.addf` / `arith.addi`) as its last op, state loads
`s[d, e]` directly in it, and then one store of the sum to an argument memref,
indexed by the column and one element per step; no load reads that memref or the state
argument.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from xdsl.dialects import arith, gpu, memref, scf
from xdsl.dialects.builtin import Float32Type, Float64Type, IntegerType, MemRefType, ModuleOp
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.affine_to_pairs import Emitter
from scanweaver.rewrites.gpu_kernel import (
    Unsupported,
    block_id,
    check_closed,
    const_int,
    kernel_name,
    shared_layout_bytes,
    thread_id,
)
from scanweaver.rewrites.gpu_nest import (
    MAX_STATE,
    arg_name,
    emit_store_kind,
    launch_nest_kernel,
    match_state_matrix_nest,
    start_nest_kernel,
    trip_and_step_index,
)
from scanweaver.rewrites.gpu_split_state import StateDims, needs_split
from scanweaver.rewrites.launch import LAUNCH_ATTR, launch_from_attr

__all__ = ["lower_state_matrices", "lower_state_matrix", "match_state_matrix"]

#: Most steps per time chunk (terms staged in shared memory between two barriers).
MAX_TIME_CHUNK = 32
#: Shared memory the kernel may declare (bytes).
SHARED_BUDGET = 32 * 1024


@dataclass
class StateMatrix:
    """The matched emit (module doc): `col` loops over state dimension `j`, `red` over `i`."""

    rec: scan.RecurrenceOp
    i: int  # the summed state dimension (rows d)
    j: int  # the column dimension (one block each)
    col: scf.ForOp
    red: scf.ForOp
    term: SSAValue  # p, the value added to the carried sum
    add: Operation  # acc + p
    store: memref.StoreOp  # out[..] = sum
    state_loads: list[memref.LoadOp]

    @property
    def el(self) -> Attribute:
        return self.rec.state_type.element_type


def _is_plain_loop(loop: scf.ForOp) -> bool:
    return const_int(loop.lb) == 0 and const_int(loop.step) == 1


def _simple_ops(ops: list[Operation], where: str) -> None:
    for o in ops:
        if isinstance(o, memref.LoadOp | scf.YieldOp | scan.YieldOp):
            continue
        if o.regions or not is_side_effect_free(o) or any(isinstance(r.type, MemRefType) for r in o.results):
            raise Unsupported(f"{where}: '{o.name}' (only pure scalar ops and loads)")


def match_state_matrix(rec: scan.RecurrenceOp) -> StateMatrix:
    """The emit of `rec` as the module doc's form, or `Unsupported` with the reason."""
    st = rec.state_type
    if st.get_num_dims() != 2:
        raise Unsupported("a state matrix kernel needs a 2-D state")
    el = st.element_type
    if not (isinstance(el, Float32Type | Float64Type) or isinstance(el, IntegerType) and el.width.data in (32, 64)):
        raise Unsupported(f"a state matrix kernel takes f32, f64, i32 or i64 states, not {el}")
    dims = StateDims(rec)
    eblock = rec.emit.block
    s_e = eblock.args[1]
    loops = [o for o in eblock.ops if isinstance(o, scf.ForOp)]
    _simple_ops([o for o in eblock.ops if not isinstance(o, scf.ForOp)], "emit")
    if len(loops) != 1 or loops[0].iter_args or not _is_plain_loop(loops[0]):
        raise Unsupported("emit must be one loop from 0 step 1 over a state dimension (and pure ops)")
    col = loops[0]
    j = next((k for k in (0, 1) if dims.size(col.ub, k)), None)
    if j is None:
        raise Unsupported("emit's loop does not run over a state dimension")
    i = 1 - j
    cbody = list(col.body.block.ops)
    reds = [o for o in cbody if isinstance(o, scf.ForOp)]
    if len(reds) != 1 or len(reds[0].iter_args) != 1 or not _is_plain_loop(reds[0]) or not dims.size(reds[0].ub, i):
        raise Unsupported("emit's column loop must hold one loop over the other state dimension carrying one sum")
    red = reds[0]
    k = cbody.index(red)
    if len(cbody) != k + 3 or not isinstance(cbody[k + 1], memref.StoreOp):
        raise Unsupported("emit's column loop must end with the store of the sum, right after its loop")
    store = cbody[k + 1]
    assert isinstance(store, memref.StoreOp)
    _simple_ops(cbody[:k], "emit's column loop")
    rbody = list(red.body.block.ops)
    _simple_ops(rbody, "emit's sum loop")
    acc = red.body.block.args[1]
    add = rbody[-2] if len(rbody) >= 2 else None
    want = arith.AddfOp if isinstance(el, Float32Type | Float64Type) else arith.AddiOp
    if not isinstance(add, want) or rbody[-1].operands[0] is not add.results[0] or len(list(acc.uses)) != 1:
        raise Unsupported(f"emit's sum loop must end with '{want.name} %acc, %term' yielded")
    term = add.rhs if add.lhs is acc else add.lhs if add.rhs is acc else None
    if term is None or term is acc:
        raise Unsupported("emit's sum loop must add one term to the carried sum")
    # the state: read as s[d, e] right in the sum loop (dims anywhere)
    d_iv, e_iv = red.body.block.args[0], col.body.block.args[0]
    loads: list[memref.LoadOp] = []
    for use in s_e.uses:
        o = use.operation
        if isinstance(o, memref.DimOp):
            continue
        idx = [d_iv, e_iv] if i == 0 else [e_iv, d_iv]
        if not isinstance(o, memref.LoadOp) or list(o.indices) != idx or o.parent_block() is not red.body.block:
            raise Unsupported("emit reads the state other than s[d, e] in its sum loop")
        loads.append(o)
    # the store: the sum, to an argument memref, one element per (step, column)
    out = store.memref
    if store.value is not red.results[0] or out is rec.state or out is s_e:
        raise Unsupported("emit must store the sum itself, to a memref other than the state")
    idx = list(store.indices)
    kind = emit_store_kind(eblock, store)
    if e_iv not in idx or kind is None or kind[0] != "inj" or idx[kind[1]] is e_iv:
        raise Unsupported("emit's store must be indexed by the column and write one element per step")
    # nothing reads the output or the state argument; nothing else writes memory
    for region in (rec.coeffs, rec.emit):
        for o in region.walk():
            if isinstance(o, memref.LoadOp) and o.memref in (out, rec.state):
                raise Unsupported("the recurrence reads the memref its sum is stored to, or the state argument")
            if isinstance(o, memref.StoreOp) and o is not store:
                raise Unsupported("the recurrence writes memory other than its sum")
            if not (isinstance(o, memref.LoadOp | memref.StoreOp | scf.IfOp | scf.YieldOp | scan.YieldOp)
                    or o is col or o is red or not o.regions and is_side_effect_free(o)):
                raise Unsupported(f"'{o.name}' in the recurrence is not supported in a state matrix kernel")
    return StateMatrix(rec, i, j, col, red, term, add, store, loads)


def _time_chunk(bs: int, el_bytes: int) -> int:
    """TC: a power of two dividing bs with TC * (bs + 1) + bs elements within the budget."""
    tc = min(MAX_TIME_CHUNK, bs)
    while tc > 1 and (tc * (bs + 1) + bs) * el_bytes > SHARED_BUDGET:
        tc //= 2
    return tc


class _Builder:
    """The kernel of one matched recurrence (module doc)."""

    def __init__(self, sm: StateMatrix, e: Emitter, vmap: dict[SSAValue, SSAValue], kstate: SSAValue):
        self.sm, self.e, self.vmap, self.kstate = sm, e, vmap, kstate
        self.is_float = isinstance(sm.el, Float32Type | Float64Type)

    def add(self, e: Emitter, x: SSAValue, y: SSAValue) -> SSAValue:
        return e.val(arith.AddfOp(x, y) if self.is_float else arith.AddiOp(x, y))

    def identity(self, e: Emitter) -> SSAValue:
        return e.const(-0.0 if self.is_float else 0, self.sm.el)  # x + identity == x, bit for bit

    def column_values(self, e: Emitter, t: SSAValue, col: SSAValue) -> dict[SSAValue, SSAValue]:
        """Emit's ops before its column loop and the column body's ops before the sum
        loop, cloned at `e` for step `t` and column `col`: the value map."""
        sm = self.sm
        eblock = sm.rec.emit.block
        m = dict(self.vmap)
        m.update({eblock.args[0]: t, eblock.args[1]: self.kstate, sm.col.body.block.args[0]: col})
        for o in eblock.ops:
            if o is sm.col:
                break
            e.op(o.clone(value_mapper=m))
        for o in sm.col.body.block.ops:
            if o is sm.red:
                break
            e.op(o.clone(value_mapper=m))
        return m

    def coeffs(self, e: Emitter, t: SSAValue, d: SSAValue, col: SSAValue) -> tuple[SSAValue, SSAValue]:
        cblock = self.sm.rec.coeffs.block
        ks = [d, col] if self.sm.i == 0 else [col, d]
        m = dict(self.vmap)
        m.update(zip(cblock.args, [t, *ks]))
        for o in cblock.ops:
            if isinstance(o, scan.YieldOp):
                return m.get(o.operands[0], o.operands[0]), m.get(o.operands[1], o.operands[1])
            e.op(o.clone(value_mapper=m))
        raise AssertionError("coeffs without scan.yield")

    def term(self, e: Emitter, t: SSAValue, d: SSAValue, col: SSAValue, h: SSAValue) -> SSAValue:
        """p(t, d, col) with the state element `h`: the sum loop's body up to its add."""
        sm = self.sm
        m = self.column_values(e, t, col)
        m[sm.red.body.block.args[0]] = d
        for o in sm.red.body.block.ops:
            if o is sm.add:
                break
            if o in sm.state_loads:
                m[o.results[0]] = h
                continue
            e.op(o.clone(value_mapper=m))
        return m.get(sm.term, sm.term)

    def update(self, e: Emitter, a: SSAValue, h: SSAValue, b: SSAValue) -> SSAValue:
        """a * h + b, rounded twice (the recurrence's meaning)."""
        if self.is_float:
            return e.val(arith.AddfOp(e.val(arith.MulfOp(a, h)), b))
        return e.val(arith.AddiOp(e.val(arith.MuliOp(a, h)), b))


def lower_state_matrix(rec: scan.RecurrenceOp, top: ModuleOp, bs: int) -> None:
    """Replace `rec` by the state matrix kernel's launch (module doc), or raise `Unsupported`."""
    sm = match_state_matrix(rec)
    nest = match_state_matrix_nest(rec, sm.j)
    el = sm.el
    el_bytes = bg.byte_size(el)
    tc = _time_chunk(bs, el_bytes)
    parts = bs // tc
    name = kernel_name(top, "state_matrix")
    kfunc, e, vmap = start_nest_kernel(nest, name)
    kstate, kout = vmap[rec.state], vmap[sm.store.memref]
    b = _Builder(sm, e, vmap, kstate)
    tid, col = thread_id(e), block_id(e)
    p_t = MemRefType(el, [tc * (bs + 1)], memory_space=bg.SHARED_SPACE)
    q_t = MemRefType(el, [bs], memory_space=bg.SHARED_SPACE)
    sp = e.val(memref.GetGlobalOp(f"{name}_p", p_t))
    sq = e.val(memref.GetGlobalOp(f"{name}_q", q_t))
    zero, one = e.index(0), e.index(1)
    bs_c, bs1_c, tc_c, parts_c = e.index(bs), e.index(bs + 1), e.index(tc), e.index(parts)
    rows = e.dim(kstate, sm.i)
    trip, step_index = trip_and_step_index(e, rec, vmap)
    row_chunks = e.divu(e.add(e.val(arith.MaxUIOp(rows, one)), e.index(bs - 1)), bs_c)  # at least one
    time_chunks = e.divu(e.add(trip, e.index(tc - 1)), tc_c)

    def row_chunk(de: Emitter, c: SSAValue, _) -> None:
        d = de.add(de.mul(c, bs_c), tid)
        active = de.cmp("ult", d, rows)
        at = [d, col] if sm.i == 0 else [col, d]
        h0 = de.if_(active, [el], lambda ie: [ie.load(kstate, at)], lambda ie: [b.identity(ie)])[0]

        def time_chunk(te: Emitter, tchunk: SSAValue, hs) -> list[SSAValue]:
            t0 = te.mul(tchunk, tc_c)

            def step(se: Emitter, k: SSAValue, hk) -> list[SSAValue]:
                s = se.add(t0, k)
                valid = se.val(arith.AndIOp(active, se.cmp("ult", s, trip)))

                def run(ie: Emitter) -> list[SSAValue]:
                    t = step_index(ie, s)
                    a, bb = b.coeffs(ie, t, d, col)
                    hn = b.update(ie, a, hk[0], bb)
                    return [hn, b.term(ie, t, d, col, hn)]

                hn, p = se.if_(valid, [el, el], run, lambda ie: [hk[0], b.identity(ie)])
                se.store(p, sp, [se.add(se.mul(k, bs1_c), tid)])
                return [hn]

            h = te.for_(zero, tc_c, one, [hs[0]], step)
            te.op(gpu.BarrierOp())
            r, part = te.remu(tid, tc_c), te.divu(tid, tc_c)
            base = te.add(te.mul(r, bs1_c), te.mul(part, tc_c))
            partial = te.for_(zero, tc_c, one, [b.identity(te)],
                              lambda fe, x, acc: [b.add(fe, acc[0], fe.load(sp, [fe.add(base, x)]))])[0]
            te.store(partial, sq, [te.add(te.mul(part, tc_c), r)])
            te.op(gpu.BarrierOp())

            def write(we: Emitter) -> None:
                total = we.for_(zero, parts_c, one, [b.identity(we)],
                                lambda xe, pp, acc: [b.add(xe, acc[0], xe.load(sq, [xe.add(xe.mul(pp, tc_c), tid)]))])[0]
                t = step_index(we, we.add(t0, tid))
                m = b.column_values(we, t, col)
                idx = [m.get(x, x) for x in sm.store.indices]
                init = sm.red.iter_args[0]
                before = we.if_(we.cmp("eq", c, zero), [el], lambda ie: [m.get(init, init)],
                                lambda ie: [ie.load(kout, idx)])[0]
                we.store(b.add(we, before, total), kout, idx)

            mine = te.val(arith.AndIOp(te.cmp("ult", tid, tc_c), te.cmp("ult", te.add(t0, tid), trip)))
            te.if_(mine, [], write)
            return list(h)

        h = de.for_(zero, time_chunks, one, [h0], time_chunk)[0]
        de.if_(active, [], lambda ie: ie.store(h, kstate, at))

    e.for_(zero, row_chunks, one, [], row_chunk)
    e.op(gpu.ReturnOp([]))
    check_closed(kfunc)

    # -- commit ---------------------------------------------------------------------------------
    kmod = bg.get_kernel_module(top)
    bg.shared_global(kmod, f"{name}_p", el, tc * (bs + 1))
    bg.shared_global(kmod, f"{name}_q", el, bs)
    kmod.body.block.add_op(kfunc)
    covers = _covered_by_state(sm, nest)
    launch_nest_kernel(
        nest, kfunc, bs, shared_layout_bytes([tc * (bs + 1) * el_bytes, bs * el_bytes]),
        notes=(f"scan.recurrence, state matrix {bg.type_name(el)} (dynamic or over {MAX_STATE} elements) "
               f"with a sum over state dimension {sm.i} in emit: one block per index of dimension {sm.j}, "
               f"threads over rows in chunks of {bs}, {tc}-step time chunks; the sum reassociated"),
    )
    desc = launch_from_attr(kfunc.attributes[LAUNCH_ATTR])  # type: ignore[arg-type]
    kfunc.attributes[LAUNCH_ATTR] = dataclasses.replace(
        desc, covers_dims=tuple(sorted(set(desc.covers_dims) | set(covers)))).to_attr()


def _covered_by_state(sm: StateMatrix, nest) -> list[tuple[str, int, str, int]]:
    """(arg, dim, state, state dim): where the row or column index (coeffs' state
    indices, emit's loop variables) indexes another argument, it must be that large."""
    rec = sm.rec
    state = rec.state
    names = {a: arg_name(nest, a) for a in nest.kernel_args}
    cargs = rec.coeffs.block.args
    of = {cargs[1]: 0, cargs[2]: 1, sm.red.body.block.args[0]: sm.i, sm.col.body.block.args[0]: sm.j}
    out = []
    for region in (rec.coeffs, rec.emit):
        for o in region.walk():
            if isinstance(o, memref.LoadOp | memref.StoreOp) and o.memref in names:
                for pos, x in enumerate(o.indices):
                    if x in of and (o.memref, pos) != (state, of[x]):
                        out.append((names[o.memref], pos, names[state], of[x]))
    return out


def lower_state_matrices(top: ModuleOp, refused: dict[Operation, str], bs: int) -> dict[Operation, str]:
    """Retry the recurrences the register and split kernels refused (`refused`: op ->
    reason) whose 2-D state is dynamic or too large for registers; returns the ops still
    refused, with both reasons where this kernel does not take one either."""
    left: dict[Operation, str] = {}
    for op, why in refused.items():
        if isinstance(op, scan.RecurrenceOp) and op.state_type.get_num_dims() == 2 and needs_split(op, MAX_STATE):
            try:
                lower_state_matrix(op, top, bs)
                continue
            except Unsupported as other:
                why = f"{why}; nor as a state matrix (one block per column): {other}"
        left[op] = why
    return left
