"""The affine-scan variant heuristics: which variant (`single`, `channels`,
`chunked`, `openmp`, `time_lanes`) runs a (channels, length) scan, and the aligned output buffer."""

from __future__ import annotations

import math
import os
import sys
import threading
from typing import Any

import numpy as np

from scanweaver.runtime.cpu_parallel import env_int, gnu_neighbour_parallel, num_threads, openmp_available

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
#: f64: only a single row this long is cut in time (see choose_affine_variant).
F64_CHUNKED_MIN_LENGTH = 1 << 22


def choose_affine_variant(channels: int, length: int, dtype: np.dtype, threads: int | None = None) -> str:
    """'single', 'channels', 'chunked', 'openmp' or 'time_lanes' for a (channels, length) scan.

    Threads only pay for inputs larger than the shared cache: below THREAD_MIN_BYTES of
    traffic one core already streams at cache bandwidth (measured here: 1024x1024 f32,
    12 MB, 0.32 ms on one core, 0.34-0.43 ms on two; 1024x4096, 48 MB, 2.8 ms on one
    core, 1.8 ms on two).
    """
    threads = num_threads() if threads is None else threads
    total = channels * length
    # f64 rows are cut in time only when there is a single long row: their compensated
    # (double-double) chunk aggregates cost about what the time parallelism saves
    # (measured here, 2 cores, 1x2^20: 3.3 ms chunked, 3.3 ms single; 3x2^20: 6.9 ms vs
    # 3.6 ms), but one row fills one lane of four, so the bit-identical variants are
    # latency-bound on one chain (1x2^24: 183-206 ms single, 150-156 ms chunked on the
    # loaded 2-core machine; about 2.9 ns CPU per element chunked against 6.5 single).
    if np.dtype(dtype) == np.float64:
        chunkable = channels == 1 and length >= F64_CHUNKED_MIN_LENGTH
    else:
        chunkable = True
    small = total < THREAD_MIN_ELEMENTS or 3 * total * np.dtype(dtype).itemsize < THREAD_MIN_BYTES
    # i32 rows with time in the lanes (exact): three streams per row instead of 3 * 8, one
    # pass over memory.  Taken for fewer rows than lanes, where the tiles leave lanes
    # empty; with full lane groups the tiles do less work per step (measured here, one
    # core, 1024x256: 0.20 ms tiles, 0.28 ms time lanes; 4x16384: 0.12 vs 0.09 ms), and
    # in the harness (stop 21) time lanes for every out-of-cache shape lost to numba at
    # 1024x4096, 64x65536 and 16384x256 where the tiles had beaten it.
    if np.dtype(dtype) == np.int32 and channels < _lanes(dtype):
        return "time_lanes"
    if threads > 1 and channels >= 2 * _lanes(dtype) * threads and total >= OPENMP_MIN_ELEMENTS and openmp_available() \
            and gnu_neighbour_parallel() is None:  # else parallel_for runs on the neighbour's threads
        return "openmp"
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


#: Outputs of at least this many bytes are kept for reuse once the caller drops them.
#: glibc serves smaller allocations from its heap, reused without page faults, but maps
#: every one above its mmap threshold (at most 32 MiB) afresh, and the kernel then
#: faults in and zeroes each page of a new output on first touch: measured here, a
#: fresh 32 MiB buffer cost about 530 faults and 3.5-4.2 ms of system time per call, a
#: 16 MiB one none (0.04 ms), and that time varies from run to run with the host's
#: memory (transparent huge pages are compacted on fault).
OUTPUT_CACHE_MIN_BYTES = 32 << 20
#: The cache's cap (buffers in use and free together); SCANWEAVER_OUTPUT_CACHE_MB
#: overrides it, 0 turns the cache off.  Memory it keeps after the caller frees its
#: results: at most this.
OUTPUT_CACHE_BYTES = 256 << 20


def _output_cache_cap() -> int:
    env = os.environ.get("SCANWEAVER_OUTPUT_CACHE_MB")
    return OUTPUT_CACHE_BYTES if not env else max(0, env_int("SCANWEAVER_OUTPUT_CACHE_MB", env)) << 20


def _refs(bufs: list, i: int) -> int:
    return sys.getrefcount(bufs[i])


_UNHELD = _refs([object()], 0)  # the count of a list entry nothing else refers to


class _OutputCache:
    """Large raw output buffers, reused once nothing outside the cache refers to them.

    Every view of a buffer (the result, its reshapes and slices, a tensor made from it)
    holds a reference to it, so a buffer whose only reference is the cache's own is free:
    its old contents are garbage, as in np.empty.
    """

    def __init__(self) -> None:
        self._bufs: list[np.ndarray] = []  # oldest first
        self._lock = threading.Lock()

    def view(self, nbytes: int, align: int, min_bytes: int = OUTPUT_CACHE_MIN_BYTES) -> np.ndarray | None:
        """`nbytes` bytes starting on an `align`-byte boundary (a uint8 view), or None
        where the cache does not take buffers of this size (under `min_bytes`)."""
        cap = _output_cache_cap()
        if nbytes < min_bytes or nbytes + align > cap:
            return None
        with self._lock:  # the view is made before another thread can see the buffer free
            for i in range(len(self._bufs)):
                if self._bufs[i].nbytes == nbytes + align and _refs(self._bufs, i) == _UNHELD:
                    return _aligned_part(self._bufs[i], nbytes, align)
            raw = np.empty(nbytes + align, np.uint8)
            out = _aligned_part(raw, nbytes, align)
            self._bufs.append(raw)
            self._evict(cap)
            return out

    def _evict(self, cap: int) -> None:
        """Forget buffers, free ones first, oldest first, until the cap holds (a buffer
        still in use lives on with its user, out of the cache)."""
        while sum(x.nbytes for x in self._bufs) > cap:
            free = [i for i in range(len(self._bufs)) if _refs(self._bufs, i) == _UNHELD]
            del self._bufs[free[0] if free else 0]

    def clear(self) -> None:
        with self._lock:
            self._bufs.clear()


_OUTPUTS = _OutputCache()


def release_outputs() -> None:
    """Drop the cached output buffers (their memory goes back once unused)."""
    _OUTPUTS.clear()


def _aligned_part(raw: np.ndarray, nbytes: int, align: int) -> np.ndarray:
    skip = (-raw.ctypes.data) % align
    return raw[skip : skip + nbytes]


def aligned_empty(shape: tuple[int, ...], dtype: Any, align: int = 64, reuse: bool = True,
                  min_bytes: int = OUTPUT_CACHE_MIN_BYTES) -> np.ndarray:
    """np.empty(shape, dtype) whose data starts on an `align`-byte boundary.

    numpy's large allocations typically start 16 bytes past a 64-byte boundary; the
    tiled affine kernel stores h with non-temporal (streaming) stores only when its
    rows start on a 64-byte cache line, so outputs allocated here (and rows whose length
    is a multiple of 64 bytes) take the faster path.  Buffers of OUTPUT_CACHE_MIN_BYTES
    and more come from `_OutputCache` (no page faults when the caller has dropped an
    earlier result of the same size); `reuse=False`: never from the cache; `min_bytes`:
    the smallest buffer taken from the cache (a caller whose buffers glibc maps afresh
    at smaller sizes may lower it: the selective scan's backward).
    """
    dtype = np.dtype(dtype)
    n = math.prod(shape) * dtype.itemsize  # (np.prod: ~10 us a call)
    part = _OUTPUTS.view(n, align, min_bytes) if reuse else None
    if part is None:
        part = _aligned_part(np.empty(n + align, np.uint8), n, align)
    return part.view(dtype).reshape(shape)
