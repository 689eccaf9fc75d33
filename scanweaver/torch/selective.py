"""`selective_scan_fn`: Mamba's selective scan as a PyTorch operator that trains.

Same signature, shapes and meaning as `mamba_ssm.ops.selective_scan_interface.
selective_scan_fn` (shared/DESIGN.md section 2).  Two custom ops:

  scanweaver::selective_scan_fwd   the forward kernel (CPU JIT; CUDA runtime on GPUs)
  scanweaver::selective_scan_bwd   the compiled VJP of the same IR (`scanweaver-grad`)

registered with fake (meta) implementations and autograd, so torch.compile traces them
and torch.library.opcheck passes.  The kernels always take D and delta_bias (zeros when
absent) and always write the last state: fewer compiled variants, same results.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np
import torch

from scanweaver.errors import BackendUnavailableError, ScanWeaverValueError
from scanweaver.runtime.cpu_scan import SelectiveScanSpec, aligned_empty, num_threads, parallel_for, split_range
from scanweaver.torch import _checks
from scanweaver.torch import _kernels
from scanweaver.torch.complex_selective import complex_selective_scan_fn

MAX_STATE = 64


def _compute_dtype(u: torch.Tensor) -> np.dtype:
    return np.dtype(np.float64) if u.dtype == torch.float64 else np.dtype(np.float32)


def _kind(x: torch.Tensor) -> str:
    return {2: "const", 3: "shared", 4: "grouped"}[x.dim()]


def _to_kernel_layout(x: np.ndarray) -> np.ndarray:
    """(batch, N, L) -> (batch, L, N) and (batch, G, N, L) -> (batch, G, L, N)."""
    return x if x.ndim == 2 else np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _from_kernel_layout(x: np.ndarray) -> np.ndarray:
    return x if x.ndim == 2 else np.ascontiguousarray(np.swapaxes(x, -1, -2))


def _spec(N: int, B: torch.Tensor, C: torch.Tensor, has_z: bool, softplus: bool,
          has_h0: bool = False) -> SelectiveScanSpec:
    return SelectiveScanSpec(N, _kind(B), _kind(C), True, has_z, True, bool(softplus), has_h0, True)


def _arrays(u, delta, A, B, C, D, z, delta_bias, h0=None):
    """numpy views in the compute dtype, B and C in the kernel's layout, D/bias filled,
    then the initial state when given."""
    dt = _compute_dtype(u)
    Dn = u.shape[1]
    arrs = [_checks.view(u, dt), _checks.view(delta, dt), _checks.view(A, dt),
            _to_kernel_layout(_checks.view(B, dt)), _to_kernel_layout(_checks.view(C, dt)),
            _checks.view(D, dt) if D is not None else np.zeros(Dn, dt)]
    arrs += [_checks.view(z, dt)] if z is not None else []
    arrs += [_checks.view(delta_bias, dt) if delta_bias is not None else np.zeros(Dn, dt)]
    arrs += [_checks.view(h0, dt)] if h0 is not None else []
    return dt, arrs


def _tasks(Dn: int, size: int, per_thread: int) -> tuple[int, list[tuple[int, int]]]:
    threads = num_threads() if size >= (1 << 16) else 1
    return threads, split_range(Dn, min(Dn, threads * per_thread))


#: Channels per task of the backward (at most GRAD_MAX_TASKS tasks, as many as two threads had).  The split depends on
#: the shape only, never on the thread count: dB / dC of input-dependent B, C are summed
#: per task (private buffers), then over the tasks in order, so another split gives other
#: bits (with 4 tasks per thread, one thread and two gave dB / dC up to 4.6e-5 apart at
#: (1, 256, 16, 2048)).  64 channels: 4 tasks at D = 256, two per thread on this 2-core
#: machine, where 8 (four per thread) ran the backward op 3-8% slower (wall medians of 21
#: interleaved calls, three processes, load 3-4; fewer private dB / dC to zero and sum).
GRAD_TASK_CHANNELS = 64
GRAD_MAX_TASKS = 8


def _grad_tasks(Dn: int, size: int) -> tuple[int, list[tuple[int, int]]]:
    threads = num_threads() if size >= (1 << 16) else 1
    tasks = max(1, min(GRAD_MAX_TASKS, Dn // GRAD_TASK_CHANNELS)) if size >= (1 << 16) else 1
    # D = 0 still takes one (empty) task: it zeroes the gradients of shared or grouped B and C
    return threads, split_range(Dn, tasks) or [(0, 0)]


def _zeros(like: np.ndarray) -> np.ndarray:
    """A zeroed buffer shaped like `like`.  np.zeros (calloc), not np.zeros_like (malloc
    then a memset pass): a fresh large buffer comes from the OS already zero, so its only
    pass is the VJP's own, which accumulates into it (it reads before it writes: np.empty
    would be wrong)."""
    return np.zeros(like.shape, like.dtype)


#: Gradient buffers of at least this many bytes are taken from `aligned_empty`'s cache
#: (one the caller has dropped is handed out again) and zeroed by the backward's tasks,
#: each over its own channels just before its kernel call.  A fresh buffer instead may
#: fault in every page at the kernel's first touch (whether glibc maps it afresh
#: depends on what the process freed before), and on two threads those faults contend
#: in the OS.  Measured here at (1, 256, 16, 2048), load ~1, one process per variant,
#: medians of 15 interleaved forward / backward calls (`python -m
#: scanweaver.bench.vjp_stages --buffers` runs this comparison): fresh, ~3000 faults a
#: call, system time 2.2 ms on one thread and 8.2 ms on two, the op 16.0 / 16.3 ms wall
#: on one / two threads; reused, no faults, 9.1 / 8.1 ms.  Smaller buffers (dA, dD,
#: ddelta_bias, a (D, N) dB / dC at small D) stay `_zeros`: glibc's heap serves them.
GRAD_REUSE_MIN_BYTES = 64 << 10


def _grad_buffer(like: np.ndarray) -> np.ndarray:
    """A gradient buffer shaped like `like`: `_zeros`, or (from GRAD_REUSE_MIN_BYTES) a
    cached one of undefined contents, which `_zero_spans` lists for the tasks to zero."""
    if like.nbytes < GRAD_REUSE_MIN_BYTES:
        return _zeros(like)
    return aligned_empty(like.shape, like.dtype, min_bytes=GRAD_REUSE_MIN_BYTES)


def _zero_spans(buf: np.ndarray, lo: int, hi: int, whole: bool) -> list[tuple[int, int]]:
    """(address, bytes) of the part of a `_grad_buffer` that the task for channels
    [lo, hi) zeroes: nothing for a `_zeros` buffer, all of a private one (`whole`), else
    its channels [lo, hi) (axis 1 of (batch, D, ...), axis 0 of (D, ...)), which only
    that task's kernel call writes."""
    if buf.nbytes < GRAD_REUSE_MIN_BYTES:
        return []
    base = buf.__array_interface__["data"][0]  # (buf.ctypes makes an object per call)
    if whole:
        return [(base, buf.nbytes)]
    axis = 1 if buf.ndim == 3 else 0
    outer, inner = buf.shape[0] if axis else 1, buf.strides[axis]
    row = buf.shape[axis] * inner
    return [(base + o * row + lo * inner, (hi - lo) * inner) for o in range(outer)]


