"""The compile driver: IR text in, artifacts out, each stage visible.

Data flows one way: parse → xDSL passes (`scanweaver-lower` stages) → MLIR text →
upstream toolchain (mlir-opt/mlir-translate, or the NVVM pipeline) → artifact
(LLVM IR for the JIT, PTX/cubin for CUDA).  Toolchain outputs go through the on-disk
cache, so a second process does not run mlir-opt again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from typing import TYPE_CHECKING, TypeVar

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.toolchain import cache

# xDSL and the passes load only when something is compiled: a build found in the disk
# cache (`build_cpu`) runs without them, so a warm first call in a new process is fast.
if TYPE_CHECKING:
    from xdsl.dialects import func
    from xdsl.dialects.builtin import ModuleOp

T = TypeVar("T")

#: Pipeline target of each artifact kind.
TARGET_FOR_KIND = {"llvm": "cpu", "mlir": "cpu", "ptx": "gpu", "cubin": "gpu"}


@dataclass
class Stage:
    name: str
    ir: str


@dataclass
class Lowered:
    """The module after the xDSL passes, and the IR after each of them."""

    module: ModuleOp
    stages: list[Stage] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The IR after the last stage; printed on first use when the stages were not
        kept (`build_cpu` reads the module only: printing it costs ~0.3 s cold)."""
        if not self.stages:
            from scanweaver.ir import print_ir

            self.stages.append(Stage("final", print_ir(self.module)))
        return self.stages[-1].ir


def lower(
    text: str,
    target: str,
    source: str = "<input>",
    progress: Callable[[str], None] | None = None,
    keep_stages: bool = True,
    openmp: bool = False,
    verify: bool = True,
    cleanup: bool = True,
    skip_idle: bool = False,
) -> Lowered:
    """Run `scanweaver-lower{target=...}` stage by stage, recording each stage's IR.
    verify=False: the result is not verified by xDSL (the caller hands it to a tool
    that verifies it on parsing).  cleanup=False: without the final canonicalize and
    cse (`stages_for`; the caller has MLIR run them).  skip_idle: without the stages
    that have nothing to do on `text` (`stages_for(text=...)`: the same result)."""
    try:
        return _lower(text, target, source, progress, keep_stages, openmp, verify, cleanup, skip_idle)
    except RecursionError:  # passes and the printer recurse into nested regions
        raise ScanWeaverValueError(f"{source}: the IR nests too deeply to compile") from None


def _lower(text, target, source, progress, keep_stages, openmp, verify=True, cleanup=True, skip_idle=False) -> Lowered:
    from scanweaver.ir import make_context, parse_ir, print_ir
    from scanweaver.rewrites.pipeline import _idle_on, stages_for
    from scanweaver.runtime.kernel_ir import take_built

    module = take_built(text) or parse_ir(text, source)  # (a kernel built just now: not parsed again)
    _refuse_nested_modules(module, source)
    result = Lowered(module, [Stage("input", text)] if keep_stages else [])
    ctx = make_context()

    def run(stage) -> None:
        if progress:
            progress(stage.name)
        stage.apply(ctx, module)
        if keep_stages:
            result.stages.append(Stage(stage.name, print_ir(module)))

    idle = None
    if skip_idle and target != "gpu" and "scanweaver-raise" not in _idle_on(text, target):
        # Raise first (it is the first stage), then leave out the stages with nothing to
        # do on the raised module: a raised real kernel (selective_scan) has no pairs or
        # complex values, so the complex stages are not even imported.
        from scanweaver.rewrites.pipeline import idle_after_raising
        from scanweaver.rewrites.raise_affine import RaiseRecurrences

        run(RaiseRecurrences())
        idle = {"scanweaver-raise"} | idle_after_raising(module)
    for stage in stages_for(target, openmp=openmp, cleanup=cleanup, text=text if skip_idle else None, idle=idle):
        run(stage)
    if verify:
        try:
            module.verify()
        except Exception as e:  # a bug in a pass, not in the user's input
            raise RuntimeError(f"ScanWeaver produced invalid IR: {e}") from e
    return result


def cpu_llvm_ir(module: ModuleOp, openmp: bool = False, bounds_checks: bool = False,
                cleanup: bool = False) -> tuple[str, bool]:
    """LLVM IR for a CPU-lowered module (cached); returns (llvm_ir, cache_hit).
    cleanup: mlir-opt first runs MLIR's canonicalize and cse (for a module lowered
    with `lower(..., cleanup=False)`)."""
    from scanweaver.rewrites.i1_memrefs import widen_i1_memrefs

    from scanweaver.ir import print_ir
    from scanweaver.toolchain.mlir import emit_c_interface, lower_to_llvm_ir

    emit_c_interface(module)
    module = widen_i1_memrefs(module)  # MLIR's CPU lowering has no sub-byte loads
    text = print_ir(module)
    options = {"openmp": openmp, **({"bounds_checks": True} if bounds_checks else {}),
               **({"cleanup": True} if cleanup else {})}
    key = cache.cache_key("llvm-ir", text, **options)
    return cache.cached(
        key, lambda: lower_to_llvm_ir(text, openmp=openmp, bounds_checks=bounds_checks, cleanup=cleanup).encode(),
        parse=_utf8,
    )


def _utf8(payload: bytes) -> str:
    return payload.decode()  # UnicodeDecodeError (a ValueError): a malformed entry


