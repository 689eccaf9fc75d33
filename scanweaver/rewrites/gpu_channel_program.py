"""Channel programs on the GPU: one thread per channel runs a whole sequential body.

`scan-to-gpu` turns a scan op that sits directly in a channel-loop nest into a
parallel-in-time kernel (`recurrence_gpu.py`).  Some functions hold more per channel:
the VJPs of `scanweaver-grad` run, per (batch, channel), a checkpoint pass and then a
reverse chunk loop with several scan ops and scratch buffers; `gpu_nest` refuses those
("'memref.alloca' between channel loops").  This lowering takes such a nest whole:

* the channel loops (perfectly nested `scf.for`s without iter_args around the body)
  become the thread index space: thread `cid = block_id.x * block + thread_id.x`,
  delinearised over the trip counts (innermost fastest), grid `ceil(channels / block)`;
* the body's scan ops become sequential loops (`scan-to-loops`' patterns), so every
  thread runs the body as the CPU would, one channel at a time: parallel over channels,
  sequential in time;
* every `memref.alloca` / `memref.alloc` of the function becomes a slice of one global
  scratch buffer per element type, which the runtime allocates per call (launch
  description `scratch`, sized by an `expr:` formula over the argument sizes).  The
  slices are interleaved by warp (`_to_scratch`), so a warp running in step touches
  consecutive addresses; nothing lands in local memory;
* a store that is not private to its channel must be a read-add-write (`x[i] += v`,
  the gradient accumulation of a VJP into an input shared by channels, such as dA over
  the batch or dB over D): it becomes `memref.atomic_rmw addf`.  Anything else shared
  between channels is refused, with the reason.

Summation order of those atomics varies between runs, so such gradients are not bit
for bit reproducible (within float rounding of the sequential sum).
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects import arith, func, gpu, memref, scf
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    FunctionType,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    SymbolRefAttr,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.pattern_rewriter import GreedyRewritePatternApplier, PatternRewriteWalker
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.traits import is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites.gpu_kernel import (
    Unsupported,
    check_closed,
    kernel_name,
    shape_entries,
    unproven_accesses,
    unproven_refusal,
)
from scanweaver.rewrites.launch import KernelLaunch

#: threads per block of a channel-program kernel
BLOCK = 128

_SCAN_OPS = (scan.RecurrenceOp, scan.LinearRecurrenceOp, scan.ScanOp, scan.AffineOp)
#: arith ops the size formulas (`expr:`) and the host code may use
_FORMULA = {
    arith.AddiOp: "add", arith.SubiOp: "sub", arith.MuliOp: "mul", arith.DivUIOp: "divu",
    arith.CeilDivUIOp: "ceildivu", arith.MinSIOp: "mins", arith.MaxSIOp: "maxs", arith.MaxUIOp: "maxu",
    arith.MinUIOp: "minu", arith.DivSIOp: "divs",
}
_ATOMIC_ADDF = 0  # arith::AtomicRMWKind::addf


# ------------------------------------------------------------------------- matching


def _pure(op: Operation) -> bool:
    return not op.regions and is_side_effect_free(op)


def channel_nest(fn: func.FuncOp) -> list[scf.ForOp] | None:
    """The channel loops of `fn`: one top-level `scf.for` holding scan ops, descended
    while a loop's body is pure ops and exactly one loop (without iter_args)."""
    if fn.is_declaration:
        return None
    loops = [o for o in fn.body.block.ops if isinstance(o, scf.ForOp) and any(isinstance(x, _SCAN_OPS) for x in o.walk())]
    if len(loops) != 1 or loops[0].iter_args:
        return None
    nest = [loops[0]]
    while True:
        body = [o for o in nest[-1].body.block.ops if not isinstance(o, scf.YieldOp)]
        inner = [o for o in body if isinstance(o, scf.ForOp)]
        if len(inner) != 1 or inner[0].iter_args or not all(o is inner[0] or _pure(o) for o in body):
            return nest
        nest.append(inner[0])


