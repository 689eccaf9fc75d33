"""The affine scans' first tier built without xDSL (runtime/cpu_loop_tier.py): bit for
bit the interpreted `scan.affine` program (the oracle) and the sequential loop, for
every dtype, direction, init, final, rank, length 0 and 1, strided views; the kernel's
arguments are the built kernel's; `import scanweaver` and a cold first call through
this tier import no xDSL, and the full build still replaces it."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import legacy_ir
import numpy as np
import pytest

from scanweaver.interp.run import run_function
from scanweaver.runtime import cpu_jit, cpu_native, cpu_scan, cpu_tiers
from scanweaver.runtime.cpu_loop_tier import OPT_LEVEL, LoopProgram, affine_loop_ir, affine_spec, loop_symbol
from scanweaver.runtime.kernel_ir import kernel_ir

pytestmark = pytest.mark.skipif(not cpu_native.available() or cpu_native._linker() is None,
                                reason="no /proc/cpuinfo or no ld: the first tier is a shared object")

DTYPES = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}
RNG = np.random.default_rng(16)


def _loop_kernel(el, rank, init, final, reverse):
    program = LoopProgram(affine_loop_ir(el, rank, init, final, reverse, "affine"))
    return cpu_jit.Kernel(program, loop_symbol("affine"), affine_spec(rank, init, final))


def _inputs(dtype, shape):
    if np.dtype(dtype).kind == "i":
        info = np.iinfo(dtype)  # full range: products wrap around
        return [RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True) for _ in range(2)]
    a = RNG.uniform(-1.1, 1.1, shape).astype(dtype)
    b = (RNG.standard_normal(shape) * np.exp(RNG.uniform(-20, 20, shape))).astype(dtype)
    return [a, b]


def _bits(x):
    return np.ascontiguousarray(x).view(f"u{x.itemsize}")


def _reference(a, b, h0, reverse):
    """The sequential loop in numpy: one rounding per multiply and per add."""
    h = np.empty_like(a)
    s = np.zeros(a.shape[:-1], a.dtype) if h0 is None else h0.copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for t in reversed(range(a.shape[-1])) if reverse else range(a.shape[-1]):
            s = a[..., t] * s + b[..., t]
            h[..., t] = s
    return h, s


CASES = [(el, rank, init, final, reverse) for el in DTYPES for rank, init, final, reverse in
         [(2, False, False, False), (2, True, True, True), (1, True, True, False), (3, False, True, True)]]


@pytest.mark.parametrize("el,rank,init,final,reverse", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_loop_tier_computes_the_interpreters_bits(el, rank, init, final, reverse):
    dtype = DTYPES[el]
    k = _loop_kernel(el, rank, init, final, reverse)
    text = cpu_scan.affine_ir(el, rank, init, final, reverse)
    outer = {1: [()], 2: [(3,), (1,)], 3: [(2, 3)]}[rank]
    for lead in outer:
        for length in (0, 1, 2, 17):
            shape = lead + (length,)
            a, b = _inputs(dtype, shape)
            h0 = _inputs(dtype, lead)[0] if init else None
            args = [a, b] + ([h0] if init else [])
            h, last = np.full(shape, 7, dtype), np.full(lead, 7, dtype)
            k(*args, h, *([last] if final else []))
            ref_h, ref_last = _reference(a, b, h0, reverse)
            np.testing.assert_array_equal(_bits(h), _bits(ref_h))
            if final:
                np.testing.assert_array_equal(_bits(last), _bits(ref_last))
            if length and lead != (1,):  # the oracle (slower: a few shapes)
                ih, ilast = np.zeros(shape, dtype), np.zeros(lead, dtype)
                with np.errstate(over="ignore", invalid="ignore"):
                    run_function(text, "affine", *args, ih, *([ilast] if final else []))
                np.testing.assert_array_equal(_bits(h), _bits(ih))
                if final:
                    np.testing.assert_array_equal(_bits(last), _bits(ilast))


def test_strided_views_and_offsets():
    """Rows of a larger array (row stride > length) and a view that starts inside it."""
    k = _loop_kernel("f32", 2, True, True, False)
    big_a, big_b = _inputs(np.float32, (9, 40))
    a, b = big_a[1::2, 3:30], big_b[1::2, 3:30]  # strides (80, 1) elements, not contiguous
    h0 = _inputs(np.float32, (4,))[0]
    h, last = np.zeros((4, 27), np.float32), np.zeros(4, np.float32)
    k(a, b, h0, h, last)
    ref_h, ref_last = _reference(a, b, h0, False)
    np.testing.assert_array_equal(_bits(h), _bits(ref_h))
    np.testing.assert_array_equal(_bits(last), _bits(ref_last))


@pytest.mark.parametrize("rank,init,final", [(2, False, False), (2, True, True), (3, True, False), (1, False, True)])
def test_the_spec_is_the_built_kernels(rank, init, final):
    ir = kernel_ir("affine", **cpu_scan._affine_options("f64", rank, init, final, False))
    assert ir.name == "affine" and list(ir.args) == affine_spec(rank, init, final)


@pytest.fixture
def cold_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(cpu_tiers.ENV_SWITCH, "1")
    cpu_jit.clear_cache()
    yield tmp_path
    cpu_tiers.wait_all(600)
    cpu_jit.clear_cache()


def test_public_calls_on_the_first_tier_then_the_full_build(cold_cache):
    """linear_scan (h0, reverse, axis) and affine_scan_cpu (out=) on the first tier and
    after the switch: the same bits."""
    import scanweaver as sw

    a, b = _inputs(np.float64, (5, 33))
    h0 = _inputs(np.float64, (5,))[0]
    k = cpu_scan._affine_kernel("f64", 2, True, True, True)
    assert isinstance(k.program, cpu_tiers.TieredProgram) and not k.program.upgraded
    ref_h, ref_last = _reference(a, b, h0, True)
    runs = []
    for _ in range(2):
        h, last = sw.linear_scan(a, b, h0=h0, reverse=True, return_final_state=True)
        runs.append((h, last))
        out = np.empty_like(a)
        cpu_scan.affine_scan_cpu(a, b, h0, reverse=True, out=out, variant="single")
        hT = sw.linear_scan(a.T, b.T, h0=h0, axis=0, reverse=True)
        runs.append((out, last))
        runs.append((hT.T, last))
        assert cpu_tiers.wait_all(600) and k.program.upgraded, "the full build failed"
    for h, last in runs:
        np.testing.assert_array_equal(_bits(h), _bits(ref_h))
        np.testing.assert_array_equal(_bits(last), _bits(ref_last))


NO_XDSL = """
import json, sys
import numpy as np, scanweaver as sw
after_import = sorted(m for m in sys.modules if m.split(".")[0] in ("xdsl", "numba", "torch", "jax"))
a = np.full((4, 64), 0.5, np.float32)
h = sw.linear_scan(a, a)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("xdsl", "numba", "torch", "jax"))
from scanweaver.runtime import cpu_scan, cpu_tiers
kind = type(cpu_scan._affine_kernel("f32", 2, False, False, False).program).__name__
upgraded = cpu_tiers.wait_all(600)
print(json.dumps({"after_import": after_import, "first_call": heavy, "kind": kind, "upgraded": upgraded,
                  "xdsl_after_upgrade": any(m.startswith("xdsl") for m in sys.modules), "h": float(h[0, -1])}))
