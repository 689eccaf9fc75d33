"""ScanWeaver: find affine recurrences in loop code and compile them to parallel scans.

    import scanweaver
    h = scanweaver.linear_scan(a, b)                      # h[t] = a[t] * h[t-1] + b[t]
    y = scanweaver.selective_scan(u, delta, A, B, C, D=D, z=z, delta_softplus=True)
    program = scanweaver.compile(mlir_text, target="cpu")  # loops -> raise -> lower -> build
    program = scanweaver.load("out.ptx")                   # a GPU artifact from `scanweaver compile`
"""

from scanweaver.api import Program, compile, linear_scan, load, selective_scan
from scanweaver.errors import BackendUnavailableError, ScanWeaverError

__version__ = "0.1.0"
__all__ = [
    "BackendUnavailableError",
    "Program",
    "ScanWeaverError",
    "compile",
    "linear_scan",
    "load",
    "selective_scan",
]
