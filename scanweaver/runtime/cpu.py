"""In-process CPU JIT for LLVM IR produced by `mlir-translate --mlir-to-llvmir`.

numba's llvmlite is built on LLVM 22, like the MLIR wheels, so it parses that IR
directly: no llc, no C compiler, no temporary files.

Calling convention (MLIR's `llvm.emit_c_interface`): we call `_mlir_ciface_NAME`.
  - a memref argument is passed as a pointer to its descriptor
    `{ptr allocated, ptr aligned, i64 offset, i64 sizes[R], i64 strides[R]}`
    (offset and strides count elements, not bytes);
  - a scalar argument is passed by value (f32, f64, i1/i8/i16/i32/i64, index = i64);
  - no result: void; one scalar result: returned by value;
  - several results: the ciface takes a pointer to a struct of the results as
    its *first* argument and returns void.
Memref results are not supported (nobody would own the buffer).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import platform
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from scanweaver.dtypes import NUMPY_DTYPES
from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError, ScanWeaverValueError, ToolFailedError



class _LazyLLVM:
    """`llvmlite.binding`, imported on first use: a process whose kernels all load as
    cached shared objects (`cpu_native.py`) never imports it (~50 ms)."""

    def __getattr__(self, name: str) -> Any:
        import llvmlite.binding as binding

        return getattr(binding, name)


llvm = _LazyLLVM()

# ------------------------------------------------------------------ argument types

# MLIR element type -> numpy dtype of the buffer (the one table, in scanweaver.dtypes).
_NUMPY_DTYPES = NUMPY_DTYPES

# Scalars passed by value. i1 comes back in a byte whose upper bits LLVM does not
# define, so results are read as uint8 and masked (see _result_value).
_SCALAR_CTYPES: dict[str, Any] = {
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
    "i1": ctypes.c_uint8,
    "i8": ctypes.c_int8,
    "i16": ctypes.c_int16,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "index": ctypes.c_int64,
}


@dataclass(frozen=True)
class Scalar:
    dtype: str  # "f32", "f64", "i1", "i8", "i16", "i32", "i64", "index"

    def __post_init__(self) -> None:
        if self.dtype not in _SCALAR_CTYPES:
            raise ScanWeaverTypeError(f"unsupported scalar type {self.dtype!r}: use one of {sorted(_SCALAR_CTYPES)}")

    def __str__(self) -> str:
        return self.dtype


@dataclass(frozen=True)
class MemRef:
    """A memref argument type.

    shape: one entry per dimension, None for `?` (an int rank means all dynamic).
    strides: None for MLIR's identity layout, whose innermost stride is a static 1,
      whose offset is 0 and whose other strides are static where the trailing sizes
      are; otherwise one entry per dimension, None for `?` (i.e. `strided<[...]>`).
    offset: static offset in elements, or None for `offset: ?`.
    """

    dtype: str
    shape: tuple[int | None, ...] | int
    strides: tuple[int | None, ...] | None = None
    offset: int | None = 0

    def __post_init__(self) -> None:
        if self.dtype not in _NUMPY_DTYPES:
            raise ScanWeaverTypeError(f"unsupported memref element type {self.dtype!r}: use one of {sorted(_NUMPY_DTYPES)}")
        if isinstance(self.shape, int):
            object.__setattr__(self, "shape", (None,) * self.shape)
        else:
            object.__setattr__(self, "shape", tuple(self.shape))
        if self.strides is not None:
            object.__setattr__(self, "strides", tuple(self.strides))
            if len(self.strides) != len(self.shape):
                raise ScanWeaverValueError(f"memref type has {len(self.shape)} sizes but {len(self.strides)} strides")

    @property
    def rank(self) -> int:
        return len(self.shape)

    def static_strides(self) -> tuple[int | None, ...]:
        """Strides the compiled code assumes; None where it reads the descriptor."""
        if self.strides is not None:
            return self.strides
        strides: list[int | None] = []
        running: int | None = 1
        for size in reversed(self.shape):
            strides.append(running)
            running = None if running is None or size is None else running * size
        return tuple(reversed(strides))

    def __str__(self) -> str:
        dims = "".join(f"{'?' if s is None else s}x" for s in self.shape)
        layout = ""
        if self.strides is not None:
            strides = ", ".join("?" if s is None else str(s) for s in self.strides)
            offset = "?" if self.offset is None else self.offset
            layout = f", strided<[{strides}], offset: {offset}>"
        return f"memref<{dims}{self.dtype}{layout}>"


ArgType = Scalar | MemRef

_MEMREF_RE = re.compile(
    r"memref<((?:(?:\?|\d+)x)*)(\w+|complex<\w+>)(?:,\s*strided<\[([^\]]*)\](?:,\s*offset:\s*(\?|\d+))?>)?\s*>"
)


def parse_type(text: str) -> ArgType:
    """`"f32"` -> Scalar, `"memref<?x4xf32, strided<[?, 1], offset: ?>>"` -> MemRef."""
    text = text.strip()
    if not text.startswith("memref"):
        return Scalar(text)
    match = _MEMREF_RE.fullmatch(text)
    if match is None:
        raise ScanWeaverTypeError(f"unsupported memref type {text!r}: only identity and strided<> layouts")
    dims, element, strides, offset = match.groups()
    shape = tuple(None if d == "?" else int(d) for d in dims.split("x")[:-1])
    if strides is None:
        return MemRef(element, shape)
    stride_list = tuple(None if s.strip() == "?" else int(s) for s in strides.split(",") if s.strip())
    static_offset = 0 if offset is None else (None if offset == "?" else int(offset))
    return MemRef(element, shape, stride_list, static_offset)


def _as_type(spec: ArgType | str) -> ArgType:
    return parse_type(spec) if isinstance(spec, str) else spec


@functools.cache
def memref_descriptor(rank: int) -> type[ctypes.Structure]:
    """ctypes twin of MLIR's rank-R memref descriptor (rank 0 has no size/stride arrays)."""
    fields = [("allocated", ctypes.c_void_p), ("aligned", ctypes.c_void_p), ("offset", ctypes.c_int64)]
    if rank:
        fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
    return type(f"MemRefDescriptor{rank}", (ctypes.Structure,), {"_fields_": fields})


