"""The GPU check bundle (benchmarks/gpu/): it builds here, stays small, matches what the
compiler builds now, and its runner goes as far as it can without a GPU: every case's
artifact loaded and every kernel launched on a fake driver, with each descriptor
pointing into its own allocation with the case's shape; the references and comparisons
the runner uses are checked against ScanWeaver's CPU path."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "benchmarks" / "gpu" / "bundle"
TESTS = REPO / "tests"

sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
import build_bundle  # noqa: E402

FAMILIES = {"affine", "generic", "selective", "linear_recurrence", "dynamic_state", "multilag", "masked"}


def _listing():
    return json.loads((BUNDLE / "cases.json").read_text())


def test_committed_bundle_covers_every_family_and_is_small():
    cases = _listing()["cases"]
    names = {c["name"] for c in cases}
    assert {c["family"] for c in cases} == FAMILIES
    for want in ("affine_f32", "affine_f64", "affine_i32", "affine_reverse_f32", "affine_init_final_f32",
                 "affine_large_offsets_f32", "generic_pair_f32", "linear_recurrence_iir2_f32",
                 "dynamic_state_ema_f32", "multilag3_one_series_f32", "masked_channels_f32"):
        assert want in names
    assert {f"selective_N{n}_{bc}" for n in (16, 32) for bc in ("constant", "shared", "grouped")} <= names
    size = sum(f.stat().st_size for f in BUNDLE.iterdir())
    assert size < 8 << 20, size  # well under the 64 MiB that travels
    for c in cases:  # ptxas figures recorded at build time: no spills anywhere
        for kernel, f in c["ptxas"].items():
            assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (c["name"], kernel)
    large = next(c for c in cases if c["name"] == "affine_large_offsets_f32")
    assert int(np.prod(large["args"][0]["shape"])) * 4 > 2**31


def test_bundle_builds_and_matches_the_committed_one(tmp_path):
    doc = build_bundle.build(tmp_path, only=["affine_f32", "generic_cumsum_i32"], progress=lambda s: None)
    assert [c["name"] for c in doc["cases"]] == ["affine_f32", "generic_cumsum_i32"]
    for name in ("affine_f32", "generic_cumsum_i32"):
        fresh = json.loads((tmp_path / f"{name}.ptx.launch.json").read_text())
        committed = json.loads((BUNDLE / f"{name}.ptx.launch.json").read_text())
        assert fresh == committed, f"benchmarks/gpu/bundle is stale: rerun benchmarks/gpu/build_bundle.py ({name})"


DRY = r"""
import glob, json, struct, sys, types
sys.path.insert(0, TESTS)
from cuda_fakes import fake_cuda_bindings_driver, param_sizes_of
by_image = {}
for f in glob.glob(BUNDLE + "/*.launch.json"):
    by_image[open(f[: -len(".launch.json")], "rb").read()] = (json.load(open(f)), param_sizes_of(json.load(open(f))["kernels"]))
drv = fake_cuda_bindings_driver(lambda image, name: by_image[image][1][name])
pkg, sub = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
pkg.bindings, sub.driver = sub, drv
sys.modules.update({"cuda": pkg, "cuda.bindings": sub, "cuda.bindings.driver": drv})
import runpy
sys.argv = ["run_bundle.py", "--dry-run", "--json", OUT]
code = 0
try:
    runpy.run_path(RUNNER, run_name="__main__")
except SystemExit as e:
    code = e.code
# every memref descriptor: aligned pointer inside a live allocation, big enough for its sizes
allocs = {p: b.nbytes for p, b in drv.memory.buffers.items()}
problems = []
for launch in drv.launches:
    doc, _ = by_image[drv.images[launch.function[1][1]]]
    (k,) = [k for k in doc["kernels"] if k["kernel"] == launch.function[2].decode()]
    i = 0
    for name, kind, dtype, shape in k["args"]:
        if kind == "scalar":
            i += 1
            continue
        rank = len(shape)
        q = [struct.unpack("<q", launch.param_bytes[i + j])[0] for j in range(3 + 2 * rank)]
        ptr, sizes, strides = q[1], q[3:3 + rank], q[3 + rank:]
        item = {"f32": 4, "f64": 8, "i32": 4, "i64": 8}[dtype]
        n = 1
        for s in sizes:
            n *= s
        # inside one live allocation (a view case starts a few elements into its buffer)
        base = next((p for p, size in allocs.items() if p <= ptr < p + size), None)
        if q[0] != ptr or q[2] != 0 or base is None or base + allocs[base] < ptr + n * item:
            problems.append((k["kernel"], name, q[:3], base))
        if strides and strides[-1] != 1:
            problems.append((k["kernel"], name, "stride", strides))
        i += 3 + 2 * rank
