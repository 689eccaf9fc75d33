"""Tiered compilation: a kernel's first call in a process with an empty disk cache
runs a quickly compiled first tier while the full build compiles in the background.

The affine scan's full CPU build (the tile kernel: a few thousand ops through the xDSL
passes, mlir-opt, LLVM O3) costs seconds cold.  Its first tier (`affine_loop_tier`) is
the sequential loop built as LLVM IR (`cpu_loop_tier.py`): no xDSL, no MLIR
tool, not even the kernel's IR in this process (the child builds it, `FullIR`).  IR
text of another kind can take the sequential-loop lowering of the same IR
(`tiered_program`, `scanweaver-lower{target=loops}`).  For the real affine scans the
tiers compute every step as the loop does (a multiply, then an add, in the element
type, no contraction), so their results are bit-identical (`tests/test_cpu_tiers.py`,
`tests/test_cpu_loop_tier.py`); only their speed differs.

The kernel's callers get the address of a small dispatch function (`dispatch_ir`):
it loads the current tier's address from a global and calls it.  The first tier's
address is stored there before the first call.  The full build starts once the first
call has returned (the dispatch then calls back once, `@sw_tier_returned`), so it takes
nothing from the first call's critical path; it starts earlier when someone waits for
it (`wait`, `wait_all`), and at exit when the kernel was never called.

The full build runs in a child process (`python -c ... build_from_stdin`, at a lower
CPU priority) that compiles the IR into the disk cache; a waiting thread then loads
the shared object from there and stores its address in the dispatch slot.  So the
build holds neither this process's GIL (the caller's Python code keeps its core) nor
any of its locks, and a fork meanwhile is safe: a forked child takes the parent's
build from the disk cache once the parent reports it done (`_follow_parent`; memory
shared with the parent holds the outcome), and a fork first waits for a compile in
progress on another thread (`cpu_jit`).  Where the child's result does not land
in the disk cache (the cache is off or unsafe, no Python executable, the child failed),
the thread compiles in this process instead.  Calls in flight finish on the tier they
started on; both tiers stay loaded.  The thread is not a daemon: a process that ends
sooner waits for it, so the next process finds the full build in the disk cache and
loads it without any tier.

Off with `SCANWEAVER_TIERED=0`, and where programs are not shared objects
(`cpu_native.available()`): then the first call compiles the full build itself.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from scanweaver.runtime.cpu_native import NativeProgram, available, native_program

#: Set to "0" to compile the full build on the first call (no first tier).
ENV_SWITCH = "SCANWEAVER_TIERED"
_SLOT = "sw_tier_target"
_RETURNED = "sw_tier_returned"
_BUILDING, _UPGRADED, _FAILED = 0, 1, 2  # TieredProgram._state


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0" and available()


def add_dispatch(module, name: str, spec: Sequence[int | str]) -> None:
    """Add to `module` (an `llvmlite.ir.Module`) `void @name(...)` with the expanded
    memref convention of `spec` (as `cpu_jit.Kernel`), forwarding its arguments to the
    function whose address is in the global `@sw_tier_target`; after the call, the
    function in `@sw_tier_returned` (when set) is taken out of it and called, so
    exactly once."""
    from llvmlite import ir

    from scanweaver.runtime.cpu_loop_tier import memref_parameters

    ptr, i64 = ir.PointerType(), ir.IntType(64)
    scalars = {"index": i64, "i64": i64, "i32": ir.IntType(32), "f32": ir.FloatType(), "f64": ir.DoubleType()}
    types, names = [], []
    for i, s in enumerate(spec):
        memref = memref_parameters([f"m{i}"], [s]) if isinstance(s, int) else ([scalars[s]], [f"x{i}"])
        types += memref[0]
        names += memref[1]
    signature = ir.FunctionType(ir.VoidType(), types)
    slot, returned = (ir.GlobalVariable(module, ptr, symbol) for symbol in (_SLOT, _RETURNED))
    for variable in (slot, returned):
        variable.initializer, variable.align = ir.Constant(ptr, None), 8
    fn = ir.Function(module, signature, name)
    for value, label in zip(fn.args, names):
        value.name = label
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    first, notify, done = (fn.append_basic_block(label) for label in ("first", "notify", "done"))
    # (loaded as a pointer to the signature: the builder's calls need the callee's type;
    # the text says `void (...)*`, which LLVM reads as `ptr`)
    b.call(b.load_atomic(slot, "acquire", 8, name="f", typ=signature.as_pointer()), fn.args)
    n = b.load_atomic(returned, "monotonic", 8, name="n", typ=ptr)
    b.cbranch(b.icmp_unsigned("==", n, ir.Constant(ptr, None), name="none"), done, first)
    b.position_at_end(first)
    callback = ir.Constant(ir.FunctionType(ir.VoidType(), []).as_pointer(), None)  # (typed: as the call above)
    g = b.atomic_rmw("xchg", returned, callback, "acq_rel", name="g")
    b.cbranch(b.icmp_unsigned("==", g, callback, name="taken"), done, notify)
    b.position_at_end(notify)
    b.call(g, [])
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()


def dispatch_ir(name: str, spec: Sequence[int | str]) -> str:
    """LLVM IR text of a module holding only `add_dispatch`'s function and globals."""
    from llvmlite import ir

    module = ir.Module()
    add_dispatch(module, name, spec)
    return str(module)


