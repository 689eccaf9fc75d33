"""The CPU goals of issue 16, measured by the harness in the same run as the peers.

Each function returns a JSON-ready dict; `plots.readme_text` renders them.
  stream_roofline   all cores read two arrays and write one (numba prange): the
                    bandwidth a scan (read a and b, write h) can at best reach
  tiny_call         the per-call cost of linear_scan on 4 x 64, beside a numba call
  neighbours        ScanWeaver alternating with PyTorch / numba prange / JAX calls:
                    each one's median against its own solo median
  first_call        a new process's first linear_scan and selective_scan, cold (empty
                    disk cache) and warm, with the import time apart
  peak_memory       extra memory (tracemalloc: numpy reports its buffers) beyond the output
  fma_exp_roofline  a vectorised exp + multiply-add microbenchmark (the selective
                    kernel's exp, compiled; per core x cores): the compute roofline of
                    the selective scan's update
Timings are medians of interleaved rounds where two things are compared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np


def _median_time(fn: Callable[[], Any], reps: int, inner: int = 1) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - start) / inner)
    return float(np.median(times))


# ---------------------------------------------------------------------------
# Streaming roofline
# ---------------------------------------------------------------------------

_KERNELS: dict[str, Any] = {}


def _numba_add():
    """o = a + b over all cores (numba prange): two arrays read, one written."""
    if "add" not in _KERNELS:
        import numba

        @numba.njit(parallel=True, fastmath=True, cache=False)
        def add(a, b, o):
            for i in numba.prange(a.shape[0]):
                o[i] = a[i] + b[i]

        _KERNELS["add"] = add
    return _KERNELS["add"]


def stream_roofline(nbytes: int = 48 << 20, reps: int = 9) -> dict[str, Any]:
    """Bytes moved (2 read + 1 written arrays of nbytes/3 each) over the median time."""
    n = max(1, nbytes // 12)
    a = np.random.default_rng(1).random(n, dtype=np.float32)
    b, o = a.copy(), np.empty_like(a)
    try:
        add = _numba_add()
        add(a, b, o)
        how = "numba prange o = a + b (all cores)"
        run = lambda: add(a, b, o)  # noqa: E731
    except ImportError:
        how = "numpy np.add(a, b, out=o) (one core: numba missing)"
        run = lambda: np.add(a, b, out=o)  # noqa: E731
    run()
    times = [_median_time(run, 1) for _ in range(reps)]
    med, best = float(np.median(times)), float(min(times))
    moved = 3 * a.nbytes
    return {"how": how, "bytes": moved, "median_s": med, "gbs": moved / med / 1e9, "gbs_best": moved / best / 1e9}


# ---------------------------------------------------------------------------
# Tiny calls
# ---------------------------------------------------------------------------


def tiny_call(shape: tuple[int, int] = (4, 64), inner: int = 2000, rounds: int = 15) -> dict[str, Any]:
    """Per-call time of linear_scan on a tiny input, interleaved with a numba @njit
    scan of the same shape (allocating its output like linear_scan)."""
    import scanweaver as sw

    rng = np.random.default_rng(2)
    a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    calls: dict[str, Callable[[], Any]] = {"scanweaver linear_scan": lambda: sw.linear_scan(a, b)}
    try:
        import numba

        @numba.njit(fastmath=True, cache=False)
        def scan(a, b):
            h = np.empty_like(a)
            for c in range(a.shape[0]):
                s = np.float32(0.0)
                for t in range(a.shape[1]):
                    s = a[c, t] * s + b[c, t]
                    h[c, t] = s
            return h

        scan(a, b)
        calls["numba @njit call"] = lambda: scan(a, b)
    except ImportError:
        pass
    sw.linear_scan(a, b)
    times: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(rounds):
        for k, fn in calls.items():
            times[k].append(_median_time(fn, 1, inner))
    out = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
    return {"shape": list(shape), "us_per_call": out, "target_us": 5.0}


# ---------------------------------------------------------------------------
# Neighbours
# ---------------------------------------------------------------------------


def _neighbour_calls(a: np.ndarray) -> dict[str, Callable[[], Any]]:
    """Work another library does between ScanWeaver's calls, on its own threads."""
    calls: dict[str, Callable[[], Any]] = {}
    try:
        import torch

        ta = torch.from_numpy(a.copy())
        tb = torch.from_numpy(a.copy())
        calls["torch ops (a * b + a, tanh)"] = lambda: torch.tanh(ta * tb + ta)
    except ImportError:
        pass
    try:
        add = _numba_add()
        fa, fb = a.ravel().copy(), a.ravel().copy()
        fo = np.empty_like(fa)
        add(fa, fb, fo)
        calls["numba prange (o = a + b)"] = lambda: add(fa, fb, fo)
    except ImportError:
        pass
    try:
        import jax
        import jax.numpy as jnp

        ja = jnp.asarray(a)
        jf = jax.jit(lambda x: jnp.tanh(x * x + x))
        jf(ja).block_until_ready()
        calls["jax jit (tanh(x * x + x))"] = lambda: jf(ja).block_until_ready()
    except ImportError:
        pass
    return calls