def _zeroing(call, spans: list[tuple[int, int]]):
    """`call`, after zeroing `spans` on the thread that runs it (ctypes.memset releases
    the GIL, and the zeroed lines are in that core's cache for the kernel)."""
    if not spans:
        return call

    def run() -> None:
        for ptr, size in spans:
            ctypes.memset(ptr, 0, size)
        call()

    return run


def _sum_in_order(bufs: list[np.ndarray]) -> np.ndarray:
    """bufs[0] + bufs[1] + ... added in that order, element by element (the bits of
    `sum(bufs[1:], bufs[0])`, one temporary).  On the calling thread: at (1, 256, 16,
    2048) the dB and dC sums of 8 tasks took 0.08 ms here, 0.13 ms handed in two halves
    to the pool's worker (its wake-up and the GIL cost more than the adds)."""
    if len(bufs) == 1:
        return bufs[0]
    total = bufs[0] + bufs[1]
    for b in bufs[2:]:
        total += b
    return total


def _require_cuda() -> None:
    from scanweaver.runtime.cuda import cuda_available, why_no_cuda

    if not cuda_available():
        raise BackendUnavailableError(f"selective_scan_fn on CUDA tensors: the CUDA runtime is not usable here: {why_no_cuda()}")


# ----------------------------------------------------------------------------- forward


