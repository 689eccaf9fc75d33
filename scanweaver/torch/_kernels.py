"""Compiled CPU kernels behind the PyTorch operators: forward IR and its compiled VJP.

The forward is the selective-scan / affine-scan IR the numpy API compiles
(`scanweaver.runtime.cpu_scan`); the backward is `@<name>_vjp`, built from that same IR
by the `scanweaver-grad` pass and compiled through the same CPU pipeline
(`compile_cpu`).  float64 tensors get a float64 copy of the IR (same ops, f64 types),
so gradcheck sees float64 arithmetic; everything else computes in float32.
"""

from __future__ import annotations

import functools

from scanweaver.runtime.cpu_scan import Kernel, SelectiveScanSpec, compile_cpu, selective_scan_ir
from scanweaver.workloads.scans import affine_scan_ir

#: Steps between state checkpoints in the backward (checkpoints: L / CHUNK states).
CHUNK = 64


def _vjp_only(ir_text: str) -> str:
    """The module with `@<name>_vjp` added by scanweaver-grad, and the forward dropped
    (compiled separately): half the IR to lower."""
    from xdsl.dialects import func

    from scanweaver.ir import make_context, parse_ir, print_ir
    from scanweaver.rewrites.grad import ScanweaverGrad

    module = parse_ir(ir_text)
    ScanweaverGrad(chunk=CHUNK).apply(make_context(), module)
    for op in list(module.ops):
        if isinstance(op, func.FuncOp) and not op.sym_name.data.endswith("_vjp"):
            module.body.block.erase_op(op)
    return print_ir(module)


def selective_ir(spec: SelectiveScanSpec, f64: bool) -> str:
    text = selective_scan_ir(spec)
    return text.replace("f32", "f64") if f64 else text


def _bc_rank(kind: str) -> int:
    return {"const": 2, "shared": 3, "grouped": 4}[kind]


def selective_arg_ranks(spec: SelectiveScanSpec) -> list[int]:
    """Ranks of the memref arguments of @selective_scan, in order (the float memrefs)."""
    ranks = [3, 3, 2, _bc_rank(spec.b_kind), _bc_rank(spec.c_kind)]
    ranks += [1] * spec.has_d + [3] * spec.has_z + [1] * spec.has_bias + [3] * spec.has_h0
    return ranks + [3] + [3] * spec.has_last


@functools.lru_cache(maxsize=None)
def selective_forward(spec: SelectiveScanSpec, f64: bool) -> Kernel:
    program = compile_cpu(selective_ir(spec, f64))
    return Kernel(program, "selective_scan", [*selective_arg_ranks(spec), "index", "index"])


@functools.lru_cache(maxsize=None)
def selective_vjp(spec: SelectiveScanSpec, f64: bool) -> Kernel:
    program = compile_cpu(_vjp_only(selective_ir(spec, f64)))
    ranks = selective_arg_ranks(spec)
    return Kernel(program, "selective_scan_vjp", [*ranks, "index", "index", *ranks])


def _affine_text(el: str, reverse: bool) -> str:
    return affine_scan_ir(("?", "?"), 1, el, el, init=True, reverse=reverse, name="linear_scan")


@functools.lru_cache(maxsize=None)
def affine_forward(el: str, reverse: bool) -> Kernel:
    return Kernel(compile_cpu(_affine_text(el, reverse)), "linear_scan", [2, 2, 1, 2])


@functools.lru_cache(maxsize=None)
def affine_vjp(el: str, reverse: bool) -> Kernel:
    program = compile_cpu(_vjp_only(_affine_text(el, reverse)))
    return Kernel(program, "linear_scan_vjp", [2, 2, 1, 2, 2, 2, 1, 2])
