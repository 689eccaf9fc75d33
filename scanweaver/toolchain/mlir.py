"""Run upstream MLIR tools (and ptxas) as subprocesses and turn their output into artifacts.

Text goes in on stdin and comes out on stdout; any failure becomes one
`ToolFailedError` naming the tool and quoting the first lines of its stderr.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, UnitAttr

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError, ToolFailedError
from scanweaver.toolchain.tools import find_tool

_STDERR_LINES = 6

# Sequential CPU lowering to the LLVM dialect. Order matters:
#  - vector-to-scf first: multi-dimensional transfer ops become scf loops + memref ops.
#  - math-to-llvm turns most math ops into LLVM intrinsics (which the JIT lowers to
#    libm calls: expf, tanhf, ...). `approximate-log1p=false` keeps math.log1p
#    exact: by default it becomes log(1 + x), which loses everything for |x| < 1e-7.
#  - math-to-libm then catches what has no intrinsic: log1p -> log1pf, erf -> erff,
#    erfc, cbrt, atan2. Vectors are unrolled into scalar calls with vector.extract,
#    hence it precedes vector-to-llvm. Caveat: math-to-llvm still lowers math.expm1
#    as exp(x) - 1 (inexact near 0); there is no switch for that.
#  - vector-to-llvm emits memref.dim (bounds of transfer ops): before the memref passes.
#  - expand-strided-metadata emits affine.apply, so lower-affine must follow it.
#  - memref lowering runs before scf-to-cf: shared/DESIGN.md section 3, needed for OpenMP.
#  - complex-to-llvm first: complex values (memref elements, iter_args) become
#    {re, im} structs before the memref and scf conversions see them.
#  - reconcile-unrealized-casts last.
_CPU_HEAD = [
    "--convert-complex-to-llvm",  # what scan-complex-to-real leaves: create/re/im/constant
    "--convert-vector-to-scf",
    "--convert-math-to-llvm=approximate-log1p=false",
    "--convert-math-to-libm",
    "--convert-vector-to-llvm",
    "--expand-strided-metadata",
    "--lower-affine",
    "--finalize-memref-to-llvm",
]
_CPU_TAIL = [
    "--convert-scf-to-cf",
    "--convert-arith-to-llvm",
    "--convert-index-to-llvm",
    "--convert-cf-to-llvm",
    "--convert-func-to-llvm",
    "--reconcile-unrealized-casts",
]
CPU_LOWERING_FLAGS: list[str] = _CPU_HEAD + _CPU_TAIL

# OpenMP: scf.parallel -> omp.parallel + omp.wsloop (first, while scf is intact), then
# the same passes plus convert-openmp-to-llvm for the omp regions once scf is gone.
CPU_OPENMP_LOWERING_FLAGS: list[str] = (
    ["--convert-scf-to-openmp"] + _CPU_HEAD + ["--convert-scf-to-cf", "--convert-openmp-to-llvm"] + _CPU_TAIL[1:]
)


def _first_lines(stderr: str) -> str:
    # Skip LLVM's crash stack dump; keep the diagnostic itself.
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not re.match(r"\s*#\d+ 0x|Stack dump|PLEASE submit", ln)]
    return "\n".join(lines[:_STDERR_LINES]) or "(no error output)"


def _failure(name: str, returncode: int, stderr: str) -> ToolFailedError:
    how = f"exit code {returncode}" if returncode > 0 else f"crashed (signal {-returncode})"
    error = ToolFailedError(f"{name} failed ({how}):\n{_first_lines(stderr)}")
    error.stderr = stderr  # full text, for debugging
    return error


def run_tool(
    name: str,
    args: list[str],
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    pipe_to: tuple[str, list[str]] | None = None,
) -> str:
    """Run `name args` with `stdin`, return stdout; raise ToolFailedError on failure.
    pipe_to=(name2, args2): `name args | name2 args2`, both at once (the second starts
    while the first works); the first that fails, in that order, is the error."""
    if pipe_to is not None:
        return _run_piped(name, args, stdin or "", *pipe_to)
    tool = find_tool(name)
    done = subprocess.run(
        [str(tool), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise _failure(name, done.returncode, done.stderr)
    return done.stdout


def _run_piped(first: str, first_args: list[str], stdin: str, second: str, second_args: list[str]) -> str:
    import threading

    tools = [str(find_tool(first)), str(find_tool(second))]
    a = subprocess.Popen([tools[0], *first_args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        b = subprocess.Popen([tools[1], *second_args], stdin=a.stdout, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    except BaseException:
        a.kill()
        a.communicate()
        raise
    a.stdout.close()  # (the second tool's now: it sees the end when the first exits)
    a_stderr: list[str] = []

    def feed() -> None:
        try:
            a.stdin.write(stdin)
            a.stdin.close()
        except BrokenPipeError:  # it stopped reading: its exit status says why
            pass

    # The first tool's input and its error output, each on a thread, beside the second's
    # output here: no pipe fills up while another is waited on.
    helpers = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=lambda: a_stderr.append(a.stderr.read()), daemon=True)]
    for helper in helpers:
        helper.start()
    out, b_stderr = b.communicate()
    for helper in helpers:
        helper.join()
    a.wait()
    if a.returncode != 0:
        raise _failure(first, a.returncode, a_stderr[0] if a_stderr else "")
    if b.returncode != 0:
        raise _failure(second, b.returncode, b_stderr)
    return out


def mlir_opt(text: str, args: list[str]) -> str:
    """mlir-opt with `args` over MLIR `text`; returns the printed result."""
    return run_tool("mlir-opt", list(args), stdin=text)


def mlir_translate_to_llvmir(text: str) -> str:
    """LLVM-dialect MLIR -> textual LLVM IR."""
    return run_tool("mlir-translate", ["--mlir-to-llvmir"], stdin=text)


#: MLIR's cleanup, run first for a module lowered without xDSL's (`stages_for(cleanup=False)`).
CPU_CLEANUP_FLAGS: list[str] = ["--canonicalize", "--cse"]


def lower_to_llvm_ir(mlir_text: str, openmp: bool = False, bounds_checks: bool = False, cleanup: bool = False) -> str:
    """Lower a module of func/scf/memref/arith/math/vector ops to LLVM IR text.

    Functions that should be callable from the CPU runtime must carry
    `llvm.emit_c_interface` (see `emit_c_interface`). With `openmp=True`,
    scf.parallel loops become OpenMP regions that need libomp at run time.
    `bounds_checks`: upstream `--generate-runtime-verification` first (every memref
    load/store checks its indices; out of bounds aborts the process with a message).
    `cleanup`: MLIR's canonicalize and cse before everything (`CPU_CLEANUP_FLAGS`).
    """
    flags = CPU_OPENMP_LOWERING_FLAGS if openmp else CPU_LOWERING_FLAGS
    if bounds_checks:
        flags = ["--generate-runtime-verification", *flags]
    if cleanup:
        flags = [*CPU_CLEANUP_FLAGS, *flags]
    return run_tool("mlir-opt", flags, stdin=mlir_text, pipe_to=("mlir-translate", ["--mlir-to-llvmir"]))


def emit_c_interface(module: ModuleOp) -> ModuleOp:
    """Mark every public, defined func.func with `llvm.emit_c_interface` (in place).

    MLIR then also emits `_mlir_ciface_NAME`, which takes memrefs as pointers to
    descriptors: the calling convention the CPU runtime uses.
    """
    for op in module.walk():
        if not isinstance(op, func.FuncOp) or op.is_declaration:
            continue
        if op.sym_visibility is not None and op.sym_visibility.data != "public":
            continue
        op.attributes["llvm.emit_c_interface"] = UnitAttr()
    return module


# ---------------------------------------------------------------------------- GPU

# PTX ISA per chip. The pipeline's default (+ptx60) makes LLVM abort for sm_80
# ("Minimum required PTX version is 7.0") and sm_90 (7.8); sm_90a needs 8.0, sm_100 8.6,
# sm_120 8.7 (all checked with this LLVM 22). We use +ptx80 (CUDA 12.0) up to Hopper:
# accepted for sm_80 and sm_90 by mlir-opt and by ptxas 13.0, loadable by CUDA 12 drivers.
# Chips after Hopper need newer PTX: the minimum LLVM 22 states for each (an older
# version makes mlir-opt abort with "PTX version 8.0 does not support target").
_MIN_PTX = {
    "sm_88": "+ptx90",
    **dict.fromkeys(("sm_100", "sm_100a", "sm_101", "sm_101a"), "+ptx86"),
    **dict.fromkeys(("sm_120", "sm_120a"), "+ptx87"),
    **dict.fromkeys(("sm_100f", "sm_101f", "sm_103", "sm_103a", "sm_103f", "sm_120f",
                     "sm_121", "sm_121a", "sm_121f"), "+ptx88"),
    **dict.fromkeys(("sm_110", "sm_110a", "sm_110f"), "+ptx90"),
}
# The architectures this LLVM's NVPTX backend knows (`llc -march=nvptx64 -mcpu=help`)
# from sm_30 on (the kernels' warp shuffles need it): any other name makes mlir-opt
# warn and then crash, so it is refused first, in one line.
KNOWN_CHIPS = (
    "sm_30", "sm_32", "sm_35", "sm_37", "sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62",
    "sm_70", "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", *_MIN_PTX,
)


def default_ptx_features(chip: str) -> str:
    return _MIN_PTX.get(chip, "+ptx80")


# What may reach mlir-opt's pipeline options and ptxas's -arch: the options are one
# space-separated string, so a chip like "sm_90 cubin-format=bin" would add an option.
_CHIP_NAME = re.compile(r"sm_[0-9]+[af]?")  # ASCII digits: \d also matches other scripts' digits
_FEATURES = re.compile(r"[+-][A-Za-z0-9_.]+(,[+-][A-Za-z0-9_.]+)*")
_FORMATS = ("isa", "bin", "fatbin")


def check_chip(chip: object, what: str = "chip") -> str:
    """`chip` if it names an NVIDIA architecture (sm_90, sm_90a, ...); else one clear error."""
    if not isinstance(chip, str):
        raise ScanWeaverTypeError(f"{what} must be a string like 'sm_90', got {chip!r}")
    if not _CHIP_NAME.fullmatch(chip):
        raise ScanWeaverValueError(f"{what} {chip!r} is not a GPU architecture: expected sm_NN or sm_NNa, e.g. sm_90")
    if chip not in KNOWN_CHIPS:
        raise ScanWeaverValueError(
            f"{what} {chip!r} is not an NVIDIA architecture this compiler knows (from sm_30 on): "
            f"one of {', '.join(sorted(KNOWN_CHIPS, key=_chip_order))}"
        )
    return chip


def _chip_order(chip: str) -> tuple[int, str]:
    digits = chip[3:].rstrip("af")
    return int(digits), chip[3 + len(digits):]


def _check_pipeline_options(chip: str, features: str, fmt: str, opt_level: int) -> None:
    check_chip(chip)
    if not isinstance(features, str) or not _FEATURES.fullmatch(features):
        raise ScanWeaverValueError(f"PTX features {features!r} are not a list like '+ptx80' or '+ptx80,+sm_90'")
    if fmt not in _FORMATS:
        raise ScanWeaverValueError(f"binary format {fmt!r} is not one of {', '.join(_FORMATS)}")
    if isinstance(opt_level, bool) or opt_level not in (0, 1, 2, 3):
        raise ScanWeaverValueError(f"opt_level must be 0, 1, 2 or 3, got {opt_level!r}")


def GPU_PIPELINE(chip: str = "sm_90", features: str | None = None, fmt: str = "isa", opt_level: int = 3) -> str:
    """The mlir-opt argument that lowers a gpu.container_module to gpu.binary ops.

    fmt: "isa" (PTX text, no CUDA needed: libdevice is embedded in this MLIR build)
    or "bin" (cubin; mlir-opt runs ptxas from PATH or /usr/local/cuda).
    Returned as one argv element: no shell quotes around the option list.
    """
    features = features or default_ptx_features(chip)
    _check_pipeline_options(chip, features, fmt, opt_level)
    return (
        f"--gpu-lower-to-nvvm-pipeline=cubin-chip={chip} cubin-features={features} "
        f"cubin-format={fmt} opt-level={opt_level}"
    )


def GPU_PIPELINE_STAGES(
    chip: str = "sm_90", features: str | None = None, fmt: str = "isa", opt_level: int = 3
) -> tuple[str, str]:
    """`GPU_PIPELINE` as two `--pass-pipeline` arguments, split after the kernels reach
    the LLVM dialect (`convert-gpu-to-nvvm` and its cleanups) and before `gpu-to-llvm`
    and `gpu-module-to-binary`, so that the kernels' LLVM-dialect text can be edited in
    between (`readonly_params.add_noalias_to_readonly_params`). The passes and their order
    are those of MLIR 22's `gpu-lower-to-nvvm-pipeline` (`--dump-pass-pipeline`; a test
    checks they still agree)."""
    features = features or default_ptx_features(chip)
    _check_pipeline_options(chip, features, fmt, opt_level)
    head = ",".join([
        "convert-nvgpu-to-nvvm",
        "gpu-kernel-outlining",
        "convert-vector-to-scf",
        "convert-scf-to-cf",
        "convert-nvvm-to-llvm",
        "convert-func-to-llvm",
        "expand-strided-metadata",
        f"nvvm-attach-target{{O={opt_level} chip={chip} features={features}}}",
        "lower-affine",
        "convert-arith-to-llvm",
        "convert-index-to-llvm",
        "canonicalize",
        "cse",
        "gpu.module(convert-gpu-to-nvvm)",
        "gpu.module(canonicalize)",
        "gpu.module(cse)",
        "gpu.module(reconcile-unrealized-casts)",
    ])
    tail = ",".join([
        "gpu-to-llvm",
        f"gpu-module-to-binary{{format={fmt}}}",
        "convert-math-to-llvm",
        "canonicalize",
        "cse",
        "reconcile-unrealized-casts",
    ])
    return f"--pass-pipeline=builtin.module({head})", f"--pass-pipeline=builtin.module({tail})"


def _lower_gpu(mlir_text: str, chip: str, features: str | None, fmt: str, env: dict[str, str] | None = None) -> str:
    """The GPU pipeline in its two stages, with the read-only kernel parameters made
    `noalias` in between (`ld.global.nc` for them; see `readonly_params`) and the
    reloads of shared copies `volatile` (`shared_reloads`)."""
    from scanweaver.toolchain.readonly_params import add_noalias_to_readonly_params, mark_readonly_loads_invariant
    from scanweaver.toolchain.shared_reloads import mark_shared_reloads_volatile

    head, tail = GPU_PIPELINE_STAGES(chip, features, fmt)
    kernels = run_tool("mlir-opt", [head], stdin=mlir_text, env=env)
    kernels = mark_readonly_loads_invariant(add_noalias_to_readonly_params(kernels))
    kernels = mark_shared_reloads_volatile(kernels)
    return run_tool("mlir-opt", [tail], stdin=kernels, env=env)


_BINARY = re.compile(r"gpu\.binary\s+@([\w$.-]+)")
_OBJECT_PAYLOAD = re.compile(r'\b(assembly|bin|fatbin|offload)\s*=\s*"((?:[^"\\]|\\.)*)"', re.S)
_CHIP = re.compile(r'chip\s*=\s*"([\w]+)"')
_ESCAPE = re.compile(rb'\\(\\|"|n|t|[0-9A-Fa-f]{2})')
_SIMPLE_ESCAPES = {b"\\": b"\\", b'"': b'"', b"n": b"\n", b"t": b"\t"}


def unescape_mlir_string(body: str) -> bytes:
    """Decode the inside of an MLIR string literal: `\\0A` -> newline, `\\22` -> quote, ..."""

    def one(match: re.Match[bytes]) -> bytes:
        code = match.group(1)
        return _SIMPLE_ESCAPES.get(code) or bytes([int(code, 16)])

    # MLIR escapes every non-printable byte, so the literal body is pure ASCII.
    return _ESCAPE.sub(one, body.encode("ascii"))


def extract_gpu_binaries(mlir_text: str) -> dict[str, bytes | str]:
    """Payload of each `gpu.binary` op: PTX text (assembly) as str, cubin/fatbin as bytes.

    Keyed by the binary's symbol name (the gpu.module's name). A binary with several
    objects (several targets) yields keys `NAME/CHIP`.
    """
    starts = list(_BINARY.finditer(mlir_text))
    result: dict[str, bytes | str] = {}
    for index, start in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(mlir_text)
        span = mlir_text[start.end() : end]
        payloads = list(_OBJECT_PAYLOAD.finditer(span))
        previous = 0
        for payload in payloads:
            chip = _CHIP.search(span, previous, payload.start())
            previous = payload.end()
            key = start.group(1)
            if len(payloads) > 1:
                key = f"{key}/{chip.group(1) if chip else len(result)}"
            data = unescape_mlir_string(payload.group(2))
            result[key] = data.decode() if payload.group(1) == "assembly" else data
    return result


def gpu_to_ptx(mlir_text: str, chip: str = "sm_90", features: str | None = None) -> dict[str, str]:
    """gpu.module name -> PTX text. Needs no CUDA installation."""
    lowered = _lower_gpu(mlir_text, chip, features, "isa")
    return {name: ptx for name, ptx in extract_gpu_binaries(lowered).items() if isinstance(ptx, str)}


def _env_with_ptxas() -> dict[str, str]:
    # mlir-opt looks for ptxas on PATH (and its build-time CUDA path): make sure the
    # one we found is first on PATH.
    ptxas_dir = str(find_tool("ptxas").parent)
    env = dict(os.environ)
    env["PATH"] = ptxas_dir + os.pathsep + env.get("PATH", "")
    return env


def gpu_to_cubin(mlir_text: str, chip: str = "sm_90", features: str | None = None) -> dict[str, bytes]:
    """gpu.module name -> cubin (ELF) bytes. Needs ptxas (ToolNotFoundError otherwise)."""
    env = _env_with_ptxas()  # raises ToolNotFoundError first if ptxas is missing
    lowered = _lower_gpu(mlir_text, chip, features, "bin", env)
    return {name: blob for name, blob in extract_gpu_binaries(lowered).items() if isinstance(blob, bytes)}


def ptx_to_cubin(ptx: str, arch: str = "sm_90") -> bytes:
    """Assemble PTX into a cubin with `ptxas` (the same PTX that was checked)."""
    with tempfile.TemporaryDirectory(prefix="scanweaver-ptxas-") as tmp:
        source, target = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        source.write_text(ptx)
        done = subprocess.run(
            [str(find_tool("ptxas")), f"-arch={arch}", str(source), "-o", str(target)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ToolFailedError(f"ptxas failed (exit code {done.returncode}):\n{_first_lines(done.stderr + done.stdout)}")
        return target.read_bytes()


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_PROPERTIES = re.compile(r"Function properties for (\S+)")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def ptxas_info(ptx: str, arch: str = "sm_90") -> dict[str, dict[str, int]]:
    """Resource usage per kernel from `ptxas -v`: registers, spills, shared and stack bytes."""
    check_chip(arch, "ptxas arch")
    with tempfile.TemporaryDirectory(prefix="scanweaver-ptxas-") as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        # ptxas -v reports on stderr (CUDA 13); read stdout too, in case a version moves it.
        done = subprocess.run(
            [str(find_tool("ptxas")), f"-arch={arch}", "-v", str(source), "-o", str(Path(tmp) / "kernel.cubin")],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        raise ToolFailedError(f"ptxas failed (exit code {done.returncode}):\n{_first_lines(done.stderr + done.stdout)}")
    return parse_ptxas_verbose(done.stdout + "\n" + done.stderr)


def parse_ptxas_verbose(output: str) -> dict[str, dict[str, int]]:
    """Per-kernel resources from `ptxas -v` text; non-kernel device functions are skipped."""
    info: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in output.splitlines():
        if entry := _PTXAS_ENTRY.search(line):
            current = info.setdefault(
                entry.group(1),
                {"registers": 0, "spill_stores": 0, "spill_loads": 0, "shared_bytes": 0, "stack_bytes": 0},
            )
        elif props := _PTXAS_PROPERTIES.search(line):
            current = info.get(props.group(1))  # None for non-kernel device functions
        elif current is None:
            continue
        elif frame := _PTXAS_FRAME.search(line):
            current["stack_bytes"], current["spill_stores"], current["spill_loads"] = map(int, frame.groups())
        elif used := _PTXAS_USED.search(line):
            current["registers"] = int(used.group(1))
            if smem := _PTXAS_SMEM.search(line):
                current["shared_bytes"] = int(smem.group(1))
    return info
