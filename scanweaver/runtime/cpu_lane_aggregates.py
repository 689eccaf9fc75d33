"""The sub-chunk aggregates of the cache-blocked chunked scan (cpu_chunk_blocks.py)
without the tiles' transposes: `@aggregate` with the chunk-aggregate kernel's
arguments and outputs (wide mode: A = A_m * 2^E, E, B in f64), for blocks of exactly
LANES sub-chunks per row.

Lane j of every vector is sub-chunk j.  Each step of the loop reads eight consecutive
f32 steps of every sub-chunk (one vector per sub-chunk, a contiguous load; lane j
SKEW_GROUPS groups behind lane j - 1), widens them to f64, and combines them in a tree
of shuffles: pairs of steps, then fours, so that after two levels the vectors hold the
aggregates of each sub-chunk's first and last four steps, one sub-chunk per lane.
Those two are applied to the lane's running (A, B) in time order (from the end when
reversed).  The tile kernel instead transposes
8x8 blocks of a and b and takes eight lane-wise steps, each a dependent multiply and
add: here there is no transpose and a quarter of the chain.

Numerics (README, Numerics: the chunk aggregates in f64): the same quantities in
another association, every operation in f64.  The product of two f32 is exact in f64,
the product of four a normal f64 (|a| < 2^128, nonzero |a| >= 2^-149) or zero, inf or
NaN where an input is; B is combined with those true products of at most four steps,
as the sequential aggregate multiplies by one step, so it never forms a product of a
that the per-step form would not.  The running product is kept as a mantissa in
[1, 2) times the fours' mantissas, its exponents summed in E (i64).  Where the inputs
hold Inf/NaN or B overflows the result is not finite, and the driver scans that block
sequentially (as before).
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

from llvmlite import ir

from scanweaver.runtime.cpu_jit import on_clear_cache

#: Sub-chunks per block row: the lanes of a vector of f64.
LANES = 8
#: Lane j runs SKEW_GROUPS groups of eight steps behind lane j - 1 (lanes out of their
#: sub-chunk take the identity).  The sub-chunks of a block are a power-of-two multiple
#: of 4 KiB apart, so unskewed the 16 streams of a and b fall on the same L1 sets and
#: their lines evict each other.  Measured here (one thread, thread CPU time, one call
#: over 64 blocks of 8 x 8192 steps from memory, medians of 21 interleaved rounds, load
#: 5-6 on 2 cores): 0.43-0.45 ns per step unskewed, 0.38-0.39 at 2, 0.35-0.38 at 6;
#: from L2 0.33-0.35 at every skew (the tiles' aggregate kernel: 0.47-0.49 either way).
SKEW_GROUPS = 6
#: Tried and not kept (same measurement): 256-bit vectors (the <8 x double> split in two,
#: 0.59 -> 0.75 ns per step from L2); software prefetch 128 to 2048 steps ahead in
#: every stream (no gain unskewed: the hardware prefetcher keeps up).
_NAME = "aggregate"

_VOID, _I32, _I64 = ir.VoidType(), ir.IntType(32), ir.IntType(64)
_F32, _F64, _PTR = ir.FloatType(), ir.DoubleType(), ir.PointerType()
_VF, _VD, _VI = ir.VectorType(_F32, LANES), ir.VectorType(_F64, LANES), ir.VectorType(_I64, LANES)


def _i64(v: int) -> ir.Constant:
    return ir.Constant(_I64, v)


def _splat(t: ir.VectorType, v) -> ir.Constant:
    return ir.Constant(t, [v] * t.count)


def _mask(idx) -> ir.Constant:
    return ir.Constant(ir.VectorType(_I32, LANES), list(idx))


#: The tree's shuffles, as pairs (earlier steps, later steps) of masks over two vectors:
#: first the even and odd f64 of every 128-bit block (unpcklpd / unpckhpd), then the even
#: and odd 128-bit blocks (vshuff64x2).  Both take two sources and write a third, so no
#: register copies (the even/odd lanes of the whole vector, vpermt2pd, overwrite a source:
#: a copy per shuffle pair).  Lane layouts: see `_group_step`.
_WITHIN_BLOCKS = (_mask([0, 8, 2, 10, 4, 12, 6, 14]), _mask([1, 9, 3, 11, 5, 13, 7, 15]))
_OF_BLOCKS = (_mask([0, 1, 4, 5, 8, 9, 12, 13]), _mask([2, 3, 6, 7, 10, 11, 14, 15]))


def _memref_params(prefix: str, rank: int) -> dict[str, ir.Type]:
    names = ["alloc", "ptr", "off"] + [f"size{i}" for i in range(rank)] + [f"stride{i}" for i in range(rank)]
    return {f"{prefix}_{n}": (_PTR if n in ("alloc", "ptr") else _I64) for n in names}


def _declare(module: ir.Module) -> SimpleNamespace:
    fma = ir.Function(module, ir.FunctionType(_VD, [_VD, _VD, _VD]), "llvm.fma.v8f64")
    smin = ir.Function(module, ir.FunctionType(_VI, [_VI, _VI]), "llvm.smin.v8i64")
    smax = ir.Function(module, ir.FunctionType(_VI, [_VI, _VI]), "llvm.smax.v8i64")
    return SimpleNamespace(fma=fma, smin=smin, smax=smax)


def _exponent_split(bld: ir.IRBuilder, f: SimpleNamespace, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(2^-k, k) per lane, k the unbiased exponent of x clamped to [-1023, 1022], as
    cpu_aggregate_arith's: x * 2^-k is exact, in [1, 2) for normal x; 0 stays 0, inf
    and NaN stay non-finite."""
    bits = bld.bitcast(x, _VI)
    field = bld.and_(bld.lshr(bits, _splat(_VI, 52)), _splat(_VI, 0x7FF))
    k = bld.sub(field, _splat(_VI, 1023))
    k = bld.call(f.smax, [bld.call(f.smin, [k, _splat(_VI, 1022)]), _splat(_VI, -1023)])
    inv = bld.bitcast(bld.shl(bld.sub(_splat(_VI, 1023), k), _splat(_VI, 52)), _VD)
    return inv, k