@torch.library.custom_op("scanweaver::selective_scan_fwd", mutates_args=())
def selective_scan_fwd(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: Optional[torch.Tensor], z: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
    delta_softplus: bool, initial_state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out in u's dtype, last state (batch, D, N) in the compute dtype)."""
    if u.device.type == "cuda":
        return _forward_cuda(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)
    batch, Dn, L = u.shape
    N = A.shape[1]
    h0 = initial_state
    dt, arrs = _arrays(u, delta, A, B, C, D, z, delta_bias, h0)
    kernel = _kernels.selective_forward(_spec(N, B, C, z is not None, delta_softplus, h0 is not None),
                                        dt == np.float64)
    out = np.empty((batch, Dn, L), dt)
    last = np.empty((batch, Dn, N), dt)
    threads, parts = _tasks(Dn, batch * Dn * L * N, 4)
    parallel_for([kernel.bind(*arrs, out, last, lo, hi) for lo, hi in parts], threads=threads)
    return torch.from_numpy(out).to(u.dtype), torch.from_numpy(last)


def _forward_cuda(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state=None):
    _require_cuda()
    from scanweaver.runtime.cuda_scan import selective_scan_cuda

    f32 = lambda x: None if x is None else _checks.device_aligned(x.detach().float().contiguous())  # noqa: E731
    out, last = selective_scan_cuda(f32(u), f32(delta), f32(A), f32(B), f32(C), f32(D), f32(z),
                                    f32(delta_bias), delta_softplus, True, f32(initial_state))
    return torch.as_tensor(out, device=u.device).to(u.dtype), torch.as_tensor(last, device=u.device)


@selective_scan_fwd.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state=None):
    dt = torch.float64 if u.dtype == torch.float64 else torch.float32
    return u.new_empty(u.shape), u.new_empty((u.shape[0], u.shape[1], A.shape[1]), dtype=dt)


# ---------------------------------------------------------------------------- backward


