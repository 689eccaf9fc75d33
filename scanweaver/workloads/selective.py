"""Builder of Mamba's selective scan as one `scan.recurrence` per (batch, channel).

    selective_scan_recurrence(spec, element="f32")
        func.func @selective_scan(u, delta, A, B, C, [Dskip], [z], [bias], [h0], out,
                                  [last], d_begin, d_end)
    selective_scan_gpu(spec)
        func.func @selective_scan(u, delta, A, B, C, [Dskip], [z], [bias], [h0], out,
                                  [last])

Every size but the state size N is dynamic, so one compiled kernel serves every
(batch, D, L); `d_begin`/`d_end` pick the channels a call runs (the CPU driver splits
them across threads).  B and C come in the kernel layout of their kind, time before
the state index: (D, N) "const", (batch, L, N) "shared", (batch, G, L, N) "grouped"
(channel d uses group d // (D / G)).  The argument list of a kernel is this function's
signature (`kernel_arguments`); callers never keep a second one.

The GPU form (`selective_scan_gpu`) is the same computation, shaped for the GPU
lowering: the state is allocated in the channel loop (one block per (batch, channel)
owns it), the channel loop runs over all of D (the grid covers the channels, so there
is no channel range), and B and C keep the caller's layout, state index before time
((batch, N, L), (batch, G, N, L)): a block's threads take consecutive time steps, so
their loads of one state element are coalesced.
"""

from __future__ import annotations

from collections.abc import Callable

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import FloatAttr, IndexType, IntegerAttr, MemRefType, ModuleOp, UnitAttr
from xdsl.ir import Attribute, Block, Region, SSAValue

from scanweaver.dialects import scan
from scanweaver.rewrites.cpu_blocked_dot import BLOCKED_DOT_MARK
from scanweaver.rewrites.exp_polynomial import FUSED_MARK, SCALEF_MARK, SOFTPLUS_LOG1P_MARK
from scanweaver.workloads.loops import element_type
from scanweaver.workloads.specs import SelectiveScanSpec
from scanweaver.workloads.types import kernel_arguments, memref_of

BC_KINDS = ("const", "shared", "grouped")

#: (batch, D, L) of a kernel: ints for a build of one shape, "?" for every shape
Sizes = tuple[int | str, int | str, int | str]
DYNAMIC: Sizes = ("?", "?", "?")


def bc_type(kind: str, n: int, element: str = "f32", gpu: bool = False, sizes: Sizes = DYNAMIC) -> MemRefType:
    """The memref type of B or C in the kernel layout of `kind` (state index last on
    the CPU, before time on the GPU; `sizes` (batch, D, L) static or "?")."""
    batch, dim, length = sizes
    if gpu:
        shapes = {"const": (dim, n), "shared": (batch, n, length), "grouped": (batch, "?", n, length)}
        return memref_of(shapes[kind], element)
    return memref_of({"const": ("?", n), "shared": ("?", "?", n), "grouped": ("?", "?", "?", n)}[kind], element)


def _named(value: SSAValue, hint: str) -> SSAValue:
    value.name_hint = hint
    return value


class _Body:
    """Emits ops at the current ImplicitBuilder point with the value names of the kernel."""

    def __init__(self, el: Attribute):
        self.el = el

    def index(self, v: int, hint: str) -> SSAValue:
        return _named(arith.ConstantOp(IntegerAttr(v, IndexType())).result, hint)

    def float(self, v: float, hint: str) -> SSAValue:
        return _named(arith.ConstantOp(FloatAttr(v, self.el)).result, hint)

    def load(self, m: SSAValue, indices: list[SSAValue], hint: str) -> SSAValue:
        return _named(memref.LoadOp.get(m, indices).res, hint)

    def op(self, make: Callable[..., object], *operands: SSAValue, hint: str) -> SSAValue:
        return _named(make(*operands).result, hint)


