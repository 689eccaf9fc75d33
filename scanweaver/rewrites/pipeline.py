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


def _holds_complex(attr: object) -> bool:
    """Whether an attribute or type is or holds a complex type (inside memrefs, function
    types, arrays, dictionaries, ...)."""
    from xdsl.dialects.builtin import ComplexType
    from xdsl.ir import Data, ParametrizedAttribute

    if isinstance(attr, ComplexType):
        return True
    if isinstance(attr, ParametrizedAttribute):
        return any(_holds_complex(p) for p in attr.parameters)
    if isinstance(attr, Data):
        data = attr.data
        parts = data.values() if isinstance(data, dict) else data if isinstance(data, (tuple, list)) else ()
        return any(_holds_complex(p) for p in parts)
    return False


def idle_after_raising(module: ModuleOp) -> set[str]:
    """`_idle_on` for a module already raised (`compiler.lower(skip_idle=True)` raises
    first): the pair rewrite with no `scan.linear_recurrence` op, then the complex
    stages with no complex op or type anywhere (results, operands, block arguments,
    attributes and properties)."""
    pairs = complex_seen = False
    for op in module.walk():
        pairs = pairs or op.name == "scan.linear_recurrence"
        complex_seen = complex_seen or op.name.startswith("complex.") or any(
            _holds_complex(a) for a in (*op.result_types, *op.operand_types,
                                        *op.attributes.values(), *op.properties.values())
        ) or any(_holds_complex(arg.type) for region in op.regions for block in region.blocks for arg in block.args)
        if pairs and complex_seen:
            break
    if pairs:
        return set()
    return {"scan-pairs-to-complex"} | (set() if complex_seen else {"scan-complex-affine-to-loops", "scan-complex-to-real"})


def stages_for(target: str, openmp: bool = False, cleanup: bool = True, text: str | None = None,
               idle: set[str] | None = None) -> list[ModulePass]:
    """The passes `scanweaver-lower{target=...}` runs, in order.

    openmp: on the CPU, make loops over independent channel groups `scf.parallel`
    (the caller then lowers with OpenMP and links libomp).
    cleanup=False: without the final canonicalize and cse, for a caller that hands the
    module to mlir-opt with MLIR's own `--canonicalize --cse` first (`compiler.build_cpu`:
    the same LLVM IR, without xDSL's canonicalize, ~0.7 s on the affine tile kernel).
    text: the input IR; the stages that have nothing to do on it (`_idle_on`) are left
    out, and their modules not imported (`compiler.build_cpu`: a cold first call).
    idle: those stages' names given instead of found in `text` (`compiler.lower`).
    """
    if target not in TARGETS:
        raise ScanWeaverError(
            f"scanweaver-lower: unknown target '{target}' (expected one of "
            f"{', '.join(TARGETS)})"
        )
    if idle is None:
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
