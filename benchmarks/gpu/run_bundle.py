"""Run the GPU check bundle on a GPU machine, with the system Python.

    python3 benchmarks/gpu/run_bundle.py [--bundle benchmarks/gpu/bundle] [--json OUT.json]
                                         [--cases NAME ...] [--reps 20] [--dry-run]

Needs numpy and one CUDA driver binding (cuda-python, numba-cuda or numba); uses torch
and Triton for peers when they are there.  Imports ScanWeaver's runtime from this
checkout (numpy only: no xDSL, no MLIR tools).  For every case of `cases.json`:

1. check: inputs from a fixed seed, outputs pre-filled with NaN (integers: 0x5A5A5A5A),
   the artifact's function run on device arrays, every output compared with a float64
   reference computed here (integers bit for bit; floats: max |error| / max |reference|
   within the case's tolerance; an unwritten element stays NaN and fails);
2. time (cases marked `time`): CUDA events around repeated launches of the case's
   kernels on device-resident arrays, against a device-to-device copy moving the same
   bytes (the case's minimal traffic: inputs read once, outputs written once) and the
   peers present: a torch loop over time, torch.cumsum where it is exact (integers), and
   Triton `tl.associative_scan` (affine f32, one program per channel).

Writes JSON (default benchmarks/results/gpu-check.json) that `scanweaver.bench`'s
README generator shows.  `--dry-run` (for machines without a GPU, with a fake driver)
loads every artifact and launches every kernel once, checks nothing and times nothing;
it skips the case whose arrays exceed 2^31 bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from scanweaver.runtime.cuda import CudaFunction, CudaModule, device_chip, launch, launch_arguments  # noqa: E402
from scanweaver.runtime.cuda_artifact import plan, read_artifact  # noqa: E402
from scanweaver.runtime.cuda_driver import open_driver  # noqa: E402
from scanweaver.workloads.reference import iir2_reference, selective_scan_reference  # noqa: E402

try:  # Triton peer (optional)
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - any import problem: no Triton peer
    triton = None

if triton is not None:

    @triton.jit
    def _affine_combine(a1, b1, a2, b2):
        return a1 * a2, a2 * b1 + b2

    @triton.jit
    def _triton_affine(A, B, H, L: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, L)
        a = tl.load(A + row * L + offs)
        b = tl.load(B + row * L + offs)
        _, h = tl.associative_scan((a, b), 0, _affine_combine)
        tl.store(H + row * L + offs, h)


NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}
TOLERANCE = {"f32": 1e-3, "f64": 1e-9}
INT_FILL = 0x5A5A5A5A

# ------------------------------------------------------------------------ inputs


def make_inputs(case: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    ins = {a["name"]: a for a in case["args"] if a["role"] in ("in", "inout")}
    out: dict[str, np.ndarray] = {}
    for name, a in ins.items():
        shape, dtype = tuple(a["shape"]), NP[a["dtype"]]
        if name == "mask":  # masked updates: about half the steps update
            out[name] = rng.integers(0, 2, size=shape, dtype=dtype)
            continue
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            out[name] = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
            continue
        x = rng.random(shape, dtype=np.float32 if dtype == np.float32 else np.float64)
        fam = case["family"]
        if fam in ("affine", "generic") and name in ("a", "x0"):
            x = 0.5 + 0.5 * x  # decaying coefficients
        elif fam == "selective":
            x = {"A": -(0.5 + 2 * x), "delta": 0.1 * x, "delta_bias": -1 + 0.5 * x}.get(name, 2 * x - 1)
        elif fam == "linear_recurrence":
            x = {"c1": 1.8 * x - 0.9, "c2": -0.5 * x}.get(name, 2 * x - 1)  # a stable filter
        elif fam in ("dynamic_state", "masked") and name == "a":
            x = 0.5 + 0.45 * x  # decaying coefficients
        elif fam == "multilag" and name == "a":
            x = np.array([0.5, -0.2, 0.1]) * (0.5 + 0.5 * x)  # sum |a| < 1: a stable filter
        else:
            x = 2 * x - 1
        out[name] = np.ascontiguousarray(x, dtype=dtype)
    return out


def prefilled(a: dict) -> np.ndarray:
    shape, dtype = tuple(a["shape"]), NP[a["dtype"]]
    fill = INT_FILL if np.issubdtype(dtype, np.integer) else np.nan
    return np.full(shape, fill, dtype)


# ---------------------------------------------------------------------- references


def _affine_ref(a, b, init=None, reverse=False, rows=None):
    integer = np.issubdtype(a.dtype, np.integer)
    if rows is not None:
        a, b = a[-rows:], b[-rows:]
        init = None if init is None else init[-rows:]
    work = a.dtype if integer else np.float64
    s = np.zeros(a.shape[0], work) if init is None else init.astype(work)
    h = np.empty(a.shape, work)
    steps = range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])
    with np.errstate(over="ignore"):
        for t in steps:
            s = a[:, t].astype(work) * s + b[:, t]
            h[:, t] = s
    return h, s


def reference(case: dict, x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    fam = case["family"]
    if fam == "affine":
        rows = case.get("check_rows")
        h, final = _affine_ref(x["a"], x["b"], x.get("init"), case.get("reverse", False), rows)
        return {"h": h, "final": final}
    if fam == "generic":
        if case["combine"] == "cumsum_i32":
            return {"y0": np.cumsum(x["x0"], axis=1, dtype=np.int32)}
        A, B = x["x0"].astype(np.float64), x["x1"].astype(np.float64)
        ya, yb = np.empty_like(A), np.empty_like(B)
        pa, pb = A[:, 0].copy(), B[:, 0].copy()
        ya[:, 0], yb[:, 0] = pa, pb
        for t in range(1, A.shape[1]):
            pa, pb = pa * A[:, t], A[:, t] * pb + B[:, t]
            ya[:, t], yb[:, t] = pa, pb
        return {"y0": ya, "y1": yb}
    if fam == "selective":
        out, last = selective_scan_reference(
            x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"], delta_bias=x["delta_bias"],
            delta_softplus=True, return_last_state=True,
        )
        return {"out": out, "last_state": last}
    if fam == "linear_recurrence":
        return {"y": iir2_reference(x["x"], x["c1"], x["c2"])}
    if fam == "dynamic_state":  # h[c] = a[c] h[c] + x[t, c], every step stored
        xs, h = x["x"].astype(np.float64), x["h"].astype(np.float64)
        y = np.empty_like(xs)
        for t in range(xs.shape[0]):
            h = x["a"] * h + xs[t]
            y[t] = h
        return {"y": y, "h": h}
    if fam == "multilag":  # y[t] = a1 y[t-1] + a2 y[t-2] + a3 y[t-3] + x[t] from t = 3
        y = x["y"].astype(np.float64).tolist()
        a1, a2, a3 = (float(v) for v in x["a"])
        xs = x["x"].astype(np.float64).tolist()
        for t in range(3, len(y)):
            y[t] = a1 * y[t - 1] + a2 * y[t - 2] + a3 * y[t - 3] + xs[t]
        return {"y": np.array(y)}
    if fam == "masked":  # if mask[c, t]: h = a h + x; y[c, t] = h; final h to hs
        h = x["hs"].astype(np.float64)
        xs, a, m = x["x"].astype(np.float64), x["a"].astype(np.float64), x["mask"] != 0
        y = np.empty_like(xs)
        for t in range(xs.shape[1]):
            h = np.where(m[:, t], a[:, t] * h + xs[:, t], h)
            y[:, t] = h
        return {"y": y, "hs": h}
    raise ValueError(f"unknown family {fam}")


def compare(got: np.ndarray, want: np.ndarray, dtype: str, rows: int | None) -> dict:
    if rows is not None:
        got = got[-rows:]
    if np.issubdtype(got.dtype, np.integer):
        bad = int(np.count_nonzero(got != want))
        return {"ok": bad == 0, "mismatches": bad}
    scale = float(np.max(np.abs(want))) or 1.0
    err = float(np.max(np.abs(got.astype(np.float64) - want))) / scale if got.size else 0.0
    nan = int(np.count_nonzero(np.isnan(got)))
    return {"ok": bool(err <= TOLERANCE[dtype]) and nan == 0, "rel_error": err, "nan": nan,
            "tolerance": TOLERANCE[dtype]}


# -------------------------------------------------------------------------- timing


def time_events(driver, run, reps: int) -> float:
    """Median-free throughput: milliseconds per `run()` over `reps` back-to-back runs."""
    run()
    driver.synchronize()
    start, stop = driver.create_event(), driver.create_event()
    driver.record_event(start)
    for _ in range(reps):
        run()
    driver.record_event(stop)
    return driver.elapsed_ms(start, stop) / reps


def torch_peers(case: dict, x: dict[str, np.ndarray], want: dict[str, np.ndarray], reps: int) -> dict:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return {"torch": {"status": "skipped", "reason": f"torch not importable: {e}"}}
    if not torch.cuda.is_available():
        return {"torch": {"status": "skipped", "reason": "torch sees no GPU"}}
    peers: dict[str, dict] = {}

    def timed(name, fn, check):
        try:
            out = fn()
            torch.cuda.synchronize()
            verdict = check(out)
            if not verdict["ok"]:
                peers[name] = {"status": "wrong", **verdict}
                return
            fn()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(reps):
                fn()
            e.record()
            e.synchronize()
            peers[name] = {"status": "ok", "ms": s.elapsed_time(e) / reps, **verdict}
        except Exception as err:  # noqa: BLE001 - a failing peer is reported, not fatal
            peers[name] = {"status": "error", "reason": f"{type(err).__name__}: {err}"}

    fam = case["family"]
    dev = {k: torch.from_numpy(v).cuda() for k, v in x.items()}
    if fam == "affine" and not case.get("reverse") and "init" not in x:
        a, b = dev["a"], dev["b"]
        dtype = case["args"][0]["dtype"]

        def loop():
            h = torch.empty_like(b)
            s = torch.zeros_like(b[:, 0])
            for t in range(a.shape[1]):
                s = a[:, t] * s + b[:, t]
                h[:, t] = s
            return h

        timed("torch-loop", loop, lambda h: compare(h.cpu().numpy(), want["h"], dtype, None))
        if triton is not None and dtype == "f32" and a.shape[1] & (a.shape[1] - 1) == 0 and a.shape[1] <= 8192:
            def tri():
                h = torch.empty_like(b)
                _triton_affine[(a.shape[0],)](a, b, h, L=a.shape[1])
                return h

            timed("triton-associative-scan", tri, lambda h: compare(h.cpu().numpy(), want["h"], dtype, None))
        elif triton is None:
            peers["triton-associative-scan"] = {"status": "skipped", "reason": "triton not importable"}
    if fam == "generic" and case["combine"] == "cumsum_i32":
        x0 = dev["x0"]
        timed("torch-cumsum", lambda: torch.cumsum(x0, dim=1, dtype=torch.int32),
              lambda y: compare(y.cpu().numpy(), want["y0"], "i32", None))
    return peers


# ---------------------------------------------------------------------------- cases


class OffsetView:
    """A device array that starts `offset` elements into a larger buffer (a view such as
    `d[1:]`, off a 16-byte boundary): the kernels run it on their scalar path."""

    def __init__(self, driver, host: np.ndarray, offset: int):
        padded = np.concatenate([np.zeros(offset, host.dtype), host.reshape(-1)])
        self.whole, self.offset, self.shape, self.dtype = driver.to_device(padded), offset, host.shape, host.dtype
        self.__cuda_array_interface__ = {
            "shape": tuple(host.shape), "typestr": host.dtype.str, "strides": None, "version": 3,
            "data": (self.whole.buffer.ptr + offset * host.dtype.itemsize, False),
        }

    def to_host(self, driver) -> np.ndarray:
        return driver.to_host(self.whole)[self.offset :].reshape(self.shape)


def run_case(driver, bundle: Path, case: dict, reps: int, dry_run: bool) -> dict:
    entry: dict = {"name": case["name"], "family": case["family"], "ptxas": case.get("ptxas", {})}
    doc, image = read_artifact(bundle / case["artifact"])
    launches, counts = plan(doc)
    seq = launches[case["function"]]
    module = CudaModule(image, driver=driver)
    fn = CudaFunction(module, case["function"], seq, counts[case["function"]],
                      doc["functions"][case["function"]].get("contract"))
    rng = np.random.default_rng(0)
    x = make_inputs(case, rng)
    outs = {a["name"]: a for a in case["args"] if a["role"] in ("out", "inout")}
    off = case.get("view_offset_elements", 0)  # every array a view `off` elements into its buffer
    place = (lambda v: OffsetView(driver, v, off)) if off else driver.to_device
    dev_in = {k: place(v) for k, v in x.items()}
    # outputs start as NaN (or a fill integer); in/out arrays start as their inputs
    dev_out = {k: dev_in[k] if a["role"] == "inout" else place(prefilled(a)) for k, a in outs.items()}
    order = [dev_in.get(a["name"]) or dev_out[a["name"]] for a in case["args"]]
    fn(*order)
    scratch: dict = {}  # multi-block scans: scratch buffers (host_args < -1), allocated once here

    def args_of(d):
        return launch_arguments(driver, d, order, scratch)

    entry["launches"] = [
        {"kernel": d.kernel_name, "grid": list(d.resolve_grid({n: tuple(a.shape) for (n, *_), a in zip(d.args, args_of(d))})),
         "block": list(d.block), "static_shared_bytes": d.shared_bytes, "dynamic_shared_bytes": d.dynamic_shared_bytes}
        for d in seq
    ]
    if dry_run:
        entry["check"] = {"status": "dry-run", "reason": "launched on a fake driver: nothing checked"}
        return entry
    want = reference(case, x)
    fetch = (lambda d: d.to_host(driver)) if off else driver.to_host
    verdicts = {k: compare(fetch(dev_out[k]), want[k], outs[k]["dtype"], case.get("check_rows"))
                for k in outs if k in want}
    entry["check"] = {"status": "ok" if all(v["ok"] for v in verdicts.values()) else "wrong", "outputs": verdicts}
    if not case.get("time") or entry["check"]["status"] != "ok":
        return entry
    nbytes = sum(v.nbytes for v in x.values()) + sum(prefilled(a).nbytes for a in outs.values() if a["role"] == "out")

    def run():
        for d in seq:
            launch(module, d, args_of(d))

    sw_ms = time_events(driver, run, reps)
    half = max(nbytes // 2, 1)  # a copy of n bytes moves 2n (read + write)
    src, dst = driver.alloc(half), driver.alloc(half)
    copy_ms = time_events(driver, lambda: driver.copy_device(dst, src, half), reps)
    entry["timing"] = {
        "reps": reps, "scanweaver_ms": sw_ms, "min_bytes": nbytes, "gbs": nbytes / sw_ms / 1e6,
        "copy_ms": copy_ms, "copy_gbs": 2 * half / copy_ms / 1e6, "copy_fraction": copy_ms / sw_ms,
        "peers": torch_peers(case, x, want, max(1, reps // 4)),
    }
    return entry


def machine(driver) -> dict:
    info = {"python": platform.python_version(), "driver_binding": driver.name, "chip": device_chip(driver),
            "numpy": np.__version__}
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["torch"] = torch.__version__
    except Exception:  # noqa: BLE001
        pass
    if triton is not None:
        info["triton"] = triton.__version__
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", type=Path, default=HERE / "bundle")
    p.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "gpu-check.json")
    p.add_argument("--cases", nargs="*")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    listing = json.loads((args.bundle / "cases.json").read_text())
    driver = open_driver()
    started = time.perf_counter()
    result = {"format": "scanweaver-gpu-check", "version": 1, "dry_run": args.dry_run,
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(driver), "bundle_chip": listing["chip"], "cases": []}
    for case in listing["cases"]:
        if args.cases and case["name"] not in args.cases:
            continue
        if args.dry_run and case.get("check_rows"):
            result["cases"].append({"name": case["name"], "family": case["family"],
                                    "check": {"status": "skipped", "reason": "dry run: arrays over 2^31 bytes"}})
            continue
        t0 = time.perf_counter()
        try:
            entry = run_case(driver, args.bundle, case, args.reps, args.dry_run)
        except Exception as e:  # noqa: BLE001 - one failing case is reported, the rest still run
            entry = {"name": case["name"], "family": case["family"],
                     "check": {"status": "error", "reason": f"{type(e).__name__}: {e}"},
                     "traceback": traceback.format_exc(limit=4)}
        entry["wall_s"] = time.perf_counter() - t0
        t = entry.get("timing")
        print(f"[gpu-check] {case['name']}: {entry['check']['status']}"
              + (f", {t['scanweaver_ms']:.3f} ms, {100 * t['copy_fraction']:.0f}% of copy" if t else ""), flush=True)
        result["cases"].append(entry)
    result["elapsed_s"] = time.perf_counter() - started
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"[gpu-check] wrote {args.json}", flush=True)
    bad = [c["name"] for c in result["cases"] if c["check"]["status"] not in ("ok", "dry-run", "skipped")]
    if bad:
        print(f"[gpu-check] FAILED: {', '.join(bad)}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
