"""The cache-blocked form of the time-chunked scan, for f32 rows split across threads
(forward and reverse; at least as many rows as threads).

`chunked` (cpu_chunked.py) reads every row twice from memory: all chunk aggregates
first, then every chunk again to scan it.  Here each thread walks its own rows in
blocks of T steps small enough to stay in its core's L2 cache, and per block:
  1. the aggregates of its S sub-chunks (`block_aggregate_kernel`: f64, the product
     renormalised, as in `chunked`, but one sub-chunk per vector lane and eight steps
     combined in a tree, cpu_lane_aggregates.py), read from memory;
  2. the carries sub-chunk to sub-chunk in f64 (`A * c * 2^E + B`, as
     `_carries_if_finite`), each rounded to f32 as a sub-chunk's start;
  3. the sub-chunks scanned from their starts (the loop's own arithmetic), read again
     from L2, h written with streaming stores (`block_scan_kernel`: no read of h's
     lines before they are written); the state entering the next block is the block's
     last h (the loop's f32 state, nothing carried in more precision across blocks).
Where a combine is not finite (Inf/NaN inputs, B or the carry overflows) the whole
block is scanned by the sequential (bit-identical) kernel from the block's carry
instead, as `chunked` does per chunk.  The steps after the last full block are scanned
sequentially too.  So about 12 bytes of memory traffic per step instead of 20.

The loop over blocks is compiled (`driver_ir`, LLVM IR built with llvmlite's IR builder,
calling the three kernels through their addresses with the expanded memref convention):
driving each block from Python costs tens of microseconds per block, about what a
block's work takes.
"""

from __future__ import annotations

import ctypes
import functools
import math
from types import SimpleNamespace

import numpy as np
from llvmlite import ir

from scanweaver.runtime.cpu_jit import on_clear_cache
from scanweaver.runtime.cpu_parallel import parallel_for, split_range

#: Sub-chunks per block (the lanes of the tiles: with R rows, R*S (row, sub-chunk) pairs).
#: The rescan of one row's block is not bound by its one chain of eight lanes: measured
#: here (one thread, thread CPU time, 64 rescans of one 2^16-step block from L2, load
#: 3.7) 16 and 32 sub-chunks took 4-5% and 12-18% longer than 8.
SUB_CHUNKS = 8
#: Bytes of a and b per block and thread: the block's a, b and h stay in a 2 MiB L2.
BLOCK_BYTES = 1 << 20
#: Smallest block (steps): sub-chunks of at least 8 tiles of 8 steps.
MIN_BLOCK_STEPS = SUB_CHUNKS * 64

#: Pieces of rows per thread: each thread takes the next piece when done with one, so a
#: core that another process slows down takes fewer rows (with one piece per thread the
#: call waits for the slowest core's whole share).
TASKS_PER_THREAD = 2

_NAME = "chunk_blocks"
#: The clip of the aggregates' exponents (`_exponents`): beyond it 2^E is 0 or inf anyway.
_EXP_CLIP = 1 << 20

_VOID, _I1, _I32, _I64 = ir.VoidType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
_F32, _F64, _PTR = ir.FloatType(), ir.DoubleType(), ir.PointerType()


def _memref(ptr: ir.Value, sizes: list, strides: list) -> list[ir.Value]:
    """The expanded memref arguments of a (ptr, sizes, strides) view: allocated and
    aligned pointer, offset 0, then the sizes and strides (ints become i64 constants)."""
    dims = [d if isinstance(d, ir.Value) else _i64(d) for d in sizes + strides]
    return [ptr, ptr, _i64(0)] + dims


def _memref_types(rank: int) -> list[ir.Type]:
    return [_PTR, _PTR, _I64] + [_I64] * (2 * rank)


def _kernel_type(*ranks: int) -> ir.PointerType:
    """The pointer to a kernel taking memrefs of these ranks: typed with its function
    type so that llvmlite can call through it (printed as `void (...)*`, which LLVM's
    parser reads as the opaque `ptr`)."""
    params = [t for rank in ranks for t in _memref_types(rank)]
    return ir.PointerType(ir.FunctionType(_VOID, params))


#: aggregate(a, b, A, E, B), scan(a, b, starts, h), seq(a, b, carry, h, last).
_AGG, _SCAN, _SEQ = _kernel_type(3, 3, 2, 2, 2), _kernel_type(3, 3, 2, 3), _kernel_type(2, 2, 1, 2, 1)


def _i64(v: int) -> ir.Constant:
    return ir.Constant(_I64, v)


