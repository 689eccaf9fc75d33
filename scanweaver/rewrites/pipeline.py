"""`scanweaver-lower`: the whole compiler as one xdsl-opt pass.

    xdsl-opt -p 'scanweaver-lower{target=gpu}' FILE    # loops/scan IR -> GPU-ready IR
    xdsl-opt -p 'scanweaver-lower{target=cpu}' FILE    # ... -> CPU-ready IR
    xdsl-opt -p 'scanweaver-lower{target=loops}' FILE  # ... -> sequential scf loops

Every target first raises affine recurrences found in loops into the scan dialect,
then lowers the scan ops for the target; scan ops the target lowering does not
handle become sequential loops (`scan-to-loops`), so the output never holds scan
ops; then it cleans up (canonicalize, cse).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from scanweaver.errors import ScanWeaverError

TARGETS = ("gpu", "cpu", "loops")


def _idle_on(text: str, target: str) -> set[str]:
    """Stages of the CPU and loops targets that can find nothing to rewrite in the IR
    `text` (so never have work: what they rewrite is not there and no stage before them
    makes it): raising with no `scf.for` loop, the pair rewrite with no
    `scan.linear_recurrence`, the complex stages with no complex type or op."""
    idle = set()
    if target == "gpu":
        return idle
    if "scf.for" not in text:
        idle.add("scanweaver-raise")
        if "scan.linear_recurrence" not in text:
            idle.add("scan-pairs-to-complex")
    if "complex" not in text and "scan-pairs-to-complex" in idle:
        idle |= {"scan-complex-affine-to-loops", "scan-complex-to-real"}
    return idle


def stages_for(target: str, openmp: bool = False, cleanup: bool = True, text: str | None = None) -> list[ModulePass]:
    """The passes `scanweaver-lower{target=...}` runs, in order.

    openmp: on the CPU, make loops over independent channel groups `scf.parallel`
    (the caller then lowers with OpenMP and links libomp).
    cleanup=False: without the final canonicalize and cse, for a caller that hands the
    module to mlir-opt with MLIR's own `--canonicalize --cse` first (`compiler.build_cpu`:
    the same LLVM IR, without xDSL's canonicalize, ~0.7 s on the affine tile kernel).
    text: the input IR; the stages that have nothing to do on it (`_idle_on`) are left
    out, and their modules not imported (`compiler.build_cpu`: a cold first call).
    """
    if target not in TARGETS:
        raise ScanWeaverError(
            f"scanweaver-lower: unknown target '{target}' (expected one of "
            f"{', '.join(TARGETS)})"
        )
    idle = _idle_on(text, target) if text is not None else set()
    stages: list[ModulePass] = []
    if "scanweaver-raise" not in idle:
        from scanweaver.rewrites.raise_affine import RaiseRecurrences

        stages.append(RaiseRecurrences())
    lowering: list[ModulePass]
    if target == "gpu":
        from scanweaver.rewrites.gpu_results import ResultsToArguments
        from scanweaver.rewrites.scan_to_gpu import ScanToGpu

        # kernels write only memrefs: returned scalars become output arguments first
        lowering = [ResultsToArguments(), ScanToGpu()]
    elif target == "cpu":
        from scanweaver.rewrites.exp_polynomial import ExpToPolynomial
        from scanweaver.rewrites.scan_to_cpu import ScanToCpu

        # scan-to-cpu marks the math.exp/log1p of the recurrences it vectorises; only
        # those become polynomials (the sequential fallback keeps libm's).
        lowering = [ScanToCpu(parallel_channels=openmp), ExpToPolynomial(marked_only=True)]
    else:
        lowering = []
    # Complex states: CPU/loops take (re, im) pair recurrences as complex ones and scan
    # complex axes time-major; the GPU runs one complex value per channel (complex
    # scan.affine split into per-channel recurrences first) as the fused 2x2 (re, im)
    # kernel, other complex scans as host loops.
    if target == "gpu":
        from scanweaver.rewrites.complex_affine_loops import ComplexScansToLoops
        from scanweaver.rewrites.complex_gpu import ComplexAffineToRecurrence
        from scanweaver.rewrites.raise_complex_pairs import ComplexToPairs

        stages += [ComplexAffineToRecurrence(), ComplexToPairs(), ComplexScansToLoops()]
    else:
        if "scan-pairs-to-complex" not in idle:
            from scanweaver.rewrites.raise_complex_pairs import PairsToComplex

            stages.append(PairsToComplex())
        if "scan-complex-affine-to-loops" not in idle:
            from scanweaver.rewrites.complex_affine_loops import ComplexAffineToLoops

            stages.append(ComplexAffineToLoops())
    from scanweaver.rewrites.scan_to_loops import ScanToLoops

    stages += [*lowering, ScanToLoops()]
    if "scan-complex-to-real" not in idle:
        from scanweaver.rewrites.complex_to_real import ComplexToReal

        stages.append(ComplexToReal())
    # (imported here: a build that leaves the cleanup to MLIR does not load them)
    cleanup_stages: list[ModulePass] = []
    if cleanup:
        from xdsl.transforms.canonicalize import CanonicalizePass
        from xdsl.transforms.common_subexpression_elimination import CommonSubexpressionElimination

        cleanup_stages = [CanonicalizePass(), CommonSubexpressionElimination()]
    return stages + cleanup_stages


def pipeline_table() -> str:
    """The README's table of what `scanweaver-lower` runs per target (a test keeps the
    README equal to it, so the documented pipeline is the one that runs)."""
    rows = ["| target | stages, in order |", "|---|---|"]
    for target in TARGETS:
        names = " → ".join(f"`{stage.name}`" for stage in stages_for(target))
        rows.append(f"| `{target}` | {names} |")
    return "\n".join(rows)


@dataclass(frozen=True)
class ScanweaverLower(ModulePass):
    name = "scanweaver-lower"

    target: str = "gpu"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for stage in stages_for(self.target):
            stage.apply(ctx, op)


if __name__ == "__main__":
    print(pipeline_table())
