"""The affine-form analysis of `scanweaver-raise`: does an `scf.for` loop carry an
affine recurrence, and how is it raised (`analyze_loop` -> `RaiseDecision` with a
`RaisePlan`, or the reason it is not).  The rewrite building the scan op from a plan
is `raise_affine.py`.

A time loop `scf.for %i` carries state in one of three shapes:

1. scalar `iter_args` (one value): `h' = A(i)*h + B(i)`  ->  `scan.recurrence` on a
   rank-0 `memref.alloca` initialised from the init value; the loop result is a load
   of it afterwards.
2. several `iter_args` depending linearly on each other (`s' = M(i) s + v(i)`)  ->
   `scan.linear_recurrence` on a `memref<Kx T>` alloca (see `dialects/scan.py`).
3. a memref location loaded and stored back each step: either at a loop-invariant
   index (`h[d]`), or inside one inner `scf.for %n = 0 to N step 1` at `h[..., %n]` (a
   state vector over channels).  When the memref is exactly the channel shape and the
   body never observes a half-updated state, the memref itself is the recurrence state;
   otherwise a temporary alloca of the channel shape is the state, copied in before the
   op, and the emit region writes each new state element back to the user's memref
   where the loop stored it (write-through), so every later read sees what it saw.
   Shifted index: the loop stores `m[.., t]` and loads the previous element
   `m[.., t - step]` (`t + step` when t walks backwards, e.g. `t = n-1-i`), where t is
   `+-i + c` built with arith.addi/subi from the loop index and loop-invariant values,
   and the other indices are loop-invariant (or the channel index).  A temporary
   (rank 0 or channel-shaped) is the state, initialised from the element the first
   step loads (guarded by `lb < ub`); emit writes each new state through to
   `m[.., t]`.  Besides those loads and the store, the loop may only read `m[.., t]`
   after the store (same block); anything else is rejected with a reason.

The analysis (`analyze_loop`) classifies each value of the body as independent of the
state, or dependent on it; dependent values get a symbolic `AffineForm` (see
`affine_form.py`).  A value depending on the *previous* state may only flow into
arith add/sub/mul/neg, divf by an independent value, and `arith.select` with an
independent condition; anything else rejects the loop with a reason.  Values computed
from the *new* state (the yielded / stored value) are consumers and go to `emit`.

Assumptions: distinct memref SSA values do not alias; coefficients may only read
memrefs that the loop never writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import BFloat16Type, Float16Type, IndexType, IntegerAttr
from xdsl.ir import Attribute, Block, BlockArgument, Operation, OpResult, SSAValue
from xdsl.traits import is_side_effect_free

from scanweaver.dialects.scan import is_supported_state_type
from scanweaver.rewrites import affine_form as af
from scanweaver.rewrites.affine_form import AffineForm
from scanweaver.rewrites.loop_utils import inside as _inside

# ---------------------------------------------------------------------------
# Decision and plan
# ---------------------------------------------------------------------------


@dataclass
class RaiseDecision:
    """What `analyze_loop` found.

    `affine`: the loop can be raised.  `reason`: why not (empty when affine).
    `kind`: "scalar", "linear", "memref" (state at a loop-invariant memref location),
    "vector" (state vector updated in an inner channel loop), or "none" when the loop
    carries no state at all (never reported as a diagnostic).
    """

    affine: bool
    reason: str = ""
    kind: str = "none"
    plan: RaisePlan | None = field(default=None, repr=False, compare=False)


@dataclass
class RaisePlan:
    loop: scf.ForOp
    kind: str
    element_type: object
    forms: list[AffineForm]  # one per state variable (K of them)
    chan_loop: scf.ForOp | None = None  # inner channel loop (vector kind)
    store: memref.StoreOp | None = None  # the state store (memref kinds)
    channels: int = 0  # vector kind: constant trip count of the channel loop, 0 if dynamic
    chan_ub: SSAValue | None = None  # vector kind: the channel count (defined before the loop)
    # Vector kind: every channel loop around the store, in the order the store
    # indexes them (the state's dimensions); chan_loop is the innermost one.
    chan_order: list[scf.ForOp] = field(default_factory=list)
    direct: bool = False  # memref kinds: the user's memref is the recurrence state
    # Shifted-index state (`m[.., t] = f(m[.., t-1])`): the loads of the previous
    # element (state sources) and the position of the time index in the indices.
    shift_loads: list[memref.LoadOp] = field(default_factory=list)
    time_pos: int | None = None
    # Multi-lag shifted state (`m[t] = sum_j a_j m[t - j*step] + x`): the lag of each
    # shift load, and the order K = the largest lag (the companion state has K values).
    lags: list[int] = field(default_factory=list)
    escapes: list[SSAValue] = field(default_factory=list)  # extra state components
    lag_stride: int = 0  # the time index of lag 1 minus the stored one (-step forwards)

    @property
    def order(self) -> int:
        return max(self.lags, default=1)

    @property
    def is_linear(self) -> bool:
        """Raised to scan.linear_recurrence (a K-vector state without channels)."""
        return self.kind == "linear" or self.order > 1


class _Reject(Exception):
    def __init__(self, reason: str, kind: str):
        super().__init__(reason)
        self.kind = kind



def const_index_value(value: SSAValue) -> int | None:
    op = value.owner
    if isinstance(op, arith.ConstantOp) and isinstance(op.value, IntegerAttr):
        return op.value.value.data
    return None


# ---------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------

_CONVERSIONS = (
    arith.ExtFOp,
    arith.TruncFOp,
    arith.SIToFPOp,
    arith.FPToSIOp,
    arith.ExtSIOp,
    arith.ExtUIOp,
    arith.TruncIOp,
    arith.BitcastOp,
)
_IMPURE_OK = (memref.LoadOp, memref.StoreOp, memref.AllocaOp, scf.ForOp, scf.IfOp)


def analyze_loop(loop: scf.ForOp) -> RaiseDecision:
    """Decide whether `loop` is an affine recurrence; never modifies the IR."""
    try:
        return _analyze(loop)
    except _Reject as e:
        return RaiseDecision(False, str(e), kind=e.kind)




def _analyze(loop: scf.ForOp) -> RaiseDecision:
    if loop.iter_args:
        kind = "scalar" if len(loop.iter_args) == 1 else "linear"
        plan = _plan_iter_args(loop, kind)
    else:
        found = _find_memref_state(loop)
        if found is None:
            return RaiseDecision(False, "the loop carries no state", kind="none")
        plan = found
    return RaiseDecision(True, "", kind=plan.kind, plan=plan)


def _check_body(loop: scf.ForOp, kind: str) -> set[SSAValue]:
    """Reject bodies with unknown side effects; return the memrefs the loop writes."""
    if not isinstance(loop.body.block.args[0].type, IndexType):
        raise _Reject("the loop induction variable is not of index type", kind)
    written: set[SSAValue] = set()
    for op in loop.body.walk():
        if isinstance(op, memref.StoreOp):
            written.add(op.memref)
        elif isinstance(op, func.CallOp):
            raise _Reject(f"the loop body calls @{op.callee.string_value()}", kind)
        elif isinstance(op, memref.CopyOp):
            written.add(op.destination)
        elif not isinstance(op, _IMPURE_OK) and not is_side_effect_free(op):
            raise _Reject(
                f"the loop body contains {op.name} with unknown side effects", kind
            )
    return written


def _state_type_reason(what: str, t: Attribute) -> str:
    if isinstance(t, Float16Type | BFloat16Type):
        return (
            f"{what} is {t}: a low-precision state is rounded to {t} after every step, "
            "and the scan ops carry f32, f64, i32 or i64 state; widening it would "
            "change the results, so it is not raised"
        )
    return (
        f"{what} has type {t}, not a supported state type "
        "(f32, f64, i32, i64, complex<f32>, complex<f64>)"
    )


def _plan_iter_args(loop: scf.ForOp, kind: str) -> RaisePlan:
    written = _check_body(loop, kind)
    body = loop.body.block
    types = {a.type for a in loop.iter_args}
    for k, arg in enumerate(loop.iter_args):
        if not is_supported_state_type(arg.type):
            raise _Reject(_state_type_reason(f"carried value #{k}", arg.type), kind)
    if len(types) != 1:
        raise _Reject(
            f"carried values have different types ({', '.join(str(a.type) for a in loop.iter_args)}): a scan "
            "op carries one type, and the loop splits into one loop per group only when values of different "
            "types do not depend on each other and no part accesses a memref another part writes",
            kind,
        )
    sources = {arg: k for k, arg in enumerate(body.args[1:])}
    yield_op = body.last_op
    assert isinstance(yield_op, scf.YieldOp)
    new = list(yield_op.arguments)
    if _is_nested_reduction(loop) and all(_is_plain_reduction(v, a) for v, a in zip(new, body.args[1:])):
        raise _Reject(
            "a reduction nested in another loop (`acc = acc op x`, e.g. a readout sum) "
            "whose running values are never used is left as a loop: a scan would only "
            "add work",
            kind,
        )
    if all(_is_reassoc_sum(v, [a]) for v, a in zip(new, body.args[1:])):
        raise _Reject(_REASSOC_SUM, kind)
    escapes: list[SSAValue] = []
    forms = _compute_forms(loop, sources, new, {body}, kind, escapes)
    if escapes:
        # Previous-state values that escape the update (`y = b0*x + s1` stored, as in
        # a transposed direct form II filter): extra state components.
        kind = "linear"
        forms += _compute_forms(loop, sources, new + escapes, {body}, kind, [])[len(new):]
    plan = RaisePlan(loop, kind, loop.iter_args[0].type, forms, escapes=escapes)
    _check_coefficients(plan, written)
    return plan


def _has_else(op: scf.IfOp) -> bool:
    return any(
        not isinstance(o, scf.YieldOp) for b in op.false_region.blocks for o in b.ops
    )


def _guards(store: memref.StoreOp, loop: scf.ForOp) -> list[scf.IfOp]:
    """The scf.if ops around the state store inside `loop` (inner first)."""
    out: list[scf.IfOp] = []
    op = store.parent_op()
    while op is not None and op is not loop:
        if isinstance(op, scf.IfOp):
            out.append(op)
        op = op.parent_op()
    return out


def _reject_state_under_if(loop: scf.ForOp) -> None:
    """A memref element loaded and stored back under an scf.if carries state even when
    the finder above does not take the form: say so rather than 'no state'."""
    iv = loop.body.block.args[0]
    for op in loop.body.walk():
        if not isinstance(op, memref.StoreOp) or _inside(op.memref, loop):
            continue
        if any(x is iv for x in op.indices):
            continue
        parent = op.parent_op()
        under_if = False
        while parent is not None and parent is not loop:
            under_if |= isinstance(parent, scf.IfOp)
            parent = parent.parent_op()
        if under_if and any(
            isinstance(ld, memref.LoadOp)
            and ld.memref is op.memref
            and list(ld.indices) == list(op.indices)
            for ld in loop.body.walk()
        ):
            raise _Reject(
                "the state in memory is updated under scf.if, but not as "
                "`if m { load; store }` (an else branch, or the state loaded outside the "
                "scf.if): carry the state as an iter_arg, or select the new value with "
                "arith.select / an scf.if yielding it",
                "memref",
            )


def _check_guards(plan: RaisePlan, guards: list[scf.IfOp]) -> None:
    """Masked memref updates: each condition is independent of the state (it reads no
    state memref).  (The state loads are in the store's block, under the same guards.)"""
    m = plan.store.memref  # type: ignore[union-attr]
    for g in guards:
        todo, seen = [g.cond], set()
        while todo:
            v = todo.pop()
            if v in seen or not _inside(v, plan.loop):
                continue
            seen.add(v)
            op = v.owner
            if isinstance(op, memref.LoadOp) and op.memref is m:
                raise _Reject("the state is used in a condition (scf.if)", plan.kind)
            if isinstance(op, Operation):
                todo.extend(op.operands)


_REASSOC_SUM = (
    "a sum whose adds are marked reorderable (fastmath reassoc, e.g. the VJP's sums over "
    "time) is left as a loop: LLVM may vectorise it, and a scan would run it in order "
    "without the mark")


def _is_reassoc_sum(new: SSAValue, prev: list[SSAValue]) -> bool:
    """`new = prev + x` (either order) by an arith.addf carrying fastmath reassoc, and
    a pure reduction: `prev` feeds only that add and `new` only its yield or store (a
    running sum read in the loop, a prefix sum, is still raised: a scan parallelises it)."""
    op = new.owner
    if not isinstance(op, arith.AddfOp) or arith.FastMathFlag.REASSOC not in op.fastmath.data:
        return False
    if len(list(new.uses)) != 1 or any(u.operation is not op for p in prev for u in p.uses):
        return False
    return any(x is p for x in (op.lhs, op.rhs) for p in prev)


#: combining ops of a reduction `acc = acc op x` (one op, `acc` used by nothing else)
_REDUCTION_OPS = (arith.AddfOp, arith.AddiOp, arith.MulfOp, arith.MuliOp, arith.MaximumfOp,
                  arith.MinimumfOp, arith.MaxSIOp, arith.MinSIOp, arith.MaxUIOp, arith.MinUIOp)


def _is_plain_reduction(new: SSAValue, prev: SSAValue) -> bool:
    """`new = prev op x` by one associative op that is `prev`'s only use: a reduction,
    which the loop already runs well.  A final state that feeds back through a
    coefficient (`h = a[t] * h + b[t]`) is a recurrence: its scan is the parallel form."""
    op = new.owner
    if not isinstance(op, _REDUCTION_OPS) or len(list(prev.uses)) != 1:
        return False
    return prev in (op.lhs, op.rhs)


def _is_nested_reduction(loop: scf.ForOp) -> bool:
    """A loop inside another scf.for whose body has no side effects and whose carried
    values are used only by its own scf.yield: only the final value matters."""
    parent = loop.parent_op()
    while parent is not None and not isinstance(parent, scf.ForOp | func.FuncOp):
        parent = parent.parent_op()
    if not isinstance(parent, scf.ForOp):
        return False
    yield_op = loop.body.block.last_op
    if any(isinstance(op, memref.StoreOp | memref.CopyOp) for op in loop.body.walk()):
        return False
    return all(
        use.operation is yield_op
        for v in (yield_op.operands if yield_op is not None else ())
        for use in v.uses
    )


def _find_memref_state(loop: scf.ForOp) -> RaisePlan | None:
    """Find `m[idx] = f(m[idx])` with idx loop-invariant, or in one inner channel loop."""
    candidates = _state_candidates(loop, _state_blocks(loop))
    if not candidates:
        _reject_state_under_if(loop)
        return None
    if len(candidates) > 1:
        raise _Reject(
            "several memref locations carry state (only one state memref per loop is "
            "supported; carry coupled state as iter_args)",
            "memref",
        )
    store, loads, time_pos = candidates[0]
    m = store.memref
    in_chan = bool(_channel_chain(store.parent_block(), loop))
    kind = "vector" if in_chan else "memref"
    other_reads = any(isinstance(o, memref.LoadOp) and o.memref is m and o not in loads for o in loop.body.walk())
    if not other_reads and _is_reassoc_sum(store.value, [ld.res for ld in loads]):
        raise _Reject(_REASSOC_SUM, kind)
    written = _check_body(loop, kind)
    el = m.type.element_type  # type: ignore[attr-defined]
    if not is_supported_state_type(el):
        raise _Reject(_state_type_reason("the state", el), kind)
    plan = RaisePlan(loop, kind, el, [], store=store)
    if in_chan:
        _plan_channel_loops(plan, time_pos)
    if time_pos is not None:
        _check_shifted(plan, loads, time_pos)
        return _with_forms(plan, loads, written)
    plan.direct = _state_is_direct(plan, loads)
    return _with_forms(plan, loads, written)


#: A state store, its loads of the previous state, and the time position of a shifted
#: index (None: the index is loop-invariant).
_Candidate = tuple[memref.StoreOp, list[memref.LoadOp], int | None]


def _state_blocks(loop: scf.ForOp) -> list[Block]:
    """The blocks a state update may sit in: the time-loop body, channel-loop bodies in
    it, and channel-loop bodies in those (a two-dimensional state S[d, e]); also the
    then-blocks of scf.if ops without results or else-branch there (a masked update
    `if m { h[c] = ... }`)."""
    body = loop.body.block
    blocks = [body]
    todo = [body]
    while todo:
        b = todo.pop(0)
        for op in b.ops:
            if isinstance(op, scf.ForOp) and _channel_depth(b, loop) < MAX_CHANNEL_RANK:
                inner = [op.body.block]
            elif isinstance(op, scf.IfOp) and not op.results and not _has_else(op):
                inner = list(op.true_region.blocks)
            else:
                continue
            blocks += inner
            todo += inner
    return blocks


def _state_candidates(loop: scf.ForOp, blocks: list[Block]) -> list[_Candidate]:
    """Every store to a memref defined outside the loop that, in its own block, is
    preceded by loads of the same element (loop-invariant or channel indices) or of the
    element one time index back (a shifted index)."""
    candidates: list[_Candidate] = []
    for block in blocks:
        chan_ivs = [lp.body.block.args[0] for lp in _channel_chain(block, loop)]
        for op in block.ops:
            if not isinstance(op, memref.StoreOp) or _inside(op.memref, loop):
                continue
            fixed = [not _inside(x, loop) or any(x is c for c in chan_ivs) for x in op.indices]
            if all(fixed):
                loads = [
                    ld
                    for ld in block.ops
                    if isinstance(ld, memref.LoadOp)
                    and ld.memref is op.memref
                    and list(ld.indices) == list(op.indices)
                    and ld.is_before_in_block(op)
                ]
                if loads:
                    candidates.append((op, loads, None))
                continue
            shifted = _shifted_loads(block, op, fixed)
            if shifted:
                pos = min(shifted)
                candidates.append((op, shifted[pos], pos))
    return candidates


def _shifted_loads(
    block: Block, store: memref.StoreOp, fixed: list[bool]
) -> dict[int, list[memref.LoadOp]]:
    """Loads before the store that differ from it only in the one time-dependent index
    (`m[.., t-1]` then `m[.., t]`), by that index's position."""
    shifted: dict[int, list[memref.LoadOp]] = {}
    for ld in block.ops:
        if (
            isinstance(ld, memref.LoadOp)
            and ld.memref is store.memref
            and ld.is_before_in_block(store)
        ):
            pos = _shift_position(ld, store, fixed)
            if pos is not None:
                shifted.setdefault(pos, []).append(ld)
    return shifted


def _plan_channel_loops(plan: RaisePlan, time_pos: int | None) -> None:
    """Check the channel loops around the state store (0 to a loop-invariant count,
    step 1, each index used once by the store) and fill the plan's channel fields."""
    store, loop, kind = plan.store, plan.loop, plan.kind
    assert store is not None
    chain = _channel_chain(store.parent_block(), loop)
    plan.chan_loop = chain[-1]
    for chan in chain:
        civ = chan.body.block.args[0]
        lb, ub, step = (const_index_value(v) for v in (chan.lb, chan.ub, chan.step))
        if lb != 0 or step != 1:
            raise _Reject("the channel loop must run from constant 0 step 1", kind)
        if ub is not None and ub < 1:
            raise _Reject("the channel loop must run a constant N > 0 or a "
                          "loop-invariant number of times", kind)
        if ub is None and _inside(chan.ub, loop):
            raise _Reject(
                "the channel count is computed inside the time loop (it must be "
                "loop-invariant, e.g. a memref.dim before the loop)",
                kind,
            )
        if sum(x is civ for x in store.indices) != 1:
            raise _Reject("the state index must use the channel index exactly once", kind)
    # State dimensions in the order the store indexes them.
    pos = {id(x): k for k, x in enumerate(store.indices)}
    plan.chan_order = sorted(chain, key=lambda c: pos[id(c.body.block.args[0])])
    plan.channels = const_index_value(chain[-1].ub) or 0
    plan.chan_ub = chain[-1].ub
    if len(chain) > 1 and time_pos is not None:
        raise _Reject(
            "a shifted-index state over several channel loops is not supported", kind
        )


def _state_is_direct(plan: RaisePlan, loads: list[memref.LoadOp]) -> bool:
    """Whether the user's memref itself can be the recurrence state: the store covers
    it exactly, it is written nowhere else, and no read observes a half-updated state
    (rejects a second store)."""
    store, loop, kind = plan.store, plan.loop, plan.kind
    assert store is not None
    m = store.memref
    if plan.chan_loop is not None:
        ivs = [c.body.block.args[0] for c in plan.chan_order]
        direct = list(store.indices) == ivs and _is_extent_of(plan, m)
    else:
        direct = not store.indices
    for op in loop.body.walk():
        if isinstance(op, memref.StoreOp) and op.memref is m and op is not store:
            raise _Reject("the state memref is written at several places", kind)
        if isinstance(op, memref.LoadOp) and op.memref is m and op not in loads:
            if not _reads_updated_state(op, store, loop):
                direct = False
    return direct


def _channel_chain(block: Block, loop: scf.ForOp) -> list[scf.ForOp]:
    """The scf.for loops between `loop` and `block` (outer to inner)."""
    chain: list[scf.ForOp] = []
    op = block.parent_op()
    while op is not None and op is not loop:
        if isinstance(op, scf.ForOp):
            chain.append(op)
        op = op.parent_op()
    return chain[::-1]


def _channel_depth(block: Block, loop: scf.ForOp) -> int:
    return len(_channel_chain(block, loop))


def _is_extent_of(plan: RaisePlan, m: SSAValue) -> bool:
    """Whether the channel loops run over exactly the memref `m`, dimension by
    dimension: a constant equal to its static size, or `memref.dim m, j`."""
    shape = m.type.get_shape()  # type: ignore[attr-defined]
    if len(shape) != len(plan.chan_order):
        return False
    for j, (size, chan) in enumerate(zip(shape, plan.chan_order)):
        count = const_index_value(chan.ub)
        if count is not None:
            if size != count:
                return False
            continue
        dim = chan.ub.owner
        if not (
            isinstance(dim, memref.DimOp)
            and dim.source is m
            and const_index_value(dim.index) == j
        ):
            return False
    return True


def _with_forms(plan: RaisePlan, loads: list[memref.LoadOp], written: set[SSAValue]) -> RaisePlan:
    """The affine forms of the stored value in the loaded state; coefficients checked.

    With K > 1 lags, state variable j-1 is the element stored j steps back; the
    companion rows shift them (`s'_j = s_{j-1}`)."""
    assert plan.store is not None
    body = plan.loop.body.block
    lags = plan.lags or [1] * len(loads)
    guards = _guards(plan.store, plan.loop)
    if guards and (plan.time_pos is not None or plan.order > 1):
        raise _Reject("a shifted-index state updated under scf.if is not supported", plan.kind)
    if guards:
        _check_guards(plan, guards)
    plan.forms = _compute_forms(
        plan.loop,
        {ld.res: lag - 1 for ld, lag in zip(loads, lags)},
        [plan.store.value],
        {body}
        | {c.body.block for c in plan.chan_order}
        | {b for g in guards for b in g.true_region.blocks},
        plan.kind,
    )
    # Under `if m { h = f(h) }` the new state is `m ? f(h) : h`, each guard in turn;
    # leaves computed under a guard stay under it ("if" terms).
    for g in guards:
        f = plan.forms[0]
        inner = any(_inside(v, g) for v in f.all_leaves())
        keep = AffineForm.state(0)
        plan.forms[0] = f.branch(g.cond, keep) if inner else f.select(g.cond, keep)
    plan.forms += [AffineForm.state(j - 1) for j in range(1, plan.order)]
    _check_coefficients(plan, written)
    return plan


# ---------------------------------------------------------------------------
# Shifted-index state: `m[.., t] = f(m[.., t-1])`
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _TimeExpr:
    """An index `coef * i + sum(syms) + const`: i the time-loop index, `syms`
    loop-invariant SSA values with integer multiplicities."""

    coef: int
    syms: tuple[tuple[SSAValue, int], ...]
    const: int

    def same_base(self, other: _TimeExpr) -> bool:
        if self.coef != other.coef or len(self.syms) != len(other.syms):
            return False
        mine = dict(self.syms)
        return all(v in mine and mine[v] == n for v, n in other.syms)


def _time_expr(v: SSAValue, loop: scf.ForOp) -> _TimeExpr | None:
    """`v` as `coef*i + syms + const` through arith.addi / arith.subi, or None."""
    if v is loop.body.block.args[0]:
        return _TimeExpr(1, (), 0)
    c = const_index_value(v)
    if c is not None:
        return _TimeExpr(0, (), c)
    if not _inside(v, loop):
        return _TimeExpr(0, ((v, 1),), 0)
    op = v.owner
    if not isinstance(op, arith.AddiOp | arith.SubiOp):
        return None
    x, y = _time_expr(op.lhs, loop), _time_expr(op.rhs, loop)
    if x is None or y is None:
        return None
    sign = 1 if isinstance(op, arith.AddiOp) else -1
    syms: dict[SSAValue, int] = dict(x.syms)
    for s, n in y.syms:
        syms[s] = syms.get(s, 0) + sign * n
    return _TimeExpr(
        x.coef + sign * y.coef,
        tuple((s, n) for s, n in syms.items() if n),
        x.const + sign * y.const,
    )


def _shift_position(
    load: memref.LoadOp, store: memref.StoreOp, fixed: list[bool]
) -> int | None:
    """The one index where `load` differs from `store`, when that index of the store
    varies with time and all the others are loop-invariant (or the channel index)."""
    if len(load.indices) != len(store.indices):
        return None
    diff = [k for k, (x, y) in enumerate(zip(load.indices, store.indices)) if x is not y]
    if len(diff) != 1:
        return None
    p = diff[0]
    if fixed[p] or not all(f for k, f in enumerate(fixed) if k != p):
        return None
    return p


def _same_indices(
    a: list[SSAValue], b: list[SSAValue], pos: int, loop: scf.ForOp
) -> bool:
    """Equal index lists: identical SSA values, or equal time expressions at `pos`."""
    if len(a) != len(b):
        return False
    for k, (x, y) in enumerate(zip(a, b)):
        if x is y:
            continue
        if k != pos:
            return False
        ex, ey = _time_expr(x, loop), _time_expr(y, loop)
        if ex is None or ey is None or not ex.same_base(ey) or ex.const != ey.const:
            return False
    return True


#: Channel loops (state dimensions) a memref state may be updated in.
MAX_CHANNEL_RANK = 2

#: The largest lag `y[t - K*step]` a multi-lag shifted recurrence may read.
MAX_LAGS = 8


def _offset(d: int) -> str:
    return "t" if d == 0 else f"t{d:+d}"


def _check_shifted(plan: RaisePlan, loads: list[memref.LoadOp], pos: int) -> None:
    """Validate `m[.., t] = f(m[.., t - step])`; fills the plan's shift fields.

    The stored time index must be `+-i + c` (i: the loop index), every state load the
    same index shifted back by one loop step (the element the previous step stored),
    and the loop must touch the state memref nowhere else, except loads of the new
    element after the store in the same block."""
    loop, kind, store = plan.loop, plan.kind, plan.store
    assert store is not None
    step = const_index_value(loop.step)
    if step is None or step <= 0:
        raise _Reject(
            "the state is carried at a shifted index but the loop step is not a "
            "positive constant",
            kind,
        )
    se = _time_expr(store.indices[pos], loop)
    if se is None or se.coef not in (1, -1):
        raise _Reject(
            "the state is stored at a time index that is not +-i + c "
            "(i: the loop index; only arith.addi / arith.subi are understood)",
            kind,
        )
    expected = -se.coef * step  # the previous step stored t + expected
    lags: list[int] = []
    for ld in loads:
        le = _time_expr(ld.indices[pos], loop)
        if le is None or not le.same_base(se):
            raise _Reject(
                "the state is loaded at a time index that is not the stored index "
                "plus a constant",
                kind,
            )
        d = le.const - se.const
        if d == expected:
            lags.append(1)
            continue
        if d % expected == 0 and 1 < d // expected <= MAX_LAGS:
            lags.append(d // expected)  # y[t - j*step]: a multi-lag recurrence
            continue
        if d == 0 or (d > 0) != (expected > 0):
            walk = "forward" if expected < 0 else "backward"
            raise _Reject(
                f"the state is loaded at {_offset(d)} but the loop walks {walk} in t "
                f"(the previous step stored {_offset(expected)})",
                kind,
            )
        raise _Reject(
            f"the state is loaded at {_offset(d)} but the previous step stored "
            f"{_offset(expected)} (the shift must be 1 to {MAX_LAGS} loop steps)",
            kind,
        )
    if max(lags) > 1 and plan.chan_loop is not None:
        raise _Reject(
            "a multi-lag recurrence inside a channel loop is not supported "
            "(scan.linear_recurrence has no channel dimension; put the channel loop "
            "outside the time loop)",
            kind,
        )
    m = store.memref
    store_idx = list(store.indices)
    block = store.parent_block()
    for use in m.uses:
        op = use.operation
        if op is store or op in loads or not loop.is_ancestor(op):
            continue
        if isinstance(op, memref.StoreOp):
            raise _Reject("the state memref is written at several places", kind)
        if (
            isinstance(op, memref.LoadOp)
            and op.parent_block() is block
            and store.is_before_in_block(op)
            and _same_indices(list(op.indices), store_idx, pos, loop)
        ):
            continue  # reads the new element: emit sees it after the write-through
        raise _Reject(
            f"the state memref is also accessed by {op.name} elsewhere than at "
            "t - step before the store or at t after it",
            kind,
        )
    plan.shift_loads = list(loads)
    plan.time_pos = pos
    plan.lags = lags
    plan.lag_stride = expected


def _reads_updated_state(load: memref.LoadOp, store: memref.StoreOp, loop: scf.ForOp) -> bool:
    """Whether `load` runs after the whole state update of its step (so it reads h_t)."""
    block = store.parent_block()
    if load.parent_block() is block:
        return store.is_before_in_block(load) and list(load.indices) == list(
            store.indices
        )
    # After the channel loops (or the store) in the time-loop body.
    top_store: Operation | None = store
    while top_store is not None and top_store.parent_block() is not loop.body.block:
        top_store = top_store.parent_op()
    top_load: Operation | None = load
    while top_load is not None and top_load.parent_block() is not loop.body.block:
        top_load = top_load.parent_op()
    assert top_store is not None and top_load is not None
    return top_store.is_before_in_block(top_load)


def _compute_forms(
    loop: scf.ForOp,
    sources: dict[SSAValue, int],
    new: list[SSAValue],
    blocks: set[Block],
    kind: str,
    escapes: list[SSAValue] | None = None,
) -> list[AffineForm]:
    """Affine forms of the new state values in terms of the state `sources`.

    `dep`: values depending on the state.  Values depending on the previous state
    other than through a new state value must be affine (else reject); forms of
    consumers of new state values are computed when possible (a new state may be
    built from another one) but failure there only matters if a new state needs it.

    With `escapes` (a list), a value affine in the previous state that is used other
    than affinely (stored, passed to math.tanh, ...) is appended to it instead of
    rejecting the loop: the caller makes it an extra state component, so that emit can
    read it; the op using it is then a consumer, like one of a new state value.
    """
    new_set = set(new)
    feeds_new = _backward_slice(new, loop) if escapes is not None else set()
    forms: dict[SSAValue, AffineForm] = {v: AffineForm.state(k) for v, k in sources.items()}
    dep: set[SSAValue] = set(sources)
    old_dep = set(sources)  # depends on the previous state not only through `new`
    allowed = set(blocks)  # grows by the blocks of masked scf.if ops
    masked: set[scf.IfOp] = set()
    for op in _ordered_ops(loop.body.block, dep, allowed, masked):
        if op is loop:
            continue
        if op in masked:
            _masked_if_forms(op, forms, dep, old_dep, kind)
            continue
        if isinstance(op, scf.YieldOp) and op.parent_op() in masked:
            continue
        dep_ops = [u for u in op.operands if u in dep]
        if not dep_ops:
            continue
        old = [u for u in dep_ops if u in old_dep and u not in new_set]
        # Enclosing ops (scf.if, scf.for) produce state-dependent results.
        parent = op.parent_op()
        while parent is not None and parent is not loop:
            dep.update(parent.results)
            parent = parent.parent_op()
        if isinstance(op, scf.YieldOp) and op.parent_op() is loop:
            continue
        if old and op.parent_block() not in allowed:
            owner = op.parent_op()
            raise _Reject(
                f"the state is used inside a nested region of "
                f"{owner.name if owner else 'an op'}",
                kind,
            )
        if isinstance(op, memref.StoreOp) and op.value in new_set and not any(
            u is op.memref or u in op.indices for u in old
        ):
            continue
        form = _transfer(op, forms, dep)
        dep.update(op.results)
        if (
            old
            and isinstance(form, str)
            and escapes is not None
            and op not in feeds_new
            and _escapable(op, old, forms)
            and all(not isinstance(u, OpResult) or u.op.parent_block() in blocks for u in old)
        ):
            for u in old:
                if u not in escapes:
                    escapes.append(u)
            continue  # a consumer of the escaping values: not old-dependent any more
        if old:
            old_dep.update(op.results)
            if isinstance(form, str):
                raise _Reject(form, kind)
        if isinstance(form, AffineForm):
            forms[op.results[0]] = form
    out: list[AffineForm] = []
    for v in new:
        if v in forms:
            out.append(forms[v])
        elif v in dep:
            raise _Reject(
                "the new state depends on another updated state non-affinely", kind
            )
        else:
            out.append(AffineForm.constant(af.leaf(v)))
    return out


def _ordered_ops(block: Block, dep: set[SSAValue], allowed: set[Block], masked: set[scf.IfOp]):
    """The ops under `block` in program order, nested ops after their parent, except
    that an `scf.if` on a state-independent condition in an allowed block (a masked
    update) comes after its branches, and its blocks become allowed."""
    for op in block.ops:
        is_mask = (
            isinstance(op, scf.IfOp)
            and op.cond not in dep
            and block in allowed
            and bool(op.false_region.blocks)
        )
        if is_mask:
            masked.add(op)
            allowed.update(b for r in op.regions for b in r.blocks)
        else:
            yield op
        for r in op.regions:
            for b in r.blocks:
                yield from _ordered_ops(b, dep, allowed, masked)
        if is_mask:
            yield op


def _masked_if_forms(
    op: scf.IfOp,
    forms: dict[SSAValue, AffineForm],
    dep: set[SSAValue],
    old_dep: set[SSAValue],
    kind: str,
) -> None:
    """Forms of the results of a masked `scf.if`: `cond ? then : else`, branch-wise.
    Leaves computed inside the branches keep them conditional ("if" terms)."""
    then_yield, else_yield = op.true_region.block.last_op, op.false_region.block.last_op
    assert isinstance(then_yield, scf.YieldOp) and isinstance(else_yield, scf.YieldOp)
    for r, tv, ev in zip(op.results, then_yield.operands, else_yield.operands):
        if tv not in dep and ev not in dep:
            continue
        dep.add(r)
        if tv in old_dep or ev in old_dep:
            old_dep.add(r)
        ft = forms.get(tv) if tv in dep else AffineForm.constant(af.leaf(tv))
        fe = forms.get(ev) if ev in dep else AffineForm.constant(af.leaf(ev))
        if ft is None or fe is None:
            if r in old_dep:
                raise _Reject("the state flows through scf.if non-affinely", kind)
            continue
        inner = any(_inside(v, op) for v in ft.all_leaves() + fe.all_leaves())
        forms[r] = ft.branch(op.cond, fe) if inner else ft.select(op.cond, fe)


def _backward_slice(values: list[SSAValue], loop: scf.ForOp) -> set[Operation]:
    """The ops of `loop` whose results `values` depend on (through operands and the
    ops enclosing them)."""
    seen: set[Operation] = set()
    todo = [v for v in values]
    while todo:
        v = todo.pop()
        op = v.owner
        if not isinstance(op, Operation) or op in seen or not loop.is_ancestor(op):
            continue
        seen.add(op)
        todo.extend(op.operands)
        for inner in op.walk():
            if inner is not op and inner not in seen:
                seen.add(inner)
                todo.extend(inner.operands)
    return seen


def _escapable(op: Operation, old: list[SSAValue], forms: dict[SSAValue, AffineForm]) -> bool:
    """Whether `op` may consume the previous-state values `old` as extra state
    components: each has an affine form, none is used as an index or a condition,
    and `op` has no regions (it runs once per step in emit)."""
    if op.regions or isinstance(op, scf.YieldOp):
        return False
    if isinstance(op, memref.StoreOp) and any(u is op.memref or u in op.indices for u in old):
        return False
    if isinstance(op, arith.SelectOp) and op.cond in old:
        return False
    if isinstance(op, memref.LoadOp | arith.IndexCastOp):
        return False
    return all(u in forms for u in old)


def _transfer(
    op: Operation, forms: dict[SSAValue, AffineForm], dep: set[SSAValue]
) -> AffineForm | str:
    """Affine form of `op`'s result from its operands' forms, or why it is not affine."""

    def form(v: SSAValue) -> AffineForm | None:
        if v in dep:
            return forms.get(v)
        return AffineForm.constant(af.leaf(v))

    def is_dep(v: SSAValue) -> bool:
        return v in dep

    name = op.name
    if name in _COMPLEX_AFFINE:
        return _complex_transfer(op, form, is_dep)
    if isinstance(op, arith.AddfOp | arith.AddiOp | arith.SubfOp | arith.SubiOp):
        x, y = form(op.lhs), form(op.rhs)
        if x is None or y is None:
            return f"the state flows into {name} through a non-affine value"
        return x + y if isinstance(op, arith.AddfOp | arith.AddiOp) else x - y
    if isinstance(op, arith.MulfOp | arith.MuliOp):
        if is_dep(op.lhs) and is_dep(op.rhs):
            return f"the state is multiplied by a state-dependent value ({name} h*h)"
        d, c = (op.lhs, op.rhs) if is_dep(op.lhs) else (op.rhs, op.lhs)
        x = form(d)
        if x is None:
            return f"the state flows into {name} through a non-affine value"
        return x.scale(af.leaf(c))
    if isinstance(op, mathd.FmaOp):
        # fma(a, h, b) = a*h + b, rounded once; the scan ops round the product and
        # the sum separately (at most 1 ulp apart per step).
        x, y, z = op.operands
        if is_dep(x) and is_dep(y):
            return "the state is multiplied by a state-dependent value (math.fma h*h)"
        d, c = (x, y) if is_dep(x) else (y, x)
        fd, fz = form(d), form(z)
        if fd is None or fz is None:
            return f"the state flows into {name} through a non-affine value"
        return fd.scale(af.leaf(c)) + fz
    if isinstance(op, arith.DivfOp):
        if is_dep(op.rhs):
            return "the state is used as a divisor (arith.divf by a state-dependent value)"
        x = form(op.lhs)
        if x is None:
            return f"the state flows into {name} through a non-affine value"
        return x.scale(af.leaf(op.rhs), divide=True)
    if isinstance(op, arith.NegfOp):
        x = form(op.operand)
        if x is None:
            return f"the state flows into {name} through a non-affine value"
        return x.neg()
    if isinstance(op, arith.SelectOp):
        if is_dep(op.cond):
            return "the state is used in a select condition (arith.select)"
        x, y = form(op.lhs), form(op.rhs)
        if x is None or y is None:
            return f"the state flows into {name} through a non-affine value"
        return x.select(op.cond, y)
    if isinstance(op, arith.CmpfOp | arith.CmpiOp):
        return f"the state is used in a condition ({name})"
    if isinstance(op, scf.IfOp):
        return "the state is used in a condition (scf.if)"
    if isinstance(op, arith.IndexCastOp | memref.LoadOp) or (
        isinstance(op, memref.StoreOp) and any(is_dep(i) for i in op.indices)
    ):
        return f"the state is used as an index ({name})"
    if isinstance(op, memref.StoreOp):
        return (
            "a value depending on the previous state escapes the update "
            "(memref.store of an intermediate value)"
        )
    if isinstance(op, scf.ForOp):
        return "the state flows into an inner loop's carried value"
    if isinstance(op, scf.YieldOp):
        return "the state flows into an inner loop's carried value"
    if isinstance(op, _CONVERSIONS):
        return f"the state is converted by {name} (mixed precision is not supported)"
    if isinstance(op, arith.DivSIOp | arith.DivUIOp | arith.RemSIOp | arith.RemUIOp):
        return f"integer division of the state is not affine ({name})"
    if name.startswith("math."):
        return f"the state flows into {name} (non-affine)"
    return f"the state is used by {name}, which is not affine"


#: Complex ops through which a complex state stays affine (the same rules as their
#: real counterparts: add/sub of forms, mul by an independent value, div by one, neg).
#: By name: a real kernel's raise does not import the complex dialect (about 40 ms).
_COMPLEX_AFFINE = ("complex.add", "complex.sub", "complex.mul", "complex.div", "complex.neg")


def _complex_transfer(op: Operation, form, is_dep) -> AffineForm | str:
    name = op.name
    if name == "complex.neg":
        x = form(op.operands[0])
        return f"the state flows into {name} through a non-affine value" if x is None else x.neg()
    lhs, rhs = op.operands
    if name in ("complex.add", "complex.sub"):
        x, y = form(lhs), form(rhs)
        if x is None or y is None:
            return f"the state flows into {name} through a non-affine value"
        return x + y if name == "complex.add" else x - y
    if name == "complex.div":
        if is_dep(rhs):
            return "the state is used as a divisor (complex.div by a state-dependent value)"
        x = form(lhs)
        return f"the state flows into {name} through a non-affine value" if x is None else x.scale(af.leaf(rhs), divide=True)
    if is_dep(lhs) and is_dep(rhs):
        return f"the state is multiplied by a state-dependent value ({name} h*h)"
    d, c = (lhs, rhs) if is_dep(lhs) else (rhs, lhs)
    x = form(d)
    return f"the state flows into {name} through a non-affine value" if x is None else x.scale(af.leaf(c))


def _outer_block(op: Operation) -> Block | None:
    """The block `op` is in, or for an op in branches of scf.if, the if's block."""
    block = op.parent_block()
    while block is not None and isinstance(block.parent_op(), scf.IfOp):
        block = block.parent_op().parent_block()  # type: ignore[union-attr]
    return block


def _check_coefficients(plan: RaisePlan, written: set[SSAValue]) -> None:
    """Every SSA leaf of the forms must be clonable into the coeffs region."""
    loop = plan.loop
    allowed = {loop.body.block} | {c.body.block for c in plan.chan_order}
    chan_ivs = {c.body.block.args[0] for c in plan.chan_order}
    seen: set[SSAValue] = set()

    def check(v: SSAValue) -> None:
        if v in seen or not _inside(v, loop):
            return
        seen.add(v)
        if v is loop.body.block.args[0] or v in chan_ivs:
            return
        if isinstance(v, BlockArgument):
            raise _Reject(
                "a coefficient depends on a loop-carried value of an inner loop",
                plan.kind,
            )
        op = v.owner
        assert isinstance(op, Operation)
        if _outer_block(op) not in allowed:
            raise _Reject("a coefficient is computed inside a nested region", plan.kind)
        if isinstance(op, memref.LoadOp):
            if op.memref in written:
                raise _Reject(
                    "a coefficient reads a memref that the loop writes", plan.kind
                )
        elif op.regions or not is_side_effect_free(op):
            raise _Reject(
                f"a coefficient is computed by {op.name}, which cannot be recomputed",
                plan.kind,
            )
        for u in op.operands:
            check(u)

    for f in plan.forms:
        for v in f.all_leaves():
            check(v)