def _descriptor(array: Any, spec: MemRef, what: str) -> ctypes.Structure:
    """Zero-copy descriptor over a numpy array, after checking it matches `spec`."""
    if not isinstance(array, np.ndarray):
        raise ScanWeaverTypeError(f"{what} expects a numpy array for {spec}, got {type(array).__name__}")
    expected = _NUMPY_DTYPES[spec.dtype]
    if array.dtype != expected:
        raise ScanWeaverTypeError(f"{what} expects dtype {expected} for {spec}, got {array.dtype}")
    if array.ndim != spec.rank:
        raise ScanWeaverValueError(f"{what} expects a {spec.rank}-D array for {spec}, got shape {array.shape}")
    if not array.flags.writeable:
        # Compiled code may store to any memref argument: never into read-only memory.
        raise ScanWeaverValueError(f"{what} is read-only, and compiled code may write memref arguments: pass a copy")
    for dim, (want, got) in enumerate(zip(spec.shape, array.shape)):
        if want is not None and want != got:
            raise ScanWeaverValueError(f"{what} expects size {want} in dimension {dim} for {spec}, got shape {array.shape}")
    itemsize = array.itemsize
    if any(s % itemsize for s in array.strides):
        raise ScanWeaverValueError(
            f"{what} has byte strides {array.strides} that are not multiples of the item size {itemsize}: "
            "pass np.ascontiguousarray(...)"
        )
    strides = tuple(s // itemsize for s in array.strides)
    if any(s < 0 for s in strides):
        # MLIR's lowering multiplies index by stride with `nuw`: negative strides are UB.
        raise ScanWeaverValueError(f"{what} has negative strides {strides}: pass np.ascontiguousarray(...)")
    for dim, (want, got) in enumerate(zip(spec.static_strides(), strides)):
        # A size-1 dimension never uses its stride, whatever numpy says; nor does an empty array.
        if want is not None and want != got and array.shape[dim] > 1 and array.size:
            raise ScanWeaverValueError(
                f"{what} has element strides {strides} but {spec} assumes stride {want} in dimension {dim}: "
                "pass np.ascontiguousarray(...) or declare the argument with strided<[?, ...], offset: ?>"
            )
    if array.ctypes.data % itemsize:
        raise ScanWeaverValueError(f"{what} is not aligned to its item size {itemsize}")
    offset = spec.offset or 0
    base = array.ctypes.data - offset * itemsize  # so that aligned + offset = first element
    desc = memref_descriptor(spec.rank)()
    desc.allocated = base
    desc.aligned = base
    desc.offset = offset
    if spec.rank:
        desc.sizes[:] = list(array.shape)
        desc.strides[:] = list(strides)
    return desc


def _scalar_arg(value: Any, spec: Scalar, what: str) -> Any:
    # Only numbers: float("1.5") or int(True-ish objects) would hide the caller's mistake.
    if isinstance(value, (str, bytes)) or not isinstance(value, (int, float, np.number, np.bool_)):
        raise ScanWeaverTypeError(f"{what} expects a number ({spec.dtype}), got {type(value).__name__} {value!r}")
    if spec.dtype in ("f32", "f64"):
        return float(value)
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise ScanWeaverTypeError(f"{what} expects an integer ({spec.dtype}), got {value!r}")
    number = int(value)
    bits = {"i1": 1, "i8": 8, "i16": 16, "i32": 32}.get(spec.dtype, 64)
    low, high = (0, 1) if bits == 1 else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    if not low <= number <= high:
        raise ScanWeaverValueError(f"{what} value {number} does not fit in {spec.dtype}")
    return number


def _result_value(value: Any, spec: Scalar) -> Any:
    return bool(value & 1) if spec.dtype == "i1" else value


# ------------------------------------------------------------------ native libraries


#: `_init_llvm` runs on whichever thread needs LLVM first: the caller's, a tier's
#: background build, or `cpu_native.target_machine_meanwhile` beside a build.
_LLVM_INIT_LOCK = threading.Lock()


def _new_init_lock() -> None:  # a forked child: the lock may have been held by a thread it does not have
    global _LLVM_INIT_LOCK
    _LLVM_INIT_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_init_lock)


