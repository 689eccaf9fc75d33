"""Generic `scan.scan` parallel in time across blocks: scan-then-propagate.

For few channels and long rows (the choice of `affine_time_blocks.wants_time_blocks`),
each channel's time axis is cut into chunks of `chunk = block_size * items_per_thread
* chunk_tiles` steps and the op becomes:

1. `<name>` (the chained-tile kernel of `scan_gpu.py` with `chunk`), grid channels x
   chunks: each block scans its chunk as if the scan started there, writing the outputs,
   and stores the chunk's aggregate (its last inclusive value) into scratch `g_j`.
2. a new `scan.scan` with the same combine over the aggregates into scratch `c_j`
   (lowered by `scan_gpu.py` like any other: one block per channel), so `c_j[.., k]` is
   the combine of chunks 0..k.
3. `<name>_carry`, grid channels x chunks: every block of a chunk k > 0 replaces each
   output of its chunk by combine(c[.., k-1], output); combine operands keep scan order
   (the carry is the earlier part), so only associativity is assumed, as in `scan_gpu`.
   Each thread takes runs of one 16-byte vector's worth of steps (4 for 32-bit
   elements), read and written by vectors where the run is inside the chunk and the
   rows are whole vectors (`_carry_vector`), else step by step.
   A seeded scan (the associative raise's host copies, `scan_seed_gpu.py`) scans the
   producer's map of its sources into its destinations in step 1 (each chunk's
   aggregate stored by the thread of its last step, exact for a partial last tile); in
   step 3 every chunk, the first included, takes the seeds on the left of its carry,
   and the last chunk's block writes combine(seeds, all chunks) to the results.  With
   no destination (the log-sum-exp) step 3 only writes the results; a seeded scan
   writing the arrays of only some operands keeps the one-block kernel.  State kept in
   memory (`m[i]`): step 1 reads the seeds from m and chunk 0 scans from them (its
   aggregate includes them), step 3 carries like an unseeded scan and the last chunk's
   block stores c[K-1] to m when L > 0: m is read in launch 1 and written in launch 3
   only, so no two blocks of one launch race on it.  Per channel (a host channel loop)
   keeps one block per channel.

Blocks of a launch never touch what another block of it writes. Integer combines stay
bit-exact; float combines are reassociated (as in `scan_gpu`). Cost: the outputs are
written, then read and written again (4 passes over the data for 2): chosen only where
one block per channel would leave the chip mostly idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from xdsl.dialects import arith, func, gpu, memref, vector
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    DictionaryAttr,
    FunctionType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    SymbolRefAttr,
    UnitAttr,
    VectorType,
    i64,
)
from xdsl.ir import Attribute, Block, Region, SSAValue
from xdsl.rewriter import InsertPoint, Rewriter

from scanweaver.dialects import scan
from scanweaver.rewrites import blelloch_gpu as bg
from scanweaver.rewrites import scan_gpu as sg
from scanweaver.rewrites.affine_time_blocks import _SCRATCH_BASE_ATTR, chunk_of_block, static_prefers_time_blocks
from scanweaver.rewrites.affine_to_pairs import Emitter
from scanweaver.rewrites.gpu_kernel import Unsupported, check_closed, kernel_name
from scanweaver.rewrites.launch import LAUNCH_ATTR, KernelLaunch, launch_from_attr
from scanweaver.rewrites.scan_seed_gpu import erase_host_copies, match_seeded
from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR

#: scratch values of the host IR -> (host_args position, like: the value whose shape it has or None)
Scratch = dict[SSAValue, tuple[int, SSAValue | None]]


def wants_time_blocks(op: scan.ScanOp, chunk: int, mode: str) -> bool:
    if mode == "never":
        return False
    choice = op.attributes.get(TIME_BLOCKS_ATTR)
    if mode == "always" or choice is not None:
        return mode == "always" or getattr(choice, "data", "") == "time_blocks"
    t = op.outputs[0].type
    return static_prefers_time_blocks(t.get_shape(), op.axis_value, chunk)  # type: ignore[attr-defined]


def _host_func(op) -> func.FuncOp:
    fn = op.parent_op()
    while not isinstance(fn, func.FuncOp):
        fn = fn.parent_op()
    return fn


def _kernel(name: str, names: Sequence[str], types: Sequence[Attribute]):
    kfunc = gpu.FuncOp(name, FunctionType.from_lists(list(types), []), kernel=True)
    kfunc.attributes["gpu.kernel"] = UnitAttr()
    for a, n in zip(kfunc.body.block.args, names):
        a.name_hint = n
    return kfunc, Emitter(kfunc.body.block)


class _ScanTimeBlocks:
    """The three steps replacing one `scan.scan` (module doc); the host code and the
    kernels share its layout and scratch buffers through the instance."""

    def __init__(self, op: scan.ScanOp, top: ModuleOp, bs: int, ipt: int, chunk_tiles: int, scratch: Scratch):
        self.combine = sg.match_scan(op)  # raises Unsupported before anything changes
        self.op, self.bs, self.ipt, self.scratch = op, bs, ipt, scratch
        # the associative raise's host copies (scan_seed_gpu.py): scan map(srcs) into dsts from seeds
        self.seeded = sd = match_seeded(op)
        if sd and any(d is None for d in sd.dsts) and any(d is not None for d in sd.dsts):
            # step 3 recombines whole tuples from the outputs: the one-block kernel does this
            raise Unsupported("time blocks: a seeded scan writing the arrays of only some of its operands")
        # state kept in memory (m[i]): step 1 reads it (chunk 0 scans from it), only step 3
        # writes it, so no two blocks of one launch race on m (launches run in order)
        self.in_memory = bool(sd and any(a is not None for a in (*sd.seed_at, *sd.final_at)))
        if sd and self.in_memory and not (
            all(a is not None or isinstance(v.owner, arith.ConstantOp) for v, a in zip(sd.seeds, sd.seed_at))
            and all(f is None or a is not None for f, a in zip(sd.finals, sd.final_at))
        ):
            raise Unsupported("time blocks: a seeded scan mixing state in memory with scalar seeds or rank-0 results")
        if sd and sd.channel_loop is not None:  # its chunk kernels lay out no host channel loop
            raise Unsupported("time blocks: a seeded scan inside a host channel loop")
        self.ins = list(sd.srcs) if sd else list(op.inputs)
        self.outs_h = [d for d in sd.dsts if d is not None] if sd else list(op.outputs)
        self.ref = sd.ref if sd else self.outs_h[0]  # its length is the scan's
        self.chunk = bs * ipt * chunk_tiles
        self.axis, self.reverse = op.axis_value, op.is_reverse
        out_t = self.ref.type
        assert isinstance(out_t, MemRefType)
        self.rank, self.shape = out_t.get_num_dims(), out_t.get_shape()
        self.channel_dims = [i for i in range(self.rank) if i != self.axis]
        self.types: list[Attribute] = [v.type.element_type for v in op.inputs]  # type: ignore[attr-defined]
        self.k = len(self.types)
        self.kmod = bg.get_kernel_module(top)
        self.name = kernel_name(top, "scan_generic_tb")
        self.fn = _host_func(op)

    def lower(self) -> None:
        self._scratch_buffers()
        self._step1_arguments()
        g1 = self._chunk_kernel()
        agg_scan = self._aggregate_scan()
        g3 = self._carry_kernel()
        self._launch(g1, agg_scan, g3)
        Rewriter.erase_op(self.op)
        if self.seeded:
            erase_host_copies(self.seeded)

    # -- host: scratch (aggregates g_j, prefixes c_j) ------------------------------------------
    def _scratch_buffers(self) -> None:
        op, shape, axis, chunk, k, fn = self.op, self.shape, self.axis, self.chunk, self.k, self.fn
        host = self.host = Emitter(InsertPoint.before(op))
        self.n_static = -(-max(shape[axis], 1) // chunk) if shape[axis] != DYNAMIC_INDEX else DYNAMIC_INDEX
        agg_shape = [shape[i] for i in self.channel_dims] + [self.n_static]
        sizes = [host.dim(self.ref, i) for i in self.channel_dims if shape[i] == DYNAMIC_INDEX]
        if self.n_static == DYNAMIC_INDEX:
            length = host.dim(self.ref, axis)
            sizes.append(host.divu(host.add(host.val(arith.MaxUIOp(length, host.index(1))), host.index(chunk - 1)),
                                   host.index(chunk)))
        j0 = fn.attributes[_SCRATCH_BASE_ATTR].value.data if _SCRATCH_BASE_ATTR in fn.attributes else 0  # type: ignore[attr-defined]
        fn.attributes[_SCRATCH_BASE_ATTR] = IntegerAttr(j0 + 2 * k, i64)
        self.aggs = [host.val(memref.AllocOp(sizes, [], MemRefType(t, agg_shape))) for t in self.types]
        self.prefixes = [host.val(memref.AllocOp(sizes, [], MemRefType(t, agg_shape))) for t in self.types]
        for j, (g, c) in enumerate(zip(self.aggs, self.prefixes)):
            self.scratch[g] = (-2 - j0 - j, None)
            self.scratch[c] = (-2 - j0 - k - j, g)

    def _step1_arguments(self) -> None:
        """Kernel arguments of step 1: inputs, outputs (an output that is an input once), aggregates."""
        k = self.k
        operands: list[SSAValue] = []
        names: list[str] = []
        kinds: list[str] = []
        for j, v in enumerate(self.ins):
            if v not in operands:
                operands += [v]
                names += [f"x{j}"]
                kinds += ["in"]
        for j, v in enumerate(self.outs_h):
            if v in operands:
                kinds[operands.index(v)] = "inout" if kinds[operands.index(v)] == "in" else "out"
            else:
                operands += [v]
                names += [f"y{j}"]
                kinds += ["out"]
        self.n_scanned = len(operands)
        operands += self.aggs
        names += [f"g{j}" for j in range(k)]
        kinds += ["out"] * k
        if self.in_memory:  # the state memrefs the seeds are read from (written only by step 3)
            for j, m in enumerate(self.seeded.seed_memref):  # type: ignore[union-attr]
                if m is not None and m not in operands:
                    operands, names, kinds = operands + [m], names + [f"init{j}"], kinds + ["in"]
        if self.seeded:  # what the producer's values from above it start from
            sg.add_captures(self.seeded, operands, names, kinds)
        self.operands, self.names, self.kinds = operands, names, kinds
        self.ref_name = names[operands.index(self.ref)]

    # -- launch descriptions ------------------------------------------------------------------
    def entry(self, arg: str, i: int) -> int | str:
        return self.shape[i] if self.shape[i] != DYNAMIC_INDEX else f"{arg}.shape[{i}]"

    def chunk_count(self, arg: str) -> int | str:
        return self.n_static if self.n_static != DYNAMIC_INDEX else f"cdiv({arg}.shape[{self.axis}],{self.chunk})"

    def chunked_grid(self, arg: str) -> int | str:
        terms = [self.entry(arg, i) for i in self.channel_dims]
        terms.append(self.chunk_count(arg))
        if all(isinstance(t, int) for t in terms):
            out = 1
            for t in terms:
                out *= t  # type: ignore[operator]
            return out
        return "*".join(str(t) for t in terms)

    @staticmethod
    def arg_desc(ns, ks, vs):
        return [
            (n, kd, bg.type_name(v.type.element_type), bg._shape_entries(v.type))  # type: ignore[attr-defined]
            if kd != "scalar" else (n, kd, bg.type_name(v.type), ())
            for n, kd, v in zip(ns, ks, vs)
        ]

    # -- the steps ------------------------------------------------------------------------------
    def _chunk_kernel(self) -> int | str:
        """Step 1: chunk-local scans and their aggregates; returns its grid."""
        op, name, bs, types, k, kmod = self.op, self.name, self.bs, self.types, self.k, self.kmod
        operands, names, ref_name = self.operands, self.names, self.ref_name
        kf1, e1 = _kernel(name, names, [v.type for v in operands])
        argmap = dict(zip(operands, kf1.body.block.args))
        shared = []
        for j, el in enumerate(types):
            s_t = MemRefType(el, [bs], memory_space=bg.SHARED_SPACE)
            c_t = MemRefType(el, [1], memory_space=bg.SHARED_SPACE)
            shared.append((e1.val(memref.GetGlobalOp(f"{name}_s{j}", s_t)), e1.val(memref.GetGlobalOp(f"{name}_c{j}", c_t))))
        outs1 = [argmap[v] for v in self.outs_h] if not self.seeded else [argmap.get(v) for v in self.seeded.dsts]
        load_fn = (lambda ie, t: self.seeded.clone_elements(ie, t, argmap)) if self.seeded else None
        seeds = sg.seeded_kernel_values(self.seeded, e1, argmap)[0] if self.in_memory else None  # type: ignore[arg-type]
        sg._emit_kernel(e1, op, self.combine, [argmap[v] for v in self.ins], outs1, shared,
                        bs, self.ipt, chunk=self.chunk, aggs=[argmap[g] for g in self.aggs], load_fn=load_fn,
                        seeds=seeds)
        e1.op(gpu.ReturnOp([]))
        check_closed(kf1)
        for j, el in enumerate(types):
            bg.shared_global(kmod, f"{name}_s{j}", el, bs)
        for j, el in enumerate(types):
            bg.shared_global(kmod, f"{name}_c{j}", el, 1)
        kmod.body.block.add_op(kf1)

        g_entries = tuple([self.entry(ref_name, i) for i in self.channel_dims] + [self.chunk_count(ref_name)])
        g1 = self.chunked_grid(ref_name)
        desc1 = KernelLaunch(
            kernel_name=name, module_name=bg.KERNEL_MODULE, grid=(g1, 1, 1), block=(bs, 1, 1),
            shared_bytes=sg.shared_layout_bytes([bs * bg.byte_size(t) for t in types] + [bg.byte_size(t) for t in types]),
            args=self.arg_desc(names, self.kinds, operands), host_args=(),
            equal_dims=tuple((n, i, ref_name, i) for n in names[: self.n_scanned] if n != ref_name
                             for i in range(self.rank)),
            scratch=tuple((f"g{j}", g_entries) for j in range(k)),
            notes=f"scan.scan time blocks 1/3: {self.chunk}-step chunks scanned from their start, aggregates out",
        )
        kf1.attributes[LAUNCH_ATTR] = desc1.to_attr()
        return g1

    def _aggregate_scan(self) -> scan.ScanOp:
        """Step 2: the scan of the aggregates, a scan.scan like any other."""
        op = self.op
        region = Region(Block(arg_types=[*self.types, *self.types]))
        mapping = dict(zip(op.combine.block.args, region.block.args))
        for o in op.combine.block.ops:
            region.block.add_op(o.clone(value_mapper=mapping))
        return scan.ScanOp(self.aggs, self.prefixes, self.rank - 1, region)

    def _carry_kernel(self) -> int | str:
        """Step 3: carries into every chunk after the first; returns its grid."""
        name, bs, k = self.name, self.bs, self.k
        outs = self.outs = list(dict.fromkeys(self.outs_h))
        names3 = [f"y{j}" for j in range(len(outs))] + [f"c{j}" for j in range(k)]
        vals3 = outs + self.prefixes
        kinds3 = ["inout"] * len(outs) + ["in"] * k
        sd = self.seeded
        if sd and not outs:  # no output array: the results' length is that of a source
            names3, vals3, kinds3 = ["x0"] + names3, [self.ref] + vals3, ["in"] + kinds3
        if sd and self.in_memory:  # the state memrefs the results go to (the seeds are in chunk 0)
            for j, v in enumerate(sd.finals):
                if v is not None and v not in vals3:
                    names3, vals3, kinds3 = names3 + [f"final{j}"], vals3 + [v], kinds3 + ["inout"]
        elif sd:
            for j, v in enumerate(sd.seeds):
                if not isinstance(v.owner, arith.ConstantOp):  # a constant is cloned into the kernel
                    names3, vals3, kinds3 = names3 + [f"init{j}"], vals3 + [v], kinds3 + ["scalar"]
            for j, v in enumerate(sd.finals):
                if v is not None:
                    names3, vals3, kinds3 = names3 + [f"final{j}"], vals3 + [v], kinds3 + ["out"]
        self.vals3 = vals3
        kf3, e3 = _kernel(f"{name}_carry", names3, [v.type for v in vals3])
        a3 = kf3.body.block.args
        args3 = dict(zip(vals3, a3))
        seeds, finals, final_at = None, (), ()
        if sd and self.in_memory:
            finals, final_at = [args3.get(v) for v in sd.finals], sg.final_indices(sd, e3, args3)  # type: ignore[arg-type]
        elif sd:
            seeds, finals, _ = sg.seeded_kernel_values(sd, e3, args3)
        _emit_carry(e3, self.combine, [a3[vals3.index(v)] for v in self.outs_h], [args3[c] for c in self.prefixes],
                    self.axis, self.reverse, bs, self.chunk, seeds, finals, args3[self.ref], final_at)
        e3.op(gpu.ReturnOp([]))
        check_closed(kf3)
        self.kmod.body.block.add_op(kf3)
        self.ref3 = "y0" if outs else "x0"
        g3 = self.chunked_grid(self.ref3)
        desc3 = KernelLaunch(
            kernel_name=f"{name}_carry", module_name=bg.KERNEL_MODULE, grid=(g3, 1, 1), block=(bs, 1, 1),
            shared_bytes=0, args=self.arg_desc(names3, kinds3, vals3), host_args=(),
            notes="scan.scan time blocks 3/3: combine(prefix of the chunks before, output) per step",
        )
        kf3.attributes[LAUNCH_ATTR] = desc3.to_attr()
        return g3

    # -- host: launches in order ----------------------------------------------------------------------------
    def _launch(self, g1: int | str, agg_scan: scan.ScanOp, g3: int | str) -> None:
        host, name, bs, ref_name = self.host, self.name, self.bs, self.ref_name
        static_channels = all(self.shape[i] != DYNAMIC_INDEX for i in self.channel_dims)

        def launches(le: Emitter) -> None:
            one = le.index(1)
            for kname, g, ref, vals in ((name, g1, {ref_name: self.ref}, self.operands), (None, None, None, None),
                                         (f"{name}_carry", g3, {self.ref3: self.vals3[0]}, self.vals3)):
                if kname is None:
                    le.op(agg_scan)
                    continue
                size = bg.emit_grid_size(le, g, ref)
                le.op(gpu.LaunchFuncOp(SymbolRefAttr(bg.KERNEL_MODULE, [kname]), [size, one, one],
                                       [le.index(bs), one, one], kernelOperands=list(vals)))

        if static_channels:
            launches(host)
        else:
            channels = "*".join(str(self.entry(ref_name, i)) for i in self.channel_dims) or "1"
            nch = bg.emit_grid_size(host, channels, {ref_name: self.ref})
            host.if_(host.cmp("sgt", nch, host.index(0)), [], launches)
        for buf in (*self.aggs, *self.prefixes):
            host.op(memref.DeallocOp.get(buf))


def lower_scan_time_blocks(op: scan.ScanOp, top: ModuleOp, bs: int, ipt: int, chunk_tiles: int, scratch: Scratch) -> None:
    """Replace `op` by the three steps of the module doc (raises `Unsupported` like
    `scan_gpu.lower_scan`, leaving `op` alone)."""
    _ScanTimeBlocks(op, top, bs, ipt, chunk_tiles, scratch).lower()


def _emit_carry(e: Emitter, combine, outs: Sequence[SSAValue], prefixes: Sequence[SSAValue], axis: int,
                reverse: bool, bs: int, chunk: int, seeds: Sequence[SSAValue] | None = None,
                finals: Sequence[SSAValue | None] = (), ref: SSAValue | None = None,
                final_at: Sequence[Sequence[SSAValue] | None] = ()) -> None:
    """Step 3: y[t] = combine(c[.., k-1], y[t]) over the steps of chunk k > 0.  With
    `seeds` (one channel: `scan_seed_gpu.py`) every chunk takes them, on the left:
    y[t] = combine(seeds, y[t]) in chunk 0, combine(combine(seeds, c[k-1]), y[t]) after;
    thread 0 of the last chunk's block writes combine(seeds, c[K-1]) (the seeds when
    L == 0) to `finals` (step 1 stored exact aggregates for seeded scans).  `ref`: an
    array of the scan's length when there are no `outs`.  `final_at` (state kept in
    memory; no `seeds`: step 1 scanned chunk 0 from them): thread 0 of the last chunk's
    block stores c[K-1] to those elements of `finals`, when L > 0 and they are in bounds."""
    combine.capture(e)
    tid = bg._thread_id(e)
    ref = outs[0] if outs else ref
    assert ref is not None
    length = e.dim(ref, axis)
    c_lin, k, n_chunks = chunk_of_block(e, length, chunk)
    channel = bg.channel_indices(e, ref, axis, c_lin)
    last_t = e.sub(length, e.index(1))
    types = [c.type.element_type for c in prefixes]  # type: ignore[attr-defined]

    def seeded_prefix(ie: Emitter, upto: SSAValue) -> list[SSAValue]:
        """combine(seeds, c[upto - 1]), or the seeds when upto == 0."""
        assert seeds is not None
        return ie.if_(
            ie.cmp("ugt", upto, ie.index(0)), types,
            lambda je: combine(je, seeds, [je.load(c, [*channel, je.sub(upto, je.index(1))]) for c in prefixes]),
            lambda je: list(seeds),
        )

    def body(ie: Emitter) -> None:
        if seeds is None:
            carry = [ie.load(c, [*channel, ie.sub(k, ie.index(1))]) for c in prefixes]
        else:
            carry = seeded_prefix(ie, k)
        t_begin = ie.mul(k, ie.index(chunk))
        t_end = ie.val(arith.MinUIOp(length, ie.add(t_begin, ie.index(chunk))))

        def one(le: Emitter, t: SSAValue) -> None:
            p = le.sub(last_t, t) if reverse else t
            idx = [*channel[:axis], p, *channel[axis:]]
            new = combine(le, carry, [le.load(y, idx) for y in outs])
            for v, y in zip(new, outs):
                le.store(v, y, idx)

        def step(le: Emitter, t: SSAValue, _: Sequence[SSAValue]) -> list[SSAValue]:
            one(le, t)
            return []

        vec = _carry_vector(outs, axis, chunk)
        if not vec:
            ie.for_(ie.add(t_begin, tid), t_end, ie.index(bs), [], step)
            return

        def run(le: Emitter, t: SSAValue, _: Sequence[SSAValue]) -> list[SSAValue]:
            # steps [t, t + vec) of this thread: one 16-byte vector per output where the
            # whole run is inside the chunk and the rows are whole vectors, else one by one
            whole = le.val(arith.AndIOp(le.cmp("ule", le.add(t, le.index(vec)), t_end), rows_aligned))

            def vectors(je: Emitter) -> None:
                runs = [_load_vectors(je, y, channel, axis, t, vec, last_t if reverse else None) for y in outs]
                news = [combine(je, carry, [r[j] for r in runs]) for j in range(vec)]
                for i, y in enumerate(outs):
                    _store_vectors(je, y, [n[i] for n in news], channel, axis, t, vec, last_t if reverse else None)

            def scalars(je: Emitter) -> None:
                for j in range(vec):
                    tj = je.add(t, je.index(j)) if j else t
                    je.if_(je.cmp("ult", tj, t_end), [], lambda ke, tj=tj: one(ke, tj))

            le.if_(whole, [], vectors, scalars)
            return []

        rows_aligned = ie.cmp("eq", ie.remu(length, ie.index(vec)), ie.index(0))
        ie.for_(ie.add(t_begin, ie.mul(tid, ie.index(vec))), t_end, ie.index(bs * vec), [], run)

    if seeds is None:
        if outs:  # (state in memory with no output array: only the results)
            e.if_(e.cmp("ugt", k, e.index(0)), [], body)
        if final_at:
            _store_state(e, tid, k, n_chunks, length, prefixes, channel, finals, final_at)
        return
    if outs:
        body(e)
    if any(f is not None for f in finals):
        # the block of the last chunk (one block when L == 0): all chunks' total, or the seeds
        zero = e.index(0)
        is_last = e.cmp("eq", k, e.sub(n_chunks, e.index(1)))

        def write_final(ie: Emitter) -> None:
            total = ie.if_(ie.cmp("ugt", length, zero), types,
                           lambda je: seeded_prefix(je, n_chunks), lambda je: list(seeds))
            sg.store_all(ie, total, finals, [])

        e.if_(sg._and(e, is_last, e.cmp("eq", tid, zero)), [], write_final)


def _store_state(e: Emitter, tid, k, n_chunks, length, prefixes, channel, finals, final_at) -> None:
    """State kept in memory: the combine of all chunks (chunk 0's aggregate holds the
    seeds) to its element, by thread 0 of the last chunk's block; m untouched for L == 0."""
    zero, one = e.index(0), e.index(1)
    cond = sg._and(e, sg._and(e, e.cmp("eq", k, e.sub(n_chunks, one)), e.cmp("eq", tid, zero)),
                   e.cmp("ugt", length, zero))

    def write(ie: Emitter) -> None:
        for c, f, a in zip(prefixes, finals, final_at):
            if f is None or a is None:
                continue
            v = ie.load(c, [*channel, ie.sub(n_chunks, one)])
            inb = sg.in_bounds(ie, f, a)
            if inb is None:
                ie.store(v, f, list(a))
            else:
                ie.if_(inb, [], lambda je, v=v, f=f, a=a: je.store(v, f, list(a)))

    e.if_(cond, [], write)


