"""ScanWeaver: find affine recurrences in loop code and compile them to parallel scans.

    import scanweaver
    h = scanweaver.linear_scan(a, b)                      # h[t] = a[t] * h[t-1] + b[t]
    y = scanweaver.selective_scan(u, delta, A, B, C, D=D, z=z, delta_softplus=True)
    program = scanweaver.compile(mlir_text, target="cpu")  # loops -> raise -> lower -> build
    program = scanweaver.load("out.ptx")                   # a GPU artifact from `scanweaver compile`
"""

from scanweaver.errors import (
    BackendUnavailableError,
    ScanWeaverError,
    ScanWeaverTypeError,
    ScanWeaverValueError,
)

__version__ = "0.1.0"
__all__ = [
    "BackendUnavailableError",
    "Program",
    "ScanWeaverError",
    "ScanWeaverTypeError",
    "ScanWeaverValueError",
    "compile",
    "linear_scan",
    "load",
    "selective_scan",
]

# The API (numpy, xDSL, numba) loads on first use, not on `import scanweaver`: the
# command-line tools import this package first and must catch Ctrl-C during start-up.
_FROM_API = ("Program", "compile", "linear_scan", "load", "selective_scan")


def __getattr__(name: str):
    if name in _FROM_API:
        from scanweaver import api

        value = getattr(api, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'scanweaver' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
