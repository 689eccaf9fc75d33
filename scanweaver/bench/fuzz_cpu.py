"""Seeded fuzz driver of the CPU paths, as a demanding user drives them.

    python -m scanweaver.bench.fuzz_cpu [--cases N] [--seed S] [--only affine,api,guard,selective,torch]

Each section draws N random cases (small default budget) at the edges of the variants
(rows 0, 1, 2, around the vector lanes and the thread count; lengths around the tiles,
chunks and blocks of cpu_affine_tiles / cpu_chunked / cpu_chunk_blocks and the
selective kernel's time blocks and tiles) and checks them against an oracle:

  affine     `affine_scan_cpu` per forced variant and thread count, with small chunks
             (CHUNKED_TEST_MIN_CHUNK) so that short rows cross many blocks: bit for bit
             against the sequential loop (numpy, same dtype) where README "Numerics" says
             so, else the README bound (`numerics.check_rows`); the final state is h's
             last step; `out=` misaligned by 0/4/8/32 bytes or aliasing a or b.
  api        `linear_scan` on views (negative and step strides, transposes), axis 0/-1,
             reverse, h0 (none, one number, an array), float16..int64, Inf/NaN/denormals.
  guard      `affine_scan_cpu` and `selective_scan` on arrays that end at (or start right
             after) a page the process may not read, outputs included: a read or write
             past an array kills the child process (run in a subprocess).
  selective  `selective_scan` against a float64 loop, relative to the magnitude
             sum_n |C| m_n (m: the state of |coefficients|).
  torch      `scanweaver.torch` selective_scan_fn / linear_scan forward and backward
             against the float64 autograd of the references.

Prints one line per failure and a summary; exit status 1 when anything failed.  The
regression tests of what it found are tests/test_probe_cpu_edges.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

ROWS = (0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 33)
LENGTHS = (0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 513, 1000, 2049, 8192, 8193)
VARIANTS = ("single", "channels", "chunked", "openmp", "time_lanes")
DTYPES = ("float32", "float64", "int32", "int64")


def sequential(a: np.ndarray, b: np.ndarray, h0: np.ndarray | None, reverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """The loop h = a*h + b along the last axis of (C, L) arrays, in their dtype
    (separate multiply and add; integers wrap)."""
    C, L = a.shape
    h = np.empty_like(a)
    s = np.zeros(C, a.dtype) if h0 is None else h0.astype(a.dtype).copy()
    with np.errstate(all="ignore"):
        for t in range(L - 1, -1, -1) if reverse else range(L):
            s = a[:, t] * s + b[:, t]
            h[:, t] = s
    return h, s


def _data(rng: np.random.Generator, shape: tuple[int, ...], dt: np.dtype, specials: bool = False):
    if dt.kind == "f":
        a = rng.uniform(0.5, 1.02, shape).astype(dt)
        b = rng.standard_normal(shape).astype(dt)
        if specials and a.size >= 4:
            i = rng.integers(0, a.size, 4)
            a.flat[i[0]], b.flat[i[1]] = np.inf, np.nan
            b.flat[i[2]], a.flat[i[3]] = np.finfo(dt).smallest_subnormal, np.finfo(dt).max / 2
    else:
        a = rng.integers(-3, 4, shape).astype(dt)
        b = rng.integers(-99, 99, shape).astype(dt)
    return a, b


def _misaligned(shape: tuple[int, ...], dt: np.dtype, off: int) -> np.ndarray:
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(n + 128, np.uint8)
    skip = (-raw.ctypes.data) % 64 + off
    return raw[skip : skip + n].view(dt).reshape(shape)


def fuzz_affine(rng: np.random.Generator, cases: int, report: Callable[[str], None]) -> None:
    from scanweaver.bench import numerics
    from scanweaver.runtime import cpu_chunked
    from scanweaver.runtime.cpu_scan import affine_scan_cpu

    for _ in range(cases):
        dt = np.dtype(rng.choice(DTYPES))
        variant = str(rng.choice(VARIANTS if dt.kind == "i" else VARIANTS[:4]))
        C, L = int(rng.choice(ROWS)), int(rng.choice(LENGTHS))
        rev, threads = bool(rng.integers(2)), int(rng.integers(1, 4))
        a, b = _data(rng, (C, L), dt, specials=bool(rng.integers(2)) and variant != "chunked")
        h0 = _data(rng, (C,), dt)[1] if rng.integers(2) else None
        out_kind = rng.choice(["none", "0", "4", "8", "32", "a", "b"])
        a2, b2, out = a, b, None
        if out_kind in ("a", "b"):
            a2, b2 = a.copy(), b.copy()
            out = a2 if out_kind == "a" else b2
        elif out_kind != "none" and int(out_kind) % dt.itemsize == 0:
            out = _misaligned((C, L), dt, int(out_kind))
        case = f"affine {dt} {variant} C={C} L={L} reverse={rev} h0={h0 is not None} threads={threads} out={out_kind}"
        old = cpu_chunked.CHUNKED_TEST_MIN_CHUNK
        cpu_chunked.CHUNKED_TEST_MIN_CHUNK = int(rng.choice([8, 16, 64])) if rng.integers(2) else None
        try:
            h, last = affine_scan_cpu(a2, b2, h0, rev, True, variant=variant, threads=threads, out=out)
        except Exception as e:  # noqa: BLE001 - every escape is a finding
            report(f"{case}: {type(e).__name__}: {e}")
            continue
        finally:
            cpu_chunked.CHUNKED_TEST_MIN_CHUNK = old
        want, want_last = sequential(a, b, h0, rev)
        if dt.kind == "i" or variant != "chunked" or L < 2:
            if h.tobytes() != want.tobytes() or last.tobytes() != want_last.tobytes():
                report(f"{case}: not the loop's bits")
            continue
        if C and last.tobytes() != h[:, 0 if rev else -1].tobytes():
            report(f"{case}: the final state is not h's last step")
        if C:
            batch = numerics.Batch(dt, rev, ["mixed"] * C, a, b, np.zeros(C, dt) if h0 is None else h0, None)
            ref, mag = numerics.reference(batch)
            res = numerics.check_rows(h, want, ref, mag, dt)
            if not res["pass"].all():
                report(f"{case}: outside the README bound ({res['err_par'].max():.3g} vs {res['err_seq'].max():.3g})")


def _views(a: np.ndarray, b: np.ndarray, kind: str):
    pick = {"contig": lambda x: x, "neg": lambda x: x[..., ::-1], "step2": lambda x: x[..., ::2],
            "T": lambda x: x.T, "negrow": lambda x: x[::-1]}[kind]
    return pick(a), pick(b)


def fuzz_api(rng: np.random.Generator, cases: int, report: Callable[[str], None]) -> None:
    import scanweaver

    shapes = [(0,), (1,), (5,), (0, 4), (4, 0), (1, 1), (3, 17), (17, 3), (2, 3, 33), (16, 300), (33, 70), (3, 2049)]
    for _ in range(cases):
        dt = np.dtype(rng.choice(DTYPES + ("float16",)))
        shape = shapes[int(rng.integers(len(shapes)))]
        kind = str(rng.choice(["contig", "neg", "step2", "T", "negrow"]))
        axis, rev = int(rng.choice([0, -1])), bool(rng.integers(2))
        a, b = _views(*_data(rng, shape, dt, specials=bool(rng.integers(2))), kind)
        state = np.dtype(np.float32) if dt == np.float16 else dt
        ax = axis % a.ndim
        channels = a.shape[:ax] + a.shape[ax + 1 :]
        h0_kind = int(rng.integers(3))
        h0 = None if h0_kind == 0 else (state.type(2) if h0_kind == 1 else
                                        (np.arange(int(np.prod(channels))) % 5).astype(state).reshape(channels))
        case = f"linear_scan {dt} shape={shape} view={kind} axis={axis} reverse={rev} h0={h0_kind}"
        try:
            h, last = scanweaver.linear_scan(a, b, h0, axis=axis, reverse=rev, return_final_state=True)
        except Exception as e:  # noqa: BLE001
            report(f"{case}: {type(e).__name__}: {e}")
            continue
        a2, b2 = (np.moveaxis(x, ax, -1).astype(state) for x in (a, b))
        h2 = None if h0 is None else np.broadcast_to(np.asarray(h0, state), channels).reshape(-1)
        rows = (int(np.prod(channels)), a.shape[ax])
        want, want_last = sequential(a2.reshape(rows), b2.reshape(rows), h2, rev)
        want = np.moveaxis(want.reshape(a2.shape), -1, ax)
        if h.shape != a.shape or h.dtype != state or last.shape != channels:
            report(f"{case}: shape/dtype {h.shape} {h.dtype} {last.shape}")
        elif not (np.array_equal(h, want, equal_nan=True) and np.array_equal(last.reshape(-1), want_last, equal_nan=True)):
            report(f"{case}: not the loop's values")  # these shapes take the bit-identical variants


_GUARD = r'''
import ctypes, mmap, sys
import numpy as np
PAGE = mmap.PAGESIZE
libc = ctypes.CDLL(None, use_errno=True)
keep = []

def guarded(x, at_end):
    """x's copy ending where an unreadable page begins (at_end), or starting right after one."""
    pages = -(-max(x.nbytes, 1) // PAGE) + 2
    mm = mmap.mmap(-1, pages * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    for p in (0, pages - 1):
        assert libc.mprotect(ctypes.c_void_p(base + p * PAGE), PAGE, 0) == 0
    y = np.frombuffer(mm, x.dtype, x.size, (pages - 1) * PAGE - x.nbytes if at_end else PAGE).reshape(x.shape)
    y[...] = x
    keep.append(mm)
    return y

from scanweaver.runtime.cpu_scan import affine_scan_cpu
from scanweaver.runtime import cpu_chunked
import scanweaver
rng = np.random.default_rng(int(sys.argv[1]))
for i in range(int(sys.argv[2])):
    keep.clear()
    dt = np.dtype(rng.choice(["float32", "float64", "int32", "int64"]))
    variant = str(rng.choice(["single", "channels", "chunked", "openmp"] + (["time_lanes"] if dt.kind == "i" else [])))
    C, L = int(rng.choice([1, 2, 3, 5, 8, 9, 17])), int(rng.choice([1, 2, 3, 7, 9, 17, 31, 33, 100, 257, 600, 2049]))
    rev, end = bool(rng.integers(2)), bool(rng.integers(2))
    cpu_chunked.CHUNKED_TEST_MIN_CHUNK = 8 if rng.integers(2) else None
    a = rng.uniform(0.9, 1, (C, L)).astype(dt) if dt.kind == "f" else rng.integers(-3, 4, (C, L)).astype(dt)
    b = rng.uniform(-1, 1, (C, L)).astype(dt) if dt.kind == "f" else rng.integers(-9, 9, (C, L)).astype(dt)
    print("affine", dt, variant, C, L, rev, end, flush=True)
    out = guarded(np.zeros((C, L), dt), end)
    affine_scan_cpu(guarded(a, end), guarded(b, end), guarded(np.ones(C, dt), end), rev, True,
                    variant=variant, threads=2, out=out)
    N, L, D = int(rng.choice([1, 3, 16, 17, 64])), int(rng.choice([1, 15, 16, 17, 129, 481, 513])), int(rng.choice([1, 2, 65]))
    f = lambda *s: guarded(rng.standard_normal(s).astype(np.float32), end)
    print("selective", N, L, D, end, flush=True)
    scanweaver.selective_scan(f(1, D, L), guarded(np.abs(rng.standard_normal((1, D, L))).astype(np.float32), end),
                              guarded(-np.ones((D, N), np.float32), end), f(1, N, L), f(1, N, L), f(D), f(1, D, L),
                              f(D), True, True, f(1, D, N))
print("ok")
'''


def fuzz_guard(rng: np.random.Generator, cases: int, report: Callable[[str], None]) -> None:
    seed = int(rng.integers(1 << 31))
    done = subprocess.run([sys.executable, "-c", _GUARD, str(seed), str(cases)], capture_output=True, text=True)
    if done.returncode != 0 or done.stdout.strip().splitlines()[-1:] != ["ok"]:
        last = (done.stdout.strip().splitlines() or ["(no case started)"])[-1]
        report(f"guard seed={seed}: child exited {done.returncode} at: {last}; {done.stderr[-500:]}")


def _selective_reference(u, delta, A, B, C, D, z, bias, softplus, h0):
    """out, last state and the magnitudes (sum_n |C| m_n, m_n) of the float64 loop."""
    u, delta, A = (x.astype(np.float64) for x in (u, delta, A))
    batch, Dn, L = u.shape
    N = A.shape[1]
    dt = delta + (bias.astype(np.float64)[None, :, None] if bias is not None else 0)
    if softplus:
        dt = np.where(dt > 20, dt, np.log1p(np.exp(np.minimum(dt, 20))))

    def at(X, t):
        X = X.astype(np.float64)
        if X.ndim == 2:
            return np.broadcast_to(X[None], (batch, Dn, N))
        if X.ndim == 3:
            return np.broadcast_to(X[:, None, :, t], (batch, Dn, N))
        return np.repeat(X[:, :, :, t], Dn // X.shape[1], axis=1)

    h = np.zeros((batch, Dn, N)) if h0 is None else h0.astype(np.float64)
    m = np.abs(h)
    y, mag = np.empty((batch, Dn, L)), np.empty((batch, Dn, L))
    for t in range(L):
        e, x = np.exp(dt[:, :, t, None] * A[None]), dt[:, :, t, None] * at(B, t) * u[:, :, t, None]
        h, m = e * h + x, e * m + np.abs(x)
        y[:, :, t], mag[:, :, t] = (h * at(C, t)).sum(-1), (m * np.abs(at(C, t))).sum(-1)
    if D is not None:
        y = y + D.astype(np.float64)[None, :, None] * u
        mag = mag + np.abs(D.astype(np.float64)[None, :, None] * u)
    if z is not None:
        g = z / (1 + np.exp(-z.astype(np.float64)))
        y, mag = y * g, mag * np.abs(g)
    return y, h, mag, m


def fuzz_selective(rng: np.random.Generator, cases: int, report: Callable[[str], None]) -> None:
    import scanweaver

    for _ in range(cases):
        N, L, Dn = (int(rng.choice(x)) for x in ((1, 3, 16, 17, 64), (1, 15, 16, 17, 33, 127, 129, 481, 513), (1, 2, 65)))
        batch, G = int(rng.integers(1, 3)), (1 if Dn == 1 else (Dn if Dn < 3 else 5))
        bk, ck = (str(k) for k in rng.choice(["const", "shared", "grouped"], 2))
        f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
        bc = {"const": lambda: f(Dn, N), "shared": lambda: f(batch, N, L), "grouped": lambda: f(batch, G, N, L)}
        u, delta = f(batch, Dn, L), np.abs(0.5 * f(batch, Dn, L))
        A = -np.exp(0.5 * f(Dn, N))
        B, C = bc[bk](), bc[ck]()
        opt = rng.integers(0, 2, 5).astype(bool)
        D, z = f(Dn) if opt[0] else None, f(batch, Dn, L) if opt[1] else None
        bias, h0 = (0.1 * f(Dn)) if opt[2] else None, f(batch, Dn, N) if opt[4] else None
        case = f"selective N={N} L={L} D={Dn} batch={batch} B={bk} C={ck} D/z/bias/softplus/h0={opt.astype(int).tolist()}"
        try:
            out, last = scanweaver.selective_scan(u, delta, A, B, C, D, z, bias, bool(opt[3]), True, h0)
        except Exception as e:  # noqa: BLE001
            report(f"{case}: {type(e).__name__}: {e}")
            continue
        y, h, mag, m = _selective_reference(u, delta, A, B, C, D, z, bias, bool(opt[3]), h0)
        err = (np.abs(out - y) / (mag + 1e-6)).max(initial=0)
        err_h = (np.abs(last - h) / (m + 1e-30)).max(initial=0)
        if not np.isfinite(out).all() or err > 1e-4 or err_h > 1e-4:
            report(f"{case}: error {err:.3g} (out), {err_h:.3g} (last state) relative to the magnitudes")


def fuzz_torch(rng: np.random.Generator, cases: int, report: Callable[[str], None]) -> None:
    import torch

    from scanweaver.torch import linear_scan, linear_scan_ref, selective_scan_fn, selective_scan_ref

    def close(x, ref, tol):
        if x is None or x.shape != ref.shape or not bool(torch.isfinite(x).all()):
            return False
        if not x.numel():
            return True
        return float((x.detach().double() - ref.detach()).abs().max()) <= tol * (1 + float(ref.detach().abs().max()))

    torch.manual_seed(int(rng.integers(1 << 31)))
    for _ in range(cases):
        dt = torch.float64 if rng.random() < 0.3 else torch.float32
        tol = 1e-3 if dt == torch.float32 else 1e-9
        mk = lambda *s, scale=1.0: (scale * torch.randn(s, dtype=torch.float64)).to(dt).requires_grad_()  # noqa: E731
        N, L, Dn = (int(rng.choice(x)) for x in ((1, 4, 16, 17), (1, 2, 63, 64, 65, 129), (1, 2, 3, 4)))
        batch, G = int(rng.integers(1, 3)), (Dn if Dn <= 2 else (1 if Dn == 3 else 2))
        bk, ck = (str(k) for k in rng.choice(["const", "shared", "grouped"], 2))
        bc = {"const": lambda: mk(Dn, N), "shared": lambda: mk(batch, N, L), "grouped": lambda: mk(batch, G, N, L)}
        opt = rng.integers(0, 2, 6).astype(bool)
        named = {"u": mk(batch, Dn, L), "delta": (0.5 * torch.rand(batch, Dn, L, dtype=torch.float64)).to(dt).requires_grad_(),
                 "A": (-torch.exp(0.5 * torch.randn(Dn, N, dtype=torch.float64))).to(dt).requires_grad_(),
                 "B": bc[bk](), "C": bc[ck](), "D": mk(Dn) if opt[0] else None, "z": mk(batch, Dn, L) if opt[1] else None,
                 "delta_bias": mk(Dn, scale=0.1) if opt[2] else None, "initial_state": mk(batch, Dn, N) if opt[5] else None}
        case = f"selective_scan_fn {dt} N={N} L={L} D={Dn} batch={batch} B={bk} C={ck} opts={opt.astype(int).tolist()}"
        given = {k: v for k, v in named.items() if v is not None}
        flags = dict(delta_softplus=bool(opt[3]), return_last_state=bool(opt[4]))
        try:
            res = selective_scan_fn(**given, **flags)
            out, last = res if opt[4] else (res, None)
            g = torch.randn_like(out)
            grads = torch.autograd.grad((out * g).sum() + (last.sum() if opt[4] else 0), list(given.values()))
        except Exception as e:  # noqa: BLE001
            report(f"{case}: {type(e).__name__}: {e}")
            continue
        ref_in = {k: v.detach().double().requires_grad_() for k, v in given.items()}
        rres = selective_scan_ref(**ref_in, **flags)
        rout, rlast = rres if opt[4] else (rres, None)
        rgrads = torch.autograd.grad((rout * g.double()).sum() + (rlast.sum() if opt[4] else 0), list(ref_in.values()))
        bad = [n for n, x, r in zip(given, grads, rgrads) if not close(x, r, tol) or x.dtype != dt]
        bad += ["out"] if not close(out, rout, tol) else []
        bad += ["last"] if opt[4] and not close(last, rlast, tol) else []
        if bad:
            report(f"{case}: wrong {bad}")
        # linear_scan: a random dim, reverse, h0, a non-contiguous layout
        nd = int(rng.integers(1, 4))
        shape = tuple(int(x) for x in rng.choice([1, 2, 3, 17, 65], nd))
        dim, rev = int(rng.integers(-nd, nd)), bool(rng.integers(2))
        a = (0.5 + 0.5 * torch.rand(shape, dtype=torch.float64)).to(dt)
        b = torch.randn(shape, dtype=torch.float64).to(dt)
        if nd >= 2 and rng.integers(2):
            a, b = (x.transpose(0, -1).contiguous().transpose(0, -1) for x in (a, b))
        a.requires_grad_(), b.requires_grad_()
        ch = shape[: dim % nd] + shape[dim % nd + 1 :]
        ins = [a, b] + ([torch.randn(ch, dtype=dt, requires_grad=True)] if rng.integers(2) else [])
        case = f"linear_scan (torch) {dt} shape={shape} dim={dim} reverse={rev} h0={len(ins) == 3}"
        try:
            h = linear_scan(ins[0], ins[1], ins[2] if len(ins) == 3 else None, rev, dim)
            g = torch.randn_like(h)
            grads = torch.autograd.grad((h * g).sum(), ins)
        except Exception as e:  # noqa: BLE001
            report(f"{case}: {type(e).__name__}: {e}")
            continue
        ref_in = [x.detach().double().requires_grad_() for x in ins]
        rh = linear_scan_ref(ref_in[0], ref_in[1], ref_in[2] if len(ins) == 3 else None, rev, dim)
        rgrads = torch.autograd.grad((rh * g.double()).sum(), ref_in)
        if not close(h, rh, tol) or not all(close(x, r, tol) for x, r in zip(grads, rgrads)):
            report(f"{case}: wrong values or gradients")


SECTIONS = {"affine": fuzz_affine, "api": fuzz_api, "guard": fuzz_guard, "selective": fuzz_selective,
            "torch": fuzz_torch}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scanweaver.bench.fuzz_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=20, help="cases per section (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", default="affine,api,guard,selective", help="comma-separated sections (torch: needs torch)")
    args = p.parse_args(argv)
    failures: list[str] = []
    for name in args.only.split(","):
        if name not in SECTIONS:
            p.error(f"unknown section {name!r} (have: {', '.join(SECTIONS)})")
        t0, before = time.time(), len(failures)
        SECTIONS[name](np.random.default_rng([args.seed, list(SECTIONS).index(name)]), args.cases,
                       lambda msg: (failures.append(msg), print("FAIL", msg, flush=True)))
        print(f"{name}: {args.cases} cases, {len(failures) - before} failures, {time.time() - t0:.1f} s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
