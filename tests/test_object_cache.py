"""The CPU machine-code cache: a new process loads the object file instead of running
O3 and code generation, and a damaged entry is rebuilt, never run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from scanweaver.runtime.cpu import CpuProgram
from scanweaver.toolchain import cache

# double every element of a 4-float array: enough to see that the code ran
LLVM_IR = """
define void @twice(ptr %p) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %q = getelementptr float, ptr %p, i64 %i
  %v = load float, ptr %q
  %w = fadd float %v, %v
  store float %w, ptr %q
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, 4
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def _run(program: CpuProgram) -> np.ndarray:
    import ctypes

    x = np.arange(4, dtype=np.float32)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(program.address("twice"))(x.ctypes.data)
    return x


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_second_program_loads_the_cached_object(cache_dir):
    first = CpuProgram(LLVM_IR)
    assert not first.cache_hit
    second = CpuProgram(LLVM_IR)
    assert second.cache_hit
    np.testing.assert_array_equal(_run(second), [0, 2, 4, 6])
    assert "fadd" in second.optimized_ir()  # still available, rebuilt on demand


NEW_PROCESS = f"""
import numpy as np
from scanweaver.runtime import cpu
def no_codegen(self):
    raise SystemExit("code generation ran")
cpu.CpuProgram._machine_code = no_codegen
program = cpu.CpuProgram({LLVM_IR!r})
import ctypes
x = np.arange(4, dtype=np.float32)
ctypes.CFUNCTYPE(None, ctypes.c_void_p)(program.address("twice"))(x.ctypes.data)
assert program.cache_hit and list(x) == [0, 2, 4, 6], x
"""


def test_a_new_process_skips_optimisation_and_codegen(cache_dir):
    CpuProgram(LLVM_IR)
    r = subprocess.run([sys.executable, "-c", NEW_PROCESS], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_damaged_entry_is_rebuilt(cache_dir, monkeypatch):
    keys = []
    real_cached = cache.cached

    def spy(key, build, parse=bytes):
        keys.append(key)
        return real_cached(key, build, parse)

    monkeypatch.setattr(cache, "cached", spy)
    CpuProgram(LLVM_IR)
    (key,) = keys
    cache.store(key, b"not an object file")  # valid checksum, malformed content
    program = CpuProgram(LLVM_IR)
    assert not program.cache_hit
    np.testing.assert_array_equal(_run(program), [0, 2, 4, 6])
    assert cache.load(key).startswith(b"\x7fELF")  # overwritten with the rebuilt object


def test_cpu_cache_keys_start_no_tool_subprocess(monkeypatch):
    from scanweaver.toolchain import tools

    tools.tool_versions.cache_clear()
    monkeypatch.setattr(tools.subprocess, "run", lambda *a, **k: pytest.fail("ran a subprocess"))
    try:
        cache.cache_key("cpu-object", "text")
        cache.cache_key("cpu-build", "text")
    finally:
        tools.tool_versions.cache_clear()
