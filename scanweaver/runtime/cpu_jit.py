"""The CPU JIT and calling layer: `compile_cpu` (the one place that compiles), its
in-process cache, and `Kernel`, a compiled `func.func` called through ctypes.

A compiled program is a cached shared object (`cpu_native.py`: a warm process loads
it without llvmlite or xDSL), else llvmlite's MCJIT (`cpu.CpuProgram`).

Calls go straight to the lowered function (memrefs expanded into pointer, offset,
sizes and strides) through ctypes, which releases the GIL for the foreign call: Python
threads then run kernels on both cores at once (`cpu_parallel.parallel_for`).
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scanweaver.errors import ScanWeaverValueError
from scanweaver.runtime.cpu import CpuProgram
from scanweaver.runtime.cpu_native import NativeProgram, native_program

# ---------------------------------------------------------------------------
# Compilation (the one place) and its in-process cache
# ---------------------------------------------------------------------------


@dataclass
class CompileStats:
    """What compile_cpu did: seconds spent compiling, cache hits."""

    compiles: int = 0
    hits: int = 0
    seconds: float = 0.0
    last_seconds: float = 0.0
    last_cached: bool = False


_CACHE: dict[str, CpuProgram | NativeProgram] = {}
_CACHE_LOCK = threading.Lock()
STATS = CompileStats()


# A fork waits for a compile in progress on another thread (e.g. a tier's build loading,
# `cpu_tiers.py`): the child then holds no lock, and no LLVM call, of a thread it lacks.
def _fork_child_lock() -> None:
    global _CACHE_LOCK
    _CACHE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=lambda: _CACHE_LOCK.acquire(), after_in_parent=lambda: _CACHE_LOCK.release(),
                        after_in_child=_fork_child_lock)


def compile_cpu(ir_text: str, openmp: bool = False, loops: bool = False) -> CpuProgram | NativeProgram:
    """Compile IR text (scan dialect + func/arith/memref/scf/math/vector) for this CPU.

    The single entry point for the drivers: `scanweaver-lower{target=cpu}` through
    `compiler.build_cpu` (cached on disk), JIT-compiled once per process.  With
    `openmp`, loops over channel groups run on OpenMP threads (BackendUnavailableError
    when libomp cannot be loaded, raised before compiling).  With `loops`, the
    sequential-loop lowering (`scanweaver-lower{target=loops}`; `cpu_tiers.py`).
    """
    if openmp:
        from scanweaver.runtime.cpu import load_openmp_runtime

        load_openmp_runtime()
    key = ("// openmp\n" if openmp else "") + ("// loops\n" if loops else "") + ir_text
    with _CACHE_LOCK:
        program = _CACHE.get(key)
        if program is not None:
            STATS.hits += 1
            STATS.last_cached, STATS.last_seconds = True, 0.0
            return program
        start = time.perf_counter()
        program = _build(ir_text, openmp, loops)
        elapsed = time.perf_counter() - start
        _CACHE[key] = program
        STATS.compiles += 1
        STATS.seconds += elapsed
        STATS.last_seconds, STATS.last_cached = elapsed, False
        return program


def _build(ir_text: str, openmp: bool, loops: bool = False) -> CpuProgram | NativeProgram:
    """The program of `ir_text`: a cached shared object keyed by the IR text itself (a
    warm process reads neither the LLVM IR nor llvmlite), else llvmlite's MCJIT."""
    def llvm_ir() -> str:
        from scanweaver.compiler import build_cpu  # (xDSL and the tools: only on a miss)

        return build_cpu(ir_text, openmp=openmp, loops=loops).llvm_ir

    native = native_program(ir_text, llvm_ir, openmp=openmp, **({"loops": True} if loops else {}))
    return native if native is not None else CpuProgram(llvm_ir(), openmp=openmp)


def compiled_now(ir_text: str) -> bool:
    """Whether `compile_cpu(ir_text)` costs no compile now: compiled in this process, or
    its shared object in the disk cache (then loaded here, for compile_cpu to return)."""
    with _CACHE_LOCK:
        if ir_text in _CACHE:
            return True

    def llvm_ir() -> str:
        from scanweaver.compiler import build_cpu

        return build_cpu(ir_text).llvm_ir

    found = native_program(ir_text, llvm_ir, build_missing=False, openmp=False)
    if found is None:
        return False
    with _CACHE_LOCK:
        _CACHE.setdefault(ir_text, found)
    return True


def clear_cache() -> None:
    """Forget compiled kernels (the next call of each kernel compiles again)."""
    with _CACHE_LOCK:
        _CACHE.clear()
    _KERNELS.clear()
    for clear in _CLEAR_HOOKS:
        clear()


#: Caches of derived kernels (cpu_scan's per-variant getters) that clear_cache empties.
_CLEAR_HOOKS: list[Callable[[], None]] = []


