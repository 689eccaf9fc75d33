"""The chunk-aggregate kernel of the parallel-in-time (chunked) affine scan:
`build_chunk_aggregate` builds `func.func @aggregate` already lowered (vector/scf/arith)
from the tiles of `cpu_affine_tiles` in an aggregate mode of `cpu_aggregate_arith`."""

from __future__ import annotations

from xdsl.builder import Builder
from xdsl.dialects import func
from xdsl.dialects.builtin import DYNAMIC_INDEX, Float64Type, i64, MemRefType, ModuleOp
from xdsl.ir import Attribute, Block, Region
from xdsl.rewriter import InsertPoint

from scanweaver.rewrites.cpu_affine_tiles import _AffineOperands, lower_affine_tiled
from scanweaver.rewrites.cpu_aggregate_arith import aggregate_mode, AGGREGATE_MODES

def build_chunk_aggregate(el: Attribute, rank: int = 3, reverse: bool = False, skew: int = 1) -> ModuleOp:
    """`func.func @aggregate(a, b, outs...)` for the chunked (parallel-in-time) scan.

    a, b: `memref<?x..x?xT>` of rank >= 2, time innermost; outs: the same without the
    time dim, one per entry of AGGREGATE_MODES[aggregate_mode(T)] (f64 for floats, i64 for E).
    Per row: A = product of a over time, B = the scan's last value from h = 0, i.e.
    the row's combined pair (a1, b1) . (a2, b2) . ... applied in time order (from the
    end when `reverse`), f32 rows in f64, f64 rows in double-double, the product
    renormalised (see AGGREGATE_MODES).  Uses the same skewed tiles as `scan.affine`.
    """
    mode = aggregate_mode(el)
    dyn = [DYNAMIC_INDEX] * rank
    full_t = MemRefType(el, dyn)
    acc_el = el if mode == "exact" else Float64Type()
    out_ts = [MemRefType(i64 if name == "E" else acc_el, dyn[:-1]) for name in AGGREGATE_MODES[mode]]
    arg_types = [full_t, full_t] + out_ts
    block = Block(arg_types=arg_types)
    a, x, *outs = block.args
    b = Builder(InsertPoint.at_end(block))
    operands = _AffineOperands(a, x, a, outs[0], outs[-1], reverse, tuple(outs))
    lower_affine_tiled(b, operands, skew, aggregate=True, agg_mode=mode)
    b.insert(func.ReturnOp())
    fn = func.FuncOp("aggregate", (arg_types, []), Region(block))
    return ModuleOp([fn])
