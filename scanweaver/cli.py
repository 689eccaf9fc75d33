"""The `scanweaver` command.

    scanweaver compile FILE.mlir --target {ptx,cubin,llvm,mlir} -o OUT [-v]
    scanweaver demo
    scanweaver bench [--full]

User errors print one line (`scanweaver: error: ...`) and exit 1; output files are
written whole or not at all.
"""

from __future__ import annotations

import argparse
import json
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
    if args.verbose:
        _say_raise_report(text, args.file)
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
        _write_gpu(lowered.module, args, out)
    _say(f"[scanweaver] wrote {out} in {time.perf_counter() - started:.2f} s")
    return 0


def _say_raise_report(text: str, source: str) -> None:
    """-v: one line per loop that carries state: raised to what, or why not."""
    from scanweaver.ir import parse_ir
    from scanweaver.rewrites.raise_affine import raise_recurrences

    report: list[str] = []
    raise_recurrences(parse_ir(text, source=source), report=report)
    for line in report:
        _say(line)


def _write_gpu(module, args: argparse.Namespace, out: Path) -> None:
    from scanweaver.rewrites.gpu_export import export_gpu
    from scanweaver.toolchain.mlir import gpu_to_cubin

    _say(f"[scanweaver] mlir-opt gpu-lower-to-nvvm-pipeline for {args.chip}")
    exported = export_gpu(module, chip=args.chip)
    if not exported["ptx"]:
        raise ScanWeaverError(f"{args.file}: nothing to compile for the GPU (no scan or recurrence found)")
    if len(exported["ptx"]) != 1:
        raise ScanWeaverError(
            f"{args.file}: expected one gpu.module, found {len(exported['ptx'])}"
        )
    for kernel, f in sorted(exported["ptxas"].items()):
        _say(
            f"[scanweaver] ptxas {args.chip}: {kernel}: {f['registers']} registers, "
            f"{f['spill_stores']}+{f['spill_loads']} bytes spilled, {f['shared_bytes']} bytes shared"
        )
    for warning in exported["warnings"]:
        _say(f"[scanweaver] warning: {warning}")
    if args.target == "ptx":
        payload: str | bytes = next(iter(exported["ptx"].values()))
    else:
        _say("[scanweaver] ptxas -> cubin")
        payload = next(iter(gpu_to_cubin(exported["mlir"], args.chip).values()))
    launches = [
        {
            "kernel": d.kernel_name,
            "module": d.module_name,
            "function": d.func_name,
            "grid": list(d.grid),
            "block": list(d.block),
            "shared_bytes": d.shared_bytes,
            "args": [list(a[:3]) + [list(a[3])] for a in d.args],
            "host_args": list(d.host_args),
            "abi": d.abi,
        }
        for d in exported["launches"]
    ]
    launch_path = out.with_name(out.name + ".launch.json")
    write_atomically(out, payload)
    write_atomically(launch_path, json.dumps({"chip": args.chip, "kernels": launches}, indent=2))
    _say(f"[scanweaver] launch description: {launch_path}")


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
    p.add_argument(
        "-v", "--verbose", action="store_true",
        help="say for every loop that carries state whether it was raised (and why not)",
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
