"""The `scanweaver` command.

    scanweaver compile FILE.mlir --target {ptx,cubin,llvm,mlir} -o OUT [-v]
    scanweaver demo
    scanweaver bench [--full | --numerics]

User errors print one line (`scanweaver: error: ...`) and exit 1; Ctrl-C exits 130
with one line.  Output files follow `scanweaver.outputs`: written whole or not at all,
never over an input, only regular files replaced, `-o -` for standard output.
"""

from __future__ import annotations

# Only modules the interpreter has loaded already (or built in) at the top: the rest is
# imported inside `main`, so that Ctrl-C during start-up is caught like Ctrl-C later.
import os
import stat
import sys
import time

from scanweaver.errors import ScanWeaverError  # loaded with the package: no dependencies


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- compile


def cmd_compile(args) -> int:
    from scanweaver import compiler
    from scanweaver.outputs import STDIO, Inputs, check_outputs, write_output

    inputs = Inputs()
    pipeline = args.lower_for or compiler.TARGET_FOR_KIND[args.target]
    if args.target in ("ptx", "cubin") and pipeline != "gpu":
        raise ScanWeaverError(f"--target {args.target} needs the gpu lowering, not '{pipeline}'")
    if args.target == "llvm" and pipeline == "gpu":
        raise ScanWeaverError("--target llvm needs the cpu or loops lowering, not 'gpu'")
    if args.target in ("ptx", "cubin"):
        from scanweaver.toolchain.mlir import check_chip

        check_chip(args.chip, "--chip")
    text = inputs.read(args.file)
    outputs = [args.output]
    if args.target in ("ptx", "cubin"):
        args.launch_json = _launch_json_path(args)
        outputs += [args.launch_json] if args.launch_json else []
    elif args.launch_json:
        raise ScanWeaverError(f"--launch-json is for --target ptx or cubin, not {args.target}")
    check_outputs(outputs, inputs)  # before the work: a refused output costs nothing
    started = time.perf_counter()
    if args.verbose:
        _say_raise_report(text, args.file)
    lowered = compiler.lower(
        text, pipeline, source=args.file, progress=lambda s: _say(f"[scanweaver] pass {s}")
    )
    if pipeline == "gpu":
        _say_gpu_refusals(lowered.module)
    if args.target == "mlir":
        write_output(args.output, lowered.text, inputs)
    elif args.target == "llvm":
        _say("[scanweaver] mlir-opt -> LLVM dialect, mlir-translate -> LLVM IR")
        llvm_ir, hit = compiler.cpu_llvm_ir(lowered.module)
        if hit:
            _say("[scanweaver] (toolchain output taken from the compile cache)")
        write_output(args.output, llvm_ir, inputs)
    else:
        _write_gpu(lowered, args, inputs, text)
    where = "standard output" if args.output == STDIO else args.output
    _say(f"[scanweaver] wrote {where} in {time.perf_counter() - started:.2f} s")
    return 0


def _say_raise_report(text: str, source: str) -> None:
    """-v: one line per loop that carries state: raised to what, or why not."""
    from scanweaver.ir import parse_ir
    from scanweaver.rewrites.raise_affine import raise_recurrences

    report: list[str] = []
    raise_recurrences(parse_ir(text, source=source), report=report)
    for line in report:
        _say(line)


def _say_gpu_refusals(module) -> None:
    """One line per scan op the GPU lowering left (or could not hand to the CUDA
    runtime), with its reason, for every function: not only the first that fails."""
    from xdsl.dialects import func

    from scanweaver.rewrites.blelloch_gpu import refusals

    for fn in module.ops:
        if isinstance(fn, func.FuncOp):
            for line in refusals(fn):
                _say(f"[scanweaver] @{fn.sym_name.data}: not lowered for the GPU: {line}")