def refused_by_nest_kernels(nest: Sequence[scf.ForOp]) -> str | None:
    """Why the fused recurrence kernels cannot take the nest's recurrences, when it is
    the body's structure (buffers or loops between the channel loops and the scan: a
    sequential program per channel); None otherwise.  Other refusals (a dependence
    between steps, a state type) stay refusals: they are not what this lowering is for."""
    from scanweaver.rewrites.gpu_nest import match_recurrence

    recs = [o for o in nest[0].walk() if isinstance(o, (scan.RecurrenceOp, scan.LinearRecurrenceOp))]
    for r in recs:
        try:
            match_recurrence(r)
        except Unsupported as e:
            if "between channel loops" in str(e):
                return str(e)
    return None


# --------------------------------------------------------------------- the lowering


class _Kernel:
    """Builds the kernel of one channel program."""

    def __init__(self, fn: func.FuncOp, nest: list[scf.ForOp], name: str, block: int, stage: bool = False):
        """`stage`: the nest is one stage of several in `fn` (a loop nest between scan
        ops): it takes the function's top-level buffers as arguments and clones only
        the pure values it uses, instead of running the whole function per channel."""
        self.fn, self.nest, self.block, self.stage = fn, nest, block, stage
        top = list(fn.body.block.ops)
        i = top.index(nest[0])
        self.prologue, self.epilogue = ([], []) if stage else (top[:i], top[i + 1:])
        for o in self.prologue:  # run again by every thread: only its own buffers
            if not (isinstance(o, memref.AllocaOp) or _pure(o) or (isinstance(o, scf.ForOp) and all(
                    isinstance(x.memref.owner, memref.AllocaOp) for x in o.walk() if isinstance(x, memref.StoreOp))
                    and not any(isinstance(x, _SCAN_OPS) for x in o.walk()))):
                raise Unsupported(f"'{o.name}' before the channel loops")
        for o in self.epilogue:
            if not isinstance(o, (memref.DeallocOp, func.ReturnOp)) or (isinstance(o, func.ReturnOp) and o.operands):
                raise Unsupported(f"'{o.name}' after the channel loops")
        used = {v for o in [*self.prologue, nest[0]] for x in o.walk() for v in x.operands}
        todo = list(used)
        while todo:  # and what the pure values it uses are computed from (sizes)
            v = todo.pop()
            if isinstance(v.owner, Operation) and _pure(v.owner):
                new = [o for o in v.owner.operands if o not in used]
                used.update(new)
                todo += new
        self.args = [a for a in fn.body.block.args if a in used]
        if stage:
            self.args += [o.memref for o in top[:i] if isinstance(o, memref.AllocOp) and o.memref in used]
        self.el_types: list[Attribute] = []
        for o in [*self.prologue, nest[0]]:
            for x in o.walk():
                if isinstance(x, (memref.AllocaOp, memref.AllocOp)):
                    t = x.memref.type.element_type
                    if t not in self.el_types:
                        self.el_types.append(t)
        types = [a.type for a in self.args] + [MemRefType(t, [DYNAMIC_INDEX]) for t in self.el_types]
        self.kfunc = gpu.FuncOp(name, FunctionType.from_lists(types, []), kernel=True)
        self.kfunc.attributes["gpu.kernel"] = UnitAttr()
        kargs = self.kfunc.body.block.args
        self.vmap: dict[SSAValue, SSAValue] = dict(zip(self.args, kargs))
        self.scratch = dict(zip(self.el_types, kargs[len(self.args):]))
        for j, (fa, ka) in enumerate(zip(self.args, kargs)):
            ka.name_hint = _value_name(fa, j)

    # -- building helpers
    def _ins(self, b: Block, op: Operation) -> SSAValue:
        b.add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def _idx(self, b: Block, v: int) -> SSAValue:
        return self._ins(b, arith.ConstantOp(IntegerAttr(v, IndexType())))

    def build(self) -> gpu.FuncOp:
        entry = self.kfunc.body.block
        # pure prologue values (constants, dims) first: the trip counts need them
        for o in self.prologue:
            if _pure(o):
                entry.add_op(o.clone(value_mapper=self.vmap))
        if self.stage:  # the pure values the stage uses (constants, sizes)
            from scanweaver.rewrites.gpu_kernel import free_values

            for v in free_values([self.nest[0]]):
                self._bound(entry, v)
        trips = []
        for loop in self.nest:
            for v in (loop.lb, loop.ub, loop.step):
                self._bound(entry, v)
            span = self._ins(entry, arith.SubiOp(self.vmap[loop.ub], self.vmap[loop.lb]))
            span = self._ins(entry, arith.MaxSIOp(span, self._idx(entry, 0)))
            trips.append(self._ins(entry, arith.CeilDivUIOp(span, self.vmap[loop.step])))
        self.trips = trips
        nchan = trips[0]
        for t in trips[1:]:
            nchan = self._ins(entry, arith.MuliOp(nchan, t))
        self.nchan = nchan
        bid = self._ins(entry, gpu.BlockIdOp(gpu.DimensionAttr(gpu.DimensionEnum.X)))
        tid = self._ins(entry, gpu.ThreadIdOp(gpu.DimensionAttr(gpu.DimensionEnum.X)))
        cid = self._ins(entry, arith.AddiOp(self._ins(entry, arith.MuliOp(bid, self._idx(entry, self.block))), tid))
        self.cid = cid
        ok = self._ins(entry, arith.CmpiOp(cid, nchan, "ult"))
        body = Block()
        self.guard = scf.IfOp(ok, [], Region(body))
        entry.add_op(self.guard)
        entry.add_op(gpu.ReturnOp([]))
        for o in self.prologue:
            if not _pure(o):
                body.add_op(o.clone(value_mapper=self.vmap))
        # channel indices: cid delinearised, innermost loop fastest
        rest, ks = cid, [None] * len(trips)
        for j in reversed(range(len(trips))):
            ks[j] = self._ins(body, arith.RemUIOp(rest, trips[j])) if j else rest
            if j:
                rest = self._ins(body, arith.DivUIOp(rest, trips[j]))
        self.ivs = []
        for loop, k in zip(self.nest, ks):
            iv = self._ins(body, arith.AddiOp(self.vmap[loop.lb], self._ins(body, arith.MuliOp(k, self.vmap[loop.step]))))
            self.vmap[loop.body.block.args[0]] = iv
            self.ivs.append(iv)
        self._clone_level(body, 0)
        body.add_op(scf.YieldOp())
        return self.kfunc

    def _bound(self, entry: Block, v: SSAValue) -> SSAValue:
        """A channel loop bound at the kernel entry: the same for every channel."""
        if v in self.vmap:
            return self.vmap[v]
        op = v.owner
        if not isinstance(op, Operation) or not _pure(op):
            raise Unsupported(f"a channel loop's bounds depend on an outer channel loop ({v})")
        for o in op.operands:
            self._bound(entry, o)
        entry.add_op(op.clone(value_mapper=self.vmap))
        return self.vmap[v]

    def _clone_level(self, body: Block, j: int) -> None:
        for o in self.nest[j].body.block.ops:
            if isinstance(o, scf.YieldOp):
                continue
            if j + 1 < len(self.nest) and o is self.nest[j + 1]:
                self._clone_level(body, j + 1)
            else:
                body.add_op(o.clone(value_mapper=self.vmap))


