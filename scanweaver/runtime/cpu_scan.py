"""Compiled CPU kernels for the API: affine scans and the Mamba selective scan.

Every kernel is IR text (a `scan.affine` or a `scan.recurrence` in a `func.func`)
compiled by `compile_cpu`, the only place that compiles: the scanweaver CPU pipeline
(raise, `scan-to-cpu`, canonicalize, cse), MLIR's CPU lowering, then the llvmlite JIT.
Compiled programs are cached in-process by IR text.

Calls go straight to the lowered function (memrefs expanded into pointer, offset,
sizes and strides) through ctypes, which releases the GIL for the foreign call: Python
threads then run kernels on both cores at once (`parallel_for`).

Around this module (the kernels' IR, the public drivers and their kernel getters):
  cpu_jit.py          compile_cpu and its cache, Kernel (the ctypes calling layer)
  cpu_object_call.py  the one-pointer-per-array trampoline of small calls
  cpu_parallel.py     the thread pool, split_range, OpenMP thread count and waiting policy
  cpu_variants.py     which variant runs a shape, the aligned output buffer
  cpu_chunked.py      the time-chunked variant
  cpu_time_lanes.py   the time-lanes variant (integer rows)

Variants of `affine_scan_cpu`, chosen by shape (see `choose_affine_variant`):
  single    one call (small inputs: threads cost more than they save)
  channels  rows split across threads, each thread a row-slice view
  openmp    one call of a kernel whose loop over channel groups is an OpenMP
            work-sharing loop (`scan-to-cpu{parallel_channels}` + convert-scf-to-openmp,
            LLVM's libomp); libomp's workers spin a while between calls, where the
            Python pool's block
  time_lanes  int32 rows with time in the vector lanes (cpu_time_lanes.py): three
            streams per row, a log-step scan inside each vector; exact for integers only
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

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from scanweaver.dtypes import COMPLEX_ELEMENTS, mlir_element
from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cpu import CpuProgram
from scanweaver.runtime.cpu_jit import STATS, CompileStats, Kernel, clear_cache, compile_cpu, kernel, on_clear_cache
from scanweaver.runtime.cpu_selective_exp import scalef_exp
from scanweaver.runtime.cpu_parallel import (
    num_threads,
    openmp_available,
    parallel_for,
    prepare_openmp,
    split_range,
)
from scanweaver.runtime.cpu_variants import (
    CHUNKED_MIN_LENGTH,
    OPENMP_MIN_ELEMENTS,
    SELECTIVE_TASKS_PER_THREAD,
    TASKS_PER_THREAD,
    THREAD_MIN_BYTES,
    THREAD_MIN_ELEMENTS,
    _lanes,
    aligned_empty,
    choose_affine_variant,
)
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.runtime.validation import check_shape
from scanweaver.workloads.specs import SelectiveScanSpec

# ---------------------------------------------------------------------------
# Affine scans
# ---------------------------------------------------------------------------

#: Variants a complex scan runs as: the kernel is the sequential loop on (re, im)
#: pairs (scan-complex-to-real), parallel across channels only.
COMPLEX_VARIANTS = ("single", "channels")
_CPU_ELEMENTS = ("f32", "f64", "i32", "i64", *COMPLEX_ELEMENTS)  # f16 inputs are widened to f32 before


def _mlir_el(dtype: np.dtype) -> str:
    el = mlir_element(dtype, _CPU_ELEMENTS)
    if el is None:
        raise ScanWeaverTypeError(
            f"affine_scan_cpu: dtype {np.dtype(dtype)} is not supported "
            "(float32, float64, int32, int64, complex64, complex128)"
        )
    return el


def _affine_options(el: str, rank: int, init: bool, final: bool, reverse: bool) -> dict:
    """The affine workload of the drivers: dynamic shape, scan along the last axis."""
    return dict(shape=("?",) * rank, axis=rank - 1, in_el=el, state_el=el,
                init=init, final=final, reverse=reverse, name="affine")


def affine_ir(el: str, rank: int = 2, init: bool = False, final: bool = False, reverse: bool = False,
              cached_only: bool = False) -> str | None:
    """IR text: `func.func @affine(a, b, [h0], h, [hT])` holding one dynamic-shape scan.affine
    (cached_only: None where it is not in the disk cache yet)."""
    ir = kernel_ir("affine", cached_only=cached_only, **_affine_options(el, rank, init, final, reverse))
    return None if ir is None else ir.text


@functools.lru_cache(maxsize=None)
def _affine_kernel(el: str, rank: int, init: bool, final: bool, reverse: bool) -> Kernel:
    real = el in ("f32", "f64", "i32", "i64")
    if real:
        # A cold first call runs the sequential loop built without xDSL (same bits) while
        # the tile kernel compiles in the background (cpu_tiers.py).
        from scanweaver.runtime.cpu_tiers import affine_loop_tier

        first = affine_loop_tier(el, rank, init, final, reverse)
        if first is not None:
            return first
    ir = kernel_ir("affine", **_affine_options(el, rank, init, final, reverse))
    return kernel(ir.text, ir.name, ir.args, tiered=real)


@functools.lru_cache(maxsize=None)
def _aggregate_kernel(el: str, reverse: bool) -> Kernel:
    """The chunk-aggregate kernel: built already lowered (vector/scf/arith), so it goes
    straight to MLIR's CPU lowering (the xDSL stages would only re-parse it: ~8 s)."""
    from xdsl.dialects.builtin import f32, f64, i32, i64

    from scanweaver.compiler import cpu_llvm_ir
    from scanweaver.rewrites.cpu_aggregate_arith import AGGREGATE_MODES, aggregate_mode
    from scanweaver.rewrites.cpu_chunk_aggregates import build_chunk_aggregate

    t = {"f32": f32, "f64": f64, "i32": i32, "i64": i64}[el]
    llvm_ir, _ = cpu_llvm_ir(build_chunk_aggregate(t, 3, reverse))
    spec = [3, 3] + [2] * len(AGGREGATE_MODES[aggregate_mode(t)])
    return Kernel(CpuProgram(llvm_ir), "aggregate", spec)