def _init_llvm() -> None:
    with _LLVM_INIT_LOCK:  # (functools.cache alone may run it twice at once)
        _init_llvm_once()


@functools.cache
def _init_llvm_once() -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # MCJIT resolves external symbols in the process; libm is normally there via
    # Python itself, but make sure expf/log1pf/tanhf/erff resolve everywhere.
    # The usual sonames first: `find_library` runs `ldconfig -p`, a subprocess.
    for libm in ("libm.so.6", "libm.dylib"):
        try:
            llvm.load_library_permanently(libm)
            return
        except RuntimeError:
            continue
    import ctypes.util  # here: its import (and subprocess) only where the sonames failed

    libm = ctypes.util.find_library("m")
    if libm:
        llvm.load_library_permanently(libm)


def _libomp_candidates() -> Iterator[str]:
    # Explicit override first, then the PyPI wheel cmeel-libomp (LLVM 21 libomp),
    # then system installs (Debian libomp5 / libomp-dev, LLVM's own packages).
    if os.environ.get("SCANWEAVER_LIBOMP"):
        yield os.environ["SCANWEAVER_LIBOMP"]
    import importlib.metadata  # here: a first call that needs no OpenMP does not pay its import

    try:
        yield str(importlib.metadata.distribution("cmeel-libomp").locate_file("cmeel.prefix/lib/libomp.so"))
    except importlib.metadata.PackageNotFoundError:
        pass
    import ctypes.util

    found = ctypes.util.find_library("omp")
    if found:
        yield found
    yield from sorted(glob.glob("/usr/lib/llvm-*/lib/libomp.so*"), reverse=True)
    yield from sorted(glob.glob("/usr/lib/*-linux-gnu/libomp.so*"), reverse=True)


