"""The `scanweaver` command.

    scanweaver compile FILE.mlir --target {ptx,cubin,llvm,mlir} -o OUT
    scanweaver demo
    scanweaver bench [--full]

User errors print one line (`scanweaver: error: ...`) and exit 1; output files are
written whole or not at all.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from scanweaver.errors import ScanWeaverError


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a partial file."""
    path = path.resolve()
    if path.is_dir():
        raise ScanWeaverError(f"cannot write {path}: it is a directory")
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:
        raise ScanWeaverError(f"cannot write {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except OSError as e:
        os.unlink(tmp)
        raise ScanWeaverError(f"cannot write {path}: {e.strerror}") from None
    except BaseException:
        os.unlink(tmp)
        raise


def _read_source(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text()
    except OSError as e:
        raise ScanWeaverError(f"cannot read {name}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ScanWeaverError(f"cannot read {name}: it is not UTF-8 text") from None


# ----------------------------------------------------------------------------- compile


def cmd_compile(args: argparse.Namespace) -> int:
    from scanweaver import compiler

    text = _read_source(args.file)
    out = Path(args.output)
    if not out.resolve().parent.is_dir():
        raise ScanWeaverError(f"cannot write {args.output}: its directory does not exist")
    if out.is_dir():
        raise ScanWeaverError(f"cannot write {args.output}: it is a directory")
    pipeline = args.lower_for or compiler.TARGET_FOR_KIND[args.target]
    if args.target in ("ptx", "cubin") and pipeline != "gpu":
        raise ScanWeaverError(f"--target {args.target} needs the gpu lowering, not '{pipeline}'")
    if args.target == "llvm" and pipeline == "gpu":
        raise ScanWeaverError("--target llvm needs the cpu or loops lowering, not 'gpu'")
    started = time.perf_counter()
    lowered = compiler.lower(
        text, pipeline, source=args.file, progress=lambda s: _say(f"[scanweaver] pass {s}")
    )
    if args.target == "mlir":
        write_atomically(out, lowered.text)
    elif args.target == "llvm":
        _say("[scanweaver] mlir-opt -> LLVM dialect, mlir-translate -> LLVM IR")
        llvm_ir, hit = compiler.cpu_llvm_ir(lowered.module)
        if hit:
            _say("[scanweaver] (toolchain output taken from the compile cache)")
        write_atomically(out, llvm_ir)
    else:
        _write_gpu(lowered, args, out)
    _say(f"[scanweaver] wrote {out} in {time.perf_counter() - started:.2f} s")
    return 0


def _write_gpu(lowered, args: argparse.Namespace, out: Path) -> None:
    """OUT (PTX or cubin) and OUT.launch.json: everything `scanweaver.load` needs."""
    from scanweaver.runtime.cuda_artifact import describe, write_artifact
    from scanweaver.runtime.cuda_program import artifacts_from_module
    from scanweaver.toolchain.mlir import ptx_to_cubin

    _say(f"[scanweaver] mlir-opt gpu-lower-to-nvvm-pipeline for {args.chip}")
    art = artifacts_from_module(lowered.module, lowered.stages, chip=args.chip)
    for kernel, f in sorted(art.ptxas.items()):
        _say(
            f"[scanweaver] ptxas {args.chip}: {kernel}: {f['registers']} registers, "
            f"{f['spill_stores']}+{f['spill_loads']} bytes spilled, {f['shared_bytes']} bytes shared"
        )
    for warning in art.warnings:
        _say(f"[scanweaver] warning: {warning}")
    payload: str | bytes = art.ptx
    if args.target == "cubin":
        _say("[scanweaver] ptxas -> cubin")
        payload = ptx_to_cubin(art.ptx, args.chip)
    doc = describe(payload, out.name, args.chip, art.launches, art.arg_counts, art.ptxas)
    meta = write_artifact(out, payload, doc)
    _say(f"[scanweaver] launch description: {meta}")


# ------------------------------------------------------------------------ demo / bench


def cmd_demo(args: argparse.Namespace) -> int:
    from scanweaver.demo import run_demo

    return run_demo(quick=args.quick)


def cmd_bench(args: argparse.Namespace) -> int:
    from scanweaver.bench.harness import main as bench_main

    return bench_main(["--full"] if args.full else [])


# -------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scanweaver",
        description="Find affine recurrences in loop IR and compile them to parallel scans.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile an MLIR file to PTX, a cubin, LLVM IR or lowered MLIR")
    p.add_argument("file", help="input .mlir file (loops or scan dialect), or - for stdin")
    p.add_argument("--target", required=True, choices=["ptx", "cubin", "llvm", "mlir"])
    p.add_argument("-o", "--output", required=True, help="output file")
    p.add_argument("--chip", default="sm_90", help="GPU architecture for ptx/cubin (default sm_90)")
    p.add_argument(
        "--lower-for",
        choices=["gpu", "cpu", "loops"],
        help="which lowering to run (default: gpu for ptx/cubin, cpu for llvm/mlir)",
    )
    p.set_defaults(run=cmd_compile)

    p = sub.add_parser("demo", help="the selective scan end to end, checked and timed")
    p.add_argument("--quick", action="store_true", help="smaller sizes")
    p.set_defaults(run=cmd_demo)

    p = sub.add_parser("bench", help="benchmark against other tools")
    p.add_argument("--full", action="store_true", help="the whole grid (slow)")
    p.set_defaults(run=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ScanWeaverError as e:
        print(f"scanweaver: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("scanweaver: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