def _for(lb: SSAValue, ub: SSAValue, step: SSAValue, iv: str, body: Callable[[SSAValue], None]) -> None:
    """`scf.for %iv = lb to ub step step { body(iv) }` without carried values."""
    block = Block(arg_types=[IndexType()])
    block.args[0].name_hint = iv
    with ImplicitBuilder(block):
        body(block.args[0])
        scf.YieldOp()
    scf.ForOp(lb, ub, step, [], Region(block))


def selective_arguments(
    spec, el: str, state_el: str | Attribute | None = None, gpu: bool = False, sizes: Sizes = DYNAMIC
) -> list[tuple[str, Attribute]]:
    """The kernel's (name, type) arguments: `el` for the real per-step data, `state_el`
    (default `el`; complex for complex A) for A, B, C and the states; the GPU form
    takes B/C in its layout and no channel range, and may fix (batch, D, L) (`sizes`)."""
    n, st = spec.n, el if state_el is None else state_el
    batch, dim, _ = sizes
    m3 = memref_of(sizes, el)
    args = [("u", m3), ("delta", m3), ("A", memref_of((dim, n), st)),
            ("B", bc_type(spec.b_kind, n, st, gpu, sizes)), ("C", bc_type(spec.c_kind, n, st, gpu, sizes))]
    args += [("Dskip", memref_of((dim,), el))] if spec.has_d else []
    args += [("z", m3)] if spec.has_z else []
    args += [("bias", memref_of((dim,), el))] if spec.has_bias else []
    args += [("h0", memref_of((batch, dim, n), st))] if spec.has_h0 else []
    args += [("out", m3)]
    args += [("last", memref_of((batch, dim, n), st))] if spec.has_last else []
    return args if gpu else args + [("d_begin", IndexType()), ("d_end", IndexType())]


def _bc_indices(
    kind: str, group: SSAValue | None, b: SSAValue, d: SSAValue, i: SSAValue, n: SSAValue, gpu: bool = False
):
    if gpu:
        return {"const": [d, n], "shared": [b, n, i], "grouped": [b, group, n, i]}[kind]
    return {"const": [d, n], "shared": [b, i, n], "grouped": [b, group, i, n]}[kind]


def selective_scan_recurrence(
    spec: SelectiveScanSpec, element: str = "f32", gpu: bool = False, sizes: Sizes = DYNAMIC
) -> ModuleOp:
    """`func.func @selective_scan` for `spec`, computing in `element` (f32, or f64);
    `gpu` gives the GPU form (see the module docstring), `sizes` fixes its (batch, D, L)."""
    if spec.b_kind not in BC_KINDS or spec.c_kind not in BC_KINDS:
        raise ValueError(f"B/C kinds must be among {BC_KINDS}, got {spec.b_kind!r}, {spec.c_kind!r}")
    if not gpu and tuple(sizes) != DYNAMIC:
        raise ValueError("the CPU form has dynamic sizes only")
    args = selective_arguments(spec, element, gpu=gpu, sizes=tuple(sizes))
    block = Block(arg_types=[t for _, t in args])
    for value, (hint, _) in zip(block.args, args):
        value.name_hint = hint
    v = dict(zip((hint for hint, _ in args), block.args))
    with ImplicitBuilder(block):
        _kernel_body(spec, element, v, gpu)
        func.ReturnOp()
    fn = func.FuncOp("selective_scan", ([t for _, t in args], []), Region(block))
    return ModuleOp([fn])


def selective_scan_gpu(spec: SelectiveScanSpec, sizes: Sizes = DYNAMIC) -> ModuleOp:
    """The f32 GPU form of `selective_scan_recurrence`: by default one build for every
    (batch, D, L); static `sizes` save the registers that dynamic strides take, which a
    64-element state needs (see `runtime/cuda_scan.py`)."""
    return selective_scan_recurrence(spec, "f32", gpu=True, sizes=tuple(sizes))