@functools.cache
def load_openmp_runtime() -> str:
    """Load LLVM's libomp into the process (for code lowered with openmp=True); returns its path."""
    for candidate in _libomp_candidates():
        try:
            llvm.load_library_permanently(candidate)  # dlopen: bare sonames are searched
        except RuntimeError:
            continue
        return candidate
    raise BackendUnavailableError(
        "LLVM's OpenMP runtime (libomp) not found: pip install cmeel-libomp==21.1.8, "
        "or apt-get install libomp5, or set SCANWEAVER_LIBOMP to the path of libomp.so"
    )


# ------------------------------------------------------------------ denormals

# x86: MXCSR bit 15 = flush-to-zero, bit 6 = denormals-are-zero.
# AArch64: FPCR bit 24 = FZ.
_DENORMAL_BITS = {"x86_64": 0x8040, "aarch64": 1 << 24}


def fp_control_ir(machine: str) -> str:
    """LLVM IR of `i64 @sw_get_fp_control()` and `void @sw_set_fp_control(i64)`: the
    floating-point control register of `machine` (x86_64: MXCSR through memory, 32
    bits; aarch64: FPCR), read and written whole."""
    from llvmlite import ir

    i32, i64, void, ptr = ir.IntType(32), ir.IntType(64), ir.VoidType(), ir.PointerType()
    module = ir.Module()
    get = ir.IRBuilder(ir.Function(module, ir.FunctionType(i64, []), "sw_get_fp_control").append_basic_block("entry"))
    put_fn = ir.Function(module, ir.FunctionType(void, [i64]), "sw_set_fp_control")
    put = ir.IRBuilder(put_fn.append_basic_block("entry"))
    if machine == "x86_64":
        mxcsr = ir.FunctionType(void, [ptr])
        store, load = (ir.Function(module, mxcsr, f"llvm.x86.sse.{op}mxcsr") for op in ("st", "ld"))
        p = get.alloca(i32, name="p")
        get.call(store, [p])
        get.ret(get.zext(get.load(p, typ=i32, name="v"), i64, name="w"))
        p = put.alloca(i32, name="p")
        put.store(put.trunc(put_fn.args[0], i32, name="v"), p)
        put.call(load, [p])
    else:
        read = ir.Function(module, ir.FunctionType(i64, []), "llvm.aarch64.get.fpcr")
        write = ir.Function(module, ir.FunctionType(void, [i64]), "llvm.aarch64.set.fpcr")
        get.ret(get.call(read, [], name="v"))
        put.call(write, [put_fn.args[0]])
    put.ret_void()
    return str(module)


@functools.cache
def _fp_control() -> tuple[int, Callable[[], int], Callable[[int], None], Any]:
    machine = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    if machine not in _DENORMAL_BITS:
        raise BackendUnavailableError(f"flushing denormals is not implemented for {machine}")
    program = CpuProgram(fp_control_ir(machine))
    get = ctypes.CFUNCTYPE(ctypes.c_int64)(program.address("sw_get_fp_control"))
    put = ctypes.CFUNCTYPE(None, ctypes.c_int64)(program.address("sw_set_fp_control"))
    return _DENORMAL_BITS[machine], get, put, program  # program kept alive with the functions


