"""The LRU row of the benchmark: the complex diagonal recurrence h_t = lam*h_{t-1} + b_t.

    python -m scanweaver.bench.lru [--full] [--out benchmarks/]

Peers, each skipped with a printed reason when its library is missing:

  scanweaver-cpu   scanweaver.linear_scan on complex64 (L, N) inputs, axis 0
  jax-assoc-scan   jax.lax.associative_scan on (lam, b) complex pairs, jitted: how the
                   LRU paper implements the recurrence
  torch-loop       a PyTorch loop over time (complex64 tensors)
  numpy-loop       a numpy loop over time

Inputs: lam from the paper's ring initialisation (|lam| in [0.4, 0.99]), b = gamma*Bu
with Bu complex normal; every peer gets lam broadcast to (L, N).  Errors are against a
complex128 numpy loop.  Writes benchmarks/results/lru-<name>.json and benchmarks/lru.md
(the figures there come from the run, never typed by hand).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "benchmarks"


def lru_cases(full: bool = False) -> list[tuple[int, int]]:
    """(L, N) per case: the paper's state sizes, short and long sequences."""
    short = [(2048, 256), (16384, 64)]
    return short + ([(16384, 256), (65536, 64)] if full else [])


def lru_inputs(L: int, N: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    from scanweaver.workloads.lru import lru_parameters

    lam, gamma = lru_parameters(N, seed=seed)
    rng = np.random.default_rng(seed + 1)
    bu = rng.standard_normal((L, N)) + 1j * rng.standard_normal((L, N))
    a = np.ascontiguousarray(np.broadcast_to(lam, (L, N))).astype(np.complex64)
    return a, (gamma * bu).astype(np.complex64)


def lru_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = np.zeros(a.shape[1], np.complex128)
    out = np.empty(a.shape, np.complex128)
    for t in range(a.shape[0]):
        h = a[t] * h + b[t]
        out[t] = h
    return out


def _scanweaver(a, b):
    import scanweaver as sw

    return lambda: sw.linear_scan(a, b, axis=0, backend="cpu")


def _jax(a, b):
    import jax
    import jax.numpy as jnp

    def combine(x, y):  # (a1, b1) then (a2, b2): (a1 a2, a2 b1 + b2)
        return x[0] * y[0], y[0] * x[1] + y[1]

    scan = jax.jit(lambda aa, bb: jax.lax.associative_scan(combine, (aa, bb), axis=0)[1])
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    return lambda: np.asarray(scan(ja, jb).block_until_ready())


def _torch(a, b):
    import torch

    ta, tb = torch.from_numpy(a), torch.from_numpy(b)

    def run():
        h = torch.zeros(a.shape[1], dtype=torch.complex64)
        out = torch.empty_like(tb)
        for t in range(a.shape[0]):
            h = ta[t] * h + tb[t]
            out[t] = h
        return out.numpy()

    return run


def _numpy(a, b):
    def run():
        h = np.zeros(a.shape[1], np.complex64)
        out = np.empty_like(b)
        for t in range(a.shape[0]):
            h = a[t] * h + b[t]
            out[t] = h
        return out

    return run


PEERS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "scanweaver-cpu": (_scanweaver, ()),
    "jax-assoc-scan": (_jax, ("jax",)),
    "torch-loop": (_torch, ("torch",)),
    "numpy-loop": (_numpy, ()),
}


def _time(run: Callable[[], Any], reps: int, budget_s: float) -> tuple[list[float], Any]:
    result = run()  # warm-up (and the JIT compile of the jitted peers)
    times: list[float] = []
    while len(times) < reps and (len(times) < 3 or sum(times) < budget_s):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return times, result


def run_lru(full: bool = False, reps: int = 9, budget_s: float = 1.0,
            progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Every case with every available peer: median seconds, max relative error."""
    skipped = {name: f"{mod} is not installed (pip install .[bench])"
               for name, (_, mods) in PEERS.items() for mod in mods if importlib.util.find_spec(mod) is None}
    for name, why in skipped.items():
        progress(f"skip lru/{name}: {why}")
    cases = []
    for L, N in lru_cases(full):
        a, b = lru_inputs(L, N)
        ref = lru_reference(a, b)
        scale = np.abs(ref).max()
        entry: dict[str, Any] = {"L": L, "N": N, "results": {}}
        for name, (setup, _) in PEERS.items():
            if name in skipped:
                continue
            times, out = _time(setup(a, b), reps, budget_s)
            err = float(np.abs(np.asarray(out) - ref).max() / scale)
            entry["results"][name] = {"median_s": float(np.median(times)), "min_s": float(min(times)),
                                      "reps": len(times), "max_rel_error": err}
            progress(f"  lru L={L} N={N} {name}: {np.median(times) * 1e3:.2f} ms (err {err:.1e})")
        sw_t = entry["results"].get("scanweaver-cpu", {}).get("median_s")
        entry["speedup_vs"] = {n: r["median_s"] / sw_t for n, r in entry["results"].items()
                               if sw_t and n != "scanweaver-cpu"}
        cases.append(entry)
    return {"workload": "lru", "dtype": "complex64", "skipped_peers": skipped, "cases": cases}


def markdown(result: dict[str, Any]) -> str:
    names = list(PEERS)
    lines = ["# LRU benchmark (complex diagonal recurrence)", "",
             "Generated by `python -m scanweaver.bench.lru` (do not edit by hand): median ms per call,",
             "complex64 inputs (L, N), lam broadcast to (L, N); in brackets the speed-up of ScanWeaver",
             "over the peer.", "",
             "| L | N | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for case in result["cases"]:
        cells = []
        for n in names:
            r = case["results"].get(n)
            if r is None:
                cells.append("skipped")
                continue
            ratio = case["speedup_vs"].get(n)
            cells.append(f"{r['median_s'] * 1e3:.2f}" + (f" ({ratio:.1f}x)" if ratio else ""))
        lines.append(f"| {case['L']} | {case['N']} | " + " | ".join(cells) + " |")
    for n, why in result["skipped_peers"].items():
        lines.append(f"\n{n} skipped: {why}")
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out_dir: Path, name: str) -> Path:
    (out_dir / "results").mkdir(parents=True, exist_ok=True)
    path = out_dir / "results" / f"lru-{name}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / "lru.md").write_text(markdown(result))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scanweaver.bench.lru", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="also the long cases")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--name", default=None, help="results name (default: cpu-short / cpu-full)")
    args = parser.parse_args(argv)
    result = run_lru(full=args.full)
    path = write(result, args.out, args.name or f"cpu-{'full' if args.full else 'short'}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
