"""Kernels cached as shared objects (runtime/cpu_native.py): built once, loaded by
a new process without llvmlite, a damaged entry rebuilt, and MCJIT where they are off."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest

from scanweaver.errors import ScanWeaverValueError
from scanweaver.runtime import cpu_native
from scanweaver.toolchain import cache

pytestmark = pytest.mark.skipif(not cpu_native.available() or cpu_native._linker() is None,
                                reason="no /proc/cpuinfo or no ld: shared objects are off here")

# add 1.0 to every element of a float array of n elements, and call expf (a libm symbol)
LLVM_IR = """
declare float @expf(float)
define void @plus_one(ptr %p, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %q = getelementptr float, ptr %p, i64 %i
  %v = load float, ptr %q
  %z = fmul float %v, 0.0
  %e = call float @expf(float %z)
  %w = fadd float %v, %e
  store float %w, ptr %q
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def _run(program) -> np.ndarray:
    x = np.arange(5, dtype=np.float32)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(program.address("plus_one"))(x.ctypes.data, 5)
    return x


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_built_then_loaded_from_the_cache(cache_dir):
    calls = []

    def ir() -> str:
        calls.append(1)
        return LLVM_IR

    first = cpu_native.native_program("key text", ir)
    second = cpu_native.native_program("key text", ir)
    assert not first.cache_hit and second.cache_hit
    assert len(calls) == 1  # a hit does not ask for the LLVM IR
    np.testing.assert_array_equal(_run(first), np.arange(5) + 1)
    np.testing.assert_array_equal(_run(second), np.arange(5) + 1)
    assert "expf" in second.optimized_ir()


def test_unknown_symbol_is_an_error(cache_dir):
    program = cpu_native.native_program("key text", lambda: LLVM_IR)
    with pytest.raises(ScanWeaverValueError, match="'nope' is not defined"):
        program.address("nope")


NEW_PROCESS = """
import sys, ctypes
import numpy as np
from scanweaver.runtime import cpu_native
def no_ir():
    raise SystemExit("the LLVM IR was asked for: not a hit")
program = cpu_native.native_program("key text", no_ir)
x = np.zeros(3, np.float32)
ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(program.address("plus_one"))(x.ctypes.data, 3)
assert program.cache_hit and x.tolist() == [1, 1, 1], x
assert "llvmlite.binding" not in sys.modules, "a hit imported llvmlite"
"""


def test_a_new_process_loads_it_without_llvmlite(cache_dir):
    cpu_native.native_program("key text", lambda: LLVM_IR)
    r = subprocess.run([sys.executable, "-c", NEW_PROCESS], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_damaged_entry_is_rebuilt(cache_dir, monkeypatch):
    keys = []
    real_cached = cache.cached

    def spy(key, build, parse=bytes):
        keys.append(key)
        return real_cached(key, build, parse)

    monkeypatch.setattr(cache, "cached", spy)
    cpu_native.native_program("key text", lambda: LLVM_IR)
    (key,) = keys
    cache.store(key, b"\x7fELF but not a shared object")  # valid checksum, does not load
    program = cpu_native.native_program("key text", lambda: LLVM_IR)
    assert not program.cache_hit
    np.testing.assert_array_equal(_run(program), np.arange(5) + 1)
    assert cache.load(key).startswith(b"\x7fELF\x02")  # overwritten with the rebuilt library


def test_keys_differ_by_text_and_options(cache_dir):
    a = cpu_native.native_program("one", lambda: LLVM_IR)
    b = cpu_native.native_program("two", lambda: LLVM_IR)
    c = cpu_native.native_program("one", lambda: LLVM_IR, openmp=True)
    assert not (a.cache_hit or b.cache_hit or c.cache_hit)


def test_off_switch_and_no_linker_fall_back(cache_dir, monkeypatch):
    monkeypatch.setenv(cpu_native.ENV_SWITCH, "0")
    assert cpu_native.native_program("off", lambda: LLVM_IR) is None
    monkeypatch.delenv(cpu_native.ENV_SWITCH)
    monkeypatch.setattr(cpu_native, "_linker", lambda: None)
    assert cpu_native.native_program("no ld", lambda: LLVM_IR) is None


def test_compile_cpu_runs_a_kernel_through_a_shared_object(cache_dir):
    """The drivers' kernels (compile_cpu) load as shared objects and compute the scan."""
    from scanweaver.runtime import cpu_jit, cpu_scan

    cpu_jit.clear_cache()
    try:
        k = cpu_scan._affine_kernel("f32", 2, False, False, False)
        from scanweaver.runtime.cpu_tiers import TieredProgram, wait_all

        wait_all()  # (with SCANWEAVER_TIERED=1: both tiers are shared objects too)
        programs = k.program.tiers if isinstance(k.program, TieredProgram) else [k.program]
        assert all(isinstance(p, cpu_native.NativeProgram) for p in programs)
        rng = np.random.default_rng(0)
        a, b = rng.uniform(0.5, 1, (3, 17)).astype(np.float32), rng.standard_normal((3, 17)).astype(np.float32)
        h = np.empty_like(a)
        k(a, b, h)
        ref = np.empty_like(a)
        s = np.zeros(3, np.float32)
        for t in range(17):
            s = a[:, t] * s + b[:, t]
            ref[:, t] = s
        np.testing.assert_array_equal(h, ref)
    finally:
        cpu_jit.clear_cache()


def test_kernel_takes_outer_strides_and_refuses_a_strided_innermost_axis(cache_dir):
    """A column slice (rows not adjacent) runs through the row strides; an innermost
    stride other than the item size, or a negative one, is refused before the call."""
    from scanweaver.runtime import cpu_jit, cpu_scan

    cpu_jit.clear_cache()
    try:
        k = cpu_scan._affine_kernel("f32", 2, False, False, False)
        rng = np.random.default_rng(1)
        big_a = rng.uniform(0.5, 1, (3, 40)).astype(np.float32)
        big_b = rng.standard_normal((3, 40)).astype(np.float32)
        a, b = big_a[:, 5:22], big_b[:, 5:22]
        h = np.zeros((3, 40), np.float32)
        k(a, b, h[:, 3:20])
        ref = np.zeros_like(h)
        s = np.zeros(3, np.float32)
        for t in range(17):
            s = a[:, t] * s + b[:, t]
            ref[:, 3 + t] = s
        np.testing.assert_array_equal(h, ref)
        out = np.empty((3, 17), np.float32)
        for bad in (big_a[:, ::2][:, :17], big_a.T.copy().T[:, :17], big_a[::-1, :17]):
            with pytest.raises(ScanWeaverValueError, match="strides"):
                k(bad, b, out)
    finally:
        cpu_jit.clear_cache()


def test_a_library_that_does_not_load_is_remembered(cache_dir, monkeypatch):
    """A built library that fails to load (a symbol nothing defines) means MCJIT, and
    the next lookup does not rebuild it."""
    missing = LLVM_IR.replace("@expf", "@sw_no_such_function")
    builds = []
    real = cpu_native.shared_object
    monkeypatch.setattr(cpu_native, "shared_object", lambda *a: builds.append(1) or real(*a))
    assert cpu_native.native_program("missing", lambda: missing) is None
    assert cpu_native.native_program("missing", lambda: missing) is None
    assert len(builds) == 1


def test_the_target_machine_made_meanwhile_builds_the_same_object():
    """`native_program` makes the target machine on a thread while the IR is built: the
    shared object is the same bytes as with one made on the caller's thread."""
    meanwhile = cpu_native.target_machine_meanwhile(3)
    assert cpu_native.shared_object(LLVM_IR, 3, meanwhile) == cpu_native.shared_object(LLVM_IR, 3)


def test_a_failure_on_the_thread_is_raised_to_the_caller(monkeypatch):
    from scanweaver.runtime import cpu

    def broken(*args, **kwargs):
        raise RuntimeError("no target here")

    monkeypatch.setattr(cpu, "host_target_machine", broken)
    with pytest.raises(RuntimeError, match="no target here"):
        cpu_native.target_machine_meanwhile(3)()
