"""Known recurrences written the plain way, as `scf.for` loops over memrefs.

Each builder returns a `ModuleOp` holding one `func.func` whose arguments are memrefs
(inputs first, outputs last; outputs are written in place).  They are the inputs of
`scanweaver-raise` and, interpreted, the golden loop semantics; `reference.py` holds a
numpy float64 version of each.

    selective_scan_loops  Mamba's selective scan (shared/DESIGN.md §2)        func @selective_scan
    ema_loops             y = a*y + (1-a)*x, scalar iter_args          func @ema
    discounted_return_loops  G_t = r_t + gamma*G_{t+1}, reverse, state in g[c]   @discounted_return
    reset_loops           h = a*(done ? 0 : h) + x, inner channel loop  func @reset
    iir2_loops            y_t = c1*y_{t-1} + c2*y_{t-2} + x_t (coupled) func @iir2
    cumsum_loops / cumprod_loops  (f32, f64, i32, i64)                 func @cumsum / @cumprod
    shifted_recurrence_loops  y[c,t] = a[c,t]*y[c,t-1] + x[c,t], state in y at t-1
                          (reverse: y[c,t+1])                       func @shifted_recurrence
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import (
    BFloat16Type,
    ComplexType,
    Float16Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    MemRefType,
    ModuleOp,
    f16,
    f32,
    f64,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Region, SSAValue

from scanweaver.errors import ScanWeaverError

DTYPES: dict[str, Attribute] = {
    "f32": f32,
    "f64": f64,
    "f16": f16,
    "bf16": BFloat16Type(),
    "i32": i32,
    "i64": i64,
    "complex<f32>": ComplexType(f32),
    "complex<f64>": ComplexType(f64),
}


def element_type(dtype: str) -> Attribute:
    if dtype not in DTYPES:
        raise ScanWeaverError(f"unknown dtype '{dtype}' (expected one of {list(DTYPES)})")
    return DTYPES[dtype]


# ---------------------------------------------------------------------------
# Small building helpers (used inside an ImplicitBuilder)
# ---------------------------------------------------------------------------


def idx(v: int) -> SSAValue:
    return arith.ConstantOp(IntegerAttr(v, IndexType())).result


def const(v: float | int, t: Attribute) -> SSAValue:
    attr = IntegerAttr(int(v), t) if isinstance(t, IntegerType) else FloatAttr(v, t)
    return arith.ConstantOp(attr).result


def load(m: SSAValue, *indices: SSAValue) -> SSAValue:
    return memref.LoadOp.get(m, indices).res


def store(v: SSAValue, m: SSAValue, *indices: SSAValue) -> None:
    memref.StoreOp.get(v, m, indices)


def _is_int(v: SSAValue) -> bool:
    return isinstance(v.type, IntegerType | IndexType)


def add(x: SSAValue, y: SSAValue) -> SSAValue:
    return (arith.AddiOp if _is_int(x) else arith.AddfOp)(x, y).result


def sub(x: SSAValue, y: SSAValue) -> SSAValue:
    return (arith.SubiOp if _is_int(x) else arith.SubfOp)(x, y).result


def mul(x: SSAValue, y: SSAValue) -> SSAValue:
    return (arith.MuliOp if _is_int(x) else arith.MulfOp)(x, y).result


def div(x: SSAValue, y: SSAValue) -> SSAValue:
    return arith.DivfOp(x, y).result


def exp(x: SSAValue) -> SSAValue:
    return mathd.ExpOp(x).result


def for_(
    lb: int | SSAValue,
    ub: int | SSAValue,
    body: Callable[..., Sequence[SSAValue] | None],
    iter_args: Sequence[SSAValue] = (),
    iv_name: str = "i",
) -> tuple[SSAValue, ...]:
    """`scf.for %i = lb to ub step 1`; `body(i, *carried)` returns the yielded values."""
    block = Block(arg_types=[IndexType(), *(a.type for a in iter_args)])
    block.args[0].name_hint = iv_name
    with ImplicitBuilder(block):
        out = body(*block.args) or ()
        scf.YieldOp(*out)
    lo = idx(lb) if isinstance(lb, int) else lb
    hi = idx(ub) if isinstance(ub, int) else ub
    loop = scf.ForOp(lo, hi, idx(1), list(iter_args), Region(block))
    return tuple(loop.results)


def function(
    name: str,
    args: Sequence[tuple[str, Attribute]],
    body: Callable[..., SSAValue | Sequence[SSAValue] | None],
    results: Sequence[Attribute] = (),
) -> ModuleOp:
    """A module with `func.func @name(args) -> results`; `body(*args)` returns results."""
    block = Block(arg_types=[t for _, t in args])
    for a, (arg_name, _) in zip(block.args, args):
        a.name_hint = arg_name
    with ImplicitBuilder(block):
        out = body(*block.args)
        if isinstance(out, SSAValue):
            out = [out]
        func.ReturnOp(*(out or ()))
    fn = func.FuncOp(name, ([t for _, t in args], list(results)), Region(block))
    return ModuleOp([fn])


def mref(t: Attribute, *shape: int) -> MemRefType:
    return MemRefType(t, list(shape))


# ---------------------------------------------------------------------------
# Mamba selective scan
# ---------------------------------------------------------------------------


def selective_scan_loops(
    batch: int,
    D: int,
    L: int,
    N: int,
    *,
    bc: str = "constant",
    groups: int = 1,
    with_D: bool = True,
    with_z: bool = True,
    with_delta_bias: bool = True,
    delta_softplus: bool = True,
    dtype: str = "f32",
    return_last_state: bool = False,
) -> ModuleOp:
    """shared/DESIGN.md §2 as loops.  Arguments, in order (all memrefs of `dtype`):
    u, delta (batch,D,L); A (D,N); B, C (D,N) | (batch,N,L) | (batch,G,N,L);
    [D_skip (D,)]; [z (batch,D,L)]; [delta_bias (D,)]; out (batch,D,L);
    [last_state (batch,D,N)].  Math runs in f32 (f64 for dtype f64)."""
    if bc not in ("constant", "shared", "grouped"):
        raise ScanWeaverError(f"bc must be constant, shared or grouped, got '{bc}'")
    if bc == "grouped" and (groups < 1 or D % groups):
        raise ScanWeaverError(f"groups={groups} must divide D={D}")
    io = element_type(dtype)
    bc_shape = {"constant": (D, N), "shared": (batch, N, L), "grouped": (batch, groups, N, L)}[bc]
    args = [
        ("u", mref(io, batch, D, L)),
        ("delta", mref(io, batch, D, L)),
        ("A", mref(io, D, N)),
        ("B", mref(io, *bc_shape)),
        ("C", mref(io, *bc_shape)),
    ]
    args += [("D_skip", mref(io, D))] if with_D else []
    args += [("z", mref(io, batch, D, L))] if with_z else []
    args += [("delta_bias", mref(io, D))] if with_delta_bias else []
    args += [("out", mref(io, batch, D, L))]
    args += [("last_state", mref(io, batch, D, N))] if return_last_state else []
    names = [n for n, _ in args]
    loops = _SelectiveLoops(
        batch, D, L, N, bc, D // groups if bc == "grouped" else 1, io,
        with_D, with_z, with_delta_bias, delta_softplus, return_last_state,
    )

    def body(*vals: SSAValue) -> None:
        loops.a = dict(zip(names, vals))
        for_(0, batch, loops.over_channels, iv_name="b")

    return function("selective_scan", args, body)


@dataclass
class _SelectiveLoops:
    """The loop nest of `selective_scan_loops`, one method per level:
    batch -> channel (state alloca, time loop, last state) -> time step (dt, state
    loop, output) -> state element (decay, drive, C reduction)."""

    batch: int
    D: int
    L: int
    N: int
    bc: str
    per_group: int
    io: Attribute
    with_D: bool
    with_z: bool
    with_delta_bias: bool
    delta_softplus: bool
    return_last_state: bool
    a: dict[str, SSAValue] = field(default_factory=dict)  # the function's arguments by name

    @property
    def ct(self) -> Attribute:
        """The compute type: f64 for f64 data, else f32."""
        return f64 if self.io == f64 else f32

    @property
    def low(self) -> bool:
        """16-bit data: extended to f32 on load, truncated on store."""
        return isinstance(self.io, Float16Type | BFloat16Type)

    def ld(self, m: SSAValue, *ix: SSAValue) -> SSAValue:
        v = load(m, *ix)
        return arith.ExtFOp(v, self.ct).result if self.low else v

    def st(self, v: SSAValue, m: SSAValue, *ix: SSAValue) -> None:
        store(arith.TruncFOp(v, self.io).result if self.low else v, m, *ix)

    def bc_load(self, m: SSAValue, b: SSAValue, d: SSAValue, n: SSAValue, t: SSAValue) -> SSAValue:
        if self.bc == "constant":
            return self.ld(m, d, n)
        if self.bc == "shared":
            return self.ld(m, b, n, t)
        g = arith.DivUIOp(d, idx(self.per_group)).result
        return self.ld(m, b, g, n, t)

    def over_channels(self, b: SSAValue) -> None:
        for_(0, self.D, lambda d: self.channel(b, d), iv_name="d")

    def channel(self, b: SSAValue, d: SSAValue) -> None:
        """h = 0; the time loop; [last_state[b, d, :] = h]."""
        h = memref.AllocaOp.get(self.ct, shape=[self.N]).memref
        h.name_hint = "h"
        zero = const(0.0, self.ct)
        for_(0, self.N, lambda n: store(zero, h, n), iv_name="n")
        for_(0, self.L, lambda t: self.step(b, d, t, h), iv_name="t")
        if self.return_last_state:
            for_(0, self.N, lambda n: self.st(load(h, n), self.a["last_state"], b, d, n), iv_name="n")

    def delta(self, b: SSAValue, d: SSAValue, t: SSAValue) -> SSAValue:
        """dt = delta[b, d, t] (+ delta_bias[d]), through softplus when asked."""
        dt = self.ld(self.a["delta"], b, d, t)
        if self.with_delta_bias:
            dt = add(dt, self.ld(self.a["delta_bias"], d))
        if self.delta_softplus:
            soft = mathd.Log1pOp(exp(dt)).result
            big = arith.CmpfOp(dt, const(20.0, self.ct), "ogt").result
            dt = arith.SelectOp(big, dt, soft).result
        return dt

    def step(self, b: SSAValue, d: SSAValue, t: SSAValue, h: SSAValue) -> None:
        """One time step: update every state element, then out[b, d, t]."""
        u = self.ld(self.a["u"], b, d, t)
        dt = self.delta(b, d, t)
        dtu = mul(dt, u)

        def state(n: SSAValue, acc: SSAValue) -> list[SSAValue]:
            hn = load(h, n)
            decay = exp(mul(dt, self.ld(self.a["A"], d, n)))
            drive = mul(dtu, self.bc_load(self.a["B"], b, d, n, t))
            hnew = add(mul(decay, hn), drive)
            store(hnew, h, n)
            return [add(acc, mul(hnew, self.bc_load(self.a["C"], b, d, n, t)))]

        (y,) = for_(0, self.N, state, [const(0.0, self.ct)], iv_name="n")
        self.output(y, u, b, d, t)

    def output(self, y: SSAValue, u: SSAValue, b: SSAValue, d: SSAValue, t: SSAValue) -> None:
        """out[b, d, t] = y [+ D_skip[d] * u], [times silu(z) = z * sigmoid(z)]."""
        if self.with_D:
            y = add(y, mul(self.ld(self.a["D_skip"], d), u))
        if self.with_z:
            z = self.ld(self.a["z"], b, d, t)
            sig = div(const(1.0, self.ct), add(const(1.0, self.ct), exp(arith.NegfOp(z).result)))
            y = mul(y, mul(z, sig))
        self.st(y, self.a["out"], b, d, t)


# ---------------------------------------------------------------------------
# Small recurrences
# ---------------------------------------------------------------------------


def ema_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@ema(x (C,L), alpha (C,), h0 (C,), y (C,L), hT (C,)):
    h = alpha*h + (1-alpha)*x[c,t]; y[c,t] = h — the state is a scalar iter_arg."""
    t = element_type(dtype)

    def body(x, alpha, h0, y, hT):
        def chan(c):
            al = load(alpha, c)
            beta = sub(const(1, t), al)

            def step(i, h):
                hn = add(mul(al, h), mul(beta, load(x, c, i)))
                store(hn, y, c, i)
                return [hn]

            (last,) = for_(0, L, step, iv_name="t", iter_args=[load(h0, c)])
            store(last, hT, c)

        for_(0, channels, chan, iv_name="c")

    args = [("x", mref(t, channels, L)), ("alpha", mref(t, channels)),
            ("h0", mref(t, channels)), ("y", mref(t, channels, L)), ("hT", mref(t, channels))]
    return function("ema", args, body)