def _kernel_body(spec: SelectiveScanSpec, element: str, v: dict[str, SSAValue], gpu: bool = False) -> None:
    """Constants and sizes, then the (batch, channel) loops around one scan.recurrence
    (the state allocated once on the CPU, per channel on the GPU)."""
    e = _Body(element_type(element))
    c0, c1, c2 = e.index(0, "c0"), e.index(1, "c1"), e.index(2, "c2")
    cN = e.index(spec.n, "cN")
    k = {"c0": c0, "c1": c1, "cN": cN,
         "zero": e.float(0.0, "zero"), "one": e.float(1.0, "one"), "twenty": e.float(20.0, "twenty")}
    dim = lambda i, hint: _named(memref.DimOp(v["u"], i).result, hint)  # noqa: E731
    batch, k["Dn"], length = dim(c0, "batch"), dim(c1, "Dn"), dim(c2, "len")
    per: dict[str, SSAValue] = {}
    for name, kind in (("B", spec.b_kind), ("C", spec.c_kind)):
        if kind == "grouped":
            groups = _named(memref.DimOp(v[name], c1).result, f"ng{name}")
            per[name] = e.op(arith.DivUIOp, k["Dn"], groups, hint=f"per{name}")
    state_type = memref_of((spec.n,), element)
    new_state = lambda: _named(memref.AllocaOp.get(state_type.element_type, shape=[spec.n]).memref, "S")  # noqa: E731
    hoisted = None if gpu else new_state()

    def channel(b: SSAValue, d: SSAValue) -> None:
        state = new_state() if hoisted is None else hoisted
        group = {name: e.op(arith.DivUIOp, d, p, hint=f"g{name}") for name, p in per.items()}
        _initial_state(e, spec, v, k, state, b, d)
        bd = e.load(v["bias"], [d], "bd") if spec.has_bias else None
        dd = e.load(v["Dskip"], [d], "dd") if spec.has_d else None
        coeffs = _coeffs_region(e, spec, v, k, state_type, b, d, group, bd, gpu)
        emit = _emit_region(e, spec, v, k, state_type, b, d, group, dd, gpu)
        scan.RecurrenceOp(c0, length, c1, state, coeffs, emit)
        if spec.has_last:
            _for(c0, cN, c1, "n", lambda n: memref.StoreOp.get(
                e.load(state, [n], "v"), v["last"], [b, d, n]))

    d_begin, d_end = (c0, k["Dn"]) if gpu else (v["d_begin"], v["d_end"])
    _for(c0, batch, c1, "b", lambda b: _for(d_begin, d_end, c1, "d", lambda d: channel(b, d)))


def _initial_state(e: _Body, spec, v, k, state: SSAValue, b: SSAValue, d: SSAValue) -> None:
    """S[n] = h0[b, d, n], or 0 without h0."""

    def init(n: SSAValue) -> None:
        value = e.load(v["h0"], [b, d, n], "v") if spec.has_h0 else k["zero"]
        memref.StoreOp.get(value, state, [n])

    _for(k["c0"], k["cN"], k["c1"], "n", init)


def _coeffs_region(e: _Body, spec, v, k, state_type, b, d, group, bd, gpu=False) -> Region:
    """(a, b) at step i, state index n: exp(dt * A[d, n]) and B[.., i, n] * dt * u."""
    return _coeffs(e, spec, v, k, b, d, bd,
                   lambda e, i, n: (v["B"], _bc_indices(spec.b_kind, group.get("B"), b, d, i, n, gpu)))


def _coeffs(e: _Body, spec, v, k, b, d, bd, read, fused: bool = False, scalef: bool = False) -> Region:
    """The coefficients' region with B[.., i, n] read through `read(e, i, n)`; `fused`
    marks its exps (exp(dt*A), the softplus's) for the fused polynomial (the tiled CPU kernel), `scalef`
    also for its AVX-512 form (the same bits in fewer operations)."""
    block = Block(arg_types=[IndexType(), IndexType()])
    i, n = block.args
    i.name_hint, n.name_hint = "i", "k"
    with ImplicitBuilder(block):
        dt = step_size(e, spec, v, k, b, d, i, bd, fused=fused, scalef=scalef)
        ak = e.load(v["A"], [d, n], "ak")
        da = e.op(arith.MulfOp, dt, ak, hint="da")
        a = _mark_exp(e.op(mathd.ExpOp, da, hint="a"), fused, scalef)
        bk = e.load(*read(e, i, n), "bk")
        uu = e.load(v["u"], [b, d, i], "uu")
        dtu = e.op(arith.MulfOp, dt, uu, hint="dtu")
        x = e.op(arith.MulfOp, bk, dtu, hint="x")
        scan.YieldOp(a, x)
    return Region(block)