def _value_name(v: SSAValue, j: int) -> str:
    if v.name_hint:
        return v.name_hint
    return f"arg{v.index}" if isinstance(v.owner, Block) else f"buffer{j}"


def _lower_scans_to_loops(kfunc: gpu.FuncOp) -> None:
    from scanweaver.rewrites.scan_to_loops import LowerAffine, LowerLinearRecurrence, LowerRecurrence, LowerScan

    PatternRewriteWalker(
        GreedyRewritePatternApplier([LowerAffine(), LowerScan(), LowerRecurrence(), LowerLinearRecurrence()]),
        apply_recursively=False,
    ).rewrite_module(kfunc)  # type: ignore[arg-type]  (walks any op)


class _Hoist:
    """Clone the pure, channel-independent computation of a value to the kernel's entry
    (before the channel guard): scratch sizes are the same for every channel."""

    def __init__(self, k: _Kernel):
        self.k = k
        self.done: dict[SSAValue, SSAValue] = {}
        self.entry = k.kfunc.body.block

    def __call__(self, v: SSAValue) -> SSAValue:
        op = v.owner
        if v is self.k.cid or isinstance(op, (gpu.ThreadIdOp, gpu.BlockIdOp)):
            raise Unsupported("a scratch buffer's size depends on the channel")
        if v.owner is self.entry or (isinstance(v.owner, Operation) and v.owner.parent_block() is self.entry):
            return v
        if v in self.done:
            return self.done[v]
        op = v.owner
        if not isinstance(op, Operation) or not _pure(op):
            raise Unsupported("a scratch buffer's size depends on the channel or on memory")
        m = {o: self(o) for o in op.operands}
        c = op.clone(value_mapper=m)
        self.entry.insert_op_before(c, self.k.guard)
        for r, cr in zip(op.results, c.results):
            self.done[r] = cr
        return self.done[v]