def discounted_return_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@discounted_return(r (C,L), gamma (C,), g (C,), G (C,L)): reverse in time,
    G[c,t] = r[c,t] + gamma[c]*G[c,t+1]; the state lives in memory at g[c] (initial
    value in, last value out)."""
    t = element_type(dtype)

    def body(r, gamma, g, G):
        def chan(c):
            gm = load(gamma, c)

            def step(i):
                tt = sub(idx(L - 1), i)
                gn = add(load(r, c, tt), mul(gm, load(g, c)))
                store(gn, g, c)
                store(gn, G, c, tt)

            for_(0, L, step, iv_name="t")

        for_(0, channels, chan, iv_name="c")

    args = [("r", mref(t, channels, L)), ("gamma", mref(t, channels)),
            ("g", mref(t, channels)), ("G", mref(t, channels, L))]
    return function("discounted_return", args, body)


def reset_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@reset(x (L,C), a (L,C), done (L,) i32, h (C,), y (L,C)): time outer, channels
    inner: h[c] = a[t,c]*(done[t] ? 0 : h[c]) + x[t,c]; y[t,c] = h[c]."""
    t = element_type(dtype)

    def body(x, a, done, h, y):
        def step(i):
            flag = arith.CmpiOp(load(done, i), const(0, i32), "ne").result

            def chan(c):
                kept = arith.SelectOp(flag, const(0, t), load(h, c)).result
                hn = add(mul(load(a, i, c), kept), load(x, i, c))
                store(hn, h, c)
                store(load(h, c), y, i, c)

            for_(0, channels, chan, iv_name="c")

        for_(0, L, step, iv_name="t")

    args = [("x", mref(t, L, channels)), ("a", mref(t, L, channels)),
            ("done", mref(i32, L)), ("h", mref(t, channels)), ("y", mref(t, L, channels))]
    return function("reset", args, body)