def _emit_region(e: _Body, spec, v, k, state_type, b, d, group, dd, gpu=False) -> Region:
    """out[b, d, i] = (C[.., i, :] . S  [+ Dskip[d] u]) [* silu(z)]."""
    block = Block(arg_types=[IndexType(), state_type])
    i, s = block.args
    i.name_hint, s.name_hint = "i", "s"
    with ImplicitBuilder(block):
        store_output(e, spec, v, k, _dot_c(e, spec, v, k, s, b, d, i, group, gpu), dd, b, d, i)
        scan.YieldOp()
    return Region(block)


def _mark_exp(value: SSAValue, fused: bool, scalef: bool) -> SSAValue:
    """Mark the math.exp of `value` for the polynomial's fused form (`FUSED_MARK`) and,
    with `scalef`, its AVX-512 form (`SCALEF_MARK`, the same bits)."""
    if fused:
        value.owner.attributes[FUSED_MARK] = UnitAttr()  # type: ignore[union-attr]
    if fused and scalef:
        value.owner.attributes[SCALEF_MARK] = UnitAttr()  # type: ignore[union-attr]
    return value


def step_size(e: _Body, spec, v, k, b, d, i, bd, fused: bool = False, scalef: bool = False) -> SSAValue:
    """dt = delta[b, d, i] [+ bias[d]], [softplus]: the step both selective builders share
    (`fused`, `scalef`: the softplus's exp marked as in `_mark_exp`)."""
    dt = e.load(v["delta"], [b, d, i], "dl")
    if spec.has_bias:
        dt = e.op(arith.AddfOp, dt, bd, hint="dlb")
    if spec.softplus:
        # softplus(x) = log1p(exp(x)), = x for x > 20 (as torch and Mamba do)
        ex = _mark_exp(e.op(mathd.ExpOp, dt, hint="ex"), fused, scalef)
        lp = e.op(mathd.Log1pOp, ex, hint="lp")
        if fused:  # (the kernels whose exps are marked fused: the log1p of an exp, then a select)
            lp.owner.attributes[SOFTPLUS_LOG1P_MARK] = UnitAttr()  # type: ignore[union-attr]
        big = _named(arith.CmpfOp(dt, k["twenty"], "ogt").result, "big")
        dt = _named(arith.SelectOp(big, dt, lp).result, "sp")
    return dt


def store_output(e: _Body, spec, v, k, y: SSAValue, dd, b, d, i, fused: bool = False, scalef: bool = False) -> None:
    """out[b, d, i] = (y [+ Dskip[d] u]) [* silu(z)]: the output gate both selective
    builders share (real and complex state; `fused`, `scalef`: silu's exp marked as in
    `_mark_exp`)."""
    if spec.has_d:
        uu = e.load(v["u"], [b, d, i], "uu")
        du = e.op(arith.MulfOp, dd, uu, hint="du")
        y = e.op(arith.AddfOp, y, du, hint="yd")
    if spec.has_z:
        zz = e.load(v["z"], [b, d, i], "zz")
        nz = e.op(arith.NegfOp, zz, hint="nz")
        ez = _mark_exp(e.op(mathd.ExpOp, nz, hint="ez"), fused, scalef)
        den = e.op(arith.AddfOp, k["one"], ez, hint="den")
        sz = e.op(arith.DivfOp, zz, den, hint="sz")
        y = e.op(arith.MulfOp, y, sz, hint="yz")
    memref.StoreOp.get(y, v["out"], [b, d, i])


