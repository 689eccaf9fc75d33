"""The compile cache runs what it finds, so it trusts only what the user alone can write
(issue 10, item 9): a 0700 directory, entries owned by the user and not writable by
group or others; a well-formed entry with malformed content is a miss for every reader.
"""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest

from scanweaver.toolchain import cache

HERE = Path(__file__).parent
AFFINE = (HERE.parent / "filecheck" / "loops" / "scan_to_loops.mlir").read_text()
ONE_FUNCTION = AFFINE.split("func.func @widen_int")[0]
TINY = "func.func @tiny(%a: memref<?xf32>, %n: index) {\n  func.return\n}\n"  # quick to build


@pytest.fixture
def cache_at(tmp_path, monkeypatch):
    """A fresh cache directory (not yet created) and a fresh warn-once memory."""
    root = tmp_path / "parent" / "cache"
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(root))
    monkeypatch.setattr(cache, "_WARNED", set())
    return root


def counting_build(payload=b"built"):
    calls = []

    def build():
        calls.append(1)
        return payload

    return build, calls


def entry(root: Path, key: str) -> Path:
    return root / key[:2] / key


def test_directory_and_entries_are_private(cache_at):
    key = cache.cache_key("t", "x")
    build, _ = counting_build()
    assert cache.cached(key, build) == (b"built", False)
    for d in (cache_at, cache_at / key[:2]):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert stat.S_IMODE(entry(cache_at, key).stat().st_mode) == 0o600
    assert cache.cached(key, build) == (b"built", True)


