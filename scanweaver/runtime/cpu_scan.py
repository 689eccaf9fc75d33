"""Compiled CPU kernels for the API: affine scans and the Mamba selective scan.

Every kernel is IR text (a `scan.affine` or a `scan.recurrence` in a `func.func`)
compiled by `compile_cpu`, the only place that compiles: the scanweaver CPU pipeline
(raise, `scan-to-cpu`, canonicalize, cse), MLIR's CPU lowering, then the llvmlite JIT.
Compiled programs are cached in-process by IR text.

Calls go straight to the lowered function (memrefs expanded into pointer, offset,
sizes and strides) through ctypes, which releases the GIL for the foreign call: Python
threads then run kernels on both cores at once (`parallel_for`).

Variants of `affine_scan_cpu`, chosen by shape (see `choose_affine_variant`):
  single    one call (small inputs: threads cost more than they save)
  channels  rows split across threads, each thread a row-slice view
  openmp    one call of a kernel whose loop over channel groups is an OpenMP
            work-sharing loop (`scan-to-cpu{parallel_channels}` + convert-scf-to-openmp,
            LLVM's libomp); libomp's workers spin a while between calls, where the
            Python pool's block
  chunked   parallel in time, for few channels and long sequences: each row is cut
            into K chunks; (1) per chunk the aggregate pair (prod a, scan from 0), in
            parallel, in more precision than the elements (f64 for f32 rows,
            compensated double-double for f64 rows) with the product renormalised by
            powers of two (no overflow, no denormals); (2) the carries chunk to chunk,
            sequentially (K steps, numpy, same precision), and where a combine is not
            finite (overflow, Inf/NaN inputs) that chunk scanned sequentially instead;
            (3) per chunk the scan seeded with its carry (the loop's own arithmetic),
            in parallel.  No flush to zero.  Float results differ from the sequential
            scan by rounding, within the bound of README "Numerics" (measured in
            benchmarks/numerics.md); integer results are identical (wrap-around
            arithmetic is associative).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from scanweaver.dtypes import mlir_element
from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cpu import CpuProgram, flush_denormals
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.runtime.validation import check_shape
from scanweaver.workloads.specs import SelectiveScanSpec

# ---------------------------------------------------------------------------
# Compilation (the one place) and its in-process cache
# ---------------------------------------------------------------------------


@dataclass
class CompileStats:
    """What compile_cpu did: seconds spent compiling, cache hits."""

    compiles: int = 0
    hits: int = 0
    seconds: float = 0.0
    last_seconds: float = 0.0
    last_cached: bool = False


_CACHE: dict[str, CpuProgram] = {}
_CACHE_LOCK = threading.Lock()
STATS = CompileStats()


def compile_cpu(ir_text: str, openmp: bool = False) -> CpuProgram:
    """Compile IR text (scan dialect + func/arith/memref/scf/math/vector) for this CPU.

    The single entry point for the drivers: `scanweaver-lower{target=cpu}` through
    `compiler.build_cpu` (cached on disk), JIT-compiled once per process.  With
    `openmp`, loops over channel groups run on OpenMP threads (BackendUnavailableError
    when libomp cannot be loaded, raised before compiling).
    """
    if openmp:
        from scanweaver.runtime.cpu import load_openmp_runtime

        load_openmp_runtime()
    key = ("// openmp\n" if openmp else "") + ir_text
    with _CACHE_LOCK:
        program = _CACHE.get(key)
        if program is not None:
            STATS.hits += 1
            STATS.last_cached, STATS.last_seconds = True, 0.0
            return program
        from scanweaver.compiler import build_cpu

        start = time.perf_counter()
        program = CpuProgram(build_cpu(ir_text, openmp=openmp).llvm_ir, openmp=openmp)
        elapsed = time.perf_counter() - start
        _CACHE[key] = program
        STATS.compiles += 1
        STATS.seconds += elapsed
        STATS.last_seconds, STATS.last_cached = elapsed, False
        return program


def clear_cache() -> None:
    """Forget compiled kernels (the next call of each kernel compiles again)."""
    with _CACHE_LOCK:
        _CACHE.clear()
    _KERNELS.clear()
    _affine_kernel.cache_clear()
    _aggregate_kernel.cache_clear()
    _openmp_affine_kernel.cache_clear()


# ---------------------------------------------------------------------------
# Fast calls: the lowered function with memrefs expanded, through ctypes
# ---------------------------------------------------------------------------

_SCALARS = {"index": ctypes.c_int64, "i64": ctypes.c_int64, "i32": ctypes.c_int32,
            "f32": ctypes.c_float, "f64": ctypes.c_double}


class Kernel:
    """A compiled `func.func` called with numpy arrays (zero copy) and scalars.

    `args`: per argument, an int R for a rank-R memref (any element type; the array
    must have the element type the IR declares, non-negative strides that are a
    multiple of the item size, innermost stride 1 when R > 0), or a scalar type name.
    The expanded MLIR calling convention is used: (allocated, aligned, offset,
    sizes[R], strides[R]) per memref.  ctypes releases the GIL during the call.
    """

    def __init__(self, program: CpuProgram, name: str, args: Sequence[int | str]):
        self.program = program  # keeps the JIT engine alive
        self.spec = list(args)
        ctypes_args: list[Any] = []
        for a in self.spec:
            if isinstance(a, int):
                ctypes_args += [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * (1 + 2 * a)
            else:
                ctypes_args.append(_SCALARS[a])
        self._fn = ctypes.CFUNCTYPE(None, *ctypes_args)(program.address(name))

    def __call__(self, *values: Any) -> None:
        self._fn(*self._flatten(values))

    def bind(self, *values: Any) -> Callable[[], None]:
        """The call with its arguments converted now (threads then only do the call)."""
        flat = self._flatten(values)
        fn = self._fn
        return lambda: fn(*flat)

    def _flatten(self, values: Sequence[Any]) -> list[Any]:
        flat: list[Any] = []
        for spec, v in zip(self.spec, values, strict=True):
            if isinstance(spec, int):
                if v.ndim != spec:
                    raise ScanWeaverValueError(f"kernel expects a {spec}-D array, got shape {v.shape}")
                ptr = v.__array_interface__["data"][0]
                item = v.itemsize
                flat += [ptr, ptr, 0, *v.shape, *(s // item for s in v.strides)]
            else:
                flat.append(v)
        return flat


_KERNELS: dict[tuple, Kernel] = {}


def kernel(ir_text: str, name: str, args: Sequence[int | str]) -> Kernel:
    key = (ir_text, name, tuple(args))
    k = _KERNELS.get(key)
    if k is None:
        k = Kernel(compile_cpu(ir_text), name, args)
        _KERNELS[key] = k
    return k


# ---------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def num_threads() -> int:
    """Worker count: SCANWEAVER_NUM_THREADS, else the CPUs this process may use."""
    env = os.environ.get("SCANWEAVER_NUM_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(1, num_threads() - 1), thread_name_prefix="scanweaver")
        return _POOL


def parallel_for(tasks: Sequence[Callable[[], None]], ftz: bool = False, threads: int | None = None) -> None:
    """Run `tasks` on this thread and the pool's workers, each taking the next task
    when done with one (dynamic balance: a core that another process slows down takes
    fewer tasks); wait for all.  ftz: flush denormals to zero while the tasks run (an
    explicit option, off by default; no ScanWeaver variant uses it).
    """
    if not tasks:
        return
    threads = min(num_threads() if threads is None else max(1, threads), len(tasks))
    order = iter(range(len(tasks)))
    lock = threading.Lock()

    def drain() -> None:
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            tasks[i]()

    def work() -> None:
        if ftz:
            with flush_denormals():
                drain()
        else:
            drain()

    if threads == 1:
        work()
        return
    futures = [_pool().submit(work) for _ in range(threads - 1)]
    try:
        work()
    finally:
        for f in futures:
            f.result()


def split_range(n: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """Cut [0, n) into at most `parts` nearly equal pieces, boundaries multiples of `align`."""
    parts = max(1, min(parts, -(-n // align) if n else 1))
    bounds = [0]
    for p in range(1, parts):
        cut = round(n * p / parts / align) * align
        bounds.append(min(max(cut, bounds[-1]), n))
    bounds.append(n)
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


# ---------------------------------------------------------------------------
# Affine scans
# ---------------------------------------------------------------------------

_CPU_ELEMENTS = ("f32", "f64", "i32", "i64")  # f16 inputs are widened to f32 before


def _mlir_el(dtype: np.dtype) -> str:
    el = mlir_element(dtype, _CPU_ELEMENTS)
    if el is None:
        raise ScanWeaverTypeError(
            f"affine_scan_cpu: dtype {np.dtype(dtype)} is not supported (float32, float64, int32, int64)"
        )
    return el


def _affine_options(el: str, rank: int, init: bool, final: bool, reverse: bool) -> dict:
    """The affine workload of the drivers: dynamic shape, scan along the last axis."""
    return dict(shape=("?",) * rank, axis=rank - 1, in_el=el, state_el=el,
                init=init, final=final, reverse=reverse, name="affine")


def affine_ir(el: str, rank: int = 2, init: bool = False, final: bool = False, reverse: bool = False) -> str:
    """IR text: `func.func @affine(a, b, [h0], h, [hT])` holding one dynamic-shape scan.affine."""
    return kernel_ir("affine", **_affine_options(el, rank, init, final, reverse)).text


@functools.lru_cache(maxsize=None)
def _affine_kernel(el: str, rank: int, init: bool, final: bool, reverse: bool) -> Kernel:
    ir = kernel_ir("affine", **_affine_options(el, rank, init, final, reverse))
    return kernel(ir.text, ir.name, ir.args)


@functools.lru_cache(maxsize=None)
def _aggregate_kernel(el: str, reverse: bool) -> Kernel:
    """The chunk-aggregate kernel: built already lowered (vector/scf/arith), so it goes
    straight to MLIR's CPU lowering (the xDSL stages would only re-parse it: ~8 s)."""
    from xdsl.dialects.builtin import f32, f64, i32, i64

    from scanweaver.compiler import cpu_llvm_ir
    from scanweaver.rewrites.scan_to_cpu import AGGREGATE_MODES, aggregate_mode, build_chunk_aggregate

    t = {"f32": f32, "f64": f64, "i32": i32, "i64": i64}[el]
    llvm_ir, _ = cpu_llvm_ir(build_chunk_aggregate(t, 3, reverse))
    spec = [3, 3] + [2] * len(AGGREGATE_MODES[aggregate_mode(t)])
    return Kernel(CpuProgram(llvm_ir), "aggregate", spec)





