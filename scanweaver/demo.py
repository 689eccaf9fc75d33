"""`scanweaver demo`: the main job, end to end.

1. A small EMA written as a loop, shown after each compiler stage.
2. Mamba's selective scan written as plain loops (delta_bias, softplus, D skip, z
   gating), raised, lowered, compiled and run — on the GPU when one is usable, else
   on the CPU — checked against a float64 reference, then timed side by side against
   baselines that need nothing beyond ScanWeaver's own dependencies.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from scanweaver import compiler
from scanweaver.ir import print_ir


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# ------------------------------------------------------------------- part 1: the stages


def show_stages() -> None:
    from scanweaver.workloads.loops import ema_loops

    text = print_ir(ema_loops(2, 8))
    _say("== 1. An EMA written as a loop, through each stage (target=cpu) ==")
    lowered = compiler.lower(text, "cpu")
    for stage in lowered.stages:
        lines = stage.ir.strip().splitlines()
        shown = lines if len(lines) <= 40 else lines[:36] + [f"    ... ({len(lines) - 36} more lines)"]
        _say(f"\n-- after {stage.name} --")
        _say("\n".join(shown))
    llvm_ir, _ = compiler.cpu_llvm_ir(lowered.module)
    _say(f"\n-- LLVM IR: {len(llvm_ir.splitlines())} lines, JIT-compiled by llvmlite --\n")


# ------------------------------------------------------------- part 2: selective scan


def _inputs(batch: int, dim: int, length: int, n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = np.float32
    return {
        "u": rng.standard_normal((batch, dim, length)).astype(f),
        "delta": (0.5 * rng.standard_normal((batch, dim, length))).astype(f),
        "A": -np.exp(rng.standard_normal((dim, n))).astype(f),
        "B": rng.standard_normal((dim, n)).astype(f),
        "C": rng.standard_normal((dim, n)).astype(f),
        "D": rng.standard_normal(dim).astype(f),
        "z": rng.standard_normal((batch, dim, length)).astype(f),
        "delta_bias": (0.1 * rng.standard_normal(dim)).astype(f),
    }


def numpy_time_loop(x: dict[str, np.ndarray]) -> np.ndarray:
    """A hand-written float32 baseline: loop over time, vectorised over (batch, D, N)."""
    dt = x["delta"] + x["delta_bias"][None, :, None]
    dt = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))
    h = np.zeros(x["u"].shape[:2] + (x["A"].shape[1],), np.float32)
    y = np.empty_like(x["u"])
    for t in range(x["u"].shape[2]):
        d = dt[:, :, t, None]
        h = np.exp(d * x["A"]) * h + d * x["B"] * x["u"][:, :, t, None]
        y[:, :, t] = (h * x["C"]).sum(-1)
    y = y + x["D"][None, :, None] * x["u"]
    return y * (x["z"] / (1 + np.exp(-x["z"])))


def run_demo(quick: bool = False) -> int:
    from scanweaver import api
    from scanweaver.runtime.cuda import cuda_available, why_no_cuda
    from scanweaver.workloads.loops import selective_scan_loops
    from scanweaver.workloads.reference import selective_scan_reference

    show_stages()
    batch, dim, length, n = (1, 16, 256, 16) if quick else (1, 256, 2048, 16)
    on_gpu = cuda_available()
    target = "cuda" if on_gpu else "cpu"
    _say(
        f"== 2. Mamba selective scan as loops: batch={batch} D={dim} L={length} N={n}, "
        "delta_bias + softplus + D + z =="
    )
    _say(f"target: {target}" + ("" if on_gpu else f" (no GPU: {why_no_cuda()})"))
    text = print_ir(selective_scan_loops(batch, dim, length, n))

    start = time.perf_counter()
    program = api.compile(text, target=target)
    first = time.perf_counter() - start
    start = time.perf_counter()
    api.compile(text, target=target)
    again = time.perf_counter() - start
    raised = program.stage_ir("scanweaver-raise")
    how = "from the compile cache" if program.cache_hit else "cold"
    _say(
        f"raise: {raised.count('scan.recurrence')} affine recurrence(s) found; "
        f"compile {first:.2f} s ({how}), then {again:.2f} s from the compile cache"
    )

    x = _inputs(batch, dim, length, n)
    args = [x[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")]
    out = np.empty_like(x["u"])

    def scanweaver_run() -> np.ndarray:
        program.selective_scan(*args, out)
        return out

    want = selective_scan_reference(
        x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"],
        delta_bias=x["delta_bias"], delta_softplus=True,
    )
    got = scanweaver_run()
    err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    ok = err < 1e-4
    _say(f"check against the float64 reference: max error {err:.2e} relative to max |out| "
         f"-> {'OK' if ok else 'WRONG'}")
    if not ok:
        return 1

    repeats = 3 if quick else 5
    rows = [("ScanWeaver (" + target + ", compiled from loops)", _median_ms(scanweaver_run, repeats))]

    def api_run() -> np.ndarray:
        return api.selective_scan(
            x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"],
            delta_bias=x["delta_bias"], delta_softplus=True, backend=target,
        )

    api_err = float(np.max(np.abs(api_run() - want)) / np.max(np.abs(want)))
    if api_err < 1e-4:
        rows.append(("scanweaver.selective_scan (" + target + " driver, all cores)", _median_ms(api_run, repeats)))
    else:
        _say(f"scanweaver.selective_scan: max error {api_err:.2e} -> WRONG, not timed")
        ok = False
    base = numpy_time_loop(x)
    if np.max(np.abs(base - want)) / np.max(np.abs(want)) < 1e-3:
        rows.append(("NumPy loop over time, vectorised over D×N", _median_ms(lambda: numpy_time_loop(x), repeats)))
    rows.append((
        "float64 NumPy reference (loop over time)",
        _median_ms(lambda: selective_scan_reference(
            x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"],
            delta_bias=x["delta_bias"], delta_softplus=True), max(1, repeats // 2)),
    ))
    first = rows[0][1]
    _say(f"\n{'method':<54} {'median ms':>10} {'time / row 1':>13}")
    for name, ms in rows:
        _say(f"{name:<54} {ms:>10.2f} {ms / first:>12.2f}x")
    _say("\n(medians of repeated runs in this process; `scanweaver bench` runs the full comparison)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_demo(quick="--quick" in sys.argv))
