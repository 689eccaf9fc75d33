"""Output files of `scanweaver compile` and `scanweaver-opt` (issue 10, items 6-8 and 10).

Never over an input, only regular files replaced, pairs whole or not at all, `-o -`,
no umask changes, one line for deep nesting and Ctrl-C.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scanweaver import outputs
from scanweaver.errors import ScanWeaverError

HERE = Path(__file__).parent
AFFINE = (HERE.parent / "filecheck" / "loops" / "scan_to_loops.mlir").read_text()
BIN = Path(sys.executable).parent


def run(tool: str, *args: str, stdin=None, **kw) -> subprocess.CompletedProcess:
    """The tool in a new process (for what needs one: umask, signals, FIFOs)."""
    module = {"scanweaver": "scanweaver.cli", "scanweaver-opt": "scanweaver.opt"}[tool]
    return subprocess.run(
        [sys.executable, "-m", module, *args], input=stdin, capture_output=True, **kw
    )


@pytest.fixture
def call(capsysbinary, monkeypatch):
    """The tool in this process (fast): returns a CompletedProcess like `run`."""
    from scanweaver import cli, opt

    def call(tool: str, *args: str, cwd: Path | None = None, stdin_file: Path | None = None):
        if cwd is not None:
            monkeypatch.chdir(cwd)
        if stdin_file is not None:
            monkeypatch.setattr(sys, "stdin", open(stdin_file))
        rc = (cli.main if tool == "scanweaver" else opt.main)(list(args))
        got = capsysbinary.readouterr()
        return subprocess.CompletedProcess(args, rc, got.out, got.err)

    return call


def one_line_error(r: subprocess.CompletedProcess, tool: str, message: str) -> None:
    err = r.stderr.decode() if isinstance(r.stderr, bytes) else r.stderr
    lines = [ln for ln in err.splitlines() if not ln.startswith("[scanweaver]")]
    assert r.returncode == 1, err
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error:"), err
    assert message in lines[0], err


def no_temporaries(directory: Path) -> None:
    assert not [p.name for p in directory.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ item 6: same file


def _aliases(tmp_path: Path, src: Path) -> dict[str, str]:
    (tmp_path / "link.mlir").symlink_to(src.name)
    os.link(src, tmp_path / "hard.mlir")
    return {
        "same name": str(src),
        "./name": "./" + src.name,
        "symlink": "link.mlir",
        "hard link": "hard.mlir",
        "absolute via ..": str(tmp_path / ".." / tmp_path.name / src.name),
    }


@pytest.mark.parametrize("tool", ["scanweaver", "scanweaver-opt"])
def test_output_that_is_the_input_is_refused(tmp_path, tool, call):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    for how, out in _aliases(tmp_path, src).items():
        if tool == "scanweaver":
            r = call(tool, "compile", "x.mlir", "--target", "mlir", "-o", out, cwd=tmp_path)
        else:
            r = call(tool, "x.mlir", "-o", out, cwd=tmp_path)
        one_line_error(r, tool, "same file as the input" if how != "same name" else "input")
        assert src.read_text() == AFFINE, how
    # Standard input redirected from the file is the same file too.
    args = ["compile", "-", "--target", "mlir", "-o", "x.mlir"] if tool == "scanweaver" else ["-o", "x.mlir"]
    one_line_error(call(tool, *args, stdin_file=src), tool, "same file as the input (standard input)")
    assert src.read_text() == AFFINE
    no_temporaries(tmp_path)


def test_launch_description_that_is_the_input_is_refused(tmp_path, call):
    src = tmp_path / "out.ptx.launch.json"
    src.write_text(AFFINE)
    r = call("scanweaver", "compile", str(src), "--target", "ptx", "-o", str(tmp_path / "out.ptx"))
    one_line_error(r, "scanweaver", "out.ptx.launch.json: it is the input")
    assert src.read_text() == AFFINE and not (tmp_path / "out.ptx").exists()
    other = tmp_path / "in.mlir"
    other.write_text(AFFINE)
    r = call("scanweaver", "compile", str(other), "--target", "ptx", "-o", str(tmp_path / "a.ptx"),
            "--launch-json", str(tmp_path / "a.ptx"))
    one_line_error(r, "scanweaver", "same file as the output")


# ---------------------------------------------- item 7: stdout, devices, FIFOs, pairs


def test_dash_writes_to_standard_output(tmp_path, call):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    r = call("scanweaver", "compile", str(src), "--target", "mlir", "--lower-for", "loops", "-o", "-")
    assert r.returncode == 0, r.stderr
    assert b"scf.for" in r.stdout and b"scan.affine" not in r.stdout
    assert b"wrote standard output" in r.stderr
    r = call("scanweaver-opt", str(src), "-o", "-")
    assert r.returncode == 0 and b"scan.affine" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.mlir"]


def test_character_device_is_written_through_not_replaced(tmp_path, call):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    before = os.stat(os.devnull)
    assert stat.S_ISCHR(before.st_mode)
    for r in (
        call("scanweaver", "compile", str(src), "--target", "mlir", "--lower-for", "loops", "-o", os.devnull),
        call("scanweaver-opt", str(src), "-o", os.devnull),
    ):
        assert r.returncode == 0, r.stderr
        after = os.stat(os.devnull)  # as root, a rename would have made it a regular file
        assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert not Path(os.devnull + ".launch.json").exists()


def test_fifo_is_written_through(tmp_path):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    r = run("scanweaver-opt", str(src), "-o", str(fifo), timeout=120)
    reader.join(timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert received and b"scan.affine" in received[0]


def test_directories_and_other_kinds_are_refused(tmp_path, call):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    one_line_error(call("scanweaver-opt", str(src), "-o", str(tmp_path)), "scanweaver-opt", "it is a directory")
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(sock_path))
        for r, tool in (
            (call("scanweaver", "compile", str(src), "--target", "mlir", "-o", str(sock_path)), "scanweaver"),
            (call("scanweaver-opt", str(src), "-o", str(sock_path)), "scanweaver-opt"),
        ):
            one_line_error(r, tool, "not a regular file, a character device or a FIFO")
        assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
    finally:
        sock.close()


def test_pair_with_a_refused_second_file_writes_nothing(tmp_path, call):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    (tmp_path / "out.ptx.launch.json").mkdir()
    r = call("scanweaver", "compile", str(src), "--target", "ptx", "-o", str(tmp_path / "out.ptx"))
    one_line_error(r, "scanweaver", "out.ptx.launch.json: it is a directory")
    assert not (tmp_path / "out.ptx").exists()


def test_pair_is_rolled_back_when_the_second_rename_fails(tmp_path, monkeypatch):
    old, new = tmp_path / "old.txt", tmp_path / "new.txt"
    old.write_text("previous")
    real_replace = os.replace
    calls = []

    def failing_replace(a, b, **kw):
        calls.append(b)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(a, b, **kw)

    monkeypatch.setattr(outputs.os, "replace", failing_replace)
    with pytest.raises(ScanWeaverError, match="cannot write .*new.txt: No space left on device"):
        outputs.write_outputs([(str(old), "first"), (str(new), "second")])
    monkeypatch.setattr(outputs.os, "replace", real_replace)
    assert old.read_text() == "previous"  # put back
    assert not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]
    # The other order: the new file goes again, the existing one is untouched.
    calls.clear()
    monkeypatch.setattr(outputs.os, "replace", failing_replace)
    with pytest.raises(ScanWeaverError):
        outputs.write_outputs([(str(new), "first"), (str(old), "second")])
    monkeypatch.setattr(outputs.os, "replace", real_replace)
    assert old.read_text() == "previous" and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.txt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_failing_stream_rolls_the_files_back(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("previous")
    with pytest.raises(ScanWeaverError, match="cannot write /dev/full: No space left on device"):
        outputs.write_outputs([(str(out), "new"), ("/dev/full", "x" * 100)])
    assert out.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_replacing_keeps_mode_and_follows_symlinks(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    os.chmod(target, 0o604)
    link = tmp_path / "link.txt"
    link.symlink_to("real.txt")
    outputs.write_output(str(link), "new")
    assert link.is_symlink() and target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o604
    no_temporaries(tmp_path)


@pytest.mark.parametrize("umask", [0o027, 0o077])
def test_new_outputs_get_the_mode_the_umask_gives(tmp_path, umask):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    out = tmp_path / "out.mlir"
    r = subprocess.run(
        [sys.executable, "-m", "scanweaver.opt", str(src), "-o", str(out)],
        capture_output=True, umask=umask,
    )
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_umask_is_never_touched(tmp_path, monkeypatch):
    from scanweaver import cli

    def forbidden(*_):
        raise AssertionError("os.umask changes process state for every thread")

    monkeypatch.setattr(os, "umask", forbidden)
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    out = tmp_path / "out.mlir"
    assert cli.main(["compile", str(src), "--target", "mlir", "--lower-for", "loops", "-o", str(out)]) == 0
    assert "scf.for" in out.read_text()


def test_launch_json_beside_files_only():
    from types import SimpleNamespace

    from scanweaver.cli import _launch_json_path

    assert _launch_json_path(SimpleNamespace(output="k.ptx", launch_json=None)) == "k.ptx.launch.json"
    assert _launch_json_path(SimpleNamespace(output="-", launch_json=None)) is None
    assert _launch_json_path(SimpleNamespace(output=os.devnull, launch_json=None)) is None
    assert _launch_json_path(SimpleNamespace(output=os.devnull, launch_json="l.json")) == "l.json"


# --------------------------------------------------- item 8: deep nesting and Ctrl-C


def _nested_regions(depth: int) -> str:
    text = "scf.yield\n"
    for _ in range(depth - 1):
        text = "scf.execute_region {\n" + text + "}\nscf.yield\n"
    return "func.func @f() {\nscf.execute_region {\n" + text + "}\nfunc.return\n}\n"


DEEP = {
    "400 regions": _nested_regions(400),
    "5000 brackets": "func.func @f() attributes {x = " + "[" * 5000 + "]" * 5000 + "} {\n  func.return\n}\n",
}


@pytest.mark.parametrize("name", sorted(DEEP))
def test_deep_nesting_is_one_line(tmp_path, name, call):
    import scanweaver

    src = tmp_path / "deep.mlir"
    src.write_text(DEEP[name])
    out = tmp_path / "out.mlir"
    one_line_error(run("scanweaver", "compile", str(src), "--target", "mlir", "-o", str(out)),
                   "scanweaver", "nests too deeply")
    one_line_error(call("scanweaver-opt", str(src), "-o", str(out)), "scanweaver-opt", "nests too deeply")
    assert not out.exists()
    with pytest.raises(ValueError, match="nests too deeply"):
        scanweaver.compile(DEEP[name])


# Raises KeyboardInterrupt when the module named in $SW_INTERRUPT_AT is imported: Ctrl-C
# at that moment of start-up, deterministically, in the real console scripts.
SITECUSTOMIZE = """
import os, sys
class _Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("SW_INTERRUPT_AT"):
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, _Interrupt())
"""


@pytest.mark.parametrize(
    "script,args,module",
    [
        ("scanweaver", ["compile", "x.mlir", "--target", "mlir", "-o", "o.mlir"], "argparse"),
        ("scanweaver", ["compile", "x.mlir", "--target", "mlir", "-o", "o.mlir"], "scanweaver.compiler"),
        ("scanweaver", ["compile", "x.mlir", "--target", "mlir", "-o", "o.mlir"], "xdsl.parser"),
        ("scanweaver", ["compile", "x.mlir", "--target", "mlir", "-o", "o.mlir"], "scanweaver.outputs"),
        ("scanweaver-opt", ["x.mlir"], "xdsl.xdsl_opt_main"),
        ("scanweaver-opt", ["x.mlir"], "scanweaver.outputs"),
    ],
)
def test_ctrl_c_during_start_up_is_one_line(tmp_path, script, args, module):
    exe = BIN / script
    if not exe.exists():
        pytest.skip(f"console script {exe} not installed")
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "x.mlir").write_text(AFFINE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "SW_INTERRUPT_AT": module}
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 130, r.stderr
    assert r.stderr == f"{script}: interrupted\n"
    assert not (tmp_path / "o.mlir").exists()


@pytest.mark.parametrize("script", ["scanweaver", "scanweaver-opt"])
def test_sigint_while_running_is_one_line(tmp_path, script):
    import signal

    exe = BIN / script
    if not exe.exists():
        pytest.skip(f"console script {exe} not installed")
    args = ["compile", "-", "--target", "mlir", "-o", str(tmp_path / "o.mlir")] if script == "scanweaver" else []
    # Reading standard input that never ends: the signal comes while it loads or waits.
    # (A test run started in the background inherits SIGINT ignored, and Python then
    # installs no handler: give the child the default disposition a terminal gives.)
    proc = subprocess.Popen([str(exe), *args], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == f"{script}: interrupted\n"
    assert not (tmp_path / "o.mlir").exists()


# ------------------------------------------------------------- item 10: --chip checks


@pytest.mark.parametrize("chip", ["sm_90 cubin-format=bin", "sm90", "sm_90\n", "compute_90", "sm_٩٠", ""])
def test_chip_is_validated_before_any_work(tmp_path, call, chip):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    r = call("scanweaver", "compile", str(src), "--target", "ptx", "--chip", chip, "-o", str(tmp_path / "o.ptx"))
    one_line_error(r, "scanweaver", "is not a GPU architecture: expected sm_NN or sm_NNa")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.mlir"]


def test_python_chip_and_option_arguments_are_validated():
    from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
    from scanweaver.runtime.cuda_program import build_cuda_artifacts
    from scanweaver.toolchain.mlir import GPU_PIPELINE, check_chip, gpu_to_ptx, ptxas_info

    for good in ("sm_80", "sm_90", "sm_90a", "sm_100a", "sm_120"):
        assert check_chip(good) == good
        assert f"cubin-chip={good} " in GPU_PIPELINE(good)
    for call in (
        lambda: GPU_PIPELINE("sm_90 cubin-format=bin"),
        lambda: GPU_PIPELINE("sm_90", features="+ptx80 opt-level=0"),
        lambda: GPU_PIPELINE("sm_90", fmt="isa cubin-chip=sm_50"),
        lambda: GPU_PIPELINE("sm_90", opt_level="3 x=y"),
        lambda: gpu_to_ptx("module {}", chip="sm_90 x"),
        lambda: ptxas_info("", arch="sm_90 -o /tmp/x"),
        lambda: build_cuda_artifacts(AFFINE, chip="sm_90,sm_80"),
    ):
        with pytest.raises(ScanWeaverValueError):
            call()
    with pytest.raises(ScanWeaverTypeError):
        check_chip(90)


def test_closed_standard_output_is_one_line(tmp_path):
    src = tmp_path / "x.mlir"
    src.write_text(AFFINE)
    proc = subprocess.Popen([sys.executable, "-m", "scanweaver.opt", str(src)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader left (`| head`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert err == "scanweaver-opt: error: cannot write standard output: Broken pipe\n"
