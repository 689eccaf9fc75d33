"""The affine scans' first tier, built without xDSL or the MLIR tools: the sequential
loop `h = a*h + b` built directly as LLVM IR (llvmlite's IR builder) and JIT-compiled
in this process.

A cold process's first `linear_scan` used to build the kernel's IR with xDSL, lower
it to loops, run mlir-opt and mlir-translate, and only then LLVM: most of a second,
mostly the xDSL import and its bytecode.  This module gives the same function (the
expanded memref arguments) in a few milliseconds of LLVM, through llvmlite's MCJIT:
no linker subprocess, no disk cache entry (a later process loads the full build);
the full build (the tile kernel) compiles in the background (`cpu_tiers.py`), whose
dispatch function (`cpu_tiers.add_dispatch`) goes into the same module.  The IR
builder costs nothing at import: `llvmlite.binding`, which compiles it, imports
`llvmlite.ir` already.

The loop computes exactly what the interpreter's loop computes: per row, in time order
(reversed with `reverse`), a multiply then an add in the element type, each rounded
(no FMA: the IR carries no fast-math or contract flag), integers wrapping around;
the state starts at h0 (or 0), and hT is the last state (h0, or 0, for an empty row).
Arrays are read through their offsets and element strides, as any memref is.
"""

from __future__ import annotations

from llvmlite import ir

#: The first tier's optimisation level: a scalar loop (O2 gives the same loop as O3).
OPT_LEVEL = 2
_LOOP = "sw_loop_"  # prefix of the loop function's symbol (the dispatch takes the name)
_I64 = ir.IntType(64)
_TYPES = {"f32": ir.FloatType(), "f64": ir.DoubleType(), "i32": ir.IntType(32), "i64": _I64}


def affine_spec(rank: int, init: bool, final: bool) -> list[int]:
    """The affine kernel's arguments (memref ranks): a, b, [h0], h, [hT]."""
    return [rank, rank] + ([rank - 1] if init else []) + [rank] + ([rank - 1] if final else [])


def memref_parameters(keys: list[str], ranks: list[int]) -> tuple[list[ir.Type], list[str]]:
    """The expanded memref convention's parameter types and names (allocated and
    aligned pointer, offset, sizes, strides) of the arrays `keys` of ranks `ranks`."""
    types: list[ir.Type] = []
    names: list[str] = []
    for key, r in zip(keys, ranks):
        types += [ir.PointerType(), ir.PointerType()] + [_I64] * (1 + 2 * r)
        names += [f"{key}.allocated", key, f"{key}.offset"]
        names += [f"{key}.n{d}" for d in range(r)] + [f"{key}.s{d}" for d in range(r)]
    return types, names


def add_affine_loop(module: ir.Module, el: str, rank: int, init: bool, final: bool, reverse: bool,
                    name: str) -> None:
    """Add `void @sw_loop_<name>(a, b, [h0], h, [hT])` (expanded memrefs) to `module`:
    the scan along the last axis of the rank-`rank` arrays (the loop bounds are a's sizes)."""
    t = _TYPES[el]
    keys = ["a", "b"] + (["h0"] if init else []) + ["h"] + (["hT"] if final else [])
    types, names = memref_parameters(keys, affine_spec(rank, init, final))
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), types), _LOOP + name)
    arg = dict(zip(names, fn.args))
    for key, value in arg.items():
        value.name = key
    # The blocks in the order the loops nest: rows (one loop per leading dimension),
    # time, then the rows' latches and exits from the innermost out.
    rows = range(rank - 1)
    blocks = {"entry": fn.append_basic_block("entry")}
    for d in rows:
        blocks |= {f"row{d}": fn.append_basic_block(f"row{d}"), f"row{d}.body": fn.append_basic_block(f"row{d}.body")}
    for label in ("time", "step", "row.end"):
        blocks[label] = fn.append_basic_block(label)
    for d in reversed(rows):
        blocks |= {f"row{d}.latch": fn.append_basic_block(f"row{d}.latch"),
                   f"row{d}.exit": fn.append_basic_block(f"row{d}.exit")}
    b = ir.IRBuilder(blocks["entry"])
    block, index = "entry", []
    for d in rows:  # for i_d in [0, a.n_d)
        b.branch(blocks[f"row{d}"])
        b.position_at_end(blocks[f"row{d}"])
        i = b.phi(_I64, name=f"i{d}")
        i.add_incoming(ir.Constant(_I64, 0), blocks[block])
        more = b.icmp_signed("<", i, arg[f"a.n{d}"], name=f"i{d}.more")
        b.cbranch(more, blocks[f"row{d}.body"], blocks[f"row{d}.exit"])
        b.position_at_end(blocks[f"row{d}.body"])
        block = f"row{d}.body"
        index.append(i)
    row = {}
    for key in keys:  # each array's row start: offset + sum(i_d * stride_d)
        row[key] = arg[f"{key}.offset"]
        for d in rows:
            row[key] = b.add(row[key], b.mul(index[d], arg[f"{key}.s{d}"], name=f"{key}.i{d}"), name=f"{key}.b{d}")
    start = b.load(b.gep(arg["h0"], [row["h0"]], name="h0.p", source_etype=t), typ=t, name="start") \
        if init else ir.Constant(t, 0)
    state = _add_time_loop(b, blocks, block, arg, row, t, start, reverse, rank - 1)
    if final:
        b.store(state, b.gep(arg["hT"], [row["hT"]], name="hT.p", source_etype=t))
    for d in reversed(rows):  # i_d += 1
        b.branch(blocks[f"row{d}.latch"])
        b.position_at_end(blocks[f"row{d}.latch"])
        step = b.add(index[d], ir.Constant(_I64, 1), name=f"i{d}.next")
        index[d].add_incoming(step, blocks[f"row{d}.latch"])
        b.branch(blocks[f"row{d}"])
        b.position_at_end(blocks[f"row{d}.exit"])
    b.ret_void()


