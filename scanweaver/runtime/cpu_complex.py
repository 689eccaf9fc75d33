"""Complex affine scans on the CPU (complex64 / complex128), for `linear_scan`.

The input is viewed as (outer, L, inner) around the scan axis, with no copy for
C-contiguous arrays:

  inner == 1   a (channels, L) kernel running TILE channels' chains together, each
               row read sequentially (workloads/complex_last_axis.py: built already
               lowered, as the reference's per-element arithmetic);
  inner > 1    a rank-3 `scan.affine ... axis 1`, lowered time-major with the inner
               channels innermost (rewrites/complex_affine_loops.py): contiguous,
               independent channels per step, and no transposed copies of (L, N) data.

Threads split the channels (outer rows, else inner columns: a column slice keeps the
innermost stride 1).  Every variant computes each element with the same complex
multiply-add, so results do not depend on the split.  No time-parallel (chunked)
variant exists for complex states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import functools

import numpy as np

from scanweaver.runtime.cpu_scan import (
    _mlir_el,
    affine_ir,
    kernel,
    num_threads,
    parallel_for,
    split_range,
)

#: Below this many elements one call beats waking a second thread.
THREAD_MIN_ELEMENTS = 1 << 17
#: Channels whose chains the last-axis kernel runs together (4 was fastest at
#: (256, 2048) complex64 on this 2-core machine; 16 and more spill).
TILE = 4


@functools.lru_cache(maxsize=None)
def _last_axis_kernel(el: str, init: bool, final: bool, reverse: bool):
    """The tiled last-axis kernel: scan-complex-to-real, then MLIR's CPU lowering (no
    raise: the loops are already the lowering; the LLVM IR is cached on disk)."""
    from scanweaver.compiler import cpu_llvm_ir
    from scanweaver.ir import make_context
    from scanweaver.rewrites.complex_to_real import ComplexToReal
    from scanweaver.runtime.cpu import CpuProgram
    from scanweaver.runtime.cpu_jit import Kernel
    from scanweaver.workloads.complex_last_axis import complex_last_axis_scan

    module = complex_last_axis_scan(el, init, final, reverse, TILE)
    ComplexToReal().apply(make_context(), module)
    llvm_ir, _ = cpu_llvm_ir(module)
    args = [2, 2] + ([1] if init else []) + [2] + ([1] if final else [])  # memref ranks
    return Kernel(CpuProgram(llvm_ir), "complex_last_axis", args)


def _last_axis(a2: np.ndarray, b2: np.ndarray, h0: np.ndarray | None, reverse: bool,
               threads: int) -> tuple[np.ndarray, np.ndarray]:
    """(h, final) of (channels, L) contiguous arrays; threads take row ranges."""
    rows, L = a2.shape
    part = {np.dtype(np.complex64): "f32", np.dtype(np.complex128): "f64"}[a2.dtype]
    k = _last_axis_kernel(part, h0 is not None, True, reverse)
    h = np.empty_like(a2)
    final = np.empty(rows, a2.dtype)
    if threads == 1 or a2.size < THREAD_MIN_ELEMENTS:
        ranges = [(0, rows)]
    else:
        ranges = split_range(rows, min(rows, threads), TILE)

    def task(lo: int, hi: int) -> Callable[[], None]:
        args: list[Any] = [a2[lo:hi], b2[lo:hi]] + ([h0[lo:hi]] if h0 is not None else []) + [h[lo:hi], final[lo:hi]]
        return k.bind(*args)

    parallel_for([task(lo, hi) for lo, hi in ranges if hi > lo], threads=threads)
    return h, final


def _rank3_kernel(el: str, init: bool, final: bool, reverse: bool):
    # affine_ir puts the axis last; the rank-3 form scans axis 1.
    ir = affine_ir(el, 3, init, final, reverse).replace(" axis 2", " axis 1")
    spec: list[int | str] = [3, 3] + ([2] if init else []) + [3] + ([2] if final else [])
    return kernel(ir, "affine", spec)


def complex_scan_cpu(
    a: np.ndarray,
    b: np.ndarray,
    h0: np.ndarray | None,
    axis: int,
    reverse: bool,
    threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(h, final) of h[t] = a[t] h[t-1] + b[t] along `axis` (a, b one complex dtype)."""
    shape = a.shape
    L = shape[axis]
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    channel_shape = shape[:axis] + shape[axis + 1 :]
    dtype = a.dtype
    threads = num_threads() if threads is None else max(1, threads)
    if inner == 1:
        h2, final = _last_axis(
            np.ascontiguousarray(a).reshape(outer, L), np.ascontiguousarray(b, dtype).reshape(outer, L),
            None if h0 is None else np.ascontiguousarray(h0, dtype).reshape(outer), reverse, threads,
        )
        return h2.reshape(shape), final.reshape(channel_shape)
    a3 = np.ascontiguousarray(a).reshape(outer, L, inner)
    b3 = np.ascontiguousarray(b).reshape(outer, L, inner)
    init = None if h0 is None else np.ascontiguousarray(h0, dtype=dtype).reshape(outer, inner)
    h = np.empty((outer, L, inner), dtype)
    final = np.empty((outer, inner), dtype)
    k = _rank3_kernel(_mlir_el(dtype), init is not None, True, reverse)
    if threads == 1 or a.size < THREAD_MIN_ELEMENTS:
        pieces = [(slice(None), slice(None))]
    elif outer >= 2 * threads:
        pieces = [(slice(lo, hi), slice(None)) for lo, hi in split_range(outer, threads)]
    else:  # few rows: split the inner channels (8 per piece keeps whole cache lines)
        pieces = [(slice(None), slice(lo, hi)) for lo, hi in split_range(inner, threads, 8)]

    def task(rows: slice, cols: slice) -> Callable[[], None]:
        args: list[Any] = [a3[rows, :, cols], b3[rows, :, cols]]
        args += [init[rows, cols]] if init is not None else []
        args += [h[rows, :, cols], final[rows, cols]]
        return k.bind(*args)

    parallel_for([task(r, c) for r, c in pieces if (r.stop or outer) > (r.start or 0) and (c.stop or inner) > (c.start or 0)],
                 threads=threads)
    return h.reshape(shape), final.reshape(channel_shape)
