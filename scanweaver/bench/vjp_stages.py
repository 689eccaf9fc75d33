"""Where the compiled selective-scan VJP spends its time, stage by stage (no profiler).

    python -m scanweaver.bench.vjp_stages [--L 2048] [--reps 9]
    python -m scanweaver.bench.vjp_stages --ratio [--batch 2 --D 768]
    python -m scanweaver.bench.vjp_stages --buffers [--batch 2 --D 768]

Each stage of `@selective_scan_vjp` (a loop or scan op of the channel body, or of the
reverse chunk loop) is timed by compiling a variant of the VJP where that stage runs
twice in a row: its cost is the variant's median time minus the VJP's.  Removing a stage
instead would let LLVM delete the stages reading its (then undefined) buffers.  The
variants' results are wrong, only their times are used.  One call over all channels on
one thread, the forward kernel timed alongside; calls interleaved, medians printed.

`--ratio`: the speed bar's `backward time / forward time` measured side by side, the
public `selective_scan` (the harness's forward) and the `scanweaver::selective_scan_bwd`
op, interleaved, on the threads the harness uses (`SCANWEAVER_NUM_THREADS=1`: one, and
the calls' thread CPU time too, which another process's load inflates less).

`--buffers`: the backward op with its large gradient buffers fresh (np.zeros) and reused
(the op's `GRAD_REUSE_MIN_BYTES`), in alternating processes, each running the harness's
interleaved forward and backward calls: wall, CPU (user, system) and page faults of a
call, and the ratio; same bits checked.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def stages(fn) -> list[tuple[str, object]]:
    """(name, op): the loops and scan ops of the channel loop body and of the reverse
    chunk loop, named by their place (block.index) and kind."""
    from xdsl.dialects import scf

    from scanweaver.dialects import scan

    holders = [op for op in fn.walk() if isinstance(op, scf.ForOp)
               and any(isinstance(o, scan.RecurrenceOp) for o in op.body.block.ops)]
    chunk_loop = holders[-1]  # the reverse runs last
    out = []
    for block, tag in ((chunk_loop.parent_block(), "channel"), (chunk_loop.body.block, "chunk")):
        for i, op in enumerate(block.ops):
            if op is chunk_loop:
                continue
            if isinstance(op, scan.RecurrenceOp):
                out.append((f"{tag}.{i} scan.recurrence", op))
            elif isinstance(op, scf.ForOp) and sum(1 for _ in op.walk()) > 10:
                out.append((f"{tag}.{i} scf.for ({sum(1 for _ in op.walk())} ops)", op))
    return out


def _kernel(spec, twice: str | None):
    from xdsl.dialects import func

    from scanweaver.ir import make_context, parse_ir, print_ir
    from scanweaver.rewrites.grad import ScanweaverGrad
    from scanweaver.runtime.cpu_scan import Kernel
    from scanweaver.torch import _kernels

    ir = _kernels.selective_ir(spec, False)
    module = parse_ir(ir.text)
    _kernels.mark_step_exp(module)  # as _kernels._vjp_only: the forward's exp form
    ScanweaverGrad(chunk=_kernels.CHUNK).apply(make_context(), module)
    for op in list(module.ops):
        if isinstance(op, func.FuncOp) and not op.sym_name.data.endswith("_vjp"):
            module.body.block.erase_op(op)
    named = stages(next(iter(module.ops)))
    if twice is not None:
        op = dict(named)[twice]
        op.parent_block().insert_op_after(op.clone(), op)
    _kernels._polynomial_math_outside_scans(module)
    program = _kernels._compile_noalias(print_ir(module), f"{ir.name}_vjp")
    kernel = Kernel(program, f"{ir.name}_vjp", [*ir.args, *_kernels.selective_arg_ranks(spec)])
    return [n for n, _ in named], kernel


def ratio(batch: int, D: int, L: int, reps: int) -> None:
    import os

    import torch

    import scanweaver.torch  # noqa: F401 - registers the scanweaver:: ops
    from scanweaver import selective_scan
    from scanweaver.bench.harness import make_inputs, selective_grad_case
    from scanweaver.bench.peers import GRAD_ORDER

    inp = make_inputs(selective_grad_case(batch, D, 16, L, True))
    args = [torch.from_numpy(inp[k]) if inp.get(k) is not None else None for k in GRAD_ORDER]
    g = torch.from_numpy(inp["g"])
    _, last = torch.ops.scanweaver.selective_scan_fwd(*args, inp["delta_softplus"])
    dlast = torch.zeros_like(last)
    calls = {
        "forward": lambda: selective_scan(*(inp.get(k) for k in GRAD_ORDER), inp["delta_softplus"]),
        "backward": lambda: torch.ops.scanweaver.selective_scan_bwd(*args, inp["delta_softplus"], g, dlast),
    }
    for _ in range(3):
        for call in calls.values():
            call()
    time.sleep(3)  # the forward's tile kernel builds in a child process after its first call
    wall: dict[str, list[float]] = {k: [] for k in calls}
    cpu: dict[str, list[float]] = {k: [] for k in calls}
    for _ in range(reps):
        for name, call in calls.items():
            start, start_cpu = time.perf_counter(), time.thread_time()
            call()
            cpu[name].append(time.thread_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    one = os.environ.get("SCANWEAVER_NUM_THREADS") == "1"
    print(f"({batch}, {D}, 16, {L}), {'one thread' if one else 'all threads'}, {reps} interleaved calls")
    for name in calls:
        line = f"{name:9s} wall median {statistics.median(wall[name]) * 1e3:8.2f} min {min(wall[name]) * 1e3:8.2f} ms"
        if one:
            line += f" | thread CPU median {statistics.median(cpu[name]) * 1e3:8.2f} min {min(cpu[name]) * 1e3:8.2f} ms"
        print(line)
    r = lambda t, f: f(t["backward"]) / f(t["forward"])  # noqa: E731
    line = f"backward / forward: wall median {r(wall, statistics.median):.2f} min {r(wall, min):.2f}"
    print(line + (f" | thread CPU median {r(cpu, statistics.median):.2f} min {r(cpu, min):.2f}" if one else ""))


def _buffers_child(variant: str, batch: int, D: int, L: int, reps: int) -> None:
    """One process of `--buffers`: the harness's sequence (public forward, backward op,
    interleaved) with the op's large gradient buffers fresh or reused; prints JSON."""
    import json
    import resource

    import torch

    from scanweaver import selective_scan
    from scanweaver.bench.harness import make_inputs, selective_grad_case
    from scanweaver.bench.peers import GRAD_ORDER
    from scanweaver.torch import selective

    if variant == "fresh":
        selective.GRAD_REUSE_MIN_BYTES = 1 << 62  # every buffer from `_zeros`, as before reuse
    inp = make_inputs(selective_grad_case(batch, D, 16, L, True))
    args = [torch.from_numpy(inp[k]) if inp.get(k) is not None else None for k in GRAD_ORDER]
    _, last = torch.ops.scanweaver.selective_scan_fwd(*args, inp["delta_softplus"])
    g, dlast = torch.from_numpy(inp["g"]), torch.zeros_like(last)
    calls = {"forward": lambda: selective_scan(*(inp.get(k) for k in GRAD_ORDER), inp["delta_softplus"]),
             "backward": lambda: torch.ops.scanweaver.selective_scan_bwd(*args, inp["delta_softplus"], g, dlast)}
    for _ in range(3):
        for call in calls.values():
            call()
    time.sleep(2)  # the forward's tile kernel builds in a child process after its first call
    got: dict[str, list[tuple[float, ...]]] = {k: [] for k in calls}
    for _ in range(reps):
        for name, call in calls.items():
            r0, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            call()
            wall, r1 = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
            got[name].append((wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, r1.ru_minflt - r0.ru_minflt))
    print(json.dumps({k: [statistics.median(x[i] for x in v) for i in range(4)] for k, v in got.items()}))