@functools.lru_cache(maxsize=None)
def _openmp_affine_kernel(el: str, init: bool, final: bool, reverse: bool) -> Kernel:
    ir = kernel_ir("affine", **_affine_options(el, 2, init, final, reverse))
    return Kernel(compile_cpu(ir.text, openmp=True), ir.name, ir.args)


@functools.lru_cache(maxsize=None)
def _omp_set_num_threads() -> Callable[[int], None]:
    from scanweaver.runtime.cpu import load_openmp_runtime

    fn = ctypes.CDLL(load_openmp_runtime()).omp_set_num_threads
    fn.argtypes, fn.restype = [ctypes.c_int], None
    return fn


_OMP_THREADS = threading.local()


def _set_openmp_threads(threads: int) -> None:
    """omp_set_num_threads for the calling thread (an OpenMP per-thread setting)."""
    if getattr(_OMP_THREADS, "n", None) != threads:
        _omp_set_num_threads()(threads)
        _OMP_THREADS.n = threads


def openmp_available() -> bool:
    """Whether libomp loads (the 'openmp' variant can run)."""
    from scanweaver.errors import BackendUnavailableError
    from scanweaver.runtime.cpu import load_openmp_runtime

    try:
        load_openmp_runtime()
    except BackendUnavailableError:
        return False
    return True