def _lower_priority() -> None:
    """Run this thread (and the processes it starts, which inherit it) at a lower CPU
    priority on Linux, where the nice value is per thread: the calls the process makes
    meanwhile come first on busy cores."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 5))
    except (AttributeError, OSError):  # no per-thread priority here: same priority
        pass


# The child: the package's folder first on its path (as it is importable here), then the
# build, into the disk cache (what it writes is all this process reads of it).
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from scanweaver.runtime.cpu_tiers import build_from_stdin; build_from_stdin()"
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_from_stdin() -> None:
    """The child process's work: `compile_cpu` of the IR on standard input, a JSON
    `{"text": IR text}` or `{"recipe": [module, function, args]}` (`FullIR`: the child
    builds the IR itself, into the disk cache too); its length in bytes on the first
    line: a process forked from the parent meanwhile holds the pipe's other end too,
    so the end of the input is never seen."""
    import json

    from scanweaver.runtime.cpu_jit import compile_cpu

    size = int(sys.stdin.buffer.readline())
    request = json.loads(sys.stdin.buffer.read(size))
    text = request["text"] if "text" in request else FullIR(*request["recipe"][:2], tuple(request["recipe"][2])).text()
    compile_cpu(text)


@dataclass(frozen=True)
class FullIR:
    """The full build's IR text, not built yet: `module.function(*args)` returns it
    (and with `cached_only=True`, None where the disk cache does not hold it).  A first
    tier that needs no IR (`affine_loop_tier`) leaves the building to the child process:
    this process then reads the IR from the disk cache and never imports xDSL."""

    module: str
    function: str
    args: tuple

    def text(self, cached_only: bool = False) -> str | None:
        import importlib

        return getattr(importlib.import_module(self.module), self.function)(*self.args, cached_only=cached_only)

    def request(self) -> dict:
        return {"recipe": [self.module, self.function, list(self.args)]}


#: Held while a build's child process starts (`_build_in_child`) and by a fork
#: (`_before_fork`): a process forked meanwhile would hold the write end of the pipe
#: that tells `Popen` the child has started, which then waits forever.
_SPAWN_LOCK = threading.Lock()


def _build_in_child(full: str | FullIR) -> bool:
    """Whether a child process built `full` (IR text, or how to get it) into the disk
    cache (exit status 0; a failure is reported by the build in this process that follows)."""
    import json
    import subprocess

    if not sys.executable:  # (an embedded interpreter): no Python to start
        return False
    data = json.dumps(full.request() if isinstance(full, FullIR) else {"text": full}).encode()
    try:
        # (its own session: a Ctrl-C at the terminal stops this process, while the build
        # finishes into the disk cache for the next one)
        with _SPAWN_LOCK:
            child = subprocess.Popen([sys.executable, "-c", _CHILD, _PACKAGE_ROOT], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    except OSError:
        return False
    child.communicate(b"%d\n" % len(data) + data)
    return child.returncode == 0


class TieredProgram:
    """A kernel program whose `name` dispatches to its current tier (`address(name)`);
    `tiers`: the programs loaded so far, the current one last; `wait()` starts the full
    build if it has not started and blocks until it is in place (True) or has failed
    (False)."""

    def __init__(self, name: str, dispatch: NativeProgram, first: NativeProgram, full: str | FullIR):
        self.name = name
        self.dispatch = dispatch
        self.tiers: list = [first]
        self.cache_hit = False
        self.upgraded = False
        self._full = full  # the full build's IR text, or how to get it (`FullIR`)
        self._slot = ctypes.c_void_p.from_address(dispatch.address(_SLOT))
        self._slot.value = first.address(name)
        # Called by the dispatch, once, when the first call returns (ctypes takes the GIL).
        self._returned = ctypes.CFUNCTYPE(None)(self._first_call_returned)
        self._returned_slot = ctypes.c_void_p.from_address(dispatch.address(_RETURNED))
        self._start()

    def _start(self) -> None:
        # The build's outcome, in memory a forked child shares (`_follow_parent`).
        self._state = mmap.mmap(-1, 1)
        self._go = threading.Event()  # the first call returned, or someone waits
        self._done = threading.Event()
        self._returned_slot.value = ctypes.cast(self._returned, ctypes.c_void_p).value
        threading.Thread(target=self._upgrade, name=f"scanweaver-compile-{self.name}").start()

    def _follow_parent(self) -> None:
        """In a forked child, for a build the parent runs: take the full build from the
        disk cache once the parent has it there (not a build of its own: a pool of
        forked workers would each compile it)."""
        self._go = threading.Event()
        self._go.set()
        self._done = threading.Event()
        parent = os.getppid()
        threading.Thread(target=self._take_parents_build, args=(parent,), daemon=True,
                         name=f"scanweaver-follow-{self.name}").start()

    def _ir_text(self, cached_only: bool = False) -> str | None:
        """The full build's IR text (cached_only: None where it must be built first)."""
        if isinstance(self._full, FullIR):
            text = self._full.text(cached_only=cached_only)
            if text is None:
                return None
            self._full = text
        return self._full

    def _take_parents_build(self, parent: int) -> None:
        from scanweaver.runtime.cpu_jit import compile_cpu, compiled_now

        try:
            while self._state[0] == _BUILDING and os.getppid() == parent:  # (a parent gone: its build too)
                time.sleep(0.05)
            text = self._ir_text(cached_only=True) if self._state[0] == _UPGRADED else None
            if text is not None and compiled_now(text):  # (not there: the cache is off)
                self._switch(compile_cpu(text))
        finally:
            self._done.set()

    def _switch(self, full) -> None:
        self.tiers.append(full)  # kept loaded before its address is published
        self._slot.value = full.address(self.name)
        self.upgraded = True

    def _first_call_returned(self) -> None:
        self._go.set()

    def address(self, symbol: str) -> int:
        return self.dispatch.address(symbol) if symbol == self.name else self.tiers[-1].address(symbol)

    def optimized_ir(self) -> str:
        return self.tiers[-1].optimized_ir()

    def wait(self, timeout: float | None = None) -> bool:
        self._go.set()
        self._done.wait(timeout)
        return self.upgraded

    def _upgrade(self) -> None:
        from scanweaver.runtime.cpu_jit import compile_cpu

        _lower_priority()
        main = threading.main_thread()
        while not self._go.wait(0.1):
            if not main.is_alive():  # exiting, the kernel never called: build for the next process
                break
        try:
            _build_in_child(self._full)
            self._switch(compile_cpu(self._ir_text()))  # from the disk cache; where it is not there, built here
        except Exception as e:  # the first tier stays: correct results, slower
            warnings.warn(f"scanweaver: the full build of @{self.name} failed, the sequential loops stay: {e}",
                          RuntimeWarning, stacklevel=1)
        finally:
            self._state[0] = _UPGRADED if self.upgraded else _FAILED
            self._done.set()


