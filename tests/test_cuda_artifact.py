"""`scanweaver compile --target ptx|cubin -o OUT` writes a self-contained artifact that
`scanweaver.load(OUT)` runs with numpy and a driver binding only (here a fake driver
whose "kernel" is a numpy affine scan reading the packed descriptors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scanweaver.cli import main
from scanweaver.errors import ScanWeaverValueError
from scanweaver.toolchain.gpu_export import ptxas_available
from scanweaver.runtime.cuda_artifact import plan, read_artifact
from scanweaver.workloads.scans import affine_scan_ir

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

RUNNER = r"""
import ctypes, json, struct, sys, types
import numpy as np
sys.path.insert(0, TESTS)
from cuda_fakes import fake_cuda_bindings_driver

def q(b):
    return struct.unpack("<q", b)[0]

def affine_kernel(p):
    # a, b, h: rank-2 descriptors (7 params each); final: rank 1 (5 params)
    rows, cols = q(p[3]), q(p[4])
    def arr(i, shape):
        n = int(np.prod(shape))
        return np.ctypeslib.as_array((ctypes.c_float * n).from_address(q(p[i]))).reshape(shape)
    a, b, h, final = arr(1, (rows, cols)), arr(8, (rows, cols)), arr(15, (rows, cols)), arr(22, (rows,))
    state = np.zeros(rows, np.float32)
    for t in range(cols):
        state = a[:, t] * state + b[:, t]
        h[:, t] = state
    final[:] = state

drv = fake_cuda_bindings_driver([8] * 26, kernel=affine_kernel)
pkg, sub = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
pkg.bindings, sub.driver = sub, drv
sys.modules.update({"cuda": pkg, "cuda.bindings": sub, "cuda.bindings.driver": drv})

import scanweaver
program = scanweaver.load(ARTIFACT)
rng = np.random.default_rng(0)
a = rng.uniform(-1, 1, (5, 37)).astype(np.float32)
b = rng.uniform(-1, 1, (5, 37)).astype(np.float32)
h = np.full((5, 37), np.nan, np.float32)
final = np.full(5, np.nan, np.float32)
program.f(a, b, h, final)
ref = np.zeros((5, 37))
s = np.zeros(5)
for t in range(37):
    s = a[:, t].astype(np.float64) * s + b[:, t]
    ref[:, t] = s
heavy = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("xdsl", "mlir", "llvm", "llvmlite")}
               | {m for m in sys.modules if m.startswith(("scanweaver.rewrites", "scanweaver.toolchain", "scanweaver.compiler", "scanweaver.dialects"))})
print(json.dumps({"err": float(np.max(np.abs(h - ref))), "final_err": float(np.max(np.abs(final - ref[:, -1]))),
                  "launches": [[list(l.grid), list(l.block), l.dynamic_shared] for l in drv.launches],
                  "heavy": heavy, "image": drv.images[0][:40].decode(errors="replace")}))