def _define(module: ir.Module, name: str, ret: ir.Type, params: dict[str, ir.Type], internal: bool = True):
    """A function with named parameters; returns it and its arguments by name."""
    fn = ir.Function(module, ir.FunctionType(ret, list(params.values())), name)
    if internal:
        fn.linkage = "internal"
    for arg, pname in zip(fn.args, params):
        arg.name = pname
    return fn, SimpleNamespace(**dict(zip(params, fn.args)))


def _blocks(fn: ir.Function, names: str) -> SimpleNamespace:
    return SimpleNamespace(**{n: fn.append_basic_block(n) for n in names.split()})


def _seq_part(module: ir.Module) -> ir.Function:
    """The rows' steps [t0, t0 + n) scanned sequentially from carry; carry <- last state
    (the kernel writes it to tmp: carry is also its input)."""
    fn, x = _define(module, "seq_part", _VOID, dict(seq=_SEQ, a=_PTR, b=_PTR, h=_PTR, R=_I64, L=_I64, t0=_I64,
                                                     n=_I64, carry=_PTR, tmp=_PTR))
    memcpy = ir.Function(module, ir.FunctionType(_VOID, [_PTR, _PTR, _I64, _I1]), "llvm.memcpy.p0.p0.i64")
    bld = ir.IRBuilder(fn.append_basic_block("entry"))
    qa, qb, qh = (bld.gep(p, [x.t0], name=q, source_etype=_F32) for p, q in ((x.a, "qa"), (x.b, "qb"), (x.h, "qh")))
    rows = [_memref(q, [x.R, x.n], [x.L, 1]) for q in (qa, qb, qh)]
    bld.call(x.seq, rows[0] + rows[1] + _memref(x.carry, [x.R], [1]) + rows[2] + _memref(x.tmp, [x.R], [1]))
    nbytes = bld.mul(x.R, _i64(4), name="bytes")
    bld.call(memcpy, [x.carry, x.tmp, nbytes, ir.Constant(_I1, 0)])
    bld.ret_void()
    return fn


def _combine(bld: ir.IRBuilder, x: SimpleNamespace, i: ir.Value, c: ir.Value) -> ir.Value:
    """`A * c * 2^E + B` of sub-chunk i in f64 (as `_carries_if_finite`)."""
    ptrs = [bld.gep(p, [i], name=n + "p", source_etype=t) for p, n, t in ((x.A, "A", _F64), (x.E, "E", _I64),
                                                                          (x.B, "B", _F64))]
    Av, Ev, Bv = (bld.load(p, name=n + "v", typ=t) for p, n, t in zip(ptrs, "AEB", (_F64, _I64, _F64)))
    # the exponent clipped as _exponents does (beyond, 2^E is 0 or inf anyway)
    El = bld.select(bld.icmp_signed("<", Ev, _i64(-_EXP_CLIP), name="lo"), _i64(-_EXP_CLIP), Ev, name="El")
    Eh = bld.select(bld.icmp_signed(">", El, _i64(_EXP_CLIP), name="hi"), _i64(_EXP_CLIP), El, name="Eh")
    E32 = bld.trunc(Eh, _I32, name="E32")
    ldexp = bld.module.globals["llvm.ldexp.f64.i32"]
    ps = bld.call(ldexp, [bld.fmul(Av, c, name="p"), E32], name="ps")
    return bld.fadd(ps, Bv, name="cn")


