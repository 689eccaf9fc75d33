"""Compiled CPU code as a cached shared object, loaded with ctypes: the warm path.

`CpuProgram` keeps its machine code as an object file that MCJIT links in each new
process, which needs llvmlite (its import and a target machine: tens of ms).  Here the
code is linked once into a shared library (position-independent code from llvmlite,
then the system linker `ld -shared`) and cached on disk like every other artifact
(`toolchain/cache.py`, keyed by the caller's text and options and by this CPU); a hit
is a cache read and a dlopen: no llvmlite, no xDSL, no tool.

The cached bytes are checked by the cache (checksum, ownership) and then written to a
new private temporary file that is dlopen'ed and removed, so the loaded file is the
checked one.  Where there is no linker or no /proc/cpuinfo, or the library does not load,
`native_program` returns None and callers keep `CpuProgram`.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

from scanweaver.errors import ScanWeaverValueError

#: Set to "0" to keep every program on llvmlite's MCJIT (`CpuProgram`).
ENV_SWITCH = "SCANWEAVER_SHARED_OBJECTS"
#: The cache entry of a program whose shared object was built but does not load here.
UNLOADABLE = b"scanweaver: shared object does not load\n"


@functools.cache
def host_cpu() -> str | None:
    """This CPU as the kernel reports it (vendor, family, model, stepping, feature
    flags): what LLVM's host CPU name and features are derived from, read without
    llvmlite.  None where /proc/cpuinfo is not there."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n", 1)[0]
    except OSError:
        return None
    keep = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags", "Features", "CPU part")
    fields = [line for line in first.splitlines() if line.split(":", 1)[0].strip() in keep]
    return "\n".join(fields) or None


@functools.cache
def _linker() -> str | None:
    import shutil

    return shutil.which("ld")


