"""`scanweaver.load` checks every field of a launch.json before using it: a damaged,
edited or foreign document is one `ScanWeaverValueError` naming the file and the
field, never a KeyError, an IndexError, a launch with a negative grid or a read
outside the artifact's directory."""

from __future__ import annotations

import copy
import glob
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scanweaver.errors import ScanWeaverValueError
from scanweaver.runtime.cuda_artifact import describe, plan, read_artifact, write_artifact
from tests.test_cuda_drivers import DESC as DRIVER_DESC

REPO = Path(__file__).resolve().parent.parent

# the drivers' test launch (a, gamma, h) with a scratch buffer, dims that must agree and
# a cdiv grid: every field of a kernel entry in use
DESC = replace(
    DRIVER_DESC,
    grid=("h.shape[0]*cdiv(h.shape[1],8192)", 1, 1),
    shared_bytes=36,
    args=[*DRIVER_DESC.args, ("agg", "out", "f32", ("?",))],
    host_args=(0, 1, 2, -2),
    equal_dims=(("a", 0, "h", 0), ("a", 1, "h", 1)),
    scratch=(("agg", ("expr:mul(h.shape[0],2)",)),),
)

_ROWS = ["iv", ["const", 0], ["dim", 0, 0]]
_COLS = ["iv", ["const", 0], ["dim", 0, 1]]
# f(a, gamma, h) stores h[c, t] for c < a.shape[0], t < a.shape[1] (`contract_check`)
CONTRACT = {
    "name": "f", "arg_names": ["a", "gamma", "h"], "same_shape": [[0, 2, [0], [0]]],
    "accesses": [{"op": "memref.store %v, %h[%c, %t]", "arg": 2, "indices": [_ROWS, _COLS], "extents": [1, 1],
                  "loops": [[["const", 0], ["dim", 0, 0]]], "write": True, "index_texts": ["c", "t"]}],
    "unchecked": [],
}


def _ptx_entry(name: str, sizes: list[int]) -> str:
    """PTX text with one entry taking parameters of these sizes (no body needed here)."""
    params = ",\n".join(f"\t.param .{'f' if n == 4 else 'u'}{8 * n} {name}_param_{i}" for i, n in enumerate(sizes))
    return f"//\n.version 8.0\n.target sm_90\n.visible .entry {name}(\n{params}\n)\n{{\n\tret;\n}}\n"


PTX = _ptx_entry("k0", DESC.param_sizes())


@pytest.fixture
def artifact(tmp_path):
    out = tmp_path / "k.ptx"
    doc = describe(PTX, out.name, "sm_90", {"f": [DESC]}, {"f": 3}, contracts={"f": CONTRACT})
    write_artifact(out, PTX, doc)
    return out


def _tampered(artifact: Path, change) -> Path:
    meta = artifact.with_name(artifact.name + ".launch.json")
    doc = json.loads(meta.read_text())
    change(doc)
    meta.write_text(json.dumps(doc))
    return artifact


def _kernel(**fields):
    return lambda doc: doc["kernels"][0].update(fields)


def _arg(index, position, value):
    return lambda doc: doc["kernels"][0]["args"][index].__setitem__(position, value)