#: Every TieredProgram of this process (`wait_all`).
_STARTED: list[TieredProgram] = []


def _before_fork() -> None:
    # A fork starts the builds still waiting for a first call (a child may wait for
    # them), and waits for a build's child process that is starting.
    for program in _STARTED:
        program._go.set()
    _SPAWN_LOCK.acquire()


def _after_fork_in_child() -> None:
    # The builds' threads are not in the child: it follows the parent's (new events:
    # the parent's threads may have held their locks).
    global _SPAWN_LOCK
    _SPAWN_LOCK = threading.Lock()
    for program in _STARTED:
        if not program._done.is_set():
            program._follow_parent()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=lambda: _SPAWN_LOCK.release(),
                        after_in_child=_after_fork_in_child)


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
    program = TieredProgram(name, dispatch, first, ir_text)
    _STARTED.append(program)
    return program


def affine_loop_tier(el: str, rank: int, init: bool, final: bool, reverse: bool):
    """The affine kernel (`cpu_scan._affine_kernel`'s arguments) as a `Kernel` of a
    TieredProgram whose first tier is the sequential loop of `cpu_loop_tier.py` (no
    xDSL, no MLIR tool: LLVM only) and whose full build, the tile kernel, compiles in a
    child process; None when no tier is needed or possible (tiers off, the full build
    in the disk cache: then loaded by the caller)."""
    from scanweaver.errors import ToolFailedError
    from scanweaver.runtime.cpu_jit import Kernel, compiled_now

    if not enabled():
        return None
    full = FullIR("scanweaver.runtime.cpu_scan", "affine_ir", (el, rank, init, final, reverse))
    text = full.text(cached_only=True)
    if text is not None and compiled_now(text):
        return None
    # (only now: a warm process, which loads the full build, imports no IR builder)
    from llvmlite import ir

    from scanweaver.runtime.cpu_loop_tier import LoopProgram, add_affine_loop, affine_spec

    name, spec = "affine", affine_spec(rank, init, final)
    # The loop and the dispatch in one module (one LLVM run).
    try:
        module = ir.Module()
        add_affine_loop(module, el, rank, init, final, reverse, name)
        add_dispatch(module, name, spec)
        first = LoopProgram(str(module))
    except (ToolFailedError, RuntimeError):  # (a bug of this tier only): the full build, on this call
        return None
    program = TieredProgram(name, first, _LoopTier(first, name), text if text is not None else full)
    _STARTED.append(program)
    return Kernel(program, name, spec)


class _LoopTier:
    """The first tier's program: `name` is the loop function (the dispatch, in the same
    module, has the kernel's name)."""

    def __init__(self, program, name: str):
        self.program, self.name = program, name
        self.cache_hit = False

    def address(self, symbol: str) -> int:
        from scanweaver.runtime.cpu_loop_tier import loop_symbol

        return self.program.address(loop_symbol(self.name) if symbol == self.name else symbol)

    def optimized_ir(self) -> str:
        return self.program.optimized_ir()


__all__ = ["ENV_SWITCH", "FullIR", "TieredProgram", "add_dispatch", "affine_loop_tier", "build_from_stdin",
           "dispatch_ir", "enabled", "tiered_program", "wait_all"]