"""


def _compile(tmp_path, target, ir=None):
    src = tmp_path / "scan.mlir"
    src.write_text(ir or affine_scan_ir(("?", "?"), 1, "f32", "f32", final=True))
    out = tmp_path / f"scan.{target}"
    assert main(["compile", str(src), "--target", target, "-o", str(out)]) == 0
    return out


def _run_loaded(artifact):
    script = RUNNER.replace("TESTS", repr(str(TESTS))).replace("ARTIFACT", repr(str(artifact)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ptx_artifact_loads_and_runs_without_the_compiler(tmp_path):
    out = _compile(tmp_path, "ptx")
    doc = json.loads((tmp_path / "scan.ptx.launch.json").read_text())
    assert doc["image"] == "scan.ptx" and doc["image_kind"] == "ptx" and doc["chip"] == "sm_90"
    (k,) = doc["kernels"]
    assert k["grid"] == ["h.shape[0]", 1, 1] and k["dynamic_shared_bytes"] == 0
    # warp-shuffle tiles: sA, sB hold the 4 warps' totals (16-byte aligned), sC the carry
    assert k["static_shared_bytes"] == 16 + 16 + 4
    assert [a[1] for a in k["args"]] == ["in", "in", "out", "out"]
    assert doc["functions"]["f"]["kernels"] == [0]
    assert [a["kind"] for a in doc["functions"]["f"]["args"]] == ["in", "in", "out", "out"]
    if ptxas_available():
        assert k["ptxas"]["spill_stores"] == 0 and k["ptxas"]["registers"] > 0
    got = _run_loaded(out)
    assert got["heavy"] == [], f"loading imported {got['heavy']}"
    assert got["err"] < 1e-5 and got["final_err"] < 1e-5
    assert got["launches"] == [[[5, 1, 1], [128, 1, 1], 0]]
    assert got["image"].lstrip().startswith("//")  # the PTX text itself went to the driver


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: cubin not built")
def test_cubin_artifact(tmp_path):
    out = _compile(tmp_path, "cubin")
    assert out.read_bytes()[:4] == b"\x7fELF"
    doc, image = read_artifact(out)
    assert doc["image_kind"] == "cubin" and isinstance(image, bytes)
    launches, counts = plan(doc)
    assert counts == {"f": 4} and launches["f"][0].kernel_name == "scan_affine_0"


def test_damaged_or_foreign_artifacts_are_refused(tmp_path):
    out = _compile(tmp_path, "ptx")
    out.write_text(out.read_text() + "// edited\n")
    with pytest.raises(ScanWeaverValueError, match="does not match .* SHA-256 differs"):
        read_artifact(out)
    (tmp_path / "x.launch.json").write_text(json.dumps({"chip": "sm_90", "kernels": []}))
    with pytest.raises(ScanWeaverValueError, match="not a ScanWeaver GPU artifact"):
        read_artifact(tmp_path / "x")
    with pytest.raises(ScanWeaverValueError, match="cannot read"):
        read_artifact(tmp_path / "missing.ptx")


def test_scalar_arguments_in_the_launch_json(tmp_path):
    from pathlib import Path as _P

    text = (_P(__file__).parent / "gpu_loop_forms" / "ema_alpha.mlir").read_text()
    out = _compile(tmp_path, "ptx", ir=text)
    doc, _ = read_artifact(out)
    assert doc["functions"]["ema"]["args"] == [
        {"name": "x", "kind": "in", "dtype": "f32", "shape": ["?", "?"]},
        {"name": "alpha", "kind": "scalar", "dtype": "f32", "shape": []},
        {"name": "y", "kind": "out", "dtype": "f32", "shape": ["?", "?"]},
    ]
    launches, counts = plan(doc)
    assert launches["ema"][0].covers_dims == (("y", 0, "x", 0), ("y", 1, "x", 1)) and counts == {"ema": 3}


def test_loaded_artifact_checks_the_shape_contract_of_its_ir(tmp_path):
    """The grouped selective scan reads B[b, d / (D / G), n, t]: with D = 4 channels
    and G = 3 groups, d / 1 reaches group 3 of 3.  No launch-description relation
    says so; the IR's shape contract does.  `compile(target="cuda")` checked it, a
    loaded artifact did not (it launched the out-of-bounds read); the artifact now
    carries the contract and the loader checks it before any launch."""
    from scanweaver.runtime.cuda_driver import CudaPythonDriver
    from scanweaver.runtime.cuda_scan import selective_scan_ir
    from scanweaver.runtime.cuda_artifact import load
    from tests.cuda_fakes import fake_cuda_bindings_driver, param_sizes_of

    batch, D, L, n = 2, 4, 8, 16  # the kernel's sizes are dynamic but N
    grouped = (batch, 2, n, L)
    shapes = {"u": (batch, D, L), "delta": (batch, D, L), "A": (D, n), "B": grouped, "C": grouped,
              "D": (D,), "z": (batch, D, L), "delta_bias": (D,)}
    out = _compile(tmp_path, "ptx", ir=selective_scan_ir(shapes, {"delta_softplus": True, "return_last_state": True}))
    doc, _ = read_artifact(out)
    contract = doc["functions"]["selective_scan"]["contract"]
    assert contract["arg_names"][3] == "B" and contract["unchecked"] == []
    sizes = param_sizes_of(doc["kernels"])
    drv = fake_cuda_bindings_driver(lambda image, name: sizes[name])
    program = load(out, driver=CudaPythonDriver(drv))

    def call(batch, D, L, G):
        f = lambda *s: np.zeros(s, np.float32)  # noqa: E731
        program.selective_scan(f(batch, D, L), f(batch, D, L), f(D, 16), f(batch, G, 16, L), f(batch, G, 16, L),
                               f(D), f(batch, D, L), f(D), f(batch, D, L), f(batch, D, 16))

    with pytest.raises(ScanWeaverValueError, match=r"argument 'B' \(#3\) has shape \(2, 3, 16, 8\).*reads dimension 1 at indices 0..3"):
        call(2, 4, 8, 3)
    assert not drv.launches
    call(2, 4, 8, 2)
    assert len(drv.launches) == len(doc["functions"]["selective_scan"]["kernels"])
