"""Registers ScanWeaver's dialect and passes with `xdsl-opt` (entry point `xdsl.universe`)."""

from xdsl.universe import Universe


def _scan_dialect():
    from scanweaver.dialects.scan import Scan

    return Scan


def _pass(module: str, cls: str):
    def load():
        import importlib

        return getattr(importlib.import_module(module), cls)

    return load


SCANWEAVER_UNIVERSE = Universe(
    all_dialects={"scan": _scan_dialect},
    all_passes={
        "scanweaver-lower": _pass("scanweaver.rewrites.pipeline", "ScanweaverLower"),
        "scanweaver-raise": _pass("scanweaver.rewrites.raise_affine", "RaiseRecurrences"),
        "scan-affine-to-pairs": _pass("scanweaver.rewrites.affine_to_pairs", "AffineToPairs"),
        "gpu-results-to-args": _pass("scanweaver.rewrites.gpu_results", "ResultsToArguments"),
        "scan-to-gpu": _pass("scanweaver.rewrites.scan_to_gpu", "ScanToGpu"),
        "scan-to-cpu": _pass("scanweaver.rewrites.scan_to_cpu", "ScanToCpu"),
        "math-exp-to-polynomial": _pass("scanweaver.rewrites.exp_polynomial", "ExpToPolynomial"),
        "scan-to-loops": _pass("scanweaver.rewrites.scan_to_loops", "ScanToLoops"),
        "scan-complex-affine-to-loops": _pass("scanweaver.rewrites.complex_affine_loops", "ComplexAffineToLoops"),
        "scan-complex-to-host-loops": _pass("scanweaver.rewrites.complex_affine_loops", "ComplexScansToLoops"),
        "scan-complex-affine-to-recurrence": _pass("scanweaver.rewrites.complex_gpu", "ComplexAffineToRecurrence"),
        "scan-complex-to-pairs": _pass("scanweaver.rewrites.raise_complex_pairs", "ComplexToPairs"),
        "scan-pairs-to-complex": _pass("scanweaver.rewrites.raise_complex_pairs", "PairsToComplex"),
        "scan-complex-to-real": _pass("scanweaver.rewrites.complex_to_real", "ComplexToReal"),
        "scanweaver-grad": _pass("scanweaver.rewrites.grad", "ScanweaverGrad"),
    },
)