#: Lanes per vector group of the tiled kernel, by element size (256-bit vectors).
def _lanes(dtype: np.dtype) -> int:
    return 32 // np.dtype(dtype).itemsize


# Heuristic thresholds (measured on 2 cores, see benchmarks/README.md).
THREAD_MIN_ELEMENTS = 1 << 19  # below this one call beats waking a worker (~60 us here)
THREAD_MIN_BYTES = 16 << 20  # a, b and h together: below this, one core (see choose_affine_variant)
CHUNKED_MIN_LENGTH = 1 << 13  # rows at least this long may be cut in time
TASKS_PER_THREAD = 1  # pieces per thread (more: dynamic balance under outside load, but more calls)
SELECTIVE_TASKS_PER_THREAD = 4
OPENMP_MIN_ELEMENTS = 1 << 19  # from here the OpenMP kernel beats one call (1024x1024 f32: 2x)


def choose_affine_variant(channels: int, length: int, dtype: np.dtype, threads: int | None = None) -> str:
    """'single', 'channels' or 'chunked' for a (channels, length) scan.

    Threads only pay for inputs larger than the shared cache: below THREAD_MIN_BYTES of
    traffic one core already streams at cache bandwidth (measured here: 1024x1024 f32,
    12 MB, 0.32 ms on one core, 0.34-0.43 ms on two; 1024x4096, 48 MB, 2.8 ms on one
    core, 1.8 ms on two).
    """
    threads = num_threads() if threads is None else threads
    total = channels * length
    # f64 rows are never cut in time: their compensated chunk aggregates cost what the
    # time parallelism saves (measured here, 2 cores, 1x2^20: 3.3 ms chunked, 3.3 ms
    # single; 3x2^20: 6.9 ms vs 3.6 ms), and the single variant is bit-identical.
    chunkable = np.dtype(dtype) != np.float64
    if threads > 1 and channels >= 2 * _lanes(dtype) * threads and total >= OPENMP_MIN_ELEMENTS and openmp_available():
        return "openmp"
    small = total < THREAD_MIN_ELEMENTS or 3 * total * np.dtype(dtype).itemsize < THREAD_MIN_BYTES
    if threads <= 1 or small:
        # One thread: still cut long rows in time when there are too few channels to
        # fill the vector lanes (latency-bound otherwise).
        if chunkable and channels < _lanes(dtype) and length >= CHUNKED_MIN_LENGTH and total >= THREAD_MIN_ELEMENTS:
            return "chunked"
        return "single"
    if channels >= 2 * _lanes(dtype) * threads:
        return "channels"
    if chunkable and length >= CHUNKED_MIN_LENGTH:
        return "chunked"
    return "channels" if channels >= 2 * threads else "single"