def _combine(bld: ir.IRBuilder, f: SimpleNamespace, first: tuple, then: tuple) -> tuple[ir.Value, ir.Value]:
    """(A, B) of `first` followed by `then` (lane-wise): (A1 A2, A2 B1 + B2)."""
    return bld.fmul(first[0], then[0]), bld.call(f.fma, [then[0], first[1], then[1]])


def _split(bld: ir.IRBuilder, u: tuple, v: tuple, masks: tuple) -> tuple[tuple, tuple]:
    """((A, B) of the earlier steps, (A, B) of the later ones) picked from u and v."""
    return tuple(tuple(bld.shuffle_vector(x, y, m) for x, y in zip(u, v)) for m in masks)


def _pair_level(bld: ir.IRBuilder, f: SimpleNamespace, u: tuple, v: tuple, masks: tuple, reverse: bool) -> tuple:
    """The earlier and later steps that `masks` pick from u and v combined, in scan order."""
    early, late = _split(bld, u, v, masks)
    return _combine(bld, f, late, early) if reverse else _combine(bld, f, early, late)


def _skewed_group(bld: ir.IRBuilder, x: SimpleNamespace, i: ir.Value, j: int, reverse: bool):
    """Sub-chunk j's vector at iteration i: (its first step, whether it is in range):
    group i - j*SKEW_GROUPS in scan order (a group in range when out of it)."""
    g = bld.sub(i, _i64(j * SKEW_GROUPS))
    live = bld.icmp_unsigned("<", g, x.groups)  # a negative g wraps past the groups
    g = bld.select(live, g, _i64(0))
    if reverse:
        g = bld.sub(bld.sub(x.groups, _i64(1)), g)
    return bld.mul(g, _i64(LANES)), live