def _launch_json_path(args) -> str | None:
    """Where the launch description goes: --launch-json, else OUT.launch.json beside a
    file OUT; none beside standard output, a device or a FIFO (`-o /dev/null`)."""
    if args.launch_json:
        return args.launch_json
    if args.output != "-":
        try:
            mode = os.stat(args.output).st_mode
        except OSError:
            mode = stat.S_IFREG  # a new file
        if stat.S_ISREG(mode):
            return args.output + ".launch.json"
    _say("[scanweaver] no launch description: the output is not a regular file (use --launch-json PATH)")
    return None


def _write_gpu(lowered, args, inputs, text: str) -> None:
    """OUT (PTX or cubin) and its launch description: everything `scanweaver.load` needs
    (with the shape contracts of the input IR's functions), written both or neither."""
    import json

    from scanweaver.ir import parse_ir
    from scanweaver.outputs import write_outputs
    from scanweaver.runtime.shape_contract import derive_contracts
    from scanweaver.runtime.cuda_artifact import describe
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
    image_name = "-" if args.output == "-" else os.path.basename(args.output)  # "-": standard output
    contracts = {name: c.to_data() for name, c in derive_contracts(parse_ir(text, source=args.file)).items()}
    doc = describe(payload, image_name, args.chip, art.launches, art.arg_counts, art.ptxas, art.results, contracts)
    items = [(args.output, payload)]
    if args.launch_json:
        items.append((args.launch_json, json.dumps(doc, indent=2)))
    write_outputs(items, inputs)  # both files or neither
    if args.launch_json:
        _say(f"[scanweaver] launch description: {args.launch_json}")


# ------------------------------------------------------------------------ demo / bench


def cmd_demo(args) -> int:
    from scanweaver.demo import run_demo

    return run_demo(quick=args.quick)


def cmd_bench(args) -> int:
    if args.numerics:
        from scanweaver.bench.numerics import main as numerics_main

        return numerics_main([])
    from scanweaver.bench.harness import main as bench_main

    return bench_main(["--full"] if args.full else [])


# -------------------------------------------------------------------------------- main


def build_parser():
    import argparse

    parser = argparse.ArgumentParser(
        prog="scanweaver",
        description="Find affine recurrences in loop IR and compile them to parallel scans.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile an MLIR file to PTX, a cubin, LLVM IR or lowered MLIR")
    p.add_argument("file", help="input .mlir file (loops or scan dialect), or - for stdin")
    p.add_argument("--target", required=True, choices=["ptx", "cubin", "llvm", "mlir"])
    p.add_argument("-o", "--output", required=True, help="output file, or - for standard output")
    p.add_argument("--chip", default="sm_90", help="GPU architecture for ptx/cubin: sm_NN or sm_NNa (default sm_90)")
    p.add_argument(
        "--launch-json",
        metavar="PATH",
        help="where ptx/cubin launch descriptions go (default OUT.launch.json when OUT is a file)",
    )
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
    p.add_argument("--numerics", action="store_true", help="the numerics run of the parallel variants instead")
    p.set_defaults(run=cmd_bench)
    return parser


def _one_line_warnings() -> None:
    """Library warnings (e.g. an unsafe compile cache) as one `scanweaver: warning:` line."""
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):
        _say(f"scanweaver: warning: {message}")

    warnings.showwarning = show


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _one_line_warnings()
    try:
        return args.run(args)
    except ScanWeaverError as e:
        _say(f"scanweaver: error: {e}")
        return 1
    except RecursionError:
        # xDSL parses, verifies and prints nested regions recursively.
        _say(f"scanweaver: error: {getattr(args, 'file', 'the input')}: the IR nests too deeply to process")
        return 1


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:
        _say("scanweaver: interrupted")
        return 130
    except BrokenPipeError:  # e.g. `-o - | head`: the reader left; say nothing more
        _quiet_stdout()
        return 1


def _quiet_stdout() -> None:
    # Python flushes stdout again at exit; point it at /dev/null so that fails quietly.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