def set_flush_denormals(enable: bool = True) -> bool:
    """Flush denormal floats to zero on the *calling thread*; returns the previous setting.

    Chunked scans multiply many decay factors and run 10x slower on denormals.
    OpenMP worker threads keep their own setting (they inherit it when created).
    """
    bits, get, put, _ = _fp_control()
    state = get()
    put(state | bits if enable else state & ~bits)
    return bool(state & bits)


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """Flush denormals to zero inside the `with` block, then restore the old setting."""
    bits, get, put, _ = _fp_control()
    state = get()
    put(state | bits)
    try:
        yield
    finally:
        put(state)


# ------------------------------------------------------------------ the program


def _object_file(payload: bytes) -> llvm.ObjectFileRef:
    """A cached object file; ValueError (a cache miss) when it is not one."""
    if not payload.startswith(b"\x7fELF"):
        raise ValueError("not an ELF object file")
    return llvm.ObjectFileRef.from_data(payload)


def host_target_machine(opt_level: int = 3, shared_object: bool = False) -> llvm.TargetMachine:
    """Target machine for this CPU with all its features (AVX2/AVX-512 where present).
    shared_object: position-independent code for a shared library (`cpu_native.py`)."""
    _init_llvm()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(
        cpu=llvm.get_host_cpu_name(),
        features=llvm.get_host_cpu_features().flatten(),
        opt=opt_level,
        **({"reloc": "pic", "codemodel": "default"} if shared_object else {"codemodel": "jitdefault"}),
    )


def optimized_module(llvm_ir: str, target_machine: llvm.TargetMachine, opt_level: int) -> llvm.ModuleRef:
    """LLVM IR parsed, verified and run through the O`opt_level` pipeline for `target_machine`."""
    try:
        module = llvm.parse_assembly(llvm_ir)
        module.verify()
    except RuntimeError as error:
        first = str(error).strip().splitlines()[:6]
        raise ToolFailedError("llvmlite rejected the LLVM IR:\n" + "\n".join(first)) from None
    module.triple = target_machine.triple
    module.data_layout = str(target_machine.target_data)
    if opt_level > 0:
        tuning = llvm.create_pipeline_tuning_options(speed_level=opt_level)
        tuning.loop_vectorization = True
        tuning.slp_vectorization = True
        builder = llvm.create_pass_builder(target_machine, tuning)
        builder.getModulePassManager().run(module, builder)
    return module