def iir2_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@iir2(x (C,L), c1 (C,), c2 (C,), y (C,L)): y_t = c1*y_{t-1} + c2*y_{t-2} + x_t
    from zero state, carried as two coupled iter_args (y_{t-1}, y_{t-2})."""
    t = element_type(dtype)

    def body(x, c1, c2, y):
        def chan(c):
            k1, k2 = load(c1, c), load(c2, c)

            def step(i, y1, y2):
                yn = add(add(mul(k1, y1), mul(k2, y2)), load(x, c, i))
                store(yn, y, c, i)
                return [yn, y1]

            zero = const(0, t)
            for_(0, L, step, iv_name="t", iter_args=[zero, zero])

        for_(0, channels, chan, iv_name="c")

    args = [("x", mref(t, channels, L)), ("c1", mref(t, channels)),
            ("c2", mref(t, channels)), ("y", mref(t, channels, L))]
    return function("iir2", args, body)


def _prefix_loops(name: str, channels: int, L: int, dtype: str, product: bool) -> ModuleOp:
    t = element_type(dtype)

    def body(x, y):
        def chan(c):
            def step(i, s):
                sn = (mul if product else add)(s, load(x, c, i))
                store(sn, y, c, i)
                return [sn]

            for_(0, L, step, iv_name="t", iter_args=[const(1 if product else 0, t)])

        for_(0, channels, chan, iv_name="c")

    return function(name, [("x", mref(t, channels, L)), ("y", mref(t, channels, L))], body)


def cumsum_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@cumsum(x (C,L), y (C,L)): y[c,t] = sum_{s<=t} x[c,s] (integers wrap)."""
    return _prefix_loops("cumsum", channels, L, dtype, product=False)