#: channels interleaved per scratch group: one warp's threads touch consecutive words
LANES = 32


def _to_scratch(k: _Kernel) -> dict[Attribute, SSAValue]:
    """Every alloca/alloc of the kernel becomes a slice of the scratch buffer of its
    element type, interleaved by warp: element `e` of the per-channel layout of channel
    `cid` is at `((cid / 32) * per_channel + e) * 32 + cid % 32`, so a warp in step
    touches 32 consecutive words, and a buffer's offset is a constant where the sizes
    before it are.  Returns the per-channel element count per type (the runtime
    allocates `ceil(channels / 32) * 32` times that)."""
    hoist = _Hoist(k)
    entry = k.kfunc.body.block

    def before_guard(op: Operation) -> SSAValue:
        entry.insert_op_before(op, k.guard)
        return op.results[0]

    def cidx(v: int) -> SSAValue:
        return before_guard(arith.ConstantOp(IntegerAttr(v, IndexType())))

    totals: dict[Attribute, SSAValue] = {t: cidx(0) for t in k.el_types}
    allocs = [o for o in k.kfunc.walk() if isinstance(o, (memref.AllocaOp, memref.AllocOp))]
    # static sizes first: their offsets fold to constants (fewer live registers)
    allocs.sort(key=lambda o: len(o.dynamic_sizes) > 0)
    placed = []
    for a in allocs:
        t: MemRefType = a.memref.type  # type: ignore[assignment]
        if t.layout != MemRefType(t.element_type, t.get_shape()).layout:
            raise Unsupported("a scratch buffer with a non-identity layout")
        dyn = iter(a.dynamic_sizes)
        sizes = [hoist(next(dyn)) if d == DYNAMIC_INDEX else cidx(d) for d in t.get_shape()]
        count = cidx(1)
        for s in sizes:
            count = before_guard(arith.MuliOp(count, s))
        el = t.element_type
        placed.append((a, sizes, totals[el]))
        totals[el] = before_guard(arith.AddiOp(totals[el], count))
    lanes = cidx(LANES)
    k.padded_channels = before_guard(arith.MuliOp(before_guard(arith.CeilDivUIOp(k.nchan, lanes)), lanes))
    group = before_guard(arith.DivUIOp(k.cid, lanes))
    lane = before_guard(arith.RemUIOp(k.cid, lanes))
    base = {el: before_guard(arith.AddiOp(before_guard(arith.MuliOp(
        before_guard(arith.MuliOp(group, totals[el])), lanes)), lane)) for el in k.el_types}
    for a, sizes, offset in placed:
        el = a.memref.type.element_type
        buf = k.scratch[el]
        for use in list(a.memref.uses):
            user = use.operation
            if isinstance(user, (memref.DeallocOp,)):
                Rewriter.erase_op(user)
                continue
            if isinstance(user, memref.DimOp):
                user.result.replace_all_uses_with(sizes[user.index.owner.value.value.data])  # type: ignore[union-attr]
                Rewriter.erase_op(user)
                continue
            if not isinstance(user, (memref.LoadOp, memref.StoreOp)) or user.memref is not a.memref:
                raise Unsupported(f"scratch buffer used by '{user.name}'")
            at = InsertPoint.before(user)
            lin = offset
            stride = None
            ops: list[Operation] = []
            for i in reversed(range(len(sizes))):
                idx = user.indices[i]
                term = idx if stride is None else _op(ops, arith.MuliOp(idx, stride))
                lin = _op(ops, arith.AddiOp(lin, term))
                stride = sizes[i] if stride is None else _op(ops, arith.MuliOp(stride, sizes[i]))
            g = _op(ops, arith.AddiOp(_op(ops, arith.MuliOp(lin, lanes)), base[el]))
            if isinstance(user, memref.LoadOp):
                new = memref.LoadOp.get(buf, [g])
            else:
                new = memref.StoreOp.get(user.value, buf, [g])
            Rewriter.insert_op(ops, at)
            Rewriter.replace_op(user, new, new.results if isinstance(user, memref.LoadOp) else [])
        Rewriter.erase_op(a)
    return totals


