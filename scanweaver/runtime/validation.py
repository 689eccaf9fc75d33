"""Argument checks shared by the public API and the runtime drivers.

One place for the messages that name an argument, its dtype and its shape, so the
API and the drivers below it refuse bad input in the same words.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError

FLOAT_TYPES = (np.float16, np.float32, np.float64)
SCAN_TYPES = (*FLOAT_TYPES, np.int32, np.int64)


def host_array(name: str, x: Any, allowed=SCAN_TYPES) -> np.ndarray:
    """`x` as a numpy array whose dtype is one of `allowed` (any dtype when None)."""
    if x is None:
        raise ScanWeaverTypeError(f"argument '{name}' is required")
    try:
        arr = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - any conversion failure is the user's input
        kind = ScanWeaverTypeError if isinstance(e, TypeError) else ScanWeaverValueError
        raise kind(f"argument '{name}' is not an array: {e}") from None
    if allowed is not None and arr.dtype not in [np.dtype(t) for t in allowed]:
        names = ", ".join(np.dtype(t).name for t in allowed)
        raise ScanWeaverTypeError(f"argument '{name}' has dtype {arr.dtype}; expected one of {names}")
    return arr


def check_shape(name: str, arr: Any, shape: tuple[int, ...], meaning: str, where: str = "") -> Any:
    """`arr` itself when its shape is `shape`; else an error naming the argument, the
    shape it has and the one it needs (`meaning` says what that shape is).  `where`
    prefixes the message with the function that checks (for the drivers)."""
    if tuple(arr.shape) != tuple(shape):
        prefix = f"{where}: " if where else ""
        raise ScanWeaverValueError(
            f"{prefix}argument '{name}' has shape {tuple(arr.shape)}; expected {tuple(shape)} ({meaning})"
        )
    return arr


__all__ = ["FLOAT_TYPES", "SCAN_TYPES", "check_shape", "host_array"]