def aligned_empty(shape: tuple[int, ...], dtype: Any, align: int = 64) -> np.ndarray:
    """np.empty(shape, dtype) whose data starts on an `align`-byte boundary.

    numpy's large allocations typically start 16 bytes past a 64-byte boundary; the
    tiled affine kernel stores h with non-temporal (streaming) stores only when its
    rows are 32-byte aligned, so outputs allocated here (and rows whose length is a
    multiple of 32 bytes) take the faster path.
    """
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + align, np.uint8)
    skip = (-raw.ctypes.data) % align
    return raw[skip : skip + n].view(dtype).reshape(shape)


def affine_scan_cpu(
    a: np.ndarray,
    b: np.ndarray,
    h0: np.ndarray | None = None,
    reverse: bool = False,
    return_final: bool = False,
    variant: str | None = None,
    threads: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """h[c, t] = a[c, t] * h[c, t-1] + b[c, t] over t for each row c (h[c, -1] = h0[c] or 0).

    a, b: (channels, L) arrays of one dtype (float32, float64, int32, int64);
    h0: (channels,).  reverse: t runs from L-1 down to 0.  Returns h, and the last
    state (channels,) with return_final.  variant: force 'single', 'channels',
    'chunked' or 'openmp' (default: by shape, `choose_affine_variant`).  out: a C-contiguous
    (channels, L) array of a's dtype to write h into (saves the allocation, whose first
    touch costs page faults on every call for large arrays).
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or a.shape != b.shape:
        raise ScanWeaverValueError(f"affine_scan_cpu: a and b must be 2-D of one shape, got {a.shape} and {b.shape}")
    if a.dtype != b.dtype:
        raise ScanWeaverTypeError(f"affine_scan_cpu: a and b must have one dtype, got {a.dtype} and {b.dtype}")
    el = _mlir_el(a.dtype)
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    C, L = a.shape
    if h0 is not None:
        h0 = np.ascontiguousarray(np.asarray(h0, dtype=a.dtype).reshape(C))
    if out is None:
        h = aligned_empty(a.shape, a.dtype)  # aligned rows: streaming stores of h
    else:
        if out.shape != a.shape or out.dtype != a.dtype or not out.flags.c_contiguous:
            raise ScanWeaverValueError(
                f"affine_scan_cpu: out must be a C-contiguous {a.shape} array of {a.dtype}, "
                f"got {out.shape} {out.dtype}"
            )
        h = out
    final = np.empty(C, a.dtype) if return_final else None
    threads = num_threads() if threads is None else max(1, threads)
    variant = variant or choose_affine_variant(C, L, a.dtype, threads)
    if variant == "chunked" and L >= 2:
        _chunked(a, b, h0, h, final, reverse, threads)
    elif variant == "openmp":
        k = _openmp_affine_kernel(el, h0 is not None, final is not None, reverse)
        _set_openmp_threads(threads)
        k(*([a, b] + ([h0] if h0 is not None else []) + [h] + ([final] if final is not None else [])))
    elif variant in ("channels", "chunked", "single"):
        lanes = _lanes(a.dtype)
        pieces = 1 if variant == "single" else min(threads * TASKS_PER_THREAD, max(threads, C // (4 * lanes)))
        parts = split_range(C, pieces, lanes)
        k = _affine_kernel(el, 2, h0 is not None, final is not None, reverse)

        def task(lo: int, hi: int) -> Callable[[], None]:
            args = [a[lo:hi], b[lo:hi]] + ([h0[lo:hi]] if h0 is not None else []) + [h[lo:hi]]
            args += [final[lo:hi]] if final is not None else []
            return k.bind(*args)

        parallel_for([task(lo, hi) for lo, hi in parts], threads=1 if variant == "single" else threads)
    else:
        raise ScanWeaverValueError(f"affine_scan_cpu: unknown variant {variant!r} (single, channels, chunked, openmp)")
    return (h, final) if return_final else h


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
    """x * 2^e, exact unless it leaves the range (0 or inf then)."""
    return np.ldexp(x, np.clip(e, -1 << 20, 1 << 20).astype(np.int32))


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


def _chunked(a, b, h0, h, final, reverse: bool, threads: int) -> None:
    C, L = a.shape
    el = _mlir_el(a.dtype)
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
        ka = _affine_kernel(el, 2, True, True, True)
        t_final = np.empty(C, a.dtype)
        ka(a[:, main:], b[:, main:], carry, h[:, main:], t_final)
        carry = t_final
    # Phase 1: aggregates per chunk, in parallel over the chunk dim.  No flush to zero:
    # denormal inputs count (the rescaled product never goes denormal itself).
    from scanweaver.rewrites.scan_to_cpu import AGGREGATE_MODES, aggregate_mode

    from xdsl.dialects.builtin import f32, f64, i32, i64

    mode = aggregate_mode({"f32": f32, "f64": f64, "i32": i32, "i64": i64}[el])
    agg_dtype = a.dtype if mode == "exact" else np.dtype(np.float64)
    agg = [np.empty((C, K), np.int64 if name == "E" else agg_dtype) for name in AGGREGATE_MODES[mode]]
    kagg = _aggregate_kernel(el, reverse)
    parts = split_range(K, threads, lanes)
    parallel_for([kagg.bind(av[:, lo:hi], bv[:, lo:hi], *(x[:, lo:hi] for x in agg)) for lo, hi in parts],
                 threads=threads)
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
        cr = _Carry(carry, dd=mode == "dd")
        seq = None
        with np.errstate(all="ignore"):
            for k in order:
                starts[:, k] = cr.start(a.dtype)
                hi, lo = cr.combine(agg, k)
                unsafe = ~np.isfinite(hi)
                if lo is not None:
                    unsafe |= ~np.isfinite(lo)
                if unsafe.any():
                    # The sequential loop's own steps for this chunk, from its start.
                    seq = seq or _affine_kernel(el, 2, True, True, reverse)
                    last = np.empty(C, a.dtype)
                    seq(av[:, k], bv[:, k], starts[:, k].copy(), hv[:, k], last)
                    done[k] = True
                    hi = np.where(unsafe, last.astype(np.float64), hi)
                    if lo is not None:
                        lo = np.where(unsafe, 0.0, lo)
                cr.hi, cr.lo = hi, lo
        carry = cr.start(a.dtype)
    # Phase 3: each chunk scanned from its carry, in parallel.
    ks = _affine_kernel(el, 3, True, False, reverse)
    runs = [(lo, hi) for lo, hi in _runs_without(done, parts)]
    tasks = [ks.bind(av[:, lo:hi], bv[:, lo:hi], starts[:, lo:hi], hv[:, lo:hi]) for lo, hi in runs]
    if tail and not reverse:
        ka = _affine_kernel(el, 2, True, final is not None, False)
        t_args = [a[:, main:], b[:, main:], carry, h[:, main:]] + ([final] if final is not None else [])
        tasks.append(lambda: ka(*t_args))
        parallel_for(tasks, threads=threads)
        return
    parallel_for(tasks, threads=threads)
    if final is not None:
        final[...] = carry


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


# ---------------------------------------------------------------------------
# Mamba selective scan
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def selective_scan_ir(spec: SelectiveScanSpec) -> str:
    """IR text of `func.func @selective_scan` (`workloads/selective.py`): one
    scan.recurrence per (batch, channel); its arguments, in order: u, delta (batch, D,
    L); A (D, N); B, C in the layout of their kind with time before the state index
    ((batch, L, N), (batch, G, L, N)) or (D, N); [D_skip (D,)]; [z (batch, D, L)];
    [delta_bias (D,)]; [h0 (batch, D, N)]; out (batch, D, L); [last (batch, D, N)];
    d_begin, d_end (index): the channels to run.
    """
    return kernel_ir("selective", spec=spec).text


def _bc_kind(x: np.ndarray, name: str, batch: int, D: int, N: int, L: int) -> tuple[str, np.ndarray]:
    """Classify B or C and put it in the kernel's layout (time before the state index)."""
    if x.ndim == 2:
        if x.shape != (D, N):
            raise ScanWeaverValueError(f"selective_scan_cpu: {name} of shape {x.shape}: expected (D, N) = {(D, N)}")
        return "const", np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 3:
        if x.shape != (batch, N, L):
            raise ScanWeaverValueError(f"selective_scan_cpu: {name} of shape {x.shape}: expected (batch, N, L) = {(batch, N, L)}")
        return "shared", np.ascontiguousarray(np.swapaxes(x, 1, 2), dtype=np.float32)
    if x.ndim == 4:
        G = x.shape[1]
        if x.shape[0] != batch or x.shape[2:] != (N, L) or G == 0 or D % G:
            raise ScanWeaverValueError(
                f"selective_scan_cpu: {name} of shape {x.shape}: expected (batch, G, N, L) with G dividing D = {D}"
            )
        return "grouped", np.ascontiguousarray(np.swapaxes(x, 2, 3), dtype=np.float32)
    raise ScanWeaverValueError(f"selective_scan_cpu: {name} must be 2-D, 3-D or 4-D, got shape {x.shape}")


def selective_scan_cpu(
    u: np.ndarray,
    delta: np.ndarray,
    A: np.ndarray,
    B: np.ndarray,
    C: np.ndarray,
    D: np.ndarray | None = None,
    z: np.ndarray | None = None,
    delta_bias: np.ndarray | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    h0: np.ndarray | None = None,
    threads: int | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Mamba's selective scan forward (shared/DESIGN.md section 2), computed in float32.

    u, delta, z: (batch, D, L); A: (D, N) real; B, C: (D, N), (batch, N, L) or
    (batch, G, N, L); D: (D,); delta_bias: (D,); h0: (batch, D, N) initial state.
    Returns out (batch, D, L) in u's dtype, and the last state (batch, D, N) float32
    with return_last_state.  No (batch, D, L, N) array is made: exp(dt*A) and
    dt*B*u are computed per step in registers, C.h is reduced on the fly.
    """
    out_dtype = np.asarray(u).dtype if np.asarray(u).dtype.kind == "f" else np.dtype(np.float32)
    f32 = lambda x: np.ascontiguousarray(x, dtype=np.float32)  # noqa: E731
    u, delta = f32(u), f32(delta)
    if u.ndim != 3 or delta.shape != u.shape:
        raise ScanWeaverValueError(f"selective_scan_cpu: u and delta must be (batch, D, L) of one shape, got {u.shape}, {delta.shape}")
    batch, Dn, L = u.shape
    A = np.asarray(A)
    if np.iscomplexobj(A):
        raise ScanWeaverTypeError("selective_scan_cpu: complex A is not supported (real A only)")
    A = f32(A)
    if A.ndim != 2 or A.shape[0] != Dn:
        raise ScanWeaverValueError(f"selective_scan_cpu: A must be (D, N) with D = {Dn}, got {A.shape}")
    N = A.shape[1]
    if not 0 < N <= 64:
        raise ScanWeaverValueError(f"selective_scan_cpu: state size N = {N} not supported (1..64)")
    b_kind, Bk = _bc_kind(np.asarray(B), "B", batch, Dn, N, L)
    c_kind, Ck = _bc_kind(np.asarray(C), "C", batch, Dn, N, L)
    where = "selective_scan_cpu"
    vec = lambda x, name: None if x is None else check_shape(name, f32(x), (Dn,), "(D,)", where)  # noqa: E731
    Dk, bias = vec(D, "D"), vec(delta_bias, "delta_bias")
    zk = None if z is None else check_shape("z", f32(z), u.shape, "(batch, D, L) like 'u'", where)
    h0k = None if h0 is None else check_shape("h0", f32(h0), (batch, Dn, N), "(batch, D, N)", where)
    spec = SelectiveScanSpec(N, b_kind, c_kind, Dk is not None, zk is not None, bias is not None,
                             bool(delta_softplus), h0k is not None, bool(return_last_state))
    ir = kernel_ir("selective", spec=spec)
    k = kernel(ir.text, ir.name, ir.args)
    out = np.empty((batch, Dn, L), np.float32)
    last = np.empty((batch, Dn, N), np.float32) if return_last_state else None
    arrays = [u, delta, A, Bk, Ck] + [x for x in (Dk, zk, bias, h0k) if x is not None] + [out]
    arrays += [last] if last is not None else []
    threads = num_threads() if threads is None else max(1, threads)
    if batch * Dn * L * N < (1 << 16):
        threads = 1
    # Several channel ranges per thread, taken dynamically: each is long (ms), so the
    # extra calls cost little and a core slowed by another process takes fewer.
    parts = split_range(Dn, min(Dn, threads * SELECTIVE_TASKS_PER_THREAD) if threads > 1 else 1)
    parallel_for([k.bind(*arrays, lo, hi) for lo, hi in parts], threads=threads)
    result = out.astype(out_dtype, copy=False)
    return (result, last) if return_last_state else result