class CpuProgram:
    """A JIT-compiled LLVM IR module; functions stay valid while this object lives.

    The machine code is cached on disk (`toolchain/cache.py`, keyed by the IR, the
    optimisation level and this CPU's name and features): a new process that runs a
    kernel it has run before loads the object file and skips O3 and code generation."""

    def __init__(self, llvm_ir: str, opt_level: int = 3, openmp: bool | None = None):
        _init_llvm()
        if openmp or (openmp is None and "@__kmpc_" in llvm_ir):
            self.openmp_runtime: str | None = load_openmp_runtime()
        else:
            self.openmp_runtime = None
        self.target_machine = host_target_machine(opt_level)
        self._llvm_ir, self._opt_level = llvm_ir, opt_level
        self._module: llvm.ModuleRef | None = None
        from scanweaver.toolchain import cache

        key = cache.cache_key(
            "cpu-object", llvm_ir, opt_level=opt_level, triple=self.target_machine.triple,
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
        )
        obj, self.cache_hit = cache.cached(key, self._machine_code, parse=_object_file)
        # An empty module carries the target; the code comes from the object file.
        shell = llvm.parse_assembly("")
        shell.triple = self.target_machine.triple
        shell.data_layout = str(self.target_machine.target_data)
        self.engine = llvm.create_mcjit_compiler(shell, self.target_machine)
        self.engine.add_object_file(obj)
        self.engine.finalize_object()
        self.engine.run_static_constructors()

    def _optimized_module(self) -> llvm.ModuleRef:
        if self._module is None:
            self._module = optimized_module(self._llvm_ir, self.target_machine, self._opt_level)
        return self._module

    def _machine_code(self) -> bytes:
        return self.target_machine.emit_object(self._optimized_module())

    def optimized_ir(self) -> str:
        """LLVM IR after the O3 pipeline (to check vectorisation, fusion, ...)."""
        return str(self._optimized_module())

    def address(self, symbol: str) -> int:
        address = self.engine.get_function_address(symbol)
        if not address:
            raise ScanWeaverValueError(f"symbol {symbol!r} is not defined in this program")
        return address

    def get(
        self,
        name: str,
        args: Sequence[ArgType | str],
        results: Sequence[Scalar | str] = (),
        ftz: bool = False,
        contract: Any = None,
    ) -> Callable[..., Any]:
        """Python callable for func.func @name through `_mlir_ciface_name`.

        args/results: types as `MemRef`/`Scalar` or MLIR type strings
        ("memref<?x?xf32>", "f32", ...). The callable takes numpy arrays (zero copy,
        any non-negative strides that the declared layout allows) and Python scalars;
        returns None, one value, or a tuple of values. ftz=True (off by default, an explicit
        numerics option) flushes denormals to zero during each call (see `flush_denormals`).
        contract: a `shape_contract.ShapeContract` checked before each call (refuses
        shapes that would make the code access memory outside its arrays).
        """
        arg_types = [_as_type(a) for a in args]
        result_types = [_as_type(r) for r in results]
        for result in result_types:
            if not isinstance(result, Scalar):
                raise ScanWeaverTypeError(f"{name}: memref results are not supported ({result}); pass an output argument")
        ciface = "_mlir_ciface_" + name
        address = self.engine.get_function_address(ciface)
        if not address:
            hint = (
                "it has no C interface: mark it with llvm.emit_c_interface (scanweaver.toolchain.mlir.emit_c_interface)"
                if self.engine.get_function_address(name)
                else "no such function"
            )
            raise ScanWeaverValueError(f"cannot call {name!r}: {hint}")

        c_args: list[Any] = []
        result_struct = None
        if len(result_types) > 1:
            result_struct = type(
                f"{name}_results",
                (ctypes.Structure,),
                {"_fields_": [(f"r{i}", _SCALAR_CTYPES[r.dtype]) for i, r in enumerate(result_types)]},
            )
            c_args.append(ctypes.POINTER(result_struct))
        for arg in arg_types:
            c_args.append(
                ctypes.POINTER(memref_descriptor(arg.rank)) if isinstance(arg, MemRef) else _SCALAR_CTYPES[arg.dtype]
            )
        restype = _SCALAR_CTYPES[result_types[0].dtype] if len(result_types) == 1 else None
        cfunc = ctypes.CFUNCTYPE(restype, *c_args)(address)

        def call(*values: Any) -> Any:
            if len(values) != len(arg_types):
                raise ScanWeaverTypeError(f"{name} takes {len(arg_types)} arguments, got {len(values)}")
            converted: list[Any] = []
            for index, (spec, value) in enumerate(zip(arg_types, values)):
                what = f"argument {index} of {name}"
                if isinstance(spec, MemRef):
                    # The descriptor holds a raw pointer: `values` keeps the arrays alive.
                    converted.append(ctypes.byref(_descriptor(value, spec, what)))
                else:
                    converted.append(_scalar_arg(value, spec, what))
            if contract is not None:
                contract.check(values)
            out = result_struct() if result_struct is not None else None
            if out is not None:
                converted.insert(0, ctypes.byref(out))
            with flush_denormals() if ftz else contextlib.nullcontext():
                raw = cfunc(*converted)
            if out is not None:
                return tuple(_result_value(getattr(out, f"r{i}"), r) for i, r in enumerate(result_types))
            if result_types:
                return _result_value(raw, result_types[0])
            return None

        call.__name__ = name
        call.__doc__ = f"{name}({', '.join(map(str, arg_types))}) -> ({', '.join(map(str, result_types))})"
        call.program = self  # type: ignore[attr-defined]  # keeps the engine alive with the callable
        return call
