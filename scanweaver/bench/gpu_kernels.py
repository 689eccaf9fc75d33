"""The per-kernel table of the GPU lowering: `python -m scanweaver.bench.gpu_kernels`.

Writes `benchmarks/gpu/KERNELS.md` and `benchmarks/gpu/kernels.json`. For each case (a
workload at the issue's sizes, static shapes) and each kernel it launches:

* from `ptxas -v` (sm_90): registers, spill bytes, shared bytes;
* occupancy on sm_90 from registers, shared memory and threads (65,536 registers and
  228 KB of shared memory per SM, 1 KB reserved per block, 64 warps, 32 blocks;
  registers allocated per warp in units of 256);
* from the PTX: the global load and store instructions by width (`ld.global.v4.f32` is
  128 bits; read-only loads, `ld.global.nc`, are counted apart as "128b.nc"), barrier
  and `shfl.sync` instructions (static counts);
* from the thread-block simulator, on one channel of the case's kernels at its block
  configuration (lengths T and 2T, T = one tile; time-block kernels with one-tile chunks):
  barriers per tile and the bytes moved in global memory per scanned element.

"before" is the same table for another git revision (default `main`): its source is
exported with `git archive` into a temporary folder, the cases are lowered there in a
subprocess (`--emit`), and simulated here. Nothing here needs a GPU; nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

# name: (what, IR builder key, big shape, small shapes (T, 2T) builder)
CASES = [
    ("affine_f32_8x1536x65536", "affine"),
    ("affine_f32_1x2p26", "affine"),
    # the same scan in one pass with a decoupled look-back (opt-in: affine_lookback.py)
    ("affine_lookback_f32_1x2p26", "affine"),
    ("generic_cumsum_i32_1x2p26", "generic"),
    ("generic_cumsum_i32_1024x4096", "generic"),
    ("selective_N16_8x1536x2048", "selective"),
    # B/C once per tile: not staged (N = 4), partly staged (24, 32), one item per thread (64)
    ("selective_N4_8x1536x2048", "selective"),
    ("selective_N24_8x1536x2048", "selective"),
    ("selective_N32_8x1536x2048", "selective"),
    ("selective_N64_8x1536x2048", "selective"),
    ("iir2_f32_512x4096", "linear"),
]

SM90 = {"regs": 65536, "shared": 228 * 1024, "reserved": 1024, "warps": 64, "blocks": 32}


# -- IR of every case (runs in the tree being measured: only long-standing APIs) -------------------


def _sum_scan():
    """`workloads.sum_scan.sum_scan` of the measured tree, or this tree's file where that
    revision predates it (the file needs only long-standing APIs)."""
    try:
        from scanweaver.workloads.sum_scan import sum_scan
    except ImportError:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_sum_scan", REPO / "scanweaver" / "workloads" / "sum_scan.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        sum_scan = module.sum_scan
    return sum_scan


def case_ir(name: str, size: str | int) -> str:
    """The case's IR at its own sizes (`size="big"`) or for one channel of `size` steps."""
    from scanweaver.workloads.scans import affine_scan_ir

    big = size == "big"
    if name == "affine_f32_8x1536x65536":
        return affine_scan_ir((8, 1536, 65536) if big else (1, 1, size), 2, "f32", "f32", final=True)
    if name == "affine_f32_1x2p26":
        return affine_scan_ir((1, 1 << 26) if big else (1, size), 1, "f32", "f32", init=True, final=True)
    if name == "affine_lookback_f32_1x2p26":
        from scanweaver.rewrites.affine_time_blocks import ask_time_blocks

        return ask_time_blocks(case_ir("affine_f32_1x2p26", size), "lookback")  # TypeError before the look-back
    if name in ("generic_cumsum_i32_1x2p26", "generic_cumsum_i32_1024x4096"):
        from scanweaver.ir import print_ir

        shape = (1, 1 << 26) if name.endswith("1x2p26") else (1024, 4096)
        return print_ir(_sum_scan()(shape if big else (1, size), 1, "i32"))
    if name.startswith("selective_N"):
        from scanweaver.runtime.cuda_scan import selective_scan_ir

        state = int(name.split("_")[1][1:])
        b, d, n, length = (8, 1536, state, 2048) if big else (1, 1, state, size)
        shapes = {"u": (b, d, length), "delta": (b, d, length), "A": (d, n), "B": (b, n, length),
                  "C": (b, n, length), "D": (d,), "z": (b, d, length), "delta_bias": (d,)}
        return selective_scan_ir(shapes, {"delta_softplus": True, "return_last_state": True})
    if name == "iir2_f32_512x4096":
        from scanweaver.ir import print_ir
        from scanweaver.workloads import loops

        return print_ir(loops.iir2_loops(512, 4096) if big else loops.iir2_loops(1, size))
    raise KeyError(name)


