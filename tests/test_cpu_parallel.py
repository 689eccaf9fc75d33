"""parallel_for on ScanWeaver's own worker threads: every task runs once, on several
threads, and a task's exception reaches the caller after the others are done."""

from __future__ import annotations

import threading
import time

import pytest

from scanweaver.runtime import cpu_parallel
from scanweaver.runtime.cpu_parallel import parallel_for, split_range


def test_every_task_runs_once_across_threads():
    done: list[int] = []
    names: set[str] = set()
    lock = threading.Lock()

    def task(i: int):
        def run() -> None:
            time.sleep(0.002)  # long enough that the workers take some of the tasks
            with lock:
                done.append(i)
                names.add(threading.current_thread().name)
        return run

    parallel_for([task(i) for i in range(40)], threads=2)
    assert sorted(done) == list(range(40))
    if cpu_parallel.num_threads() > 1:
        assert any(n.startswith("scanweaver_") for n in names)


def test_a_failing_task_raises_in_the_caller_after_the_rest():
    ran: list[int] = []

    def ok(i: int):
        return lambda: ran.append(i)

    def bad() -> None:
        raise ValueError("task failed")

    tasks = [ok(0), bad, ok(2), ok(3)]
    with pytest.raises(ValueError, match="task failed"):
        parallel_for(tasks, threads=2)
    assert sorted(ran) == [0, 2, 3]
    parallel_for([ok(9)], threads=2)  # the pool still works afterwards
    assert 9 in ran


def test_the_pool_does_not_import_concurrent_futures():
    import subprocess
    import sys

    code = ("import sys\nfrom scanweaver.runtime.cpu_parallel import parallel_for\n"
            "out = []\nparallel_for([lambda: out.append(1)] * 8, threads=2)\n"
            "assert out == [1] * 8 and 'concurrent.futures' not in sys.modules, sys.modules.keys()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_split_range_covers_the_range():
    parts = split_range(100, 3, align=8)
    assert parts[0][0] == 0 and parts[-1][1] == 100
    assert all(lo % 8 == 0 for lo, _ in parts)
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
