"""Build the GPU check bundle here (needs the compiler; no GPU).

    .venv/bin/python benchmarks/gpu/build_bundle.py [--out benchmarks/gpu/bundle] [--chip sm_90]

Writes one artifact per case (PTX + `*.launch.json`, as `scanweaver compile --target
ptx` does) and `cases.json` listing, per case, the artifact, the host function, its
arguments (role, shape, dtype) and how `run_bundle.py` makes inputs and checks the
result.  The bundle then travels to a GPU machine with the working tree and runs there
with the system Python (numpy + one CUDA driver binding): see benchmarks/gpu/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from scanweaver import compiler  # noqa: E402
from scanweaver.ir import parse_ir, print_ir  # noqa: E402
from scanweaver.runtime.cuda_artifact import describe, write_artifact  # noqa: E402
from scanweaver.rewrites.affine_time_blocks import ask_time_blocks  # noqa: E402
from scanweaver.runtime.cuda_program import artifacts_from_module  # noqa: E402
from scanweaver.runtime.cuda_scan import selective_scan_ir  # noqa: E402
from scanweaver.runtime.shape_contract import derive_contracts  # noqa: E402
from scanweaver.workloads import loops  # noqa: E402
from scanweaver.workloads.scans import affine_scan_ir  # noqa: E402

# Bytes per array beyond which element offsets pass 2^31 bytes (64-bit index math).
LARGE = (8192, 65600)  # 537,395,200 f32 = 2.15e9 bytes per array

GENERIC = {
    # scan.scan with a non-commutative pair combine: (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2)
    "pair_f32": (
        ["f32", "f32"],
        "%ra = arith.mulf %a0, %b0 : f32\n    %m = arith.mulf %b0, %a1 : f32\n    %rb = arith.addf %m, %b1 : f32",
        "%ra, %rb",
    ),
    "cumsum_i32": (["i32"], "%r = arith.addi %a0, %b0 : i32", "%r"),
}


def generic_scan_ir(name: str) -> str:
    types, body, results = GENERIC[name]
    k = len(types)
    mts = [f"memref<?x?x{t}>" for t in types]
    params = [f"%x{j}: {mts[j]}" for j in range(k)] + [f"%y{j}: {mts[j]}" for j in range(k)]
    bargs = [f"%a{j}: {t}" for j, t in enumerate(types)] + [f"%b{j}: {t}" for j, t in enumerate(types)]
    return (
        f"func.func @f({', '.join(params)}) {{\n"
        f"  scan.scan ins({', '.join(f'%x{j}' for j in range(k))} : {', '.join(mts)}) "
        f"outs({', '.join(f'%y{j}' for j in range(k))} : {', '.join(mts)}) axis 1 {{\n"
        f"  ^bb0({', '.join(bargs)}):\n    {body}\n    scan.yield {results} : {', '.join(types)}\n  }}\n"
        "  func.return\n}\n"
    )


# Loop forms the raise took in issue 14, written as users write them (the GPU lowering's
# newer paths): a dynamic channel count (state memref<?xf32>: one block per element), a
# third-order IIR filter over one long series (scan.linear_recurrence, one block), and a
# masked update over channels (an i32 mask).
DYNAMIC_STATE_EMA = """
func.func @ema(%x: memref<?x?xf32>, %a: memref<?xf32>, %h: memref<?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nt = memref.dim %x, %c0 : memref<?x?xf32>
  %nc = memref.dim %h, %c0 : memref<?xf32>
  scf.for %t = %c0 to %nt step %c1 {
    scf.for %c = %c0 to %nc step %c1 {
      %hv = memref.load %h[%c] : memref<?xf32>
      %av = memref.load %a[%c] : memref<?xf32>
      %xv = memref.load %x[%t, %c] : memref<?x?xf32>
      %m = arith.mulf %av, %hv : f32
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%c] : memref<?xf32>
      memref.store %hn, %y[%t, %c] : memref<?x?xf32>
    }
  }
  func.return
}
"""

MULTILAG3 = """
func.func @iir3(%x: memref<?xf32>, %a: memref<3xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %a1 = memref.load %a[%c0] : memref<3xf32>
  %a2 = memref.load %a[%c1] : memref<3xf32>
  %a3 = memref.load %a[%c2] : memref<3xf32>
  %n = memref.dim %y, %c0 : memref<?xf32>
  scf.for %t = %c3 to %n step %c1 {
    %t1 = arith.subi %t, %c1 : index
    %t2 = arith.subi %t, %c2 : index
    %t3 = arith.subi %t, %c3 : index
    %y1 = memref.load %y[%t1] : memref<?xf32>
    %y2 = memref.load %y[%t2] : memref<?xf32>
    %y3 = memref.load %y[%t3] : memref<?xf32>
    %p1 = arith.mulf %a1, %y1 : f32
    %p2 = arith.mulf %a2, %y2 : f32
    %p3 = arith.mulf %a3, %y3 : f32
    %s1 = arith.addf %p1, %p2 : f32
    %s2 = arith.addf %s1, %p3 : f32
    %xv = memref.load %x[%t] : memref<?xf32>
    %yn = arith.addf %s2, %xv : f32
    memref.store %yn, %y[%t] : memref<?xf32>
  }
  func.return
}
"""

MASKED_CHANNELS = """
func.func @masked(%x: memref<?x?xf32>, %a: memref<?x?xf32>, %mask: memref<?x?xi32>, %y: memref<?x?xf32>,
                  %hs: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zm = arith.constant 0 : i32
  %nc = memref.dim %x, %c0 : memref<?x?xf32>
  %n = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %nc step %c1 {
    %h0 = memref.load %hs[%c] : memref<?xf32>
    %r = scf.for %t = %c0 to %n step %c1 iter_args(%h = %h0) -> (f32) {
      %mv = memref.load %mask[%c, %t] : memref<?x?xi32>
      %m = arith.cmpi ne, %mv, %zm : i32
      %hn = scf.if %m -> (f32) {
        %av = memref.load %a[%c, %t] : memref<?x?xf32>
        %xv = memref.load %x[%c, %t] : memref<?x?xf32>
        %p = arith.mulf %av, %h : f32
        %q = arith.addf %p, %xv : f32
        scf.yield %q : f32
      } else {
        scf.yield %h : f32
      }
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
    memref.store %r, %hs[%c] : memref<?xf32>
  }
  func.return
}
"""


def _time_blocks(ir: str, on: bool | str) -> str:
    """Ask for the multi-block strategy in time (few long channels; `affine_time_blocks.py`),
    or, with on="lookback", the single-pass look-back (`affine_lookback.py`)."""
    return ask_time_blocks(ir, "lookback" if on == "lookback" else "time_blocks") if on else ir


def affine_case(name, shape, el, *, init=False, final=False, reverse=False, time=False, check_rows=None,
                time_blocks=False):
    st = el
    args = [("a", "in", shape, el), ("b", "in", shape, el)]
    if init:
        args.append(("init", "in", shape[:1], st))
    args.append(("h", "out", shape, st))
    if final:
        args.append(("final", "out", shape[:1], st))
    return {
        "name": name, "family": "affine", "ir": _time_blocks(affine_scan_ir(("?", "?"), 1, el, st, init=init, final=final, reverse=reverse), time_blocks),
        "function": "f", "args": args, "reverse": reverse, "time": time, "check_rows": check_rows,
        "exact": el.startswith("i"),
    }


def cases() -> list[dict]:
    out = [
        affine_case("affine_f32", (1024, 4096), "f32", final=True, time=True),
        affine_case("affine_f64", (256, 4096), "f64", final=True, time=True),
        affine_case("affine_i32", (256, 4096), "i32", final=True, time=True),
        affine_case("affine_reverse_f32", (256, 3001), "f32", reverse=True, time=True),
        affine_case("affine_init_final_f32", (300, 1000), "f32", init=True, final=True),
        # each array > 2^31 bytes: the last rows sit beyond 2^31-byte offsets; only they are checked
        affine_case("affine_large_offsets_f32", LARGE, "f32", final=True, check_rows=4),
        # one channel of 2^24 steps: several blocks per channel, in time (three launches)
        affine_case("affine_time_blocks_f32_1x2p24", (1, 1 << 24), "f32", init=True, final=True, time=True,
                    time_blocks=True),
        affine_case("affine_time_blocks_i32_4x2p20", (4, 1 << 20), "i32", final=True, reverse=True, time=True,
                    time_blocks=True),
        # the same shapes in one pass with a decoupled look-back (opt-in; timed beside them)
        affine_case("affine_lookback_f32_1x2p24", (1, 1 << 24), "f32", init=True, final=True, time=True,
                    time_blocks="lookback"),
        affine_case("affine_lookback_i32_4x2p20", (4, 1 << 20), "i32", final=True, reverse=True, time=True,
                    time_blocks="lookback"),
    ]
    # device views off a 16-byte boundary (1 f32, 1 f64 element in): the scalar path, timed
    # against the aligned cases above
    for el, offset in (("f32", 1), ("f64", 1)):
        view = affine_case(f"affine_view_{el}", (256, 4096), el, final=True, time=True)
        view["view_offset_elements"] = offset
        out.append(view)
    for g, shape in (("pair_f32", (512, 4096)), ("cumsum_i32", (512, 4096))):
        types = GENERIC[g][0]
        args = [(f"x{j}", "in", shape, t) for j, t in enumerate(types)] + [
            (f"y{j}", "out", shape, t) for j, t in enumerate(types)
        ]
        out.append({"name": f"generic_{g}", "family": "generic", "combine": g, "ir": generic_scan_ir(g),
                    "function": "f", "args": args, "time": True, "exact": g.endswith("i32")})
    view = dict(out[-1], name="generic_view_cumsum_i32", view_offset_elements=3)  # 12 bytes in
    out.append(view)
    shape = (2, 1 << 21)  # few long channels: scan-then-propagate across blocks
    args = [("x0", "in", shape, "i32"), ("y0", "out", shape, "i32")]
    out.append({"name": "generic_time_blocks_cumsum_i32_2x2p21", "family": "generic", "combine": "cumsum_i32",
                "ir": _time_blocks(generic_scan_ir("cumsum_i32"), True), "function": "f", "args": args,
                "time": True, "exact": True})
    batch, D, L = 2, 256, 2048
    for n in (16, 32):
        for bc, groups in (("constant", 1), ("shared", 1), ("grouped", 2)):
            bshape = {"constant": (D, n), "shared": (batch, n, L), "grouped": (batch, groups, n, L)}[bc]
            shapes = {"u": (batch, D, L), "delta": (batch, D, L), "A": (D, n), "B": bshape, "C": bshape,
                      "D": (D,), "z": (batch, D, L), "delta_bias": (D,)}
            ir = selective_scan_ir(shapes, {"delta_softplus": True, "return_last_state": True})
            args = [(k, "in", s, "f32") for k, s in shapes.items()]
            args += [("out", "out", (batch, D, L), "f32"), ("last_state", "out", (batch, D, n), "f32")]
            out.append({"name": f"selective_N{n}_{bc}", "family": "selective", "ir": ir, "function": "selective_scan",
                        "args": args, "time": True, "bc": bc, "groups": groups, "exact": False})
    # few long channels: the selective scan's recurrence in time across blocks (recurrence_time_blocks.py)
    shapes = {"u": (1, 4, 1 << 18), "delta": (1, 4, 1 << 18), "A": (4, 16), "B": (4, 16), "C": (4, 16),
              "D": (4,), "z": (1, 4, 1 << 18), "delta_bias": (4,)}
    args = [(k, "in", s, "f32") for k, s in shapes.items()]
    args += [("out", "out", (1, 4, 1 << 18), "f32"), ("last_state", "out", (1, 4, 16), "f32")]
    out.append({"name": "selective_N16_time_blocks_1x4x2p18", "family": "selective", "function": "selective_scan",
                "ir": _time_blocks(selective_scan_ir(shapes, {"delta_softplus": True, "return_last_state": True}), True),
                "args": args, "time": True, "bc": "constant", "groups": 1, "exact": False})
    C, L = 512, 4096
    out.append({"name": "linear_recurrence_iir2_f32", "family": "linear_recurrence",
                "ir": print_ir(loops.iir2_loops(C, L)), "function": "iir2",
                "args": [("x", "in", (C, L), "f32"), ("c1", "in", (C,), "f32"), ("c2", "in", (C,), "f32"),
                         ("y", "out", (C, L), "f32")], "time": True, "exact": False})
    T, C = 2048, 4096
    out.append({"name": "dynamic_state_ema_f32", "family": "dynamic_state", "ir": DYNAMIC_STATE_EMA,
                "function": "ema", "args": [("x", "in", (T, C), "f32"), ("a", "in", (C,), "f32"),
                                            ("h", "inout", (C,), "f32"), ("y", "out", (T, C), "f32")],
                "time": True, "exact": False})
    out.append({"name": "multilag3_one_series_f32", "family": "multilag", "ir": MULTILAG3, "function": "iir3",
                "args": [("x", "in", (1 << 16,), "f32"), ("a", "in", (3,), "f32"), ("y", "inout", (1 << 16,), "f32")],
                "time": True, "exact": False})
    C, L = 512, 4096
    out.append({"name": "masked_channels_f32", "family": "masked", "ir": MASKED_CHANNELS, "function": "masked",
                "args": [("x", "in", (C, L), "f32"), ("a", "in", (C, L), "f32"), ("mask", "in", (C, L), "i32"),
                         ("y", "out", (C, L), "f32"), ("hs", "inout", (C,), "f32")],
                "time": True, "exact": False})
    return out


def build(out_dir: Path, chip: str = "sm_90", only: list[str] | None = None, progress=print) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    listing = []
    for case in cases():
        if only and case["name"] not in only:
            continue
        progress(f"[bundle] {case['name']}")
        lowered = compiler.lower(case["ir"], "gpu", keep_stages=False)
        art = artifacts_from_module(lowered.module, lowered.stages, chip)
        image = out_dir / f"{case['name']}.ptx"
        contracts = {n: c.to_data() for n, c in derive_contracts(parse_ir(case["ir"])).items()}
        write_artifact(image, art.ptx, describe(art.ptx, image.name, chip, art.launches, art.arg_counts, art.ptxas,
                                                contracts=contracts))
        entry = {k: v for k, v in case.items() if k != "ir"}
        entry["artifact"] = image.name
        entry["args"] = [{"name": n, "role": r, "shape": list(s), "dtype": t} for n, r, s, t in case["args"]]
        entry["ptxas"] = art.ptxas
        entry["warnings"] = art.warnings
        listing.append(entry)
    doc = {"format": "scanweaver-gpu-check-bundle", "version": 1, "chip": chip, "cases": listing}
    (out_dir / "cases.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=HERE / "bundle")
    p.add_argument("--chip", default="sm_90")
    p.add_argument("--only", nargs="*", help="case names (default: all)")
    args = p.parse_args(argv)
    doc = build(args.out, args.chip, args.only)
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.is_file())
    print(f"[bundle] {len(doc['cases'])} cases, {size / 1e6:.1f} MB in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