def _lower(ir: str, small: bool, time_blocks: bool = False):
    """Lower for the GPU with the default pass; small builds of cases whose big build is
    in time blocks take them too, with one-tile chunks (so 2T is two chunks)."""
    from scanweaver.ir import make_context, parse_ir
    from scanweaver.rewrites.blelloch_gpu import ScanToGpu
    from scanweaver.rewrites.pipeline import stages_for

    module = parse_ir(ir)
    ctx = make_context()
    strategy = "lookback" if '"lookback"' in ir else "always" if time_blocks else "never"
    for stage in stages_for("gpu"):
        if isinstance(stage, ScanToGpu) and small:
            try:
                stage = ScanToGpu(chunk_tiles=1, time_blocks=strategy)  # type: ignore[call-arg]
            except TypeError:
                pass  # a revision without time blocks
        stage.apply(ctx, module)
    return module


def emit(skip_unknown: bool = False) -> dict[str, Any]:
    """Lower every case here: PTX + ptxas per kernel of the big build, the small builds'
    IR (for the simulator), the tile size.  `skip_unknown` (the "before" revision): a
    case its source cannot build yet is left out (its "before" rows stay empty)."""
    from scanweaver.ir import print_ir
    from scanweaver.rewrites.launch import launch_descriptions
    from scanweaver.toolchain.gpu_export import export_gpu

    out: dict[str, Any] = {}
    for name, _ in CASES:
        try:
            big_ir = case_ir(name, "big")
        except (TypeError, ImportError, KeyError):
            if not skip_unknown:
                raise
            continue
        big = _lower(big_ir, small=False)
        exported = export_gpu(big, chip="sm_90")
        (ptx,) = exported["ptx"].values()
        descs = launch_descriptions(big)
        tile = _tile(descs[-1].notes)
        multi = len(descs) > 1
        out[name] = {
            "ptx": ptx,
            "ptxas": exported["ptxas"],
            "launches": [d.to_json() for d in descs],
            "tile": tile,
            "small": {str(n): print_ir(_lower(case_ir(name, n), small=True, time_blocks=multi)) for n in (tile, 2 * tile)},
        }
    return out


def _tile(notes: str) -> int:
    bs = re.search(r"block_size=(\d+)", notes)
    ipt = re.search(r"items_per_thread=(\d+)", notes)
    return int(bs.group(1)) * int(ipt.group(1)) if bs and ipt else 512


# -- figures -----------------------------------------------------------------------------------


def ptx_kernel_text(ptx: str, kernel: str) -> str:
    start = ptx.index(f".entry {kernel}(")
    nxt = ptx.find(".entry ", start + 1)
    return ptx[start : nxt if nxt > 0 else len(ptx)]


_MEM = re.compile(r"\b(ld|st)\.global(\.nc)?(?:\.L\w+::\w+)*(?:\.v(\d))?\.[bfsu](\d+)\b")


def ptx_figures(text: str) -> dict[str, Any]:
    """Global accesses by width ("128b"; read-only `ld.global.nc` loads as "128b.nc"),
    barriers and shuffles, counted in the PTX text."""
    widths: dict[str, dict[str, int]] = {"ld": {}, "st": {}}
    for kind, nc, vec, bits in _MEM.findall(text):
        w = f"{int(vec or 1) * int(bits)}b{nc}"
        widths[kind][w] = widths[kind].get(w, 0) + 1
    return {
        "global_loads": widths["ld"],
        "global_stores": widths["st"],
        "barriers": len(re.findall(r"\b(?:bar|barrier)\.sync\b", text)),
        "shuffles": len(re.findall(r"\bshfl\.sync\b", text)),
    }


