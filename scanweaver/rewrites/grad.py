"""`scanweaver-grad`: the vector-Jacobian product of functions whose recurrences were raised.

For each public `func.func @f` holding scan ops, adds `func.func @f_vjp(args..., d_args...)`:
the primal arguments of @f, then one *shadow* memref per float memref argument.  Seeing
@f as a map from the contents of all its memref arguments to their contents afterwards,
@f_vjp applies the transposed Jacobian to the shadows in place:

    on entry  d_X = cotangent of X's contents after @f   (zeros for arrays @f only reads)
    on exit   d_X = cotangent of X's contents before @f  (= the gradient, plus d_X's entry
                    value for arrays @f only reads)

The VJP is reverse-mode differentiation of the loop code with recomputation instead of a
tape; the primal output arguments may be overwritten with recomputed values.  Each raised
recurrence `h_i = a_i * h_{i-1} + b_i` becomes, in the reverse sweep:

  * a forward run in chunks of `chunk` steps that keeps the state at chunk starts
    (checkpoints: (steps / chunk) x state), and for the last `window` steps at most
    their coefficients and states (window x state buffers, reused per channel);
  * per chunk, from the last: the states of the chunk recomputed from its checkpoint
    (a `scan.recurrence`), the reverse of the `emit` region per step (the cotangent g_i
    of the state from the consumer), then the adjoint recurrence, itself a
    `scan.recurrence` running backwards in time over the chunk:
        mu_{i-1} = a_i * (mu_i + g_i)        (mu: cotangent of h_{i-1} from the future)
    so lambda_i = mu_i + g_i = dL/dh_i, db_i = lambda_i, da_i = lambda_i * h_{i-1}, and the
    reverse of the `coeffs` region turns (da_i, db_i) into input gradients.  At the end mu
    is the cotangent of the initial state.  With `fuse` (the default), the adjoint of a
    `scan.recurrence` runs on lambda itself, lambda_i = a_{i+1} * lambda_{i+1} + g_i, and
    its emit region is the reverse of `coeffs` for step i: one pass over the chunk, the
    state vector (lambda) in registers, the sums over the state vectorised.  `scan.linear_recurrence` is the same with
    mu_{i-1} = M_i^T (mu_i + g_i); `scan.affine` runs the adjoint as a reverse
    `scan.affine` over the whole arrays (their size is the inputs' size).

Everything is scan ops plus arith/math/memref/scf, so the VJP goes through the same CPU
and GPU lowerings as the forward.  What cannot be differentiated is refused with a reason
(`GradRefused`): integer or mixed-precision states, loops carrying values that were not
raised into scans (other than additive reductions such as sum_n C[n]*h[n]), scf.if, calls,
float scalar arguments, results, and functions that read an argument after writing it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects.arith import FastMathFlag
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    UnitAttr,
)
from xdsl.ir import Attribute, Block, BlockArgument, OpResult, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from scanweaver.dialects import scan
from scanweaver.errors import ScanWeaverError
from scanweaver.rewrites.grad_rules import INACTIVE, RULES

#: unit attribute on each `@f_vjp` this pass writes: its chunk loops (`t0 + i` for
#: `i < min(chunk, L - t0)`) stay inside the primal's index ranges by construction, which
#: the shape contract's intervals cannot show, so the GPU channel programs take its
#: accesses on this pass's word (`gpu_channel_program.check_in_bounds`)
GENERATED_VJP_ATTR = "scanweaver.generated_vjp"
FLOAT_TYPES = (Float16Type, BFloat16Type, Float32Type, Float64Type)
SCAN_OPS = (scan.RecurrenceOp, scan.LinearRecurrenceOp, scan.AffineOp)


class GradRefused(ScanWeaverError):
    """`scanweaver-grad` cannot differentiate a function; the message says why."""


def is_float(t: Attribute) -> bool:
    return isinstance(t, FLOAT_TYPES)


def is_float_memref(t: Attribute) -> bool:
    return isinstance(t, MemRefType) and is_float(t.element_type)


# ---------------------------------------------------------------------------
# Emitting ops: a cursor at the end of a block, plus small arith helpers
# ---------------------------------------------------------------------------


class Emit:
    """Appends ops to `self.block`; allocas of fixed size are hoisted to the entry."""

    def __init__(self, block: Block):
        self.block = block
        self.hoisted: list[Operation] = []

    def put(self, op: Operation) -> Operation:
        self.block.add_op(op)
        return op

    # -- constants and arithmetic ---------------------------------------------------
    def iconst(self, v: int) -> SSAValue:
        return self.put(arith.ConstantOp(IntegerAttr(v, IndexType()))).result

    def fconst(self, v: float, t: Attribute) -> SSAValue:
        return self.put(arith.ConstantOp(FloatAttr(v, t))).result

    def add(self, x, y):
        return self.put(arith.AddfOp(x, y)).result

    def add_reassoc(self, x, y):
        """x + y, reorderable with other such sums (LLVM may vectorise a sum of them)."""
        flags = arith.FastMathFlagsAttr([FastMathFlag.REASSOC, FastMathFlag.NO_SIGNED_ZEROS])
        return self.put(arith.AddfOp(x, y, flags)).result

    def sub(self, x, y):
        return self.put(arith.SubfOp(x, y)).result

    def mul(self, x, y):
        return self.put(arith.MulfOp(x, y)).result

    def div(self, x, y):
        return self.put(arith.DivfOp(x, y)).result

    def neg(self, x):
        return self.put(arith.NegfOp(x)).result

    def select(self, c, x, y):
        return self.put(arith.SelectOp(c, x, y)).result

    def addi(self, x, y):
        return self.put(arith.AddiOp(x, y)).result

    def subi(self, x, y):
        return self.put(arith.SubiOp(x, y)).result

    def muli(self, x, y):
        return self.put(arith.MuliOp(x, y)).result

    def divui(self, x, y):
        return self.put(arith.DivUIOp(x, y)).result

    def mini(self, x, y):
        return self.put(arith.MinSIOp(x, y)).result

    def maxi(self, x, y):
        return self.put(arith.MaxSIOp(x, y)).result

    def cmpi(self, x, y, pred: str):
        return self.put(arith.CmpiOp(x, y, pred)).result

    def ceildiv(self, x, y):
        """ceil(x / y) for x >= 0, y > 0."""
        return self.divui(self.subi(self.addi(x, y), self.iconst(1)), y)

    def trip_count(self, lb, ub, step):
        return self.ceildiv(self.maxi(self.subi(ub, lb), self.iconst(0)), step)

    # -- memory ------------------------------------------------------------------
    def load(self, m, idx: Sequence[SSAValue]):
        return self.put(memref.LoadOp.get(m, list(idx))).res

    def store(self, v, m, idx: Sequence[SSAValue]):
        self.put(memref.StoreOp.get(v, m, list(idx)))

    def accumulate(self, m, idx: Sequence[SSAValue], d: SSAValue, reassoc: bool = False):
        """m[idx] += d (d converted to m's element type).  reassoc: the sum may be
        reordered (a reduction cell: LLVM then vectorises the loop around it)."""
        el = m.type.element_type
        if d.type != el:
            d = self.put(arith.TruncFOp(d, el) if _width(el) < _width(d.type) else arith.ExtFOp(d, el)).result
        flags = arith.FastMathFlagsAttr([FastMathFlag.REASSOC, FastMathFlag.NO_SIGNED_ZEROS]) if reassoc else None
        self.store(self.put(arith.AddfOp(self.load(m, idx), d, flags)).result, m, idx)

    def hoisted_alloca(self, t: MemRefType) -> SSAValue:
        op = memref.AllocaOp.get(t.element_type, shape=list(t.get_shape()))
        self.hoisted.append(op)
        return op.memref

    def alloc(self, el: Attribute, shape: Sequence[int], dynamic: Sequence[SSAValue]) -> SSAValue:
        return self.put(memref.AllocOp.get(el, shape=list(shape), dynamic_sizes=list(dynamic))).memref

    def dealloc(self, m: SSAValue) -> None:
        self.put(memref.DeallocOp.get(m))

    # -- loops -------------------------------------------------------------------
    def for_(self, lb, ub, body, reverse: bool = False) -> None:
        """scf.for from lb to ub (step 1); body(iv) emits into the loop body.  With
        reverse, iv runs from ub-1 down to lb."""
        blk = Block(arg_types=[IndexType()])
        outer, self.block = self.block, blk
        iv = blk.args[0]
        if reverse:
            iv = self.subi(self.subi(self.addi(lb, ub), self.iconst(1)), iv)
        body(iv)
        self.put(scf.YieldOp())
        self.block = outer
        self.put(scf.ForOp(lb, ub, self.iconst(1), [], Region(blk)))

    def for_sums(self, lb, ub, inits: Sequence[SSAValue], body) -> list[SSAValue]:
        """scf.for from lb to ub (step 1) carrying the sums `inits`: body(iv, sums)
        emits into the loop body and returns the new sums; returns the loop's results.
        Sums in registers, not in memory cells: LLVM vectorises the loop around them."""
        blk = Block(arg_types=[IndexType(), *(v.type for v in inits)])
        outer, self.block = self.block, blk
        out = body(blk.args[0], list(blk.args[1:]))
        self.put(scf.YieldOp(*out))
        self.block = outer
        return list(self.put(scf.ForOp(lb, ub, self.iconst(1), list(inits), Region(blk))).results)

    def for_static_sums(self, shape: Sequence[int], inits: Sequence[SSAValue], body, prefix=()) -> list[SSAValue]:
        """for_static carrying sums through the loop nest: body(indices, sums) -> sums."""
        if not shape:
            return body(list(prefix), list(inits))
        return self.for_sums(
            self.iconst(0),
            self.iconst(shape[0]),
            inits,
            lambda i, sums: self.for_static_sums(shape[1:], sums, body, (*prefix, i)),
        )

    def for_static(self, shape: Sequence[int], body, prefix=()) -> None:
        """Loops over every index of a static shape; body(indices)."""
        if not shape:
            body(list(prefix))
            return
        self.for_(
            self.iconst(0),
            self.iconst(shape[0]),
            lambda i: self.for_static(shape[1:], body, (*prefix, i)),
        )

    def copy_rows(self, shape, src, src_pre, dst, dst_pre) -> None:
        """dst[dst_pre, k] = src[src_pre, k] for every k of `shape`."""
        self.for_static(
            shape, lambda k: self.store(self.load(src, [*src_pre, *k]), dst, [*dst_pre, *k])
        )

    def fill(self, shape, dst, pre, value) -> None:
        self.for_static(shape, lambda k: self.store(value, dst, [*pre, *k]))


def _width(t: Attribute) -> int:
    return {Float16Type: 16, BFloat16Type: 16, Float32Type: 32, Float64Type: 64}[type(t)]


# ---------------------------------------------------------------------------
# Scopes: cotangents of SSA values, and memory cells for values of enclosing blocks
# ---------------------------------------------------------------------------


@dataclass
class Scope:
    """Cotangents of the values of one block being reversed.  Values defined in an
    enclosing block (used inside a loop or a recurrence region) accumulate into a
    rank-0 memref cell instead, read back once the loop is done."""

    adj: dict[SSAValue, SSAValue] = field(default_factory=dict)
    cells: dict[SSAValue, SSAValue] = field(default_factory=dict)
    #: values of an enclosing block whose cotangents are summed as SSA values here
    #: (value -> the running sum), reassociably
    sums: dict[SSAValue, SSAValue] = field(default_factory=dict)


def free_float_values(regions: Iterable[Region], owner: Operation) -> list[SSAValue]:
    """Float values used inside `regions` of `owner` but defined outside it (not
    constants: their cotangent goes nowhere)."""
    seen: dict[SSAValue, None] = {}
    for region in regions:
        for op in region.walk():
            for v in op.operands:
                if not is_float(v.type) or v in seen:
                    continue
                if isinstance(v, BlockArgument):
                    parent = v.block.parent_op()
                    inside = parent is not None and (parent is owner or owner.is_ancestor(parent))
                else:
                    if isinstance(v.owner, arith.ConstantOp):
                        continue
                    inside = owner.is_ancestor(v.owner)
                if not inside:
                    seen[v] = None
    return list(seen)


# ---------------------------------------------------------------------------
# The VJP builder
# ---------------------------------------------------------------------------


class VjpBuilder:
    #: staged: the buffered recurrence computes (a, b) and stores them for the reverse,
    #: instead of a fill loop before it (`buffered_coeffs`; the same bits)
    FUSED_FILL = True

    def __init__(self, fn: func.FuncOp, chunk: int, window: int = 8192, fuse: bool = True, staged: bool = True):
        self.fn = fn
        self.fuse = fuse  # scan.recurrence: the coefficients' reverse in the adjoint's emit
        # the per-step scalar work of a scan.recurrence's reverse in loops of its own, and
        # b computed again where cheap (see ScanweaverGrad.staged)
        self.staged = staged
        self.name = fn.sym_name.data
        self.chunk = chunk
        self.window_chunks = max(1, window // chunk)  # chunks whose coefficients are kept
        self.shadow: dict[SSAValue, SSAValue] = {}  # old memref -> its shadow in the VJP
        self.primal_args: set[SSAValue] = set()

    def refuse(self, why: str, op: Operation | None = None) -> GradRefused:
        where = f" ('{op.name}')" if op is not None else ""
        return GradRefused(f"scanweaver-grad: cannot differentiate @{self.name}{where}: {why}")

    # -- checks ------------------------------------------------------------------
    def check(self) -> None:
        fn = self.fn
        if fn.function_type.outputs.data:
            raise self.refuse("it returns values (write results to memref arguments instead)")
        for i, t in enumerate(fn.function_type.inputs.data):
            if is_float(t):
                raise self.refuse(f"argument #{i} is a float scalar (pass it as a memref to get its gradient)")
        args = set(fn.body.block.args)
        written: set[SSAValue] = set()
        for op in fn.body.walk():
            reads, writes = _own_memory_effects(op)
            for m in reads:
                if m in args and m in written:
                    raise self.refuse(
                        f"argument #{m.index} is read after being written (the VJP recomputes "
                        "from the arguments' initial contents)", op)
            written |= {m for m in writes if m in args}
            if isinstance(op, (scf.IfOp, func.CallOp)):
                raise self.refuse("conditionals and calls are not supported", op)
            if isinstance(op, scf.ForOp):
                self.check_no_carried_memory(op)
            if isinstance(op, SCAN_OPS):
                self.check_scan(op)

    def check_no_carried_memory(self, loop: scf.ForOp) -> None:
        """The VJP runs loop iterations backwards, recomputing each from memory as it
        was: refuse loops whose iterations pass values to each other through a memref
        (a recurrence the raise pass did not turn into a scan)."""
        iv = loop.body.block.args[0]
        reads, writes = _memory_effects(loop)
        for m in set(reads) & set(writes):
            if loop.is_ancestor(m.owner if isinstance(m, OpResult) else m.block.parent_op()):
                continue  # a buffer of the iteration itself
            if all(iv in idx for idx in _access_indices(loop, m)):
                continue  # each iteration touches its own slice
            if _initialized_first(loop.body.block, m):
                continue  # each iteration overwrites it before reading it
            raise self.refuse(
                "a loop passes values between iterations through a memref (a recurrence that "
                "was not raised into a scan; run scanweaver-raise{diagnose=true} to see why)", loop)

    def check_scan(self, op: Operation) -> None:
        if isinstance(op, scan.AffineOp):
            el = op.h.type.element_type
            if not is_float(el):
                raise self.refuse(f"integer scans have no gradient (element type {el})", op)
            if any(v.type.element_type != el for v in (op.a, op.b)):
                raise self.refuse("inputs of another precision than the state are not supported", op)
            return
        st = op.state_type
        if not is_float(st.element_type):
            raise self.refuse(f"integer recurrences have no gradient (state {st})", op)
        if any(d == DYNAMIC_INDEX for d in st.get_shape()):
            raise self.refuse(f"the state {st} must have a static shape", op)
        if isinstance(op.state, BlockArgument) and op.state.block is not self.fn.body.block:
            raise self.refuse("the state must be an argument or a local buffer", op)

    # -- the function --------------------------------------------------------------
    def build(self) -> func.FuncOp:
        self.check()
        old_args = list(self.fn.body.block.args)
        in_types = list(self.fn.function_type.inputs.data)
        shadowed = [a for a in old_args if is_float_memref(a.type)]
        block = Block(arg_types=in_types + [a.type for a in shadowed])
        arg_names = [a.name_hint or f"arg{a.index}" for a in old_args]
        for new, name in zip(block.args, arg_names):
            new.name_hint = name
        vmap: dict[SSAValue, SSAValue] = dict(zip(old_args, block.args))
        self.primal_args = set(block.args[: len(old_args)])
        for k, a in enumerate(shadowed):
            sh = block.args[len(old_args) + k]
            sh.name_hint = "d_" + arg_names[a.index]
            self.shadow[a] = sh
        e = Emit(block)
        self.rev_block(e, self.fn.body.block, vmap, Scope())
        e.put(func.ReturnOp())
        for op in reversed(e.hoisted):
            block.insert_op_before(op, block.first_op)
        _reassociate_sums(block)
        vjp = func.FuncOp(self.name + "_vjp", (list(block.arg_types), []), Region(block))
        vjp.attributes[GENERATED_VJP_ATTR] = UnitAttr()
        return vjp

    # -- blocks: recompute forward, then reverse ----------------------------------
    def rev_block(self, e: Emit, block: Block, vmap, scope: Scope, seeds=()) -> None:
        ops = [op for op in block.ops if not isinstance(op, (scf.YieldOp, scan.YieldOp, func.ReturnOp))]
        self.rev_ops(e, ops, vmap, scope, seeds)

    def rev_ops(self, e: Emit, ops: list[Operation], vmap, scope: Scope, seeds=(), forward: bool = True,
                preset: frozenset = frozenset()) -> None:
        """Recompute `ops` (unless forward=False: done already; ops whose results are
        in `preset` are mapped in vmap already), then emit their reverse."""
        ckpt: dict[Operation, dict] = {}
        if forward:
            needed = self.needed_in_forward(ops, vmap)
            for op in ops:
                if op in needed and not (op.results and all(r in preset for r in op.results)):
                    self.forward(e, op, vmap, ckpt)
        for v, d in seeds:
            self.add_adj(e, scope, v, d)
        for op in reversed(ops):
            self.reverse(e, op, vmap, scope, ckpt)

    def needed_in_forward(self, ops: list[Operation], vmap) -> set[Operation]:
        """Ops of the forward sweep: all but dropped argument stores and result-less
        region ops whose local writes no later op reads (their reverse recomputes them)."""
        needed: set[Operation] = set()
        live: set[SSAValue] = set()
        for op in reversed(ops):
            reads, writes = _memory_effects(op)
            local_writes = {m for m in writes if vmap.get(m) not in self.primal_args}
            if isinstance(op, memref.StoreOp):
                keep = op.memref not in self.fn.body.block.args
            elif op.regions and not op.results and not isinstance(op, SCAN_OPS):
                keep = bool(local_writes & live)
            else:
                keep = True
            if keep:
                needed.add(op)
                live |= set(reads)
        return needed

    def clone(self, e: Emit, op: Operation, vmap) -> Operation:
        new = op.clone(value_mapper=vmap)
        e.put(new)
        for inner in list(new.walk()):
            if isinstance(inner, memref.StoreOp) and inner.memref in self.primal_args:
                inner.detach()
                inner.erase()
        for old, nv in zip(op.results, new.results):
            vmap[old] = nv
        return new

    def forward(self, e: Emit, op: Operation, vmap, ckpt) -> None:
        if isinstance(op, memref.AllocaOp):
            self.clone(e, op, vmap)
            if is_float_memref(op.memref.type):
                t = op.memref.type
                if any(d == DYNAMIC_INDEX for d in t.get_shape()):
                    raise self.refuse("local buffers of dynamic size are not supported", op)
                sh = e.hoisted_alloca(t)
                e.fill(t.get_shape(), sh, [], e.fconst(0.0, t.element_type))
                self.shadow[op.memref] = sh
            return
        if isinstance(op, (scan.RecurrenceOp, scan.LinearRecurrenceOp)):
            ckpt[op] = self.forward_recurrence(e, op, vmap)
            return
        self.clone(e, op, vmap)

    # -- cotangent bookkeeping -------------------------------------------------------
    def add_adj(self, e: Emit, scope: Scope, v: SSAValue, d: SSAValue | None) -> None:
        if d is None or not is_float(v.type):
            return
        if isinstance(v, SSAValue) and isinstance(getattr(v, "owner", None), arith.ConstantOp):
            return
        if v in scope.sums:
            scope.sums[v] = e.add_reassoc(scope.sums[v], d)
            return
        cell = scope.cells.get(v)
        if cell is not None:
            e.accumulate(cell, [], d, reassoc=True)
        elif v in scope.adj:
            scope.adj[v] = e.add(scope.adj[v], d)
        else:
            scope.adj[v] = d

    def make_cells(self, e: Emit, values: list[SSAValue]) -> dict[SSAValue, SSAValue]:
        cells = {}
        for v in values:
            c = e.hoisted_alloca(MemRefType(v.type, []))
            e.store(e.fconst(0.0, v.type), c, [])
            cells[v] = c
        return cells

    def read_cells(self, e: Emit, scope: Scope, cells) -> None:
        for v, c in cells.items():
            self.add_adj(e, scope, v, e.load(c, []))

    # -- reverse of one op -------------------------------------------------------------
    def reverse(self, e: Emit, op: Operation, vmap, scope: Scope, ckpt) -> None:
        if isinstance(op, memref.LoadOp):
            d = scope.adj.get(op.res)
            sh = self.shadow.get(op.memref)
            if d is not None and sh is not None:
                e.accumulate(sh, [vmap[i] for i in op.indices], d)
            return
        if isinstance(op, memref.StoreOp):
            sh = self.shadow.get(op.memref)
            if sh is not None:
                idx = [vmap[i] for i in op.indices]
                self.add_adj(e, scope, op.value, e.load(sh, idx))
                e.store(e.fconst(0.0, sh.type.element_type), sh, idx)
            return
        if isinstance(op, scf.ForOp):
            self.reverse_for(e, op, vmap, scope)
            return
        if isinstance(op, (scan.RecurrenceOp, scan.LinearRecurrenceOp)):
            self.reverse_recurrence(e, op, vmap, scope, ckpt[op])
            return
        if isinstance(op, scan.AffineOp):
            self.reverse_affine(e, op, vmap, scope)
            return
        if isinstance(op, (memref.AllocaOp, memref.AllocOp, memref.DeallocOp, memref.DimOp, *INACTIVE)):
            return
        if type(op) in RULES and len(op.results) == 1:
            r = op.results[0]
            if not is_float(r.type):
                return
            d = scope.adj.get(r)
            if d is None:
                return
            outs = RULES[type(op)](e, [vmap[x] for x in op.operands], d, vmap[r])
            for x, dx in zip(op.operands, outs):
                self.add_adj(e, scope, x, dx)
            return
        raise self.refuse("no derivative rule for this op", op)

    # -- scf.for: reversed iterations ------------------------------------------------
    def reverse_for(self, e: Emit, op: scf.ForOp, vmap, scope: Scope) -> None:
        body = op.body.block
        carried = list(body.args[1:])
        yielded = list(body.last_op.operands)
        for k, arg in enumerate(carried):
            if not is_float(arg.type):
                raise self.refuse("loops carrying non-float values are not supported", op)
            self.check_additive(op, arg, yielded[k])
        d_res = [scope.adj.get(r) for r in op.results]
        cells = self.make_cells(e, free_float_values([op.body], op))
        lb, ub, step = vmap[op.lb], vmap[op.ub], vmap[op.step]
        trip = e.trip_count(lb, ub, step)

        def body_fn(r):
            inner = dict(vmap)
            inner[body.args[0]] = e.addi(lb, e.muli(r, step))
            for arg in carried:  # additive chains: the carried primal value is not needed
                inner[arg] = e.fconst(0.0, arg.type)
            seeds = [(yielded[k], d) for k, d in enumerate(d_res) if d is not None]
            self.rev_block(e, body, inner, Scope(cells=cells), seeds)

        e.for_(e.iconst(0), trip, body_fn, reverse=True)
        self.read_cells(e, scope, cells)
        for k, d in enumerate(d_res):
            self.add_adj(e, scope, op.iter_args[k], d)

    def check_additive(self, op: Operation, arg: SSAValue, yielded: SSAValue) -> None:
        """The carried value only flows through addf (either side) / subf (left side)
        into its yield: its cotangent is then the same at every iteration."""
        v = arg
        while v is not yielded:
            uses = list(v.uses)
            if len(uses) != 1:
                raise self.refuse("a loop carries a value that was not raised into a scan", op)
            user = uses[0].operation
            ok = isinstance(user, arith.AddfOp) or (isinstance(user, arith.SubfOp) and uses[0].index == 0)
            if not ok:
                raise self.refuse(
                    f"a loop carries a value through '{user.name}' (not raised into a scan; "
                    "only additive reductions are differentiated)", op)
            v = user.results[0]

    # -- recurrences -------------------------------------------------------------------
    def kept_coefficients(self, op) -> list[SSAValue]:
        """Float values of coeffs that do not depend on the state index (softplus of the
        step and the like): computed once per step by fill_coefficients, read back by
        the reverse."""
        el = op.state_type.element_type
        return [r for o in split_by_state_index(op.coeffs.block)[0] for r in o.results
                if r.type == el and not isinstance(o, arith.ConstantOp)]

    def forward_recurrence(self, e: Emit, op, vmap) -> dict:
        """Run the recurrence in chunks, keeping the state at every chunk start.

        scan.recurrence: the coefficients (a, b) of the last `window` steps (at most) are
        computed once, into buffers of window x state (AB) and kept values x window (INV):
        the checkpoint run and the reverse both read them, so for a recurrence of up to
        `window` steps exp(dt*A) and the softplus run once per step in the whole VJP.
        Chunks before the window run the recurrence itself here, and the reverse fills
        the buffers' first chunk rows again for them.  The states of the window's steps
        are kept too (H), so the reverse recomputes those of the chunks before it only."""
        st_t = op.state_type
        el = st_t.element_type
        shape = list(st_t.get_shape())
        state = vmap[op.state]
        if state in self.primal_args:  # keep the argument's initial contents
            work = e.hoisted_alloca(st_t)
            e.copy_rows(shape, state, [], work, [])
            state = work
        lb, ub, step = vmap[op.lb], vmap[op.ub], vmap[op.step]
        steps = e.trip_count(lb, ub, step)
        K = e.iconst(self.chunk)
        chunks = e.ceildiv(steps, K)
        ck = e.alloc(el, [DYNAMIC_INDEX, *shape], [e.addi(chunks, e.iconst(1))])
        e.copy_rows(shape, state, [], ck, [e.iconst(0)])
        span = e.muli(K, step)
        info = {"state": state, "ck": ck, "steps": steps, "chunks": chunks, "span": span,
                "AB": None, "INV": None, "kept": [], "split": chunks, "H": None}

        def chunk(c, buffered: bool):
            s0 = e.addi(lb, e.muli(c, span))
            s1 = e.mini(e.addi(s0, span), ub)
            if buffered:
                base = e.muli(e.subi(c, info["split"]), K)
                self.recompute_states(e, op, vmap, s0, s1, step, state, info["H"], info["AB"], base, base,
                                      info["kept"], info["INV"])
            else:
                new = self.clone(e, op, dict(vmap))
                new.operands = [s0, s1, step, state]
            e.copy_rows(shape, state, [], ck, [e.addi(c, e.iconst(1))])

        if isinstance(op, scan.RecurrenceOp):
            kept = self.kept_coefficients(op)
            rows = e.muli(e.mini(chunks, e.iconst(self.window_chunks)), K)  # <= window
            # b of a step is not kept when it is cheap to compute again from the kept
            # values (dt*u*B[k]): the reads of the buffered recurrence recompute it
            AB = (e.alloc(el, [DYNAMIC_INDEX, *shape], [rows]),
                  None if self.staged and self.b_slice(op, kept) is not None
                  else e.alloc(el, [DYNAMIC_INDEX, *shape], [rows]))
            INV = e.alloc(el, [len(kept), DYNAMIC_INDEX], [rows]) if kept else None
            H = e.alloc(el, [DYNAMIC_INDEX, *shape], [e.addi(rows, e.iconst(1))])  # states, as the reverse's H
            split = e.maxi(e.subi(chunks, e.iconst(self.window_chunks)), e.iconst(0))
            info.update(AB=AB, INV=INV, kept=kept, split=split, H=H)
            e.for_(e.iconst(0), split, lambda c: chunk(c, False))
            e.copy_rows(shape, state, [], H, [e.iconst(0)])
            w_steps = e.subi(steps, e.muli(split, K))
            self.fill_coefficients(e, op, vmap, e.addi(lb, e.muli(split, span)), step, w_steps,
                                   AB, kept, INV, e.iconst(0))
            e.for_(split, chunks, lambda c: chunk(c, True))
        else:
            e.for_(e.iconst(0), chunks, lambda c: chunk(c, False))
        return info

    def reverse_recurrence(self, e: Emit, op, vmap, scope: Scope, info: dict) -> None:
        """The chunks from the last to the first (see _RecurrenceAdjoint), then the
        cotangents of the values the regions read from outside."""
        adj = _RecurrenceAdjoint(self, e, op, vmap, info)
        e.for_(e.iconst(0), info["chunks"], adj.chunk, reverse=True)
        self.read_cells(e, scope, adj.cells)
        for buf in (info["ck"], *(info["AB"] or ()), info["INV"], info["H"]):  # (None: not allocated)
            if buf is not None:
                e.dealloc(buf)

    def fill_coefficients(self, e: Emit, op, vmap, s0, step, n, AB, kept, INV, base) -> None:
        """A[base + jj, k], B[base + jj, k] = coeffs(s0 + jj*step, k) for n steps; the ops
        not depending on k once per step, their `kept` float results in INV[m, base + jj].
        Staged (FUSED_FILL): INV only; the buffered recurrence over the same steps
        computes and stores A and B (`buffered_coeffs`)."""
        shape = list(op.state_type.get_shape())
        cb = op.coeffs.block
        inv, dep = split_by_state_index(cb)

        def time_only(jj):
            inner = dict(vmap)
            inner[cb.args[0]] = e.addi(s0, e.muli(jj, step))
            for o in inv:
                self.clone(e, o, inner)
            for m, v in enumerate(kept):
                e.store(inner[v], INV, [e.iconst(m), e.addi(base, jj)])

        # the ops not depending on k in a loop of their own, stored along time: it
        # vectorises over the steps (softplus and the like, not one step at a time)
        if kept:
            e.for_(e.iconst(0), n, time_only)

        def step_fn(jj):
            inner = dict(vmap)
            inner[cb.args[0]] = e.addi(s0, e.muli(jj, step))
            row = e.addi(base, jj)
            for m, v in enumerate(kept):
                inner[v] = e.load(INV, [e.iconst(m), row])
            for o in inv:
                if not (o.results and all(r in kept for r in o.results)):
                    self.clone(e, o, inner)

            def per_element(k):
                inner_k = dict(inner)
                for a, kk in zip(cb.args[1:], k):
                    inner_k[a] = kk
                for o in dep:
                    self.clone(e, o, inner_k)
                for v, buf in zip(cb.last_op.operands, AB):
                    if buf is not None:
                        e.store(inner_k.get(v, v), buf, [row, *k])

            e.for_static(shape, per_element)

        if not (self.staged and self.FUSED_FILL):  # else the buffered recurrence computes and stores them (buffered_coeffs)
            e.for_(e.iconst(0), n, step_fn)

    def b_slice(self, op, kept) -> list[Operation] | None:
        """The coeffs ops that compute b from the kept values, the time and state
        indices (in block order), when they are few loads and arithmetic ops: b is then
        computed again where it is read instead of buffered.  None otherwise."""
        cb = op.coeffs.block
        need = {cb.last_op.operands[1]}
        ops = []
        for o in reversed([o for o in cb.ops if not isinstance(o, scan.YieldOp)]):
            if not any(r in need for r in o.results) or all(r in kept for r in o.results):
                continue
            cheap = isinstance(o, (memref.LoadOp, arith.MulfOp, arith.AddfOp, arith.SubfOp, arith.ConstantOp)) or (
                o.dialect_name() == "arith" and not any(is_float(r.type) for r in o.results))  # index arithmetic
            if o.regions or not cheap:
                return None
            ops.append(o)
            need |= {v for v in o.operands if v not in kept}
        return list(reversed(ops)) if 0 < len(ops) <= 4 else None

    def buffered_coeffs(self, e: Emit, op, vmap, s0, step, AB, base, kept=(), INV=None) -> Region:
        """A coeffs region reading (a, b) from the buffers at base + (i - s0) / step
        (b computed from the kept values in INV when AB has no b buffer); staged
        (FUSED_FILL): computing them from the kept values and storing them there."""
        shape = list(op.state_type.get_shape())
        cb = op.coeffs.block
        blk = Block(arg_types=[IndexType()] * (1 + len(shape)))
        outer, e.block = e.block, blk
        jj = e.addi(base, e.divui(e.subi(blk.args[0], s0), step))
        if self.staged and self.FUSED_FILL:
            # staged: (a, b) computed here, from the kept values, and stored for the
            # reverse: the exp(dt*A) of each state element runs beside the recurrence's
            # step-to-step chain instead of in a fill loop of its own before it
            inner = dict(vmap)
            inner.update(zip(cb.args, blk.args))
            for m, v in enumerate(kept):
                inner[v] = e.load(INV, [e.iconst(m), jj])
            for o in cb.ops:
                if isinstance(o, scan.YieldOp) or (o.results and all(r in kept for r in o.results)):
                    continue
                self.clone(e, o, inner)
            ab = [inner.get(v, v) for v in cb.last_op.operands]
            for v, buf in zip(ab, AB):
                if buf is not None:
                    e.store(v, buf, [jj, *blk.args[1:]])
            e.put(scan.YieldOp(*ab))
            e.block = outer
            return Region(blk)
        a = e.load(AB[0], [jj, *blk.args[1:]])
        if AB[1] is not None:
            b = e.load(AB[1], [jj, *blk.args[1:]])
        else:
            inner = dict(vmap)
            inner.update(zip(cb.args, blk.args))
            for m, v in enumerate(kept):
                inner[v] = e.load(INV, [e.iconst(m), jj])
            for o in self.b_slice(op, kept):
                self.clone(e, o, inner)
            b = inner[cb.last_op.operands[1]]
        e.put(scan.YieldOp(a, b))
        e.block = outer
        return Region(blk)

    def recompute_states(self, e: Emit, op, vmap, s0, s1, step, row, H, AB=None, base=None, hb=None,
                         kept=(), INV=None) -> None:
        """The recurrence from s0 to s1 on `row`, its emit storing the state after step
        jj into H[hb + jj + 1] ((a, b) from AB at base + jj when given)."""
        shape = list(op.state_type.get_shape())
        if AB is not None:
            coeffs = self.buffered_coeffs(e, op, vmap, s0, step, AB, base, kept, INV)
        else:
            coeffs = Region()
            op.coeffs.clone_into(coeffs, value_mapper=dict(vmap))
        blk = Block(arg_types=[IndexType(), op.state_type])
        outer, e.block = e.block, blk
        jj = e.divui(e.subi(blk.args[0], s0), step)
        if hb is not None:
            jj = e.addi(hb, jj)
        e.copy_rows(shape, blk.args[1], [], H, [e.addi(jj, e.iconst(1))])
        e.put(scan.YieldOp())
        e.block = outer
        e.put(type(op)(s0, s1, step, row, coeffs, Region(blk)))

    def adjoint_scan(self, e: Emit, op, vmap, s0, step, n, mu, GS, MU, AB, base=None) -> None:
        """mu_{i-1} = a_i * (mu_i + g_i) (or M_i^T (mu_i + g_i)) from the chunk's last
        step to its first; the state after each step goes to MU[jj]."""
        shape = list(op.state_type.get_shape())
        linear = AB is None
        if not linear:  # a_i from the buffer: (a_i, a_i * g_i)
            blk = Block(arg_types=[IndexType()] * (1 + len(shape)))
            outer, e.block = e.block, blk
            jj = e.subi(e.subi(n, e.iconst(1)), blk.args[0])
            a = e.load(AB[0], [e.addi(base, jj), *blk.args[1:]])
            e.put(scan.YieldOp(a, e.mul(a, e.load(GS, [jj, *blk.args[1:]]))))
            eblk = Block(arg_types=[IndexType(), op.state_type])
            e.block = eblk
            jj2 = e.subi(e.subi(n, e.iconst(1)), eblk.args[0])
            e.copy_rows(shape, eblk.args[1], [], MU, [jj2])
            e.put(scan.YieldOp())
            e.block = outer
            e.put(type(op)(e.iconst(0), n, e.iconst(1), mu, Region(blk), Region(eblk)))
            return
        cb = op.coeffs.block
        rank_args = [IndexType()] * (1 + (0 if linear else len(shape)))
        cblk = Block(arg_types=rank_args)
        outer, e.block = e.block, cblk
        jj = e.subi(e.subi(n, e.iconst(1)), cblk.args[0])
        inner = dict(vmap)
        inner[cb.args[0]] = e.addi(s0, e.muli(jj, step))
        for a, kk in zip(cb.args[1:], cblk.args[1:]):
            inner[a] = kk
        for cop in cb.ops:
            if isinstance(cop, scan.YieldOp):
                break
            self.clone(e, cop, inner)
        ys = [inner.get(v, v) for v in cb.last_op.operands]
        if linear:
            size = shape[0]
            g = [e.load(GS, [jj, e.iconst(c)]) for c in range(size)]
            mt = [ys[r * size + c] for c in range(size) for r in range(size)]  # M^T row-major
            mg = []
            for c in range(size):  # (M^T g)[c] = sum_r M[r][c] g[r], left to right
                acc = e.mul(ys[c], g[0])
                for r in range(1, size):
                    acc = e.add(acc, e.mul(ys[r * size + c], g[r]))
                mg.append(acc)
            e.put(scan.YieldOp(*mt, *mg))
        else:
            a = ys[0]
            e.put(scan.YieldOp(a, e.mul(a, e.load(GS, [jj, *cblk.args[1:]]))))
        eblk = Block(arg_types=[IndexType(), op.state_type])
        e.block = eblk
        jj2 = e.subi(e.subi(n, e.iconst(1)), eblk.args[0])
        e.copy_rows(shape, eblk.args[1], [], MU, [jj2])
        e.put(scan.YieldOp())
        e.block = outer
        e.put(type(op)(e.iconst(0), n, e.iconst(1), mu, Region(cblk), Region(eblk)))

    # -- scan.affine: a reverse scan.affine over the whole arrays -----------------------
    def reverse_affine(self, e: Emit, op: scan.AffineOp, vmap, scope: Scope) -> None:
        h_t = op.h.type
        el = h_t.element_type
        rank = h_t.get_num_dims()
        axis = op.axis_value
        a, h = vmap[op.a], vmap[op.h]
        dims = [e.put(memref.DimOp(h, e.iconst(k))).result for k in range(rank)]
        dyn = [DYNAMIC_INDEX] * rank
        length = dims[axis]
        one, zero = e.fconst(1.0, el), e.fconst(0.0, el)
        L1 = e.subi(length, e.iconst(1))
        # a_next[t] = a[t+1] in the scan's direction (1 past the end)
        a_next = e.alloc(el, dyn, dims)
        lam = e.alloc(el, dyn, dims)

        def over_all(body):
            def rec(k, idx):
                if k == rank:
                    body(idx)
                    return
                e.for_(e.iconst(0), dims[k], lambda i: rec(k + 1, [*idx, i]))

            rec(0, [])

        def shifted(idx, delta_sign):
            t = idx[axis]
            if op.is_reverse != (delta_sign < 0):  # neighbour toward the end of time order
                edge = e.cmpi(t, e.iconst(0), "eq")
                nb = e.maxi(e.subi(t, e.iconst(1)), e.iconst(0))
            else:
                edge = e.cmpi(t, L1, "eq")
                nb = e.mini(e.addi(t, e.iconst(1)), L1)
            return edge, [*idx[:axis], nb, *idx[axis + 1 :]]

        def fill_next(idx):
            edge, nidx = shifted(idx, +1)
            e.store(e.select(edge, one, e.load(a, nidx)), a_next, idx)

        over_all(fill_next)
        dh = self.shadow[op.h]
        dfinal = self.shadow.get(op.final) if op.final is not None else None
        init = None
        if dfinal is not None:
            init = e.alloc(el, [DYNAMIC_INDEX] * (rank - 1), [d for k, d in enumerate(dims) if k != axis])
            ch_dims = [d for k, d in enumerate(dims) if k != axis]

            def copy_final(ch):
                e.store(e.load(dfinal, ch), init, ch)
                e.store(zero, dfinal, ch)

            def over_ch(body, k=0, idx=()):
                if k == rank - 1:
                    body(list(idx))
                    return
                e.for_(e.iconst(0), ch_dims[k], lambda i: over_ch(body, k + 1, (*idx, i)))

            over_ch(copy_final)
        e.put(scan.AffineOp(a_next, dh, lam, axis, init=init, reverse=not op.is_reverse))
        d_a, d_b = self.shadow.get(op.a), self.shadow.get(op.b)
        d_init = self.shadow.get(op.init) if op.init is not None else None
        h0 = vmap[op.init] if op.init is not None else None

        def grads(idx):
            lv = e.load(lam, idx)
            e.store(zero, dh, idx)  # h is overwritten by the scan
            if d_b is not None:
                e.accumulate(d_b, idx, lv)
            edge, pidx = shifted(idx, -1)
            ch = [*idx[:axis], *idx[axis + 1 :]]
            prev_h = e.load(h, pidx)
            if h0 is not None:
                prev_h = e.select(edge, e.load(h0, ch), prev_h)
            else:
                prev_h = e.select(edge, zero, prev_h)
            if d_a is not None:
                e.accumulate(d_a, idx, e.mul(lv, prev_h))
            if d_init is not None:
                # only the first step in time order reaches the initial state
                e.accumulate(d_init, ch, e.select(edge, e.mul(lv, e.load(a, idx)), zero))

        # lam is read whole before dh is cleared: grads reads lam, not dh
        over_all(grads)
        e.dealloc(a_next)
        e.dealloc(lam)
        if init is not None:
            e.dealloc(init)


class _RecurrenceAdjoint:
    """The reverse of one raised recurrence, chunk by chunk (from the last): its buffers,
    allocated once, and the steps of one chunk.

    H[hb + jj] = state before step jj (H[hb]: the checkpoint; hb: the chunk's first row
    when H holds the window's states, else 0), MU[jj + 1] = cotangent of the
    state after step jj from the future (MU[n]: from the next chunk): one row past the
    chunk, so the reverse reads both without a select per element.  GS[jj] = the
    consumer's cotangent of the state after step jj."""

    def __init__(self, builder: VjpBuilder, e: Emit, op, vmap, info: dict):
        self.b, self.e, self.op, self.vmap, self.info = builder, e, op, vmap, info
        self.linear = isinstance(op, scan.LinearRecurrenceOp)
        self.fused = builder.fuse and not self.linear
        st_t = op.state_type
        el = st_t.element_type
        self.shape = list(st_t.get_shape())
        Kc = builder.chunk
        # fused: the adjoint's state is lambda itself (LAM), no per-step buffer of it
        self.MU = None if self.fused else e.hoisted_alloca(MemRefType(el, [Kc + 1, *self.shape]))
        self.LAM = e.hoisted_alloca(st_t) if self.fused else None
        self.TOT: list[SSAValue] | None = None  # the fused adjoint's per-step sums (coeffs_reverse_diagonal)
        self.tot_values: list[SSAValue] = []
        self.H = info["H"] if info["H"] is not None else e.hoisted_alloca(MemRefType(el, [Kc + 1, *self.shape]))
        self.GS = e.hoisted_alloca(MemRefType(el, [Kc, *self.shape]))
        self.row, self.grow = (e.hoisted_alloca(st_t) for _ in range(2))
        # the emit region's ops not reading the state (silu of z, D*u, ...) run in a loop
        # over the chunk's steps of their own, their float results kept in EINV
        eb = op.emit.block
        self.e_inv = time_only_ops(eb, eb.args[1], op.state)
        self.e_kept = [r for o in self.e_inv for r in o.results
                       if is_float(r.type) and not isinstance(o, arith.ConstantOp)]
        self.EINV = [e.hoisted_alloca(MemRefType(v.type, [Kc])) for v in self.e_kept]
        self.e_split = self.emit_split() if builder.staged else None  # (emit_reverse_split)
        self.R: list[SSAValue] | None = None
        self.DR: list[SSAValue] = []
        self.mu = builder.shadow[op.state]  # cotangent of the final state; becomes that of the initial
        self.cells = builder.make_cells(e, free_float_values([op.coeffs, op.emit], op))
        self.zero = e.fconst(0.0, el)

    def chunk(self, c) -> None:
        e, info = self.e, self.info
        lb, ub, step = (self.vmap[v] for v in (self.op.lb, self.op.ub, self.op.step))
        s0 = e.addi(lb, e.muli(c, info["span"]))
        s1 = e.mini(e.addi(s0, info["span"]), ub)
        n = e.trip_count(s0, s1, step)
        base = hb = None
        if info["AB"] is not None:
            # chunks in the window: their rows of AB / INV, filled by the forward; chunks
            # before it: fill the first rows (free now: the later chunks are done)
            in_window = e.cmpi(c, info["split"], "sge")
            zero = e.iconst(0)
            base = e.select(in_window, e.muli(e.subi(c, info["split"]), e.iconst(self.b.chunk)), zero)
            self.b.fill_coefficients(e, self.op, self.vmap, s0, step, e.select(in_window, zero, n),
                                     info["AB"], info["kept"], info["INV"], base)
            hb = base  # the window's states are in H already: no recompute (no steps)
            s1 = e.select(in_window, s0, s1)
        self.hb = hb if hb is not None else e.iconst(0)
        self.recompute(c, s0, s1, step, base)
        self.emit_reverse(s0, step, n)
        if self.fused:
            self.adjoint_fused(s0, step, n, base)
            return
        self.adjoint(s0, step, n, base)
        e.for_(e.iconst(0), n, lambda jj: self.coeffs_reverse(s0, step, jj, base), reverse=True)

    # 1. the chunk's states from its checkpoint
    def recompute(self, c, s0, s1, step, base) -> None:
        e, ck = self.e, self.info["ck"]
        e.copy_rows(self.shape, ck, [c], self.row, [])
        e.copy_rows(self.shape, ck, [c], self.H, [self.hb])  # (the same values in the window)
        self.b.recompute_states(e, self.op, self.vmap, s0, s1, step, self.row, self.H, self.info["AB"], base,
                                self.hb, self.info["kept"], self.info["INV"])

    # 2. the consumer's cotangent of the state at each step, last step first
    def emit_reverse(self, s0, step, n) -> None:
        e, eb = self.e, self.op.emit.block

        def time_only(jj):
            inner = dict(self.vmap)
            inner[eb.args[0]] = e.addi(s0, e.muli(jj, step))
            for o in self.e_inv:
                self.b.clone(e, o, inner)
            for v, buf in zip(self.e_kept, self.EINV):
                e.store(inner[v], buf, [jj])

        if self.e_kept:
            e.for_(e.iconst(0), n, time_only)

        if self.e_split is not None:
            self.emit_reverse_split(s0, step, n)
            return

        def emit_step(jj):
            e.copy_rows(self.shape, self.H, [e.addi(self.hb, e.addi(jj, e.iconst(1)))], self.row, [])
            e.fill(self.shape, self.grow, [], self.zero)
            inner = dict(self.vmap)
            inner[eb.args[0]], inner[eb.args[1]] = e.addi(s0, e.muli(jj, step)), self.row
            for v, buf in zip(self.e_kept, self.EINV):
                inner[v] = e.load(buf, [jj])
            self.b.shadow[eb.args[1]] = self.grow
            ops = [o for o in eb.ops if not isinstance(o, scan.YieldOp)]
            self.b.rev_ops(e, ops, inner, Scope(cells=self.cells), preset=frozenset(self.e_kept))
            e.copy_rows(self.shape, self.grow, [], self.GS, [jj])

        e.for_(e.iconst(0), n, emit_step, reverse=True)

    def emit_split(self) -> tuple[list[Operation], list[Operation]] | None:
        """(readers, rest): the emit's ops that read the state, when they are side-effect
        free loops or ops with float results (sums such as sum_n C[n] * h[n]) computed
        from the state, the time-only ops and indices only; the other ops, which do not
        read the state.  None when the emit has no such split."""
        eb = self.op.emit.block
        ops = [o for o in eb.ops if not isinstance(o, scan.YieldOp)]
        state = eb.args[1]
        readers = [o for o in ops if any(v is state for w in o.walk() for v in w.operands)]
        if not readers:
            return None
        own = {r for o in ops if o not in self.e_inv for r in o.results}
        for o in readers:
            if _memory_effects(o)[1] or not o.results or not all(is_float(r.type) for r in o.results):
                return None
            if any(v in own for w in o.walk() for v in w.operands):
                return None
        return readers, [o for o in ops if o not in readers]

    def emit_reverse_split(self, s0, step, n) -> None:
        """The emit's reverse in three loops over the chunk's steps, last step first:
        (1) the readers' values (their sums over the state, one per step) into R; (2)
        the reverse of the other ops, which read no state, seeded from the stored
        values, down to the readers' cotangents (into DR): scalars per step, a loop
        that vectorises over the steps; (3) the reverse of the readers: the state's
        cotangent per step (GS) and the gradients of what they read, vectorised over
        the state.  One loop for all held each step's long scalar chain (a sum over the
        state, a division) in the loop's registers and reorder window."""
        e, eb = self.e, self.op.emit.block
        readers, rest = self.e_split
        results = [r for o in readers for r in o.results]
        if self.R is None:
            self.R = [e.hoisted_alloca(MemRefType(r.type, [self.b.chunk])) for r in results]
            self.DR = [e.hoisted_alloca(MemRefType(r.type, [self.b.chunk])) for r in results]

        def inner_at(jj, with_state: bool):
            inner = dict(self.vmap)
            inner[eb.args[0]] = e.addi(s0, e.muli(jj, step))
            if with_state:
                e.copy_rows(self.shape, self.H, [e.addi(self.hb, e.addi(jj, e.iconst(1)))], self.row, [])
                inner[eb.args[1]] = self.row
            for v, buf in zip(self.e_kept, self.EINV):
                inner[v] = e.load(buf, [jj])
            return inner

        def readers_forward(jj):
            inner = inner_at(jj, True)
            for o in self.e_inv:
                if not (o.results and all(r in self.e_kept for r in o.results)):
                    self.b.clone(e, o, inner)
            for o in readers:
                self.b.clone(e, o, inner)
            for r, buf in zip(results, self.R):
                e.store(inner[r], buf, [jj])

        def rest_reverse(jj):
            inner = inner_at(jj, False)
            for r, buf in zip(results, self.R):
                inner[r] = e.load(buf, [jj])
            scope = Scope(cells=self.cells)
            self.b.rev_ops(e, rest, inner, scope, preset=frozenset([*self.e_kept, *results]))
            for r, buf in zip(results, self.DR):
                d = scope.adj.get(r)
                e.store(d if d is not None else e.fconst(0.0, r.type), buf, [jj])

        def readers_reverse(jj):
            inner = inner_at(jj, True)
            for o in self.e_inv:
                if not (o.results and all(r in self.e_kept for r in o.results)):
                    self.b.clone(e, o, inner)
            e.fill(self.shape, self.grow, [], self.zero)
            self.b.shadow[eb.args[1]] = self.grow
            seeds = [(r, e.load(buf, [jj])) for r, buf in zip(results, self.DR)]
            self.b.rev_ops(e, readers, inner, Scope(cells=self.cells), seeds, forward=False)
            e.copy_rows(self.shape, self.grow, [], self.GS, [jj])

        e.for_(e.iconst(0), n, readers_forward, reverse=True)
        e.for_(e.iconst(0), n, rest_reverse, reverse=True)
        e.for_(e.iconst(0), n, readers_reverse, reverse=True)

    # 3. the adjoint recurrence, backwards over the chunk
    def adjoint(self, s0, step, n, base) -> None:
        self.e.copy_rows(self.shape, self.mu, [], self.MU, [n])
        self.b.adjoint_scan(self.e, self.op, self.vmap, s0, step, n, self.mu, self.GS, self.MU,
                            self.info["AB"], base)

    # 3+4, fused (scan.recurrence): one reverse scan over the chunk whose state is
    #     lambda_i = a_{i+1} * lambda_{i+1} + g_i
    # and whose emit runs the producer's reverse of step i with lambda_i in registers
    def adjoint_fused(self, s0, step, n, base) -> None:
        e, op, AB = self.e, self.op, self.info["AB"]
        one = e.fconst(1.0, op.state_type.element_type)
        e.copy_rows(self.shape, self.mu, [], self.LAM, [])  # mu = a_{i+1} lambda_{i+1} of the next chunk
        blk = Block(arg_types=[IndexType()] * (1 + len(self.shape)))
        outer, e.block = e.block, blk
        jj = e.subi(e.subi(n, e.iconst(1)), blk.args[0])
        nxt = e.addi(jj, e.iconst(1))
        # a_{i+1} (inside the chunk; 1 at its last step: mu carries the next chunk's)
        a = e.load(AB[0], [e.addi(base, e.mini(nxt, e.subi(n, e.iconst(1)))), *blk.args[1:]])
        a = e.select(e.cmpi(nxt, n, "eq"), one, a)
        e.put(scan.YieldOp(a, e.load(self.GS, [jj, *blk.args[1:]])))
        eblk = Block(arg_types=[IndexType(), op.state_type])
        e.block = eblk
        jj2 = e.subi(e.subi(n, e.iconst(1)), eblk.args[0])
        self.coeffs_reverse_diagonal(s0, step, jj2, base, lam=eblk.args[1])
        e.put(scan.YieldOp())
        e.block = outer
        e.put(scan.RecurrenceOp(e.iconst(0), n, e.iconst(1), self.LAM, Region(blk), Region(eblk)))
        # the steps' time-only reverse (softplus and the like), left out of the scan's
        # emit: a loop over the chunk's steps of its own, which vectorises over them
        if self.TOT:
            e.for_(e.iconst(0), n, lambda jj: self.time_only_reverse(s0, step, jj, base), reverse=True)
        # to the chunk before: mu = a_{s0} * lambda_{s0}
        e.for_static(self.shape, lambda k: e.store(
            e.mul(e.load(AB[0], [base, *k]), e.load(self.LAM, k)), self.mu, k))

    # 4. the producer's reverse: (da, db) of step jj into the input gradients
    def lam_h(self, jj, k, lam=None):
        """(lambda, h_{i-1}) of step jj, state element k (lambda from the state `lam`
        of the fused adjoint, or from MU and GS)."""
        e = self.e
        if lam is not None:
            lv = e.load(lam, k)
        else:
            lv = e.add(e.load(self.MU, [e.addi(jj, e.iconst(1)), *k]), e.load(self.GS, [jj, *k]))
        return lv, e.load(self.H, [e.addi(self.hb, jj), *k])

    def coeffs_reverse(self, s0, step, jj, base) -> None:
        if self.linear:
            self.coeffs_reverse_linear(s0, step, jj)
        else:
            self.coeffs_reverse_diagonal(s0, step, jj, base)

    def coeffs_reverse_linear(self, s0, step, jj) -> None:
        e, cb = self.e, self.op.coeffs.block
        yielded = list(cb.last_op.operands)
        size = self.shape[0]
        inner = dict(self.vmap)
        inner[cb.args[0]] = e.addi(s0, e.muli(jj, step))
        lh = [self.lam_h(jj, [e.iconst(j)]) for j in range(size)]
        seeds = []
        for j in range(size):
            for col in range(size):
                seeds.append((yielded[j * size + col], e.mul(lh[j][0], lh[col][1])))
            seeds.append((yielded[size * size + j], lh[j][0]))
        self.b.rev_block(e, cb, inner, Scope(cells=self.cells), seeds)

    def _step_values(self, s0, step, jj, base):
        """Step jj's row g in AB / INV, the coeffs ops split by the state index (inv, dep),
        and the value map with the kept values loaded and the other inv ops cloned."""
        e, b, cb = self.e, self.b, self.op.coeffs.block
        INV, kept = self.info["INV"], self.info["kept"]
        g = e.addi(base, jj)
        inv, dep = split_by_state_index(cb)
        inner = dict(self.vmap)
        inner[cb.args[0]] = e.addi(s0, e.muli(jj, step))
        for m, v in enumerate(kept):
            inner[v] = e.load(INV, [e.iconst(m), g])
        for o in inv:
            if not (o.results and all(r in kept for r in o.results)):
                b.clone(e, o, inner)
        return g, inv, dep, inner

    def coeffs_reverse_diagonal(self, s0, step, jj, base, lam=None) -> None:
        """The ops of coeffs that do not depend on the state index run once per step,
        outside the loop over the state; their cotangents sum over it."""
        e, b, cb = self.e, self.b, self.op.coeffs.block
        AB = self.info["AB"]
        yielded = list(cb.last_op.operands)
        g, inv, dep, inner = self._step_values(s0, step, jj, base)
        step_scope = Scope(cells=self.cells)
        used = {v for o in dep for w in o.walk() for v in w.operands} | set(yielded)
        inv_values = [r for o in inv for r in o.results if r in used and is_float(r.type)
                      and not isinstance(o, arith.ConstantOp)]
        zeros = [e.fconst(0.0, v.type) for v in inv_values]
        parts = [e.hoisted_alloca(MemRefType(v.type, self.shape)) for v in inv_values]

        def per_element(k):
            lv, hp = self.lam_h(jj, k, lam)
            inner_k = dict(inner)
            for a, kk in zip(cb.args[1:], k):
                inner_k[a] = kk
            # a and b themselves come from the buffers, not recomputed (the reverse of
            # their ops needs only their operands and result)
            preset = set()
            for v, buf in zip(yielded, AB):
                owner = getattr(v, "owner", None)
                if buf is not None and owner in dep and not owner.regions and len(owner.results) == 1:
                    inner_k[v] = e.load(buf, [g, *k])
                    preset.add(v)
            seeds = [(yielded[0], e.mul(lv, hp)), (yielded[1], lv)]
            scope = Scope(cells=self.cells, sums=dict(zip(inv_values, zeros)))
            b.rev_ops(e, dep, inner_k, scope, seeds, preset=frozenset(preset))
            for v, part in zip(inv_values, parts):
                e.store(scope.sums[v], part, k)

        # the cotangents of the step's values, one per state element, summed in a loop
        # of their own: a pure reduction stays a loop (not raised into a scan), and
        # both loops vectorise over the state
        e.for_static(self.shape, per_element)
        totals = e.for_static_sums(self.shape, zeros, lambda k, sums: [
            e.add_reassoc(acc, e.load(part, k)) for acc, part in zip(sums, parts)])
        if lam is not None and b.staged:
            # the fused adjoint's emit: the sums go to TOT[m][jj], and the reverse of
            # the time-only ops runs after the scan (time_only_reverse).  In the emit,
            # each step's long scalar chain (sums, softplus' reverse, a division) held
            # the scan's registers and reorder window.  Only accumulations into the
            # gradients move, which commute.
            if self.TOT is None:
                self.TOT = [e.hoisted_alloca(MemRefType(v.type, [b.chunk])) for v in inv_values]
                self.tot_values = inv_values
            for total, buf in zip(totals, self.TOT):
                e.store(total, buf, [jj])
            return
        for v, total in zip(inv_values, totals):
            b.add_adj(e, step_scope, v, total)
        b.rev_ops(e, inv, inner, step_scope, forward=False)

    def time_only_reverse(self, s0, step, jj, base) -> None:
        """Step jj's reverse of the coeffs ops not depending on the state index, seeded
        with the sums the fused adjoint's emit kept in TOT (see coeffs_reverse_diagonal)."""
        e, b = self.e, self.b
        _, inv, _, inner = self._step_values(s0, step, jj, base)
        step_scope = Scope(cells=self.cells)
        for v, buf in zip(self.tot_values, self.TOT):
            b.add_adj(e, step_scope, v, e.load(buf, [jj]))
        b.rev_ops(e, inv, inner, step_scope, forward=False)


def _reassociate_sums(block: Block) -> None:
    """Mark the additive reductions of loops (`acc = acc + x` in iter_args, such as the
    recomputed sum_n C[n] * h[n]) reassociable, so LLVM vectorises the loops around them;
    the forward's own vectorised consumer sums in tree order too."""
    for op in block.walk():
        if not isinstance(op, scf.ForOp) or not op.iter_args:
            continue
        body = op.body.block
        for arg, y in zip(body.args[1:], body.last_op.operands):
            owner = getattr(y, "owner", None)
            if isinstance(owner, arith.AddfOp) and arg in owner.operands:
                owner.fastmath = arith.FastMathFlagsAttr([FastMathFlag.REASSOC, FastMathFlag.NO_SIGNED_ZEROS])


def _memory_effects(op: Operation) -> tuple[list[SSAValue], list[SSAValue]]:
    """(memrefs read, memrefs written) by op and the ops nested in it."""
    reads: list[SSAValue] = []
    writes: list[SSAValue] = []
    for o in op.walk():
        r, w = _own_memory_effects(o)
        reads += r
        writes += w
    return reads, writes


def _own_memory_effects(o: Operation) -> tuple[list[SSAValue], list[SSAValue]]:
    """(memrefs read, memrefs written) by o itself, not the ops nested in it."""
    reads: list[SSAValue] = []
    writes: list[SSAValue] = []
    if isinstance(o, memref.LoadOp):
        reads.append(o.memref)
    elif isinstance(o, memref.StoreOp):
        writes.append(o.memref)
    elif isinstance(o, scan.AffineOp):
        reads += [o.a, o.b] + ([o.init] if o.init is not None else [])
        writes += [o.h] + ([o.final] if o.final is not None else [])
    elif isinstance(o, (scan.RecurrenceOp, scan.LinearRecurrenceOp)):
        reads.append(o.state)
        writes.append(o.state)
    elif isinstance(o, memref.CopyOp):
        reads.append(o.source)
        writes.append(o.destination)
    return reads, writes


def split_by_state_index(cb: Block) -> tuple[list[Operation], list[Operation]]:
    """The ops of a coeffs block (yield excluded) that do not depend on the state index
    arguments, and those that do, each in block order."""
    dep_values: set[SSAValue] = set(cb.args[1:])
    inv: list[Operation] = []
    dep: list[Operation] = []
    for op in cb.ops:
        if isinstance(op, scan.YieldOp):
            break
        if any(v in dep_values for w in op.walk() for v in w.operands):
            dep.append(op)
            dep_values |= set(op.results)
        else:
            inv.append(op)
    return inv, dep


def time_only_ops(block: Block, state: SSAValue, outer_state: SSAValue) -> list[Operation]:
    """The ops of an emit block (in order) that compute from the time index and the
    inputs only: arith/math ops and loads of memrefs the block does not write (nor the
    recurrence's state, `outer_state`), none depending on `state` (or on an op that is
    not one of them)."""
    written = {o.memref for o in block.walk() if isinstance(o, memref.StoreOp)} | {outer_state}
    dep: set[SSAValue] = {state}
    out: list[Operation] = []
    for op in block.ops:
        if isinstance(op, scan.YieldOp):
            break
        free = not op.regions and not any(v in dep for v in op.operands)
        pure = (isinstance(op, memref.LoadOp) and op.memref not in written) or (
            op.dialect_name() in ("arith", "math") and not isinstance(op, memref.StoreOp))
        if free and pure:
            out.append(op)
        else:
            dep |= set(op.results)
    return out


def _access_indices(loop: Operation, m: SSAValue) -> list[tuple[SSAValue, ...]]:
    """Index lists of every access of m inside loop (a recurrence's state: no indices)."""
    out = []
    for o in loop.walk():
        if isinstance(o, (memref.LoadOp, memref.StoreOp)) and o.memref is m:
            out.append(tuple(o.indices))
        elif isinstance(o, SCAN_OPS) and m in o.operands:
            out.append(())
    return out


def _initialized_first(block: Block, m: SSAValue) -> bool:
    """The first op of block touching m writes all of it: a store to a rank-0 m, a loop
    `for n in 0..size: store _, m[n]`, or a loop whose iterations each do so."""
    for op in block.ops:
        reads, writes = _memory_effects(op)
        if m not in reads and m not in writes:
            continue
        t = m.type
        if isinstance(op, memref.StoreOp):
            return op.memref is m and t.get_num_dims() == 0
        if not isinstance(op, scf.ForOp):
            return False
        body = op.body.block
        first = next((o for o in body.ops if m in _memory_effects(o)[0] + _memory_effects(o)[1]), None)
        full = (
            isinstance(first, memref.StoreOp)
            and t.get_num_dims() == 1
            and tuple(first.indices) == (body.args[0],)
            and _constant(op.lb) == 0
            and _constant(op.step) == 1
            and _constant(op.ub) == t.get_shape()[0]
        )
        return full or _initialized_first(body, m)
    return False


def _constant(v: SSAValue) -> int | None:
    owner = getattr(v, "owner", None)
    if isinstance(owner, arith.ConstantOp) and isinstance(owner.value, IntegerAttr):
        return owner.value.value.data
    return None


def build_vjp(fn: func.FuncOp, chunk: int = 64, window: int = 8192, fuse: bool = True,
              staged: bool = True) -> func.FuncOp:
    """`@<name>_vjp` of one function (see the module docstring); GradRefused if not."""
    return VjpBuilder(fn, chunk, window, fuse, staged).build()


@dataclass(frozen=True)
class ScanweaverGrad(ModulePass):
    """Add `@<name>_vjp` next to each public function with a float memref argument
    (or, with `functions=a,b`, next to those named); refuse with a reason what cannot
    be differentiated.  `chunk`: steps between state checkpoints; `window`: steps (at
    most, rounded down to whole chunks) whose recurrence coefficients are kept from the
    checkpoint run for the reverse (buffers of window x state per call); `fuse`: the
    producer's reverse of a `scan.recurrence` runs in the emit of its adjoint scan
    (lambda in registers), else in a loop of its own after it; `staged`: a
    `scan.recurrence`'s per-step scalar work runs in loops over the chunk's steps of
    its own (the fused adjoint's time-only reverse, and the emit's reverse split around
    its sums over the state), and b is computed again from the kept values where that
    is a few loads and products instead of buffered.  Only accumulations into
    gradients move: the results differ from `staged=0` in the order of sums over time
    (reassociable ones) at most."""

    name = "scanweaver-grad"

    chunk: int = 64
    functions: str = ""
    window: int = 8192
    fuse: bool = True
    staged: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.chunk < 1:
            raise ScanWeaverError(f"scanweaver-grad: chunk must be >= 1, got {self.chunk}")
        if self.window < 1:
            raise ScanWeaverError(f"scanweaver-grad: window must be >= 1, got {self.window}")
        funcs = {f.sym_name.data: f for f in op.ops if isinstance(f, func.FuncOp)}
        wanted = [n.strip() for n in self.functions.split(",") if n.strip()]
        for n in wanted:
            if n not in funcs or funcs[n].is_declaration:
                raise ScanWeaverError(f"scanweaver-grad: no function named '@{n}' to differentiate")
        for fn in list(funcs.values()):
            if wanted:
                if fn.sym_name.data not in wanted:
                    continue
            elif (fn.is_declaration or fn.sym_name.data.endswith("_vjp")
                  or (fn.sym_visibility is not None and fn.sym_visibility.data != "public")
                  or not any(is_float_memref(t) for t in fn.function_type.inputs.data)):
                continue
            name = fn.sym_name.data + "_vjp"
            if name in funcs:
                continue
            vjp = build_vjp(fn, self.chunk, self.window, self.fuse, self.staged)
            op.body.block.insert_op_after(vjp, fn)