CASES = [
    ("no image", lambda d: d.pop("image"), "the document has no 'image'"),
    ("image up a directory", lambda d: d.update(image="../k.ptx"), "image '../k.ptx' must be a file name"),
    ("image absolute", lambda d: d.update(image="/etc/passwd"), "image '/etc/passwd' must be a file name"),
    ("image number", lambda d: d.update(image=5), "image must be a string, not an integer"),
    ("image kind", lambda d: d.update(image_kind="elf"), "image_kind is 'elf'; expected one of ptx, cubin"),
    ("chip", lambda d: d.update(chip="sm_90 cubin-format=bin"), "chip 'sm_90 cubin-format=bin' is not a valid"),
    ("version string", lambda d: d.update(version="1"), "artifact version '1'; this ScanWeaver reads 1"),
    ("version true", lambda d: d.update(version=True), "artifact version True"),
    ("functions list", lambda d: d.update(functions=[]), "functions must be an object, not a list"),
    ("no kernels", lambda d: d.pop("kernels"), "has no 'kernels'"),
    ("kernel index past the end", lambda d: d["functions"]["f"].update(kernels=[1]),
     r"functions.f.kernels\[0\] is 1; it must be between 0 and 0"),
    ("kernel index negative", lambda d: d["functions"]["f"].update(kernels=[-1]), "is -1; it must be between 0 and 0"),
    ("arg count string", lambda d: d["functions"]["f"].update(arg_count="3"), "arg_count must be an integer"),
    ("function arg shape", lambda d: d["functions"]["f"]["args"][0].update(shape=5),
     r"functions.f.args\[0\].shape must be a list, not an integer"),
    ("arg count negative", lambda d: d["functions"]["f"].update(arg_count=-1), "arg_count is -1"),
    ("grid python", _kernel(grid=["__import__('os').getcwd()", 1, 1]), r"grid\[0\] is not a launch size formula"),
    ("grid negative", _kernel(grid=[-5, 1, 1]), r"grid\[0\] is -5; it must be between 1 and 2147483647"),
    ("grid y over 65535", _kernel(grid=[1, 65536, 1]), r"grid\[1\] is 65536; it must be between 1 and 65535"),
    ("grid float", _kernel(grid=[2.5, 1, 1]), "must be a positive integer or a size formula, not a number"),
    ("grid boolean", _kernel(grid=[True, 1, 1]), "not a boolean"),
    ("grid two entries", _kernel(grid=[1, 1]), "grid must have 3 entries, not 2"),
    ("grid always 0", _kernel(grid=["h.shape[0]*0", 1, 1]), "is 0 for arrays of any size"),
    ("grid unknown argument", _kernel(grid=["zz.shape[0]", 1, 1]), "no size zz.shape"),
    ("grid deep formula", _kernel(grid=["expr:" + "add(1," * 400 + "1" + ")" * 400, 1, 1]), "at most 1000"),
    ("block negative", _kernel(block=[-128, 1, 1]), r"block\[0\] is -128"),
    ("block too many threads", _kernel(block=[1024, 2, 1]), "asks for 2048 threads"),
    ("block string", _kernel(block=["128", 1, 1]), "must be an integer, not a string"),
    ("shared over the limit", _kernel(static_shared_bytes=10**9), "static_shared_bytes is 1000000000"),
    ("static + dynamic over the limit", _kernel(dynamic_shared_bytes=49152),
     "dynamic_shared_bytes is 49152; it must be between 0 and 49116"),
    ("shared negative", _kernel(static_shared_bytes=-1), "static_shared_bytes is -1"),
    ("arg kind", _arg(0, 1, "weird"), r"args\[0\]\[1\] is 'weird'"),
    ("arg dtype", _arg(0, 2, "f128"), r"args\[0\]\[2\] is 'f128'"),
    ("arg size negative", _arg(0, 3, [-1, "?"]), r"args\[0\]\[3\]\[0\] is -1"),
    ("scalar with a shape", _arg(1, 3, ["?"]), r"args\[1\]\[3\] must have 0 entries"),
    ("arg too short", lambda d: d["kernels"][0]["args"].__setitem__(0, ["a", "in"]), "must have 4 entries, not 2"),
    ("host arg past the function's", _kernel(host_args=[0, 1, 9, -2]), r"host_args\[2\] is 9"),
    ("host args too few", _kernel(host_args=[0, 1]), "host_args must have 4 entries"),
    ("host arg -1", _kernel(host_args=[0, 1, -1, -2]), "gives argument 'h' no value"),
    ("scratch without a shape", _kernel(scratch=[]), "uses scratch buffer 0 before any kernel gives its shape"),
    ("scalar as array", _kernel(host_args=[0, 0, 2, -2]), "passes function argument #0 as a scalar here"),
    ("abi", _kernel(abi="bare-ptr"), "packs 'memref-descriptor' arguments only"),
    ("equal dims past the rank", _kernel(equal_dims=[["a", 7, "h", 0]]), r"equal_dims\[0\]\[1\] is 7"),
    ("equal dims of a scalar", _kernel(equal_dims=[["gamma", 0, "h", 0]]), "'gamma' is not an array argument"),
    ("kernel name number", _kernel(kernel=7), "kernel must be a string"),
    ("kernel not in the PTX", _kernel(kernel="k1"), "names 'k1', which the PTX does not define"),
    ("arg rank unlike the PTX's", lambda d: _agg_rank_2(d), r"'k0' packs 22 parameters of .* but the PTX entry takes 20"),
    ("scalar type unlike the PTX's", _arg(1, 2, "f64"), r"packs 20 parameters .* 8, 8, 8, 8, 8, 8, 8, 8, 8"),
    ("contract a list", lambda d: d["functions"]["f"].update(contract=[]), "contract is not a shape contract"),
    ("contract dim of a scalar", lambda d: _access(d)["indices"].__setitem__(0, ["dim", 1, 0]),
     r"index tree node \['dim', 1, 0\] is malformed"),
    ("contract dim past the rank", lambda d: _access(d)["indices"].__setitem__(0, ["dim", 0, 2]), "is malformed"),
    ("contract scalar that is an array", lambda d: _access(d)["indices"].__setitem__(0, ["arg", 2]), "is malformed"),
    ("contract tree too deep", lambda d: _access(d)["indices"].__setitem__(0, _deep(300)), "malformed or too deep"),
    ("contract access of no argument", lambda d: _access(d).update(arg=7), "access of argument 7"),
    ("contract op", lambda d: _access(d)["indices"].__setitem__(0, ["**", ["const", 1], ["const", 2]]), "malformed"),
]