def _is_refused(key, build, calls, expect_warning: str) -> None:
    with pytest.warns(cache.CacheWarning, match=expect_warning):
        assert cache.cached(key, build) == (b"built", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: not again
        assert cache.cached(key, build) == (b"built", False)
    assert len(calls) == 2, "every call builds: the cache is not used"


@pytest.mark.parametrize("mode,who", [(0o770, "its group"), (0o707, "others"), (0o777, "others")])
def test_writable_directory_is_refused(cache_at, mode, who):
    cache_at.mkdir(parents=True)
    os.chmod(cache_at, mode)
    key = cache.cache_key("t", "writable dir")
    build, calls = counting_build()
    _is_refused(key, build, calls, f"compile cache disabled: .* writable by {who}")
    assert not (cache_at / key[:2]).exists(), "nothing stored in an unsafe directory"


def test_directory_of_another_user_is_refused(cache_at, monkeypatch):
    cache_at.mkdir(parents=True, mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(cache_at).st_uid + 1)  # we are someone else
    key = cache.cache_key("t", "foreign dir")
    build, calls = counting_build()
    _is_refused(key, build, calls, "compile cache disabled: .* owned by user id")


def test_unsafe_shard_directory_is_refused(cache_at):
    key = cache.cache_key("t", "shard")
    build, calls = counting_build()
    cache.cached(key, build)
    os.chmod(cache_at / key[:2], 0o777)
    with pytest.warns(cache.CacheWarning, match="writable by others"):
        assert cache.cached(key, build) == (b"built", False)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_entry_owned_by_another_user_is_not_run(cache_at):
    """A forged entry with a valid checksum, owned by someone else: ignored, rebuilt."""
    from scanweaver import compiler

    honest = compiler.build_cpu(TINY)
    key = cache.cache_key("cpu-build", TINY, openmp=False)
    forged = json.dumps({"llvm_ir": "; forged\n" + honest.llvm_ir, "signatures": honest.signatures}).encode()
    cache.store(key, forged)
    os.chown(entry(cache_at, key), 65534, 65534)
    with pytest.warns(cache.CacheWarning, match="ignored: it is owned by user id 65534"):
        rebuilt = compiler.build_cpu(TINY)
    assert not rebuilt.cache_hit and "; forged" not in rebuilt.llvm_ir
    assert os.stat(entry(cache_at, key)).st_uid == os.geteuid(), "replaced by our own entry"
    assert compiler.build_cpu(TINY).cache_hit


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_writable_entry_is_ignored_and_replaced(cache_at, mode):
    key = cache.cache_key("t", f"entry {mode}")
    build, calls = counting_build()
    cache.cached(key, build)
    os.chmod(entry(cache_at, key), mode)
    with pytest.warns(cache.CacheWarning, match="ignored: it is writable by"):
        assert cache.cached(key, build) == (b"built", False)
    assert stat.S_IMODE(entry(cache_at, key).stat().st_mode) == 0o600
    assert cache.cached(key, build) == (b"built", True)
    assert len(calls) == 2


def test_symlinked_entry_is_not_followed(cache_at, tmp_path):
    key = cache.cache_key("t", "symlink")
    build, calls = counting_build()
    cache.cached(key, build)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(entry(cache_at, key).read_bytes())
    entry(cache_at, key).unlink()
    entry(cache_at, key).symlink_to(elsewhere)
    assert cache.load(key) is None
    assert cache.cached(key, build) == (b"built", False)
    assert not entry(cache_at, key).is_symlink()


# ----------------------------------------------- valid checksum, malformed content

MALFORMED_JSON = [
    b"not json at all",
    b"\xff\xfe\x00",
    b"[]",
    b"null",
    b'{"llvm_ir": "x"}',
    b'{"signatures": {}}',
    b'{"llvm_ir": 5, "signatures": {}}',
    b'{"llvm_ir": "x", "signatures": []}',
    b'{"llvm_ir": "x", "signatures": {"f": "ab"}}',
    b'{"llvm_ir": "x", "signatures": {"f": [[1], []]}}',
    b'{"llvm_ir": "x", "signatures": {"f": [["f32"]]}}',
    b'{"ptx": "x"}',
    b'{"ptx": 1, "ptxas": {}}',
    b'{"ptx": "x", "ptxas": {"k": {"registers": "many"}}}',
    b'{"ptx": "x", "ptxas": []}',
]


def test_cpu_build_entry_with_bad_content_is_rebuilt(cache_at):
    from scanweaver import compiler

    key = cache.cache_key("cpu-build", TINY, openmp=False)
    honest = compiler.build_cpu(TINY)  # also caches the inner LLVM IR: fast rebuilds
    for content in MALFORMED_JSON:
        cache.store(key, content)
        build = compiler.build_cpu(TINY)
        assert not build.cache_hit, content
        assert (build.llvm_ir, build.signatures) == (honest.llvm_ir, honest.signatures)
        assert json.loads(cache.load(key))["llvm_ir"] == build.llvm_ir  # overwritten
        assert compiler.build_cpu(TINY).cache_hit


def test_llvm_ir_entry_that_is_not_text_is_rebuilt(cache_at):
    from scanweaver import compiler

    lowered = compiler.lower(ONE_FUNCTION, "loops", keep_stages=False)
    llvm_ir, hit = compiler.cpu_llvm_ir(lowered.module)
    key = cache.cache_key("llvm-ir", compiler.print_ir(lowered.module), openmp=False)
    assert cache.load(key) == llvm_ir.encode()
    cache.store(key, b"\xff\xfe not utf-8")
    again, hit = compiler.cpu_llvm_ir(lowered.module)
    assert (again, hit) == (llvm_ir, False)
    assert cache.load(key) == llvm_ir.encode()


def test_ptx_entry_with_bad_content_is_rebuilt(cache_at, monkeypatch):
    """The CUDA program reader (no GPU needed: the PTX export is replaced by a stub)."""
    from scanweaver.runtime import cuda_program
    from scanweaver.toolchain import gpu_export

    exports = []

    def fake_export(module, chip="sm_90", **_):
        exports.append(chip)
        return {"ptx": {"m": "// ptx"}, "ptxas": {"k": {"registers": 8}}}

    monkeypatch.setattr(gpu_export, "export_gpu", fake_export)
    key = _ptx_key()
    for content in (b"not json", b'{"ptx": 1, "ptxas": {}}', b'{"ptx": "x", "ptxas": {"k": {"registers": "many"}}}'):
        exports.clear()
        cache.store(key, content)
        artifacts = cuda_program.build_cuda_artifacts(ONE_FUNCTION, "sm_90")
        assert (artifacts.ptx, artifacts.ptxas) == ("// ptx", {"k": {"registers": 8}}), content
        assert exports == ["sm_90"]
        cuda_program.build_cuda_artifacts(ONE_FUNCTION, "sm_90")
        assert exports == ["sm_90"], "the rebuilt entry is used"


def _ptx_key() -> str:
    from scanweaver import compiler
    from scanweaver.toolchain.gpu_export import print_generic

    lowered = compiler.lower(ONE_FUNCTION, "gpu")
    return cache.cache_key("ptx", print_generic(lowered.module), chip="sm_90")


def test_every_reader_goes_through_a_parser():
    """Where the cache is read in the package: only `cached(..., parse=...)`, no raw loads."""
    root = Path(cache.__file__).resolve().parent.parent
    readers = {}
    for path in root.rglob("*.py"):
        text = path.read_text()
        if path.name != "cache.py" and ("cache.load(" in text or "cache.cached(" in text):
            readers[path.relative_to(root).as_posix()] = text
    assert set(readers) == {"compiler.py", "runtime/cuda_program.py", "runtime/cpu.py", "runtime/cpu_native.py"}
    for name, text in readers.items():
        assert "cache.load(" not in text, name
        calls = text.count("cache.cached(")
        assert calls and text.count("parse=") >= calls, name


def test_command_line_warns_once_and_still_builds(tmp_path):
    import subprocess
    import sys

    unsafe = tmp_path / "shared"
    unsafe.mkdir()
    os.chmod(unsafe, 0o777)
    src = tmp_path / "x.mlir"
    src.write_text(ONE_FUNCTION)
    out = tmp_path / "x.ll"
    r = subprocess.run(
        [sys.executable, "-m", "scanweaver.cli", "compile", str(src), "--target", "llvm",
         "--lower-for", "loops", "-o", str(out)],
        capture_output=True, text=True, env={**os.environ, "SCANWEAVER_CACHE_DIR": str(unsafe)},
    )
    assert r.returncode == 0, r.stderr
    warned = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert warned == [
        f"scanweaver: warning: compile cache disabled: {unsafe} is not safe to run code from: "
        "it is writable by others (mode 777)"
    ], r.stderr
    assert "define void @reverse_init_final" in out.read_text()
    assert list(unsafe.iterdir()) == []