def _starts(module: ir.Module) -> ir.Function:
    """Sub-chunk starts of one block into st from carry (the carries through the block's
    sub-chunks, in scan order); 1 when every combine is finite."""
    S = SUB_CHUNKS
    fn, x = _define(module, "starts", _I1, dict(R=_I64, carry=_PTR, A=_PTR, E=_PTR, B=_PTR, st=_PTR, isrev=_I1))
    blk = _blocks(fn, "entry row sub row_end exit")
    bld = ir.IRBuilder(blk.entry)
    bld.branch(blk.row)
    bld.position_at_end(blk.row)
    r, okr = bld.phi(_I64, name="r"), bld.phi(_I1, name="okr")
    c0f = bld.load(bld.gep(x.carry, [r], name="cp", source_etype=_F32), name="c0f", typ=_F32)
    c0 = bld.fpext(c0f, _F64, name="c0")
    base = bld.mul(r, _i64(S), name="base")
    bld.branch(blk.sub)
    bld.position_at_end(blk.sub)
    k, c, ok = bld.phi(_I64, name="k"), bld.phi(_F64, name="c"), bld.phi(_I1, name="ok")
    kk = bld.select(x.isrev, bld.sub(_i64(S - 1), k, name="kr"), k, name="kk")
    i = bld.add(base, kk, name="i")
    stp = bld.gep(x.st, [i], name="stp", source_etype=_F32)
    bld.store(bld.fptrunc(c, _F32, name="cf"), stp)
    cn = _combine(bld, x, i, c)
    mag = bld.call(module.globals["llvm.fabs.f64"], [cn], name="mag")
    fin = bld.fcmp_ordered("<", mag, ir.Constant(_F64, math.inf), name="fin")
    ok1 = bld.and_(ok, fin, name="ok1")
    k1 = bld.add(k, _i64(1), name="k1")
    bld.cbranch(bld.icmp_unsigned("==", k1, _i64(S), name="subdone"), blk.row_end, blk.sub)
    bld.position_at_end(blk.row_end)
    ok2 = bld.phi(_I1, name="ok2")
    r1 = bld.add(r, _i64(1), name="r1")
    bld.cbranch(bld.icmp_unsigned("==", r1, x.R, name="rowsdone"), blk.exit, blk.row)
    bld.position_at_end(blk.exit)
    bld.ret(ok2)
    _incoming(r, (_i64(0), blk.entry), (r1, blk.row_end))
    _incoming(okr, (ir.Constant(_I1, 1), blk.entry), (ok2, blk.row_end))
    _incoming(k, (_i64(0), blk.row), (k1, blk.sub))
    _incoming(c, (c0, blk.row), (cn, blk.sub))
    _incoming(ok, (okr, blk.row), (ok1, blk.sub))
    _incoming(ok2, (ok1, blk.sub))
    return fn


def _incoming(phi: ir.PhiInstr, *pairs) -> None:
    for value, block in pairs:
        phi.add_incoming(value, block)


def _block_scan(bld: ir.IRBuilder, x: SimpleNamespace, blk: SimpleNamespace, fns: SimpleNamespace,
                j: ir.Value, e: SimpleNamespace) -> None:
    """Block j (from the end when reversed): its aggregates and starts, then either the
    sub-chunks from their starts and the carry <- the block's last h, or (a combine not
    finite) the whole block sequentially from the carry."""
    S = SUB_CHUNKS
    bld.position_at_end(blk.block)
    jr = bld.sub(bld.sub(e.nb, _i64(1), name="jr0"), j, name="jr")
    t0 = bld.mul(bld.select(e.isrev, jr, j, name="jj"), x.T, name="t0")
    pa, pb, ph = (bld.gep(p, [t0], name=q, source_etype=_F32) for p, q in ((x.a, "pa"), (x.b, "pb"), (x.h, "ph")))
    a3, b3, h3 = (_memref(p, [x.R, S, e.Lc], [x.L, e.Lc, 1]) for p in (pa, pb, ph))
    aggs = [v for p in (x.A, x.E, x.B) for v in _memref(p, [x.R, S], [S, 1])]
    bld.call(x.agg, a3 + b3 + aggs)
    ok = bld.call(fns.starts, [x.R, x.carry, x.A, x.E, x.B, x.st, e.isrev], name="ok")
    bld.cbranch(ok, blk.fast, blk.slow)
    bld.position_at_end(blk.fast)
    bld.call(x.scan, a3 + b3 + _memref(x.st, [x.R, S], [S, 1]) + h3)
    tend = bld.sub(bld.add(t0, x.T, name="tl"), _i64(1), name="tend")
    tlast = bld.select(e.isrev, t0, tend, name="tlast")  # the block's last step in scan order
    bld.branch(blk.keep)
    bld.position_at_end(blk.keep)
    r = bld.phi(_I64, name="r")
    off = bld.add(bld.mul(r, x.L, name="off0"), tlast, name="off")
    hv = bld.load(bld.gep(x.h, [off], name="hp", source_etype=_F32), name="hv", typ=_F32)
    bld.store(hv, bld.gep(x.carry, [r], name="cp", source_etype=_F32))
    r1 = bld.add(r, _i64(1), name="r1")
    bld.cbranch(bld.icmp_unsigned("==", r1, x.R, name="rdone"), blk.next, blk.keep)
    _incoming(r, (_i64(0), blk.fast), (r1, blk.keep))
    bld.position_at_end(blk.slow)
    bld.call(fns.seq_part, [x.seq, x.a, x.b, x.h, x.R, x.L, t0, x.T, x.carry, x.tmp])
    bld.branch(blk.next)


