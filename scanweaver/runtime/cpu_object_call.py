"""Calls of a compiled kernel that take numpy arrays as Python objects.

The expanded MLIR calling convention passes 3 + 2R machine words per rank-R memref;
converting them in ctypes (plus `__array_interface__` per array) costs tens of
microseconds for a tiny call.  Here a small compiled trampoline per argument
signature, `sw_object_call(fn, obj...)`, reads each ndarray's data pointer, sizes and
strides from the array object (numpy's public `PyArrayObject_fields` layout: data,
nd, dimensions, strides after the object header) and calls `fn` with the expanded
arguments: ctypes then converts one pointer per array.

The layout is checked once per process against numpy itself on a probe array (data
pointer, sizes, strides); where it differs (a numpy or Python build with another
header) `object_caller` returns None and callers keep the ordinary ctypes path.
The caller checks types, dtypes, ranks and strides before calling, as for `Kernel`.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Sequence

import numpy as np

from scanweaver.runtime.cpu import CpuProgram
from scanweaver.runtime.cpu_native import NativeProgram, native_program

#: Byte offsets in a PyArrayObject: data pointer, dimensions and strides pointers.
_HEADER = object.__basicsize__  # PyObject_HEAD: 16 bytes on 64-bit CPython
_DATA, _DIMS, _STRIDES = _HEADER, _HEADER + 16, _HEADER + 24

_LLVM_SCALARS = {"index": "i64", "i64": "i64", "i32": "i32", "f32": "float", "f64": "double"}
_C_SCALARS = {"index": ctypes.c_int64, "i64": ctypes.c_int64, "i32": ctypes.c_int32,
              "f32": ctypes.c_float, "f64": ctypes.c_double}


def _memref_words(obj: str, rank: int, itemsize: int, lines: list[str]) -> list[str]:
    """LLVM IR reading (data, data, 0, sizes, strides in elements) of array `obj`."""
    lines += [
        f"  %{obj}.dp = getelementptr i8, ptr %{obj}, i64 {_DATA}",
        f"  %{obj}.data = load ptr, ptr %{obj}.dp",
        f"  %{obj}.sp = getelementptr i8, ptr %{obj}, i64 {_DIMS}",
        f"  %{obj}.sizes = load ptr, ptr %{obj}.sp",
        f"  %{obj}.tp = getelementptr i8, ptr %{obj}, i64 {_STRIDES}",
        f"  %{obj}.strides = load ptr, ptr %{obj}.tp",
    ]
    words = [f"ptr %{obj}.data", f"ptr %{obj}.data", "i64 0"]
    for kind, base in (("n", "sizes"), ("s", "strides")):
        for d in range(rank):
            lines += [
                f"  %{obj}.{kind}{d}p = getelementptr i64, ptr %{obj}.{base}, i64 {d}",
                f"  %{obj}.{kind}{d}b = load i64, ptr %{obj}.{kind}{d}p",
            ]
            if kind == "s":  # bytes -> elements (strides are multiples of the item size)
                lines.append(f"  %{obj}.s{d} = sdiv exact i64 %{obj}.s{d}b, {itemsize}")
                words.append(f"i64 %{obj}.s{d}")
            else:
                words.append(f"i64 %{obj}.n{d}b")
    return words


def trampoline_ir(spec: Sequence[int | str], itemsizes: Sequence[int]) -> str:
    """LLVM IR of `sw_object_call(ptr fn, ...)`: per memref argument an ndarray object,
    per scalar the scalar; `itemsizes` per memref argument, in order."""
    params, words, lines = ["ptr %fn"], [], []
    sizes = iter(itemsizes)
    for i, s in enumerate(spec):
        if isinstance(s, int):
            params.append(f"ptr %o{i}")
            words += _memref_words(f"o{i}", s, next(sizes), lines)
        else:
            params.append(f"{_LLVM_SCALARS[s]} %x{i}")
            words.append(f"{_LLVM_SCALARS[s]} %x{i}")
    return (
        f"define void @sw_object_call({', '.join(params)}) {{\n" + "\n".join(lines) + "\n"
        f"  call void %fn({', '.join(words)})\n  ret void\n}}\n"
    )


def _program(llvm_ir: str, opt_level: int) -> CpuProgram | NativeProgram:
    """A cached shared object where possible (no llvmlite in a warm process), else MCJIT."""
    return native_program(llvm_ir, lambda: llvm_ir, opt_level) or CpuProgram(llvm_ir, opt_level=opt_level)


@functools.cache
def _trampoline(spec: tuple, itemsizes: tuple) -> tuple[CpuProgram | NativeProgram, Callable[..., None]]:
    program = _program(trampoline_ir(spec, itemsizes), opt_level=2)
    args: list = [ctypes.c_void_p]
    args += [ctypes.py_object if isinstance(s, int) else _C_SCALARS[s] for s in spec]
    return program, ctypes.CFUNCTYPE(None, *args)(program.address("sw_object_call"))


_PROBE_IR = """
define void @sw_probe(ptr %o, ptr %out) {
  %dp = getelementptr i8, ptr %o, i64 DATA
  %data = load ptr, ptr %dp
  %d = ptrtoint ptr %data to i64
  store i64 %d, ptr %out
  %sp = getelementptr i8, ptr %o, i64 DIMS
  %sizes = load ptr, ptr %sp
  %n1p = getelementptr i64, ptr %sizes, i64 1
  %n1 = load i64, ptr %n1p
  %o1 = getelementptr i64, ptr %out, i64 1
  store i64 %n1, ptr %o1
  %tp = getelementptr i8, ptr %o, i64 STRIDES
  %strides = load ptr, ptr %tp
  %s0 = load i64, ptr %strides
  %o2 = getelementptr i64, ptr %out, i64 2
  store i64 %s0, ptr %o2
  ret void
}
"""


@functools.cache
def layout_ok() -> bool:
    """Whether arrays have the layout the trampolines read (checked on a probe array)."""
    if sys.maxsize != 2**63 - 1 or _HEADER != 16:
        return False
    ir = _PROBE_IR.replace("DATA", str(_DATA)).replace("DIMS", str(_DIMS)).replace("STRIDES", str(_STRIDES))
    program = _program(ir, opt_level=0)
    probe = ctypes.CFUNCTYPE(None, ctypes.py_object, ctypes.c_void_p)(program.address("sw_probe"))
    x = np.zeros((3, 5, 7), np.float64)[:, 1:4]  # a view: sizes and strides not the defaults
    out = np.zeros(3, np.int64)
    probe(x, out.ctypes.data)
    return [int(v) for v in out] == [x.ctypes.data, x.shape[1], x.strides[0]]


def object_caller(fn_address: int, spec: Sequence[int | str], itemsizes: Sequence[int]) -> Callable[..., None] | None:
    """`call(*values)` of the kernel at `fn_address` taking ndarrays for memrefs, or None
    where the array layout is not the expected one.  The trampoline program stays alive
    with the returned function (cached per signature)."""
    if not layout_ok():
        return None
    program, trampoline = _trampoline(tuple(spec), tuple(itemsizes))
    # A partial, not a Python closure: one frame less per call (~0.3 us of a tiny call).
    call = functools.partial(trampoline, ctypes.c_void_p(fn_address))
    call.program = program  # type: ignore[attr-defined]
    return call