def _carry_vector(outs: Sequence[SSAValue], axis: int, chunk: int) -> int:
    """Steps per thread and run of the carry kernel's 16-byte accesses (the most elements
    of one vector over the outputs), or 0 where it keeps one step per thread: an output
    the vectors do not fit (`blelloch_gpu.vector_width`), or chunks that do not start on
    a vector boundary."""
    if not outs:
        return 0
    vec = max(16 // bg.byte_size(y.type.element_type) for y in outs)  # type: ignore[attr-defined]
    if chunk % vec or not all(bg.vector_width(y.type.element_type, vec, axis, [y]) for y in outs):  # type: ignore[attr-defined]
        return 0
    return vec


def _load_vectors(e: Emitter, y: SSAValue, channel, axis: int, t: SSAValue, n: int, reverse_last) -> list[SSAValue]:
    """Steps [t, t + n) of `y` (logical order) by 16-byte vector loads."""
    el = y.type.element_type  # type: ignore[attr-defined]
    chunks = bg.run_vectors(e, channel, axis, t, n, bg.vector_width(el, n, axis, [y]), reverse_last)
    return bg.load_run(e, y, chunks, el)


def _store_vectors(e: Emitter, y: SSAValue, vals: Sequence[SSAValue], channel, axis: int, t: SSAValue, n: int,
                   reverse_last) -> None:
    """`vals` (steps [t, t + n), logical order) to `y` by 16-byte vector stores."""
    el = y.type.element_type  # type: ignore[attr-defined]
    width = bg.vector_width(el, n, axis, [y])
    vt = VectorType(el, [width])
    for idx, lanes in bg.run_vectors(e, channel, axis, t, n, width, reverse_last):
        v = e.val(vector.BroadcastOp(vals[lanes[0]], vt))
        for pos, item in enumerate(lanes[1:], 1):
            v = e.val(vector.InsertOp(vals[item], v, [pos], vt))
        bg.store_aligned(e, v, y, idx)


def fix_scratch_launches(top: ModuleOp, scratch: Scratch) -> None:
    """Give every launch that passes scratch values their `host_args` positions, and the
    first launch of each scratch buffer its shape (same as the buffer it is `like`)."""
    for fn in top.ops:
        if not isinstance(fn, func.FuncOp):
            continue
        seen: set[SSAValue] = set()
        for launch in [o for o in fn.walk() if isinstance(o, gpu.LaunchFuncOp)]:
            kname = launch.kernel.nested_references.data[-1].data
            kfunc = next(o for o in bg.get_kernel_module(top).body.block.ops
                         if isinstance(o, gpu.FuncOp) and o.sym_name.data == kname)
            attr = kfunc.attributes.get(LAUNCH_ATTR)
            if not isinstance(attr, DictionaryAttr):
                continue
            desc = launch_from_attr(attr)
            vals = list(launch.kernelOperands)
            if not any(v in scratch for v in vals) and desc.host_args:
                seen.update(v for v in vals if v in scratch)
                continue
            host_args, new_scratch = [], list(desc.scratch)
            known = {n for n, _ in desc.scratch}
            for (n, *_), v in zip(desc.args, vals):
                if v in scratch:
                    pos, like = scratch[v]
                    host_args.append(pos)
                    if v not in seen and n not in known and like is not None and like in vals:
                        like_name = desc.args[vals.index(like)][0]
                        t = v.type
                        new_scratch.append((n, tuple(d if d != DYNAMIC_INDEX else f"{like_name}.shape[{i}]"
                                                     for i, d in enumerate(t.get_shape()))))  # type: ignore[attr-defined]
                    seen.add(v)
                elif v.owner is fn.body.block:  # type: ignore[attr-defined]
                    host_args.append(v.index)  # type: ignore[attr-defined]
                else:
                    host_args.append(-1)
            kfunc.attributes[LAUNCH_ATTR] = replace(
                desc, host_args=tuple(host_args), scratch=tuple(new_scratch), func_name=fn.sym_name.data
            ).to_attr()


__all__ = ["fix_scratch_launches", "lower_scan_time_blocks", "wants_time_blocks"]