@functools.lru_cache(maxsize=None)
def _openmp_affine_kernel(el: str, init: bool, final: bool, reverse: bool) -> Kernel:
    ir = kernel_ir("affine", **_affine_options(el, 2, init, final, reverse))
    return Kernel(compile_cpu(ir.text, openmp=True), ir.name, ir.args)

for _getter in (_affine_kernel, _aggregate_kernel, _openmp_affine_kernel):
    on_clear_cache(_getter.cache_clear)


#: Per (dtype, reverse, final): the small-call function (or False: not available).
_SMALL_CALLS: dict[tuple, Callable[..., None] | bool] = {}


def small_affine_scan(a: np.ndarray, b: np.ndarray, reverse: bool, return_final: bool):
    """The scan of small C-contiguous 2-D ndarrays a, b (one dtype, one shape) in one
    call of the single-variant kernel through the object-call trampoline: h, and the
    final state with return_final; None when the call is not such a call (callers
    then take the general path).  The same kernel and result as `affine_scan_cpu`.
    """
    if a.ndim != 2 or a.shape != b.shape or a.size >= THREAD_MIN_ELEMENTS:
        return None
    if not (a.flags.c_contiguous and b.flags.c_contiguous):
        return None
    key = (a.dtype, b.dtype, reverse, return_final)
    call = _SMALL_CALLS.get(key)
    if call is None:
        call = False
        el = mlir_element(a.dtype, ("f32", "f64", "i32", "i64"))  # real scans only: one element per item
        if a.dtype == b.dtype and el is not None:
            k = _affine_kernel(el, 2, False, return_final, reverse)
            if getattr(k.program, "upgraded", True) is False:
                # On a cold first tier (cpu_tiers.py): the ordinary path for now; the
                # trampoline (a linked shared object: ld, subprocess) once the full build is in.
                return None
            from scanweaver.runtime.cpu_object_call import object_caller

            call = object_caller(k.program.address("affine"), k.spec, [a.itemsize] * len(k.spec)) or False
            if call:
                call.kernel = k  # type: ignore[attr-defined]  # keeps the kernel's program alive
        _SMALL_CALLS[key] = call
    if call is False:
        return None
    h = np.empty(a.shape, a.dtype)
    if return_final:
        final = np.empty(a.shape[0], a.dtype)
        call(a, b, h, final)  # type: ignore[operator]
        return h, final
    call(a, b, h)  # type: ignore[operator]
    return h


