"""Numerics of the parallel (reassociating) scan variants against the sequential loop.

    python -m scanweaver.bench.numerics [--cases N] [--seed S] [--out DIR] [--gpu-cases M]
    scanweaver bench --numerics

A seeded random set of cases (one case = one row h[t] = a[t]*h[t-1] + b[t], f32 and
f64, forward and reverse): growth (|a| > 1), decays near 1, alternating growth and
decay, denormal b, mixed signs, resets (a = 0), products that overflow or underflow
in a chunk, Inf/NaN inputs; lengths from 1 to long rows crossing chunk boundaries.
Each case runs three ways:

  seq    the sequential loop in the input precision (the `single` CPU variant, which is
         bit-identical to the loop)
  par    the parallel variant under test: `chunked` (time-parallel CPU) with small
         chunks forced (`cpu_chunked.CHUNKED_TEST_MIN_CHUNK`) so that short rows cross
         many chunk boundaries, or with the default chunks for long rows; and, on a
         smaller subset (rows of 1 to 96 steps), the GPU Blelloch kernels (`scan-to-gpu`,
         blocks of 8 threads x 2 items: 16-step tiles, so a row crosses several tiles and
         every tree level) in the thread-block simulator, which runs the kernel's own
         IR op by op in the input precision
  ref    a higher-precision reference: the loop in f64 for f32 inputs, in
         double-double (about 106 bits) for f64 inputs

Errors are measured at every step t in units of the sequential loop's rounding
scale u * m_t, where u is the unit roundoff of the input type and m_t the magnitude
recurrence m_t = |a_t| m_{t-1} + |a_t h_{t-1}| + |b_t| (the classic forward-error
bound of the loop is a small multiple of u * m_t): err = max_t |x_t - ref_t| / (u m_t).
A case passes when
  * par is finite wherever seq is finite, and
  * err(par) <= 2 * max(err(seq), 1): at most twice the sequential loop's own error,
    or one rounding unit where the sequential loop happens to be exact.
`run()` returns the summary; `main()` writes benchmarks/numerics.json and the table
benchmarks/numerics.md from it (nothing typed by hand).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KINDS = ("growth", "decay", "alternating", "denormal", "mixed", "resets", "overflow", "underflow", "specials")


# ---------------------------------------------------------------------------- cases


@dataclass
class Batch:
    """Rows of one dtype, direction and length (each row is one case)."""

    dtype: np.dtype
    reverse: bool
    kinds: list[str]
    a: np.ndarray
    b: np.ndarray
    h0: np.ndarray
    forced_chunk: int | None  # CHUNKED_TEST_MIN_CHUNK for this batch (None: default chunks)


def _row(rng: np.random.Generator, kind: str, L: int, dt: np.dtype, reverse: bool) -> tuple[np.ndarray, np.ndarray, float]:
    f32 = dt == np.float32
    tiny = np.finfo(dt).smallest_subnormal
    sign = rng.choice([-1.0, 1.0], L)
    b = rng.standard_normal(L)
    h0 = float(rng.standard_normal()) if rng.random() < 0.5 else 0.0
    if kind == "growth":
        a = sign * (1.0 + 10.0 ** rng.uniform(-4, -1, L)) if rng.random() < 0.5 else 1.0 + 10.0 ** rng.uniform(-4, -1.3, L)
        if rng.random() < 0.5:  # the pattern: zeros, then ones at the end
            b = np.zeros(L)
            b[-max(1, L // 50):] = 1.0
            h0 = 0.0
    elif kind == "decay":
        a = 1.0 - 10.0 ** rng.uniform(-7 if f32 else -12, -1, L)
    elif kind == "alternating":
        block = int(rng.integers(1, 64))
        up = (np.arange(L) // block) % 2 == 0
        g = rng.uniform(1.05, 2.0)
        a = np.where(up, g, rng.uniform(0.5, 1.0) / g)
        b = b * rng.choice([1.0, 1e-3, 1e3])
    elif kind == "denormal":
        a = np.ones(L) if rng.random() < 0.5 else rng.uniform(0.5, 1.0, L)
        b = tiny * rng.integers(1, 1 << 20, L) * rng.choice([1.0, -1.0, 1.0], L)
        h0 = 0.0 if rng.random() < 0.5 else float(tiny * rng.integers(1, 1000))
    elif kind == "mixed":
        a = rng.uniform(-1.2, 1.2, L)
    elif kind == "resets":
        a = rng.uniform(0.5, 1.5, L)
        a[rng.random(L) < 0.05] = 0.0
    elif kind == "overflow":
        # Chunk products leave the exponent range; b mostly zero so the loop stays finite.
        top = 30 if f32 else 250
        a = sign * 10.0 ** rng.uniform(0.5, top / 8, L)
        b = np.where(rng.random(L) < 0.9, 0.0, b * 1e-30)
        h0 = 0.0
        r = rng.random()
        if r < 0.4:  # issue 10's pattern: constant growth, b = 0 until the last k steps
            # g large enough that products over a few steps (a chunk, a GPU subtree)
            # overflow: the loop never forms them
            top = 38 if f32 else 308
            lo = max(0.1, 1.2 * top / min(max(L, 1), 8))
            g = 10.0 ** rng.uniform(lo, lo + (1.5 if f32 else 8))
            a = np.full(L, g) * (sign if rng.random() < 0.3 else 1.0)
            k = int(np.clip(rng.integers(1, max(2, int(0.8 * top / np.log10(g)) + 1)), 1, L))
            b = np.zeros(L)
            if reverse:
                b[:k] = rng.standard_normal(k)
            else:
                b[L - k:] = rng.standard_normal(k)
        elif r < 0.7:
            b[: max(0, L - 8)] = 0.0
    elif kind == "underflow":
        # Products sink below the range, then are amplified back; h0 large.
        top = 30 if f32 else 250
        block = int(rng.integers(2, 16))
        down = (np.arange(L) // block) % 2 == 0
        a = np.where(down, 10.0 ** -rng.uniform(1, top / 4), 10.0 ** rng.uniform(1, top / 4))
        h0 = 10.0 ** rng.uniform(0, top)
        b = b * 10.0 ** rng.uniform(-top, 0)
    elif kind == "specials":
        a = rng.uniform(0.5, 1.1, L)
        n = max(1, L // 100)
        pos = rng.integers(0, L, n)
        vals = rng.choice([np.inf, -np.inf, np.nan], n)
        (a if rng.random() < 0.5 else b)[pos] = vals
    else:  # pragma: no cover
        raise ValueError(kind)
    with np.errstate(over="ignore", under="ignore"):
        return a.astype(dt), b.astype(dt), float(np.asarray(h0, dt))


def _lengths(rng: np.random.Generator, n: int, long_rows: bool, max_length: int | None = None) -> list[int]:
    if max_length is not None:
        return [int(x) for x in rng.integers(1, max_length + 1, n)]
    out = []
    for _ in range(n):
        r = rng.random()
        if long_rows and r < 0.1:
            out.append(int(rng.choice([1 << 13, 1 << 14, 1 << 15]) + rng.integers(-7, 8)))
        elif r < 0.2:
            out.append(int(rng.integers(1, 40)))
        else:
            out.append(int(rng.integers(40, 1500)))
    return out


def make_batches(n_cases: int, seed: int = 0, rows: int = 24, long_rows: bool = True,
                 max_length: int | None = None) -> list[Batch]:
    """About n_cases rows in batches of `rows`, all kinds, f32/f64, both directions."""
    rng = np.random.default_rng(seed)
    batches = []
    n_batches = max(1, -(-n_cases // rows))
    for i, L in enumerate(_lengths(rng, n_batches, long_rows, max_length)):
        dt = np.dtype(np.float32 if i % 2 == 0 else np.float64)
        reverse = bool((i // 2) % 2)
        kinds = [KINDS[int(k)] for k in rng.integers(0, len(KINDS), rows)]
        cols = [_row(rng, k, L, dt, reverse) for k in kinds]
        a = np.stack([c[0] for c in cols])
        b = np.stack([c[1] for c in cols])
        h0 = np.array([c[2] for c in cols], dt)
        forced = None if L >= (1 << 13) else int(rng.integers(1, 64))
        batches.append(Batch(dt, reverse, kinds, a, b, h0, forced))
    return batches


# ----------------------------------------------------------------------- references


def _reference_kernels():
    from numba import njit

    @njit(cache=False)
    def split(x):
        # Dekker's split, scaled for huge |x| so that it cannot overflow.
        big = abs(x) > 2.0**995
        y = x * 2.0**-28 if big else x
        t = 134217729.0 * y
        hi = t - (t - y)
        lo = y - hi
        if big:
            hi *= 2.0**28
            lo *= 2.0**28
        return hi, lo

    @njit(cache=False)
    def two_prod(x, y):
        p = x * y
        xh, xl = split(x)
        yh, yl = split(y)
        return p, ((xh * yh - p) + xh * yl + xl * yh) + xl * yl

    @njit(cache=False)
    def reference(a, b, h0, reverse, dd):
        """(ref, m): the loop in f64 (dd=False) or double-double, and the magnitude m_t."""
        C, L = a.shape
        ref = np.empty((C, L))
        mag = np.empty((C, L))
        for c in range(C):
            hh = np.float64(h0[c])
            hl = 0.0
            m = abs(hh)
            for i in range(L):
                t = L - 1 - i if reverse else i
                at = np.float64(a[c, t])
                bt = np.float64(b[c, t])
                m = abs(at) * m + abs(at * hh) + abs(bt)
                if dd:
                    p, e = two_prod(at, hh)
                    e += at * hl
                    s = p + bt
                    z = s - p
                    e += (p - (s - z)) + (bt - z)
                    hh = s + e
                    hl = e - (hh - s)
                    if not np.isfinite(hh):
                        hl = 0.0
                else:
                    hh = at * hh + bt
                ref[c, t] = hh
                mag[c, t] = m
        return ref, mag

    return reference


_REF = None


def reference(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    global _REF
    if _REF is None:
        _REF = _reference_kernels()
    with np.errstate(all="ignore"):
        return _REF(batch.a, batch.b, batch.h0, batch.reverse, batch.dtype == np.float64)


# ------------------------------------------------------------------------- checking


def scaled_error(x: np.ndarray, ref: np.ndarray, mag: np.ndarray, u: float) -> np.ndarray:
    """Per row: max_t |x - ref| / (u * m_t) over the steps where x and ref are finite."""
    with np.errstate(all="ignore"):
        x = x.astype(np.float64)
        ok = np.isfinite(x) & np.isfinite(ref) & np.isfinite(mag)
        diff = np.where(ok, np.abs(x - ref), 0.0)
        scale = u * mag
        units = np.where(diff == 0, 0.0, diff / np.where(scale > 0, scale, np.finfo(np.float64).tiny))
        return units.max(axis=1) if units.shape[1] else np.zeros(len(x))


def check_rows(par: np.ndarray, seq: np.ndarray, ref: np.ndarray, mag: np.ndarray, dtype: np.dtype) -> dict[str, np.ndarray]:
    u = float(np.finfo(dtype).eps) / 2
    with np.errstate(all="ignore"):
        bad_nonfinite = (np.isfinite(seq) & ~np.isfinite(par)).any(axis=1)
        class_mismatch = ((np.isnan(seq) != np.isnan(par)) | (np.isinf(seq) != np.isinf(par))).any(axis=1)
        identical = (par.view(np.uint8).reshape(len(par), -1) == seq.view(np.uint8).reshape(len(seq), -1)).all(axis=1)
    e_par = scaled_error(par, ref, mag, u)
    e_seq = scaled_error(seq, ref, mag, u)
    accurate = e_par <= 2.0 * np.maximum(e_seq, 1.0)
    return {"nonfinite": bad_nonfinite, "class_mismatch": class_mismatch, "identical": identical,
            "err_par": e_par, "err_seq": e_seq, "pass": accurate & ~bad_nonfinite}


def run_chunked(batch: Batch) -> np.ndarray:
    from scanweaver.runtime import cpu_chunked, cpu_scan

    old = cpu_chunked.CHUNKED_TEST_MIN_CHUNK
    cpu_chunked.CHUNKED_TEST_MIN_CHUNK = batch.forced_chunk
    try:
        return cpu_scan.affine_scan_cpu(batch.a, batch.b, batch.h0, reverse=batch.reverse, return_final=True,
                                        variant="chunked")[0]
    finally:
        cpu_chunked.CHUNKED_TEST_MIN_CHUNK = old


def run_sequential(batch: Batch) -> np.ndarray:
    from scanweaver.runtime.cpu_scan import affine_scan_cpu

    return affine_scan_cpu(batch.a, batch.b, batch.h0, reverse=batch.reverse, return_final=True, variant="single")[0]


def run_gpu_sim(batch: Batch) -> np.ndarray:
    """The GPU Blelloch kernels (`scan-to-gpu`, small blocks so that a row spans several
    blocks) in the thread-block simulator."""
    from xdsl.context import Context

    from scanweaver.interp.gpu_sim import simulate_launch
    from scanweaver.rewrites.blelloch_gpu import ScanToGpu
    from scanweaver.workloads.affine import affine_scan

    C, L = batch.a.shape
    el = "f32" if batch.dtype == np.float32 else "f64"
    module = affine_scan((C, L), 1, el, el, init=True, reverse=batch.reverse, name="f")
    module.verify()
    ScanToGpu(block_size=8, items_per_thread=2).apply(Context(), module)
    h = np.zeros((C, L), batch.dtype)
    with np.errstate(all="ignore"):
        simulate_launch(module, "f", batch.a.copy(), batch.b.copy(), batch.h0.copy(), h, race_check=False)
    return h


VARIANTS = {"cpu-chunked": run_chunked, "gpu-blelloch-sim": run_gpu_sim}


def evaluate(batches: list[Batch], variant: str) -> list[dict[str, Any]]:
    """One record per case (row)."""
    records = []
    for batch in batches:
        ref, mag = reference(batch)
        seq = run_sequential(batch)
        par = VARIANTS[variant](batch)
        res = check_rows(par, seq, ref, mag, batch.dtype)
        for r, kind in enumerate(batch.kinds):
            records.append({
                "variant": variant, "dtype": batch.dtype.name, "reverse": batch.reverse, "kind": kind,
                "length": int(batch.a.shape[1]), "chunk": batch.forced_chunk,
                **{k: (bool(v[r]) if v.dtype == bool else float(v[r])) for k, v in res.items()},
            })
    return records


# -------------------------------------------------------------------------- summary


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, dtype, kind): cases, failures, worst error ratios."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["variant"], r["dtype"], r["kind"]), []).append(r)
        groups.setdefault((r["variant"], r["dtype"], "all"), []).append(r)
    rows = []
    for (variant, dtype, kind), rs in sorted(groups.items()):
        ratio = [r["err_par"] / max(r["err_seq"], 1.0) for r in rs]
        rows.append({
            "variant": variant, "dtype": dtype, "kind": kind, "cases": len(rs),
            "fail": sum(not r["pass"] for r in rs),
            "nonfinite_where_seq_finite": sum(r["nonfinite"] for r in rs),
            "nan_inf_pattern_differs": sum(r["class_mismatch"] for r in rs),
            "bit_identical": sum(r["identical"] for r in rs),
            "max_err_seq": max(r["err_seq"] for r in rs),
            "max_err_par": max(r["err_par"] for r in rs),
            "max_ratio": max(ratio),
        })
    return rows


def run(n_cases: int = 10_000, seed: int = 0, gpu_cases: int = 0, long_rows: bool = True) -> dict[str, Any]:
    start = time.perf_counter()
    records = evaluate(make_batches(n_cases, seed, long_rows=long_rows), "cpu-chunked")
    if gpu_cases:
        # The simulator interprets every op: short rows only.
        small = make_batches(gpu_cases, seed + 1, rows=4, long_rows=False, max_length=96)
        records += evaluate(small, "gpu-blelloch-sim")
    return {"seed": seed, "cases": len(records), "seconds": time.perf_counter() - start,
            "summary": summarise(records), "records": records}


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def markdown(result: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        "# ScanWeaver numerics: parallel variants against the sequential loop",
        "",
        f"Generated by `python -m scanweaver.bench.numerics` (seed {result['seed']}, "
        f"{result['cases']} cases, {result['seconds']:.0f} s) on {meta['date']}. Do not edit by hand: rerun it.",
        "",
        "Errors are in units of the loop's rounding scale u*m_t (see `scanweaver/bench/numerics.py`); "
        "a case fails when the variant is NaN/Inf where the sequential loop is finite, or its error "
        "exceeds 2 x max(sequential error, 1). `max ratio` = max over cases of error / max(sequential error, 1).",
        "",
        "| variant | dtype | kind | cases | fail | NaN/Inf where seq finite | NaN/Inf pattern differs | bit-identical | max err seq | max err variant | max ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["summary"]:
        kind = f"**{r['kind']}**" if r["kind"] == "all" else r["kind"]
        lines.append(
            f"| {r['variant']} | {r['dtype']} | {kind} | {r['cases']} | {r['fail']} | "
            f"{r['nonfinite_where_seq_finite']} | {r['nan_inf_pattern_differs']} | {r['bit_identical']} | "
            f"{_fmt(r['max_err_seq'])} | {_fmt(r['max_err_par'])} | {_fmt(r['max_ratio'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scanweaver.bench.numerics", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-cases", type=int, default=800, help="cases for the GPU kernels in the simulator")
    p.add_argument("--out", type=Path, default=Path("benchmarks"))
    args = p.parse_args(argv)
    result = run(args.cases, args.seed, args.gpu_cases)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "machine": platform.machine()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "numerics.json").write_text(json.dumps({"meta": meta, "seed": result["seed"], "cases": result["cases"],
                                                        "seconds": result["seconds"], "summary": result["summary"]},
                                                       indent=1) + "\n")
    (args.out / "numerics.md").write_text(markdown(result, meta))
    fails = sum(r["fail"] for r in result["summary"] if r["kind"] == "all")
    print(f"{result['cases']} cases, {fails} failing; wrote {args.out / 'numerics.json'} and {args.out / 'numerics.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