"""


def test_import_and_a_cold_first_call_import_no_xdsl(cold_cache):
    env = dict(os.environ, SCANWEAVER_CACHE_DIR=str(cold_cache), SCANWEAVER_TIERED="1")
    done = subprocess.run([sys.executable, "-c", NO_XDSL], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.strip().splitlines()[-1])
    # (the child process built the IR and the tile kernel; this one read them from the disk cache)
    assert run == {"after_import": [], "first_call": [], "kind": "TieredProgram", "upgraded": True,
                   "xdsl_after_upgrade": False, "h": pytest.approx(1.0)}


def test_the_small_call_trampoline_waits_for_the_full_build(cold_cache):
    """On the first tier a small call takes the ordinary path (no trampoline linked on
    the first call); once the full build is in, the trampoline, with the same bits."""
    a, b = _inputs(np.float32, (3, 40))
    ref = _reference(a, b, None, False)[0]
    assert cpu_scan.small_affine_scan(a, b, False, False) is None
    k = cpu_scan._affine_kernel("f32", 2, False, False, False)
    assert isinstance(k.program, cpu_tiers.TieredProgram)
    np.testing.assert_array_equal(_bits(cpu_scan.affine_scan_cpu(a, b)), _bits(ref))
    assert cpu_tiers.wait_all(600) and k.program.upgraded, "the full build failed"
    h = cpu_scan.small_affine_scan(a, b, False, False)
    assert h is not None and callable(cpu_scan._SMALL_CALLS[(a.dtype, b.dtype, False, False)])
    np.testing.assert_array_equal(_bits(h), _bits(ref))


# ------------------------------------------- the builder's IR against the old IR text

_canonical = legacy_ir.canonical_llvm_ir


LOOP_VARIANTS = list(itertools.product(DTYPES, (1, 2, 3, 4), (False, True), (False, True), (False, True)))


@pytest.mark.parametrize("el", DTYPES)
def test_the_built_loop_optimises_to_the_old_texts_code(el):
    """Every rank 1-4, init, final, reverse: the same optimised IR (O2, as the tier
    compiles it) as the LLVM IR text the tier wrote before the builder."""
    for _, rank, init, final, reverse in (v for v in LOOP_VARIANTS if v[0] == el):
        old = legacy_ir.affine_loop_ir(el, rank, init, final, reverse, "affine")
        new = affine_loop_ir(el, rank, init, final, reverse, "affine")
        assert _canonical(new, OPT_LEVEL) == _canonical(old, OPT_LEVEL), (rank, init, final, reverse)


@pytest.mark.parametrize("spec", [[2, 2, 2], [1, 1, 0, 1, 0], [3, 3, 2, 3, 2], [4, 2, "index", "i32", "f32", "f64", "i64"]],
                         ids=str)
def test_the_built_dispatch_is_the_old_texts(spec):
    """The dispatch as written (O0: parsed, verified) and optimised (O2, as compiled):
    the same as the old text's."""
    for level in (0, 2):
        assert _canonical(cpu_tiers.dispatch_ir("affine", spec), level) == \
            _canonical(legacy_ir.dispatch_ir("affine", spec), level)