def _agg_rank_2(doc):
    """Scratch buffer `agg` edited to rank 2, consistently everywhere but the PTX."""
    _arg(3, 3, ["?", "?"])(doc)
    _kernel(scratch=[["agg", ["h.shape[0]", 2]]])(doc)


def _access(doc):
    return doc["functions"]["f"]["contract"]["accesses"][0]


def _deep(depth):
    tree = ["const", 0]
    for _ in range(depth):
        tree = ["+", tree, ["const", 1]]
    return tree


@pytest.mark.parametrize("name, change, message", CASES, ids=[c[0] for c in CASES])
def test_tampered_launch_description_is_one_clear_error(artifact, name, change, message):
    read_artifact(artifact)  # the untouched artifact loads
    _tampered(artifact, change)
    with pytest.raises(ScanWeaverValueError, match=message) as e:
        read_artifact(artifact)
    assert "k.ptx.launch.json" in str(e.value)


def test_unreadable_documents_and_images(artifact):
    meta = artifact.with_name("k.ptx.launch.json")
    good = meta.read_bytes()
    meta.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ScanWeaverValueError, match="is not UTF-8 text"):
        read_artifact(artifact)
    meta.write_bytes(b"[" * 100_000)
    with pytest.raises(ScanWeaverValueError, match="is not JSON"):
        read_artifact(artifact)
    meta.write_bytes(good)
    doc = json.loads(good)
    artifact.write_bytes(b"\xff\xfe")  # a PTX image that is not text, with a matching hash
    import hashlib

    doc["image_sha256"] = hashlib.sha256(b"\xff\xfe").hexdigest()
    meta.write_text(json.dumps(doc))
    with pytest.raises(ScanWeaverValueError, match="is not PTX text"):
        read_artifact(artifact)
    artifact.unlink()
    with pytest.raises(ScanWeaverValueError, match="cannot read .*k.ptx: No such file"):
        read_artifact(artifact)


def test_every_committed_bundle_artifact_passes_the_checks():
    docs = sorted(glob.glob(str(REPO / "benchmarks" / "gpu" / "bundle" / "*.launch.json")))
    assert docs, "no bundle artifacts found"
    for path in docs:
        doc, _ = read_artifact(path)
        launches, counts = plan(doc)
        assert all(len(seq) >= 1 for seq in launches.values()) and counts


def test_checks_leave_a_good_document_unchanged(artifact):
    meta = artifact.with_name("k.ptx.launch.json")
    before = json.loads(meta.read_text())
    doc, _ = read_artifact(artifact)
    assert doc == before and copy.deepcopy(doc) == before
    (launch,) = plan(doc)[0]["f"]
    assert launch == DESC
    assert doc["functions"]["f"]["contract"] == CONTRACT


def test_the_contract_of_a_loaded_artifact_is_checked_before_any_launch(artifact):
    from scanweaver.runtime.cuda_artifact import load
    from scanweaver.runtime.cuda_driver import CudaPythonDriver
    from tests.cuda_fakes import fake_cuda_bindings_driver

    drv = fake_cuda_bindings_driver([8] * 7 + [4] + [8] * 7 + [8] * 5)
    program = load(artifact, driver=CudaPythonDriver(drv))
    a = np.ones((3, 5), np.float32)
    with pytest.raises(ScanWeaverValueError, match=r"@f: argument 'h' \(#2\) has shape \(3, 4\), but "
                       r"`memref.store %v, %h\[%c, %t\]` writes dimension 1 at indices 0..4"):
        program.f(a, 0.5, np.zeros((3, 4), np.float32))
    with pytest.raises(ScanWeaverValueError, match=r"'a' \(#0\) has shape \(3, 5\) and argument 'h' \(#2\) has shape \(2, 5\)"):
        program.f(a, 0.5, np.zeros((2, 5), np.float32))
    assert not drv.launches


