"""Compiled CPU kernels behind the PyTorch operators: forward IR and its compiled VJP.

The forward is the selective-scan / affine-scan IR the numpy API compiles
(`scanweaver.runtime.cpu_scan`); the backward is `@<name>_vjp`, built from that same IR
by the `scanweaver-grad` pass and compiled through the same CPU pipeline
(`compile_cpu`).  float64 tensors get a float64 copy of the IR (same ops, f64 types),
so gradcheck sees float64 arithmetic; everything else computes in float32.
"""

from __future__ import annotations

import functools

from scanweaver.runtime.cpu_scan import Kernel, SelectiveScanSpec, compile_cpu
from scanweaver.runtime.kernel_ir import KernelIR, kernel_ir
from scanweaver.workloads.scans import affine_scan_ir

#: Steps between state checkpoints in the backward (checkpoints: L / CHUNK states).
CHUNK = 64


def _vjp_only(ir_text: str, read_only: tuple[str, ...] = ()) -> str:
    """The module with `@<name>_vjp` added by scanweaver-grad, and the forward dropped
    (compiled separately): half the IR to lower.  `read_only`: primal outputs whose
    cotangent the VJP only reads (`_read_only_shadows`)."""
    from xdsl.dialects import func

    from scanweaver.ir import make_context, parse_ir, print_ir
    from scanweaver.rewrites.grad import ScanweaverGrad

    module = parse_ir(ir_text)
    mark_step_exp(module)
    ScanweaverGrad(chunk=CHUNK).apply(make_context(), module)
    for op in list(module.ops):
        if isinstance(op, func.FuncOp) and not op.sym_name.data.endswith("_vjp"):
            module.body.block.erase_op(op)
    if read_only:
        _read_only_shadows(module, read_only)
    _polynomial_math_outside_scans(module)
    return print_ir(module)


def _read_only_shadows(module, names: tuple[str, ...]) -> None:
    """Drop the VJP's zeroing of the cotangents `d_<name>` as it consumes them, so the
    caller passes the incoming cotangent without a copy.  Only for outputs the forward
    writes once per element and never reads back (the selective scan's `out`): there
    the zero (the cotangent of the contents before the forward) is never read, by the
    VJP or by the caller.  ScanWeaverValueError when the VJP has no such argument or
    zeroing store (the IR's names changed)."""
    from xdsl.dialects import arith, func, memref

    from scanweaver.errors import ScanWeaverValueError

    vjp = next(op for op in module.ops if isinstance(op, func.FuncOp))
    args = {a.name_hint: a for a in vjp.body.block.args}
    for name in names:
        shadow = args.get(f"d_{name}")
        zeroing = [op for op in vjp.walk() if isinstance(op, memref.StoreOp) and op.memref is shadow
                   and isinstance(op.value.owner, arith.ConstantOp) and op.value.owner.value.value.data == 0.0]
        if shadow is None or not zeroing:
            raise ScanWeaverValueError(f"VJP of @{vjp.sym_name.data}: no zeroing store of argument 'd_{name}'")
        if any(isinstance(op, memref.StoreOp) and op.memref is shadow and op not in zeroing for op in vjp.walk()):
            raise ScanWeaverValueError(f"VJP of @{vjp.sym_name.data}: 'd_{name}' is accumulated, not only read")
        for op in zeroing:
            op.detach()
            op.erase()


def mark_step_exp(module, scalef: bool | None = None) -> int:
    """Mark the exp of each f32 `scan.recurrence`'s coefficient a (the selective scan's
    exp(delta*A)) for the fused polynomial, and for its AVX-512 scalef form where the
    CPU kernel takes it (`scalef_exp()`; `scalef` overrides): the forms the forward's
    tiled kernel computes.  Run before scanweaver-grad, whose clones keep the marks, so
    the VJP's checkpoint run, its recompute of h and the reverse of the coefficients
    evaluate exp as the forward does (<= 1 ulp, README Numerics).  Returns the count."""
    from xdsl.dialects import math as mathd
    from xdsl.dialects.builtin import Float32Type, UnitAttr

    from scanweaver.dialects import scan
    from scanweaver.rewrites.exp_polynomial import FUSED_MARK, SCALEF_MARK
    from scanweaver.runtime.cpu_selective_exp import scalef_exp

    if scalef is None:
        scalef = scalef_exp()
    marked = 0
    for op in module.walk():
        if not isinstance(op, scan.RecurrenceOp):
            continue
        a = op.coeffs.block.last_op.operands[0].owner
        if isinstance(a, mathd.ExpOp) and isinstance(a.operand.type, Float32Type):
            a.attributes[FUSED_MARK] = UnitAttr()
            if scalef:
                a.attributes[SCALEF_MARK] = UnitAttr()
            marked += 1
    return marked


