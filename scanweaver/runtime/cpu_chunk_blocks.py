"""The cache-blocked form of the time-chunked scan, for f32 rows split across threads
(forward and reverse; at least as many rows as threads).

`chunked` (cpu_chunked.py) reads every row twice from memory: all chunk aggregates
first, then every chunk again to scan it.  Here each thread walks its own rows in
blocks of T steps small enough to stay in its core's L2 cache, and per block:
  1. the aggregates of its S sub-chunks (the chunk-aggregate kernel: f64, the product
     renormalised, exactly as in `chunked`), read from memory;
  2. the carries sub-chunk to sub-chunk in f64 (`A * c * 2^E + B`, as
     `_carries_if_finite`), each rounded to f32 as a sub-chunk's start;
  3. the sub-chunks scanned from their starts (the loop's own arithmetic), read again
     from L2; the state entering the next block is the block's last h (the loop's f32
     state, nothing carried in more precision across blocks).
Where a combine is not finite (Inf/NaN inputs, B or the carry overflows) the whole
block is scanned by the sequential (bit-identical) kernel from the block's carry
instead, as `chunked` does per chunk.  The steps after the last full block are scanned
sequentially too.  So about 12 bytes of memory traffic per step instead of 20.

The loop over blocks is compiled (`driver_ir`, LLVM IR calling the three kernels
through their addresses with the expanded memref convention): driving each block from
Python costs tens of microseconds per block, about what a block's work takes.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np

from scanweaver.runtime.cpu_jit import on_clear_cache
from scanweaver.runtime.cpu_parallel import parallel_for, split_range

#: Sub-chunks per block (the lanes of the tiles: with R rows, R*S (row, sub-chunk) pairs).
SUB_CHUNKS = 8
#: Bytes of a and b per block and thread: the block's a, b and h stay in a 2 MiB L2.
BLOCK_BYTES = 1 << 20
#: Smallest block (steps): sub-chunks of at least 8 tiles of 8 steps.
MIN_BLOCK_STEPS = SUB_CHUNKS * 64

_NAME = "chunk_blocks"


def _memref(ptr: str, sizes: list[str], strides: list[str]) -> str:
    return ", ".join([f"ptr {ptr}", f"ptr {ptr}", "i64 0"] + [f"i64 {s}" for s in sizes + strides])


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
    S = SUB_CHUNKS
    a3 = _memref("%pa", ["%R", str(S), "%Lc"], ["%L", "%Lc", "1"])
    b3 = _memref("%pb", ["%R", str(S), "%Lc"], ["%L", "%Lc", "1"])
    h3 = _memref("%ph", ["%R", str(S), "%Lc"], ["%L", "%Lc", "1"])
    aggs = ", ".join(_memref(p, ["%R", str(S)], [str(S), "1"]) for p in ("%A", "%E", "%B"))
    st2 = _memref("%st", ["%R", str(S)], [str(S), "1"])
    a2 = _memref("%qa", ["%R", "%n"], ["%L", "1"])
    b2 = _memref("%qb", ["%R", "%n"], ["%L", "1"])
    h2 = _memref("%qh", ["%R", "%n"], ["%L", "1"])
    c1 = _memref("%carry", ["%R"], ["1"])
    t1 = _memref("%tmp", ["%R"], ["1"])
    return f"""
declare double @llvm.ldexp.f64.i32(double, i32)
declare double @llvm.fabs.f64(double)

; The rows' steps [t0, t0 + n) scanned sequentially from carry; carry <- last state.
define internal void @seq_part(ptr %seq, ptr %a, ptr %b, ptr %h, i64 %R, i64 %L, i64 %t0, i64 %n,
                               ptr %carry, ptr %tmp) {{
entry:
  %qa = getelementptr float, ptr %a, i64 %t0
  %qb = getelementptr float, ptr %b, i64 %t0
  %qh = getelementptr float, ptr %h, i64 %t0
  call void %seq({a2}, {b2}, {c1}, {h2}, {t1})
  %bytes = mul i64 %R, 4
  call void @llvm.memcpy.p0.p0.i64(ptr %carry, ptr %tmp, i64 %bytes, i1 false)
  ret void
}}
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)

