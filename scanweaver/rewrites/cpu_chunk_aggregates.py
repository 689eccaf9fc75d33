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


#: The block rescan's skew (2, not `scan-to-cpu`'s SKEW_BLOCKS: its sub-chunks are 4 KiB-strided
#: rows when the block length is a power of two, measured with skew 2) and no software prefetch: the block's
#: a and b were just read by the aggregates and sit in L2.  Tried and slower (ad hoc,
#: one core, CPU time of the whole blocked scan at 4x2^20 f32, interleaved): 16
#: sub-chunks in two chains per tile (1.2x), no skew with sub-chunks padded off 4 KiB
#: (1.1x), 16-lane (512-bit) tiles (1.4x); software prefetch made no difference.
BLOCK_SCAN_SKEW = 2


def build_block_scan(el: Attribute, reverse: bool = False) -> ModuleOp:
    """`func.func @affine(a, b, starts, h)` (ranks 3, 3, 2, 3): the rescan of the
    cache-blocked chunked scan (runtime/cpu_chunk_blocks.py), each (row, sub-chunk) of
    the block scanned from its start, the loop's own arithmetic (the tiles of
    `scan.affine`, same bits).  h is stored with streaming stores whatever its size
    (rows on a cache line, a runtime test): a block's h is not read again, so ordinary
    stores would first read every line of h from memory (a third more traffic)."""
    t3, t2 = MemRefType(el, [DYNAMIC_INDEX] * 3), MemRefType(el, [DYNAMIC_INDEX] * 2)
    arg_types = [t3, t3, t2, t3]
    block = Block(arg_types=arg_types)
    a, x, starts, h = block.args
    b = Builder(InsertPoint.at_end(block))
    lower_affine_tiled(b, _AffineOperands(a, x, h, starts, None, reverse), BLOCK_SCAN_SKEW, nontemporal=True,
                       nontemporal_min_bytes=0)
    b.insert(func.ReturnOp())
    return ModuleOp([func.FuncOp("affine", (arg_types, []), Region(block))])
