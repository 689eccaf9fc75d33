"""Tiered compilation (runtime/cpu_tiers.py): a cold affine kernel first runs as the
sequential loops while the tile kernel compiles in the background; both tiers give
the same bits, the dispatch switches to the full build, and a new process loads the
full build from the disk cache without tiers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from scanweaver.runtime import cpu_jit, cpu_native, cpu_tiers
from scanweaver.runtime.cpu_scan import _affine_options
from scanweaver.runtime.kernel_ir import kernel_ir

pytestmark = pytest.mark.skipif(not cpu_native.available() or cpu_native._linker() is None,
                                reason="no /proc/cpuinfo or no ld: tiers need shared objects")


@pytest.fixture
def tiers_on(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cpu_tiers.ENV_SWITCH, "1")
    cpu_jit.clear_cache()
    yield tmp_path
    cpu_jit.clear_cache()


def _inputs(dtype, shape, rng):
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)  # full range: products wrap around
        return (rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True),
                rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True))
    a = rng.uniform(-1.1, 1.1, shape).astype(dtype)
    a[:, ::7] = rng.uniform(0.9, 1.0, a[:, ::7].shape)  # long products, tiny and huge values
    b = (rng.standard_normal(shape) * np.exp(rng.uniform(-30, 30, shape))).astype(dtype)
    return a, b


def _reference(a, b, h0, reverse):
    """The sequential loop in numpy (one rounding per multiply and per add)."""
    h = np.empty_like(a)
    s = np.zeros(a.shape[0], a.dtype) if h0 is None else h0.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for t in reversed(range(a.shape[1])) if reverse else range(a.shape[1]):
            s = a[:, t] * s + b[:, t]
            h[:, t] = s
    return h, s


def _run(k, a, b, h0, final):
    h = np.empty_like(a)
    last = np.empty(a.shape[0], a.dtype)
    k(*([a, b] + ([h0] if h0 is not None else []) + [h] + ([last] if final else [])))
    return h, last


CASES = [("f32", np.float32, False, False, False), ("f64", np.float64, True, True, False),
         ("i32", np.int32, False, True, True)]


@pytest.mark.parametrize("el,dtype,init,final,reverse", CASES, ids=[c[0] for c in CASES])
def test_both_tiers_compute_the_loops_bits(tiers_on, el, dtype, init, final, reverse):
    ir = kernel_ir("affine", **_affine_options(el, 2, init, final, reverse))
    k = cpu_jit.kernel(ir.text, ir.name, ir.args, tiered=True)
    program = k.program
    assert isinstance(program, cpu_tiers.TieredProgram)
    first = cpu_jit.Kernel(program.tiers[0], ir.name, ir.args)
    rng = np.random.default_rng(7)
    shapes = [(19, 37), (8, 1000), (1, 5), (33, 1)]
    inputs = []
    for shape in shapes:
        a, b = _inputs(dtype, shape, rng)
        h0 = _inputs(dtype, (shape[0], 1), rng)[1][:, 0].copy() if init else None
        inputs.append((a, b, h0))
        h, last = _run(first, a, b, h0, final)
        ref_h, ref_last = _reference(a, b, h0, reverse)
        np.testing.assert_array_equal(h.view(f"u{a.itemsize}"), ref_h.view(f"u{a.itemsize}"))
        if final:
            np.testing.assert_array_equal(last.view(f"u{a.itemsize}"), ref_last.view(f"u{a.itemsize}"))
    assert cpu_tiers.wait_all(600) and program.upgraded, "the full build failed"
    full = program.tiers[-1]
    assert full is cpu_jit.compile_cpu(ir.text)  # the tile kernel, now in the in-process cache
    for a, b, h0 in inputs:
        ref = _reference(a, b, h0, reverse)
        for kern in (k, cpu_jit.Kernel(full, ir.name, ir.args)):  # through the dispatch, and directly
            h, last = _run(kern, a, b, h0, final)
            np.testing.assert_array_equal(h.view(f"u{a.itemsize}"), ref[0].view(f"u{a.itemsize}"))
            if final:
                np.testing.assert_array_equal(last.view(f"u{a.itemsize}"), ref[1].view(f"u{a.itemsize}"))


NEW_PROCESS = """
import json, numpy as np, scanweaver as sw
from scanweaver.runtime import cpu_scan
rng = np.random.default_rng(3)
a = rng.uniform(0.5, 1, (4, 50)).astype(np.float32); b = rng.standard_normal((4, 50)).astype(np.float32)
h = sw.linear_scan(a, b, reverse=True)
k = cpu_scan._affine_kernel("f32", 2, False, False, True)
print(json.dumps({"kind": type(k.program).__name__, "hit": bool(k.program.cache_hit), "h": h.tobytes().hex()}))
"""


def test_a_new_process_loads_the_full_build_the_first_one_waited_for(tiers_on):
    env = dict(os.environ, SCANWEAVER_CACHE_DIR=str(tiers_on), SCANWEAVER_TIERED="1")
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", NEW_PROCESS], capture_output=True, text=True, env=env,
                              timeout=600)
        assert done.returncode == 0, done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["kind"] == "TieredProgram"
    assert runs[1]["kind"] == "NativeProgram" and runs[1]["hit"]
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1, (4, 50)).astype(np.float32)
    b = rng.standard_normal((4, 50)).astype(np.float32)
    assert runs[0]["h"] == runs[1]["h"] == _reference(a, b, None, True)[0].tobytes().hex()


def test_tiers_off(tiers_on, monkeypatch):
    monkeypatch.setenv(cpu_tiers.ENV_SWITCH, "0")
    ir = kernel_ir("affine", **_affine_options("i64", 1, False, False, False))
    assert cpu_tiers.tiered_program(ir.text, ir.name, ir.args) is None


FORKS = """
import json, multiprocessing, os, sys
import numpy as np, scanweaver as sw
from scanweaver.runtime import cpu_scan, cpu_tiers

