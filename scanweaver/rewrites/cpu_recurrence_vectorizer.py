"""`scan.recurrence` with a rank-1 static state: the state vector in registers,
the `coeffs`/`emit` regions vectorised over it (see `scan_to_cpu`'s docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.dialects import arith, func, memref, scf, vector
from xdsl.dialects.builtin import Float32Type, Float64Type, IndexType, IntegerAttr, UnitAttr, VectorType, i64
from xdsl.dialects.utils.fast_math import FastMathFlag
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.rewriter import InsertPoint
from xdsl.traits import is_side_effect_free, IsTerminator

from scanweaver.dialects import scan
from scanweaver.errors import CannotLower
from scanweaver.rewrites.cpu_blocked_dot import DotPlan, TreeSums, dot_plan
from scanweaver.rewrites.cpu_vector_builders import _B, _element_bits, _identity_layout, _res, _step
from scanweaver.rewrites.exp_polynomial import generic_op_class
from scanweaver.rewrites.loop_utils import for_loop

# ---------------------------------------------------------------------------
# scan.recurrence: the state vector in registers, regions vectorised over it
# ---------------------------------------------------------------------------


#: The vectoriser does not handle this recurrence (the sequential lowering will).
_Unsupported = CannotLower


_REDUCTIONS: dict[type, vector.CombiningKindFlag] = {
    arith.AddfOp: vector.CombiningKindFlag.ADD,
    arith.AddiOp: vector.CombiningKindFlag.ADD,
    arith.MulfOp: vector.CombiningKindFlag.MUL,
    arith.MuliOp: vector.CombiningKindFlag.MUL,
    arith.MaximumfOp: vector.CombiningKindFlag.MAXIMUMF,
    arith.MinimumfOp: vector.CombiningKindFlag.MINIMUMF,
    arith.MaxnumfOp: vector.CombiningKindFlag.MAXNUMF,
    arith.MinnumfOp: vector.CombiningKindFlag.MINNUMF,
    arith.MaxSIOp: vector.CombiningKindFlag.MAXSI,
    arith.MinSIOp: vector.CombiningKindFlag.MINSI,
    arith.AndIOp: vector.CombiningKindFlag.AND,
    arith.OrIOp: vector.CombiningKindFlag.OR,
    arith.XOrIOp: vector.CombiningKindFlag.XOR,
}

MAX_STATE_LANES = 64


@dataclass
class _Val:
    """How an original SSA value lives in the vectorised loop.

    kind "u": uniform (one scalar, `new`); "v": varying (`new` is vector<N>);
    "i": an index equal to the state index plus `new` (`const` when known);
    "state": the state memref (its elements are the register vector).
    """

    kind: str
    new: SSAValue | None = None
    const: int | None = None


def _vectorised(op: Operation, operands: Sequence[SSAValue], lanes: int) -> Operation:
    """The elementwise `op` on vector operands (a generic twin where xDSL wants scalars)."""
    from scanweaver.rewrites.exp_polynomial import vector_compatible

    new = type(op).create(
        operands=list(operands),
        result_types=[VectorType(r.type, [lanes]) for r in op.results],
        properties=dict(op.properties),
        attributes=dict(op.attributes),
    )
    return vector_compatible(new)


#: Steps per block of the time-vectorised prologue of a recurrence.
TIME_BLOCK = 16


@dataclass
class _HoistPlan:
    """Ops of the regions that depend on time only, computed T steps at a time.

    kinds: result -> "inv" (loop-invariant scalar) or "tv" (vector over T steps).
    exported: hoisted values the per-step code uses.
    """

    ops: list[Operation]
    kinds: dict[SSAValue, str]
    exported: list[SSAValue]


def _const_int(v: SSAValue) -> int | None:
    owner = v.owner
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return owner.value.value.data
    return None


class _RecurrenceVectorizer:
    #: Whether the blocked loop reads time-vectorised values through `_step_buffers`
    #: (else by a vector.extract per step; the same bits, tests compare the two).  Off:
    #: the extracts (a permute per step and value, 3 more instructions per selective
    #: step) ran the selective kernel 8-14% faster than the buffers' volatile loads
    #: (thread CPU time, medians of 7-11 interleaved calls in one process, at
    #: (2, 1536, 16, 1024) and (1, 256, 16, 2048) on one thread, (2, 768, 16, 2048) and
    #: (2, 1536, 16, 1024) on two; load 5-6 on this 2-core machine).  A double-buffered
    #: variant (each block's values stored one block ahead, plain or volatile loads) was
    #: slower than either.
    STEP_BUFFERS = False
    #: Whether each time block's prologue is computed one block ahead, in the previous
    #: iteration (software pipelining; the same ops and bits, tests compare the two).
    PIPELINED = True

    def __init__(self, op: scan.RecurrenceOp, reassoc: bool):
        self.op = op
        st = op.state_type
        self.N = st.get_shape()[0]
        self.el = st.element_type
        self.vt = VectorType(self.el, [self.N])
        self.reassoc = reassoc
        self.needs_state_store = False
        self.state_values = {op.state, op.emit.block.args[1]}
        self.state_vec: SSAValue | None = None
        self.skip: set[Operation] = set()
        self.dot: DotPlan | None = None  # the emit's dot product reduced a time block at a time
        self.deferred: TreeSums | None = None  # its per-step products in the block, summed

    # -- values ------------------------------------------------------------

    def val(self, env: dict[SSAValue, _Val], v: SSAValue) -> _Val:
        if v in env:
            return env[v]
        if v in self.state_values:
            return _Val("state")
        return _Val("u", v)  # defined outside the regions: loop-invariant

    def uniform(self, env, v: SSAValue) -> SSAValue:
        x = self.val(env, v)
        if x.kind != "u":
            raise _Unsupported(f"value {v} is not uniform")
        assert x.new is not None
        return x.new

    def as_vector(self, b: _B, env, v: SSAValue) -> SSAValue:
        x = self.val(env, v)
        if x.kind == "v":
            assert x.new is not None
            return x.new
        if x.kind == "u":
            assert x.new is not None
            t = x.new.type
            if isinstance(t, IndexType | VectorType):
                raise _Unsupported("cannot broadcast this value")
            return b.splat(x.new, VectorType(t, [self.N]))
        raise _Unsupported(f"cannot use {x.kind} value {v} as a vector")

    def lane_index(self, b: _B, x: _Val, n: int) -> SSAValue:
        assert x.new is not None
        return b.add(x.new, b.idx(n)) if n else x.new

    # -- cloning uniform ops -------------------------------------------------

    def _outside_refs(self, op: Operation) -> list[SSAValue]:
        """Operands used in op (nested regions included) that are defined outside it."""
        inner: set[SSAValue] = set()
        for o in op.walk():
            inner.update(o.results)
            for r in o.regions:
                for blk in r.blocks:
                    inner.update(blk.args)
        refs = []
        for o in op.walk():
            for v in o.operands:
                if v not in inner:
                    refs.append(v)
        return refs

    def clone_uniform(self, b: Builder, env, op: Operation) -> None:
        mapper: dict[SSAValue, SSAValue] = {}
        for v in self._outside_refs(op):
            x = self.val(env, v)
            if x.kind == "state":
                self.needs_state_store = True
                mapper[v] = self.op.state
            elif x.kind == "u":
                assert x.new is not None
                mapper[v] = x.new
            else:
                raise _Unsupported(f"'{op.name}' uses a value that depends on the state index")
        new = b.insert(op.clone(value_mapper=mapper))
        for old, nv in zip(op.results, new.results):
            env[old] = _Val("u", nv)

    # -- one block -----------------------------------------------------------

    def block(self, b: Builder, block: Block, env: dict[SSAValue, _Val], in_vector_loop: bool) -> list[SSAValue]:
        """Vectorise `block` into `b`; return the (original) values its terminator yields."""
        for op in block.ops:
            if op is block.last_op and op.has_trait(IsTerminator):
                return list(op.operands)
            if op in self.skip:
                continue  # computed for a whole block of steps (time-vectorised)
            self.one(b, op, env, in_vector_loop)
        return []

    def one(self, b: Builder, op: Operation, env, in_vector_loop: bool) -> None:
        bb = _B(b)
        kinds = [self.val(env, v).kind for v in op.operands]
        if isinstance(op, memref.LoadOp):
            self.load(bb, op, env, kinds)
            return
        if isinstance(op, memref.StoreOp):
            self.store(bb, op, env, kinds, in_vector_loop)
            return
        if isinstance(op, scf.ForOp) and self.is_state_loop(op):
            if in_vector_loop:
                raise _Unsupported("nested loops over the state")
            self.vector_loop(b, op, env)
            return
        if op.regions or all(k == "u" for k in kinds):
            if in_vector_loop and not is_side_effect_free(op) and not isinstance(op, memref.LoadOp):
                # Run once instead of N times: only sound for pure ops.
                raise _Unsupported(f"'{op.name}' with side effects inside a loop over the state")
            self.clone_uniform(b, env, op)
            return
        if "state" in kinds:
            raise _Unsupported(f"'{op.name}' uses the state memref")
        if isinstance(op, arith.AddiOp | arith.SubiOp) and "i" in kinds:
            x, y = (self.val(env, v) for v in op.operands)
            if isinstance(op, arith.AddiOp) and x.kind == "u" and y.kind == "i":
                x, y = y, x
            if x.kind == "i" and y.kind == "u":
                assert x.new is not None and y.new is not None
                c = _const_int(y.new)
                if isinstance(op, arith.AddiOp):
                    env[op.results[0]] = _Val("i", bb.add(x.new, y.new), None if x.const is None or c is None else x.const + c)
                else:
                    env[op.results[0]] = _Val("i", bb.sub(x.new, y.new), None if x.const is None or c is None else x.const - c)
                return
            raise _Unsupported("unsupported arithmetic on the state index")
        if "i" in kinds:
            raise _Unsupported(f"'{op.name}' on the state index")
        if op.dialect_name() not in ("arith", "math"):
            raise _Unsupported(f"'{op.name}' on values that depend on the state index")
        operands = [self.as_vector(bb, env, v) for v in op.operands]
        new = b.insert(_vectorised(op, operands, self.N))
        for old, nv in zip(op.results, new.results):
            env[old] = _Val("v", nv)

    def _contiguous_last(self, ref: SSAValue, kinds: list[str]) -> bool:
        """Only the last index varies (as state index + offset) on a unit-stride dim."""
        if "v" in kinds or kinds.count("i") != 1 or kinds[-1] != "i":
            return False
        return _identity_layout(ref.type)

    def load(self, bb: _B, op: memref.LoadOp, env, kinds) -> None:
        ref_kind, idx_kinds = kinds[0], kinds[1:]
        res = op.results[0]
        if ref_kind == "state":
            (x,) = (self.val(env, v) for v in op.indices)
            assert self.state_vec is not None
            if x.kind == "i" and x.const == 0:
                env[res] = _Val("v", self.state_vec)
            elif x.kind == "u":
                assert x.new is not None
                env[res] = _Val("u", bb.ins(vector.ExtractOp(self.state_vec, [x.new], self.el)))
            else:
                raise _Unsupported("state read at a shifted index")
            return
        if all(k == "u" for k in kinds):
            self.clone_uniform(bb.b, env, op)
            return
        if ref_kind != "u" or "v" in idx_kinds:
            raise _Unsupported("load through a varying index")
        ref = self.uniform(env, op.memref)
        xs = [self.val(env, v) for v in op.indices]
        if self._contiguous_last(op.memref, idx_kinds):
            index = [x.new for x in xs]
            env[res] = _Val("v", bb.ins(vector.LoadOp(ref, index, VectorType(res.type, [self.N]))))
            return
        # Gather: one scalar load per lane.
        vec = None
        for n in range(self.N):
            index = [self.lane_index(bb, x, n) if x.kind == "i" else x.new for x in xs]
            scalar = bb.ins(memref.LoadOp.get(ref, index))
            if vec is None:
                vec = bb.splat(scalar, VectorType(res.type, [self.N]))
            else:
                vec = bb.ins(vector.InsertOp(scalar, vec, [n]))
        env[res] = _Val("v", vec)

    def store(self, bb: _B, op: memref.StoreOp, env, kinds, in_vector_loop: bool) -> None:
        value_kind, ref_kind, idx_kinds = kinds[0], kinds[1], kinds[2:]
        if ref_kind == "state":
            raise _Unsupported("emit writes the state")
        if all(k == "u" for k in kinds):
            if in_vector_loop:
                raise _Unsupported("a store to one location inside a loop over the state")
            self.clone_uniform(bb.b, env, op)
            return
        if ref_kind != "u" or "v" in idx_kinds or value_kind not in ("u", "v"):
            raise _Unsupported("store through a varying index")
        ref = self.uniform(env, op.memref)
        xs = [self.val(env, v) for v in op.indices]
        if "i" not in idx_kinds:
            raise _Unsupported("varying value stored to one location")
        value = self.as_vector(bb, env, op.value)
        if self._contiguous_last(op.memref, idx_kinds):
            bb.b.insert(vector.StoreOp(value, ref, [x.new for x in xs]))
            return
        for n in range(self.N):  # scatter
            index = [self.lane_index(bb, x, n) if x.kind == "i" else x.new for x in xs]
            lane = bb.ins(vector.ExtractOp(value, [n], value.type.element_type))  # type: ignore[attr-defined]
            bb.b.insert(memref.StoreOp.get(lane, ref, index))

    # -- loops over the state index --------------------------------------------

    def is_state_loop(self, op: scf.ForOp) -> bool:
        if _const_int(op.lb) != 0 or _const_int(op.step) != 1:
            return False
        ub = op.ub
        if _const_int(ub) != self.N:
            owner = ub.owner
            if not (isinstance(owner, memref.DimOp) and owner.source in self.state_values):
                return False
        iv = op.body.block.args[0]
        return bool(iv.uses) or any(v in self.state_values for v in self._outside_refs(op))

    def vector_loop(self, b: Builder, op: scf.ForOp, env) -> None:
        """`for n in 0..N` with reductions in iter_args -> vector code + vector.reduction."""
        bb = _B(b)
        block = op.body.block
        iv, accs = block.args[0], list(block.args[1:])
        yield_op = block.last_op
        assert yield_op is not None
        yielded = list(yield_op.operands)
        combine: dict[int, tuple[Operation, SSAValue]] = {}
        for pos, acc in enumerate(accs):
            uses = list(acc.uses)
            if len(uses) != 1:
                raise _Unsupported("loop-carried value that is not a reduction")
            user = uses[0].operation
            kind = _REDUCTIONS.get(type(user))
            if kind is None or user.results[0] is not yielded[pos] or len(list(user.results[0].uses)) != 1:
                raise _Unsupported("loop-carried value that is not a reduction")
            other = user.operands[1] if user.operands[0] is acc else user.operands[0]
            if other is acc:
                raise _Unsupported("reduction of the accumulator with itself")
            combine[pos] = (user, other)
        skip = {user for user, _ in combine.values()}
        inner = dict(env)
        inner[iv] = _Val("i", bb.idx(0), 0)
        for a in accs:
            inner[a] = _Val("acc")
        for inner_op in block.ops:
            if inner_op is yield_op or inner_op in skip:
                continue
            self.one(b, inner_op, inner, True)
        if self.deferred is not None and self.dot is not None and op is self.dot.loop:
            self._defer_dot(bb, op, env, inner, combine)
            return
        for pos, (user, other) in combine.items():
            x = self.as_vector(bb, inner, other)
            init = self.uniform(env, op.iter_args[pos])
            fm = None
            if self.reassoc and isinstance(init.type, Float32Type | Float64Type):
                fm = arith.FastMathFlagsAttr([FastMathFlag.REASSOC])
            red = vector.ReductionOp.build(
                operands=[x, init],
                result_types=[init.type],
                properties={"kind": vector.CombiningKindAttr(_REDUCTIONS[type(user)]),
                            **({"fastmath": fm} if fm is not None else {})},
            )
            env[op.results[pos]] = _Val("u", _res(b.insert(red)))

    # -- time-vectorised prologue ------------------------------------------------

    def hoist_plan(self) -> _HoistPlan | None:
        """Which region ops depend on time only (and whether blocking them pays)."""
        op = self.op
        if _const_int(op.step) != 1:
            return None
        inside: set[SSAValue] = set()
        for o in op.walk():
            if o is op:
                continue
            inside.update(o.results)
        for region in op.regions:
            inside.update(region.block.args)
        written = {o.memref for o in op.walk() if isinstance(o, memref.StoreOp)}
        kinds: dict[SSAValue, str] = {}
        ops: list[Operation] = []
        expensive = False
        for region in (op.coeffs, op.emit):
            time_arg = region.block.args[0]
            for o in region.block.ops:
                if o.has_trait(IsTerminator):
                    continue
                kind = self._hoist_kind(o, kinds, inside, written, time_arg)
                if kind is None:
                    continue
                ops.append(o)
                for r in o.results:
                    kinds[r] = kind
                if kind == "tv" and (o.dialect_name() == "math" or isinstance(o, arith.DivfOp)):
                    expensive = True
        if not expensive:
            return None
        hoisted = set(ops)
        exported = [
            v for o in ops for v in o.results if any(u.operation not in hoisted for u in v.uses)
        ]
        return _HoistPlan(ops, kinds, exported)

    def _hoist_kind(self, o: Operation, kinds, inside, written, time_arg) -> str | None:
        def kind_of(v: SSAValue) -> str | None:
            if v is time_arg:
                return "time"
            if v in kinds:
                return kinds[v]
            if v not in inside and v not in self.state_values:
                return "inv"
            return None

        if isinstance(o, arith.ConstantOp):
            return "inv"
        ks = [kind_of(v) for v in o.operands]
        if None in ks:
            return None
        if isinstance(o, memref.LoadOp):
            if o.memref in written or ks[0] != "inv":
                return None
            idx = ks[1:]
            if all(k == "inv" for k in idx):
                return "inv"
            if idx and idx[-1] == "time" and all(k == "inv" for k in idx[:-1]):
                return "tv" if _identity_layout(o.memref.type) else None
            return None
        if o.regions or o.dialect_name() not in ("arith", "math") or not is_side_effect_free(o):
            return None
        if "time" in ks:
            return None  # index arithmetic on the step: per step
        if "tv" not in ks:
            return "inv"
        if any(isinstance(r.type, IndexType | VectorType) for r in o.results):
            return None
        return "tv"

    def prologue(self, b: Builder, i0: SSAValue, plan: _HoistPlan) -> dict[SSAValue, SSAValue]:
        """The hoisted ops for steps i0 .. i0+T-1: scalars ("inv") and vector<T> ("tv")."""
        bb = _B(b)
        vals: dict[SSAValue, SSAValue] = {}
        get = lambda v: vals.get(v, v)  # noqa: E731 - defined outside: itself
        for o in plan.ops:
            kind = plan.kinds[o.results[0]] if o.results else "inv"
            if kind == "inv":
                new = b.insert(o.clone(value_mapper={v: get(v) for v in o.operands}))
            elif isinstance(o, memref.LoadOp):
                index = [get(v) for v in o.indices[:-1]] + [i0]
                res_t = VectorType(o.results[0].type, [TIME_BLOCK])
                new = b.insert(vector.LoadOp(get(o.memref), index, res_t))
            else:
                operands = [
                    vals[v] if plan.kinds.get(v) == "tv" else bb.splat(get(v), VectorType(v.type, [TIME_BLOCK]))
                    for v in o.operands
                ]
                new = b.insert(_vectorised(o, operands, TIME_BLOCK))
            for r, nr in zip(o.results, new.results):
                vals[r] = nr
        return vals

    # -- the emit's dot product a time block at a time (cpu_blocked_dot) ---------

    def _defer_dot(self, bb: _B, op: scf.ForOp, env, inner, combine) -> None:
        """Keep this step's product vector; the sum comes in `_blocked_output`."""
        ((_, other),) = combine.values()
        assert self.deferred is not None
        self.deferred.push(self.as_vector(bb, inner, other))
        env[op.results[0]] = _Val("u", self.uniform(env, op.iter_args[0]))  # unused: the ops after it are skipped

    def _blocked_output(self, b: Builder, i0: SSAValue, vals: dict[SSAValue, SSAValue], plan: _HoistPlan) -> None:
        """The block's dot products (`TreeSums`), then the ops after the reduction and
        the store, vectorised over the block's steps."""
        assert self.dot is not None and self.deferred is not None
        bb = _B(b)
        T = TIME_BLOCK
        get = lambda v: vals.get(v, v)  # noqa: E731 - defined outside the regions: itself
        start = get(self.dot.loop.iter_args[0])
        over_time: dict[SSAValue, SSAValue] = {self.dot.loop.results[0]: self.deferred.result(bb, start)}
        self.deferred = None

        def operand(v: SSAValue) -> SSAValue:
            if v in over_time:
                return over_time[v]
            if plan.kinds.get(v) == "tv":
                return vals[v]
            return bb.splat(get(v), VectorType(v.type, [T]))

        for o in self.dot.post:
            new = b.insert(_vectorised(o, [operand(v) for v in o.operands], T))
            for r, nr in zip(o.results, new.results):
                over_time[r] = nr
        store = self.dot.store
        index = [get(v) for v in store.indices[:-1]] + [i0]
        b.insert(vector.StoreOp(over_time[store.value], get(store.memref), index))

    # -- the time-vectorised values, read back one step at a time ----------------

    def _step_buffers(self, plan: _HoistPlan, skipped: set[Operation]) -> dict[SSAValue, tuple[SSAValue, SSAValue]]:
        """Per exported vector<T> value of 32/64-bit element type that a step's code
        uses (an op outside `skipped`), a T-element stack buffer made at the function's
        entry and its address (i64): each block stores the value there and each step
        reads its element (`_step_value`).  Empty when the recurrence is not in a plain
        nest of scf.for / scf.if in a func.func (a parallel region would share it)."""
        if not self.STEP_BUFFERS:
            return {}
        fn = self.op.parent_op()
        while fn is not None and not isinstance(fn, func.FuncOp):
            if not isinstance(fn, scf.ForOp | scf.IfOp):
                return {}
            fn = fn.parent_op()
        if fn is None or not fn.body.blocks:
            return {}
        at = Builder(InsertPoint.at_start(fn.body.blocks[0]))
        addresses = {}
        for v in plan.exported:
            if plan.kinds[v] != "tv" or _element_bits(v.type) is None \
                    or all(u.operation in skipped for u in v.uses):
                continue
            buf = _res(at.insert(memref.AllocaOp.get(v.type, alignment=64, shape=[TIME_BLOCK])))  # one line
            base = _res(at.insert(memref.ExtractAlignedPointerAsIndexOp.get(buf)))
            addresses[v] = (buf, _res(at.insert(arith.IndexCastOp(base, i64))))
        return addresses

    def _step_value(self, bb: _B, buffer, j: int, v: SSAValue) -> SSAValue:
        """Element j of the buffer as a volatile load: the load stays a load, which x86
        folds into its use as a broadcast from memory (an extract of the vector, or a
        plain load that LLVM forwards from the block's store, is a permute per step)."""
        from xdsl.dialects import llvm  # (here: its module is large, and no cold first call gets here)

        _, base = buffer
        offset = j * _element_bits(v.type) // 8
        address = bb.ins(arith.AddiOp(base, bb.ins(arith.ConstantOp(IntegerAttr(offset, i64))))) if j else base
        pointer = bb.ins(llvm.IntToPtrOp(address))
        load = generic_op_class("llvm.load", ("alignment", "volatile_"), pure=False)
        return bb.ins(load.create(operands=[pointer], result_types=[v.type], properties={
            "alignment": IntegerAttr(_element_bits(v.type) // 8, i64), "volatile_": UnitAttr()}))

    def _first_prologue(self, b: Builder, lb: SSAValue, blocked_end: SSAValue, plan: _HoistPlan,
                        ahead: list[SSAValue]) -> list[SSAValue]:
        """The first block's `ahead` values (the pipelined loop carries each block's
        into the next iteration), computed only when there is a block: with fewer than
        T steps its loads would read past the arrays."""
        if not ahead:
            return []
        bb = _B(b)
        then, other = Block(), Block()
        tb, eb = Builder(InsertPoint.at_end(then)), Builder(InsertPoint.at_end(other))
        vals = self.prologue(tb, lb, plan)
        tb.insert(scf.YieldOp(*(vals[v] for v in ahead)))
        types = [VectorType(v.type, [TIME_BLOCK]) for v in ahead]
        eb.insert(scf.YieldOp(*(_B(eb).splat_const(0, t) for t in types)))  # unused: no block runs
        has_block = bb.cmp(lb, blocked_end, "slt")
        return list(b.insert(scf.IfOp(has_block, types, Region(then), Region(other))).results)

    # -- the whole op ----------------------------------------------------------

    def step(self, b: Builder, i: SSAValue, h: SSAValue, pre: dict[SSAValue, _Val], store_points) -> SSAValue:
        """One step: coeffs (vectorised over the state), the update, emit."""
        sb = _B(b)
        op = self.op
        cargs = op.coeffs.block.args
        env: dict[SSAValue, _Val] = {cargs[0]: _Val("u", i), cargs[1]: _Val("i", sb.idx(0), 0), **pre}
        a, x = self.block(b, op.coeffs.block, env, False)
        av, xv = self.as_vector(sb, env, a), self.as_vector(sb, env, x)
        h = _step(b, av, h, xv)
        self.state_vec = h
        store_points.append(b.insert(vector.StoreOp(h, op.state, [sb.idx(0)])))
        eargs = op.emit.block.args
        eenv: dict[SSAValue, _Val] = {eargs[0]: _Val("u", i), **pre}
        self.block(b, op.emit.block, eenv, False)
        return h

    def build(self, b: Builder) -> None:
        op = self.op
        bb = _B(b)
        zero = bb.idx(0)
        h = bb.ins(vector.LoadOp(op.state, [zero], self.vt))
        store_points: list[Operation] = []
        plan = self.hoist_plan()
        if plan is not None:
            self.dot = dot_plan(op, self.N, TIME_BLOCK, set(plan.ops), self.is_state_loop)
        if plan is not None:
            T = TIME_BLOCK
            span = bb.sub(op.ub, op.lb)
            nonneg = bb.max(span, zero)
            blocked_end = bb.add(op.lb, bb.mul(bb.ins(arith.DivUIOp(nonneg, bb.idx(T))), bb.idx(T)))
            skipped = set(plan.ops) | ({*self.dot.post, self.dot.store} if self.dot is not None else set())
            buffers = self._step_buffers(plan, skipped)
            ahead = [v for v in plan.exported if plan.kinds[v] == "tv"] if self.PIPELINED else []
            last = bb.sub(blocked_end, bb.idx(T))

            def block_body(sb: Builder, i0: SSAValue, carried):
                sbb = _B(sb)
                if ahead:
                    # The next block's prologue first (the last block's again, to stay in
                    # bounds): its long chains run beside this block's steps.
                    upcoming = self.prologue(sb, sbb.min(sbb.add(i0, sbb.idx(T)), last), plan)
                    vals = {**upcoming, **dict(zip(ahead, carried[1:]))}
                else:
                    upcoming = vals = self.prologue(sb, i0, plan)
                for v, (buf, _) in buffers.items():
                    sb.insert(vector.StoreOp(vals[v], buf, [sbb.idx(0)]))
                hv = carried[0]
                self.skip = skipped
                if self.dot is not None:
                    self.deferred = TreeSums(TIME_BLOCK)
                for j in range(T):
                    i = sbb.add(i0, sbb.idx(j)) if j else i0
                    pre: dict[SSAValue, _Val] = {}
                    for v in plan.exported:
                        nv = vals[v]
                        if v in buffers:
                            nv = self._step_value(sbb, buffers[v], j, v)
                        elif plan.kinds[v] == "tv":
                            nv = sbb.ins(vector.ExtractOp(nv, [j], v.type))
                        pre[v] = _Val("u", nv)
                    hv = self.step(sb, i, hv, pre, store_points)
                if self.dot is not None:
                    self._blocked_output(sb, i0, vals, plan)
                self.skip = set()
                return [hv] + [upcoming[v] for v in ahead]

            first = self._first_prologue(b, op.lb, blocked_end, plan, ahead)
            h = for_loop(b, op.lb, blocked_end, bb.idx(T), [h, *first], block_body)[0]
            lb = blocked_end
        else:
            lb = op.lb

        def body(sb: Builder, i: SSAValue, carried):
            return [self.step(sb, i, carried[0], {}, store_points)]

        (h,) = for_loop(b, lb, op.ub, op.step, [h], body)
        if not self.needs_state_store:
            for marker in store_points:
                marker.detach()
                marker.erase()
        b.insert(vector.StoreOp(h, op.state, [zero]))
