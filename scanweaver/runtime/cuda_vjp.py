"""The selective scan's backward on the GPU: the compiled VJP as a channel program.

`@selective_scan_vjp` is what `scanweaver-grad` derives from the GPU form of the
selective scan (`workloads/selective.py`, B and C in the caller's layout); `scan-to-gpu`
lowers it with `rewrites/gpu_channel_program.py`: one thread per (batch, channel)
runs the checkpoint pass and the reverse chunk loop, its buffers slices of one scratch
array the runtime allocates per call, dA / dD / ddelta_bias / dB / dC accumulated with
atomic adds.  Parallel over (batch, D), sequential in time (Mamba's backward kernel is
also parallel within a chunk; this one is not).

The kernels always take D and delta_bias (zeros when absent) and write the last
state: one build per (N, B/C layouts, z, softplus, h0), every (batch, D, L).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from scanweaver.workloads.specs import SelectiveScanSpec

#: steps between checkpoints, and the window of kept coefficients, of the GPU VJP: one
#: chunk, so each thread's scratch is (L / CHUNK + 1) x N checkpoints plus O(CHUNK x N)
CHUNK = 64
VJP_NAME = "selective_scan_vjp"


def vjp_spec(n: int, b_kind: str, c_kind: str, has_z: bool, softplus: bool, has_h0: bool) -> SelectiveScanSpec:
    return SelectiveScanSpec(n, b_kind, c_kind, True, has_z, True, bool(softplus), has_h0, True)


@functools.cache
def selective_vjp_ir(spec: SelectiveScanSpec) -> str:
    """The module holding only `@selective_scan_vjp` (forward arguments, then one
    cotangent per memref argument, in order)."""
    from xdsl.dialects import func

    from scanweaver.ir import make_context, parse_ir, print_ir
    from scanweaver.rewrites.grad import ScanweaverGrad
    from scanweaver.runtime.kernel_ir import kernel_ir

    module = parse_ir(kernel_ir("selective_gpu", spec=spec).text)
    # staged=False: the CPU-tuned loop split of the reverse is not measured on the GPU
    ScanweaverGrad(chunk=CHUNK, window=CHUNK, staged=False).apply(make_context(), module)
    for op in list(module.ops):
        if isinstance(op, func.FuncOp) and op.sym_name.data != VJP_NAME:
            module.body.block.erase_op(op)
    return print_ir(module)


def selective_scan_vjp_cuda(arrays: list[Any], spec: SelectiveScanSpec, driver: Any = None) -> None:
    """Run the VJP on `arrays` = forward arguments (u, delta, A, B, C, D, [z], bias,
    [h0], out, last) then their shadows (zeros, accumulated into) with dout and dlast
    last (consumed).  Device arrays (`__cuda_array_interface__`) are used in place;
    numpy arrays are copied in and out.  `driver`: a `CudaDriver` (tests)."""
    from scanweaver.runtime.cuda import CudaFunction, CudaModule, device_chip
    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    ir = selective_vjp_ir(spec)
    artifacts = build_cuda_artifacts(ir, "sm_90" if driver is not None else device_chip())
    module = CudaModule(artifacts.ptx, driver=driver) if driver is not None else _module(ir, artifacts.ptx)
    fn = CudaFunction(module, VJP_NAME, artifacts.launches[VJP_NAME], artifacts.arg_counts[VJP_NAME])
    fn(*arrays)


@functools.cache
def _module(ir: str, ptx: str):
    from scanweaver.runtime.cuda import CudaModule

    return CudaModule(ptx)


def numpy_grads(u, delta, A, B, C, D, z, delta_bias, softplus: bool, h0, dout, dlast, driver=None):
    """float32 numpy gradients (du, ddelta, dA, dB, dC, dD, dz, dbias, dh0) through the
    GPU VJP (dz / dh0 None when z / h0 are); B, C in the caller's layout."""
    f32 = lambda x: np.ascontiguousarray(x, np.float32)  # noqa: E731
    batch, dn, length = np.shape(u)
    n = np.shape(A)[1]
    kinds = {2: "const", 3: "shared", 4: "grouped"}
    spec = vjp_spec(n, kinds[np.ndim(B)], kinds[np.ndim(C)], z is not None, softplus, h0 is not None)
    D = np.zeros(dn, np.float32) if D is None else D
    delta_bias = np.zeros(dn, np.float32) if delta_bias is None else delta_bias
    fwd = [f32(x) for x in (u, delta, A, B, C, D, *([z] if z is not None else []), delta_bias,
                            *([h0] if h0 is not None else []))]
    fwd += [np.zeros((batch, dn, length), np.float32), np.zeros((batch, dn, n), np.float32)]
    shadows = [np.zeros_like(x) for x in fwd[:-2]] + [f32(dout).copy(), f32(dlast).copy()]
    selective_scan_vjp_cuda([*fwd, *shadows], spec, driver)
    g = shadows[:-2]
    du, ddelta, dA, dB, dC, dD = g[:6]
    rest = g[6:]
    dz = rest.pop(0) if z is not None else None
    dbias = rest.pop(0)
    dh0 = rest.pop(0) if h0 is not None else None
    return du, ddelta, dA, dB, dC, dD, dz, dbias, dh0


__all__ = ["CHUNK", "numpy_grads", "selective_scan_vjp_cuda", "selective_vjp_ir", "vjp_spec"]


# ------------------------------------------------------------------ linear_scan (affine)

LINEAR_VJP_NAME = "linear_scan_vjp"


@functools.cache
def linear_vjp_ir(el: str, reverse: bool) -> str:
    """`@linear_scan_vjp(a, b, h0, h, d_a, d_b, d_h0, d_h)` of the (C, L) affine scan,
    marked so that scan-to-gpu makes its elementwise loops kernels too: its stages are
    the recomputing scan.affine, the shifted coefficients, the reverse scan.affine (both
    parallel in time, the forward's kernels) and the gradient loop."""
    from xdsl.dialects import func
    from xdsl.dialects.builtin import UnitAttr

    from scanweaver.ir import make_context, parse_ir, print_ir
    from scanweaver.rewrites.gpu_channel_program import LOOP_STAGES_ATTR
    from scanweaver.rewrites.grad import ScanweaverGrad
    from scanweaver.workloads.scans import affine_scan_ir

    module = parse_ir(affine_scan_ir(("?", "?"), 1, el, el, init=True, reverse=reverse, name="linear_scan"))
    ScanweaverGrad(chunk=CHUNK).apply(make_context(), module)
    for op in list(module.ops):
        if isinstance(op, func.FuncOp):
            if op.sym_name.data != LINEAR_VJP_NAME:
                module.body.block.erase_op(op)
            else:
                op.attributes[LOOP_STAGES_ATTR] = UnitAttr()
    return print_ir(module)


def linear_scan_vjp_cuda(arrays: list[Any], el: str, reverse: bool, driver: Any = None) -> None:
    """Run `@linear_scan_vjp` on (a, b, h0, h scratch, da, db, dh0 zeros, dh consumed)."""
    from scanweaver.runtime.cuda import CudaFunction, CudaModule, device_chip
    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    ir = linear_vjp_ir(el, bool(reverse))
    artifacts = build_cuda_artifacts(ir, "sm_90" if driver is not None else device_chip())
    module = CudaModule(artifacts.ptx, driver=driver) if driver is not None else _module(ir, artifacts.ptx)
    CudaFunction(module, LINEAR_VJP_NAME, artifacts.launches[LINEAR_VJP_NAME],
                 artifacts.arg_counts[LINEAR_VJP_NAME])(*arrays)