def _parse_cpu_build(payload: bytes) -> tuple[str, dict[str, tuple[list[str], list[str]]]]:
    """A `cpu-build` cache entry; TypeError/ValueError/KeyError when malformed."""
    data = json.loads(payload)
    llvm_ir, raw = data["llvm_ir"], data["signatures"]
    if not isinstance(llvm_ir, str) or not isinstance(raw, dict):
        raise TypeError("malformed cpu-build entry")
    signatures = {}
    for name, sig in raw.items():
        args, results = sig  # ValueError unless a pair
        if not all(isinstance(t, str) for t in (*args, *results)) or isinstance(args, str) or isinstance(results, str):
            raise TypeError("malformed signature")
        signatures[name] = (list(args), list(results))
    return llvm_ir, signatures


@dataclass
class CpuBuild:
    """A CPU build of user IR: LLVM IR plus each public function's signature."""

    llvm_ir: str
    signatures: dict[str, tuple[list[str], list[str]]]  # name -> (arg types, result types)
    cache_hit: bool


def build_cpu(text: str, source: str = "<input>", openmp: bool = False, bounds_checks: bool = False,
              loops: bool = False) -> CpuBuild:
    """User IR → `scanweaver-lower{target=cpu}` → LLVM IR, cached on disk by input text.

    A hit skips every stage, the xDSL passes included: only the JIT remains to do.
    openmp: parallel channel-group loops through OpenMP (the JIT then needs libomp).
    bounds_checks: runtime bounds checks on memref loads and stores (for accesses whose
    shape relations `runtime/shape_contract.py` cannot derive).
    loops: `scanweaver-lower{target=loops}` instead, the sequential loops (the quick
    first tier of `runtime/cpu_tiers.py`: a fraction of the compile time).
    """
    options = {"openmp": openmp, **({"bounds_checks": True} if bounds_checks else {}),
               **({"loops": True} if loops else {})}
    key = cache.cache_key("cpu-build", text, **options)
    target = "loops" if loops else "cpu"

    def build() -> bytes:
        # No xDSL verification here (~0.4 s on the affine kernel): mlir-opt verifies the
        # whole module when it parses it, just below (a pass bug: ToolFailedError).
        # Nor xDSL's canonicalize and cse: MLIR's run first in mlir-opt, in C++ (the same
        # LLVM IR for the drivers' kernels, `tests/test_cpu_cleanup.py`).  Nor the stages
        # with nothing to do on this IR (not even imported: raising, on a kernel built
        # as scan ops, and the complex stages, on real ones).
        lowered = lower(text, target, source, keep_stages=False, openmp=openmp, verify=False, cleanup=False,
                        skip_idle=True)
        llvm_ir, _ = cpu_llvm_ir(lowered.module, openmp=openmp, bounds_checks=bounds_checks, cleanup=True)
        signatures = {
            name: (
                [str(t) for t in fn.function_type.inputs.data],
                [str(t) for t in fn.function_type.outputs.data],
            )
            for name, fn in public_functions(lowered.module).items()
        }
        return json.dumps({"llvm_ir": llvm_ir, "signatures": signatures}).encode()

    (llvm_ir, signatures), hit = cache.cached(key, build, parse=_parse_cpu_build)
    return CpuBuild(llvm_ir, signatures, hit)


def built_workload(key_material: dict, build: Callable[[], bytes], parse: Callable[[bytes], T]) -> T:
    """A workload builder's printed IR (`runtime/kernel_ir.py`) through the disk cache,
    keyed by the builder, its options and ScanWeaver's sources: a warm process gets a
    kernel's IR text, the key of its build, without importing xDSL."""
    material = {"kind": "workload-ir", **key_material, "compiler": cache.compiler_fingerprint()}
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    value, _ = cache.cached(key, build, parse=parse)
    return value


def _refuse_nested_modules(module: ModuleOp, source: str) -> None:
    """Several builtin.modules (or one nested in another) would compile to nothing:
    refuse them rather than write empty output."""
    from xdsl.dialects import func
    from xdsl.dialects.builtin import ModuleOp

    nested = [op for op in module.walk() if isinstance(op, ModuleOp) and op is not module]
    if nested:
        names = sorted(f.sym_name.data for m in nested for f in m.walk() if isinstance(f, func.FuncOp))
        raise ScanWeaverValueError(
            f"{source}: holds {len(nested)} builtin.module op(s) inside the top-level module "
            f"(functions {', '.join('@' + n for n in names) or 'none'}); ScanWeaver compiles one module: "
            "put all functions in a single builtin.module"
        )


def public_functions(module: ModuleOp) -> dict[str, func.FuncOp]:
    from xdsl.dialects import func

    return {
        op.sym_name.data: op
        for op in module.ops
        if isinstance(op, func.FuncOp)
        and not op.is_declaration
        and (op.sym_visibility is None or op.sym_visibility.data == "public")
    }


def check_target(target: str) -> str:
    if not isinstance(target, str):
        raise ScanWeaverTypeError(f"target must be 'cpu' or 'cuda', got {target!r}")
    if target not in ("cpu", "cuda"):
        raise ScanWeaverValueError(f"unknown target '{target}' (expected 'cpu' or 'cuda')")
    return target


def __getattr__(name: str):
    # `compiler.parse_ir`, `compiler.stages_for`, ...: loaded on first use (see above).
    if name in ("make_context", "parse_ir", "print_ir"):
        from scanweaver import ir

        return getattr(ir, name)
    if name == "stages_for":
        from scanweaver.rewrites.pipeline import stages_for

        return stages_for
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
