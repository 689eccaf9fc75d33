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

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import (
    BFloat16Type,
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
    ct = f64 if dtype == "f64" else f32
    low = isinstance(io, Float16Type | BFloat16Type)
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

    def ld(m: SSAValue, *ix: SSAValue) -> SSAValue:
        v = load(m, *ix)
        return arith.ExtFOp(v, ct).result if low else v

    def st(v: SSAValue, m: SSAValue, *ix: SSAValue) -> None:
        store(arith.TruncFOp(v, io).result if low else v, m, *ix)

    def body(*vals: SSAValue) -> None:
        a = dict(zip(names, vals))
        per_group = D // groups if bc == "grouped" else 1

        def bc_load(m: SSAValue, b: SSAValue, d: SSAValue, n: SSAValue, t: SSAValue):
            if bc == "constant":
                return ld(m, d, n)
            if bc == "shared":
                return ld(m, b, n, t)
            g = arith.DivUIOp(d, idx(per_group)).result
            return ld(m, b, g, n, t)

        def over_d(b: SSAValue) -> None:
            def channel(d: SSAValue) -> None:
                h = memref.AllocaOp.get(ct, shape=[N]).memref
                h.name_hint = "h"
                zero = const(0.0, ct)
                for_(0, N, lambda n: store(zero, h, n), iv_name="n")

                def step(t: SSAValue) -> None:
                    u = ld(a["u"], b, d, t)
                    dt = ld(a["delta"], b, d, t)
                    if with_delta_bias:
                        dt = add(dt, ld(a["delta_bias"], d))
                    if delta_softplus:
                        soft = mathd.Log1pOp(exp(dt)).result
                        big = arith.CmpfOp(dt, const(20.0, ct), "ogt").result
                        dt = arith.SelectOp(big, dt, soft).result
                    dtu = mul(dt, u)

                    def state(n: SSAValue, acc: SSAValue) -> list[SSAValue]:
                        hn = load(h, n)
                        decay = exp(mul(dt, ld(a["A"], d, n)))
                        drive = mul(dtu, bc_load(a["B"], b, d, n, t))
                        hnew = add(mul(decay, hn), drive)
                        store(hnew, h, n)
                        return [add(acc, mul(hnew, bc_load(a["C"], b, d, n, t)))]

                    (y,) = for_(0, N, state, [const(0.0, ct)], iv_name="n")
                    if with_D:
                        y = add(y, mul(ld(a["D_skip"], d), u))
                    if with_z:
                        z = ld(a["z"], b, d, t)
                        sig = div(const(1.0, ct), add(const(1.0, ct), exp(arith.NegfOp(z).result)))
                        y = mul(y, mul(z, sig))
                    st(y, a["out"], b, d, t)

                for_(0, L, step, iv_name="t")
                if return_last_state:
                    for_(0, N, lambda n: st(load(h, n), a["last_state"], b, d, n), iv_name="n")

            for_(0, D, channel, iv_name="d")

        for_(0, batch, over_d, iv_name="b")

    return function("selective_scan", args, body)


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
