"""The methods the benchmark compares, each behind one small interface.

A peer is set up once per input (`setup(inputs) -> Prepared`), outside the timing:
conversions to its own array type (torch tensors, jax arrays) happen there.  The
`run` callable is what gets timed; `result` turns the output of the last run into a
numpy array for the correctness check.  A peer whose library is missing (or that needs
a GPU when there is none) reports `unavailable()` with a reason and is skipped.

Workload "affine": inputs a, b of shape (channels, L), float32; h[c, t] = a h[c, t-1] + b.
Workload "selective": Mamba's selective scan forward (shared/DESIGN.md section 2); inputs u,
delta, A, B, C, D, z, delta_bias, delta_softplus.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Prepared:
    run: Callable[[], Any]
    result: Callable[[Any], np.ndarray]
    compile: Callable[[], None] | None = None  # first call (JIT compile), timed separately


@dataclass
class Peer:
    name: str
    workload: str  # "affine" | "selective"
    setup: Callable[[dict], Prepared]
    requires: tuple[str, ...] = ()  # importable modules
    gpu: bool = False
    is_scanweaver: bool = False
    # Largest problem (elements of the biggest array the peer builds) it is run on.
    max_elements: int | None = None
    # Longest single run tolerated (seconds): larger sizes of the same case are skipped.
    max_seconds: float | None = None
    # Longest row (steps) it is run on: loops over time in Python take seconds per 10^5 steps.
    max_length: int | None = None
    dtypes: tuple[str, ...] | None = None  # affine element types it runs (None: all)
    note: str = ""
    _reason: str | None = field(default=None, repr=False)

    def unavailable(self) -> str | None:
        """None when the peer can run here, else why not."""
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install .[bench])"
            try:
                importlib.import_module(module)
            except Exception as error:  # noqa: BLE001 - a broken install is a skip reason
                return f"{module} failed to import: {type(error).__name__}: {error}"
        if self.gpu and not gpu_available():
            return "no CUDA GPU on this machine"
        return None


def gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def _sync_cuda() -> None:
    import torch

    torch.cuda.synchronize()


# ---------------------------------------------------------------------------
# Affine scan peers
# ---------------------------------------------------------------------------


def _numpy_loop(inp: dict) -> Prepared:
    a, b = inp["a"], inp["b"]

    def run():
        h = np.empty_like(a)
        s = np.zeros(a.shape[0], a.dtype)
        for t in range(a.shape[1]):
            s = a[:, t] * s + b[:, t]
            h[:, t] = s
        return h

    return Prepared(run, lambda h: h)


_NUMBA_KERNELS: dict[str, Any] = {}


def _numba_kernel(kind: str):
    if kind in _NUMBA_KERNELS:
        return _NUMBA_KERNELS[kind]
    import numba

    # s starts at zero of the element type (b * 0: the inputs are finite).
    def body(a, b, h):
        C, L = a.shape
        for c in range(C):
            s = b[c, 0] * 0
            for t in range(L):
                s = a[c, t] * s + b[c, t]
                h[c, t] = s

    def body_par(a, b, h):
        C, L = a.shape
        for c in numba.prange(C):
            s = b[c, 0] * 0
            for t in range(L):
                s = a[c, t] * s + b[c, t]
                h[c, t] = s

    if kind == "plain":
        fn = numba.njit(cache=False)(body)
    elif kind == "fastmath":
        fn = numba.njit(fastmath=True, cache=False)(body)
    else:
        fn = numba.njit(fastmath=True, parallel=True, cache=False)(body_par)
    _NUMBA_KERNELS[kind] = fn
    return fn


def _numba(kind: str) -> Callable[[dict], Prepared]:
    def setup(inp: dict) -> Prepared:
        a, b = inp["a"], inp["b"]
        fn = _numba_kernel(kind)

        def run():  # the output allocated per call, as linear_scan does
            h = np.empty_like(a)
            fn(a, b, h)
            return h

        return Prepared(run, lambda h: h, compile=run)

    return setup


def _torch_affine_loop(device: str) -> Callable[[dict], Prepared]:
    def setup(inp: dict) -> Prepared:
        import torch

        a = torch.from_numpy(inp["a"]).to(device)
        b = torch.from_numpy(inp["b"]).to(device)

        def run():
            with torch.no_grad():
                h = torch.empty_like(a)
                s = torch.zeros(a.shape[0], dtype=a.dtype, device=device)
                for t in range(a.shape[1]):
                    s = a[:, t] * s + b[:, t]
                    h[:, t] = s
                if device != "cpu":
                    _sync_cuda()
                return h

        return Prepared(run, lambda h: h.cpu().numpy())

    return setup


def _jax_associative(inp: dict) -> Prepared:
    import jax
    import jax.numpy as jnp

    a, b = jnp.asarray(inp["a"]), jnp.asarray(inp["b"])

    def combine(x, y):  # (a1, b1) then (a2, b2)
        a1, b1 = x
        a2, b2 = y
        return a1 * a2, a2 * b1 + b2

    fn = jax.jit(lambda a, b: jax.lax.associative_scan(combine, (a, b), axis=1)[1])

    def run():
        return fn(a, b).block_until_ready()

    return Prepared(run, lambda h: np.asarray(h), compile=run)


def _mambapy_affine(inp: dict) -> Prepared:
    """mambapy's Blelloch pscan (torch) on (1, L, C, 1): needs L a power of two."""
    import torch
    from mambapy.pscan import pscan

    L = inp["a"].shape[1]
    if L & (L - 1):
        raise RuntimeError("mambapy pscan needs a power-of-two length")
    A = torch.from_numpy(np.ascontiguousarray(inp["a"].T))[None, :, :, None]
    X = torch.from_numpy(np.ascontiguousarray(inp["b"].T))[None, :, :, None]

    def run():
        with torch.no_grad():
            return pscan(A, X)

    return Prepared(run, lambda H: H[0, :, :, 0].numpy().T)