def _op(ops: list[Operation], op: Operation) -> SSAValue:
    ops.append(op)
    return op.results[0]


def _injective(k: _Kernel) -> list[set[SSAValue]]:
    """Per channel loop, values that are one-to-one in its induction variable alone
    (iv, iv +- invariant, invariant - iv, iv * nonzero constant)."""
    # values that may differ between channels: from the channel id, memory, or loops
    varying: set[SSAValue] = {k.cid}
    for o in k.guard.walk():
        if o is k.guard:
            continue
        for r in o.regions:
            for b in r.blocks:
                varying.update(b.args)
        if not _pure(o) or any(v in varying for v in o.operands):
            varying.update(o.results)

    def invariant(v: SSAValue) -> bool:
        return v not in varying

    sets = []
    for iv in k.ivs:
        s = {iv}
        for o in k.guard.walk():
            if isinstance(o, (arith.AddiOp, arith.SubiOp)):
                x, y = o.lhs, o.rhs
                if (x in s and invariant(y)) or (y in s and invariant(x)):
                    s.add(o.result)
            elif isinstance(o, arith.MuliOp):
                for x, y in ((o.lhs, o.rhs), (o.rhs, o.lhs)):
                    if x in s and isinstance(y.owner, arith.ConstantOp) and y.owner.value.value.data != 0:  # type: ignore[union-attr]
                        s.add(o.result)
        sets.append(s)
    return sets


def _shared_stores_to_atomics(k: _Kernel) -> None:
    """Stores into arguments at indices not private to the channel: `x[i] += v`
    becomes `memref.atomic_rmw addf`; anything else shared is refused."""
    inj = _injective(k)
    kargs = set(k.kfunc.body.block.args[: len(k.args)])

    def private(indices) -> bool:
        return all(any(i in s for i in indices) for s in inj)

    written: set[SSAValue] = set()
    for st in [o for o in k.kfunc.walk() if isinstance(o, memref.StoreOp)]:
        if st.memref not in kargs:
            continue
        written.add(st.memref)
        if private(st.indices):
            continue
        add = st.value.owner
        load = None
        if isinstance(add, arith.AddfOp):
            for x, y in ((add.lhs, add.rhs), (add.rhs, add.lhs)):
                ld = x.owner
                if (isinstance(ld, memref.LoadOp) and ld.memref is st.memref and list(ld.indices) == list(st.indices)
                        and len(list(ld.res.uses)) == 1 and len(list(add.result.uses)) == 1):
                    load, other = ld, y
                    break
        name = st.memref.name_hint or "an argument"
        if load is None:
            raise Unsupported(f"a store into '{name}' is shared between channels and is not an accumulation")
        rmw = memref.AtomicRMWOp.build(
            operands=[other, st.memref, list(st.indices)], result_types=[other.type],
            properties={"kind": IntegerAttr(_ATOMIC_ADDF, i64)},
        )
        Rewriter.insert_op(rmw, InsertPoint.before(st))
        Rewriter.erase_op(st)
        Rewriter.erase_op(add)
        Rewriter.erase_op(load)
    for ld in [o for o in k.kfunc.walk() if isinstance(o, memref.LoadOp)]:
        if ld.memref in written and not private(ld.indices):
            raise Unsupported(f"'{ld.memref.name_hint}' is read where other channels write it")


def _formula(v: SSAValue, names: dict[SSAValue, str]) -> str:
    """A host index value as an `expr:` term over the sizes of a launch's arguments
    (`names`: argument value -> its name in the launch; cuda_launch.py evaluates it).
    A size is `x.shape[i]` for `memref.dim x, i`, or for the value a buffer `x` of the
    launch was allocated with in dimension i."""
    op = v.owner
    if isinstance(op, arith.ConstantOp):
        return str(op.value.value.data)  # type: ignore[union-attr]
    if isinstance(op, memref.DimOp) and op.source in names and isinstance(op.index.owner, arith.ConstantOp):
        return f"{names[op.source]}.shape[{op.index.owner.value.value.data}]"  # type: ignore[union-attr]
    for x, name in names.items():
        if isinstance(x.owner, memref.AllocOp) and v in x.owner.dynamic_sizes:
            dims = [i for i, d in enumerate(x.type.get_shape()) if d == DYNAMIC_INDEX]  # type: ignore[attr-defined]
            return f"{name}.shape[{dims[list(x.owner.dynamic_sizes).index(v)]}]"
    if type(op) in _FORMULA:
        return f"{_FORMULA[type(op)]}({_formula(op.operands[0], names)},{_formula(op.operands[1], names)})"
    raise Unsupported("a launch size is not a formula of the launch's argument sizes")


