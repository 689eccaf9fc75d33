"""The affine scans' first tier, built without xDSL or the MLIR tools: the sequential
loop `h = a*h + b` written directly as LLVM IR with llvmlite's IR builder.

A cold process's first `linear_scan` used to build the kernel's IR with xDSL, lower
it to loops, run mlir-opt and mlir-translate, and only then LLVM: most of a second,
mostly the xDSL import and its bytecode.  This module gives the same function (name,
expanded memref arguments) in a few milliseconds of LLVM; the full build (the tile
kernel) then compiles in the background (`cpu_tiers.py`).

The loop computes exactly what the interpreter's loop computes: per row, in time order
(reversed with `reverse`), a multiply then an add in the element type, each rounded
(no FMA: the IR carries no fast-math or contract flag), integers wrapping around;
the state starts at h0 (or 0), and hT is the last state (h0, or 0, for an empty row).
Arrays are read through their offsets and element strides, as any memref is.
"""

from __future__ import annotations

import functools

#: The first tier's optimisation level: a scalar loop (O2 gives the same loop as O3).
OPT_LEVEL = 2
_LOOP = "sw_loop_"  # prefix of the loop function's symbol (the dispatch takes the name)


def affine_spec(rank: int, init: bool, final: bool) -> list[int]:
    """The affine kernel's arguments (memref ranks): a, b, [h0], h, [hT]."""
    return [rank, rank] + ([rank - 1] if init else []) + [rank] + ([rank - 1] if final else [])


@functools.cache
def _types(el: str):
    from llvmlite import ir

    element = {"f32": ir.FloatType(), "f64": ir.DoubleType(), "i32": ir.IntType(32), "i64": ir.IntType(64)}[el]
    return ir, element


def affine_loop_ir(el: str, rank: int, init: bool, final: bool, reverse: bool, name: str) -> str:
    """LLVM IR text of `void @sw_loop_<name>(a, b, [h0], h, [hT])` (expanded memrefs,
    scan along the last axis of the rank-`rank` arrays; their shape is a's)."""
    ir, t = _types(el)
    i64, ptr = ir.IntType(64), ir.PointerType()
    spec = affine_spec(rank, init, final)
    params: list = []
    for r in spec:
        params += [ptr, ptr] + [i64] * (1 + 2 * r)
    module = ir.Module(name=f"{_LOOP}{name}")
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), params), f"{_LOOP}{name}")
    args = list(fn.args)
    memrefs = []  # per argument: (aligned pointer, offset, sizes, strides)
    for r in spec:
        _, aligned, offset, *rest = args[: 3 + 2 * r]
        memrefs.append((aligned, offset, rest[:r], rest[r:]))
        del args[: 3 + 2 * r]
    names = ["a", "b"] + (["h0"] if init else []) + ["h"] + (["hT"] if final else [])
    m = dict(zip(names, memrefs))
    sizes = m["a"][2]
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    zero, one = ir.Constant(i64, 0), ir.Constant(i64, 1)

    def loop(count, body, carried=None):
        """for i in [0, count): carried = body(i, carried), as blocks after the
        builder's current one; returns the carried value after the loop."""
        before = builder.block
        head, work, done = (fn.append_basic_block(n) for n in ("head", "body", "done"))
        builder.branch(head)
        builder.position_at_end(head)
        i = builder.phi(i64)
        i.add_incoming(zero, before)
        value = None
        if carried is not None:
            value = builder.phi(carried.type)
            value.add_incoming(carried, before)
        builder.cbranch(builder.icmp_signed("<", i, count), work, done)
        builder.position_at_end(work)
        new = body(i, value)
        if value is not None:
            value.add_incoming(new, builder.block)
        i.add_incoming(builder.add(i, one), builder.block)
        builder.branch(head)
        builder.position_at_end(done)
        return value

    def element(key, index, time=None):
        """The address of m[key][index..., time]: offset + sum(index_d * stride_d)."""
        aligned, offset, _, strides = m[key]
        position = offset
        for i, s in zip(index, strides):
            position = builder.add(position, builder.mul(i, s))
        if time is not None:
            position = builder.add(position, builder.mul(time, strides[-1]))
        return builder.gep(aligned, [position], source_etype=t)

    floats = el in ("f32", "f64")
    length = sizes[-1]

    def step(index, k, state):
        time = builder.sub(builder.sub(length, one), k) if reverse else k
        a = builder.load(element("a", index, time), typ=t)
        b = builder.load(element("b", index, time), typ=t)
        new = builder.fadd(builder.fmul(a, state), b) if floats else builder.add(builder.mul(a, state), b)
        builder.store(new, element("h", index, time))
        return new

    def row(index):
        start = builder.load(element("h0", index), typ=t) if init else ir.Constant(t, 0)
        last = loop(length, lambda k, state: step(index, k, state), start)
        if final:
            builder.store(last, element("hT", index))

    def rows(depth, index):
        if depth == rank - 1:
            row(index)
        else:
            loop(sizes[depth], lambda i, _: rows(depth + 1, index + [i]))

    rows(0, [])
    builder.ret_void()
    return str(module)


def loop_symbol(name: str) -> str:
    return f"{_LOOP}{name}"


__all__ = ["OPT_LEVEL", "affine_loop_ir", "affine_spec", "loop_symbol"]