def occupancy(registers: int, shared: int, threads: int) -> float:
    """Resident warps / 64 on sm_90 (module doc)."""
    warps = math.ceil(threads / 32)
    per_warp = math.ceil(max(registers, 1) * 32 / 256) * 256
    by_regs = (SM90["regs"] // per_warp) // warps
    by_shared = SM90["shared"] // (math.ceil((shared + SM90["reserved"]) / 128) * 128)
    blocks = min(SM90["blocks"], SM90["warps"] // warps, by_regs, by_shared)
    return blocks * warps / SM90["warps"]


def _one_channel_shape(shape: tuple[int, ...], length: int) -> tuple[int, ...]:
    """Sizes for the dynamic dims of a small build (one channel of `length` steps): the
    last dim of a rank-3 array (batch, channel, time: the selective scan's sequences) is
    the length, every other dynamic dim is 1."""
    rank = len(shape)
    return tuple(
        (length if (rank == 3 and i == rank - 1) else 1) if d < 0 else d for i, d in enumerate(shape)
    )


def simulate(name: str, small: dict[str, str], tile: int) -> dict[str, dict[str, Any]]:
    """Per kernel: barriers per tile and global bytes per element, from the simulator."""
    import numpy as np
    from xdsl.dialects import func

    from scanweaver.interp.gpu_sim import simulate_launch
    from scanweaver.interp.run import numpy_dtype_for
    from scanweaver.ir import parse_ir

    runs = {}
    for n, text in small.items():
        module = parse_ir(text)
        fn = next(o for o in module.ops if isinstance(o, func.FuncOp) and not o.is_declaration)
        rng = np.random.default_rng(0)
        args = []
        for i, t in enumerate(fn.function_type.inputs.data):
            dt = numpy_dtype_for(t.element_type)
            shape = _one_channel_shape(tuple(t.get_shape()), int(n))
            # tame values, so that no tile takes the overflow/underflow fallback: decays
            # near 1 (affine a), negative A (selective), small filter coefficients
            if dt.kind != "f":
                args.append(rng.integers(0, 100, shape).astype(dt))
            elif name.startswith("affine") and i == 0:
                args.append(rng.uniform(0.99, 1.0, shape).astype(dt))
            elif name.startswith("selective") and i == 2:
                args.append(-rng.uniform(0.5, 1.0, shape).astype(dt))
            else:
                args.append(rng.uniform(-0.4, 0.4, shape).astype(dt))
        stats: list = []
        simulate_launch(module, fn.sym_name.data, *args, stats=stats)
        runs[int(n)] = stats
    one, two = runs[tile], runs[2 * tile]
    out: dict[str, dict[str, Any]] = {}
    for s1, s2 in zip(one, two):  # the same launches, in the same order
        per_tile = s2["max_barriers"] - s1["max_barriers"] or s1["max_barriers"]
        out[s2["kernel"]] = {
            "barriers_per_tile": per_tile,
            "bytes_per_element": (s2["load_bytes"] + s2["store_bytes"]) / (2 * tile),
            "load_bytes_per_element": s2["load_bytes"] / (2 * tile),
            "store_bytes_per_element": s2["store_bytes"] / (2 * tile),
        }
    return out


def table(emitted: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {}
    for name, case in emitted.items():
        sim = simulate(name, case["small"], case["tile"])
        rows[name] = []
        for launch in case["launches"]:
            k = launch["kernel"]
            p = case["ptxas"].get(k, {})
            threads = math.prod(launch["block"])
            shared = p.get("shared_bytes", launch["static_shared_bytes"])
            row = {
                "kernel": k,
                "grid": launch["grid"],
                "block": launch["block"],
                "registers": p.get("registers"),
                "spill_bytes": (p.get("spill_stores", 0) + p.get("spill_loads", 0)) if p else None,
                "shared_bytes": shared,
                "occupancy": occupancy(p["registers"], shared, threads) if p else None,
                **ptx_figures(ptx_kernel_text(case["ptx"], k)),
            }
            # the small build launches the same kernels (same names)
            row.update(sim.get(k, {}))
            rows[name].append(row)
    return rows


def _widths(d: dict[str, int]) -> str:
    def order(item: tuple[str, int]) -> tuple[int, str]:
        bits, _, nc = item[0].partition("b")
        return int(bits), nc

    return ", ".join(f"{w} x{n}" for w, n in sorted(d.items(), key=order)) or "-"


def markdown(before: dict[str, Any], after: dict[str, Any], before_ref: str) -> str:
    lines = [
        "# GPU kernels: resources and traffic, before and after",
        "",
        "Generated by `python -m scanweaver.bench.gpu_kernels` (do not edit). Nothing here ran on a",
        f"GPU: ptxas (sm_90), the PTX text, and the thread-block simulator. \"before\" is `{before_ref}`,",
        "\"after\" this tree. Occupancy: resident warps / 64 per sm_90 SM from registers, shared",
        "memory and threads. Barriers per tile and bytes per element: simulated on one channel",
        "of two tiles (time-block kernels with one-tile chunks, so their per-block loads weigh more",
        "than at 8192-step chunks, and the carry kernel of `scan.scan`, which skips chunk 0, touches",
        "half the elements instead of nearly all). The least an affine scan moves is 12 B/element",
        "(f32 a, b read, h written), 8 for the i32 cumsum. Loads marked `.nc` are `ld.global.nc`",
        "(the read-only data path, for the inputs a kernel never writes).",
        "",
    ]
    head = ("| case | | kernel | grid | regs | spill B | shared B | occupancy | global loads | global stores "
            "| bar (PTX) | shfl | bar/tile | B/elem |")
    for name in after:
        lines += [f"## {name}", "", head, "|" + "---|" * 14]
        for label, rows in (("before", before.get(name, [])), ("after", after[name])):
            for r in rows:
                occ = f"{r['occupancy']:.2f}" if r.get("occupancy") is not None else "-"
                lines.append(
                    f"| {name} | {label} | `{r['kernel']}` | {r['grid'][0]} | {r['registers']} | {r['spill_bytes']} "
                    f"| {r['shared_bytes']} | {occ} | {_widths(r['global_loads'])} | {_widths(r['global_stores'])} "
                    f"| {r['barriers']} | {r['shuffles']} | {r.get('barriers_per_tile', '-')} "
                    f"| {r.get('bytes_per_element', 0):.2f} |"
                )
        lines.append("")
        for label, rows in (("before", before.get(name, [])), ("after", after[name])):
            total = sum(r.get("bytes_per_element", 0) for r in rows)
            lines.append(f"- {label}: {len(rows)} launch(es), {total:.2f} bytes moved per element in all")
        lines.append("")
    return "\n".join(lines) + "\n"


def emit_in(ref: str) -> dict[str, Any]:
    """`emit()` run on the source of git revision `ref` (exported to a temporary folder)."""
    with tempfile.TemporaryDirectory(prefix="scanweaver-before-") as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "scanweaver"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = Path(tmp) / "emitted.json"
        env_path = f"{tmp}"
        subprocess.run([sys.executable, __file__, "--emit", str(out)], check=True, cwd=tmp,
                       env={**_env(), "PYTHONPATH": env_path})
        return json.loads(out.read_text())


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="main", help="git revision of the 'before' kernels (default: main)")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "gpu")
    p.add_argument("--emit", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.emit:
        import scanweaver

        print(f"[gpu-kernels] lowering with {Path(scanweaver.__file__).parent}", file=sys.stderr)
        args.emit.write_text(json.dumps(emit(skip_unknown=True)))
        return 0
    before = table(emit_in(args.before))
    after = table(emit())
    doc = {"format": "scanweaver-gpu-kernels", "version": 1, "chip": "sm_90", "before_ref": args.before,
           "before": before, "after": after}
    (args.out / "kernels.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "KERNELS.md").write_text(markdown(before, after, args.before))
    print(f"[gpu-kernels] wrote {args.out / 'KERNELS.md'} and kernels.json")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--emit":
        sys.path.insert(0, str(Path.cwd()))
    sys.exit(main())