def _group_step(bld: ir.IRBuilder, f: SimpleNamespace, x: SimpleNamespace, i: ir.Value, acc: list, reverse: bool):
    """Iteration i: eight steps of every sub-chunk in range (`_skewed_group`) applied
    to the running (A_m, E, B); the others take the identity (1, -0.0) and keep theirs."""
    pairs = []
    ident = (_splat(_VD, 1.0), _splat(_VD, -0.0))
    for j in range(LANES):
        t, live = _skewed_group(bld, x, i, j, reverse)
        off = bld.add(bld.mul(x.sub, _i64(j)), t)
        loads = [bld.load(bld.gep(p, [off], source_etype=_F32), align=4, typ=_VF) for p in (x.pa, x.pb)]
        pairs.append(tuple(bld.select(live, bld.fpext(v, _VD), e) for v, e in zip(loads, ident)))
    # Sub-chunks x, y (vectors j, j + 1; lane = step): pairs of steps, lanes
    # [x01 y01 x23 y23 x45 y45 x67 y67]; with z, w: fours, [x0-3 y0-3 x4-7 y4-7 z0-3 w0-3
    # z4-7 w4-7]; then the first and the last four steps of sub-chunk j in lane j.
    twos = [_pair_level(bld, f, pairs[i], pairs[i + 1], _WITHIN_BLOCKS, reverse) for i in range(0, LANES, 2)]
    fours = [_pair_level(bld, f, twos[i], twos[i + 1], _OF_BLOCKS, reverse) for i in range(0, len(twos), 2)]
    ev, od = _split(bld, fours[0], fours[1], _OF_BLOCKS)  # steps [t, t+4), [t+4, t+8)
    am, e, bacc = acc
    for four in ((od, ev) if reverse else (ev, od)):
        bacc = bld.call(f.fma, [four[0], bacc, four[1]])
    # The running mantissa renormalised from its value here (off the B chain), times
    # the fours' mantissas (in [1, 2) each: their product below 8).
    parts = [_exponent_split(bld, f, v) for v in (am, ev[0], od[0])]
    mant = bld.fmul(bld.fmul(ev[0], parts[1][0]), bld.fmul(od[0], parts[2][0]))
    am = bld.fmul(bld.fmul(am, parts[0][0]), mant)
    for _, k in parts:
        e = bld.add(e, k)
    return [am, e, bacc]


def _single_step(bld: ir.IRBuilder, f: SimpleNamespace, x: SimpleNamespace, t: ir.Value, acc: list, reverse: bool):
    """Step t of every sub-chunk (the steps past the last group of eight): a gather."""
    vecs = []
    for p in (x.pa, x.pb):
        v = ir.Constant(_VF, None)
        for j in range(LANES):
            off = bld.add(bld.mul(x.sub, _i64(j)), t)
            v = bld.insert_element(v, bld.load(bld.gep(p, [off], source_etype=_F32), typ=_F32), _I32(j))
        vecs.append(bld.fpext(v, _VD))
    am, e, bacc = acc
    inv, k = _exponent_split(bld, f, vecs[0])
    return [bld.fmul(am, bld.fmul(vecs[0], inv)), bld.add(e, k), bld.call(f.fma, [vecs[0], bacc, vecs[1]])]


def _counted_loop(fn: ir.Function, bld: ir.IRBuilder, count: ir.Value, acc: list, body, name: str) -> list:
    """`for i in range(count): acc = body(bld, i, acc)`; returns the final acc (bld at the exit)."""
    pre = bld.block
    head, loop, done = (fn.append_basic_block(f"{name}_{s}") for s in ("head", "body", "done"))
    bld.branch(head)
    bld.position_at_end(head)
    i = bld.phi(_I64, name=f"{name}_i")
    phis = [bld.phi(v.type) for v in acc]
    bld.cbranch(bld.icmp_unsigned("<", i, count), loop, done)
    bld.position_at_end(loop)
    new = body(bld, i, list(phis))
    i1 = bld.add(i, _i64(1))
    end = bld.block
    bld.branch(head)
    i.add_incoming(_i64(0), pre)
    i.add_incoming(i1, end)
    for phi, v0, v1 in zip(phis, acc, new):
        phi.add_incoming(v0, pre)
        phi.add_incoming(v1, end)
    bld.position_at_end(done)
    return list(phis)