def cumprod_loops(channels: int, L: int, dtype: str = "f32") -> ModuleOp:
    """@cumprod(x (C,L), y (C,L)): y[c,t] = prod_{s<=t} x[c,s] (integers wrap)."""
    return _prefix_loops("cumprod", channels, L, dtype, product=True)


def shifted_recurrence_loops(
    channels: int, L: int, reverse: bool = False, dtype: str = "f32"
) -> ModuleOp:
    """@shifted_recurrence(a (C,L), x (C,L), y (C,L)): the state is carried through
    memory at a shifted index.  Forward: for t in 1..L-1,
    y[c,t] = a[c,t]*y[c,t-1] + x[c,t] (y[c,0] is the initial state).  Reverse: for
    i in 0..L-2, t = L-2-i, y[c,t] = a[c,t]*y[c,t+1] + x[c,t] (y[c,L-1] initial)."""
    t = element_type(dtype)

    def body(a, x, y):
        def chan(c):
            def step(i):
                if reverse:
                    tt = sub(idx(L - 2), i)
                    prev = add(tt, idx(1))
                else:
                    tt = i
                    prev = sub(i, idx(1))
                yn = add(mul(load(a, c, tt), load(y, c, prev)), load(x, c, tt))
                store(yn, y, c, tt)

            if reverse:
                for_(0, max(L - 1, 0), step, iv_name="i")
            else:
                for_(1, L, step, iv_name="t")

        for_(0, channels, chan, iv_name="c")

    args = [("a", mref(t, channels, L)), ("x", mref(t, channels, L)),
            ("y", mref(t, channels, L))]
    return function("shifted_recurrence", args, body)
