"""Functions that return scalars on the GPU: device temporaries for their results.

`gpu-results-to-args` (`rewrites/gpu_results.py`) turns each scalar result of a
function into a rank-0 output memref argument appended after the function's own.
`ReturningFunction` hides them again: per call it allocates one element per result
(staged on the device like any output array), launches, copies it back and returns
the value(s), so `prog.f(a, b)` returns what the CPU build's `f` returns.  Plain data
and numpy only (deployed artifacts load it without the compiler).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cuda import call_options

#: result type name (MLIR) -> numpy dtype of its temporary
RESULT_DTYPES = {
    "f16": np.float16, "f32": np.float32, "f64": np.float64,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64, "index": np.int64,
}


class ReturningFunction:
    """A launched function (`CudaFunction`) whose last arguments are its results."""

    def __init__(self, function: Any, name: str, results: Sequence[str], arg_count: int):
        unknown = [r for r in results if r not in RESULT_DTYPES]
        if unknown:
            raise ScanWeaverValueError(f"@{name} returns {', '.join(unknown)}, which the CUDA runtime cannot return")
        self._function, self._name = function, name
        self._dtypes = [np.dtype(RESULT_DTYPES[r]) for r in results]
        self._arg_count = arg_count - len(results)  # what the caller passes

    def __call__(self, *arrays: Any, **options: Any) -> Any:
        stream = call_options(self._name, options)
        if len(arrays) != self._arg_count:
            raise ScanWeaverTypeError(f"@{self._name} takes {self._arg_count} arguments, got {len(arrays)}")
        temps = [np.zeros((), dt) for dt in self._dtypes]
        self._function(*arrays, *temps, stream=stream)
        values = [t[()] for t in temps]
        return values[0] if len(values) == 1 else tuple(values)

    def __getattr__(self, attr: str) -> Any:  # timing helpers etc. of the launched function
        return getattr(self._function, attr)


def with_results(function: Any, name: str, results: Sequence[str], arg_count: int) -> Any:
    """`function` itself, or a `ReturningFunction` around it when it has results."""
    return ReturningFunction(function, name, results, arg_count) if results else function


__all__ = ["RESULT_DTYPES", "ReturningFunction", "with_results"]