print(json.dumps({"code": code, "launches": len(drv.launches), "problems": problems,
                  "heavy": sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("xdsl", "mlir", "llvm")})}))
"""


def test_runner_dry_run_on_a_fake_driver(tmp_path):
    out = tmp_path / "gpu-check.json"
    script = (DRY.replace("TESTS", repr(str(TESTS))).replace("BUNDLE", repr(str(BUNDLE)))
              .replace("OUT", repr(str(out))).replace("RUNNER", repr(str(REPO / "benchmarks/gpu/run_bundle.py"))))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["code"] == 0 and got["problems"] == [] and got["heavy"] == []
    result = json.loads(out.read_text())
    statuses = {c["name"]: c["check"]["status"] for c in result["cases"]}
    assert statuses.pop("affine_large_offsets_f32") == "skipped"
    assert set(statuses.values()) == {"dry-run"} and len(statuses) == len(_listing()["cases"]) - 1
    # one launch per case, three for the time-block cases (several blocks per channel),
    # two for the look-back ones (the status words' reset, then the single pass)
    assert got["launches"] == sum(len(c.get("launches", [])) for c in result["cases"])
    assert all(len(c["launches"]) == (3 if "time_blocks" in c["name"] else 2 if "lookback" in c["name"] else 1)
               for c in result["cases"] if c["name"] in statuses)
    by_name = {c["name"]: c for c in result["cases"]}
    assert by_name["affine_f32"]["launches"][0]["grid"] == [1024, 1, 1]
    assert by_name["selective_N32_grouped"]["launches"][0]["grid"] == [2 * 256, 1, 1]
    assert all(lc["dynamic_shared_bytes"] == 0 for c in result["cases"] for lc in c.get("launches", []))


# -------------------------------------------------- the runner's references, on the CPU


@pytest.fixture(scope="module")
def runner():
    return runpy.run_path(str(REPO / "benchmarks" / "gpu" / "run_bundle.py"), run_name="gpu_check_runner")


def _small(case, **shapes):
    case = json.loads(json.dumps(case))
    for a in case["args"]:
        if a["name"] in shapes:
            a["shape"] = list(shapes[a["name"]])
    return case


def _f32_loop(a, b, init=None, reverse=False):
    """The recurrence in the inputs' own type, written out independently of the runner."""
    h = np.empty_like(a)
    s = np.zeros(a.shape[0], a.dtype) if init is None else init.copy()
    for t in (range(a.shape[1] - 1, -1, -1) if reverse else range(a.shape[1])):
        s = a[:, t] * s + b[:, t]
        h[:, t] = s
    return h, s


def test_references_agree_with_the_cpu_path(runner):
    import scanweaver

    cases = {c["name"]: c for c in _listing()["cases"]}
    rng = np.random.default_rng(1)
    # affine f32, reversed, and with init
    for name in ("affine_f32", "affine_reverse_f32", "affine_init_final_f32"):
        c = _small(cases[name], a=(3, 50), b=(3, 50), h=(3, 50), init=(3,), final=(3,))
        x = runner["make_inputs"](c, rng)
        want = runner["reference"](c, x)
        h, final = _f32_loop(x["a"], x["b"], x.get("init"), c.get("reverse", False))
        assert runner["compare"](h, want["h"], "f32", None)["ok"]
        assert runner["compare"](final, want["final"], "f32", None)["ok"]
        h[1, 7] = np.nan  # an unwritten element fails the check
        assert not runner["compare"](h, want["h"], "f32", None)["ok"]
    # i32 wraps like the loop, bit for bit
    c = _small(cases["affine_i32"], a=(2, 40), b=(2, 40), h=(2, 40), final=(2,))
    x = runner["make_inputs"](c, rng)
    h, _ = _f32_loop(x["a"], x["b"])
    assert runner["compare"](h, runner["reference"](c, x)["h"], "i32", None) == {"ok": True, "mismatches": 0}
    # only the checked rows of the large case
    c = _small(cases["affine_large_offsets_f32"], a=(6, 30), b=(6, 30), h=(6, 30), final=(6,))
    x = runner["make_inputs"](c, rng)
    h, _ = _f32_loop(x["a"], x["b"])
    assert runner["compare"](h, runner["reference"](c, x)["h"], "f32", 4)["ok"]
    # selective scan, grouped B/C: the runner's inputs through the CPU kernel
    c = _small(cases["selective_N16_grouped"], u=(2, 8, 40), delta=(2, 8, 40), z=(2, 8, 40), A=(8, 16),
               B=(2, 2, 16, 40), C=(2, 2, 16, 40), D=(8,), delta_bias=(8,))
    x = runner["make_inputs"](c, rng)
    out, last = scanweaver.selective_scan(x["u"], x["delta"], x["A"], x["B"], x["C"], D=x["D"], z=x["z"],
                                          delta_bias=x["delta_bias"], delta_softplus=True,
                                          return_last_state=True, backend="cpu")
    want = runner["reference"](c, x)
    assert runner["compare"](out, want["out"], "f32", None)["ok"]
    assert runner["compare"](last, want["last_state"], "f32", None)["ok"]