def _host(k: _Kernel, totals: dict[Attribute, SSAValue]) -> None:
    """Replace the nest by the scratch allocations and the launch."""
    fn, entry = k.fn, k.kfunc.body.block
    # host values: clone the kernel entry's pure computation (sizes only), mapping
    # kernel arguments back to the function's
    back = {ka: fa for fa, ka in zip(k.args, entry.args)}
    host_ops: list[Operation] = []
    m = dict(back)

    def host(v: SSAValue) -> SSAValue:
        if v in m:
            return m[v]
        op = v.owner
        assert isinstance(op, Operation) and _pure(op)
        c = op.clone(value_mapper={o: host(o) for o in op.operands})
        host_ops.append(c)
        for r, cr in zip(op.results, c.results):
            m[r] = cr
        return m[v]

    names = {fa: _value_name(fa, j) for j, fa in enumerate(k.args)}
    blocks = host(_ceildiv_in_kernel(k, k.nchan))
    grid0 = f"expr:{_formula(blocks, names)}"
    bufs = []
    scratch_desc = []
    j0 = _take_scratch_numbers(fn, len(k.el_types))
    for t in k.el_types:
        per = totals[t]
        total_k = _mul_in_kernel(k, per, k.padded_channels)
        size = host(total_k)
        alloc = memref.AllocOp([size], [], MemRefType(t, [DYNAMIC_INDEX]))
        host_ops.append(alloc)
        bufs.append(alloc.memref)
        scratch_desc.append((f"scratch_{bg.type_name(t)}", (f"expr:{_formula(size, names)}",)))
    one = arith.ConstantOp(IntegerAttr(1, IndexType()))
    bs = arith.ConstantOp(IntegerAttr(k.block, IndexType()))
    host_ops += [one, bs]
    launch = gpu.LaunchFuncOp(
        SymbolRefAttr(bg.KERNEL_MODULE, [k.kfunc.sym_name.data]),
        [blocks, one.result, one.result], [bs.result, one.result, one.result],
        kernelOperands=[*k.args, *bufs],
    )
    # no launch for an empty grid (the runtime skips those itself; the IR says so too)
    zero = arith.ConstantOp(IntegerAttr(0, IndexType()))
    nonempty = arith.CmpiOp(blocks, zero.result, "ugt")
    host_ops += [zero, nonempty, scf.IfOp(nonempty.result, [], Region(Block([launch, scf.YieldOp()])))]
    host_ops += [memref.DeallocOp.get(b) for b in bufs]
    Rewriter.insert_op(host_ops, InsertPoint.before(k.nest[0]))
    Rewriter.erase_op(k.nest[0])
    for o in reversed(k.prologue):
        if not o.results or not any(r.uses for r in o.results):
            Rewriter.erase_op(o, safe_erase=False)
    for o in k.epilogue:
        if isinstance(o, memref.DeallocOp):
            Rewriter.erase_op(o)

    stored = {o.memref for o in k.kfunc.walk() if isinstance(o, (memref.StoreOp, memref.AtomicRMWOp))}
    loaded = {o.memref for o in k.kfunc.walk() if isinstance(o, (memref.LoadOp, memref.AtomicRMWOp))}

    def kind(a: SSAValue) -> str:
        w, r = a in stored, a in loaded
        return "inout" if w and r else "out" if w else "in"

    kargs = entry.args
    args = []
    for fa, ka in zip(k.args, kargs):
        if isinstance(fa.type, MemRefType):
            args.append((names[fa], kind(ka), bg.type_name(fa.type.element_type), shape_entries(fa.type)))
        else:
            args.append((names[fa], "scalar", bg.type_name(fa.type), ()))
    for (n, _), t in zip(scratch_desc, k.el_types):
        args.append((n, "inout", bg.type_name(t), ("?",)))
    desc = KernelLaunch(
        kernel_name=k.kfunc.sym_name.data,
        module_name=bg.KERNEL_MODULE,
        func_name=fn.sym_name.data,
        grid=(grid0, 1, 1),
        block=(k.block, 1, 1),
        shared_bytes=0,
        args=args,
        # a top-level buffer of the function (stage kernels): -1 until `buffers_to_scratch`
        host_args=tuple([fa.index if isinstance(fa.owner, Block) else -1 for fa in k.args]
                        + [-2 - j0 - j for j in range(len(bufs))]),
        scratch=tuple(scratch_desc),
        notes=f"channel program: one thread per channel ({' x '.join('loop' for _ in k.nest)}), "
              "sequential in time; scratch in global memory, interleaved by channel",
    )
    k.kfunc.attributes["scanweaver.launch"] = desc.to_attr()