def _add_time_loop(b: ir.IRBuilder, blocks: dict, block: str, arg: dict, row: dict, t: ir.Type,
                   start: ir.Value, reverse: bool, last: int) -> ir.Value:
    """The loop over time (the last axis): state = a[t]*state + b[t], h[t] = state,
    each rounded in the element type; leaves `b` at the end of "row.end" and returns
    the row's last state."""
    floats = isinstance(t, (ir.FloatType, ir.DoubleType))
    final_t = b.sub(arg[f"a.n{last}"], ir.Constant(_I64, 1), name="last")
    b.branch(blocks["time"])
    b.position_at_end(blocks["time"])
    k = b.phi(_I64, name="k")
    state = b.phi(t, name="state")
    k.add_incoming(ir.Constant(_I64, 0), blocks[block])
    state.add_incoming(start, blocks[block])
    more = b.icmp_signed("<", k, arg[f"a.n{last}"], name="k.more")
    b.cbranch(more, blocks["step"], blocks["row.end"])
    b.position_at_end(blocks["step"])
    at_t = b.sub(final_t, k, name="t") if reverse else k
    p = {}
    for key in ("a", "b", "h"):
        at = b.add(row[key], b.mul(at_t, arg[f"{key}.s{last}"], name=f"{key}.tk"), name=f"{key}.at")
        p[key] = b.gep(arg[key], [at], name=f"{key}.p", source_etype=t)
    av, bv = b.load(p["a"], typ=t, name="av"), b.load(p["b"], typ=t, name="bv")
    product = (b.fmul if floats else b.mul)(av, state, name="product")
    new = (b.fadd if floats else b.add)(product, bv, name="state.next")
    b.store(new, p["h"])
    k.add_incoming(b.add(k, ir.Constant(_I64, 1), name="k.next"), blocks["step"])
    state.add_incoming(new, blocks["step"])
    b.branch(blocks["time"])
    b.position_at_end(blocks["row.end"])
    return state


def affine_loop_ir(el: str, rank: int, init: bool, final: bool, reverse: bool, name: str) -> str:
    """LLVM IR text of a module holding only `add_affine_loop`'s function."""
    module = ir.Module()
    add_affine_loop(module, el, rank, init, final, reverse, name)
    return str(module)


class LoopProgram:
    """LLVM IR JIT-compiled in this process (MCJIT, no disk cache): `address(symbol)`
    of a function or a global, like the other programs."""

    def __init__(self, llvm_ir: str):
        from scanweaver.runtime.cpu import host_target_machine, llvm, optimized_module

        self._llvm_ir = llvm_ir
        self.cache_hit = False
        target_machine = host_target_machine(OPT_LEVEL)
        self.engine = llvm.create_mcjit_compiler(optimized_module(llvm_ir, target_machine, OPT_LEVEL),
                                                 target_machine)
        self.engine.finalize_object()

    def address(self, symbol: str) -> int:
        from scanweaver.errors import ScanWeaverValueError

        address = self.engine.get_function_address(symbol) or self.engine.get_global_value_address(symbol)
        if not address:
            raise ScanWeaverValueError(f"symbol {symbol!r} is not defined in this program")
        return address

    def optimized_ir(self) -> str:
        from scanweaver.runtime.cpu import host_target_machine, optimized_module

        return str(optimized_module(self._llvm_ir, host_target_machine(OPT_LEVEL), OPT_LEVEL))


def loop_symbol(name: str) -> str:
    return f"{_LOOP}{name}"


__all__ = ["OPT_LEVEL", "LoopProgram", "add_affine_loop", "affine_loop_ir", "affine_spec", "loop_symbol",
           "memref_parameters"]