def _complex_variant(channels: int, length: int, dtype: np.dtype, threads: int) -> str:
    """'channels' when there are rows for every thread and enough work, else 'single'."""
    total = channels * length
    if threads > 1 and channels >= 2 * threads and total >= THREAD_MIN_ELEMENTS // 4:
        return "channels"
    return "single"


on_clear_cache(_SMALL_CALLS.clear)


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
    'chunked', 'openmp' or 'time_lanes' (integers only) (default: by shape, `choose_affine_variant`).  out: a C-contiguous
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
    if a.dtype.kind == "c":
        variant = variant or _complex_variant(C, L, a.dtype, threads)
        if variant not in COMPLEX_VARIANTS:
            raise ScanWeaverValueError(
                f"affine_scan_cpu: variant {variant!r} does not take complex dtypes "
                f"(complex scans run as {' or '.join(map(repr, COMPLEX_VARIANTS))})"
            )
    variant = variant or choose_affine_variant(C, L, a.dtype, threads)
    # The chunked and time-lane variants are imported where chosen (a selective
    # scan's cold first call does not load them).
    if variant == "chunked" and L >= 2:
        from scanweaver.runtime.cpu_chunked import _chunked

        _chunked(a, b, h0, h, final, reverse, threads, el, _affine_kernel, _aggregate_kernel)
    elif variant == "time_lanes":
        from scanweaver.runtime.cpu_time_lanes import time_lanes_scan

        time_lanes_scan(a, b, h0, h, final, reverse, threads)
    elif variant == "openmp":
        k = _openmp_affine_kernel(el, h0 is not None, final is not None, reverse)
        prepare_openmp(threads)
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
        raise ScanWeaverValueError(f"affine_scan_cpu: unknown variant {variant!r} (single, channels, chunked, openmp, time_lanes)")
    return (h, final) if return_final else h


#: Elements per array of one staged segment (affine_scan_staged): 16 MB of f32.
#: Elements per staging segment: 1 MB per f32 buffer, so the three buffers of a segment
#: stay in the L2 caches while it is copied in, scanned and copied out (faster than
#: 16 MB segments that go through memory, measured) and the extra memory is 3 MB.
SEGMENT_ELEMENTS = 1 << 18