@torch.library.custom_op("scanweaver::selective_scan_bwd", mutates_args=())
def selective_scan_bwd(
    u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
    D: Optional[torch.Tensor], z: Optional[torch.Tensor], delta_bias: Optional[torch.Tensor],
    delta_softplus: bool, dout: torch.Tensor, dlast: torch.Tensor,
    initial_state: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
           torch.Tensor, torch.Tensor]:
    """Gradients (du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, dinitial_state) in the
    inputs' dtypes; dD / dz / ddelta_bias / dinitial_state are empty tensors when D / z /
    delta_bias / initial_state are None."""
    if u.device.type == "cuda":
        return _backward_cuda(u, delta, A, B, C, D, z, delta_bias, delta_softplus, dout, dlast, initial_state)
    batch, Dn, L = u.shape
    N = A.shape[1]
    h0 = initial_state
    dt, arrs = _arrays(u, delta, A, B, C, D, z, delta_bias, h0)
    kernel = _kernels.selective_vjp(_spec(N, B, C, z is not None, delta_softplus, h0 is not None),
                                    dt == np.float64)
    g_out = _checks.view(dout, dt)  # only read by this VJP (_kernels.selective_vjp): no copy
    g_last = _checks.view(dlast, dt).copy()
    out_scratch = np.empty((batch, Dn, L), dt)  # primal outputs: never read or written by the VJP
    last_scratch = np.empty((batch, Dn, N), dt)
    shared = [_grad_buffer(arrs[0]), _grad_buffer(arrs[1]), _grad_buffer(arrs[2])]
    tail = [_grad_buffer(a) for a in arrs[5:]]  # dD, [dz], dbias, [dh0]
    threads, parts = _grad_tasks(Dn, batch * Dn * L * N)
    # dB / dC of shared or grouped B, C sum over channels: one private buffer per task
    private = [_kind(B) != "const", _kind(C) != "const"]
    dBC = [[_grad_buffer(arrs[3 + k]) for _ in parts] if private[k] else [_grad_buffer(arrs[3 + k])] * len(parts)
           for k in range(2)]
    first = len(arrs) + 4  # the shadows' position in the VJP's arguments
    calls = kernel.bind_each([*arrs, out_scratch, last_scratch, 0, 0, *shared, dBC[0][0], dBC[1][0], *tail,
                              g_out, g_last],
                             [{first - 2: lo, first - 1: hi, first + 3: dBC[0][p], first + 4: dBC[1][p]}
                              for p, (lo, hi) in enumerate(parts)])
    tasks = []
    for p, (lo, hi) in enumerate(parts):
        spans = [s for buf in (*shared, *tail) for s in _zero_spans(buf, lo, hi, False)]
        spans += [s for k in range(2) for s in _zero_spans(dBC[k][p], lo, hi, private[k])]
        tasks.append(_zeroing(calls[p], spans))
    parallel_for(tasks, threads=threads)
    dB = _from_kernel_layout(_sum_in_order(dBC[0]) if private[0] else dBC[0][0])
    dC = _from_kernel_layout(_sum_in_order(dBC[1]) if private[1] else dBC[1][0])
    dD = tail[0]
    dz = tail[1] if z is not None else None
    dbias = tail[-2] if h0 is not None else tail[-1]
    dh0 = tail[-1] if h0 is not None else None

    def back(g, like):
        if like is None:
            return u.new_empty((0,))
        return torch.from_numpy(np.ascontiguousarray(g)).to(like.dtype)

    return (back(shared[0], u), back(shared[1], delta), back(shared[2], A), back(dB, B), back(dC, C),
            back(dD, D), back(dz, z), back(dbias, delta_bias), back(dh0, h0))


def _backward_cuda(u, delta, A, B, C, D, z, delta_bias, delta_softplus, dout, dlast, initial_state):
    """The compiled VJP on the GPU (`runtime/cuda_vjp.py`): one thread per (batch,
    channel), sequential in time; float32 math (float64 inputs too), gradients cast back
    to the inputs' dtypes.  dA, dD, ddelta_bias and shared/grouped dB, dC are summed
    with atomic adds, so they may differ in the last bits from run to run."""
    _require_cuda()
    from scanweaver.runtime.cuda_vjp import selective_scan_vjp_cuda, vjp_spec

    f32 = lambda x: _checks.device_aligned(x.detach().to(torch.float32).contiguous())  # noqa: E731
    batch, Dn, L = u.shape
    N = A.shape[1]
    spec = vjp_spec(N, _kind(B), _kind(C), z is not None, delta_softplus, initial_state is not None)
    zeros = u.new_zeros((Dn,), dtype=torch.float32)
    fwd = [f32(u), f32(delta), f32(A), f32(B), f32(C), f32(D) if D is not None else zeros]
    fwd += [f32(z)] if z is not None else []
    fwd += [f32(delta_bias) if delta_bias is not None else zeros.clone()]
    fwd += [f32(initial_state)] if initial_state is not None else []
    fwd += [u.new_empty((batch, Dn, L), dtype=torch.float32), u.new_empty((batch, Dn, N), dtype=torch.float32)]
    shadows = [torch.zeros_like(x) for x in fwd[:-2]]
    shadows += [dout.detach().to(torch.float32).clone(), dlast.detach().to(torch.float32).clone()]  # consumed
    with torch.cuda.device(u.device):
        selective_scan_vjp_cuda([*fwd, *shadows], spec)
    g = shadows[:-2]
    rest = g[6:]
    dz = rest.pop(0) if z is not None else None
    dbias = rest.pop(0)
    dh0 = rest.pop(0) if initial_state is not None else None

    def back(x, like):
        return u.new_empty((0,)) if like is None else x.to(like.dtype)

    return (back(g[0], u), back(g[1], delta), back(g[2], A), back(g[3], B), back(g[4], C), back(g[5], D),
            back(dz, z), back(dbias, delta_bias), back(dh0, initial_state))


