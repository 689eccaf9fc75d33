"""Sequence-parallel scans: communication and compute per rank, measured with P = 1, 2
gloo processes on this machine, and a stated model of P = 8 GPUs on NVLink.

    python -m scanweaver.bench.distributed [--repeats 7] [--out benchmarks]

Each rank times its forward and forward+backward calls (median of `--repeats`, after a
warm-up call that compiles), with every collective recorded (bytes received, seconds).
Compute per rank = call time - collective time.  Writes
`benchmarks/results/distributed.json` and regenerates `benchmarks/DISTRIBUTED.md`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

AFFINE = {"channels": 64, "L": 1 << 18}
SELECTIVE = {"batch": 1, "D": 256, "N": 16, "L": 2048}

# Model constants for the P = 8 projection.  Assumptions, not measurements: NVLink 4
# on an 8-GPU H100/H200 board moves about 450 GB/s per GPU per direction, and a small
# NCCL all-gather costs about 15 us of latency.
NVLINK_BYTES_PER_S = 450e9
NCCL_LATENCY_S = 15e-6


def _inputs(workload: str, lo: int, hi: int, grad: bool):
    import torch

    g = torch.Generator().manual_seed(0)
    if workload == "affine":
        c, L = AFFINE["channels"], AFFINE["L"]
        a = torch.rand(c, L, generator=g) * 0.2 + 0.9
        b = torch.randn(c, L, generator=g)
        return [x[:, lo:hi].contiguous().requires_grad_(grad) for x in (a, b)]
    bsz, D, N, L = (SELECTIVE[k] for k in ("batch", "D", "N", "L"))
    u = torch.randn(bsz, D, L, generator=g)
    delta = torch.randn(bsz, D, L, generator=g) * 0.5
    A = -torch.exp(torch.randn(D, N, generator=g) * 0.5)
    B = torch.randn(bsz, N, L, generator=g)
    C = torch.randn(bsz, N, L, generator=g)
    z = torch.randn(bsz, D, L, generator=g)
    Dskip = torch.randn(D, generator=g)
    bias = torch.randn(D, generator=g) * 0.3
    local = [x[..., lo:hi].contiguous() for x in (u, delta, B, C, z)]
    tensors = [local[0], local[1], A, local[2], local[3], Dskip, local[4], bias]
    return [x.requires_grad_(grad) for x in tensors]


def _call(workload: str, xs):
    import scanweaver.distributed as sd

    if workload == "affine":
        return sd.linear_scan(xs[0], xs[1])
    u, delta, A, B, C, Dskip, z, bias = xs
    return sd.selective_scan_fn(u, delta, A, B, C, D=Dskip, z=z, delta_bias=bias, delta_softplus=True)


def _time(workload, rank, world, repeats, backward):
    import torch.distributed as dist

    from scanweaver.distributed.collectives import record_collectives

    length = (AFFINE if workload == "affine" else SELECTIVE)["L"]
    lo, hi = rank * length // world, (rank + 1) * length // world
    xs = _inputs(workload, lo, hi, backward)
    out = _call(workload, xs)  # compiles every kernel the timed calls use
    if backward:
        out.sum().backward()
    totals, comms, nbytes = [], [], 0
    for _ in range(repeats):
        dist.barrier()
        with record_collectives() as log:
            start = time.perf_counter()
            out = _call(workload, xs)
            if backward:
                out.sum().backward()
            totals.append(time.perf_counter() - start)
        comms.append(sum(e["seconds"] for e in log))
        nbytes = sum(e["bytes"] for e in log)
    return {
        "seconds": statistics.median(totals),
        "collective_seconds": statistics.median(comms),
        "compute_seconds": statistics.median(t - c for t, c in zip(totals, comms)),
        "collective_bytes": nbytes,
        "local_steps": hi - lo,
    }


def _rank_main(rank, world, init_file, repeats, out_file):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    rows = {}
    for workload in ("affine", "selective"):
        for backward in (False, True):
            rows[f"{workload}/{'fwd+bwd' if backward else 'fwd'}"] = _time(
                workload, rank, world, repeats, backward
            )
    Path(f"{out_file}.{rank}").write_text(json.dumps(rows))
    dist.destroy_process_group()


def measure(worlds=(1, 2), repeats=7) -> dict:
    import torch.multiprocessing as mp

    results = {}
    for world in worlds:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows")
            mp.spawn(_rank_main, args=(world, os.path.join(tmp, "rdv"), repeats, out), nprocs=world)
            results[world] = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
    return results


def model_p8(measured: dict) -> dict:
    """Predicted per-rank seconds at P = 8 GPUs: the measured P = 2 compute per step
    scaled to L/8 steps, plus the all-gather of the measured per-rank carry bytes."""
    p2 = measured[2]
    rows = {}
    for key in p2[0]:
        compute_per_step = max(r[key]["compute_seconds"] / max(r[key]["local_steps"], 1) for r in p2)
        length = (AFFINE if key.startswith("affine") else SELECTIVE)["L"]
        per_rank_bytes = max(r[key]["collective_bytes"] for r in p2) / 2  # bytes per rank's block(s)
        collectives = 2 if key.endswith("fwd+bwd") else 1
        comm = collectives * NCCL_LATENCY_S + per_rank_bytes * 7 / NVLINK_BYTES_PER_S
        rows[key] = {"compute_seconds": compute_per_step * length / 8, "collective_seconds": comm,
                     "collective_bytes_per_rank": per_rank_bytes * 8}
    return rows


def write(measured: dict, out_dir: Path) -> None:
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    doc = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "affine": AFFINE, "selective": SELECTIVE, "measured": measured, "model_p8": model_p8(measured)}
    (out_dir / "results" / "distributed.json").write_text(json.dumps(doc, indent=1))
    (out_dir / "DISTRIBUTED.md").write_text(render(doc))


def render(doc: dict) -> str:
    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    lines = [
        "# Sequence-parallel scans: measured and modelled",
        "",
        "Generated by `python -m scanweaver.bench.distributed` on "
        f"{doc['date']}; do not edit by hand.",
        "",
        f"Affine scan: {doc['affine']['channels']} channels x {doc['affine']['L']} steps, float32. "
        f"Selective scan: (batch, D, N, L) = ({doc['selective']['batch']}, {doc['selective']['D']}, "
        f"{doc['selective']['N']}, {doc['selective']['L']}), D, z, delta_bias, softplus, float32.",
        "",
        "## Measured on this machine (gloo, one thread per rank)",
        "",
        "Medians per rank; the slowest rank is shown. Compute = call time - time inside "
        "collectives; collective time includes waiting for the slowest rank.",
        "",
        "| call | P | local steps | call ms | compute ms | collective ms | collective bytes received |",
        "|---|---|---|---|---|---|---|",
    ]
    for world, ranks in sorted(doc["measured"].items(), key=lambda kv: int(kv[0])):
        for key in ranks[0]:
            worst = max(ranks, key=lambda r: r[key]["seconds"])[key]
            lines.append(
                f"| {key} | {world} | {worst['local_steps']} | {ms(worst['seconds'])} | "
                f"{ms(worst['compute_seconds'])} | {ms(worst['collective_seconds'])} | "
                f"{worst['collective_bytes']} |"
            )
    lines += [
        "",
        "## Model: P = 8 GPUs on NVLink (a model, not a measurement)",
        "",
        "Compute per rank: the measured P = 2 compute per step (this CPU) times L/8 steps; a GPU "
        "rank would be faster, so read the compute column as this machine's, and the collective "
        "column as the NVLink cost: one all-gather (forward) or two collectives "
        f"(forward+backward) of the measured carry bytes, at an assumed "
        f"{NVLINK_BYTES_PER_S / 1e9:.0f} GB/s per GPU and {NCCL_LATENCY_S * 1e6:.0f} us latency each.",
        "",
        "| call | compute ms per rank | collective ms | carry bytes per rank, all ranks |",
        "|---|---|---|---|",
    ]
    for key, row in doc["model_p8"].items():
        lines.append(f"| {key} | {ms(row['compute_seconds'])} | {row['collective_seconds'] * 1e3:.4f} | "
                     f"{int(row['collective_bytes_per_rank'])} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks")
    a = p.parse_args(argv)
    write(measure(repeats=a.repeats), a.out)
    print(f"wrote {a.out / 'DISTRIBUTED.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
