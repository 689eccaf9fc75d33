"""ScanWeaver beside numba's GNU libgomp (runtime/cpu_parallel.py): libomp is in the global
symbol scope once loaded, and when numba's omp layer started on libgomp before that,
parallel_for runs its tasks on libgomp's threads while they spin after numba's regions
(and 'openmp' is not chosen)."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import types

import numpy as np
import pytest

from scanweaver.runtime import cpu_parallel, cpu_scan, cpu_variants


def _libgomp() -> str:
    try:
        ctypes.CDLL("libgomp.so.1")
    except OSError:
        pytest.skip("GNU libgomp (libgomp.so.1) is not installed")
    return "libgomp.so.1"


@pytest.fixture
def numba_on_gomp(monkeypatch):
    """As if numba's omppool (which links libgomp) had started before libomp loaded."""
    monkeypatch.setitem(sys.modules, cpu_parallel._NUMBA_OMP, types.SimpleNamespace(__file__=_libgomp()))
    monkeypatch.setitem(cpu_parallel._SHARED, "numba_before", True)
    monkeypatch.setattr(cpu_parallel, "_GNU_WORKERS", set())  # no worker met yet
    monkeypatch.setattr(cpu_parallel, "_gnu_workers_spinning", lambda: True)  # as right after numba's call
    monkeypatch.setattr(cpu_parallel, "_LOAD", {"checked": 1e18, "over": False})  # not oversubscribed
    monkeypatch.setattr(cpu_parallel, "_GNU", {"cpu_at_ours": 0.0, "slept": True, "spin_cpu": None, "until": 1e18})  # numba's spin
    monkeypatch.delenv("SCANWEAVER_ADOPT_GOMP", raising=False)
    assert cpu_parallel.gnu_neighbour_parallel() is None  # the first look meets the workers
    assert cpu_parallel._GNU_WORKERS


def test_tasks_run_once_each_on_the_neighbours_threads(numba_on_gomp):
    assert cpu_parallel.gnu_neighbour_parallel() is not None
    done: list[int] = []
    native: set[int] = set()
    lock = threading.Lock()

    def task(i: int):
        def run() -> None:
            time.sleep(0.002)  # releases the GIL: the other libgomp thread takes tasks too
            with lock:
                done.append(i)
                native.add(threading.get_native_id())
        return run

    cpu_parallel.parallel_for([task(i) for i in range(40)], threads=2)
    assert sorted(done) == list(range(40))
    assert len(native) == 2  # this thread and libgomp's worker
    assert threading.get_native_id() in native
    assert native - {threading.get_native_id()} <= cpu_parallel._GNU_WORKERS  # libgomp's worker


def test_a_failing_task_raises_in_the_caller(numba_on_gomp):
    ran: list[int] = []

    def bad() -> None:
        raise RuntimeError("task 3 failed")

    tasks = [(lambda i=i: ran.append(i)) for i in range(3)] + [bad] + [(lambda i=i: ran.append(i)) for i in range(4, 8)]
    with pytest.raises(RuntimeError, match="task 3 failed"):
        cpu_parallel.parallel_for(tasks, threads=2)
    assert len(ran) >= 3  # the tasks before it ran; the thread that hit it stopped taking more


def test_no_adoption_when_numba_started_on_libomp_or_when_turned_off(numba_on_gomp, monkeypatch):
    monkeypatch.setitem(cpu_parallel._SHARED, "libomp_global", True)
    monkeypatch.setitem(cpu_parallel._SHARED, "numba_before", False)  # numba's symbols resolved to libomp
    assert cpu_parallel.gnu_neighbour_parallel() is None
    monkeypatch.setitem(cpu_parallel._SHARED, "numba_before", True)
    assert cpu_parallel.gnu_neighbour_parallel() is not None
    monkeypatch.setenv("SCANWEAVER_ADOPT_GOMP", "0")
    assert cpu_parallel.gnu_neighbour_parallel() is None
    monkeypatch.delitem(sys.modules, cpu_parallel._NUMBA_OMP)
    monkeypatch.delenv("SCANWEAVER_ADOPT_GOMP")
    assert cpu_parallel.gnu_neighbour_parallel() is None  # no numba omp layer at all


