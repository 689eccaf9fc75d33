"""The compile cache: keyed on everything, shared across processes, robust to damage."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from scanweaver.toolchain import cache

HERE = Path(__file__).parent
AFFINE = (HERE.parent / "filecheck" / "loops" / "scan_to_loops.mlir").read_text()

# Compile in a fresh process where running any external tool is an error: it can only
# succeed by reading the cache.
NO_TOOLS_COMPILE = """
import sys
import scanweaver.toolchain.mlir as mlir
def forbidden(*a, **k):
    raise SystemExit("mlir tool was run")
mlir.run_tool = forbidden
from scanweaver import compiler
lowered = compiler.lower(sys.stdin.read(), "loops", keep_stages=False)
llvm_ir, hit = compiler.cpu_llvm_ir(lowered.module)
print("HIT" if hit else "MISS")
"""


def test_key_depends_on_text_and_options():
    k = cache.cache_key("llvm-ir", "module {}")
    assert k == cache.cache_key("llvm-ir", "module {}")
    assert k != cache.cache_key("llvm-ir", "module { }")
    assert k != cache.cache_key("ptx", "module {}")
    assert k != cache.cache_key("llvm-ir", "module {}", chip="sm_90")


def test_second_process_does_not_run_mlir_opt(tmp_path, monkeypatch):
    from scanweaver import compiler

    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    lowered = compiler.lower(AFFINE, "loops", keep_stages=False)
    assert compiler.cpu_llvm_ir(lowered.module)[1] is False
    r = subprocess.run(
        [sys.executable, "-c", NO_TOOLS_COMPILE], input=AFFINE, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "HIT"


def test_corrupt_and_truncated_entries_are_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    key = cache.cache_key("test", "x")
    builds = []

    def build():
        builds.append(1)
        return b"payload-bytes"

    assert cache.cached(key, build) == (b"payload-bytes", False)
    assert cache.cached(key, build) == (b"payload-bytes", True)
    path = next(p for p in tmp_path.rglob(key))
    path.write_bytes(path.read_bytes()[:-3])  # truncated
    assert cache.cached(key, build) == (b"payload-bytes", False)
    path.write_bytes(path.read_bytes().replace(b"payload", b"PAYLOAD"))  # corrupted
    assert cache.cached(key, build) == (b"payload-bytes", False)
    path.write_bytes(b"garbage")
    assert cache.load(key) is None and not path.exists()
    assert len(builds) == 3


def _store_many(args):
    directory, worker = args
    os.environ["SCANWEAVER_CACHE_DIR"] = directory
    key = cache.cache_key("race", "same")
    payload = bytes([worker % 256]) * 200_000
    for _ in range(20):
        cache.store(key, payload)
        got = cache.load(key)
        assert got is not None and len(got) == 200_000 and len(set(got)) == 1
    return True


def test_concurrent_writers_never_expose_partial_entries(tmp_path):
    with ProcessPoolExecutor(max_workers=4) as pool:
        assert all(pool.map(_store_many, [(str(tmp_path), w) for w in range(4)]))
    assert not list(tmp_path.rglob(".tmp-*"))


# A fresh process in which lowering or running a tool is an error: scanweaver.compile
# must take the whole build from the cache and only JIT it.
NO_LOWERING_COMPILE = """
import sys
import numpy as np
import scanweaver, scanweaver.compiler as compiler, scanweaver.toolchain.mlir as mlir
def forbidden(*a, **k):
    raise SystemExit("the compiler ran")
compiler.lower = forbidden
mlir.run_tool = forbidden
program = scanweaver.compile(sys.stdin.read(), target="cpu")
a = np.full((4, 3), 0.5, np.float32); b = np.ones((4, 3), np.float32)
h0 = np.zeros(4, np.float32); h = np.zeros((4, 3), np.float32); hT = np.zeros(4, np.float32)
program.reverse_init_final(a, b, h0, h, hT)
print("HIT" if program.cache_hit else "MISS", h[0].tolist())
"""


def test_compile_cache_skips_every_stage_in_a_new_process(tmp_path, monkeypatch):
    import scanweaver

    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    text = AFFINE.split("func.func @widen_int")[0]
    assert scanweaver.compile(text, target="cpu").cache_hit is False
    r = subprocess.run(
        [sys.executable, "-c", NO_LOWERING_COMPILE], input=text, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "HIT"
    assert r.stdout.strip().endswith("[1.75, 1.5, 1.0]")  # reverse: h = 0.5*h + 1
