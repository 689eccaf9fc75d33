"""A warm first call: a new process whose kernels are in the disk cache runs
`linear_scan` without loading xDSL, numba or (kernels cached as shared objects)
llvmlite, and without starting a tool subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

FIRST_CALL = """
import subprocess, sys
import numpy as np
def no_tools(*a, **k):
    raise SystemExit(f"a subprocess was started: {a[0] if a else k}")
if sys.argv[1] == "warm":
    subprocess.Popen = no_tools
import scanweaver
a = np.full((4, 64), 0.5, np.float32)
h = scanweaver.linear_scan(a, a)
assert abs(float(h[0, -1]) - 1.0) < 1e-6, h[0, -1]
if sys.argv[1] == "warm":
    from scanweaver.runtime import cpu_native
    heavy = ("xdsl", "numba", "scanweaver.rewrites") + (("llvmlite.binding",) if cpu_native.available() else ())
    loaded = sorted(m for m in heavy if m in sys.modules)
    assert not loaded, f"a warm first call loaded {loaded}"
"""


def test_warm_first_call_loads_no_compiler(tmp_path):
    env = {**os.environ, "SCANWEAVER_CACHE_DIR": str(tmp_path)}
    env.pop("SCANWEAVER_CUDA_DRIVER", None)
    for mode in ("cold", "warm"):
        r = subprocess.run([sys.executable, "-c", FIRST_CALL, mode], env=env, capture_output=True, text=True)
        assert r.returncode == 0, f"{mode}: {r.stderr[-2000:]}"
