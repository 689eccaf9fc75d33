"""Per-rank bodies of the multi-process tests in test_distributed.py (spawned processes
import this module, so it holds only top-level functions)."""

from __future__ import annotations

import datetime
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist

GLOBAL_LENGTH = 23


def init(rank: int, world: int, init_file: str, timeout_s: float = 30.0) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def reference_scan(a, b, h0, reverse):
    """The sequential loop in torch ops (differentiable), time on the last axis."""
    h = h0
    outs = [None] * a.shape[-1]
    steps = range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1])
    for t in steps:
        h = a[..., t] * h + b[..., t]
        outs[t] = h
    return torch.stack(outs, dim=-1), h


def _case_inputs(seed, dtype, channels):
    g = np.random.default_rng(seed)
    if dtype in (torch.int32, torch.int64):
        info = np.iinfo(np.int32 if dtype == torch.int32 else np.int64)
        a = g.integers(info.min // 2, info.max // 2, size=(channels, GLOBAL_LENGTH))
        b = g.integers(info.min // 2, info.max // 2, size=(channels, GLOBAL_LENGTH))
        h0 = g.integers(-1000, 1000, size=channels)
        np_t = np.int32 if dtype == torch.int32 else np.int64
        return a.astype(np_t), b.astype(np_t), h0.astype(np_t), None, None
    a = g.uniform(-1.3, 1.3, size=(channels, GLOBAL_LENGTH))
    b = g.normal(size=(channels, GLOBAL_LENGTH))
    h0 = g.normal(size=channels)
    w = g.normal(size=(channels, GLOBAL_LENGTH))
    wf = g.normal(size=channels)
    return a, b, h0, w, wf


ALL_DTYPES = ("float32", "float64", "int32", "int64")
TEST_DTYPES = ("float32", "float64", "int32")


def check_linear_scan(rank: int, world: int, init_file: str, splits, out_dir: str,
                      dtypes=ALL_DTYPES, h0_options=(False, True)) -> list:
    """Every case: forward outputs and every gradient equal the single-process result."""
    import scanweaver.distributed as sd

    assert sum(splits) == GLOBAL_LENGTH and len(splits) == world
    lo = sum(splits[:rank])
    hi = lo + splits[rank]
    report = []
    seed = 0
    for dtype in [getattr(torch, name) for name in dtypes]:
        for reverse in (False, True):
            for with_h0 in h0_options:
                seed += 1
                channels = 3
                a, b, h0, w, wf = _case_inputs(seed, dtype, channels)
                if dtype.is_floating_point:
                    report.append(_float_case(sd, rank, world, a, b, h0 if with_h0 else None,
                                              w, wf, lo, hi, dtype, reverse))
                else:
                    report.append(_int_case(sd, rank, a, b, h0 if with_h0 else None, lo, hi,
                                            dtype, reverse))
    # the channel dimension first (dim=0 is time)
    a, b, h0, w, wf = _case_inputs(99, torch.float64, 2)
    at = torch.tensor(a.T[lo:hi].copy())
    bt = torch.tensor(b.T[lo:hi].copy())
    h = sd.linear_scan(at, bt, dim=0)
    want, _ = reference_scan(torch.tensor(a), torch.tensor(b), torch.zeros(2, dtype=torch.float64), False)
    assert torch.allclose(h, want.T[lo:hi], rtol=1e-12, atol=1e-12)
    return report


def _float_case(sd, rank, world, a, b, h0, w, wf, lo, hi, dtype, reverse):
    start = world - 1 if reverse else 0
    full = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (a, b)]
    h0_full = torch.tensor(h0 if h0 is not None else np.zeros(a.shape[0]), dtype=torch.float64,
                           requires_grad=True)
    ref_h, ref_final = reference_scan(full[0], full[1], h0_full, reverse)
    loss = (ref_h * torch.tensor(w)).sum() + (ref_final * torch.tensor(wf)).sum()
    loss.backward()

    la = torch.tensor(a[:, lo:hi], dtype=dtype, requires_grad=True)
    lb = torch.tensor(b[:, lo:hi], dtype=dtype, requires_grad=True)
    lh0 = torch.tensor(h0, dtype=dtype, requires_grad=True) if h0 is not None else None
    h, final = sd.linear_scan(la, lb, lh0, reverse=reverse, return_final_state=True)
    # the replicated final state: rank `start` alone puts it in its loss
    local = (h * torch.tensor(w[:, lo:hi], dtype=dtype)).sum()
    if rank == start:
        local = local + (final * torch.tensor(wf, dtype=dtype)).sum()
    local.backward()

    tol = 1e-5 if dtype == torch.float32 else 1e-12

    def close(got, want, what):
        scale = max(float(want.abs().max()), 1e-30) if want.numel() else 1.0
        err = float((got.double() - want).abs().max()) / scale if want.numel() else 0.0
        assert err <= tol, f"rank {rank} {dtype} reverse={reverse} {what}: rel err {err}"
        return err

    errs = {
        "h": close(h.detach(), ref_h.detach()[:, lo:hi], "h"),
        "final": close(final.detach(), ref_final.detach(), "final"),
        "da": close(la.grad, full[0].grad[:, lo:hi], "da"),
        "db": close(lb.grad, full[1].grad[:, lo:hi], "db"),
    }
    if lh0 is not None:
        want = h0_full.grad if rank == start else torch.zeros_like(h0_full.grad)
        errs["dh0"] = close(lh0.grad, want, "dh0")
    return {"dtype": str(dtype), "reverse": reverse, "errors": errs}


def _int_case(sd, rank, a, b, h0, lo, hi, dtype, reverse):
    import scanweaver

    want, want_final = scanweaver.linear_scan(a, b, h0, reverse=reverse, return_final_state=True)
    h, final = sd.linear_scan(torch.tensor(a[:, lo:hi]), torch.tensor(b[:, lo:hi]),
                              None if h0 is None else torch.tensor(h0), reverse=reverse,
                              return_final_state=True)
    assert np.array_equal(h.numpy(), want[:, lo:hi]), f"rank {rank} {dtype} h differs"
    assert np.array_equal(final.numpy(), want_final), f"rank {rank} {dtype} final differs"
    return {"dtype": str(dtype), "reverse": reverse, "exact": True}


SELECTIVE_CASES = [
    # (dtype, B kind, C kind, D, z, delta_bias, softplus, oracle)
    # float32 against the single-process op (the same compiled kernels), float64 against
    # the pure PyTorch reference (z applied by both)
    ("float32", "shared", "shared", True, False, True, True, "op"),
    ("float64", "grouped", "const", True, True, True, False, "reference"),
]


def _selective_inputs(seed, dtype, b_kind, c_kind, with_D, with_z, with_bias, batch=2,
                      channels=4, n_state=3, groups=2):
    g = torch.Generator().manual_seed(seed)
    L = GLOBAL_LENGTH

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    def bc(kind):
        return {"const": (channels, n_state), "shared": (batch, n_state, L),
                "grouped": (batch, groups, n_state, L)}[kind]

    return dict(
        u=r(batch, channels, L), delta=r(batch, channels, L, scale=0.5),
        A=-torch.exp(r(channels, n_state, scale=0.5)), B=r(*bc(b_kind)), C=r(*bc(c_kind)),
        D=r(channels) if with_D else None, z=r(batch, channels, L) if with_z else None,
        delta_bias=r(channels, scale=0.3) if with_bias else None,
    ), r(batch, channels, L), r(batch, channels, n_state)


TIME_LOCAL = ("u", "delta", "z")


def _local_chunk(name, x, lo, hi):
    if x is None:
        return None
    if name in TIME_LOCAL or (name in ("B", "C") and x.dim() >= 3):
        return x[..., lo:hi].detach().clone()
    return x.detach().clone()


def check_selective_scan(rank: int, world: int, init_file: str, splits, out_dir: str,
                         cases=None) -> list:
    import scanweaver.distributed as sd
    import scanweaver.torch as st

    lo = sum(splits[:rank])
    hi = lo + splits[rank]
    last = world - 1
    report = []
    cases = SELECTIVE_CASES if cases is None else cases
    for k, (dtype_name, b_kind, c_kind, with_D, with_z, with_bias, softplus, oracle) in enumerate(cases):
        dtype = getattr(torch, dtype_name)
        full, w, wf = _selective_inputs(100 + k, dtype, b_kind, c_kind, with_D, with_z, with_bias)
        ref_in = {n: (None if x is None else x.clone().requires_grad_()) for n, x in full.items()}
        single = st.selective_scan_fn if oracle == "op" else st.selective_scan_ref
        out, final = single(**ref_in, delta_softplus=softplus, return_last_state=True)
        ((out * w).sum() + (final * wf).sum()).backward()

        loc = {n: _local_chunk(n, x, lo, hi) for n, x in full.items()}
        for x in loc.values():
            if x is not None:
                x.requires_grad_()
        got, got_final = sd.selective_scan_fn(**loc, delta_softplus=softplus, return_last_state=True)
        loss = (got * w[..., lo:hi]).sum()
        if rank == last:
            loss = loss + (got_final * wf).sum()
        loss.backward()

        tol = 1e-5 if dtype == torch.float32 else 1e-10

        def close(g, want, what):
            if want.numel() == 0:
                return 0.0
            scale = max(float(want.abs().max()), 1e-30)
            err = float((g.double() - want.double()).abs().max()) / scale
            assert err <= tol, f"rank {rank} case {k} {what}: rel err {err:.3g}"
            return err

        errs = {"out": close(got.detach(), out.detach()[..., lo:hi], "out"),
                "final": close(got_final.detach(), final.detach(), "final")}
        for name, x in loc.items():
            if x is None:
                continue
            want = ref_in[name].grad
            if _local_chunk(name, want, lo, hi).shape != want.shape:  # time-local
                errs["d" + name] = close(x.grad, want[..., lo:hi], "d" + name)
            else:  # replicated parameter: the ranks' gradients add up to the total
                # (None where this rank's chunk does not use it, e.g. an empty chunk)
                total = torch.zeros_like(x) if x.grad is None else x.grad.clone()
                dist.all_reduce(total)
                errs["d" + name] = close(total, want, "d" + name)
        report.append({"case": k, "errors": errs})
    return report


def check_training_example(steps: int) -> dict:
    """examples/train_mamba_distributed.py: losses and summed gradients of a few Adam
    steps with the sequence split over the ranks equal the single-process run."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "train_mamba_distributed.py"
    spec = importlib.util.spec_from_file_location("train_mamba_distributed", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    loss_diff, grad_diff = example.compare(steps=steps, log=lambda *_: None)
    assert loss_diff <= 1e-5, f"loss differs by {loss_diff}"
    assert grad_diff <= 1e-4, f"gradients differ by {grad_diff} (relative)"
    return {"loss_diff": loss_diff, "grad_diff": grad_diff}


def check_all(rank: int, world: int, init_file: str, splits, out_dir: str,
              linear_dtypes, linear_h0, selective_cases, training_steps=0) -> None:
    """One process group per test: the linear and the selective checks, then a report."""
    init(rank, world, init_file)
    report = {
        "linear": check_linear_scan(rank, world, init_file, splits, out_dir, linear_dtypes, linear_h0),
        "selective": check_selective_scan(rank, world, init_file, splits, out_dir, selective_cases),
    }
    if training_steps:
        report["training"] = check_training_example(training_steps)
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()
    # Seen once in about a dozen runs: an abort ("terminate called without an active
    # exception") during interpreter teardown, after all the work; the report is
    # written, so leave without the teardown.
    os._exit(0)


def _peer_misbehaves(rank: int, world: int, init_file: str, out_dir: str, timeout_s: float,
                     stall_s: float) -> None:
    """Rank 1 leaves (stall_s = 0) or stalls past the group's timeout instead of taking part;
    rank 0 records the error its collective raises and how long that took."""
    import scanweaver
    import scanweaver.distributed as sd

    init(rank, world, init_file, timeout_s=timeout_s)
    if rank == 1:
        time.sleep(stall_s)
        return  # exits without calling: its sockets close
    ones = np.ones((2, 5), np.float32)
    scanweaver.linear_scan(ones, ones, np.zeros(2, np.float32))  # compile first: time the collective
    t0 = time.monotonic()
    try:
        sd.linear_scan(torch.ones(2, 5), torch.ones(2, 5))
        message = "no error"
    except Exception as e:  # noqa: BLE001 - the test inspects the message
        message = f"{type(e).__name__}: {e}"
    with open(f"{out_dir}/rank0.json", "w") as f:
        json.dump({"message": message, "seconds": time.monotonic() - t0}, f)
    # The group is broken now; gloo may abort the process at teardown over the send
    # that never completed (see README, Scaling out), so leave without it.
    os._exit(0)


def peer_leaves(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Rank 1 leaves before the collective; rank 0 must fail with a clear error, soon."""
    _peer_misbehaves(rank, world, init_file, out_dir, timeout_s=20.0, stall_s=0.0)


def peer_stalls(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Rank 1 stalls past the group's 4 s timeout; rank 0 must fail with a clear error
    once the timeout has passed, not wait for it."""
    _peer_misbehaves(rank, world, init_file, out_dir, timeout_s=4.0, stall_s=12.0)