def test_ptx_for_a_newer_chip_than_the_gpu_is_refused_at_load(artifact):
    from scanweaver.runtime.cuda_artifact import load, ptx_runs_on
    from scanweaver.runtime.cuda_driver import CudaPythonDriver
    from tests.cuda_fakes import fake_cuda_bindings_driver

    with pytest.raises(ScanWeaverValueError, match=r"the PTX is for sm_90, which this GPU \(sm_80\) cannot run; "
                       r"rebuild with --chip sm_80"):
        load(artifact, driver=CudaPythonDriver(fake_cuda_bindings_driver([8], cc=(8, 0))))
    load(artifact, driver=CudaPythonDriver(fake_cuda_bindings_driver([8], cc=(10, 0))))  # PTX runs forward
    assert ptx_runs_on("sm_80", "sm_86") and ptx_runs_on("sm_90", "sm_120")
    assert not ptx_runs_on("sm_90a", "sm_100") and ptx_runs_on("sm_90a", "sm_90")
    assert ptx_runs_on("sm_100f", "sm_103") and not ptx_runs_on("sm_100f", "sm_120")


def test_paths_that_name_no_artifact():
    from scanweaver.errors import ScanWeaverTypeError

    for bad in (None, 123, b"k.ptx"):
        with pytest.raises(ScanWeaverTypeError, match="an artifact path must be a str or a path"):
            read_artifact(bad)
    for empty in ("", "/"):
        with pytest.raises(ScanWeaverValueError, match="names no file"):
            read_artifact(empty)  # was a bare ValueError from Path.with_name


def test_the_driver_argument_of_load(artifact, monkeypatch):
    from scanweaver.errors import BackendUnavailableError, ScanWeaverTypeError
    from scanweaver.runtime import cuda_driver
    from scanweaver.runtime.cuda_artifact import load

    with pytest.raises(ScanWeaverValueError, match="driver 'cuda' is not a CUDA driver binding: one of cuda-python"):
        load(artifact, driver="cuda")
    with pytest.raises(ScanWeaverTypeError, match="driver must be a binding's name or a CudaDriver, not int"):
        load(artifact, driver=0)  # was AttributeError: 'int' object has no attribute 'compute_capability'
    cuda_driver.reset_drivers()
    monkeypatch.setitem(__import__("sys").modules, "cuda", None)  # cuda-python absent
    with pytest.raises(BackendUnavailableError, match="cuda-python: not installed"):
        load(artifact, driver="cuda-python")
    cuda_driver.reset_drivers()


def test_ptx_signatures_read_every_parameter_form():
    """What LLVM's NVPTX back end writes for pointers, scalars of each width and
    parameters passed as byte arrays (a half: `.align 2 .b8 p[2]`)."""
    from scanweaver.runtime.cuda_artifact_schema import ptx_signatures

    ptx = (".visible .entry k(\n\t.param .u64 .ptr .align 1 k_param_0,\n\t.param .u8 k_param_1,\n"
           "\t.param .u16 k_param_2,\n\t.param .f32 k_param_3,\n\t.param .align 2 .b8 k_param_4[2]\n)\n{\n}\n"
           ".visible .entry none(\n)\n{\n}\n")
    assert ptx_signatures(ptx) == {"k": [8, 1, 2, 4, 2], "none": []}


@pytest.mark.parametrize("binding", ["cuda-python", "numba-cuda", "numba"])
def test_a_loaded_artifact_launches_through_each_binding(artifact, binding):
    """The same artifact, loaded with each driver binding (fakes): the PTX text reaches
    the binding and the launch carries the descriptors of the arrays passed."""
    import struct

    from scanweaver.runtime.cuda_artifact import load
    from tests.test_cuda_call_checks import _binding

    driver, launches = _binding(binding, DESC.param_sizes())
    driver.compute_capability = lambda: (9, 0)  # the numba fakes say sm_80; the artifact is sm_90 PTX
    program = load(artifact, driver=driver)
    a, h = np.ones((3, 5), np.float32), np.zeros((3, 5), np.float32)
    program.f(a, 0.25, h)
    (launch,) = launches
    assert launch.grid == (3, 1, 1) and launch.block == (128, 1, 1) and launch.dynamic_shared == 0
    sizes = [struct.unpack("<q", launch.param_bytes[i])[0] for i in (3, 4, 5, 6)]
    assert sizes == [3, 5, 5, 1] and struct.unpack("<f", launch.param_bytes[7]) == (0.25,)
    agg = [struct.unpack("<q", launch.param_bytes[i])[0] for i in (18, 19)]
    assert agg == [6, 1]  # the scratch buffer: expr:mul(h.shape[0],2) elements