def _triton_affine(inp: dict) -> Prepared:  # pragma: no cover - GPU only
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def combine(a1, b1, a2, b2):
        return a1 * a2, a2 * b1 + b2

    @triton.jit
    def kernel(a_ptr, b_ptr, h_ptr, L: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, L)
        a = tl.load(a_ptr + row * L + offs)
        b = tl.load(b_ptr + row * L + offs)
        _, h = tl.associative_scan((a, b), 0, combine)
        tl.store(h_ptr + row * L + offs, h)

    a = torch.from_numpy(inp["a"]).cuda()
    b = torch.from_numpy(inp["b"]).cuda()
    h = torch.empty_like(a)
    C, L = a.shape
    if L > 65536 or L & (L - 1):
        raise RuntimeError("one Triton block per row: L must be a power of two <= 65536")

    def run():
        kernel[(C,)](a, b, h, L=L)
        _sync_cuda()
        return h

    return Prepared(run, lambda h: h.cpu().numpy(), compile=run)


def _scanweaver_affine_cpu(inp: dict) -> Prepared:
    from scanweaver import linear_scan

    a, b = inp["a"], inp["b"]
    return Prepared(lambda: linear_scan(a, b), lambda h: h, compile=lambda: linear_scan(a, b))


def _scanweaver_affine_cuda(inp: dict) -> Prepared:  # pragma: no cover - GPU only
    import torch

    from scanweaver.runtime.cuda_scan import linear_scan_cuda

    a = torch.from_numpy(inp["a"]).cuda()
    b = torch.from_numpy(inp["b"]).cuda()

    def run():
        out = linear_scan_cuda(a, b, None, 1, False, False)
        _sync_cuda()
        return out

    def result(out):
        h = out[0] if isinstance(out, tuple) else out
        return h.cpu().numpy() if hasattr(h, "cpu") else np.asarray(h.copy_to_host())

    return Prepared(run, result, compile=run)


# ---------------------------------------------------------------------------
# Selective scan peers
# ---------------------------------------------------------------------------