def _chunk_blocks(module: ir.Module, fns: SimpleNamespace) -> ir.Function:
    """The driver: the full blocks in order (reverse: from the end), the steps past the
    last full block sequentially (reverse: first)."""
    S = SUB_CHUNKS
    fn, x = _define(module, _NAME, _VOID, dict(agg=_AGG, scan=_SCAN, seq=_SEQ, a=_PTR, b=_PTR, h=_PTR, R=_I64,
                                                L=_I64, T=_I64, carry=_PTR, tmp=_PTR, A=_PTR, E=_PTR, B=_PTR,
                                                st=_PTR, rev=_I64), internal=False)
    blk = _blocks(fn, "entry rest_first head block fast keep slow next tail rest_scan exit")
    bld = ir.IRBuilder(blk.entry)
    e = SimpleNamespace(Lc=bld.udiv(x.T, _i64(S), name="Lc"), nb=bld.udiv(x.L, x.T, name="nb"))
    e.done = bld.mul(e.nb, x.T, name="done")
    rest = bld.sub(x.L, e.done, name="rest")
    e.isrev = bld.icmp_unsigned("!=", x.rev, _i64(0), name="isrev")
    anyrest = bld.icmp_unsigned(">", rest, _i64(0), name="any")
    rest_args = [x.seq, x.a, x.b, x.h, x.R, x.L, e.done, rest, x.carry, x.tmp]
    bld.cbranch(bld.and_(e.isrev, anyrest, name="pre"), blk.rest_first, blk.head)
    bld.position_at_end(blk.rest_first)  # reversed: the steps past the last full block come first
    bld.call(fns.seq_part, rest_args)
    bld.branch(blk.head)
    bld.position_at_end(blk.head)
    j = bld.phi(_I64, name="j")
    bld.cbranch(bld.icmp_unsigned("<", j, e.nb, name="more"), blk.block, blk.tail)
    _block_scan(bld, x, blk, fns, j, e)
    bld.position_at_end(blk.next)
    j1 = bld.add(j, _i64(1), name="j1")
    bld.branch(blk.head)
    _incoming(j, (_i64(0), blk.entry), (_i64(0), blk.rest_first), (j1, blk.next))
    bld.position_at_end(blk.tail)
    fwd = bld.xor(e.isrev, ir.Constant(_I1, 1), name="fwd")
    bld.cbranch(bld.and_(fwd, anyrest, name="post"), blk.rest_scan, blk.exit)
    bld.position_at_end(blk.rest_scan)
    bld.call(fns.seq_part, rest_args)
    bld.branch(blk.exit)
    bld.position_at_end(blk.exit)
    bld.ret_void()
    return fn


def driver_ir() -> str:
    """`void @chunk_blocks(agg, scan, seq, a, b, h, R, L, T, carry, tmp, A, E, B, st, rev)`.

    agg, scan, seq: the addresses of `@aggregate` (rank 3, wide mode), of the rank-3
    scan from starts and of the rank-2 scan from starts with final state (cpu_scan's
    kernels).  a, b, h: R rows of L f32 steps (row stride L).  T: steps per block, a
    multiple of SUB_CHUNKS.  carry: R f32, the state entering row (in) and the last
    state (out).  tmp: R f32.  A, E, B, st: R*S f64, i64, f64, f32 scratch.  rev: 1
    for a reverse scan (the kernels then reverse ones): blocks, and sub-chunks inside
    a block, from the end, the steps past the last full block first.
    """
    module = ir.Module(name=_NAME)
    ir.Function(module, ir.FunctionType(_F64, [_F64, _I32]), "llvm.ldexp.f64.i32")
    ir.Function(module, ir.FunctionType(_F64, [_F64]), "llvm.fabs.f64")
    fns = SimpleNamespace(seq_part=_seq_part(module), starts=_starts(module))
    _chunk_blocks(module, fns)
    return str(module)


@functools.lru_cache(maxsize=None)
def _driver():
    from scanweaver.runtime.cpu import CpuProgram

    program = CpuProgram(driver_ir())
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = ctypes.CFUNCTYPE(None, p, p, p, p, p, p, i64, i64, i64, p, p, p, p, p, p, i64)(program.address(_NAME))
    return program, fn


on_clear_cache(_driver.cache_clear)


def block_aggregate_kernel(reverse: bool):
    """The blocks' sub-chunk aggregates (`@aggregate`, ranks (3, 3, 2, 2, 2), wide mode):
    cpu_lane_aggregates' kernel, one sub-chunk per lane, no transposes.  Measured here
    (one thread, thread CPU time, one call over 64 blocks of 8 x 8192 f32 steps, median
    of 21-25 interleaved rounds, load 3-6 on 2 cores): 0.33 ns per step from L2 and
    0.35-0.38 from memory, against 0.43-0.49 for the tiles' aggregate kernel
    (cpu_chunk_aggregates), either way."""
    from scanweaver.runtime.cpu_lane_aggregates import LANES, lane_aggregate_kernel

    assert SUB_CHUNKS == LANES, "one sub-chunk per lane"
    return lane_aggregate_kernel(reverse)