#: the function attribute counting its runtime scratch buffers (shared with the
#: multi-block scans of affine_time_blocks.py)
SCRATCH_COUNT_ATTR = "scanweaver.scratch_count"


def _take_scratch_numbers(fn: func.FuncOp, n: int) -> int:
    attr = fn.attributes.get(SCRATCH_COUNT_ATTR)
    j0 = attr.value.data if isinstance(attr, IntegerAttr) else 0
    fn.attributes[SCRATCH_COUNT_ATTR] = IntegerAttr(j0 + n, i64)
    return j0


def buffers_to_scratch(top: ModuleOp) -> None:
    """Top-level `memref.alloc`s of a host function that only launches use become
    runtime scratch buffers (`host_args` -2 - j, shape in the first launch naming them):
    the temporaries between the stages of a VJP (`lower_loop_stages`)."""
    from dataclasses import replace

    from scanweaver.rewrites.launch import LAUNCH_ATTR, launch_from_attr

    kernels = {o.sym_name.data: o for o in bg.get_kernel_module(top).body.block.ops if isinstance(o, gpu.FuncOp)} \
        if any(isinstance(o, gpu.ModuleOp) for o in top.ops) else {}
    for fn in [o for o in top.ops if isinstance(o, func.FuncOp) and not o.is_declaration]:
        allocs = [o for o in fn.body.block.ops if isinstance(o, memref.AllocOp)
                  and all(isinstance(u.operation, (gpu.LaunchFuncOp, memref.DeallocOp, memref.DimOp))
                          for u in o.memref.uses)
                  and any(isinstance(u.operation, gpu.LaunchFuncOp) for u in o.memref.uses)]
        if not allocs:
            continue
        number: dict[SSAValue, int] = {}
        for launch in [o for o in fn.walk() if isinstance(o, gpu.LaunchFuncOp)]:
            kfunc = kernels.get(launch.kernel.nested_references.data[-1].data)
            if kfunc is None or LAUNCH_ATTR not in kfunc.attributes:
                continue
            desc = launch_from_attr(kfunc.attributes[LAUNCH_ATTR])
            host_args, scratch = list(desc.host_args), list(desc.scratch)
            names = {v: a[0] for v, a in zip(launch.kernelOperands, desc.args)}
            for pos, v in enumerate(launch.kernelOperands):
                alloc = v.owner
                if alloc not in allocs or desc.host_args[pos] != -1:  # not yet numbered
                    continue
                first = v not in number
                if first:
                    number[v] = _take_scratch_numbers(fn, 1)
                host_args[pos] = -2 - number[v]
                if first:
                    dyn = iter(alloc.dynamic_sizes)
                    others = {x: n for x, n in names.items() if x is not v}
                    shape = tuple(f"expr:{_formula(next(dyn), others)}" if d == DYNAMIC_INDEX else d
                                  for d in alloc.memref.type.get_shape())
                    scratch.append((desc.args[pos][0], shape))
            kfunc.attributes[LAUNCH_ATTR] = replace(desc, host_args=tuple(host_args), scratch=tuple(scratch)).to_attr()


def _loop_stages(fn: func.FuncOp) -> list[list[scf.ForOp]]:
    """The top-level loop nests of `fn` (elementwise stages, or per-row programs)."""
    out = []
    for o in list(fn.body.block.ops):
        if isinstance(o, scf.ForOp) and not o.iter_args:
            nest = [o]
            while True:
                body = [x for x in nest[-1].body.block.ops if not isinstance(x, scf.YieldOp)]
                inner = [x for x in body if isinstance(x, scf.ForOp)]
                if len(inner) != 1 or inner[0].iter_args or not all(x is inner[0] or _pure(x) for x in body):
                    break
                nest.append(inner[0])
            out.append(nest)
    return out