def test_adopted_only_while_a_known_worker_spins(numba_on_gomp, monkeypatch, tmp_path):
    monkeypatch.undo()  # the real spinning check, on a fake /proc
    monkeypatch.setitem(sys.modules, cpu_parallel._NUMBA_OMP, types.SimpleNamespace(__file__=_libgomp()))
    monkeypatch.setitem(cpu_parallel._SHARED, "numba_before", True)
    monkeypatch.setattr(cpu_parallel, "_LOAD", {"checked": 1e18, "over": False})
    monkeypatch.setattr(cpu_parallel, "_GNU", {"cpu_at_ours": 0.0, "slept": True, "spin_cpu": None, "until": -1e9})
    monkeypatch.delenv("SCANWEAVER_ADOPT_GOMP", raising=False)
    stat, schedstat = tmp_path / "stat", tmp_path / "schedstat"
    fake = {"/proc/self/task/4242/stat": stat, "/proc/self/task/4242/schedstat": schedstat}
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(fake.get(p, p), *a, **k))
    schedstat.write_bytes(b"0 0 0\n")
    monkeypatch.setattr(cpu_parallel, "_GNU_WORKERS", {4242})
    stat.write_bytes(b"4242 (python3 (x) y) R 1 2 3\n")  # on a CPU: spinning for its next region
    assert cpu_parallel.gnu_neighbour_parallel() is not None
    stat.write_bytes(b"4242 (python3 (x) y) S 1 2 3\n")  # asleep in a futex: ScanWeaver's own runtime
    assert cpu_parallel.gnu_neighbour_parallel() is None
    # after one of our regions (its CPU then 1 ms): spinning, but not known to be numba's
    cpu_parallel._GNU.update(cpu_at_ours=0.001, slept=False, until=-1e9)
    stat.write_bytes(b"4242 (python3 (x) y) R 1 2 3\n")
    schedstat.write_bytes(b"2000000 0 0\n")
    assert cpu_parallel.gnu_neighbour_parallel() is None
    stat.write_bytes(b"4242 (python3 (x) y) S 1 2 3\n")  # its spin over: 3 ms of CPU since ours, learnt
    schedstat.write_bytes(b"4000000 0 0\n")
    assert cpu_parallel.gnu_neighbour_parallel() is None
    assert cpu_parallel._GNU["spin_cpu"] == pytest.approx(0.003) and cpu_parallel._GNU["slept"]
    stat.write_bytes(b"4242 (python3 (x) y) R 1 2 3\n")  # woken since it slept: by numba
    assert cpu_parallel.gnu_neighbour_parallel() is not None
    cpu_parallel._GNU.update(cpu_at_ours=0.004, slept=False, until=-1e9)  # another region of ours
    schedstat.write_bytes(b"9000000 0 0\n")  # 5 ms since: within twice our spin
    assert cpu_parallel.gnu_neighbour_parallel() is None
    schedstat.write_bytes(b"11000000 0 0\n")  # 7 ms since: more than our spin, numba's work
    assert cpu_parallel.gnu_neighbour_parallel() is not None
    stat.unlink()  # the thread ended: forgotten; the next look meets libgomp's real workers
    assert cpu_parallel.gnu_neighbour_parallel() is None
    assert 4242 not in cpu_parallel._GNU_WORKERS and cpu_parallel._GNU_WORKERS


def test_not_adopted_on_an_oversubscribed_machine_unless_asked(numba_on_gomp, monkeypatch):
    monkeypatch.setattr(cpu_parallel, "_LOAD", {"checked": -1e9, "over": False})
    monkeypatch.setattr(cpu_parallel.os, "getloadavg", lambda: (10.0 * (cpu_parallel.os.cpu_count() or 1), 0, 0))
    assert cpu_parallel.gnu_neighbour_parallel() is None
    assert "oversubscribed" in cpu_parallel.neighbour_policy()
    monkeypatch.setenv("SCANWEAVER_ADOPT_GOMP", "1")
    assert cpu_parallel.gnu_neighbour_parallel() is not None
    monkeypatch.delenv("SCANWEAVER_ADOPT_GOMP")
    monkeypatch.setattr(cpu_parallel, "_LOAD", {"checked": -1e9, "over": True})
    monkeypatch.setattr(cpu_parallel.os, "getloadavg", lambda: (0.5, 0, 0))  # quiet again
    assert cpu_parallel.gnu_neighbour_parallel() is not None


def test_openmp_variant_gives_way_to_the_neighbours_threads(numba_on_gomp, monkeypatch):
    assert cpu_variants.choose_affine_variant(1024, 4096, np.float32, 2) == "channels"
    monkeypatch.setenv("SCANWEAVER_ADOPT_GOMP", "0")
    expected = "openmp" if cpu_parallel.openmp_available() else "channels"
    assert cpu_variants.choose_affine_variant(1024, 4096, np.float32, 2) == expected


def test_scan_on_the_neighbours_threads_is_bit_identical(numba_on_gomp):
    rng = np.random.default_rng(16)
    a = rng.uniform(0.5, 1.0, (96, 300)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (96, 300)).astype(np.float32)
    h0 = rng.uniform(-1.0, 1.0, 96).astype(np.float32)
    ref, ref_last = cpu_scan.affine_scan_cpu(a, b, h0, return_final=True, variant="single")
    h, last = cpu_scan.affine_scan_cpu(a, b, h0, return_final=True, variant="channels", threads=2)
    assert np.array_equal(h, ref) and np.array_equal(last, ref_last)


def test_libomp_is_in_the_global_scope_once_loaded():
    if not cpu_parallel.openmp_available():
        pytest.skip("libomp is not installed (pip install cmeel-libomp)")
    assert cpu_parallel._SHARED["libomp_global"] and cpu_parallel._SHARED["checked"]
    # dlsym(RTLD_DEFAULT): what a library loaded later (numba's omppool) binds GOMP_* to
    assert hasattr(ctypes.CDLL(None), "GOMP_parallel")
    assert hasattr(ctypes.CDLL(None), "kmp_set_blocktime")  # libomp's, not libgomp's


def test_the_neighbours_row_says_which_policy_ran(numba_on_gomp, monkeypatch):
    from scanweaver.bench import plots

    assert "tasks run on its threads while one spins" in cpu_parallel.neighbour_policy()
    monkeypatch.setitem(cpu_parallel._SHARED, "libomp_global", True)
    monkeypatch.setitem(cpu_parallel._SHARED, "numba_before", False)
    assert "both on libomp" in cpu_parallel.neighbour_policy()
    row = {"scanweaver_solo_s": 1e-3, "scanweaver_mixed_s": 1e-3, "neighbour_solo_s": 1e-3, "neighbour_mixed_s": 1e-3,
           "scanweaver_slowdown": 1.0, "neighbour_slowdown": 1.0, "met": True, "scanweaver_policy": "policy P"}
    result = {"cases": [], "cpu_goals": {"neighbours": {
        "shape": [4, 4], "limits": {"scanweaver": 1.2, "neighbour": 1.1}, "rows": {"numba x": row},
        "scanweaver_alone_s": 2.5e-3}}}
    text = "\n".join(plots.goals_text(result))
    assert "numba x: policy P" in text and "ScanWeaver alone, before any neighbour call of these rows: 2.5 ms" in text