@functools.lru_cache(maxsize=None)
def block_scan_kernel(reverse: bool):
    """The f32 rescan from starts (`build_block_scan`: the tiles of `scan.affine`, h
    stored with streaming stores), a `Kernel` of ranks (3, 3, 2, 3)."""
    from xdsl.dialects.builtin import f32

    from scanweaver.compiler import cpu_llvm_ir
    from scanweaver.rewrites.cpu_chunk_aggregates import build_block_scan
    from scanweaver.runtime.cpu import CpuProgram
    from scanweaver.runtime.cpu_jit import Kernel

    llvm_ir, _ = cpu_llvm_ir(build_block_scan(f32, reverse))
    return Kernel(CpuProgram(llvm_ir), "affine", [3, 3, 2, 3])


on_clear_cache(block_scan_kernel.cache_clear)


def block_steps(rows: int, L: int, min_chunk: int | None = None) -> int:
    """Steps per block for `rows` f32 rows on one thread: a and b of a block fill
    BLOCK_BYTES (a power of two, a multiple of SUB_CHUNKS); with `min_chunk` (tests)
    sub-chunks of that many steps, so that small inputs cross many blocks."""
    if min_chunk is not None:
        return SUB_CHUNKS * max(1, min_chunk)
    T = MIN_BLOCK_STEPS
    while 2 * T * rows * 8 <= BLOCK_BYTES:
        T *= 2
    return T


def _task(fn, addrs: list[int], a: np.ndarray, b: np.ndarray, h: np.ndarray, carry: np.ndarray, T: int,
          reverse: bool):
    """The driver's call over the C-contiguous rows a, b -> h from carry (in: the
    entering states, out: the last ones)."""
    R, L = a.shape
    assert all(x.flags.c_contiguous and x.shape == (R, L) for x in (a, b, h)), "the driver's rows are contiguous"
    # One buffer for tmp (R f32), A, E, B (R*S f64, i64, f64) and st (R*S f32), the
    # 8-byte ones first: fewer numpy calls per task (Python costs tens of us per call).
    n = R * SUB_CHUNKS
    scratch = np.empty(3 * n * 8 + n * 4 + R * 4, np.uint8)
    base = _address(scratch)
    A, E, B, st, tmp = (base + off for off in (0, 8 * n, 16 * n, 24 * n, 28 * n))
    args = addrs + [_address(x) for x in (a, b, h)] + [R, L, T, _address(carry), tmp, A, E, B, st, int(reverse)]
    return functools.partial(_call, fn, args, a, b, h, carry, scratch)


def _address(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]


def _call(fn, args, *keep) -> None:
    fn(*args)  # `keep`: the arrays behind the pointers, alive during the call


@functools.lru_cache(maxsize=64)
def _kernel_addresses(kernels) -> list[int]:
    kagg, kscan, kseq = kernels
    return [kagg.program.address("aggregate"), kscan.program.address("affine"), kseq.program.address("affine")]


on_clear_cache(_kernel_addresses.cache_clear)


def chunk_blocks_scan(a: np.ndarray, b: np.ndarray, h0: np.ndarray | None, h: np.ndarray,
                      final: np.ndarray | None, threads: int, kernels, min_chunk: int | None = None,
                      reverse: bool = False) -> None:
    """h (and final) of the C-contiguous f32 (C, L) rows a, b; rows split into up to
    TASKS_PER_THREAD pieces per thread.  kernels: (aggregate, rank-3 scan from starts, rank-2
    scan from starts with final) as cpu_scan's `Kernel`s, reverse ones for `reverse`
    (the rescan: `block_scan_kernel`, or any scan from starts with the same bits)."""
    assert a.dtype == np.float32 and a.flags.c_contiguous and b.flags.c_contiguous and h.flags.c_contiguous
    C, L = a.shape
    _, fn = _driver()
    addrs = list(_kernel_addresses(tuple(kernels)))
    carry = np.zeros(C, np.float32) if h0 is None else h0.astype(np.float32, copy=True)
    tasks = [_task(fn, addrs, a[lo:hi], b[lo:hi], h[lo:hi], carry[lo:hi], block_steps(hi - lo, L, min_chunk), reverse)
             for lo, hi in split_range(C, TASKS_PER_THREAD * threads)]
    parallel_for(tasks, threads=threads)
    if final is not None:
        final[...] = carry