def _row_aggregates(fn, bld, f, x, reverse: bool) -> list:
    """The LANES aggregates of the row at x.pa, x.pb (sub-chunks x.Lc steps apart)."""
    groups = bld.udiv(x.Lc, _i64(LANES))
    main = bld.mul(groups, _i64(LANES))
    rest = bld.sub(x.Lc, main)
    acc = [_splat(_VD, 1.0), _splat(_VI, 0), _splat(_VD, 0.0)]

    x.groups = groups
    # With the lanes skewed, groups + 7 * SKEW_GROUPS iterations (none without a group).
    iters = bld.select(bld.icmp_unsigned("==", groups, _i64(0)), _i64(0),
                       bld.add(groups, _i64((LANES - 1) * SKEW_GROUPS)))

    def group(b, i, a):
        return _group_step(b, f, x, i, a, reverse)

    def single(b, i, a):
        t = b.sub(b.sub(x.Lc, _i64(1)), i) if reverse else b.add(main, i)
        return _single_step(b, f, x, t, a, reverse)

    if reverse:  # the steps past the last group come first
        acc = _counted_loop(fn, bld, rest, acc, single, "rest")
        return _counted_loop(fn, bld, iters, acc, group, "groups")
    acc = _counted_loop(fn, bld, iters, acc, group, "groups")
    return _counted_loop(fn, bld, rest, acc, single, "rest")


def aggregate_ir(reverse: bool) -> str:
    """`void @aggregate(a, b, A, E, B)`: memrefs a, b (R, LANES, Lc) f32 (innermost
    stride 1), A, E, B (R, LANES) f64, i64, f64 with innermost stride 1, in the
    expanded MLIR convention (the chunk-aggregate kernel's signature)."""
    module = ir.Module(name="lane_aggregate")
    f = _declare(module)
    params = {**_memref_params("a", 3), **_memref_params("b", 3)}
    for out in "AEB":
        params.update(_memref_params(out, 2))
    fn = ir.Function(module, ir.FunctionType(_VOID, list(params.values())), _NAME)
    args = SimpleNamespace(**{n: arg for arg, n in zip(fn.args, params)})
    bld = ir.IRBuilder(fn.append_basic_block("entry"))
    base = [bld.gep(getattr(args, f"{p}_ptr"), [getattr(args, f"{p}_off")], source_etype=t)
            for p, t in (("a", _F32), ("b", _F32), ("A", _F64), ("E", _I64), ("B", _F64))]

    def row(b, r, _acc):
        pa, pb = (b.gep(base[i], [b.mul(r, getattr(args, f"{p}_stride0"))], source_etype=_F32)
                  for i, p in ((0, "a"), (1, "b")))
        x = SimpleNamespace(pa=pa, pb=pb, sub=args.a_stride1, Lc=args.a_size2)
        res = _row_aggregates(fn, b, f, x, reverse)
        for i, (p, v) in enumerate(zip("AEB", res)):
            t = _I64 if p == "E" else _F64
            q = b.gep(base[2 + i], [b.mul(r, getattr(args, f"{p}_stride0"))], source_etype=t)
            b.store(v, q, align=8)
        return []

    _counted_loop(fn, bld, args.a_size0, [], row, "rows")
    bld.ret_void()
    return str(module)


@functools.lru_cache(maxsize=None)
def lane_aggregate_kernel(reverse: bool):
    """The compiled `@aggregate` (a `Kernel` of ranks (3, 3, 2, 2, 2))."""
    from scanweaver.runtime.cpu import CpuProgram
    from scanweaver.runtime.cpu_jit import Kernel

    return Kernel(CpuProgram(aggregate_ir(reverse)), _NAME, [3, 3, 2, 2, 2])


on_clear_cache(lane_aggregate_kernel.cache_clear)