; Sub-chunk starts of one block into st from carry; 1 when every combine is finite.
define internal i1 @starts(i64 %R, ptr %carry, ptr %A, ptr %E, ptr %B, ptr %st, i1 %isrev) {{
entry:
  br label %row
row:
  %r = phi i64 [0, %entry], [%r1, %row_end]
  %okr = phi i1 [1, %entry], [%ok2, %row_end]
  %cp = getelementptr float, ptr %carry, i64 %r
  %c0f = load float, ptr %cp
  %c0 = fpext float %c0f to double
  %base = mul i64 %r, {S}
  br label %sub
sub:
  %k = phi i64 [0, %row], [%k1, %sub]
  %c = phi double [%c0, %row], [%cn, %sub]
  %ok = phi i1 [%okr, %row], [%ok1, %sub]
  %kr = sub i64 {S - 1}, %k
  %kk = select i1 %isrev, i64 %kr, i64 %k
  %i = add i64 %base, %kk
  %stp = getelementptr float, ptr %st, i64 %i
  %cf = fptrunc double %c to float
  store float %cf, ptr %stp
  %Ap = getelementptr double, ptr %A, i64 %i
  %Ep = getelementptr i64, ptr %E, i64 %i
  %Bp = getelementptr double, ptr %B, i64 %i
  %Av = load double, ptr %Ap
  %Ev = load i64, ptr %Ep
  %Bv = load double, ptr %Bp
  ; the exponent clipped as _exponents does (beyond, 2^E is 0 or inf anyway)
  %lo = icmp slt i64 %Ev, -1048576
  %El = select i1 %lo, i64 -1048576, i64 %Ev
  %hi = icmp sgt i64 %El, 1048576
  %Eh = select i1 %hi, i64 1048576, i64 %El
  %E32 = trunc i64 %Eh to i32
  %p = fmul double %Av, %c
  %ps = call double @llvm.ldexp.f64.i32(double %p, i32 %E32)
  %cn = fadd double %ps, %Bv
  %mag = call double @llvm.fabs.f64(double %cn)
  %fin = fcmp olt double %mag, 0x7FF0000000000000
  %ok1 = and i1 %ok, %fin
  %k1 = add i64 %k, 1
  %subdone = icmp eq i64 %k1, {S}
  br i1 %subdone, label %row_end, label %sub
row_end:
  %ok2 = phi i1 [%ok1, %sub]
  %r1 = add i64 %r, 1
  %rowsdone = icmp eq i64 %r1, %R
  br i1 %rowsdone, label %exit, label %row
exit:
  ret i1 %ok2
}}

