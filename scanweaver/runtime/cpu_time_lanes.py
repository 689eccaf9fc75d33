"""The `time_lanes` variant of `affine_scan_cpu` for integer rows: time in the vector
lanes (`rewrites/cpu_affine_time_lanes.py`), rows split across threads.  Exact (integer
wrap-around arithmetic is associative), so its results are the loop's bit for bit."""

from __future__ import annotations

import functools

import numpy as np

from scanweaver.errors import ScanWeaverTypeError
from scanweaver.runtime.cpu_jit import Kernel, on_clear_cache
from scanweaver.runtime.cpu_parallel import parallel_for, split_range

#: The element types the variant takes (numpy dtype name -> MLIR).
TIME_LANES_DTYPES = {"int32": "i32", "int64": "i64"}


@functools.lru_cache(maxsize=None)
def vector_bits() -> int:
    """512 on a CPU with AVX-512F (as LLVM targets it): the log-step scan then takes
    fewer instructions per step (measured here, one core, 2x2^20 i32: 0.80 against
    1.06 ns per step, ad hoc); 256 otherwise."""
    import llvmlite.binding as llvm

    from scanweaver.runtime.cpu import _init_llvm

    _init_llvm()
    return 512 if llvm.get_host_cpu_features().get("avx512f") else 256


@functools.lru_cache(maxsize=None)
def _time_lanes_kernel(el: str, reverse: bool) -> Kernel:
    """Built already lowered, like the chunk aggregates: straight to MLIR's CPU lowering."""
    from xdsl.dialects.builtin import i32, i64

    from scanweaver.compiler import cpu_llvm_ir
    from scanweaver.rewrites.cpu_affine_time_lanes import build_time_lanes_scan
    from scanweaver.runtime.cpu import CpuProgram

    llvm_ir, _ = cpu_llvm_ir(build_time_lanes_scan({"i32": i32, "i64": i64}[el], reverse, vector_bits()))
    return Kernel(CpuProgram(llvm_ir), "affine_time_lanes", [2, 2, 1, 2, 1])


on_clear_cache(_time_lanes_kernel.cache_clear)


def time_lanes_scan(a: np.ndarray, b: np.ndarray, h0: np.ndarray | None, h: np.ndarray,
                    final: np.ndarray | None, reverse: bool, threads: int) -> None:
    """h (and final) of the C-contiguous integer (C, L) rows a, b; rows cut into one
    piece per thread."""
    if a.dtype.name not in TIME_LANES_DTYPES:  # a float scan would be reassociated
        raise ScanWeaverTypeError(
            f"affine_scan_cpu: variant 'time_lanes' takes int32 and int64 only, got {a.dtype}"
        )
    C = a.shape[0]
    k = _time_lanes_kernel(TIME_LANES_DTYPES[a.dtype.name], reverse)
    start = np.zeros(C, a.dtype) if h0 is None else h0
    last = np.empty(C, a.dtype) if final is None else final
    if C == 1 and threads > 1 and not reverse and _parts_scan(a, b, start, h, last, threads, k):
        return
    parts = split_range(C, threads)
    parallel_for([k.bind(a[lo:hi], b[lo:hi], start[lo:hi], h[lo:hi], last[lo:hi]) for lo, hi in parts],
                 threads=threads)


# ---- One long row on several threads, in parts (exact: integer arithmetic is a ring).
#
# Thread 0 scans the first part P1 while threads 1..n-1 compute the aggregates
# (A, B) = (prod a, scan from 0) of P2..Pn in chunks (the chunked variant's exact
# aggregate kernel); the carries into P2..P(n+1) then follow one after the other (P2:
# P1's last state; P(i+1): A * carry + B over P_i's chunks, wrapping), and n threads
# scan P2..P(n+1) from them.  An aggregate step costs less than a scan step, so P1 is
# shorter than the others by about that ratio.

#: A single row at least this long (per thread) is cut into parts.
PARTS_MIN_STEPS_PER_THREAD = 1 << 17
#: An aggregate step's cost over a time-lanes scan step's (ad hoc, one core, 2^22 i32
#: steps: 0.63-0.70 against 1.13-1.18 ns per step).
PARTS_AGGREGATE_COST = 0.55
#: Chunks per aggregated part (four tiles of lanes: independent chains).
PARTS_CHUNKS = 32


def _part_cuts(L: int, n: int, unit: int) -> list[int]:
    y = L / (n + PARTS_AGGREGATE_COST)
    return [0] + [round((PARTS_AGGREGATE_COST * y + i * y) / unit) * unit for i in range(n)] + [L]


def _parts_scan(a: np.ndarray, b: np.ndarray, start: np.ndarray, h: np.ndarray, last: np.ndarray,
                threads: int, k: Kernel, min_steps: int = PARTS_MIN_STEPS_PER_THREAD) -> bool:
    """The one row of a, b scanned in parts on `threads` threads; False (nothing
    done) when the row is shorter than `min_steps` per thread."""
    from scanweaver.runtime.cpu_scan import _aggregate_kernel

    L = a.shape[1]
    if L < min_steps * threads:
        return False
    unit = PARTS_CHUNKS * 16  # chunks of whole vectors
    cuts = _part_cuts(L, threads, unit)
    parts = list(zip(cuts, cuts[1:]))
    if any(hi - lo < unit for lo, hi in parts):
        return False
    kagg = _aggregate_kernel(TIME_LANES_DTYPES[a.dtype.name], False)

    def chunks(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
        return x[:, lo:hi].reshape(1, PARTS_CHUNKS, (hi - lo) // PARTS_CHUNKS)

    lasts = [np.empty(1, a.dtype) for _ in parts]
    aggs = [(np.empty((1, PARTS_CHUNKS), a.dtype), np.empty((1, PARTS_CHUNKS), a.dtype)) for _ in parts[1:-1]]
    lo, hi = parts[0]
    tasks = [k.bind(a[:, lo:hi], b[:, lo:hi], start, h[:, lo:hi], lasts[0])]
    tasks += [kagg.bind(chunks(a, lo, hi), chunks(b, lo, hi), *agg) for (lo, hi), agg in zip(parts[1:-1], aggs)]
    parallel_for(tasks, threads=threads)
    carries = [lasts[0]]
    with np.errstate(over="ignore"):  # wrap-around, as the loop
        for A, B in aggs:
            c = carries[-1].copy()
            for j in range(PARTS_CHUNKS):
                c = A[:, j] * c + B[:, j]
            carries.append(c)
    parallel_for([k.bind(a[:, lo:hi], b[:, lo:hi], c, h[:, lo:hi], out)
                  for (lo, hi), c, out in zip(parts[1:], carries, lasts[1:])], threads=threads)
    last[...] = lasts[-1]
    return True
