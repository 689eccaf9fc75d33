"""Builder of the last-axis complex affine scan with channels in tiles, already lowered
(scf/memref/complex ops), for `runtime/cpu_complex.py`.

    complex_last_axis_scan(el, init, final, reverse, tile)
        func.func @complex_last_axis(a, b, [h0], h, [final])   a, b, h: (C, L); h0, final: (C,)

    for c0 in channels, step `tile`:             (the last C % tile channels: tile 1)
        S[k] = h0[c0 + k] (or 0)                                 k < tile
        for t in time (backwards for reverse):
            for k < tile:  S[k] = a[c0 + k, t] * S[k] + b[c0 + k, t];  h[c0 + k, t] = S[k]
        final[c0 + k] = S[k]

A channel-at-a-time loop waits on one channel's complex multiply-add chain each step
(latency-bound); here `tile` independent chains are in flight per step, each reading
its own row sequentially (`tile` streams, no transposed copies).  Each element is the
reference's complex.mul then complex.add (`loop_utils.mul_add`), so the results are
bit for bit those of the interpreted `scan.affine` once `scan-complex-to-real` has
made the arithmetic real.  Empty L: final = h0 (or 0), as `scan.affine` defines it.
"""

from __future__ import annotations

from xdsl.builder import Builder, ImplicitBuilder
from xdsl.dialects import arith, func, memref
from xdsl.dialects.builtin import ComplexType, ModuleOp
from xdsl.ir import Block, Region, SSAValue
from xdsl.rewriter import InsertPoint

from scanweaver.rewrites.loop_utils import const_index, const_scalar, for_loop, mul_add
from scanweaver.workloads.loops import element_type
from scanweaver.workloads.types import memref_of


def complex_last_axis_scan(el: str, init: bool, final: bool, reverse: bool, tile: int = 8) -> ModuleOp:
    """`func.func @complex_last_axis` on complex<el> (el: "f32" or "f64")."""
    if el not in ("f32", "f64"):
        raise ValueError(f"the complex parts must be f32 or f64, got {el!r}")
    if tile < 1:
        raise ValueError(f"tile must be positive, got {tile}")
    c = ComplexType(element_type(el))
    m2, m1 = memref_of(("?", "?"), c), memref_of(("?",), c)
    names = ["a", "b"] + (["h0"] if init else []) + ["h"] + (["final"] if final else [])
    types = [m2, m2] + ([m1] if init else []) + [m2] + ([m1] if final else [])
    block = Block(arg_types=types)
    v = dict(zip(names, block.args))
    for name, arg in v.items():
        arg.name_hint = name
    b = Builder(InsertPoint.at_end(block))
    zero, one = const_index(b, 0), const_index(b, 1)
    channels = b.insert(memref.DimOp(v["a"], zero)).result
    length = b.insert(memref.DimOp(v["a"], one)).result
    last = b.insert(arith.SubiOp(length, one)).result
    state = b.insert(memref.AllocaOp.get(c, shape=[tile])).memref
    cz = const_scalar(b, 0, c)
    ctile = const_index(b, tile)
    tiled = b.insert(arith.MuliOp(b.insert(arith.DivUIOp(channels, ctile)).result, ctile)).result

    def channel_tile(width: int, tb: Builder, c0: SSAValue) -> None:
        ks = [const_index(tb, k) for k in range(width)]
        rows = [tb.insert(arith.AddiOp(c0, k)).result for k in ks]
        for k, row in zip(ks, rows):
            start = tb.insert(memref.LoadOp.get(v["h0"], [row])).res if init else cz
            tb.insert(memref.StoreOp.get(start, state, [k]))

        def step(sb: Builder, s: SSAValue, _carried):
            t = sb.insert(arith.SubiOp(last, s)).result if reverse else s
            for k, row in zip(ks, rows):  # the tile's chains, written out: independent
                x = sb.insert(memref.LoadOp.get(v["a"], [row, t])).res
                y = sb.insert(memref.LoadOp.get(v["b"], [row, t])).res
                prev = sb.insert(memref.LoadOp.get(state, [k])).res
                new = mul_add(sb, x, prev, y)
                sb.insert(memref.StoreOp.get(new, state, [k]))
                sb.insert(memref.StoreOp.get(new, v["h"], [row, t]))
            return []

        for_loop(tb, zero, length, one, [], step)
        if final:
            for k, row in zip(ks, rows):
                tb.insert(memref.StoreOp.get(tb.insert(memref.LoadOp.get(state, [k])).res, v["final"], [row]))

    for_loop(b, zero, tiled, ctile, [], lambda tb, c0, _: channel_tile(tile, tb, c0) or [])
    for_loop(b, tiled, channels, one, [], lambda tb, c0, _: channel_tile(1, tb, c0) or [])
    with ImplicitBuilder(block):
        func.ReturnOp()
    fn = func.FuncOp("complex_last_axis", (types, []), Region(block))
    return ModuleOp([fn])


__all__ = ["complex_last_axis_scan"]