def _dot_c(e: _Body, spec, v, k, s, b, d, i, group, gpu=False) -> SSAValue:
    """sum over n of S[n] * C[.., i, n], as an scf.for reduction."""
    block = Block(arg_types=[IndexType(), e.el])
    n, acc = block.args
    n.name_hint, acc.name_hint = "n", "acc"
    with ImplicitBuilder(block):
        hv = e.load(s, [n], "hv")
        cv = e.load(v["C"], _bc_indices(spec.c_kind, group.get("C"), b, d, i, n, gpu), "cv")
        pr = e.op(arith.MulfOp, hv, cv, hint="pr")
        scf.YieldOp(e.op(arith.AddfOp, acc, pr, hint="acc2"))
    loop = scf.ForOp(k["c0"], k["cN"], k["c1"], [k["zero"]], Region(block))
    return _named(loop.results[0], "y")


__all__ = ["BC_KINDS", "SelectiveScanSpec", "bc_type", "kernel_arguments", "selective_scan_gpu", "selective_scan_recurrence"]  # re-exports


# ---------------------------------------------------------------------------
# The CPU driver's kernel: B and C read in the caller's layout through small tiles
# ---------------------------------------------------------------------------

#: Floats of one staged B or C tile (time steps x N): 32 KB, 512 steps at N = 16, so
#: both tiles stay in L2 and a channel's recurrence runs long enough per tile that its
#: start (state and constants into registers) and the row switches cost little
#: (2 KB and 8 KB tiles measured slower).
TILE_FLOATS = 8192
#: Channels whose states one pass over a time tile carries: the staged tiles are
#: re-read from L1 by every channel of the chunk (B and C are shared by the channels).
CHUNK_CHANNELS = 64
#: Bytes of the stack buffers' alignment (one x86 cache line, one 16-float vector).
CACHE_LINE = 64