rng = np.random.default_rng(5)
a = rng.uniform(0.5, 1, (6, 300)).astype(np.float32); b = rng.standard_normal((6, 300)).astype(np.float32)
h = sw.linear_scan(a, b, reverse=True)
program = cpu_scan._affine_kernel("f32", 2, False, False, True).program
in_flight = isinstance(program, cpu_tiers.TieredProgram) and not program._done.is_set()

def worker(_):
    same = sw.linear_scan(a, b, reverse=True).tobytes() == h.tobytes()
    upgraded = cpu_tiers.wait_all(120)  # (False, not a hang, where a child cannot follow)
    return same and upgraded and sw.linear_scan(a, b, reverse=True).tobytes() == h.tobytes()

pid = os.fork()
if pid == 0:
    os._exit(0 if worker(0) else 3)
with multiprocessing.get_context("fork").Pool(2) as pool:
    workers = pool.map(worker, range(3))
_, status = os.waitpid(pid, 0)
print(json.dumps({"in_flight": in_flight, "fork": os.waitstatus_to_exitcode(status), "workers": workers,
                  "parent": cpu_tiers.wait_all(300) and sw.linear_scan(a, b, reverse=True).tobytes() == h.tobytes()}))
"""


def test_forks_during_the_background_build(tiers_on):
    """os.fork and a 'fork' pool while the full build runs: the children compute the
    same bits, switch to the parent's full build (no deadlock), and the disk cache
    holds only whole entries, which a new process loads."""
    from scanweaver.toolchain import cache

    env = dict(os.environ, SCANWEAVER_CACHE_DIR=str(tiers_on), SCANWEAVER_TIERED="1")
    done = subprocess.run([sys.executable, "-c", FORKS], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run == {"in_flight": True, "fork": 0, "workers": [True] * 3, "parent": True}
    entries = [p for p in tiers_on.rglob("*") if p.is_file()]
    assert entries and not [p for p in entries if p.name.startswith(".tmp-")]
    assert all(cache.load(p.name) is not None for p in entries), "a damaged cache entry"
    # (the kernel NEW_PROCESS runs)
    again = subprocess.run([sys.executable, "-c", NEW_PROCESS], capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["kind"] == "NativeProgram"


COLD = """
import json, sys, numpy as np, scanweaver as sw
from scanweaver.runtime import cpu_tiers
a = np.full((4, 64), 0.5, np.float32)
h = sw.linear_scan(a, a)
heavy = ("scanweaver.rewrites.raise_affine", "scanweaver.rewrites.scan_to_cpu", "scanweaver.rewrites.complex_to_real",
         "xdsl.dialects.gpu")
first = sorted(m for m in heavy if m in sys.modules)
upgraded = cpu_tiers.wait_all(300)
print(json.dumps({"first": first, "upgraded": upgraded, "after": sorted(m for m in heavy if m in sys.modules),
                  "h": float(h[0, -1])}))
"""


def test_a_cold_first_call_loads_only_the_loops_tier(tiers_on):
    """A cold first call imports neither the tile kernel's passes nor the stages with
    nothing to do (raising, complex, the GPU dialect); the tile kernel is compiled in
    another process (this one never imports its passes)."""
    env = dict(os.environ, SCANWEAVER_CACHE_DIR=str(tiers_on), SCANWEAVER_TIERED="1")
    done = subprocess.run([sys.executable, "-c", COLD], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run == {"first": [], "upgraded": True, "after": [], "h": pytest.approx(1.0)}