def buffers(batch: int, D: int, L: int, reps: int, rounds: int = 3) -> None:
    """The backward op with its large gradient buffers fresh (np.zeros: the kernel's
    first touch faults their pages in, on every thread at once) and reused (the op's
    GRAD_REUSE_MIN_BYTES), in alternating processes: glibc's heap state, which decides
    whether a fresh buffer faults, depends on everything the process did before, so
    one process cannot hold both fairly.  Same bits checked in this process."""
    import json
    import subprocess
    import sys

    import torch

    from scanweaver.bench.harness import make_inputs, selective_grad_case
    from scanweaver.bench.peers import GRAD_ORDER
    from scanweaver.torch import selective

    inp = make_inputs(selective_grad_case(batch, D, 16, L, True))
    args = [torch.from_numpy(inp[k]) if inp.get(k) is not None else None for k in GRAD_ORDER]
    _, last = torch.ops.scanweaver.selective_scan_fwd(*args, inp["delta_softplus"])
    call = lambda: [t.clone() for t in torch.ops.scanweaver.selective_scan_bwd(  # noqa: E731
        *args, inp["delta_softplus"], torch.from_numpy(inp["g"]), torch.zeros_like(last))]
    reused, saved = call(), selective.GRAD_REUSE_MIN_BYTES
    try:
        selective.GRAD_REUSE_MIN_BYTES = 1 << 62
        fresh = call()
    finally:
        selective.GRAD_REUSE_MIN_BYTES = saved
    if not all(torch.equal(a, b) for a, b in zip(fresh, reused)):
        raise SystemExit("gradients differ between the buffer variants")
    print(f"({batch}, {D}, 16, {L}), {reps} interleaved forward/backward calls a process, same bits; medians:")
    print("round variant  | backward: wall ms  user ms  sys ms  faults | forward wall ms | bwd/fwd wall")
    for r in range(rounds):
        for variant in ("fresh", "reused"):
            cmd = [sys.executable, "-m", "scanweaver.bench.vjp_stages", "--buffers-child", variant,
                   "--batch", str(batch), "--D", str(D), "--L", str(L), "--reps", str(reps)]
            m = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            b, f = m["backward"], m["forward"]
            print(f"{r:5d} {variant:8s} | {b[0] * 1e3:17.2f} {b[1] * 1e3:8.2f} {b[2] * 1e3:7.2f} {b[3]:7.0f} "
                  f"| {f[0] * 1e3:15.2f} | {b[0] / f[0]:12.2f}")