def selective_scan_torch_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """Mamba's `selective_scan_ref` (mamba_ssm/ops/selective_scan_interface.py), real A."""
    import torch
    import torch.nn.functional as F

    dtype_in = u.dtype
    u, delta = u.float(), delta.float()
    if delta_bias is not None:
        delta = delta + delta_bias[..., None].float()
    if delta_softplus:
        delta = F.softplus(delta)
    batch, dim, dstate = u.shape[0], A.shape[0], A.shape[1]
    is_variable_B, is_variable_C = B.dim() >= 3, C.dim() >= 3
    B, C = B.float(), C.float()
    x = A.new_zeros((batch, dim, dstate))
    ys = []
    deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    if not is_variable_B:
        deltaB_u = torch.einsum("bdl,dn,bdl->bdln", delta, B, u)
    else:
        if B.dim() == 3:
            deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
        else:
            B = B.repeat_interleave(dim // B.shape[1], dim=1)
            deltaB_u = torch.einsum("bdl,bdnl,bdl->bdln", delta, B, u)
    if is_variable_C and C.dim() == 4:
        C = C.repeat_interleave(dim // C.shape[1], dim=1)
    for i in range(u.shape[2]):
        x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
        if not is_variable_C:
            y = torch.einsum("bdn,dn->bd", x, C)
        elif C.dim() == 3:
            y = torch.einsum("bdn,bn->bd", x, C[:, :, i])
        else:
            y = torch.einsum("bdn,bdn->bd", x, C[:, :, :, i])
        ys.append(y)
    y = torch.stack(ys, dim=2)
    out = y if D is None else y + u * D[:, None]
    if z is not None:
        out = out * F.silu(z)
    return out.to(dtype=dtype_in)


def _torch_selective(device: str) -> Callable[[dict], Prepared]:
    def setup(inp: dict) -> Prepared:
        import torch

        t = {k: (torch.from_numpy(v).to(device) if isinstance(v, np.ndarray) else v) for k, v in inp.items()}

        def run():
            with torch.no_grad():
                out = selective_scan_torch_ref(
                    t["u"], t["delta"], t["A"], t["B"], t["C"], t.get("D"), t.get("z"),
                    t.get("delta_bias"), inp["delta_softplus"],
                )
                if device != "cpu":
                    _sync_cuda()
                return out

        return Prepared(run, lambda o: o.cpu().numpy())

    return setup


def _jax_selective(inp: dict) -> Prepared:
    """The selective scan as a jitted jax.lax.scan over time with the per-step work
    (discretisation, input, readout) inside the scan body: nothing of size
    (batch, D, L, N) is built, as a JAX user writing a Mamba layer would."""
    import jax
    import jax.numpy as jnp

    has_d, has_z, has_bias = inp.get("D") is not None, inp.get("z") is not None, inp.get("delta_bias") is not None
    softplus = inp["delta_softplus"]

    def per_step(M, dim):  # the per-time slices of B or C: (L, batch, [G,] N), or None when constant
        if M.ndim == 2:
            return None
        return jnp.moveaxis(M, -1, 0)

    def expand(m, dim):  # one step's B or C slice -> broadcastable to (batch, D, N)
        if m.ndim == 2:  # (batch, N): shared by every channel
            return m[:, None, :]
        return jnp.repeat(m, dim // m.shape[1], axis=1)  # grouped (batch, G, N)

    def fn(u, delta, A, B, C, D, z, bias):
        dim = u.shape[1]
        dt = delta + bias[:, None] if has_bias else delta
        if softplus:
            dt = jnp.where(dt > 20.0, dt, jax.nn.softplus(dt))
        Bt, Ct = per_step(B, dim), per_step(C, dim)

        def step(h, xs):
            dt_t, u_t, b_t, c_t = xs
            b_t = B[None] if Bt is None else expand(b_t, dim)
            c_t = C[None] if Ct is None else expand(c_t, dim)
            h = jnp.exp(dt_t[..., None] * A) * h + (dt_t * u_t)[..., None] * b_t
            return h, jnp.sum(h * c_t, axis=-1)

        n = A.shape[1]
        h0 = jnp.zeros((u.shape[0], dim, n), jnp.float32)
        length = u.shape[2]
        none = jnp.zeros((length,), jnp.float32)
        xs = (jnp.moveaxis(dt, 2, 0), jnp.moveaxis(u, 2, 0), none if Bt is None else Bt, none if Ct is None else Ct)
        _, ys = jax.lax.scan(step, h0, xs)
        out = jnp.moveaxis(ys, 0, 2)
        if has_d:
            out = out + u * D[:, None]
        if has_z:
            out = out * jax.nn.silu(z)
        return out

    jfn = jax.jit(fn)
    zeros = np.zeros(1, np.float32)
    args = [jnp.asarray(inp[k]) if inp.get(k) is not None else jnp.asarray(zeros)
            for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]

    def run():
        return jfn(*args).block_until_ready()

    return Prepared(run, lambda o: np.asarray(o), compile=run)


def _mambapy_selective(inp: dict) -> Prepared:
    """mambapy's selective scan: materialised deltaA, deltaB*u, then its parallel pscan."""
    import torch
    import torch.nn.functional as F
    from mambapy.pscan import pscan

    if inp["B"].ndim != 3 or inp["C"].ndim != 3:
        raise RuntimeError("peer written for shared (batch, N, L) B and C")
    L = inp["u"].shape[2]
    if L & (L - 1):
        raise RuntimeError("mambapy pscan needs a power-of-two length")
    t = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in inp.items()}

    def run():
        with torch.no_grad():
            delta = t["delta"]
            if t.get("delta_bias") is not None:
                delta = delta + t["delta_bias"][:, None]
            if inp["delta_softplus"]:
                delta = F.softplus(delta)
            x = t["u"].transpose(1, 2)  # (B, L, D)
            dl = delta.transpose(1, 2)
            Bm, Cm = t["B"].transpose(1, 2), t["C"].transpose(1, 2)  # (B, L, N)
            deltaA = torch.exp(dl.unsqueeze(-1) * t["A"])  # (B, L, D, N)
            BX = (dl * x).unsqueeze(-1) * Bm.unsqueeze(2)
            hs = pscan(deltaA, BX)
            y = (hs @ Cm.unsqueeze(-1)).squeeze(3).transpose(1, 2)  # (B, D, L)
            if t.get("D") is not None:
                y = y + t["u"] * t["D"][:, None]
            if t.get("z") is not None:
                y = y * F.silu(t["z"])
            return y

    return Prepared(run, lambda o: o.numpy())


def _mamba_cuda(inp: dict) -> Prepared:  # pragma: no cover - GPU only
    import torch
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

    t = {k: (torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v) for k, v in inp.items()}

    def run():
        out = selective_scan_fn(
            t["u"], t["delta"], t["A"], t["B"], t["C"], t.get("D"), t.get("z"),
            t.get("delta_bias"), inp["delta_softplus"],
        )
        _sync_cuda()
        return out

    return Prepared(run, lambda o: o.cpu().numpy(), compile=run)


def _scanweaver_selective_cpu(inp: dict) -> Prepared:
    from scanweaver import selective_scan

    def run():
        return selective_scan(
            inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"], inp.get("D"), inp.get("z"),
            inp.get("delta_bias"), inp["delta_softplus"],
        )

    return Prepared(run, lambda o: o, compile=run)


def _scanweaver_selective_cuda(inp: dict) -> Prepared:  # pragma: no cover - GPU only
    import torch

    from scanweaver.runtime.cuda_scan import selective_scan_cuda

    t = {k: (torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v) for k, v in inp.items()}

    def run():
        out = selective_scan_cuda(
            t["u"], t["delta"], t["A"], t["B"], t["C"], t.get("D"), t.get("z"),
            t.get("delta_bias"), inp["delta_softplus"], False, None,
        )
        _sync_cuda()
        return out

    def result(out):
        o = out[0] if isinstance(out, tuple) else out
        return o.cpu().numpy() if hasattr(o, "cpu") else np.asarray(o.copy_to_host())

    return Prepared(run, result, compile=run)


# -- selective scan forward + backward (workload "selective-grad") -------------------

GRAD_ORDER = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def flat_grads(grads) -> np.ndarray:
    """Gradients (in GRAD_ORDER, None / empty for absent inputs) as one float64 vector."""
    return np.concatenate([np.asarray(g.detach().cpu().double().numpy()).ravel()
                           for g in grads if g is not None and g.numel()])


def _scanweaver_selective_grad_cpu(backward_only: bool) -> Callable[[dict], Prepared]:
    """scanweaver.torch's ops: the compiled forward, then the compiled VJP (scanweaver-grad)."""

    def setup(inp: dict) -> Prepared:
        import torch

        import scanweaver.torch  # noqa: F401 - registers the scanweaver:: ops

        args = [torch.from_numpy(inp[k]) if inp.get(k) is not None else None for k in GRAD_ORDER]
        g = torch.from_numpy(inp["g"])
        fwd = torch.ops.scanweaver.selective_scan_fwd
        bwd = torch.ops.scanweaver.selective_scan_bwd
        _, last = fwd(*args, inp["delta_softplus"])
        dlast = torch.zeros_like(last)

        def run():
            if not backward_only:
                fwd(*args, inp["delta_softplus"])
            return bwd(*args, inp["delta_softplus"], g, dlast)

        return Prepared(run, flat_grads, compile=run)

    return setup


def _torch_selective_grad(inp: dict) -> Prepared:
    """PyTorch autograd through the eager loop-over-time reference (forward + backward)."""
    import torch

    args = [torch.from_numpy(inp[k]).requires_grad_() if inp.get(k) is not None else None for k in GRAD_ORDER]
    g = torch.from_numpy(inp["g"])

    def run():
        out = selective_scan_torch_ref(*args, delta_softplus=inp["delta_softplus"])
        present = [a for a in args if a is not None]
        return torch.autograd.grad(out, present, g)

    return Prepared(run, flat_grads)


def _shared_bc_only(inp: dict) -> None:
    if inp["B"].ndim != 3 or inp["C"].ndim != 3:
        raise RuntimeError("peer written for shared (batch, N, L) B and C")


def _jax_selective_grad(inp: dict) -> Prepared:
    """jax.vjp of a jitted lax.scan over time with the discretisation in the step (what a
    JAX user writes: exp(dt*A) and dt*u*B per step, no (batch, D, L, N) inputs)."""
    import jax
    import jax.numpy as jnp

    _shared_bc_only(inp)
    keys = [k for k in GRAD_ORDER if inp.get(k) is not None]
    softplus = inp["delta_softplus"]

    def forward(x):
        u, delta, A, B, C = (x[k] for k in ("u", "delta", "A", "B", "C"))
        dt = delta + x["delta_bias"][:, None] if "delta_bias" in x else delta
        if softplus:
            dt = jnp.where(dt > 20.0, dt, jax.nn.softplus(dt))

        def step(h, xs):
            dt_t, u_t, B_t, C_t = xs  # (batch, D), (batch, D), (batch, N), (batch, N)
            h = jnp.exp(dt_t[..., None] * A) * h + (dt_t * u_t)[..., None] * B_t[:, None, :]
            return h, jnp.einsum("bdn,bn->bd", h, C_t)

        time_major = [jnp.moveaxis(v, -1, 0) for v in (dt, u, B, C)]
        h0 = jnp.zeros((u.shape[0], u.shape[1], A.shape[1]), u.dtype)
        out = jnp.moveaxis(jax.lax.scan(step, h0, time_major)[1], 0, -1)
        if "D" in x:
            out = out + u * x["D"][:, None]
        if "z" in x:
            out = out * jax.nn.silu(x["z"])
        return out

    grads = jax.jit(lambda x, g: jax.vjp(forward, x)[1](g)[0])
    x = {k: jnp.asarray(inp[k]) for k in keys}
    g = jnp.asarray(inp["g"])

    def run():
        return jax.block_until_ready(grads(x, g))

    def result(d):
        return np.concatenate([np.asarray(d[k], np.float64).ravel() for k in keys])

    return Prepared(run, result, compile=run)


def _mambapy_selective_grad(inp: dict) -> Prepared:
    """Autograd through mambapy's selective scan (materialised deltaA and deltaB*u, its
    parallel pscan with pscan's own backward)."""
    import torch
    import torch.nn.functional as F
    from mambapy.pscan import pscan

    _shared_bc_only(inp)
    L = inp["u"].shape[2]
    if L & (L - 1):
        raise RuntimeError("mambapy pscan needs a power-of-two length")
    t = {k: torch.from_numpy(inp[k]).requires_grad_() for k in GRAD_ORDER if inp.get(k) is not None}
    g = torch.from_numpy(inp["g"])

    def run():
        delta = t["delta"] + t["delta_bias"][:, None] if "delta_bias" in t else t["delta"]
        if inp["delta_softplus"]:
            delta = F.softplus(delta)
        dl = delta.transpose(1, 2)  # (B, L, D)
        deltaA = torch.exp(dl.unsqueeze(-1) * t["A"])  # (B, L, D, N)
        BX = (dl * t["u"].transpose(1, 2)).unsqueeze(-1) * t["B"].transpose(1, 2).unsqueeze(2)
        hs = pscan(deltaA, BX)
        y = (hs @ t["C"].transpose(1, 2).unsqueeze(-1)).squeeze(3).transpose(1, 2)  # (B, D, L)
        if "D" in t:
            y = y + t["u"] * t["D"][:, None]
        if "z" in t:
            y = y * F.silu(t["z"])
        return torch.autograd.grad(y, list(t.values()), g)

    return Prepared(run, flat_grads)


# Elements of the largest (batch, D, L, N) array a materialising peer may build.
_MATERIALISE_LIMIT = 1 << 27


def default_peers() -> list[Peer]:
    """Every peer the harness knows, CPU and GPU."""
    return [
        # affine
        Peer("scanweaver-cpu", "affine", _scanweaver_affine_cpu, is_scanweaver=True,
             note="the public linear_scan(a, b): all cores, the output allocated per call "
                  "(outputs of 32 MiB and more reuse a buffer the caller has dropped: runtime/cpu_variants.py)"),
        Peer("numpy-loop", "affine", _numpy_loop, max_seconds=3.0, max_length=1 << 16,
             note="a Python loop over time of numpy row operations, vectorised across channels"),
        Peer("numba-seq", "affine", _numba("plain"), ("numba",), max_seconds=3.0,
             note="@njit, one channel at a time, output allocated per call"),
        Peer("numba-seq-fastmath", "affine", _numba("fastmath"), ("numba",), max_seconds=3.0,
             note="@njit(fastmath=True), one channel at a time"),
        Peer("numba-prange-fastmath", "affine", _numba("prange"), ("numba",),
             note="@njit(parallel=True, fastmath=True), prange over channels, the time loop inside"),
        Peer("torch-loop", "affine", _torch_affine_loop("cpu"), ("torch",), max_seconds=3.0, max_length=1 << 16,
             note="eager PyTorch loop over time (torch.no_grad), vectorised across channels"),
        Peer("jax-associative-scan", "affine", _jax_associative, ("jax",), max_seconds=5.0,
             note="jit(lax.associative_scan) with the affine combine along the time axis"),
        Peer("mambapy-pscan", "affine", _mambapy_affine, ("torch", "mambapy"), max_seconds=5.0,
             dtypes=("float32",), note="mambapy's Blelloch pscan (PyTorch), power-of-two lengths"),
        Peer("scanweaver-cuda", "affine", _scanweaver_affine_cuda, ("torch", "numba"), gpu=True),
        Peer("torch-cuda-loop", "affine", _torch_affine_loop("cuda"), ("torch",), gpu=True, max_seconds=5.0),
        Peer("triton-associative-scan", "affine", _triton_affine, ("torch", "triton"), gpu=True),
        # selective
        Peer("scanweaver-cpu", "selective", _scanweaver_selective_cpu, is_scanweaver=True,
             note="the public selective_scan: all cores"),
        Peer("torch-ref", "selective", _torch_selective("cpu"), ("torch",), max_elements=_MATERIALISE_LIMIT,
             max_seconds=10.0, note="Mamba's selective_scan_ref, eager loop over time"),
        Peer("jax-lax-scan", "selective", _jax_selective, ("jax",), max_seconds=10.0,
             note="jit(lax.scan) over time, the discretisation exp(dt*A), dt*B*u and the C readout "
                  "inside the scan body (nothing of size batch x D x L x N)"),
        Peer("mambapy-pscan", "selective", _mambapy_selective, ("torch", "mambapy"),
             max_elements=_MATERIALISE_LIMIT, max_seconds=10.0, note="mambapy's Blelloch pscan (PyTorch)"),
        Peer("scanweaver-cuda", "selective", _scanweaver_selective_cuda, ("torch", "numba"), gpu=True),
        Peer("torch-cuda-ref", "selective", _torch_selective("cuda"), ("torch",), gpu=True,
             max_elements=_MATERIALISE_LIMIT, max_seconds=10.0),
        Peer("mamba-cuda", "selective", _mamba_cuda, ("torch", "mamba_ssm"), gpu=True),
        # selective forward + backward
        Peer("scanweaver-cpu", "selective-grad", _scanweaver_selective_grad_cpu(False), ("torch",),
             is_scanweaver=True, note="scanweaver.torch ops: compiled forward + compiled VJP"),
        Peer("scanweaver-cpu-backward", "selective-grad", _scanweaver_selective_grad_cpu(True), ("torch",),
             note="the compiled VJP alone (what autograd's backward step runs)"),
        Peer("torch-ref-autograd", "selective-grad", _torch_selective_grad, ("torch",),
             max_elements=_MATERIALISE_LIMIT, max_seconds=30.0,
             note="autograd through Mamba's selective_scan_ref, eager loop over time"),
        Peer("jax-lax-scan-grad", "selective-grad", _jax_selective_grad, ("jax",), max_seconds=30.0,
             note="jit(jax.vjp) of lax.scan over time, discretisation in the step"),
        Peer("mambapy-pscan-grad", "selective-grad", _mambapy_selective_grad, ("torch", "mambapy"),
             max_elements=_MATERIALISE_LIMIT, max_seconds=30.0,
             note="autograd through mambapy's pscan (deltaA, deltaB*u materialised)"),
    ]


__all__ = ["GRAD_ORDER", "Peer", "Prepared", "default_peers", "flat_grads", "gpu_available",
           "selective_scan_torch_ref"]