def neighbours(shape: tuple[int, int] = (1024, 4096), rounds: int = 15) -> dict[str, Any]:
    """Median of each alone and alternating (ScanWeaver call, neighbour call, ...)."""
    import scanweaver as sw
    from scanweaver.runtime.cpu_parallel import neighbour_policy

    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.0, shape).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, shape).astype(np.float32)
    scan = lambda: sw.linear_scan(a, b)  # noqa: E731
    scan()
    # ScanWeaver before any neighbour's call of this goal: on its own runtime (the
    # rows' solo times may run on a neighbour's threads, `cpu_parallel.neighbour_policy`)
    alone = float(np.median([_median_time(scan, 3) for _ in range(rounds)]))
    out: dict[str, Any] = {"shape": list(shape), "limits": {"scanweaver": 1.2, "neighbour": 1.1}, "rows": {},
                           "scanweaver_alone_s": alone}
    for name, other in _neighbour_calls(a).items():
        other()
        solo_sw, solo_other, mixed_sw, mixed_other = [], [], [], []
        for _ in range(rounds):
            solo_sw.append(_median_time(scan, 3))
            solo_other.append(_median_time(other, 3))
            for _ in range(3):
                start = time.perf_counter()
                scan()
                mid = time.perf_counter()
                other()
                mixed_sw.append(mid - start)
                mixed_other.append(time.perf_counter() - mid)
        row = {"scanweaver_solo_s": float(np.median(solo_sw)), "scanweaver_mixed_s": float(np.median(mixed_sw)),
               "neighbour_solo_s": float(np.median(solo_other)), "neighbour_mixed_s": float(np.median(mixed_other))}
        row["scanweaver_slowdown"] = row["scanweaver_mixed_s"] / row["scanweaver_solo_s"]
        row["neighbour_slowdown"] = row["neighbour_mixed_s"] / row["neighbour_solo_s"]
        row["met"] = row["scanweaver_slowdown"] <= 1.2 and row["neighbour_slowdown"] <= 1.1
        row["scanweaver_policy"] = neighbour_policy()
        out["rows"][name] = row
    return out


# ---------------------------------------------------------------------------
# First call in a new process
# ---------------------------------------------------------------------------

# The inputs of each first call, made before it is timed (sys.argv[1]: which call).
_FIRST_CALL_INPUTS = r"""
rng = np.random.default_rng(0)
if what == "linear_scan":
    a = rng.uniform(0.5, 1, (64, 1024)).astype(np.float32); b = rng.standard_normal((64, 1024)).astype(np.float32)
else:
    bt, D, N, L = 1, 64, 16, 256
    u, dl = rng.standard_normal((bt, D, L)).astype(np.float32), rng.uniform(0, .1, (bt, D, L)).astype(np.float32)
    A = -rng.uniform(.5, 2, (D, N)).astype(np.float32)
    B, C = rng.standard_normal((bt, N, L)).astype(np.float32), rng.standard_normal((bt, N, L)).astype(np.float32)
"""
_FIRST_CALLS = {"linear_scan": "sw.linear_scan(a, b)", "selective_scan": "sw.selective_scan(u, dl, A, B, C)"}

