"""Run a `func.func` from IR on numpy arrays with the xDSL interpreter (the golden oracle).

Memref arguments are read from and written back to the numpy arrays in place, as a
compiled function would; scalar arguments are plain Python numbers.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    BFloat16Type,
    ComplexType,
    Float16Type,
    Float32Type,
    Float64Type,
    IndexType,
    IntegerType,
    MemRefType,
    ModuleOp,
)
from xdsl.interpreter import Interpreter, InterpreterFunctions
from xdsl.interpreters import register_implementations
from xdsl.interpreters.builtin import xtype_for_el_type
from xdsl.interpreters.shaped_array import ShapedArray
from xdsl.interpreters.utils.ptr import RawPtr, TypedPtr
from xdsl.ir import Attribute

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.interp.numerics import bf16_bits_to_float, float_to_bf16_bits
from scanweaver.interp.complex_impls import ComplexFunctions, ComplexStorage
from scanweaver.interp.scan_impls import ScanFunctions
from scanweaver.interp.upstream_impls import UpstreamFunctions


class BF16Storage:
    """Packs bf16 values as 16-bit patterns; xDSL's BFloat16Type cannot be packed."""

    compile_time_size = 2
    name = "bf16"

    def unpack(self, buffer, num: int) -> tuple[float, ...]:
        return tuple(bf16_bits_to_float(b) for b in struct.unpack(f"<{num}H", buffer))

    def iter_unpack(self, buffer):
        return (bf16_bits_to_float(b) for (b,) in struct.iter_unpack("<H", buffer))

    def pack_into(self, buffer, offset: int, value: float) -> None:
        struct.pack_into("<H", buffer, offset, float_to_bf16_bits(value))

    def pack(self, values: Sequence[float]) -> bytes:
        return struct.pack(f"<{len(values)}H", *map(float_to_bf16_bits, values))


#: numpy dtype expected for each memref element type (bf16 travels as raw uint16 bits).
def numpy_dtype_for(el: Attribute) -> np.dtype:
    if isinstance(el, ComplexType) and isinstance(el.element_type, Float32Type | Float64Type):
        return np.dtype(np.complex64 if isinstance(el.element_type, Float32Type) else np.complex128)
    if isinstance(el, Float32Type):
        return np.dtype(np.float32)
    if isinstance(el, Float64Type):
        return np.dtype(np.float64)
    if isinstance(el, Float16Type):
        return np.dtype(np.float16)
    if isinstance(el, BFloat16Type):
        return np.dtype(np.uint16)
    if isinstance(el, IndexType):
        return np.dtype(np.int64)
    if isinstance(el, IntegerType):
        width = el.width.data
        if width == 1:
            return np.dtype(np.bool_)
        return np.dtype(f"int{width}")
    raise ScanWeaverTypeError(f"element type {el} is not supported by the interpreter")


def _storage_xtype(el: Attribute):
    if isinstance(el, BFloat16Type):
        return BF16Storage()
    if isinstance(el, ComplexType):
        return ComplexStorage(el)
    return xtype_for_el_type(el, 64)


def make_interpreter(module: ModuleOp) -> Interpreter:
    interpreter = Interpreter(module, index_bitwidth=64)
    register_implementations(interpreter, Context())
    interpreter.register_implementations(UpstreamFunctions(), override=True)
    interpreter.register_implementations(ScanFunctions())
    interpreter.register_implementations(ComplexFunctions())
    return interpreter


def parse_module(text: str) -> ModuleOp:
    from scanweaver.ir import parse_ir

    return parse_ir(text)


def _to_shaped(array: np.ndarray, t: MemRefType, name: str) -> ShapedArray[Any]:
    want = numpy_dtype_for(t.element_type)
    if array.dtype != want:
        raise ScanWeaverTypeError(
            f"argument '{name}': expected a numpy array of dtype {want} for "
            f"{t}, got {array.dtype}"
        )
    shape = list(t.get_shape())
    if len(shape) != array.ndim or any(
        d != DYNAMIC_INDEX and d != s for d, s in zip(shape, array.shape)
    ):
        raise ScanWeaverValueError(
            f"argument '{name}': shape {array.shape} does not match {t}"
        )
    raw = RawPtr(bytearray(np.ascontiguousarray(array).tobytes()))
    return ShapedArray(TypedPtr(raw, xtype=_storage_xtype(t.element_type)), list(array.shape))


def _from_shaped(shaped: ShapedArray[Any], dtype: np.dtype) -> np.ndarray:
    buffer = shaped.data_ptr.raw.memoryview
    return np.frombuffer(buffer, dtype=dtype, count=shaped.size).reshape(shaped.shape)


def run_function(
    module: ModuleOp | str,
    name: str,
    *args: Any,
    extra_impls: Sequence[InterpreterFunctions] = (),
) -> tuple[Any, ...]:
    """Interpret `func.func @name` on `args`; memref arguments are updated in place.

    `extra_impls` adds op implementations (e.g. the GPU simulator's gpu.launch_func).
    """
    if isinstance(module, str):
        module = parse_module(module)
    fn = next(
        (op for op in module.walk() if isinstance(op, func.FuncOp) and op.sym_name.data == name),
        None,
    )
    if fn is None:
        raise ScanWeaverValueError(f"no function named '@{name}' in the module")
    arg_types = fn.function_type.inputs.data
    if len(args) != len(arg_types):
        raise ScanWeaverTypeError(
            f"function '@{name}' takes {len(arg_types)} arguments, got {len(args)}"
        )
    values: list[Any] = []
    written: list[tuple[np.ndarray, ShapedArray[Any], np.dtype]] = []
    for i, (arg, t) in enumerate(zip(args, arg_types)):
        arg_name = f"#{i} of @{name}"
        if isinstance(t, MemRefType):
            if not isinstance(arg, np.ndarray):
                raise ScanWeaverTypeError(f"argument {arg_name}: expected a numpy array for {t}")
            shaped = _to_shaped(arg, t, arg_name)
            written.append((arg, shaped, numpy_dtype_for(t.element_type)))
            values.append(shaped)
        else:
            values.append(arg.item() if isinstance(arg, np.generic) else arg)
    interpreter = make_interpreter(module)
    for impls in extra_impls:
        interpreter.register_implementations(impls)
    results = interpreter.call_op(name, tuple(values))
    for array, shaped, dtype in written:
        array[...] = _from_shaped(shaped, dtype)
    return tuple(
        _from_shaped(r, numpy_dtype_for(t.element_type)).copy()
        if isinstance(r, ShapedArray) and isinstance(t, MemRefType)
        else r
        for r, t in zip(results, fn.function_type.outputs.data)
    )
