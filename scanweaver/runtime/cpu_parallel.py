"""The CPU parallel driver: ScanWeaver's thread pool (`parallel_for` over kernel
calls, which release the GIL), `split_range`, and the control of LLVM's OpenMP
runtime used by the 'openmp' variant (thread count, and how its workers wait when
another OpenMP runtime shares the process)."""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence

from scanweaver.runtime.cpu import flush_denormals

# ---------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------

class _Task:
    """One submitted callable: `result()` waits for it and re-raises its exception."""

    def __init__(self, fn: Callable[[], None]):
        self._fn, self._done, self._error = fn, threading.Event(), None

    def run(self) -> None:
        try:
            self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self._error = e
        finally:
            self._done.set()

    def result(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error


class _Workers:
    """Daemon threads that run submitted callables: what parallel_for needs of
    concurrent.futures' pool, without its import (~20 ms of a first call, logging
    included).  Idle workers block on the queue; parallel_for waits for every task it
    submits, so no kernel runs when the interpreter exits."""

    def __init__(self, count: int):
        import queue

        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        for i in range(count):
            threading.Thread(target=self._serve, name=f"scanweaver_{i}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._jobs.get().run()

    def submit(self, fn: Callable[[], None]) -> _Task:
        task = _Task(fn)
        self._jobs.put(task)
        return task


_POOL: _Workers | None = None
_POOL_LOCK = threading.Lock()


def env_int(name: str, value: str) -> int:
    """An integer environment variable's value; one clear error where it is not one."""
    try:
        return int(value)
    except ValueError:
        from scanweaver.errors import ScanWeaverValueError

        raise ScanWeaverValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def num_threads() -> int:
    """Worker count: SCANWEAVER_NUM_THREADS, else the CPUs this process may use."""
    env = os.environ.get("SCANWEAVER_NUM_THREADS")
    if env:
        return max(1, env_int("SCANWEAVER_NUM_THREADS", env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _pool() -> _Workers:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = _Workers(max(1, num_threads() - 1))
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
    neighbour = gnu_neighbour_parallel()
    if neighbour is not None:
        _run_on_gnu_threads(neighbour, work, threads)
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


# ---- Waiting policy of libomp's workers beside another OpenMP runtime
#
# After a parallel region libomp's workers spin for KMP_BLOCKTIME (200 ms) before
# sleeping: alone that makes the next call start at once, but beside GNU libgomp
# (PyTorch, numba's omp layer; its workers spin too) or Intel's libiomp the two
# runtimes' spinning threads take each other's cores.  So when a foreign OpenMP
# runtime is mapped into the process, ScanWeaver's workers sleep as soon as a region
# ends (kmp_set_blocktime(0)): the neighbour keeps its cores, and ScanWeaver pays one
# wake-up per call (microseconds against milliseconds of work).  SCANWEAVER_OMP_BLOCKTIME
# (milliseconds) sets the blocktime whatever is loaded.

_FOREIGN = {"checked": -1e9, "found": False}
FOREIGN_RECHECK_S = 1.0  # libraries load while a program runs: look again at most this often


def foreign_openmp_loaded() -> bool:
    """Whether GNU libgomp or Intel libiomp is mapped into this process."""
    now = time.monotonic()
    if not _FOREIGN["found"] and now - _FOREIGN["checked"] > FOREIGN_RECHECK_S:
        try:
            with open("/proc/self/maps") as maps:
                text = maps.read()
        except OSError:  # not Linux: nothing to look at
            text = ""
        _FOREIGN["found"] = "libgomp" in text or "libiomp" in text
        _FOREIGN["checked"] = now
    return bool(_FOREIGN["found"])


@functools.lru_cache(maxsize=None)
def _omp_set_blocktime() -> Callable[[int], None]:
    from scanweaver.runtime.cpu import load_openmp_runtime

    fn = ctypes.CDLL(load_openmp_runtime()).kmp_set_blocktime
    fn.argtypes, fn.restype = [ctypes.c_int], None
    return fn


def openmp_blocktime() -> int | None:
    """The blocktime (ms) ScanWeaver's OpenMP calls use now; None: libomp's default."""
    env = os.environ.get("SCANWEAVER_OMP_BLOCKTIME")
    if env:
        return max(0, int(env))
    return 0 if foreign_openmp_loaded() else None


def prepare_openmp(threads: int) -> None:
    """Thread count and waiting policy for the calling thread's next OpenMP region."""
    _set_openmp_threads(threads)
    blocktime = openmp_blocktime()
    if blocktime is not None and getattr(_OMP_THREADS, "blocktime", None) != blocktime:
        _omp_set_blocktime()(blocktime)  # a per-thread setting, like the thread count
        _OMP_THREADS.blocktime = blocktime


# ---- Sharing the threads of a neighbour on GNU libgomp (numba's omp layer)
#
# libgomp's workers spin about 3 ms after each parallel region here (GOMP_SPINCOUNT's
# 300000 pauses; measured as the CPU a numba prange call's worker burns while the
# caller sleeps), and nothing outside libgomp can shorten that once it started.  A
# ScanWeaver call right after numba's (a loop alternating the two) shares one of its
# two cores with that spinning thread, whichever pool it runs on.  The spinning
# thread waits for libgomp's next region, so ScanWeaver gives it one: parallel_for
# runs its tasks inside the neighbour's GOMP_parallel, on the neighbour's threads,
# and the two libraries take turns on one thread pool.
#
# Which runtime numba's omp layer calls is fixed when it first runs: the dynamic
# linker resolves its GOMP_* symbols to the first library of the global scope that
# defines them, and libomp, loaded RTLD_GLOBAL, defines them too.  So numba code that
# starts after ScanWeaver first loads libomp (`share_libomp`, from `openmp_available`:
# the first call large enough for the 'openmp' variant) runs on libomp, as
# ScanWeaver's own regions do: nothing to adopt.  numba code that started before runs
# on GNU libgomp.  Then parallel_for adopts its threads (and the 'openmp' variant is
# not chosen) when
#   - one of them spins (state R in /proc: a region ended less than ~3 ms ago), and
#   - numba's own code left one spinning within the last ADOPT_FOR_S: seen spinning
#     after all were seen asleep, or busy on a CPU, since ScanWeaver's last region
#     there, for more than twice what they spin after one of its regions (schedstat,
#     not wall time: a thread waiting for a loaded CPU is in state R too), and
#   - the machine is not oversubscribed (1-minute load average above
#     OVERSUBSCRIBED_LOAD per CPU), where libgomp's spinning barriers cost ScanWeaver
#     more than the neighbour's spinning does.
# Otherwise ScanWeaver's own runtime runs the call as it would alone; a spin that
# ScanWeaver's own last call caused does not keep it on libgomp beside another
# neighbour (PyTorch's own libgomp, whose workers spin too).  Measured here, 1024x4096
# f32 alternating with numba prange in one process: at load 10 on the 2 cores, 24 ms a
# call on libgomp's threads against 17.5 ms on libomp; with the machine to itself
# (SCHED_FIFO), 1.70-3.00 ms on libgomp's threads against 2.58-4.08 ms on libomp, and
# alone (back to back) 1.66-2.66 ms on either.
# SCANWEAVER_ADOPT_GOMP=0 turns the adoption off, =1 on whatever the load.

_GOMP_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_NUMBA_OMP = "numba.np.ufunc.omppool"  # numba's omp threading layer (a C extension)
_SHARED = {"checked": False, "libomp_global": False, "numba_before": False}
_GNU_WORKERS: set[int] = set()  # native ids of libgomp threads that ran our tasks
ADOPT_FOR_S = 0.1  # after a spinning worker that numba left: adopt while one spins, this long
# The workers' CPU seconds when ScanWeaver's last libgomp region ended, whether all were
# seen asleep since, the least CPU they spent spinning after one of its regions (the
# spin alone: about 3 ms here), and until when to adopt.
_GNU: dict = {"cpu_at_ours": 0.0, "slept": True, "spin_cpu": None, "until": -1e9}
OVERSUBSCRIBED_LOAD = 2.0  # runnable threads per CPU (1-minute average) from which libgomp is avoided
_LOAD = {"checked": -1e9, "over": False}


def share_libomp() -> None:
    """Note, once, whether numba's omp layer had started before ScanWeaver loads libomp
    (LLVM's loader opens it RTLD_GLOBAL): numba code that starts after runs on it."""
    if _SHARED["checked"]:
        return
    from scanweaver.errors import BackendUnavailableError
    from scanweaver.runtime.cpu import load_openmp_runtime

    _SHARED.update(checked=True, numba_before=_NUMBA_OMP in sys.modules)
    try:
        load_openmp_runtime()
    except BackendUnavailableError:  # no libomp: numba stays on libgomp
        return
    _SHARED["libomp_global"] = True


@functools.lru_cache(maxsize=None)
def _gomp_parallel(library: str) -> Callable | None:
    """GOMP_parallel as `library` links it (dlsym on its handle searches its
    dependencies: omppool's own libgomp), or None."""
    try:
        fn = ctypes.CDLL(library).GOMP_parallel
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [_GOMP_BODY, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint], None
    return fn


def gnu_neighbour_parallel() -> Callable | None:
    """GOMP_parallel of the GNU libgomp that numba's parallel code runs on, when its
    threads are to run ScanWeaver's tasks now; else None (no numba omp layer, numba on
    libomp, no worker spinning after numba's own region, an oversubscribed machine, or
    SCANWEAVER_ADOPT_GOMP=0)."""
    omppool = sys.modules.get(_NUMBA_OMP)
    mode = os.environ.get("SCANWEAVER_ADOPT_GOMP")
    if omppool is None or mode == "0":
        return None
    if _SHARED["libomp_global"] and not _SHARED["numba_before"]:
        return None  # numba's GOMP_* calls resolved to libomp
    if mode != "1" and _oversubscribed():
        return None
    path = getattr(omppool, "__file__", None)
    gomp_parallel = _gomp_parallel(path) if path else None
    if gomp_parallel is None:
        return None
    spinning = _gnu_workers_spinning()  # forgets workers that ended
    if not _GNU_WORKERS:  # meet the workers with an empty region (ours: they spin after it)
        _run_on_gnu_threads(gomp_parallel, lambda: None, num_threads())
        return None
    now, since = time.monotonic(), _gnu_workers_cpu() - _GNU["cpu_at_ours"]
    if not spinning:
        if not _GNU["slept"]:  # asleep again after our region: at most what its spin costs
            _GNU["spin_cpu"] = since if _GNU["spin_cpu"] is None else min(_GNU["spin_cpu"], since)
        _GNU["slept"] = True
    elif _GNU["slept"] or (_GNU["spin_cpu"] is not None and since > 2 * _GNU["spin_cpu"]):
        _GNU["until"] = now + ADOPT_FOR_S  # woken since, or busier than our spin: numba's region
    return gomp_parallel if spinning and now < _GNU["until"] else None


def _oversubscribed() -> bool:
    """Whether the 1-minute load average exceeds OVERSUBSCRIBED_LOAD per CPU (looked
    at again at most every FOREIGN_RECHECK_S)."""
    now = time.monotonic()
    if now - _LOAD["checked"] > FOREIGN_RECHECK_S:
        try:
            load = os.getloadavg()[0]
        except OSError:  # not available: not known to be loaded
            load = 0.0
        _LOAD["over"] = load > OVERSUBSCRIBED_LOAD * (os.cpu_count() or 1)
        _LOAD["checked"] = now
    return bool(_LOAD["over"])


def _gnu_workers_spinning() -> bool:
    """Whether a libgomp worker met before is on a CPU now (spinning for its next
    region)."""
    for tid in list(_GNU_WORKERS):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1][1:2]  # the field after the (name)
        except (OSError, IndexError):  # the thread ended (or no /proc): forget it
            _GNU_WORKERS.discard(tid)
            continue
        if state == b"R":
            return True
    return False


def _gnu_workers_cpu() -> float:
    """CPU seconds the known libgomp workers have run (schedstat: nanoseconds on a CPU)."""
    total = 0
    for tid in list(_GNU_WORKERS):
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as stat:
                total += int(stat.read().split()[0])
        except (OSError, ValueError, IndexError):  # ended, or no schedstat: counts nothing
            pass
    return total / 1e9


def neighbour_policy() -> str:
    """In words, how ScanWeaver's parallel calls treat the OpenMP runtimes loaded now."""
    parts = []
    if sys.modules.get(_NUMBA_OMP) is not None:
        mode = os.environ.get("SCANWEAVER_ADOPT_GOMP")
        if _SHARED["libomp_global"] and not _SHARED["numba_before"]:
            parts.append("numba's omp layer started after libomp was loaded: both on libomp")
        elif mode == "0":
            parts.append("numba's omp layer on GNU libgomp; adopting its threads is off (SCANWEAVER_ADOPT_GOMP=0)")
        elif mode != "1" and _oversubscribed():
            parts.append("numba's omp layer on GNU libgomp; the machine is oversubscribed, so ScanWeaver "
                         "keeps its own runtime")
        else:
            parts.append("numba's omp layer on GNU libgomp: ScanWeaver's tasks run on its threads while one spins")
    if foreign_openmp_loaded() and openmp_blocktime() == 0:
        parts.append("a foreign OpenMP runtime is loaded: libomp's workers sleep when a region ends")
    return "; ".join(parts) or "alone: libomp's default waiting"


def _run_on_gnu_threads(gomp_parallel: Callable, work: Callable[[], None], threads: int) -> None:
    """work() on each of up to `threads` threads of a libgomp team, this thread among
    them (work takes tasks until none is left, so a smaller team still runs all)."""
    errors: list[BaseException] = []
    caller = threading.get_native_id()

    def body(_data) -> None:
        if threading.get_native_id() != caller:
            _GNU_WORKERS.add(threading.get_native_id())
        try:
            work()
        except BaseException as e:  # noqa: BLE001 - re-raised on the calling thread
            errors.append(e)

    try:
        gomp_parallel(_GOMP_BODY(body), None, threads, 0)
    finally:
        _GNU.update(cpu_at_ours=_gnu_workers_cpu(), slept=False)
    if errors:
        raise errors[0]


def openmp_available() -> bool:
    """Whether libomp loads (the 'openmp' variant can run)."""
    share_libomp()
    return _SHARED["libomp_global"]