_FIRST_CALL = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import scanweaver as sw
t2 = time.perf_counter()
what, inputs, call = sys.argv[1:4]
exec(inputs)
t3 = time.perf_counter()
exec(call)
t4 = time.perf_counter()
print(json.dumps({"import_numpy_s": t1 - t0, "import_scanweaver_s": t2 - t1, "first_call_s": t4 - t3,
                  "total_s": t4 - t0 - (t3 - t2)}))
"""


def _one_process(what: str, cache_dir: str, bytecode_in_cache_dir: bool = True) -> dict[str, Any]:
    # Bytecode caches as a user's install has them (written under the temporary
    # folder, not in the source tree), even where this process runs without them.
    # bytecode_in_cache_dir=False: the bytecode already next to the sources (what pip
    # compiles at install time) is used instead.
    env = dict(os.environ, SCANWEAVER_CACHE_DIR=cache_dir)
    if bytecode_in_cache_dir:
        env["PYTHONPYCACHEPREFIX"] = os.path.join(cache_dir, "pyc")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("SCANWEAVER_TIERED", None)  # the default a user gets (the harness turns tiers off for itself)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _FIRST_CALL, what, _FIRST_CALL_INPUTS, _FIRST_CALLS[what]],
                          capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_wall_s"] = wall
    return row


# The same first call under cProfile (another cold process: the profiler slows Python
# code, so the timed rows above run without it): the profiled seconds of `import
# scanweaver` + the call, by where they were spent (each function's own time, so the
# stages add up to the whole), and the call's heaviest packages loaded.
_BREAKDOWN = r"""
import cProfile, json, pstats, sys
import numpy as np
what, inputs, call = sys.argv[1:4]
exec(inputs)
profile = cProfile.Profile()
profile.enable()
import scanweaver as sw
exec(call)
profile.disable()
from scanweaver.bench.cpu_goals import first_call_stage
stages = {}
for (path, _, function), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
    stage = first_call_stage(path, function)
    stages[stage] = stages.get(stage, 0.0) + own
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"xdsl", "llvmlite", "numba", "torch", "jax"})
print(json.dumps({"stages_s": stages, "profiled_s": sum(stages.values()), "packages": heavy}))
"""

#: (stage, test on (file, function) of the profiled function) in order: the first that matches.
FIRST_CALL_STAGES: list[tuple[str, Callable[[str, str], bool]]] = [
    ("compiling Python sources to bytecode", lambda p, f: f == "<built-in method builtins.compile>"),
    ("xDSL (its import, IR building, passes, printing)", lambda p, f: "/xdsl/" in p),
    ("LLVM through llvmlite (its import, optimisation, code generation)", lambda p, f: "/llvmlite/" in p),
    ("waiting for subprocesses (mlir-opt, mlir-translate, ld)",
     lambda p, f: any(w in f for w in ("'poll' of 'select.poll'", "posix.waitpid", "fork_exec", "posix.read"))),
    ("loading native libraries and extension modules",
     lambda p, f: any(w in f for w in ("exec_dynamic", "create_dynamic", "dlopen")) or p.endswith("ctypes/__init__.py")),
    ("ScanWeaver's own Python (IR text, keys, the call)", lambda p, f: "/scanweaver/" in p),
    ("the import machinery (finding, reading, running modules)",
     lambda p, f: "importlib" in p or p.startswith("<frozen") or f in ("<built-in method builtins.exec>",
                                                                       "<built-in method marshal.loads>")),
]


def first_call_stage(path: str, function: str) -> str:
    """The stage a profiled function's own time belongs to (FIRST_CALL_STAGES)."""
    for stage, test in FIRST_CALL_STAGES:
        if test(path, function):
            return stage
    return "other (numpy, the standard library, the disk cache's files)"