@pytest.mark.parametrize("name,function,ir,shapes", [
    ("dynamic_state_ema_f32", "ema", build_bundle.DYNAMIC_STATE_EMA, dict(x=(9, 5), a=(5,), h=(5,), y=(9, 5))),
    ("multilag3_one_series_f32", "iir3", build_bundle.MULTILAG3, dict(x=(40,), y=(40,))),
    ("masked_channels_f32", "masked", build_bundle.MASKED_CHANNELS,
     dict(x=(3, 30), a=(3, 30), mask=(3, 30), y=(3, 30), hs=(3,))),
])
def test_new_form_references_agree_with_the_interpreter(runner, name, function, ir, shapes):
    """The runner's float64 references of the issue-14 forms against the interpreted loops."""
    from scanweaver.interp.run import run_function

    c = _small(next(c for c in _listing()["cases"] if c["name"] == name), **shapes)
    x = runner["make_inputs"](c, np.random.default_rng(3))
    arrays = {a["name"]: (x[a["name"]].copy() if a["name"] in x else np.zeros(a["shape"], np.float32))
              for a in c["args"]}
    run_function(ir, function, *arrays.values())
    want = runner["reference"](c, x)
    assert set(want) == {a["name"] for a in c["args"] if a["role"] in ("out", "inout")}
    for k, v in want.items():
        assert runner["compare"](arrays[k], v, "f32", None)["ok"], (name, k)
        if name == "masked_channels_f32" and k == "y":  # masked-off steps keep the state
            assert np.count_nonzero(x["mask"]) not in (0, x["mask"].size)


def test_generic_pair_reference_is_the_affine_scan(runner):
    c = _small(next(c for c in _listing()["cases"] if c["name"] == "generic_pair_f32"),
               x0=(2, 20), x1=(2, 20), y0=(2, 20), y1=(2, 20))
    x = runner["make_inputs"](c, np.random.default_rng(2))
    want = runner["reference"](c, x)
    # y1 is h_t = a_t h_{t-1} + b_t from h_0 = b_0, y0 the running product
    h = np.zeros(2)
    for t in range(20):
        h = x["x0"][:, t] * h + x["x1"][:, t] if t else x["x1"][:, 0].astype(np.float64)
        np.testing.assert_allclose(want["y1"][:, t], h, rtol=1e-12)
    np.testing.assert_allclose(want["y0"], np.cumprod(x["x0"].astype(np.float64), axis=1), rtol=1e-12)


def test_readme_section(tmp_path):
    from scanweaver.bench.gpu_check import readme_section

    assert "Nothing has run on GPU hardware yet" in readme_section(tmp_path)
    result = {"dry_run": False, "created": "2026-12-01T00:00:00+00:00",
              "machine": {"gpu": "NVIDIA H200", "chip": "sm_90", "driver_binding": "cuda-python", "python": "3.12.3"},
              "cases": [{"name": "affine_f32", "check": {"status": "ok"},
                         "timing": {"scanweaver_ms": 0.5, "gbs": 100.0, "copy_fraction": 0.25,
                                    "peers": {"torch-loop": {"status": "ok", "ms": 40.0}}}},
                        {"name": "affine_i32", "check": {"status": "wrong"}}]}
    (tmp_path / "gpu-check.json").write_text(json.dumps(result))
    text = readme_section(tmp_path)
    assert "| affine_f32 | ok | 0.5 | 100 | 25% | torch-loop 40 |" in text
    assert "| affine_i32 | wrong | - |" in text and "NVIDIA H200 (sm_90)" in text


