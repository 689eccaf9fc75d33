"""The CPU parallel driver: ScanWeaver's thread pool (`parallel_for` over kernel
calls, which release the GIL), `split_range`, and the control of LLVM's OpenMP
runtime used by the 'openmp' variant."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from scanweaver.runtime.cpu import flush_denormals

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
