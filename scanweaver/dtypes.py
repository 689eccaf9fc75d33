"""The one table of element types: MLIR element type name <-> numpy dtype.

Every layer (workload builders, CPU and GPU drivers, the JIT calling layer) reads its
mapping from here, so a new element type is added in one place.
"""

from __future__ import annotations

import numpy as np

# MLIR element type -> numpy dtype of the buffer. i1 is stored as one byte in memory.
# bf16 has no numpy dtype: its raw bits travel as uint16.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(np.uint16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "index": np.dtype(np.int64),  # index is i64 on the 64-bit hosts we target
    "complex<f32>": np.dtype(np.complex64),  # (re, im) adjacent, numpy's layout
    "complex<f64>": np.dtype(np.complex128),
}

#: Element types a scan kernel computes in (the scan workloads' inputs and states).
SCAN_ELEMENTS = ("f16", "f32", "f64", "i32", "i64")

#: Complex states (the CPU kernels of linear_scan and the complex selective scan).
COMPLEX_ELEMENTS = ("complex<f32>", "complex<f64>")

#: numpy dtype -> MLIR element type of the scan kernels.
MLIR_ELEMENT: dict[np.dtype, str] = {NUMPY_DTYPES[el]: el for el in (*SCAN_ELEMENTS, *COMPLEX_ELEMENTS)}


def mlir_element(dtype, allowed: tuple[str, ...] = SCAN_ELEMENTS) -> str | None:
    """The MLIR element type of a numpy `dtype` among `allowed`, or None."""
    el = MLIR_ELEMENT.get(np.dtype(dtype))
    return el if el in allowed else None


__all__ = ["COMPLEX_ELEMENTS", "MLIR_ELEMENT", "NUMPY_DTYPES", "SCAN_ELEMENTS", "mlir_element"]
