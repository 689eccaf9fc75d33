"""How ScanWeaver's libomp workers wait (runtime/cpu_parallel.py): libomp's default
alone, no spinning (blocktime 0) beside another OpenMP runtime, or as the user sets."""

import ctypes

import pytest

from scanweaver.runtime import cpu_parallel


def _libomp():
    if not cpu_parallel.openmp_available():
        pytest.skip("libomp is not installed (pip install cmeel-libomp)")
    from scanweaver.runtime.cpu import load_openmp_runtime

    lib = ctypes.CDLL(load_openmp_runtime())
    lib.kmp_get_blocktime.restype = ctypes.c_int
    return lib


def test_foreign_runtime_is_seen_in_the_maps(monkeypatch, tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f0000000000-7f0000001000 r-xp 00000000 08:01 1 /usr/lib/libm.so.6\n")
    real_open = open
    monkeypatch.setattr(cpu_parallel, "_FOREIGN", {"checked": -1e9, "found": False})
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(maps if p == "/proc/self/maps" else p, *a, **k))
    assert cpu_parallel.foreign_openmp_loaded() is False
    maps.write_text(maps.read_text() + "7f0000002000-7f0000003000 r-xp 0 08:01 2 /x/torch/lib/libgomp-a34b3233.so.1\n")
    assert cpu_parallel.foreign_openmp_loaded() is False  # not looked at again within FOREIGN_RECHECK_S
    monkeypatch.setattr(cpu_parallel, "FOREIGN_RECHECK_S", 0.0)
    assert cpu_parallel.foreign_openmp_loaded() is True
    assert cpu_parallel.openmp_blocktime() == 0


def test_blocktime_policy_reaches_libomp(monkeypatch):
    lib = _libomp()
    monkeypatch.setattr(cpu_parallel, "_FOREIGN", {"checked": 1e18, "found": False})  # alone
    monkeypatch.delenv("SCANWEAVER_OMP_BLOCKTIME", raising=False)
    assert cpu_parallel.openmp_blocktime() is None  # libomp's default is left alone
    monkeypatch.setenv("SCANWEAVER_OMP_BLOCKTIME", "7")
    cpu_parallel.prepare_openmp(2)
    assert lib.kmp_get_blocktime() == 7
    monkeypatch.delenv("SCANWEAVER_OMP_BLOCKTIME")
    monkeypatch.setattr(cpu_parallel, "_FOREIGN", {"checked": 1e18, "found": True})  # beside libgomp
    cpu_parallel.prepare_openmp(2)
    assert lib.kmp_get_blocktime() == 0
