"""Scalar rounding helpers: make Python numbers behave like MLIR's fixed-width types.

The xDSL interpreter computes with Python floats (binary64) and unbounded ints; only a
store rounds.  ScanWeaver's oracle rounds every op to its result type instead, so that
interpreted IR matches compiled IR bit for bit (f32 math, integer wrap-around).
"""

from __future__ import annotations

import struct
from functools import cache

from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    IndexType,
    IntegerType,
)
from xdsl.ir import Attribute

_F32 = struct.Struct("<f")
_F16 = struct.Struct("<e")


def round_f32(x: float) -> float:
    try:
        return _F32.unpack(_F32.pack(x))[0]
    except OverflowError:  # finite beyond f32 range: IEEE rounding gives +-inf
        return float("inf") if x > 0 else float("-inf")


def round_f16(x: float) -> float:
    try:
        return _F16.unpack(_F16.pack(x))[0]
    except OverflowError:
        return float("inf") if x > 0 else float("-inf")


def round_bf16(x: float) -> float:
    return bf16_bits_to_float(float_to_bf16_bits(x))


def float_to_bf16_bits(x: float) -> int:
    """Round-to-nearest-even from f32 to bf16 (NaN stays NaN)."""
    bits = _F32_U32(round_f32(x))
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x007FFFFF:
        return (bits >> 16) | 0x40
    bits += 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16) & 0xFFFF


def bf16_bits_to_float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def _F32_U32(x: float) -> int:
    return struct.unpack("<I", _F32.pack(x))[0]


def wrap_int(value: int, width: int) -> int:
    """Two's-complement wrap to a signed `width`-bit integer."""
    value &= (1 << width) - 1
    return value - (1 << width) if value >> (width - 1) else value


@cache
def _rounder(t: Attribute):
    if isinstance(t, Float32Type):
        return round_f32
    if isinstance(t, Float16Type):
        return round_f16
    if isinstance(t, BFloat16Type):
        return round_bf16
    if isinstance(t, IntegerType):
        width = t.width.data
        return (lambda v: wrap_int(int(v), width)) if width > 1 else (lambda v: int(v) & 1)
    if isinstance(t, IndexType):
        return lambda v: wrap_int(int(v), 64)
    return lambda v: v  # f64: Python floats are already binary64


def round_to(t: Attribute, value):
    """Round or wrap `value` to the MLIR type `t`."""
    return _rounder(t)(value)