CHECKED = r"""
import ctypes, glob, json, struct, sys, types
import numpy as np
sys.path.insert(0, TESTS)
from cuda_fakes import fake_cuda_bindings_driver, param_sizes_of
by_image = {}
for f in glob.glob(BUNDLE + "/*.launch.json"):
    doc = json.load(open(f))
    by_image[open(f[: -len(".launch.json")], "rb").read()] = ({k["kernel"]: k for k in doc["kernels"]},
                                                                param_sizes_of(doc["kernels"]))
NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32}

def arrays(pb, k):
    out, i = {}, 0
    for name, kind, dtype, shape in k["args"]:
        r = len(shape)
        q = [struct.unpack("<q", pb[i + j])[0] for j in range(3 + 2 * r)]
        n = int(np.prod(q[3:3 + r])) if r else 1
        buf = (ctypes.c_char * (n * np.dtype(NP[dtype]).itemsize)).from_address(q[1])
        out[name] = np.frombuffer(buf, NP[dtype]).reshape(q[3:3 + r])
        i += 3 + 2 * r
    return out

def kernel(pb, image, name):
    # stands in for the GPU: the affine scan and the generic cumsum, on the descriptors
    k = by_image[image][0][name]
    x = arrays(pb, k)
    if name.startswith("scan_affine"):
        s = x["init"].copy() if "init" in x else np.zeros(x["h"].shape[0], x["h"].dtype)
        steps = range(x["a"].shape[1])
        if "reverse" in k["notes"]:
            steps = reversed(steps)
        with np.errstate(over="ignore"):
            for t in steps:
                s = x["a"][:, t] * s + x["b"][:, t]
                x["h"][:, t] = s
        if "final" in x:
            x["final"][:] = s
    elif "x1" not in x:  # the one-operand generic scan: cumsum; the pair scan: no stand-in
        x["y0"][...] = np.cumsum(x["x0"], axis=1, dtype=x["x0"].dtype)

drv = fake_cuda_bindings_driver(lambda image, name: by_image[image][1][name], kernel=kernel)
pkg, sub = types.ModuleType("cuda"), types.ModuleType("cuda.bindings")
pkg.bindings, sub.driver = sub, drv
sys.modules.update({"cuda": pkg, "cuda.bindings": sub, "cuda.bindings.driver": drv, "torch": None})
import runpy
sys.argv = ["run_bundle.py", "--json", OUT, "--reps", "2", "--cases", "affine_f32", "affine_i32",
            "affine_reverse_f32", "affine_init_final_f32", "generic_cumsum_i32", "generic_pair_f32",
            "affine_view_f32", "affine_view_f64", "generic_view_cumsum_i32"]
code = 0
try:
    runpy.run_path(RUNNER, run_name="__main__")
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code}))
"""


def test_runner_checks_and_times_on_a_fake_gpu(tmp_path):
    """The runner's whole path (staging, NaN prefill, copy back, float64 checks, CUDA
    event timing, the copy baseline, JSON) with numpy standing in for the kernels; the
    generic pair scan has no stand-in, so its NaN-prefilled outputs must fail."""
    out = tmp_path / "gpu-check.json"
    script = (CHECKED.replace("TESTS", repr(str(TESTS))).replace("BUNDLE", repr(str(BUNDLE)))
              .replace("OUT", repr(str(out))).replace("RUNNER", repr(str(REPO / "benchmarks/gpu/run_bundle.py"))))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"code": 1}  # the pair scan failed
    result = json.loads(out.read_text())
    by_name = {c["name"]: c for c in result["cases"]}
    for name in ("affine_f32", "affine_i32", "affine_reverse_f32", "affine_init_final_f32", "generic_cumsum_i32",
                 "affine_view_f32", "affine_view_f64", "generic_view_cumsum_i32"):
        assert by_name[name]["check"]["status"] == "ok", by_name[name]["check"]
    assert by_name["affine_i32"]["check"]["outputs"]["h"] == {"ok": True, "mismatches": 0}
    pair = by_name["generic_pair_f32"]["check"]
    assert pair["status"] == "wrong" and pair["outputs"]["y0"]["nan"] == 512 * 4096
    t = by_name["affine_f32"]["timing"]
    assert t["scanweaver_ms"] == 1.5 / 2 and t["min_bytes"] == 3 * 1024 * 4096 * 4 + 1024 * 4
    assert t["peers"]["torch"]["status"] == "skipped"
    assert "timing" not in by_name["affine_init_final_f32"]  # not a timed case