#: function attribute asking for its top-level loop nests as GPU kernels (one thread
#: per iteration of the whole nest): the VJPs whose stages are whole-array scans
#: (`scan.affine`) with elementwise loops between them
LOOP_STAGES_ATTR = "scanweaver.gpu_loop_stages"


def lower_loop_stages(top: ModuleOp, block: int = BLOCK) -> dict[Operation, str]:
    refused: dict[Operation, str] = {}
    for fn in [o for o in top.ops if isinstance(o, func.FuncOp) and LOOP_STAGES_ATTR in o.attributes]:
        for nest in _loop_stages(fn):
            try:
                _emit_kernel(_Kernel(fn, nest, kernel_name(top, f"{fn.sym_name.data}_stage"), block, stage=True), top)
            except Unsupported as e:
                first = next((o for o in fn.walk() if isinstance(o, _SCAN_OPS)), None)
                if first is not None:
                    refused[first] = f"loop stage: {e}"
    return refused


def _ceildiv_in_kernel(k: _Kernel, v: SSAValue) -> SSAValue:
    entry = k.kfunc.body.block
    c = arith.ConstantOp(IntegerAttr(k.block, IndexType()))
    d = arith.CeilDivUIOp(v, c.result)
    entry.insert_op_before(c, k.guard)
    entry.insert_op_before(d, k.guard)
    return d.result


def _mul_in_kernel(k: _Kernel, a: SSAValue, b: SSAValue) -> SSAValue:
    entry = k.kfunc.body.block
    d = arith.MuliOp(a, b)
    entry.insert_op_before(d, k.guard)
    return d.result


def lower_channel_program(fn: func.FuncOp, nest: list[scf.ForOp], top: ModuleOp, block: int = BLOCK) -> None:
    """Lower one channel program (see the module docstring); Unsupported leaves `fn`
    unchanged."""
    _emit_kernel(_Kernel(fn, nest, kernel_name(top, f"{fn.sym_name.data}_channels"), block), top)


def check_in_bounds(k: _Kernel) -> None:
    """Every access of a memref argument the threads run must be one the shape contract
    follows (checked before the launch; the device checks nothing), else `Unsupported`
    naming it.  A VJP of the gradient pass is taken on its word (`GENERATED_VJP_ATTR`)."""
    from scanweaver.rewrites.grad import GENERATED_VJP_ATTR

    if GENERATED_VJP_ATTR in k.fn.attributes:
        return
    for o, ref in unproven_accesses(k.fn, [*k.prologue, k.nest[0]]):
        raise unproven_refusal(o, ref)


def _emit_kernel(k: _Kernel, top: ModuleOp) -> None:
    """Build `k`'s kernel (scans as loops, buffers as scratch slices, shared stores as
    atomics), add it to the kernel module and replace the nest by its launch."""
    check_in_bounds(k)
    kfunc = k.build()
    _lower_scans_to_loops(kfunc)
    totals = _to_scratch(k)
    _shared_stores_to_atomics(k)
    check_closed(kfunc)
    bg.get_kernel_module(top).body.block.add_op(kfunc)
    _host(k, totals)


def lower_channel_programs(top: ModuleOp, block: int = BLOCK) -> dict[Operation, str]:
    """Lower every function whose channel nest the fused kernels refuse; returns the
    ones this lowering refused too, with the reason."""
    refused: dict[Operation, str] = {}
    for fn in [o for o in top.ops if isinstance(o, func.FuncOp) and LOOP_STAGES_ATTR not in o.attributes]:
        nest = channel_nest(fn)
        if nest is None or refused_by_nest_kernels(nest) is None:
            continue
        try:
            lower_channel_program(fn, nest, top, block)
        except Unsupported as e:  # noted on the function through its first scan op
            first = next(o for o in nest[0].walk() if isinstance(o, _SCAN_OPS))
            refused[first] = f"channel program (one thread per channel): {e}"
    return refused


__all__ = ["LOOP_STAGES_ATTR", "buffers_to_scratch", "lower_loop_stages", "BLOCK", "channel_nest", "lower_channel_program", "lower_channel_programs", "refused_by_nest_kernels"]