def affine_scan_staged(a: np.ndarray, b: np.ndarray, h0: np.ndarray | None, reverse: bool,
                       state_dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """h (C-contiguous, state dtype) and the final state of the scan of (channels, L)
    arrays a, b of any strides and of a dtype that widens to `state_dtype` (float16 to
    float32), without full-size copies: when a and b are not already C-contiguous
    state-dtype arrays, the time axis is cut into segments of about SEGMENT_ELEMENTS
    elements, each staged into contiguous buffers (widened on the way) and scanned
    from the previous segment's final state (last segment first when reversed): the
    sequential order of the steps is kept, and only three segment buffers are extra.
    """
    state_dtype = np.dtype(state_dtype)
    if (a.dtype == state_dtype and b.dtype == state_dtype and a.flags.c_contiguous and b.flags.c_contiguous) \
            or a.size == 0:
        return affine_scan_cpu(a.astype(state_dtype, copy=False), b.astype(state_dtype, copy=False), h0,
                               reverse=reverse, return_final=True)
    C, L = a.shape
    seg = max(1, min(L, SEGMENT_ELEMENTS // C))
    h = aligned_empty((C, L), state_dtype)
    bufs = [aligned_empty((C * seg,), state_dtype) for _ in range(3)]
    starts = list(range(0, L, seg))
    carry = h0
    for t0 in reversed(starts) if reverse else starts:
        t1 = min(L, t0 + seg)
        sa, sb, sh = (x[: C * (t1 - t0)].reshape(C, t1 - t0) for x in bufs)
        np.copyto(sa, a[:, t0:t1])
        np.copyto(sb, b[:, t0:t1])
        _, carry = affine_scan_cpu(sa, sb, carry, reverse=reverse, return_final=True, out=sh)
        h[:, t0:t1] = sh
    return h, carry



# ---------------------------------------------------------------------------
# Mamba selective scan
# ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def selective_scan_ir(spec: SelectiveScanSpec) -> str:
    """IR text of the driver's kernel `func.func @selective_scan_tiled`
    (`workloads/selective.py`): per (batch, chunk of channels), time tiles with B and C
    staged transposed on the stack; its arguments, in order: u, delta (batch, D, L); A
    (D, N); B, C in the caller's layout ((batch, N, L), (batch, G, N, L)) or (D, N);
    [D_skip (D,)]; [z (batch, D, L)]; [delta_bias (D,)]; [h0 (batch, D, N)]; out
    (batch, D, L); [last (batch, D, N)]; d_begin, d_end (index): the channels to run.
    """
    return kernel_ir("selective_tiled", spec=spec, scalef=scalef_exp()).text


def _bc_kind(x: np.ndarray, name: str, batch: int, D: int, N: int, L: int) -> tuple[str, np.ndarray]:
    """Classify B or C; it stays in the caller's layout (the kernel stages small
    transposed tiles itself), made float32 C-contiguous (no copy when it is already)."""
    if x.ndim == 2:
        if x.shape != (D, N):
            raise ScanWeaverValueError(f"selective_scan_cpu: {name} of shape {x.shape}: expected (D, N) = {(D, N)}")
        return "const", np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 3:
        if x.shape != (batch, N, L):
            raise ScanWeaverValueError(f"selective_scan_cpu: {name} of shape {x.shape}: expected (batch, N, L) = {(batch, N, L)}")
        return "shared", np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 4:
        G = x.shape[1]
        if x.shape[0] != batch or x.shape[2:] != (N, L) or G == 0 or D % G:
            raise ScanWeaverValueError(
                f"selective_scan_cpu: {name} of shape {x.shape}: expected (batch, G, N, L) with G dividing D = {D}"
            )
        return "grouped", np.ascontiguousarray(x, dtype=np.float32)
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
    ir = kernel_ir("selective_tiled", spec=spec, scalef=scalef_exp())
    k = kernel(ir.text, ir.name, ir.args)
    # Cache-line aligned: with L a multiple of 16 each 16-step store is one line, not two
    # (not from the affine scan's output cache: the selective output is allocated afresh).
    out = aligned_empty((batch, Dn, L), np.float32, reuse=False)
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


__all__ = [  # the names callers import from here (some defined in cpu_jit, cpu_parallel, cpu_variants)
    "CHUNKED_MIN_LENGTH", "OPENMP_MIN_ELEMENTS", "STATS", "SELECTIVE_TASKS_PER_THREAD", "TASKS_PER_THREAD",
    "THREAD_MIN_BYTES", "THREAD_MIN_ELEMENTS", "CompileStats", "Kernel", "SelectiveScanSpec", "affine_ir",
    "affine_scan_cpu", "aligned_empty", "choose_affine_variant", "clear_cache", "compile_cpu", "kernel",
    "num_threads", "openmp_available", "parallel_for", "selective_scan_cpu", "selective_scan_ir",
    "small_affine_scan", "split_range", "affine_scan_staged", "SEGMENT_ELEMENTS",
]