def on_clear_cache(clear: Callable[[], None]) -> None:
    """Have clear_cache also call `clear` (a cache of kernels built on compile_cpu)."""
    _CLEAR_HOOKS.append(clear)


# ---------------------------------------------------------------------------
# Fast calls: the lowered function with memrefs expanded, through ctypes
# ---------------------------------------------------------------------------

_SCALARS = {"index": ctypes.c_int64, "i64": ctypes.c_int64, "i32": ctypes.c_int32,
            "f32": ctypes.c_float, "f64": ctypes.c_double}


class Kernel:
    """A compiled `func.func` called with numpy arrays (zero copy) and scalars.

    `args`: per argument, an int R for a rank-R memref (any element type; the array
    must have the element type the IR declares, non-negative strides that are a
    multiple of the item size, innermost stride 1 when R > 0), or a scalar type name.
    The expanded MLIR calling convention is used: (allocated, aligned, offset,
    sizes[R], strides[R]) per memref.  ctypes releases the GIL during the call.
    """

    def __init__(self, program: CpuProgram | NativeProgram, name: str, args: Sequence[int | str]):
        self.program = program  # keeps the JIT engine alive
        self.spec = list(args)
        ctypes_args: list[Any] = []
        for a in self.spec:
            if isinstance(a, int):
                ctypes_args += [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * (1 + 2 * a)
            else:
                ctypes_args.append(_SCALARS[a])
        self._fn = ctypes.CFUNCTYPE(None, *ctypes_args)(program.address(name))

    def __call__(self, *values: Any) -> None:
        self._fn(*self._flatten(values))

    def bind(self, *values: Any) -> Callable[[], None]:
        """The call with its arguments converted now (threads then only do the call)."""
        flat = self._flatten(values)
        fn = self._fn
        return lambda: fn(*flat)

    def bind_each(self, values: Sequence[Any], changes: Sequence[dict[int, Any]]) -> list[Callable[[], None]]:
        """[bind(*values with the arguments at each mapping's positions replaced) for each
        mapping in `changes`], converting the arguments common to all calls once (the
        selective backward binds a task per channel range: a bind costs ~60 us here,
        most of it converting the twenty unchanged arrays again)."""
        if len(values) != len(self.spec):
            raise ScanWeaverValueError(f"kernel takes {len(self.spec)} arguments, got {len(values)}")
        common = [self._flat_arg(spec, v) for spec, v in zip(self.spec, values)]
        fn = self._fn
        calls = []
        for change in changes:
            flat = [x for i, part in enumerate(common)
                    for x in (self._flat_arg(self.spec[i], change[i]) if i in change else part)]
            calls.append(lambda flat=flat: fn(*flat))
        return calls

    def _flatten(self, values: Sequence[Any]) -> list[Any]:
        return [x for spec, v in zip(self.spec, values, strict=True) for x in self._flat_arg(spec, v)]

    @staticmethod
    def _flat_arg(spec: int | str, v: Any) -> list[Any]:
        if not isinstance(spec, int):
            return [v]
        if v.ndim != spec:
            raise ScanWeaverValueError(f"kernel expects a {spec}-D array, got shape {v.shape}")
        ptr = v.__array_interface__["data"][0]
        item = v.itemsize
        if not _layout_ok(v.shape, v.strides, item):
            # the lowered code reads memrefs with innermost stride 1: any other
            # layout would address outside the array or read the wrong elements
            raise ScanWeaverValueError(
                f"kernel argument of shape {v.shape} has strides {v.strides}: needs "
                f"non-negative strides, a multiple of the item size {item}, innermost {item}")
        return [ptr, ptr, 0, *v.shape, *(s // item for s in v.strides)]


def _layout_ok(shape: Sequence[int], strides: Sequence[int], item: int) -> bool:
    """Strides the lowered code can take: non-negative multiples of the item size, and
    the innermost one equal to it (an empty array, or a size-1 axis, may have any stride)."""
    if 0 in shape:
        return True
    if any(s < 0 or s % item for s, n in zip(strides, shape) if n > 1):
        return False
    return not shape or shape[-1] <= 1 or strides[-1] == item


_KERNELS: dict[tuple, Kernel] = {}


def kernel(ir_text: str, name: str, args: Sequence[int | str], tiered: bool = False) -> Kernel:
    """The compiled `name` of `ir_text`, cached.  tiered: a build that is not in the
    disk cache first runs as the sequential loops, while the full build compiles in
    the background (`cpu_tiers.py`; only for IR whose two lowerings compute the
    same bits, as the real affine scans do)."""
    key = (ir_text, name, tuple(args))
    k = _KERNELS.get(key)
    if k is None:
        program = None
        if tiered:
            from scanweaver.runtime.cpu_tiers import tiered_program

            program = tiered_program(ir_text, name, args)
        k = Kernel(program or compile_cpu(ir_text), name, args)
        _KERNELS[key] = k
    return k
