"""The time-chunked affine scan (`chunked` variant of `affine_scan_cpu`): parallel in
time for few channels and long rows (see cpu_scan's docstring for the three phases).
f32 scans with at least as many rows as threads take the
cache-blocked form of cpu_chunk_blocks.py (one pass over memory instead of two)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np

from scanweaver.runtime.cpu_jit import Kernel
from scanweaver.runtime.cpu_parallel import parallel_for, split_range
from scanweaver.runtime.cpu_variants import _lanes

#: Chunked-scan knob: when set (tests), rows at least this long may be chunked
#: whatever their size, and chunks are at least this long, so that small inputs
#: exercise the chunked code (every chunk boundary, the tail, the overflow guard).
CHUNKED_TEST_MIN_CHUNK: int | None = None


def _chunk_count(C: int, L: int, lanes: int, threads: int) -> int:
    """Chunks per row: enough rows of chunks to fill the lanes on every thread."""
    want = max(2 * lanes, -(-lanes * threads * 2 // max(C, 1)))
    want = -(-want // lanes) * lanes  # a multiple of the lanes
    # Chunks of at least 4 tiles of time each.
    min_chunk = 8 * lanes if CHUNKED_TEST_MIN_CHUNK is None else max(1, CHUNKED_TEST_MIN_CHUNK)
    return max(1, min(want, L // min_chunk))


# ---- Carries between chunks (phase 2), in more precision than the element type.
#
# Chunk k's aggregate (A_k, B_k) maps the state entering the chunk to the state
# leaving it: h_out = A_k * h_in + B_k.  f32 rows: A, B in f64; f64 rows: A, B in
# double-double (hi + lo).  A is renormalised: A = A_m * 2^E (E: i64).  The
# carry is kept in the same precision from chunk to chunk and rounded to the element
# type only as each chunk's start.  Where the combine is not finite (the product of
# `a` left the exponent range, B overflowed, the inputs hold Inf/NaN, or the carry
# itself overflows) the chunk is scanned sequentially from its start instead: the
# sequential loop's own arithmetic, so no Inf*0 the loop never forms.

_SPLIT = 134217729.0  # 2^27 + 1: Dekker's split of a double into 26-bit halves


def _two_prod(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p + e == x * y exactly (Dekker; numpy has no FMA).  Non-finite for |x|, |y| > 2^995."""
    p = x * y
    tx = _SPLIT * x
    xh = tx - (tx - x)
    xl = x - xh
    ty = _SPLIT * y
    yh = ty - (ty - y)
    yl = y - yh
    e = ((xh * yh - p) + xh * yl + xl * yh) + xl * yl
    return p, e


def _dd_add(ah, al, bh, bl):
    s = ah + bh
    z = s - ah
    e = (ah - (s - z)) + (bh - z) + al + bl
    hi = s + e
    return hi, e - (hi - s)