@selective_scan_bwd.register_fake
def _(u, delta, A, B, C, D, z, delta_bias, delta_softplus, dout, dlast, initial_state=None):
    return _checks.selective_backward_like(u, delta, A, B, C, D, z, delta_bias, initial_state)


selective_scan_fwd.register_autograd(
    _checks.selective_backward(torch.ops.scanweaver.selective_scan_bwd), setup_context=_checks.save_selective_inputs
)


# ------------------------------------------------------------------------ public entry


def selective_scan_fn(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, return_last_state=False,
    initial_state=None,
):
    """Mamba's selective scan, differentiable: drop-in for mamba_ssm's selective_scan_fn.

    u, delta, z: (batch, D, L); A: (D, N) real; B, C: (D, N), (batch, N, L) or
    (batch, G, N, L) with G dividing D; D, delta_bias: (D,).  Returns out (batch, D, L)
    in u's dtype, and with return_last_state also the state after the last step
    (batch, D, N), float32 (float64 for float64 inputs).  Math is float32 for float32,
    float16 and bfloat16 inputs, float64 for float64 inputs.  initial_state (an addition
    to mamba_ssm's signature, keyword or last): the state before the first step
    (batch, D, N), zeros when None; it gets a gradient like the other inputs.  A complex
    (Mamba's complex wtype) runs torch/complex_selective.py.
    """
    delta_softplus = _checks.flag("delta_softplus", delta_softplus)
    return_last_state = _checks.flag("return_last_state", return_last_state)
    if isinstance(A, torch.Tensor) and A.is_complex():
        return complex_selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                                         initial_state)
    u = _checks.tensor("u", u)
    delta, A = _checks.tensor("delta", delta), _checks.tensor("A", A)
    B, C = _checks.tensor("B", B), _checks.tensor("C", C)
    D = _checks.tensor("D", D, optional=True)
    z = _checks.tensor("z", z, optional=True)
    delta_bias = _checks.tensor("delta_bias", delta_bias, optional=True)
    initial_state = _checks.tensor("initial_state", initial_state, optional=True)
    _checks.same_device({"u": u, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "delta_bias": delta_bias,
                         "initial_state": initial_state})
    if u.dim() != 3:
        raise ScanWeaverValueError(f"argument 'u' must have shape (batch, D, L), got {tuple(u.shape)}")
    batch, Dn, L = u.shape
    _checks.shape("delta", delta, u.shape, "(batch, D, L) like 'u'")
    if A.dim() != 2 or A.shape[0] != Dn:
        raise ScanWeaverValueError(f"argument 'A' must have shape (D, N) = ({Dn}, N), got {tuple(A.shape)}")
    N = A.shape[1]
    if not 1 <= N <= MAX_STATE:
        raise ScanWeaverValueError(f"argument 'A': state size N = {N} is not supported (1..{MAX_STATE})")
    for name, x in (("B", B), ("C", C)):
        if x.dim() == 4:
            G = x.shape[1]
            if x.shape[0] != batch or tuple(x.shape[2:]) != (N, L) or G == 0 or Dn % G:
                raise ScanWeaverValueError(
                    f"argument '{name}' (grouped) must have shape (batch, G, N, L) = ({batch}, G, {N}, {L}) "
                    f"with G dividing D = {Dn}, got {tuple(x.shape)}")
        elif tuple(x.shape) not in ((Dn, N), (batch, N, L)):
            raise ScanWeaverValueError(
                f"argument '{name}' must have shape (D, N) = {(Dn, N)}, (batch, N, L) = {(batch, N, L)} "
                f"or (batch, G, N, L), got {tuple(x.shape)}")
    _checks.shape("D", D, (Dn,), "(D,)")
    _checks.shape("z", z, u.shape, "(batch, D, L) like 'u'")
    _checks.shape("delta_bias", delta_bias, (Dn,), "(D,)")
    _checks.shape("initial_state", initial_state, (batch, Dn, N), "(batch, D, N)")
    out, last = torch.ops.scanweaver.selective_scan_fwd(u, delta, A, B, C, D, z, delta_bias, bool(delta_softplus),
                                                        initial_state)
    return (out, last) if return_last_state else out