def tile_steps(n: int) -> int:
    """Time steps of a tile for state size n: a multiple of 16 (the vectorised
    recurrence's time block, so tiles split the steps as one long run does)."""
    return max(16, TILE_FLOATS // n // 16 * 16)


def selective_scan_tiled(spec: SelectiveScanSpec, scalef: bool = False) -> ModuleOp:
    """`func.func @selective_scan_tiled`: the CPU form's computation with B and C in the
    caller's layout, state index before time ((batch, N, L), (batch, G, N, L), or
    (D, N)); arguments as `selective_arguments(spec, "f32", gpu=True)` plus d_begin,
    d_end.  Per batch and chunk of CHUNK_CHANNELS channels, time runs in tiles of
    `tile_steps(N)` steps: B[.., :, tile] and C[.., :, tile] are copied transposed into
    stack tiles (time before the state index, as the vectorised recurrence reads them)
    and every channel of the chunk runs its recurrence over the tile from its state,
    kept in a per-chunk stack buffer.  The per-step operations are those of
    `selective_scan_recurrence`'s CPU form, its exps (exp(delta*A), softplus's, silu's)
    marked for the polynomial's fused form, so the results are the bits of that form
    with the same marks; no (batch, L, N) copy of B or C is made.  `scalef`: the kernel
    is for a CPU with AVX-512F, VL and DQ, and its exps take the fused form's scalef
    variant (the same bits; `rewrites/exp_polynomial.py`)."""
    if spec.b_kind not in BC_KINDS or spec.c_kind not in BC_KINDS:
        raise ValueError(f"B/C kinds must be among {BC_KINDS}, got {spec.b_kind!r}, {spec.c_kind!r}")
    args = selective_arguments(spec, "f32", gpu=True) + [("d_begin", IndexType()), ("d_end", IndexType())]
    block = Block(arg_types=[t for _, t in args])
    for value, (hint, _) in zip(block.args, args):
        value.name_hint = hint
    v = dict(zip((hint for hint, _ in args), block.args))
    with ImplicitBuilder(block):
        _tiled_body(spec, v, scalef)
        func.ReturnOp()
    fn = func.FuncOp("selective_scan_tiled", ([t for _, t in args], []), Region(block))
    return ModuleOp([fn])


def _tiled_body(spec: SelectiveScanSpec, v: dict[str, SSAValue], scalef: bool) -> None:
    e = _Body(element_type("f32"))
    c0, c1, c2 = e.index(0, "c0"), e.index(1, "c1"), e.index(2, "c2")
    steps, chunk = tile_steps(spec.n), CHUNK_CHANNELS
    k = {"c0": c0, "c1": c1, "cN": e.index(spec.n, "cN"), "cT": e.index(steps, "cT"),
         "cK": e.index(chunk, "cK"), "zero": e.float(0.0, "zero"), "one": e.float(1.0, "one"),
         "twenty": e.float(20.0, "twenty")}
    dim = lambda m, i, hint: _named(memref.DimOp(m, i).result, hint)  # noqa: E731
    batch, k["Dn"], length = dim(v["u"], c0, "batch"), dim(v["u"], c1, "Dn"), dim(v["u"], c2, "len")
    f32t = element_type("f32")
    # Cache-line aligned: a tile row of N = 16 floats is then one line, not two (the
    # default 4-byte alignment made every step's B and C loads split loads; measured).
    alloca = lambda shape, hint: _named(  # noqa: E731
        memref.AllocaOp.get(f32t, alignment=CACHE_LINE, shape=shape).memref, hint)
    state = alloca([spec.n], "S")  # the recurrence's state (in registers inside it)
    states = alloca([chunk, spec.n], "SK")  # the chunk's states between tiles
    staged = {name: alloca([steps, spec.n], f"T{name}") for name, kind in (("B", spec.b_kind), ("C", spec.c_kind))
              if kind != "const"}
    per = {name: e.op(arith.DivUIOp, k["Dn"], dim(v[name], c1, f"ng{name}"), hint=f"per{name}")
           for name, kind in (("B", spec.b_kind), ("C", spec.c_kind)) if kind == "grouped"}

    def chunk_body(b: SSAValue, d0: SSAValue) -> None:
        d1 = e.op(arith.MinUIOp, e.op(arith.AddiOp, d0, k["cK"], hint="dk"), v["d_end"], hint="d1")
        _for(d0, d1, c1, "d", lambda d: _for(k["c0"], k["cN"], c1, "n", lambda n: memref.StoreOp.get(
            e.load(v["h0"], [b, d, n], "v") if spec.has_h0 else k["zero"], states,
            [e.op(arith.SubiOp, d, d0, hint="r"), n])))

        def tile(t0: SSAValue) -> None:
            t1 = e.op(arith.MinUIOp, e.op(arith.AddiOp, t0, k["cT"], hint="tk"), length, hint="t1")
            _for(d0, d1, c1, "d", lambda d: _tiled_channel(e, spec, v, k, b, d, d0, t0, t1, state, states, staged, per,
                                                           scalef))

        _for(c0, length, k["cT"], "t0", tile)
        if spec.has_last:
            _for(d0, d1, c1, "d", lambda d: _for(k["c0"], k["cN"], c1, "n", lambda n: memref.StoreOp.get(
                e.load(states, [e.op(arith.SubiOp, d, d0, hint="r"), n], "v"), v["last"], [b, d, n])))

    _for(c0, batch, c1, "b", lambda b: _for(v["d_begin"], v["d_end"], k["cK"], "d0", lambda d0: chunk_body(b, d0)))


def _stage_tile(e: _Body, kind: str, src: SSAValue, tile: SSAValue, k, b, g, t0, t1) -> None:
    """tile[t - t0, n] = src[b, [g,] n, t] for t in [t0, t1): a tile of B or C, transposed."""

    def row(t: SSAValue) -> None:
        r = e.op(arith.SubiOp, t, t0, hint="r")
        _for(k["c0"], k["cN"], k["c1"], "n", lambda n: memref.StoreOp.get(
            e.load(src, [b, n, t] if kind == "shared" else [b, g, n, t], "bc"), tile, [r, n]))

    _for(t0, t1, k["c1"], "t", row)


def _tiled_channel(e: _Body, spec, v, k, b, d, d0, t0, t1, state, states, staged, per, scalef) -> None:
    """Channel d over the tile [t0, t1): stage the tiles when d starts the chunk (or a
    new group), load its state, run the recurrence, keep its state."""
    group = {name: e.op(arith.DivUIOp, d, p, hint=f"g{name}") for name, p in per.items()}
    first = _named(arith.CmpiOp(d, d0, "eq").result, "first")
    for name, tile in staged.items():
        kind = spec.b_kind if name == "B" else spec.c_kind
        when = first
        if kind == "grouped":  # the chunk may cross a group boundary
            starts = _named(arith.CmpiOp(e.op(arith.RemUIOp, d, per[name], hint="dg"), k["c0"], "eq").result, "gs")
            when = e.op(arith.OrIOp, first, starts, hint="stage")
        then = Block()
        with ImplicitBuilder(then):
            _stage_tile(e, kind, v[name], tile, k, b, group.get(name), t0, t1)
            scf.YieldOp()
        scf.IfOp(when, [], Region(then))
    r = e.op(arith.SubiOp, d, d0, hint="r")
    _for(k["c0"], k["cN"], k["c1"], "n", lambda n: memref.StoreOp.get(e.load(states, [r, n], "v"), state, [n]))
    bd = e.load(v["bias"], [d], "bd") if spec.has_bias else None
    dd = e.load(v["Dskip"], [d], "dd") if spec.has_d else None
    read = {name: _tile_reader(spec.b_kind if name == "B" else spec.c_kind, v[name], staged.get(name), d, t0)
            for name in ("B", "C")}
    state_type = memref_of((spec.n,), "f32")
    coeffs = _coeffs(e, spec, v, k, b, d, bd, read["B"], fused=True, scalef=scalef)
    emit = _tiled_emit(e, spec, v, k, state_type, b, d, dd, read["C"], scalef)
    rec = scan.RecurrenceOp(t0, t1, k["c1"], state, coeffs, emit)
    rec.attributes[BLOCKED_DOT_MARK] = UnitAttr()  # C . S may be reduced a time block at a time
    _for(k["c0"], k["cN"], k["c1"], "n", lambda n: memref.StoreOp.get(e.load(state, [n], "v"), states, [r, n]))


def _tile_reader(kind: str, src: SSAValue, tile: SSAValue | None, d: SSAValue, t0: SSAValue):
    """(memref, indices of step i and state index n) of B or C: the staged tile at
    [i - t0, n], or the (D, N) array at [d, n]."""
    if kind == "const":
        return lambda e, i, n: (src, [d, n])
    return lambda e, i, n: (tile, [e.op(arith.SubiOp, i, t0, hint="ti"), n])


def _tiled_emit(e: _Body, spec, v, k, state_type, b, d, dd, read, scalef: bool) -> Region:
    """`_emit_region`'s output with C read through `read`, silu's exp in the fused form."""
    block = Block(arg_types=[IndexType(), state_type])
    i, s = block.args
    i.name_hint, s.name_hint = "i", "s"
    with ImplicitBuilder(block):
        red = Block(arg_types=[IndexType(), e.el])
        n, acc = red.args
        n.name_hint, acc.name_hint = "n", "acc"
        with ImplicitBuilder(red):
            hv = e.load(s, [n], "hv")
            cv = e.load(*read(e, i, n), "cv")
            pr = e.op(arith.MulfOp, hv, cv, hint="pr")
            scf.YieldOp(e.op(arith.AddfOp, acc, pr, hint="acc2"))
        y = _named(scf.ForOp(k["c0"], k["cN"], k["c1"], [k["zero"]], Region(red)).results[0], "y")
        store_output(e, spec, v, k, y, dd, b, d, i, fused=True, scalef=scalef)
        scan.YieldOp()
    return Region(block)
