"""Which form of exp(delta*A) the CPU selective kernel takes on this machine.

With AVX-512F and AVX-512VL the kernel's fused polynomial exp applies 2^k with
`vscalefps` (`SCALEF_MARK` in `rewrites/exp_polynomial.py`): the same bits, about a
quarter fewer instructions per step.  The choice is an option of the kernel's builder,
so it is part of the kernel's IR text and of every cache key made from it.
"""

from __future__ import annotations

import functools
import os

from scanweaver.runtime.cpu_native import host_cpu

#: Set to "0" for the fused form without vscalefps on every CPU.
ENV_SWITCH = "SCANWEAVER_SCALEF_EXP"


@functools.cache
def _host_has_scalef() -> bool:
    """AVX-512F and AVX-512VL in this CPU's flags (/proc/cpuinfo, as LLVM sees them)."""
    info = host_cpu() or ""
    flags = set()
    for line in info.splitlines():
        if line.split(":", 1)[0].strip() == "flags":
            flags.update(line.split(":", 1)[1].split())
    return {"avx512f", "avx512vl"} <= flags


def scalef_exp() -> bool:
    """Whether the CPU selective kernel is built with the scalef exp here."""
    return os.environ.get(ENV_SWITCH, "1") != "0" and _host_has_scalef()


__all__ = ["ENV_SWITCH", "scalef_exp"]
