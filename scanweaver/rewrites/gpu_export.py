"""Moved to `scanweaver.toolchain.gpu_export` (it runs tools; it is not a rewrite).
This name stays so that existing imports keep working."""

from scanweaver.toolchain.gpu_export import (  # noqa: F401
    MIN_PTX_FEATURES,
    check_shared_memory,
    export_gpu,
    print_generic,
    ptxas_available,
)

__all__ = ["MIN_PTX_FEATURES", "check_shared_memory", "export_gpu", "print_generic", "ptxas_available"]