def main(argv=None) -> None:
    import torch

    from scanweaver.bench.harness import make_inputs, selective_grad_case
    from scanweaver.torch import _kernels
    from scanweaver.torch.selective import _arrays, _spec

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--L", type=int, default=2048)
    parser.add_argument("--D", type=int, default=256)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--batch", type=int, default=1, help="--ratio only")
    parser.add_argument("--ratio", action="store_true", help="forward and backward op side by side")
    parser.add_argument("--buffers", action="store_true", help="backward op: fresh vs reused gradient buffers")
    parser.add_argument("--buffers-child", choices=("fresh", "reused"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.buffers_child:
        _buffers_child(args.buffers_child, args.batch, args.D, args.L, args.reps)
        return
    if args.buffers:
        buffers(args.batch, args.D, args.L, args.reps)
        return
    if args.ratio:
        ratio(args.batch, args.D, args.L, args.reps)
        return
    inp = make_inputs(selective_grad_case(1, args.D, 16, args.L, True))
    keys = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    t = [torch.from_numpy(inp[k]) for k in keys]
    spec = _spec(16, t[3], t[4], True, True)
    _, arrs = _arrays(*t)
    out = np.empty((1, args.D, args.L), np.float32)
    last = np.empty((1, args.D, 16), np.float32)
    names, vjp = _kernel(spec, None)
    kernels = {"VJP": vjp, **{f"+ {n}": _kernel(spec, n)[1] for n in names}}
    keep = []

    def vjp_call(k):
        shadows = [np.zeros_like(a) for a in arrs] + [inp["g"].copy(), np.zeros_like(last)]
        keep.append(shadows)  # the bound call holds raw pointers only
        return k.bind(*arrs, out, last, 0, args.D, *shadows)

    calls = {"forward": _kernels.selective_forward(spec, False).bind(*arrs, out, last, 0, args.D)}
    calls.update({name: vjp_call(k) for name, k in kernels.items()})
    times: dict[str, list[float]] = {k: [] for k in calls}
    for call in calls.values():
        call()
    for _ in range(args.reps):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"(1, {args.D}, 16, {args.L}), one thread, medians of {args.reps}")
    print(f"forward {med['forward']:8.2f} ms")
    print(f"VJP     {med['VJP']:8.2f} ms  ({med['VJP'] / med['forward']:.2f}x the forward)")
    for n in names:
        print(f"  {n:34s} {med['+ ' + n] - med['VJP']:7.2f} ms")


if __name__ == "__main__":
    main()