def _polynomial_math_outside_scans(module) -> None:
    """f32 exp / log1p of the VJP's plain loops as arith polynomials (<= 1 ulp; what the
    forward's fast path computes): the loops over the state index then vectorise instead
    of calling libm per lane.  An exp marked by `mark_step_exp` takes the fused form
    (the scalef one on vector types; a scalar gets the fused form's same bits).  Inside
    scan ops, scan-to-cpu does this itself."""
    from xdsl.dialects import math as mathd

    from scanweaver.dialects import scan
    from scanweaver.rewrites.exp_polynomial import FUSED_MARK, SCALEF_MARK, expand_exp, expand_log1p
    from xdsl.builder import Builder
    from xdsl.rewriter import InsertPoint
    from xdsl.dialects.builtin import Float32Type

    def inside_scan(op) -> bool:
        p = op.parent_op()
        while p is not None:
            if isinstance(p, (scan.RecurrenceOp, scan.LinearRecurrenceOp, scan.ScanOp)):
                return True
            p = p.parent_op()
        return False

    for op in list(module.walk()):
        if isinstance(op, (mathd.ExpOp, mathd.Log1pOp)) and isinstance(op.operand.type, Float32Type) \
                and not inside_scan(op):
            at = Builder(InsertPoint.before(op))
            if isinstance(op, mathd.ExpOp):
                y = expand_exp(at, op.operand, fused=FUSED_MARK in op.attributes,
                               scalef=SCALEF_MARK in op.attributes)
            else:
                y = expand_log1p(at, op.operand)
            op.result.replace_all_uses_with(y)
            op.detach()
            op.erase()


def selective_ir(spec: SelectiveScanSpec, f64: bool) -> KernelIR:
    return kernel_ir("selective", spec=spec, element="f64" if f64 else "f32")


def selective_arg_ranks(spec: SelectiveScanSpec) -> list[int]:
    """Ranks of the memref arguments of @selective_scan, in order (the float memrefs),
    read from the built function's signature."""
    return [a for a in selective_ir(spec, False).args if isinstance(a, int)]


@functools.lru_cache(maxsize=None)
def selective_forward(spec: SelectiveScanSpec, f64: bool) -> Kernel:
    ir = selective_ir(spec, f64)
    return Kernel(compile_cpu(ir.text), ir.name, ir.args)


#: The vector width LLVM's loop vectoriser may use in the VJP (bits; "" = LLVM's choice).
#: LLVM prefers 256-bit vectors on AVX-512 CPUs, so the VJP's plain loops over the
#: state (the coefficient fill, the emit's reverse) took two ymm halves and spilled
#: their constants while its scan ops use 512-bit vectors; 512 makes them zmm loops.
#: Elementwise results keep their bits; reassociable sums may differ in the last bits
#: (their vectorised order).  A CPU without AVX-512 ignores it (256-bit registers).
PREFER_VECTOR_WIDTH = "512"


def _compile_noalias(ir_text: str, name: str):
    """compile_cpu, with the memref pointers of @name marked `noalias` in the LLVM IR,
    and LLVM's preferred vector width for it raised (`PREFER_VECTOR_WIDTH`).

    The VJP's calls here never pass overlapping arrays where one is written (shadows and
    scratch outputs are fresh buffers, the primal inputs are only read), and saying so
    lets LLVM vectorise its loops over the state index without runtime alias checks
    (the MLIR lowering puts `llvm.noalias` on the C-interface wrapper only)."""
    import re

    from scanweaver.compiler import build_cpu
    from scanweaver.runtime.cpu import CpuProgram

    llvm_ir = build_cpu(ir_text).llvm_ir
    head = f"define void @{name}("
    lines = llvm_ir.split("\n")
    hits = [k for k, line in enumerate(lines) if line.startswith(head)]
    if len(hits) != 1:  # the lowering's output changed: compile without the promise
        return compile_cpu(ir_text)
    lines[hits[0]] = re.sub(r"\bptr %", "ptr noalias %", lines[hits[0]])
    if PREFER_VECTOR_WIDTH and lines[hits[0]].rstrip().endswith("{"):
        lines[hits[0]] = lines[hits[0]].rstrip()[:-1] + f'"prefer-vector-width"="{PREFER_VECTOR_WIDTH}" {{'
    return CpuProgram("\n".join(lines))


@functools.lru_cache(maxsize=None)
def selective_vjp(spec: SelectiveScanSpec, f64: bool) -> Kernel:
    """`@selective_scan_vjp(forward arguments..., d_memrefs...)`: one cotangent per memref;
    d_out is only read (`_read_only_shadows`): the caller passes dout itself."""
    ir = selective_ir(spec, f64)
    program = _compile_noalias(_vjp_only(ir.text, read_only=("out",)), f"{ir.name}_vjp")
    return Kernel(program, f"{ir.name}_vjp", [*ir.args, *selective_arg_ranks(spec)])


def _affine_text(el: str, reverse: bool) -> str:
    return affine_scan_ir(("?", "?"), 1, el, el, init=True, reverse=reverse, name="linear_scan")


@functools.lru_cache(maxsize=None)
def affine_forward(el: str, reverse: bool) -> Kernel:
    return Kernel(compile_cpu(_affine_text(el, reverse)), "linear_scan", [2, 2, 1, 2])


@functools.lru_cache(maxsize=None)
def affine_vjp(el: str, reverse: bool) -> Kernel:
    program = compile_cpu(_vjp_only(_affine_text(el, reverse)))
    return Kernel(program, "linear_scan_vjp", [2, 2, 1, 2, 2, 2, 1, 2])
