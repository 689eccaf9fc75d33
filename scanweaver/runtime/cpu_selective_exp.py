"""Which form of exp(delta*A) the CPU selective kernel takes on this machine.

With AVX-512F, VL and DQ the kernel's fused polynomial exp applies 2^k with
`vscalefps` and bounds its reduced argument with `vrangeps` (`SCALEF_MARK` in
`rewrites/exp_polynomial.py`): the same bits, about a third fewer instructions per step.  The choice is an option of the kernel's builder,
so it is part of the kernel's IR text and of every cache key made from it.

Also here: `state_update_kernel`, the selective scan's state update h = exp(d*a)*h + x
alone with that exp (the harness's compute roofline, `bench/cpu_goals.py`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

import numpy as np

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cpu_native import host_cpu

#: Set to "0" for the fused form without vscalefps on every CPU.
ENV_SWITCH = "SCANWEAVER_SCALEF_EXP"


@functools.cache
def _host_has_scalef() -> bool:
    """AVX-512F, VL and DQ in this CPU's flags (/proc/cpuinfo, as LLVM sees them)."""
    info = host_cpu() or ""
    flags = set()
    for line in info.splitlines():
        if line.split(":", 1)[0].strip() == "flags":
            flags.update(line.split(":", 1)[1].split())
    return {"avx512f", "avx512vl", "avx512dq"} <= flags


def scalef_exp() -> bool:
    """Whether the CPU selective kernel is built with the scalef exp here."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and _host_has_scalef()


_UPDATE_IR = """func.func @state_update(%d: memref<?xf32>, %a: memref<?xf32>, %x: memref<?xf32>, %h: memref<?xf32>,
                         %reps: index) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c16 = arith.constant 16 : index
  %n = memref.dim %h, %c0 : memref<?xf32>
  scf.for %r = %c0 to %reps step %c1 {{
    scf.for %i = %c0 to %n step %c16 {{
      %dv = vector.load %d[%i] : memref<?xf32>, vector<16xf32>
      %av = vector.load %a[%i] : memref<?xf32>, vector<16xf32>
      %t = arith.mulf %dv, %av : vector<16xf32>
      %e = math.exp %t {{{marks}}} : vector<16xf32>
      %hv = vector.load %h[%i] : memref<?xf32>, vector<16xf32>
      %p = arith.mulf %e, %hv : vector<16xf32>
      %xv = vector.load %x[%i] : memref<?xf32>, vector<16xf32>
      %s = arith.addf %p, %xv : vector<16xf32>
      vector.store %s, %h[%i] : memref<?xf32>, vector<16xf32>
    }}
  }}
  func.return
}}
"""


def state_update_kernel() -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int], None]:
    """`reps` times h = exp(d * a) * h + x over f32 arrays (length a multiple of 16), compiled with
    the exp the selective kernel takes here (fused, scalef where `scalef_exp()`): the
    selective scan's state update alone, for the harness's compute roofline (an
    update of the scan also reads B, multiplies by C and sums, so it runs slower)."""
    from scanweaver.rewrites.exp_polynomial import FUSED_MARK, POLY_MARK, SCALEF_MARK
    from scanweaver.runtime.cpu_jit import kernel

    marks = ", ".join([POLY_MARK, FUSED_MARK] + ([SCALEF_MARK] if scalef_exp() else []))
    update = kernel(_UPDATE_IR.format(marks=marks), "state_update", [1, 1, 1, 1, "index"])

    def run(d: np.ndarray, a: np.ndarray, x: np.ndarray, h: np.ndarray, reps: int = 1) -> None:
        arrays = (d, a, x, h)
        if not d.shape == a.shape == x.shape == h.shape or h.ndim != 1 or h.size % 16:
            raise ScanWeaverValueError(f"state_update_kernel: four 1-D arrays of one length, a multiple of 16; "
                                       f"got {d.shape}, {a.shape}, {x.shape}, {h.shape}")
        if any(v.dtype != np.float32 for v in arrays):
            raise ScanWeaverTypeError(f"state_update_kernel: float32 arrays, got {[str(v.dtype) for v in arrays]}")
        update(d, a, x, h, max(0, int(reps)))

    return run


__all__ = ["ENV_SWITCH", "scalef_exp", "state_update_kernel"]
