"""Tiered compilation: a kernel's first call in a process with an empty disk cache
runs a quickly compiled first tier while the full build compiles in the background.

The affine scan's full CPU build (the tile kernel: a few thousand ops through the xDSL
passes, mlir-opt, LLVM O3) costs seconds cold; the sequential-loop lowering of the
same IR (`scanweaver-lower{target=loops}`) a fraction of that.  For the real affine
scans both compute every step as the loop does (a multiply, then an add, in the
element type, no contraction), so the tiers' results are bit-identical
(`tests/test_cpu_tiers.py`); only their speed differs.

The kernel's callers get the address of a small dispatch function (`dispatch_ir`):
it loads the current tier's address from a global and calls it.  The first tier's
address is stored there before the first call; a background thread then runs
`compile_cpu` on the IR (which also fills the disk cache) and stores the full build's
address.  Calls in flight finish on the tier they started on; both tiers stay loaded.
The thread is not a daemon: a process that ends sooner waits for it, so the next
process finds the full build in the disk cache and loads it without any tier.  It runs
at a lower CPU priority (Linux: per thread, inherited by mlir-opt and the linker).

Off with `SCANWEAVER_TIERED=0`, and where programs are not shared objects
(`cpu_native.available()`): then the first call compiles the full build itself.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from collections.abc import Sequence

from scanweaver.runtime.cpu_native import NativeProgram, available, native_program

#: Set to "0" to compile the full build on the first call (no first tier).
ENV_SWITCH = "SCANWEAVER_TIERED"
_LLVM_SCALARS = {"index": "i64", "i64": "i64", "i32": "i32", "f32": "float", "f64": "double"}
_SLOT = "sw_tier_target"


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0" and available()


def dispatch_ir(name: str, spec: Sequence[int | str]) -> str:
    """LLVM IR of `void @name(...)` with the expanded memref convention of `spec` (as
    `cpu_jit.Kernel`), forwarding its arguments to the function whose address is in
    the global `@sw_tier_target`."""
    params: list[str] = []
    for i, s in enumerate(spec):
        if isinstance(s, int):
            params += [f"ptr %m{i}a", f"ptr %m{i}b", f"i64 %m{i}o"]
            params += [f"i64 %m{i}n{d}" for d in range(s)] + [f"i64 %m{i}s{d}" for d in range(s)]
        else:
            params.append(f"{_LLVM_SCALARS[s]} %x{i}")
    args = ", ".join(params)
    return (
        f"@{_SLOT} = global ptr null, align 8\n"
        f"define void @{name}({args}) {{\n"
        f"  %f = load atomic ptr, ptr @{_SLOT} acquire, align 8\n"
        f"  tail call void %f({args})\n"
        "  ret void\n}\n"
    )


def _lower_priority() -> None:
    """Run this thread (and the tools it starts, which inherit it) at a lower CPU
    priority on Linux, where the nice value is per thread: the calls the process makes
    meanwhile come first on busy cores."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 5))
    except (AttributeError, OSError):  # no per-thread priority here: same priority
        pass


class TieredProgram:
    """A kernel program whose `name` dispatches to its current tier (`address(name)`);
    `tiers`: the programs loaded so far, the current one last; `wait()` blocks until
    the full build is in place (True) or has failed (False)."""

    def __init__(self, name: str, dispatch: NativeProgram, first: NativeProgram):
        self.name = name
        self.dispatch = dispatch
        self.tiers: list = [first]
        self.cache_hit = False
        self._slot = ctypes.c_void_p.from_address(dispatch.address(_SLOT))
        self._slot.value = first.address(name)
        self._done = threading.Event()
        self.upgraded = False

    def address(self, symbol: str) -> int:
        return self.dispatch.address(symbol) if symbol == self.name else self.tiers[-1].address(symbol)

    def optimized_ir(self) -> str:
        return self.tiers[-1].optimized_ir()

    def wait(self, timeout: float | None = None) -> bool:
        self._done.wait(timeout)
        return self.upgraded

    def _upgrade(self, ir_text: str) -> None:
        from scanweaver.runtime.cpu_jit import compile_cpu

        _lower_priority()
        try:
            full = compile_cpu(ir_text)
            self.tiers.append(full)  # kept loaded before its address is published
            self._slot.value = full.address(self.name)
            self.upgraded = True
        except Exception as e:  # the first tier stays: correct results, slower
            warnings.warn(f"scanweaver: the full build of @{self.name} failed, the sequential loops stay: {e}",
                          RuntimeWarning, stacklevel=1)
        finally:
            self._done.set()


#: Every TieredProgram of this process (`wait_all`).
_STARTED: list[TieredProgram] = []


def wait_all(timeout: float | None = None) -> bool:
    """Wait until every background full build started so far is in place (a benchmark
    that times calls right after a first call); True when all were."""
    return all([p.wait(timeout) for p in list(_STARTED)])


def tiered_program(ir_text: str, name: str, spec: Sequence[int | str]) -> TieredProgram | None:
    """A TieredProgram for `ir_text` whose full build is to compile in the background;
    None when no tier is needed (compiled already, in the disk cache, tiers off) or
    possible (the quick tier is not a shared object): then compile as usual."""
    from scanweaver.runtime.cpu_jit import compile_cpu, compiled_now

    if not enabled() or compiled_now(ir_text):
        return None
    try:
        first = compile_cpu(ir_text, loops=True)
    except Exception:  # (a bug of the loops lowering only): the full build, which reports its own errors
        return None
    text = dispatch_ir(name, spec)
    dispatch = native_program(text, lambda: text, opt_level=2)
    if not isinstance(first, NativeProgram) or dispatch is None:
        return None
    program = TieredProgram(name, dispatch, first)
    _STARTED.append(program)
    threading.Thread(target=program._upgrade, args=(ir_text,), name=f"scanweaver-compile-{name}").start()
    return program


__all__ = ["ENV_SWITCH", "TieredProgram", "dispatch_ir", "enabled", "tiered_program", "wait_all"]