def available() -> bool:
    """Whether programs can be cached as shared objects here (a miss also needs `ld`:
    without one, `native_program` returns None after looking in the cache)."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and host_cpu() is not None


class NativeProgram:
    """A loaded shared object: `address(symbol)` like `CpuProgram.address`.  The library
    stays loaded while this object (or a function holding it) lives."""

    def __init__(self, library: ctypes.CDLL, cache_hit: bool, llvm_ir: Callable[[], str], opt_level: int):
        self.library = library
        self.cache_hit = cache_hit
        self._llvm_ir, self._opt_level = llvm_ir, opt_level

    def address(self, symbol: str) -> int:
        try:
            return ctypes.cast(getattr(self.library, symbol), ctypes.c_void_p).value or 0
        except AttributeError:
            raise ScanWeaverValueError(f"symbol {symbol!r} is not defined in this program") from None

    def optimized_ir(self) -> str:
        """LLVM IR after the O3 pipeline (rebuilt on demand, as `CpuProgram` does)."""
        from scanweaver.runtime.cpu import host_target_machine, optimized_module

        tm = host_target_machine(self._opt_level, shared_object=True)
        return str(optimized_module(self._llvm_ir(), tm, self._opt_level))


def target_machine_meanwhile(opt_level: int) -> Callable[[], object]:
    """Start making the target machine of `shared_object` (llvmlite's import, LLVM's
    initialisation: 20-45 ms cold, mostly in C, where the GIL is free) on a thread, while
    this one builds the IR (xDSL's passes, then waiting for mlir-opt and mlir-translate);
    the returned function waits for it.  (A failure there: made again here, to raise.)"""
    import threading

    from scanweaver.runtime.cpu import host_target_machine

    made: list = []

    def make() -> None:
        try:
            made.append(host_target_machine(opt_level, shared_object=True))
        except Exception:  # raised again on this thread
            pass

    thread = threading.Thread(target=make, name="scanweaver-llvm-init", daemon=True)
    thread.start()

    def wait() -> object:
        thread.join()
        return made[0] if made else host_target_machine(opt_level, shared_object=True)

    return wait


def shared_object(llvm_ir: str, opt_level: int, target_machine: Callable[[], object] | None = None) -> bytes:
    """LLVM IR → O`opt_level` → position-independent object → `ld -shared` → bytes.
    target_machine: returns the target machine (`target_machine_meanwhile`)."""
    import subprocess
    import tempfile

    from scanweaver.errors import ToolFailedError
    from scanweaver.runtime.cpu import host_target_machine, optimized_module

    linker = _linker()
    if linker is None:
        raise ToolFailedError("no linker (ld) on PATH to make a shared object")
    tm = target_machine() if target_machine is not None else host_target_machine(opt_level, shared_object=True)
    obj = tm.emit_object(optimized_module(llvm_ir, tm, opt_level))
    with tempfile.TemporaryDirectory(prefix="scanweaver-so-") as tmp:
        src, out = os.path.join(tmp, "code.o"), os.path.join(tmp, "code.so")
        with open(src, "wb") as f:
            f.write(obj)
        done = subprocess.run([linker, "-shared", "-z", "noexecstack", "-o", out, src], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise ToolFailedError(f"ld -shared failed: {done.stderr.strip()[:400]}")
        with open(out, "rb") as f:
            return f.read()


@functools.cache
def _libm_global() -> None:
    # Compiled code calls expf, log1pf, ...: make libm's symbols global for the dlopen.
    try:
        ctypes.CDLL("libm.so.6", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass


def _load(payload: bytes) -> ctypes.CDLL:
    """dlopen the shared object `payload`; ValueError (a cache miss: rebuilt) when it
    is not one or does not load.  The bytes go to a new private file (mode 0600, created
    exclusively, a unique name: the loader reuses a library already loaded under the
    same name), removed once loaded."""
    if not payload.startswith(b"\x7fELF"):
        raise ValueError("not an ELF shared object")
    _libm_global()
    path = os.path.join(os.environ.get("TMPDIR") or "/tmp", f"scanweaver-{os.getpid()}-{os.urandom(8).hex()}.so")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(path, flags, 0o600), "wb") as f:  # (not `tempfile`: a warm call skips its import)
        f.write(payload)
    try:
        return ctypes.CDLL(path)
    except OSError as e:  # unresolved symbol, wrong architecture, ...
        raise ValueError(f"the shared object does not load: {e}") from None
    finally:
        os.unlink(path)  # the mapping stays


class _Missing(Exception):
    """A lookup that builds nothing found no entry."""


def _missing() -> bytes:
    raise _Missing


def native_program(key_text: str, llvm_ir: Callable[[], str], opt_level: int = 3, build_missing: bool = True,
                   **options: object) -> NativeProgram | None:
    """The program whose LLVM IR is `llvm_ir()`, cached as a shared object under
    (`key_text`, `opt_level`, `options`, this CPU); None where shared objects are not
    available here (then use `CpuProgram`).  On a hit, `llvm_ir` is not called.
    build_missing=False: None on a miss too (nothing is built).
    OpenMP code needs libomp loaded first (`cpu.load_openmp_runtime`)."""
    if not available():
        return None
    from scanweaver.errors import ToolFailedError
    from scanweaver.toolchain import cache

    key = cache.cache_key("cpu-object", key_text, shared_object=True, opt_level=opt_level, host=host_cpu(), **options)
    if not build_missing:
        try:
            library, _ = cache.cached(key, _missing, parse=lambda payload: None if payload == UNLOADABLE else _load(payload))
        except _Missing:
            return None
        return None if library is None else NativeProgram(library, True, llvm_ir, opt_level)
    memo: list[str] = []

    def ir() -> str:
        if not memo:
            memo.append(llvm_ir())
        return memo[0]

    built: list[ctypes.CDLL] = []

    def build() -> bytes:
        tm = target_machine_meanwhile(opt_level) if not memo else None  # (the IR to build first: LLVM meanwhile)
        payload = shared_object(ir(), opt_level, tm)
        try:
            built.append(_load(payload))
        except ValueError:  # e.g. a symbol no loaded library defines: remembered, so
            return UNLOADABLE  # later processes go straight to MCJIT without rebuilding
        return payload

    def parse(payload: bytes) -> ctypes.CDLL | None:
        if payload == UNLOADABLE:
            return None
        return built[0] if built else _load(payload)

    try:
        library, hit = cache.cached(key, build, parse=parse)
    except (ValueError, OSError, ToolFailedError):
        return None  # no working linker here: MCJIT does the job
    return None if library is None else NativeProgram(library, hit, ir, opt_level)


__all__ = ["NativeProgram", "available", "host_cpu", "native_program", "shared_object"]
