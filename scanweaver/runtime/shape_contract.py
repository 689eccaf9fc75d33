"""Shape contracts: the argument shapes a compiled function's memory accesses rely on.

Compiled code does not check bounds.  A function like

    %L = memref.dim %x, %c1
    scf.for %t = %c0 to %L step %c1 { ... memref.store %v, %y[%c, %t] ... }

relies on dim 1 of %y being at least dim 1 of %x.  `derive_contracts` walks the input
IR once and records, for every load and store of a memref argument, the index
expressions as intervals over loop bounds (constants, `memref.dim` of arguments,
index scalar arguments, +, -, * and division by constants, min/max); before each call,
`ShapeContract.check` evaluates them with the actual shapes and refuses the call
(ScanWeaverValueError naming both arguments and dimensions) when an index could leave
its array.  scan ops in the input add their own relations (a, b, h of one shape).

Accesses under `scf.if` are judged too, where the condition says nothing about indices
(a data guard, `if h > 0`: judged as if unguarded, since the data may take the branch
anywhere), or where it is a conjunction of signed comparisons of index values (a bounds
guard, `if t + 1 < L`: inside, `t + 1` is taken as at most `L - 1`).  Accesses whose
index the analysis does not follow (a loaded index, an access under another `scf.if`,
an access through a view, a call or any other op that takes a memref) are listed in
`unchecked` (and their ops in `unchecked_ops`, for the GPU lowering, which refuses what
nothing proves in bounds); `check` cannot vouch for them.  Local buffers of static shape
(`memref.alloca`) are checked against that shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from xdsl.dialects import arith, func, memref, scf, vector
from xdsl.dialects.builtin import DYNAMIC_INDEX, IndexType, IntegerAttr, IntegerType, MemRefType, ModuleOp
from xdsl.ir import Block, BlockArgument, Operation, SSAValue

from scanweaver.runtime.contract_check import check_contract, interval

Interval = tuple[int, int]
Env = Sequence[Any]  # the call's argument values


@dataclass
class _Expr:
    """An index value as an interval tree (`contract_check`), evaluated per call;
    `text` for messages."""

    tree: list[Any]
    text: str
    sources: frozenset[str] = frozenset()  # "dim 1 of argument 'x' (#0)" and the like
    ivs: frozenset = frozenset()  # the loop induction variables it depends on
    # An induction variable on both sides of an operation (`min(t0 + 64, L) - t0`):
    # intervals lose that correlation and overestimate the value.
    correlated: bool = False

    def eval(self, env: Env) -> Interval:
        return interval(self.tree, env)

    def message_text(self) -> str:
        src = f" (from {', '.join(sorted(self.sources))})" if self.sources else ""
        return f"{self.text}{src}"


class _Unknown(Exception):
    pass


@dataclass
class _Loop:
    iv: SSAValue
    lb: _Expr
    ub: _Expr

    @property
    def dependent(self) -> bool:
        """Bounds that move with an outer loop (`i < min(C, L - t0)`): intervals lose
        the correlation and would overestimate `t0 + i`, so such indices are not judged."""
        return bool(self.lb.ivs or self.ub.ivs)


@dataclass
class _Access:
    op_text: str
    arg: int | None  # None: a local buffer of static shape `local_shape`
    indices: list[_Expr]
    extents: list[int]  # elements touched from each index (vector loads: the vector length)
    loops: list[_Loop]
    write: bool
    local_shape: tuple[int, ...] = ()
    # size guards around it (`if 3 < dim(y)`): (cmpi predicate, lhs, rhs), none moving
    # with a loop; the access is skipped for sizes that make one false
    when: list[tuple[int, _Expr, _Expr]] = field(default_factory=list)


@dataclass
class ShapeContract:
    name: str
    arg_names: list[str]
    accesses: list[_Access] = field(default_factory=list)
    same_shape: list[tuple[int, int, list[int], list[int]]] = field(default_factory=list)  # (i, j, dims i, dims j)
    unchecked: list[str] = field(default_factory=list)
    unchecked_ops: list[Operation] = field(default_factory=list, repr=False, compare=False)
    _data: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def to_data(self) -> dict[str, Any]:
        """The contract as plain data (`contract_check`'s format): what a deployed
        artifact carries, and what `check` evaluates."""
        return {
            "name": self.name,
            "arg_names": list(self.arg_names),
            "same_shape": [[i, j, list(di), list(dj)] for i, j, di, dj in self.same_shape],
            "accesses": [
                {"op": a.op_text, "arg": a.arg, "local_shape": list(a.local_shape), "indices": [x.tree for x in a.indices], "extents": list(a.extents),
                 "loops": [[lp.lb.tree, lp.ub.tree] for lp in a.loops], "write": a.write,
                 "index_texts": [x.message_text() for x in a.indices],
                 "when": [[pred, x.tree, y.tree] for pred, x, y in a.when]}
                for a in self.accesses
            ],
            "unchecked": list(self.unchecked),
        }

    def check(self, values: Env) -> None:
        """Raise ScanWeaverValueError when these arguments could be accessed out of bounds."""
        if self._data is None:  # built once: the analysis has finished by the first call
            self._data = self.to_data()
        check_contract(self._data, values)


def _const(v: int) -> _Expr:
    return _Expr(["const", v], str(v))


class _Analysis:
    def __init__(self, fn: func.FuncOp):
        self.fn = fn
        self.args = list(fn.body.blocks[0].args)
        names = [a.name_hint or f"arg{i}" for i, a in enumerate(self.args)]
        self.contract = ShapeContract(fn.sym_name.data, names)
        self.exprs: dict[SSAValue, _Expr] = {}
        self.loops: dict[SSAValue, _Loop] = {}
        self.states: dict[SSAValue, SSAValue] = {}  # a recurrence's emit argument -> its `state` operand
        self.bounds: list[tuple[SSAValue, str, _Expr]] = []  # what the bounds guards around say
        self.when: list[tuple[int, _Expr, _Expr]] = []  # the size guards around

    def arg_text(self, i: int) -> str:
        return f"argument '{self.contract.arg_names[i]}' (#{i})"

    def expr(self, v: SSAValue) -> _Expr:
        if v in self.exprs:
            return self.exprs[v]
        e = _within_width(self._expr(v), v.type)
        self.exprs[v] = e
        return e

    def _expr(self, v: SSAValue) -> _Expr:
        if isinstance(v, BlockArgument):
            if v in self.loops:
                loop = self.loops[v]
                if loop is None:
                    raise _Unknown
                lb, ub = loop.lb, loop.ub
                return _Expr(["iv", lb.tree, ub.tree],
                             f"{lb.text}..{ub.text}-1", lb.sources | ub.sources,
                             frozenset({v}) | lb.ivs | ub.ivs)
            if v.owner is self.fn.body.blocks[0]:
                i = v.index
                return _Expr(["arg", i], self.contract.arg_names[i],
                             frozenset({self.arg_text(i)}))
            raise _Unknown
        op = v.owner
        if isinstance(op, arith.ConstantOp) and isinstance(op.value, IntegerAttr):
            return _const(op.value.value.data)
        if isinstance(op, memref.DimOp):
            src, dim = op.source, self.expr(op.index)
            if not (isinstance(src, BlockArgument) and src.owner is self.fn.body.blocks[0]):
                raise _Unknown
            i = src.index
            if dim.sources or dim.ivs:
                raise _Unknown  # a dim index that is not a constant
            d = dim.eval(())[0]
            if not 0 <= d < src.type.get_num_dims():
                raise _Unknown  # undefined behaviour: left to the runtime checks
            return self.dim_expr(i, d)
        if isinstance(op, arith.IndexCastOp):
            return self.expr(op.input)
        sym = _BINARY.get(type(op))
        if sym is None:
            raise _Unknown
        x, y = self.expr(op.operands[0]), self.expr(op.operands[1])
        unsigned = type(op) in _UNSIGNED
        return _Expr([_UNSIGNED_KIND[sym] if unsigned else sym, x.tree, y.tree], f"({x.text} {sym} {y.text})", x.sources | y.sources,
                     x.ivs | y.ivs, x.correlated or y.correlated or bool(x.ivs & y.ivs))

    def loop_scope(self, iv: SSAValue, lb: SSAValue, ub: SSAValue, step: SSAValue) -> _Loop | None:
        """Record the interval of a loop's induction variable (None: bounds not followed)."""
        try:
            s = self.expr(step).eval(())
        except Exception:  # noqa: BLE001 - a step that is not a constant
            s = (0, 0)
        try:
            loop = _Loop(iv, self.expr(lb), self.expr(ub))
        except _Unknown:
            return None
        if s[0] <= 0:
            return None
        self.loops[iv] = loop
        return loop

    def skip(self, op: Operation) -> None:
        """An access (or an op taking a memref) the contract cannot vouch for."""
        self.contract.unchecked.append(op_text(op))
        self.contract.unchecked_ops.append(op)

    def visit_if(self, op: scf.IfOp, loops: list[_Loop | None], guarded: bool) -> None:
        """A data guard's branches are judged as if unguarded; a bounds guard's then-branch
        with the compared index values bounded by the guard (and by the guards around it);
        anything else is unchecked."""
        guards = None if guarded else self.guard(op.cond)
        bounds = None if guards is None else [g for g in guards if g[1] != "when"]
        sizes = [g[2] for g in guards or () if g[1] == "when"]
        outer, around, when = self.exprs, self.bounds, self.when
        for region, refine in ((op.true_region, bounds), (op.false_region, [] if guards == [] else None)):
            self.bounds = around + (refine or [])
            self.when = when + (sizes if region is op.true_region else [])
            # a fresh cache inside: values computed from a bounded one are bounded too
            self.exprs = dict(outer) if not refine else {}
            for v, kind, bound in self.bounds if refine else ():
                e = self.exprs.get(v) or self.expr(v)
                self.exprs[v] = _Expr([kind, e.tree, bound.tree], f"{kind}({e.text}, {bound.text})",
                                      e.sources | bound.sources, e.ivs | bound.ivs, e.correlated)
            for blk in region.blocks:
                self.walk(blk, loops, guarded or refine is None)
        self.exprs, self.bounds, self.when = outer, around, when

    def guard(self, cond: SSAValue) -> list[tuple[SSAValue, str, _Expr]] | None:
        """What `cond` being true bounds: [] for a data guard (its value depends on no index,
        size or integer scalar), [(value, "min" | "max", bound)] for a conjunction of signed
        comparisons of an index that moves with a loop against one that does not, else None."""
        if not _mentions_indices(cond):
            return []
        op = cond.owner
        if isinstance(op, arith.AndIOp):
            lhs, rhs = self.guard(op.lhs), self.guard(op.rhs)
            return None if lhs is None or rhs is None else lhs + rhs
        if not isinstance(op, arith.CmpiOp) or op.predicate.value.data not in _SIGNED_BOUND:
            return None
        try:
            a, b = self.expr(op.lhs), self.expr(op.rhs)
        except _Unknown:
            return None
        below, shift = _SIGNED_BOUND[op.predicate.value.data]  # lhs < rhs + shift (or >)
        if a.ivs and not b.ivs:
            return [(op.lhs, "min" if below else "max", _plus(b, shift))]
        if b.ivs and not a.ivs:
            return [(op.rhs, "max" if below else "min", _plus(a, -shift))]
        if not a.ivs and not b.ivs:  # sizes and constants only: whether the branch runs at all
            return [(op.lhs, "when", (op.predicate.value.data, a, b))]  # type: ignore[list-item]
        return None

    def walk(self, block: Block, loops: list[_Loop | None], guarded: bool) -> None:
        for op in block.ops:
            self.visit(op, loops, guarded)

    def visit(self, op: Operation, loops: list[_Loop | None], guarded: bool) -> None:
        if isinstance(op, memref.LoadOp | memref.StoreOp | vector.LoadOp | vector.StoreOp):
            self.access(op, loops, guarded)
            return
        from scanweaver.dialects import scan

        if isinstance(op, scf.IfOp):
            self.visit_if(op, loops, guarded)
            return
        if isinstance(op, scf.ForOp):
            body = op.body.blocks[0]
            loop = self.loop_scope(body.args[0], op.lb, op.ub, op.step)
            self.walk(body, loops + [loop], guarded)
            return
        if isinstance(op, scan.RecurrenceOp | scan.LinearRecurrenceOp):
            shape = op.state.type.get_shape()
            for region in op.regions:
                blk = region.blocks[0]
                loop = self.loop_scope(blk.args[0], op.lb, op.ub, op.step)
                for k, arg in enumerate(blk.args[1:]):
                    if isinstance(arg.type, IndexType):  # coeffs' state indices run over the state's sizes
                        self.loops[arg] = self.state_size(arg, op.state, k, shape)  # type: ignore[assignment]
                if len(blk.args) > 1 and isinstance(blk.args[1].type, MemRefType):
                    self.states[blk.args[1]] = op.state  # emit's view of the state is the state itself
                self.walk(blk, loops + [loop], guarded)
            return
        if isinstance(op, scan.AffineOp):
            self.scan_affine(op)
            return
        if isinstance(op, scan.ScanOp):
            self.scan_scan(op)
            return
        if not isinstance(op, _MEMREF_SAFE_OPS) and any(isinstance(v.type, MemRefType) for v in op.operands):
            # A call, a view (subview, cast, ...), a copy or another dialect's access:
            # what it touches is not followed here, so the runtime bounds checks guard it.
            self.skip(op)
        # Any other op with regions (scf.if, scf.while, scf.parallel, ...): its accesses
        # may be guarded or iterate in ways not followed here, so they are unchecked.
        for region in op.regions:
            for blk in region.blocks:
                self.walk(blk, loops, True)

    def state_size(self, iv: SSAValue, state: SSAValue, k: int, shape: Sequence[int]) -> _Loop | None:
        """0 .. size k of a recurrence's state: static, or the dim of a state argument."""
        i = self.arg_index(state)
        if k < len(shape) and shape[k] != DYNAMIC_INDEX:
            size = _const(shape[k])
        elif i is not None:
            size = self.dim_expr(i, k)
        else:
            return None
        return _Loop(iv, _const(0), size)

    def dim_expr(self, i: int, d: int) -> _Expr:
        return _Expr(["dim", i, d], f"dim({self.contract.arg_names[i]}, {d})", frozenset({f"dim {d} of {self.arg_text(i)}"}))

    def arg_index(self, v: SSAValue) -> int | None:
        if isinstance(v, BlockArgument) and v.owner is self.fn.body.blocks[0]:
            return v.index
        return None

    def scan_affine(self, op) -> None:
        h = self.arg_index(op.h)
        axis = op.axis_value
        rank = op.h.type.get_num_dims()
        full = list(range(rank))
        chan = [d for d in full if d != axis]
        for v, dims in ((op.a, full), (op.b, full), (op.init, list(range(rank - 1))), (op.final, list(range(rank - 1)))):
            i = self.arg_index(v) if v is not None else None
            if i is not None and h is not None and i != h:
                self.contract.same_shape.append((i, h, dims, full if dims is full else chan))

    def scan_scan(self, op) -> None:
        """Every input and output of a `scan.scan` has one shape (the lowering walks the first's)."""
        operands = [self.arg_index(v) for v in (*op.inputs, *op.outputs)]
        if any(i is None for i in operands):
            self.skip(op)
            return
        dims = list(range(op.outputs[0].type.get_num_dims()))
        for i in operands[1:]:
            if i != operands[0]:
                self.contract.same_shape.append((i, operands[0], dims, dims))

    def access(self, op: Operation, loops: list[_Loop | None], guarded: bool) -> None:
        ref = op.memref if hasattr(op, "memref") else op.base  # type: ignore[attr-defined]
        ref = self.states.get(ref, ref)
        i = self.arg_index(ref)
        local_shape = _static_local_shape(ref) if i is None else ()
        text = op_text(op)
        if i is None and local_shape is None:
            self.skip(op)  # a view, or a buffer of dynamic size
            return
        if guarded or any(loop is None for loop in loops):
            self.skip(op)
            return
        try:
            indices = [self.expr(x) for x in op.indices]  # type: ignore[attr-defined]
        except _Unknown:
            self.skip(op)
            return
        if any(self.loops.get(iv) is not None and self.loops[iv].dependent for e in indices for iv in e.ivs):
            self.skip(op)  # runtime bounds checks guard it instead
            return
        if i is None and any(e.correlated for e in indices):
            # (a local buffer indexed within a chunk, as the gradient pass's are: intervals
            # would refuse calls that stay inside it)
            self.skip(op)
            return
        extents = [1] * len(indices)
        vt = op.result.type if isinstance(op, vector.LoadOp) else (op.vector.type if isinstance(op, vector.StoreOp) else None)
        if vt is not None and indices:
            extents[-1] = vt.get_shape()[-1]
        write = isinstance(op, memref.StoreOp | vector.StoreOp)
        self.contract.accesses.append(
            _Access(text, i, indices, extents, [lp for lp in loops if lp], write, local_shape or (), list(self.when))
        )


#: Ops that take a memref without touching its elements, or whose accesses `visit` follows.
_MEMREF_SAFE_OPS = (memref.DimOp, memref.DeallocOp, memref.LoadOp, memref.StoreOp, vector.LoadOp, vector.StoreOp)


#: cmpi predicate -> (lhs below rhs, the bound's offset from rhs): slt, sle, sgt, sge
_SIGNED_BOUND = {2: (True, -1), 3: (True, 0), 4: (False, 1), 5: (False, 0)}


def _plus(e: _Expr, k: int) -> _Expr:
    return e if k == 0 else _Expr(["+", e.tree, ["const", k]], f"({e.text} + {k})", e.sources, e.ivs, e.correlated)


def _mentions_indices(v: SSAValue) -> bool:
    """Whether `v` is computed from an index, size or integer scalar (a loop variable,
    `memref.dim`, an integer argument or carried value), looking through pure ops but
    not through loads: a loaded value is data, whatever its index."""
    seen: set[SSAValue] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        if isinstance(x, BlockArgument):
            if isinstance(x.type, IndexType | IntegerType):
                return True
            continue
        op = x.owner
        if isinstance(op, memref.LoadOp | vector.LoadOp):
            continue
        if isinstance(op, memref.DimOp) or op.regions:
            return True  # a size, or a value a region computes (not followed)
        todo.extend(op.operands)
    return False


def _static_local_shape(ref: SSAValue) -> tuple[int, ...] | None:
    """The shape of a local buffer (`memref.alloca` / `alloc`) of static shape, else None."""
    if isinstance(ref.owner, memref.AllocaOp | memref.AllocOp) and isinstance(ref.type, MemRefType):
        shape = tuple(ref.type.get_shape())
        if DYNAMIC_INDEX not in shape:
            return shape
    return None


_BINARY = {arith.AddiOp: "+", arith.SubiOp: "-", arith.MuliOp: "*", arith.MinSIOp: "min", arith.MaxSIOp: "max",
           arith.MinUIOp: "min", arith.MaxUIOp: "max", arith.DivUIOp: "/", arith.DivSIOp: "/",
           arith.FloorDivSIOp: "//", arith.RemUIOp: "%", arith.RemSIOp: "%"}
_UNSIGNED = (arith.MinUIOp, arith.MaxUIOp, arith.DivUIOp, arith.RemUIOp)
#: The tree node of an unsigned op: a negative operand is a huge unsigned one.
_UNSIGNED_KIND = {"min": "umin", "max": "umax", "/": "u/", "%": "u%"}


def _within_width(e: _Expr, t: Any) -> _Expr:
    """`e` as its type holds it: integer arithmetic wraps at the type's width (64 bits for
    index, 32 for i32, ...), and a value cast to a narrower type is truncated; where the
    exact interval leaves that range, the value could be anything the type holds
    (`contract_check`'s "wrap" node)."""
    bits = 64 if isinstance(t, IndexType) else t.width.data if isinstance(t, IntegerType) else None
    if bits is None or (e.tree[0] == "const" and -(1 << (bits - 1)) <= e.tree[1] < 1 << (bits - 1)):
        return e
    if bits == 64 and e.tree[0] in ("dim", "iv", "wrap"):
        return e  # a size, or a loop variable between wrapped bounds, always fits 64 bits
    return _Expr(["wrap", bits, e.tree], e.text, e.sources, e.ivs, e.correlated)


def op_text(op: Operation) -> str:
    from scanweaver.ir import print_ir

    try:
        return print_ir(op).strip().splitlines()[0][:160]
    except Exception:  # noqa: BLE001 - a message only
        return op.name


def derive_contract(fn: func.FuncOp) -> ShapeContract:
    analysis = _Analysis(fn)
    analysis.walk(fn.body.blocks[0], [], False)
    return analysis.contract


def derive_contracts(module: ModuleOp) -> dict[str, ShapeContract]:
    """A contract per public function with a body."""
    functions = {op.sym_name.data: op for op in module.walk() if isinstance(op, func.FuncOp) and not op.is_declaration}
    contracts = {name: derive_contract(fn) for name, fn in functions.items()}
    for name, contract in contracts.items():
        primal = functions.get(name.removesuffix("_vjp")) if name.endswith("_vjp") else None
        if primal is not None:
            _add_shadow_shapes(contract, primal, functions[name])
    return contracts


def _add_shadow_shapes(contract: ShapeContract, primal: func.FuncOp, vjp: func.FuncOp) -> None:
    """`@f_vjp(args..., d_args...)` (scanweaver-grad): each shadow is the cotangent of its
    float memref argument, so it has that argument's shape.  Its accesses sit in chunked
    loops that intervals do not judge; this relation refuses a wrong shadow before the call."""
    from scanweaver.rewrites.grad import is_float_memref

    inputs, vjp_inputs = list(primal.function_type.inputs.data), list(vjp.function_type.inputs.data)
    floats = [i for i, t in enumerate(inputs) if is_float_memref(t)]
    if vjp_inputs != inputs + [inputs[i] for i in floats]:
        return  # not the gradient pass's signature
    for k, i in enumerate(floats):
        dims = list(range(inputs[i].get_num_dims()))
        contract.same_shape.append((len(inputs) + k, i, dims, dims))


__all__ = ["ShapeContract", "derive_contract", "derive_contracts"]