define void @{_NAME}(ptr %agg, ptr %scan, ptr %seq, ptr %a, ptr %b, ptr %h, i64 %R, i64 %L, i64 %T,
                     ptr %carry, ptr %tmp, ptr %A, ptr %E, ptr %B, ptr %st, i64 %rev) {{
entry:
  %Lc = udiv i64 %T, {S}
  %nb = udiv i64 %L, %T
  %done = mul i64 %nb, %T
  %rest = sub i64 %L, %done
  %isrev = icmp ne i64 %rev, 0
  %any = icmp ugt i64 %rest, 0
  %pre = and i1 %isrev, %any
  br i1 %pre, label %rest_first, label %head
rest_first:  ; reversed: the steps past the last full block come first
  call void @seq_part(ptr %seq, ptr %a, ptr %b, ptr %h, i64 %R, i64 %L, i64 %done, i64 %rest, ptr %carry, ptr %tmp)
  br label %head
head:
  %j = phi i64 [0, %entry], [0, %rest_first], [%j1, %next]
  %more = icmp ult i64 %j, %nb
  br i1 %more, label %block, label %tail
block:
  %jr0 = sub i64 %nb, 1
  %jr = sub i64 %jr0, %j
  %jj = select i1 %isrev, i64 %jr, i64 %j
  %t0 = mul i64 %jj, %T
  %pa = getelementptr float, ptr %a, i64 %t0
  %pb = getelementptr float, ptr %b, i64 %t0
  %ph = getelementptr float, ptr %h, i64 %t0
  call void %agg({a3}, {b3}, {aggs})
  %ok = call i1 @starts(i64 %R, ptr %carry, ptr %A, ptr %E, ptr %B, ptr %st, i1 %isrev)
  br i1 %ok, label %fast, label %slow
fast:
  call void %scan({a3}, {b3}, {st2}, {h3})
  %tl = add i64 %t0, %T
  %tend = sub i64 %tl, 1
  %tlast = select i1 %isrev, i64 %t0, i64 %tend  ; the block's last step in scan order
  br label %keep
keep:
  %r = phi i64 [0, %fast], [%r1, %keep]
  %off0 = mul i64 %r, %L
  %off = add i64 %off0, %tlast
  %hp = getelementptr float, ptr %h, i64 %off
  %hv = load float, ptr %hp
  %cp = getelementptr float, ptr %carry, i64 %r
  store float %hv, ptr %cp
  %r1 = add i64 %r, 1
  %rdone = icmp eq i64 %r1, %R
  br i1 %rdone, label %next, label %keep
slow:
  call void @seq_part(ptr %seq, ptr %a, ptr %b, ptr %h, i64 %R, i64 %L, i64 %t0, i64 %T, ptr %carry, ptr %tmp)
  br label %next
next:
  %j1 = add i64 %j, 1
  br label %head
tail:
  %fwd = xor i1 %isrev, 1
  %post = and i1 %fwd, %any
  br i1 %post, label %rest_scan, label %exit
rest_scan:
  call void @seq_part(ptr %seq, ptr %a, ptr %b, ptr %h, i64 %R, i64 %L, i64 %done, i64 %rest, ptr %carry, ptr %tmp)
  br label %exit
exit:
  ret void
}}
"""


@functools.lru_cache(maxsize=None)
def _driver():
    from scanweaver.runtime.cpu import CpuProgram

    program = CpuProgram(driver_ir())
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    fn = ctypes.CFUNCTYPE(None, p, p, p, p, p, p, i64, i64, i64, p, p, p, p, p, p, i64)(program.address(_NAME))
    return program, fn


on_clear_cache(_driver.cache_clear)


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
    scratch = (np.empty(R, np.float32), np.empty(R * SUB_CHUNKS), np.empty(R * SUB_CHUNKS, np.int64),
               np.empty(R * SUB_CHUNKS), np.empty(R * SUB_CHUNKS, np.float32))
    args = addrs + [x.ctypes.data for x in (a, b, h)] + [R, L, T, carry.ctypes.data] + [x.ctypes.data for x in scratch]
    args.append(int(reverse))
    return functools.partial(_call, fn, args, a, b, h, carry, scratch)


def _call(fn, args, *keep) -> None:
    fn(*args)  # `keep`: the arrays behind the pointers, alive during the call


def _kernel_addresses(kernels) -> list[int]:
    kagg, kscan, kseq = kernels
    return [kagg.program.address("aggregate"), kscan.program.address("affine"), kseq.program.address("affine")]


def chunk_blocks_scan(a: np.ndarray, b: np.ndarray, h0: np.ndarray | None, h: np.ndarray,
                      final: np.ndarray | None, threads: int, kernels, min_chunk: int | None = None,
                      reverse: bool = False) -> None:
    """h (and final) of the C-contiguous f32 (C, L) rows a, b; rows split across
    threads (one piece each).  kernels: (aggregate, rank-3 scan from starts, rank-2
    scan from starts with final) as cpu_scan's `Kernel`s, reverse ones for `reverse`."""
    assert a.dtype == np.float32 and a.flags.c_contiguous and b.flags.c_contiguous and h.flags.c_contiguous
    C, L = a.shape
    _, fn = _driver()
    addrs = _kernel_addresses(kernels)
    carry = np.zeros(C, np.float32) if h0 is None else h0.astype(np.float32, copy=True)
    tasks = [_task(fn, addrs, a[lo:hi], b[lo:hi], h[lo:hi], carry[lo:hi], block_steps(hi - lo, L, min_chunk), reverse)
             for lo, hi in split_range(C, threads)]
    parallel_for(tasks, threads=threads)
    if final is not None:
        final[...] = carry