def _breakdown_process(what: str) -> dict[str, Any]:
    """Where a cold first call's time goes: a new process on an empty disk cache with
    no bytecode, the call under cProfile."""
    with tempfile.TemporaryDirectory(prefix="scanweaver-first-call-") as cache:
        env = dict(os.environ, SCANWEAVER_CACHE_DIR=cache, PYTHONPYCACHEPREFIX=os.path.join(cache, "pyc"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.pop("SCANWEAVER_TIERED", None)
        done = subprocess.run([sys.executable, "-c", _BREAKDOWN, what, _FIRST_CALL_INPUTS, _FIRST_CALLS[what]],
                              capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_call() -> dict[str, Any]:
    """Cold: a fresh disk cache; warm: the best of 3 later processes on the same cache
    (Python's bytecode caches are written by the cold process and used by the warm ones).
    Also, for information: cold with the bytecode an installed package already has
    (a fresh disk cache, but no module compiled to bytecode in the process)."""
    out: dict[str, Any] = {"targets_s": {"cold": 1.0, "warm": 0.05}, "rows": {}}
    with tempfile.TemporaryDirectory(prefix="scanweaver-first-call-") as cache:
        for what in ("linear_scan", "selective_scan"):
            cold = _one_process(what, cache)
            warms = [_one_process(what, cache) for _ in range(3)]
            ok = [w for w in warms if "error" not in w]
            warm = min(ok, key=lambda w: w["first_call_s"] + w["import_scanweaver_s"]) if ok else warms[0]
            with tempfile.TemporaryDirectory(prefix="scanweaver-first-call-") as fresh:
                installed = _one_process(what, fresh, bytecode_in_cache_dir=False)
            out["rows"][what] = {"cold": cold, "warm": warm, "cold_installed_bytecode": installed}
            out.setdefault("breakdown", {})[what] = _breakdown_process(what)
    return out


# ---------------------------------------------------------------------------
# Peak extra memory
# ---------------------------------------------------------------------------


def _peak_extra(fn: Callable[[], Any]) -> tuple[int, int]:
    """(peak bytes allocated during fn beyond what was live before, bytes of its result)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    arrays = result if isinstance(result, tuple) else (result,)
    return peak - base, int(sum(np.asarray(x).nbytes for x in arrays))


def peak_memory(elements: int = 1 << 24) -> dict[str, Any]:
    import scanweaver as sw

    rng = np.random.default_rng(4)
    C = 64
    L = elements // C
    a = rng.uniform(0.5, 1.0, (C, L)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (C, L)).astype(np.float32)
    at, bt = np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    bt_, D, N, Ls = 1, 256, 16, 2048
    u = rng.standard_normal((bt_, D, Ls)).astype(np.float32)
    dl = rng.uniform(0, 0.1, (bt_, D, Ls)).astype(np.float32)
    A = -rng.uniform(0.5, 2, (D, N)).astype(np.float32)
    B = rng.standard_normal((bt_, N, Ls)).astype(np.float32)
    Cm = rng.standard_normal((bt_, N, Ls)).astype(np.float32)
    cases: dict[str, Callable[[], Any]] = {
        f"linear_scan f32 ({C}, {L}), axis=-1": lambda: sw.linear_scan(a, b),
        f"linear_scan f32 ({L}, {C}), axis=0": lambda: sw.linear_scan(at, bt, axis=0),
        f"linear_scan f16 ({C}, {L}) (f32 result)": lambda: sw.linear_scan(a16, b16),
        f"selective_scan ({bt_}, {D}, {N}, {Ls})": lambda: sw.selective_scan(u, dl, A, B, Cm),
    }
    from scanweaver.runtime.cpu_scan import SEGMENT_ELEMENTS

    staging = 3 * SEGMENT_ELEMENTS * 4  # three f32 segment buffers, whatever the input size
    rows = {}
    # The large-output cache (runtime/cpu_variants.py) off: every call allocates its result.
    saved, os.environ["SCANWEAVER_OUTPUT_CACHE_MB"] = os.environ.get("SCANWEAVER_OUTPUT_CACHE_MB"), "0"
    try:
        measured = {}
        for name, fn in cases.items():
            fn()  # compile outside the measurement
            measured[name] = _peak_extra(fn)
    finally:
        if saved is None:
            del os.environ["SCANWEAVER_OUTPUT_CACHE_MB"]
        else:
            os.environ["SCANWEAVER_OUTPUT_CACHE_MB"] = saved
    for name, (extra, result) in measured.items():
        # The goals: selective_scan's peak extra memory stays at the output size
        # (5% slack); axis=0 and f16 make no full-size transposed or widened copy (at
        # most the three staging segments, a fixed size far below the input's).
        allowed = result // 20 + (staging if "axis=0" in name or "f16" in name else 0)
        rows[name] = {"peak_bytes": extra, "result_bytes": result, "extra_over_result": extra - result,
                      "allowed_extra_bytes": allowed}
    return {"rows": rows, "note": "tracemalloc peak during the call minus what was live before it; goals: the "
                                  "peak stays at the output size (allowed beyond the result: 5% of it), and "
                                  "linear_scan axis=0 and f16 inputs make no full-size transposed or widened "
                                  f"copy (allowed in addition: the three staging segments, {staging / 1e6:.1f} MB at any size)"}


# ---------------------------------------------------------------------------
# Compute roofline of the selective scan's state update
# ---------------------------------------------------------------------------


def fma_exp_roofline(n: int = 1 << 11, reps: int = 21) -> dict[str, Any]:
    """exp(d * a) * h + x per element on cache-resident arrays, compiled with the exp
    the selective kernel takes (`cpu_selective_exp.state_update_kernel`, one core),
    times the core count: the rate the vector units give the selective scan's
    per-(channel, state, step) update when nothing else limits it (numpy's exp, four
    passes over the arrays, ran slower than the scan itself: no roofline)."""
    from scanweaver.runtime.cpu_scan import num_threads
    from scanweaver.runtime.cpu_selective_exp import state_update_kernel

    rng = np.random.default_rng(5)
    d = rng.uniform(0, 0.1, n).astype(np.float32)
    a = -rng.uniform(0.5, 2, n).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    h = np.zeros(n, np.float32)
    kernel, sweeps = state_update_kernel(), 200

    def update() -> None:
        kernel(d, a, x, h, sweeps)

    update()
    per_core = n * sweeps / _median_time(update, reps, inner=2)
    cores = num_threads()
    return {"how": f"compiled exp(d * a) * h + x with the kernel's exp, {sweeps} sweeps over {n} "
                   f"cache-resident f32, one core, x {cores} cores",
            "updates_per_s": per_core * cores, "updates_per_s_one_core": per_core}


GOALS = ("tiny_call", "neighbours", "first_call", "peak_memory", "fma_exp_roofline")


def main(argv: list[str] | None = None) -> int:
    """`python -m scanweaver.bench.cpu_goals GOAL...`: those goals alone, as JSON, in the
    harness's order of events: the peers' libraries imported (where installed), then the
    streaming roofline (numba prange code), then ScanWeaver."""
    import argparse
    import importlib

    parser = argparse.ArgumentParser(prog="python -m scanweaver.bench.cpu_goals", description=main.__doc__)
    parser.add_argument("goals", nargs="+", choices=GOALS)
    args = parser.parse_args(argv)
    for module in ("torch", "jax", "numba"):  # as the harness's peer checks do
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    out: dict[str, Any] = {"stream_roofline": stream_roofline()}
    for name in args.goals:
        out[name] = globals()[name]()
    print(json.dumps(out, indent=1))
    return 0


__all__ = ["GOALS", "first_call", "fma_exp_roofline", "main", "neighbours", "peak_memory", "stream_roofline",
           "tiny_call"]

if __name__ == "__main__":
    sys.exit(main())