def _scale2(x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """x * 2^e (e: int32 from `_exponents`), exact unless it leaves the range (0 or inf then)."""
    return np.ldexp(x, e)


class _Carry:
    """The carry entering a chunk, per row, in the carry precision."""

    def __init__(self, start: np.ndarray, dd: bool):
        self.hi = start.astype(np.float64)
        self.lo = np.zeros_like(self.hi) if dd else None

    def start(self, dtype: np.dtype) -> np.ndarray:
        with np.errstate(over="ignore"):  # beyond the range of dtype: inf, as the loop gets
            return self.hi.astype(dtype)  # hi + lo rounds to hi: hi is the rounded sum

    def combine(self, agg: list[np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray | None]:
        """A_k * carry + B_k (not stored); non-finite where the combine is unsafe."""
        if self.lo is None:  # wide: A, E, B
            A, E, B = (x[:, k] for x in agg)
            return _scale2(A * self.hi, E) + B, None
        Ah, Al, E, Bh, Bl = (x[:, k] for x in agg)
        p, e = _two_prod(Ah, self.hi)
        e = e + (Ah * self.lo + Al * self.hi)
        ph = p + e
        pl = e - (ph - p)
        return _dd_add(_scale2(ph, E), _scale2(pl, E), Bh, Bl)


def _exponents(E: np.ndarray) -> np.ndarray:
    """The chunks' exponents as ldexp takes them (clipped: beyond, 2^E is 0 or inf anyway)."""
    return np.clip(E, -1 << 20, 1 << 20).astype(np.int32)


def _carries_if_finite(start: np.ndarray, agg: list[np.ndarray], order: range, starts: np.ndarray,
                       dd: bool) -> np.ndarray | None:
    """Every chunk's start into `starts` and the carry after the last chunk, when every
    combine is finite (checked once at the end: a non-finite carry stays non-finite);
    None otherwise.  The same operations as `_carries_checked` on that path: same bits."""
    cr = _Carry(start, dd)
    seen = np.empty((2 if dd else 1, start.shape[0], len(order)))
    with np.errstate(all="ignore"):
        for i, k in enumerate(order):
            starts[:, k] = cr.start(starts.dtype)
            cr.hi, cr.lo = cr.combine(agg, k)
            seen[0, :, i] = cr.hi
            if dd:
                seen[1, :, i] = cr.lo
        if not np.isfinite(seen).all():
            return None
        return cr.start(starts.dtype)


#: The wide-mode carries of at most this many (row, chunk) pairs run on Python floats
#: (`_wide_carries_scalar`): numpy's per-call cost over one column of K columns is
#: most of phase 2 at few rows (4x2^20 f32, 16 chunks: about 0.2 ms of a 4 ms call).
SCALAR_CARRY_MAX_PAIRS = 4096


def _wide_carries_scalar(start: np.ndarray, agg: list[np.ndarray], order: range,
                         starts: np.ndarray) -> np.ndarray | None:
    """`_carries_if_finite` for the wide mode (A, E, B in f64) on Python floats: the
    same IEEE double operations (A * c, then * 2^E, then + B; one rounding to the
    element type per start), so the same bits; None where a combine is not finite."""
    A, E, B = (x.tolist() for x in agg)
    rows = start.astype(np.float64).tolist()
    el = starts.dtype.type
    cols = list(order)
    out = [[0.0] * len(cols) for _ in rows]
    with np.errstate(over="ignore"):  # a start beyond the element range rounds to inf
        for r, c in enumerate(rows):
            Ar, Er, Br, o = A[r], E[r], B[r], out[r]
            for k in cols:
                o[k] = c
                try:
                    c = math.ldexp(Ar[k] * c, Er[k]) + Br[k]
                except OverflowError:  # np.ldexp gives inf here: not finite
                    return None
                if not math.isfinite(c):
                    return None
            rows[r] = c
        starts[...] = np.array(out, np.float64).astype(starts.dtype)
        return np.array(rows, np.float64).astype(el)


def _scan_chunk(seq: Kernel, av, bv, hv, k: int, start: np.ndarray) -> np.ndarray:
    """Chunk k scanned by the sequential loop's own steps from `start`: its last state."""
    last = np.empty(start.shape[0], av.dtype)
    seq(av[:, k], bv[:, k], start.copy(), hv[:, k], last)
    return last


def _carries_checked(start: np.ndarray, agg: list[np.ndarray], order: range, starts: np.ndarray, dd: bool,
                     scan_chunk: Callable[[int, np.ndarray], np.ndarray], done: np.ndarray) -> np.ndarray:
    """The carries chunk to chunk, each combine checked: where one is not finite, that
    chunk is scanned sequentially now (marked in `done`) and its last state carried."""
    cr = _Carry(start, dd)
    with np.errstate(all="ignore"):
        for k in order:
            starts[:, k] = cr.start(starts.dtype)
            hi, lo = cr.combine(agg, k)
            unsafe = ~np.isfinite(hi)
            if lo is not None:
                unsafe |= ~np.isfinite(lo)
            if unsafe.any():
                last = scan_chunk(k, starts[:, k])
                done[k] = True
                hi = np.where(unsafe, last.astype(np.float64), hi)
                if lo is not None:
                    lo = np.where(unsafe, 0.0, lo)
            cr.hi, cr.lo = hi, lo
        return cr.start(starts.dtype)


def _chunked(a, b, h0, h, final, reverse: bool, threads: int, el: str,
             scan_kernel: Callable[..., Kernel], aggregate_kernel: Callable[..., Kernel]) -> None:
    """The chunked scan of rows a, b into h (and final); `el` the MLIR element type,
    `scan_kernel(el, rank, init, final, reverse)` and `aggregate_kernel(el, reverse)`
    the compiled kernels (cpu_scan's cached getters)."""
    C, L = a.shape
    if C == 0:  # no rows: nothing to scan (the carries' numpy code would not take (0, K))
        return
    if a.dtype == np.float32 and C >= threads:
        # Each thread's rows in L2-sized blocks, one pass over memory (cpu_chunk_blocks.py).
        # Fewer rows than threads (one row on two cores) stay with the chunks below: cut
        # into parts, a row's per-thread work grows by the parts' aggregates, and that
        # cost about what the saved pass gained (ad hoc, 1x2^24: about 10 ms of per-thread
        # CPU time in parts against 9 ms here).
        from scanweaver.runtime.cpu_chunk_blocks import block_aggregate_kernel, block_scan_kernel, chunk_blocks_scan

        kernels = (block_aggregate_kernel(reverse), block_scan_kernel(reverse), scan_kernel(el, 2, True, True, reverse))
        chunk_blocks_scan(a, b, h0, h, final, threads, kernels, CHUNKED_TEST_MIN_CHUNK, reverse)
        return
    lanes = _lanes(a.dtype)
    K = _chunk_count(C, L, lanes, threads)
    Lc = L // K
    main = K * Lc
    # Chunk views (C, K, Lc) over the first K*Lc steps; the `tail` steps after them run
    # last (first when reversed) with a plain scan.
    def view(x: np.ndarray) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(x, shape=(C, K, Lc), strides=(x.strides[0], Lc * x.itemsize, x.itemsize))

    av, bv, hv = view(a), view(b), view(h)
    tail = L - main
    carry = np.zeros(C, a.dtype) if h0 is None else h0.copy()
    if tail and reverse:  # the last `tail` steps run first
        ka = scan_kernel(el, 2, True, True, True)
        t_final = np.empty(C, a.dtype)
        ka(a[:, main:], b[:, main:], carry, h[:, main:], t_final)
        carry = t_final
    carry0 = carry
    # Phase 1: aggregates per chunk, in parallel over the chunk dim.  No flush to zero:
    # denormal inputs count (the rescaled product never goes denormal itself).
    from scanweaver.rewrites.cpu_aggregate_arith import AGGREGATE_MODES, aggregate_mode

    from xdsl.dialects.builtin import f32, f64, i32, i64

    mode = aggregate_mode({"f32": f32, "f64": f64, "i32": i32, "i64": i64}[el])
    agg_dtype = a.dtype if mode == "exact" else np.dtype(np.float64)
    agg = [np.empty((C, K), np.int64 if name == "E" else agg_dtype) for name in AGGREGATE_MODES[mode]]
    parts = split_range(K, threads, lanes)
    parallel_for(_aggregate_tasks(lambda: aggregate_kernel(el, reverse), av, bv, agg, parts, reverse), threads=threads)
    # Phase 2: carries, chunk to chunk.
    starts = np.empty((C, K), a.dtype)
    order = range(K - 1, -1, -1) if reverse else range(K)
    done = np.zeros(K, bool)  # chunks already scanned (sequentially, in phase 2)
    if mode == "exact":
        c = carry.copy()
        A, B = agg
        with np.errstate(over="ignore"):
            for k in order:
                starts[:, k] = c
                c = A[:, k] * c + B[:, k]
        carry = c
    else:
        agg = [_exponents(x) if x.dtype == np.int64 else x for x in agg]
        if mode == "wide" and C * K <= SCALAR_CARRY_MAX_PAIRS:
            carry = _wide_carries_scalar(carry, agg, order, starts)
        else:
            carry = _carries_if_finite(carry, agg, order, starts, mode == "dd")
        if carry is None:  # a combine was not finite: chunk by chunk, with the fallback
            seq = functools.partial(_scan_chunk, scan_kernel(el, 2, True, True, reverse), av, bv, hv)
            carry = _carries_checked(carry0, agg, order, starts, mode == "dd", seq, done)
    # Phase 3: each chunk scanned from its carry, in parallel.
    ks = scan_kernel(el, 3, True, False, reverse)
    runs = [(lo, hi) for lo, hi in _runs_without(done, parts)]
    tasks = [ks.bind(av[:, lo:hi], bv[:, lo:hi], starts[:, lo:hi], hv[:, lo:hi]) for lo, hi in runs]
    if tail and not reverse:
        ka = scan_kernel(el, 2, True, final is not None, False)
        t_args = [a[:, main:], b[:, main:], carry, h[:, main:]] + ([final] if final is not None else [])
        tasks.append(lambda: ka(*t_args))
        parallel_for(tasks, threads=threads)
        return
    parallel_for(tasks, threads=threads)
    if final is not None:  # the state h ends with (the carry past the last chunk is its f64 value, rounded once)
        final[...] = h[:, 0] if reverse else h[:, -1]


def _lanes_view(x: np.ndarray) -> np.ndarray | None:
    """x (one row: (1, n, ...)) as (n / LANES, LANES, ...) without a copy, or None."""
    from scanweaver.runtime.cpu_lane_aggregates import LANES

    if x.shape[0] != 1 or x.shape[1] % LANES:
        return None
    v = x[0].view()
    try:
        v.shape = (x.shape[1] // LANES, LANES) + x.shape[2:]  # raises where it would copy
    except AttributeError:
        return None
    return v


def _aggregate_tasks(tiles: Callable[[], Kernel], av, bv, agg: list[np.ndarray], parts,
                     reverse: bool) -> list[Callable[[], None]]:
    """Phase 1's calls, one per part of the chunks.  A single f32 row takes
    cpu_lane_aggregates' kernel (same outputs, its chunks eight to a vector: no
    transposes), where every part is a whole number of vectors; the others the tiles'
    kernel (`tiles()`, built only then)."""
    if av.dtype == np.float32 and len(agg) == 3:
        from scanweaver.runtime.cpu_lane_aggregates import lane_aggregate_kernel

        views = [[_lanes_view(x[:, lo:hi]) for x in (av, bv, *agg)] for lo, hi in parts]
        if all(v is not None for vs in views for v in vs):
            klane = lane_aggregate_kernel(reverse)
            return [klane.bind(*vs) for vs in views]
    kagg = tiles()
    return [kagg.bind(av[:, lo:hi], bv[:, lo:hi], *(x[:, lo:hi] for x in agg)) for lo, hi in parts]


def _runs_without(done: np.ndarray, parts: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges of `parts` with the chunks marked done cut out."""
    runs = []
    for lo, hi in parts:
        start = None
        for k in range(lo, hi + 1):
            if k < hi and not done[k]:
                start = k if start is None else start
            elif start is not None:
                runs.append((start, k))
                start = None
    return runs
