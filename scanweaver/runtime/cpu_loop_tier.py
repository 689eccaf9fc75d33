"""The affine scans' first tier, built without xDSL or the MLIR tools: the sequential
loop `h = a*h + b` written directly as LLVM IR text and JIT-compiled in this process.

A cold process's first `linear_scan` used to build the kernel's IR with xDSL, lower
it to loops, run mlir-opt and mlir-translate, and only then LLVM: most of a second,
mostly the xDSL import and its bytecode.  This module gives the same function (the
expanded memref arguments) in a few milliseconds of LLVM, through llvmlite's MCJIT:
no linker subprocess, no disk cache entry (a later process loads the full build);
the full build (the tile kernel) compiles in the background (`cpu_tiers.py`).  The IR
is plain text, like `cpu_tiers.dispatch_ir` that shares its module.  llvmlite's IR
builder would cost nothing more at import (`llvmlite.binding` imports `llvmlite.ir`
already): moving both functions to it is a change still to make.

The loop computes exactly what the interpreter's loop computes: per row, in time order
(reversed with `reverse`), a multiply then an add in the element type, each rounded
(no FMA: the IR carries no fast-math or contract flag), integers wrapping around;
the state starts at h0 (or 0), and hT is the last state (h0, or 0, for an empty row).
Arrays are read through their offsets and element strides, as any memref is.
"""

from __future__ import annotations

#: The first tier's optimisation level: a scalar loop (O2 gives the same loop as O3).
OPT_LEVEL = 2
_LOOP = "sw_loop_"  # prefix of the loop function's symbol (the dispatch takes the name)
_TYPES = {"f32": "float", "f64": "double", "i32": "i32", "i64": "i64"}


def affine_spec(rank: int, init: bool, final: bool) -> list[int]:
    """The affine kernel's arguments (memref ranks): a, b, [h0], h, [hT]."""
    return [rank, rank] + ([rank - 1] if init else []) + [rank] + ([rank - 1] if final else [])


def affine_loop_ir(el: str, rank: int, init: bool, final: bool, reverse: bool, name: str) -> str:
    """LLVM IR text of `void @sw_loop_<name>(a, b, [h0], h, [hT])` (expanded memrefs:
    allocated and aligned pointer, offset, sizes, strides), the scan along the last axis
    of the rank-`rank` arrays (the loop bounds are a's sizes)."""
    t = _TYPES[el]
    floats = el in ("f32", "f64")
    keys = ["a", "b"] + (["h0"] if init else []) + ["h"] + (["hT"] if final else [])
    params = []
    for key, r in zip(keys, affine_spec(rank, init, final)):
        params += [f"ptr %{key}.allocated", f"ptr %{key}", f"i64 %{key}.offset"]
        params += [f"i64 %{key}.n{d}" for d in range(r)] + [f"i64 %{key}.s{d}" for d in range(r)]
    out = [f"define void @{_LOOP}{name}({', '.join(params)}) {{", "entry:"]
    block = "entry"
    for d in range(rank - 1):  # the rows: one loop per leading dimension
        out += [f"  br label %row{d}", f"row{d}:",
                f"  %i{d} = phi i64 [0, %{block}], [%i{d}.next, %row{d}.latch]",
                f"  %i{d}.more = icmp slt i64 %i{d}, %a.n{d}",
                f"  br i1 %i{d}.more, label %row{d}.body, label %row{d}.exit", f"row{d}.body:"]
        block = f"row{d}.body"
    for key in keys:  # each array's row start: offset + sum(i_d * stride_d)
        base = f"%{key}.offset"
        for d in range(rank - 1):
            out += [f"  %{key}.i{d} = mul i64 %i{d}, %{key}.s{d}", f"  %{key}.b{d} = add i64 {base}, %{key}.i{d}"]
            base = f"%{key}.b{d}"
        out.append(f"  %{key}.row = add i64 {base}, 0")
    if init:
        out += ["  %h0.p = getelementptr " + t + ", ptr %h0, i64 %h0.row", f"  %start = load {t}, ptr %h0.p"]
    start = "%start" if init else ("0.0" if floats else "0")
    last = rank - 1
    out += [f"  %last = sub i64 %a.n{last}, 1", "  br label %time", "time:",
            f"  %k = phi i64 [0, %{block}], [%k.next, %step]",
            f"  %state = phi {t} [{start}, %{block}], [%state.next, %step]",
            f"  %k.more = icmp slt i64 %k, %a.n{last}",
            "  br i1 %k.more, label %step, label %row.end", "step:",
            "  %t = sub i64 %last, %k" if reverse else "  %t = add i64 %k, 0"]
    for key in ("a", "b", "h"):
        out += [f"  %{key}.tk = mul i64 %t, %{key}.s{last}", f"  %{key}.at = add i64 %{key}.row, %{key}.tk",
                f"  %{key}.p = getelementptr {t}, ptr %{key}, i64 %{key}.at"]
    mul, add = ("fmul", "fadd") if floats else ("mul", "add")
    out += [f"  %av = load {t}, ptr %a.p", f"  %bv = load {t}, ptr %b.p",
            f"  %product = {mul} {t} %av, %state", f"  %state.next = {add} {t} %product, %bv",
            f"  store {t} %state.next, ptr %h.p", "  %k.next = add i64 %k, 1", "  br label %time", "row.end:"]
    if final:
        out += [f"  %hT.p = getelementptr {t}, ptr %hT, i64 %hT.row", f"  store {t} %state, ptr %hT.p"]
    for d in reversed(range(rank - 1)):
        out += [f"  br label %row{d}.latch", f"row{d}.latch:", f"  %i{d}.next = add i64 %i{d}, 1",
                f"  br label %row{d}", f"row{d}.exit:"]
    out += ["  ret void", "}", ""]
    return "\n".join(out)


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


__all__ = ["OPT_LEVEL", "LoopProgram", "affine_loop_ir", "affine_spec", "loop_symbol"]
